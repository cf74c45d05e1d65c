//! The idle planner: per vCPU, which mechanism keeps it from halting while its workload waits
//! and for how long (its *window*), from the idle periods it has seen and the machine's
//! wake-cost curve, under a CPU budget. Pure: the agent and the simulator call it with what
//! they measured and apply what it returns.
//!
//! ```text
//!  per vCPU, gaps: idle periods ended by a wakeup of the workload (from another CPU, or a
//!  timer or interrupt on this one) + all others
//!  for a window W (2^k ns, 16 us .. 16.8 ms, or ALWAYS; the shared kernel polling window
//!  from 64 us, MIN_POLL_CAP):
//!     cost(W)   = sum over every gap g of min(g, W)                 CPU spent polling/yielding
//!     saving(W) = sum over woken gaps g <= W of C(g) - caught       the halt never happened
//!               + sum over woken gaps g >  W of C(g) - C(g - W)     a shorter halt, often cheap
//!                 caught = P (kernel polling: no IPI) or B (a yielder: an IPI to a busy vCPU)
//!     value(W)  = saving(W) - price * cost(W)                       price: latency ns a CPU ns
//!                                                                   must buy (default 0.01)
//!  choose the W of highest value with cost(W) <= budget * traced time; none pays: halt (W = 0)
//!  then over every vCPU: workload busy + retention <= vm_share * vCPUs, lowering the windows
//!  that lose least value per vCPU freed until it holds, or until what a move loses is more
//!  than the overrun's price (OVER_SHARE_PRICE)
//!  before all that: a vCPU idle under 30% of its time beside one idle under 5% (the
//!  workload's bottleneck: bottleneck_idle_share) retains nothing
//! ```
//!
//! Kernel polling beats yielding wherever the machine has it (no IPI, no `SCHED_IDLE` thread
//! in the scheduler's way), so yielders are planned only where there is no POLL state (beside
//! one, the guest loop's ladder runs them as its top level on a saturated VM, by experiment,
//! not by this model: `crate::guest::ladder`). Kernel
//! polling comes in two forms ([`Means`]): the `haltpoll` governor's window, one for every
//! CPU (the agent fixes it there: no growing from 50 us, no shrinking after a long idle period,
//! so the window the kernel keeps is the one modelled here), and "always" (a 0 us resume
//! latency limit on one CPU). The planner picks the one cap that maximizes the summed value
//! of every vCPU, each vCPU either living with that cap or polling always if that is worth
//! more to it.
//!
//! Why these rules. The 2-competitive timeout `max(C, 2(C - B))` that retention used before
//! assumed a constant halt cost; on a KVM host that polls halted vCPUs the cost depends on the
//! gap (cheap inside the host's poll window, dear after it), and the rule capped every window
//! at about C, so it could never reach the gaps where halting costs. It also priced a
//! microsecond spent on an otherwise idle vCPU like one on the workload's critical path. The
//! planner prices it explicitly (`price`) and bounds it (`budget`).
//!
//! Why a VM share. A host that caps a VM's CPU (a cgroup quota, commonly the VM's vCPU count)
//! stops the whole VM when it uses the quota up: on these development VMs two vCPUs kept at
//! 100% stalled for 100 ms about once every 3 s each (10 stalls in 30 s), at 95% each never
//! (`scripts/bench/host-quota.py`). Polling is busy time to the host, so a plan that polled
//! both vCPUs whole turned a server's quiet tail into 100 ms stalls (the open loop at 200
//! requests/s: p99 7 ms in the runs that met one). The planner leaves the VM that headroom.

use serde::{Deserialize, Serialize};

use super::curve::WakeCurve;
use super::hist::Log2Hist;
use super::trace::VcpuGaps;

/// A window that never ends: the vCPU polls (or yields) until work arrives.
pub const ALWAYS: u64 = u64::MAX;

/// Smallest and largest finite window, as powers of two (16.4 us and 16.8 ms).
pub const MIN_WINDOW_EXP: u32 = 14;
pub const MAX_WINDOW_EXP: u32 = 24;

/// The narrowest shared kernel polling window (65.5 us). A traced slice of a few
/// milliseconds cannot show a workload's rarer idle periods, and a window fitted to the ones
/// it saw halts on the rest: the built-in ping-pong's first trace saw none of its woken idle
/// periods past 16 us, the window planned was 16 us, and a fixed 16 us window doubled the
/// ping-pong's p99 (17.9 against haltpoll's 8.7 us, 8 alternated rounds), where a fixed
/// 64 us one was at haltpoll's (8.7). docs/idle-policy.md, "Priors".
pub const MIN_POLL_CAP: u64 = 1 << 16;

/// The finite candidate windows, ascending.
pub fn windows() -> impl Iterator<Item = u64> + Clone {
    (MIN_WINDOW_EXP..=MAX_WINDOW_EXP).map(|k| 1u64 << k)
}

/// What keeps an idle vCPU from halting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    /// Nothing: the vCPU halts at once (what the guest does without gleaner, where its
    /// kernel does not poll).
    Halt,
    /// The kernel's POLL idle state: a wakeup needs no IPI.
    Poll,
    /// A `SCHED_IDLE` yielding thread: a wakeup is an IPI to a busy vCPU.
    Yield,
}

/// The mechanisms this machine offers the planner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Means {
    /// The `haltpoll` governor's window (one cap for every CPU).
    pub poll_window: bool,
    /// Per-CPU polling until work arrives (resume latency limit 0).
    pub poll_always: bool,
    /// Yielding threads (any Linux guest).
    pub yielders: bool,
}

impl Means {
    /// Kernel polling in some form.
    pub fn kernel_polling(&self) -> bool {
        self.poll_window || self.poll_always
    }
}

/// Tunables of the planner.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlanConfig {
    /// Share of each vCPU's time the mechanism may spend (polling or yielding), 0 < b <= 1.
    pub budget: f64,
    /// Wakeup latency (ns) one ns of that CPU must save to be spent: the exchange rate
    /// between a vCPU's otherwise idle time and the workload's wakeups.
    pub price: f64,
    /// Share of the managed vCPUs' time the workload and retention together may fill, in (0,
    /// 1]: retention leaves the rest idle, so that a host capping the VM's CPU at its vCPU
    /// count never has to stop it (module documentation). 1 on a host known to have no cap.
    pub vm_share: f64,
    /// Fewer woken idle periods than this in the observed window: too little to plan from
    /// (the vCPU halts, as stock).
    pub min_woken: u64,
    /// A vCPU the workload leaves less than this share of its time idle (measured, polling
    /// included) is the workload's bottleneck: the other vCPUs busy enough to feed it
    /// ([`BEHIND_MAX_IDLE_SHARE`]) retain nothing ([`PlanReason::Bottleneck`]), in [0, 1); 0
    /// turns the rule off.
    pub bottleneck_idle_share: f64,
}

/// The default budget: all of a vCPU's idle time may be spent, but only where it buys
/// wakeups at the price (an idle workload spends nothing; see docs/agent.md).
pub const DEFAULT_BUDGET: f64 = 1.0;
/// The default price: a microsecond of wakeup latency is worth up to 200 us of idle vCPU
/// (docs/idle-policy.md, "Priors").
pub const DEFAULT_PRICE: f64 = 0.005;
/// The default VM share: 90% of the managed vCPUs, a margin under the 95% at which this
/// VM's host was never seen to stop it (polling's use varies period to period).
pub const DEFAULT_VM_SHARE: f64 = 0.9;

/// The default bottleneck share: a vCPU idle under 5% of its time. What retention elsewhere can
/// add to a closed loop that vCPU paces is its idle time (the loop cannot run it more than
/// full), while polling the vCPUs that feed it cost nginx with 50 connections 1-4% of its
/// requests (docs/idle-policy.md, "Priors").
pub const DEFAULT_BOTTLENECK_IDLE_SHARE: f64 = 0.05;

impl Default for PlanConfig {
    fn default() -> Self {
        Self {
            budget: DEFAULT_BUDGET,
            price: DEFAULT_PRICE,
            vm_share: DEFAULT_VM_SHARE,
            min_woken: 8,
            bottleneck_idle_share: DEFAULT_BOTTLENECK_IDLE_SHARE,
        }
    }
}

impl PlanConfig {
    /// Checks the ranges; the error names the field and what is allowed.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.budget > 0.0 && self.budget <= 1.0) {
            return Err(format!("budget = {}: allowed a share of a vCPU in (0, 1]", self.budget));
        }
        if !(0.0..=1.0).contains(&self.price) {
            return Err(format!("price = {}: allowed 0..=1 (latency ns per CPU ns)", self.price));
        }
        if !(self.vm_share > 0.0 && self.vm_share <= 1.0) {
            return Err(format!("vm_share = {}: allowed a share of the VM's vCPUs in (0, 1]", self.vm_share));
        }
        if !(0.0..1.0).contains(&self.bottleneck_idle_share) {
            return Err(format!("bottleneck_idle_share = {}: allowed a share of a vCPU in [0, 1) (0: off)", self.bottleneck_idle_share));
        }
        Ok(())
    }
}

/// What a window is expected to do on one vCPU, per second of observed time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// Share of the vCPU spent polling or yielding.
    pub cost_share: f64,
    /// Wakeup latency saved, ns per second.
    pub saving_ns_per_s: f64,
    /// Share of the woken idle periods the window covers whole.
    pub caught_share: f64,
    /// Woken idle periods per second.
    pub woken_per_s: f64,
}

/// One vCPU's plan.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct VcpuPlan {
    pub cpu: u32,
    pub mechanism: Mechanism,
    /// How long an idle period is covered, ns ([`ALWAYS`]: until work arrives; 0 with `Halt`).
    pub window_ns: u64,
    pub estimate: Estimate,
    /// Why, for people and the events.
    pub why: PlanReason,
}

/// Why a vCPU got its plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanReason {
    /// The window of highest value within the budget.
    BestValue,
    /// Too few woken idle periods to plan from.
    TooFewWakeups,
    /// No window saves more than it costs at the price.
    NothingPays,
    /// The machine offers no mechanism (no POLL state, yielders not allowed).
    NoMechanism,
    /// The shared kernel polling window other vCPUs chose applies here too.
    SharedWindow,
    /// Set by the configuration (`--timeout-us`), not planned.
    Configured,
    /// Retention is off (the governor's mode, or a probe of it): the machine's own idle
    /// policy runs.
    RetentionOff,
    /// Nothing seen yet: the kernel's upstream haltpoll window, until the first plan.
    Initial,
    /// Its best option did not fit the VM's share (`vm_share`): the window is the most
    /// valuable one that let every vCPU's plan fit.
    VmShare,
    /// The workload leaves the vCPUs (almost) no idle time: kernel polling could win at most
    /// that share, and polling the few short gaps cost a lock-bound workload throughput (guest
    /// loop, `SATURATED_IDLE_SHARE`).
    Saturated,
    /// The ladder's top level (`gleaner_policy::guest::ladder`): the window of most saving,
    /// at no price.
    Wide,
    /// Another vCPU the workload keeps (almost) busy sets its pace
    /// ([`PlanConfig::bottleneck_idle_share`]): wakeups here do not, and retaining here made
    /// the vCPUs feeding it do so in smaller batches.
    Bottleneck,
}

/// The plan of every vCPU, and the kernel settings it maps to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdlePlan {
    pub vcpus: Vec<VcpuPlan>,
    /// The haltpoll governor's cap (`guest_halt_poll_ns`), ns; 0: no windowed polling.
    pub poll_window_ns: u64,
    /// vCPUs that poll until work arrives (resume latency limit 0).
    pub poll_always: Vec<u32>,
}

impl IdlePlan {
    /// Whether `other` runs every vCPU as this plan does (the same mechanisms, windows and
    /// always-polling vCPUs), whatever their estimates and reasons.
    #[must_use]
    pub fn runs_as(&self, other: &IdlePlan) -> bool {
        self.poll_window_ns == other.poll_window_ns
            && self.poll_always == other.poll_always
            && self.vcpus.len() == other.vcpus.len()
            && self.vcpus.iter().zip(&other.vcpus).all(|(a, b)| (a.cpu, a.mechanism, a.window_ns) == (b.cpu, b.mechanism, b.window_ns))
    }

    /// Nothing retained: every vCPU halts.
    pub fn halt(cpus: impl IntoIterator<Item = u32>) -> Self {
        let vcpus = cpus
            .into_iter()
            .map(|cpu| VcpuPlan {
                cpu,
                mechanism: Mechanism::Halt,
                window_ns: 0,
                estimate: Estimate::default(),
                why: PlanReason::NothingPays,
            })
            .collect();
        Self { vcpus, poll_window_ns: 0, poll_always: Vec::new() }
    }

    /// Before anything was seen: every vCPU polls with the shared window `window_ns`.
    pub fn initial_poll(cpus: impl IntoIterator<Item = u32>, window_ns: u64) -> Self {
        let vcpus = cpus
            .into_iter()
            .map(|cpu| VcpuPlan { cpu, mechanism: Mechanism::Poll, window_ns, estimate: Estimate::default(), why: PlanReason::Initial })
            .collect();
        Self { vcpus, poll_window_ns: window_ns, poll_always: Vec::new() }
    }

    /// Before anything was seen: every vCPU polls until work arrives.
    pub fn poll_until_work(cpus: impl IntoIterator<Item = u32>) -> Self {
        let vcpus: Vec<VcpuPlan> = cpus
            .into_iter()
            .map(|cpu| VcpuPlan {
                cpu,
                mechanism: Mechanism::Poll,
                window_ns: ALWAYS,
                estimate: Estimate::default(),
                why: PlanReason::Initial,
            })
            .collect();
        let poll_always = vcpus.iter().map(|v| v.cpu).collect();
        Self { vcpus, poll_window_ns: 0, poll_always }
    }

    /// Every vCPU halts, for `why`.
    pub fn halt_because(cpus: impl IntoIterator<Item = u32>, why: PlanReason) -> Self {
        let mut p = Self::halt(cpus);
        for v in &mut p.vcpus {
            v.why = why;
        }
        p
    }

    /// Retention off: every vCPU as the machine leaves it.
    pub fn off(cpus: impl IntoIterator<Item = u32>) -> Self {
        Self::halt_because(cpus, PlanReason::RetentionOff)
    }

    /// Every vCPU yields with the same fixed window (`--timeout-us`).
    pub fn fixed_yield(cpus: impl IntoIterator<Item = u32>, window_ns: u64) -> Self {
        let vcpus = cpus
            .into_iter()
            .map(|cpu| VcpuPlan { cpu, mechanism: Mechanism::Yield, window_ns, estimate: Estimate::default(), why: PlanReason::Configured })
            .collect();
        Self { vcpus, poll_window_ns: 0, poll_always: Vec::new() }
    }

    /// Every vCPU yields until work arrives, the kernel's idle settings as found: the guest
    /// loop's Wide level on a VM its workload saturates (`guest::ladder`).
    pub fn yield_always(cpus: impl IntoIterator<Item = u32>) -> Self {
        let mut p = Self::fixed_yield(cpus, ALWAYS);
        for v in &mut p.vcpus {
            v.why = PlanReason::Wide;
        }
        p
    }

    /// Some vCPU polls in the kernel (the plan changes the kernel's idle knobs).
    pub fn polls(&self) -> bool {
        self.vcpus.iter().any(|v| v.mechanism == Mechanism::Poll)
    }

    /// The plan of `cpu`.
    pub fn of(&self, cpu: u32) -> Option<&VcpuPlan> {
        self.vcpus.iter().find(|v| v.cpu == cpu)
    }

    /// The yielding thread's window on `cpu` under this plan, ns: its window where it yields
    /// and retention is `on`, else 0 (parked). The agent and the simulator give their yielders
    /// this.
    pub fn yield_window(&self, cpu: u32, on: bool) -> u64 {
        self.of(cpu).filter(|v| on && v.mechanism == Mechanism::Yield).map_or(0, |v| v.window_ns)
    }

    /// Some vCPU polls or yields.
    pub fn retains(&self) -> bool {
        self.vcpus.iter().any(|v| v.mechanism != Mechanism::Halt)
    }

    /// Expected retention CPU over every vCPU, in vCPUs.
    pub fn expected_cost_vcpus(&self) -> f64 {
        self.vcpus.iter().map(|v| v.estimate.cost_share).sum()
    }
}

/// The observed idle periods of one vCPU, with the time they were observed over and the
/// vCPU's own budget (the agent tightens it where the realized cost ran over).
#[derive(Debug, Clone, Copy)]
pub struct VcpuInput<'a> {
    pub gaps: &'a VcpuGaps,
    /// Time the gaps were observed over, ns.
    pub observed_ns: u64,
    /// Share of this vCPU the mechanism may spend.
    pub budget: f64,
    /// Share of its time the workload left this vCPU idle as its counters measured it (idle
    /// states and `/proc/stat`, polling and yielders' time included), smoothed; `None`: only
    /// the gaps tell. The VM's share is counted from it: a vCPU idle in one long period (the
    /// one consolidation took away) shows no gap to a tracer that never sees the period end.
    pub idle_share: Option<f64>,
}

/// The cost of a caught wakeup under `m`, ns (`None`: the machine cannot measure it).
fn caught_cost(curve: &WakeCurve, m: Mechanism) -> Option<f64> {
    match m {
        Mechanism::Poll => curve.poll_cost_ns(),
        Mechanism::Yield => Some(curve.busy_cost_ns()),
        Mechanism::Halt => None,
    }
}

/// What window `w` does on one vCPU under mechanism `m` (module documentation).
pub fn estimate(curve: &WakeCurve, m: Mechanism, gaps: &VcpuGaps, observed_ns: u64, w: u64) -> Estimate {
    let secs = observed_ns.max(1) as f64 / 1e9;
    let workload = gaps.workload();
    let woken = workload.count();
    let mut e = Estimate { woken_per_s: woken as f64 / secs, ..Estimate::default() };
    let Some(caught) = caught_cost(curve, m) else { return e };
    if w == 0 {
        return e;
    }
    let all = gaps.all();
    let cost_ns = if w == ALWAYS { all.sum_ns() as f64 } else { all.sum_min_ns(w) };
    e.cost_share = cost_ns / observed_ns.max(1) as f64;
    let (mut saving, mut caught_n) = (0.0, 0u64);
    for (i, c, _) in workload.iter() {
        let g = workload.bucket_mean_ns(i);
        let halted = curve.halt_cost_ns(g);
        let hi = if i + 1 >= super::hist::BUCKETS { u64::MAX } else { super::hist::bucket_lo(i + 1) };
        let per = if w == ALWAYS || hi <= w || g <= w as f64 {
            caught_n += c;
            halted - caught
        } else {
            halted - curve.halt_cost_ns(g - w as f64)
        };
        saving += per.max(0.0) * c as f64;
    }
    e.saving_ns_per_s = saving / secs;
    e.caught_share = if woken == 0 { 0.0 } else { caught_n as f64 / woken as f64 };
    e
}

/// The value of an estimate at `price`: latency saved minus the CPU it took, ns per second.
fn value(e: &Estimate, price: f64) -> f64 {
    e.saving_ns_per_s - price * e.cost_share * 1e9
}

fn plan_of(cpu: u32, mechanism: Mechanism, window_ns: u64, estimate: Estimate, why: PlanReason) -> VcpuPlan {
    VcpuPlan { cpu, mechanism, window_ns, estimate, why }
}

/// One way to run a vCPU (a mechanism and window), and its value at the price.
#[derive(Debug, Clone, Copy)]
struct Choice {
    plan: VcpuPlan,
    value: f64,
}

impl Choice {
    fn cost(&self) -> f64 {
        self.plan.estimate.cost_share
    }
}

/// Every way to run one vCPU on its own (yielders, or "always" polling only) within its
/// budget that pays at the price, among the candidate windows (`finite`, ascending) and
/// [`ALWAYS`] (`always`), then halting.
fn options_alone(curve: &WakeCurve, m: Mechanism, cfg: &PlanConfig, input: &VcpuInput<'_>, finite: bool, always: bool) -> Vec<Choice> {
    let cpu = input.gaps.cpu;
    let none = estimate(curve, m, input.gaps, input.observed_ns, 0);
    if input.gaps.workload().count() < cfg.min_woken {
        return vec![Choice { plan: plan_of(cpu, Mechanism::Halt, 0, none, PlanReason::TooFewWakeups), value: 0.0 }];
    }
    let cands = windows().filter(|_| finite).chain(always.then_some(ALWAYS));
    let mut paying: Vec<Choice> = cands
        .map(|w| (w, estimate(curve, m, input.gaps, input.observed_ns, w)))
        .filter(|(_, e)| e.cost_share <= input.budget)
        .map(|(w, e)| Choice { plan: plan_of(cpu, m, w, e, PlanReason::BestValue), value: value(&e, cfg.price) })
        .filter(|o| o.value > 0.0)
        .collect();
    let why = if paying.is_empty() { PlanReason::NothingPays } else { PlanReason::BestValue };
    paying.push(Choice { plan: plan_of(cpu, Mechanism::Halt, 0, none, why), value: 0.0 });
    paying
}

/// Which of `inputs` another one paces: some other vCPU's measured idle share is under
/// [`PlanConfig::bottleneck_idle_share`]. A closed loop runs its bottleneck at most full, so
/// what retention elsewhere can add to it is that vCPU's idle time; and retaining the vCPUs
/// that feed it made them wake per reply instead of per batch (nginx with 50 connections: 5
/// times the idle entries on wrk's vCPU, 1-4% fewer requests). A vCPU that busy also queues
/// an open-loop server's requests: their wait there, not a wakeup elsewhere, is their latency.
/// Where every vCPU is that busy, each is behind another: the VM leaves nothing to win.
///
/// Only a vCPU the workload keeps busy most of its time is behind one
/// ([`BEHIND_MAX_IDLE_SHARE`]). A vCPU busy all the time may be a client spinning for its
/// replies rather than a bottleneck, and its server, woken at the client's rate, has time to
/// spare: sockperf under load, its client's vCPU 100% busy while it measures, left the
/// server's vCPU idle 95% at 2,000 messages a second and 46-55% at 60,000. Feeders of a real
/// bottleneck do their share of the loop's work between its replies: wrk's vCPU idle 9-14%,
/// the built-in pipeline's other stage 5-8% (`/proc/stat` over half seconds).
fn behind_bottleneck(cfg: &PlanConfig, inputs: &[VcpuInput<'_>]) -> Vec<bool> {
    let pacing = |i: &VcpuInput<'_>| i.idle_share.is_some_and(|s| s < cfg.bottleneck_idle_share);
    let feeds = |i: &VcpuInput<'_>| i.idle_share.is_some_and(|s| s < BEHIND_MAX_IDLE_SHARE);
    // One pass: a vCPU is behind one if it feeds and some other vCPU paces.
    let pacers = inputs.iter().filter(|i| pacing(i)).count();
    inputs.iter().map(|i| feeds(i) && pacers > usize::from(pacing(i))).collect()
}

/// A vCPU idle more than this share of its time is behind no bottleneck
/// ([`behind_bottleneck`]).
pub const BEHIND_MAX_IDLE_SHARE: f64 = 0.3;

/// The halt of a vCPU behind a bottleneck ([`behind_bottleneck`]).
fn halt_behind(curve: &WakeCurve, input: &VcpuInput<'_>) -> Choice {
    let none = estimate(curve, Mechanism::Halt, input.gaps, input.observed_ns, 0);
    Choice { plan: plan_of(input.gaps.cpu, Mechanism::Halt, 0, none, PlanReason::Bottleneck), value: 0.0 }
}

/// The most valuable of `options`, the first of equals (a finite window that covers every
/// idle period ties with "until work", listed after it: the window).
fn best_of(options: &[Choice]) -> Option<Choice> {
    options.iter().copied().reduce(|best, c| if c.value > best.value { c } else { best })
}

/// The best way to run one vCPU on its own ([`options_alone`]).
fn best_alone(curve: &WakeCurve, m: Mechanism, cfg: &PlanConfig, input: &VcpuInput<'_>, finite: bool, always: bool) -> VcpuPlan {
    best_of(&options_alone(curve, m, cfg, input, finite, always)).expect("halting is always an option").plan
}

/// The price of a vCPU-second of retention over the VM's share, ns of wakeup latency.
const OVER_PRICE_NS: f64 = OVER_SHARE_PRICE * 1e9;

/// Share of its observed time a vCPU was idle (the workload left it), unclamped: the same
/// sums the costs come from, so that no option costs more than its vCPU's idle share.
fn idle_share(input: &VcpuInput<'_>) -> f64 {
    input.gaps.all().sum_ns() as f64 / input.observed_ns.max(1) as f64
}

/// Retention CPU the VM may spend, in vCPUs: what keeps the workload's busy time plus
/// retention within `vm_share` of the managed vCPUs (all the idle time at 1). The idle time is
/// the measured one where the adapter has it: the gaps miss a period that has not ended (the
/// vCPU consolidation took away, halted all along, counted as busy, kept the one left from
/// polling until work: the open loop at 200 requests/s caught 63% of its wakeups instead of
/// all, p50 99 us against 43).
fn vm_allowance(cfg: &PlanConfig, inputs: &[VcpuInput<'_>]) -> f64 {
    let idle: f64 = inputs.iter().map(|i| i.idle_share.unwrap_or_else(|| idle_share(i))).sum();
    (idle - (1.0 - cfg.vm_share) * inputs.len() as f64).max(0.0)
}

/// Retention over the VM's share is priced at this (ns of wakeup latency per ns of CPU over
/// the share): the share is a cost, not a wall, because a shared haltpoll window leaves some
/// workloads no cheaper option than halting a vCPU whose every wakeup it would save (a
/// ping-pong whose two ends each idle half their vCPU in 6 us gaps: over the share by polling
/// both, but ~50 us a round trip saved), while the host's stop it risks costs a closed loop one
/// round trip. A constant, not a multiple of `price` (it was 10x the price): what it prices is
/// the host's stop, which a tenant valuing its idle vCPU time less does not make any cheaper
/// (at price 0.005 a multiple let the open loop at 200 requests/s poll both vCPUs past the
/// share).
pub const OVER_SHARE_PRICE: f64 = 0.1;

/// Picks one option per vCPU (`options[v]`, any order) for the most value less the price of
/// the VM share overrun: each vCPU starts at its most valuable option, then, while the sum of
/// their costs is over `allowance`, the move to a cheaper option that loses least value per
/// vCPU it frees is made, as long as that loss is below `over_price` (ns per vCPU-second).
/// Returns the choices and the overrun's price (ns per second); `None` if some vCPU has no
/// option.
fn fit_vm(options: &[Vec<Choice>], allowance: f64, over_price: f64) -> Option<(Vec<Choice>, f64)> {
    let mut at: Vec<Choice> = options.iter().map(|o| best_of(o)).collect::<Option<_>>()?;
    loop {
        let over = at.iter().map(Choice::cost).sum::<f64>() - allowance;
        if over <= 1e-9 {
            return Some((at, 0.0));
        }
        let mut best: Option<(f64, usize, Choice)> = None;
        for (v, opts) in options.iter().enumerate() {
            for o in opts.iter().filter(|o| o.cost() < at[v].cost()) {
                let loss = (at[v].value - o.value) / (at[v].cost() - o.cost());
                if best.as_ref().is_none_or(|(l, _, _)| loss < *l) {
                    best = Some((loss, v, *o));
                }
            }
        }
        match best {
            Some((loss, v, mut o)) if loss < over_price => {
                o.plan.why = PlanReason::VmShare;
                at[v] = o;
            }
            _ => return Some((at, over * over_price)),
        }
    }
}

/// Plans every vCPU (module documentation). `inputs` lists the managed vCPUs.
pub fn plan(means: &Means, curve: &WakeCurve, cfg: &PlanConfig, inputs: &[VcpuInput<'_>]) -> IdlePlan {
    let cpus = inputs.iter().map(|i| i.gaps.cpu);
    let behind = behind_bottleneck(cfg, inputs);
    if means.kernel_polling() && curve.poll_ns.is_some() {
        return plan_polling(means, curve, cfg, inputs, &behind);
    }
    if !means.yielders {
        return IdlePlan::halt_because(cpus, PlanReason::NoMechanism);
    }
    let options: Vec<Vec<Choice>> = inputs
        .iter()
        .zip(&behind)
        .map(|(i, &b)| if b { vec![halt_behind(curve, i)] } else { options_alone(curve, Mechanism::Yield, cfg, i, true, true) })
        .collect();
    // Halting is every vCPU's last option: the fit always exists.
    let (fitted, _) = fit_vm(&options, vm_allowance(cfg, inputs), OVER_PRICE_NS).unwrap_or_default();
    IdlePlan { vcpus: fitted.iter().map(|o| o.plan).collect(), poll_window_ns: 0, poll_always: Vec::new() }
}

/// Kernel polling: one shared cap (if the haltpoll window is offered) chosen for the summed
/// value of every vCPU, each vCPU taking "always" instead where that is worth more to it and
/// the VM's share allows it.
fn plan_polling(means: &Means, curve: &WakeCurve, cfg: &PlanConfig, inputs: &[VcpuInput<'_>], behind: &[bool]) -> IdlePlan {
    let m = Mechanism::Poll;
    let allowance = vm_allowance(cfg, inputs);
    // Each vCPU's own best with "always" only (or nothing): its alternative under any cap.
    let alone: Vec<VcpuPlan> = inputs
        .iter()
        .zip(behind)
        .map(|(i, &b)| if b { halt_behind(curve, i).plan } else { best_alone(curve, m, cfg, i, false, means.poll_always) })
        .collect();
    let caps: Vec<u64> =
        if means.poll_window { std::iter::once(0).chain(windows().filter(|&w| w >= MIN_POLL_CAP)).collect() } else { vec![0] };
    let mut best: Option<(f64, u64, Vec<VcpuPlan>)> = None;
    for &cap in &caps {
        let options: Vec<Vec<Choice>> = inputs
            .iter()
            .zip(&alone)
            .zip(behind)
            .map(|((input, own), &behind)| {
                let mut opts = Vec::with_capacity(2);
                // The cap applies to a vCPU that does not poll always, whether it wants it
                // or not: its cost counts, and must fit the vCPU's budget.
                if cap == 0 {
                    let why = if own.window_ns == ALWAYS { PlanReason::NothingPays } else { own.why };
                    let none = estimate(curve, m, input.gaps, input.observed_ns, 0);
                    opts.push(Choice { plan: plan_of(input.gaps.cpu, Mechanism::Halt, 0, none, why), value: 0.0 });
                } else {
                    let mut capped = estimate(curve, m, input.gaps, input.observed_ns, cap);
                    if behind {
                        // Polled under another vCPU's cap, it saves nothing that counts.
                        capped.saving_ns_per_s = 0.0;
                    }
                    if capped.cost_share <= input.budget {
                        let v = value(&capped, cfg.price);
                        let why = if behind {
                            PlanReason::Bottleneck
                        } else if input.gaps.workload().count() < cfg.min_woken || v <= 0.0 {
                            PlanReason::SharedWindow
                        } else {
                            PlanReason::BestValue
                        };
                        opts.push(Choice { plan: plan_of(input.gaps.cpu, m, cap, capped, why), value: v });
                    }
                }
                // "Until work" after the cap: a tie (every idle period inside the cap) keeps
                // the cap.
                if own.window_ns == ALWAYS {
                    opts.push(Choice { plan: *own, value: value(&own.estimate, cfg.price) });
                }
                opts
            })
            .collect();
        let Some((fitted, overrun)) = fit_vm(&options, allowance, OVER_PRICE_NS) else { continue };
        let total: f64 = fitted.iter().map(|o| o.value).sum::<f64>() - overrun;
        if best.as_ref().is_none_or(|(bv, _, _)| total > *bv) {
            best = Some((total, cap, fitted.iter().map(|o| o.plan).collect()));
        }
    }
    let (_, cap, vcpus) = best.unwrap_or_else(|| (0.0, 0, IdlePlan::halt(inputs.iter().map(|i| i.gaps.cpu)).vcpus));
    let poll_always = vcpus.iter().filter(|v| v.mechanism == Mechanism::Poll && v.window_ns == ALWAYS).map(|v| v.cpu).collect();
    let poll_window_ns = if vcpus.iter().any(|v| v.mechanism == Mechanism::Poll && v.window_ns != ALWAYS) { cap } else { 0 };
    IdlePlan { vcpus, poll_window_ns, poll_always }
}

/// Idle periods as an exponential distribution of mean `mean_ns`, `count` of them, spread over
/// the log2 buckets: the estimate where no tracer saw the real ones (cpuidle usage and time
/// give the count and the mean).
pub fn exponential_gaps(count: u64, mean_ns: f64) -> Log2Hist {
    let mut h = Log2Hist::default();
    if count == 0 || mean_ns.is_nan() || mean_ns <= 0.0 {
        return h;
    }
    let cdf = |x: f64| 1.0 - (-x / mean_ns).exp();
    let mut left = count;
    for i in 0..super::hist::BUCKETS {
        let lo = super::hist::bucket_lo(i) as f64;
        let hi = super::hist::bucket_lo(i + 1) as f64;
        let share = cdf(hi) - cdf(lo);
        let n = crate::num::saturating_u64((share * count as f64).round()).min(left);
        if n > 0 {
            // The mean of an exponential restricted to [lo, hi).
            let (a, b) = ((-lo / mean_ns).exp(), (-hi / mean_ns).exp());
            let m = if a - b > 1e-12 { (lo * a - hi * b) / (a - b) + mean_ns } else { (lo + hi) / 2.0 };
            h.record_n(crate::num::saturating_u64(m.clamp(lo, hi.max(lo + 1.0) - 1.0).round()), n);
            left -= n;
        }
        if left == 0 {
            break;
        }
    }
    if left > 0 {
        h.record_n(crate::num::saturating_u64(mean_ns.round()), left);
    }
    h
}

#[cfg(test)]
mod tests;
