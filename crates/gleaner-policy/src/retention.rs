//! Resource retention: the yielding thread's idle detector (Gleaner paper, section 6).
//!
//! A `SCHED_IDLE` thread on each active vCPU calls `sched_yield()` in a loop. A call that
//! returns quickly means nothing else wanted the vCPU (the vCPU is idle but kept from halting);
//! a slow call means the workload ran meanwhile (one computation period ended). The detector
//! accumulates the time of consecutive quick calls and, once it reaches the timeout, tells the
//! thread to sleep so the vCPU can halt and the hypervisor can reclaim the pCPU.
//!
//! ```text
//!  yield(d):  d >  idle_threshold  -> work ran: idle time := 0, backoff := reset, KeepYielding
//!             d <= idle_threshold  -> idle time += d
//!                                     idle time >= timeout -> Sleep(backoff), backoff *= 2
//!                                                             (capped at max_sleep)
//! ```
//!
//! The sleep doubles while the vCPU stays idle, so an idle workload costs almost no CPU
//! (a timeout of spinning per `max_sleep`), and snaps back to `min_sleep` as soon as work shows up.
//! Work is seen only through slow yields, never through how long a sleep took: on tick-based
//! guests (this development VM) any sleep of a `SCHED_IDLE` thread takes at least a 4 ms tick.
//!
//! **Noise is not work.** A yield can also be slow because an interrupt was handled or the
//! hypervisor preempted the vCPU during the call; no other task ran. On the development VM an
//! idle CPU sees about ten such 20-80 us yields a second, and treating each one as work reset
//! the backoff so often that an idle workload's yielders spent 3-6% of a CPU. So when the
//! caller can tell ([`YieldProbe::other_task_ran`], from the thread's involuntary context
//! switch count), a slow yield during which no other task ran is *noise*: counted apart,
//! added to the idle time like a quick yield, and neither ends the idle period nor resets the
//! backoff.
//!
//! **Stepping aside** (not in the paper). A CPU whose only runnable task is a `SCHED_IDLE`
//! yielder never becomes "newly idle", so the kernel's new-idle load balancing, which pulls a
//! thread waiting in another CPU's run queue the moment a CPU runs out of work, does not run;
//! the waiting thread stays queued until the periodic balancer (milliseconds) or its CPU frees.
//! With more runnable threads than vCPUs (a pipeline) that costs more than retention gains. So
//! on a quick yield, if more threads are runnable than the other CPUs can run, the detector
//! asks for one very short sleep (`step_aside_ns`): the CPU goes newly idle, the kernel pulls
//! the waiting thread, and the yielder is back behind it a microsecond later. At most once per
//! idle period (until the workload runs here again or the timeout), so threads pinned
//! elsewhere cannot make it halt over and over. Off by default: on the development VM it did
//! not speed up the pipeline workload measurably, and with other processes running it made an
//! idle workload's yielders spin more (a pulled thread looks like workload activity and resets
//! the sleep backoff); docs/agent.md has the numbers.
//!
//! **An adaptive timeout per vCPU** (`adapt`, not in the paper). Each detector adapts its own
//! timeout to the idle periods its vCPU sees, the way the guest cpuidle haltpoll governor
//! adapts its poll window (`adjust_poll_limit`). The configured `timeout_ns` (calibrated from
//! the wakeup costs: spinning longer than a halt-and-wake costs cannot pay) is the start and
//! the cap, `min_timeout_ns` the floor. An idle period of length b, judged when it ends:
//!
//! ```text
//!  b <= timeout             caught: retention did its job        -> timeout stays
//!  timeout < b <= long      ended not long after the timeout     -> timeout * grow (<= cap)
//!  b > long                 ran far past any useful timeout      -> timeout / shrink (>= floor,
//!                                                                   shrink 0: back to the floor)
//!  long = max(long_idle_ns (1 ms), cap + sleep0)
//! ```
//!
//! haltpoll's bound between the two is its cap. Ours is wider, for two reasons. After a
//! timeout the end of a period is only known to within the first sleep (`sleep0`, below). And
//! idle periods are not independent of the decision: a vCPU that halted wakes slower and, on a
//! shared host, can lose its pCPU to another VM, so every thread waiting for it (at a barrier)
//! idles longer. With the cap as the bound, `gleaner sim fig7` streamcluster (a 16-vCPU
//! barrier code next to a matmul VM) saw its 60 us waits turn into 150-400 us ones after one
//! early shrink, shrank every timeout to the floor, and lost retention's 2.18x speedup (1.03x);
//! with 1 ms only waits of another scale (I/O, timers, a co-runner's whole slice) shrink it.
//!
//! How long a period lasted is read from a monotonic clock the caller passes with each call
//! ([`IdleDetector::on_yield_at`]): it starts when a slow yield (work) returns and ends at the
//! start of the next call that shows work, minus its noise (yields stretched by the host or an
//! interrupt: time the vCPU was taken away, which no timeout could have spent spinning; on a
//! shared host a co-runner's 3 ms slice would otherwise look like a 3 ms idle period). A period that ends before the timeout is measured
//! to within one quick yield. A period that reached the timeout is **only bounded from
//! above**: the thread sleeps after the timeout (the vCPU halts), so work that starts during
//! the sleep is seen at the earliest when the sleep ends (if the caller can tell that another
//! task ran meanwhile, [`YieldProbe::ran_while_asleep`]) or else at the next slow yield, which
//! may be several idle periods later (after work it slept through, the thread measures the
//! next period from its first call, late by at most the sleep). That is why "not long after"
//! reaches at least to the cap plus the first sleep (`min_sleep_ns`, `sleep0` above): a period
//! that ended during the first sleep cannot be placed more precisely. The error leans towards
//! shrinking (less spinning, the stock behaviour), never towards spinning past the cap.
//!
//! Whether retention should run at all is decided at start from measured wakeups
//! ([`retention_verdict`]) and re-decided online by the [`governor`].

use crate::idle::Log2Hist;
use serde::{Deserialize, Serialize};

pub mod governor;
pub mod synthetic;

pub use governor::{
    ChangeCause, Comparison, EpochReading, GovernorConfig, GovernorState, GovernorStep, ModeChange, Phase, PriorStrength, ProgressUnit,
    RetentionGovernor, RetentionMode, Verdict, WorkloadIo,
};

/// Configuration of one yielding thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// A `sched_yield()` longer than this means another thread ran during the call.
    pub idle_threshold_ns: u64,
    /// Accumulated idle yielding after which the vCPU is allowed to halt; with `adapt`, where
    /// the adaptive timeout starts and its cap.
    pub timeout_ns: u64,
    /// First sleep after a timeout (the paper's `nanosleep(1)` plus timer slack).
    pub min_sleep_ns: u64,
    /// Longest sleep while the vCPU stays idle.
    pub max_sleep_ns: u64,
    /// Length of the sleep that lets the kernel's new-idle balancing pull a waiting thread
    /// (see the module documentation); 0 turns stepping aside off.
    pub step_aside_ns: u64,
    /// Adapt the timeout to the idle periods of this vCPU between `min_timeout_ns` and
    /// `timeout_ns` (module documentation); `false` keeps `timeout_ns` fixed.
    pub adapt: bool,
    /// Floor of the adaptive timeout.
    pub min_timeout_ns: u64,
    /// Factor by which an idle period that ended just past the timeout grows it (< 2: never).
    pub timeout_grow: u64,
    /// Divisor by which an idle period far past the timeout shrinks it (0: back to the floor).
    pub timeout_shrink: u64,
    /// An idle period that reached the timeout and lasted longer than this (at least the cap
    /// plus the first sleep) ran "far past" it and shrinks it; a shorter one grows it.
    pub long_idle_ns: u64,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            idle_threshold_ns: 20_000,
            timeout_ns: 100_000,
            min_sleep_ns: 50_000,
            max_sleep_ns: 20_000_000,
            step_aside_ns: 0,
            adapt: true,
            min_timeout_ns: 10_000,
            timeout_grow: 2,
            timeout_shrink: 2,
            long_idle_ns: 1_000_000,
        }
    }
}

/// What the yielding thread does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RetentionAction {
    /// Keep calling `sched_yield()`.
    KeepYielding,
    /// Timeout: sleep this long so the vCPU can halt.
    Sleep { ns: u64 },
    /// Sleep this long so the kernel's new-idle balancing can pull a waiting thread here.
    StepAside { ns: u64 },
}

/// Counters kept by the detector (monotonic; the agent takes differences per period).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetentionCounters {
    /// `sched_yield()` calls seen.
    pub yields: u64,
    /// Slow calls: the workload ran (one idle period ended).
    pub busy_returns: u64,
    /// Time spent in quick calls, i.e. the vCPU idle but retained.
    pub idle_yield_ns: u64,
    /// Timeouts (times the vCPU was allowed to halt).
    pub timeouts: u64,
    /// Time asked to sleep.
    pub sleep_ns: u64,
    /// Times the thread stepped aside for a thread waiting elsewhere.
    #[serde(default)]
    pub step_asides: u64,
    /// Slow calls during which no other task ran (an interrupt or the hypervisor took the
    /// vCPU): not work, so they neither end an idle period nor reset the backoff.
    #[serde(default)]
    pub noise_returns: u64,
    /// The timeout now (not a counter: the adaptive timeout's current value).
    #[serde(default)]
    pub timeout_ns: u64,
    /// Times the adaptive timeout grew (an idle period ended just past it).
    #[serde(default)]
    pub timeout_grows: u64,
    /// Times the adaptive timeout shrank (an idle period ran far past it).
    #[serde(default)]
    pub timeout_shrinks: u64,
    /// Sleeps during which another task ran ([`YieldProbe::ran_while_asleep`]): an idle
    /// period ended unseen, and the backoff snapped back.
    #[serde(default)]
    pub asleep_work: u64,
}

/// What the yielding thread can find out about its CPU, asked by the detector only when the
/// answer matters (so the answers may cost a system call).
pub trait YieldProbe {
    /// Did another task run on this CPU during the slow call just fed? Asked once per slow
    /// call. `true` when the caller cannot tell (then every slow call counts as work, as in the
    /// paper).
    fn other_task_ran(&mut self) -> bool;
    /// Are more threads runnable than the other CPUs can run (one waits in a run queue)?
    /// Asked on quick calls, only when stepping aside is on and not yet done in this period.
    fn others_waiting(&mut self) -> bool;
    /// Did another task run on this CPU while the thread slept after a timeout? Asked on the
    /// first call after a [`RetentionAction::Sleep`], only when the timeout adapts. `false` (the
    /// default) when the caller cannot tell: the period's end is then seen at the next slow
    /// yield, later than it happened. `true` also snaps the sleep backoff back (the vCPU did
    /// not stay idle), so answer it from evidence of a task, not of an interrupt.
    fn ran_while_asleep(&mut self) -> bool {
        false
    }
}

/// A probe made of two closures: `FnProbe(other_task_ran, others_waiting)`.
#[derive(Debug, Clone, Copy)]
pub struct FnProbe<R, W>(pub R, pub W);

impl<R: FnMut() -> bool, W: FnMut() -> bool> YieldProbe for FnProbe<R, W> {
    fn other_task_ran(&mut self) -> bool {
        (self.0)()
    }
    fn others_waiting(&mut self) -> bool {
        (self.1)()
    }
}

/// A probe of a caller that knows what happened (the simulator, synthetic traces): whether
/// another task ran during the call just fed and while the thread slept; nobody waits
/// elsewhere (it never steps aside).
#[derive(Debug, Clone, Copy, Default)]
pub struct KnownProbe {
    pub other_task_ran: bool,
    pub ran_while_asleep: bool,
}

impl YieldProbe for KnownProbe {
    fn other_task_ran(&mut self) -> bool {
        self.other_task_ran
    }
    fn others_waiting(&mut self) -> bool {
        false
    }
    fn ran_while_asleep(&mut self) -> bool {
        self.ran_while_asleep
    }
}

/// A probe that knows nothing: every slow call is work, nobody waits elsewhere.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProbe;

impl YieldProbe for NoProbe {
    fn other_task_ran(&mut self) -> bool {
        true
    }
    fn others_waiting(&mut self) -> bool {
        false
    }
}

/// The pure state machine of one yielding thread.
#[derive(Debug, Clone)]
pub struct IdleDetector {
    cfg: RetentionConfig,
    idle_acc_ns: u64,
    next_sleep_ns: u64,
    /// Stepped aside in this idle period already.
    stepped: bool,
    counters: RetentionCounters,
    /// The timeout now (fixed at `cfg.timeout_ns` unless `cfg.adapt`).
    timeout_ns: u64,
    /// The clock at the end of the last call: the caller's ([`Self::on_yield_at`]) or, for
    /// callers without a clock, the yields and asked sleeps added up.
    clock_ns: u64,
    /// Sleep asked since the last call, for the added-up clock.
    asked_ns: u64,
    /// Start of the idle period being measured (the end of the last work); `None` when unknown
    /// (at start, after a reset).
    period_start_ns: Option<u64>,
    /// The idle period being measured reached the timeout.
    timed_out: bool,
    /// Noise in the idle period being measured: time the vCPU was taken away, not idle time.
    period_noise_ns: u64,
    /// The thread slept since the last call.
    slept: bool,
    /// Held at the cap for now ([`Self::hold_at_cap`]).
    held: bool,
    /// The idle periods the thread caught: each one that ended with the workload's work
    /// before the timeout, as long as the quick yields before that work (a lower bound).
    caught: Log2Hist,
}

impl IdleDetector {
    pub fn new(cfg: RetentionConfig) -> Self {
        let counters = RetentionCounters { timeout_ns: cfg.timeout_ns, ..RetentionCounters::default() };
        Self {
            idle_acc_ns: 0,
            next_sleep_ns: cfg.min_sleep_ns.max(1),
            stepped: false,
            counters,
            timeout_ns: cfg.timeout_ns,
            clock_ns: 0,
            asked_ns: 0,
            period_start_ns: None,
            timed_out: false,
            period_noise_ns: 0,
            slept: false,
            held: false,
            caught: Log2Hist::default(),
            cfg,
        }
    }

    pub fn config(&self) -> &RetentionConfig {
        &self.cfg
    }

    pub fn counters(&self) -> RetentionCounters {
        self.counters
    }

    /// The timeout now: accumulated idle yielding that lets the vCPU halt.
    pub fn timeout_ns(&self) -> u64 {
        self.timeout_ns
    }

    /// The clock at the end of the last call fed.
    pub fn clock_ns(&self) -> u64 {
        self.clock_ns
    }

    /// Idle yielding accumulated towards the timeout since the last work or timeout.
    pub fn idle_ns(&self) -> u64 {
        self.idle_acc_ns
    }

    /// The idle periods caught so far (cumulative): each one the workload ended before the
    /// timeout, as long as the quick yields before it. A scheduler tracer cannot see them (the
    /// yielding thread held the vCPU, not the idle task), so the idle planner adds them to
    /// the traced ones: without them a vCPU whose yielder catches every wakeup looks as if it
    /// had no wakeups to save.
    pub fn caught(&self) -> &Log2Hist {
        &self.caught
    }

    /// Feeds one `sched_yield()` call that ended at `now_ns` on a monotonic clock (any origin)
    /// and took `yield_duration_ns`, asking `probe` what only the caller can find out: whether
    /// a slow call was work or noise, whether threads wait elsewhere, and whether work ran
    /// while the thread slept. The clock measures idle periods for the adaptive timeout.
    pub fn on_yield_at(&mut self, now_ns: u64, yield_duration_ns: u64, probe: &mut impl YieldProbe) -> RetentionAction {
        let now = now_ns.max(self.clock_ns);
        self.clock_ns = now;
        self.asked_ns = 0;
        let call_start = now.saturating_sub(yield_duration_ns);
        if std::mem::take(&mut self.slept) && self.cfg.adapt && probe.ran_while_asleep() {
            // The idle period ended during the sleep. The next one began when that work
            // stopped, at the latest now: measure it from here (late by at most the sleep).
            // The vCPU did not stay idle, so the backoff snaps back as after a slow yield:
            // the next period's end is then seen within a short first sleep.
            self.period_ended(call_start);
            self.period_start_ns = Some(call_start);
            self.next_sleep_ns = self.cfg.min_sleep_ns.max(1);
            self.stepped = false;
            self.counters.asleep_work += 1;
        }
        let slow = yield_duration_ns > self.cfg.idle_threshold_ns;
        let noise = slow && !probe.other_task_ran();
        if noise {
            self.period_noise_ns = self.period_noise_ns.saturating_add(yield_duration_ns);
        }
        if slow && !noise {
            if !self.timed_out && self.period_start_ns.is_some() {
                // Caught: the whole idle period was yielded away. A period shorter than one
                // yield still counts (1 ns: any window catches it).
                self.caught.record(self.idle_acc_ns.max(1));
            }
            self.period_ended(call_start);
            self.period_start_ns = Some(now);
        }
        let action = self.feed(yield_duration_ns, slow && !noise);
        if let RetentionAction::Sleep { ns } = action {
            self.asked_ns = ns;
            return action;
        }
        if noise
            || action != RetentionAction::KeepYielding
            || slow
            || self.cfg.step_aside_ns == 0
            || self.stepped
            || !probe.others_waiting()
        {
            return action;
        }
        self.stepped = true;
        self.counters.step_asides += 1;
        self.asked_ns = self.cfg.step_aside_ns;
        RetentionAction::StepAside { ns: self.cfg.step_aside_ns }
    }

    /// Feeds `k` calls of `yield_ns` each, the i-th ending at `start_ns + i * yield_ns`, exactly
    /// as `k` calls of [`Self::on_yield_at`] would, and stops at the first call whose action is
    /// not [`RetentionAction::KeepYielding`] (returned; the calls after it are not fed). A
    /// simulator feeds a stretch of quick yields this way: the quick calls before the one that
    /// reaches the timeout are added up at once (what each would do: count a yield, add its
    /// length to the idle time), so a stretch costs O(1) instead of one call per yield; calls
    /// that need the probe (after a sleep, slow ones, stepping aside) go one by one.
    pub fn on_yields_at(&mut self, start_ns: u64, k: u64, yield_ns: u64, probe: &mut impl YieldProbe) -> RetentionAction {
        let at = |i: u64| start_ns.saturating_add(i.saturating_mul(yield_ns));
        let summable = yield_ns > 0 && yield_ns <= self.cfg.idle_threshold_ns && self.cfg.step_aside_ns == 0;
        let mut i = 0;
        while i < k {
            if summable && !self.slept {
                // Quick calls that leave the idle time below the timeout: n * yield_ns < room.
                let room = self.timeout_ns.saturating_sub(self.idle_acc_ns);
                let n = (room.saturating_sub(1) / yield_ns).min(k - i);
                if n > 0 {
                    i += n;
                    self.clock_ns = at(i).max(self.clock_ns);
                    self.asked_ns = 0;
                    self.counters.yields += n;
                    self.counters.idle_yield_ns += n * yield_ns;
                    self.idle_acc_ns += n * yield_ns;
                    continue;
                }
            }
            i += 1;
            let action = self.on_yield_at(at(i), yield_ns, probe);
            if action != RetentionAction::KeepYielding {
                return action;
            }
        }
        RetentionAction::KeepYielding
    }

    /// Feeds the duration of one `sched_yield()` call, asking `probe` what only the caller can
    /// find out. Without a clock, time is the yields and the asked sleeps added up (exact for
    /// a caller whose sleeps take as long as asked).
    pub fn on_yield_with(&mut self, yield_duration_ns: u64, probe: &mut impl YieldProbe) -> RetentionAction {
        let now = self.clock_ns.saturating_add(self.asked_ns).saturating_add(yield_duration_ns);
        self.on_yield_at(now, yield_duration_ns, probe)
    }

    /// Feeds the duration of one `sched_yield()` call when nothing else is known: every slow
    /// call is work (the paper's rule), and the thread never steps aside.
    pub fn on_yield(&mut self, yield_duration_ns: u64) -> RetentionAction {
        self.on_yield_with(yield_duration_ns, &mut NoProbe)
    }

    fn feed(&mut self, yield_duration_ns: u64, work: bool) -> RetentionAction {
        self.counters.yields += 1;
        if work {
            self.counters.busy_returns += 1;
            self.stepped = false;
            self.idle_acc_ns = 0;
            self.next_sleep_ns = self.cfg.min_sleep_ns.max(1);
            return RetentionAction::KeepYielding;
        }
        if yield_duration_ns > self.cfg.idle_threshold_ns {
            self.counters.noise_returns += 1;
        }
        self.counters.idle_yield_ns += yield_duration_ns;
        self.idle_acc_ns += yield_duration_ns;
        if self.idle_acc_ns < self.timeout_ns {
            return RetentionAction::KeepYielding;
        }
        self.idle_acc_ns = 0;
        self.stepped = false;
        self.timed_out = true;
        self.slept = true;
        let ns = self.next_sleep_ns;
        self.next_sleep_ns = (ns.saturating_mul(2)).min(self.cfg.max_sleep_ns.max(ns));
        self.counters.timeouts += 1;
        self.counters.sleep_ns += ns;
        RetentionAction::Sleep { ns }
    }

    /// An idle period that started at `period_start_ns` ended at `end_ns` (an upper bound if it
    /// reached the timeout): adapt the timeout as the haltpoll governor adapts its window.
    fn period_ended(&mut self, end_ns: u64) {
        let timed_out = std::mem::take(&mut self.timed_out);
        let noise = std::mem::take(&mut self.period_noise_ns);
        let Some(start) = self.period_start_ns.take() else {
            return;
        };
        if !self.cfg.adapt || self.held || !timed_out {
            // Caught before the timeout (or fixed timeout): the timeout stays.
            return;
        }
        let cap = self.cfg.timeout_ns;
        let floor = self.cfg.min_timeout_ns.min(cap);
        let old = self.timeout_ns;
        let idle = end_ns.saturating_sub(start).saturating_sub(noise);
        let new = if idle <= self.long_idle_ns() {
            old.saturating_mul(self.cfg.timeout_grow).max(floor).min(cap)
        } else {
            old.checked_div(self.cfg.timeout_shrink).unwrap_or(0).max(floor)
        };
        if new > old {
            self.counters.timeout_grows += 1;
        } else if new < old {
            self.counters.timeout_shrinks += 1;
        }
        self.timeout_ns = new;
        self.counters.timeout_ns = new;
    }

    /// Sets the timeout's cap (the idle planner's window for this vCPU): a fixed timeout
    /// becomes it, an adaptive one is lowered to it if above and adapts below it from then on.
    pub fn set_cap(&mut self, cap_ns: u64) {
        if cap_ns == self.cfg.timeout_ns {
            return;
        }
        self.cfg.timeout_ns = cap_ns;
        if !self.cfg.adapt || self.held || self.timeout_ns > cap_ns {
            self.timeout_ns = cap_ns;
        }
        self.counters.timeout_ns = self.timeout_ns;
    }

    /// Holds the timeout at the cap (`true`) or lets it adapt again from there (`false`).
    /// The governor holds it while it measures retention paying clearly: then spinning is
    /// worth its CPU, and shrinking risks a cascade in which the halts themselves lengthen the
    /// idle periods (module documentation). No effect without `adapt`.
    pub fn hold_at_cap(&mut self, hold: bool) {
        if !self.cfg.adapt || hold == self.held {
            return;
        }
        self.held = hold;
        if hold {
            self.timeout_ns = self.cfg.timeout_ns;
            self.counters.timeout_ns = self.timeout_ns;
        }
    }

    /// Idle periods that reached the timeout and lasted longer than this shrink it.
    pub fn long_idle_ns(&self) -> u64 {
        self.cfg.long_idle_ns.max(self.cfg.timeout_ns.saturating_add(self.cfg.min_sleep_ns))
    }

    /// Forgets accumulated idleness and backoff (e.g. after the vCPU was reactivated); keeps
    /// the timeout it has learned.
    pub fn reset(&mut self) {
        self.idle_acc_ns = 0;
        self.stepped = false;
        self.next_sleep_ns = self.cfg.min_sleep_ns.max(1);
        self.period_start_ns = None;
        self.timed_out = false;
        self.period_noise_ns = 0;
        self.slept = false;
    }
}

/// Picks the idle threshold from durations of `sched_yield()` calls measured with nothing else
/// runnable: twice the 99th percentile, at least 10 us. `None` for no samples.
///
/// The threshold errs high on purpose: taking a short burst of work for idleness only keeps
/// the thread spinning a little longer, but taking jitter (a yield that spans a timer tick or
/// a host preemption) for work resets the sleep backoff, and an idle workload then costs CPU.
pub fn idle_threshold_from_samples(samples_ns: &[u64]) -> Option<u64> {
    if samples_ns.is_empty() {
        return None;
    }
    let mut v = samples_ns.to_vec();
    v.sort_unstable();
    let p99 = v[(v.len() * 99 / 100).min(v.len() - 1)];
    Some((p99.saturating_mul(2)).max(10_000))
}

/// The retention timeout from a measured vCPU wakeup: spinning for as long as a halt-and-wake
/// would cost is the classic 2-competitive choice. `wake_idle_ns` is the wakeup latency when
/// the target vCPU halts (setting C), `wake_busy_ns` when it is kept busy (setting B).
/// The result is clamped to [10 us, 2 ms].
pub fn timeout_from_wakeup(wake_idle_ns: u64, wake_busy_ns: u64) -> u64 {
    let extra = wake_idle_ns.saturating_sub(wake_busy_ns);
    let t = wake_idle_ns.max(extra.saturating_mul(2));
    t.clamp(10_000, 2_000_000)
}

/// Wakeup latencies (medians, ns) that decide whether retention can pay on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WakeupCosts {
    /// The waiter's vCPU is kept busy by a yielding thread (Table 2 setting B).
    pub busy_ns: u64,
    /// The waiter's vCPU was idle long enough to halt for good (setting C, long gap).
    pub idle_long_ns: u64,
    /// The waiter's vCPU was idle for as long as the retention timeout (setting C with a gap
    /// equal to the timeout): the longest idle period retention would cover.
    pub idle_at_timeout_ns: u64,
}

/// Whether keeping idle vCPUs busy can make wakeups cheaper here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RetentionVerdict {
    /// Waking a vCPU that has been idle for the timeout costs clearly more than waking a busy
    /// one: retention pays.
    Pays,
    /// A vCPU idle for as long as the timeout still wakes about as fast as a busy one. The
    /// host keeps a halted vCPU polling for at least that long (KVM halt polling, a guest
    /// haltpoll cpuidle driver), so every wakeup retention could speed up is already cheap
    /// and its yielding threads would only take CPU from others.
    HostPolls,
    /// Even after a long idle period a halted vCPU wakes about as fast as a busy one: there is
    /// no halt penalty to hide.
    NoHaltPenalty,
}

/// A halt penalty (long-idle minus busy wakeup) below this is measurement noise.
pub const MIN_HALT_PENALTY_NS: u64 = 3_000;

/// Decides from measured wakeups whether retention pays: it does when a vCPU idle for the
/// timeout has paid more than half the halt penalty (`idle_long - busy`) already.
pub fn retention_verdict(c: &WakeupCosts) -> RetentionVerdict {
    let penalty = c.idle_long_ns.saturating_sub(c.busy_ns);
    if penalty < MIN_HALT_PENALTY_NS {
        return RetentionVerdict::NoHaltPenalty;
    }
    if c.idle_at_timeout_ns <= c.busy_ns + penalty / 2 {
        RetentionVerdict::HostPolls
    } else {
        RetentionVerdict::Pays
    }
}

#[cfg(test)]
mod adaptive_tests;

#[cfg(test)]
mod tests;
