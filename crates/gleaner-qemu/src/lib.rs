//! The QEMU guest fixture the lab's experiments and the host agent's QEMU tests share (after
//! Cloud Hypervisor's `test_infra`): everything that boots a test guest on this machine and
//! cleans up after it, and nothing about experiments.
//!
//! ```text
//!  kernel    Debian kernel package -> cached vmlinux + the 9p/virtio modules (modinfo, cpio)
//!  command   QemuCommand: the one QEMU command line builder; RunningQemu: its own process
//!            group, pinned, PR_SET_PDEATHSIG, killed by PID on drop; wait_until
//!  guest     GuestSpec (a QemuCommand and what the guest runs) -> initramfs (busybox, init,
//!            job) -> Guest: the host's root over 9p, a result port read by a thread that
//!            timestamps markers and samples QEMU's thread CPU (hostproc)
//!  session   several guests, their events, per-step host CPU, deadlines, the interrupt flag
//!  accel     KVM or TCG, decided by booting a probe guest
//! ```
//!
//! Dependencies point down the list: `accel` -> `session` -> `guest` -> `command`, `kernel`;
//! every module may use [`GuestError`].

pub mod accel;
pub mod command;
pub mod cpio;
mod error;
pub mod guest;
pub mod hostproc;
pub mod interrupt;
pub mod kernel;
pub mod modinfo;
pub mod session;

pub use command::{wait_until, Accel, QemuCommand, RunningQemu, WaitTimeout};
pub use error::GuestError;
