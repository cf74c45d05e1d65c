//! Thin, safe adapters over the Linux interfaces gleaner reads and changes:
//! procfs, sysfs (cpuidle, haltpoll), cgroupfs (v1 cpuset and v2), scheduler syscalls.
//!
//! Every adapter that touches the filesystem has a constructor taking a root path
//! (`with_root`) so it can be tested on a temp-dir fixture; the plain constructor only
//! supplies the real root.

pub mod input;

pub use input::BadInput;
