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
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use gleaner_os::cpuset::CpuSet;
use gleaner_os::kvm::HaltPollGuard;
use gleaner_os::sysfs::Sysfs;
use gleaner_os::BadInput;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::experiment::{Compute, Experiment, Mode, Scenario};
use crate::native::NativeProc;
use crate::qmp;
use crate::results::{self, parse_bench_output, AgentSummary, Row, RunError, SummaryRow};
use gleaner_policy::IdlePolicy;
use gleaner_qemu::accel::{self, AccelChoice};
use gleaner_qemu::guest::{self, shell_quote, GuestSpec};
use gleaner_qemu::kernel::{self as cache, Kernel, KernelMeta};
use gleaner_qemu::session::{self, Session, StepResult};
use gleaner_qemu::{Accel, GuestError};

use crate::keys::{Env, HaltPoll, Instance, RowMode};

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

/// Where the agent policies write their events inside the guest (sent back as an attachment).
pub const GUEST_EVENTS: &str = "/run/gleaner-lab/events.jsonl";

fn cmd_line(gleaner: &Path, args: &[String]) -> String {
    std::iter::once(gleaner.display().to_string()).chain(args.iter().cloned()).map(|a| shell_quote(&a)).collect::<Vec<_>>().join(" ")
}

/// The shell command of a mode: the workload stock, under naive yielders, or under the agent.
pub fn mode_command(gleaner: &Path, workload: &[String], mode: &Mode) -> String {
    let wrap = |prefix: &[&str]| {
        let mut a: Vec<String> = prefix.iter().map(|s| (*s).to_string()).collect();
        a.push(gleaner.display().to_string());
        a.extend(workload.iter().cloned());
        cmd_line(gleaner, &a)
    };
    match (mode.policy(), mode.agent_args()) {
        (IdlePolicy::Yielders, _) => wrap(&["bench", "yielders", "--"]),
        (_, Some(agent)) => {
            let mut a = vec!["run".to_string()];
            a.extend(agent);
            a.extend(["--events".to_string(), GUEST_EVENTS.to_string(), "--".to_string(), gleaner.display().to_string()]);
            a.extend(workload.iter().cloned());
            cmd_line(gleaner, &a)
        }
        (_, None) => cmd_line(gleaner, workload),
    }
}

/// A setup step of a guest's job (named `setup.NAME`): sizing and provenance, not measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    /// The guest's compute rate (the sizing guest).
    Rate,
    /// Table 2's wakeup latencies.
    Wakeup,
    /// One of the sizing guest's synchronization runs.
    Sync(u32),
    /// The agent's calibration at boot.
    Calibrate,
    /// Which cpuidle driver the guest runs.
    Cpuidle,
}

/// What a step of a guest's job is, from its name. The job's shell carries names; the host
/// writes them with [`StepKind::name`] and reads them back with [`StepKind::parse`] only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepKind {
    Setup(Setup),
    /// The co-runner's `n`-th iteration (`co.N`).
    Co(u32),
    /// A measured run, `MODE.REP`.
    Measured {
        mode: String,
        rep: u32,
    },
    /// Anything else (a job the lab did not write).
    Other(String),
}

const SETUP_PREFIX: &str = "setup.";
const CO_PREFIX: &str = "co.";

impl StepKind {
    pub fn name(&self) -> String {
        match self {
            StepKind::Setup(s) => {
                let n = match s {
                    Setup::Rate => "rate".to_string(),
                    Setup::Wakeup => "wakeup".into(),
                    Setup::Sync(i) => format!("sync{i}"),
                    Setup::Calibrate => "calibrate".into(),
                    Setup::Cpuidle => "cpuidle".into(),
                };
                format!("{SETUP_PREFIX}{n}")
            }
            StepKind::Co(n) => format!("{CO_PREFIX}{n}"),
            StepKind::Measured { mode, rep } => format!("{mode}.{rep}"),
            StepKind::Other(s) => s.clone(),
        }
    }

    pub fn parse(name: &str) -> StepKind {
        if let Some(n) = name.strip_prefix(SETUP_PREFIX) {
            // The names `name` writes, read back through it (one table: its match).
            let fixed = [Setup::Rate, Setup::Wakeup, Setup::Calibrate, Setup::Cpuidle].into_iter();
            let setup = fixed
                .map(StepKind::Setup)
                .find(|k| k.name() == name)
                .or_else(|| n.strip_prefix("sync").and_then(|i| i.parse().ok()).map(|i| StepKind::Setup(Setup::Sync(i))));
            return setup.unwrap_or_else(|| StepKind::Other(name.into()));
        }
        if let Some(n) = name.strip_prefix(CO_PREFIX).and_then(|n| n.parse().ok()) {
            return StepKind::Co(n);
        }
        match name.rsplit_once('.').and_then(|(m, r)| Some((m, r.parse().ok()?))) {
            Some((mode, rep)) if !mode.is_empty() => StepKind::Measured { mode: mode.into(), rep },
            _ => StepKind::Other(name.into()),
        }
    }

    pub fn is_setup(&self) -> bool {
        matches!(self, StepKind::Setup(_))
    }
}

/// What a step of the guest fixture's is, to the lab.
pub trait StepKindOf {
    /// [`StepKind::parse`] of the step's name.
    fn kind(&self) -> StepKind;
}

impl StepKindOf for StepResult {
    fn kind(&self) -> StepKind {
        StepKind::parse(&self.step)
    }
}

/// `step NAME CMD` of a job.
fn step_line(kind: &StepKind, cmd: &str) -> String {
    format!("step {} {cmd}\n", kind.name())
}

/// A measured guest's job for one boot: setup steps, then for each rep every mode once, in an
/// order rotated by the rep (`rep` 1: m1 m2 m3, rep 2: m2 m3 m1, ...), so no mode always
/// runs first after boot or right after another.
pub fn guest_job(modes: &[&Mode], reps: &[u32], gleaner: &Path, workload: &[String], wakeup: bool) -> String {
    let mut s = String::new();
    if wakeup {
        s.push_str(&step_line(&StepKind::Setup(Setup::Wakeup), &cmd_line(gleaner, &wakeup_args())));
    }
    if modes.iter().any(|m| m.agent_args().is_some()) {
        s.push_str(&step_line(&StepKind::Setup(Setup::Calibrate), &cmd_line(gleaner, &["calibrate".into(), "--json".into()])));
    }
    if modes.iter().any(|m| matches!(m.policy(), IdlePolicy::Haltpoll { .. })) {
        // Runs that would silently measure stock are not worth their time: stop here when the
        // guest's haltpoll cpuidle driver did not register (the lab reports them as not run).
        s.push_str(&step_line(&StepKind::Setup(Setup::Cpuidle), &format!("cat {CPUIDLE_DRIVER}")));
        s.push_str(&format!("[ \"$(cat {CPUIDLE_DRIVER})\" = haltpoll ] || exit 0\n"));
    }
    for &rep in reps {
        let n = modes.len();
        for i in 0..n {
            let m = modes[(i + rep as usize - 1) % n];
            let name = StepKind::Measured { mode: m.name.clone(), rep }.name();
            s.push_str(&format!("step {name} {}\n", mode_command(gleaner, workload, m)));
            if m.agent_args().is_some() {
                s.push_str(&format!("attach {name} events {GUEST_EVENTS}\n"));
            }
        }
    }
    s
}

const CPUIDLE_DRIVER: &str = "/sys/devices/system/cpu/cpuidle/current_driver";

/// The wakeup measurement of the lab's setup steps: Table 2 settings A, B, C, 300 rounds each
/// 500 us apart (about 1 s natively; a few seconds under TCG next to a co-runner).
fn wakeup_args() -> Vec<String> {
    ["bench", "wakeup", "--setting", "A,B,C", "--rounds", "300", "--period-us", "500", "--json"].iter().map(|s| (*s).to_string()).collect()
}

/// Where a guest's wakeup costs were measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WakePlace {
    /// The sizing guest, alone on the pCPUs.
    #[serde(rename = "alone")]
    Alone,
    /// The measured guest's first boot, next to VM B (`oc`).
    #[serde(rename = "with co-runner")]
    WithCoRunner,
    /// VM A next to VM B (`oc2`).
    #[serde(rename = "next to VM B")]
    NextToVmB,
}

impl WakePlace {
    pub const ALL: [WakePlace; 3] = [WakePlace::Alone, WakePlace::WithCoRunner, WakePlace::NextToVmB];

    /// The words it is written as (in documents and reports).
    pub fn label(self) -> &'static str {
        match self {
            WakePlace::Alone => "alone",
            WakePlace::WithCoRunner => "with co-runner",
            WakePlace::NextToVmB => "next to VM B",
        }
    }

    /// Where the measured guest of `scenario` takes its wakeup measurement.
    pub fn of(scenario: Scenario) -> Self {
        match scenario {
            Scenario::Uc => WakePlace::Alone,
            Scenario::Oc => WakePlace::WithCoRunner,
            Scenario::Oc2 => WakePlace::NextToVmB,
        }
    }
}

impl std::fmt::Display for WakePlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// Where a wakeup measurement was taken and under which host halt-poll setting (`None`: the
/// sizing guest, which runs once per experiment). Written as one string, `alone` or
/// `with co-runner, halt_poll 0`, as results documents have always had it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct WakeContext {
    pub place: WakePlace,
    pub halt_poll: Option<HaltPoll>,
}

const HALT_POLL_SEP: &str = ", halt_poll ";

impl std::fmt::Display for WakeContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.halt_poll {
            Some(hp) => write!(f, "{}{HALT_POLL_SEP}{hp}", self.place),
            None => write!(f, "{}", self.place),
        }
    }
}

impl From<WakeContext> for String {
    fn from(c: WakeContext) -> String {
        c.to_string()
    }
}

impl TryFrom<String> for WakeContext {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        let (place, halt_poll) = match s.split_once(HALT_POLL_SEP) {
            Some((p, hp)) => (p, Some(hp.parse::<HaltPoll>()?)),
            None => (s.as_str(), None),
        };
        let place = WakePlace::ALL.into_iter().find(|w| w.label() == place).ok_or_else(|| {
            let allowed: Vec<String> = WakePlace::ALL.iter().map(|w| format!("'{w}'")).collect();
            format!("wake cost context '{s}': allowed {} (optionally followed by '{HALT_POLL_SEP}SETTING')", allowed.join(", "))
        })?;
        Ok(WakeContext { place, halt_poll })
    }
}

/// Wakeup latencies measured in a guest (setup step `setup.wakeup`), and where.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WakeCosts {
    pub context: WakeContext,
    pub guest: String,
    pub settings: Vec<gleaner_bench::wakeup::SettingResult>,
}

fn wake_costs(context: WakeContext, guest: &str, stdout: &str) -> Option<WakeCosts> {
    let doc: gleaner_measure::report::WakeupDoc = gleaner_measure::report::from_output(stdout).ok()?;
    let mut settings = doc.settings;
    for s in &mut settings {
        s.samples_ns.clear();
    }
    Some(WakeCosts { context, guest: guest.into(), settings })
}

/// `params.iters_per_us` of a bench JSON document.
pub fn calibrated_rate(stdout: &str) -> Option<f64> {
    let doc = parse_bench_output(stdout).ok()?;
    doc.params.get("iters_per_us")?.as_f64().filter(|r| *r > 0.0)
}

/// The co-runner guest's job: the co-runner in a loop until the guest is killed.
pub fn co_runner_job(args: &[String], gleaner: &Path) -> String {
    // The iteration's number comes from the shell: `co.$i` is `StepKind::Co(i)`'s name.
    format!("i=0\nwhile :; do i=$((i+1)); step {CO_PREFIX}$i {}; done\n", cmd_line(gleaner, args))
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

/// Everything resolved before the first run.
struct Prepared {
    gleaner: PathBuf,
    kernel: Kernel,
    busybox: PathBuf,
    runs: u32,
    pcpus: Vec<usize>,
    acc: Accel,
    deadline: Instant,
    halt_polls: Vec<HaltPoll>,
    gamma_native: f64,
    gamma_vm: f64,
    native_instances: usize,
    notes: Vec<String>,
    wake_costs: Vec<WakeCosts>,
}

impl Prepared {
    /// A guest of this experiment, sharing the gleaner binary's directory when the guest
    /// would not see it (a checkout under /tmp).
    fn spec(&self, exp: &Experiment, name: &str, job: String, kernel_args: &[String]) -> GuestSpec {
        let mut g = GuestSpec::new(name)
            .vcpus(exp.vcpus)
            .memory_mib(exp.memory_mib)
            .accel(self.acc)
            .pin(Some(self.pcpus.clone()))
            .cgroup(exp.guest_cgroup)
            .kernel_args(kernel_args.to_vec())
            .job(job);
        if let Some(dir) = self.gleaner.parent() {
            g = g.share(dir);
        }
        g
    }
}

fn prepare(exp: &Experiment, opts: &RunOptions) -> anyhow::Result<Prepared> {
    if !opts.gleaner.is_file() {
        return Err(BadInput::new("--gleaner", opts.gleaner.display(), "an existing gleaner binary (cargo build --release)").into());
    }
    let gleaner = opts.gleaner.canonicalize().with_context(|| opts.gleaner.display().to_string())?;
    if !guest::shareable(&gleaner) {
        return Err(BadInput::new("--gleaner", gleaner.display(), "a path outside /dev, /proc and /sys").into());
    }
    let kernel = cache::find_kernel(&opts.cache_dir, opts.kernel.as_deref())?;
    let busybox = guest::find_busybox()?;
    let runs = opts.runs.unwrap_or_else(|| exp.runs_for(opts.quick));
    if runs == 0 {
        return Err(BadInput::new("--runs", runs, ">= 1").into());
    }
    let allowed: Vec<usize> = gleaner_measure::measure::allowed_cpus().into_iter().map(|c| c as usize).collect();
    let pcpus = match opts.pcpus.as_ref().or(exp.pcpus.as_ref()) {
        Some(list) => {
            let p: Vec<usize> = list.iter().map(|c| c as usize).collect();
            if let Some(c) = p.iter().find(|c| !allowed.contains(c)) {
                return Err(BadInput::new("pcpus", list, format!("CPUs this process may use (not {c})")).into());
            }
            p
        }
        None => allowed.iter().copied().take(exp.vcpus as usize).collect(),
    };
    let np = pcpus.len() as f64;
    let acc = accel::resolve(opts.accel, &kernel, &busybox)?;
    let mut notes = Vec::new();
    if acc == Accel::Tcg {
        notes.push("TCG (binary translation) was used: guest CPU time includes emulation, so d_eta_r and d_eta_t measure TCG+virtualization overhead, not KVM's. Compare modes with each other; host halt polling does not apply, and guests see no steal time.".into());
    }
    notes.push("CPU time stands in for cycles (no hardware counters): natively the workload's rusage, for guests the host-side CPU time of all QEMU threads during the step.".into());
    notes.push("vCPU halts are counted host-side as the vCPU threads' voluntary context switches (a halted vCPU's thread sleeps; a wait for QEMU's lock counts too).".into());
    let (native_instances, gamma_native, gamma_vm) = match exp.scenario {
        Scenario::Uc => (1, np, f64::from(exp.vcpus).min(np)),
        Scenario::Oc => (1, np, np / 2.0),
        Scenario::Oc2 => (2, np / 2.0, np / 2.0),
    };
    let halt_polls = if acc == Accel::Kvm { exp.halt_poll.clone() } else { vec![HaltPoll::NotApplicable] };
    let deadline = Instant::now() + Duration::from_secs(exp.timeout_for(opts.quick));
    Ok(Prepared {
        gleaner,
        kernel,
        busybox,
        runs,
        pcpus,
        acc,
        deadline,
        halt_polls,
        gamma_native,
        gamma_vm,
        native_instances,
        notes,
        wake_costs: Vec::new(),
    })
}

fn left(d: Instant) -> String {
    let s = d.saturating_duration_since(Instant::now()).as_secs();
    format!("{}m{:02}s left", s / 60, s % 60)
}

/// `args` with `flag VALUE` set (an earlier `flag V` or `flag=V` removed).
pub fn with_flag(args: &[String], flag: &str, value: &str) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len() + 2);
    let mut skip = false;
    for a in args {
        if skip {
            skip = false;
        } else if a == flag {
            skip = true;
        } else if !a.starts_with(&format!("{flag}=")) {
            out.push(a.clone());
        }
    }
    out.extend([flag.to_string(), value.to_string()]);
    out
}

/// The typed parameters of a `bench workload NAME ...` argument list; `None` for other
/// commands.
pub fn bench_workload_params(args: &[String]) -> Option<Result<gleaner_bench::workload::WorkloadParams, BadInput>> {
    #[derive(clap::Parser)]
    struct P {
        #[command(flatten)]
        a: gleaner_bench::WorkloadArgs,
    }
    use clap::Parser as _;
    if args.len() < 3 || args[0] != "bench" || args[1] != "workload" {
        return None;
    }
    let parsed = P::try_parse_from(std::iter::once("workload").chain(args[2..].iter().map(String::as_str)))
        .map_err(|e| BadInput::new("workload", args.join(" "), format!("valid `gleaner bench workload` arguments ({})", e.kind())));
    Some(parsed.and_then(|p| gleaner_bench::workload_params(&p.a).map(|x| x.1)))
}

/// Median CPU time per item, us, of bench documents (runs that failed are skipped).
fn cpu_per_item_us(outputs: &[String]) -> Option<f64> {
    let v: Vec<f64> = outputs
        .iter()
        .filter_map(|o| {
            let d = parse_bench_output(o).ok()?;
            let r = d.runs.first()?;
            Some(r.cpu_ns() as f64 / 1e3 / r.items.filter(|&n| n > 0)? as f64)
        })
        .collect();
    gleaner_policy::stats::median(&v).ok()
}

/// What sizing found (kept in the results).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sizing {
    pub compute: Compute,
    pub native_iters_per_us: f64,
    pub guest_iters_per_us: Option<f64>,
    /// CPU time per item with no compute (synchronization alone), us: natively and in a guest
    /// alone on the pCPUs.
    pub native_sync_us_per_item: Option<f64>,
    pub guest_sync_us_per_item: Option<f64>,
    /// `work_us` natively and in the guests.
    pub native_work_us: f64,
    pub guest_work_us: f64,
}

/// Items of a sizing run (no compute: synchronization alone).
const SIZING_ITEMS: u64 = 2000;
const SIZING_RUNS: u32 = 3;

/// The workload's arguments for (native, guest) runs, fixing the compute per item (see
/// [`Compute`]): the compute rate is measured natively and, for `balanced`, in one guest
/// booted alone on the pCPUs, with the synchronization cost per item on both sides.
fn size_workload(
    exp: &Experiment,
    p: &mut Prepared,
    quick: bool,
    pb: &ProgressBar,
) -> anyhow::Result<(Vec<String>, Vec<String>, Option<Sizing>)> {
    let w = exp.workload_args(quick);
    let params = match bench_workload_params(&w) {
        None => return Ok((w.clone(), w, None)),
        Some(p) => p?,
    };
    if params.iters_per_us.is_some() {
        return Ok((w.clone(), w, None));
    }
    pb.set_message(format!("{}: measuring the compute rate natively", exp.name));
    let rate_args = vec!["bench".to_string(), "rate".into(), "--trials".into(), "20".into()];
    let (_, out, _) = NativeProc::spawn(&p.gleaner, &rate_args, &p.pcpus)?.wait(p.deadline, "native compute rate")?;
    let native_rate: f64 =
        out.trim().parse().map_err(|_| anyhow::anyhow!("`gleaner bench rate` printed {:?}, not a number", out.trim()))?;
    let native = with_flag(&w, "--iters-per-us", &format!("{native_rate:.3}"));
    let mut sizing = Sizing {
        compute: exp.compute,
        native_iters_per_us: native_rate,
        guest_iters_per_us: None,
        native_sync_us_per_item: None,
        guest_sync_us_per_item: None,
        native_work_us: params.work_us,
        guest_work_us: params.work_us,
    };
    if exp.compute == Compute::Native || params.work_us == 0.0 {
        p.notes.push(format!("compute per item fixed for native and guest runs with --iters-per-us {native_rate:.3} (measured natively): the same instructions everywhere"));
        return Ok((native.clone(), native, Some(sizing)));
    }
    // Synchronization cost per item: the workload with no compute, natively...
    let sync_args = with_flag(&with_flag(&w, "--work-us", "0"), "--items", &SIZING_ITEMS.to_string());
    pb.set_message(format!("{}: measuring the synchronization cost per item natively", exp.name));
    let mut native_out = Vec::new();
    for _ in 0..SIZING_RUNS {
        native_out.push(NativeProc::spawn(&p.gleaner, &sync_args, &p.pcpus)?.wait(p.deadline, "native sizing")?.1);
    }
    // ...and in one guest alone on the pCPUs, with the guest's compute rate.
    pb.set_message(format!("{}: sizing guest (compute rate, synchronization cost per item)", exp.name));
    let mut job = step_line(&StepKind::Setup(Setup::Rate), &cmd_line(&p.gleaner, &rate_args))
        + &step_line(&StepKind::Setup(Setup::Wakeup), &cmd_line(&p.gleaner, &wakeup_args()));
    for i in 0..SIZING_RUNS {
        job.push_str(&step_line(&StepKind::Setup(Setup::Sync(i)), &cmd_line(&p.gleaner, &sync_args)));
    }
    let spec = p.spec(exp, &format!("lab-{}-sizing", exp.name), job, &[]);
    let timeout = p.deadline.saturating_duration_since(Instant::now());
    let (_, steps, _) = session::run_single(&p.kernel, &p.busybox, &spec, timeout)?;
    let guest_rate = steps.iter().find(|s| s.kind() == StepKind::Setup(Setup::Rate)).and_then(|s| s.stdout.trim().parse::<f64>().ok());
    match steps.iter().find(|s| s.kind() == StepKind::Setup(Setup::Wakeup)) {
        Some(s) => match wake_costs(WakeContext { place: WakePlace::Alone, halt_poll: None }, spec.name(), &s.stdout) {
            Some(w) => p.wake_costs.push(w),
            None => p.notes.push(format!(
                "{}: setup.wakeup (rc {}) printed no wakeup document: {}",
                spec.name(),
                s.rc,
                s.stdout.chars().take(200).collect::<String>()
            )),
        },
        None => p.notes.push(format!(
            "{}: no setup.wakeup step (steps: {})",
            spec.name(),
            steps.iter().map(|s| s.step.as_str()).collect::<Vec<_>>().join(", ")
        )),
    }
    let guest_out: Vec<String> =
        steps.iter().filter(|s| matches!(s.kind(), StepKind::Setup(Setup::Sync(_)))).map(|s| s.stdout.clone()).collect();
    let (Some(gr), Some(ns), Some(gs)) = (guest_rate, cpu_per_item_us(&native_out), cpu_per_item_us(&guest_out)) else {
        anyhow::bail!(
            "sizing the workload failed (guest steps: {})",
            steps.iter().map(|s| format!("{} rc {}", s.step, s.rc)).collect::<Vec<_>>().join(", ")
        );
    };
    let k = (gs / ns.max(1e-3)).clamp(1.0, 1000.0);
    sizing.guest_iters_per_us = Some(gr);
    sizing.native_sync_us_per_item = Some(ns);
    sizing.guest_sync_us_per_item = Some(gs);
    sizing.guest_work_us = (params.work_us * k * 10.0).round() / 10.0;
    p.notes.push(format!(
        "balanced compute: synchronization alone costs {ns:.1} us of CPU per item natively and {gs:.1} us in a guest alone on the pCPUs ({k:.1}x), so guest runs compute {:.1} us per step where native runs compute {} us, at each side's measured rate ({native_rate:.0} and {gr:.0} iterations/us): both spend the same share of their CPU on synchronization",
        sizing.guest_work_us, params.work_us
    ));
    let guest = with_flag(&with_flag(&w, "--iters-per-us", &format!("{gr:.3}")), "--work-us", &format!("{}", sizing.guest_work_us));
    Ok((native, guest, Some(sizing)))
}

fn native_baseline(exp: &Experiment, p: &Prepared, wargs: &[String], pb: &ProgressBar) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for rep in 1..=p.runs {
        pb.set_message(format!("{}: native x{} run {rep}/{} ({})", exp.name, p.native_instances, p.runs, left(p.deadline)));
        let procs: Vec<NativeProc> =
            (0..p.native_instances).map(|_| NativeProc::spawn(&p.gleaner, wargs, &p.pcpus)).collect::<Result<_, _>>()?;
        for (i, proc) in procs.into_iter().enumerate() {
            let (rc, out, wall) = proc.wait(p.deadline, "native baseline")?;
            let mut row = Row {
                env: Env::Native,
                instance: Instance::Native(u32::try_from(i + 1).unwrap_or(u32::MAX)),
                mode: RowMode::Native,
                halt_poll: HaltPoll::NotApplicable,
                rep,
                rc,
                gamma: p.gamma_native,
                end_s: wall.as_secs_f64(),
                ..Default::default()
            };
            row.fill_from_bench(&out);
            if rc != 0 && row.error.is_none() {
                row.error = Some(RunError::Failed(format!("exit {rc}: {}", out.chars().take(300).collect::<String>())));
            }
            rows.push(row);
        }
        pb.inc(1);
    }
    Ok(rows)
}

/// One measured step, with its guest role and session-clock window.
struct Measured {
    instance: Instance,
    step: StepResult,
    begin_s: f64,
    end_s: f64,
}

/// What one halt-poll pass of the guests produced.
#[derive(Default)]
struct Pass {
    measured: Vec<Measured>,
    co_runner: Vec<Measured>,
    setup: Vec<SetupStep>,
    boot_s: BTreeMap<String, f64>,
    kvm_stats: BTreeMap<String, Vec<(String, f64)>>,
    notes: Vec<String>,
    wake_costs: Vec<WakeCosts>,
    /// Runs a boot was to do but did not, and why: (instance, mode, rep, reason).
    not_run: Vec<(Instance, String, u32, String)>,
}

/// The boots of the measured guest: (rep numbers, boot group index). One boot for all reps
/// when every mode shares a kernel command line; else one boot per group per round, with the
/// group order rotated by round.
fn boot_plan(groups: usize, runs: u32) -> Vec<(Vec<u32>, usize)> {
    if groups == 1 {
        return vec![((1..=runs).collect(), 0)];
    }
    (1..=runs).flat_map(|r| (0..groups).map(move |i| (vec![r], (i + r as usize - 1) % groups))).collect()
}

/// One halt-poll pass of the guests, in named steps: set the host knob, start the co-runner
/// (oc), boot the measured guest(s) once per entry of the boot plan and collect each boot,
/// let the co-runner finish its iteration and collect it, read KVM statistics, kill all.
fn guest_pass(exp: &Experiment, p: &Prepared, hp: HaltPoll, wargs: &[String], quick: bool, pb: &ProgressBar) -> anyhow::Result<Pass> {
    let _guard = set_halt_poll(p, hp)?;
    let mut pass = Pass::default();
    let mut s = Session::new(p.kernel.clone(), p.busybox.clone());
    let cx = PassCtx { exp, p, hp, epoch: Instant::now() };
    let mut tick = progress_tick(&cx, pb);
    let co = start_co_runner(&cx, quick, &mut s, &mut tick)?;
    let groups = exp.boot_groups();
    let plan = boot_plan(groups.len(), p.runs);
    for (k, (reps, gi)) in plan.iter().enumerate() {
        let (kargs, modes) = &groups[*gi];
        let boot = Boot { reps, modes, kargs, job: guest_job(modes, reps, &p.gleaner, wargs, k == 0) };
        let suffix = if plan.len() == 1 { String::new() } else { format!("-{}", k + 1) };
        let ids = boot_measured(&cx, &mut s, &boot, &suffix, co, &mut tick)?;
        for (inst, id) in ids {
            collect_measured(&cx, &mut s, (inst, id), &boot, &mut pass);
        }
    }
    if let Some(b) = co {
        finish_co_runner(&cx, &mut s, b, &mut pass, &mut tick)?;
    }
    if p.acc == Accel::Kvm {
        collect_kvm_stats(&s, hp, &mut pass);
    }
    s.kill_all();
    Ok(pass)
}

/// What every step of a pass reads: the experiment, what was prepared, the pass's halt-poll
/// setting, and the instant its session clock starts from (steps' `begin_s`/`end_s`).
struct PassCtx<'a> {
    exp: &'a Experiment,
    p: &'a Prepared,
    hp: HaltPoll,
    epoch: Instant,
}

/// Sets the host's `kvm.halt_poll_ns` to `hp` for the pass (KVM and a number only; `n/a`
/// under TCG); restored when the guard drops.
fn set_halt_poll(p: &Prepared, hp: HaltPoll) -> anyhow::Result<Option<HaltPollGuard>> {
    Ok(match hp {
        HaltPoll::Ns(v) if p.acc == Accel::Kvm => Some(HaltPollGuard::set(&Sysfs::new(), v)?),
        _ => None,
    })
}

/// The progress bar's update while a session runs: each running guest's step and the
/// measured steps done so far.
fn progress_tick<'a>(cx: &'a PassCtx, pb: &'a ProgressBar) -> impl FnMut(&Session) + 'a {
    let (exp, p, hp) = (cx.exp, cx.p, cx.hp);
    let before = pb.position();
    move |s: &Session| {
        let parts: Vec<String> = s
            .guests
            .iter()
            .zip(&s.states)
            .filter(|(_, st)| st.done.is_none())
            .map(|(g, st)| {
                let what = match (st.ready_at, st.current_step()) {
                    (None, _) => "booting".to_string(),
                    (Some(_), Some(c)) => c.to_string(),
                    (Some(_), None) => "ready".into(),
                };
                format!("{} {what}", g.name.trim_start_matches("lab-"))
            })
            .collect();
        let now = s
            .states
            .iter()
            .map(|x| x.steps.iter().filter(|st| !matches!(st.0.kind(), StepKind::Co(_) | StepKind::Setup(_))).count())
            .sum::<usize>();
        pb.set_position(before + now as u64);
        pb.set_message(format!("{} [{}, halt_poll {hp}]: {} ({})", exp.name, p.acc, parts.join(", "), left(p.deadline)));
    }
}

/// oc: boots VM B with the co-runner in a loop and waits until its first iteration runs.
fn start_co_runner(cx: &PassCtx, quick: bool, s: &mut Session, tick: &mut dyn FnMut(&Session)) -> anyhow::Result<Option<usize>> {
    let (exp, p) = (cx.exp, cx.p);
    if exp.scenario != Scenario::Oc {
        return Ok(None);
    }
    let args = exp.co_runner_args(quick).unwrap_or_default();
    let b = s.start(&p.spec(exp, &format!("lab-{}-B", exp.name), co_runner_job(&args, &p.gleaner), &[]))?;
    s.drive(
        p.deadline,
        "the co-runner to start in VM B",
        &[b],
        &|s| s.states[b].current_step().is_some() || !s.states[b].steps.is_empty(),
        tick,
    )?;
    Ok(Some(b))
}

/// One boot of the measured guest(s): which reps of which modes, under which kernel
/// command line, and the job that runs them.
struct Boot<'a> {
    reps: &'a [u32],
    modes: &'a [&'a Mode],
    kargs: &'a [String],
    job: String,
}

/// Boots VM A (and for oc2 VM B) for `boot` and drives the session until their jobs are done
/// (the co-runner, if any, must keep running). Returns (instance, guest id) of each.
fn boot_measured(
    cx: &PassCtx,
    s: &mut Session,
    boot: &Boot,
    suffix: &str,
    co: Option<usize>,
    tick: &mut dyn FnMut(&Session),
) -> anyhow::Result<Vec<(Instance, usize)>> {
    let (exp, p) = (cx.exp, cx.p);
    let mut ids = vec![(Instance::A, s.start(&p.spec(exp, &format!("lab-{}-A{suffix}", exp.name), boot.job.clone(), boot.kargs))?)];
    if exp.scenario == Scenario::Oc2 {
        ids.push((Instance::B, s.start(&p.spec(exp, &format!("lab-{}-B{suffix}", exp.name), boot.job.clone(), boot.kargs))?));
    }
    let mut needed: Vec<usize> = ids.iter().map(|x| x.1).collect();
    needed.extend(co);
    let targets: Vec<usize> = ids.iter().map(|x| x.1).collect();
    s.drive(p.deadline, "the workload's steps", &needed, &|s| targets.iter().all(|&g| s.states[g].done.is_some()), tick)?;
    Ok(ids)
}

/// Collects one measured guest after its boot: the runs it did not do (and why), its boot
/// time, its wakeup costs, setup steps and measured steps; then waits for QEMU to exit.
fn collect_measured(cx: &PassCtx, s: &mut Session, (inst, id): (Instance, usize), boot: &Boot, pass: &mut Pass) {
    let (exp, p, hp, epoch) = (cx.exp, cx.p, cx.hp, cx.epoch);
    let name = s.guests[id].name.clone();
    let st = &s.states[id];
    let cpuidle = st.steps.iter().find(|x| x.0.kind() == StepKind::Setup(Setup::Cpuidle)).map(|x| x.0.stdout.trim().to_string());
    for &rep in boot.reps {
        for m in boot.modes {
            let step = StepKind::Measured { mode: m.name.clone(), rep }.name();
            if !st.steps.iter().any(|x| x.0.step == step) {
                let why = match (&cpuidle, m.policy()) {
                    (Some(d), IdlePolicy::Haltpoll { .. }) if d != "haltpoll" => {
                        format!("the guest's cpuidle driver is {d} (not haltpoll): {}", haltpoll_reason(p.acc))
                    }
                    _ => {
                        format!("{name}'s job ended before step {step} (rc {})", st.done.unwrap_or(-1))
                    }
                };
                pass.not_run.push((inst, m.name.clone(), rep, why));
            }
        }
    }
    if let Some(bs) = s.boot_s(id) {
        pass.boot_s.insert(format!("{name}@{hp}"), bs);
    }
    for (r, bi, ei) in &s.states[id].steps {
        let kind = r.kind();
        if kind == StepKind::Setup(Setup::Wakeup) {
            let context = WakeContext { place: WakePlace::of(exp.scenario), halt_poll: Some(hp) };
            if let Some(w) = wake_costs(context, &name, &r.stdout) {
                pass.wake_costs.push(w);
            }
        }
        if kind.is_setup() {
            pass.setup.push(SetupStep { guest: name.clone(), step: r.step.clone(), rc: r.rc, stdout: r.stdout.trim().to_string() });
            continue;
        }
        pass.measured.push(Measured {
            instance: inst,
            step: r.clone(),
            begin_s: (*bi - epoch).as_secs_f64(),
            end_s: (*ei - epoch).as_secs_f64(),
        });
    }
    s.guests[id].wait_exit(Duration::from_secs(5));
}

/// Lets the co-runner finish the iteration under way, then collects its iterations and boot
/// time. An iteration that spans A's whole last step would otherwise never be counted, and
/// that step would have no co-runner rate (seen with short steps under load). Best effort.
fn finish_co_runner(cx: &PassCtx, s: &mut Session, b: usize, pass: &mut Pass, tick: &mut dyn FnMut(&Session)) -> anyhow::Result<()> {
    let (p, hp, epoch) = (cx.p, cx.hp, cx.epoch);
    let a_end = pass.measured.iter().map(|m| m.end_s).fold(0.0, f64::max);
    let wait = p.deadline.min(Instant::now() + Duration::from_secs(30));
    let ended_after = |s: &Session| s.states[b].steps.last().is_some_and(|x| (x.2 - epoch).as_secs_f64() >= a_end);
    match s.drive(wait, "the co-runner's iteration in VM B", &[b], &ended_after, tick) {
        Ok(()) | Err(GuestError::Timeout { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    for (r, bi, ei) in &s.states[b].steps {
        pass.co_runner.push(Measured {
            instance: Instance::B,
            step: r.clone(),
            begin_s: (*bi - epoch).as_secs_f64(),
            end_s: (*ei - epoch).as_secs_f64(),
        });
    }
    if let Some(bs) = s.boot_s(b) {
        pass.boot_s.insert(format!("{}@{hp}", s.guests[b].name), bs);
    }
    Ok(())
}

/// QMP `query-stats` of every guest of the session (KVM only); a failure is a note.
fn collect_kvm_stats(s: &Session, hp: HaltPoll, pass: &mut Pass) {
    for g in &s.guests {
        let stats = qmp::Qmp::connect(&g.qmp_path(), Duration::from_secs(5))
            .and_then(|mut q| q.execute("query-stats", Some(serde_json::json!({"target": "vcpu"}))))
            .map(|v| qmp::flatten_stats(&v));
        match stats {
            Ok(v) => {
                pass.kvm_stats.insert(format!("{}@{hp}", g.name), v);
            }
            Err(e) => pass.notes.push(format!("query-stats on {}: {e}", g.name)),
        }
    }
}

/// The rows of a pass: measured steps (with the co-runner's rate during each) and the
/// co-runner's iterations.
fn pass_rows(exp: &Experiment, p: &Prepared, hp: HaltPoll, pass: &Pass) -> Vec<Row> {
    let co_iters: Vec<(f64, f64, u64)> = pass
        .co_runner
        .iter()
        .filter(|m| m.step.rc == 0)
        .filter_map(|m| Some((m.begin_s, m.end_s, parse_bench_output(&m.step.stdout).ok()?.runs.first()?.items?)))
        .collect();
    let host_fields = |row: &mut Row, r: &StepResult| {
        let mut vcpus: Vec<(u32, u64)> = r.vcpu_threads().filter_map(|t| t.vcpu().map(|v| (v, t.run_ns))).collect();
        vcpus.sort_unstable();
        row.host_cpu_ns = Some(r.host_cpu_ns());
        row.host_vcpu_ns = vcpus.into_iter().map(|v| v.1).collect();
        row.host_vcpu_wait_ns = Some(r.vcpu_threads().map(|t| t.wait_ns).sum());
        row.vcpu_sleeps = Some(r.vcpu_threads().map(|t| t.voluntary).sum());
        row.vcpu_preemptions = Some(r.vcpu_threads().map(|t| t.involuntary).sum());
    };
    let mut rows = Vec::new();
    for m in &pass.measured {
        let r = &m.step;
        let (mode_name, rep) = r.step.rsplit_once('.').unwrap_or((r.step.as_str(), "0"));
        let mode = exp.modes.iter().find(|x| x.name == mode_name);
        let policy = mode.map(Mode::policy);
        let mut row = Row {
            env: Env::Vm,
            instance: m.instance,
            mode: RowMode::mode(mode_name),
            policy,
            halt_poll: hp,
            rep: rep.parse().unwrap_or(0),
            rc: r.rc,
            begin_s: m.begin_s,
            end_s: m.end_s,
            gamma: p.gamma_vm,
            co_runner_rate: results::co_runner_rate(m.begin_s, m.end_s, &co_iters),
            // An agent that decided nothing writes no events: an empty summary, not a failure.
            agent: policy
                .filter(|x| x.agent_args().is_some())
                .map(|_| r.attachments.get("events").map_or_else(AgentSummary::default, |e| AgentSummary::from_events(e))),
            ..Default::default()
        };
        host_fields(&mut row, r);
        row.fill_from_bench(&r.stdout);
        if row.error.is_none() && matches!(policy, Some(IdlePolicy::Haltpoll { .. })) && row.cpuidle_driver.as_deref() != Some("haltpoll") {
            row.error = Some(RunError::Failed(format!(
                "the guest's cpuidle driver is {} (not haltpoll): {}",
                row.cpuidle_driver.as_deref().unwrap_or("unknown"),
                haltpoll_reason(p.acc)
            )));
        }
        rows.push(row);
    }
    for (inst, mode, rep, why) in &pass.not_run {
        let policy = exp.modes.iter().find(|x| &x.name == mode).map(Mode::policy);
        rows.push(Row {
            env: Env::Vm,
            instance: *inst,
            mode: RowMode::mode(mode),
            policy,
            halt_poll: hp,
            rep: *rep,
            rc: -1,
            gamma: p.gamma_vm,
            error: Some(RunError::NotRun(why.clone())),
            ..Default::default()
        });
    }
    for m in &pass.co_runner {
        let mut row = Row {
            env: Env::Vm,
            instance: Instance::B,
            mode: RowMode::CoRunner,
            halt_poll: hp,
            rep: match m.step.kind() {
                StepKind::Co(n) => n,
                _ => 0,
            },
            rc: m.step.rc,
            begin_s: m.begin_s,
            end_s: m.end_s,
            gamma: p.gamma_vm,
            ..Default::default()
        };
        host_fields(&mut row, &m.step);
        row.fill_from_bench(&m.step.stdout);
        rows.push(row);
    }
    rows
}

/// The share of the CPU that was the workload's compute, per row (see
/// [`SummaryRow::compute_share`]): for VM rows of the vCPU threads' host CPU, for native rows of
/// the workload's own CPU time. Only for bench kernels with a fixed number of compute steps.
fn add_compute_shares(summary: &mut [SummaryRow], native_args: &[String], guest_args: &[String]) {
    let compute_us = |args: &[String]| -> Option<f64> {
        let p = bench_workload_params(args)?.ok()?;
        let w = gleaner_bench::workload::Workload::parse(args.get(2)?).ok()?;
        Some(w.compute_steps_per_item(p.threads)? * p.work_us)
    };
    let (native, guest) = (compute_us(native_args), compute_us(guest_args));
    for s in summary.iter_mut() {
        let (compute, cpu_s) = if s.mode == RowMode::Native {
            (native, s.guest_cpu_s)
        } else {
            (guest, (!s.host_vcpu_s.is_empty()).then(|| s.host_vcpu_s.iter().sum::<f64>()))
        };
        let (Some(c), Some(cpu), Some(n)) = (compute, cpu_s, s.items.filter(|&n| n > 0.0)) else {
            continue;
        };
        let per_item = cpu * 1e6 / n;
        if per_item > 0.0 {
            s.compute_share = Some((c / per_item).min(1.0));
        }
    }
}

/// Mean wakeup latency of a setting, us.
fn mean_us(w: &WakeCosts, setting: gleaner_bench::wakeup::Setting) -> Option<f64> {
    w.settings.iter().find(|s| s.setting == setting)?.mean_us
}

/// The blocked-waiter bound of each stock row, from the wakeup costs measured in the
/// scenario's conditions (the first non-`alone` measurement, else `alone`).
fn add_bww_bounds(summary: &mut [SummaryRow], wake: &[WakeCosts], notes: &mut Vec<String>) {
    use gleaner_bench::wakeup::Setting;
    let Some(w) = wake.iter().find(|w| w.context.place != WakePlace::Alone).or_else(|| wake.first()) else {
        return;
    };
    let (Some(a), Some(c)) = (mean_us(w, Setting::A), mean_us(w, Setting::C)) else {
        return;
    };
    let penalty = c - a;
    for s in summary.iter_mut().filter(|s| s.policy == Some(IdlePolicy::Stock)) {
        s.bww_bound = results::bww_bound(s, penalty);
        if let (Some(b), Some(h), Some(t)) = (s.bww_bound, s.sleeps_per_item, s.wall_per_item_us()) {
            notes.push(format!(
                "blocked-waiter bound, VM {} {} (halt poll {}): stock halts {h:.2} times per item and takes {t:.0} us per item; a halted vCPU wakes in {c:.0} us on average vs {a:.0} us on the same vCPU ({}), so removing every halt's penalty could speed it up at most {b:.2}x",
                s.instance, s.mode, s.halt_poll, w.context
            ));
        }
    }
}

/// Why the guest's cpuidle-haltpoll driver did not load.
fn haltpoll_reason(acc: Accel) -> &'static str {
    match acc {
        Accel::Tcg => "cpuidle-haltpoll registers only when kvm_para_available(), i.e. the guest sees KVM's paravirtual CPUID signature, which QEMU provides only with -accel kvm",
        Accel::Kvm => "cpuidle-haltpoll did not register (check the guest kernel's CONFIG_HALTPOLL_CPUIDLE and the console)",
    }
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
                    gleaner_agent::agent::setup::describe_curve(&c.results.curve)
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
mod tests {
    use super::*;

    const G: &str = "/work/main/target/release/gleaner";

    #[test]
    fn jobs_rotate_modes_wrap_the_agent_and_attach_its_events() {
        let exp = Experiment::load("oc").unwrap();
        let groups = exp.boot_groups();
        assert_eq!(groups.len(), 1, "oc's modes share one boot");
        let w = exp.workload_args(true);
        assert_eq!(w, ["bench", "workload", "pipeline", "--json", "--items", "3000"]);
        let job = guest_job(&groups[0].1, &[1, 2], Path::new(G), &w, false);
        let lines: Vec<&str> = job.lines().collect();
        assert_eq!(lines[0], format!("step setup.calibrate {G} calibrate --json"));
        let steps: Vec<&str> = lines
            .iter()
            .filter(|l| l.starts_with("step ") && !l.starts_with("step setup."))
            .map(|l| l.split(' ').nth(1).unwrap())
            .collect();
        assert_eq!(steps, ["off.1", "gleaner.1", "gleaner.2", "off.2"]);
        assert!(lines.contains(&format!("step off.1 {G} bench workload pipeline --json --items 3000").as_str()), "{job}");
        assert!(
            lines.contains(
                &format!("step gleaner.1 {G} run --events {GUEST_EVENTS} -- {G} bench workload pipeline --json --items 3000").as_str()
            ),
            "{job}"
        );
        assert!(lines.contains(&format!("attach gleaner.1 events {GUEST_EVENTS}").as_str()));
        let co = co_runner_job(&exp.co_runner_args(true).unwrap(), Path::new(G));
        assert!(co.contains(&format!("step co.$i {G} bench workload matmul --json --quick")));
    }

    #[test]
    fn every_policy_has_its_command() {
        let w = vec!["bench".to_string(), "workload".into(), "condvar".into()];
        let cmd = |p| mode_command(Path::new("/g"), &w, &Mode::of(p));
        assert_eq!(cmd(IdlePolicy::Stock), "/g bench workload condvar");
        assert_eq!(cmd(IdlePolicy::Poll), "/g bench workload condvar");
        assert_eq!(cmd(IdlePolicy::Yielders), "/g bench yielders -- /g bench workload condvar");
        assert_eq!(cmd(IdlePolicy::Retention), format!("/g run --no-consolidation --events {GUEST_EVENTS} -- /g bench workload condvar"));
        assert_eq!(cmd(IdlePolicy::Consolidation), format!("/g run --no-retention --events {GUEST_EVENTS} -- /g bench workload condvar"));
        let m = Mode { name: "g2".into(), policy: Some(IdlePolicy::Gleaner), agent: Some(vec!["--period-ms".into(), "100".into()]) };
        assert_eq!(
            mode_command(Path::new("/g"), &w, &m),
            format!("/g run --period-ms 100 --events {GUEST_EVENTS} -- /g bench workload condvar")
        );
    }

    #[test]
    fn flags_are_replaced_not_repeated() {
        let a: Vec<String> = ["bench", "workload", "pipeline", "--work-us", "10", "--items=5"].iter().map(|s| s.to_string()).collect();
        assert_eq!(with_flag(&a, "--work-us", "190"), ["bench", "workload", "pipeline", "--items=5", "--work-us", "190"]);
        assert_eq!(with_flag(&a, "--items", "7"), ["bench", "workload", "pipeline", "--work-us", "10", "--items", "7"]);
        let p = bench_workload_params(&a).unwrap().unwrap();
        assert_eq!((p.work_us, p.items), (10.0, 5));
        assert!(bench_workload_params(&["bench".into(), "workload".into(), "nope".into()]).unwrap().is_err());
        assert!(bench_workload_params(&["bench".into(), "rate".into()]).is_none());
    }

    #[test]
    fn compute_share_is_compute_over_the_cpu_burned_per_item() {
        let args = |w: &str| -> Vec<String> {
            ["bench", "workload", "pipeline", "--threads", "2", "--work-us", w].iter().map(|s| s.to_string()).collect()
        };
        let mut rows = vec![
            // Natively 1000 items, 0.04 s of CPU: 40 us per item, 2 x 10 us compute = 50%.
            SummaryRow { mode: RowMode::Native, items: Some(1000.0), guest_cpu_s: Some(0.04), ..Default::default() },
            // In the guest 2 x 100 us per item out of (0.3 + 0.5) s / 1000 = 800 us: 25%.
            SummaryRow { mode: RowMode::mode("stock"), items: Some(1000.0), host_vcpu_s: vec![0.3, 0.5], ..Default::default() },
            SummaryRow { mode: RowMode::mode("gleaner"), items: None, host_vcpu_s: vec![0.3], ..Default::default() },
        ];
        add_compute_shares(&mut rows, &args("10"), &args("100"));
        assert!((rows[0].compute_share.unwrap() - 0.5).abs() < 1e-9);
        assert!((rows[1].compute_share.unwrap() - 0.25).abs() < 1e-9);
        assert_eq!(rows[2].compute_share, None);
        // Kernels without a fixed number of steps per item get none.
        let mut m = vec![SummaryRow { mode: RowMode::mode("stock"), items: Some(1.0), host_vcpu_s: vec![1.0], ..Default::default() }];
        add_compute_shares(&mut m, &[], &["bench".into(), "workload".into(), "matmul".into()]);
        assert_eq!(m[0].compute_share, None);
    }

    #[test]
    fn boots_interleave_command_lines_round_by_round() {
        assert_eq!(boot_plan(1, 3), vec![(vec![1, 2, 3], 0)]);
        assert_eq!(boot_plan(2, 2), vec![(vec![1], 0), (vec![1], 1), (vec![2], 1), (vec![2], 0)]);
    }

    #[test]
    fn calibration_rate_from_bench_json() {
        assert_eq!(calibrated_rate("{\"params\":{}}"), None);
        assert_eq!(calibrated_rate(""), None);
    }

    #[test]
    fn wake_contexts_read_and_write_as_the_strings_results_always_had() {
        for (text, place, hp) in [
            ("alone", WakePlace::Alone, None),
            ("with co-runner, halt_poll n/a", WakePlace::WithCoRunner, Some("n/a")),
            ("next to VM B, halt_poll 0", WakePlace::NextToVmB, Some("0")),
        ] {
            let c: WakeContext = serde_json::from_str(&format!("\"{text}\"")).unwrap();
            assert_eq!(c, WakeContext { place, halt_poll: hp.map(|h| h.parse().unwrap()) });
            assert_eq!(serde_json::to_string(&c).unwrap(), format!("\"{text}\""));
        }
        let e = serde_json::from_str::<WakeContext>("\"beside B\"").unwrap_err().to_string();
        assert!(e.contains("'beside B'") && e.contains("'alone', 'with co-runner', 'next to VM B'"), "{e}");
        assert_eq!(WakePlace::of(Scenario::Oc), WakePlace::WithCoRunner);
        // A place alone (`WakeCheck::context`) is written as its label too.
        for w in WakePlace::ALL {
            assert_eq!(serde_json::to_string(&w).unwrap(), format!("\"{}\"", w.label()));
        }
    }

    #[test]
    fn step_names_parse_to_what_wrote_them() {
        for k in [
            StepKind::Setup(Setup::Rate),
            StepKind::Setup(Setup::Wakeup),
            StepKind::Setup(Setup::Sync(3)),
            StepKind::Setup(Setup::Calibrate),
            StepKind::Setup(Setup::Cpuidle),
            StepKind::Co(12),
            StepKind::Measured { mode: "gleaner".into(), rep: 2 },
            StepKind::Measured { mode: "idle-poll".into(), rep: 7 },
        ] {
            assert_eq!(StepKind::parse(&k.name()), k);
        }
        assert_eq!(StepKind::parse("exec"), StepKind::Other("exec".into()));
        assert_eq!(StepKind::parse("setup.unknown"), StepKind::Other("setup.unknown".into()));
        // What the co-runner's shell loop names its third iteration.
        let job = co_runner_job(&["x".into()], Path::new("/g"));
        assert!(job.contains("step co.$i "), "{job}");
        assert_eq!(StepKind::parse(&job.split("step ").nth(1).unwrap().split(' ').next().unwrap().replace("$i", "3")), StepKind::Co(3));
    }
}
