//! Bringing each vCPU's own haltpoll window down to a lowered cap ([`WindowReset`]): the
//! haltpoll governor keeps a window per CPU, grown up to the cap and shrunk only after a halt
//! longer than it, so a lowered cap leaves a CPU that polls through its idle periods at its
//! old window. First a shrink; a governor switch only where the shrink did not reach, once
//! what the stale window polls outweighs the switch's halts; and a switch when the plan goes
//! back to the machine's own settings after a window was polled.

use super::{GuestController, GuestReading, WindowReset};
use crate::idle::plan::PlanReason;
use crate::idle::IdlePlan;

/// Bringing a stale haltpoll window down ([`WindowReset`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WindowCheck {
    /// No stale window seen since the last reset.
    Clear,
    /// The period being read ran with shrinking on: its polling was partly at the old window.
    Shrinking,
    /// A shrink did not reach every vCPU: while the window stays stale its polling past the
    /// estimate adds up, and a switch comes once that outweighs the switch's halts.
    Judging,
}

/// How long switching the cpuidle governor away and back halts every vCPU, ns: the agent's
/// two writes of `current_governor` took 13.2-16.0 ms on a development VM (timed in the
/// agent around `IdleKnobs::reset_poll_windows`, nginx with one connection).
pub const GOVERNOR_SWITCH_NS: u64 = 15_000_000;

impl GuestController {
    /// How applying `next` brings each vCPU's own haltpoll window down ([`WindowReset`]): the
    /// kernel may still poll at a larger window than the applied plan's, and the vCPUs polled more
    /// than its estimate by [`priors.stale_window_excess`](super::LoopPriors::stale_window_excess).
    /// A lowered window is otherwise just written. The first answer to a stale window is a shrink;
    /// a switch (every vCPU halted for the governor's switch) only where a vCPU the shrink did not
    /// reach stays stale until its polling past the estimate, at the price, outweighs the switch
    /// (`switch_cost_ns`).
    pub(super) fn track_kernel_window(&mut self, r: &GuestReading, period_ns: u64, next: &IdlePlan) -> WindowReset {
        if !next.retains() {
            return self.back_to_stock();
        }
        self.grown_window_ns = self.grown_window_ns.max(next.poll_window_ns);
        if next.poll_window_ns == 0 && self.kernel_window_ns > 0 && self.window_check == WindowCheck::Clear {
            // A cap of 0: no vCPU is to poll by the window (those kept polling until work poll
            // by their resume latency), but each one's own window, grown under an older cap,
            // stays where shrinking is off, and a vCPU planned to halt polls it out at every
            // idle period: the open loop at 200 requests a second, its second vCPU planned to
            // halt after a 16.7 ms shared window, polled 20-45 ms a period past the plan. A
            // shrink zeroes each window at its vCPU's next halt, which comes after a window
            // polled out, and halts nothing that polls until work, where a switch would. Judged
            // like any shrink: no vCPU polls the window now, so it is done after a period.
            self.window_check = WindowCheck::Shrinking;
            return WindowReset::Shrink;
        }
        let over = self.polled_past_estimate(r, period_ns);
        if self.window_check == WindowCheck::Shrinking {
            self.judge_shrink(&over, period_ns, next);
            return WindowReset::Keep;
        }
        let excess: f64 = over.iter().map(|&(e, _)| e).sum();
        let applied = &self.applied;
        let stale =
            applied.poll_window_ns > 0 && self.kernel_window_ns > applied.poll_window_ns && excess > self.cfg.priors.stale_window_excess;
        self.answer(stale, excess, period_ns, next)
    }

    /// The machine's own settings. Restoring the cap does not bring each CPU's own window
    /// down: the stock rule shrinks it only after a halt longer than it, which a CPU whose idle
    /// periods end while it polls never has (nginx with 50 connections: the start plan's 200 us
    /// window stayed on wrk's vCPU for 1.5 s after the plan halted it, its cap written back to
    /// the original 0 already). A switch here costs nothing the plan does not ask: it halts
    /// every vCPU for its ~15 ms, and the plan halts them all.
    fn back_to_stock(&mut self) -> WindowReset {
        let reset = if self.grown_window_ns > 0 { WindowReset::Switch } else { WindowReset::Keep };
        self.kernel_window_ns = 0;
        self.grown_window_ns = 0;
        self.window_check = WindowCheck::Clear;
        self.stale_cpu_ns = 0.0;
        reset
    }

    /// Each vCPU polling the applied plan's window with a planned estimate (not the start
    /// plan's): its polling past the estimate and its halted time, shares of the period.
    fn polled_past_estimate(&self, r: &GuestReading, period_ns: u64) -> Vec<(f64, f64)> {
        let applied = &self.applied;
        applied
            .vcpus
            .iter()
            .filter(|v| {
                v.mechanism == crate::idle::Mechanism::Poll
                    && !applied.poll_always.contains(&v.cpu)
                    && matches!(v.why, PlanReason::BestValue | PlanReason::SharedWindow | PlanReason::VmShare)
            })
            .filter_map(|v| {
                let i = r.idle.iter().find(|i| i.cpu == v.cpu)?;
                let real = i.poll_ns as f64 / period_ns as f64;
                Some(((real - v.estimate.cost_share).max(0.0), i.idle_ns.saturating_sub(i.poll_ns) as f64 / period_ns as f64))
            })
            .collect()
    }

    /// The period after a shrink: its polling ran partly at the old window, before each
    /// vCPU's first long halt. Every vCPU still polling past the estimate halted for more than
    /// twice its old window: the shrink reached them (a halt comes after a whole window polled),
    /// and what they poll past the estimate is the estimate's, which no reset changes.
    /// Otherwise the next period says whether a switch is needed.
    fn judge_shrink(&mut self, over: &[(f64, f64)], period_ns: u64, next: &IdlePlan) {
        let old_window = 2.0 * self.kernel_window_ns as f64 / period_ns as f64;
        let reached = over.iter().all(|&(excess, halted)| excess == 0.0 || halted > old_window);
        self.window_check = if reached { WindowCheck::Clear } else { WindowCheck::Judging };
        self.kernel_window_ns =
            if reached { self.applied.poll_window_ns.max(next.poll_window_ns) } else { self.kernel_window_ns.max(next.poll_window_ns) };
    }

    /// The answer to a window found `stale` (or not) with `excess` polled past the estimate:
    /// a shrink first; while a shrink did not reach, a switch once the stale polling at the
    /// price outweighs it; a window no longer stale is the plan's again.
    fn answer(&mut self, stale: bool, excess: f64, period_ns: u64, next: &IdlePlan) -> WindowReset {
        match (stale, self.window_check) {
            (true, WindowCheck::Clear) => {
                // The windows stay what they were until the shrink is judged.
                self.window_check = WindowCheck::Shrinking;
                WindowReset::Shrink
            }
            (true, _) => {
                self.stale_cpu_ns += excess * period_ns as f64;
                if self.stale_cpu_ns * self.cfg.plan.price < self.switch_cost_ns(self.applied.poll_window_ns) {
                    return WindowReset::Keep;
                }
                self.window_check = WindowCheck::Clear;
                self.stale_cpu_ns = 0.0;
                self.kernel_window_ns = next.poll_window_ns;
                self.grown_window_ns = next.poll_window_ns;
                WindowReset::Switch
            }
            (false, check) => {
                if check == WindowCheck::Judging {
                    // No longer past the estimate: the shrink got there after all.
                    self.window_check = WindowCheck::Clear;
                    self.stale_cpu_ns = 0.0;
                    self.kernel_window_ns = self.applied.poll_window_ns;
                }
                self.kernel_window_ns = self.kernel_window_ns.max(next.poll_window_ns);
                WindowReset::Keep
            }
        }
    }

    /// What a switch of the cpuidle governor costs the workload, ns of wakeup latency: every
    /// wakeup of its [`GOVERNOR_SWITCH_NS`] finds a halted vCPU instead of one polling `window_ns`
    /// (the curve's halted cost at that gap over its polling cost). 0 without a curve or a
    /// rate: nothing to weigh it by, so a stale window is switched at once.
    pub(super) fn switch_cost_ns(&self, window_ns: u64) -> f64 {
        let (Some(curve), Some(rate)) = (self.cfg.curve.as_ref(), self.sync_rate()) else { return 0.0 };
        let polled = curve.poll_cost_ns().unwrap_or_else(|| curve.busy_cost_ns());
        let per_wake = (curve.halt_cost_ns(window_ns as f64) - polled).max(0.0);
        rate * GOVERNOR_SWITCH_NS as f64 / 1e9 * per_wake
    }
}
