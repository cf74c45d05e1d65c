//! `gleaner lab matrix`: every idle policy against every workload and co-runner, in the
//! overcommitted scenario where the blocked-waiter wakeup problem lives (the policy
//! matrix). Each cell (workload x co-runner) is an `oc` experiment whose modes are the
//! policies; the matrix report puts the cells side by side: workload speedup, co-runner
//! throughput, weighted speedup (each with its 95% interval) and the CPU each policy burns,
//! with one latency-versus-CPU plot per cell.
//!
//! ```text
//!  for workload in pipeline barrier condvar:
//!    for co-runner in matmul freqsleep:
//!      cell = oc(workload, co-runner, modes = policies)   -> DIR/oc-W-C/ (report.md, results.json, ...)
//!  DIR/matrix.json, DIR/matrix.md, DIR/matrix.csv
//! ```

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use gleaner_bench::workload::Workload;
use gleaner_os::BadInput;
use serde::{Deserialize, Serialize};

use crate::experiment::{Compute, Experiment, Mode, Scenario};
use crate::keys::{HaltPoll, Instance};
use crate::results::{RunError, SummaryRow};
use crate::runner::{self, LabResults, RunOptions, Sizing, WakeCosts};
use gleaner_policy::IdlePolicy;
use gleaner_qemu::Accel;

/// The matrix's default workloads and co-runners (the Gleaner paper's 7.2 co-runners).
pub const DEFAULT_WORKLOADS: [Workload; 3] = [Workload::Pipeline, Workload::Barrier, Workload::Condvar];
pub const DEFAULT_CO_RUNNERS: [Workload; 2] = [Workload::Matmul, Workload::Freqsleep];

/// Items per measured run (full, quick): a few seconds of a stock run under TCG with the
/// balanced compute sizing.
fn items_for(w: Workload) -> (u64, u64) {
    match w {
        Workload::Pipeline => (8_000, 3_000),
        Workload::Barrier => (3_000, 1_500),
        Workload::Condvar => (12_000, 4_000),
        Workload::Mutex => (20_000, 6_000),
        Workload::SpinBarrier => (2_000, 600),
        Workload::Matmul | Workload::Freqsleep => (3_000, 1_000),
    }
}

/// Parses a comma-separated list with `parse`, naming the flag on error.
pub fn parse_list<T>(flag: &str, s: &str, parse: impl Fn(&str) -> Result<T, BadInput>) -> Result<Vec<T>, BadInput> {
    let v: Vec<T> = s
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(&parse)
        .collect::<Result<_, _>>()
        .map_err(|e| BadInput::new(flag, e.value.clone(), e.allowed.clone()))?;
    if v.is_empty() {
        return Err(BadInput::new(flag, s, "a non-empty comma-separated list"));
    }
    Ok(v)
}

/// The experiment of one cell.
pub fn cell_experiment(workload: Workload, co_runner: Workload, policies: &[IdlePolicy]) -> Experiment {
    let (full, quick) = items_for(workload);
    let mut modes: Vec<Mode> = Vec::new();
    if !policies.contains(&IdlePolicy::Stock) {
        modes.push(Mode::of(IdlePolicy::Stock));
    }
    modes.extend(policies.iter().map(|&p| Mode::of(p)));
    Experiment {
        name: format!("oc-{}-{}", workload.name(), co_runner.name()),
        description: format!(
            "VM A ({}) next to VM B ({} loop) on the same pCPUs; policies {}",
            workload.name(),
            co_runner.name(),
            modes.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", ")
        ),
        scenario: Scenario::Oc,
        vcpus: 2,
        memory_mib: 512,
        pcpus: None,
        workload: vec!["bench".into(), "workload".into(), workload.name().into(), "--json".into()],
        full_args: vec!["--items".into(), full.to_string()],
        quick_args: vec!["--items".into(), quick.to_string()],
        co_runner: Some(vec!["bench".into(), "workload".into(), co_runner.name().into(), "--json".into()]),
        co_runner_quick_args: vec!["--quick".into()],
        runs: 7,
        quick_runs: 5,
        timeout_s: 3600,
        quick_timeout_s: 1800,
        modes,
        halt_poll: vec![HaltPoll::Default, HaltPoll::Ns(0)],
        guest_cgroup: Default::default(),
        compute: Compute::Balanced,
    }
}

/// One policy in one cell, as the matrix report shows it (the halt-poll setting is the
/// summary's: a field of its own would write `halt_poll` twice and could not be read back).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MatrixEntry {
    pub workload: Workload,
    pub co_runner: Workload,
    #[serde(flatten)]
    pub summary: SummaryRow,
}

/// One cell's provenance in `matrix.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MatrixCell {
    pub name: String,
    pub workload: Workload,
    pub co_runner: Workload,
    pub dir: PathBuf,
    pub duration_s: f64,
    pub accel: Accel,
    pub runs_per_mode: u32,
    pub sizing: Option<Sizing>,
    pub wake_costs: Vec<WakeCosts>,
    pub guest_args: Vec<String>,
    pub co_runner_args: Vec<String>,
    pub notes: Vec<String>,
}

/// `matrix.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MatrixResults {
    pub quick: bool,
    pub policies: Vec<IdlePolicy>,
    pub cells: Vec<MatrixCell>,
    pub entries: Vec<MatrixEntry>,
}

/// Runs every cell (writing each cell's own report under `out`), then the matrix files.
pub fn run_matrix(
    workloads: &[Workload],
    co_runners: &[Workload],
    policies: &[IdlePolicy],
    opts: &RunOptions,
) -> anyhow::Result<MatrixResults> {
    std::fs::create_dir_all(&opts.out).with_context(|| format!("creating {}", opts.out.display()))?;
    let mut m = MatrixResults { quick: opts.quick, policies: policies.to_vec(), cells: Vec::new(), entries: Vec::new() };
    let total = workloads.len() * co_runners.len();
    for &w in workloads {
        for &c in co_runners {
            let exp = cell_experiment(w, c, policies);
            let dir = opts.out.join(&exp.name);
            eprintln!("lab matrix: cell {}/{total}: {} -> {}", m.cells.len() + 1, exp.name, dir.display());
            let cell_opts = RunOptions { out: dir.clone(), ..opts.clone() };
            let r = runner::run_experiment(&exp, &cell_opts)?;
            crate::report::write(&dir, &r)?;
            add_cell(&mut m, w, c, &dir, &r);
            // Keep what is done if a later cell fails or is interrupted.
            write(&opts.out, &m)?;
        }
    }
    Ok(m)
}

fn add_cell(m: &mut MatrixResults, w: Workload, c: Workload, dir: &Path, r: &LabResults) {
    m.cells.push(MatrixCell {
        name: r.experiment.name.clone(),
        workload: w,
        co_runner: c,
        dir: dir.to_path_buf(),
        duration_s: r.duration_s,
        accel: r.accel,
        runs_per_mode: r.runs_per_mode,
        sizing: r.sizing.clone(),
        wake_costs: r.wake_costs.clone(),
        guest_args: r.guest_args.clone(),
        co_runner_args: r.experiment.co_runner_args(r.quick).unwrap_or_default(),
        notes: r.notes.clone(),
    });
    for s in r.summary.iter().filter(|s| s.instance == Instance::A) {
        m.entries.push(MatrixEntry { workload: w, co_runner: c, summary: s.clone() });
    }
}

fn f(v: Option<f64>, d: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.d$}"))
}

fn ci(v: Option<f64>, c: Option<gleaner_policy::stats::Interval>) -> String {
    match (v, c) {
        (Some(v), Some(c)) => format!("{v:.2} [{:.2}, {:.2}]", c.lo, c.hi),
        (v, _) => f(v, 2),
    }
}

/// The matrix table (Markdown): one line per cell and policy.
pub fn table(m: &MatrixResults) -> String {
    let mut t = String::from(
        "| workload | co-runner | halt poll | policy | ok/runs | wall s | speedup [95% CI] | co-runner ratio [95% CI] | weighted speedup [95% CI] | host CPU us/item | vCPU halts/item | host CPU per avoided halt, us | agent: consolidations (fewest vCPUs), mean active vCPUs, retention on, agent CPU | note |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for e in &m.entries {
        let s = &e.summary;
        let cons = crate::report::agent_cell(s);
        let mut note = match &s.failure {
            // A policy that cannot run here says why (one line: the reason's first sentence).
            Some(RunError::NotRun(why)) => format!("not run: {}", why.split(['\n', ';']).next().unwrap_or(why)),
            _ if s.runs_ok < s.runs => format!("{} run(s) failed: see the cell's runs.csv", s.runs - s.runs_ok),
            _ => String::new(),
        };
        if let Some(b) = s.bww_bound {
            note = format!("blocked-waiter bound {} {note}", crate::results::bound_label(b));
        }
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {}/{} | {} | {} | {} | {} | {} | {} | {} | {cons} | {note} |",
            e.workload,
            e.co_runner,
            s.halt_poll,
            s.mode,
            s.runs_ok,
            s.runs,
            f(s.wall_s, 3),
            ci(s.speedup, s.speedup_ci),
            ci(s.co_runner_ratio, s.co_runner_ratio_ci),
            ci(s.weighted_speedup, s.weighted_speedup_ci),
            f(s.host_cpu_per_item_us, 1),
            f(s.sleeps_per_item, 2),
            f(s.cpu_per_avoided_halt_us, 0)
        );
    }
    t
}

/// For each cell: the policy with the best weighted speedup, and where Gleaner stands.
pub fn verdicts(m: &MatrixResults) -> Vec<String> {
    let mut out = Vec::new();
    for c in &m.cells {
        let es: Vec<&MatrixEntry> = m.entries.iter().filter(|e| e.workload == c.workload && e.co_runner == c.co_runner).collect();
        let mut hps: Vec<HaltPoll> = es.iter().map(|e| e.summary.halt_poll).collect();
        hps.dedup();
        for hp in hps {
            let cell: Vec<&&MatrixEntry> = es.iter().filter(|e| e.summary.halt_poll == hp).collect();
            let best = cell
                .iter()
                .filter(|e| e.summary.weighted_speedup.is_some())
                .max_by(|a, b| a.summary.weighted_speedup.partial_cmp(&b.summary.weighted_speedup).unwrap_or(std::cmp::Ordering::Equal));
            let g = cell.iter().find(|e| e.summary.policy == Some(IdlePolicy::Gleaner));
            if let Some(b) = best {
                let gl = g.map_or("gleaner not run".into(), |g| {
                    format!(
                        "gleaner: speedup {}, weighted {}",
                        ci(g.summary.speedup, g.summary.speedup_ci),
                        ci(g.summary.weighted_speedup, g.summary.weighted_speedup_ci)
                    )
                });
                out.push(format!(
                    "{} + {} (halt poll {hp}): best weighted speedup {} ({}); {gl}",
                    c.workload,
                    c.co_runner,
                    ci(b.summary.weighted_speedup, b.summary.weighted_speedup_ci),
                    b.summary.mode
                ));
            }
        }
    }
    out
}

/// Writes `matrix.json`, `matrix.md` and `matrix.csv` into `out`; returns the report's path.
pub fn write(out: &Path, m: &MatrixResults) -> anyhow::Result<PathBuf> {
    let w = |name: &str, text: &str| std::fs::write(out.join(name), text).with_context(|| out.join(name).display().to_string());
    w("matrix.json", &serde_json::to_string_pretty(m)?)?;
    let mut csv = String::from("workload,co_runner,");
    let summary = crate::report::summary_csv(&m.entries.iter().map(|e| e.summary.clone()).collect::<Vec<_>>());
    let mut lines = summary.lines();
    csv.push_str(lines.next().unwrap_or(""));
    csv.push('\n');
    for (e, l) in m.entries.iter().zip(lines) {
        let _ = writeln!(csv, "{},{},{l}", e.workload, e.co_runner);
    }
    w("matrix.csv", &csv)?;
    let mut md = String::from("# gleaner lab matrix: idle policies in the overcommitted scenario\n\n");
    let _ = writeln!(md, "Each cell is an `oc` experiment: VM A runs the workload under each policy (interleaved, rotated run by run), VM B runs the co-runner in a loop on the same pCPUs. Speedup and co-runner ratio are against the stock mode of the same cell; the weighted speedup is their mean (Gleaner paper 7.2.1). Intervals are bootstrap 95% intervals over the runs. Each cell's own report (with its latency-versus-CPU plot) is in its directory.{}\n", if m.quick { " Quick sizes (--quick)." } else { "" });
    md.push_str(&table(m));
    md.push_str("\n## Per cell\n\n");
    for v in verdicts(m) {
        let _ = writeln!(md, "- {v}");
    }
    md.push('\n');
    for c in &m.cells {
        let rel = c.dir.file_name().map_or_else(|| c.dir.display().to_string(), |n| n.to_string_lossy().into_owned());
        let _ = writeln!(md, "### {}\n\n[report]({rel}/report.md), {} run(s) per policy, {:.0} s, {}; guest workload `gleaner {}`\n\n![{}]({rel}/latency_cpu.png)\n", c.name, c.runs_per_mode, c.duration_s, c.accel, c.guest_args.join(" "), c.name);
    }
    w("matrix.md", &md)?;
    Ok(out.join("matrix.md"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::RowMode;

    #[test]
    fn cells_have_a_stock_mode_and_one_mode_per_policy() {
        let e = cell_experiment(Workload::Condvar, Workload::Freqsleep, &[IdlePolicy::Gleaner, IdlePolicy::Poll]);
        assert_eq!(e.name, "oc-condvar-freqsleep");
        assert_eq!(e.modes.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), ["stock", "gleaner", "poll"]);
        assert_eq!(e.boot_groups().len(), 2, "idle=poll needs its own boot");
        assert_eq!(e.co_runner_args(true).unwrap(), ["bench", "workload", "freqsleep", "--json", "--quick"]);
        let all = cell_experiment(Workload::Pipeline, Workload::Matmul, &gleaner_policy::peer::ALL);
        assert_eq!(all.modes.len(), gleaner_policy::peer::ALL.len());
        // The generated experiment passes the same validation as a file.
        Experiment::parse(&toml::to_string(&all).unwrap(), "matrix").unwrap();
    }

    #[test]
    fn a_policy_that_cannot_run_here_says_why_in_its_line() {
        let entry = |mode: &str, runs_ok, failure: Option<&str>| MatrixEntry {
            workload: Workload::Pipeline,
            co_runner: Workload::Matmul,
            summary: SummaryRow {
                mode: RowMode::mode(mode),
                runs_ok,
                runs: 7,
                failure: failure.map(|f| RunError::from(f.to_string())),
                ..Default::default()
            },
        };
        let why = "not run: the guest's cpuidle driver is none (not haltpoll): QEMU provides it only with -accel kvm";
        let m = MatrixResults {
            quick: false,
            policies: vec![IdlePolicy::HALTPOLL],
            cells: Vec::new(),
            entries: vec![entry("haltpoll", 0, Some(why)), entry("gleaner", 5, None), entry("yielders", 0, Some("guest timed out"))],
        };
        let t = table(&m);
        let line = |mode: &str| t.lines().find(|l| l.contains(&format!("| {mode} |"))).unwrap().to_string();
        assert!(line("haltpoll").contains(why), "{t}");
        assert!(line("gleaner").contains("2 run(s) failed"), "{t}");
        assert!(line("yielders").contains("7 run(s) failed"), "{t}");
    }

    #[test]
    fn matrix_entries_keep_the_kernel_names_and_refuse_unknown_ones() {
        let e = MatrixEntry { workload: Workload::SpinBarrier, co_runner: Workload::Freqsleep, summary: SummaryRow::default() };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!((v["workload"].as_str(), v["co_runner"].as_str()), (Some("spin-barrier"), Some("freqsleep")));
        let mut bad = v.clone();
        bad["workload"] = "dedupp".into();
        let err = serde_json::from_value::<MatrixEntry>(bad).unwrap_err().to_string();
        assert!(err.contains("dedupp") && err.contains("pipeline"), "{err}");
        assert_eq!(serde_json::from_value::<MatrixEntry>(v).unwrap(), e);
    }

    #[test]
    fn lists_name_the_bad_value() {
        assert_eq!(parse_list("--workloads", "pipeline,condvar", Workload::parse).unwrap(), [Workload::Pipeline, Workload::Condvar]);
        let e = parse_list("--workloads", "pipeline,nope", Workload::parse).unwrap_err();
        assert!(e.to_string().contains("--workloads") && e.to_string().contains("nope"), "{e}");
        let e = parse_list("--policies", "gleaner,magic", crate::experiment::parse_policy).unwrap_err();
        assert!(e.to_string().contains("magic") && e.to_string().contains("haltpoll:CAP"), "{e}");
        assert!(parse_list("--policies", ",", crate::experiment::parse_policy).is_err());
    }
}
