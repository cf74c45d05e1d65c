//! Stop signals (SIGINT, SIGTERM, SIGHUP) as a flag, for every front end (guest agent, host
//! agent, lab): the handler only records which signal arrived (async-signal-safe); the loops
//! poll [`received`] and unwind normally, so every guard (cgroups, guests, temp dirs) is dropped
//! on the ordinary path.
//!
//! Whether a system call the signal interrupts is restarted is the caller's choice: the guest
//! agent wants its `poll` on the workload's pidfd to return at once (no `SA_RESTART`); the host
//! agent and the lab sleep in short steps and prefer restarted reads and writes.

use std::sync::atomic::{AtomicI32, Ordering};

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

use crate::error::{OsError, Result};

static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    RECEIVED.store(sig, Ordering::SeqCst);
}

/// What happens to a system call a stop signal interrupts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterruptedCalls {
    /// It fails with `EINTR`: a blocking wait returns as soon as the signal arrives.
    Return,
    /// It is restarted (`SA_RESTART`).
    Restart,
}

/// The signals that ask a gleaner process to stop and clean up.
pub const STOP_SIGNALS: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

/// Installs the flag-setting handler for [`STOP_SIGNALS`]. Does not clear a signal already
/// received (see [`clear`]).
pub fn catch_stop_signals(calls: InterruptedCalls) -> Result<()> {
    let flags = match calls {
        InterruptedCalls::Return => SaFlags::empty(),
        InterruptedCalls::Restart => SaFlags::SA_RESTART,
    };
    let act = SigAction::new(SigHandler::Handler(on_signal), flags, SigSet::empty());
    for s in STOP_SIGNALS {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(s, &act) }.map_err(|e| OsError::Syscall { call: "sigaction", tid: 0, source: std::io::Error::from(e) })?;
    }
    Ok(())
}

/// The stop signal received, if any (the last one).
pub fn received() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Whether a stop signal arrived (or [`request`] was called).
pub fn stop_requested() -> bool {
    received().is_some()
}

/// Asks for a stop as signal `sig` would (tests, a progress UI's cancel).
pub fn request(sig: i32) {
    RECEIVED.store(sig, Ordering::SeqCst);
}

/// Forgets a received signal (the start of a new command in the same process).
pub fn clear() {
    RECEIVED.store(0, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[serial_test::serial(signal)]
    fn a_caught_signal_is_recorded_not_fatal() {
        clear();
        catch_stop_signals(InterruptedCalls::Return).unwrap();
        assert_eq!(received(), None);
        nix::sys::signal::raise(Signal::SIGHUP).unwrap();
        assert_eq!(received(), Some(libc::SIGHUP));
        assert!(stop_requested());
        clear();
        assert!(!stop_requested());
        request(libc::SIGINT);
        assert_eq!(received(), Some(libc::SIGINT));
        clear();
    }
}
