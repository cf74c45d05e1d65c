//! Thin, safe adapters over the Linux interfaces gleaner reads and changes:
//! procfs, sysfs (cpuidle, haltpoll), cgroupfs (v1 cpuset and v2), scheduler syscalls.
//!
//! Every adapter that touches the filesystem has a constructor taking a root path
//! (`with_root`) so it can be tested on a temp-dir fixture; the plain constructor only
//! supplies the real root.
//!
//! | module | reads / writes |
//! |---|---|
//! | [`cpuset`] | kernel CPU list format (`0-3,5`) |
//! | [`procfs`] | `/proc/stat`, `/proc/<pid>/task/<tid>/{schedstat,status,stat}`, mountinfo, cpuinfo |
//! | [`sysfs`] | online CPUs, cpuidle driver/governor/states, module parameters, DMI |
//! | [`idle`] | the kernel's idle knobs: haltpoll window, per-CPU resume latency, state disable, governor |
//! | [`kvm`] | the host's `kvm.halt_poll_ns`, set for a guard's life and restored on drop |
//! | [`virt`] | hypervisor detection (cpuinfo flag, CPUID leaf 0x40000000, DMI, /sys/hypervisor) |
//! | [`cgroup`] | cpuset cgroups, v1 and v2 |
//! | [`sched`] | affinity, SCHED_IDLE/OTHER, EEVDF slice (`sched_setattr`), gettid, getcpu |
//! | [`rusage`] | getrusage, wait4 |
//! | [`private`] | the agents' own files: no-follow reads, atomic writes, a directory lock |
//! | [`bpf`] | an in-kernel scheduler tracer (wakeup latency, idle periods) in eBPF written from Rust |
//!
//! ```
//! use gleaner_os::cpuset::CpuSet;
//! let cpus = CpuSet::parse("0-3,5").unwrap();
//! assert_eq!((cpus.len(), cpus.to_string()), (5, "0-3,5".to_string()));
//! ```
//!
//! A typical agent step (needs root and a cpuset controller):
//!
//! ```no_run
//! # fn main() -> gleaner_os::Result<()> {
//! use std::path::Path;
//! use gleaner_os::{cgroup::Cgroups, cpuset::CpuSet, procfs::Procfs, sched};
//! let procfs = Procfs::new();
//! let group = Cgroups::detect()?.create(Path::new(""), "gleaner-run-42")?;
//! group.set_cpus(&CpuSet::parse("0-1").unwrap())?;
//! group.add_process(4242)?;
//! for tid in procfs.tasks(4242)? {
//!     match procfs.task_schedstat(4242, tid) {
//!         Ok(s) => println!("{tid}: {} ns on CPU", s.run_ns),
//!         Err(e) if e.is_vanished() => continue, // the thread exited meanwhile
//!         Err(e) => return Err(e),
//!     }
//! }
//! sched::set_slice(0, std::time::Duration::from_millis(1))?;
//! group.remove()?; // moves 4242 back to the parent, rmdir
//! # Ok(()) }
//! ```

pub mod bpf;
pub mod cgroup;
pub mod cpuset;
pub mod error;
pub mod fd;
pub mod idle;
pub mod input;
pub mod journal;
pub mod kvm;
pub mod pins;
pub mod private;
pub mod procfs;
pub mod qmp;
pub mod rusage;
pub mod sched;
pub mod signal;
pub mod sysfs;
// Test helpers: the haltpoll sysfs fixture for other crates' tests (feature `testutil`, turned
// on by their `[dev-dependencies]` only), and this crate's own.
#[cfg(any(test, feature = "testutil"))]
#[doc(hidden)]
pub mod testutil;
mod util;
pub mod virt;

pub use error::{OsError, Result};
pub use input::BadInput;

/// The running kernel's release (`uname -r`), e.g. `6.18.44-fc-v595`.
pub fn kernel_release() -> String {
    // SAFETY: `utsname` is plain old data, so all-zero is a valid value; `uname` only writes
    // into the struct we pass, and we read `release` only after it returned 0, when the kernel
    // has stored a NUL-terminated string in it.
    unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut u) != 0 {
            return String::from("unknown");
        }
        std::ffi::CStr::from_ptr(u.release.as_ptr()).to_string_lossy().into_owned()
    }
}

/// Time since boot, suspended time included (`CLOCK_BOOTTIME`): ages of per-boot records
/// measured with it do not jump when the wall clock is set.
pub fn boottime() -> std::time::Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).map(std::time::Duration::from).unwrap_or_default()
}

/// `CLOCK_MONOTONIC`, ns: the clock other programs time events with (`clock_gettime`,
/// Python's `time.monotonic_ns`), for lining records up with theirs.
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| u64::try_from(std::time::Duration::from(t).as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn monotonic_ns_is_the_clock_python_reads() {
        let ours = super::monotonic_ns();
        let out = std::process::Command::new("python3").args(["-c", "import time; print(time.monotonic_ns())"]).output().expect("python3");
        let theirs: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("a number");
        assert!(theirs >= ours && theirs - ours < 10_000_000_000, "ours {ours}, python's {theirs}");
    }

    #[test]
    fn boottime_advances() {
        let a = super::boottime();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(super::boottime() > a && !a.is_zero());
    }

    #[test]
    fn kernel_release_matches_proc() {
        let proc = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("/proc/sys/kernel/osrelease must exist");
        assert_eq!(super::kernel_release(), proc.trim());
    }
}
