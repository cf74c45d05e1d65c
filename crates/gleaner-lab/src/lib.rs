//! `gleaner lab`: real QEMU guests for the survey's UC / OC / OC2 experiments.
//!
//! The guests themselves (kernel cache, QEMU launcher, guest fixture, sessions, KVM-or-TCG)
//! are [`gleaner_qemu`]'s, shared with the host agent's QEMU tests.
//!
//! - [`experiment`]: experiment files (TOML) and the built-ins `uc`, `oc`, `oc2`.
//! - [`cli`]: the command line (clap types) and its parsing into typed values.
//! - [`runner`]: runs an experiment; [`results`], [`report`]: JSON/CSV, Markdown + PNG.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use gleaner_qemu::kernel as cache;
use gleaner_qemu::{accel, guest, interrupt, session};

pub mod check;
pub mod cli;
pub mod experiment;
pub mod keys;
pub mod matrix;
pub mod native;
pub mod predict;
pub mod qmp;
pub mod report;
pub mod results;
pub mod runner;

pub use cli::{CheckArgs, ExecArgs, FetchArgs, LabArgs, LabCommand, MatrixArgs, PredictArgs, RunArgs, RunFlags};

fn default_out(name: &str) -> PathBuf {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    PathBuf::from("lab-results").join(format!("{name}-{t}"))
}

/// Runs one `gleaner lab` command.
pub fn run(args: LabArgs) -> anyhow::Result<ExitCode> {
    interrupt::install().context("installing signal handlers")?;
    let cache_dir = cache::resolve_cache_dir(args.cache_dir.as_deref());
    match args.command {
        LabCommand::Predict(p) => predict::run(&p),
        LabCommand::FetchKernel(f) => fetch_kernel(&cache_dir, &f),
        LabCommand::Exec(e) => exec(&cache_dir, &e),
        LabCommand::List => list(),
        LabCommand::Check(c) => preflight(&cache_dir, &c),
        LabCommand::Run(r) => run_experiment(cache_dir, &r),
        LabCommand::Matrix(m) => run_matrix(cache_dir, &m),
    }
}

/// `gleaner lab fetch-kernel`: fetches the kernel into the cache and prints its version and directory.
fn fetch_kernel(cache_dir: &Path, f: &FetchArgs) -> anyhow::Result<ExitCode> {
    let k = cache::fetch_kernel(cache_dir, Some(&f.package), &mut |s| eprintln!("lab: {s}"))?;
    println!("{} {}", k.meta.version, k.dir.display());
    Ok(ExitCode::SUCCESS)
}

/// `gleaner lab exec`: boots one guest, runs the command in it and prints its output.
fn exec(cache_dir: &Path, e: &ExecArgs) -> anyhow::Result<ExitCode> {
    let choice = accel::AccelChoice::parse("--accel", &e.accel)?;
    let kernel = cache::find_kernel(cache_dir, None)?;
    let busybox = guest::find_busybox()?;
    let acc = accel::resolve(choice, &kernel, &busybox)?;
    let cmd = e.command.iter().map(|a| guest::shell_quote(a)).collect::<Vec<_>>().join(" ");
    let mut spec = guest::GuestSpec::new("lab-exec")
        .vcpus(e.vcpus)
        .memory_mib(e.memory_mib)
        .accel(acc)
        .kernel_args(e.kernel_args.clone())
        .job(format!("step exec {cmd}\n"));
    // This binary's directory is visible in the guest even under /tmp.
    if let Some(dir) = std::env::current_exe().ok().and_then(|p| p.parent().map(std::path::Path::to_path_buf)) {
        spec = spec.share(&dir);
    }
    let (boot, steps, _) = session::run_single(&kernel, &busybox, &spec, Duration::from_secs(e.timeout_s))?;
    let step = steps.first().context("the guest reported no step")?;
    eprintln!("lab: accel={acc} boot={boot:.2}s rc={} host_cpu={:.2}s", step.rc, step.host_cpu_ns() as f64 / 1e9);
    println!("{}", step.stdout);
    Ok(if step.rc == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// `gleaner lab list`: the built-in experiments.
fn list() -> anyhow::Result<ExitCode> {
    for (name, text) in experiment::BUILTIN {
        let e = experiment::Experiment::parse(text, name)?;
        println!("{name:5} {:?}: {}", e.scenario, e.description);
    }
    Ok(ExitCode::SUCCESS)
}

/// `gleaner lab check`: runs the preflight checks and prints them (or their JSON).
fn preflight(cache_dir: &Path, c: &CheckArgs) -> anyhow::Result<ExitCode> {
    let me = std::env::current_exe().ok();
    let items = check::run_checks(cache_dir, c.fetch, true, me.as_deref());
    let ok = items.iter().all(|i| i.ok || !i.required);
    if c.json {
        println!("{}", serde_json::json!({ "ok": ok, "cache_dir": cache_dir, "items": items }));
    } else {
        for i in &items {
            let mark = if i.ok {
                "ok  "
            } else if i.required {
                "FAIL"
            } else {
                "warn"
            };
            println!("{mark} {:13} {}", i.name, i.detail);
            if let Some(fix) = &i.fix {
                println!("     {:13} -> {fix}", "");
            }
        }
        println!("{}", if ok { "lab: ready" } else { "lab: not ready (see FAIL lines)" });
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// `gleaner lab run`: runs one experiment and writes its report.
fn run_experiment(cache_dir: PathBuf, r: &RunArgs) -> anyhow::Result<ExitCode> {
    let exp = experiment::Experiment::load(&r.experiment)?;
    let out = r.out.clone().unwrap_or_else(|| default_out(&exp.name));
    let opts = r.flags.options(out.clone(), cache_dir)?;
    let results = runner::run_experiment(&exp, &opts)?;
    let report = report::write(&out, &results)?;
    if r.json {
        println!("{}", serde_json::to_string(&results)?);
    } else {
        println!("{}", report::main_table(&results));
        println!(
            "acceleration: {}; boot: {}",
            results.accel,
            results.boot_s.iter().map(|(k, v)| format!("{k} {v:.1}s")).collect::<Vec<_>>().join(", ")
        );
    }
    eprintln!("lab: report in {}", report.display());
    Ok(ExitCode::SUCCESS)
}

/// `gleaner lab matrix`: runs every cell of the matrix and writes its report.
fn run_matrix(cache_dir: PathBuf, m: &MatrixArgs) -> anyhow::Result<ExitCode> {
    let workloads = matrix::parse_list("--workloads", &m.workloads, gleaner_bench::workload::Workload::parse)?;
    let co_runners = matrix::parse_list("--co-runners", &m.co_runners, gleaner_bench::workload::Workload::parse)?;
    let policies = matrix::parse_list("--policies", &m.policies, experiment::parse_policy)?;
    let out = m.out.clone().unwrap_or_else(|| default_out("matrix"));
    let opts = m.flags.options(out.clone(), cache_dir)?;
    let results = matrix::run_matrix(&workloads, &co_runners, &policies, &opts)?;
    let report = matrix::write(&out, &results)?;
    predict::append_to_matrix_report(&out);
    if m.json {
        println!("{}", serde_json::to_string(&results)?);
    } else {
        println!("{}", matrix::table(&results));
        for v in matrix::verdicts(&results) {
            println!("{v}");
        }
    }
    eprintln!("lab: matrix report in {}", report.display());
    Ok(ExitCode::SUCCESS)
}
