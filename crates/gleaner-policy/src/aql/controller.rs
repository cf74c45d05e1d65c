//! The AQL_Sched host control loop, whole: what `gleaner host run` and the simulator's AQL host
//! both call once per monitoring period. Before this existed each adapter wrote its own loop
//! and they had drifted (the host counted spin exits per vCPU per wall-clock period; the
//! simulator normalized them per VM).
//!
//! ```text
//!  every period:  readings (one per vCPU that has a period)      live vCPUs
//!                   |  ConSpin per VM per run time (normalise_spin)   |
//!                   v                                                 v
//!                 TypeRecognizer::observe  ......................  forget the gone
//!  every `decide_every` periods:
//!                 classify -> plan(infos, topology, quanta) -> diff against the plan in force
//!                 -> applied at once, or (`confirm`) each vCPU's change of type only when two
//!                    consecutive decisions agree on it (a vCPU's first type, and a new
//!                    vCPU, at once); the plan is made from the confirmed types
//! ```
//!
//! The two damping settings are configuration, not two loops. The paper's rule (the
//! simulator's default) decides every period and applies every change; `gleaner host run`
//! decides every window and confirms, because on the lab's real hosts vCPUs whose type flaps
//! between windows otherwise migrated every window (docs/host.md). Confirmation is per vCPU:
//! it confirmed the whole plan once, and then one flapping vCPU anywhere kept every other
//! vCPU's change from ever being applied (the simulator's `aql-damping` scenario, with the
//! host's settings: Figure 6's ConSpin VMs never got their 1 ms pool, S1 14.07 -> 0.83).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{plan, Classification, Limits, Plan, PlanDiff, Quanta, Topology, TypeRecognizer, VcpuClass, VcpuCounters, VcpuId, VcpuInfo};

/// How the loop is set up (the host's flags and config, or the simulator's paper settings).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ControllerConfig {
    /// The recognizer's window in periods (the paper: 4 periods of 30 ms).
    pub window: usize,
    /// Periods between decisions (1: every period, the paper's rule; the host: the window).
    pub decide_every: usize,
    /// Apply a vCPU's change of type only when two consecutive decisions agree on it (not in
    /// the paper; the host's default).
    pub confirm: bool,
    pub limits: Limits,
    /// Points by which another cursor must beat a vCPU's class to change it (0: the paper).
    pub hysteresis: f64,
    pub topology: Topology,
    pub quanta: Quanta,
}

/// One vCPU's counters over the period that just ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reading {
    pub id: VcpuId,
    pub counters: VcpuCounters,
}

/// What a window ended with: the plan computed, how it differs from the plan in force, and
/// whether to apply it now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub plan: Plan,
    pub diff: PlanDiff,
    pub apply: bool,
}

/// The loop's state: the recognizer's windows, the plan in force, the type each vCPU was
/// planned with and the changes of type awaiting confirmation.
#[derive(Debug, Clone)]
pub struct AqlController {
    cfg: ControllerConfig,
    rec: TypeRecognizer,
    periods: u64,
    current: Plan,
    confirmed: BTreeMap<VcpuId, VcpuInfo>,
    pending: BTreeMap<VcpuId, VcpuInfo>,
}

impl AqlController {
    pub fn new(cfg: ControllerConfig) -> Self {
        let rec = TypeRecognizer::new(cfg.window, cfg.limits).with_hysteresis(cfg.hysteresis);
        Self { cfg, rec, periods: 0, current: Plan::default(), confirmed: BTreeMap::new(), pending: BTreeMap::new() }
    }

    /// One monitoring period. `live` is every vCPU that exists now (one without a reading yet
    /// is planned as [`VcpuClass::Unknown`]); `readings` are the counters of the period that
    /// just ended, with raw per-vCPU spin events. Returns a decision every `decide_every`
    /// periods.
    pub fn step(&mut self, live: &[VcpuId], readings: &[Reading]) -> Option<Decision> {
        self.rec.retain(|id| live.contains(id));
        for r in normalise_spin(readings) {
            self.rec.observe(r.id, &r.counters);
        }
        self.periods += 1;
        if !self.periods.is_multiple_of(self.cfg.decide_every.max(1) as u64) {
            return None;
        }
        let infos: Vec<VcpuInfo> = live
            .iter()
            .map(|&id| match self.rec.classify(id) {
                Some(c) => VcpuInfo::from_classification(id, &c),
                None => VcpuInfo::new(id, VcpuClass::Unknown, false),
            })
            .collect();
        let infos = if self.cfg.confirm { self.confirm(infos) } else { infos };
        let new = plan(&infos, &self.cfg.topology, &self.cfg.quanta);
        let diff = new.diff(&self.current);
        let apply = !diff.is_empty();
        if apply {
            self.current = new.clone();
        }
        Some(Decision { plan: new, diff, apply })
    }

    /// The types to plan with: each vCPU's new type where the previous decision proposed the
    /// same, where it has none confirmed yet (or only `Unknown`), or where the new type wants a
    /// shorter quantum than the confirmed one; else the confirmed one, the new type then
    /// awaiting the next decision. The asymmetry is the costs': a spinning or I/O vCPU left in
    /// a long-slice pool for a window starves (a spin barrier waits on it: Figure 6's ConSpin
    /// VM at work rate 0.00), while a CPU-bound one left in a 1 ms pool for a window only
    /// switches more often. So a vCPU flapping between IOInt and CpuBurn stays in the 1 ms
    /// pool instead of migrating every window.
    fn confirm(&mut self, infos: Vec<VcpuInfo>) -> Vec<VcpuInfo> {
        let quantum = |i: &VcpuInfo| self.cfg.quanta.for_class(i.class).unwrap_or(self.cfg.quanta.default_ns);
        self.confirmed.retain(|id, _| infos.iter().any(|i| i.id == *id));
        self.pending.retain(|id, _| infos.iter().any(|i| i.id == *id));
        infos
            .into_iter()
            .map(|info| {
                let used = match self.confirmed.get(&info.id) {
                    Some(c)
                        if *c != info
                            && c.class != VcpuClass::Unknown
                            && quantum(&info) >= quantum(c)
                            && self.pending.get(&info.id) != Some(&info) =>
                    {
                        self.pending.insert(info.id, info);
                        *c
                    }
                    _ => {
                        self.pending.remove(&info.id);
                        info
                    }
                };
                self.confirmed.insert(info.id, used);
                used
            })
            .collect()
    }

    /// The type of `id` from its window, `None` if it was never observed.
    pub fn classify(&self, id: VcpuId) -> Option<Classification> {
        self.rec.classify(id)
    }

    /// The plan in force (the last one applied).
    pub fn current(&self) -> &Plan {
        &self.current
    }

    /// Periods stepped so far.
    pub fn periods(&self) -> u64 {
        self.periods
    }
}

/// ConSpin_level is "the number of spin-locks performed by its VM" (AQL paper, 3.3.1): each
/// vCPU's spin events become its VM's spin events per second of the VM's run time, scaled to
/// the vCPU's period. Counted per vCPU per wall-clock period instead, the level depends on the
/// CPU share the policy itself gave: a spinning vCPU starved by a long slice exits rarely per
/// wall second, stays below ConSpin_LIMIT and is typed LoLCF, in the pool that starves it.
/// vCPUs without spin events or run time keep their reading as it is.
pub fn normalise_spin(readings: &[Reading]) -> Vec<Reading> {
    let mut per_vm: std::collections::BTreeMap<u64, (u64, u64)> = std::collections::BTreeMap::new();
    for r in readings {
        if let (Some(e), Some(run)) = (r.counters.spin_events, r.counters.run_ns) {
            let v = per_vm.entry(r.id.vm).or_default();
            v.0 = v.0.saturating_add(e);
            v.1 = v.1.saturating_add(run);
        }
    }
    readings
        .iter()
        .map(|r| {
            let mut r = *r;
            if let (Some(_), Some(_)) = (r.counters.spin_events, r.counters.run_ns) {
                let (exits, run) = per_vm[&r.id.vm];
                r.counters.spin_events = Some(spin_events_per_period(exits, run, r.counters.period_ns));
            }
            r
        })
        .collect()
}

/// `exits` over `run_ns` of run time, as a count per `period_ns` of running (0 when nothing
/// ran). Saturates instead of overflowing.
pub fn spin_events_per_period(exits: u64, run_ns: u64, period_ns: u64) -> u64 {
    if run_ns == 0 {
        return 0;
    }
    let v = u128::from(exits) * u128::from(period_ns) / u128::from(run_ns);
    u64::try_from(v).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 30_000_000;

    fn cfg(window: usize) -> ControllerConfig {
        ControllerConfig {
            window,
            decide_every: window,
            confirm: true,
            limits: Limits::default(),
            hysteresis: 0.0,
            topology: Topology::uniform(1, 4),
            quanta: Quanta::paper(),
        }
    }

    fn io(vm: u64, vcpu: u32, events: u64) -> Reading {
        Reading {
            id: VcpuId { vm, vcpu },
            counters: VcpuCounters { period_ns: P, io_events: Some(events), run_ns: Some(P), ..Default::default() },
        }
    }

    fn spin(vm: u64, vcpu: u32, exits: u64, run_ns: u64) -> Reading {
        Reading {
            id: VcpuId { vm, vcpu },
            counters: VcpuCounters {
                period_ns: P,
                io_events: Some(0),
                spin_events: Some(exits),
                run_ns: Some(run_ns),
                ..Default::default()
            },
        }
    }

    #[test]
    fn decides_once_per_window_and_applies_the_first_plan_at_once() {
        let mut c = AqlController::new(cfg(4));
        let live = [VcpuId { vm: 1, vcpu: 0 }];
        for _ in 0..3 {
            assert_eq!(c.step(&live, &[io(1, 0, 900)]), None);
        }
        let d = c.step(&live, &[io(1, 0, 900)]).expect("a decision at the window's end");
        assert!(d.apply && !d.diff.is_empty());
        assert_eq!(c.current(), &d.plan);
        assert_eq!(d.plan.pools[0].quantum_ns, 1_000_000, "IOInt: 1 ms");
        assert_eq!(c.periods(), 4);
        // Nothing changed: decided, nothing to apply.
        let mut last = None;
        for _ in 0..4 {
            last = c.step(&live, &[io(1, 0, 900)]);
        }
        let d = last.unwrap();
        assert!(!d.apply && d.diff.is_empty());
    }

    #[test]
    fn a_changed_plan_is_applied_only_when_two_windows_agree() {
        let mut c = AqlController::new(cfg(1));
        let live = [VcpuId { vm: 1, vcpu: 0 }];
        assert!(c.step(&live, &[io(1, 0, 900)]).unwrap().apply);
        let first = c.current().clone();
        // The vCPU turns CPU-bound (no I/O): the first window proposes (the plan stays the one
        // made from its confirmed type), the second confirms.
        let d = c.step(&live, &[io(1, 0, 0)]).unwrap();
        assert!(!d.apply && d.diff.is_empty() && d.plan == first);
        assert_eq!(c.classify(live[0]).unwrap().class, VcpuClass::CpuBurn, "typed anew, not yet confirmed");
        assert_eq!(c.current(), &first, "not applied yet");
        let d = c.step(&live, &[io(1, 0, 0)]).unwrap();
        assert!(d.apply);
        assert_ne!(c.current(), &first);
        // A type that flaps every window migrates once, into the shorter quantum it wants
        // half the time (IOInt's 1 ms), and stays there.
        let mut applied = 0;
        for i in 0..10 {
            let d = c.step(&live, &[io(1, 0, if i % 2 == 0 { 900 } else { 0 })]).unwrap();
            applied += usize::from(d.apply);
        }
        assert_eq!(applied, 1, "a flapping type migrated {applied} times");
        assert_eq!(c.current(), &first, "back in the 1 ms pool");
    }

    /// Confirmation is per vCPU: one vCPU flapping every window does not hold back another's
    /// settled change (with the whole plan confirmed, no plan ever repeated, and the steady
    /// vCPU never moved).
    #[test]
    fn a_flapping_vcpu_does_not_hold_back_another_ones_change() {
        let mut c = AqlController::new(cfg(1));
        let (flap, steady) = (VcpuId { vm: 1, vcpu: 0 }, VcpuId { vm: 2, vcpu: 0 });
        let live = [flap, steady];
        assert!(c.step(&live, &[io(1, 0, 900), io(2, 0, 900)]).unwrap().apply);
        assert_eq!(c.current().pool_of(&steady).unwrap().quantum_ns, 1_000_000, "IOInt: 1 ms");
        let mut moved = None;
        for i in 0..6 {
            let d = c.step(&live, &[io(1, 0, if i % 2 == 0 { 0 } else { 900 }), io(2, 0, 0)]).unwrap();
            if c.current().pool_of(&steady).unwrap().quantum_ns != 1_000_000 && moved.is_none() {
                moved = Some(i);
                assert!(d.apply);
            }
            assert_eq!(c.current().pool_of(&flap).unwrap().quantum_ns, 1_000_000, "window {i}: the flapping vCPU stays");
        }
        assert_eq!(moved, Some(1), "the steady vCPU's change is applied at its second agreeing window");
    }

    #[test]
    fn spin_is_counted_per_vm_per_run_time() {
        assert_eq!(spin_events_per_period(8, 1_120_000, P), 214);
        assert_eq!(spin_events_per_period(5, 0, P), 0);
        assert_eq!(spin_events_per_period(u64::MAX, 1, u64::MAX), u64::MAX);
        // Two vCPUs of one VM: 1 + 3 exits over 0.1 + 0.1 ms of running, i.e. 20 per ms.
        let n = normalise_spin(&[spin(7, 0, 1, 100_000), spin(7, 1, 3, 100_000), io(8, 0, 5)]);
        assert_eq!(n[0].counters.spin_events, Some(600), "20 per ms of running, 600 per 30 ms period");
        assert_eq!(n[1].counters.spin_events, Some(600));
        assert_eq!(n[2].counters.spin_events, None, "no source stays no source");
        assert_eq!(n[2].counters.io_events, Some(5));
    }

    #[test]
    fn a_starved_spinner_is_typed_conspin_and_a_gone_vcpu_is_forgotten() {
        let mut c = AqlController::new(cfg(4));
        let (a, b) = (VcpuId { vm: 0, vcpu: 0 }, VcpuId { vm: 0, vcpu: 1 });
        let mut d = None;
        for _ in 0..4 {
            // 1 exit per 30 ms of wall time, but in 0.14 ms of running.
            d = c.step(&[a, b], &[spin(0, 0, 1, 140_000), spin(0, 1, 1, 140_000)]);
        }
        assert_eq!(c.classify(a).unwrap().class, VcpuClass::ConSpin);
        assert_eq!(d.unwrap().plan.pool_of(&a).unwrap().quantum_ns, 1_000_000);
        c.step(&[a], &[spin(0, 0, 1, 140_000)]);
        assert!(c.classify(b).is_none(), "vCPU b is gone");
    }

    #[test]
    fn a_vcpu_without_a_reading_yet_is_planned_as_unknown() {
        let mut c = AqlController::new(cfg(1));
        let (a, new) = (VcpuId { vm: 1, vcpu: 0 }, VcpuId { vm: 2, vcpu: 0 });
        let d = c.step(&[a, new], &[io(1, 0, 900)]).unwrap();
        assert!(d.plan.pool_of(&new).is_some(), "every live vCPU gets a pool");
        assert!(c.classify(new).is_none());
    }

    #[test]
    fn the_papers_rule_decides_every_period_and_applies_every_change() {
        let mut c = AqlController::new(ControllerConfig { decide_every: 1, confirm: false, ..cfg(4) });
        let live = [VcpuId { vm: 1, vcpu: 0 }];
        let d = c.step(&live, &[io(1, 0, 900)]).expect("a decision every period");
        assert!(d.apply);
        // One CPU-bound period is not enough to change the window's average (IOInt still wins)...
        assert!(!c.step(&live, &[io(1, 0, 0)]).unwrap().apply);
        // ...but once the window turns, the change is applied in the period it is decided.
        let mut applied = false;
        for _ in 0..4 {
            applied |= c.step(&live, &[io(1, 0, 0)]).unwrap().apply;
        }
        assert!(applied, "applied without a second agreeing decision");
    }
}
