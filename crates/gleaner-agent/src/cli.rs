//! The agent's command line: clap types, and their resolution (`--config` file, then flags on
//! top, then validation) into the typed [`AgentConfig`] the agent runs on. Handlers never see
//! raw flags.

use std::path::PathBuf;

use crate::compare;
use crate::config::{self, AgentConfig};

/// Flags shared by `run` and `attach` (they override the `--config` file).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AgentFlags {
    /// TOML configuration file (see `gleaner daemon --print-config`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Do not keep idle vCPUs from halting (no kernel polling, no yielding threads): measure
    /// consolidation alone.
    #[arg(long)]
    pub no_retention: bool,
    /// Share of each managed vCPU's time retention may spend polling or yielding, in (0, 1]
    /// (default 1: an idle vCPU's time, spent only where it makes the workload's wakeups
    /// cheaper; docs/agent.md).
    #[arg(long, value_name = "SHARE")]
    pub budget: Option<f64>,
    /// Share of the managed vCPUs' time the workload and retention together may fill, in (0,
    /// 1] (default 0.9: headroom for a host that caps the VM's CPU at its vCPU count and stops
    /// the VM when it uses that up; 1 where the host has no cap; docs/agent.md).
    #[arg(long, value_name = "SHARE")]
    pub vm_share: Option<f64>,
    /// Leave the kernel's idle knobs alone (haltpoll window, per-CPU resume latency): keep
    /// vCPUs from halting with yielding threads only.
    #[arg(long)]
    pub no_kernel_polling: bool,
    /// Do not trace the workload's wakeups with eBPF: estimate idle periods from cpuidle
    /// counters instead.
    #[arg(long)]
    pub no_trace: bool,
    /// Do not change the workload's cpuset (measure retention alone).
    #[arg(long)]
    pub no_consolidation: bool,
    /// Sleep (microseconds, 0..=1000) of a yielding thread that steps aside so the kernel can
    /// pull a thread waiting on another vCPU; 0 never steps aside (see docs/agent.md).
    #[arg(long, value_name = "US")]
    pub step_aside_us: Option<u64>,
    /// Control period in milliseconds (10..=10000); once the idle plan has held for 5 periods,
    /// the periods run 2.5 times as long until it changes.
    #[arg(long, value_name = "MS")]
    pub period_ms: Option<u64>,
    /// A fixed yielding window in microseconds (1..=100000) for every vCPU, instead of the one
    /// planned per vCPU from its idle periods and the wake-cost curve: yielding threads spin
    /// this long before letting their vCPU halt, always (no kernel polling, no governor; the
    /// wake-cost curve is not measured). For experiments.
    #[arg(long, value_name = "US")]
    pub timeout_us: Option<u64>,
    /// Apply the planned idle policy without ever probing the other mode (no governor): the
    /// plan is trusted for the whole run. For experiments.
    #[arg(long)]
    pub no_adapt: bool,
    /// The governor's first retention mode: calibrated (on where the wake-cost curve says
    /// retention can pay), on or off; the governor then keeps or changes it from what it
    /// measures.
    #[arg(long, value_name = "MODE")]
    pub retention_start: Option<config::RetentionStart>,
    /// CPUs to manage (kernel list format, e.g. 0-3); default: every online CPU.
    #[arg(long, value_name = "LIST")]
    pub cpus: Option<String>,
    /// Measure the calibration (the wake-cost curve, the idle threshold) now even if a valid
    /// record exists in the run dir, and store the new one.
    #[arg(long)]
    pub recalibrate: bool,
    /// Seconds a stored calibration stays valid (0..=31536000; 0: never, so every run starts
    /// from the prior curve and measures after its workload). Default: 86400, or
    /// `calibration_max_age_s` of the config file.
    #[arg(long, value_name = "S")]
    pub calibration_max_age_s: Option<u64>,
    /// Serve Prometheus text-format metrics: a port alone (e.g. 9464) listens on 127.0.0.1
    /// only; IP:PORT listens where told (another machine can then read them).
    #[arg(long, value_name = "[IP:]PORT")]
    pub metrics_addr: Option<String>,
    /// Append JSON lines to FILE: every consolidation decision, one `period` line per period
    /// (active vCPUs, timeouts, per-vCPU retention timeouts, retention mode, the agent's own
    /// CPU time), one `retention` line per change of retention mode (with the governor's
    /// state) and one `exit` line when the run ends.
    #[arg(long, value_name = "FILE")]
    pub events: Option<PathBuf>,
    /// The workload's own progress counter, read once a period: a file holding a number
    /// (its first token), or http://HOST:PORT/PATH#METRIC (a Prometheus text endpoint, every
    /// series of METRIC summed). The guest loop then judges its idle levels by the work this
    /// counts instead of the workload's sync points or bytes.
    #[arg(long, value_name = "SOURCE")]
    pub progress: Option<String>,
    /// Directory of state files, status sockets and the calibration record.
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
}

impl AgentFlags {
    /// The configuration file (if any) with these flags applied on top.
    pub fn resolve(&self) -> anyhow::Result<AgentConfig> {
        let mut cfg = match &self.config {
            Some(p) => AgentConfig::load(p)?,
            None => AgentConfig::default(),
        };
        if self.no_retention {
            cfg.retention = false;
        }
        if let Some(v) = self.budget {
            cfg.budget = v;
        }
        if let Some(v) = self.vm_share {
            cfg.vm_share = v;
        }
        if self.no_kernel_polling {
            cfg.kernel_polling = false;
        }
        if self.no_trace {
            cfg.trace = false;
        }
        if self.no_consolidation {
            cfg.consolidation = false;
        }
        if let Some(v) = self.step_aside_us {
            cfg.step_aside_us = v;
        }
        if let Some(v) = self.period_ms {
            cfg.period_ms = v;
        }
        if let Some(v) = self.timeout_us {
            cfg.timeout_us = Some(v);
        }
        if self.no_adapt {
            cfg.adapt = false;
        }
        if let Some(v) = self.retention_start {
            cfg.retention_start = v;
        }
        if let Some(v) = &self.cpus {
            cfg.cpus = Some(v.clone());
        }
        cfg.recalibrate = self.recalibrate;
        if let Some(v) = self.calibration_max_age_s {
            cfg.calibration_max_age_s = v;
        }
        if let Some(v) = &self.metrics_addr {
            cfg.metrics_addr = Some(v.clone());
        }
        if let Some(v) = &self.events {
            cfg.events = Some(v.clone());
        }
        if let Some(v) = &self.progress {
            cfg.progress = Some(v.clone());
        }
        if let Some(v) = &self.run_dir {
            cfg.run_dir = v.clone();
        } else if cfg.run_dir == AgentConfig::default().run_dir {
            cfg.run_dir = default_run_dir();
        }
        // The file was valid on its own (`load` checks it): a value refused now came from a
        // flag, and the error names the flag rather than the key.
        let checked = cfg.validate().and_then(|()| crate::agent::managed_cpus(&cfg, &gleaner_os::sysfs::Sysfs::new()).map(|_| ()));
        checked.map_err(|e| self.name_the_flag(e))?;
        Ok(cfg)
    }

    /// `e` with the configuration key it names replaced by the flag that set it, if one did.
    fn name_the_flag(&self, e: anyhow::Error) -> anyhow::Error {
        let Some(bad) = e.downcast_ref::<gleaner_os::BadInput>() else { return e };
        let set = |key: &str| match key {
            "budget" => self.budget.is_some(),
            "vm_share" => self.vm_share.is_some(),
            "step_aside_us" => self.step_aside_us.is_some(),
            "period_ms" => self.period_ms.is_some(),
            "timeout_us" => self.timeout_us.is_some(),
            "cpus" => self.cpus.is_some(),
            "calibration_max_age_s" => self.calibration_max_age_s.is_some(),
            "metrics_addr" => self.metrics_addr.is_some(),
            "progress" => self.progress.is_some(),
            _ => false,
        };
        if !set(&bad.what) {
            return e;
        }
        gleaner_os::BadInput { what: format!("--{}", bad.what.replace('_', "-")), ..bad.clone() }.into()
    }
}

/// `/run/gleaner` for root; /run is root's, so an unprivileged agent keeps its socket and its
/// calibration in its own temp dir.
pub fn default_run_dir() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        AgentConfig::default().run_dir
    } else {
        std::env::temp_dir().join(format!("gleaner-{}", nix::unistd::geteuid()))
    }
}

/// Agent commands.
#[derive(Debug, clap::Subcommand)]
pub enum AgentCommand {
    /// Run CMD under Gleaner: in a cpuset cgroup the agent manages, its idle vCPUs kept from
    /// halting as long as that makes its wakeups cheaper (kernel polling where the machine
    /// has a POLL state, yielding threads elsewhere). Passes CMD's output through and exits
    /// with its exit status.
    Run {
        #[command(flatten)]
        flags: AgentFlags,
        /// The command and its arguments.
        #[arg(last = true, required = true, value_name = "CMD")]
        cmd: Vec<String>,
    },
    /// Manage an already running workload: a cgroup (its cpuset.cpus is managed and restored)
    /// or a process and its descendants (moved into a new cgroup and back).
    Attach {
        #[command(flatten)]
        flags: AgentFlags,
        /// Existing cpuset cgroup (absolute path, or relative to the cpuset hierarchy root).
        #[arg(long, value_name = "PATH", conflicts_with = "pid", required_unless_present = "pid")]
        cgroup: Option<PathBuf>,
        /// Process to manage, with its descendants: a running process's pid, 1..=4194304, not
        /// init, the agent or its ancestors, and one the caller may manage (root, or the same
        /// user).
        #[arg(long, value_name = "PID")]
        pid: Option<i32>,
    },
    /// Measure this machine's wake-cost curve once per boot and store it for the agents.
    ///
    /// Measures how long waking a blocked thread takes when its vCPU halted after an idle
    /// gap of 10 us .. 10 ms (kernel polling off), when a yielding thread keeps it busy, and
    /// when it polls in the kernel's POLL state, plus the idle threshold of yielding threads;
    /// stores them in the run dir, where `run`, `attach`, `compare` and `daemon` reuse them
    /// instead of measuring (about 2 s) at every start. Every idle knob turned for the
    /// measurement is put back. A valid record (same boot, kernel, online CPUs, cpuidle
    /// driver and governor; younger than --max-age-s) is shown, not measured again, unless
    /// --recalibrate.
    Calibrate(CalibrateArgs),
    /// Run as a service (what the systemd unit gleaner.service runs): manage the `[[target]]`s
    /// of the configuration file, or, with none, keep retention on every vCPU of the VM.
    ///
    /// Also keeps the calibration record fresh: renews it before it expires, while the
    /// machine idles. The Debian package installs the unit (neither enabled nor started) and
    /// the sample configuration as /etc/gleaner/gleaner.toml; without it, see the header of
    /// dist/gleaner.service in the source tree.
    Daemon {
        /// Configuration file.
        #[arg(long, value_name = "FILE", default_value = "/etc/gleaner/gleaner.toml")]
        config: PathBuf,
        /// Print a commented sample configuration and exit.
        #[arg(long)]
        print_config: bool,
    },
    /// Live state of the running agents (over their root-only Unix sockets).
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Directory of the agents' sockets.
        #[arg(long, value_name = "DIR", default_value = "/run/gleaner")]
        run_dir: PathBuf,
    },
    /// Undo whatever crashed agents left behind (cpusets, cgroups, idle knobs), from their
    /// state files.
    Restore {
        /// Directory of the agents' state files.
        #[arg(long, value_name = "DIR", default_value = "/run/gleaner")]
        run_dir: PathBuf,
    },
    /// The main job: run a workload under each idle policy in turn (stock and Gleaner by
    /// default; --policies adds the kernel's guest haltpoll and naive yielders), N times each,
    /// and print medians, spread, ratios and the CPU each policy took. Default workload: the
    /// built-in `pipeline` (dedup-like).
    Compare(compare::CompareArgs),
    /// Internal: the guardian process that restores the agent's changes if it dies.
    #[command(name = "__guardian", hide = true)]
    Guardian {
        #[arg(long)]
        state: PathBuf,
    },
}

/// `gleaner calibrate`
#[derive(Debug, Clone, clap::Args)]
pub struct CalibrateArgs {
    /// Print JSON (the provenance and the stored record).
    #[arg(long)]
    pub json: bool,
    /// Measure even if a valid record exists.
    #[arg(long)]
    pub recalibrate: bool,
    /// Seconds a record stays valid (0..=31536000). Default: 86400.
    #[arg(long, value_name = "S")]
    pub max_age_s: Option<u64>,
    /// Directory of the record (and of the agents' state files and sockets). Default:
    /// /run/gleaner as root, $TMPDIR/gleaner-UID otherwise.
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// CPUs the agents will manage (kernel list format); the wakeup is measured between the
    /// first two. Default: every online CPU.
    #[arg(long, value_name = "LIST")]
    pub cpus: Option<String>,
}
