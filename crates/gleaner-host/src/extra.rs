//! Old home of the per-thread procfs readers (`task/<tid>/io`, `task/<tid>/cgroup`) and the
//! sysfs CPU topology readers (package ids, cache sizes). They now live in gleaner-os
//! ([`gleaner_os::procfs::Procfs::task_io`], [`gleaner_os::procfs::Procfs::task_cgroup`],
//! [`gleaner_os::sysfs::Sysfs::package_id`], [`gleaner_os::sysfs::Sysfs::llc_bytes`], ...);
//! these names are kept for callers outside this crate until they move.

pub use gleaner_os::procfs::{parse_task_io, Procfs as ProcExtra, TaskIo};
pub use gleaner_os::sysfs::{parse_size, Sysfs as CpuTopo};
