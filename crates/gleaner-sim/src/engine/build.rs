//! Building a VM into the engine: its sync objects, vCPUs and threads, and the agent it runs
//! with (the guest loop as `gleaner_policy::guest::setup` configures it).

use super::*;

impl Engine {
    pub(super) fn add_vm(&mut self, vi: u32, vm: SetupVm, pcpus: u32, shared: bool) {
        let w = &vm.workload;
        let vcpu_base = self.vcpus.len() as u32;
        let bases = self.add_sync_objects(w);
        let retention = vm.guest.retention() && self.virt;
        // The agent's mechanism: kernel polling where the variant offers it (and an agent
        // configuration from the lab offers it too), else yielding threads; beside kernel
        // polling, parked yielders where the governors run (the ladder's Wide level on a
        // saturated VM), as the agent starts them (`gleaner_policy::guest::setup::decide`).
        let kernel_polling =
            retention && vm.gleaner.kernel_polling == Some(true) && vm.gleaner.agent.as_ref().is_none_or(|a| a.means.kernel_polling());
        let beside = vm.gleaner.agent.as_ref().map_or(vm.gleaner.govern, |a| a.means.yielders && a.governor.is_some());
        let yielders = retention && (!kernel_polling || beside);
        let curve = model_curve(&self.costs, shared, kernel_polling);
        // Yielders beside kernel polling start parked at no window, as the agent's do.
        let detector = if kernel_polling { RetentionConfig { timeout_ns: 0, ..vm.gleaner.retention } } else { vm.gleaner.retention };
        self.add_vcpus(vi, &vm, pcpus, yielders.then_some(detector));
        let (alive, pinned_threads) = self.add_threads(vi, &vm, vcpu_base, bases);
        let queued = alive;
        if !vm.background {
            self.fg_alive += 1;
        }
        let consolidation = vm.guest.consolidation() && self.virt;
        let has_agent = consolidation || retention;
        let mechanisms = Mechanisms { retention, kernel_polling, yielders, consolidation };
        let agent = has_agent.then(|| vm_agent(&vm, mechanisms, &curve));
        let windows = vec![if yielders && !kernel_polling { vm.gleaner.retention.timeout_ns } else { 0 }; vm.vcpus as usize];
        self.vms.push(VmState {
            name: vm.name,
            vcpu_base,
            nvcpus: vm.vcpus,
            alive,
            done_at: None,
            background: vm.background,
            guest: vm.guest,
            gleaner: vm.gleaner,
            haltpoll: vm.haltpoll,
            cache: w.cache,
            queued,
            s_work: 0,
            agent,
            period_start: 0,
            windows,
            periods: 0,
            retain_periods: 0,
            prev: vec![(0, 0, 0, 0, 0); vm.vcpus as usize],
            prev_steal: vec![(0, 0); vm.vcpus as usize],
            prev_s_work: 0,
            decisions: 0,
            lat: Hist::default(),
            req: Hist::default(),
            trace: has_agent.then(|| WakeTrace::empty(TraceSource::Model, 0..vm.vcpus)),
            prev_caught: vec![Log2Hist::default(); vm.vcpus as usize],
            kpoll: kernel_polling.then(|| KernelPolling {
                cap_ns: 0,
                always: vec![false; vm.vcpus as usize],
                reset_until: 0,
                shrink: false,
            }),
            prev_poll: vec![0; vm.vcpus as usize],
            pinned_threads,
        });
    }

    /// The workload's sync objects (mutexes, queues, condition variables, barriers, spin
    /// barriers), appended to the engine's: where this VM's numbering starts in each.
    fn add_sync_objects(&mut self, w: &Workload) -> Bases {
        let bases = Bases {
            mutex: self.mutexes.len() as u32,
            queue: self.queues.len() as u32,
            cond: self.conds.len() as u32,
            barrier: self.barriers.len() as u32,
            spin: self.spins.len() as u32,
        };
        for _ in 0..w.mutexes {
            self.mutexes.push(MutexObj { owner: NONE, waiters: VecDeque::new() });
        }
        for (i, &cap) in w.queues.iter().enumerate() {
            self.queues.push(QueueObj {
                stamps: VecDeque::new(),
                stamped: w.records,
                len: 0,
                cap,
                producers: w.queue_producers[i],
                closed: w.queue_producers[i] == 0,
                pop_w: VecDeque::new(),
                push_w: VecDeque::new(),
            });
        }
        for _ in 0..w.conds {
            self.conds.push(CondObj { tokens: 0, waiters: VecDeque::new() });
        }
        for &n in &w.barriers {
            self.barriers.push(BarrierObj { n, arrived: 0, waiters: Vec::new() });
        }
        for &n in &w.spin_barriers {
            self.spins.push(BarrierObj { n, arrived: 0, waiters: Vec::new() });
        }
        bases
    }

    /// The VM's vCPUs, halted, each pinned to its pCPU where the VM is pinned (else first on
    /// pCPU `index mod pcpus`), with a yielding thread where the VM's agent runs yielders.
    fn add_vcpus(&mut self, vi: u32, vm: &SetupVm, pcpus: u32, yielders: Option<RetentionConfig>) {
        let vcpu_base = self.vcpus.len() as u32;
        for i in 0..vm.vcpus {
            let aff = match vm.pin_offset {
                Some(off) => self.intern_aff(vec![off + i]),
                None => 0,
            };
            let last_p = match vm.pin_offset {
                Some(off) => off + i,
                None => (vcpu_base + i) % pcpus,
            };
            let yielder = yielders.map(|cfg| {
                Box::new(Yielder {
                    det: IdleDetector::new(cfg),
                    state: YState::Awake,
                    paused_at: None,
                    paused_for_work: false,
                    run_ns: 0,
                    target_ns: 0,
                    work_at_sleep: None,
                    gen: 0,
                })
            });
            self.vcpus.push(Vcpu {
                vm: vi,
                idx: i,
                host: Host::Off,
                vruntime: 0,
                slice_ns: self.host_slice_ns,
                slice_end: 0,
                aff,
                pinned: vm.pin_offset.is_some(),
                last_p,
                overhead: 0,
                pending_rv: false,
                halt_start: 0,
                rv_due: 0,
                kvm_poll_ns: 0,
                hpolling: false,
                poll_end: 0,
                kick_pending: false,
                inbox: Vec::new(),
                cur: NONE,
                rq: VecDeque::new(),
                gslice_end: 0,
                idle: Idle::Halted,
                spin_since: 0,
                guest_poll_limit: 0,
                idle_since: 0,
                trace_since: Ns::MAX,
                wake_src: NONE,
                queued_since: Ns::MAX,
                steal_ns: 0,
                steal_idle_ns: 0,
                steal_yield_ns: 0,
                boost_until: 0,
                run_start: 0,
                yielder,
                gv_since: 0,
                c: Counters::default(),
            });
            self.vload.push(0);
            self.rqlen.push(0);
            self.allowed.push(true);
        }
    }

    /// The workload's threads, one program per thread group (its ops renumbered into this
    /// VM's sync objects), placed round robin (or pinned) on the vCPUs' run queues: how many
    /// there are, and the pinned ones.
    fn add_threads(&mut self, vi: u32, vm: &SetupVm, vcpu_base: u32, b: Bases) -> (u32, Vec<u32>) {
        let mut alive = 0;
        let mut pinned_threads = Vec::new();
        let mut k = 0u32;
        for g in &vm.workload.groups {
            let prog = self.progs.len() as u32;
            let mut pushes: Vec<u32> = g.ops.iter().filter_map(|o| if let Op::Push(q) = o { Some(b.queue + q) } else { None }).collect();
            pushes.sort_unstable();
            pushes.dedup();
            let ops = g.ops.iter().map(|&o| b.renumber(o)).collect();
            self.progs.push(Prog { ops, iterations: g.iterations, pushes });
            for j in 0..g.threads {
                let pin = if g.pin.is_empty() { NONE } else { g.pin[(j as usize) % g.pin.len()] };
                let v = vcpu_base + if pin != NONE { pin } else { k % vm.vcpus };
                k += 1;
                let t = self.threads.len() as u32;
                if pin != NONE {
                    pinned_threads.push(t);
                }
                self.threads.push(Thread {
                    vm: vi,
                    prog,
                    pc: 0,
                    iter: 0,
                    state: Ts::Runnable,
                    vcpu: v,
                    pin: if pin != NONE { vcpu_base + pin } else { NONE },
                    rem: 0,
                    wake_at: Ns::MAX,
                    wake_state: TargetState::Busy,
                    timer_gen: 0,
                    spinning: false,
                    io_pending: false,
                });
                self.stamps.push(Ns::MAX);
                self.arrivals.push(Ns::MAX);
                self.vcpus[v as usize].rq.push_back(t);
                self.rqlen[v as usize] += 1;
                self.vload[v as usize] += 1;
                alive += 1;
            }
        }
        (alive, pinned_threads)
    }
}

/// Where a VM's numbering starts in each kind of the engine's sync objects.
#[derive(Debug, Clone, Copy)]
struct Bases {
    mutex: u32,
    queue: u32,
    cond: u32,
    barrier: u32,
    spin: u32,
}

impl Bases {
    /// An op of the workload's program with its sync object renumbered into the engine's.
    fn renumber(self, o: Op) -> Op {
        match o {
            Op::Lock(m) => Op::Lock(self.mutex + m),
            Op::Unlock(m) => Op::Unlock(self.mutex + m),
            Op::Push(q) => Op::Push(self.queue + q),
            Op::Pop(q) => Op::Pop(self.queue + q),
            Op::Signal(c) => Op::Signal(self.cond + c),
            Op::Wait(c) => Op::Wait(self.cond + c),
            Op::Barrier(b) => Op::Barrier(self.barrier + b),
            Op::SpinBarrier(b) => Op::SpinBarrier(self.spin + b),
            o => o,
        }
    }
}

/// What a VM's agent runs: retention (kernel polling or yielders) and consolidation.
#[derive(Debug, Clone, Copy)]
struct Mechanisms {
    retention: bool,
    kernel_polling: bool,
    yielders: bool,
    consolidation: bool,
}

/// The VM's guest loop. The lab's predictor gives the agent's own configuration (kernel
/// polling or yielders only where the variant has them); otherwise the model's machine as
/// `gleaner_policy::guest::setup::decide` reads one: kernel polling in both forms where the
/// variant offers it (and yielders beside, parked, where the governors run), else yielders, and
/// no calibration (the variant asked for retention, so it starts on).
fn vm_agent(vm: &SetupVm, m: Mechanisms, curve: &WakeCurve) -> GuestController {
    let Mechanisms { retention, kernel_polling, yielders, consolidation } = m;
    let cpus: Vec<u32> = (0..vm.vcpus).collect();
    // The paper's Gleaner (no governor) runs the paper's controller.
    let params = consolidation.then(|| gleaner_policy::gleaner::Params {
        measured: vm.gleaner.params.measured && vm.gleaner.govern,
        ..vm.gleaner.params.clone()
    });
    if let Some(a) = &vm.gleaner.agent {
        let means = Means {
            poll_window: kernel_polling && a.means.poll_window,
            poll_always: kernel_polling && a.means.poll_always,
            yielders: yielders && a.means.yielders,
        };
        return GuestController::new(GuestConfig { cpus, consolidation: params, means, ..a.clone() });
    }
    let offer = Offer { kernel_polling, poll_window: kernel_polling, poll_always: kernel_polling };
    let s = setup::decide(SetupInput {
        cpus,
        retention,
        // Without the governor the yielders keep the detector's own cap on every vCPU
        // (always-on retention, adaptive below the cap).
        fixed_yield_ns: (yielders && !vm.gleaner.govern).then_some(vm.gleaner.retention.timeout_ns),
        curve: if retention { Ok(curve) } else { Err("no retention".into()) },
        offer: Some(offer),
        kernel_polling: Ok(kernel_polling),
        workload: true,
        governor: vm.gleaner.govern.then_some(vm.gleaner.governor),
        prior: Prior::Fixed(if retention { RetentionMode::On } else { RetentionMode::Off }),
        // The model's host has no CPU cap on a VM (its pCPUs are shared by its own
        // scheduler): no headroom to leave.
        plan: PlanConfig { vm_share: 1.0, ..PlanConfig::default() },
        start: gleaner_policy::guest::StartConfig::default(),
        consolidation: params,
        period_ns: ms_to_ns(vm.gleaner.period_ms),
        priors: LoopPriors::DEFAULT,
        curve_is_prior: false,
        yielders: YielderStart::default(),
    });
    GuestController::new(s.guest)
}
