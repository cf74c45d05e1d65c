//! Runs an experiment in named phases: prepare (paths, kernel, acceleration, pCPUs), size the
//! workload, the native baseline, then for each host halt-poll setting the guests of the
//! scenario (modes interleaved and rotated run by run, one boot per kernel command line),
//! and finally rows and the summary.
//!
//! ```text
//!  uc : native x R          | VM A: setup, then off.1 gleaner.1 ... | gleaner.2 off.2 ... (rotated)
//!  oc : native x R          | VM B: co.1 co.2 co.3 ... (loop, started first)
//!                           | VM A: as uc, started once B runs
//!  oc2: native pair x R     | VM A and VM B: as uc, both at once
//!  modes that need another kernel command line (idle=poll, cpuidle_haltpoll.force=1) get
//!  their own boot of VM A per round: round r boots each command line once, in rotated order.
//! ```
//!
//! Setup steps (`setup.*`: the compute rate, the agent's calibration) run at each boot of a
//! measured guest before its first measured step, outside every measured window.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use gleaner_os::cpuset::CpuSet;
use gleaner_qemu::accel::AccelChoice;
use gleaner_qemu::kernel::KernelMeta;
use gleaner_qemu::{Accel, GuestError};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::experiment::{Experiment, Scenario};
use crate::keys::RowMode;
use crate::results::{self, Row, RunError, SummaryRow};

// One file per phase (and the job scripts and wakeup costs they share); a phase names what
// it takes from another (`super::prepare::Prepared`), so the files stay layered.
mod baseline;
mod job;
mod pass;
mod prepare;
mod rows;
mod sizing;
mod wake;

use baseline::native_baseline;
pub use job::{co_runner_job, guest_job, mode_command, Setup, StepKind, StepKindOf, GUEST_EVENTS};
use pass::guest_pass;
use prepare::{prepare, Prepared};
use rows::{add_bww_bounds, add_compute_shares, pass_rows};
use sizing::size_workload;
pub use sizing::{bench_workload_params, calibrated_rate, with_flag, Sizing};
pub use wake::{WakeContext, WakeCosts, WakePlace};

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub out: PathBuf,
    pub quick: bool,
    /// The gleaner binary run natively and inside the guests.
    pub gleaner: PathBuf,
    pub accel: AccelChoice,
    pub kernel: Option<String>,
    pub cache_dir: PathBuf,
    /// Overrides the experiment's pCPU list.
    pub pcpus: Option<CpuSet>,
    /// Overrides the number of runs per mode.
    pub runs: Option<u32>,
    /// Show a progress bar on stderr.
    pub progress: bool,
}

/// A setup step of a measured guest (not a measured run): its output is kept as provenance.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SetupStep {
    pub guest: String,
    pub step: String,
    pub rc: i32,
    pub stdout: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LabResults {
    pub experiment: Experiment,
    pub quick: bool,
    pub accel: Accel,
    pub kernel: KernelMeta,
    pub qemu_version: String,
    pub host_kernel: String,
    pub gleaner: String,
    pub pcpus: Vec<usize>,
    pub runs_per_mode: u32,
    pub started_unix_s: u64,
    pub duration_s: f64,
    /// Seconds from QEMU start to the guest's init reporting READY, per guest and pass.
    pub boot_s: BTreeMap<String, f64>,
    pub rows: Vec<Row>,
    pub summary: Vec<SummaryRow>,
    /// Setup steps of the measured guests (the agent's calibration), per boot.
    pub setup: Vec<SetupStep>,
    /// How the workload was sized (compute rate, synchronization cost, work per step).
    pub sizing: Option<Sizing>,
    /// The agent's calibration at each boot of a measured guest (`gleaner calibrate --json`);
    /// none in results written before the lab recorded it.
    #[serde(default)]
    pub calibrations: Vec<(String, gleaner_agent::CalibrateReport)>,
    /// Cross-vCPU wakeup latencies measured in the guests (Table 2 A, B, C): alone and in the
    /// scenario's conditions. The simulator's `--from-lab` takes its costs from here.
    pub wake_costs: Vec<WakeCosts>,
    /// The workload's arguments natively and in the guests, after sizing.
    pub native_args: Vec<String>,
    pub guest_args: Vec<String>,
    /// QMP `query-stats` per guest and pass (KVM only).
    pub kvm_stats: BTreeMap<String, Vec<(String, f64)>>,
    pub notes: Vec<String>,
}

fn qemu_version() -> String {
    std::process::Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).lines().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Runs `exp` and returns its results (the caller writes them with `report::write`), in
/// named phases: prepare, size the workload, the native baseline, one guest pass per host
/// halt-poll setting, then the report (calibrations, notes, summary).
pub fn run_experiment(exp: &Experiment, opts: &RunOptions) -> anyhow::Result<LabResults> {
    let t0 = Instant::now();
    let started_unix_s = now_unix();
    let mut p = prepare(exp, opts)?;
    let pb = progress_bar(exp, &p, opts.progress);
    let (native_args, guest_args, sizing) = size_workload(exp, &mut p, opts.quick, &pb)?;
    let mut rows = native_baseline(exp, &p, &native_args, &pb)?;
    let guests = guest_passes(exp, &mut p, &guest_args, opts.quick, &pb)?;
    pb.finish_and_clear();
    rows.extend(guests.rows);
    let Guests { setup, boot_s, kvm_stats, mut notes, wake_costs, .. } = guests;
    let calibrations = calibration_notes(&setup, &mut notes);
    failure_notes(&setup, &rows, &mut notes);
    let mut summary = results::summarize(&rows, &RowMode::mode(&exp.stock_mode().name));
    add_bww_bounds(&mut summary, &wake_costs, &mut notes);
    add_compute_shares(&mut summary, &native_args, &guest_args);
    Ok(LabResults {
        experiment: exp.clone(),
        quick: opts.quick,
        accel: p.acc,
        kernel: p.kernel.meta.clone(),
        qemu_version: qemu_version(),
        host_kernel: nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default(),
        gleaner: p.gleaner.display().to_string(),
        pcpus: p.pcpus,
        runs_per_mode: p.runs,
        started_unix_s,
        duration_s: t0.elapsed().as_secs_f64(),
        boot_s,
        rows,
        summary,
        setup,
        sizing,
        calibrations,
        wake_costs,
        native_args,
        guest_args,
        kvm_stats,
        notes,
    })
}

/// The progress bar of a run (hidden without `progress`): one tick per native run and per
/// measured guest step.
fn progress_bar(exp: &Experiment, p: &Prepared, progress: bool) -> ProgressBar {
    let vm_steps = p.runs as usize * exp.modes.len() * if exp.scenario == Scenario::Oc2 { 2 } else { 1 } * p.halt_polls.len();
    let pb = if progress { ProgressBar::new((p.runs as usize + vm_steps) as u64) } else { ProgressBar::hidden() };
    pb.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:25}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb
}

/// What all guest passes produced, with the notes and wakeup costs gathered before them.
struct Guests {
    rows: Vec<Row>,
    setup: Vec<SetupStep>,
    boot_s: BTreeMap<String, f64>,
    kvm_stats: BTreeMap<String, Vec<(String, f64)>>,
    notes: Vec<String>,
    wake_costs: Vec<WakeCosts>,
}

/// One [`guest_pass`] per host halt-poll setting, its rows and provenance merged.
fn guest_passes(exp: &Experiment, p: &mut Prepared, guest_args: &[String], quick: bool, pb: &ProgressBar) -> anyhow::Result<Guests> {
    let mut g = Guests {
        rows: Vec::new(),
        setup: Vec::new(),
        boot_s: BTreeMap::new(),
        kvm_stats: BTreeMap::new(),
        notes: std::mem::take(&mut p.notes),
        wake_costs: std::mem::take(&mut p.wake_costs),
    };
    for hp in p.halt_polls.clone() {
        let pass = guest_pass(exp, p, hp, guest_args, quick, pb)?;
        g.rows.extend(pass_rows(exp, p, hp, &pass));
        g.setup.extend(pass.setup);
        g.boot_s.extend(pass.boot_s);
        g.kvm_stats.extend(pass.kvm_stats);
        g.notes.extend(pass.notes);
        g.wake_costs.extend(pass.wake_costs);
    }
    Ok(g)
}

/// The agent's calibrations at boot (`setup.calibrate`), each with a note; a step that printed
/// no report is a note.
fn calibration_notes(setup: &[SetupStep], notes: &mut Vec<String>) -> Vec<(String, gleaner_agent::CalibrateReport)> {
    let mut calibrations = Vec::new();
    for st in setup.iter().filter(|s| StepKind::parse(&s.step) == StepKind::Setup(Setup::Calibrate) && s.rc == 0) {
        match serde_json::from_str::<gleaner_agent::CalibrateReport>(&st.stdout) {
            Ok(c) => {
                notes.push(format!(
                    "{}: the agent's calibration at boot (outside measured steps, {} ms): {}",
                    st.guest,
                    c.record.as_ref().map_or(0, |r| r.took_ms),
                    c.results.curve.describe()
                ));
                calibrations.push((st.guest.clone(), c));
            }
            Err(e) => notes.push(format!("{}: setup.calibrate printed no calibration report ({e})", st.guest)),
        }
    }
    calibrations
}

/// Notes on setup steps that failed and on runs that failed or printed no bench JSON.
fn failure_notes(setup: &[SetupStep], rows: &[Row], notes: &mut Vec<String>) {
    for st in setup.iter().filter(|s| s.rc != 0) {
        notes.push(format!("{} {} exited {}: {}", st.guest, st.step, st.rc, st.stdout.chars().take(200).collect::<String>()));
    }
    let failed: Vec<&Row> = rows.iter().filter(|r| !r.ok() && r.mode != RowMode::CoRunner).collect();
    if !failed.is_empty() {
        let mut why: Vec<String> = failed.iter().filter_map(|r| r.error.as_ref().map(RunError::to_string)).collect();
        why.dedup();
        notes.push(format!(
            "{} run(s) failed or printed no bench JSON: {}",
            failed.len(),
            why.into_iter().take(3).collect::<Vec<_>>().join("; ")
        ));
    }
}

/// True when the run ended because of SIGINT/SIGTERM/SIGHUP.
pub fn is_interrupt(e: &anyhow::Error) -> bool {
    e.chain().any(|c| matches!(c.downcast_ref::<GuestError>(), Some(GuestError::Interrupted)))
}

#[cfg(test)]
mod tests;
