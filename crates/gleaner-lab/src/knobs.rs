//! The host's KVM halt polling knob (`/sys/module/kvm/parameters/halt_poll_ns`), changed only
//! for the duration of a guard and restored on drop.

use std::fs;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct KnobError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Sets `kvm.halt_poll_ns` under a sysfs root until dropped.
#[derive(Debug)]
pub struct HaltPollGuard {
    path: PathBuf,
    original: String,
}

impl HaltPollGuard {
    pub fn set(sys_root: &Path, value: u64) -> Result<Self, KnobError> {
        let path = sys_root.join("module/kvm/parameters/halt_poll_ns");
        let original = fs::read_to_string(&path).map_err(|source| KnobError { path: path.clone(), source })?;
        fs::write(&path, value.to_string()).map_err(|source| KnobError { path: path.clone(), source })?;
        tracing::info!(path = %path.display(), from = original.trim(), to = value, "halt_poll_ns set");
        Ok(Self { path, original: original.trim().to_string() })
    }
}

impl Drop for HaltPollGuard {
    fn drop(&mut self) {
        if let Err(e) = fs::write(&self.path, &self.original) {
            eprintln!("lab: could not restore {} to {}: {e}", self.path.display(), self.original);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_and_restores() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("module/kvm/parameters");
        fs::create_dir_all(&p).unwrap();
        fs::write(p.join("halt_poll_ns"), "200000\n").unwrap();
        {
            let _g = HaltPollGuard::set(d.path(), 0).unwrap();
            assert_eq!(fs::read_to_string(p.join("halt_poll_ns")).unwrap(), "0");
        }
        assert_eq!(fs::read_to_string(p.join("halt_poll_ns")).unwrap(), "200000");
    }

    #[test]
    fn missing_knob_names_path() {
        let d = tempfile::tempdir().unwrap();
        let e = HaltPollGuard::set(d.path(), 0).unwrap_err();
        assert!(e.to_string().contains("halt_poll_ns"));
    }
}
