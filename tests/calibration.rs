//! End-to-end tests of the per-boot calibration record through the real binary: `gleaner
//! calibrate` stores it; `run`, `compare` and `status` reuse it and say so (the daemon is
//! covered in tests/agent.rs); a run without one starts its workload at once from the prior
//! and measures after it, unless it was stopped; `--recalibrate` measures again; a corrupt or symlinked record
//! is ignored with a note and never followed. They measure real wakeups and manage real
//! cgroups, so they need root and a cpuset hierarchy (failing, never skipping, without), and
//! run serially. Each test has its own temp run dir: nothing is written to /run/gleaner.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use serial_test::serial;

fn json(out: &std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn calibrate(run_dir: &Path, extra: &[&str]) -> serde_json::Value {
    json(&gleaner().args(["calibrate", "--json", "--run-dir"]).arg(run_dir).args(extra).output().unwrap())
}

/// `gleaner run -- true`: its stderr (the retention line names the calibration's source).
fn run_true(run_dir: &Path, extra: &[&str]) -> String {
    let out = gleaner().arg("run").args(extra).arg("--run-dir").arg(run_dir).args(["--", "true"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

fn record(run_dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(run_dir.join("calibration.json")).expect("a calibration record")).unwrap()
}

#[test]
#[serial(host)]
fn calibrate_then_run_reuses_the_record_and_recalibrate_measures_again() {
    require_root_and_cpuset();
    let run_dir = tempfile::tempdir().unwrap();
    let first = calibrate(run_dir.path(), &[]);
    assert_eq!(first["source"]["origin"], "measured_now", "{first}");
    assert_eq!(first["source"]["why"]["kind"], "missing", "{first}");
    let stored = record(run_dir.path());
    assert_eq!(stored, first["record"], "the record printed is the record stored");
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_eq!(stored["depends_on"]["boot_id"], boot_id.trim());
    assert_eq!(stored["schema"], gleaner_agent::cache::SCHEMA);
    // The wake-cost curve: a halted vCPU after each gap, a busy one, and (where the machine
    // has a POLL state, as the development and CI machines do) a polling one.
    let curve = &stored["results"]["curve"];
    let halted = curve["halted"].as_array().unwrap_or_else(|| panic!("no halted curve: {stored}"));
    let gaps: Vec<u64> = halted.iter().map(|p| p["gap_ns"].as_u64().unwrap()).collect();
    assert_eq!(gaps, [10_000, 30_000, 100_000, 300_000, 1_000_000, 3_000_000, 10_000_000], "{curve}");
    assert!(halted.iter().all(|p| p["mean_ns"].as_u64() > Some(0)), "{curve}");
    assert!(curve["busy_ns"].as_u64() > Some(0), "{curve}");
    let poll_state = std::fs::read_to_string("/sys/devices/system/cpu/cpu1/cpuidle/state0/name").unwrap_or_default();
    assert_eq!(
        curve["poll_ns"].as_u64().is_some(),
        poll_state.trim() == "POLL",
        "P is measured exactly where there is a POLL state: {curve}"
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(run_dir.path().join("calibration.json")).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);

    // A second calibrate and a run read it: nothing is measured.
    assert_eq!(calibrate(run_dir.path(), &[])["source"]["origin"], "cached");
    let t0 = std::time::Instant::now();
    let stderr = run_true(run_dir.path(), &[]);
    let took = t0.elapsed();
    assert!(stderr.contains("[calibration cached (age "), "{stderr}");
    assert_eq!(record(run_dir.path()), stored, "a cache hit does not rewrite the record");
    // How fast a hit is belongs to the benchmarks (scripts/startup-benchmark.sh); here what
    // happened: read, not measured, not rewritten (above).
    eprintln!("gleaner run -- true took {took:?} with a valid record");

    // --recalibrate measures again and replaces the record.
    let stderr = run_true(run_dir.path(), &["--recalibrate"]);
    assert!(stderr.contains("[calibration measured now (--recalibrate;"), "{stderr}");
    let again = record(run_dir.path());
    assert_ne!(again["measured_at_boottime_ms"], stored["measured_at_boottime_ms"], "not measured again");
    let forced = calibrate(run_dir.path(), &["--recalibrate"]);
    assert_eq!(forced["source"]["why"]["kind"], "recalibrate", "{forced}");
    // Max age 0: too old at once.
    let expired = calibrate(run_dir.path(), &["--max-age-s", "0"]);
    assert_eq!(expired["source"]["why"]["kind"], "expired", "{expired}");
    assert_run_dir_clean(run_dir.path());
}

#[test]
#[serial(host)]
fn a_corrupt_or_symlinked_record_is_ignored_with_a_note_and_never_followed() {
    require_root_and_cpuset();
    let run_dir = tempfile::tempdir().unwrap();
    let path = run_dir.path().join("calibration.json");
    calibrate(run_dir.path(), &[]);

    std::fs::write(&path, b"{\"schema\": 1, \"depends_on\": ").unwrap();
    let stderr = run_true(run_dir.path(), &[]);
    assert!(stderr.contains("record ignored:") && stderr.contains("is not a calibration record"), "{stderr}");
    assert_eq!(record(run_dir.path())["schema"], gleaner_agent::cache::SCHEMA, "replaced by a new record");

    // A link to a valid record elsewhere is refused all the same, and its target is untouched.
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("calibration.json");
    std::fs::rename(&path, &target).unwrap();
    std::os::unix::fs::symlink(&target, &path).unwrap();
    let before = std::fs::read(&target).unwrap();
    let stderr = run_true(run_dir.path(), &[]);
    assert!(stderr.contains("symbolic link (not followed)"), "{stderr}");
    assert_eq!(std::fs::read(&target).unwrap(), before, "the link's target was written");
    assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_file(), "the link is still there");
    assert_eq!(calibrate(run_dir.path(), &[])["source"]["origin"], "cached");
    assert_run_dir_clean(run_dir.path());
}

#[test]
#[serial(host)]
fn status_and_compare_say_where_the_calibration_came_from() {
    require_root_and_cpuset();
    let run_dir = tempfile::tempdir().unwrap();
    calibrate(run_dir.path(), &[]);
    let r = json(
        &gleaner()
            .args(["compare", "--runs", "1", "--json", "--no-consolidation", "--run-dir"])
            .arg(run_dir.path())
            .args(["--", "true"])
            .output()
            .unwrap(),
    );
    let c = r["calibration"].as_str().unwrap_or_else(|| panic!("no calibration: {r}"));
    assert!(c.starts_with("cached (age ") && c.contains(&run_dir.path().join("calibration.json").display().to_string()), "{c}");

    let mut agent = gleaner()
        .args(["run", "--period-ms", "50", "--run-dir"])
        .arg(run_dir.path())
        .args(["--", "sleep", "2"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The socket opens before the agent has read its record: wait for the status to name it.
    let (found, report) = wait_status(run_dir.path(), Duration::from_secs(5), |r| r[0]["calibration"]["origin"].is_string());
    assert!(found, "no status naming the calibration from the agent: {report}");
    assert_eq!(report[0]["calibration"]["origin"], "cached", "{report}");
    assert!(report[0]["calibration"]["age_s"].is_u64(), "{report}");
    let text = gleaner().args(["status", "--run-dir"]).arg(run_dir.path()).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("calibration cached (age"), "{text}");
    assert!(wait_child(&mut agent, Duration::from_secs(10)).expect("agent did not finish").success());
    assert!(gleaner_groups().iter().all(|g| !g.to_string_lossy().contains("gleaner-agent-")), "{:?}", gleaner_groups());
    assert_run_dir_clean(run_dir.path());
}

/// CLOCK_BOOTTIME now, ms (the clock of the record's `measured_at_boottime_ms`).
fn boottime_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given.
    assert_eq!(unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &raw mut ts) }, 0);
    u64::try_from(ts.tv_sec).unwrap() * 1000 + u64::try_from(ts.tv_nsec).unwrap() / 1_000_000
}

#[test]
#[serial(host)]
fn a_run_without_a_record_starts_its_workload_at_once_and_measures_after_it() {
    require_root_and_cpuset();
    let run_dir = tempfile::tempdir().unwrap();
    let marks = tempfile::tempdir().unwrap();
    let ended = marks.path().join("ended");
    // The workload notes when it ended; the measurement must begin after that, not before it.
    let script = format!("sleep 0.2; awk '{{print int($1 * 1000)}}' /proc/uptime > {}", ended.display());
    let before_ms = boottime_ms();
    let out = gleaner().arg("run").arg("--run-dir").arg(run_dir.path()).args(["--", "sh", "-c", &script]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("[calibration prior (no record yet;"), "{stderr}");
    assert!(stderr.contains("measuring this VM's wake costs for the runs after this one"), "{stderr}");
    let stored = record(run_dir.path());
    let measured_at = stored["measured_at_boottime_ms"].as_u64().unwrap();
    let workload_end: u64 = std::fs::read_to_string(&ended).unwrap().trim().parse().unwrap();
    // /proc/uptime counts in 10 ms steps, and is CLOCK_BOOTTIME like the record's stamp.
    assert!(workload_end <= measured_at + 10, "measured at {measured_at} ms, before the workload ended at {workload_end} ms");
    assert!(workload_end >= before_ms, "{workload_end} < {before_ms}");
    // The next run reads it.
    assert!(run_true(run_dir.path(), &[]).contains("[calibration cached (age "));
    assert_run_dir_clean(run_dir.path());
}

#[test]
#[serial(host)]
fn a_run_stopped_by_a_signal_does_not_measure_after_its_workload() {
    require_root_and_cpuset();
    let run_dir = tempfile::tempdir().unwrap();
    let mut agent = gleaner()
        .args(["run", "--period-ms", "50", "--run-dir"])
        .arg(run_dir.path())
        .args(["--", "sleep", "30"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (found, report) = wait_status(run_dir.path(), Duration::from_secs(5), |r| r[0]["calibration"]["origin"].is_string());
    assert!(found, "no status naming the calibration: {report}");
    assert_eq!(report[0]["calibration"]["origin"], "prior", "{report}");
    let pid = i32::try_from(agent.id()).unwrap();
    // SAFETY: kill on the PID of the child this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = wait_child(&mut agent, Duration::from_secs(10)).expect("the agent did not stop on SIGTERM");
    let mut stderr = String::new();
    std::io::Read::read_to_string(agent.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(!status.success() || !stderr.is_empty(), "{status:?}");
    assert!(!stderr.contains("measuring this VM's wake costs"), "{stderr}");
    assert!(!run_dir.path().join("calibration.json").exists(), "a stopped run measured after its workload");
    assert_run_dir_clean(run_dir.path());
}
