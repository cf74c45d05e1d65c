//! The command line of `gleaner lab`: clap's raw flags, and their parsing at the edge into
//! typed values ([`AccelChoice`], [`CpuSet`]) with one-line [`BadInput`] errors (exit 2).

use std::path::PathBuf;

use anyhow::Context;
use gleaner_os::cpuset::CpuSet;
use gleaner_os::BadInput;

use crate::predict::model::WakeStat;
use crate::runner;
use gleaner_qemu::accel::AccelChoice;
use gleaner_qemu::kernel as cache;

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
    Predict(PredictArgs),
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
    /// Runs per mode, 1..=1000 (overrides the experiment: 7, or 5 with --quick).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub runs: Option<u32>,
}

impl RunFlags {
    /// The run's resolved options: `--accel` and `--pcpus` parsed, the gleaner binary located.
    pub fn options(&self, out: PathBuf, cache_dir: PathBuf) -> anyhow::Result<runner::RunOptions> {
        let gleaner = match &self.gleaner {
            Some(g) => g.clone(),
            None => std::env::current_exe().context("locating this gleaner binary")?,
        };
        Ok(runner::RunOptions {
            out,
            quick: self.quick,
            gleaner,
            accel: AccelChoice::parse("--accel", &self.accel)?,
            kernel: self.kernel.clone(),
            cache_dir,
            pcpus: self.pcpus.as_deref().map(|p| cpu_list("--pcpus", p)).transpose()?,
            runs: self.runs,
            progress: true,
        })
    }
}

#[derive(Debug, clap::Args)]
pub struct MatrixArgs {
    /// Workloads of VM A (comma-separated): pipeline, barrier, condvar, mutex, spin-barrier.
    #[arg(long, default_value = "pipeline,barrier,condvar")]
    pub workloads: String,
    /// Co-runners of VM B (comma-separated): matmul, freqsleep.
    #[arg(long, default_value = "matmul,freqsleep")]
    pub co_runners: String,
    /// Policies (comma-separated): stock, yielders, poll, haltpoll, haltpoll:CAP, retention,
    /// consolidation, gleaner. Stock is always run (speedups are relative to it).
    #[arg(long, default_value = "stock,yielders,poll,haltpoll,retention,consolidation,gleaner")]
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
    /// vCPUs of the guest, 1..=64.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub vcpus: u32,
    /// Guest memory in MiB, 128..=16384 (as in experiment files).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(128..=16384))]
    pub memory_mib: u32,
    /// kvm, tcg or auto (try KVM, fall back to TCG).
    #[arg(long, default_value = "auto")]
    pub accel: String,
    /// Deadline for the whole guest run, in seconds, 1..=86400.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub timeout_s: u64,
    /// Extra guest kernel command-line argument (repeatable), e.g. `idle=poll`.
    #[arg(long = "kernel-arg", value_name = "ARG")]
    pub kernel_args: Vec<String>,
    /// The command (run through the host's /bin/sh inside the guest's chroot).
    #[arg(required = true, last = true)]
    pub command: Vec<String>,
}

/// `gleaner lab predict DIR`
#[derive(Debug, clap::Args)]
pub struct PredictArgs {
    /// A `gleaner lab matrix` directory (matrix.json), a `gleaner lab run` directory
    /// (results.json), or one of those files.
    pub dir: PathBuf,
    /// Simulator seeds, e.g. `1-3` or `1,7`. The kernels' compute is fixed, so seeds differ
    /// only with --jitter-pct.
    #[arg(long, default_value = "1")]
    pub seeds: String,
    /// Uniform jitter of every simulated compute step, percent, 0..=100 (a sensitivity check).
    #[arg(long, default_value_t = 0.0)]
    pub jitter_pct: f64,
    /// Statistic of the lab's wakeup measurements the simulator's costs come from.
    #[arg(long, value_enum, default_value = "p50")]
    pub wake_stat: WakeStat,
    /// EEVDF base slice of the lab's host, us, 0..=1000000 (default: debugfs or procfs when
    /// readable, else 0.75 ms x (1 + log2(online CPUs))).
    #[arg(long)]
    pub base_slice_us: Option<f64>,
    /// Scheduler tick of the lab's host, us, 0..=1000000 (default: 1 s / CONFIG_HZ; 250 Hz
    /// when unknown).
    #[arg(long)]
    pub tick_us: Option<f64>,
    /// Also write each cell's simulator scenario here (TOML; `gleaner sim FILE` runs it).
    #[arg(long, value_name = "DIR")]
    pub scenarios: Option<PathBuf>,
    /// Worker threads for the simulations, 1..=1024 (default: all cores).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub jobs: Option<usize>,
    /// Print one JSON document instead of the Markdown report.
    #[arg(long)]
    pub json: bool,
}

/// A non-empty CPU list in the kernel's format (`0-1`, `0,2`), named `what` in errors.
pub fn cpu_list(what: &str, text: &str) -> Result<CpuSet, BadInput> {
    match CpuSet::parse(text) {
        Ok(set) if !set.is_empty() => Ok(set),
        _ => Err(BadInput::new(what, text, "a CPU list like 0-1 or 0,2")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_non_empty_kernel_lists() {
        assert_eq!(cpu_list("--pcpus", "3,0-1").unwrap().to_vec(), [0, 1, 3]);
        for bad in ["", "x", "2-1", "0,,1"] {
            let e = cpu_list("--pcpus", bad).unwrap_err().to_string();
            assert_eq!(e, format!("invalid --pcpus '{bad}': allowed: a CPU list like 0-1 or 0,2"));
        }
    }

    #[test]
    fn run_flags_resolve_to_typed_options() {
        let flags =
            RunFlags { quick: true, gleaner: Some("/g".into()), accel: "kvm".into(), kernel: None, pcpus: Some("0-1".into()), runs: None };
        let o = flags.options("out".into(), "cache".into()).unwrap();
        assert_eq!((o.accel, o.pcpus.map(|p| p.to_string())), (AccelChoice::Kvm, Some("0-1".into())));
        let bad = RunFlags { accel: "hvf".into(), ..flags.clone() };
        let e = bad.options("out".into(), "cache".into()).unwrap_err();
        assert_eq!(e.to_string(), "invalid --accel 'hvf': allowed: auto, kvm, tcg");
        assert!(e.is::<BadInput>());
        let bad = RunFlags { pcpus: Some("1-0".into()), ..flags };
        assert!(bad.options("out".into(), "cache".into()).unwrap_err().to_string().contains("'1-0'"));
    }
}
