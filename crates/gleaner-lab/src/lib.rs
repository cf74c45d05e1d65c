//! `gleaner lab`: real QEMU guests for the survey's UC / OC / OC2 experiments.
//!
//! - [`cache`]: Debian kernel package -> cached `vmlinux` + 9p modules.
//! - [`guest`]: one QEMU guest (initramfs, 9p host root, result port, process-group guard).
//! - [`session`]: drives several guests, collects steps with host-side CPU times.
//! - [`accel`]: KVM-or-TCG detection by trying.
//! - [`experiment`]: experiment files (TOML) and the built-ins `uc`, `oc`, `oc2`.
//! - [`runner`]: runs an experiment; [`results`], [`report`]: JSON/CSV, Markdown + PNG.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

pub mod accel;
pub mod cache;
pub mod check;
pub mod cpio;
pub mod experiment;
pub mod guest;
pub mod hostproc;
pub mod interrupt;
pub mod knobs;
pub mod matrix;
pub mod modinfo;
pub mod native;
pub mod predict;
pub mod qmp;
pub mod report;
pub mod results;
pub mod runner;
pub mod session;

/// `gleaner lab ...`
#[derive(Debug, clap::Args)]
pub struct LabArgs {
    #[command(subcommand)]
    pub command: LabCommand,
    /// Lab cache directory (kernels). Default: $GLEANER_LAB_CACHE, /var/cache/gleaner-lab as
    /// root, else $XDG_CACHE_HOME/gleaner-lab.
    #[arg(long, global = true)]
    pub cache_dir: Option<PathBuf>,
}

#[derive(Debug, clap::Subcommand)]
pub enum LabCommand {
    /// Preflight: QEMU, kernel cache, acceleration (by trying), cgroups, free memory.
    Check(CheckArgs),
    /// Download the Debian kernel package with apt-get (never installed) into the lab cache.
    FetchKernel(FetchArgs),
    /// List the built-in experiments.
    List,
    /// Boot one guest and run a command in it (the host's root filesystem, read-only).
    Exec(ExecArgs),
    /// Run an experiment (built-in name or TOML file) and write results and a report.
    Run(RunArgs),
    /// Every idle policy (stock, naive yielders, idle=poll, guest haltpoll, Gleaner retention,
    /// consolidation, both) against every workload and co-runner in the overcommitted
    /// scenario; one report per cell and a matrix report (docs/lab.md).
    Matrix(MatrixArgs),
    /// Predict lab results with the simulator: each cell of a matrix (or one `lab run`)
    /// simulated from the lab's own measurements, beside what was measured (docs/sim.md).
    Predict(predict::PredictArgs),
}

/// Flags shared by `lab run` and `lab matrix`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunFlags {
    /// Small sizes and fewer runs (the experiment's quick settings).
    #[arg(long)]
    pub quick: bool,
    /// The gleaner binary to run natively and in the guests (default: this binary; any path,
    /// /tmp included: its directory is shared into the guests).
    #[arg(long)]
    pub gleaner: Option<PathBuf>,
    /// kvm, tcg or auto (try KVM, fall back to TCG).
    #[arg(long, default_value = "auto")]
    pub accel: String,
    /// Guest kernel version from the cache (default: newest).
    #[arg(long)]
    pub kernel: Option<String>,
    /// Host CPUs for guests and native runs (overrides the experiment), e.g. 0-1.
    #[arg(long)]
    pub pcpus: Option<String>,
    /// Runs per mode (overrides the experiment: 7, or 5 with --quick).
    #[arg(long)]
    pub runs: Option<u32>,
}

impl RunFlags {
    fn options(&self, out: PathBuf, cache_dir: PathBuf) -> anyhow::Result<runner::RunOptions> {
        let gleaner = match &self.gleaner {
            Some(g) => g.clone(),
            None => std::env::current_exe().context("locating this gleaner binary")?,
        };
        Ok(runner::RunOptions {
            out,
            quick: self.quick,
            gleaner,
            accel: self.accel.clone(),
            kernel: self.kernel.clone(),
            cache_dir,
            pcpus: self.pcpus.clone(),
            runs: self.runs,
            progress: true,
        })
    }
}

fn default_out(name: &str) -> PathBuf {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    PathBuf::from("lab-results").join(format!("{name}-{t}"))
}

#[derive(Debug, clap::Args)]
pub struct MatrixArgs {
    /// Workloads of VM A (comma-separated): pipeline, barrier, condvar, mutex, spin-barrier.
    #[arg(long, default_value = "pipeline,barrier,condvar")]
    pub workloads: String,
    /// Co-runners of VM B (comma-separated): matmul, freqsleep.
    #[arg(long, default_value = "matmul,freqsleep")]
    pub co_runners: String,
    /// Policies (comma-separated): stock, yielders, idle-poll, haltpoll, retention,
    /// consolidation, gleaner. Stock is always run (speedups are relative to it).
    #[arg(long, default_value = "stock,yielders,idle-poll,haltpoll,retention,consolidation,gleaner")]
    pub policies: String,
    /// Output directory (default: lab-results/matrix-UNIXTIME).
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub flags: RunFlags,
    /// Print the matrix as one JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Built-in experiment (uc, oc, oc2; see `gleaner lab list`) or an experiment TOML file.
    pub experiment: String,
    /// Output directory (default: lab-results/NAME-UNIXTIME).
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub flags: RunFlags,
    /// Print the results as one JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Fetch the kernel when the cache has none.
    #[arg(long)]
    pub fetch: bool,
    /// Print one JSON document.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct FetchArgs {
    /// Debian package to fetch (a metapackage is resolved to its kernel package).
    #[arg(long, default_value = cache::DEFAULT_META_PACKAGE)]
    pub package: String,
}

#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    /// vCPUs of the guest.
    #[arg(long, default_value_t = 2)]
    pub vcpus: u32,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 512)]
    pub memory_mib: u32,
    /// kvm, tcg or auto (try KVM, fall back to TCG).
    #[arg(long, default_value = "auto")]
    pub accel: String,
    /// Deadline for the whole guest run, in seconds.
    #[arg(long, default_value_t = 120)]
    pub timeout_s: u64,
    /// Extra guest kernel command-line argument (repeatable), e.g. `idle=poll`.
    #[arg(long = "kernel-arg", value_name = "ARG")]
    pub kernel_args: Vec<String>,
    /// The command (run through the host's /bin/sh inside the guest's chroot).
    #[arg(required = true, last = true)]
    pub command: Vec<String>,
}

pub fn run(args: LabArgs) -> anyhow::Result<ExitCode> {
    interrupt::install().context("installing signal handlers")?;
    let cache_dir = cache::resolve_cache_dir(args.cache_dir.as_deref());
    match args.command {
        LabCommand::Predict(p) => predict::run(&p),
        LabCommand::FetchKernel(f) => {
            let k = cache::fetch_kernel(&cache_dir, Some(&f.package), &mut |s| eprintln!("lab: {s}"))?;
            println!("{} {}", k.meta.version, k.dir.display());
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Exec(e) => {
            let kernel = cache::find_kernel(&cache_dir, None)?;
            let busybox = guest::find_busybox()?;
            let acc = accel::resolve(&e.accel, &kernel, &busybox)?;
            let cmd = e.command.iter().map(|a| accel::shell_quote(a)).collect::<Vec<_>>().join(" ");
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
        LabCommand::List => {
            for (name, text) in experiment::BUILTIN {
                let e = experiment::Experiment::parse(text, name)?;
                println!("{name:5} {:?}: {}", e.scenario, e.description);
            }
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Check(c) => {
            let me = std::env::current_exe().ok();
            let items = check::run_checks(&cache_dir, c.fetch, true, me.as_deref());
            let ok = items.iter().all(|i| i.ok || !i.required);
            if c.json {
                println!("{}", serde_json::json!({ "ok": ok, "cache_dir": cache_dir, "items": items }));
            } else {
                for i in &items {
                    let mark = if i.ok { "ok  " } else if i.required { "FAIL" } else { "warn" };
                    println!("{mark} {:13} {}", i.name, i.detail);
                    if let Some(fix) = &i.fix {
                        println!("     {:13} -> {fix}", "");
                    }
                }
                println!("{}", if ok { "lab: ready" } else { "lab: not ready (see FAIL lines)" });
            }
            Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        LabCommand::Run(r) => {
            let exp = experiment::Experiment::load(&r.experiment)?;
            let out = r.out.clone().unwrap_or_else(|| default_out(&exp.name));
            let opts = r.flags.options(out.clone(), cache_dir)?;
            let results = runner::run_experiment(&exp, &opts)?;
            let report = report::write(&out, &results)?;
            if r.json {
                println!("{}", serde_json::to_string(&results)?);
            } else {
                println!("{}", report::main_table(&results));
                println!("acceleration: {}; boot: {}", results.accel, results.boot_s.iter().map(|(k, v)| format!("{k} {v:.1}s")).collect::<Vec<_>>().join(", "));
            }
            eprintln!("lab: report in {}", report.display());
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Matrix(m) => {
            let workloads = matrix::parse_list("--workloads", &m.workloads, gleaner_bench::workload::Workload::parse)?;
            let co_runners = matrix::parse_list("--co-runners", &m.co_runners, gleaner_bench::workload::Workload::parse)?;
            let policies = matrix::parse_list("--policies", &m.policies, experiment::Policy::parse)?;
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
    }
}
