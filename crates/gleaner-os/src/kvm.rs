//! The host's KVM knobs: `kvm.halt_poll_ns` (`/sys/module/kvm/parameters/halt_poll_ns`),
//! changed only for the life of a [`HaltPollGuard`] and restored when it drops.
//!
//! ```no_run
//! # fn main() -> gleaner_os::Result<()> {
//! use gleaner_os::{kvm::HaltPollGuard, sysfs::Sysfs};
//! let guard = HaltPollGuard::set(&Sysfs::new(), 0)?; // no host halt polling...
//! // ... run the guests ...
//! drop(guard); // ...and the host's own value again
//! # Ok(()) }
//! ```

use std::path::PathBuf;

use crate::error::Result;
use crate::sysfs::Sysfs;

/// Sets `kvm.halt_poll_ns` under a sysfs tree until dropped, then writes back the value it
/// found.
#[derive(Debug)]
pub struct HaltPollGuard {
    sysfs: Sysfs,
    original: String,
}

impl HaltPollGuard {
    /// Writes `value` ns to `kvm.halt_poll_ns` of `sysfs` (`Sysfs::new()` for the real host,
    /// `Sysfs::with_root` for a fixture). Errors carry the parameter's path.
    pub fn set(sysfs: &Sysfs, value: u64) -> Result<Self> {
        let original = sysfs.write_module_param("kvm", "halt_poll_ns", &value.to_string())?;
        tracing::info!(path = %Self::path(sysfs).display(), from = %original, to = value, "halt_poll_ns set");
        Ok(Self { sysfs: sysfs.clone(), original })
    }

    /// The value found before the guard changed it (restored on drop).
    pub fn original(&self) -> &str {
        &self.original
    }

    fn path(sysfs: &Sysfs) -> PathBuf {
        sysfs.root().join("module/kvm/parameters/halt_poll_ns")
    }
}

impl Drop for HaltPollGuard {
    fn drop(&mut self) {
        if let Err(e) = self.sysfs.write_module_param("kvm", "halt_poll_ns", &self.original) {
            tracing::error!(path = %Self::path(&self.sysfs).display(), value = %self.original, "could not restore halt_poll_ns: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::error::OsError;

    #[test]
    fn sets_and_restores() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("module/kvm/parameters");
        fs::create_dir_all(&p).unwrap();
        fs::write(p.join("halt_poll_ns"), "200000\n").unwrap();
        {
            let g = HaltPollGuard::set(&Sysfs::with_root(d.path()), 0).unwrap();
            assert_eq!(g.original(), "200000");
            assert_eq!(fs::read_to_string(p.join("halt_poll_ns")).unwrap(), "0");
        }
        assert_eq!(fs::read_to_string(p.join("halt_poll_ns")).unwrap(), "200000");
    }

    #[test]
    fn missing_knob_names_path() {
        let d = tempfile::tempdir().unwrap();
        let e = HaltPollGuard::set(&Sysfs::with_root(d.path()), 0).unwrap_err();
        assert!(matches!(&e, OsError::Read { path, .. } if path.ends_with("module/kvm/parameters/halt_poll_ns")), "{e:?}");
        assert!(e.to_string().contains("halt_poll_ns"), "{e}");
    }

    #[test]
    fn a_knob_that_vanished_is_not_restored_and_does_not_panic() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("module/kvm/parameters");
        fs::create_dir_all(&p).unwrap();
        fs::write(p.join("halt_poll_ns"), "10\n").unwrap();
        let g = HaltPollGuard::set(&Sysfs::with_root(d.path()), 0).unwrap();
        fs::remove_dir_all(d.path().join("module")).unwrap();
        drop(g);
        assert!(!p.exists());
    }
}
