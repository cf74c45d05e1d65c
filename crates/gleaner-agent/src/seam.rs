//! Test seam: stop the agent at a named phase so a test can `kill -9` it exactly there.
//!
//! With `GLEANER_TEST_STOP_AT=<phase>` in its environment the agent says
//! `gleaner: test seam: stopped at <phase>` on stderr and stops itself (`SIGSTOP`) when it
//! reaches that phase; `SIGCONT` resumes it, `SIGKILL` ends it there. The fault-injection
//! tests (tests/faults.rs) use it to kill the agent before its journal is written, right after
//! a shrink and in the middle of its own restore. Without the variable it costs one
//! environment lookup per call; the phases are set-up and restore steps and the first shrink,
//! never the per-period loop's hot path.

/// The phases, in the order an agent meets them.
pub const PHASES: &[&str] = &[BEFORE_JOURNAL, JOURNALED, AFTER_SHRINK, MID_RESTORE];
/// Before the state file (journal) exists: nothing has been changed yet.
pub const BEFORE_JOURNAL: &str = "before-journal";
/// The cgroup the agent is about to create is recorded, not yet created.
pub const JOURNALED: &str = "journaled";
/// Right after the first cpuset write that took vCPUs away from the workload.
pub const AFTER_SHRINK: &str = "after-shrink";
/// The agent's own restore has undone its newest change, not the others.
pub const MID_RESTORE: &str = "mid-restore";

/// The phases at which the kernel's idle knobs are changed (a workload whose vCPUs idle
/// briefly, on a machine with a POLL state, reaches them).
pub const KNOB_PHASES: &[&str] = &[MEASURING_POLL, AFTER_POLL];
/// The calibration made the waiter's vCPU poll (its resume latency limit 0) to measure P.
pub const MEASURING_POLL: &str = "measuring-poll";
/// The agent applied the first plan that polls in the kernel.
pub const AFTER_POLL: &str = "after-poll";

const VAR: &str = "GLEANER_TEST_STOP_AT";

/// Stops this process if the seam names `phase`.
pub fn stop_at(phase: &str) {
    if std::env::var(VAR).is_ok_and(|p| p == phase) {
        eprintln!("gleaner: test seam: stopped at {phase}");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
    }
}
