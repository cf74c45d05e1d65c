//! Resource retention mechanism: one `SCHED_IDLE` yielding thread pinned to each managed vCPU.
//!
//! The decisions (idle or not, when to let the vCPU halt, how long to sleep, the per-vCPU
//! adaptive timeout) are made by [`gleaner_policy::retention::IdleDetector`]; this module only
//! runs the loop with a monotonic clock, publishes the detector's counters in atomics for the
//! sampler, and parks threads of deactivated vCPUs, of vCPUs the idle planner gives no window
//! ([`Yielders::set_windows`]), or all of them while retention is off
//! ([`Yielders::set_retention`], the governor's switch).

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use gleaner_os::cpuset::CpuSet;
use gleaner_os::sched;
use gleaner_policy::idle::Log2Hist;
use gleaner_policy::retention::{IdleDetector, RetentionAction, RetentionConfig, RetentionCounters, YieldProbe};

/// Counters of one yielding thread, readable from other threads.
#[derive(Debug, Default)]
pub struct SlotCounters {
    pub yields: AtomicU64,
    pub busy_returns: AtomicU64,
    pub idle_yield_ns: AtomicU64,
    pub timeouts: AtomicU64,
    pub sleep_ns: AtomicU64,
    pub step_asides: AtomicU64,
    pub noise_returns: AtomicU64,
    pub timeout_ns: AtomicU64,
    pub timeout_grows: AtomicU64,
    pub timeout_shrinks: AtomicU64,
    pub asleep_work: AtomicU64,
}

impl SlotCounters {
    fn publish(&self, c: &RetentionCounters) {
        self.yields.store(c.yields, Ordering::Relaxed);
        self.busy_returns.store(c.busy_returns, Ordering::Relaxed);
        self.idle_yield_ns.store(c.idle_yield_ns, Ordering::Relaxed);
        self.timeouts.store(c.timeouts, Ordering::Relaxed);
        self.sleep_ns.store(c.sleep_ns, Ordering::Relaxed);
        self.step_asides.store(c.step_asides, Ordering::Relaxed);
        self.noise_returns.store(c.noise_returns, Ordering::Relaxed);
        self.timeout_ns.store(c.timeout_ns, Ordering::Relaxed);
        self.timeout_grows.store(c.timeout_grows, Ordering::Relaxed);
        self.timeout_shrinks.store(c.timeout_shrinks, Ordering::Relaxed);
        self.asleep_work.store(c.asleep_work, Ordering::Relaxed);
    }

    /// A consistent-enough copy (each field is monotonic).
    pub fn read(&self) -> RetentionCounters {
        RetentionCounters {
            yields: self.yields.load(Ordering::Relaxed),
            busy_returns: self.busy_returns.load(Ordering::Relaxed),
            idle_yield_ns: self.idle_yield_ns.load(Ordering::Relaxed),
            timeouts: self.timeouts.load(Ordering::Relaxed),
            sleep_ns: self.sleep_ns.load(Ordering::Relaxed),
            step_asides: self.step_asides.load(Ordering::Relaxed),
            noise_returns: self.noise_returns.load(Ordering::Relaxed),
            timeout_ns: self.timeout_ns.load(Ordering::Relaxed),
            timeout_grows: self.timeout_grows.load(Ordering::Relaxed),
            timeout_shrinks: self.timeout_shrinks.load(Ordering::Relaxed),
            asleep_work: self.asleep_work.load(Ordering::Relaxed),
        }
    }
}

/// One vCPU's yielding thread, as seen from the agent.
#[derive(Debug)]
pub struct Slot {
    pub cpu: u32,
    /// The thread's tid once it runs (0 before).
    pub tid: AtomicI32,
    pub counters: SlotCounters,
    active: AtomicBool,
    /// The idle planner's window for this vCPU, ns: the detector's timeout cap (0 parks the
    /// thread, `u64::MAX` never lets the vCPU halt).
    window_ns: AtomicU64,
    /// The idle periods the thread caught so far (`IdleDetector::caught`, cumulative): the
    /// scheduler tracer cannot see them, the planner needs them.
    caught: Mutex<Log2Hist>,
}

impl Slot {
    /// The idle periods caught so far (cumulative).
    pub fn caught(&self) -> Log2Hist {
        self.caught.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Publishes the detector's counters, and its catches when there are new ones.
    fn publish(&self, det: &IdleDetector) {
        self.counters.publish(&det.counters());
        let mut c = self.caught.lock().unwrap_or_else(|e| e.into_inner());
        if c.count() != det.caught().count() {
            c.clone_from(det.caught());
        }
    }

    fn parked(&self, shared: &Shared) -> bool {
        !self.active.load(Ordering::Relaxed) || !shared.retain.load(Ordering::Relaxed) || self.window_ns.load(Ordering::Relaxed) == 0
    }
}

#[derive(Debug)]
struct Shared {
    stop: AtomicBool,
    /// Retention on (the governor's mode): off parks every thread, like a deactivated vCPU.
    retain: AtomicBool,
    /// Hold the adaptive timeouts at their cap (the governor measures retention paying).
    hold: AtomicBool,
    /// Origin of the threads' monotonic clock (the detector measures idle periods with it).
    epoch: Instant,
    /// Yielding threads that are runnable now (in the yield loop, not sleeping or parked):
    /// subtracted from the kernel's runnable count to see the other threads.
    runnable: AtomicU32,
    /// Online CPUs: more other threads runnable than this minus one means one is waiting.
    online_cpus: u32,
    /// Wakes parked threads (deactivated vCPUs, retention back on, or stop).
    gate: Mutex<()>,
    wake: Condvar,
}

impl Shared {
    fn new(online_cpus: u32, retain: bool) -> Self {
        Self {
            stop: AtomicBool::new(false),
            retain: AtomicBool::new(retain),
            hold: AtomicBool::new(false),
            epoch: Instant::now(),
            runnable: AtomicU32::new(0),
            online_cpus,
            gate: Mutex::new(()),
            wake: Condvar::new(),
        }
    }

    fn notify(&self) {
        let _g = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        self.wake.notify_all();
    }
}

/// The set of yielding threads. Dropping it stops and joins them.
#[derive(Debug)]
pub struct Yielders {
    slots: Vec<Arc<Slot>>,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Yielders {
    /// Starts one thread per CPU of `cpus`, pinned and `SCHED_IDLE`, yielding if `retain`
    /// (else parked until [`Self::set_retention`]). Fails (and stops the threads already
    /// started) if a thread cannot be pinned or made `SCHED_IDLE`.
    pub fn start(cpus: &CpuSet, cfg: RetentionConfig, retain: bool) -> anyhow::Result<Self> {
        let online = gleaner_os::sysfs::Sysfs::new().online_cpus().map(|c| c.len()).unwrap_or(0);
        let online_cpus = u32::try_from(online).unwrap_or(u32::MAX).max(u32::try_from(cpus.len()).unwrap_or(u32::MAX));
        let shared = Arc::new(Shared::new(online_cpus, retain));
        let mut me = Self { slots: Vec::new(), shared, threads: Vec::new() };
        for cpu in cpus.iter() {
            let slot = Arc::new(Slot {
                cpu,
                tid: AtomicI32::new(0),
                counters: SlotCounters::default(),
                active: AtomicBool::new(true),
                window_ns: AtomicU64::new(cfg.timeout_ns),
                caught: Mutex::new(Log2Hist::default()),
            });
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let (s, sh) = (Arc::clone(&slot), Arc::clone(&me.shared));
            let handle = std::thread::Builder::new()
                .name(format!("gleaner-yield{cpu}"))
                .spawn(move || {
                    let setup = setup_thread(cpu);
                    let ok = setup.is_ok();
                    let _ = ready_tx.send(setup);
                    if ok {
                        s.tid.store(sched::gettid(), Ordering::Relaxed);
                        yield_loop(&s, &sh, cfg);
                    }
                })
                .context("spawning a yielding thread")?;
            me.threads.push(handle);
            me.slots.push(slot);
            let setup = ready_rx.recv().context("yielding thread died during setup")?;
            setup.with_context(|| format!("setting up the yielding thread of CPU {cpu}"))?;
        }
        Ok(me)
    }

    pub fn slots(&self) -> &[Arc<Slot>] {
        &self.slots
    }

    /// Activates the threads of `active` CPUs and parks the others.
    pub fn set_active(&self, active: &CpuSet) {
        for s in &self.slots {
            s.active.store(active.contains(s.cpu), Ordering::Relaxed);
        }
        self.shared.notify();
    }

    /// Sets each vCPU's window (the detector's timeout cap; 0 parks its thread). vCPUs not
    /// listed keep theirs.
    pub fn set_windows(&self, windows: &[(u32, u64)]) {
        for s in &self.slots {
            if let Some(&(_, w)) = windows.iter().find(|(c, _)| *c == s.cpu) {
                s.window_ns.store(w, Ordering::Relaxed);
            }
        }
        self.shared.notify();
    }

    /// Turns retention on (threads of active CPUs yield) or off (every thread parks).
    pub fn set_retention(&self, on: bool) {
        self.shared.retain.store(on, Ordering::Relaxed);
        self.shared.notify();
    }

    /// Holds every thread's adaptive timeout at its cap (`true`) or lets them adapt.
    pub fn hold_timeouts(&self, hold: bool) {
        self.shared.hold.store(hold, Ordering::Relaxed);
    }

    /// Whether retention is on.
    pub fn retaining(&self) -> bool {
        self.shared.retain.load(Ordering::Relaxed)
    }

    /// Sum of the counters of every thread.
    pub fn totals(&self) -> RetentionCounters {
        self.slots.iter().fold(RetentionCounters::default(), |mut acc, s| {
            let c = s.counters.read();
            acc.yields += c.yields;
            acc.busy_returns += c.busy_returns;
            acc.idle_yield_ns += c.idle_yield_ns;
            acc.timeouts += c.timeouts;
            acc.sleep_ns += c.sleep_ns;
            acc.step_asides += c.step_asides;
            acc.noise_returns += c.noise_returns;
            acc.timeout_grows += c.timeout_grows;
            acc.timeout_shrinks += c.timeout_shrinks;
            acc.asleep_work += c.asleep_work;
            acc
        })
    }

    /// Stops and joins every thread.
    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.notify();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Yielders {
    fn drop(&mut self) {
        self.stop();
    }
}

fn setup_thread(cpu: u32) -> anyhow::Result<()> {
    let tid = sched::gettid();
    sched::set_affinity(tid, &CpuSet::from_iter([cpu]))?;
    sched::set_idle(tid)?;
    // The step-aside sleep is a microsecond; the default 50 us slack would stretch it.
    sched::set_own_timer_slack(1_000)?;
    Ok(())
}

/// Sleeps `ns` while not counted as a runnable yielder.
fn sleep_uncounted(shared: &Shared, ns: u64) {
    shared.runnable.fetch_sub(1, Ordering::Relaxed);
    std::thread::sleep(Duration::from_nanos(ns));
    shared.runnable.fetch_add(1, Ordering::Relaxed);
}

/// What a yielding thread can find out about its CPU (see [`YieldProbe`]).
struct ThreadProbe<'a> {
    shared: &'a Shared,
    loadavg: Option<gleaner_os::procfs::Loadavg>,
    /// This thread's involuntary context switches when last asked. A `sched_yield()` that hands
    /// the CPU to another task is an involuntary switch; sleeping and parking are voluntary, so
    /// they do not disturb the count.
    nivcsw: Option<u64>,
    /// This thread's schedstat (only with an adaptive timeout): a thread woken from a sleep
    /// while another task runs on its CPU waits in the run queue, and that delay shows.
    schedstat: Option<gleaner_os::procfs::SchedstatFile>,
    /// Run-queue delay when the thread went to sleep.
    delay_before_sleep: Option<u64>,
    /// A wait longer than this after a sleep means a task held the CPU when the sleep ended.
    busy_wait_ns: u64,
}

impl ThreadProbe<'_> {
    fn involuntary_switches() -> Option<u64> {
        gleaner_os::rusage::thread_rusage().ok().map(|r| r.nivcsw)
    }

    fn run_queue_delay(&mut self) -> Option<u64> {
        self.schedstat.as_mut().and_then(|f| f.read().ok()).map(|s| s.wait_ns)
    }

    /// Called just before the thread sleeps after a timeout.
    fn going_to_sleep(&mut self) {
        self.delay_before_sleep = self.run_queue_delay();
    }
}

impl YieldProbe for ThreadProbe<'_> {
    fn other_task_ran(&mut self) -> bool {
        let now = Self::involuntary_switches();
        let before = std::mem::replace(&mut self.nivcsw, now);
        match (before, now) {
            (Some(a), Some(b)) => b != a,
            // Cannot tell: count it as work, as the paper does.
            _ => true,
        }
    }

    fn others_waiting(&mut self) -> bool {
        let Some(runnable) = self.loadavg.as_mut().and_then(|l| l.runnable().ok()) else { return false };
        let others = runnable.saturating_sub(self.shared.runnable.load(Ordering::Relaxed));
        // This CPU is idle, so at most online - 1 of the others run: the rest wait.
        others >= self.shared.online_cpus
    }

    /// Work that ran during the sleep and was still running when it ended delayed this
    /// thread's wake-up in the run queue (work that came and went within the sleep leaves no
    /// trace: then the detector sees the period's end later, an upper bound).
    fn ran_while_asleep(&mut self) -> bool {
        let before = self.delay_before_sleep.take();
        match (before, self.run_queue_delay()) {
            (Some(a), Some(b)) => b.saturating_sub(a) > self.busy_wait_ns,
            _ => false,
        }
    }
}

fn yield_loop(slot: &Slot, shared: &Shared, cfg: RetentionConfig) {
    let mut det = IdleDetector::new(cfg);
    let procfs = gleaner_os::procfs::Procfs::new();
    // Without /proc/loadavg the thread cannot see waiting threads: it just never steps aside.
    // Without its schedstat it cannot see work during its sleeps: the adaptive timeout then
    // learns an idle period's end at the next slow yield (an upper bound).
    let mut probe = ThreadProbe {
        shared,
        loadavg: procfs.open_loadavg().ok(),
        nivcsw: ThreadProbe::involuntary_switches(),
        schedstat: cfg.adapt.then(|| procfs.open_task_schedstat(std::process::id().cast_signed(), sched::gettid()).ok()).flatten(),
        delay_before_sleep: None,
        busy_wait_ns: cfg.idle_threshold_ns,
    };
    let mut n: u32 = 0;
    shared.runnable.fetch_add(1, Ordering::Relaxed);
    slot.publish(&det);
    while !shared.stop.load(Ordering::Relaxed) {
        if slot.parked(shared) {
            slot.publish(&det);
            shared.runnable.fetch_sub(1, Ordering::Relaxed);
            let g = shared.gate.lock().unwrap_or_else(|e| e.into_inner());
            // Re-check under the lock: set_active/set_retention/set_windows/stop notify while
            // holding it.
            if slot.parked(shared) && !shared.stop.load(Ordering::Relaxed) {
                let _ = shared.wake.wait_timeout(g, Duration::from_millis(500));
            }
            shared.runnable.fetch_add(1, Ordering::Relaxed);
            det.reset();
            continue;
        }
        det.set_cap(slot.window_ns.load(Ordering::Relaxed));
        det.hold_at_cap(shared.hold.load(Ordering::Relaxed));
        let t0 = Instant::now();
        sched::yield_now();
        let t1 = Instant::now();
        let now_ns = duration_ns(t1.duration_since(shared.epoch));
        match det.on_yield_at(now_ns, duration_ns(t1.duration_since(t0)), &mut probe) {
            RetentionAction::KeepYielding => {}
            RetentionAction::Sleep { ns } => {
                probe.going_to_sleep();
                sleep_uncounted(shared, ns);
                slot.publish(&det);
            }
            RetentionAction::StepAside { ns } => sleep_uncounted(shared, ns),
        }
        n = n.wrapping_add(1);
        if n.is_multiple_of(64) {
            slot.publish(&det);
        }
    }
    shared.runnable.fetch_sub(1, Ordering::Relaxed);
    slot.publish(&det);
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Measures `samples` back-to-back `sched_yield()` calls on the current thread (for the idle
/// threshold calibration): call it from a thread pinned to a CPU with nothing else runnable.
pub fn sample_yields(samples: usize) -> Vec<u64> {
    (0..samples)
        .map(|_| {
            let t0 = Instant::now();
            sched::yield_now();
            duration_ns(t0.elapsed())
        })
        .collect()
}
