//! The calibration cache on fixture /proc and /sys trees, a fake clock and a fake measurement.

use super::*;
use gleaner_policy::idle::WakeCurve;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

const HOUR: Duration = Duration::from_secs(3600);

/// A machine in a temp dir: /proc and /sys fixtures, a run dir, and a clock the test moves.
struct Machine {
    dir: tempfile::TempDir,
    clock_ms: Arc<AtomicU64>,
    measured: Arc<AtomicUsize>,
}

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn results() -> CalibrationResults {
    use gleaner_policy::idle::CurvePoint;
    let pt = |gap_us: u64, mean_us: u64| CurvePoint { gap_ns: gap_us * 1000, mean_ns: mean_us * 1000, p50_ns: mean_us * 1000 };
    CalibrationResults {
        curve: WakeCurve::new(vec![pt(10, 12), pt(1000, 14), pt(10_000, 40)], 9_000, Some(3_000)),
        idle_threshold_ns: 21_000,
        polling: PollingControl { halted: "guest_halt_poll_ns 0".into(), poll: "cpu1 resume latency limit 0 (n/a)".into() },
    }
}

impl Machine {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let m = Machine { dir, clock_ms: Arc::new(AtomicU64::new(10 * 3_600_000)), measured: Arc::new(AtomicUsize::new(0)) };
        m.set("proc/sys/kernel/random/boot_id", "c3637bc8-ed44-4fad-95e4-ff8c310b0c77\n");
        m.set("proc/sys/kernel/osrelease", "6.18.44-fc-v595\n");
        m.set("sys/devices/system/cpu/online", "0-1\n");
        m.set("sys/devices/system/cpu/cpuidle/current_driver", "none\n");
        m.set("sys/devices/system/cpu/cpuidle/current_governor", "menu\n");
        m.set("sys/module/haltpoll/parameters/guest_halt_poll_ns", "200000\n");
        m.set("sys/module/haltpoll/parameters/guest_halt_poll_allow_shrink", "Y\n");
        std::fs::create_dir(m.run_dir()).unwrap();
        std::fs::set_permissions(m.run_dir(), std::fs::Permissions::from_mode(0o700)).unwrap();
        m
    }

    fn set(&self, rel: &str, text: &str) {
        write(self.dir.path(), rel, text);
    }

    fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    fn record(&self) -> PathBuf {
        self.run_dir().join(FILE_NAME)
    }

    fn world(&self) -> World {
        let clock = Arc::clone(&self.clock_ms);
        World {
            procfs: Procfs::with_root(self.dir.path().join("proc")),
            sysfs: Sysfs::with_root(self.dir.path().join("sys")),
            boottime: Arc::new(move || Duration::from_millis(clock.load(Ordering::SeqCst))),
        }
    }

    fn policy(&self) -> CachePolicy {
        CachePolicy { run_dir: self.run_dir(), max_age: 24 * HOUR, recalibrate: false }
    }

    fn advance(&self, d: Duration) {
        self.clock_ms.fetch_add(u64::try_from(d.as_millis()).unwrap(), Ordering::SeqCst);
    }

    /// `obtain` with a fake measurement that counts its calls.
    fn obtain_with(&self, policy: &CachePolicy, cpus: &str) -> Obtained {
        let n = Arc::clone(&self.measured);
        obtain(policy, &self.world(), &CpuSet::parse(cpus).unwrap(), move || {
            n.fetch_add(1, Ordering::SeqCst);
            Ok(results())
        })
    }

    fn obtain(&self) -> Obtained {
        self.obtain_with(&self.policy(), "0-1")
    }

    fn measurements(&self) -> usize {
        self.measured.load(Ordering::SeqCst)
    }
}

fn why(o: &Obtained) -> Reason {
    match &o.source {
        CalibrationSource::MeasuredNow { why, .. } => why.clone(),
        s => panic!("expected a measurement, got {s:?}"),
    }
}

fn is_cached(o: &Obtained) -> bool {
    matches!(o.source, CalibrationSource::Cached { .. })
}

#[test]
fn a_missing_record_is_measured_once_stored_and_then_reused() {
    let m = Machine::new();
    let first = m.obtain();
    assert_eq!(why(&first), Reason::Missing);
    assert!(matches!(&first.source, CalibrationSource::MeasuredNow { stored: Some(p), .. } if *p == m.record()), "{:?}", first.source);
    assert_eq!(first.results, Ok(results()));
    m.advance(HOUR);
    let second = m.obtain();
    assert!(is_cached(&second), "{:?}", second.source);
    assert!(matches!(&second.source, CalibrationSource::Cached { path, age_s: 3600, .. } if *path == m.record()));
    assert_eq!(second.results, Ok(results()));
    assert_eq!(m.measurements(), 1);
    let rec: CalibrationRecord = serde_json::from_slice(&std::fs::read(m.record()).unwrap()).unwrap();
    assert_eq!(rec.depends_on.cpuidle_governor.as_deref(), Some("menu"));
    assert_eq!(rec.depends_on.cpuidle_driver, None, "'none' means no cpuidle driver");
    assert_eq!(std::fs::metadata(m.record()).unwrap().permissions().mode() & 0o777, 0o600);
}

#[test]
fn an_expired_record_is_measured_again() {
    let m = Machine::new();
    m.obtain();
    m.advance(24 * HOUR + Duration::from_secs(1));
    let o = m.obtain();
    assert_eq!(why(&o), Reason::Expired { age_s: 24 * 3600 + 1, max_age_s: 24 * 3600 });
    assert_eq!(m.measurements(), 2);
    assert!(is_cached(&m.obtain()), "the new record is valid");
    // Max age 0: every start measures (the behaviour before the cache).
    let never = CachePolicy { max_age: Duration::ZERO, ..m.policy() };
    assert!(matches!(why(&m.obtain_with(&never, "0-1")), Reason::Expired { .. }));
}

#[test]
fn every_dependency_change_invalidates_the_record_and_is_named() {
    let changes = [
        ("proc/sys/kernel/random/boot_id", "0e9a3f1c-1111-2222-3333-444455556666\n", "boot id"),
        ("proc/sys/kernel/osrelease", "6.19.0\n", "kernel release"),
        ("sys/devices/system/cpu/online", "0-3\n", "online CPUs"),
        ("sys/devices/system/cpu/cpuidle/current_driver", "haltpoll\n", "cpuidle driver"),
        ("sys/devices/system/cpu/cpuidle/current_governor", "haltpoll\n", "cpuidle governor"),
    ];
    for (file, value, name) in changes {
        let m = Machine::new();
        m.obtain();
        m.set(file, value);
        let o = m.obtain();
        match why(&o) {
            Reason::DependencyChanged(c) => assert_eq!(c.dependency, name, "{file}: {c:?}"),
            r => panic!("{file}: {r:?}"),
        }
        assert!(why(&o).to_string().contains(name), "{}", why(&o));
        assert_eq!(m.measurements(), 2, "{file}");
    }
}

#[test]
fn haltpoll_parameters_are_not_a_dependency_the_measurement_sets_them_itself() {
    // Agents change guest_halt_poll_ns while they run, and the measurement turns kernel
    // polling off and on itself: a changed parameter keeps the record.
    let m = Machine::new();
    m.obtain();
    m.set("sys/module/haltpoll/parameters/guest_halt_poll_ns", "50000\n");
    assert!(is_cached(&m.obtain()));
    assert_eq!(m.measurements(), 1);
}

#[test]
fn recalibrate_measures_even_a_valid_record() {
    let m = Machine::new();
    m.obtain();
    let o = m.obtain_with(&CachePolicy { recalibrate: true, ..m.policy() }, "0-1");
    assert_eq!(why(&o), Reason::Recalibrate);
    assert_eq!(o.source.describe().split(';').next(), Some("measured now (--recalibrate"));
    assert_eq!(m.measurements(), 2);
}

#[test]
fn a_corrupt_record_is_ignored_with_a_note_and_replaced() {
    let m = Machine::new();
    for junk in ["", "{\"schema\": 1", "[1, 2, 3]"] {
        std::fs::write(m.record(), junk).unwrap();
        std::fs::set_permissions(m.record(), std::fs::Permissions::from_mode(0o600)).unwrap();
        let o = m.obtain();
        match why(&o) {
            Reason::Unusable { problem } => assert!(problem.contains("is not a calibration record"), "{problem}"),
            r => panic!("{junk:?}: {r:?}"),
        }
        assert!(is_cached(&m.obtain()), "replaced by a valid record");
    }
}

#[test]
fn a_symlinked_record_is_never_followed() {
    let m = Machine::new();
    m.obtain();
    // A valid record elsewhere, linked into place: still refused.
    let elsewhere = m.dir.path().join("elsewhere.json");
    std::fs::rename(m.record(), &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, m.record()).unwrap();
    let before = std::fs::read(&elsewhere).unwrap();
    let o = m.obtain();
    match why(&o) {
        Reason::Unusable { problem } => assert!(problem.contains("symbolic link"), "{problem}"),
        r => panic!("{r:?}"),
    }
    assert_eq!(std::fs::read(&elsewhere).unwrap(), before, "the link's target is untouched");
    assert!(std::fs::symlink_metadata(m.record()).unwrap().file_type().is_file(), "the link was replaced");
}

#[test]
fn a_run_dir_others_can_write_is_neither_read_nor_written() {
    let m = Machine::new();
    m.obtain();
    std::fs::set_permissions(m.run_dir(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let o = m.obtain();
    assert!(matches!(why(&o), Reason::RunDirUnusable { ref problem } if problem.contains("writable by others")), "{:?}", o.source);
    assert!(matches!(&o.source, CalibrationSource::MeasuredNow { stored: None, not_stored: Some(_), .. }));
    let (_, src) = idle_threshold(&m.policy(), &m.world(), &CpuSet::parse("0-1").unwrap(), || 5);
    assert!(matches!(src, CalibrationSource::MeasuredNow { why: Reason::RunDirUnusable { .. }, .. }), "{src:?}");
}

#[test]
fn a_missing_run_dir_is_created_private() {
    let m = Machine::new();
    let policy = CachePolicy { run_dir: m.dir.path().join("new/run"), ..m.policy() };
    let o = m.obtain_with(&policy, "0-1");
    assert!(matches!(&o.source, CalibrationSource::MeasuredNow { stored: Some(_), .. }), "{:?}", o.source);
    assert_eq!(std::fs::metadata(&policy.run_dir).unwrap().permissions().mode() & 0o777, 0o700);
}

#[test]
fn an_incomplete_measurement_is_used_but_not_stored() {
    let m = Machine::new();
    let inc = Incomplete { idle_threshold_ns: 20_000, error: "one CPU".into() };
    let expected = inc.clone();
    let o = obtain(&m.policy(), &m.world(), &CpuSet::parse("0-1").unwrap(), move || Err(inc));
    assert_eq!(o.results, Err(expected));
    assert!(matches!(&o.source, CalibrationSource::MeasuredNow { stored: None, .. }));
    assert!(!m.record().exists());
}

#[test]
fn a_record_of_another_schema_or_policy_is_measured_again() {
    let m = Machine::new();
    m.obtain();
    let text = std::fs::read_to_string(m.record()).unwrap();
    let mut rec: CalibrationRecord = serde_json::from_str(&text).unwrap();
    rec.schema = SCHEMA + 1;
    gleaner_os::private::write_private_atomic(&m.record(), &serde_json::to_vec(&rec).unwrap()).unwrap();
    assert!(matches!(why(&m.obtain()), Reason::Unusable { ref problem } if problem.contains("schema")));
    let mut rec: CalibrationRecord = serde_json::from_str(&text).unwrap();
    rec.results.curve.halted.clear();
    gleaner_os::private::write_private_atomic(&m.record(), &serde_json::to_vec(&rec).unwrap()).unwrap();
    assert!(matches!(why(&m.obtain()), Reason::Unusable { ref problem } if problem.contains("curve")));
}

#[test]
fn a_record_of_schema_2_is_refused_by_its_schema_and_says_what_it_was() {
    // What gleaner wrote before the wake-cost curve (three means and a timeout).
    let m = Machine::new();
    m.obtain();
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(m.record()).unwrap()).unwrap();
    v["schema"] = 2.into();
    v["results"] = serde_json::json!({"wakeup_costs": {"busy_ns": 13000, "idle_long_ns": 32000, "idle_at_timeout_ns": 7000},
        "timeout_ns": 38000, "idle_threshold_ns": 12000, "verdict": "HostPolls"});
    gleaner_os::private::write_private_atomic(&m.record(), &serde_json::to_vec(&v).unwrap()).unwrap();
    let o = m.obtain();
    let w = why(&o).to_string();
    assert!(w.contains("schema 2 (three wakeup means and a retention timeout)") && w.contains("schema 3"), "{w}");
    assert_eq!(m.measurements(), 2);
}

#[test]
fn a_cpu_subset_gets_its_own_record() {
    let m = Machine::new();
    m.set("sys/devices/system/cpu/online", "0-3\n");
    m.obtain_with(&m.policy(), "0-3");
    m.obtain_with(&m.policy(), "2-3");
    assert!(m.record().exists() && m.run_dir().join("calibration-cpu2-cpu3.json").exists());
    assert!(is_cached(&m.obtain_with(&m.policy(), "0-1")), "0-1 measures on the same pair as 0-3");
    assert!(is_cached(&m.obtain_with(&m.policy(), "2-3")));
    assert_eq!(m.measurements(), 2);
}

#[test]
fn agents_starting_together_measure_once() {
    let m = Arc::new(Machine::new());
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let m = Arc::clone(&m);
            std::thread::spawn(move || {
                let n = Arc::clone(&m.measured);
                obtain(&m.policy(), &m.world(), &CpuSet::parse("0-1").unwrap(), move || {
                    n.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(100));
                    Ok(results())
                })
            })
        })
        .collect();
    let got: Vec<Obtained> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(m.measurements(), 1, "the others waited for the lock and read the record");
    assert_eq!(got.iter().filter(|o| is_cached(o)).count(), 3);
}

#[test]
fn with_a_configured_timeout_the_idle_threshold_comes_from_a_valid_record_or_is_sampled() {
    let m = Machine::new();
    let cpus = CpuSet::parse("0-1").unwrap();
    let (v, src) = idle_threshold(&m.policy(), &m.world(), &cpus, || 7_000);
    assert_eq!(v, 7_000);
    assert!(matches!(src, CalibrationSource::MeasuredNow { why: Reason::Missing, stored: None, .. }), "{src:?}");
    assert!(!m.record().exists(), "a threshold alone is no record");
    m.obtain();
    let (v, src) = idle_threshold(&m.policy(), &m.world(), &cpus, || unreachable!("cached"));
    assert_eq!((v, matches!(src, CalibrationSource::Cached { .. })), (21_000, true));
    let (v, _) = idle_threshold(&CachePolicy { recalibrate: true, ..m.policy() }, &m.world(), &cpus, || 7_000);
    assert_eq!(v, 7_000);
}

#[test]
fn refresh_waits_for_an_idle_machine_without_retention() {
    let max = 24 * HOUR;
    assert_eq!(refresh_decision(&Ok(HOUR), max, 0.9, 3), RefreshDecision::NotDue);
    assert_eq!(
        refresh_decision(&Ok(22 * HOUR), max, 0.01, 0),
        RefreshDecision::Refresh(Reason::Refresh { age_s: 22 * 3600, max_age_s: 24 * 3600 }),
        "due at 90% of the max age"
    );
    assert_eq!(refresh_decision(&Err(Reason::Missing), max, 0.5, 0), RefreshDecision::WaitBusy { busy: 0.5 });
    assert_eq!(refresh_decision(&Err(Reason::Missing), max, 0.0, 1), RefreshDecision::WaitRetention { agents: 1 });
    assert_eq!(refresh_decision(&Err(Reason::Missing), max, IDLE_BUSY_FRACTION - 0.01, 0), RefreshDecision::Refresh(Reason::Missing));
}

#[test]
fn busy_fraction_counts_steal_as_busy() {
    let a = CpuTimes { user: 100, idle: 100, ..CpuTimes::default() };
    let b = CpuTimes { user: 110, system: 10, idle: 170, steal: 10, ..CpuTimes::default() };
    assert!((busy_fraction(&a, &b) - 0.3).abs() < 1e-9);
    assert_eq!(busy_fraction(&a, &a), 1.0, "no time passed: assume busy");
}

#[test]
fn the_refresher_renews_a_due_record_only_when_allowed() {
    let m = Machine::new();
    let cpus = CpuSet::parse("0-1").unwrap();
    let count = |n: &Arc<AtomicUsize>| {
        let n = Arc::clone(n);
        move || {
            n.fetch_add(1, Ordering::SeqCst);
            Ok(results())
        }
    };
    let step = |busy: f64, agents: usize| refresh_step(&m.policy(), &m.world(), &cpus, || busy, || agents, count(&m.measured));
    assert!(matches!(step(0.0, 0), RefreshDecision::Refresh(Reason::Missing)));
    assert_eq!(step(0.0, 0), RefreshDecision::NotDue);
    m.advance(23 * HOUR);
    assert!(matches!(step(0.5, 0), RefreshDecision::WaitBusy { .. }));
    assert!(matches!(step(0.0, 2), RefreshDecision::WaitRetention { agents: 2 }));
    assert_eq!(m.measurements(), 1);
    assert!(matches!(step(0.0, 0), RefreshDecision::Refresh(Reason::Refresh { .. })));
    assert!(is_cached(&m.obtain()));
    assert_eq!(m.measurements(), 2);
    assert_eq!(refresh_period(24 * HOUR), Duration::from_secs(600));
    assert_eq!(refresh_period(Duration::from_secs(2)), Duration::from_secs(1));
}

#[test]
fn sources_say_where_the_numbers_came_from() {
    let cached = CalibrationSource::Cached { path: "/run/gleaner/calibration.json".into(), age_s: 180, measured_at_unix_s: 0 };
    assert_eq!(cached.describe(), "cached (age 3 min, /run/gleaner/calibration.json)");
    let json = serde_json::to_value(&cached).unwrap();
    assert_eq!(json["origin"], "cached");
    let now = CalibrationSource::MeasuredNow {
        why: Reason::DependencyChanged(DependencyChange {
            dependency: "cpuidle governor".into(),
            was: "menu".into(),
            now: "haltpoll".into(),
        }),
        stored: Some("/run/gleaner/calibration.json".into()),
        not_stored: None,
        took_ms: 520,
        measured_at_unix_s: 0,
    };
    assert_eq!(
        now.describe(),
        "measured now (cpuidle governor changed: menu -> haltpoll; took 0.52 s; stored in /run/gleaner/calibration.json)"
    );
    let json = serde_json::to_value(&now).unwrap();
    assert_eq!((json["origin"].as_str(), json["why"]["kind"].as_str()), (Some("measured_now"), Some("dependency_changed")));
    let back: CalibrationSource = serde_json::from_value(json).unwrap();
    assert_eq!(back, now);
    assert_eq!([human_age(59), human_age(600), human_age(9000), human_age(200_000)], ["59 s", "10 min", "2.5 h", "2.3 d"]);
}

#[test]
fn a_lookup_never_measures_and_says_why_there_is_no_record() {
    let m = Machine::new();
    let cpus = CpuSet::parse("0-1").unwrap();
    assert_eq!(lookup_valid(&m.policy(), &m.world(), &cpus).unwrap_err(), Reason::Missing);
    let forced = CachePolicy { recalibrate: true, ..m.policy() };
    assert_eq!(lookup_valid(&forced, &m.world(), &cpus).unwrap_err(), Reason::Recalibrate);
    assert_eq!(m.measurements(), 0, "a lookup measured");
    m.obtain();
    m.advance(HOUR);
    let hit = lookup_valid(&m.policy(), &m.world(), &cpus).unwrap();
    assert!(matches!(&hit.source, CalibrationSource::Cached { age_s: 3600, .. }), "{:?}", hit.source);
    assert_eq!(hit.results, Ok(results()));
    m.advance(24 * HOUR);
    assert!(matches!(lookup_valid(&m.policy(), &m.world(), &cpus).unwrap_err(), Reason::Expired { .. }));
    assert_eq!(m.measurements(), 1);
}

#[test]
fn a_run_from_the_prior_measures_after_it_only_where_the_record_can_be_stored() {
    assert!(CalibrationSource::Prior { why: Reason::Missing }.wants_measuring());
    assert!(CalibrationSource::Prior { why: Reason::Expired { age_s: 90_000, max_age_s: 86_400 } }.wants_measuring());
    assert!(!CalibrationSource::Prior { why: Reason::RunDirUnusable { problem: "others may write it".into() } }.wants_measuring());
    let cached = CalibrationSource::Cached { path: "/run/gleaner/calibration.json".into(), age_s: 1, measured_at_unix_s: 0 };
    assert!(!cached.wants_measuring());
    let p = CalibrationSource::Prior { why: Reason::Missing };
    assert_eq!(p.describe(), "prior (no record yet; this VM's is measured after the workload)");
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!((json["origin"].as_str(), json["why"]["kind"].as_str()), (Some("prior"), Some("missing")), "{json}");
}
