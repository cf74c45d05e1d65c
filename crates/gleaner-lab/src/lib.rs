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
pub mod cpio;
pub mod guest;
pub mod hostproc;
pub mod interrupt;
pub mod modinfo;
pub mod qmp;
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
    /// The command (run through the host's /bin/sh inside the guest's chroot).
    #[arg(required = true, last = true)]
    pub command: Vec<String>,
}

pub fn run(args: LabArgs) -> anyhow::Result<ExitCode> {
    interrupt::install().context("installing signal handlers")?;
    let cache_dir = cache::resolve_cache_dir(args.cache_dir.as_deref());
    match args.command {
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
            let spec = guest::GuestSpec::new("lab-exec")
                .vcpus(e.vcpus)
                .memory_mib(e.memory_mib)
                .accel(acc)
                .job(format!("step exec {cmd}\n"));
            let (boot, steps, _) = session::run_single(&kernel, &busybox, &spec, Duration::from_secs(e.timeout_s))?;
            let step = steps.first().context("the guest reported no step")?;
            eprintln!("lab: accel={acc} boot={boot:.2}s rc={} host_cpu={:.2}s", step.rc, step.host_cpu_ns() as f64 / 1e9);
            println!("{}", step.stdout);
            Ok(if step.rc == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        _ => anyhow::bail!("not yet"),
    }
}
