//! `gleaner sim`: a deterministic discrete-event simulator of two-level scheduling (a KVM-like
//! host scheduling vCPUs, guests scheduling threads) that runs the real policy code of
//! `gleaner-policy`: the Gleaner consolidation controller and idle detector inside simulated
//! guests, AQL_Sched's recognizer and clustering on the simulated host.
//!
//! ```text
//!   scenario.toml ──> scenario::expand_cases ──> runner::run_cases ──(rayon)──> Engine::run
//!                                                   │  per case x variant,      (one thread,
//!                                                   │  plus native baselines     integer ns,
//!                                                   v                            seeded RNG)
//!                                               Report ──> table | --json | --plot
//! ```
//!
//! Modules: [`queue`] (event heap), [`engine`] (pCPUs, vCPUs, host scheduler), [`guest`]
//! (guest scheduler, threads, sync objects), [`agent`] (Gleaner in the guest, host policy
//! period), [`policy`] (host policy trait, stock and AQL), [`workload`] (thread programs and
//! built-ins), [`scenario`] (files, validation), [`runner`] (runs, report), [`stats`].
//! See docs/sim.md for the model and its fidelity.

// Entity indices (pCPUs, vCPUs, threads, sync objects) are u32 by design and bounded by scenario
// validation (<= 4096 CPUs, <= 2^20 threads per group); f64 -> u64 casts are of validated,
// finite, non-negative durations (and `as` saturates).
#![allow(clippy::cast_possible_truncation)]

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use gleaner_policy::input::BadInput;

pub mod agent;
pub mod cli;
pub mod engine;
pub mod guest;
pub mod knob_probe;
pub mod plot;
pub mod policy;
pub mod predict;
pub mod queue;
pub mod runner;
pub mod scenario;
pub mod stats;
pub mod workload;

pub use cli::{PredictArgs, RunOpts, SimArgs, SimCommand, SweepArgs};
pub use runner::{run_cases, Report};

/// Built-in scenarios: name, description, file text.
pub const SCENARIOS: &[(&str, &str, &str)] = &[
    (
        "table2",
        "Table 2: wake-up latency in settings A-D, and E (B next to a co-runner) (ping-pong)",
        include_str!("../scenarios/table2.toml"),
    ),
    ("table1", "Table 1: dedup native / dedicated / shared with streamcluster or matmul", include_str!("../scenarios/table1.toml")),
    ("fig1", "Figure 1: slowdown vs idle-transition frequency over the built-in workloads", include_str!("../scenarios/fig1.toml")),
    ("fig7", "Figure 7: Gleaner on an oversubscribed host (app VM + matmul VM)", include_str!("../scenarios/fig7.toml")),
    (
        "idle-policies",
        "stock vs halt polling off/on vs guest haltpoll vs idle=poll vs Gleaner on dedup",
        include_str!("../scenarios/idle-policies.toml"),
    ),
    ("aql", "AQL_Sched vs a fixed slice: spin barriers next to an LLC-friendly hog", include_str!("../scenarios/aql.toml")),
    (
        "aql-fig6",
        "AQL_Sched Figure 6: per-type performance vs a fixed 30 ms slice, 16 vCPUs on 4 pCPUs",
        include_str!("../scenarios/aql-fig6.toml"),
    ),
    (
        "vm-matrix",
        "idle policies on a 2-vCPU VM: ping-pong, open loop at 3 rates, pipeline, saturated (compare --policies)",
        include_str!("../scenarios/vm-matrix.toml"),
    ),
    ("scale", "64 pCPUs, 4 VMs x 64 vCPUs x 257 pipeline threads, 1 simulated second", include_str!("../scenarios/scale.toml")),
];

/// Loads a scenario by file path or built-in name: (name, text).
pub fn load_scenario(arg: &str) -> anyhow::Result<(String, String)> {
    if let Some((n, _, text)) = SCENARIOS.iter().find(|(n, _, _)| *n == arg) {
        return Ok((n.to_string(), text.to_string()));
    }
    let p = Path::new(arg);
    if p.exists() {
        let text = std::fs::read_to_string(p).with_context(|| format!("reading scenario {}", p.display()))?;
        return Ok((arg.to_string(), text));
    }
    let names: Vec<&str> = SCENARIOS.iter().map(|(n, _, _)| *n).collect();
    Err(BadInput::new("scenario", arg, format!("a TOML file or a built-in scenario: {}", names.join(", "))).into())
}

/// Runs `f` on a rayon pool of `jobs` threads (`None`: the global pool, all cores); `--jobs 0`
/// is bad input.
pub fn with_pool<T: Send>(jobs: Option<usize>, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
    match jobs {
        None => Ok(f()),
        Some(0) => Err(BadInput::new("--jobs", 0, ">= 1").into()),
        Some(n) => Ok(rayon::ThreadPoolBuilder::new().num_threads(n).build()?.install(f)),
    }
}

/// Runs a scenario text (all its cases and variants).
pub fn run_text(name: &str, text: &str, seed: Option<u64>, timing: bool) -> anyhow::Result<Report> {
    let cases = scenario::expand_cases(text, name)?;
    let seed = seed.unwrap_or(cases[0].1.seed);
    run_cases(&cases[0].1.name, &cases[0].1.description, &cases, seed, timing)
}

/// A scenario text's cases with `--from-calibration` applied (it overrides every case's
/// `costs.calibration`), and one line on stderr per calibration record the cases use: the
/// file and the costs taken from it (and a note where RV was clamped). Bad records are bad
/// input here, before anything runs.
pub fn cli_cases(name: &str, text: &str, calibration: Option<&Path>) -> anyhow::Result<Vec<(String, scenario::Scenario)>> {
    let mut cases = scenario::expand_cases(text, name)?;
    if let Some(file) = calibration {
        for (_, sc) in &mut cases {
            sc.costs.calibration = Some(file.to_path_buf());
        }
    }
    let mut told: Vec<(std::path::PathBuf, scenario::Costs)> = Vec::new();
    for (_, sc) in &cases {
        let r = sc.resolve_costs()?;
        let Some(c) = r.calibration else { continue };
        if told.iter().any(|(f, vm)| *f == c.file && *vm == r.vm) {
            continue;
        }
        eprintln!("gleaner sim: {}", c.describe(&r.vm));
        if let Some(note) = c.clamp_note() {
            eprintln!("gleaner sim: {note}");
        }
        told.push((c.file, r.vm));
    }
    Ok(cases)
}

fn emit(reports: &[Report], opts: &RunOpts, many: bool) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if opts.json {
        let s = if many { serde_json::to_string_pretty(reports)? } else { serde_json::to_string_pretty(&reports[0])? };
        writeln!(out, "{s}")?;
    } else {
        for r in reports {
            write!(out, "{}", runner::render(r))?;
        }
    }
    if let Some(p) = &opts.plot {
        plot::wall_times(reports, p)?;
        eprintln!("gleaner sim: wrote {}", p.display());
    }
    Ok(())
}

/// Parses a seed list: a range `1-5` or a list `1,7,9` (bad input names `--seeds`).
pub fn parse_seeds(s: &str) -> anyhow::Result<Vec<u64>> {
    let bad = || BadInput::new("--seeds", s, "a range like 1-5 or a list like 1,7,9");
    if let Some((a, b)) = s.split_once('-') {
        let (a, b): (u64, u64) = (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
        if a > b || b - a > 10_000 {
            return Err(bad().into());
        }
        return Ok((a..=b).collect());
    }
    s.split(',').map(|x| x.trim().parse::<u64>().map_err(|_| bad().into())).collect()
}

fn parse_value(s: &str) -> toml::Value {
    let doc = format!("v = {s}");
    match toml::from_str::<toml::Table>(&doc) {
        Ok(mut t) => t.remove("v").unwrap_or_else(|| toml::Value::String(s.to_string())),
        Err(_) => toml::Value::String(s.to_string()),
    }
}

/// The sweep's cases: the cartesian product of the `--set` axes, applied to the scenario.
pub fn sweep_text(text: &str, sets: &[String]) -> anyhow::Result<String> {
    let mut axes: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    for s in sets {
        let (k, v) = s.split_once('=').ok_or_else(|| BadInput::new("--set", s, "KEY=V1,V2,... (e.g. host.pcpus=4,8,16)"))?;
        let keys: Vec<String> = k.split('+').map(|x| x.trim().to_string()).collect();
        let vals: Vec<String> = v.split(',').map(|x| x.trim().to_string()).collect();
        if keys.iter().any(|k| k.is_empty()) || vals.iter().any(|v| v.is_empty()) {
            return Err(BadInput::new("--set", s, "KEY=V1,V2,... with non-empty keys and values").into());
        }
        axes.push((keys, vals));
    }
    let base = scenario::parse(text, "sweep")?;
    if !base.cases.is_empty() {
        return Err(BadInput::new("sweep scenario", &base.name, "a scenario without [[case]] tables").into());
    }
    let mut combos: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for (keys, vals) in &axes {
        let mut next = Vec::new();
        for c in &combos {
            for v in vals {
                let mut c2 = c.clone();
                for k in keys {
                    c2.push((k.clone(), v.clone()));
                }
                next.push(c2);
            }
        }
        combos = next;
    }
    if combos.len() > 10_000 {
        return Err(BadInput::new("--set", format!("{} combinations", combos.len()), "at most 10000").into());
    }
    let mut doc: toml::Table = toml::from_str(text).map_err(|e| BadInput::new("scenario", e.message(), "TOML"))?;
    let mut cases = Vec::new();
    for c in combos {
        let mut case = toml::Table::new();
        let name: Vec<String> = c.iter().map(|(k, v)| format!("{k}={v}")).collect();
        case.insert("name".into(), toml::Value::String(name.join(" ")));
        let mut set = toml::Table::new();
        for (k, v) in c {
            set.insert(k, parse_value(&v));
        }
        case.insert("set".into(), toml::Value::Table(set));
        cases.push(toml::Value::Table(case));
    }
    doc.insert("case".into(), toml::Value::Array(cases));
    Ok(toml::to_string(&doc)?)
}

/// `gleaner sim predict`: runs `vm-matrix` (with the machine's wake costs when asked) and puts
/// its ratios beside the measured ones.
pub fn run_predict(a: &PredictArgs) -> anyhow::Result<predict::Prediction> {
    if let Some(d) = &a.measured {
        if !d.is_dir() {
            return Err(BadInput::new("--measured", d.display(), "a directory of `gleaner compare --json` documents").into());
        }
    }
    let (name, text) = load_scenario("vm-matrix")?;
    let cases = cli_cases(&name, &text, a.from_calibration.as_deref())?;
    let report = run_cases(&cases[0].1.name, &cases[0].1.description, &cases, a.seed.unwrap_or(cases[0].1.seed), false)?;
    predict::compare(&report, a.from_calibration.clone(), a.measured.as_deref())
}

/// Entry point of `gleaner sim`.
pub fn run(args: SimArgs) -> anyhow::Result<ExitCode> {
    if let Some(SimCommand::Predict(p)) = &args.command {
        let pred = run_predict(p)?;
        let mut out = std::io::stdout().lock();
        if p.json {
            writeln!(out, "{}", serde_json::to_string_pretty(&pred)?)?;
        } else {
            write!(out, "{}", predict::render(&pred))?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(SimCommand::Sweep(s)) = args.command {
        let (name, text) = load_scenario(&s.scenario)?;
        let swept = sweep_text(&text, &s.set)?;
        let seeds = match &s.seeds {
            Some(x) => parse_seeds(x)?.into_iter().map(Some).collect(),
            None => vec![s.opts.seed],
        };
        let timing = !s.opts.no_timing;
        let cases = cli_cases(&name, &swept, s.opts.from_calibration.as_deref())?;
        let (sname, sdesc) = (cases[0].1.name.clone(), cases[0].1.description.clone());
        let reports = with_pool(s.opts.jobs, || -> anyhow::Result<Vec<Report>> {
            seeds.iter().map(|&seed| run_cases(&sname, &sdesc, &cases, seed.unwrap_or(cases[0].1.seed), timing)).collect()
        })??;
        emit(&reports, &s.opts, true)?;
        return Ok(ExitCode::SUCCESS);
    }
    if args.list {
        let mut out = std::io::stdout().lock();
        if args.opts.json {
            let sc: Vec<_> = SCENARIOS.iter().map(|(n, d, _)| serde_json::json!({"name": n, "description": d})).collect();
            let wl: Vec<_> = workload::BUILTINS.iter().map(|(n, d)| serde_json::json!({"name": n, "description": d})).collect();
            writeln!(out, "{}", serde_json::to_string_pretty(&serde_json::json!({"scenarios": sc, "workloads": wl}))?)?;
        } else {
            writeln!(out, "built-in scenarios (gleaner sim NAME):")?;
            for (n, d, _) in SCENARIOS {
                writeln!(out, "  {n:<14} {d}")?;
            }
            writeln!(out, "\nbuilt-in workloads (vm.workload):")?;
            for (n, d) in workload::BUILTINS {
                writeln!(out, "  {n:<16} {d}")?;
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let Some(arg) = args.scenario else {
        // `--from-calibration table2`: the optional FILE took the scenario.
        let took = args
            .opts
            .from_calibration
            .as_deref()
            .and_then(Path::to_str)
            .filter(|f| SCENARIOS.iter().any(|(n, _, _)| n == f) || Path::new(f).extension().is_some_and(|e| e == "toml"));
        let allowed = match took {
            Some(f) => format!("a scenario file or built-in name (`--from-calibration {f}` read {f} as the record: put the scenario first, or write --from-calibration=FILE)"),
            None => "a scenario file or built-in name; see `gleaner sim --list`".into(),
        };
        return Err(BadInput::new("scenario", "(none)", allowed).into());
    };
    let (name, text) = load_scenario(&arg)?;
    if args.print {
        print!("{text}");
        return Ok(ExitCode::SUCCESS);
    }
    let timing = !args.opts.no_timing;
    let cases = cli_cases(&name, &text, args.opts.from_calibration.as_deref())?;
    let seed = args.opts.seed.unwrap_or(cases[0].1.seed);
    let report = with_pool(args.opts.jobs, || run_cases(&cases[0].1.name, &cases[0].1.description, &cases, seed, timing))??;
    emit(std::slice::from_ref(&report), &args.opts, false)?;
    Ok(ExitCode::SUCCESS)
}
