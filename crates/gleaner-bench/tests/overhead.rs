//! `bench overhead` on result documents, against hand-computed values.

use gleaner_bench::overhead_of;
use gleaner_measure::report::{BenchDoc, HostInfo, RunSummary};
use gleaner_measure::RunMetrics;

fn doc(name: &str, runs: &[(u64, u64, u32)]) -> BenchDoc {
    let runs: Vec<RunMetrics> = runs
        .iter()
        .map(|&(wall_ns, cpu_ns, cpus)| RunMetrics {
            wall_ns,
            user_ns: cpu_ns * 3 / 4,
            sys_ns: cpu_ns / 4,
            cpus_available: cpus,
            ..RunMetrics::default()
        })
        .collect();
    BenchDoc {
        kind: "workload".into(),
        name: name.into(),
        params: serde_json::json!({}),
        summary: RunSummary::of(&runs).unwrap(),
        runs,
        host: HostInfo::default(),
    }
}

#[test]
fn medians_and_metrics_match_hand_computation() {
    // Base medians: wall 10 s, CPU 16 s; target medians: wall 12 s, CPU 20 s; 2 CPUs each.
    let base = doc("base", &[(9_000, 15_000, 2), (10_000, 16_000, 2), (30_000, 40_000, 2)]);
    let target = doc("target", &[(12_000, 20_000, 2), (11_000, 19_000, 2), (13_000, 22_000, 2)]);
    let r = overhead_of(&base, &target, None, None).unwrap();
    assert_eq!((r.base_wall_ns, r.base_cpu_ns, r.gamma_base), (10_000.0, 16_000.0, 2.0));
    assert_eq!((r.target_wall_ns, r.target_cpu_ns), (12_000.0, 20_000.0));
    assert!((r.metrics.d_eta_r - 0.25).abs() < 1e-12);
    assert!((r.metrics.d_eta_t - 0.2).abs() < 1e-12);
    assert!((r.metrics.omega - 1.2 / 1.25).abs() < 1e-12);
    assert!(r.note.contains("CPU time"));
}

#[test]
fn gamma_override_for_overcommitted_target() {
    // OC: the target VM gets half the pCPUs: d_eta_t = (12*1 - 10*2) / 20 = -0.4.
    let base = doc("base", &[(10_000, 16_000, 2)]);
    let target = doc("target", &[(12_000, 20_000, 2)]);
    let r = overhead_of(&base, &target, None, Some(1.0)).unwrap();
    assert!((r.metrics.d_eta_t + 0.4).abs() < 1e-12);
    assert!(overhead_of(&base, &target, Some(-1.0), None).is_err());
}

#[test]
fn documents_round_trip_through_json_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("base.json");
    let d = doc("base", &[(10_000, 16_000, 2), (11_000, 17_000, 2)]);
    std::fs::write(&path, serde_json::to_string_pretty(&d).unwrap()).unwrap();
    assert_eq!(BenchDoc::load(&path).unwrap(), d);
}
