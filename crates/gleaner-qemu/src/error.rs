//! The fixture's one error type: every variant names the guest or the path.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
/// What can go wrong with a guest, its QEMU, or the files they need.
pub enum GuestError {
    #[error("guest {guest}: no {waiting_for} within {after_s:.0} s (deadline); last console lines:\n{console}")]
    Timeout { guest: String, waiting_for: String, after_s: f64, console: String },
    #[error("interrupted (signal); guests killed, temp dirs removed")]
    Interrupted,
    #[error("guest {guest}: {what}; last console lines:\n{console}")]
    GuestFailed { guest: String, what: String, console: String },
    #[error("cannot start {what}: {source}")]
    Spawn {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no static busybox found (looked in {looked}): install Debian package busybox-static")]
    NoBusybox { looked: String },
}
