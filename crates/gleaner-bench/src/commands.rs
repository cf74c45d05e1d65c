//! The `gleaner bench` subcommands: argument resolution, runs, human and JSON output.

use std::os::fd::AsFd;
use std::process::{Command, ExitCode, Stdio};

use anyhow::Context;
use gleaner_measure::measure::{self, SystemMeter};
use gleaner_measure::report::{BenchDoc, HostInfo, RunSummary, WakeupDoc};
use gleaner_measure::wakeup::{self, SettingResult, WakeupConfig};
use gleaner_os::cpuset::CpuSet;
use gleaner_os::procfs::Procfs;
use gleaner_os::sysfs::Sysfs;
use gleaner_os::BadInput;
use gleaner_policy::overhead::{self, Overhead, Side};
use gleaner_policy::stats::median;
use serde::{Deserialize, Serialize};

use crate::cli::{OverheadArgs, RunArgs, WakeupArgs, WorkloadArgs, YieldersArgs};
use crate::workload::latency::{self, LatencyKernel, LatencyParams, LatencyPlan, OpenloopParams, PingpongParams};
use crate::workload::{self, Workload, WorkloadParams};

fn print_json<T: Serialize>(v: &T) -> anyhow::Result<()> {
    Ok(gleaner_measure::report::write_document(std::io::stdout().lock(), v)?)
}

fn ms(ns: f64) -> String {
    format!("{:.1} ms", ns / 1e6)
}

fn opt_us(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.1}"))
}

/// Resolve the flags of `bench wakeup` into a configuration.
pub fn wakeup_config(a: &WakeupArgs, allowed: &gleaner_os::cpuset::CpuSet) -> Result<WakeupConfig, BadInput> {
    let mut cfg = WakeupConfig::for_cpus(allowed);
    cfg.settings = a.settings.clone();
    cfg.settings.dedup();
    cfg.primitive = a.primitive;
    cfg.rounds = a.rounds;
    cfg.warmup = a.warmup;
    cfg.period_us = a.period_us;
    cfg.deadline_ms = a.deadline_ms;
    if let Some(c) = a.waker_cpu {
        cfg.waker_cpu = c;
        if a.waiter_cpu.is_none() && cfg.waiter_cpu == c {
            cfg.waiter_cpu = allowed.iter().find(|&x| x != c).unwrap_or(c);
        }
    }
    if let Some(c) = a.waiter_cpu {
        cfg.waiter_cpu = c;
        if a.waker_cpu.is_none() && cfg.waker_cpu == c {
            cfg.waker_cpu = allowed.iter().find(|&x| x != c).unwrap_or(c);
        }
    }
    cfg.validate(allowed)?;
    Ok(cfg)
}

pub(crate) fn wakeup(a: &WakeupArgs) -> anyhow::Result<ExitCode> {
    let allowed = measure::allowed_cpu_set();
    let cfg = wakeup_config(a, &allowed)?;
    if let Some(p) = &a.plot {
        crate::plot::check_path(p)?;
    }
    let procfs = Procfs::new();
    let sysfs = Sysfs::new();
    eprintln!(
        "measuring wakeup latency ({:?}): settings {:?}, {} rounds each, period {} us, waker CPU {}, waiter CPU {}",
        cfg.primitive, cfg.settings, cfg.rounds, cfg.period_us, cfg.waker_cpu, cfg.waiter_cpu
    );
    let results = wakeup::run(&cfg, &allowed, &procfs)?;
    if let Some(p) = &a.plot {
        crate::plot::wakeup_cdf(p, &results)?;
        eprintln!("wrote {}", p.display());
    }
    let doc = WakeupDoc {
        kind: "wakeup".into(),
        primitive: cfg.primitive,
        rounds: cfg.rounds,
        warmup: cfg.warmup,
        period_us: cfg.period_us,
        settings: results,
        host: HostInfo::collect(&procfs, &sysfs),
    };
    if a.json {
        print_json(&doc)?;
    } else {
        print_wakeup_table(&doc.settings);
    }
    Ok(ExitCode::SUCCESS)
}

/// Human table of wakeup results beside the paper's figures.
pub fn print_wakeup_table(results: &[SettingResult]) {
    println!("Time to wake up a blocked thread (us)        paper p50: PM / VM");
    println!("setting  samples   mean    p50    p90    p99  discarded  lost   PM    VM");
    for r in results {
        let (pm, vm) = r.setting.paper_us();
        println!(
            "{:<7} {:>8} {:>6} {:>6} {:>6} {:>6} {:>10} {:>5} {:>4} {:>5}   {}",
            r.setting.to_string(),
            r.samples,
            opt_us(r.mean_us),
            opt_us(r.p50_us),
            opt_us(r.p90_us),
            opt_us(r.p99_us),
            r.discarded,
            r.lost,
            pm,
            vm,
            r.description
        );
    }
}

/// Every kernel's name, for the error about an unknown one.
fn all_kernel_names() -> String {
    let names: Vec<&str> = Workload::ALL.iter().map(|w| w.name()).chain(LatencyKernel::ALL.iter().map(|k| k.name())).collect();
    names.join(", ")
}

/// A flag given to a kernel that does not use it.
fn unused_flag<T: std::fmt::Display>(flag: &str, value: Option<T>, allowed: &str) -> Result<(), BadInput> {
    value.map_or(Ok(()), |v| Err(BadInput::new(flag, v, allowed)))
}

/// Resolve `bench workload` flags into a throughput kernel and its parameters (latency
/// kernels: [`latency_params`]).
pub fn workload_params(a: &WorkloadArgs) -> Result<(Workload, WorkloadParams), BadInput> {
    let w = Workload::parse(&a.name)?;
    let latency_only = "only with the latency kernels (pingpong, openloop)";
    unused_flag("--client-cpu", a.client_cpu, latency_only)?;
    unused_flag("--server-cpu", a.server_cpu, latency_only)?;
    unused_flag("--duration-ms", a.duration_ms, latency_only)?;
    unused_flag("--rounds", a.rounds, "only with pingpong")?;
    unused_flag("--think-us", a.think_us, "only with pingpong")?;
    unused_flag("--rate", a.rate, "only with openloop")?;
    unused_flag("--seed", a.seed, "only with openloop")?;
    let mut p = if a.quick { WorkloadParams::quick(w) } else { WorkloadParams::default_for(w) };
    if let Some(t) = a.threads {
        p.threads = t;
    }
    if let Some(x) = a.work_us {
        p.work_us = x;
    }
    if let Some(n) = a.items {
        p.items = n;
    }
    p.iters_per_us = a.iters_per_us;
    p.validate()?;
    if a.runs == 0 || a.runs > 1000 {
        return Err(BadInput::new("--runs", a.runs, "1..=1000"));
    }
    Ok((w, p))
}

/// Resolve `bench workload pingpong|openloop` flags into the kernel's parameters; `allowed`
/// are the CPUs this process may use.
pub fn latency_params(k: LatencyKernel, a: &WorkloadArgs, allowed: &CpuSet) -> Result<LatencyParams, BadInput> {
    let not_here = format!("not with {k}: a latency kernel runs one client and one server for --duration-ms");
    unused_flag("--threads", a.threads, &not_here)?;
    unused_flag("--items", a.items, &not_here)?;
    if a.runs == 0 || a.runs > 1000 {
        return Err(BadInput::new("--runs", a.runs, "1..=1000"));
    }
    let duration = a.duration_ms.or(a.quick.then_some(latency::QUICK_DURATION_MS));
    let p = match k {
        LatencyKernel::Pingpong => {
            let server_only_answers = "not with pingpong (the server only answers; see openloop)";
            unused_flag("--work-us", a.work_us, server_only_answers)?;
            unused_flag("--iters-per-us", a.iters_per_us, server_only_answers)?;
            unused_flag("--rate", a.rate, "only with openloop (pingpong is a closed loop)")?;
            unused_flag("--seed", a.seed, "only with openloop")?;
            let mut p = PingpongParams::for_cpus(allowed);
            (p.client_cpu, p.server_cpu) = latency_cpus(a, allowed, (p.client_cpu, p.server_cpu));
            p.think_us = a.think_us.unwrap_or(0);
            if let Some(n) = a.rounds {
                (p.rounds, p.duration_ms) = (Some(n), None);
            } else if let Some(ms) = duration {
                p.duration_ms = Some(ms);
            }
            LatencyParams::Pingpong(p)
        }
        LatencyKernel::Openloop => {
            unused_flag("--rounds", a.rounds, "only with pingpong (openloop runs for --duration-ms)")?;
            unused_flag("--think-us", a.think_us, "only with pingpong (openloop's arrivals are set by --rate)")?;
            let mut p = OpenloopParams::for_cpus(allowed);
            (p.client_cpu, p.server_cpu) = latency_cpus(a, allowed, (p.client_cpu, p.server_cpu));
            p.rate_per_s = a.rate.unwrap_or(p.rate_per_s);
            p.duration_ms = duration.unwrap_or(p.duration_ms);
            p.work_us = a.work_us.unwrap_or(p.work_us);
            p.seed = a.seed.unwrap_or(p.seed);
            p.iters_per_us = a.iters_per_us;
            LatencyParams::Openloop(p)
        }
    };
    p.validate(allowed)?;
    Ok(p)
}

/// Client and server CPUs from the flags: a CPU given for one side moves the other side's
/// default off it, when another CPU is allowed.
fn latency_cpus(a: &WorkloadArgs, allowed: &CpuSet, (client, server): (u32, u32)) -> (u32, u32) {
    let other = |c: u32| allowed.iter().find(|&x| x != c).unwrap_or(c);
    match (a.client_cpu, a.server_cpu) {
        (Some(c), Some(s)) => (c, s),
        (Some(c), None) => (c, if server == c { other(c) } else { server }),
        (None, Some(s)) => (if client == s { other(s) } else { client }, s),
        (None, None) => (client, server),
    }
}

/// Run a latency kernel `runs` times in this process and build its document: the same
/// [`BenchDoc`] as the throughput kernels', each run's [`gleaner_measure::RunMetrics`] with
/// its latency summary.
pub fn latency_doc(p: &LatencyParams, runs: u32) -> anyhow::Result<BenchDoc> {
    let procfs = Procfs::new();
    let sysfs = Sysfs::new();
    let cpus = measure::allowed_cpu_set();
    // Validated, compute rate fixed and arrivals drawn once, outside the measured runs.
    let plan = LatencyPlan::new(p)?;
    let k = plan.kernel();
    let mut metrics = Vec::new();
    let mut last = None;
    for i in 0..runs {
        let (out, mut m) =
            measure::measure_in_process(&procfs, &sysfs, &cpus, || plan.run()).with_context(|| format!("{k} run {}", i + 1))?;
        m.items = Some(out.items);
        m.throughput = Some(out.items as f64 * 1e9 / m.wall_ns.max(1) as f64);
        m.latency = out.summary();
        let us = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{:.1} us", v / 1e3));
        eprintln!(
            "{k} run {}/{runs}: {} {} in {}, latency p50 {} p99 {}, {} idle entries",
            i + 1,
            out.items,
            k.item_unit(),
            ms(m.wall_ns as f64),
            us(m.latency.as_ref().map(|l| l.p50_ns)),
            us(m.latency.as_ref().map(|l| l.p99_ns)),
            m.idle_entries.map_or_else(|| "-".into(), |e| e.to_string())
        );
        metrics.push(m);
        last = Some(out);
    }
    let mut params = serde_json::to_value(plan.params())?;
    if let (Some(obj), Some(out)) = (params.as_object_mut(), last) {
        obj.insert("item_unit".into(), k.item_unit().into());
        obj.insert("checksum".into(), format!("{:#018x}", out.checksum).into());
        if k == LatencyKernel::Openloop {
            obj.insert("iters_per_item".into(), out.iters_per_item.into());
            obj.insert("requests".into(), plan.schedule().len().into());
        }
    }
    Ok(BenchDoc {
        kind: "workload".into(),
        name: k.name().into(),
        params,
        summary: RunSummary::of(&metrics)?,
        runs: metrics,
        host: HostInfo::collect(&procfs, &sysfs),
    })
}

/// Run kernel `w` `runs` times in this process and build its document.
pub fn workload_doc(w: Workload, p: &WorkloadParams, runs: u32) -> anyhow::Result<BenchDoc> {
    let procfs = Procfs::new();
    let sysfs = Sysfs::new();
    let cpus = measure::allowed_cpu_set();
    let mut p = p.clone();
    // Fix the compute rate for all runs of this document.
    let rate = *p.iters_per_us.get_or_insert_with(workload::compute::iters_per_us);
    let mut metrics = Vec::new();
    let mut last = None;
    for i in 0..runs {
        let (out, mut m) = measure::measure_in_process(&procfs, &sysfs, &cpus, || workload::run_workload(w, &p))
            .with_context(|| format!("{w} run {}", i + 1))?;
        m.items = Some(out.items);
        m.throughput = Some(out.items as f64 * 1e9 / m.wall_ns.max(1) as f64);
        eprintln!(
            "{w} run {}/{runs}: {} wall, {:.0} {}/s, {} idle entries",
            i + 1,
            ms(m.wall_ns as f64),
            m.throughput.unwrap_or(0.0),
            w.item_unit(),
            m.idle_entries.map_or_else(|| "-".into(), |e| e.to_string())
        );
        metrics.push(m);
        last = Some(out);
    }
    let mut params = serde_json::to_value(&p)?;
    if let (Some(obj), Some(out)) = (params.as_object_mut(), last) {
        obj.insert("iters_per_us".into(), rate.into());
        obj.insert("iters_per_item".into(), out.iters_per_item.into());
        obj.insert("checksum".into(), format!("{:#018x}", out.checksum).into());
        obj.insert("item_unit".into(), w.item_unit().into());
    }
    Ok(BenchDoc {
        kind: "workload".into(),
        name: w.name().into(),
        params,
        summary: RunSummary::of(&metrics)?,
        runs: metrics,
        host: HostInfo::collect(&procfs, &sysfs),
    })
}

pub(crate) fn workload(a: &WorkloadArgs) -> anyhow::Result<ExitCode> {
    let doc = match LatencyKernel::parse(&a.name) {
        Some(k) => latency_doc(&latency_params(k, a, &measure::allowed_cpu_set())?, a.runs)?,
        None if Workload::parse(&a.name).is_err() => {
            return Err(BadInput::new("workload", &a.name, all_kernel_names()).into());
        }
        None => {
            let (w, p) = workload_params(a)?;
            workload_doc(w, &p, a.runs)?
        }
    };
    if a.json {
        print_json(&doc)?;
    } else {
        print_doc(&doc);
        print_latency(&doc);
    }
    Ok(ExitCode::SUCCESS)
}

/// The latency kernels' part of the human output: each run's latency distribution and rate.
fn print_latency(doc: &BenchDoc) {
    let runs: Vec<(usize, &gleaner_measure::LatencySummary)> =
        doc.runs.iter().enumerate().filter_map(|(i, r)| r.latency.as_ref().map(|l| (i + 1, l))).collect();
    if runs.is_empty() {
        if doc.runs.iter().any(|r| r.items == Some(0)) {
            println!("latency          no samples (no request was scheduled)");
        }
        return;
    }
    let cpu = |key: &str| doc.params.get(key).and_then(serde_json::Value::as_u64).map_or_else(|| "-".into(), |c| c.to_string());
    println!("latency (us), client CPU {}, server CPU {}", cpu("client_cpu"), cpu("server_cpu"));
    println!("run    samples      mean       p50       p90       p99     p99.9       max   rate/s");
    for (i, l) in runs {
        let us = |ns: f64| format!("{:.1}", ns / 1e3);
        let rate = match (l.requested_per_s, l.achieved_per_s) {
            (Some(req), Some(got)) => format!("{got:.0} of {req:.0} requested"),
            _ => doc.runs[i - 1].throughput.map_or_else(|| "-".into(), |t| format!("{t:.0}")),
        };
        println!(
            "{i:<4} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}   {rate}",
            l.samples,
            us(l.mean_ns),
            us(l.p50_ns),
            us(l.p90_ns),
            us(l.p99_ns),
            us(l.p999_ns),
            us(l.max_ns as f64)
        );
        if let (Some(p50), Some(p99)) = (l.send_lag_p50_ns, l.send_lag_p99_ns) {
            println!("     sender late by p50 {} us, p99 {} us (included above)", us(p50), us(p99));
        }
    }
}

fn print_doc(doc: &BenchDoc) {
    let s = &doc.summary;
    println!(
        "{} {}: {} run(s) on {} CPU(s) ({})",
        doc.kind,
        doc.name,
        s.runs,
        doc.runs.first().map_or(0, |r| r.cpus_available),
        doc.host.kernel
    );
    println!("                      median        p10        p90");
    let row = |name: &str, x: &gleaner_policy::stats::Summary, f: &dyn Fn(f64) -> String| {
        println!("{name:<16} {:>11} {:>10} {:>10}", f(x.p50), f(x.p10), f(x.p90));
    };
    let msf = |v: f64| format!("{:.1}ms", v / 1e6);
    let num = |v: f64| format!("{v:.0}");
    row("wall", &s.wall_ns, &msf);
    row("cpu user", &s.user_ns, &msf);
    row("cpu sys", &s.sys_ns, &msf);
    row("vol. ctx sw", &s.vcsw, &num);
    row("invol. ctx sw", &s.nivcsw, &num);
    match (&s.idle_entries, &s.idle_entries_per_s) {
        (Some(e), Some(r)) => {
            row("idle entries", e, &num);
            row("idle entries/s", r, &num);
        }
        _ => println!("idle entries     unavailable ({})", doc.runs.first().map_or("", |r| r.idle_source.as_str())),
    }
    row("steal", &s.steal_ns, &msf);
    if let Some(t) = &s.throughput {
        row("throughput/s", t, &num);
    }
}

fn stderr_stdio() -> Stdio {
    std::io::stderr().as_fd().try_clone_to_owned().map_or_else(|_| Stdio::null(), Stdio::from)
}

/// Measure `cmd` `runs` times (its stdout goes to our stderr) and build the document.
pub fn run_doc(cmd: &[String], runs: u32) -> anyhow::Result<BenchDoc> {
    if runs == 0 || runs > 1000 {
        return Err(BadInput::new("--runs", runs, "1..=1000").into());
    }
    let Some(prog) = cmd.first() else {
        return Err(BadInput::new("command", "(empty)", "a program and its arguments after --").into());
    };
    let procfs = Procfs::new();
    let sysfs = Sysfs::new();
    let cpus = measure::allowed_cpu_set();
    let mut metrics = Vec::new();
    for i in 0..runs {
        let meter = SystemMeter::start(&procfs, &sysfs, &cpus)?;
        let child = Command::new(prog)
            .args(&cmd[1..])
            .stdin(Stdio::null())
            .stdout(stderr_stdio())
            .spawn()
            .map_err(|e| BadInput::new("command", prog, format!("a program that can be started ({e})")))?;
        let m = measure::measure_child(child, meter).with_context(|| format!("run {} of {}", i + 1, cmd.join(" ")))?;
        eprintln!("run {}/{runs}: {} wall, exit {}", i + 1, ms(m.wall_ns as f64), m.exit_code.unwrap_or(-1));
        metrics.push(m);
    }
    Ok(BenchDoc {
        kind: "run".into(),
        name: cmd.join(" "),
        params: serde_json::json!({ "command": cmd }),
        summary: RunSummary::of(&metrics)?,
        runs: metrics,
        host: HostInfo::collect(&procfs, &sysfs),
    })
}

pub(crate) fn run(a: &RunArgs) -> anyhow::Result<ExitCode> {
    let doc = run_doc(&a.command, a.runs)?;
    if a.json {
        print_json(&doc)?;
    } else {
        print_doc(&doc);
    }
    let failed: Vec<i32> = doc.runs.iter().filter_map(|r| r.exit_code).filter(|&c| c != 0).collect();
    if let Some(c) = failed.first() {
        eprintln!("gleaner: {} of {} runs of the command failed (first exit status {c})", failed.len(), doc.runs.len());
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// `bench overhead` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OverheadReport {
    pub base: String,
    pub target: String,
    /// Median CPU time (user + sys) of each side, ns: the stand-in for cycles.
    pub base_cpu_ns: f64,
    pub target_cpu_ns: f64,
    /// Median wall time of each side, ns.
    pub base_wall_ns: f64,
    pub target_wall_ns: f64,
    pub gamma_base: f64,
    pub gamma_target: f64,
    #[serde(flatten)]
    pub metrics: Overhead,
    pub note: String,
}

/// Compute the survey's metrics from two documents (medians over their runs).
pub fn overhead_of(
    base: &BenchDoc,
    target: &BenchDoc,
    gamma_base: Option<f64>,
    gamma_target: Option<f64>,
) -> anyhow::Result<OverheadReport> {
    let side = |d: &BenchDoc, gamma: Option<f64>, flag: &str| -> anyhow::Result<Side> {
        let cpu = median(&d.runs.iter().map(|r| r.cpu_ns() as f64).collect::<Vec<_>>())?;
        let wall = median(&d.runs.iter().map(|r| r.wall_ns as f64).collect::<Vec<_>>())?;
        let gamma = match gamma {
            Some(g) => check_gamma(flag, g)?,
            None => median(&d.runs.iter().map(|r| f64::from(r.cpus_available)).collect::<Vec<_>>())?,
        };
        Ok(Side { cpu, wall, gamma })
    };
    let b = side(base, gamma_base, "--gamma-base")?;
    let t = side(target, gamma_target, "--gamma-target")?;
    let metrics = overhead::overhead(b, t).map_err(|e| {
        BadInput::new(
            "result files",
            format!("{} / {}", base.name, target.name),
            format!("runs with CPU time, wall time and gamma > 0 ({e})"),
        )
    })?;
    Ok(OverheadReport {
        base: base.name.clone(),
        target: target.name.clone(),
        base_cpu_ns: b.cpu,
        target_cpu_ns: t.cpu,
        base_wall_ns: b.wall,
        target_wall_ns: t.wall,
        gamma_base: b.gamma,
        gamma_target: t.gamma,
        metrics,
        note: "CPU time (user + sys, rusage) stands in for CPU cycles: no hardware counters here".into(),
    })
}

/// Most CPUs a `--gamma-*` may count.
const MAX_GAMMA: f64 = 1_048_576.0;

/// A `--gamma-*` value: a number of CPUs in (0, [`MAX_GAMMA`]].
fn check_gamma(flag: &str, g: f64) -> Result<f64, BadInput> {
    if g.is_finite() && g > 0.0 && g <= MAX_GAMMA {
        Ok(g)
    } else {
        Err(BadInput::new(flag, g, "a number of CPUs in (0, 1048576]"))
    }
}

pub(crate) fn overhead(a: &OverheadArgs) -> anyhow::Result<ExitCode> {
    // The flags first: a bad value is named before any file is read.
    for (flag, g) in [("--gamma-base", a.gamma_base), ("--gamma-target", a.gamma_target)] {
        if let Some(g) = g {
            check_gamma(flag, g)?;
        }
    }
    let base = BenchDoc::load(&a.base)?;
    let target = BenchDoc::load(&a.target)?;
    let r = overhead_of(&base, &target, a.gamma_base, a.gamma_target)?;
    if a.json {
        print_json(&r)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "base:   {} ({}): median CPU {}, wall {}, gamma {}",
        a.base.display(),
        r.base,
        ms(r.base_cpu_ns),
        ms(r.base_wall_ns),
        r.gamma_base
    );
    println!(
        "target: {} ({}): median CPU {}, wall {}, gamma {}",
        a.target.display(),
        r.target,
        ms(r.target_cpu_ns),
        ms(r.target_wall_ns),
        r.gamma_target
    );
    println!("reduced resource efficiency d_eta_r = {:+.3}  (CPU time ratio - 1)", r.metrics.d_eta_r);
    println!("reduced temporal efficiency d_eta_t = {:+.3}  ((t_t*gamma_t - t_b*gamma_b) / (t_b*gamma_b))", r.metrics.d_eta_t);
    println!("overhead impact factor      omega   = {:.3}  ((1 + d_eta_t) / (1 + d_eta_r))", r.metrics.omega);
    println!("note: {}", r.note);
    Ok(ExitCode::SUCCESS)
}

/// `gleaner bench yielders -- CMD`: CMD runs as a child (its CPU time is its own) while this
/// process keeps a SCHED_IDLE yielding thread on every CPU; exits with CMD's status
/// (`128+n` if killed by signal n).
pub(crate) fn yielders(a: &YieldersArgs) -> anyhow::Result<ExitCode> {
    let allowed = measure::allowed_cpu_set();
    let cpus = match &a.cpus {
        None => allowed.clone(),
        Some(list) => {
            let c = gleaner_os::cpuset::CpuSet::parse(list).map_err(|_| BadInput::new("--cpus", list, "a CPU list such as 0-3"))?;
            if c.is_empty() || !c.iter().all(|x| allowed.contains(x)) {
                return Err(
                    BadInput::new("--cpus", list, format!("a non-empty subset of the CPUs this process may use ({allowed})")).into()
                );
            }
            c
        }
    };
    let (prog, args) =
        a.command.split_first().ok_or_else(|| BadInput::new("command", "(empty)", "a program and its arguments after --"))?;
    let loads = cpus.iter().map(wakeup::yielder_load).collect::<anyhow::Result<Vec<_>>>()?;
    let status = Command::new(prog)
        .args(args)
        .status()
        .map_err(|e| BadInput::new("command", prog, format!("a program that can be started ({e})")))?;
    drop(loads);
    use std::os::unix::process::ExitStatusExt;
    let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    Ok(ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1)))
}
