//! What the simulator needs from lab results, read through the lab's own types: one
//! [`LabCell`] per matrix cell (`matrix.json`, with each cell's `results.json` when it is
//! there) or per `gleaner lab run` (`results.json`). Each file is read once, and its rows
//! are split once into the cell's [`Pass`]es (one per host halt-poll setting: VM A's modes,
//! its runs, the co-runner's iterations), which the model and the report then take whole.

use std::path::{Path, PathBuf};

use gleaner_bench::workload::{Workload, WorkloadParams};
use gleaner_os::BadInput;
use serde::de::DeserializeOwned;

use crate::keys::Env;
use crate::matrix::MatrixResults;
use crate::results::{HaltPoll, Instance, Row, RowMode, SummaryRow};
use crate::runner::{bench_workload_params, LabResults, Sizing, WakeCosts, WakePlace};
use gleaner_policy::IdlePolicy;
use gleaner_qemu::Accel;

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

/// What a cell measured under one host halt-poll setting (`n/a` under TCG).
#[derive(Debug, Clone, PartialEq)]
pub struct Pass {
    pub halt_poll: HaltPoll,
    /// VM A's modes, as the summary lists them.
    pub modes: Vec<MeasuredMode>,
    /// VM A's successful runs.
    pub vm_a: Vec<Row>,
    /// VM B's successful co-runner iterations.
    pub co_runner: Vec<Row>,
}

impl Pass {
    /// VM A's successful runs under `policy`.
    pub fn runs_of(&self, policy: IdlePolicy) -> impl Iterator<Item = &Row> {
        self.vm_a.iter().filter(move |r| r.policy == Some(policy))
    }
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
    /// What was measured under each host halt-poll setting, in the order first measured.
    pub passes: Vec<Pass>,
    /// The results had per-run rows (not when only `matrix.json` was available).
    pub per_run: bool,
    /// The agent's own calibration at each boot of VM A (guest, results), when the lab
    /// recorded it.
    pub calibrations: Vec<(String, gleaner_measure::calibration::CalibrationResults)>,
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

/// The passes of a cell: VM A's summary lines and successful runs, and the co-runner's
/// successful iterations, by halt-poll setting.
fn passes(summary: &[SummaryRow], rows: &[Row], notes: &mut Vec<String>) -> Vec<Pass> {
    let mut out: Vec<Pass> = Vec::new();
    fn pass(out: &mut Vec<Pass>, halt_poll: HaltPoll) -> &mut Pass {
        if let Some(i) = out.iter().position(|p| p.halt_poll == halt_poll) {
            return &mut out[i];
        }
        out.push(Pass { halt_poll, modes: Vec::new(), vm_a: Vec::new(), co_runner: Vec::new() });
        out.last_mut().expect("just pushed")
    }
    for s in summary.iter().filter(|s| s.instance == Instance::A) {
        match s.policy {
            Some(policy) => pass(&mut out, s.halt_poll).modes.push(MeasuredMode { policy, summary: s.clone() }),
            None => notes.push(format!("mode {} has no policy: not predicted", s.mode)),
        }
    }
    for r in rows.iter().filter(|r| r.ok()) {
        if r.mode == RowMode::CoRunner {
            pass(&mut out, r.halt_poll).co_runner.push(r.clone());
        } else if r.instance == Instance::A && r.env == Env::Vm {
            pass(&mut out, r.halt_poll).vm_a.push(r.clone());
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
    let passes = passes(&r.summary, &r.rows, &mut notes);
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
        passes,
        per_run: !r.rows.is_empty(),
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
        let passes = passes(&summary, &[], &mut notes);
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
            passes,
            per_run: false,
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
    /// The wakeup measurement taken alone on the pCPUs (the sizing guest), if any.
    pub fn wake_alone(&self) -> Option<&WakeCosts> {
        self.wake_costs.iter().find(|w| w.context.place == WakePlace::Alone)
    }

    /// The wakeup measurement in VM A next to VM B, for host halt-poll setting `hp` (or any).
    pub fn wake_with_co_runner(&self, hp: HaltPoll) -> Option<&WakeCosts> {
        let with: Vec<&WakeCosts> = self.wake_costs.iter().filter(|w| w.context.place == WakePlace::WithCoRunner).collect();
        with.iter().find(|w| w.context.halt_poll == Some(hp)).or(with.first()).copied()
    }
}
