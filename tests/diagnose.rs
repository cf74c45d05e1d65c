//! `gleaner diagnose` on this machine: the verdict from the wake-cost curve (what retention
//! would save), the curve plotted, and `--pid`'s wakeup histogram of a running process.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use serial_test::serial;

fn json(out: &std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "exit {:?}: {}", out.status, String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
#[serial(host)]
fn the_verdict_comes_from_the_wake_cost_curve_and_the_curve_is_plotted() {
    require_root_and_cpuset();
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("curve.svg");
    let out = gleaner()
        .args(["diagnose", "--json", "--rounds", "100", "--run-dir"])
        .arg(dir.path().join("run"))
        .arg("--plot")
        .arg(&plot)
        .output()
        .unwrap();
    let r = json(&out);
    let curve = &r["curve"];
    assert!(curve.is_object(), "no curve: {}", r["curve_source"]);
    assert!(r["curve_source"].as_str().unwrap().contains("measured now"), "{}", r["curve_source"]);
    let points = curve["halted"].as_array().unwrap();
    let savings = r["savings"].as_array().unwrap();
    assert_eq!(savings.len(), points.len(), "one saving per measured gap");
    // The verdict's basis is one of the savings at a gap up to 1 ms, and the exposure follows
    // its speedup by the documented thresholds.
    let best = &r["best_saving"];
    assert!(best["gap_ns"].as_u64().unwrap() <= 1_000_000, "{best}");
    // The same gap as one of the savings; where that saving is within the noise the verdict
    // counts it as no speedup (1.0).
    let same_gap = savings.iter().find(|s| s["gap_ns"] == best["gap_ns"]).unwrap_or_else(|| panic!("{best} not among {savings:?}"));
    let within_noise = same_gap["saved_ns"].as_u64() < Some(gleaner_policy::idle::curve::NOISE_NS) && best["speedup"].as_f64() == Some(1.0);
    assert!(same_gap == best || within_noise, "{best} vs {same_gap}");
    let speedup = best["speedup"].as_f64().unwrap();
    let want = if speedup >= 2.0 {
        "high"
    } else if speedup >= 1.3 {
        "moderate"
    } else {
        "low"
    };
    assert_eq!(r["exposure"], want, "speedup {speedup}");
    // Retained by polling exactly when the machine measured a POLL state cheaper than busy.
    let by_polling = curve["poll_ns"].as_u64().is_some_and(|p| p <= curve["busy_ns"].as_u64().unwrap());
    assert_eq!(best["by_polling"], by_polling, "{best}");
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.contains("<svg") && svg.contains("halted (C)"), "{}", &svg[..svg.len().min(300)]);
    // The second run reads the stored record instead of measuring again.
    let out = gleaner().args(["diagnose", "--json", "--rounds", "50", "--run-dir"]).arg(dir.path().join("run")).output().unwrap();
    let again = json(&out);
    assert!(again["curve_source"].as_str().unwrap().starts_with("cached"), "{}", again["curve_source"]);
    assert_eq!(again["curve"], r["curve"]);
}

#[test]
#[serial(host)]
fn pid_shows_a_running_workloads_wakeups_by_target_state() {
    require_root_and_cpuset();
    let mut child = gleaner()
        .args(["bench", "workload", "pingpong", "--duration-ms", "4000", "--json"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let out = gleaner().args(["diagnose", "--json", "--seconds", "1", "--pid"]).arg(child.id().to_string()).output().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let r = json(&out);
    assert_eq!(r["pid"], child.id());
    let all = r["all"]["count"].as_u64().unwrap();
    assert!(all > 100, "a ping-pong wakes its threads thousands of times a second: {all}");
    let by_state: u64 = r["by_state"].as_array().unwrap().iter().map(|s| s[1]["count"].as_u64().unwrap()).sum();
    assert_eq!(by_state, all, "every wakeup has a target state");
    let buckets: u64 = r["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| ["busy", "poll", "halt", "idle"].iter().map(|k| b[k].as_u64().unwrap()).sum::<u64>())
        .sum();
    assert_eq!(buckets, all, "the histogram holds every wakeup");
    let traced = r["traced_ns"].as_u64().unwrap();
    // At least the second asked; the upper bound only catches a tracer that never stops.
    assert!((900_000_000..30_000_000_000).contains(&traced), "traced for about the second asked: {traced} ns");
}

#[test]
fn bad_diagnose_input_is_one_line_and_exit_2() {
    for (args, what) in [
        (vec!["diagnose", "--pid", "0"], "--pid"),
        (vec!["diagnose", "--pid", "1", "--seconds", "0"], "--seconds"),
        (vec!["diagnose", "--plot", "x.pdf"], "--plot"),
        (vec!["diagnose", "--pid", "1", "--plot", "x.svg"], "--plot"),
    ] {
        let out = gleaner().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(what), "{args:?}: {err}");
    }
}
