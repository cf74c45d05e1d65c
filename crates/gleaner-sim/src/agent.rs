//! The Gleaner agent inside a simulated guest: an adapter of the agent's own guest loop
//! (`gleaner_policy::guest::GuestController`: consolidation, the idle planner, the retention
//! governor) and of its yielders' idle detector, and the host policy's monitoring period.
//!
//! ```text
//!  yielder (SCHED_IDLE, one per active vCPU)        every period, per VM
//!  ────────────────────────────────────────         ─────────────────────────────────────
//!  runs when the vCPU has no thread; a stretch      GuestReading: snapshot of T_work,
//!  of quick yields is fed to IdleDetector when       T_yield, T_idle, S_yield per vCPU and
//!  it ends, with the simulated clock; a yield       S_work (guest view, as in schedstat),
//!  interrupted by work or by the host is one        idle per vCPU (halted time, idle
//!  slow yield (work only if a thread ran, else      entries, yielder time); the model
//!  noise); Sleep{ns} lets the vCPU halt until       tracer's period (idle-task periods by
//!  the sleep ends; after it the detector learns     how they ended, wakeup latency by target
//!  whether a thread ran meanwhile; the periods      state, as the eBPF tracer reports them);
//!  it caught (IdleDetector::caught)                 each yielder's catches since last period
//!                                                   -> GuestController::step -> active set
//!  the plan's window caps the detector's               applied; retention on/off and each
//!  timeout (IdleDetector::set_cap)                     yielder's window (0: parked); the next
//!                                                      period after next_period_share x period
//! ```
//!
//! The planner prices windows with the model's own wake costs ([`crate::engine::model_curve`]:
//! a halted vCPU's cost by idle gap, flat without an RV curve; the POLL state where the
//! variant offers the agent kernel polling), so the simulated agent plans as the real one
//! would on a machine with those costs. With kernel polling the plan's haltpoll window and
//! always-polling vCPUs are applied as the agent applies them (`kernel_poll_apply`), and no
//! yielding threads run.

use gleaner_policy::gleaner::{Snapshot, VcpuSample};
use gleaner_policy::guest::{GuestReading, VcpuIdle, WindowReset};
use gleaner_policy::idle::{IdlePlan, TraceSource, WakeTrace};
use gleaner_policy::num::saturating_u64;
use gleaner_policy::retention::{KnownProbe, RetentionAction};

use crate::engine::{Engine, Host, Idle, Ts, YState, GOVERNOR_SWITCH_NS, GV_IDLE, GV_WORK, GV_YIELD, NONE};
use crate::policy::{HostView, SimVcpuCounters};
use crate::queue::{Ev, Ns};

impl Engine {
    fn yield_ns(&self, v: u32) -> Ns {
        let vm = self.vcpus[v as usize].vm as usize;
        saturating_u64((self.vms[vm].gleaner.yield_us * 1000.0).round()).max(1)
    }

    /// Feeds one `sched_yield()` call of length `d` that ended at `end` to the detector;
    /// `Some(ns)` = sleep. `work`: a guest thread ran during the call (else a slow call is
    /// noise, as the real agent sees a yield stretched by the host: no context switch).
    fn feed(&mut self, v: u32, d: Ns, work: bool, end: Ns) -> Option<Ns> {
        let vi = v as usize;
        let gv_work = self.vcpus[vi].c.gv[GV_WORK];
        let y = self.vcpus[vi].yielder.as_mut()?;
        let ran_while_asleep = y.work_at_sleep.take().is_some_and(|w| w != gv_work);
        // The model knows what happened. It never steps aside: its guest scheduler has no
        // new-idle balancing for a yielder to get in the way of (docs/sim.md, assumptions).
        match y.det.on_yield_at(end, d, &mut KnownProbe { other_task_ran: work, ran_while_asleep }) {
            RetentionAction::KeepYielding | RetentionAction::StepAside { .. } => None,
            RetentionAction::Sleep { ns } => Some(ns),
        }
    }

    /// Feeds the `k` quick yields of a stretch that began at `start`; `Some(ns)` = sleep.
    /// Summed by the detector itself (`IdleDetector::on_yields_at`): a stretch costs O(1), not
    /// one call per yield (a stretch of an always-on yielder is its whole idle period).
    fn feed_stretch(&mut self, v: u32, start: Ns, k: u64) -> Option<Ns> {
        if k == 0 {
            return None;
        }
        let yn = self.yield_ns(v);
        let vi = v as usize;
        let gv_work = self.vcpus[vi].c.gv[GV_WORK];
        let y = self.vcpus[vi].yielder.as_mut()?;
        let ran_while_asleep = y.work_at_sleep.take().is_some_and(|w| w != gv_work);
        // As `feed`, call by call: no thread ran during a quick yield; the model never steps
        // aside (its probe sees nobody waiting), so only a sleep ends the stretch early.
        match y.det.on_yields_at(start, k, yn, &mut KnownProbe { other_task_ran: false, ran_while_asleep }) {
            RetentionAction::KeepYielding | RetentionAction::StepAside { .. } => None,
            RetentionAction::Sleep { ns } => Some(ns),
        }
    }

    fn new_stretch(&mut self, v: u32) {
        let yn = self.yield_ns(v);
        let y = self.vcpus[v as usize].yielder.as_mut().expect("yielder");
        let left = y.det.timeout_ns().saturating_sub(y.det.idle_ns()).max(1);
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
            if let Some(ns) = self.feed(v, now - pa, work, now) {
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
        let start = self.now - y.run_ns;
        y.run_ns = 0;
        if let Some(ns) = self.feed_stretch(v, start, k) {
            self.yielder_sleep(v, ns);
            return;
        }
        self.vcpus[v as usize].yielder.as_mut().expect("yielder").paused_at = Some(self.now);
    }

    /// The stretch reached the detector's timeout.
    pub(crate) fn yield_timeout(&mut self, v: u32) {
        let yn = self.yield_ns(v);
        let (start, k) = {
            let y = self.vcpus[v as usize].yielder.as_mut().expect("yielder");
            let k = y.run_ns / yn;
            let start = self.now - y.run_ns;
            y.run_ns = 0;
            (start, k)
        };
        if let Some(ns) = self.feed_stretch(v, start, k) {
            self.gv_flush(v);
            self.yielder_sleep(v, ns);
            return;
        }
        // The stretch ended short of the timeout (rounding): keep yielding with a fresh target.
        self.new_stretch(v);
    }

    fn yielder_sleep(&mut self, v: u32, ns: Ns) {
        let now = self.now;
        self.gv_flush(v);
        let gv_work = self.vcpus[v as usize].c.gv[GV_WORK];
        let y = self.vcpus[v as usize].yielder.as_mut().expect("yielder");
        y.work_at_sleep = Some(gv_work);
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

    /// One period of the guest loop: the counters since the last period, read as the agent
    /// reads them, go to the one `GuestController` (consolidation, idle planner, governor),
    /// and its step is applied: the active set, retention on or off, each yielder's window.
    pub(crate) fn on_gleaner_period(&mut self, vm: u32) {
        let vmi = vm as usize;
        if self.vms[vmi].done_at.is_some() {
            return;
        }
        let reading = self.guest_reading(vmi);
        let Some(agent) = self.vms[vmi].agent.as_mut() else { return };
        let step = agent.step(&reading);
        self.vms[vmi].decisions += step.decisions.len() as u64;
        let (base, n) = (self.vms[vmi].vcpu_base, self.vms[vmi].nvcpus);
        // The active set as the agent reads it (which vCPUs the workload may use); the
        // decisions are only counted.
        if self.vms[vmi].agent.as_ref().is_some_and(|a| a.config().consolidation.is_some()) {
            self.apply_active(base, n, &step.active);
        }
        // Every yielder follows the plan: a vCPU it gives no yielding window (kernel
        // polling or halt, in an agent configuration from the lab) parks its yielder.
        if self.has_yielders(vmi) {
            let windows: Vec<u64> = (0..n).map(|i| step.plan.yield_window(i, true)).collect();
            let hold = step.governor.is_some_and(|g| g.hold_timeouts);
            self.retention_apply(vm, step.mode.is_on(), &windows, hold);
        }
        if self.vms[vmi].kpoll.is_some() {
            // The period is counted once: by the yielders' apply where they run beside.
            let count = !self.has_yielders(vmi);
            self.kernel_poll_apply(vm, step.mode.is_on(), &step.plan, count, step.reset_poll_windows);
        }
        self.vms[vmi].period_start = self.now;
        self.q.push(self.now + step.next_period_ns, Ev::GleanerPeriod { vm });
    }

    /// The period's reading of VM `vmi`, as the agent takes it: each vCPU's counters, the
    /// workload's sync points, the model tracer's period, the yielders' catches and the
    /// pinned threads' vCPUs.
    fn guest_reading(&mut self, vmi: usize) -> GuestReading {
        let elapsed = self.now.saturating_sub(self.vms[vmi].period_start).max(1);
        let (samples, idle) = self.vcpu_readings(vmi);
        let (base, n) = (self.vms[vmi].vcpu_base, self.vms[vmi].nvcpus);
        let s_work = self.vms[vmi].s_work - self.vms[vmi].prev_s_work;
        self.vms[vmi].prev_s_work = self.vms[vmi].s_work;
        // The model tracer's period (the agent traces a slice of one period in five; the
        // model traces every period whole), and each yielder's catches, which no tracer sees.
        let trace = self.vms[vmi].trace.as_mut().map(|t| {
            let mut done = std::mem::replace(t, WakeTrace::empty(TraceSource::Model, 0..n));
            done.traced_ns = elapsed;
            done
        });
        let mut caught = Vec::new();
        for i in 0..n {
            let Some(y) = self.vcpus[(base + i) as usize].yielder.as_ref() else { continue };
            let now = y.det.caught().clone();
            let delta = now.delta_since(&self.vms[vmi].prev_caught[i as usize]);
            if delta.count() > 0 {
                caught.push((i, delta));
            }
            self.vms[vmi].prev_caught[i as usize] = now;
        }
        // The model's threads synchronize but move no bytes: the governor judges by sync points.
        let io = gleaner_policy::retention::WorkloadIo::default();
        // The model's tracer follows every thread of the VM's workload: it misses none.
        // The vCPUs of the pinned threads still running, as the agent reads them.
        let mut pinned: Vec<u32> = self.vms[vmi]
            .pinned_threads
            .iter()
            .map(|&t| &self.threads[t as usize])
            .filter(|th| th.state != Ts::Done)
            .map(|th| th.pin - base)
            .collect();
        pinned.sort_unstable();
        pinned.dedup();
        GuestReading {
            snapshot: Snapshot { period_ns: elapsed, vcpus: samples, s_work, pinned },
            idle,
            trace,
            caught,
            io,
            // No user counter, and the model's agent costs nothing.
            counter: None,
            agent_work_ns: 0,
            trace_missed: 0.0,
        }
    }

    /// Each vCPU's period: the controller's sample (work, yield and idle time, idle entries)
    /// and `/proc/stat`'s and cpuidle's view (halted and polling time is idle, the yielder's
    /// time busy; the POLL state's time is the agent's kernel polling).
    fn vcpu_readings(&mut self, vmi: usize) -> (Vec<VcpuSample>, Vec<VcpuIdle>) {
        let (base, n) = (self.vms[vmi].vcpu_base, self.vms[vmi].nvcpus);
        let mut samples = Vec::with_capacity(n as usize);
        let mut idle = Vec::with_capacity(n as usize);
        for i in 0..n {
            let v = base + i;
            self.gv_flush(v);
            let vc = &self.vcpus[v as usize];
            let c = &vc.c;
            let cur = (c.gv[GV_WORK], c.gv[GV_YIELD], c.gv[GV_IDLE], c.idle_entries, vc.steal_ns);
            let stolen = (vc.steal_idle_ns, vc.steal_yield_ns);
            let polled = c.gpoll_ns - std::mem::replace(&mut self.vms[vmi].prev_poll[i as usize], c.gpoll_ns);
            let prev = std::mem::replace(&mut self.vms[vmi].prev[i as usize], cur);
            let stolen_before = std::mem::replace(&mut self.vms[vmi].prev_steal[i as usize], stolen);
            samples.push(VcpuSample {
                cpu: i,
                t_work_ns: cur.0 - prev.0,
                t_yield_ns: cur.1 - prev.1,
                t_idle_ns: (cur.1 - prev.1) + (cur.2 - prev.2),
                s_yield: cur.3 - prev.3,
            });
            // As a Linux guest's `/proc/stat` counts them: steal apart, idle and the yielders'
            // time without the waits for a pCPU in them; a guest without steal (TCG) has the
            // waits in them and no steal.
            let (steal_ns, taken) =
                if self.guest_steal { (cur.4 - prev.4, (stolen.0 - stolen_before.0, stolen.1 - stolen_before.1)) } else { (0, (0, 0)) };
            let idle_ns = (cur.2 - prev.2).saturating_sub(taken.0);
            idle.push(VcpuIdle {
                cpu: i,
                idle_ns,
                entries: Some(cur.3 - prev.3),
                poll_ns: polled.min(idle_ns),
                yield_ns: (cur.1 - prev.1).saturating_sub(taken.1),
                steal_ns,
            });
        }
        (samples, idle)
    }

    /// Makes the VM's allowed vCPUs (`base..base + n`) the controller's `active` set (indices in
    /// the VM): vCPUs taken back first, then those given up, in vCPU order.
    fn apply_active(&mut self, base: u32, n: u32, active: &[u32]) {
        for i in 0..n {
            if active.contains(&i) && !self.allowed[(base + i) as usize] {
                self.restore(base + i);
            }
        }
        for i in 0..n {
            if !active.contains(&i) && self.allowed[(base + i) as usize] {
                self.deactivate(base + i);
            }
        }
    }

    /// Whether the VM's guest runs yielding threads (a retention or gleaner variant).
    pub(crate) fn has_yielders(&self, vmi: usize) -> bool {
        self.vcpus[self.vms[vmi].vcpu_base as usize].yielder.is_some()
    }

    /// The start plan, before anything ran: yielders of vCPUs that do not yield are parked
    /// (a period is not counted).
    pub(crate) fn start_retention(&mut self, vm: u32, on: bool, windows: &[u64]) {
        let vmi = vm as usize;
        for (i, &w) in windows.iter().enumerate() {
            let v = self.vms[vmi].vcpu_base + i as u32;
            self.vms[vmi].windows[i] = if on { w } else { 0 };
            if let Some(y) = self.vcpus[v as usize].yielder.as_mut() {
                if w > 0 {
                    y.det.set_cap(w);
                }
            }
            if !(on && w > 0) {
                self.park_yielder(v);
            }
        }
    }

    /// Applies the plan's kernel polling as the agent does (`IdleActuator::apply`): with
    /// retention on and a plan that polls, the haltpoll window fixed at `poll_window_ns`
    /// (`reset`: a shrink turns shrinking to nothing on until the next apply, so a vCPU's next
    /// halt longer than the cap zeroes its own window; a switch sets every vCPU's own window back
    /// to 0, the governor switched away and back, no polling for [`GOVERNOR_SWITCH_NS`]; a
    /// lowered cap alone leaves them) and `poll_always`
    /// polling until work; otherwise the machine's own settings, which in the model are the
    /// stock guest's (halt; the agent's restore, or its switch, resets the windows). A vCPU polling now
    /// follows at once (an always poller that no longer is polls out its own window from
    /// now, or halts). `count`: a period of the guest loop (not the start plan).
    pub(crate) fn kernel_poll_apply(&mut self, vm: u32, on: bool, plan: &IdlePlan, count: bool, reset: WindowReset) {
        let vmi = vm as usize;
        let (base, n) = (self.vms[vmi].vcpu_base, self.vms[vmi].nvcpus);
        if count {
            self.vms[vmi].periods += 1;
            self.vms[vmi].retain_periods += u64::from(on);
        }
        // A plan in which nothing polls (every vCPU halts, or yields) leaves the kernel as found.
        let retains = on && plan.polls();
        let cap = if retains { plan.poll_window_ns } else { 0 };
        let always: Vec<bool> = (0..n).map(|i| retains && plan.poll_always.contains(&i)).collect();
        let Some(kp) = self.vms[vmi].kpoll.as_mut() else { return };
        let now = self.now;
        // The agent's restore to the machine's settings resets the windows where it writes the
        // cap back (a cap over the stock 0), and a switch asked for with it resets them where it
        // does not (a cap already back at 0, a vCPU polled until work); only a reset while
        // polling goes on halts a workload that polls.
        kp.shrink = retains && reset == WindowReset::Shrink;
        let switch = reset == WindowReset::Switch && retains;
        let reset = switch || (!retains && (kp.cap_ns > 0 || reset == WindowReset::Switch));
        if switch {
            kp.reset_until = now + GOVERNOR_SWITCH_NS;
        }
        kp.cap_ns = cap;
        kp.always.clone_from(&always);
        for i in 0..n {
            let vi = (base + i) as usize;
            if reset {
                self.vcpus[vi].guest_poll_limit = 0;
            }
            let Idle::Poll { until } = self.vcpus[vi].idle else { continue };
            let limit = self.vcpus[vi].guest_poll_limit;
            let to = if always[i as usize] {
                Ns::MAX
            } else if until == Ns::MAX || reset {
                now + limit
            } else {
                until
            };
            if to != until {
                if let Host::Running(p) = self.vcpus[vi].host {
                    self.settle(p);
                    self.mark_dirty(p);
                }
                self.vcpus[vi].idle = Idle::Poll { until: to };
            }
        }
    }

    /// Applies the guest loop's retention: on or off, each vCPU's yielding window (its
    /// detector's cap; 0 parks that vCPU's yielder), and whether the timeouts are held at it.
    fn retention_apply(&mut self, vm: u32, on: bool, windows: &[u64], hold: bool) {
        let vmi = vm as usize;
        let (base, n) = (self.vms[vmi].vcpu_base, self.vms[vmi].nvcpus);
        self.vms[vmi].periods += 1;
        self.vms[vmi].retain_periods += u64::from(on);
        for i in 0..n {
            let v = base + i;
            let w = windows.get(i as usize).copied().unwrap_or(0);
            self.vms[vmi].windows[i as usize] = if on { w } else { 0 };
            if let Some(y) = self.vcpus[v as usize].yielder.as_mut() {
                if w > 0 {
                    y.det.set_cap(w);
                }
                y.det.hold_at_cap(hold);
            }
            let parked = self.vcpus[v as usize].yielder.as_ref().is_some_and(|y| y.state == YState::Parked);
            let yields = on && w > 0;
            if yields && parked && self.allowed[v as usize] {
                self.wake_yielder(v);
                self.kick_idle(v);
            } else if !yields && !parked {
                self.park_yielder(v);
            }
        }
    }

    /// Parks vCPU `v`'s yielder (deactivated vCPU, or retention off): if it is yielding now,
    /// the vCPU leaves the yield state and halts when it is next driven (which it is made to
    /// be, with or without a yielder).
    fn park_yielder(&mut self, v: u32) {
        let vi = v as usize;
        if let Some(y) = self.vcpus[vi].yielder.as_mut() {
            y.gen = y.gen.wrapping_add(1);
        }
        if let Host::Running(p) = self.vcpus[vi].host {
            self.settle(p);
            self.mark_dirty(p);
        }
        if self.vcpus[vi].yielder.is_none() {
            return;
        }
        if self.vcpus[vi].idle == Idle::Yield {
            self.yield_pause(v, false);
            self.gv_flush(v);
            self.vcpus[vi].idle = Idle::Busy;
        }
        self.vcpus[vi].yielder.as_mut().expect("yielder").state = YState::Parked;
    }

    /// Wakes vCPU `v`'s parked yielder (reactivated vCPU, or retention on): it forgets the idle
    /// period it was in (keeping its timeout) and runs when the vCPU, kicked by the caller,
    /// has no thread.
    fn wake_yielder(&mut self, v: u32) {
        let vi = v as usize;
        let Some(y) = self.vcpus[vi].yielder.as_mut() else { return };
        if y.state != YState::Parked {
            return;
        }
        y.det.reset();
        y.state = YState::Awake;
        y.paused_at = None;
        y.paused_for_work = false;
        y.run_ns = 0;
        y.work_at_sleep = None;
        y.gen = y.gen.wrapping_add(1);
    }

    /// Makes vCPU `v` look for work: settles it if it runs, else sends it an IPI.
    fn kick_idle(&mut self, v: u32) {
        match self.vcpus[v as usize].host {
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

    /// Removes vCPU `v` from the workload's cpuset: its threads move to allowed vCPUs, its
    /// yielder sleeps, and it halts.
    fn deactivate(&mut self, v: u32) {
        let vi = v as usize;
        if !self.allowed[vi] {
            return;
        }
        self.allowed[vi] = false;
        self.park_yielder(v);
        let mut moved = Vec::new();
        let vm = self.vcpus[vi].vm as usize;
        let rq = std::mem::take(&mut self.vcpus[vi].rq);
        let mut keep = std::collections::VecDeque::new();
        // Every thread moves, pinned ones too: Linux intersects a thread's own affinity with
        // the cpuset and, when nothing is left, runs it anywhere in the cpuset (a thread pinned
        // to this vCPU returns to it once the vCPU is given back: `select_vcpu`).
        for t in rq {
            if self.threads[t as usize].pin == NONE || self.threads[t as usize].pin == v {
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
        if cur != NONE && (self.threads[cur as usize].pin == NONE || self.threads[cur as usize].pin == v) {
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
        let vm = self.vcpus[vi].vm as usize;
        let i = (v - self.vms[vm].vcpu_base) as usize;
        if self.vms[vm].windows[i] > 0 {
            self.wake_yielder(v);
        }
        self.kick_idle(v);
    }

    pub(crate) fn on_host_period(&mut self) {
        let Some(period) = self.host_policy.period_ns() else { return };
        for p in 0..self.pcpus.len() as u32 {
            self.settle(p);
        }
        let mut deltas = Vec::with_capacity(self.vcpus.len());
        for (i, vc) in self.vcpus.iter().enumerate() {
            let (llc_refs, llc_misses) = vc.c.llc(&self.vms[vc.vm as usize].cache);
            let cur = SimVcpuCounters {
                vm: vc.vm,
                vcpu: vc.idx,
                io_events: vc.c.io_events,
                ple_exits: vc.c.exits_ple,
                spin_ns: vc.c.spin_ns,
                llc_refs,
                llc_misses,
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
