//! The discrete-event engine: state of pCPUs, vCPUs, threads and sync objects, the main loop,
//! and the host scheduler. Guest scheduling lives in [`crate::guest`], the Gleaner agent and
//! host policies in [`crate::agent`].
//!
//! ```text
//!   pCPU p ──runs──> vCPU v ──runs──> thread t | yielder | guest poll | (halted: KVM polls)
//!      │               │
//!      │ rq: vCPUs      │ rq: threads, inbox: threads whose IPI is in flight
//!      │ (fair share,   │ (round robin, newidle stealing, wake to an idle vCPU)
//!      │  wakeup preemption, KVM halt polling)
//! ```
//!
//! Every change to what a pCPU runs follows one pattern: `settle(p)` (account the time since
//! the last event), mutate, then `drive(p)` (handle whatever boundary is reached now, repeat)
//! and `replan(p)` (schedule the pCPU's next boundary with a fresh generation number, which
//! makes the previous event stale). Wake-ups that touch another pCPU mark it dirty; dirty
//! pCPUs are driven after the current event, so handlers never recurse.

use std::collections::VecDeque;

use gleaner_policy::guest::setup::{self, Offer, Prior, SetupInput};
use gleaner_policy::guest::{GuestConfig, GuestController, LoopPriors, WindowReset};
use gleaner_policy::idle::{CurvePoint, Log2Hist, Means, Mechanism, PlanConfig, TargetState, TraceSource, WakeCurve, WakeTrace};
use gleaner_policy::num::saturating_u64;
use gleaner_policy::retention::{IdleDetector, RetentionMode};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::policy::{HostPolicy, SimVcpuCounters};
use crate::queue::{Ev, EventQueue, Ns};
use crate::scenario::{Costs, GleanerCfg, GuestHaltpollCfg};
use crate::stats::RetentionOutcome;
use crate::stats::{Hist, VmOutcome};
use crate::workload::{CacheProfile, Op, Workload};
use gleaner_policy::IdlePolicy;

pub(crate) const NONE: u32 = u32::MAX;

/// KVM halt-polling parameters (`None` in [`Setup`] disables halt polling).
#[derive(Debug, Clone, Copy)]
pub struct HaltPoll {
    pub max_ns: u64,
    pub grow: u64,
    pub grow_start: u64,
    pub shrink: u64,
}

/// One VM as the engine sees it.
#[derive(Debug, Clone)]
pub struct SetupVm {
    pub name: String,
    pub workload: Workload,
    pub vcpus: u32,
    /// Pin vCPU i to pCPU `offset + i`.
    pub pin_offset: Option<u32>,
    pub background: bool,
    pub guest: IdlePolicy,
    pub gleaner: GleanerCfg,
    pub haltpoll: GuestHaltpollCfg,
}

/// Everything one run needs.
#[derive(Debug)]
pub struct Setup {
    pub pcpus: u32,
    pub host_slice_ns: Ns,
    pub wakeup_preemption: bool,
    pub wakeup_gran_ns: Ns,
    pub guest_slice_ns: Ns,
    pub halt_poll: Option<HaltPoll>,
    pub ple_window_ns: Ns,
    /// Periodic host load balancing interval (`None`: only idle pCPUs pull queued vCPUs).
    pub balance_ns: Option<Ns>,
    /// False for the native baseline: no exits, no halt polling, PM costs.
    pub virt: bool,
    pub costs: Costs,
    pub vms: Vec<SetupVm>,
    pub seed: u64,
    pub stop_at: Option<Ns>,
    pub max_ns: Ns,
    pub host_policy: Box<dyn HostPolicy>,
}

/// A set of pCPUs a vCPU may run on.
pub(crate) struct Aff {
    pub cpus: Vec<u32>,
    pub member: Vec<bool>,
}

pub(crate) struct Pcpu {
    pub cur: u32,
    pub rq: Vec<u32>,
    pub seg_start: Ns,
    pub last: u32,
    pub dirty: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Host {
    Off,
    Queued(u32),
    Running(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Idle {
    /// Running (or preempted in) a workload thread.
    Busy,
    /// The Gleaner yielding thread runs.
    Yield,
    /// The guest polls (haltpoll, idle=poll) until `until`.
    Poll { until: Ns },
    /// The guest executed HLT (the host may be polling: `hpolling`).
    Halted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum YState {
    Awake,
    Sleeping {
        asked: Ns,
        since: Ns,
    },
    /// Woken from a sleep, not yet run: `on_sleep_end` is fed when it runs.
    Woken {
        asked: Ns,
        since: Ns,
    },
    Parked,
}

pub(crate) struct Yielder {
    pub det: IdleDetector,
    pub state: YState,
    /// When the yielder last stopped running while awake (its pending yield call started).
    pub paused_at: Option<Ns>,
    /// A guest thread ran since `paused_at` (the pending slow yield is work); false when only
    /// the host took the pCPU (noise to the real agent, which sees no context switch).
    pub paused_for_work: bool,
    /// Running time of the current stretch of quick yields.
    pub run_ns: Ns,
    /// Running time at which the current stretch times out (from the detector's timeout and
    /// accumulated idle time; the detector itself decides).
    pub target_ns: Ns,
    /// The vCPU's guest-visible work time when the yielder went to sleep: a change when it
    /// runs again means a thread ran meanwhile (`YieldProbe::ran_while_asleep`).
    pub work_at_sleep: Option<Ns>,
    pub gen: u32,
}

/// Where [`Counters::gv`] keeps the guest view's work, yielding and idle time.
pub(crate) const GV_WORK: usize = 0;
pub(crate) const GV_YIELD: usize = 1;
pub(crate) const GV_IDLE: usize = 2;

/// Per-vCPU counters. `repr(C)` in this order: the ones `settle` adds to on every event share
/// one cache line (see [`Vcpu`]), all of them (`hpoll_ns` was on the next).
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
pub(crate) struct Counters {
    // The first cache line: what `settle` adds to.
    pub run_ns: u64,
    pub overhead_ns: u64,
    pub work_ns: u64,
    pub spin_ns: u64,
    pub yield_ns: u64,
    pub gpoll_ns: u64,
    pub hpoll_ns: u64,
    /// Working-set refills after another vCPU ran on the pCPU. The LLC references and misses
    /// are derived from these and `work_ns` ([`Counters::llc`]), not summed per segment: a
    /// floating-point multiply, divide and two dependent adds on every `settle` were a tenth
    /// of the run's time.
    pub refills: u64,
    /// Guest view: time with a workload thread current, yielding, idle (halted or polling),
    /// at [`GV_WORK`], [`GV_YIELD`] and [`GV_IDLE`]: an array, so that `gv_flush` adds to one
    /// picked without a branch.
    pub gv: [u64; 3],
    pub idle_entries: u64,
    pub exits_hlt: u64,
    pub exits_ipi: u64,
    pub io_events: u64,
    pub exits_timer: u64,
    pub exits_ple: u64,
    pub exits_io: u64,
    pub hpoll_attempts: u64,
    pub hpoll_success: u64,
}

impl Counters {
    /// The LLC references and misses of this much work and these refills, for a VM that uses
    /// the cache as `cache` says: `refs_per_us` references a microsecond of work, `miss_ratio`
    /// of them missing, and a refill of the working set 16 references a KiB, each a miss.
    pub(crate) fn llc(&self, cache: &CacheProfile) -> (f64, f64) {
        let refs = ns_f64(self.work_ns) * cache.refs_per_us / 1000.0;
        let refill = ns_f64(self.refills) * cache.wss_kb * 16.0;
        (refs + refill, refs * cache.miss_ratio + refill)
    }
}

/// A vCPU, host and guest side.
///
/// `repr(C)`, aligned to a cache line, hottest fields first: with 256 vCPUs the array is far
/// larger than L1, and letting the compiler order the fields spread what `settle`, `drive` and
/// `replan` touch on every event over several lines. Line 1: what the per-event step reads;
/// line 2: queue and host state, guest-view clock; line 3: the counters `settle` updates;
/// the rest is touched rarely.
#[repr(C, align(64))]
pub(crate) struct Vcpu {
    // line 1
    pub vruntime: u64,
    pub overhead: Ns,
    pub slice_end: Ns,
    pub gslice_end: Ns,
    pub spin_since: Ns,
    pub cur: u32,
    pub vm: u32,
    pub idle: Idle,
    // line 2
    pub rq: VecDeque<u32>,
    pub host: Host,
    pub poll_end: Ns,
    pub gv_since: Ns,
    pub hpolling: bool,
    pub kick_pending: bool,
    pub pending_rv: bool,
    pub pinned: bool,
    pub last_p: u32,
    // lines 3-5
    pub c: Counters,
    // cold
    pub idx: u32,
    /// Index into `Engine::affs`.
    pub aff: u32,
    pub slice_ns: Ns,
    pub halt_start: Ns,
    /// RV owed when `pending_rv` is charged: the resume cost after the halt that just ended
    /// (`Costs::rv_at` its length).
    pub rv_due: Ns,
    pub kvm_poll_ns: u64,
    pub guest_poll_limit: u64,
    pub idle_since: Ns,
    /// When the guest's idle task got the vCPU (halted or polling; `Ns::MAX`: it has not),
    /// and who woke a thread onto it last (`NONE`: a timer or device): the model tracer's
    /// idle periods, as the scheduler tracer sees them (a yielding thread is not idle).
    pub trace_since: Ns,
    pub wake_src: u32,
    /// Since when the vCPU waits in a host run queue (`Ns::MAX`: it does not), and the time
    /// it waited so far: `/proc/stat`'s steal, as the guest sees it.
    pub queued_since: Ns,
    pub steal_ns: u64,
    pub inbox: Vec<u32>,
    /// Boxed: the detector is 960 bytes, which made a `Vcpu` 22 cache lines (7 now), its hot
    /// lines a stride of 1.4 KB apart.
    pub yielder: Option<Box<Yielder>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ts {
    Runnable,
    Running,
    Blocked,
    Done,
}

/// A guest thread. Aligned to a cache line: at its natural 56 bytes most threads straddle two
/// lines, and one is touched on nearly every event.
#[repr(align(64))]
pub(crate) struct Thread {
    pub vm: u32,
    pub prog: u32,
    pub pc: u32,
    pub iter: u64,
    pub state: Ts,
    pub vcpu: u32,
    pub pin: u32,
    pub rem: Ns,
    pub wake_at: Ns,
    pub timer_gen: u32,
    pub spinning: bool,
    pub io_pending: bool,
    /// The state of the vCPU it was last woken onto, when woken (the model tracer's split).
    pub wake_state: TargetState,
}

pub(crate) struct Prog {
    pub ops: Vec<Op>,
    pub iterations: Option<u64>,
    /// Global queue indices this program pushes to.
    pub pushes: Vec<u32>,
}

pub(crate) struct MutexObj {
    pub owner: u32,
    pub waiters: VecDeque<u32>,
}
pub(crate) struct QueueObj {
    /// The stamps of the queued items, oldest first (only in VMs whose workload records
    /// request latencies: `stamped`).
    pub stamps: VecDeque<Ns>,
    pub stamped: bool,
    pub len: u32,
    pub cap: u32,
    pub producers: u32,
    pub closed: bool,
    pub pop_w: VecDeque<u32>,
    pub push_w: VecDeque<u32>,
}
pub(crate) struct CondObj {
    pub tokens: u64,
    pub waiters: VecDeque<u32>,
}
pub(crate) struct BarrierObj {
    pub n: u32,
    pub arrived: u32,
    pub waiters: Vec<u32>,
}

pub(crate) struct VmState {
    pub name: String,
    pub vcpu_base: u32,
    pub nvcpus: u32,
    pub alive: u32,
    pub done_at: Option<Ns>,
    pub background: bool,
    pub guest: IdlePolicy,
    pub gleaner: GleanerCfg,
    pub haltpoll: GuestHaltpollCfg,
    pub cache: CacheProfile,
    /// Threads waiting in vCPU run queues (for stealing).
    pub queued: u32,
    pub s_work: u64,
    /// The guest loop (`gleaner_policy::guest::GuestController`, the agent's own): the
    /// consolidation controller, the idle planner and the retention governor; `None` when
    /// the variant has neither consolidation nor retention.
    pub agent: Option<GuestController>,
    /// When the current Gleaner period began.
    pub period_start: Ns,
    /// Each vCPU's yielding window now: the plan's while retention is on, 0 (its yielder
    /// parked) while it is off or the plan gives that vCPU none.
    pub windows: Vec<u64>,
    /// Periods, and periods with retention on.
    pub periods: u64,
    pub retain_periods: u64,
    pub prev: Vec<(u64, u64, u64, u64, u64)>,
    pub prev_s_work: u64,
    pub decisions: u64,
    pub lat: Hist,
    /// Request latencies (`record` ops).
    pub req: Hist,
    /// What a scheduler tracer would have seen since the last Gleaner period (VMs with an
    /// agent): each vCPU's idle periods by how they ended, the wakeup latency by target state.
    pub trace: Option<WakeTrace>,
    /// Each yielder's catches (`IdleDetector::caught`) at the last Gleaner period.
    pub prev_caught: Vec<Log2Hist>,
    /// The agent's kernel polling, as applied (`None`: the VM's agent does not poll).
    pub kpoll: Option<KernelPolling>,
    /// Each vCPU's guest polling time at the last Gleaner period.
    pub prev_poll: Vec<u64>,
    /// The workload's pinned threads (global ids): the agent reads their vCPUs each period.
    pub pinned_threads: Vec<u32>,
}

/// The kernel idle knobs the agent set from its plan (crates/gleaner-agent/src/agent/apply.rs):
/// the haltpoll window fixed at `cap_ns` for every vCPU (`guest_halt_poll_ns` = grow_start =
/// the cap, no shrinking: a vCPU's own window, `Vcpu::guest_poll_limit`, goes from 0 to the cap
/// after its first idle period inside the cap, and stays), and the vCPUs polling until work
/// (resume latency limit 0). Retention off: the cap 0 and no vCPU always polling (the model's
/// stock guest halts). A lowered cap leaves each vCPU's own window where it was, as in the
/// kernel, until the guest loop asks for a reset (`GuestStep::reset_poll_windows`): a shrink
/// (until the next period: a vCPU's next halt longer than the cap zeroes its window, which its
/// next idle period inside the cap grows to the cap), or a switch of the cpuidle governor away
/// and back (every vCPU's window to 0; every vCPU halts for [`GOVERNOR_SWITCH_NS`]).
#[derive(Debug, Clone)]
pub(crate) struct KernelPolling {
    pub cap_ns: u64,
    pub always: Vec<bool>,
    /// Until when a reset's governor switch keeps every vCPU from polling.
    pub reset_until: Ns,
    /// Shrinking to nothing is on (`WindowReset::Shrink`, until the next apply).
    pub shrink: bool,
}

/// How long resetting the vCPUs' own haltpoll windows keeps them from polling: the agent
/// writes another cpuidle governor and `haltpoll` back, every CPU on the default idle (HLT)
/// meanwhile; the guest loop weighs a switch by the same measured length.
pub(crate) use gleaner_policy::guest::GOVERNOR_SWITCH_NS;

/// The engine's clock and sizes; its thousands of threads and sync objects are left out.
impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("now", &self.now)
            .field("pcpus", &self.pcpus.len())
            .field("vcpus", &self.vcpus.len())
            .field("threads", &self.threads.len())
            .field("host_policy", &self.host_policy)
            .finish_non_exhaustive()
    }
}

/// The simulator state for one run.
pub struct Engine {
    pub(crate) now: Ns,
    pub(crate) q: EventQueue,
    pub(crate) rng: ChaCha8Rng,
    pub(crate) virt: bool,
    pub(crate) costs: Costs,
    pub(crate) host_slice_ns: Ns,
    pub(crate) wakeup_preemption: bool,
    pub(crate) wakeup_gran_ns: Ns,
    pub(crate) guest_slice_ns: Ns,
    pub(crate) halt_poll: Option<HaltPoll>,
    pub(crate) ple_window_ns: Ns,
    balance_ns: Option<Ns>,
    pub(crate) pcpus: Vec<Pcpu>,
    pub(crate) vcpus: Vec<Vcpu>,
    /// Compact per-vCPU load (current thread + run queue + inbox) for fast scans.
    pub(crate) vload: Vec<u32>,
    /// Compact copy of each vCPU's run-queue length, so that newidle stealing scans a VM's
    /// vCPUs in a few cache lines instead of touching every `Vcpu` (kept by `rq_push`/`rq_take`).
    pub(crate) rqlen: Vec<u32>,
    pub(crate) allowed: Vec<bool>,
    pub(crate) threads: Vec<Thread>,
    /// Per thread: the stamp of the request it carries (`Ns::MAX`: none) and its next
    /// Poisson arrival (`Ns::MAX`: not started). Apart from `Thread`, which they would push
    /// past a cache line, and touched only by the request ops.
    pub(crate) stamps: Vec<Ns>,
    pub(crate) arrivals: Vec<Ns>,
    pub(crate) progs: Vec<Prog>,
    pub(crate) mutexes: Vec<MutexObj>,
    pub(crate) queues: Vec<QueueObj>,
    pub(crate) conds: Vec<CondObj>,
    pub(crate) barriers: Vec<BarrierObj>,
    pub(crate) spins: Vec<BarrierObj>,
    pub(crate) vms: Vec<VmState>,
    pub(crate) dirty: Vec<u32>,
    pub(crate) idle_pcpus: u32,
    pub(crate) queued_vcpus: u32,
    pub(crate) fg_alive: u32,
    pub(crate) events: u64,
    pub(crate) stale: u64,
    pub(crate) host_policy: Box<dyn HostPolicy>,
    pub(crate) host_prev: Vec<SimVcpuCounters>,
    pub(crate) host_plans: u64,
    pub(crate) affs: Vec<Aff>,
    aff_index: std::collections::BTreeMap<Vec<u32>, u32>,
    stop_at: Option<Ns>,
    max_ns: Ns,
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub end_ns: Ns,
    pub finished: bool,
    pub events: u64,
    pub stale_events: u64,
    pub host_plans: u64,
    pub vms: Vec<VmOutcome>,
}

impl Engine {
    pub fn new(s: Setup) -> Self {
        let mut e = Engine {
            now: 0,
            q: EventQueue::with_capacity(1024),
            rng: ChaCha8Rng::seed_from_u64(s.seed),
            virt: s.virt,
            costs: s.costs,
            host_slice_ns: s.host_slice_ns,
            wakeup_preemption: s.wakeup_preemption,
            wakeup_gran_ns: s.wakeup_gran_ns,
            guest_slice_ns: s.guest_slice_ns,
            halt_poll: if s.virt { s.halt_poll } else { None },
            ple_window_ns: s.ple_window_ns,
            balance_ns: s.balance_ns,
            pcpus: (0..s.pcpus).map(|_| Pcpu { cur: NONE, rq: Vec::new(), seg_start: 0, last: NONE, dirty: false }).collect(),
            vcpus: Vec::new(),
            vload: Vec::new(),
            rqlen: Vec::new(),
            allowed: Vec::new(),
            threads: Vec::new(),
            stamps: Vec::new(),
            arrivals: Vec::new(),
            progs: Vec::new(),
            mutexes: Vec::new(),
            queues: Vec::new(),
            conds: Vec::new(),
            barriers: Vec::new(),
            spins: Vec::new(),
            vms: Vec::new(),
            dirty: Vec::new(),
            idle_pcpus: s.pcpus,
            queued_vcpus: 0,
            fg_alive: 0,
            events: 0,
            stale: 0,
            host_policy: s.host_policy,
            host_prev: Vec::new(),
            host_plans: 0,
            affs: Vec::new(),
            aff_index: std::collections::BTreeMap::new(),
            stop_at: s.stop_at,
            max_ns: s.max_ns,
        };
        e.intern_aff((0..s.pcpus).collect());
        // The wake-cost curve each agent plans with is the one it would calibrate at boot on
        // this host: where the VMs' vCPUs outnumber the pCPUs, a halted vCPU's wakeup also
        // waits for a pCPU (Table 2's setting D).
        let shared = s.vms.iter().map(|v| u64::from(v.vcpus)).sum::<u64>() > u64::from(s.pcpus);
        for (vi, vm) in s.vms.into_iter().enumerate() {
            e.add_vm(vi as u32, vm, s.pcpus, shared);
        }
        e.host_prev = vec![SimVcpuCounters::default(); e.vcpus.len()];
        e
    }

    /// The index of the affinity set `cpus` (sorted, deduplicated), creating it if needed.
    pub(crate) fn intern_aff(&mut self, mut cpus: Vec<u32>) -> u32 {
        cpus.sort_unstable();
        cpus.dedup();
        if let Some(&i) = self.aff_index.get(&cpus) {
            return i;
        }
        let mut member = vec![false; self.pcpus.len()];
        for &c in &cpus {
            member[c as usize] = true;
        }
        let i = self.affs.len() as u32;
        self.aff_index.insert(cpus.clone(), i);
        self.affs.push(Aff { cpus, member });
        i
    }

    fn add_vm(&mut self, vi: u32, vm: SetupVm, pcpus: u32, shared: bool) {
        let w = &vm.workload;
        let vcpu_base = self.vcpus.len() as u32;
        let m_base = self.mutexes.len() as u32;
        let q_base = self.queues.len() as u32;
        let c_base = self.conds.len() as u32;
        let b_base = self.barriers.len() as u32;
        let s_base = self.spins.len() as u32;
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
        let retention = vm.guest.retention() && self.virt;
        // The agent's mechanism: kernel polling where the variant offers it (and an agent
        // configuration from the lab offers it too), else yielding threads, as the agent
        // starts either one or the other (`IdleSetup::decide`).
        let kernel_polling =
            retention && vm.gleaner.kernel_polling == Some(true) && vm.gleaner.agent.as_ref().is_none_or(|a| a.means.kernel_polling());
        let yielders = retention && !kernel_polling;
        let curve = model_curve(&self.costs, shared, kernel_polling);
        for i in 0..vm.vcpus {
            let aff = match vm.pin_offset {
                Some(off) => self.intern_aff(vec![off + i]),
                None => 0,
            };
            let last_p = match vm.pin_offset {
                Some(off) => off + i,
                None => (vcpu_base + i) % pcpus,
            };
            let yielder = yielders.then(|| {
                Box::new(Yielder {
                    det: IdleDetector::new(vm.gleaner.retention),
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
                yielder,
                gv_since: 0,
                c: Counters::default(),
            });
            self.vload.push(0);
            self.rqlen.push(0);
            self.allowed.push(true);
        }
        // Threads, placed round robin (or pinned) on the vCPUs' run queues.
        let mut alive = 0;
        let mut pinned_threads = Vec::new();
        let mut k = 0u32;
        for g in &w.groups {
            let prog = self.progs.len() as u32;
            let mut pushes: Vec<u32> = g.ops.iter().filter_map(|o| if let Op::Push(q) = o { Some(q_base + q) } else { None }).collect();
            pushes.sort_unstable();
            pushes.dedup();
            let ops = g
                .ops
                .iter()
                .map(|o| match *o {
                    Op::Lock(m) => Op::Lock(m_base + m),
                    Op::Unlock(m) => Op::Unlock(m_base + m),
                    Op::Push(q) => Op::Push(q_base + q),
                    Op::Pop(q) => Op::Pop(q_base + q),
                    Op::Signal(c) => Op::Signal(c_base + c),
                    Op::Wait(c) => Op::Wait(c_base + c),
                    Op::Barrier(b) => Op::Barrier(b_base + b),
                    Op::SpinBarrier(b) => Op::SpinBarrier(s_base + b),
                    o => o,
                })
                .collect();
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
        let queued = alive;
        if !vm.background {
            self.fg_alive += 1;
        }
        let consolidation = vm.guest.consolidation() && self.virt;
        let has_agent = consolidation || retention;
        let agent = has_agent.then(|| {
            let cpus: Vec<u32> = (0..vm.vcpus).collect();
            let params = consolidation.then(|| vm.gleaner.params.clone());
            if let Some(a) = &vm.gleaner.agent {
                // The agent's own configuration (the lab's predictor): kernel polling or
                // yielders only where the variant has them.
                let means = Means {
                    poll_window: kernel_polling && a.means.poll_window,
                    poll_always: kernel_polling && a.means.poll_always,
                    yielders: yielders && a.means.yielders,
                };
                return GuestController::new(GuestConfig { cpus, consolidation: params, means, ..a.clone() });
            }
            // The model's machine as `gleaner_policy::guest::setup::decide` reads one: kernel
            // polling in both forms where the variant offers it, else yielders, and no
            // calibration (the variant asked for retention, so it starts on).
            let offer = Offer { kernel_polling, poll_window: kernel_polling, poll_always: kernel_polling };
            let s = setup::decide(
                SetupInput {
                    cpus,
                    retention,
                    // Without the governor the yielders keep the detector's own cap on every
                    // vCPU (always-on retention, adaptive below the cap).
                    fixed_yield_ns: (yielders && !vm.gleaner.govern).then_some(vm.gleaner.retention.timeout_ns),
                    curve: if retention { Ok(&curve) } else { Err("no retention".into()) },
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
                },
                |_| String::new(),
            );
            GuestController::new(s.guest)
        });
        let windows = vec![if yielders { vm.gleaner.retention.timeout_ns } else { 0 }; vm.vcpus as usize];
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

    /// Runs to completion (every foreground VM done), to `stop_at`, or to the safety limit.
    pub fn run(mut self) -> Outcome {
        for v in 0..self.vcpus.len() as u32 {
            self.vcpus[v as usize].halt_start = 0;
            self.host_wake(v);
        }
        for vm in 0..self.vms.len() {
            if let Some(a) = &self.vms[vm].agent {
                // The guest loop starts with its start plan, over a short first period, as
                // the agent does.
                let start = a.applied().clone();
                let on = a.mode().is_on();
                let first_share = a.config().priors.first_period_share;
                let n = self.vms[vm].nvcpus;
                let windows: Vec<u64> =
                    (0..n).map(|i| start.of(i).filter(|p| p.mechanism == Mechanism::Yield).map_or(0, |p| p.window_ns)).collect();
                if self.has_yielders(vm) {
                    self.start_retention(vm as u32, on, &windows);
                }
                if self.vms[vm].kpoll.is_some() {
                    self.kernel_poll_apply(vm as u32, on, &start, false, WindowReset::Keep);
                }
                let p = ms_to_ns(self.vms[vm].gleaner.period_ms) as f64 * first_share;
                self.q.push(saturating_u64(p.round()).max(1), Ev::GleanerPeriod { vm: vm as u32 });
            }
        }
        if let Some(p) = self.host_policy.period_ns() {
            self.q.push(p, Ev::HostPeriod);
        }
        if let Some(b) = self.balance_ns {
            self.q.push(b, Ev::HostBalance);
        }
        self.flush_dirty();
        let limit = self.stop_at.unwrap_or(self.max_ns).min(self.max_ns);
        let mut finished = false;
        while let Some((t, ev)) = self.q.pop() {
            if t > limit {
                self.now = limit;
                break;
            }
            self.now = t;
            if self.handle(ev) {
                self.events += 1;
            } else {
                self.stale += 1;
            }
            self.flush_dirty();
            if self.fg_alive == 0 && self.stop_at.is_none() {
                finished = true;
                break;
            }
        }
        if self.stop_at.is_some() && self.fg_alive == 0 {
            finished = true;
        }
        self.finish(finished)
    }

    fn handle(&mut self, ev: Ev) -> bool {
        match ev {
            Ev::Pcpu { p, .. } => self.drive(p),
            Ev::Kick { v } => self.on_kick(v),
            Ev::ThreadTimer { t, gen } => {
                let th = &self.threads[t as usize];
                if th.timer_gen != gen || th.state != Ts::Blocked {
                    return false;
                }
                self.wake_thread(t, NONE);
            }
            Ev::YielderTimer { v, gen } => {
                let Some(y) = self.vcpus[v as usize].yielder.as_ref() else { return false };
                if y.gen != gen {
                    return false;
                }
                self.on_yielder_timer(v);
            }
            Ev::GleanerPeriod { vm } => self.on_gleaner_period(vm),
            Ev::HostPeriod => self.on_host_period(),
            Ev::HostBalance => self.on_host_balance(),
        }
        true
    }

    pub(crate) fn mark_dirty(&mut self, p: u32) {
        let pc = &mut self.pcpus[p as usize];
        if !pc.dirty {
            pc.dirty = true;
            self.dirty.push(p);
        }
    }

    fn flush_dirty(&mut self) {
        while let Some(p) = self.dirty.pop() {
            self.pcpus[p as usize].dirty = false;
            self.drive(p);
        }
    }

    /// Accounts the time since the pCPU's last settle to whatever its vCPU was doing.
    pub(crate) fn settle(&mut self, p: u32) {
        let now = self.now;
        let pc = &mut self.pcpus[p as usize];
        let e = now - pc.seg_start;
        pc.seg_start = now;
        if e == 0 || pc.cur == NONE {
            return;
        }
        let vi = pc.cur as usize;
        let vc = &mut self.vcpus[vi];
        vc.vruntime += e;
        vc.c.run_ns += e;
        let x = e.min(vc.overhead);
        vc.overhead -= x;
        vc.c.overhead_ns += x;
        // No early return when the overhead took it all (`e` 0): whether it did is data,
        // half the time each way, and the adds below are then of 0.
        let e = e - x;
        match vc.idle {
            Idle::Busy if vc.cur == NONE => {}
            Idle::Busy => {
                let th = &mut self.threads[vc.cur as usize];
                if th.spinning {
                    vc.c.spin_ns += e;
                } else {
                    let w = e.min(th.rem);
                    th.rem -= w;
                    vc.c.work_ns += w;
                }
            }
            Idle::Yield => {
                if let Some(y) = vc.yielder.as_mut() {
                    y.run_ns += e;
                }
                vc.c.yield_ns += e;
            }
            Idle::Poll { .. } => vc.c.gpoll_ns += e,
            Idle::Halted => vc.c.hpoll_ns += e,
        }
    }

    /// Handles every boundary reached at `now` on pCPU `p`, then schedules the next one.
    pub(crate) fn drive(&mut self, p: u32) {
        self.settle(p);
        let mut guard = 0u32;
        loop {
            guard += 1;
            debug_assert!(guard < 100_000, "drive loop does not converge on pCPU {p}");
            if guard >= 100_000 {
                break;
            }
            let v = self.pcpus[p as usize].cur;
            if v == NONE {
                if !self.pick_next(p) {
                    break;
                }
                continue;
            }
            let now = self.now;
            let vi = v as usize;
            // `&`, not `&&`: one branch on the pair, which is nearly always false, instead of
            // one on a queue that is often not empty and one on the slice's end.
            if !self.pcpus[p as usize].rq.is_empty() & (now >= self.vcpus[vi].slice_end) {
                self.host_slice_expired(p);
                continue;
            }
            if self.vcpus[vi].overhead > 0 {
                break;
            }
            if !self.guest_step(v, p) {
                break;
            }
        }
        self.replan(p);
    }

    fn replan(&mut self, p: u32) {
        let pc = &self.pcpus[p as usize];
        let v = pc.cur;
        if v == NONE {
            self.q.cancel_pcpu(p);
            return;
        }
        let now = self.now;
        let vc = &self.vcpus[v as usize];
        let mut t = Ns::MAX;
        if !pc.rq.is_empty() {
            t = t.min(vc.slice_end.max(now));
        }
        if vc.overhead > 0 {
            t = t.min(now + vc.overhead);
        } else {
            match vc.idle {
                Idle::Busy => {
                    let th = &self.threads[vc.cur as usize];
                    if th.spinning {
                        if self.virt {
                            t = t.min((vc.spin_since + self.ple_window_ns).max(now));
                        }
                    } else {
                        t = t.min(now + th.rem);
                    }
                    if !vc.rq.is_empty() {
                        t = t.min(vc.gslice_end.max(now));
                    }
                }
                Idle::Yield => {
                    if let Some(y) = vc.yielder.as_ref() {
                        t = t.min(now + y.target_ns.saturating_sub(y.run_ns));
                    }
                }
                Idle::Poll { until } => t = t.min(until),
                Idle::Halted => t = t.min(vc.poll_end.max(now)),
            }
        }
        if t == Ns::MAX {
            self.q.cancel_pcpu(p);
        } else {
            self.q.set_pcpu(p, t);
        }
    }

    // ---------------------------------------------------------------- host scheduler

    /// Picks the next vCPU for an empty pCPU: its own queue first, then steals. False if idle.
    fn pick_next(&mut self, p: u32) -> bool {
        let pi = p as usize;
        if !self.pcpus[pi].rq.is_empty() {
            let rq = &self.pcpus[pi].rq;
            let mut best = 0;
            for i in 1..rq.len() {
                if self.vcpus[rq[i] as usize].vruntime < self.vcpus[rq[best] as usize].vruntime {
                    best = i;
                }
            }
            let v = self.pcpus[pi].rq.remove(best);
            self.queued_vcpus -= 1;
            self.run_on(p, v);
            return true;
        }
        if self.queued_vcpus > 0 {
            let n = self.pcpus.len() as u32;
            for k in 1..n {
                let q = (p + k) % n;
                let rq = &self.pcpus[q as usize].rq;
                if let Some(pos) = rq.iter().position(|&w| self.affs[self.vcpus[w as usize].aff as usize].member[p as usize]) {
                    let v = self.pcpus[q as usize].rq.remove(pos);
                    self.queued_vcpus -= 1;
                    self.mark_dirty(q);
                    self.run_on(p, v);
                    return true;
                }
            }
        }
        false
    }

    /// Starts vCPU `v` on the (empty, settled) pCPU `p`, charging resume and switch costs.
    pub(crate) fn run_on(&mut self, p: u32, v: u32) {
        let now = self.now;
        let pi = p as usize;
        debug_assert_eq!(self.pcpus[pi].cur, NONE);
        let last = self.pcpus[pi].last;
        self.pcpus[pi].cur = v;
        self.pcpus[pi].last = v;
        self.pcpus[pi].seg_start = now;
        self.idle_pcpus -= 1;
        let pv = self.costs.pv;
        let vc = &mut self.vcpus[v as usize];
        let mut oh = 0;
        if vc.pending_rv {
            oh += vc.rv_due;
            vc.pending_rv = false;
        }
        if last != v && last != NONE {
            oh += pv;
            let cache = &self.vms[vc.vm as usize].cache;
            oh += saturating_u64(cache.wss_kb * cache.refill_ns_per_kb);
            vc.c.refills += 1;
        }
        vc.overhead += oh;
        let queued = std::mem::replace(&mut vc.queued_since, Ns::MAX);
        if queued != Ns::MAX {
            vc.steal_ns += now - queued;
        }
        vc.host = Host::Running(p);
        vc.last_p = p;
        vc.slice_end = now + vc.overhead + vc.slice_ns;
        vc.spin_since = now;
        if vc.idle == Idle::Yield {
            self.yield_resume(v);
        }
    }

    /// Takes vCPU `v` off its pCPU (already settled). The pCPU is left empty.
    pub(crate) fn take_off(&mut self, v: u32) -> u32 {
        let Host::Running(p) = self.vcpus[v as usize].host else { unreachable!("vCPU {v} is not running") };
        if self.vcpus[v as usize].idle == Idle::Yield {
            self.yield_pause(v, false);
        }
        self.pcpus[p as usize].cur = NONE;
        self.idle_pcpus += 1;
        self.vcpus[v as usize].host = Host::Off;
        p
    }

    fn enqueue_on(&mut self, p: u32, v: u32) {
        self.pcpus[p as usize].rq.push(v);
        self.queued_vcpus += 1;
        let vc = &mut self.vcpus[v as usize];
        vc.host = Host::Queued(p);
        if vc.queued_since == Ns::MAX {
            vc.queued_since = self.now;
        }
    }

    fn host_slice_expired(&mut self, p: u32) {
        let pi = p as usize;
        let v = self.pcpus[pi].cur;
        let min_rq = self.pcpus[pi].rq.iter().map(|&w| self.vcpus[w as usize].vruntime).min().unwrap_or(u64::MAX);
        if min_rq < self.vcpus[v as usize].vruntime {
            self.take_off(v);
            self.enqueue_on(p, v);
        } else {
            let vc = &mut self.vcpus[v as usize];
            vc.slice_end = self.now + vc.slice_ns;
        }
    }

    /// Periodic load balancing (`Setup::balance_ns`): while the pCPU with the most vCPUs
    /// (running + queued) has two or more than the one with the fewest, move its oldest queued
    /// vCPU that may run there, placed as a waking vCPU is (at most half a slice behind).
    fn on_host_balance(&mut self) {
        let Some(interval) = self.balance_ns else { return };
        let n = self.pcpus.len();
        for _ in 0..self.vcpus.len() {
            if self.queued_vcpus == 0 || n < 2 {
                break;
            }
            let load = |pc: &Pcpu| pc.rq.len() + usize::from(pc.cur != NONE);
            let (mut hi, mut lo) = (0, 0);
            for p in 1..n {
                if load(&self.pcpus[p]) > load(&self.pcpus[hi]) {
                    hi = p;
                }
                if load(&self.pcpus[p]) < load(&self.pcpus[lo]) {
                    lo = p;
                }
            }
            if load(&self.pcpus[hi]) < load(&self.pcpus[lo]) + 2 {
                break;
            }
            let Some(pos) = self.pcpus[hi].rq.iter().position(|&w| self.affs[self.vcpus[w as usize].aff as usize].member[lo]) else {
                break;
            };
            let v = self.pcpus[hi].rq.remove(pos);
            self.queued_vcpus -= 1;
            let (hi, lo) = (hi as u32, lo as u32);
            self.settle(lo);
            let pc = &self.pcpus[lo as usize];
            let minv = pc.rq.iter().chain(std::iter::once(&pc.cur).filter(|&&c| c != NONE)).map(|&w| self.vcpus[w as usize].vruntime).min();
            if let Some(minv) = minv {
                let vc = &mut self.vcpus[v as usize];
                vc.vruntime = vc.vruntime.max(minv.saturating_sub(self.host_slice_ns / 2));
            }
            self.enqueue_on(lo, v);
            self.mark_dirty(lo);
            self.mark_dirty(hi);
        }
        self.q.push(self.now + interval, Ev::HostBalance);
    }

    /// Directed yield after a pause-loop exit: let a waiting vCPU run.
    pub(crate) fn host_yield(&mut self, p: u32) {
        let v = self.pcpus[p as usize].cur;
        let maxv = self.pcpus[p as usize].rq.iter().map(|&w| self.vcpus[w as usize].vruntime).max().unwrap_or(0);
        self.take_off(v);
        let vc = &mut self.vcpus[v as usize];
        vc.vruntime = vc.vruntime.max(maxv + 1);
        self.enqueue_on(p, v);
    }

    /// KVM's halt-polling window update after a halt of `halt_ns` (kvm_vcpu_halt).
    pub(crate) fn kvm_adjust(&mut self, v: u32, halt_ns: u64) {
        let Some(hp) = self.halt_poll else { return };
        let vc = &mut self.vcpus[v as usize];
        let cur = vc.kvm_poll_ns;
        if halt_ns <= cur {
            // woke up during the poll: keep the window
        } else if cur > 0 && halt_ns > hp.max_ns {
            vc.kvm_poll_ns = cur.checked_div(hp.shrink).unwrap_or(0);
        } else if cur < hp.max_ns && halt_ns < hp.max_ns {
            let mut val = cur.saturating_mul(hp.grow);
            if val < hp.grow_start {
                val = hp.grow_start;
            }
            vc.kvm_poll_ns = val.min(hp.max_ns);
        }
    }

    /// Makes a halted, descheduled vCPU runnable (an IPI or a timer reached it).
    pub(crate) fn host_wake(&mut self, v: u32) {
        let now = self.now;
        let halt_ns = now - self.vcpus[v as usize].halt_start;
        self.kvm_adjust(v, halt_ns);
        let rv = self.costs.rv_at(halt_ns);
        let vc = &mut self.vcpus[v as usize];
        vc.rv_due = rv;
        vc.pending_rv = true;
        self.host_place(v);
    }

    /// Puts an off-CPU vCPU on a pCPU of its affinity: an idle one if any, else a run queue
    /// (preempting the running vCPU if wakeup preemption allows).
    pub(crate) fn host_place(&mut self, v: u32) {
        let (ai, last) = {
            let vc = &self.vcpus[v as usize];
            (vc.aff as usize, vc.last_p)
        };
        let span = self.affs[ai].cpus.len() as u32;
        let last_ok = self.affs[ai].member[last as usize];
        if self.idle_pcpus > 0 {
            if last_ok && self.pcpus[last as usize].cur == NONE {
                self.settle(last);
                self.run_on(last, v);
                self.mark_dirty(last);
                return;
            }
            let start = v % span;
            for k in 0..span {
                let p = self.affs[ai].cpus[((start + k) % span) as usize];
                if self.pcpus[p as usize].cur == NONE {
                    self.settle(p);
                    self.run_on(p, v);
                    self.mark_dirty(p);
                    return;
                }
            }
        }
        let p = if last_ok { last } else { self.affs[ai].cpus[(v % span) as usize] };
        self.settle(p);
        let cur = self.pcpus[p as usize].cur;
        // Sleeper credit: a waking vCPU is placed at most half a slice behind the queue's minimum.
        let minv = self.pcpus[p as usize]
            .rq
            .iter()
            .chain(std::iter::once(&cur).filter(|&&c| c != NONE))
            .map(|&w| self.vcpus[w as usize].vruntime)
            .min()
            .unwrap_or(0);
        let half = self.host_slice_ns / 2;
        let vc = &mut self.vcpus[v as usize];
        vc.vruntime = vc.vruntime.max(minv.saturating_sub(half));
        let vr = vc.vruntime;
        if cur != NONE && self.wakeup_preemption && vr + self.wakeup_gran_ns < self.vcpus[cur as usize].vruntime {
            self.take_off(cur);
            self.enqueue_on(p, cur);
            self.run_on(p, v);
        } else {
            self.enqueue_on(p, v);
        }
        self.mark_dirty(p);
    }

    /// Moves a vCPU onto its (new) affinity if it is outside it.
    pub(crate) fn host_migrate_if_needed(&mut self, v: u32) {
        let vc = &self.vcpus[v as usize];
        let member = &self.affs[vc.aff as usize].member;
        match vc.host {
            Host::Running(p) if !member[p as usize] => {
                self.settle(p);
                self.take_off(v);
                self.mark_dirty(p);
                self.host_place(v);
            }
            Host::Queued(p) if !member[p as usize] => {
                let rq = &mut self.pcpus[p as usize].rq;
                if let Some(pos) = rq.iter().position(|&w| w == v) {
                    rq.remove(pos);
                    self.queued_vcpus -= 1;
                }
                self.vcpus[v as usize].host = Host::Off;
                self.mark_dirty(p);
                self.host_place(v);
            }
            _ => {}
        }
    }

    /// An IPI (or a timer) reached vCPU `v`: deliver the threads in flight and wake it.
    fn on_kick(&mut self, v: u32) {
        let vi = v as usize;
        self.vcpus[vi].kick_pending = false;
        if let Host::Running(p) = self.vcpus[vi].host {
            self.settle(p);
        }
        let inbox = std::mem::take(&mut self.vcpus[vi].inbox);
        for &t in &inbox {
            self.rq_push(v, t);
        }
        let mut inbox = inbox;
        inbox.clear();
        self.vcpus[vi].inbox = inbox;
        match self.vcpus[vi].host {
            Host::Running(p) => self.mark_dirty(p),
            Host::Queued(_) => {}
            Host::Off => self.host_wake(v),
        }
    }

    /// Sends a wake-up to vCPU `v` after `delay` (no-op if one is in flight).
    pub(crate) fn kick(&mut self, v: u32, delay: Ns) {
        let vc = &mut self.vcpus[v as usize];
        if !vc.kick_pending {
            vc.kick_pending = true;
            self.q.push_after(self.now, delay, Ev::Kick { v });
        }
    }

    /// An exponentially distributed gap with this mean (a Poisson process's), at least 1 ns.
    pub(crate) fn sample_exp(&mut self, mean: Ns) -> Ns {
        let u: f64 = self.rng.gen_range(f64::MIN_POSITIVE..1.0);
        round_at_least_1(-ns_f64(mean) * u.ln())
    }

    pub(crate) fn sample_compute(&mut self, mean: Ns, jitter_pm: u32) -> Ns {
        if jitter_pm == 0 || mean == 0 {
            return mean;
        }
        let d = ns_f64(mean) * f64::from(jitter_pm) / 1000.0;
        let x: f64 = self.rng.gen_range(-1.0..1.0);
        round_at_least_1(ns_f64(mean) + x * d)
    }

    fn finish(mut self, finished: bool) -> Outcome {
        for p in 0..self.pcpus.len() as u32 {
            self.settle(p);
        }
        for v in 0..self.vcpus.len() as u32 {
            self.gv_flush(v);
        }
        let end = self.now;
        let mut vms = Vec::new();
        for (i, vm) in self.vms.iter().enumerate() {
            let mut c = Counters::default();
            for v in vm.vcpu_base..vm.vcpu_base + vm.nvcpus {
                let x = &self.vcpus[v as usize].c;
                c.run_ns += x.run_ns;
                c.overhead_ns += x.overhead_ns;
                c.work_ns += x.work_ns;
                c.spin_ns += x.spin_ns;
                c.yield_ns += x.yield_ns;
                c.gpoll_ns += x.gpoll_ns;
                c.hpoll_ns += x.hpoll_ns;
                c.idle_entries += x.idle_entries;
                c.exits_hlt += x.exits_hlt;
                c.exits_ipi += x.exits_ipi;
                c.exits_timer += x.exits_timer;
                c.exits_ple += x.exits_ple;
                c.exits_io += x.exits_io;
                c.io_events += x.io_events;
                c.hpoll_attempts += x.hpoll_attempts;
                c.hpoll_success += x.hpoll_success;
                c.refills += x.refills;
            }
            let (llc_refs, llc_misses) = c.llc(&vm.cache);
            let active = vm.agent.as_ref().filter(|a| a.config().consolidation.is_some()).map(|a| a.active().len() as u32);
            let timeouts: Vec<u64> = (vm.vcpu_base..vm.vcpu_base + vm.nvcpus)
                .filter_map(|v| self.vcpus[v as usize].yielder.as_ref().map(|y| y.det.timeout_ns()))
                .collect();
            let retention = vm.agent.as_ref().and_then(GuestController::governor_state).map(|g| RetentionOutcome {
                periods: vm.periods,
                on_periods: vm.retain_periods,
                switches: g.switches,
                probes: g.probes,
                timeout_ns_mean_end: timeouts.iter().sum::<u64>() / timeouts.len().max(1) as u64,
                timeout_grows: self.vcpus[vm.vcpu_base as usize..(vm.vcpu_base + vm.nvcpus) as usize]
                    .iter()
                    .filter_map(|v| v.yielder.as_ref().map(|y| y.det.counters().timeout_grows))
                    .sum(),
                timeout_shrinks: self.vcpus[vm.vcpu_base as usize..(vm.vcpu_base + vm.nvcpus) as usize]
                    .iter()
                    .filter_map(|v| v.yielder.as_ref().map(|y| y.det.counters().timeout_shrinks))
                    .sum(),
            });
            vms.push(VmOutcome {
                index: i as u32,
                name: vm.name.clone(),
                vcpus: vm.nvcpus,
                background: vm.background,
                done_at: vm.done_at,
                end_ns: end,
                run_ns: c.run_ns,
                overhead_ns: c.overhead_ns,
                work_ns: c.work_ns,
                spin_ns: c.spin_ns,
                yield_ns: c.yield_ns,
                guest_poll_ns: c.gpoll_ns,
                host_poll_ns: c.hpoll_ns,
                idle_entries: c.idle_entries,
                exits_hlt: c.exits_hlt,
                exits_ipi: c.exits_ipi,
                exits_timer: c.exits_timer,
                exits_ple: c.exits_ple,
                exits_io: c.exits_io,
                halt_poll_attempts: c.hpoll_attempts,
                halt_poll_successes: c.hpoll_success,
                llc_refs,
                llc_misses,
                context_switches: vm.s_work,
                lat: vm.lat.clone(),
                req: vm.req.clone(),
                gleaner_active_end: active,
                gleaner_decisions: vm.decisions,
                retention,
            });
        }
        Outcome { end_ns: end, finished, events: self.events, stale_events: self.stale, host_plans: self.host_plans, vms }
    }
}

/// `x.round().max(1.0) as Ns`, bit for bit, without the `round` library call (x86-64 has no
/// instruction for rounding half away from zero; the call was 1% of a run).
#[inline]
fn round_at_least_1(x: f64) -> Ns {
    // Below 1 (or NaN) the rounded value is at most 1, so the result is 1.
    if x.is_nan() || x < 1.0 {
        return 1;
    }
    // From 2^52 on every double is an integer (and the conversion saturates like `as`).
    if x >= 4_503_599_627_370_496.0 {
        return saturating_u64(x);
    }
    // In [1, 2^52) truncation through i64 is `saturating_u64`'s, in one instruction (x86 has
    // no unsigned conversions).
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let i = x as i64 as u64;
    // Exact: the fraction of a double below 2^52 is representable.
    let frac = x - ns_f64(i);
    i + Ns::from(frac >= 0.5)
}

/// `n as f64`, in one instruction where `n` fits an `i64` (every time and duration of a run):
/// x86 converts only signed integers, and `u64 as f64` is several instructions on the paths
/// taken per event. The same value as `as` for every `n`.
#[inline]
#[allow(clippy::cast_possible_wrap, clippy::cast_precision_loss)]
pub(crate) fn ns_f64(n: Ns) -> f64 {
    if n < 1 << 63 {
        n as i64 as f64
    } else {
        n as f64
    }
}

pub(crate) fn ms_to_ns(ms: f64) -> Ns {
    saturating_u64((ms * 1e6).round()).max(1)
}

/// The model's wake-cost curve, for the idle planner: a halted vCPU costs `IPI + RV(g) + RT`
/// after an idle gap g (at each gap of the costs' RV curve; without one, RV whatever the gap),
/// plus `PV` where the host's pCPUs are shared (`shared`: setting D, the wakeup waits for a
/// pCPU); one kept busy by a yielder `IPI + YW + RT`; one polling in the kernel (`poll`: the
/// agent may use the POLL state) `RT`, its wakeup needing no IPI.
pub(crate) fn model_curve(c: &Costs, shared: bool, poll: bool) -> WakeCurve {
    let base = c.ipi + c.rt + if shared { c.pv } else { 0 };
    let pt = |gap_ns, rv: u64| CurvePoint { gap_ns, mean_ns: base + rv, p50_ns: base + rv };
    let halted = if c.rv_by_gap.is_empty() {
        vec![pt(10_000, c.rv), pt(10_000_000, c.rv)]
    } else {
        c.rv_by_gap.iter().map(|p| pt(p.gap_ns, p.rv_ns)).collect()
    };
    WakeCurve::new(halted, c.ipi + c.yield_wake + c.rt, poll.then_some(c.rt))
}

#[cfg(test)]
mod tests {
    use super::{ns_f64, round_at_least_1, Counters, Engine, Host, Idle, Ns, Vcpu, WindowReset, NONE};
    use std::mem::{offset_of, size_of};

    use crate::knob_probe::two_pcpu_engine;

    /// A woken thread's vCPU: its previous one if idle, else the first idle one after it in the
    /// VM's order, wrapping around; else the previous one; else (not allowed) the least loaded.
    #[test]
    fn a_woken_thread_takes_the_next_idle_vcpu_after_its_last_wrapping_around() {
        let mut e = two_pcpu_engine(4);
        e.threads[0].vcpu = 2;
        // (loads, allowed, the vCPU picked, why), thread 0 last on vCPU 2.
        let cases: [([u32; 4], [bool; 4], u32, &str); 6] = [
            ([1, 0, 1, 1], [true; 4], 1, "wraps around past the last vCPU"),
            ([0, 0, 1, 0], [true; 4], 3, "the next after the previous one first"),
            ([0, 0, 1, 0], [true, true, true, false], 0, "only allowed vCPUs"),
            ([1, 1, 0, 1], [true; 4], 2, "the previous one when idle"),
            ([2, 1, 3, 1], [true; 4], 2, "none idle: the previous one"),
            ([2, 1, 3, 1], [true, true, false, true], 1, "the previous one not allowed: the least loaded allowed"),
        ];
        for (load, allowed, want, why) in cases {
            e.vload = load.to_vec();
            e.allowed = allowed.to_vec();
            assert_eq!(e.select_vcpu(0), want, "{why}");
        }
    }

    /// Four always-runnable vCPUs stacked on one of two pCPUs (three queued behind a running
    /// one, which only an idle pCPU would pull): a balancing pass leaves two on each.
    #[test]
    fn periodic_balancing_moves_queued_vcpus_to_the_lighter_pcpu() {
        let mut e = two_pcpu_engine(4);
        e.pcpus[0].cur = 0;
        e.vcpus[0].host = Host::Running(0);
        e.idle_pcpus = 0;
        for v in 1..4 {
            e.enqueue_on(0, v);
        }
        e.pcpus[1].cur = NONE;
        e.on_host_balance();
        let load = |e: &Engine, p: usize| e.pcpus[p].rq.len() + usize::from(e.pcpus[p].cur != NONE);
        assert_eq!((load(&e, 0), load(&e, 1)), (2, 2));
        assert_eq!(e.pcpus[1].rq, vec![1, 2], "the oldest queued vCPUs move");
        e.on_host_balance();
        assert_eq!(e.pcpus[1].rq, vec![1, 2], "a balanced host stays as it is");
    }

    /// The agent's kernel polling as applied: a lowered cap leaves each vCPU's own window (the
    /// haltpoll governor shrinks it only after a long halt, and the agent turns that off); a
    /// reset zeroes them and lets nothing poll for the governor switch; the machine's own
    /// settings (a plan that retains nothing) zero them without that pause.
    #[test]
    fn a_lowered_poll_window_stays_until_a_reset_which_pauses_polling() {
        use gleaner_policy::idle::IdlePlan;
        let mut e = two_pcpu_engine(2);
        e.vms[0].kpoll = Some(super::KernelPolling { cap_ns: 0, always: vec![false; 2], reset_until: 0, shrink: false });
        e.now = 1_000_000_000;
        e.kernel_poll_apply(0, true, &IdlePlan::initial_poll([0, 1], 1_048_576), true, WindowReset::Keep);
        for v in 0..2 {
            e.vcpus[v].guest_poll_limit = 1_048_576; // grown to the cap
        }
        e.kernel_poll_apply(0, true, &IdlePlan::initial_poll([0, 1], 65_536), true, WindowReset::Keep);
        let limits = |e: &Engine| e.vcpus.iter().map(|v| v.guest_poll_limit).collect::<Vec<_>>();
        assert_eq!(limits(&e), vec![1_048_576; 2], "a lowered cap alone leaves the vCPUs' windows");
        assert_eq!(e.vms[0].kpoll.as_ref().map(|k| (k.cap_ns, k.reset_until)), Some((65_536, 0)));
        e.kernel_poll_apply(0, true, &IdlePlan::initial_poll([0, 1], 65_536), true, WindowReset::Switch);
        assert_eq!(limits(&e), vec![0; 2]);
        assert_eq!(e.vms[0].kpoll.as_ref().map(|k| k.reset_until), Some(1_000_000_000 + super::GOVERNOR_SWITCH_NS));
        for v in 0..2 {
            e.vcpus[v].guest_poll_limit = 65_536;
        }
        e.now += super::GOVERNOR_SWITCH_NS;
        e.kernel_poll_apply(0, true, &IdlePlan::halt([0, 1]), true, WindowReset::Keep);
        assert_eq!(limits(&e), vec![0; 2], "the machine's settings restored, windows reset");
        assert_eq!(e.vms[0].kpoll.as_ref().map(|k| (k.cap_ns, k.reset_until)), Some((0, 1_000_000_000 + super::GOVERNOR_SWITCH_NS)));
        // A cap already back at the stock 0 (vCPU 0 polled until work) restores nothing that
        // resets: the windows stay, unless the guest loop asks for the switch with the stock plan.
        let until_work = || {
            let mut p = IdlePlan::initial_poll([0, 1], 0);
            p.poll_always = vec![0];
            p
        };
        for reset in [WindowReset::Keep, WindowReset::Switch] {
            e.kernel_poll_apply(0, true, &until_work(), true, WindowReset::Keep);
            for v in 0..2 {
                e.vcpus[v].guest_poll_limit = 200_000; // grown under an earlier cap
            }
            e.kernel_poll_apply(0, true, &IdlePlan::halt([0, 1]), true, reset);
            let want = if reset == WindowReset::Switch { 0 } else { 200_000 };
            assert_eq!(limits(&e), vec![want; 2], "{reset:?}");
        }
    }

    /// A shrink (the agent's first answer to a stale window) pauses nothing: while it is on, a
    /// vCPU's halt past the cap zeroes its own window and its next idle period inside the cap
    /// grows it to the cap; the next apply turns it off, and a long halt then keeps the window.
    #[test]
    fn a_shrink_zeroes_a_window_at_its_next_long_halt_and_ends_at_the_next_apply() {
        use gleaner_policy::idle::IdlePlan;
        let mut e = two_pcpu_engine(2);
        e.vms[0].kpoll = Some(super::KernelPolling { cap_ns: 0, always: vec![false; 2], reset_until: 0, shrink: false });
        e.now = 1_000_000_000;
        e.kernel_poll_apply(0, true, &IdlePlan::initial_poll([0, 1], 65_536), true, WindowReset::Shrink);
        assert_eq!(e.vms[0].kpoll.as_ref().map(|k| (k.reset_until, k.shrink)), Some((0, true)));
        for v in 0..2 {
            e.vcpus[v].guest_poll_limit = 1_048_576; // stale: grown to an older cap
        }
        let idle = |e: &mut Engine, v: u32, ns: u64| {
            e.vcpus[v as usize].idle_since = e.now;
            e.now += ns;
            e.haltpoll_adjust(v);
        };
        idle(&mut e, 0, 500_000); // polled through: no halt, no change
        assert_eq!(e.vcpus[0].guest_poll_limit, 1_048_576);
        idle(&mut e, 0, 2_000_000); // halted past the cap
        assert_eq!(e.vcpus[0].guest_poll_limit, 0);
        idle(&mut e, 0, 20_000); // halted at once, inside the cap: grown to it
        assert_eq!(e.vcpus[0].guest_poll_limit, 65_536);
        e.kernel_poll_apply(0, true, &IdlePlan::initial_poll([0, 1], 65_536), true, WindowReset::Keep);
        assert_eq!(e.vms[0].kpoll.as_ref().map(|k| k.shrink), Some(false));
        idle(&mut e, 1, 2_000_000);
        assert_eq!(e.vcpus[1].guest_poll_limit, 1_048_576, "shrinking off: a long halt keeps the window");
    }

    /// The planner's curve is the model's: without an RV curve today's two flat points; with
    /// one, a halted point per gap (`IPI + RV(g) + RT`, `+ PV` on shared pCPUs); the POLL
    /// point `RT` only where the agent may poll.
    #[test]
    fn the_planners_curve_follows_the_costs() {
        use crate::scenario::{Costs, CostsCfg, RvPoint};
        let c = Costs::from_table2(&CostsCfg::default().vm, 1.0, 2.0, 1.0);
        let flat = super::model_curve(&c, false, false);
        let gaps: Vec<(u64, u64)> = flat.halted.iter().map(|p| (p.gap_ns, p.mean_ns)).collect();
        assert_eq!((gaps, flat.busy_ns, flat.poll_ns), (vec![(10_000, 37_000), (10_000_000, 37_000)], 17_000, None));
        let mut g = c.clone();
        g.rv_by_gap = vec![RvPoint { gap_ns: 50_000, rv_ns: 3_000 }, RvPoint { gap_ns: 3_000_000, rv_ns: 42_000 }];
        let curve = super::model_curve(&g, true, true);
        let pts: Vec<(u64, u64, u64)> = curve.halted.iter().map(|p| (p.gap_ns, p.mean_ns, p.p50_ns)).collect();
        assert_eq!(pts, vec![(50_000, 79_000, 79_000), (3_000_000, 118_000, 118_000)], "IPI 11 + RV + RT 6 + PV 59 us");
        assert_eq!((curve.busy_ns, curve.poll_ns), (17_000, Some(6_000)));
        assert!(curve.validate().is_ok());
    }

    #[test]
    fn vcpu_hot_fields_share_cache_lines() {
        // Line 1: the per-event step; line 2: queue and host state; line 3: settle's counters.
        assert!(offset_of!(Vcpu, idle) + size_of::<Idle>() <= 64);
        assert!(offset_of!(Vcpu, rq) >= 64 && offset_of!(Vcpu, last_p) + 4 <= 128);
        assert_eq!(offset_of!(Vcpu, c), 128);
        assert!(offset_of!(Counters, hpoll_ns) + 8 <= 64);
        assert!(size_of::<Vcpu>() <= 7 * 64, "the yielder's detector stays out of line");
    }

    #[test]
    fn the_llc_counts_follow_the_work_and_the_refills() {
        let cache = crate::workload::CacheProfile { refs_per_us: 20.0, miss_ratio: 0.05, wss_kb: 256.0, refill_ns_per_kb: 0.0 };
        // 2 ms of work: 40,000 references, 2,000 of them misses; 3 refills of 256 KiB at 16
        // references a KiB: 12,288 more, every one a miss.
        let c = Counters { work_ns: 2_000_000, refills: 3, ..Counters::default() };
        assert_eq!(c.llc(&cache), (52_288.0, 14_288.0));
        assert_eq!(Counters::default().llc(&cache), (0.0, 0.0));
    }

    #[test]
    #[allow(clippy::cast_precision_loss)]
    fn ns_f64_is_as() {
        for n in [0, 1, 2, 999, 1 << 52, (1 << 53) + 1, (1 << 63) - 1, 1 << 63, (1 << 63) + 12345, Ns::MAX] {
            assert_eq!(ns_f64(n).to_bits(), (n as f64).to_bits(), "n = {n}");
        }
    }

    #[test]
    fn round_at_least_1_matches_the_float_expression() {
        let mut xs = vec![
            f64::NAN,
            f64::NEG_INFINITY,
            f64::INFINITY,
            -1e300,
            -3.5,
            -0.5,
            0.0,
            0.49999999999999994,
            0.5,
            0.9999999999999999,
            1.0,
            1.4999999999999998,
            1.5,
            2.5,
            3.5,
            1e15 + 0.5,
            4503599627370495.5,
            4503599627370496.0,
            9007199254740993.0,
            1.8446744073709552e19,
            1e30,
        ];
        let mut s: u64 = 1;
        for _ in 0..100_000 {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let m = (s >> 11) as f64 / (1u64 << 53) as f64;
            xs.push(m * 200_000.0 - 1000.0);
            xs.push((s >> 44) as f64 + 0.5);
        }
        for x in xs {
            assert_eq!(round_at_least_1(x), gleaner_policy::num::saturating_u64(x.round()).max(1), "x = {x:?}");
        }
    }
}
