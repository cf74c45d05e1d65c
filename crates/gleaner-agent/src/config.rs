//! Agent configuration: a TOML file (`--config`, `daemon --config`) plus command-line overrides.
//!
//! Raw flags live in the clap structs of `lib.rs`; this module holds the resolved configuration
//! and its validation. `gleaner daemon --print-config` prints [`SAMPLE_CONFIG`].

use std::path::{Path, PathBuf};

use anyhow::Context;
use gleaner_os::BadInput;
use gleaner_policy::gleaner::Params;
use gleaner_policy::retention::GovernorConfig;
use serde::{Deserialize, Serialize};

/// The resolved configuration of one agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// Keep idle vCPUs from halting while the workload waits (resource retention): the
    /// kernel's own polling where the machine has a POLL state, yielding threads elsewhere.
    pub retention: bool,
    /// Share of each managed vCPU's time retention may spend polling or yielding, (0, 1].
    pub budget: f64,
    /// Wakeup latency (ns) one ns of that CPU must save to be spent, 0..=1.
    pub price: f64,
    /// Share of the managed vCPUs' time the workload and retention together may fill, (0, 1]
    /// (headroom for a host that caps the VM's CPU).
    pub vm_share: f64,
    /// A vCPU the workload leaves idle less than this share of its time is its bottleneck:
    /// the other vCPUs busy over 70% of their time retain nothing, [0, 1); 0 turns the rule
    /// off.
    pub bottleneck_idle_share: f64,
    /// Use the kernel's polling (haltpoll window, per-CPU resume latency) where offered;
    /// `false` leaves the kernel's idle knobs alone (yielding threads only).
    pub kernel_polling: bool,
    /// Trace the workload's wakeups and the vCPUs' idle periods in the kernel (eBPF, root);
    /// `false` estimates idle periods from cpuidle counters.
    pub trace: bool,
    /// Shrink the workload's cpuset while the section-5 conditions hold.
    pub consolidation: bool,
    /// Control period.
    pub period_ms: u64,
    /// Retention timeout; `None` calibrates it from a measured vCPU wakeup at start (the cap
    /// of the per-vCPU adaptive timeouts; the measured verdict is the governor's first mode);
    /// a value is fixed and always retains (no adaptation, no governor).
    pub timeout_us: Option<u64>,
    /// Adapt each vCPU's timeout to its idle periods and re-decide online whether retention
    /// pays (the governor). `false`: the calibrated timeout stays fixed and the start-up
    /// verdict holds for the whole run.
    pub adapt: bool,
    /// The governor's first mode: `calibrated` (the start-up verdict), `on` or `off`.
    pub retention_start: RetentionStart,
    /// A yield longer than this means the workload ran; `None` calibrates it.
    pub idle_threshold_us: Option<u64>,
    /// How long a stored calibration (`RUN_DIR/calibration.json`) stays valid; it is also
    /// measured again when anything it depends on changes. 0: never valid.
    pub calibration_max_age_s: u64,
    /// Measure the calibration even if a valid record exists (`--recalibrate`; not a file key).
    #[serde(skip)]
    pub recalibrate: bool,
    /// Longest sleep of a yielding thread whose vCPU stays idle.
    pub max_sleep_ms: u64,
    /// Sleep of a yielding thread that steps aside so the kernel can pull a thread waiting on
    /// another vCPU; 0 never steps aside.
    pub step_aside_us: u64,
    /// CPUs to manage; `None` means every online CPU.
    pub cpus: Option<String>,
    /// Controller parameters (rho, eta, min_time_slice_ns, ...).
    pub controller: Params,
    /// Governor parameters (probe intervals, margin, cpu_price, confirm, min_progress).
    pub governor: GovernorConfig,
    /// How a run starts before it has seen the workload (the start plan's window, when
    /// tracing begins).
    pub start: gleaner_policy::guest::StartConfig,
    /// The guest loop's priors: the numbers it starts from or bounds itself by.
    pub priors: gleaner_policy::guest::LoopPriors,
    /// Prometheus text endpoint: a port alone (`9464`, served on 127.0.0.1) or `IP:PORT`.
    pub metrics_addr: Option<String>,
    /// JSON-lines file of decisions, periods and retention changes.
    pub events: Option<PathBuf>,
    /// The workload's own progress counter, which the governors judge by where given: a file
    /// holding a number, or `http://HOST:PORT/PATH#METRIC` ([`crate::progress`]).
    pub progress: Option<String>,
    /// Where state files and status sockets live.
    pub run_dir: PathBuf,
    /// Targets managed by `gleaner daemon`.
    #[serde(rename = "target")]
    pub targets: Vec<Target>,
}

/// The latest [`gleaner_policy::guest::StartConfig::trace_after_ns`]: an hour.
const MAX_TRACE_AFTER_NS: u64 = 3_600_000_000_000;

/// The governor's first retention mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum RetentionStart {
    /// The start-up verdict from measured wakeups: on where retention pays, off where the host
    /// already polls halted vCPUs or there is no halt penalty.
    #[default]
    Calibrated,
    /// On, whatever the verdict (the governor turns it off if it loses).
    On,
    /// Off, whatever the verdict (the governor turns it on if it pays).
    Off,
}

/// A workload the daemon manages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// Manage the processes of this cgroup (absolute path or relative to the cpuset root).
    pub cgroup: Option<PathBuf>,
    /// Manage this process and its descendants.
    pub pid: Option<i32>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            retention: true,
            budget: gleaner_policy::idle::plan::DEFAULT_BUDGET,
            price: gleaner_policy::idle::plan::DEFAULT_PRICE,
            vm_share: gleaner_policy::idle::plan::DEFAULT_VM_SHARE,
            bottleneck_idle_share: gleaner_policy::idle::plan::DEFAULT_BOTTLENECK_IDLE_SHARE,
            kernel_polling: true,
            trace: true,
            consolidation: true,
            period_ms: gleaner_policy::guest::DEFAULT_PERIOD_NS / 1_000_000,
            timeout_us: None,
            adapt: true,
            retention_start: RetentionStart::Calibrated,
            idle_threshold_us: None,
            calibration_max_age_s: crate::cache::DEFAULT_MAX_AGE_S,
            recalibrate: false,
            max_sleep_ms: 20,
            step_aside_us: 0,
            cpus: None,
            controller: Params::default(),
            governor: GovernorConfig::default(),
            start: gleaner_policy::guest::StartConfig::default(),
            priors: gleaner_policy::guest::LoopPriors::DEFAULT,
            metrics_addr: None,
            events: None,
            progress: None,
            run_dir: PathBuf::from("/run/gleaner"),
            targets: Vec::new(),
        }
    }
}

impl AgentConfig {
    /// Reads and validates a TOML file. The agent runs as root and acts on what the file says
    /// (which cgroups and processes to manage), so a file anyone but its owner could have
    /// changed is refused, as sshd refuses one ([`gleaner_os::private::read_trusted`]).
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let bytes = gleaner_os::private::read_trusted(path, MAX_CONFIG_BYTES).map_err(|e| match e {
            gleaner_os::OsError::NotPrivate { .. } => {
                BadInput::new("config file", path.display(), format!("a file only its owner can change ({e})"))
            }
            other => BadInput::new("config file", path.display(), format!("a readable TOML file ({other})")),
        })?;
        let text = String::from_utf8(bytes).map_err(|e| BadInput::new("config file", path.display(), format!("UTF-8 text ({e})")))?;
        Self::parse(&text).with_context(|| format!("config file {}", path.display()))
    }

    /// Parses and validates TOML text.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let cfg: Self = toml::from_str(text).map_err(|e| {
            // Quote the offending line: a bad value's message names the value, not its key.
            let line = e.span().and_then(|r| {
                let start = text[..r.start.min(text.len())].rfind('\n').map_or(0, |i| i + 1);
                text[start..].lines().next().map(str::trim).filter(|l| !l.is_empty())
            });
            let what = match line {
                Some(l) => format!("{} (in `{l}`)", e.message().trim()),
                None => e.message().trim().to_string(),
            };
            BadInput::new("configuration", what, "the keys and values of `gleaner daemon --print-config`")
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks every value against its allowed range; the error names the key.
    pub fn validate(&self) -> anyhow::Result<()> {
        if !(10..=10_000).contains(&self.period_ms) {
            return Err(BadInput::new("period_ms", self.period_ms, "10..=10000").into());
        }
        if let Some(t) = self.timeout_us {
            if !(1..=100_000).contains(&t) {
                return Err(BadInput::new("timeout_us", t, "1..=100000").into());
            }
        }
        if let Some(t) = self.idle_threshold_us {
            if !(1..=10_000).contains(&t) {
                return Err(BadInput::new("idle_threshold_us", t, "1..=10000").into());
            }
        }
        if self.calibration_max_age_s > MAX_CALIBRATION_AGE_S {
            return Err(BadInput::new("calibration_max_age_s", self.calibration_max_age_s, "0..=31536000 (seconds; 0: never valid)").into());
        }
        if !(1..=1000).contains(&self.max_sleep_ms) {
            return Err(BadInput::new("max_sleep_ms", self.max_sleep_ms, "1..=1000").into());
        }
        if self.step_aside_us > 1000 {
            return Err(BadInput::new("step_aside_us", self.step_aside_us, "0..=1000 (0: never step aside)").into());
        }
        if let Some(c) = &self.cpus {
            gleaner_os::cpuset::CpuSet::parse(c).map_err(|_| BadInput::new("cpus", c, "a CPU list such as 0-3,6"))?;
        }
        if let Some(a) = &self.metrics_addr {
            gleaner_os::input::metrics_addr("metrics_addr", a)?;
        }
        let plan = self.plan_config();
        if let Err(e) = plan.validate() {
            let (key, value, allowed) = if e.starts_with("budget") {
                ("budget", self.budget, "a share of a vCPU in (0, 1], e.g. 0.5")
            } else if e.starts_with("vm_share") {
                ("vm_share", self.vm_share, "a share of the managed vCPUs in (0, 1], e.g. 0.9")
            } else if e.starts_with("bottleneck_idle_share") {
                ("bottleneck_idle_share", self.bottleneck_idle_share, "a share of a vCPU in [0, 1), e.g. 0.05 (0: off)")
            } else {
                ("price", self.price, "0..=1 (latency ns per CPU ns)")
            };
            return Err(BadInput::new(key, value, allowed).into());
        }
        self.controller.validate().map_err(|e| BadInput::new("controller parameter", e, "see `gleaner daemon --print-config`"))?;
        self.governor.validate().map_err(|e| BadInput::new("governor parameter", e, "see `gleaner daemon --print-config`"))?;
        if let Some(p) = &self.progress {
            p.parse::<crate::progress::ProgressSource>()
                .map_err(|why| BadInput::new("progress", p, format!("{} ({why})", crate::progress::ProgressSource::ALLOWED)))?;
        }
        self.priors.validate()?;
        if self.start.trace_after_ns > MAX_TRACE_AFTER_NS {
            return Err(BadInput::new("start.trace_after_ns", self.start.trace_after_ns, "0..=3600000000000 (an hour)").into());
        }
        for t in &self.targets {
            if t.cgroup.is_some() == t.pid.is_some() {
                return Err(BadInput::new("[[target]]", format!("{t:?}"), "exactly one of `cgroup = \"PATH\"` or `pid = N`").into());
            }
        }
        Ok(())
    }
}

/// Longest allowed `calibration_max_age_s`: a year.
pub const MAX_CALIBRATION_AGE_S: u64 = 365 * 24 * 3600;

/// A configuration larger than this is not one (the sample is ~3 KB).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

impl AgentConfig {
    /// The idle planner's configuration.
    pub fn plan_config(&self) -> gleaner_policy::idle::PlanConfig {
        gleaner_policy::idle::PlanConfig {
            budget: self.budget,
            price: self.price,
            vm_share: self.vm_share,
            bottleneck_idle_share: self.bottleneck_idle_share,
            ..Default::default()
        }
    }

    /// Where this agent's calibration record lives and how long it stays valid.
    pub fn cache_policy(&self) -> crate::cache::CachePolicy {
        crate::cache::CachePolicy {
            run_dir: self.run_dir.clone(),
            max_age: std::time::Duration::from_secs(self.calibration_max_age_s),
            recalibrate: self.recalibrate,
        }
    }
}

/// The commented sample configuration printed by `gleaner daemon --print-config`.
pub const SAMPLE_CONFIG: &str = r#"# /etc/gleaner/gleaner.toml: configuration of the Gleaner guest agent.
# Every key is optional; the values shown are the defaults.

# Keep idle vCPUs from halting while the workload waits (resource retention): the kernel's
# own polling (cpuidle POLL state: no IPI to wake) where the machine has it, SCHED_IDLE threads
# calling sched_yield() where it does not. Per vCPU, the agent picks how long an idle vCPU
# keeps polling from the idle periods it traces and the wake-cost curve it calibrated.
retention = true
# Share of each managed vCPU's time retention may spend polling or yielding, (0, 1]. 1: all of
# an idle vCPU's time may go, but only where it buys wakeups at `price` (an idle workload
# spends nothing; a vCPU that is never idle has nothing to spend).
budget = 1.0
# Wakeup latency (ns) one ns of that CPU must save to be spent: 0.005 means a microsecond of
# wakeup latency is worth up to 200 us of otherwise idle vCPU.
price = 0.005
# Share of the managed vCPUs' time the workload and retention together may fill, (0, 1].
# Polling is busy time to the host, and a host that caps the VM's CPU at its vCPU count (a
# cgroup quota) stops the whole VM for the rest of its period when the VM uses it up (here:
# 100 ms stalls with both vCPUs at 100%, none at 95%). 1 on a host known to have no cap.
vm_share = 0.9
# A vCPU the workload leaves idle less than this share of its time (polling included) is its
# bottleneck, [0, 1): the other vCPUs busy over 70% of their time then retain nothing. A closed
# loop cannot run its bottleneck more than full, and polling the vCPUs that feed it made them
# wake per reply instead of per batch (nginx with 50 connections: 1-4% fewer requests). A
# client that busy-polls for its replies also reads as a bottleneck where its server is that
# busy: 0 turns the rule off for such a workload.
bottleneck_idle_share = 0.05
# Use the kernel's idle knobs (haltpoll window guest_halt_poll_ns, per-CPU
# pm_qos_resume_latency_us); every knob is put back on exit, by the guardian after kill -9,
# or by `gleaner restore`. false: yielding threads only.
kernel_polling = true
# Trace the workload's wakeups and each vCPU's idle periods in the kernel (eBPF on the
# scheduler tracepoints; root). false, or where eBPF is unavailable: idle periods are
# estimated from cpuidle counters and the workload's context switches.
trace = true
# Shrink the workload's cpuset one vCPU at a time while the paper's two conditions hold
# (consolidation scheduling). Needs root or a delegated cgroup; without it the agent runs
# with retention only and says so.
consolidation = true
# Control period: how often metrics are sampled and the controller decides (2.5 times as
# long while the idle plan holds, after 5 periods of it).
period_ms = 200
# A fixed yielding window instead of the planned one: every vCPU keeps a yielding thread
# that spins this long before letting its vCPU halt (no kernel polling, no governor; for
# experiments). Unset: planned per vCPU.
# timeout_us = 100
# Re-decide while running whether retention pays, from short on/off probe periods (the
# governor). false: the plan is applied without probes.
adapt = true
# The governor's first mode: "calibrated" (on where the machine's wake-cost curve says
# retention can pay), "on" or "off".
retention_start = "calibrated"
# A sched_yield() call longer than this means the workload ran meanwhile. Unset: calibrated.
# idle_threshold_us = 20
# The calibration is stored in run_dir/calibration.json (`gleaner calibrate` shows it) and
# reused until it is this old (seconds) or anything it depends on changes (boot, kernel, online
# CPUs, cpuidle driver or governor); `--recalibrate` measures it again.
# The daemon renews it before it expires, while the machine idles. 0: never valid.
calibration_max_age_s = 86400
# Longest sleep of a yielding thread while its vCPU stays idle (the sleep doubles from 50 us).
max_sleep_ms = 20
# A vCPU kept busy by a yielding thread never looks "newly idle" to the kernel, so the kernel
# does not pull a thread waiting in another vCPU's run queue to it. When more threads are
# runnable than the other vCPUs can run, the yielding thread sleeps this long (once per idle
# period) to let that happen (1 is a good value). 0, the default, is the paper's plain
# retention: stepping aside did not measurably help here and costs CPU when other processes run.
step_aside_us = 0
# CPUs to manage (kernel list format). Unset: every online CPU.
# cpus = "0-3"
# Prometheus text-format endpoint: a port alone listens on 127.0.0.1 only; "IP:PORT" listens
# where told (another machine can then read the metrics).
# metrics_addr = "9464"
# JSON-lines log: every decision (consolidate, restore, reset, factor change), one `period`
# line per period (per-vCPU retention timeouts) and one `retention` line per change of mode.
# events = "/var/log/gleaner/events.jsonl"
# The workload's own progress counter, which the guest loop then compares its levels by: a
# file holding a number, or a Prometheus endpoint and metric (every series summed).
# progress = "http://127.0.0.1:9100/metrics#requests_total"
# State files (for `gleaner restore`) and root-only status sockets.
run_dir = "/run/gleaner"

[controller]
# Load factor rho in (0, 1]: consolidate only if l_comp <= rho * (N-1) * l_idle.
rho = 1.0
# Granularity factor eta in (0, 1]: and only if g_comp <= min(eta * l_idle, min_time_slice).
eta = 1.0
# The OS's minimum time slice in ns (EEVDF base slice is about 3 ms).
min_time_slice_ns = 3000000
# Major-change indicators: relative utilization change, busiest vCPU, g_comp factor.
util_change = 0.2
busy_threshold = 0.9
gcomp_change = 2.0
# A utilization drop beyond this after a consolidation rolls it back.
rollback_drop = 0.05
# Never go below this many vCPUs.
min_active = 1
# Periods with fewer idle periods than this are not decided on.
min_idle_periods = 8
# Utilization (in vCPUs) below which its changes are noise (no rollback, no reset).
min_util = 0.05
# A workload with a thread it pinned itself (sched_setaffinity, taskset) keeps every vCPU:
# its program places its threads, and its next pin must not fail on a vCPU taken away.
# false: the paper's cpuset, which moves pinned threads too.
keep_pinned = true
# Consolidation as an experiment: measure every vCPU first, and roll a step back where the
# sync rate falls below every vCPU's beyond chance. false: the paper's controller.
measured = true

[governor]
# Every probe_every_min..probe_every_max periods (doubling while the answer holds) one period
# runs with retention in the other mode and is compared with the periods around it.
probe_every_min = 4
probe_every_max = 32
# While retention pays clearly (wakeups off at least 1 + settle_gain times slower, or progress
# on that much higher), the probes of "off" back off further, up to probe_every_settled
# periods: under a server each one halts a quarter period of its requests.
probe_every_settled = 256
settle_gain = 1.0
# Retention pays when the workload's sync points per second grow by more than
# cpu_price * (vCPUs its threads burn) + margin; it loses below cpu_price * vCPUs burned.
margin = 0.05
cpu_price = 0.05
# Comparisons in a row that must disagree before the mode switches.
confirm = 3
# While retention is on, one comparison in which it slowed the workload by more than this
# fraction turns it off at once (1 disables).
decisive_loss = 0.25
# Periods with fewer workload sync points than this are too few to compare.
min_progress = 50
# Where every period has at least min_wakeups traced wakeups of the workload, latency
# decides: retention pays when it shortens the mean wakeup by latency_gain (and progress did
# not fall by more than margin), and loses when it shortens it by less than margin.
min_wakeups = 50
latency_gain = 0.1
# Where not 0, a latency gain pays only if the wakeup time it saves is worth the CPU it takes
# more at this price (latency ns per CPU ns); the guest loop's upper governor (Planned
# against Wide) uses the planner's price whatever this says.
latency_price = 0.0
# Where the workload moved at least this many bytes through read/write calls in every period
# of a comparison (per full period), progress is those bytes instead of its sync points, and
# only chance (not margin) excuses a fall of them.
min_io_bytes = 65536

[start]
# The start plan, before the workload is seen: every vCPU polls until work arrives
# (until_work, where the machine offers per-CPU resume latency limits), and, once the
# workload is quiet, or where there is no such limit, up to this window (ns; 0: halt).
window_ns = 200000
until_work = true
# No period is traced before the run is this old (ns): a short run plans from the cpuidle
# counters and pays nothing for the tracer.
trace_after_ns = 1000000000

[priors]
# The guest loop's priors (docs/idle-policy.md, "Priors", gives the measurement behind each).
# Below these shares of the vCPUs' time left idle, the planned level has no kernel polling /
# no yielding threads (the ladder's probes of the wide level still try them).
saturated_idle_share = 0.02
saturated_yield_idle_share = 0.25
# While vCPUs poll, consolidation runs only while the workload uses at most this many vCPUs.
poll_consolidation_util = 0.15
# Under this many sync points a second the workload is quiet; quiet this long (ns) before it
# was seen, the start plan gives way to halting.
quiet_rate = 10.0
quiet_start_ns = 1000000000
# Period lengths, as shares of period_ms: the first, a probe's, and a calm one (after
# calm_periods periods in which the plan held).
first_period_share = 0.25
probe_share = 0.25
calm_periods = 5
calm_period_share = 2.5
# The agent's own period work: at most this share of a vCPU before periods lengthen (up to
# max_period_stretch times); SCHED_IDLE up to background_max_rate sync points a second per
# vCPU; a woken thread waits for at most agent_pace_ns of it.
agent_work_share = 0.005
max_period_stretch = 10.0
background_max_rate = 5000.0
agent_pace_ns = 50000
# A trace that missed this share of the sync points (processes started while it counted) is
# set aside, at most max_set_aside times in a row; a rate change under min_rate_change sync
# points a second asks for no new trace; a gap seen whole in a slice counts at most
# slice_max_weight times.
trace_missed_share = 0.1
max_set_aside = 3
min_rate_change = 100.0
slice_max_weight = 4.0
# A haltpoll window is stale once polling past the plan's estimate reaches this share of a vCPU.
stale_window_excess = 0.05
# Steal over steal_share of a period (and over steal_min_ns) while retaining halves a vCPU's
# budget; it grows back by steal_recovery per steal-free period.
steal_share = 0.02
steal_min_ns = 30000000
steal_recovery = 1.02

# Workloads the daemon manages: one [[target]] per workload, with either a cgroup or a pid.
# [[target]]
# cgroup = "/sys/fs/cgroup/myapp"
# [[target]]
# pid = 1234
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_config_parses_to_defaults() {
        let cfg = AgentConfig::parse(SAMPLE_CONFIG).unwrap();
        assert_eq!(cfg, AgentConfig::default());
    }

    #[test]
    fn empty_config_is_default() {
        assert_eq!(AgentConfig::parse("").unwrap(), AgentConfig::default());
    }

    #[test]
    fn unknown_key_is_named() {
        let e = AgentConfig::parse("retension = true").unwrap_err();
        assert!(e.chain().any(|c| c.is::<BadInput>()));
        assert!(format!("{e:#}").contains("retension"), "{e:#}");
    }

    #[test]
    fn out_of_range_values_are_named() {
        for (text, key) in [
            ("period_ms = 0", "period_ms"),
            ("budget = 0", "budget"),
            ("budget = 1.5", "budget"),
            ("price = -1", "price"),
            ("vm_share = 0", "vm_share"),
            ("vm_share = 1.2", "vm_share"),
            ("bottleneck_idle_share = 1", "bottleneck_idle_share"),
            ("bottleneck_idle_share = -0.1", "bottleneck_idle_share"),
            ("timeout_us = 0", "timeout_us"),
            ("step_aside_us = 5000", "step_aside_us"),
            ("calibration_max_age_s = 99999999999", "calibration_max_age_s"),
            ("recalibrate = true", "recalibrate"),
            ("cpus = \"3-1\"", "cpus"),
            ("metrics_addr = \"localhost\"", "metrics_addr"),
            ("[controller]\nrho = 2.0", "rho"),
            ("[governor]\nconfirm = 0", "confirm"),
            ("[governor]\ndecisive_loss = 1.5", "decisive_loss"),
            ("retention_start = \"maybe\"", "retention_start"),
            ("[[target]]\ncgroup = \"/a\"\npid = 3", "[[target]]"),
            ("[priors]\nprobe_share = 0", "priors.probe_share"),
            ("[priors]\nsaturated_idle_share = 2", "priors.saturated_idle_share"),
            ("[priors]\ncalm_periods = 0", "priors.calm_periods"),
            ("[priors]\nquiet = 1", "quiet"),
        ] {
            let e = AgentConfig::parse(text).unwrap_err();
            assert!(e.chain().any(|c| c.is::<BadInput>()), "{text}");
            assert!(format!("{e:#}").contains(key), "{text}: {e:#}");
        }
    }

    #[test]
    fn malformed_toml_is_bad_input() {
        let e = AgentConfig::parse("retention = = true").unwrap_err();
        assert!(e.chain().any(|c| c.is::<BadInput>()));
    }
}
