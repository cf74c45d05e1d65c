//! `gleaner bench wakeup`: Table 2 of the Gleaner paper (section 3.1) on this machine.
//!
//! The time from just before `notify_one` (a futex wake: `std::sync::Condvar` is futex-based
//! like glibc's `pthread_cond_signal`) to the blocked waiter running again (back from
//! `wait`, mutex re-acquired), in four settings:
//!
//! | setting | waker / waiter | waiter's CPU while it waits |
//! |---|---|---|
//! | A | same CPU | runs the waker |
//! | B | different CPUs | kept busy by a `SCHED_IDLE` thread looping `sched_yield()` |
//! | C | different CPUs | idle: the vCPU halts (after cpuidle polling, if any) |
//! | D | different CPUs | a CPU-bound `SCHED_OTHER` co-runner on every CPU |
//! | E | different CPUs | as D, and the waiter spins on the round counter instead of blocking |
//!
//! E is not the paper's: it is how a host's scheduler treats a vCPU kept from halting on a
//! shared host. A polling or yielding vCPU's thread is always runnable, like E's spinning
//! waiter next to its co-runner; a halted one sleeps and is woken, like D's. Run on a host
//! (or any Linux), D against E measures the two wake costs of a vCPU thread next to a
//! co-runner that the simulator's host model predicts (`scripts/sim/table2-hosts.toml`).
//!
//! One round:
//!
//! ```text
//!  waker (waker CPU)                          waiter (waiter CPU)
//!  wait until waiter announces round r-1 <--- lock; waiting = true; notify waker;
//!                                              cond.wait_timeout(deadline)   (blocks)
//!  sleep period_us (waiter blocks, CPU idles)
//!  /proc/self/task/<waiter>/stat state == S ?   (no: round discarded)
//!  t0 = now; lock; round = r; unlock;
//!  cond.notify_one()  ----------------------> returns from wait; t1 = now
//!  wait until done == r (deadline)  <-------- sample = t1 - t0; done = r; notify waker
//! ```
//!
//! Timestamps are `CLOCK_MONOTONIC` (`Instant`) ns since a shared base, kept in the shared
//! state. Every wait has a deadline: a wakeup that does not arrive within it counts as `lost`
//! and the benchmark goes on (or stops that setting if the peer is gone), never hangs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context;
use gleaner_os::cpuset::CpuSet;
use gleaner_os::procfs::Procfs;
use gleaner_os::{sched, BadInput};
use gleaner_policy::stats::Summary;
use serde::{Deserialize, Serialize};

use crate::measure::pin_current_thread;

/// One of the four settings of Table 2, or E (not the paper's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum), value(rename_all = "UPPER"))]
pub enum Setting {
    /// Waker and waiter on the same CPU.
    A,
    /// Different CPUs; the waiter's CPU kept busy by a SCHED_IDLE sched_yield() loop.
    B,
    /// Different CPUs; the waiter's CPU otherwise idle (halts).
    C,
    /// As C, with a CPU-bound co-runner on every CPU.
    D,
    /// As D, the waiter spinning instead of blocking (a polling vCPU's thread next to a
    /// co-runner, as the host's scheduler sees it); not in the paper, not run by default.
    E,
}

impl Setting {
    /// The paper's four settings (the default run).
    pub const ALL: [Setting; 4] = [Setting::A, Setting::B, Setting::C, Setting::D];

    pub fn describe(self) -> &'static str {
        match self {
            Setting::A => "same CPU",
            Setting::B => "different CPUs, waiter's CPU busy with a SCHED_IDLE yielder",
            Setting::C => "different CPUs, waiter's CPU idle (halts)",
            Setting::D => "different CPUs, CPU-bound co-runner on every CPU",
            Setting::E => "different CPUs, CPU-bound co-runner on every CPU, the waiter spinning (never blocks)",
        }
    }

    /// The paper's figures (p50-like, microseconds): physical machine, virtual machine.
    pub fn paper_us(self) -> (&'static str, &'static str) {
        match self {
            Setting::A => ("4", "6"),
            Setting::B => ("8", "17"),
            Setting::C => ("8", "37"),
            Setting::D => ("17", ">96"),
            Setting::E => ("-", "-"),
        }
    }
}

impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

/// The blocking primitive the waiter sleeps in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Primitive {
    /// `std::sync::Condvar` (futex): timed from `notify_one` (pthread_cond_signal).
    #[default]
    Condvar,
    /// glibc `pthread_mutex_t` (default type, no spinning): timed from
    /// `pthread_mutex_unlock` to `pthread_mutex_timedlock` returning (the paper's Table 2).
    Mutex,
}

impl Primitive {
    pub fn describe(self) -> &'static str {
        match self {
            Primitive::Condvar => "condvar (futex): notify_one -> waiter back from wait",
            Primitive::Mutex => "pthread mutex: pthread_mutex_unlock -> waiter back from pthread_mutex_timedlock",
        }
    }
}

/// What to measure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WakeupConfig {
    pub settings: Vec<Setting>,
    /// The primitive the waiter blocks in.
    #[serde(default)]
    pub primitive: Primitive,
    /// Measured rounds per setting (after the warm-up).
    pub rounds: u32,
    /// Warm-up rounds per setting, not recorded.
    pub warmup: u32,
    /// Time the waker waits after the waiter blocked, before waking it (µs).
    pub period_us: u64,
    pub waker_cpu: u32,
    pub waiter_cpu: u32,
    /// How long a wait may last before the wakeup counts as lost (ms).
    pub deadline_ms: u64,
    /// Setting B only: CPUs kept busy by a yielder as well as the waiter's (the calibration
    /// measures B with a yielder on every vCPU but the waker's, as the agent runs them: where
    /// the vCPUs share fewer host CPUs, the spinning vCPUs delay the waiter's turn).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub busy_also: Vec<u32>,
}

impl WakeupConfig {
    /// Defaults for this process's CPUs: waker on the first allowed CPU, waiter on the second.
    pub fn for_cpus(allowed: &CpuSet) -> WakeupConfig {
        let v = allowed.to_vec();
        let waker_cpu = v.first().copied().unwrap_or(0);
        let waiter_cpu = v.get(1).copied().unwrap_or(waker_cpu);
        WakeupConfig {
            settings: Setting::ALL.to_vec(),
            primitive: Primitive::Condvar,
            rounds: 2000,
            warmup: 20,
            period_us: 1000,
            waker_cpu,
            waiter_cpu,
            deadline_ms: 0,
            busy_also: Vec::new(),
        }
    }

    /// Check against the CPUs this process may use.
    pub fn validate(&self, allowed: &CpuSet) -> Result<(), BadInput> {
        if self.rounds == 0 || self.rounds > 1_000_000 {
            return Err(BadInput::new("--rounds", self.rounds, "1..=1000000"));
        }
        if self.period_us == 0 || self.period_us > 1_000_000 {
            return Err(BadInput::new("--period-us", self.period_us, "1..=1000000 microseconds"));
        }
        if self.settings.is_empty() {
            return Err(BadInput::new("--setting", "(none)", "A, B, C, D, E"));
        }
        if self.primitive == Primitive::Mutex && self.settings.contains(&Setting::E) {
            // E's waiter spins on the round counter: it blocks in no primitive.
            return Err(BadInput::new("--setting", "E", "A, B, C, D with --primitive mutex (E's waiter spins, it blocks in nothing)"));
        }
        for (flag, cpu) in [("--waker-cpu", self.waker_cpu), ("--waiter-cpu", self.waiter_cpu)] {
            if !allowed.contains(cpu) {
                return Err(BadInput::new(flag, cpu, format!("a CPU this process may use: {allowed}")));
            }
        }
        let cross = self.settings.iter().any(|s| *s != Setting::A);
        if cross && self.waker_cpu == self.waiter_cpu {
            let allowed_settings = if allowed.len() < 2 {
                "A only (this process may use one CPU)"
            } else {
                "different --waker-cpu and --waiter-cpu for B, C, D, E"
            };
            return Err(BadInput::new(
                "--setting",
                format!("{:?} with both threads on CPU {}", self.settings, self.waker_cpu),
                allowed_settings,
            ));
        }
        Ok(())
    }

    fn deadline(&self) -> Duration {
        if self.deadline_ms > 0 {
            Duration::from_millis(self.deadline_ms)
        } else {
            Duration::from_millis(200) + Duration::from_micros(self.period_us) * 10
        }
    }
}

/// The result of one setting. Field names are stable: the simulator loads them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SettingResult {
    pub setting: Setting,
    pub description: String,
    pub waker_cpu: u32,
    pub waiter_cpu: u32,
    /// Number of recorded samples.
    pub samples: usize,
    pub mean_us: Option<f64>,
    pub p50_us: Option<f64>,
    pub p90_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub min_us: Option<f64>,
    pub max_us: Option<f64>,
    /// Rounds not recorded because the waiter was not yet blocked when the waker woke it.
    pub discarded: u64,
    /// Rounds whose wakeup did not arrive before the deadline.
    pub lost: u64,
    /// Warm-up rounds (not recorded).
    pub warmup: u32,
    /// The raw samples, ns, in round order.
    pub samples_ns: Vec<u64>,
}

impl SettingResult {
    fn from_samples(setting: Setting, cfg: &WakeupConfig, samples_ns: Vec<u64>, discarded: u64, lost: u64) -> Self {
        let (waker_cpu, waiter_cpu) = placement(setting, cfg);
        let us: Vec<f64> = samples_ns.iter().map(|&n| n as f64 / 1000.0).collect();
        let s = Summary::of(&us).ok();
        SettingResult {
            setting,
            description: setting.describe().to_string(),
            waker_cpu,
            waiter_cpu,
            samples: samples_ns.len(),
            mean_us: s.map(|s| s.mean),
            p50_us: s.map(|s| s.p50),
            p90_us: s.map(|s| s.p90),
            p99_us: s.map(|s| s.p99),
            min_us: s.map(|s| s.min),
            max_us: s.map(|s| s.max),
            discarded,
            lost,
            warmup: cfg.warmup,
            samples_ns,
        }
    }
}

fn placement(setting: Setting, cfg: &WakeupConfig) -> (u32, u32) {
    match setting {
        Setting::A => (cfg.waiter_cpu, cfg.waiter_cpu),
        _ => (cfg.waker_cpu, cfg.waiter_cpu),
    }
}

#[derive(Default)]
struct Shared {
    round: u64,
    t0_ns: u64,
    waiting: bool,
    done: u64,
    sample_ns: u64,
    late: bool,
    stop: bool,
    waiter_tid: i32,
    error: Option<String>,
}

struct Chan {
    m: Mutex<Shared>,
    to_waiter: Condvar,
    to_waker: Condvar,
    base: Instant,
    /// The mutex the waiter blocks in with [`Primitive::Mutex`].
    pm: PthreadMutex,
    /// t0 for [`Primitive::Mutex`]: published before the unlock, read after the lock.
    t0_ns: std::sync::atomic::AtomicU64,
    /// The round, as the spinning waiter of [`Setting::E`] watches it (stored by the waker
    /// with `Shared::round`; `u64::MAX` once the setting stops).
    spin_round: std::sync::atomic::AtomicU64,
}

/// A glibc `pthread_mutex_t` of the default type (no adaptive spinning: a contended lock
/// sleeps in the kernel at once), boxed so its address never changes.
struct PthreadMutex(Box<std::cell::UnsafeCell<libc::pthread_mutex_t>>);

// SAFETY: pthread mutexes exist to be used from several threads at once; the value is only
// ever accessed through the pthread functions, at a stable heap address.
unsafe impl Sync for PthreadMutex {}
// SAFETY: as above; moving the Box does not move the mutex.
unsafe impl Send for PthreadMutex {}

impl PthreadMutex {
    fn new() -> Self {
        Self(Box::new(std::cell::UnsafeCell::new(libc::PTHREAD_MUTEX_INITIALIZER)))
    }

    /// Lock, giving up after `timeout`; true when locked (the caller then owns it).
    fn lock_for(&self, timeout: Duration) -> bool {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid, writable timespec for the call.
        unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
        let total_ns = i128::from(ts.tv_nsec) + i128::try_from(timeout.as_nanos()).unwrap_or(i128::MAX / 4);
        ts.tv_sec = ts.tv_sec.saturating_add(libc::time_t::try_from(total_ns / 1_000_000_000).unwrap_or(libc::time_t::MAX / 2));
        ts.tv_nsec = libc::c_long::try_from(total_ns % 1_000_000_000).unwrap_or(0);
        // SAFETY: the mutex was initialized by PTHREAD_MUTEX_INITIALIZER and lives at a stable
        // address for the lifetime of `self`; `ts` is valid for the call.
        unsafe { libc::pthread_mutex_timedlock(self.0.get(), &ts) == 0 }
    }

    /// Unlock; only called by the thread that locked it.
    fn unlock(&self) {
        // SAFETY: initialized mutex at a stable address, owned by the calling thread (every
        // call site pairs with its own successful `lock_for`).
        unsafe { libc::pthread_mutex_unlock(self.0.get()) };
    }
}

impl Drop for PthreadMutex {
    fn drop(&mut self) {
        // SAFETY: no thread uses the mutex any more (we have `&mut self`) and it is unlocked
        // (every lock is paired with an unlock before the threads exit).
        unsafe { libc::pthread_mutex_destroy(self.0.get()) };
    }
}

impl Chan {
    fn new() -> Chan {
        Chan {
            m: Mutex::new(Shared::default()),
            to_waiter: Condvar::new(),
            to_waker: Condvar::new(),
            base: Instant::now(),
            pm: PthreadMutex::new(),
            t0_ns: std::sync::atomic::AtomicU64::new(0),
            spin_round: std::sync::atomic::AtomicU64::new(0),
        }
    }
    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    fn now_ns(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
    /// Ends the setting: the waiter, blocked or spinning, sees `stop` at once.
    fn stop(&self) {
        self.lock().stop = true;
        // No round is u64::MAX: a spinning waiter stops watching and finds `stop`.
        self.spin_round.store(u64::MAX, Ordering::Release);
        self.to_waiter.notify_all();
    }
}

fn wait_for<'a>(
    cv: &Condvar,
    mut g: MutexGuard<'a, Shared>,
    timeout: Duration,
    done: impl Fn(&Shared) -> bool,
) -> (MutexGuard<'a, Shared>, bool) {
    let until = Instant::now() + timeout;
    while !done(&g) {
        let now = Instant::now();
        if now >= until {
            return (g, false);
        }
        g = cv.wait_timeout(g, until - now).unwrap_or_else(std::sync::PoisonError::into_inner).0;
    }
    (g, true)
}

/// Pins the waiter to `cpu` and tells the waker its tid; a waiter that cannot be pinned tells
/// the waker why and stops the setting (`None`).
fn start_waiter(chan: &Chan, cpu: u32) -> Option<MutexGuard<'_, Shared>> {
    let mut g = chan.lock();
    if let Err(e) = pin_current_thread(cpu) {
        g.error = Some(format!("pinning the waiter to CPU {cpu}: {e}"));
        g.stop = true;
        chan.to_waker.notify_all();
        return None;
    }
    g.waiter_tid = sched::gettid();
    Some(g)
}

/// The waiter of [`Primitive::Condvar`]: announces its round, then waits for the waker to move
/// it, blocked in the condvar or, for [`Setting::E`] (`spin`), spinning on `spin_round` (never
/// blocking: always runnable, as a polling vCPU's thread is).
fn waiter(chan: &Chan, cpu: u32, deadline: Duration, spin: bool) {
    let Some(mut g) = start_waiter(chan, cpu) else { return };
    loop {
        if g.stop {
            break;
        }
        let my = g.round;
        g.waiting = true;
        chan.to_waker.notify_one();
        let until = Instant::now() + deadline;
        let (ng, t1, timed_out) = if spin {
            drop(g);
            let timed_out = spin_until_moved(chan, my, until);
            let t1 = chan.now_ns();
            (chan.lock(), t1, timed_out)
        } else {
            let (g, timed_out) = block_until_moved(chan, g, my, until);
            (g, chan.now_ns(), timed_out)
        };
        g = ng;
        g.waiting = false;
        if g.stop {
            break;
        }
        if g.round == my {
            continue; // the waker did not come within the deadline: announce again
        }
        g.sample_ns = t1.saturating_sub(g.t0_ns);
        g.late = timed_out;
        g.done = g.round;
        chan.to_waker.notify_one();
    }
}

/// Blocks in the condvar until the round moves past `my`, the run stops, or `until`; whether
/// the last wait timed out.
fn block_until_moved<'a>(chan: &'a Chan, mut g: MutexGuard<'a, Shared>, my: u64, until: Instant) -> (MutexGuard<'a, Shared>, bool) {
    let mut timed_out = false;
    while g.round == my && !g.stop {
        let now = Instant::now();
        if now >= until {
            return (g, true);
        }
        let (ng, r) = chan.to_waiter.wait_timeout(g, until - now).unwrap_or_else(std::sync::PoisonError::into_inner);
        g = ng;
        timed_out = r.timed_out();
    }
    (g, timed_out)
}

/// Spins until the waker stores a round past `my` in `spin_round`, or `until`; whether it
/// timed out.
fn spin_until_moved(chan: &Chan, my: u64, until: Instant) -> bool {
    while chan.spin_round.load(Ordering::Acquire) == my {
        if Instant::now() >= until {
            return true;
        }
        std::hint::spin_loop();
    }
    false
}

/// The waiter of [`Primitive::Mutex`]: waits (condvar) for the round to start, then blocks
/// in `pthread_mutex_timedlock` on the mutex the waker holds.
fn waiter_mutex(chan: &Chan, cpu: u32, deadline: Duration) {
    let Some(mut g) = start_waiter(chan, cpu) else { return };
    loop {
        if g.stop {
            break;
        }
        let my = g.round;
        g.waiting = true;
        chan.to_waker.notify_one();
        let (ng, _) = wait_for(&chan.to_waiter, g, deadline, |s| s.round != my || s.stop);
        g = ng;
        g.waiting = false;
        if g.stop {
            break;
        }
        if g.round == my {
            continue;
        }
        drop(g);
        let locked = chan.pm.lock_for(deadline);
        let t1 = chan.now_ns();
        if locked {
            chan.pm.unlock();
        }
        let t0 = chan.t0_ns.load(Ordering::Acquire);
        g = chan.lock();
        g.sample_ns = t1.saturating_sub(t0);
        g.late = !locked;
        g.done = g.round;
        chan.to_waker.notify_one();
    }
}

/// The waker of [`Primitive::Mutex`]: holds the mutex, starts the round, lets the waiter
/// block on the mutex, then unlocks it.
fn waker_mutex(chan: &Chan, cpu: u32, cfg: &WakeupConfig, procfs: &Procfs) -> anyhow::Result<Tally> {
    pin_current_thread(cpu).with_context(|| format!("pinning the waker to CPU {cpu}"))?;
    let pid = i32::try_from(std::process::id()).context("pid out of range")?;
    let period = Duration::from_micros(cfg.period_us);
    let peer_deadline = cfg.deadline() * 2 + Duration::from_secs(1);
    let mut t = Tally::new(cfg);
    for r in 1..=t.total {
        let (mut g, ok) = wait_for(&chan.to_waker, chan.lock(), peer_deadline, |s| (s.waiting && s.round == r - 1) || s.stop);
        if let Some(e) = &g.error {
            anyhow::bail!("{e}");
        }
        if !ok || !chan.pm.lock_for(peer_deadline) {
            t.lose_the_rest(r);
            tracing::warn!("waiter thread unresponsive; ending this setting after {} rounds", r - 1);
            break;
        }
        let tid = g.waiter_tid;
        g.round = r;
        drop(g);
        chan.to_waiter.notify_one();
        std::thread::sleep(period);
        let blocked = procfs.task_stat(pid, tid).map(|s| s.state == 'S').unwrap_or(false);
        chan.t0_ns.store(chan.now_ns(), Ordering::Release);
        chan.pm.unlock();
        let (g, ok) = wait_for(&chan.to_waker, chan.lock(), peer_deadline, |s| s.done == r);
        if !ok {
            t.lose_the_rest(r);
            tracing::warn!("waiter did not report round {r}; ending this setting");
            break;
        }
        t.count(r, g.late, blocked, g.sample_ns);
    }
    Ok(t)
}

/// A waker's rounds: `warmup` rounds first (not counted), then `rounds` counted ones.
struct Tally {
    samples: Vec<u64>,
    discarded: u64,
    lost: u64,
    warmup: u64,
    total: u64,
}

impl Tally {
    fn new(cfg: &WakeupConfig) -> Self {
        let warmup = u64::from(cfg.warmup);
        Self { samples: Vec::with_capacity(cfg.rounds as usize), discarded: 0, lost: 0, warmup, total: u64::from(cfg.rounds) + warmup }
    }

    /// Round `r` (1-based) ended: a warm-up round is not counted; a late waiter is a lost
    /// sample, a waiter that was not blocked a discarded one, else `sample_ns` is a sample.
    fn count(&mut self, r: u64, late: bool, blocked: bool, sample_ns: u64) {
        if r <= self.warmup {
        } else if late {
            self.lost += 1;
        } else if !blocked {
            self.discarded += 1;
        } else {
            self.samples.push(sample_ns);
        }
    }

    /// The setting ends at round `r` (the peer stopped answering): its counted rounds from
    /// `r` on are lost.
    fn lose_the_rest(&mut self, r: u64) {
        self.lost += self.total - (r - 1).max(self.warmup);
    }
}

/// The waker of [`Primitive::Condvar`] (and of [`Setting::E`]'s spinning waiter, which is
/// never blocked: `spinning` counts its rounds without that check).
fn waker(chan: &Chan, cpu: u32, cfg: &WakeupConfig, procfs: &Procfs, spinning: bool) -> anyhow::Result<Tally> {
    pin_current_thread(cpu).with_context(|| format!("pinning the waker to CPU {cpu}"))?;
    let pid = i32::try_from(std::process::id()).context("pid out of range")?;
    let period = Duration::from_micros(cfg.period_us);
    let peer_deadline = cfg.deadline() * 2 + Duration::from_secs(1);
    let mut t = Tally::new(cfg);
    for r in 1..=t.total {
        let (g, ok) = wait_for(&chan.to_waker, chan.lock(), peer_deadline, |s| (s.waiting && s.round == r - 1) || s.stop);
        if let Some(e) = &g.error {
            anyhow::bail!("{e}");
        }
        if !ok {
            t.lose_the_rest(r);
            tracing::warn!("waiter thread unresponsive; ending this setting after {} rounds", r - 1);
            break;
        }
        let tid = g.waiter_tid;
        drop(g);
        std::thread::sleep(period);
        let blocked = spinning || procfs.task_stat(pid, tid).map(|s| s.state == 'S').unwrap_or(false);
        let t0 = chan.now_ns();
        {
            let mut g = chan.lock();
            g.round = r;
            g.t0_ns = t0;
            chan.spin_round.store(r, Ordering::Release);
        }
        chan.to_waiter.notify_one();
        let (g, ok) = wait_for(&chan.to_waker, chan.lock(), peer_deadline, |s| s.done == r);
        if !ok {
            t.lose_the_rest(r);
            tracing::warn!("waiter did not report round {r}; ending this setting");
            break;
        }
        t.count(r, g.late, blocked, g.sample_ns);
    }
    Ok(t)
}

/// A SCHED_IDLE thread on `cpu` calling `sched_yield()` until the returned value is dropped
/// (the yielder of setting B; `gleaner bench yielders`).
pub fn yielder_load(cpu: u32) -> anyhow::Result<impl Drop> {
    Load::yielder(cpu)
}

/// Background load for settings B and D, stopped and joined on drop.
struct Load {
    stop: std::sync::Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn none() -> Load {
        Load { stop: std::sync::Arc::new(AtomicBool::new(false)), threads: Vec::new() }
    }

    /// A SCHED_IDLE thread on `cpu` calling sched_yield() in a loop.
    fn yielder(cpu: u32) -> anyhow::Result<Load> {
        Load::yielders([cpu])
    }

    /// [`Load::yielder`] on each of `cpus`.
    fn yielders(cpus: impl IntoIterator<Item = u32>) -> anyhow::Result<Load> {
        let mut l = Load::none();
        for cpu in cpus {
            let stop = l.stop.clone();
            let (tx, rx) = std::sync::mpsc::channel();
            l.threads.push(std::thread::spawn(move || {
                let r = pin_current_thread(cpu).and_then(|()| sched::set_idle(sched::gettid()));
                let ok = r.is_ok();
                let _ = tx.send(r);
                while ok && !stop.load(Ordering::Relaxed) {
                    sched::yield_now();
                }
            }));
            rx.recv().context("yielder thread died")?.with_context(|| format!("making a SCHED_IDLE yielder on CPU {cpu}"))?;
        }
        Ok(l)
    }

    /// A CPU-bound SCHED_OTHER thread on each of `cpus`.
    fn hogs(cpus: &CpuSet) -> anyhow::Result<Load> {
        let mut l = Load::none();
        for cpu in cpus {
            let stop = l.stop.clone();
            let (tx, rx) = std::sync::mpsc::channel();
            l.threads.push(std::thread::spawn(move || {
                let ok = pin_current_thread(cpu).is_ok();
                let _ = tx.send(ok);
                let mut x = u64::from(cpu);
                while ok && !stop.load(Ordering::Relaxed) {
                    x = burn(x, 10_000);
                }
            }));
            if !rx.recv().unwrap_or(false) {
                anyhow::bail!("cannot pin a co-runner to CPU {cpu}");
            }
        }
        Ok(l)
    }
}

/// `n` dependent multiply-adds (a 64-bit LCG, as the bench's compute unit): plain CPU work
/// for the co-runners of setting D, with no `pause` instruction that a hypervisor could turn
/// into a pause-loop exit.
#[inline(never)]
fn burn(mut x: u64, n: u64) -> u64 {
    for _ in 0..std::hint::black_box(n) {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    }
    std::hint::black_box(x)
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Run one setting.
pub fn run_setting(setting: Setting, cfg: &WakeupConfig, allowed: &CpuSet, procfs: &Procfs) -> anyhow::Result<SettingResult> {
    let (waker_cpu, waiter_cpu) = placement(setting, cfg);
    let _load = match setting {
        Setting::B => Load::yielders(std::iter::once(waiter_cpu).chain(cfg.busy_also.iter().copied().filter(|&c| c != waiter_cpu)))?,
        Setting::D | Setting::E => Load::hogs(allowed)?,
        Setting::A | Setting::C => Load::none(),
    };
    let chan = Chan::new();
    let deadline = cfg.deadline();
    let spin = setting == Setting::E;
    let tally = std::thread::scope(|s| {
        let (w, k) = match (setting, cfg.primitive) {
            (Setting::E, _) | (_, Primitive::Condvar) => {
                (s.spawn(|| waiter(&chan, waiter_cpu, deadline, spin)), s.spawn(|| waker(&chan, waker_cpu, cfg, procfs, spin)))
            }
            (_, Primitive::Mutex) => {
                (s.spawn(|| waiter_mutex(&chan, waiter_cpu, deadline)), s.spawn(|| waker_mutex(&chan, waker_cpu, cfg, procfs)))
            }
        };
        let tally = k.join();
        chan.stop();
        let _ = w.join();
        tally
    });
    let tally = match tally {
        Ok(t) => t?,
        Err(p) => std::panic::resume_unwind(p),
    };
    Ok(SettingResult::from_samples(setting, cfg, tally.samples, tally.discarded, tally.lost))
}

/// Run every configured setting in order.
pub fn run(cfg: &WakeupConfig, allowed: &CpuSet, procfs: &Procfs) -> anyhow::Result<Vec<SettingResult>> {
    cfg.validate(allowed)?;
    let mut out = Vec::new();
    for &s in &cfg.settings {
        tracing::info!("wakeup setting {s}: {} rounds", cfg.rounds);
        out.push(run_setting(s, cfg, allowed, procfs).with_context(|| format!("setting {s}"))?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setting_b_keeps_the_cpus_it_is_given_busy_as_well_as_the_waiter_s() {
        let allowed = sched::affinity(0).unwrap();
        assert!(allowed.len() >= 2, "this test needs 2 CPUs this process may use, has {allowed}");
        let mut cfg =
            WakeupConfig { settings: vec![Setting::B], rounds: 30, warmup: 2, period_us: 200, ..WakeupConfig::for_cpus(&allowed) };
        // The waker's own CPU too (the calibration leaves it out; here it shows the load runs).
        cfg.busy_also = vec![cfg.waker_cpu, cfg.waiter_cpu];
        let load =
            Load::yielders(std::iter::once(cfg.waiter_cpu).chain(cfg.busy_also.iter().copied().filter(|&c| c != cfg.waiter_cpu))).unwrap();
        assert_eq!(load.threads.len(), 2, "one yielder per CPU, the waiter's once");
        drop(load);
        let r = run_setting(Setting::B, &cfg, &allowed, &Procfs::new()).unwrap();
        assert!(r.mean_us.is_some(), "{r:?}");
        let back: WakeupConfig = serde_json::from_value(serde_json::to_value(WakeupConfig::for_cpus(&allowed)).unwrap()).unwrap();
        assert!(back.busy_also.is_empty());
    }

    #[test]
    fn setting_e_s_spinning_waiter_records_every_round_and_discards_none() {
        let allowed = sched::affinity(0).unwrap();
        assert!(allowed.len() >= 2, "this test needs 2 CPUs this process may use, has {allowed}");
        let cfg = WakeupConfig { settings: vec![Setting::E], rounds: 30, warmup: 2, period_us: 200, ..WakeupConfig::for_cpus(&allowed) };
        let r = run_setting(Setting::E, &cfg, &allowed, &Procfs::new()).unwrap();
        // Never blocked, so never "not yet blocked": no round is discarded, and none is lost.
        assert_eq!((r.samples, r.discarded, r.lost), (30, 0, 0), "{r:?}");
        assert!(r.min_us.is_some_and(|m| m >= 0.0) && r.max_us >= r.min_us, "{r:?}");
    }

    /// E's waiter moves on the round counter alone, where the blocking one waits to be
    /// notified; and both see the end of the setting at once, not at their deadline.
    #[test]
    fn the_spinning_waiter_needs_no_notify_and_both_stop_at_once() {
        let cpu = sched::affinity(0).unwrap().iter().next().expect("a CPU");
        for spin in [true, false] {
            let chan = Chan::new();
            let deadline = Duration::from_secs(5);
            std::thread::scope(|s| {
                let w = s.spawn(|| waiter(&chan, cpu, deadline, spin));
                let (mut g, ok) = wait_for(&chan.to_waker, chan.lock(), deadline, |s| s.waiting);
                assert!(ok, "the waiter never announced its round");
                g.round = 1;
                g.t0_ns = chan.now_ns();
                drop(g);
                chan.spin_round.store(1, Ordering::Release); // and no notify
                let moved = wait_for(&chan.to_waker, chan.lock(), Duration::from_millis(300), |s| s.done == 1).1;
                assert_eq!(moved, spin, "spinning {spin}: moved by the counter alone {moved}");
                let t = Instant::now();
                chan.stop();
                w.join().unwrap();
                assert!(t.elapsed() < Duration::from_secs(1), "spinning {spin}: stopped after {:?}", t.elapsed());
            });
        }
    }

    #[test]
    fn tally_skips_warmup_and_sorts_late_unblocked_and_good_rounds() {
        let cfg = WakeupConfig { rounds: 4, warmup: 2, ..WakeupConfig::for_cpus(&CpuSet::from_iter([0])) };
        let mut t = Tally::new(&cfg);
        assert_eq!(t.total, 6);
        t.count(1, true, false, 1); // warm-up: nothing counted, whatever happened
        t.count(2, false, true, 2);
        t.count(3, false, true, 30);
        t.count(4, true, true, 40);
        t.count(5, false, false, 50);
        assert_eq!((t.samples.as_slice(), t.lost, t.discarded), (&[30][..], 1, 1));
        // The waiter stops answering in round 6: that round is lost too.
        t.lose_the_rest(6);
        assert_eq!(t.lost, 2);
        // Stopping during the warm-up loses every counted round.
        let mut early = Tally::new(&cfg);
        early.lose_the_rest(2);
        assert_eq!(early.lost, 4);
    }
}
