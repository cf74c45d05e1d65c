//! `gleaner sim predict`: the model's idle-policy ratios on a 2-vCPU VM (the built-in
//! `vm-matrix` scenario) beside the ones `gleaner compare --policies` measured on the machine.
//!
//! ```text
//!  vm-matrix.toml --(costs.calibration)--> run_text --> Report (per case, variant: request
//!                                                       latency p50/p99, wall time)
//!  DIR/<file>.json (gleaner compare --json) --> CompareDoc --> medians per policy
//!  both --> rows: case, policy, metric, predicted ratio, measured ratio, error
//! ```
//!
//! A ratio is stock's over the policy's (latency p50 and p99 for the latency kernels, wall
//! time for the others), so above 1 means better than stock, as in `compare`'s `vs_stock`.
//! The error is predicted / measured; the target is within 25% (0.75..=1.25).

use std::path::{Path, PathBuf};

use gleaner_measure::compare::CompareDoc;
use gleaner_policy::input::BadInput;
use serde::Serialize;

use crate::runner::{CaseReport, Report};

/// How far a prediction may be from the measurement (as a ratio of ratios) and still count.
pub const TOLERANCE: f64 = 0.25;

/// The scenario's cases, the metric each is judged by, and the file `scripts/bench/
/// idle-policies.sh` writes its measurement to.
pub const CASES: &[(&str, Metric, &str)] = &[
    ("pingpong", Metric::Latency, "pingpong"),
    ("openloop-200", Metric::Latency, "openloop-200"),
    ("openloop-2000", Metric::Latency, "openloop-2000"),
    ("openloop-20000", Metric::Latency, "openloop-20000"),
    ("pipeline", Metric::Wall, "pipeline"),
    ("saturated", Metric::Wall, "stress-ng-cpu2"),
];

/// What a case is judged by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Request latency, p50 and p99.
    Latency,
    /// Wall time of a fixed amount of work.
    Wall,
}

/// The ratio a row compares (stock's over the policy's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ratio {
    LatencyP50,
    LatencyP99,
    /// Wall time: the speed.
    Speed,
}

impl Ratio {
    pub fn label(self) -> &'static str {
        match self {
            Ratio::LatencyP50 => "latency_p50",
            Ratio::LatencyP99 => "latency_p99",
            Ratio::Speed => "speed",
        }
    }
}

/// One compared number.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub case: String,
    pub policy: String,
    pub metric: Ratio,
    /// Stock's value over the policy's, in the model.
    pub predicted: f64,
    /// The same from the measurement (`None`: no measurement of this case or policy).
    pub measured: Option<f64>,
    /// predicted / measured.
    pub error: Option<f64>,
    pub within_tolerance: Option<bool>,
}

/// What `predict --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct Prediction {
    pub scenario: String,
    pub seed: u64,
    pub calibration: Option<PathBuf>,
    pub measured_dir: Option<PathBuf>,
    pub tolerance: f64,
    pub rows: Vec<Row>,
    /// Rows with a measurement, and those within the tolerance.
    pub compared: usize,
    pub within: usize,
}

/// What one policy did in one case: latency p50 and p99 (us), wall time (s).
#[derive(Debug, Clone, PartialEq)]
struct Values {
    policy: String,
    latency: Option<(f64, f64)>,
    wall_s: f64,
}

/// Each variant of one case of the model.
fn model_values(c: &CaseReport) -> Vec<Values> {
    c.variants
        .iter()
        .filter_map(|v| {
            let vm = v.vms.first()?;
            let latency = vm.request_latency.map(|l| (l.p50_us, l.p99_us));
            // A variant named for an idle policy goes by the policy's own name (`naive` is
            // `yielders`), the name compare writes; other variants keep theirs.
            let policy = v.name.parse::<gleaner_policy::IdlePolicy>().map_or_else(|_| v.name.clone(), |p| p.to_string());
            Some(Values { policy, latency, wall_s: vm.wall_ns as f64 / 1e9 })
        })
        .collect()
}

/// The medians of each policy in one `compare --json` document.
fn measured_values(doc: &CompareDoc) -> Vec<Values> {
    doc.summaries
        .iter()
        .map(|s| {
            let latency = s.latency_p50_us.as_ref().zip(s.latency_p99_us.as_ref()).map(|(a, b)| (a.p50, b.p50));
            Values { policy: s.policy.to_string(), latency, wall_s: s.wall_s.p50 }
        })
        .collect()
}

/// Stock's over the policy's, per metric: (metric, ratio).
fn ratios(metric: Metric, stock: &Values, x: &Values) -> Vec<(Ratio, Option<f64>)> {
    match metric {
        Metric::Latency => {
            let l = stock.latency.zip(x.latency);
            vec![(Ratio::LatencyP50, l.and_then(|(s, x)| ratio(s.0, x.0))), (Ratio::LatencyP99, l.and_then(|(s, x)| ratio(s.1, x.1)))]
        }
        Metric::Wall => vec![(Ratio::Speed, ratio(stock.wall_s, x.wall_s))],
    }
}

fn ratio(stock: f64, x: f64) -> Option<f64> {
    (stock.is_finite() && x.is_finite() && stock > 0.0 && x > 0.0).then(|| stock / x)
}

/// Reads `DIR/<file>.json` if it exists: a `gleaner compare --json` document.
pub fn read_measured(dir: &Path, file: &str) -> anyhow::Result<Option<CompareDoc>> {
    let p = dir.join(format!("{file}.json"));
    if !p.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&p).map_err(|e| BadInput::new("--measured", p.display(), format!("a readable file ({e})")))?;
    let doc = serde_json::from_str(&text)
        .map_err(|e| BadInput::new("--measured", p.display(), format!("a `gleaner compare --json` document ({e})")))?;
    Ok(Some(doc))
}

/// The rows of one case: every non-stock variant of the model, with the measurement's ratio
/// for the policy of the same name where `measured` has it.
pub fn case_rows(case: &CaseReport, metric: Metric, measured: Option<&CompareDoc>) -> Vec<Row> {
    let model = model_values(case);
    let Some(m_stock) = model.iter().find(|v| v.policy == "stock") else { return Vec::new() };
    let meas = measured.map(measured_values).unwrap_or_default();
    let r_stock = meas.iter().find(|v| v.policy == "stock");
    let mut rows = Vec::new();
    for x in model.iter().filter(|v| v.policy != "stock") {
        let measured: Vec<(Ratio, Option<f64>)> = match (r_stock, meas.iter().find(|v| v.policy == x.policy)) {
            (Some(s), Some(r)) => ratios(metric, s, r),
            _ => Vec::new(),
        };
        for (metric, predicted) in ratios(metric, m_stock, x) {
            let Some(predicted) = predicted else { continue };
            let measured = measured.iter().find(|(m, _)| *m == metric).and_then(|(_, r)| *r);
            let error = measured.map(|m| predicted / m);
            rows.push(Row {
                case: case.name.clone(),
                policy: x.policy.clone(),
                metric,
                predicted,
                measured,
                error,
                within_tolerance: error.map(|e| (1.0 - TOLERANCE..=1.0 + TOLERANCE).contains(&e)),
            });
        }
    }
    rows
}

/// Puts a model report of `vm-matrix` beside the measurements in `measured_dir`.
pub fn compare(report: &Report, calibration: Option<PathBuf>, measured_dir: Option<&Path>) -> anyhow::Result<Prediction> {
    let mut rows = Vec::new();
    for &(name, metric, file) in CASES {
        let Some(case) = report.cases.iter().find(|c| c.name == name) else { continue };
        let doc = match measured_dir {
            Some(d) => read_measured(d, file)?,
            None => None,
        };
        rows.extend(case_rows(case, metric, doc.as_ref()));
    }
    let compared = rows.iter().filter(|r| r.measured.is_some()).count();
    let within = rows.iter().filter(|r| r.within_tolerance == Some(true)).count();
    Ok(Prediction {
        scenario: report.scenario.clone(),
        seed: report.seed,
        calibration,
        measured_dir: measured_dir.map(Path::to_path_buf),
        tolerance: TOLERANCE,
        rows,
        compared,
        within,
    })
}

/// A table of a prediction.
pub fn render(p: &Prediction) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "gleaner sim predict: scenario {} (seed {}), wake costs {}",
        p.scenario,
        p.seed,
        p.calibration.as_ref().map_or("of the scenario (Table 2)".to_string(), |c| format!("from {}", c.display()))
    );
    let _ = writeln!(s, "ratio = stock / policy (latency p50, p99; speed: wall time); > 1 is better than stock");
    let _ = writeln!(s, "  {:<16} {:<9} {:<12} {:>9} {:>9} {:>9}", "case", "policy", "metric", "predicted", "measured", "error");
    for r in &p.rows {
        let opt = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2}"));
        let flag = match r.within_tolerance {
            Some(true) => "",
            Some(false) => "  off",
            None => "",
        };
        let _ = writeln!(
            s,
            "  {:<16} {:<9} {:<12} {:>9.2} {:>9} {:>9}{}",
            r.case,
            r.policy,
            r.metric.label(),
            r.predicted,
            opt(r.measured),
            opt(r.error),
            flag
        );
    }
    match &p.measured_dir {
        Some(d) => {
            let _ = writeln!(
                s,
                "{} of {} measured ratios predicted within {:.0}% (measurements: {})",
                p.within,
                p.compared,
                p.tolerance * 100.0,
                d.display()
            );
        }
        None => {
            let _ = writeln!(s, "no measurements given (--measured DIR, from scripts/bench/idle-policies.sh)");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use gleaner_measure::compare::{Policy, PolicySummary};
    use gleaner_policy::stats::Summary;

    fn one(x: f64) -> Summary {
        Summary::of(&[x]).expect("a value")
    }

    fn summary(policy: Policy, p50: f64, p99: f64, wall: f64) -> PolicySummary {
        PolicySummary {
            policy,
            runs: 1,
            wall_s: one(wall),
            throughput: None,
            latency_p50_us: (p50 > 0.0).then(|| one(p50)),
            latency_p99_us: (p99 > 0.0).then(|| one(p99)),
            latency_mean_us: None,
            busy_vcpus: one(1.0),
            poll_vcpus: one(0.0),
            total_vcpus: one(1.0),
            policy_vcpus: one(0.0),
            total_cpu_per_item_us: None,
        }
    }

    fn doc(summaries: Vec<PolicySummary>) -> CompareDoc {
        CompareDoc {
            command: vec!["x".into()],
            runs: 1,
            cpus: "0-1".into(),
            policies: summaries.iter().map(|s| s.policy).collect(),
            machine: String::new(),
            calibration: None,
            notes: Vec::new(),
            samples: Vec::new(),
            summaries,
            vs_stock: Vec::new(),
            per_round: Vec::new(),
        }
    }

    fn model() -> Report {
        let (name, text) = crate::load_scenario("vm-matrix").expect("built in");
        crate::run_text(&name, &text, None, false).expect("runs")
    }

    #[test]
    fn predicted_ratios_meet_the_measured_ones_by_policy_and_metric() {
        let report = model();
        let case = report.cases.iter().find(|c| c.name == "pingpong").expect("case");
        let lat = |v: &str| {
            let l = case.variants.iter().find(|x| x.name == v).expect("variant").vms[0].request_latency.expect("records");
            (l.p50_us, l.p99_us)
        };
        let (s50, s99) = lat("stock");
        let (h50, _) = lat("haltpoll");
        // Measured: haltpoll exactly as predicted at p50, naive twice as good as predicted.
        let (n50, _) = lat("naive");
        let measured = doc(vec![
            summary(Policy::Stock, 100.0, 200.0, 3.0),
            summary(Policy::HALTPOLL, 100.0 * h50 / s50, 150.0, 3.0),
            summary(Policy::Yielders, 50.0 * n50 / s50, 200.0, 3.0),
        ]);
        let rows = case_rows(case, Metric::Latency, Some(&measured));
        let row = |p: &str, m: Ratio| rows.iter().find(|r| r.policy == p && r.metric == m).expect("row").clone();
        let h = row("haltpoll", Ratio::LatencyP50);
        assert!((h.error.expect("measured") - 1.0).abs() < 1e-9, "{h:?}");
        assert_eq!(h.within_tolerance, Some(true));
        let n = row("yielders", Ratio::LatencyP50);
        assert!((n.error.expect("measured") - 0.5).abs() < 1e-9, "{n:?}");
        assert_eq!(n.within_tolerance, Some(false));
        assert!((row("haltpoll", Ratio::LatencyP99).measured.expect("measured") - 200.0 / 150.0).abs() < 1e-9);
        // gleaner was not measured: predicted only.
        let g = row("gleaner", Ratio::LatencyP50);
        assert_eq!((g.measured, g.within_tolerance), (None, None));
        assert!((g.predicted - s50 / lat("gleaner").0).abs() < 1e-9 && s99 > 0.0);
    }

    #[test]
    fn a_measurement_directory_is_read_by_the_bench_script_names() {
        let report = model();
        let dir = tempfile::tempdir().expect("tempdir");
        let d = doc(vec![summary(Policy::Stock, 0.0, 0.0, 4.0), summary(Policy::Gleaner, 0.0, 0.0, 5.0)]);
        std::fs::write(dir.path().join("stress-ng-cpu2.json"), serde_json::to_string(&d).expect("json")).expect("write");
        let p = compare(&report, None, Some(dir.path())).expect("compares");
        assert_eq!(p.compared, 1, "only the saturated case was measured");
        let r = p.rows.iter().find(|r| r.measured.is_some()).expect("a measured row");
        assert_eq!((r.case.as_str(), r.policy.as_str(), r.metric), ("saturated", "gleaner", Ratio::Speed));
        assert!((r.measured.expect("m") - 0.8).abs() < 1e-9);
        assert!(render(&p).contains("of 1 measured ratios predicted within 25%"));
        std::fs::write(dir.path().join("pingpong.json"), "{ not json").expect("write");
        let e = compare(&report, None, Some(dir.path())).expect_err("malformed");
        let b = e.downcast_ref::<BadInput>().expect("BadInput");
        assert_eq!(b.what, "--measured");
        assert!(b.value.contains("pingpong.json") && b.allowed.contains("gleaner compare --json"), "{b:?}");
    }
}
