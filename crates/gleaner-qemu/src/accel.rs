//! KVM or TCG, decided by trying: a tiny guest is booted with KVM under a short deadline; if
//! it does not reach init, TCG is used. (On nested hosts without hardware virtualization
//! `/dev/kvm` exists but a standard kernel hangs.)

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::command::Accel;
use crate::guest::GuestSpec;
use crate::kernel::Kernel;
use crate::session::Session;
use crate::GuestError;

/// Default deadline for the KVM probe to reach the guest's init.
pub const KVM_PROBE_S: u64 = 12;

#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    pub accel: Accel,
    /// Seconds until the guest's init reported READY (None: never within the deadline).
    pub boot_s: Option<f64>,
    pub detail: String,
}

/// Boots a guest with `accel` that runs `true` and reports how long it took to reach init.
pub fn probe(accel: Accel, kernel: &Kernel, busybox: &Path, deadline: Duration) -> Result<Probe, GuestError> {
    if accel == Accel::Kvm && !Path::new("/dev/kvm").exists() {
        return Ok(Probe { accel, boot_s: None, detail: "/dev/kvm does not exist".into() });
    }
    let spec = GuestSpec::new(format!("lab-probe-{accel}")).vcpus(1).memory_mib(256).accel(accel).job("true\n");
    let mut s = Session::new(kernel.clone(), busybox.to_path_buf());
    let id = s.start(&spec)?;
    let end = Instant::now() + deadline;
    match s.drive(end, "init (READY)", &[id], &|s| s.states[0].ready_at.is_some(), &mut |_| {}) {
        Ok(()) => Ok(Probe { accel, boot_s: s.boot_s(id), detail: "reached init".into() }),
        Err(GuestError::Interrupted) => Err(GuestError::Interrupted),
        Err(e) => {
            let first = e.to_string().lines().next().unwrap_or("").to_string();
            Ok(Probe { accel, boot_s: None, detail: first })
        }
    }
}

/// The acceleration asked for on the command line (`--accel`): one of [`Accel`], or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccelChoice {
    /// Try KVM, fall back to TCG.
    Auto,
    Kvm,
    Tcg,
}

impl AccelChoice {
    /// `auto`, `kvm` or `tcg`, named `what` in the error.
    pub fn parse(what: &str, text: &str) -> Result<Self, gleaner_os::BadInput> {
        match text {
            "auto" => Ok(Self::Auto),
            "kvm" => Ok(Self::Kvm),
            "tcg" => Ok(Self::Tcg),
            other => Err(gleaner_os::BadInput::new(what, other, "auto, kvm, tcg")),
        }
    }
}

/// `auto` tries KVM then falls back to TCG; `kvm` and `tcg` are taken as given.
pub fn resolve(choice: AccelChoice, kernel: &Kernel, busybox: &Path) -> Result<Accel, GuestError> {
    match choice {
        AccelChoice::Tcg => Ok(Accel::Tcg),
        AccelChoice::Kvm => Ok(Accel::Kvm),
        AccelChoice::Auto => {
            let p = probe(Accel::Kvm, kernel, busybox, Duration::from_secs(KVM_PROBE_S))?;
            if p.boot_s.is_some() {
                eprintln!("lab: KVM boots a guest ({:.1} s): using KVM", p.boot_s.unwrap_or(0.0));
                Ok(Accel::Kvm)
            } else {
                eprintln!("lab: KVM did not boot a guest ({}): using TCG", p.detail);
                Ok(Accel::Tcg)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accel_choices() {
        assert_eq!(AccelChoice::parse("--accel", "auto").unwrap(), AccelChoice::Auto);
        assert_eq!(AccelChoice::parse("--accel", "tcg").unwrap(), AccelChoice::Tcg);
        assert_eq!(AccelChoice::parse("--accel", "KVM").unwrap_err().to_string(), "invalid --accel 'KVM': allowed: auto, kvm, tcg");
    }
}
