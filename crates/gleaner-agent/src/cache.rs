//! Calibration is a per-boot fact: measured once (`gleaner calibrate`, or the first agent that
//! needs it), kept in `RUN_DIR/calibration.json`, and reused by `run`, `attach`, `compare`
//! and `daemon` until something it depends on changes.
//!
//! ```text
//!   agent start ──> Dependencies::read (boot id, kernel, CPUs, cpuidle, haltpoll params)
//!        │
//!        ├── record valid? (same dependencies, younger than max age, not --recalibrate)
//!        │      yes ──> Cached { path, age }                       (no lock, one read)
//!        │      no  ──> lock RUN_DIR ──> valid now? (another agent just measured) ──> Cached
//!        │                          └──> calibrate::measure (~0.5 s) ──> write temp + rename
//!        │                                 ──> MeasuredNow { why, stored }
//!   daemon, every few minutes: record due (90% of max age, or invalid) and the machine idle
//!        and no retention running (it would distort the measurement) ──> measure and store
//! ```
//!
//! One schema ([`CalibrationRecord`]) for everything: the record, `gleaner calibrate --json`,
//! and the provenance ([`CalibrationSource`]) in `status` and `compare --json`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gleaner_os::cpuset::CpuSet;
use gleaner_os::procfs::{CpuTimes, Procfs};
use gleaner_os::sysfs::Sysfs;
use serde::{Deserialize, Serialize};

use gleaner_measure::calibration::{measured_pair, schema_meaning};
pub use gleaner_measure::calibration::{
    CalibrationRecord, CalibrationResults, Dependencies, DependencyChange, PollingControl, RecordError, FILE_NAME, SCHEMA,
};

use crate::calibrate::Incomplete;

/// Default maximum age of a record (config `calibration_max_age_s`).
pub const DEFAULT_MAX_AGE_S: u64 = 24 * 3600;

/// A record is far smaller; anything bigger is not ours.
const MAX_RECORD_BYTES: u64 = 64 * 1024;

/// The daemon refreshes a record from this fraction of its maximum age, so that agents
/// started meanwhile never find it expired.
const REFRESH_AT: f64 = 0.9;

/// The machine counts as idle for a refresh below this busy fraction (all CPUs, 1 s window).
pub const IDLE_BUSY_FRACTION: f64 = 0.10;

/// Why the numbers were measured now instead of read from a record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reason {
    /// No record yet.
    Missing,
    /// Asked for (`--recalibrate`).
    Recalibrate,
    /// Older than the maximum age.
    Expired { age_s: u64, max_age_s: u64 },
    /// Something the record depends on changed.
    DependencyChanged(DependencyChange),
    /// The record cannot be used: corrupt, another schema, a symlink, not private. It is
    /// ignored, never followed.
    Unusable { problem: String },
    /// The run dir cannot be created, or others could write it: nothing in it is read or
    /// written.
    RunDirUnusable { problem: String },
    /// The daemon renews a record near its maximum age while the machine idles.
    Refresh { age_s: u64, max_age_s: u64 },
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Missing => write!(f, "no record yet"),
            Reason::Recalibrate => write!(f, "--recalibrate"),
            Reason::Expired { age_s, max_age_s } => write!(f, "expired: {} old, max {}", human_age(*age_s), human_age(*max_age_s)),
            Reason::DependencyChanged(c) => write!(f, "{} changed: {} -> {}", c.dependency, c.was, c.now),
            Reason::Unusable { problem } => write!(f, "record ignored: {problem}"),
            Reason::RunDirUnusable { problem } => write!(f, "run dir not usable: {problem}"),
            Reason::Refresh { age_s, max_age_s } => write!(f, "refresh: {} old, max {}", human_age(*age_s), human_age(*max_age_s)),
        }
    }
}

/// Where an agent's calibration came from (status, `compare --json`, stderr notes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "origin", rename_all = "snake_case")]
pub enum CalibrationSource {
    /// Read from a valid record.
    Cached { path: PathBuf, age_s: u64, measured_at_unix_s: u64 },
    /// Measured by this agent.
    MeasuredNow {
        why: Reason,
        /// Where the new record was stored; `None` with `not_stored` saying why.
        stored: Option<PathBuf>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        not_stored: Option<String>,
        took_ms: u64,
        measured_at_unix_s: u64,
    },
    /// No valid record at start: the run planned from the prior curve
    /// (`gleaner_policy::idle::WakeCurve::prior`) and measures this VM's after its workload.
    Prior { why: Reason },
}

impl CalibrationSource {
    /// Age of the numbers now (wall clock), for `status`.
    pub fn age_now_s(&self) -> u64 {
        let at = match self {
            Self::Cached { measured_at_unix_s, .. } | Self::MeasuredNow { measured_at_unix_s, .. } => *measured_at_unix_s,
            Self::Prior { .. } => return 0,
        };
        unix_now_s().saturating_sub(at)
    }

    /// The run planned from the prior, and a measurement after it could be stored for the
    /// runs after it (a run dir that cannot hold a record is not worth measuring for).
    pub fn wants_measuring(&self) -> bool {
        matches!(self, Self::Prior { why } if !matches!(why, Reason::RunDirUnusable { .. }))
    }

    /// One line: `cached (age 3 min, /run/gleaner/calibration.json)` or `measured now (...)`.
    pub fn describe(&self) -> String {
        match self {
            Self::Cached { path, age_s, .. } => format!("cached (age {}, {})", human_age(*age_s), path.display()),
            Self::MeasuredNow { why, stored, not_stored, took_ms, .. } => {
                let kept = match (stored, not_stored) {
                    (Some(p), _) => format!("stored in {}", p.display()),
                    (None, Some(n)) => format!("not stored: {n}"),
                    (None, None) => "not stored".into(),
                };
                format!("measured now ({why}; took {:.2} s; {kept})", *took_ms as f64 / 1000.0)
            }
            Self::Prior { why } => format!("prior ({why}; this VM's is measured after the workload)"),
        }
    }
}

/// `45 s`, `3 min`, `5.2 h`, `2.0 d`.
pub fn human_age(s: u64) -> String {
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        7200..=172_799 => format!("{:.1} h", s as f64 / 3600.0),
        _ => format!("{:.1} d", s as f64 / 86400.0),
    }
}

fn unix_now_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The record file for `deps` in `run_dir`: `calibration.json` for the first two online
/// vCPUs, `calibration-cpuW-cpuV.json` for another pair (a `--cpus` subset), so runs with
/// different CPU sets do not overwrite each other's record.
pub fn record_path(run_dir: &Path, deps: &Dependencies) -> PathBuf {
    let online = CpuSet::parse(&deps.online_cpus).unwrap_or_default();
    if measured_pair(&online) == (deps.waker_cpu, deps.waiter_cpu) {
        run_dir.join(FILE_NAME)
    } else {
        run_dir.join(format!("calibration-cpu{}-cpu{}.json", deps.waker_cpu, deps.waiter_cpu))
    }
}

/// Whether `record` can be used now: its age, or why not. Pure.
pub fn check(record: &CalibrationRecord, now: &Dependencies, now_boottime: Duration, max_age: Duration) -> Result<Duration, Reason> {
    if record.schema != SCHEMA {
        return Err(old_schema(u64::from(record.schema)));
    }
    if let Some(c) = record.depends_on.first_change(now) {
        return Err(Reason::DependencyChanged(c));
    }
    if let Err(problem) = record.results.curve.validate() {
        return Err(Reason::Unusable { problem: format!("its wake-cost curve is unusable: {problem}") });
    }
    let Some(age) = now_boottime.checked_sub(Duration::from_millis(record.measured_at_boottime_ms)) else {
        return Err(Reason::Unusable { problem: "measured after the current boot time".into() });
    };
    if age >= max_age {
        return Err(Reason::Expired { age_s: age.as_secs(), max_age_s: max_age.as_secs() });
    }
    Ok(age)
}

/// Why a record of schema `v` is not used.
fn old_schema(v: u64) -> Reason {
    Reason::Unusable {
        problem: format!(
            "schema {v} ({}); this gleaner writes schema {SCHEMA} (a wake-cost curve), so it measures again",
            schema_meaning(v)
        ),
    }
}

/// Reads and checks the record at `path`. Pure apart from the read.
pub fn lookup(path: &Path, now: &Dependencies, now_boottime: Duration, max_age: Duration) -> Result<(CalibrationRecord, Duration), Reason> {
    let unusable = |problem: String| Reason::Unusable { problem };
    let bytes = match gleaner_os::private::read_private(path, MAX_RECORD_BYTES) {
        Ok(Some(b)) => b,
        Ok(None) => return Err(Reason::Missing),
        Err(e) => return Err(unusable(e.to_string())),
    };
    let record = CalibrationRecord::from_slice(&bytes).map_err(|e| match e {
        RecordError::Schema { found: Some(v) } => old_schema(v),
        RecordError::NotJson(e) | RecordError::Invalid(e) => unusable(format!("{} is not a calibration record ({e})", path.display())),
        RecordError::Schema { found: None } => unusable(format!("{} is not a calibration record (no schema)", path.display())),
    })?;
    let age = check(&record, now, now_boottime, max_age)?;
    Ok((record, age))
}

/// Where records live and how long they stay valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachePolicy {
    pub run_dir: PathBuf,
    pub max_age: Duration,
    /// Measure even if a valid record exists.
    pub recalibrate: bool,
}

/// The world the cache reads: the adapters (fixtures in tests) and the clock.
#[derive(Clone)]
pub struct World {
    pub procfs: Procfs,
    pub sysfs: Sysfs,
    /// `CLOCK_BOOTTIME` now.
    pub boottime: std::sync::Arc<dyn Fn() -> Duration + Send + Sync>,
}

impl fmt::Debug for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("World").field("procfs", &self.procfs.root()).field("sysfs", &self.sysfs.root()).finish()
    }
}

impl World {
    /// The real machine.
    pub fn real() -> Self {
        Self { procfs: Procfs::new(), sysfs: Sysfs::new(), boottime: std::sync::Arc::new(gleaner_os::boottime) }
    }
}

/// The calibration an agent starts with, and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Obtained {
    /// The numbers, or what could not be measured (retention falls back to retaining).
    pub results: Result<CalibrationResults, Incomplete>,
    pub source: CalibrationSource,
    /// The record behind `results` (the one read or stored).
    pub record: Option<CalibrationRecord>,
}

/// A valid record for `cpus`, or why there is none; never measures (a run starts at once
/// and plans from the prior without one).
pub fn lookup_valid(policy: &CachePolicy, world: &World, cpus: &CpuSet) -> Result<Obtained, Reason> {
    if policy.recalibrate {
        return Err(Reason::Recalibrate);
    }
    let deps = Dependencies::read(&world.procfs, &world.sysfs, cpus)
        .map_err(|e| Reason::Unusable { problem: format!("what the calibration depends on cannot be read ({e})") })?;
    private_run_dir(&policy.run_dir).map_err(|problem| Reason::RunDirUnusable { problem })?;
    cached(&record_path(&policy.run_dir, &deps), &deps, world, policy)
}

/// A valid record for `cpus`, or measures (under the run dir's lock, once for all agents
/// starting together) and stores a new one. `measure` is [`crate::calibrate::measure`]
/// outside tests.
pub fn obtain(
    policy: &CachePolicy,
    world: &World,
    cpus: &CpuSet,
    measure: impl FnOnce() -> Result<CalibrationResults, Incomplete>,
) -> Obtained {
    obtain_with(policy, world, cpus, policy.recalibrate.then_some(Reason::Recalibrate), measure)
}

/// [`obtain`]; `force` measures even a valid record, for that reason.
fn obtain_with(
    policy: &CachePolicy,
    world: &World,
    cpus: &CpuSet,
    force: Option<Reason>,
    measure: impl FnOnce() -> Result<CalibrationResults, Incomplete>,
) -> Obtained {
    let deps = match Dependencies::read(&world.procfs, &world.sysfs, cpus) {
        Ok(d) => d,
        Err(e) => {
            let why = Reason::Unusable { problem: format!("what the calibration depends on cannot be read ({e})") };
            return measure_and_store(None, why, world, measure, Some("no dependencies to store it with".into()));
        }
    };
    // Nothing in the run dir is trusted, or written, unless the dir is ours alone.
    if let Err(problem) = private_run_dir(&policy.run_dir) {
        return measure_and_store(None, Reason::RunDirUnusable { problem }, world, measure, Some("no usable run dir".into()));
    }
    let path = record_path(&policy.run_dir, &deps);
    let why = match force.clone() {
        Some(why) => why,
        None => match cached(&path, &deps, world, policy) {
            Ok(hit) => return hit,
            Err(why) => why,
        },
    };
    // Held until the record is stored: agents starting meanwhile wait here, then read it.
    let _lock = match gleaner_os::private::lock_dir(&policy.run_dir) {
        Ok(l) => l,
        Err(e) => return measure_and_store(None, why, world, measure, Some(format!("cannot lock {} ({e})", policy.run_dir.display()))),
    };
    // Another agent may have measured while this one waited for the lock.
    if force.is_none() {
        if let Ok(hit) = cached(&path, &deps, world, policy) {
            return hit;
        }
    }
    measure_and_store(Some((&path, deps)), why, world, measure, None)
}

/// Creates the run dir if needed (mode 0700) and checks that it is ours alone.
fn private_run_dir(dir: &Path) -> Result<(), String> {
    crate::state::create_private_dir(dir).map_err(|e| format!("{e:#}"))?;
    gleaner_os::private::check_private_dir(dir).map_err(|e| e.to_string())
}

fn cached(path: &Path, deps: &Dependencies, world: &World, policy: &CachePolicy) -> Result<Obtained, Reason> {
    let (record, age) = lookup(path, deps, (world.boottime)(), policy.max_age)?;
    let source =
        CalibrationSource::Cached { path: path.to_path_buf(), age_s: age.as_secs(), measured_at_unix_s: record.measured_at_unix_s };
    Ok(Obtained { results: Ok(record.results.clone()), source, record: Some(record) })
}

/// Measures; stores the record at `target` when given and the measurement is complete.
fn measure_and_store(
    target: Option<(&Path, Dependencies)>,
    why: Reason,
    world: &World,
    measure: impl FnOnce() -> Result<CalibrationResults, Incomplete>,
    mut not_stored: Option<String>,
) -> Obtained {
    let start_boot = (world.boottime)();
    let measured_at_unix_s = unix_now_s();
    let t0 = std::time::Instant::now();
    let results = measure();
    let took_ms = ms(t0.elapsed());
    let mut stored = None;
    let mut record = None;
    match (&results, target) {
        (Ok(r), Some((path, deps))) => {
            let rec = CalibrationRecord {
                schema: SCHEMA,
                depends_on: deps,
                measured_at_unix_s,
                measured_at_boottime_ms: ms(start_boot),
                took_ms,
                results: r.clone(),
            };
            let written = serde_json::to_vec_pretty(&rec)
                .map_err(|e| e.to_string())
                .and_then(|bytes| gleaner_os::private::write_private_atomic(path, &bytes).map_err(|e| e.to_string()));
            match written {
                Ok(()) => stored = Some(path.to_path_buf()),
                Err(e) => not_stored = Some(e),
            }
            record = Some(rec);
        }
        (Err(_), _) => not_stored = Some("the measurement was incomplete".into()),
        (Ok(_), None) => {}
    }
    let source = CalibrationSource::MeasuredNow { why, stored, not_stored, took_ms, measured_at_unix_s };
    Obtained { results, source, record }
}

/// The idle threshold alone, for agents with a configured timeout (no wakeup is measured):
/// from a valid record if there is one, else sampled now (a few ms) and not stored.
pub fn idle_threshold(policy: &CachePolicy, world: &World, cpus: &CpuSet, sample: impl FnOnce() -> u64) -> (u64, CalibrationSource) {
    let found = match Dependencies::read(&world.procfs, &world.sysfs, cpus) {
        Err(e) => Err(Reason::Unusable { problem: format!("what the calibration depends on cannot be read ({e})") }),
        Ok(_) if policy.recalibrate => Err(Reason::Recalibrate),
        Ok(deps) => match gleaner_os::private::check_private_dir(&policy.run_dir) {
            Ok(()) => cached(&record_path(&policy.run_dir, &deps), &deps, world, policy),
            Err(gleaner_os::OsError::Dir { .. }) => Err(Reason::Missing),
            Err(e) => Err(Reason::RunDirUnusable { problem: e.to_string() }),
        },
    };
    match found {
        Ok(Obtained { results: Ok(r), source, .. }) => (r.idle_threshold_ns, source),
        Ok(Obtained { results: Err(_), .. }) => unreachable!("a cached record is complete"),
        Err(why) => {
            let measured_at_unix_s = unix_now_s();
            let t0 = std::time::Instant::now();
            let v = sample();
            let not_stored = Some("--timeout-us given: the wake-cost curve was not measured, so there is no full record to store".into());
            (v, CalibrationSource::MeasuredNow { why, stored: None, not_stored, took_ms: ms(t0.elapsed()), measured_at_unix_s })
        }
    }
}

/// Fraction of all CPU time spent busy between two `/proc/stat` totals; steal counts as busy
/// (the host running something else on our pCPUs disturbs a measurement too). Pure.
pub fn busy_fraction(before: &CpuTimes, after: &CpuTimes) -> f64 {
    let d = after.delta(before);
    let total = d.total_ticks();
    if total == 0 {
        return 1.0;
    }
    (d.busy_ticks() + d.steal) as f64 / total as f64
}

/// What the daemon does about its record this time round.
#[derive(Debug, Clone, PartialEq)]
pub enum RefreshDecision {
    /// Valid and not near its maximum age.
    NotDue,
    /// Measure now.
    Refresh(Reason),
    /// Due, but the machine is busy: measuring now would be disturbed (and disturb).
    WaitBusy { busy: f64 },
    /// Due, but agents keep vCPUs from halting with retention: the halted-vCPU wakeup
    /// cannot be measured while they run.
    WaitRetention { agents: usize },
}

/// Whether the daemon should re-measure: `state` is the record's check, `busy` the busy
/// fraction over a short window, `retention_agents` the running agents with retention on. Pure.
pub fn refresh_decision(state: &Result<Duration, Reason>, max_age: Duration, busy: f64, retention_agents: usize) -> RefreshDecision {
    let why = match state {
        Ok(age) if age.as_secs_f64() < max_age.as_secs_f64() * REFRESH_AT => return RefreshDecision::NotDue,
        Ok(age) => Reason::Refresh { age_s: age.as_secs(), max_age_s: max_age.as_secs() },
        Err(r) => r.clone(),
    };
    if retention_agents > 0 {
        RefreshDecision::WaitRetention { agents: retention_agents }
    } else if busy >= IDLE_BUSY_FRACTION {
        RefreshDecision::WaitBusy { busy }
    } else {
        RefreshDecision::Refresh(why)
    }
}

/// The daemon's record keeper: a thread that checks the record every `every` and renews it
/// when [`refresh_decision`] says so. Running agents keep the numbers they started with; the
/// renewed record is for agents started later.
#[derive(Debug)]
pub struct Refresher {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The refresher's period for a maximum age: a tenth of it, between 1 s and 10 min.
pub fn refresh_period(max_age: Duration) -> Duration {
    (max_age / 10).clamp(Duration::from_secs(1), Duration::from_secs(600))
}

/// The machine's busy fraction over `window` (1.0 when `/proc/stat` cannot be read).
pub fn sample_busy(procfs: &Procfs, window: Duration) -> f64 {
    let Ok(a) = procfs.stat() else { return 1.0 };
    std::thread::sleep(window);
    procfs.stat().map(|b| busy_fraction(&a.total, &b.total)).unwrap_or(1.0)
}

/// One check of the refresher: reads the record, and if it is due samples the busy fraction
/// (`busy`) and counts retention agents, then refreshes when allowed.
pub fn refresh_step(
    policy: &CachePolicy,
    world: &World,
    cpus: &CpuSet,
    busy: impl FnOnce() -> f64,
    retention_agents: impl FnOnce() -> usize,
    measure: impl FnOnce() -> Result<CalibrationResults, Incomplete>,
) -> RefreshDecision {
    let state = match Dependencies::read(&world.procfs, &world.sysfs, cpus) {
        Ok(deps) => lookup(&record_path(&policy.run_dir, &deps), &deps, (world.boottime)(), policy.max_age).map(|(_, age)| age),
        Err(e) => Err(Reason::Unusable { problem: e.to_string() }),
    };
    if refresh_decision(&state, policy.max_age, 0.0, 0) == RefreshDecision::NotDue {
        return RefreshDecision::NotDue;
    }
    let decision = refresh_decision(&state, policy.max_age, busy(), retention_agents());
    if let RefreshDecision::Refresh(why) = &decision {
        let got = obtain_with(policy, world, cpus, Some(why.clone()), measure);
        tracing::info!("calibration {}", got.source.describe());
    }
    decision
}

impl Refresher {
    /// Starts checking every [`refresh_period`] of the policy's maximum age;
    /// `retention_agents` counts the running agents with retention (their status sockets).
    pub fn spawn(policy: CachePolicy, cpus: CpuSet, retention_agents: impl Fn() -> usize + Send + 'static) -> anyhow::Result<Self> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let st = std::sync::Arc::clone(&stop);
        let every = refresh_period(policy.max_age);
        let thread = std::thread::Builder::new().name("gleaner-calib".into()).spawn(move || {
            let world = World::real();
            let mut was_waiting = false;
            loop {
                let until = std::time::Instant::now() + every;
                while std::time::Instant::now() < until {
                    if st.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                let retention = &retention_agents;
                let busy = || sample_busy(&world.procfs, Duration::from_secs(1));
                let d =
                    refresh_step(&policy, &world, &cpus, busy, retention, || crate::calibrate::measure_journaled(&policy.run_dir, &cpus));
                // Say once when the refresh starts waiting, not at every check.
                let waiting = matches!(d, RefreshDecision::WaitBusy { .. } | RefreshDecision::WaitRetention { .. });
                if waiting && !was_waiting {
                    tracing::info!("calibration due for a refresh, waiting: {d:?}");
                }
                was_waiting = waiting;
            }
        })?;
        Ok(Self { stop, thread: Some(thread) })
    }

    /// Stops the thread (waiting for a measurement in progress, at most ~0.5 s).
    pub fn stop(mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests;
