//! Ctrl-C / SIGTERM / SIGHUP handling: the handler only sets a flag; every wait loop of the
//! lab polls it and returns [`crate::guest::LabError::Interrupted`], so the guards of running
//! guests and temp dirs are dropped on the normal unwinding path.

use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Installs the flag-setting handler for SIGINT, SIGTERM and SIGHUP, and clears the flag.
pub fn install() -> nix::Result<()> {
    INTERRUPTED.store(false, Ordering::SeqCst);
    let act = SigAction::new(SigHandler::Handler(on_signal), SaFlags::SA_RESTART, SigSet::empty());
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(s, &act) }?;
    }
    Ok(())
}

/// True once a signal arrived (or [`request`] was called).
pub fn requested() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Requests an interruption as a signal would (used by tests and by the progress UI).
pub fn request() {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Clears the flag (start of a new lab command).
pub fn clear() {
    INTERRUPTED.store(false, Ordering::SeqCst);
}
