//! What the simulator needs from lab results, read through the lab's own types: one
//! [`LabCell`] per matrix cell (`matrix.json`, with each cell's `results.json` when it is
//! there) or per `gleaner lab run` (`results.json`).

use std::path::{Path, PathBuf};

use gleaner_bench::workload::{Workload, WorkloadParams};
use gleaner_os::BadInput;
use serde::de::DeserializeOwned;

use crate::guest::Accel;
use crate::matrix::MatrixResults;
use crate::results::{Row, SummaryRow};
use crate::runner::{bench_workload_params, LabResults, Sizing, WakeCosts, WakePlace};
use gleaner_policy::IdlePolicy;

/// A `gleaner bench workload` kernel as a guest ran it: the kernel and its typed size, with the
/// thread count the guest used.
#[derive(Debug, Clone, PartialEq)]
pub struct Kernel {
    pub workload: Workload,
    pub params: WorkloadParams,
}

/// One measured mode of VM A (a line of the lab's summary).
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredMode {
    pub policy: IdlePolicy,
    pub summary: SummaryRow,
}

/// One lab cell: VM A's workload under each policy next to VM B's co-runner.
#[derive(Debug, Clone)]
pub struct LabCell {
    pub name: String,
    /// The file the cell was read from.
    pub source: PathBuf,
    pub accel: Accel,
    pub pcpus: u32,
    pub vcpus: u32,
    pub workload: Kernel,
    pub co_runner: Option<Kernel>,
    pub sizing: Option<Sizing>,
    pub wake_costs: Vec<WakeCosts>,
    /// VM A's modes, per host halt-poll setting (`n/a` under TCG).
    pub modes: Vec<MeasuredMode>,
    /// Every run (empty when only `matrix.json` was available).
    pub rows: Vec<Row>,
    /// The agent's own calibration at each boot of VM A (guest, results), when the lab
    /// recorded it.
    pub calibrations: Vec<(String, gleaner_agent::cache::CalibrationResults)>,
    /// What had to be assumed while reading.
    pub notes: Vec<String>,
}

const ALLOWED: &str = "a directory holding matrix.json (gleaner lab matrix) or results.json (gleaner lab run), or one of those files";

/// Reads `path`: a directory with `matrix.json` or `results.json`, or such a file. A missing,
/// unreadable or malformed file is [`BadInput`] naming the path and what is expected.
pub fn load(path: &Path) -> anyhow::Result<Vec<LabCell>> {
    let file = if path.is_dir() {
        ["matrix.json", "results.json"]
            .iter()
            .map(|n| path.join(n))
            .find(|p| p.is_file())
            .ok_or_else(|| BadInput::new("lab results", path.display(), ALLOWED))?
    } else if path.is_file() {
        path.to_path_buf()
    } else {
        return Err(BadInput::new("lab results", path.display(), ALLOWED).into());
    };
    if file.file_name().is_some_and(|n| n == "matrix.json") {
        let m: MatrixResults = read_json(&file, "a `gleaner lab matrix` matrix.json")?;
        from_matrix(&file, &m)
    } else {
        let r: LabResults = read_json(&file, "a `gleaner lab run` results.json")?;
        Ok(vec![from_results(&file, &r)?])
    }
}

/// Reads a lab document through a JSON value first: matrix files written before `MatrixEntry`
/// lost its own `halt_poll` hold that key twice (equal values), which a typed read refuses.
fn read_json<T: DeserializeOwned>(file: &Path, what: &str) -> anyhow::Result<T> {
    let bad = |e: &dyn std::fmt::Display| BadInput::new("lab results", file.display(), format!("{what} ({e})"));
    let text = std::fs::read_to_string(file).map_err(|e| bad(&e))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(&e))?;
    Ok(serde_json::from_value(value).map_err(|e| bad(&e))?)
}

/// The kernel of `bench workload NAME ...` arguments; the thread count defaults to what the
/// kernel picks on `vcpus` CPUs (the guest's), not on the machine reading the results.
pub fn kernel_of(args: &[String], vcpus: u32) -> Result<Kernel, BadInput> {
    let bad = || BadInput::new("guest workload", args.join(" "), "`bench workload KERNEL ...` arguments of a built-in kernel");
    let mut params = bench_workload_params(args).ok_or_else(bad)??;
    let workload = Workload::parse(&args[2])?;
    if !args.iter().any(|a| a == "--threads" || a.starts_with("--threads=")) {
        params.threads = WorkloadParams::default_for_cpus(workload, vcpus as usize).threads;
    }
    Ok(Kernel { workload, params })
}

fn measured_modes(summary: &[SummaryRow], notes: &mut Vec<String>) -> Vec<MeasuredMode> {
    let mut out = Vec::new();
    for s in summary.iter().filter(|s| s.instance == "A") {
        match s.policy.parse::<IdlePolicy>() {
            Ok(policy) => out.push(MeasuredMode { policy, summary: s.clone() }),
            Err(_) => notes.push(format!("mode {} has no known policy ({:?}): not predicted", s.mode, s.policy)),
        }
    }
    out
}

/// A cell from one `gleaner lab run` results file.
pub fn from_results(file: &Path, r: &LabResults) -> anyhow::Result<LabCell> {
    let vcpus = r.experiment.vcpus;
    let workload = kernel_of(&r.guest_args, vcpus).map_err(|e| anyhow::Error::new(e).context(format!("{}", file.display())))?;
    let co_runner = match r.experiment.co_runner_args(r.quick) {
        Some(a) => Some(kernel_of(&a, vcpus).map_err(|e| anyhow::Error::new(e).context(format!("{}", file.display())))?),
        None => None,
    };
    let mut notes = Vec::new();
    let modes = measured_modes(&r.summary, &mut notes);
    Ok(LabCell {
        name: r.experiment.name.clone(),
        source: file.to_path_buf(),
        accel: r.accel,
        pcpus: u32::try_from(r.pcpus.len()).unwrap_or(u32::MAX).max(1),
        vcpus,
        workload,
        co_runner,
        sizing: r.sizing.clone(),
        wake_costs: r.wake_costs.clone(),
        modes,
        rows: r.rows.clone(),
        calibrations: r.calibrations.iter().map(|(g, c)| (g.clone(), c.results.clone())).collect(),
        notes,
    })
}

/// The cells of a matrix: each from its own `results.json` when that is next to `matrix.json`
/// (or where the matrix recorded it), else from what `matrix.json` holds.
fn from_matrix(file: &Path, m: &MatrixResults) -> anyhow::Result<Vec<LabCell>> {
    let dir = file.parent().unwrap_or(Path::new("."));
    let mut cells = Vec::new();
    for c in &m.cells {
        let local = c.dir.file_name().map(|n| dir.join(n).join("results.json"));
        let found = local.into_iter().chain([c.dir.join("results.json")]).find(|p| p.is_file());
        if let Some(rf) = found {
            let r: LabResults = read_json(&rf, "a `gleaner lab run` results.json")?;
            cells.push(from_results(&rf, &r)?);
            continue;
        }
        // Typed in matrix.json: an unknown kernel was refused when the file was read.
        let (w, co) = (c.workload, c.co_runner);
        // The matrix builds each cell's experiment itself: its vCPUs and pCPUs are these.
        let exp = crate::matrix::cell_experiment(w, co, &m.policies);
        let mut notes = vec![format!(
            "no results.json for cell {}: no per-run rows (co-runner model from defaults, no per-window co-runner ratios)",
            c.name
        )];
        let summary: Vec<SummaryRow> =
            m.entries.iter().filter(|e| e.workload == c.workload && e.co_runner == c.co_runner).map(|e| e.summary.clone()).collect();
        let modes = measured_modes(&summary, &mut notes);
        let ctx = |e: BadInput| anyhow::Error::new(e).context(format!("cell {} in {}", c.name, file.display()));
        cells.push(LabCell {
            name: c.name.clone(),
            source: file.to_path_buf(),
            accel: c.accel,
            pcpus: exp.vcpus,
            vcpus: exp.vcpus,
            workload: kernel_of(&c.guest_args, exp.vcpus).map_err(ctx)?,
            co_runner: Some(kernel_of(&c.co_runner_args, exp.vcpus).map_err(ctx)?),
            sizing: c.sizing.clone(),
            wake_costs: c.wake_costs.clone(),
            modes,
            rows: Vec::new(),
            calibrations: Vec::new(),
            notes,
        });
    }
    if cells.is_empty() {
        return Err(BadInput::new("lab results", file.display(), "a matrix.json with at least one finished cell").into());
    }
    Ok(cells)
}

impl LabCell {
    /// The host halt-poll settings the cell was measured with (`n/a` under TCG).
    pub fn halt_polls(&self) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        for m in &self.modes {
            if !v.contains(&m.summary.halt_poll) {
                v.push(m.summary.halt_poll.clone());
            }
        }
        v
    }

    /// The wakeup measurement taken alone on the pCPUs (the sizing guest), if any.
    pub fn wake_alone(&self) -> Option<&WakeCosts> {
        self.wake_costs.iter().find(|w| w.context.place == WakePlace::Alone)
    }

    /// The wakeup measurement in VM A next to VM B, for host halt-poll setting `hp` (or any).
    pub fn wake_with_co_runner(&self, hp: &str) -> Option<&WakeCosts> {
        let with: Vec<&WakeCosts> = self.wake_costs.iter().filter(|w| w.context.place == WakePlace::WithCoRunner).collect();
        with.iter().find(|w| w.context.halt_poll.as_deref() == Some(hp)).or(with.first()).copied()
    }
}
