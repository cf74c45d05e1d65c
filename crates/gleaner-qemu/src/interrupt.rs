//! Ctrl-C / SIGTERM / SIGHUP handling: the handler only sets a flag; every wait loop of the
//! lab polls it and returns [`crate::GuestError::Interrupted`], so the guards of running
//! guests and temp dirs are dropped on the normal unwinding path.

use gleaner_os::signal::{self, InterruptedCalls};

/// Installs the flag-setting handler for SIGINT, SIGTERM and SIGHUP (`gleaner_os::signal`, with
/// SA_RESTART), and clears the flag.
pub fn install() -> gleaner_os::Result<()> {
    signal::clear();
    signal::catch_stop_signals(InterruptedCalls::Restart)
}

/// True once a signal arrived (or [`request`] was called).
pub fn requested() -> bool {
    signal::stop_requested()
}

/// Requests an interruption as a signal would (used by tests and by the progress UI).
pub fn request() {
    signal::request(libc::SIGINT);
}

/// Clears the flag (start of a new lab command).
pub fn clear() {
    signal::clear();
}
