//! Scheduler syscalls on threads: affinity, SCHED_IDLE / SCHED_OTHER, the EEVDF per-task
//! slice (`sched_setattr` `sched_runtime`, Linux >= 6.12), gettid, sched_getcpu, yield.
//!
//! `tid` 0 means the calling thread for every function here (as for the syscalls).

use std::io;
use std::time::Duration;

use serde::Serialize;

use crate::cpuset::CpuSet;
use crate::error::{is_gone, OsError, Result};
use crate::BadInput;

/// A scheduling policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Policy {
    Other,
    Fifo,
    RoundRobin,
    Batch,
    Idle,
    Deadline,
    /// sched_ext (7).
    Ext,
    Unknown(u32),
}

impl Policy {
    /// From the kernel's policy number.
    pub fn from_raw(p: u32) -> Policy {
        match p {
            0 => Policy::Other,
            1 => Policy::Fifo,
            2 => Policy::RoundRobin,
            3 => Policy::Batch,
            5 => Policy::Idle,
            6 => Policy::Deadline,
            7 => Policy::Ext,
            n => Policy::Unknown(n),
        }
    }
    /// True for the policies of the fair (EEVDF) class.
    pub fn is_fair(self) -> bool {
        matches!(self, Policy::Other | Policy::Batch | Policy::Idle)
    }
    /// True where the kernel honours a custom slice: SCHED_OTHER and SCHED_BATCH. (The
    /// kernel's `fair_policy()` excludes SCHED_IDLE, whose `sched_runtime` is silently
    /// ignored, so [`set_slice`] refuses it.)
    pub fn accepts_slice(self) -> bool {
        matches!(self, Policy::Other | Policy::Batch)
    }
}

/// Shortest EEVDF slice the kernel accepts (0.1 ms).
pub const MIN_SLICE: Duration = Duration::from_micros(100);
/// Longest EEVDF slice the kernel accepts (100 ms).
pub const MAX_SLICE: Duration = Duration::from_millis(100);

/// The kernel's `struct sched_attr` (`SCHED_ATTR_SIZE_VER1`, 56 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SchedAttr {
    pub size: u32,
    pub sched_policy: u32,
    pub sched_flags: u64,
    pub sched_nice: i32,
    pub sched_priority: u32,
    /// For fair tasks on Linux >= 6.12: the slice, ns.
    pub sched_runtime: u64,
    pub sched_deadline: u64,
    pub sched_period: u64,
    pub sched_util_min: u32,
    pub sched_util_max: u32,
}

const SCHED_ATTR_SIZE: u32 = 56;
const _: () = assert!(std::mem::size_of::<SchedAttr>() == SCHED_ATTR_SIZE as usize);
const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;

fn syscall_err(call: &'static str, tid: i32, e: io::Error) -> OsError {
    if tid != 0 && is_gone(&e) {
        return OsError::Vanished { pid: tid, tid: Some(tid) };
    }
    OsError::Syscall { call, tid, source: e }
}

/// The calling thread's id.
pub fn gettid() -> i32 {
    nix::unistd::gettid().as_raw()
}

/// Pins thread `tid` to `cpus`.
pub fn set_affinity(tid: i32, cpus: &CpuSet) -> Result<()> {
    if cpus.is_empty() {
        return Err(BadInput::new("CPU affinity", "(empty)", "at least one CPU").into());
    }
    let mut set = nix::sched::CpuSet::new();
    for c in cpus {
        set.set(c as usize).map_err(|_| BadInput::new("CPU id", c, format!("below {}", nix::sched::CpuSet::count())))?;
    }
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(tid), &set)
        .map_err(|e| syscall_err("sched_setaffinity", tid, io::Error::from(e)))
}

/// The CPUs thread `tid` may run on.
pub fn affinity(tid: i32) -> Result<CpuSet> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(tid))
        .map_err(|e| syscall_err("sched_getaffinity", tid, io::Error::from(e)))?;
    let n = nix::sched::CpuSet::count();
    Ok((0..n).filter(|&c| set.is_set(c).unwrap_or(false)).filter_map(|c| u32::try_from(c).ok()).collect())
}

fn setscheduler(tid: i32, policy: libc::c_int) -> Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid, initialized sched_param that outlives the call; the
    // kernel only reads it.
    let r = unsafe { libc::sched_setscheduler(tid, policy, &param) };
    if r != 0 {
        return Err(syscall_err("sched_setscheduler", tid, io::Error::last_os_error()));
    }
    Ok(())
}

/// Makes `tid` SCHED_IDLE: it runs only when nothing else wants the CPU.
pub fn set_idle(tid: i32) -> Result<()> {
    setscheduler(tid, libc::SCHED_IDLE)
}

/// Makes `tid` SCHED_OTHER with nice 0 (the default).
pub fn set_other(tid: i32) -> Result<()> {
    setscheduler(tid, libc::SCHED_OTHER)?;
    let who = libc::id_t::try_from(tid).map_err(|_| BadInput::new("tid", tid, "a non-negative thread id"))?;
    // SAFETY: setpriority takes plain integers and has no memory-safety preconditions.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, who, 0) };
    if r != 0 {
        return Err(syscall_err("setpriority", tid, io::Error::last_os_error()));
    }
    Ok(())
}

/// The scheduling policy of `tid`.
pub fn policy(tid: i32) -> Result<Policy> {
    // SAFETY: sched_getscheduler takes a plain integer and has no memory-safety preconditions.
    let r = unsafe { libc::sched_getscheduler(tid) };
    if r < 0 {
        return Err(syscall_err("sched_getscheduler", tid, io::Error::last_os_error()));
    }
    // The kernel may OR SCHED_RESET_ON_FORK (0x40000000) into the result.
    Ok(Policy::from_raw(u32::try_from(r & !0x4000_0000).unwrap_or(u32::MAX)))
}

/// All scheduling attributes of `tid` (`sched_getattr`).
pub fn get_attr(tid: i32) -> Result<SchedAttr> {
    let mut attr = SchedAttr::default();
    // SAFETY: `attr` is a writable #[repr(C)] struct of exactly SCHED_ATTR_SIZE bytes and we
    // pass that size, so the kernel writes at most that many bytes into it.
    let r = unsafe { libc::syscall(libc::SYS_sched_getattr, tid, &mut attr as *mut SchedAttr, SCHED_ATTR_SIZE, 0u32) };
    if r != 0 {
        return Err(syscall_err("sched_getattr", tid, io::Error::last_os_error()));
    }
    Ok(attr)
}

/// Sets all scheduling attributes of `tid` (`sched_setattr`); `attr.size` is filled in.
pub fn set_attr(tid: i32, attr: &SchedAttr) -> Result<()> {
    let mut a = *attr;
    a.size = SCHED_ATTR_SIZE;
    // SAFETY: `a` is an initialized #[repr(C)] sched_attr whose `size` field matches its
    // layout; the kernel only reads it during the call.
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, tid, &a as *const SchedAttr, 0u32) };
    if r != 0 {
        return Err(syscall_err("sched_setattr", tid, io::Error::last_os_error()));
    }
    Ok(())
}

/// Sets the EEVDF slice of a SCHED_OTHER/SCHED_BATCH thread (Linux >= 6.12), keeping its
/// policy and nice value (other policies are refused with [`BadInput`]). The kernel accepts 0.1-100 ms; other values are refused with [`BadInput`].
pub fn set_slice(tid: i32, slice: Duration) -> Result<()> {
    if slice < MIN_SLICE || slice > MAX_SLICE {
        return Err(BadInput::new("EEVDF slice", format!("{slice:?}"), "0.1 ms to 100 ms").into());
    }
    let ns = u64::try_from(slice.as_nanos()).unwrap_or(u64::MAX);
    set_runtime(tid, ns)
}

/// Drops a custom slice: the thread goes back to the default (`sched_runtime` 0).
pub fn reset_slice(tid: i32) -> Result<()> {
    set_runtime(tid, 0)
}

fn set_runtime(tid: i32, ns: u64) -> Result<()> {
    let cur = get_attr(tid)?;
    let pol = Policy::from_raw(cur.sched_policy);
    if !pol.accepts_slice() {
        return Err(BadInput::new("thread policy for a slice", format!("{pol:?} (tid {tid})"), "SCHED_OTHER or SCHED_BATCH").into());
    }
    let attr = SchedAttr {
        sched_policy: cur.sched_policy,
        sched_flags: cur.sched_flags & SCHED_FLAG_RESET_ON_FORK,
        sched_nice: cur.sched_nice,
        sched_runtime: ns,
        ..SchedAttr::default()
    };
    set_attr(tid, &attr)
}

/// The current slice of a fair-class thread (`sched_runtime` from `sched_getattr`; the
/// default slice when none was set, 0 on kernels before 6.12).
pub fn slice(tid: i32) -> Result<Duration> {
    Ok(Duration::from_nanos(get_attr(tid)?.sched_runtime))
}

/// Sets the calling thread's timer slack (how late the kernel may fire its sleep timers to
/// batch wake-ups; 50 us by default), so a microsecond sleep stays a microsecond.
pub fn set_own_timer_slack(ns: u64) -> Result<()> {
    if ns == 0 {
        // prctl treats 0 as "back to the default slack", which is not what a caller means.
        return Err(BadInput::new("timer slack", "0 ns", "at least 1 ns").into());
    }
    nix::sys::prctl::set_timerslack(ns).map_err(|e| syscall_err("prctl(PR_SET_TIMERSLACK)", gettid(), io::Error::from(e)))
}

/// The CPU the calling thread is running on now.
pub fn current_cpu() -> Result<u32> {
    let c = nix::sched::sched_getcpu().map_err(|e| syscall_err("sched_getcpu", 0, io::Error::from(e)))?;
    Ok(u32::try_from(c).unwrap_or(u32::MAX))
}

/// `sched_yield()`: lets another runnable thread of the same or higher priority on this
/// CPU run. Cannot fail on Linux.
pub fn yield_now() {
    // SAFETY: sched_yield takes no arguments and always succeeds on Linux.
    unsafe {
        libc::sched_yield();
    }
}

#[cfg(test)]
mod tests;
