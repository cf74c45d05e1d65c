//! `gleaner compare`: the main job. Runs a workload under each idle policy a tenant can pick
//! (stock and Gleaner by default; the kernel's guest haltpoll at any cap, polling only, and
//! naive yielders on request),
//! in turn, N times each, and reports medians, spread (min..max), ratios to stock and the CPU
//! each policy took, kernel polling counted, all measured in the same invocation.
//!
//! ```text
//!  round i: policies in the order of a Williams design (`round_order`: over n rounds, 2n
//!           for odd n, each policy in each place and after each other policy as often)
//!    stock     the command, as the machine is
//!    haltpoll  guest_halt_poll_ns 200000 (haltpoll:CAP: CAP), grow 2 from 50000, shrink 2
//!              (journaled, put back, each vCPU's window reset after)
//!    poll      every managed vCPU's resume latency limit n/a: the POLL state only (journaled)
//!    yielders  a SCHED_IDLE yielding thread on every vCPU that never sleeps
//!    gleaner   `gleaner run` with the given flags (retention: with --no-consolidation,
//!              consolidation: with --no-retention)
//!  each run: SystemMeter (busy, idle, steal) + POLL-state time + compare's own CPU (the
//!            yielders or the agent) + the workload's own document when it prints one
//!            (`gleaner bench workload ... --json`: items, throughput, latency)
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use gleaner_measure::compare::{balanced_rounds, per_round, round_order, summarize, CompareDoc, PerRound, Policy, PolicyRun, RoundRatios};
use gleaner_measure::measure::{self, SystemMeter};
use gleaner_measure::report::BenchDoc;
use gleaner_measure::RunMetrics;
use gleaner_os::cpuset::CpuSet;
use gleaner_os::idle::{IdleKnobs, IdleOffer};
use gleaner_os::procfs::Procfs;
use gleaner_os::sysfs::Sysfs;
use gleaner_os::BadInput;
use gleaner_policy::retention::RetentionConfig;
use gleaner_policy::stats::Summary;

use crate::agent::{self, RunOptions, Target};
use crate::knobs::KnobWriter;
use crate::state::{Guardian, StateFile, UndoCx};
use crate::yielders::Yielders;
use crate::AgentFlags;

/// `gleaner compare [--runs N] [--policies LIST] [-- CMD ...]`
#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// Runs of each policy (1..=1000; default 5, 3 with no CMD); each round runs every policy
    /// once, in an order that changes from round to round so that over N rounds (2N for an odd
    /// number N of policies) each policy runs in each place and after each other policy equally
    /// often.
    #[arg(long, value_name = "N")]
    pub runs: Option<u32>,
    /// Idle policies to compare, comma-separated: stock (the machine as found), haltpoll (the
    /// kernel's guest halt polling, upstream defaults: 200 us cap), haltpoll:CAP (the same
    /// under another cap, e.g. haltpoll:2400us), poll (never halt: every vCPU's PM QoS resume
    /// latency "n/a", what idle=poll gives), yielders or naive (a never-sleeping SCHED_IDLE
    /// yielding thread per vCPU), gleaner (`gleaner run` with these flags), retention and
    /// consolidation (gleaner with --no-consolidation / --no-retention). Default: stock and
    /// gleaner with a CMD; with none, every policy this machine offers.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub policies: Option<Vec<Policy>>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also draw latency (or wall time) against the CPU each run took, one point per run, to
    /// FILE (.png or .svg).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Run nothing: read a document an earlier `compare --json` wrote to FILE and summarize its
    /// runs again (medians, ratios to stock, round by round), e.g. one written before round
    /// ratios or their intervals were reported.
    #[arg(long, value_name = "FILE", conflicts_with = "cmd")]
    pub from: Option<PathBuf>,
    #[command(flatten)]
    pub flags: AgentFlags,
    /// Command to measure. Its output is captured and shown only if it fails; a `gleaner
    /// bench workload ... --json` document in it gives the runs their items, throughput and
    /// latency. Without one, compare runs a built-in latency kernel (a 1 s ping-pong) and a
    /// built-in throughput kernel (the dedup-like pipeline) under every idle policy the
    /// machine offers and says in one line what gleaner did here.
    #[arg(last = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

/// The upstream defaults of the haltpoll module's other parameters
/// (Documentation/virt/guest-halt-polling.rst); the cap is the policy's.
const HALTPOLL_DEFAULTS: [(&str, &str); 4] = [
    ("guest_halt_poll_grow", "2"),
    ("guest_halt_poll_grow_start", "50000"),
    ("guest_halt_poll_shrink", "2"),
    ("guest_halt_poll_allow_shrink", "Y"),
];

/// Runs the comparison and prints it (`--plot` is drawn by the binary, which links plotting).
pub fn run(args: CompareArgs) -> anyhow::Result<ExitCode> {
    let doc = run_doc(&args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print_table(&doc);
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs the comparison (module documentation) and returns its document.
pub fn run_doc(args: &CompareArgs) -> anyhow::Result<CompareDoc> {
    if let Some(path) = &args.from {
        return resummarize(path);
    }
    check_runs(args)?;
    let runs = args.runs.unwrap_or(5);
    let policies = chosen_policies(args)?;
    let cfg = args.flags.resolve()?;
    let sysfs = Sysfs::new();
    let cpus = agent::managed_cpus(&cfg, &sysfs)?;
    let command = command_of(args)?;
    agent::check_program(&command)?;
    let knobs = IdleKnobs::new();
    let offer = knobs.offer(&cpus).ok();
    let root = nix::unistd::geteuid().is_root();
    check_offered(&policies, offer.as_ref(), root)?;
    let mut notes: Vec<String> = balance_note(runs, &policies).into_iter().collect();
    let calibration = calibrate_once(&policies, &cfg, &cpus);
    if let Some(Err(e)) = calibration.as_ref().map(|c| &c.results) {
        notes.push(format!("gleaner runs without a wake-cost curve: {e}"));
    }
    let out_dir = tempfile::tempdir().context("creating a temp dir for workload output")?;
    let opts = RunOptions {
        quiet: true,
        stdout_to: Some(out_dir.path().join("out.txt")),
        stderr_to: Some(out_dir.path().join("err.txt")),
        status_socket: false,
        calibration: calibration.clone(),
    };
    let mut runner = Runner::new(&cfg, &cpus, offer.clone(), &policies, root)?;
    let rounds = Rounds {
        runs,
        policies: &policies,
        command: &command,
        cfg: &cfg,
        opts: &opts,
        err_txt: out_dir.path().join("err.txt"),
        show: !args.json,
    };
    let result = rounds.run(&mut runner);
    let finished = runner.finish();
    let samples = result?;
    finished?;
    if !args.json {
        eprintln!();
    }
    let (summaries, vs_stock) = summarize(&policies, &samples);
    let per_round = per_round(&samples);
    Ok(CompareDoc {
        command,
        runs,
        cpus: cpus.to_string(),
        policies,
        machine: offer.map_or_else(|| "cpuidle settings unreadable".into(), |o| o.describe()),
        calibration: calibration.and_then(|c| c.source).map(|s| s.describe()),
        notes,
        samples,
        summaries,
        vs_stock,
        per_round,
    })
}

/// The policies `--policies` names (stock and gleaner by default), each once, in order.
fn chosen_policies(args: &CompareArgs) -> anyhow::Result<Vec<Policy>> {
    let mut policies: Vec<Policy> = Vec::new();
    for p in args.policies.as_deref().unwrap_or(&[Policy::Stock, Policy::Gleaner]) {
        if !policies.contains(p) {
            policies.push(*p);
        }
    }
    if policies.is_empty() {
        return Err(BadInput::new("--policies", "(none)", Policy::allowed()).into());
    }
    Ok(policies)
}

/// The command to measure: the given one, or this binary's pipeline workload with `--json`.
fn command_of(args: &CompareArgs) -> anyhow::Result<Vec<String>> {
    Ok(if args.cmd.is_empty() {
        let exe = std::env::current_exe().context("locating the gleaner binary")?;
        vec![exe.display().to_string(), "bench".into(), "workload".into(), "pipeline".into(), "--json".into()]
    } else {
        args.cmd.clone()
    })
}

/// Fails on the first policy this machine does not offer, saying why.
fn check_offered(policies: &[Policy], offer: Option<&IdleOffer>, root: bool) -> anyhow::Result<()> {
    for &p in policies {
        if let Some(why) = unavailable(p, offer, root) {
            let list: Vec<String> = policies.iter().map(Policy::to_string).collect();
            return Err(BadInput::new("--policies", list.join(","), format!("policies this machine offers ({p}: {why})")).into());
        }
    }
    Ok(())
}

/// A note when `runs` rounds cannot balance the order of the policies.
fn balance_note(runs: u32, policies: &[Policy]) -> Option<String> {
    let balanced = u32::try_from(balanced_rounds(policies.len())).unwrap_or(1);
    (policies.len() > 1 && !runs.is_multiple_of(balanced)).then(|| {
        format!(
            "{} runs of {} policies: each policy takes each place in a round, and follows each other policy, equally often only when --runs is a multiple of {balanced}",
            runs,
            policies.len(),
        )
    })
}

/// Calibrates once, so every Gleaner run plans from the same wake-cost curve; `None` when no
/// policy retains or retention is off.
fn calibrate_once(policies: &[Policy], cfg: &crate::config::AgentConfig, cpus: &CpuSet) -> Option<agent::Calibrated> {
    (policies.iter().any(|p| p.retention()) && cfg.retention).then(|| {
        if cfg.timeout_us.is_some() {
            agent::setup::calibration(cfg, cpus, None, false)
        } else {
            let got = crate::cache::obtain(&cfg.cache_policy(), &crate::cache::World::real(), cpus, || {
                crate::calibrate::measure_journaled(&cfg.run_dir, cpus)
            });
            agent::Calibrated { results: got.results.map_err(|i| i.error), source: Some(got.source), threshold_ns: None }
        }
    })
}

/// The rounds of a comparison: every policy once a round, in the round's order.
struct Rounds<'a> {
    runs: u32,
    policies: &'a [Policy],
    command: &'a [String],
    cfg: &'a crate::config::AgentConfig,
    opts: &'a RunOptions,
    /// Where the workload's standard error goes (shown when it fails).
    err_txt: PathBuf,
    /// Whether to show progress on standard error.
    show: bool,
}

impl Rounds<'_> {
    /// Runs every round with `runner`; returns the runs, or the first error (a workload that
    /// failed is one).
    fn run(&self, runner: &mut Runner) -> anyhow::Result<Vec<PolicyRun>> {
        let (runs, policies, command) = (self.runs, self.policies, self.command);
        let total = runs * u32::try_from(policies.len()).unwrap_or(u32::MAX);
        let mut samples = Vec::new();
        let t0 = Instant::now();
        for i in 0..runs {
            for p in round_order(policies.len(), usize::try_from(i).unwrap_or(0)).into_iter().map(|k| policies[k]) {
                let n = u32::try_from(samples.len()).map_or(u32::MAX, |done| done + 1);
                if self.show {
                    let eta = if n > 1 {
                        format!(", ~{:.0} s left", t0.elapsed().as_secs_f64() / f64::from(n - 1) * f64::from(total - n + 1))
                    } else {
                        String::new()
                    };
                    eprint!("\rgleaner compare: run {n}/{total} ({p}, round {}){eta}    ", i + 1);
                }
                let s = runner.run(p, i, command, self.cfg, self.opts)?;
                if s.metrics.exit_code.unwrap_or(1) != 0 {
                    let err = std::fs::read_to_string(&self.err_txt).unwrap_or_default();
                    anyhow::bail!(
                        "the workload failed in a {p} run (exit status {}): {}{}",
                        s.metrics.exit_code.unwrap_or(1),
                        command.join(" "),
                        if err.is_empty() { String::new() } else { format!(": {}", err.trim()) }
                    );
                }
                samples.push(s);
            }
        }
        Ok(samples)
    }
}

/// `--from FILE`: the document of an earlier comparison, its summaries made again from its runs.
fn resummarize(path: &Path) -> anyhow::Result<CompareDoc> {
    let bad = |e: &dyn std::fmt::Display| BadInput::new("--from", path.display(), format!("a `gleaner compare --json` document ({e})"));
    let text = std::fs::read_to_string(path).map_err(|e| bad(&e))?;
    let mut value: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(&e))?;
    // What is made again from the runs is not read: an older compare wrote it otherwise.
    if let Some(o) = value.as_object_mut() {
        for derived in ["summaries", "vs_stock", "per_round"] {
            o.insert(derived.into(), serde_json::Value::Array(Vec::new()));
        }
    }
    let mut doc: CompareDoc = serde_json::from_value(value).map_err(|e| bad(&e))?;
    let (summaries, vs_stock) = summarize(&doc.policies, &doc.samples);
    doc.summaries = summaries;
    doc.vs_stock = vs_stock;
    doc.per_round = per_round(&doc.samples);
    Ok(doc)
}

/// What the runs of one comparison share: the meters, the naive yielders' configuration, and
/// for haltpoll a journal of the knobs it turns.
struct Runner {
    procfs: Procfs,
    sysfs: Sysfs,
    cpus: CpuSet,
    knobs: IdleKnobs,
    poll_state: Option<u32>,
    naive: RetentionConfig,
    /// Journal and guardian of the haltpoll runs' knobs (root, haltpoll asked for).
    journal: Option<(StateFile, Guardian, KnobWriter)>,
    run_dir: PathBuf,
}

impl Runner {
    fn new(
        cfg: &crate::config::AgentConfig,
        cpus: &CpuSet,
        offer: Option<IdleOffer>,
        policies: &[Policy],
        root: bool,
    ) -> anyhow::Result<Self> {
        let knobs = IdleKnobs::new();
        let journal = match (policies.iter().any(|p| p.sets_idle_knobs()) && root, offer.clone()) {
            (true, Some(o)) => {
                let state = StateFile::create_for_knobs(&cfg.run_dir, std::process::id().cast_signed())?;
                let mut guardian = Guardian::spawn(state.path())?;
                guardian.wait_armed(std::time::Duration::from_secs(5))?;
                Some((state, guardian, KnobWriter::new(knobs.clone(), o)))
            }
            _ => None,
        };
        Ok(Self {
            procfs: Procfs::new(),
            sysfs: Sysfs::new(),
            cpus: cpus.clone(),
            knobs,
            poll_state: offer.and_then(|o| o.poll_state),
            naive: RetentionConfig { timeout_ns: u64::MAX, adapt: false, step_aside_ns: 0, ..RetentionConfig::default() },
            journal,
            run_dir: cfg.run_dir.clone(),
        })
    }

    /// Kernel polling of the managed vCPUs so far, ns (0 without a POLL state).
    fn poll_ns(&self) -> u64 {
        self.poll_state
            .and_then(|s| self.knobs.state_time_us(&self.cpus, s).ok())
            .map_or(0, |v| v.iter().map(|(_, us)| us.saturating_mul(1000)).sum())
    }

    fn self_cpu_ns() -> anyhow::Result<u64> {
        let r = gleaner_os::rusage::self_rusage()?;
        Ok(r.user_ns + r.sys_ns)
    }

    /// One run of `command` under `policy`.
    fn run(
        &mut self,
        policy: Policy,
        round: u32,
        command: &[String],
        cfg: &crate::config::AgentConfig,
        opts: &RunOptions,
    ) -> anyhow::Result<PolicyRun> {
        let poll0 = self.poll_ns();
        let self0 = Self::self_cpu_ns()?;
        let (metrics, out) = match policy {
            Policy::Stock => (self.run_child(command, opts)?, None),
            Policy::Haltpoll { cap_ns } => {
                let _lock = crate::knobs::try_lock_knobs(&self.run_dir)?.context("another agent drives the idle knobs")?;
                let (state, _, writer) = self.journal.as_mut().context("haltpoll runs need the knob journal")?;
                writer.set_poll_window(state, cap_ns)?;
                for (name, value) in HALTPOLL_DEFAULTS {
                    if writer.knobs().haltpoll_params()?.contains_key(name) {
                        writer.set_haltpoll_param(state, name, value)?;
                    }
                }
                (self.with_knobs_restored(command, opts)?, None)
            }
            Policy::Poll => {
                let _lock = crate::knobs::try_lock_knobs(&self.run_dir)?.context("another agent drives the idle knobs")?;
                let (state, _, writer) = self.journal.as_mut().context("poll runs need the knob journal")?;
                for cpu in self.cpus.iter() {
                    writer.set_poll_always(state, cpu, true)?;
                }
                (self.with_knobs_restored(command, opts)?, None)
            }
            Policy::Yielders => {
                let y = Yielders::start(&self.cpus, self.naive, true)?;
                y.set_windows(&self.cpus.iter().map(|c| (c, u64::MAX)).collect::<Vec<_>>());
                let m = self.run_child(command, opts);
                drop(y);
                (m?, None)
            }
            Policy::Gleaner | Policy::Retention | Policy::Consolidation => {
                let cfg = &crate::config::AgentConfig {
                    retention: cfg.retention && policy.retention(),
                    consolidation: cfg.consolidation && policy.consolidation(),
                    ..cfg.clone()
                };
                let meter = SystemMeter::start(&self.procfs, &self.sysfs, &self.cpus)?;
                let out = agent::run(Target::Command(command.to_vec()), cfg, opts)?;
                // The system counters cover the agent's set-up and clean-up too; the wall time
                // is the workload's own, from its start to its exit.
                let system = measure::SystemDelta { wall_ns: out.workload_wall_ns, ..meter.stop()? };
                let mut m = measure::metrics(&out.rusage.unwrap_or_default(), &system, cpu_count(&self.cpus));
                m.exit_code = Some(out.exit_code.unwrap_or(1));
                (m, Some(out))
            }
        };
        let metrics = with_document(metrics, opts.stdout_to.as_deref());
        let poll_ns = self.poll_ns().saturating_sub(poll0);
        let policy_cpu_ns = Self::self_cpu_ns()?.saturating_sub(self0);
        Ok(PolicyRun {
            policy,
            round: Some(round),
            cpu_ns: metrics.cpu_ns(),
            poll_ns,
            policy_cpu_ns,
            total_cpu_ns: metrics.busy_ns.saturating_add(poll_ns),
            agent_cpu_ns: out.as_ref().map(|_| policy_cpu_ns),
            agent_maxrss_kib: None,
            decisions: out.as_ref().map(|o| o.final_status.totals.decisions),
            retention_on_share: out
                .as_ref()
                .map(|o| o.final_status.totals)
                .filter(|t| t.periods > 0)
                .map(|t| t.retention_on_periods as f64 / t.periods as f64),
            wake: out.as_ref().and_then(|o| o.wake),
            tracer_cpu_ns: out.as_ref().and_then(|o| o.tracer_cpu_ns),
            metrics,
        })
    }

    fn run_child(&self, command: &[String], opts: &RunOptions) -> anyhow::Result<RunMetrics> {
        run_child(&self.procfs, &self.sysfs, &self.cpus, command, opts)
    }

    /// Runs `command` with the knobs the policy set, then puts every knob back (resetting each
    /// vCPU's haltpoll window, so the next run does not start from this one's).
    fn with_knobs_restored(&mut self, command: &[String], opts: &RunOptions) -> anyhow::Result<RunMetrics> {
        let m = run_child(&self.procfs, &self.sysfs, &self.cpus, command, opts);
        let (_, _, writer) = self.journal.as_mut().context("runs that turn idle knobs need the knob journal")?;
        let errors = writer.restore_now();
        let m = m?;
        if !errors.is_empty() {
            anyhow::bail!("restoring the idle knobs after a run: {}", errors.join("; "));
        }
        Ok(m)
    }

    /// Undoes the haltpoll runs' journal and dismisses its guardian.
    fn finish(&mut self) -> anyhow::Result<()> {
        let Some((state, guardian, writer)) = self.journal.take() else { return Ok(()) };
        let r = state.undo(&UndoCx { cgroups: None, knobs: writer.knobs().clone() });
        guardian.dismiss();
        r
    }
}

/// Runs `command` as a child of compare and measures it.
fn run_child(procfs: &Procfs, sysfs: &Sysfs, cpus: &CpuSet, command: &[String], opts: &RunOptions) -> anyhow::Result<RunMetrics> {
    {
        let mut cmd = std::process::Command::new(&command[0]);
        cmd.args(&command[1..]);
        if let Some(p) = &opts.stdout_to {
            cmd.stdout(std::fs::File::create(p)?);
        }
        if let Some(p) = &opts.stderr_to {
            cmd.stderr(std::fs::File::create(p)?);
        }
        let meter = SystemMeter::start(procfs, sysfs, cpus)?;
        let child = cmd.spawn().map_err(|e| BadInput::new("command", &command[0], format!("a program that can be started ({e})")))?;
        measure::measure_child(child, meter)
    }
}

/// The run's items, throughput and latency from the workload's own document, when it printed
/// one (`gleaner bench workload ... --json`: the same typed record `bench` writes).
fn with_document(mut m: RunMetrics, stdout: Option<&Path>) -> RunMetrics {
    let Some(text) = stdout.and_then(|p| std::fs::read_to_string(p).ok()) else { return m };
    let Ok(doc) = gleaner_measure::report::from_output::<BenchDoc>(&text) else { return m };
    let Some(run) = doc.runs.first() else { return m };
    m.items = run.items.or(m.items);
    m.throughput = run.throughput.or(m.throughput);
    m.latency = run.latency.clone().or(m.latency);
    m
}

/// The number of CPUs in `cpus` as [`RunMetrics::cpus_available`] counts them.
fn cpu_count(cpus: &CpuSet) -> u32 {
    u32::try_from(cpus.len()).unwrap_or(u32::MAX)
}

/// What `gleaner compare` with no command measured: a latency kernel and a throughput kernel,
/// each under every idle policy the machine offers.
#[derive(Debug, Clone)]
pub struct FirstRun {
    pub latency: CompareDoc,
    pub throughput: CompareDoc,
}

/// The idle policies this machine offers to whoever runs compare: stock, haltpoll and poll
/// where its knobs allow them, yielders, gleaner.
pub fn offered_policies(offer: Option<&IdleOffer>, root: bool) -> Vec<Policy> {
    let all = [Policy::Stock, Policy::HALTPOLL, Policy::Poll, Policy::Yielders, Policy::Gleaner];
    all.into_iter().filter(|&p| unavailable(p, offer, root).is_none()).collect()
}

/// `--runs`, if given, within 1..=1000: checked before anything runs or is printed.
fn check_runs(args: &CompareArgs) -> anyhow::Result<()> {
    match args.runs {
        Some(runs) if !(1..=1000).contains(&runs) => Err(BadInput::new("--runs", runs, "1..=1000").into()),
        _ => Ok(()),
    }
}

/// `gleaner compare` with no command (the README's first command): the built-in ping-pong for
/// a second and the built-in pipeline, under every policy offered (or `--policies`), 3 rounds
/// each unless `--runs` says otherwise.
pub fn first_run(args: &CompareArgs) -> anyhow::Result<FirstRun> {
    check_runs(args)?;
    let exe = std::env::current_exe().context("locating the gleaner binary")?.display().to_string();
    let cpus = agent::managed_cpus(&args.flags.resolve()?, &Sysfs::new())?;
    let offer = IdleKnobs::new().offer(&cpus).ok();
    let policies = args.policies.clone().unwrap_or_else(|| offered_policies(offer.as_ref(), nix::unistd::geteuid().is_root()));
    let with = |cmd: &[&str]| CompareArgs {
        runs: Some(args.runs.unwrap_or(3)),
        policies: Some(policies.clone()),
        cmd: std::iter::once(exe.clone()).chain(cmd.iter().map(|s| (*s).to_string())).collect(),
        ..args.clone()
    };
    if !args.json {
        eprintln!("gleaner compare: a 1 s ping-pong, then the built-in pipeline, under {}", list(&policies));
    }
    let latency = run_doc(&with(&["bench", "workload", "pingpong", "--duration-ms", "1000", "--json"]))?;
    let throughput = run_doc(&with(&["bench", "workload", "pipeline", "--json"]))?;
    Ok(FirstRun { latency, throughput })
}

fn list(p: &[Policy]) -> String {
    p.iter().map(Policy::to_string).collect::<Vec<_>>().join(", ")
}

/// The first run's verdict in one line, for a newcomer: what gleaner did to wakeup latency and
/// at what CPU against stock, how it stands against the best other policy, and what it left of
/// throughput; or, where nothing here pays, that plainly.
pub fn first_run_verdict(f: &FirstRun) -> String {
    let (lat, thr) = (&f.latency, &f.throughput);
    let p50 = |d: &CompareDoc, p: Policy| d.summary(p).and_then(|s| s.latency_p50_us.as_ref()).map(|s| s.p50);
    let vcpus = |d: &CompareDoc, p: Policy| d.summary(p).map(|s| s.total_vcpus.p50);
    let (Some(stock), Some(gleaner)) = (p50(lat, Policy::Stock), p50(lat, Policy::Gleaner)) else {
        return "gleaner vs stock: not both measured (give --policies with stock and gleaner)".into();
    };
    let cut =
        lat.per_round(Policy::Gleaner, Policy::Stock).and_then(|r| r.latency_p50).map_or(stock / gleaner.max(1e-9), |r| r.summary.p50);
    let extra = vcpus(lat, Policy::Gleaner).zip(vcpus(lat, Policy::Stock)).map_or(0.0, |(g, s)| g - s);
    let throughput = thr.per_round(Policy::Gleaner, Policy::Stock).and_then(|r| r.throughput.or(r.speedup)).map(|r| r.summary.p50);
    let thr_text =
        throughput.map_or("throughput not measured".to_string(), |t| format!("left the pipeline's throughput at {t:.2}x of stock's"));
    // The best other policy's p50, and gleaner's per-round ratio to it (above 1: gleaner better).
    let best = lat
        .summaries
        .iter()
        .filter(|s| s.policy != Policy::Gleaner && s.policy != Policy::Stock)
        .filter_map(|s| s.latency_p50_us.as_ref().map(|l| (s.policy, l.p50)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    let against = best.map_or(String::new(), |(p, _)| {
        let r = lat.per_round(Policy::Gleaner, p).or_else(|| lat.per_round(p, Policy::Gleaner));
        match r.and_then(|r| r.latency_p50.map(|x| (r.policy, x.summary.p50))) {
            Some((first, x)) => {
                // The ratio is the later policy's advantage: `against`'s latency over its own.
                let g_over_p = if first == Policy::Gleaner { 1.0 / x } else { x };
                format!(", {g_over_p:.2}x the latency of the best other policy ({p})")
            }
            None => String::new(),
        }
    });
    if cut < 1.1 {
        return format!(
            "on this VM waking an idle vCPU is already cheap: gleaner changed the ping-pong's wakeup latency by {cut:.2}x ({stock:.1} -> {gleaner:.1} us) and {thr_text}; nothing here pays for keeping vCPUs from halting"
        );
    }
    format!(
        "on this VM gleaner cut wakeup latency {cut:.1}x ({stock:.1} -> {gleaner:.1} us p50){against} at {extra:.1} vCPU of extra CPU, and {thr_text}"
    )
}

/// Why `policy` cannot run here (`None`: it can): the knobs it turns need root and the
/// machine's cpuidle support.
fn unavailable(policy: Policy, offer: Option<&IdleOffer>, root: bool) -> Option<String> {
    if !policy.sets_idle_knobs() {
        return None;
    }
    let Some(o) = offer else { return Some("the cpuidle settings cannot be read".into()) };
    if !root {
        return Some("it changes the kernel's idle knobs, which needs root".into());
    }
    match policy {
        Policy::Haltpoll { .. } if !o.poll_window() => {
            Some(format!("this machine has no haltpoll cpuidle driver and governor ({})", o.describe()))
        }
        Policy::Poll if !o.poll_always() => {
            Some(format!("this machine has no POLL state with per-CPU resume latency limits ({})", o.describe()))
        }
        _ => None,
    }
}

/// The comparison as a table, for people.
pub fn print_table(d: &CompareDoc) {
    println!("gleaner compare: {}", d.command.join(" "));
    println!("  {} runs of each policy, orders balanced (Williams design); CPUs {}; {}", d.runs, d.cpus, d.machine);
    if let Some(c) = &d.calibration {
        println!("  calibration: {c}");
    }
    for n in &d.notes {
        println!("  note: {n}");
    }
    let f = |s: Option<&Summary>, digits: usize| {
        s.map(|s| format!("{:.d$} [{:.d$}..{:.d$}]", s.p50, s.min, s.max, d = digits)).unwrap_or_else(|| "-".into())
    };
    println!("  median [min..max]");
    println!(
        "  {:<9} {:>24} {:>24} {:>22} {:>22} {:>22} {:>18}",
        "policy", "wall s", "items/s", "latency p50 us", "latency p99 us", "CPU vCPUs (polling)", "CPU us/item"
    );
    for s in &d.summaries {
        let cpu = format!("{:.2} ({:.2})", s.total_vcpus.p50, s.poll_vcpus.p50);
        println!(
            "  {:<9} {:>24} {:>24} {:>22} {:>22} {:>22} {:>18}",
            s.policy.to_string(),
            f(Some(&s.wall_s), 3),
            f(s.throughput.as_ref(), 0),
            f(s.latency_p50_us.as_ref(), 1),
            f(s.latency_p99_us.as_ref(), 1),
            cpu,
            s.total_cpu_per_item_us.as_ref().map_or("-".into(), |x| format!("{:.1}", x.p50)),
        );
    }
    let stock = d.summary(Policy::Stock);
    for v in &d.vs_stock {
        let (Some(st), Some(s)) = (stock, d.summary(v.policy)) else { continue };
        let lat = v.latency_p50.map_or(String::new(), |r| {
            format!(" latency p50 {:.2}x better{}", r, v.latency_p99.map_or(String::new(), |r99| format!(", p99 {r99:.2}x")))
        });
        // A latency kernel runs for a fixed time: its wall time says nothing.
        let wall = if s.latency_p50_us.is_some() {
            String::new()
        } else {
            format!(" wall {:.2}x ({})", v.speedup, verdict(&st.wall_s, &s.wall_s, &v.policy.to_string()))
        };
        println!("  {} vs stock:{wall}{lat}; CPU per item {:.2}x", v.policy, v.cpu);
    }
    if !d.per_round.is_empty() {
        println!("  round by round (median [min..max] of the rounds' ratios; above 1: the first did better):");
        for r in &d.per_round {
            println!("    {}", describe_per_round(r));
        }
    }
}

/// One line of the round-by-round comparison: latency where the workload reports it, else
/// throughput, else wall time.
fn describe_per_round(r: &PerRound) -> String {
    let f = |r: &RoundRatios| {
        let (s, ci) = (&r.summary, &r.median_ci95);
        let verdict = if ci.excludes(1.0) { "" } else { ", within chance" };
        format!("{:.2}x [{:.2}..{:.2}] (95% {:.2}..{:.2}{verdict})", s.p50, s.min, s.max, ci.lo, ci.hi)
    };
    let what = match (&r.latency_p50, &r.latency_p99, &r.throughput, &r.speedup) {
        (Some(p50), p99, _, _) => {
            format!("latency p50 {}{}", f(p50), p99.as_ref().map_or(String::new(), |p| format!(", p99 {}", f(p))))
        }
        (None, _, Some(t), _) => format!("throughput {}", f(t)),
        (None, _, None, Some(w)) => format!("wall {}", f(w)),
        _ => "no metric in both runs".into(),
    };
    format!("{} vs {} ({} rounds): {what}", r.policy, r.against, r.rounds)
}

/// Says "faster"/"slower" only when the runs do not overlap: a median ahead by less than
/// the run-to-run spread is no result.
fn verdict(stock: &Summary, other: &Summary, name: &str) -> String {
    if other.max < stock.min {
        format!("faster under {name} in every run")
    } else if other.min > stock.max {
        format!("slower under {name} in every run")
    } else if other.p50 < stock.p50 {
        format!("median faster under {name}, within the run-to-run spread")
    } else if other.p50 > stock.p50 {
        format!("median slower under {name}, within the run-to-run spread")
    } else {
        "same median".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(v: &[f64]) -> Summary {
        Summary::of(v).unwrap()
    }

    #[test]
    fn a_round_by_round_line_names_both_policies_and_the_workload_s_own_metric() {
        let ratios = |v: &[f64]| RoundRatios::of(v);
        let r = |p50: Option<RoundRatios>, thr: Option<RoundRatios>| PerRound {
            policy: Policy::Gleaner,
            against: Policy::HALTPOLL,
            rounds: 3,
            speedup: ratios(&[1.0, 1.1, 0.9]),
            throughput: thr,
            latency_p50: p50,
            latency_p99: None,
            latency_mean: None,
        };
        assert_eq!(
            describe_per_round(&r(ratios(&[0.9, 1.0, 1.2]), None)),
            "gleaner vs haltpoll (3 rounds): latency p50 1.00x [0.90..1.20] (95% 0.90..1.20, within chance)"
        );
        assert_eq!(
            describe_per_round(&r(None, ratios(&[0.98, 0.97, 0.96]))),
            "gleaner vs haltpoll (3 rounds): throughput 0.97x [0.96..0.98] (95% 0.96..0.98)"
        );
        assert_eq!(
            describe_per_round(&r(None, None)),
            "gleaner vs haltpoll (3 rounds): wall 1.00x [0.90..1.10] (95% 0.90..1.10, within chance)"
        );
    }

    #[test]
    fn a_saved_document_is_summarized_again_and_a_bad_one_named() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: CompareArgs,
        }
        let dir = tempfile::tempdir().unwrap();
        let run = |policy: Policy, round: u32, p50_us: f64| {
            let latency = gleaner_measure::measure::LatencySummary {
                samples: 10,
                p50_ns: p50_us * 1e3,
                p99_ns: p50_us * 2e3,
                mean_ns: p50_us * 1e3,
                ..Default::default()
            };
            let metrics = RunMetrics { wall_ns: 1_000_000_000, latency: Some(latency), ..Default::default() };
            PolicyRun { round: Some(round), total_cpu_ns: 1, ..PolicyRun::new(policy, metrics) }
        };
        // A document as an older compare wrote it: no summaries, no round ratios.
        let mut old = serde_json::to_value(CompareDoc {
            command: vec!["x".into()],
            runs: 2,
            cpus: "0-1".into(),
            policies: vec![Policy::Stock, Policy::Gleaner],
            machine: String::new(),
            calibration: None,
            notes: Vec::new(),
            samples: vec![
                run(Policy::Stock, 0, 40.0),
                run(Policy::Gleaner, 0, 20.0),
                run(Policy::Gleaner, 1, 10.0),
                run(Policy::Stock, 1, 30.0),
            ],
            summaries: Vec::new(),
            vs_stock: Vec::new(),
            per_round: Vec::new(),
        })
        .unwrap();
        // Its round ratios in a form no longer read (no intervals): made again, not parsed.
        old["per_round"] = serde_json::json!([{"policy": "gleaner", "against": "stock", "rounds": 2, "latency_p50": {"p50": 1.0}}]);
        let path = dir.path().join("old.json");
        std::fs::write(&path, old.to_string()).unwrap();
        let cli = Cli::try_parse_from(["compare", "--from", path.to_str().unwrap()]).unwrap();
        let doc = run_doc(&cli.args).unwrap();
        assert_eq!(doc.summaries.len(), 2);
        let r = doc.per_round(Policy::Gleaner, Policy::Stock).expect("paired");
        // Rounds: 40/20 = 2 and 30/10 = 3.
        assert_eq!(r.rounds, 2);
        assert!((r.latency_p50.unwrap().summary.p50 - 2.5).abs() < 1e-9);
        assert!(Cli::try_parse_from(["compare", "--from", "f.json", "--", "true"]).is_err(), "a command conflicts with --from");
        std::fs::write(&path, "{not json").unwrap();
        let e = run_doc(&Cli::try_parse_from(["compare", "--from", path.to_str().unwrap()]).unwrap().args).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains("--from") && msg.contains("old.json") && msg.contains("compare --json"), "{msg}");
    }

    #[test]
    fn a_verdict_needs_runs_that_do_not_overlap() {
        assert_eq!(verdict(&runs(&[2.0, 2.1]), &runs(&[1.0, 1.1]), "gleaner"), "faster under gleaner in every run");
        assert_eq!(verdict(&runs(&[1.0, 1.1]), &runs(&[2.0, 2.1]), "naive"), "slower under naive in every run");
        assert_eq!(
            verdict(&runs(&[1.9, 2.0, 2.1]), &runs(&[1.85, 1.95, 2.2]), "gleaner"),
            "median faster under gleaner, within the run-to-run spread"
        );
        assert_eq!(
            verdict(&runs(&[1.9, 2.0, 2.1]), &runs(&[1.95, 2.05, 2.08]), "gleaner"),
            "median slower under gleaner, within the run-to-run spread"
        );
        assert_eq!(verdict(&runs(&[1.0]), &runs(&[1.0]), "gleaner"), "same median");
    }

    #[test]
    fn a_workloads_document_gives_its_run_items_and_latency() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.txt");
        let run = RunMetrics {
            items: Some(7),
            throughput: Some(3.5),
            latency: Some(gleaner_measure::LatencySummary { samples: 7, p50_ns: 4000.0, ..Default::default() }),
            ..Default::default()
        };
        let doc = serde_json::json!({"kind": "workload", "name": "pingpong", "params": {}, "runs": [run],
            "summary": serde_json::to_value(gleaner_measure::report::RunSummary::of(std::slice::from_ref(&run)).unwrap()).unwrap(),
            "host": serde_json::to_value(gleaner_measure::report::HostInfo::default()).unwrap()});
        std::fs::write(&p, format!("some text first\n{doc}\n")).unwrap();
        let m = with_document(RunMetrics { wall_ns: 5, ..Default::default() }, Some(&p));
        assert_eq!((m.items, m.wall_ns), (Some(7), 5));
        assert_eq!(m.latency.unwrap().p50_ns, 4000.0);
        // No document: the run as measured.
        std::fs::write(&p, "sockperf: avg-latency=4.2\n").unwrap();
        assert_eq!(with_document(RunMetrics::default(), Some(&p)).items, None);
    }
}
