//! Applying an idle plan: the kernel's idle knobs (the haltpoll window, each vCPU's resume
//! latency limit) through the journaled [`KnobWriter`], and each yielding thread's window.
//!
//! ```text
//!  plan (retention on)   poll_window_ns -> guest_halt_poll_ns       (written when it changes;
//!                                          fixed: grow_start = it, allow_shrink = N; each
//!                                          CPU's own window reset only when the guest loop
//!                                          says a lowered one is still polled at an older)
//!                        reset Shrink   -> allow_shrink = Y, shrink = 0 for one period
//!                                          (a CPU's next long halt drops its window to 0,
//!                                          its next short idle period grows it to the cap)
//!                        reset Switch   -> cpuidle governor away and back (windows to 0)
//!                        poll_always    -> cpuN resume latency n/a  (others: their original)
//!                        Yield windows  -> Yielders::set_windows    (0 parks a thread)
//!  nothing polls         (every vCPU halts, or yields: Wide on a saturated VM) the kernel's
//!                        knobs as for retention off
//!  retention off         every knob back to what the agent found (stock); threads parked;
//!                        reset Switch -> windows to 0 where restoring the cap did not
//! ```

use std::collections::BTreeSet;

use gleaner_policy::guest::WindowReset;
use gleaner_policy::idle::IdlePlan;

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
    /// Shrinking to nothing is on (a [`WindowReset::Shrink`] applied last).
    shrinking: bool,
}

impl IdleActuator {
    pub fn new(writer: KnobWriter) -> Self {
        Self { writer, window_ns: None, always: BTreeSet::new(), shrinking: false }
    }

    pub fn writer(&self) -> &KnobWriter {
        &self.writer
    }

    pub fn writer_mut(&mut self) -> &mut KnobWriter {
        &mut self.writer
    }

    /// Applies `plan` (or, when `on` is false, the machine's own settings). Every knob's
    /// original is journaled before its first change. `reset`: how each CPU's own haltpoll
    /// window comes down to a lowered cap (`GuestStep::reset_poll_windows`: a CPU whose idle
    /// periods stay below its window goes on polling past a lowered cap). A shrink lasts until
    /// the next apply; where this kernel cannot shrink to nothing it is a switch. A switch of
    /// the cpuidle governor halts every CPU for ~15 ms, so the guest loop asks for it only where
    /// a shrink did not reach. An error leaves what was written written (the journal restores
    /// it) and says which knob.
    pub fn apply(&mut self, journal: &mut StateFile, plan: &IdlePlan, on: bool, reset: WindowReset) -> anyhow::Result<()> {
        if !on || !plan.polls() {
            // Nothing polls (every vCPU halts, or yields: the ladder's Wide on a saturated
            // VM): the kernel as found.
            return self.back_to_stock(journal, reset == WindowReset::Switch).map(drop);
        }
        let offer = self.writer.offer().clone();
        if offer.poll_window() && self.window_ns != Some(plan.poll_window_ns) {
            self.writer.set_fixed_poll_window(journal, plan.poll_window_ns)?;
            self.window_ns = Some(plan.poll_window_ns);
        }
        if offer.poll_window() {
            let shrink = reset == WindowReset::Shrink && self.writer.set_shrink_to_nothing(journal, true)?;
            if !shrink && self.shrinking {
                self.writer.set_shrink_to_nothing(journal, false)?;
            }
            self.shrinking = shrink;
            if reset == WindowReset::Switch || (reset == WindowReset::Shrink && !shrink) {
                self.writer.reset_poll_windows(journal)?;
            }
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

    /// [`Self::stock`], and with `switch` each CPU's own haltpoll window reset too, by a switch
    /// of the governor where restoring the cap did not do one (it does where it writes the cap
    /// back). Returns whether it switched itself.
    fn back_to_stock(&mut self, journal: &mut StateFile, switch: bool) -> anyhow::Result<bool> {
        let switch = switch && self.writer.offer().poll_window() && !self.writer.restore_resets_windows()?;
        self.stock()?;
        Ok(switch && self.writer.reset_poll_windows(journal)?)
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
        self.shrinking = false;
        if errors.is_empty() {
            Ok(())
        } else {
            anyhow::bail!("restoring the idle knobs: {}", errors.join("; "))
        }
    }
}

/// Gives each yielding thread its window from `plan` (0 for a vCPU that does not yield).
pub fn apply_yielders(y: &Yielders, plan: &IdlePlan, on: bool) {
    let windows: Vec<(u32, u64)> = y.slots().iter().map(|s| (s.cpu, plan.yield_window(s.cpu, on))).collect();
    y.set_windows(&windows);
}

#[cfg(test)]
mod tests {
    use std::fs;

    use gleaner_os::testutil::HaltpollSysfs;
    use gleaner_policy::idle::IdlePlan;

    use super::*;
    use crate::knobs::tests::{journaled, writer};

    /// Back to stock with a switch asked for: the adapter switches only where restoring the cap
    /// did not (the cap already back at its original, one vCPU polled until work); never where
    /// nothing was asked.
    #[test]
    fn back_to_stock_switches_where_restoring_the_cap_does_not() {
        let plan = |w| IdlePlan::initial_poll([0, 1], w);
        let mut until_work = plan(200_000);
        until_work.poll_always = vec![0];
        for (first, switch, want) in [(plan(131_072), true, false), (until_work.clone(), true, true), (until_work, false, false)] {
            let d = tempfile::tempdir().unwrap();
            let (mut journal, w) = journaled(d.path(), "haltpoll", 13);
            let mut a = IdleActuator::new(w);
            a.apply(&mut journal, &first, true, WindowReset::Keep).unwrap();
            assert_eq!(a.back_to_stock(&mut journal, switch).unwrap(), want, "{first:?}, switch asked: {switch}");
            assert!(!a.writer().restore_resets_windows().unwrap(), "restored");
        }
    }

    /// A shrink lasts one apply: the next plan's apply turns it off, whatever it changes; a
    /// plan that retains nothing puts every knob back.
    #[test]
    fn a_shrink_lasts_until_the_next_apply() {
        let d = tempfile::tempdir().unwrap();
        // Every upstream parameter, the cap at upstream's 200 us.
        HaltpollSysfs::new().param("guest_halt_poll_ns", "200000").write(d.path());
        let hp = d.path().join("module/haltpoll/parameters");
        let p = |name: &str| fs::read_to_string(hp.join(name)).unwrap().trim().to_string();
        let mut journal = StateFile::create(&d.path().join("run"), 12).unwrap();
        let mut a = IdleActuator::new(writer(d.path()));
        let plan = |w| IdlePlan::initial_poll([0, 1], w);
        a.apply(&mut journal, &plan(131_072), true, WindowReset::Keep).unwrap();
        assert_eq!((p("guest_halt_poll_ns"), p("guest_halt_poll_allow_shrink")), ("131072".into(), "N".into()));
        a.apply(&mut journal, &plan(65_536), true, WindowReset::Shrink).unwrap();
        assert_eq!(
            (p("guest_halt_poll_ns"), p("guest_halt_poll_grow_start"), p("guest_halt_poll_allow_shrink"), p("guest_halt_poll_shrink")),
            ("65536".into(), "65536".into(), "Y".into(), "0".into())
        );
        a.apply(&mut journal, &plan(65_536), true, WindowReset::Keep).unwrap();
        assert_eq!(p("guest_halt_poll_allow_shrink"), "N");
        // Lowered again in the same apply as the shrink: the window's own N comes first.
        a.apply(&mut journal, &plan(32_768), true, WindowReset::Shrink).unwrap();
        assert_eq!((p("guest_halt_poll_ns"), p("guest_halt_poll_allow_shrink")), ("32768".into(), "Y".into()));
        a.apply(&mut journal, &IdlePlan::halt([0, 1]), true, WindowReset::Keep).unwrap();
        let upstream = ("200000".into(), "50000".into(), "Y".into(), "2".into());
        let params =
            || (p("guest_halt_poll_ns"), p("guest_halt_poll_grow_start"), p("guest_halt_poll_allow_shrink"), p("guest_halt_poll_shrink"));
        assert_eq!(params(), upstream);
        // The yielders on every vCPU (Wide on a saturated VM): the kernel as found too.
        a.apply(&mut journal, &plan(65_536), true, WindowReset::Keep).unwrap();
        assert_ne!(params(), upstream);
        a.apply(&mut journal, &IdlePlan::yield_always([0, 1]), true, WindowReset::Keep).unwrap();
        assert_eq!(params(), upstream);
    }
}
