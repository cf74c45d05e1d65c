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
//! | [`virt`] | hypervisor detection (cpuinfo flag, CPUID leaf 0x40000000, DMI, /sys/hypervisor) |
//! | [`cgroup`] | cpuset cgroups, v1 and v2 |
//! | [`sched`] | affinity, SCHED_IDLE/OTHER, EEVDF slice (`sched_setattr`), gettid, getcpu |
//! | [`rusage`] | getrusage, wait4 |

pub mod cgroup;
pub mod cpuset;
pub mod error;
pub mod input;
pub mod procfs;
pub mod rusage;
pub mod sched;
pub mod sysfs;
pub mod virt;
mod util;

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

#[cfg(test)]
mod tests {
    #[test]
    fn kernel_release_matches_proc() {
        let proc = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("/proc/sys/kernel/osrelease must exist");
        assert_eq!(super::kernel_release(), proc.trim());
    }
}
