//! Applying an idle plan: the kernel's idle knobs (the haltpoll window, each vCPU's resume
//! latency limit) through the journaled [`KnobWriter`], and each yielding thread's window.
//!
//! ```text
//!  plan (retention on)   poll_window_ns -> guest_halt_poll_ns       (written when it changes;
//!                                          fixed: grow_start = it, allow_shrink = N; each
//!                                          CPU's own window reset only when the guest loop
//!                                          says a lowered one is still polled at an older)
//!                        poll_always    -> cpuN resume latency n/a  (others: their original)
//!                        Yield windows  -> Yielders::set_windows    (0 parks a thread)
//!  retention off         every knob back to what the agent found (stock); threads parked
//! ```

use std::collections::BTreeSet;

use gleaner_policy::idle::{IdlePlan, Mechanism};

use crate::knobs::KnobWriter;
use crate::state::StateFile;
use crate::yielders::Yielders;

/// The kernel half of applying a plan; remembers what it applied to write only changes.
#[derive(Debug)]
pub struct IdleActuator {
    writer: KnobWriter,
    /// What is applied now: `None` = the machine's own settings (stock).
    window_ns: Option<u64>,
    always: BTreeSet<u32>,
}

impl IdleActuator {
    pub fn new(writer: KnobWriter) -> Self {
        Self { writer, window_ns: None, always: BTreeSet::new() }
    }

    pub fn writer(&self) -> &KnobWriter {
        &self.writer
    }

    pub fn writer_mut(&mut self) -> &mut KnobWriter {
        &mut self.writer
    }

    /// Applies `plan` (or, when `on` is false, the machine's own settings). Every knob's
    /// original is journaled before its first change. `reset_windows`: each CPU's own haltpoll
    /// window back to 0 too (`GuestStep::reset_poll_windows`: a CPU whose idle periods stay
    /// below its window goes on polling past a lowered cap, but the reset switches the cpuidle
    /// governor, which halts every CPU for ~20 ms, so the guest loop asks for it only where the
    /// old window is seen to cost). An error leaves what was written written (the journal
    /// restores it) and says which knob.
    pub fn apply(&mut self, journal: &mut StateFile, plan: &IdlePlan, on: bool, reset_windows: bool) -> anyhow::Result<()> {
        if !on || !plan.retains() {
            return self.stock();
        }
        let offer = self.writer.offer().clone();
        if offer.poll_window() && self.window_ns != Some(plan.poll_window_ns) {
            self.writer.set_fixed_poll_window(journal, plan.poll_window_ns)?;
            self.window_ns = Some(plan.poll_window_ns);
        }
        if offer.poll_window() && reset_windows {
            self.writer.knobs().reset_poll_windows()?;
        }
        if offer.poll_always() {
            let want: BTreeSet<u32> = plan.poll_always.iter().copied().collect();
            for &cpu in self.always.difference(&want) {
                self.writer.set_poll_always(journal, cpu, false)?;
            }
            for &cpu in want.difference(&self.always) {
                self.writer.set_poll_always(journal, cpu, true)?;
            }
            self.always = want;
        }
        Ok(())
    }

    /// Puts every knob back as the agent found it (the journal keeps the records: the final
    /// undo finds them restored).
    pub fn stock(&mut self) -> anyhow::Result<()> {
        if self.window_ns.is_none() && self.always.is_empty() {
            return Ok(());
        }
        let errors = self.writer.restore_now();
        self.window_ns = None;
        self.always.clear();
        if errors.is_empty() {
            Ok(())
        } else {
            anyhow::bail!("restoring the idle knobs: {}", errors.join("; "))
        }
    }
}

/// Gives each yielding thread its window from `plan` (0 for a vCPU that does not yield).
pub fn apply_yielders(y: &Yielders, plan: &IdlePlan, on: bool) {
    let windows: Vec<(u32, u64)> = y
        .slots()
        .iter()
        .map(|s| {
            let w = plan.of(s.cpu).filter(|v| on && v.mechanism == Mechanism::Yield).map_or(0, |v| v.window_ns);
            (s.cpu, w)
        })
        .collect();
    y.set_windows(&windows);
}
