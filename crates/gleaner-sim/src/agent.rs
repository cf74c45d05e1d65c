//! The Gleaner agent inside a simulated guest (the real `gleaner_policy` controller and idle
//! detector), and the host policy's monitoring period.
//!
//! ```text
//!  yielder (SCHED_IDLE, one per active vCPU)        controller (one per VM, every period)
//!  ────────────────────────────────────────         ─────────────────────────────────────
//!  runs when the vCPU has no thread; a stretch      snapshot of T_work, T_yield, T_idle,
//!  of quick yields is fed to IdleDetector when       S_yield per vCPU and S_work (guest view:
//!  it ends; a yield interrupted by work or by       time with a thread current counts as
//!  the host is one slow yield (work only if a       work, steal included, as in schedstat)
//!  thread ran, else noise); Sleep{ns} lets
//!  the vCPU halt until the sleep ends               -> Controller::step -> Deactivate/Restore/
//!                                                      ResetAll applied to the allowed set
//! ```

use gleaner_policy::gleaner::{Decision, Snapshot, VcpuSample};
use gleaner_policy::retention::{FnProbe, RetentionAction};

use crate::engine::{ms_to_ns, Engine, Host, Idle, Ts, YState, NONE};
use crate::policy::{HostView, VcpuCounters};
use crate::queue::{Ev, Ns};

impl Engine {
    fn yield_ns(&self, v: u32) -> Ns {
        let vm = self.vcpus[v as usize].vm as usize;
        ((self.vms[vm].gleaner.yield_us * 1000.0).round() as Ns).max(1)
    }

    /// Feeds one `sched_yield()` duration to the detector (and its mirror); `Some(ns)` = sleep.
    /// `work`: a guest thread ran during the call (else a slow call is noise, as the real
    /// agent sees a yield stretched by the host: no context switch).
    fn feed(&mut self, v: u32, d: Ns, work: bool) -> Option<Ns> {
        let y = self.vcpus[v as usize].yielder.as_mut()?;
        let cfg = *y.det.config();
        if d > cfg.idle_threshold_ns && work {
            y.acc = 0;
        } else {
            y.acc += d;
        }
        match y.det.on_yield_with(d, &mut FnProbe(|| work, || false)) {
            RetentionAction::KeepYielding => None,
            RetentionAction::Sleep { ns } => {
                y.acc = 0;
                Some(ns)
            }
            // `on_yield` never steps aside; the model's guest scheduler has no new-idle
            // balancing for a yielder to get in the way of (docs/sim.md, assumptions).
            RetentionAction::StepAside { .. } => None,
        }
    }

    fn new_stretch(&mut self, v: u32) {
        let yn = self.yield_ns(v);
        let y = self.vcpus[v as usize].yielder.as_mut().expect("yielder");
        let timeout = y.det.config().timeout_ns;
        let left = timeout.saturating_sub(y.acc).max(1);
        y.run_ns = 0;
        y.target_ns = left.div_ceil(yn) * yn;
    }

    /// The yielder (re)starts running. False if it decided to sleep right away.
    pub(crate) fn yield_resume(&mut self, v: u32) -> bool {
        let now = self.now;
        let y = self.vcpus[v as usize].yielder.as_mut().expect("yield state without yielder");
        if let YState::Woken { .. } = y.state {
            y.state = YState::Awake;
        }
        if let Some(pa) = y.paused_at.take() {
            let work = std::mem::take(&mut y.paused_for_work);
            if let Some(ns) = self.feed(v, now - pa, work) {
                self.yielder_sleep(v, ns);
                return false;
            }
        }
        self.new_stretch(v);
        true
    }

    /// The yielder stops running while awake (a thread arrived: `work`, or the host took the
    /// pCPU): the quick yields of the stretch are fed, and the pending call becomes a slow one.
    pub(crate) fn yield_pause(&mut self, v: u32, work: bool) {
        let yn = self.yield_ns(v);
        let Some(y) = self.vcpus[v as usize].yielder.as_mut() else { return };
        if y.state != YState::Awake {
            return;
        }
        y.paused_for_work |= work;
        let k = y.run_ns / yn;
        y.run_ns = 0;
        for _ in 0..k {
            if let Some(ns) = self.feed(v, yn, false) {
                self.yielder_sleep(v, ns);
                return;
            }
        }
        self.vcpus[v as usize].yielder.as_mut().expect("yielder").paused_at = Some(self.now);
    }

    /// The stretch reached the detector's timeout.
    pub(crate) fn yield_timeout(&mut self, v: u32) {
        let yn = self.yield_ns(v);
        let k = {
            let y = self.vcpus[v as usize].yielder.as_mut().expect("yielder");
            let k = y.run_ns / yn;
            y.run_ns = 0;
            k
        };
        for _ in 0..k {
            if let Some(ns) = self.feed(v, yn, false) {
                self.gv_flush(v);
                self.yielder_sleep(v, ns);
                return;
            }
        }
        // The mirror was off: keep yielding with a fresh target.
        self.new_stretch(v);
    }

    fn yielder_sleep(&mut self, v: u32, ns: Ns) {
        let now = self.now;
        let y = self.vcpus[v as usize].yielder.as_mut().expect("yielder");
        y.state = YState::Sleeping { asked: ns, since: now };
        y.gen = y.gen.wrapping_add(1);
        y.paused_at = None;
        y.paused_for_work = false;
        y.run_ns = 0;
        let gen = y.gen;
        self.q.push(now + ns, Ev::YielderTimer { v, gen });
    }

    pub(crate) fn on_yielder_timer(&mut self, v: u32) {
        let vi = v as usize;
        let y = self.vcpus[vi].yielder.as_mut().expect("yielder");
        let YState::Sleeping { asked, since } = y.state else { return };
        y.state = YState::Woken { asked, since };
        if self.vcpus[vi].cur != NONE || !self.allowed[vi] {
            return;
        }
        match self.vcpus[vi].host {
            Host::Running(p) => {
                self.settle(p);
                self.mark_dirty(p);
            }
            Host::Off => self.kick(v, 0),
            Host::Queued(_) => {}
        }
    }

    pub(crate) fn on_gleaner_period(&mut self, vm: u32) {
        let vmi = vm as usize;
        if self.vms[vmi].done_at.is_some() {
            return;
        }
        let period = ms_to_ns(self.vms[vmi].gleaner.period_ms);
        let (base, n) = (self.vms[vmi].vcpu_base, self.vms[vmi].nvcpus);
        let mut samples = Vec::with_capacity(n as usize);
        for i in 0..n {
            let v = base + i;
            self.gv_flush(v);
            let c = &self.vcpus[v as usize].c;
            let cur = (c.gv_work, c.gv_yield, c.gv_idle, c.idle_entries);
            let prev = std::mem::replace(&mut self.vms[vmi].prev[i as usize], cur);
            samples.push(VcpuSample {
                cpu: i,
                t_work_ns: cur.0 - prev.0,
                t_yield_ns: cur.1 - prev.1,
                t_idle_ns: (cur.1 - prev.1) + (cur.2 - prev.2),
                s_yield: cur.3 - prev.3,
            });
        }
        let s_work = self.vms[vmi].s_work - self.vms[vmi].prev_s_work;
        self.vms[vmi].prev_s_work = self.vms[vmi].s_work;
        let snap = Snapshot { period_ns: period, vcpus: samples, s_work };
        let decisions = self.vms[vmi].ctrl.as_mut().expect("controller").step(&snap);
        for d in decisions {
            self.vms[vmi].decisions += 1;
            if self.vms[vmi].decision_log.len() < 10_000 {
                self.vms[vmi].decision_log.push((self.now, format!("{d:?}")));
            }
            match d {
                Decision::Deactivate { cpu } => self.deactivate(base + cpu),
                Decision::Restore { cpu } => self.restore(base + cpu),
                Decision::ResetAll { .. } => {
                    for v in base..base + n {
                        if !self.allowed[v as usize] {
                            self.restore(v);
                        }
                    }
                }
                Decision::SetRho { .. } | Decision::SetEta { .. } => {}
            }
        }
        self.q.push(self.now + period, Ev::GleanerPeriod { vm });
    }

    /// Removes vCPU `v` from the workload's cpuset: its threads move to allowed vCPUs, its
    /// yielder sleeps, and it halts.
    fn deactivate(&mut self, v: u32) {
        let vi = v as usize;
        if !self.allowed[vi] {
            return;
        }
        self.allowed[vi] = false;
        if let Some(y) = self.vcpus[vi].yielder.as_mut() {
            y.gen = y.gen.wrapping_add(1);
        }
        if let Host::Running(p) = self.vcpus[vi].host {
            self.settle(p);
            self.mark_dirty(p);
        }
        let mut moved = Vec::new();
        let vm = self.vcpus[vi].vm as usize;
        let rq = std::mem::take(&mut self.vcpus[vi].rq);
        let mut keep = std::collections::VecDeque::new();
        for t in rq {
            if self.threads[t as usize].pin == NONE {
                self.vms[vm].queued -= 1;
                moved.push(t);
            } else {
                keep.push_back(t);
            }
        }
        self.rqlen[vi] = keep.len() as u32;
        self.vcpus[vi].rq = keep;
        moved.append(&mut self.vcpus[vi].inbox);
        let cur = self.vcpus[vi].cur;
        if cur != NONE && self.threads[cur as usize].pin == NONE {
            self.gv_flush(v);
            self.threads[cur as usize].state = Ts::Runnable;
            self.vcpus[vi].cur = NONE;
            moved.push(cur);
        }
        self.vload[vi] -= moved.len() as u32;
        for t in moved {
            let v2 = self.select_for_migration(t);
            self.deliver(t, v2, v);
        }
        if self.vcpus[vi].yielder.is_some() {
            if self.vcpus[vi].idle == Idle::Yield {
                // Leave the yield state now; the vCPU halts when it is next driven.
                self.yield_pause(v, false);
                self.gv_flush(v);
                self.vcpus[vi].idle = Idle::Busy;
            }
            self.vcpus[vi].yielder.as_mut().expect("yielder").state = YState::Parked;
        }
    }

    fn select_for_migration(&self, t: u32) -> u32 {
        let th = &self.threads[t as usize];
        let vm = &self.vms[th.vm as usize];
        let mut best = NONE;
        for u in vm.vcpu_base..vm.vcpu_base + vm.nvcpus {
            if self.allowed[u as usize] && (best == NONE || self.vload[u as usize] < self.vload[best as usize]) {
                best = u;
            }
        }
        if best == NONE {
            th.vcpu
        } else {
            best
        }
    }

    /// Gives vCPU `v` back to the workload: its yielder wakes and it pulls work when it runs.
    fn restore(&mut self, v: u32) {
        let vi = v as usize;
        if self.allowed[vi] {
            return;
        }
        self.allowed[vi] = true;
        if let Some(y) = self.vcpus[vi].yielder.as_mut() {
            y.det.reset();
            y.acc = 0;
            y.state = YState::Awake;
            y.paused_at = None;
            y.paused_for_work = false;
            y.run_ns = 0;
            y.gen = y.gen.wrapping_add(1);
        }
        match self.vcpus[vi].host {
            Host::Running(p) => {
                self.settle(p);
                self.mark_dirty(p);
            }
            Host::Off => {
                let d = self.costs.ipi;
                self.kick(v, d);
            }
            Host::Queued(_) => {}
        }
    }

    pub(crate) fn on_host_period(&mut self) {
        let Some(period) = self.host_policy.period_ns() else { return };
        for p in 0..self.pcpus.len() as u32 {
            self.settle(p);
        }
        let mut deltas = Vec::with_capacity(self.vcpus.len());
        for (i, vc) in self.vcpus.iter().enumerate() {
            let cur = VcpuCounters {
                vm: vc.vm,
                vcpu: vc.idx,
                io_events: vc.c.io_events,
                ple_exits: vc.c.exits_ple,
                spin_ns: vc.c.spin_ns,
                llc_refs: vc.c.llc_refs,
                llc_misses: vc.c.llc_misses,
                run_ns: vc.c.run_ns,
            };
            let prev = std::mem::replace(&mut self.host_prev[i], cur);
            deltas.push(cur.delta(&prev));
        }
        let view = HostView { now_ns: self.now, period_ns: period, pcpus: self.pcpus.len() as u32, vcpus: &deltas };
        if let Some(plan) = self.host_policy.on_period(&view) {
            if plan.validate(self.pcpus.len() as u32, self.vcpus.len()).is_ok() {
                self.host_plans += 1;
                for v in 0..self.vcpus.len() {
                    if self.vcpus[v].pinned {
                        continue; // pinned vCPUs keep their pCPU
                    }
                    let pool = &plan.pools[plan.assign[v] as usize];
                    let (slice, cpus) = (pool.slice_ns, pool.pcpus.clone());
                    let aff = self.intern_aff(cpus);
                    self.vcpus[v].slice_ns = slice;
                    self.vcpus[v].aff = aff;
                    self.host_migrate_if_needed(v as u32);
                }
            }
        }
        self.q.push(self.now + period, Ev::HostPeriod);
    }
}
