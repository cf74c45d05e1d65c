//! Hardware counters per vCPU thread (`perf_event_open`): LLC references, LLC misses,
//! instructions. Absent on many virtual machines (including the development machines):
//! [`probe`] says why, and the monitor reports the LLC sources as missing.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `struct perf_event_attr` up to `config1` (PERF_ATTR_SIZE_VER0 = 64 bytes), enough for
/// counting hardware events.
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

const PERF_TYPE_HARDWARE: u32 = 0;
/// PERF_COUNT_HW_INSTRUCTIONS, _CACHE_REFERENCES, _CACHE_MISSES.
pub const INSTRUCTIONS: u64 = 1;
pub const CACHE_REFERENCES: u64 = 2;
pub const CACHE_MISSES: u64 = 3;

/// A counting hardware event on one thread.
#[derive(Debug)]
pub struct Counter {
    fd: OwnedFd,
}

impl Counter {
    /// Opens `config` (one of the constants) on thread `tid` (0 = the caller), any CPU.
    pub fn open(tid: i32, config: u64) -> io::Result<Counter> {
        let attr = PerfEventAttr { type_: PERF_TYPE_HARDWARE, size: 64, config, ..Default::default() };
        // SAFETY: `attr` is a valid, initialized perf_event_attr of the size it declares;
        // the kernel only reads it. pid = tid, cpu = -1 (any), group_fd = -1, flags = 0.
        let r = unsafe { libc::syscall(libc::SYS_perf_event_open, &attr as *const PerfEventAttr, tid, -1i32, -1i32, 0u64) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = i32::try_from(r).map_err(|_| io::Error::other("fd out of range"))?;
        // SAFETY: the kernel returned a new file descriptor we own exclusively.
        Ok(Counter { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// The current count.
    pub fn read(&self) -> io::Result<u64> {
        let mut buf = [0u8; 8];
        let n = nix::unistd::read(self.fd.as_raw_fd(), &mut buf).map_err(io::Error::from)?;
        if n != 8 {
            return Err(io::Error::other(format!("short read of {n} bytes")));
        }
        Ok(u64::from_ne_bytes(buf))
    }
}

/// `Ok(())` when LLC reference counting works here, else why not.
pub fn probe() -> Result<(), String> {
    match Counter::open(0, CACHE_REFERENCES) {
        Ok(c) => c.read().map(|_| ()).map_err(|e| format!("reading a cache-references counter failed: {e}")),
        Err(e) => Err(format!("no hardware cache counters (perf_event_open cache-references: {e})")),
    }
}

/// The three counters of one vCPU thread.
#[derive(Debug)]
pub struct LlcCounters {
    pub refs: Counter,
    pub misses: Counter,
    pub instructions: Counter,
}

impl LlcCounters {
    pub fn open(tid: i32) -> io::Result<Self> {
        Ok(Self {
            refs: Counter::open(tid, CACHE_REFERENCES)?,
            misses: Counter::open(tid, CACHE_MISSES)?,
            instructions: Counter::open(tid, INSTRUCTIONS)?,
        })
    }
    /// (refs, misses, instructions) now.
    pub fn read(&self) -> io::Result<(u64, u64, u64)> {
        Ok((self.refs.read()?, self.misses.read()?, self.instructions.read()?))
    }
}
