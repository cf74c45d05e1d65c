//! Resource usage: `getrusage` (thread, process, children) and `wait4`.

use std::io;

use serde::Serialize;

use crate::error::{OsError, Result};

/// CPU time, context switches and peak memory of a thread, process or reaped children.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Rusage {
    pub user_ns: u64,
    pub sys_ns: u64,
    /// Voluntary context switches (blocked).
    pub nvcsw: u64,
    /// Involuntary context switches (preempted).
    pub nivcsw: u64,
    /// Peak resident set size, KiB.
    pub maxrss_kib: u64,
}

impl Rusage {
    /// user + sys.
    pub fn cpu_ns(&self) -> u64 {
        self.user_ns + self.sys_ns
    }
    /// Per-field difference `self - earlier`, saturating (maxrss kept from `self`).
    pub fn delta(&self, earlier: &Rusage) -> Rusage {
        Rusage {
            user_ns: self.user_ns.saturating_sub(earlier.user_ns),
            sys_ns: self.sys_ns.saturating_sub(earlier.sys_ns),
            nvcsw: self.nvcsw.saturating_sub(earlier.nvcsw),
            nivcsw: self.nivcsw.saturating_sub(earlier.nivcsw),
            maxrss_kib: self.maxrss_kib,
        }
    }
}

fn tv_ns(tv: libc::timeval) -> u64 {
    let s = u64::try_from(tv.tv_sec).unwrap_or(0);
    let us = u64::try_from(tv.tv_usec).unwrap_or(0);
    s * 1_000_000_000 + us * 1000
}

fn from_raw(r: &libc::rusage) -> Rusage {
    Rusage {
        user_ns: tv_ns(r.ru_utime),
        sys_ns: tv_ns(r.ru_stime),
        nvcsw: u64::try_from(r.ru_nvcsw).unwrap_or(0),
        nivcsw: u64::try_from(r.ru_nivcsw).unwrap_or(0),
        maxrss_kib: u64::try_from(r.ru_maxrss).unwrap_or(0),
    }
}

fn getrusage(who: libc::c_int, call: &'static str) -> Result<Rusage> {
    // SAFETY: `rusage` is plain old data (all-zero is valid) and getrusage writes only into
    // the struct we pass.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `r` is a valid, writable rusage for the duration of the call.
    if unsafe { libc::getrusage(who, &mut r) } != 0 {
        return Err(OsError::Syscall { call, tid: 0, source: io::Error::last_os_error() });
    }
    Ok(from_raw(&r))
}

/// Usage of the calling thread (`RUSAGE_THREAD`).
pub fn thread_rusage() -> Result<Rusage> {
    getrusage(libc::RUSAGE_THREAD, "getrusage(RUSAGE_THREAD)")
}

/// Usage of this process, all threads (`RUSAGE_SELF`).
pub fn self_rusage() -> Result<Rusage> {
    getrusage(libc::RUSAGE_SELF, "getrusage(RUSAGE_SELF)")
}

/// Usage of all reaped children and their descendants (`RUSAGE_CHILDREN`).
pub fn children_rusage() -> Result<Rusage> {
    getrusage(libc::RUSAGE_CHILDREN, "getrusage(RUSAGE_CHILDREN)")
}

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ExitStatusLike {
    /// Exited with this code.
    Exited(i32),
    /// Killed by this signal.
    Signaled { signal: i32, core_dumped: bool },
}

impl ExitStatusLike {
    /// The code a shell would report: the exit code, or 128 + signal.
    pub fn code(&self) -> i32 {
        match *self {
            ExitStatusLike::Exited(c) => c,
            ExitStatusLike::Signaled { signal, .. } => 128 + signal,
        }
    }
    /// True for exit code 0.
    pub fn success(&self) -> bool {
        *self == ExitStatusLike::Exited(0)
    }
}

/// Waits for child `pid` to terminate (retrying on EINTR, ignoring stops) and returns how
/// it ended and its resource usage (including its reaped descendants).
pub fn wait4(pid: i32) -> Result<(ExitStatusLike, Rusage)> {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: see getrusage: all-zero rusage is valid.
        let mut r: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `status` and `r` are valid writable locations for the whole call.
        let ret = unsafe { libc::wait4(pid, &mut status, 0, &mut r) };
        if ret < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(OsError::Syscall { call: "wait4", tid: pid, source: e });
        }
        if libc::WIFEXITED(status) {
            return Ok((ExitStatusLike::Exited(libc::WEXITSTATUS(status)), from_raw(&r)));
        }
        if libc::WIFSIGNALED(status) {
            let s = ExitStatusLike::Signaled { signal: libc::WTERMSIG(status), core_dumped: libc::WCOREDUMP(status) };
            return Ok((s, from_raw(&r)));
        }
        // Stopped/continued: only reported with WUNTRACED/WCONTINUED, which we do not pass.
    }
}

/// CPU time of the calling thread so far, ns (`CLOCK_THREAD_CPUTIME_ID`; 0 if unreadable).
pub fn thread_cpu_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(0, |t| u64::try_from(std::time::Duration::from(t).as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn thread_usage_grows_with_work() {
        let before = thread_rusage().unwrap();
        // Spin until the thread's own CPU clock advanced 30 ms (wall time varies with load).
        let c0 = thread_cpu_ns();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut x = 0u64;
        while thread_cpu_ns() - c0 < 30_000_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            assert!(std::time::Instant::now() < deadline, "got no 30 ms of CPU in 20 s");
        }
        std::hint::black_box(x);
        let after = thread_rusage().unwrap();
        let d = after.delta(&before);
        // getrusage splits tick-sampled user/sys over the precise runtime: allow slack.
        assert!(d.cpu_ns() >= 20_000_000, "{d:?}");
        let me = self_rusage().unwrap();
        assert!(me.cpu_ns() >= after.cpu_ns());
        assert!(me.maxrss_kib > 0);
    }

    #[test]
    #[allow(clippy::zombie_processes)] // reaped by our wait4, not Child::wait
    fn wait4_reports_exit_code_signal_and_usage() {
        use std::os::unix::process::CommandExt;
        let child = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; exit 3"])
            .spawn()
            .expect("need /bin/sh");
        let pid = i32::try_from(child.id()).unwrap();
        let (st, ru) = wait4(pid).unwrap();
        assert_eq!(st, ExitStatusLike::Exited(3));
        assert_eq!(st.code(), 3);
        assert!(ru.cpu_ns() > 0, "{ru:?}");
        assert!(ru.maxrss_kib > 0);
        let child = std::process::Command::new("sleep").arg("30").process_group(0).spawn().expect("need sleep");
        let pid = i32::try_from(child.id()).unwrap();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
        let (st, _) = wait4(pid).unwrap();
        assert_eq!(st, ExitStatusLike::Signaled { signal: libc::SIGKILL, core_dumped: false });
        assert_eq!(st.code(), 137);
        assert!(!st.success());
        let e = wait4(pid).unwrap_err();
        assert!(e.to_string().contains("wait4"), "{e}");
        assert!(children_rusage().unwrap().cpu_ns() >= ru.cpu_ns());
    }
}
