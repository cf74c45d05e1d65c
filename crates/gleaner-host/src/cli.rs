//! The command line of `gleaner host`, in two layers (ripgrep's lowargs/hiargs split):
//!
//! - the clap types ([`HostArgs`] and the per-command `*Args`): the flags as written, each
//!   already parsed by clap into its value type (`--cpus` a [`CpuSet`], `--types` a list of
//!   [`VcpuType`], `--metrics-addr` a [`SocketAddr`]); a malformed value stops at the edge,
//!   with clap's one-line message naming the value and what is allowed (exit status 2);
//! - the resolved options ([`MonitorOptions`], [`RunOptions`], [`CalibrateOptions`]): ranges
//!   checked, durations as [`Duration`], what a command handler takes. Resolving fails with
//!   [`BadInput`] (exit status 2) for values clap cannot judge alone (a range, a relation
//!   between two flags).
//!
//! The handlers in `crate::cmd` never see a raw string.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use gleaner_os::cpuset::CpuSet;
use gleaner_os::BadInput;
use gleaner_policy::aql::VcpuType;

use crate::discover::Vm;

/// Default state file.
pub const STATE_PATH: &str = "/run/gleaner/host-state.json";

/// `gleaner host ...`
#[derive(Debug, clap::Args)]
pub struct HostArgs {
    #[command(subcommand)]
    pub command: HostCommand,
}

/// The host agent's commands.
#[derive(Debug, clap::Subcommand)]
pub enum HostCommand {
    /// List VMs (QEMU, Firecracker, Cloud Hypervisor) and their vCPU threads.
    Discover(DiscoverArgs),
    /// Monitor vCPUs for one window and print their cursors and types (changes nothing).
    Classify(ClassifyArgs),
    /// Type vCPUs continuously and apply pools (cpusets) and per-pool slices until stopped.
    Run(RunArgs),
    /// Measure each type's best quantum (slices 1, 10, 30, 60, 90 ms) and write the config.
    Calibrate(CalibrateArgs),
    /// Show the running agent's state file and what it changed.
    Status(StateArgs),
    /// Undo the changes of an agent that crashed (state file, then any gleaner-aql* cgroup).
    Restore(StateArgs),
}

/// Which VMs to look at.
#[derive(Debug, Clone, clap::Args)]
pub struct VmFilter {
    /// Only these VMs (pid or name; repeatable). Default: all.
    #[arg(long = "vm")]
    pub vms: Vec<String>,
}

impl VmFilter {
    /// True when `vm` passes the filter.
    pub fn keep(&self, vm: &Vm) -> bool {
        self.vms.is_empty() || self.vms.iter().any(|v| *v == vm.name || *v == vm.pid.to_string())
    }
}

#[derive(Debug, clap::Args)]
pub struct DiscoverArgs {
    #[command(flatten)]
    pub filter: VmFilter,
    /// Print one JSON document.
    #[arg(long)]
    pub json: bool,
}

/// Monitoring options shared by `classify` and `run`.
#[derive(Debug, Clone, clap::Args)]
pub struct MonitorArgs {
    #[command(flatten)]
    pub filter: VmFilter,
    /// Monitoring period in ms, 1..=10000 (the paper's 30 ms).
    #[arg(long, default_value_t = 30)]
    pub period_ms: u64,
    /// Periods per decision, 1..=1000 (the paper's n = 4).
    #[arg(long, default_value_t = 4)]
    pub window: usize,
    /// Configuration (quanta, thresholds). Default: /etc/gleaner/host.toml if present, else the
    /// paper's quanta.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Hysteresis in cursor points: a vCPU keeps its type until another cursor average beats
    /// it by more than this, 0..=100 (0 = the paper's rule).
    #[arg(long, default_value_t = 10.0)]
    pub hysteresis_points: f64,
}

#[derive(Debug, clap::Args)]
pub struct ClassifyArgs {
    #[command(flatten)]
    pub monitor: MonitorArgs,
    /// Print one JSON document.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub monitor: MonitorArgs,
    /// Compute and print the first plan and the changes it would make, then exit; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Stop (and restore everything) after this many seconds, in (0, 31536000]. Default: until
    /// SIGINT/SIGTERM.
    #[arg(long, value_parser = positive_seconds)]
    pub duration_s: Option<f64>,
    /// Stop (and restore) when no VM is left.
    #[arg(long)]
    pub exit_when_no_vms: bool,
    /// pCPUs the pools may use (kernel list, e.g. `2-15`). Default: all online CPUs.
    #[arg(long, value_name = "LIST", value_parser = cpu_list)]
    pub cpus: Option<CpuSet>,
    /// pCPUs kept out of every pool (the paper's dom0 socket), e.g. `0-3`.
    #[arg(long, value_name = "LIST", value_parser = cpu_list)]
    pub reserve_cpus: Option<CpuSet>,
    /// State file recording every change (for `restore` after a crash).
    #[arg(long, default_value = STATE_PATH)]
    pub state: PathBuf,
    /// Serve Prometheus metrics: a port alone (e.g. 9464) listens on 127.0.0.1 only; IP:PORT
    /// listens where told (another machine can then read them).
    #[arg(long, value_name = "[IP:]PORT", value_parser = metrics_addr)]
    pub metrics_addr: Option<SocketAddr>,
    /// Print one JSON document (at exit).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct CalibrateArgs {
    /// pCPU the kernels and competitors run on, 0..=4095 and online. Default: the last online
    /// CPU.
    #[arg(long)]
    pub cpu: Option<u32>,
    /// Slices to try, in ms (1..=100).
    #[arg(long, value_delimiter = ',', default_value = "1,10,30,60,90")]
    pub slices_ms: Vec<u64>,
    /// Measurement time per point (after a warm-up of a fifth of it); several rounds of the
    /// largest slice over all threads sharing the pCPU; 1..=60000 ms.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub duration_ms: u64,
    /// Repeats per point (the median is kept), 1..=100.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeats: u32,
    /// Cache-thrashing CPU burners sharing the pCPU, 1..=64 (the paper: 2-4 vCPUs per pCPU).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub competitors: u32,
    /// LLC size to size the kernels for, bytes, 65536..=17179869184. Default: from sysfs.
    #[arg(long, value_parser = clap::value_parser!(u64).range(65_536..=17_179_869_184))]
    pub llc_bytes: Option<u64>,
    /// Types to calibrate (IOInt, ConSpin, LLCF, LoLCF, LLCO). Default: all.
    #[arg(long, value_delimiter = ',', value_parser = vcpu_type)]
    pub types: Vec<VcpuType>,
    /// Least relative gain over the 30 ms default for another slice to be chosen (raised to the
    /// repeats' noise when that is larger), in [0, 1); types whose slices all stay within it are
    /// agnostic.
    #[arg(long, default_value_t = 0.05)]
    pub agnostic_spread: f64,
    /// Config file to write.
    #[arg(long, default_value = crate::config::DEFAULT_PATH)]
    pub out: PathBuf,
    /// Measure and print, but do not write the config.
    #[arg(long)]
    pub no_write: bool,
    /// Print one JSON document.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct StateArgs {
    /// State file.
    #[arg(long, default_value = STATE_PATH)]
    pub state: PathBuf,
    /// Print one JSON document.
    #[arg(long)]
    pub json: bool,
}

// ---- value parsers (clap prints their message after "invalid value '<v>' for '<flag>'") ----

/// A kernel CPU list (`0-3,6`).
fn cpu_list(s: &str) -> Result<CpuSet, String> {
    CpuSet::parse(s).map_err(|e| format!("a CPU list like 0-3,6 ({e})"))
}

/// A vCPU type by name, any case.
pub fn vcpu_type(s: &str) -> Result<VcpuType, String> {
    VcpuType::ALL
        .into_iter()
        .find(|t| t.name().eq_ignore_ascii_case(s))
        .ok_or_else(|| "one of IOInt, ConSpin, LLCF, LoLCF, LLCO".to_string())
}

/// `[IP:]PORT` (a port alone is loopback).
fn metrics_addr(s: &str) -> Result<SocketAddr, String> {
    gleaner_os::input::metrics_addr("--metrics-addr", s).map_err(|e| e.allowed.to_string())
}

/// `value` of `flag` if within `range`, else the error naming the range as `LO..=HI`.
fn in_range<T: PartialOrd + std::fmt::Display>(flag: &str, value: T, range: std::ops::RangeInclusive<T>) -> Result<(), BadInput> {
    if range.contains(&value) {
        return Ok(());
    }
    Err(BadInput::new(flag, &value, format!("{}..={}", range.start(), range.end())))
}

/// Longest `--duration-s`: a year.
const MAX_DURATION_S: f64 = 31_536_000.0;

/// What `--duration-s` allows.
const DURATION_S: &str = "a number of seconds in (0, 31536000]";

/// A number of seconds in (0, [`MAX_DURATION_S`]].
fn positive_seconds(s: &str) -> Result<f64, String> {
    s.trim().parse::<f64>().ok().filter(|d| *d > 0.0 && *d <= MAX_DURATION_S).ok_or_else(|| DURATION_S.to_string())
}

// ---- resolved options: what the handlers take ----

/// `classify` and `run`'s monitoring options, checked.
#[derive(Debug, Clone)]
pub struct MonitorOptions {
    pub filter: VmFilter,
    pub period: Duration,
    pub window: usize,
    pub config: Option<PathBuf>,
    pub hysteresis_points: f64,
}

impl MonitorArgs {
    /// Checks the ranges clap does not know.
    pub fn resolve(&self) -> Result<MonitorOptions, BadInput> {
        in_range("--period-ms", self.period_ms, 1..=10_000)?;
        in_range("--window", self.window, 1..=1000)?;
        in_range("--hysteresis-points", self.hysteresis_points, 0.0..=100.0)?;
        Ok(MonitorOptions {
            filter: self.filter.clone(),
            period: Duration::from_millis(self.period_ms),
            window: self.window,
            config: self.config.clone(),
            hysteresis_points: self.hysteresis_points,
        })
    }
}

/// `run`'s options, checked. The CPU lists are checked against the online CPUs when the
/// topology is read (`crate::cmd::topology`).
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub monitor: MonitorOptions,
    pub dry_run: bool,
    pub duration: Option<Duration>,
    pub exit_when_no_vms: bool,
    pub cpus: Option<CpuSet>,
    pub reserve_cpus: Option<CpuSet>,
    pub state: PathBuf,
    pub metrics_addr: Option<SocketAddr>,
    pub json: bool,
}

impl RunArgs {
    /// Checks ranges and converts units. `duration_s` is checked again here because the
    /// struct can be built without clap (tests do).
    pub fn resolve(&self) -> Result<RunOptions, BadInput> {
        let duration = match self.duration_s {
            Some(d) if !(d > 0.0 && d <= MAX_DURATION_S) => return Err(BadInput::new("--duration-s", d, DURATION_S)),
            Some(d) => Some(Duration::try_from_secs_f64(d).map_err(|_| BadInput::new("--duration-s", d, DURATION_S))?),
            None => None,
        };
        Ok(RunOptions {
            monitor: self.monitor.resolve()?,
            dry_run: self.dry_run,
            duration,
            exit_when_no_vms: self.exit_when_no_vms,
            cpus: self.cpus.clone(),
            reserve_cpus: self.reserve_cpus.clone(),
            state: self.state.clone(),
            metrics_addr: self.metrics_addr,
            json: self.json,
        })
    }
}

/// `calibrate`'s options, checked (the CPU against the online CPUs in the handler).
#[derive(Debug, Clone)]
pub struct CalibrateOptions {
    pub cpu: Option<u32>,
    pub slices_ms: Vec<u64>,
    pub duration: Duration,
    pub repeats: u32,
    pub competitors: u32,
    pub llc_bytes: Option<u64>,
    /// Never empty: all types when none was named.
    pub types: Vec<VcpuType>,
    pub agnostic_spread: f64,
    /// Where to write the config; `None` with `--no-write`.
    pub out: Option<PathBuf>,
    pub json: bool,
}

impl CalibrateArgs {
    pub fn resolve(&self) -> Result<CalibrateOptions, BadInput> {
        if !(0.0..1.0).contains(&self.agnostic_spread) {
            return Err(BadInput::new("--agnostic-spread", self.agnostic_spread, "[0, 1)"));
        }
        // clap checks these too; the struct can be built without it (tests do).
        in_range("--duration-ms", self.duration_ms, 1..=60_000)?;
        in_range("--repeats", self.repeats, 1..=100)?;
        in_range("--competitors", self.competitors, 1..=64)?;
        if let Some(s) = self.slices_ms.iter().find(|s| !(1..=100).contains(*s)) {
            return Err(BadInput::new("--slices-ms", s, "1..=100 (the EEVDF slice range in whole ms)"));
        }
        if let Some(cpu) = self.cpu.filter(|c| *c > 4095) {
            return Err(BadInput::new("--cpu", cpu, "0..=4095, an online CPU"));
        }
        Ok(CalibrateOptions {
            cpu: self.cpu,
            slices_ms: self.slices_ms.clone(),
            duration: Duration::from_millis(self.duration_ms),
            repeats: self.repeats,
            competitors: self.competitors,
            llc_bytes: self.llc_bytes,
            types: if self.types.is_empty() { VcpuType::ALL.to_vec() } else { self.types.clone() },
            agnostic_spread: self.agnostic_spread,
            out: (!self.no_write).then(|| self.out.clone()),
            json: self.json,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        host: HostArgs,
    }

    fn parse(args: &[&str]) -> Result<HostCommand, clap::Error> {
        Cli::try_parse_from(std::iter::once("host").chain(args.iter().copied())).map(|c| c.host.command)
    }

    #[test]
    fn flags_arrive_typed() {
        let HostCommand::Run(r) =
            parse(&["run", "--cpus", "0-3,6", "--reserve-cpus", "0", "--metrics-addr", "9464", "--duration-s", "1.5"]).unwrap()
        else {
            panic!("not run")
        };
        let o = r.resolve().unwrap();
        assert_eq!(o.cpus.unwrap().to_vec(), vec![0, 1, 2, 3, 6]);
        assert_eq!(o.reserve_cpus.unwrap().to_vec(), vec![0]);
        assert_eq!(o.metrics_addr.unwrap().to_string(), "127.0.0.1:9464");
        assert_eq!(o.duration, Some(Duration::from_millis(1500)));
        assert_eq!(o.monitor.period, Duration::from_millis(30));
        let HostCommand::Calibrate(c) = parse(&["calibrate", "--types", "ioint,LLCF"]).unwrap() else { panic!("not calibrate") };
        assert_eq!(c.resolve().unwrap().types, vec![VcpuType::IoInt, VcpuType::Llcf]);
        let HostCommand::Calibrate(c) = parse(&["calibrate", "--no-write"]).unwrap() else { panic!("not calibrate") };
        let c = c.resolve().unwrap();
        assert_eq!((c.types.len(), c.out), (5, None));
    }

    #[test]
    fn bad_values_name_the_value_and_what_is_allowed() {
        for (args, value, allowed) in [
            (&["run", "--cpus", "3-1"][..], "3-1", "a CPU list like 0-3,6"),
            (&["run", "--reserve-cpus", "x"][..], "x", "a CPU list"),
            (&["run", "--metrics-addr", "localhost"][..], "localhost", "PORT (served on 127.0.0.1) or IP:PORT"),
            (&["run", "--duration-s", "0"][..], "0", "a number of seconds in (0, 31536000]"),
            (&["run", "--duration-s", "31536001"][..], "31536001", "a number of seconds in (0, 31536000]"),
            (&["calibrate", "--competitors", "65"][..], "65", "1..=64"),
            (&["calibrate", "--repeats", "0"][..], "0", "1..=100"),
            (&["calibrate", "--duration-ms", "60001"][..], "60001", "1..=60000"),
            (&["calibrate", "--types", "IOInt,Fast"][..], "Fast", "one of IOInt, ConSpin"),
        ] {
            let e = parse(args).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{args:?}");
            let first = e.to_string();
            let first = first.lines().next().unwrap();
            assert!(first.contains(&format!("'{value}'")) && first.contains(allowed), "{args:?}: {first}");
        }
        let HostCommand::Run(r) = parse(&["run", "--period-ms", "0"]).unwrap() else { panic!("not run") };
        assert_eq!(r.resolve().unwrap_err().to_string(), BadInput::new("--period-ms", 0, "1..=10000").to_string());
    }
}
