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

use gleaner_policy::guest::setup::{self, Offer, Prior, SetupInput, YielderStart};
use gleaner_policy::guest::{GuestConfig, GuestController, LoopPriors, WindowReset};
use gleaner_policy::idle::{CurvePoint, Log2Hist, Means, Mechanism, PlanConfig, TargetState, TraceSource, WakeCurve, WakeTrace};
use gleaner_policy::num::saturating_u64;
use gleaner_policy::retention::{IdleDetector, RetentionConfig, RetentionMode};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::policy::{HostPolicy, SimVcpuCounters};
use crate::queue::{Ev, EventQueue, Ns};
use crate::scenario::{Costs, GleanerCfg, GuestHaltpollCfg, HostScheduler};
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
    /// Host slices drawn within +-this per mille of their length (`HostCfg::slice_jitter_pm`).
    pub slice_jitter_pm: u32,
    pub scheduler: HostScheduler,
    pub wakeup_preemption: bool,
    pub wakeup_gran_ns: Ns,
    pub guest_slice_ns: Ns,
    pub halt_poll: Option<HaltPoll>,
    pub ple_window_ns: Ns,
    /// Periodic host load balancing interval (`None`: only idle pCPUs pull queued vCPUs).
    pub balance_ns: Option<Ns>,
    /// The guests see steal (`HostCfg::guest_steal`).
    pub guest_steal: bool,
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
    /// it waited so far: `/proc/stat`'s steal, as the guest sees it. Of that, the waits in
    /// the guest view's idle and yielding time ([`Engine::gv_kind`]): a Linux guest counts
    /// steal apart, its idle and busy times without it, where `gv` has it in.
    pub queued_since: Ns,
    pub steal_ns: u64,
    pub steal_idle_ns: u64,
    pub steal_yield_ns: u64,
    /// A credit host's BOOST (`Engine::credit`): 0 none, `Ns::MAX` boosted and not yet run,
    /// else boosted until this accounting tick. And when the vCPU got its pCPU last.
    pub boost_until: Ns,
    pub run_start: Ns,
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
    /// Each vCPU's `steal_idle_ns` and `steal_yield_ns` at the last reading.
    pub prev_steal: Vec<(u64, u64)>,
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
    pub(crate) slice_jitter_pm: u32,
    /// Xen credit's wakeup rule (`HostScheduler::Credit`) instead of fair placement.
    pub(crate) credit: bool,
    pub(crate) wakeup_preemption: bool,
    pub(crate) wakeup_gran_ns: Ns,
    pub(crate) guest_slice_ns: Ns,
    pub(crate) halt_poll: Option<HaltPoll>,
    pub(crate) ple_window_ns: Ns,
    balance_ns: Option<Ns>,
    pub(crate) guest_steal: bool,
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
            slice_jitter_pm: s.slice_jitter_pm,
            credit: s.scheduler == HostScheduler::Credit,
            wakeup_preemption: s.wakeup_preemption,
            wakeup_gran_ns: s.wakeup_gran_ns,
            guest_slice_ns: s.guest_slice_ns,
            halt_poll: if s.virt { s.halt_poll } else { None },
            ple_window_ns: s.ple_window_ns,
            balance_ns: s.balance_ns,
            guest_steal: s.guest_steal,
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

    /// A VM's counters: the sum over its vCPUs.
    fn vm_counters(&self, vm: &VmState) -> Counters {
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
        c
    }

    /// What a VM's governor did over the run (`None`: no agent, or no governor).
    fn retention_of(&self, vm: &VmState) -> Option<RetentionOutcome> {
        let timeouts: Vec<u64> = (vm.vcpu_base..vm.vcpu_base + vm.nvcpus)
            .filter_map(|v| self.vcpus[v as usize].yielder.as_ref().map(|y| y.det.timeout_ns()))
            .collect();
        vm.agent.as_ref().and_then(GuestController::governor_state).map(|g| RetentionOutcome {
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
        })
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
            let c = self.vm_counters(vm);
            let (llc_refs, llc_misses) = c.llc(&vm.cache);
            let active = vm.agent.as_ref().filter(|a| a.config().consolidation.is_some()).map(|a| a.active().len() as u32);
            let retention = self.retention_of(vm);
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

mod build;
mod host;
#[cfg(test)]
mod tests;
