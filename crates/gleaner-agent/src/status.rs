//! What the agent reports, as typed serde values: the live [`StatusReport`] (served by
//! [`crate::server`] on the status socket and as Prometheus text) and the [`EventRecord`]s of
//! `--events` (JSON lines, read back by the lab as this same type).
//!
//! The agent loop owns a [`StatusReport`] behind a mutex and updates it once per period; the
//! servers only read it.

use std::collections::VecDeque;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use gleaner_os::cpuset::CpuSet;
use gleaner_policy::gleaner::{Decision, Metrics};
use gleaner_policy::idle::plan::{Mechanism, ALWAYS};
use gleaner_policy::idle::{IdlePlan, Means, PlanConfig, TraceSource, WakeCurve, WakeSummary};
use gleaner_policy::retention::{Comparison, EpochReading, GovernorState, ModeChange, RetentionMode};
use serde::{Deserialize, Serialize};

use crate::sampler::PeriodExtras;
pub use crate::sampler::VcpuTimeout;
use crate::stats::{one, stats, Kind, Reading, Sample, Stat, Value};

/// How many recent decisions the status keeps.
pub const RECENT: usize = 32;

/// One decision or notable event, as written to `--events` (one JSON object per line) and kept
/// in the status. `event` says which optional fields are set:
///
/// | event | fields |
/// |---|---|
/// | `consolidate`, `restore`, `reset`, `factor_change` | `decision` |
/// | `period` (every period) | `count` (timeouts), `vcpus` (per-vCPU timeouts), `retention` (the mode it ran in), `reading` (what the governor read; its `comparison` if it made one), `wake` (the workload's wakeup latency, traced), `plan` (the idle plan applied next, when it changed) |
/// | `retention` (start, and each change of mode) | `retention` (the new mode), `change` (none at start), `comparison`, `governor` |
///
/// Every event has the time, the active CPUs after it and the controller's measurements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    /// Milliseconds since the agent started.
    pub t_ms: u64,
    /// `CLOCK_MONOTONIC` at the event (a period's: at its end), ns: to line the agent's
    /// periods up with a workload's own timestamps (`scripts/bench/kv-latency.c` writes its
    /// requests' with it, `scripts/bench/request-blame.py` lines them up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mono_ns: Option<u64>,
    /// Which event this is (it says which optional fields are set).
    pub event: EventKind,
    /// The controller's decision, when the event is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// Timeouts in the period (for `period` events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Active CPUs after the event.
    pub active_cpus: String,
    /// The measurements the decision was based on.
    pub metrics: Metrics,
    /// Per-vCPU retention timeouts at the end of the period (`period` events with yielding
    /// threads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<Vec<VcpuTimeout>>,
    /// Retention mode: the one the period ran in (`period`), the new one (`retention`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionMode>,
    /// The mode change and its cause (`retention` events after the start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change: Option<ModeChange>,
    /// The period's reading as the governor took it (`period` events with a governor; unlike
    /// `metrics`, also for probe periods, which the controller does not see).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reading: Option<EpochReading>,
    /// The on/off comparison behind a `retention` event, if one was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comparison: Option<Comparison>,
    /// The governor's state after a `retention` event (none when retention is pinned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub governor: Option<GovernorState>,
    /// The agent's own CPU time (user + sys, every thread, the yielding threads included)
    /// since it started (`period` and `exit` events): what managing the workload costs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_cpu_ns: Option<u64>,
    /// Times the agent's period work stepped aside for a woken thread (`sched_yield()`
    /// between its steps, `agent/pace.rs`) since it started (`period` and `exit` events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_yields: Option<u64>,
    /// The workload's wakeup latency in the period, by target vCPU state (`period` events,
    /// where the tracer ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake: Option<WakeSummary>,
    /// The idle plan applied from the next period on (`period` events, when it changed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<IdlePlan>,
    /// Kernel polling in the period, ns (`period` events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_ns: Option<u64>,
    /// How long the tracer counted in the period, ns, from its start (`period` events of
    /// traced periods).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traced_ns: Option<u64>,
    /// Share of the period's sync points made by the workload's processes that started while
    /// the tracer counted and were not followed (`period` events of traced periods, where
    /// any): the guest loop sets such a trace aside ([`GuestReading::trace_missed`]).
    ///
    /// [`GuestReading::trace_missed`]: gleaner_policy::guest::GuestReading::trace_missed
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_missed: Option<f64>,
    /// How applying the period's plan brought the vCPUs' own haltpoll windows down, where it
    /// did (`period` events; [`WindowReset`]).
    ///
    /// [`WindowReset`]: gleaner_policy::guest::WindowReset
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_reset: Option<gleaner_policy::guest::WindowReset>,
    /// Each vCPU's budget after the period (`period` events with an idle policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Vec<(u32, f64)>>,
    /// What the eBPF tracer cost and did over the run (`exit` events, when it ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracer: Option<TracerUse>,
}

/// What the eBPF tracer cost and did over a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracerUse {
    /// Its programs' run time, ns (counting and paused; `BPF_ENABLE_STATS`: 0 where the
    /// statistics could not be turned on).
    pub cpu_ns: u64,
    /// Periods traced.
    pub traced_periods: u64,
    /// Times its programs were attached to their tracepoints (each attach and detach patches
    /// kernel text): 1 when they stayed attached, paused between slices, all run.
    pub attaches: u64,
    /// Times the paused programs were detached because they cost more than their bound
    /// (a workload that switches very often).
    pub cost_detaches: u64,
    /// Pausing between slices (rather than detaching) when the run ended.
    pub resident: bool,
}

impl EventRecord {
    /// An event with only the common fields set.
    pub fn new(t_ms: u64, event: EventKind, active_cpus: String, metrics: Metrics) -> Self {
        Self {
            t_ms,
            mono_ns: None,
            event,
            decision: None,
            count: None,
            active_cpus,
            metrics,
            vcpus: None,
            retention: None,
            change: None,
            reading: None,
            comparison: None,
            governor: None,
            agent_cpu_ns: None,
            agent_yields: None,
            wake: None,
            plan: None,
            poll_ns: None,
            traced_ns: None,
            trace_missed: None,
            window_reset: None,
            budget: None,
            tracer: None,
        }
    }

    /// The event of a decision.
    pub fn kind_of(d: &Decision) -> EventKind {
        match d {
            Decision::Deactivate { .. } => EventKind::Consolidate,
            Decision::Restore { .. } => EventKind::Restore,
            Decision::ResetAll { .. } => EventKind::Reset,
            Decision::SetRho { .. } | Decision::SetEta { .. } => EventKind::FactorChange,
        }
    }
}

/// The kinds of [`EventRecord`], written as their snake_case names (`"event": "period"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// The controller took a vCPU from the workload.
    Consolidate,
    /// The controller gave one back.
    Restore,
    /// The controller gave every vCPU back.
    Reset,
    /// The controller changed its load (rho) or granularity (eta) factor.
    FactorChange,
    /// One control period ended.
    Period,
    /// Retention's mode at start, and each change of it.
    Retention,
    /// The last, partial period, written once when the run ends.
    Exit,
    /// A batch of retention timeouts (`count`), as agents before the `period` event wrote them;
    /// still read.
    Timeout,
    /// A kind this build does not know (a newer agent's): read and skipped, not an error.
    #[serde(other)]
    Other,
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The serialized name: one spelling of each kind.
        let v = serde_json::to_value(self).map_err(|_| std::fmt::Error)?;
        f.write_str(v.as_str().unwrap_or("other"))
    }
}

/// The idle policy as it runs: what the machine offers, the curve, the plan, the tracer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IdleStatus {
    /// What the machine offers to keep idle vCPUs from halting (`None`: unreadable).
    pub offer: Option<gleaner_os::idle::IdleOffer>,
    /// What this agent uses of it.
    pub means: Option<Means>,
    /// This agent drives the kernel's idle knobs.
    pub kernel: bool,
    /// The wake-cost curve planned with.
    pub curve: Option<WakeCurve>,
    /// Budget and price.
    pub plan_config: PlanConfig,
    /// Each vCPU's budget now (tightened where polling or yielding ran over).
    pub budget: Vec<(u32, f64)>,
    /// The plan applied now (every vCPU halts while retention is off).
    pub plan: Option<IdlePlan>,
    /// What retention on means now.
    pub planned: Option<IdlePlan>,
    /// Where the idle periods come from (`bpf`, `estimated`).
    pub gaps_from: Option<TraceSource>,
    /// Why the tracer does not run, if it does not.
    pub tracer_note: Option<String>,
    /// The workload's wakeup latency in the last traced period.
    pub wake: Option<WakeSummary>,
    /// Kernel polling since start, ns.
    pub poll_ns: u64,
}

/// The live state of one agent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    pub agent_pid: i32,
    /// What is managed: `command ...`, `pid N`, `cgroup PATH`.
    pub target: String,
    /// Yielding threads exist (they may be parked while the governor keeps retention off).
    pub retention: bool,
    /// Why retention started off although it was asked for (measured not to pay here).
    #[serde(default)]
    pub retention_note: Option<String>,
    /// Where the calibration (timeout, idle threshold, verdict) came from: a cached record
    /// (path, age) or measured at start (and why). `None`: retention off or all configured.
    #[serde(default)]
    pub calibration: Option<crate::cache::CalibrationSource>,
    /// Retention on or off now (`None`: no yielding threads).
    #[serde(default)]
    pub retention_mode: Option<RetentionMode>,
    /// The governor re-deciding retention online (`None`: pinned by `--timeout-us`, or
    /// `--no-adapt`).
    #[serde(default)]
    pub governor: Option<GovernorState>,
    /// Each yielding thread's timeout now, with its grows and shrinks since start.
    #[serde(default)]
    pub vcpu_timeouts: Vec<VcpuTimeout>,
    pub consolidation: bool,
    /// The agent's period work runs SCHED_IDLE, in the time the workload leaves idle
    /// (`GuestController::agent_in_background`; false while the VM is saturated).
    #[serde(default)]
    pub agent_in_background: bool,
    /// The agent's period work is cut into pieces a woken thread need not wait out
    /// (`GuestController::agent_paced`; false while the VM is saturated).
    #[serde(default)]
    pub agent_paced: bool,
    /// Why consolidation is off although it was asked for.
    pub note: Option<String>,
    pub all_cpus: CpuSet,
    pub active_cpus: CpuSet,
    /// The vCPUs of threads the workload pinned itself (consolidation keeps every vCPU while
    /// there are any: `[controller] keep_pinned`).
    #[serde(default)]
    pub pinned_cpus: CpuSet,
    /// The configured or calibrated timeout: fixed, or the cap of the adaptive ones.
    pub timeout_us: u64,
    /// Per-vCPU timeouts adapt.
    #[serde(default)]
    pub adaptive_timeout: bool,
    pub idle_threshold_us: u64,
    pub period_ms: u64,
    pub uptime_s: f64,
    /// The last period's measurements (l_comp, g_comp, l_idle, utilization, rho, eta).
    pub metrics: Metrics,
    /// Totals since start.
    #[serde(flatten)]
    pub totals: Totals,
    /// What managing the workload costs it since start.
    #[serde(default)]
    pub overhead: Overhead,
    /// Workload threads seen in the last period.
    pub threads: usize,
    /// The idle policy (`None`: retention off).
    #[serde(default)]
    pub idle: Option<IdleStatus>,
    pub recent: VecDeque<EventRecord>,
}

/// The shared, live status.
pub type SharedStatus = Arc<Mutex<StatusReport>>;

/// Appends events as JSON lines.
#[derive(Debug)]
pub struct EventLog {
    file: std::fs::File,
}

impl EventLog {
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| gleaner_os::BadInput::new("--events file", path.display(), format!("a writable path ({e})")))?;
        Ok(Self { file })
    }

    pub fn write(&mut self, e: &EventRecord) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(e)?;
        line.push(b'\n');
        self.file.write_all(&line).context("writing an event")
    }
}

stats! {
    /// What the agent totals over its periods since start (each period added once, by
    /// [`StatusReport::add_period`]).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(default)]
    pub struct Totals {
        yields: u64 => Counter("yields", "sched_yield calls of the yielding threads") print "yields";
        timeouts: u64 => Counter("timeouts", "Retention timeouts") print "timeouts";
        step_asides: u64 => Counter("step_asides", "Yielding threads stepping aside for a thread waiting on another vCPU") print "step-asides";
        noise_returns: u64 => Counter("noise_yields", "Slow yields with no other task run (interrupts, host preemption): not counted as work") print "noise";
        decisions: u64 => Counter("decisions", "Controller decisions") print "decisions";
        periods: u64 => Counter("periods", "Control periods");
        yielder_cpu_ns: u64 => Gauge("yielder_cpu_seconds", "CPU time of the yielding threads", seconds);
        retention_on_periods: u64 => Counter("retention_on_periods", "Control periods run with retention on");
    }
}

stats! {
    /// What managing the workload costs it, since start: the guest loop's experiments
    /// (`GuestController::probe_time`) and the agent's own CPU.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(default)]
    pub struct Overhead {
        probe_ns: u64 => Counter("probe_seconds", "Time the workload ran in probe epochs: a level of retention the governors do not believe in", seconds);
        probe_worse_ns: u64 => Counter("probe_worse_seconds", "Of that, time in probes their comparison found worse than the baseline", seconds);
        agent_cpu_ns: u64 => Counter("agent_cpu_seconds", "The agent's own CPU time: every thread of it but the yielding threads (yielder_cpu_seconds)", seconds);
    }
}

impl Overhead {
    /// `ns` as a share of `uptime_s` seconds (0 before any time has passed).
    pub fn share(ns: u64, uptime_s: f64) -> f64 {
        if uptime_s > 0.0 {
            ns as f64 / 1e9 / uptime_s
        } else {
            0.0
        }
    }

    /// The line `gleaner status` prints: probing and the agent's CPU as shares of the run.
    pub fn line(&self, uptime_s: f64) -> String {
        format!(
            "probing {:.1}% of the run ({:.1}% in a plan found worse)   agent CPU {:.2}% of a vCPU",
            100.0 * Self::share(self.probe_ns, uptime_s),
            100.0 * Self::share(self.probe_worse_ns, uptime_s),
            100.0 * Self::share(self.agent_cpu_ns, uptime_s),
        )
    }
}

impl Totals {
    /// Adds one period: its counts, its `decisions`, and whether it ran with retention on.
    pub fn add_period(&mut self, extras: &PeriodExtras, decisions: u64, retention_on: bool) {
        self.periods += 1;
        self.yields += extras.yields;
        self.timeouts += extras.timeouts;
        self.step_asides += extras.step_asides;
        self.noise_returns += extras.noise_returns;
        self.decisions += decisions;
        self.yielder_cpu_ns += extras.yielder_run_ns;
        self.retention_on_periods += u64::from(retention_on);
    }
}

/// A single float, always exported.
fn float(x: f64) -> Reading {
    one(Value::Float(x))
}

/// Nanoseconds in seconds; a measurement that is not there is `NaN`.
fn seconds_or_nan(ns: Option<f64>) -> Reading {
    float(ns.unwrap_or(f64::NAN) / 1e9)
}

/// One value per vCPU.
fn by_cpu<I: IntoIterator<Item = (u32, Value)>>(values: I) -> Reading {
    Some(values.into_iter().map(|(cpu, value)| Sample { labels: vec![cpu.to_string()], value }).collect())
}

/// The status's own stats (before its [`Totals`] and its [`IdleStatus::STATS`]).
pub const STATUS_STATS: &[Stat<StatusReport>] = &[
    Stat {
        name: "active_vcpus",
        kind: Kind::Gauge,
        help: "vCPUs the workload may run on",
        labels: &[],
        print: None,
        read: |s| float(s.active_cpus.len() as f64),
    },
    Stat { name: "rho", kind: Kind::Gauge, help: "Load factor", labels: &[], print: None, read: |s| float(s.metrics.rho) },
    Stat { name: "eta", kind: Kind::Gauge, help: "Granularity factor", labels: &[], print: None, read: |s| float(s.metrics.eta) },
    Stat {
        name: "l_comp_seconds",
        kind: Kind::Gauge,
        help: "Computation length between idle periods",
        labels: &[],
        print: None,
        read: |s| seconds_or_nan(s.metrics.l_comp_ns),
    },
    Stat {
        name: "g_comp_seconds",
        kind: Kind::Gauge,
        help: "Computation granularity",
        labels: &[],
        print: None,
        read: |s| seconds_or_nan(s.metrics.g_comp_ns),
    },
    Stat {
        name: "l_idle_seconds",
        kind: Kind::Gauge,
        help: "Idle period length",
        labels: &[],
        print: None,
        read: |s| seconds_or_nan(s.metrics.l_idle_ns),
    },
    Stat {
        name: "utilization_vcpus",
        kind: Kind::Gauge,
        help: "Workload utilization in vCPUs",
        labels: &[],
        print: None,
        read: |s| float(s.metrics.util),
    },
    Stat {
        name: "retention_timeout_seconds",
        kind: Kind::Gauge,
        help: "Retention timeout (configured, or the cap of the adaptive ones)",
        labels: &[],
        print: None,
        read: |s| float(s.timeout_us as f64 / 1e6),
    },
    Stat {
        name: "retention_on",
        kind: Kind::Gauge,
        help: "Retention on (1) or off (0) now",
        labels: &[],
        print: None,
        read: |s| float(f64::from(u8::from(s.retention_mode == Some(RetentionMode::On)))),
    },
    Stat {
        name: "vcpu_retention_timeout_seconds",
        kind: Kind::Gauge,
        help: "Adaptive retention timeout of each vCPU's yielding thread",
        labels: &["cpu"],
        print: None,
        read: |s| by_cpu(s.vcpu_timeouts.iter().map(|v| (v.cpu, Value::seconds(v.timeout_ns)))),
    },
    Stat {
        name: "retention_timeout_grows",
        kind: Kind::Counter,
        help: "Times a vCPU's adaptive timeout grew",
        labels: &[],
        print: None,
        read: |s| one(Value::Count(s.vcpu_timeouts.iter().map(|v| v.grows).sum())),
    },
    Stat {
        name: "retention_timeout_shrinks",
        kind: Kind::Counter,
        help: "Times a vCPU's adaptive timeout shrank",
        labels: &[],
        print: None,
        read: |s| one(Value::Count(s.vcpu_timeouts.iter().map(|v| v.shrinks).sum())),
    },
    Stat {
        name: "retention_switches",
        kind: Kind::Counter,
        help: "Times the governor switched retention's baseline mode",
        labels: &[],
        print: None,
        read: |s| one(Value::Count(s.governor.map_or(0, |g| g.switches))),
    },
    Stat {
        name: "retention_probes",
        kind: Kind::Counter,
        help: "Probe epochs the governor ran in the other mode",
        labels: &[],
        print: None,
        read: |s| one(Value::Count(s.governor.map_or(0, |g| g.probes))),
    },
];

/// The traced wakeups' summaries by the state of the vCPU woken onto.
fn by_target(i: &IdleStatus, value: fn(&gleaner_policy::idle::LatencySummary) -> Value) -> Reading {
    let w = i.wake.as_ref()?;
    let states = [("busy", &w.busy), ("poll", &w.poll), ("halt", &w.halt), ("idle", &w.idle)];
    Some(states.into_iter().map(|(state, l)| Sample { labels: vec![state.to_string()], value: value(l) }).collect())
}

impl IdleStatus {
    /// The idle policy's stats: kernel polling, each vCPU's mechanism and window, the traced
    /// wakeups by target state.
    pub const STATS: &'static [Stat<IdleStatus>] = &[
        Stat {
            name: "kernel_polling_seconds",
            kind: Kind::Counter,
            help: "Time the managed vCPUs polled in the kernel's POLL state (idle for /proc/stat)",
            labels: &[],
            print: None,
            read: |i| one(Value::seconds(i.poll_ns)),
        },
        // prometheus-client writes an infinite float as `inf`, which OpenMetrics does not
        // read: "until work arrives" is a gauge of its own.
        Stat {
            name: "vcpu_idle_window_seconds",
            kind: Kind::Gauge,
            help: "How long an idle vCPU is kept from halting (vCPUs kept until work arrives: see vcpu_idle_until_work)",
            labels: &["cpu"],
            print: None,
            read: |i| by_cpu(i.plan.as_ref()?.vcpus.iter().filter(|v| v.window_ns != ALWAYS).map(|v| (v.cpu, Value::seconds(v.window_ns)))),
        },
        Stat {
            name: "vcpu_idle_until_work",
            kind: Kind::Gauge,
            help: "1 where an idle vCPU is kept from halting until work arrives",
            labels: &["cpu"],
            print: None,
            read: |i| by_cpu(i.plan.as_ref()?.vcpus.iter().map(|v| (v.cpu, Value::Count(u64::from(v.window_ns == ALWAYS))))),
        },
        Stat {
            name: "vcpu_idle_mechanism",
            kind: Kind::Gauge,
            help: "What keeps each vCPU from halting (1 for the one in use)",
            labels: &["cpu", "mechanism"],
            print: None,
            read: |i| {
                let mechanisms = [(Mechanism::Halt, "halt"), (Mechanism::Poll, "poll"), (Mechanism::Yield, "yield")];
                let each = i.plan.as_ref()?.vcpus.iter().flat_map(|v| {
                    mechanisms.into_iter().map(move |(m, name)| Sample {
                        labels: vec![v.cpu.to_string(), name.to_string()],
                        value: Value::Count(u64::from(v.mechanism == m)),
                    })
                });
                Some(each.collect())
            },
        },
        Stat {
            name: "poll_window_seconds",
            kind: Kind::Gauge,
            help: "The haltpoll governor's cap (guest_halt_poll_ns) the agent set",
            labels: &[],
            print: None,
            read: |i| one(Value::seconds(i.plan.as_ref()?.poll_window_ns)),
        },
        Stat {
            name: "wakeups",
            kind: Kind::Gauge,
            help: "The workload's wakeups in the last traced period, by the state of the vCPU woken onto",
            labels: &["target"],
            print: None,
            read: |i| by_target(i, |l| Value::Count(l.count)),
        },
        Stat {
            name: "wakeup_latency_mean_seconds",
            kind: Kind::Gauge,
            help: "Their mean latency, sched_waking to running",
            labels: &["target"],
            print: None,
            read: |i| by_target(i, |l| Value::Float(l.mean_ns / 1e9)),
        },
    ];
}

impl StatusReport {
    /// Adds one period (the one place the agent sums its periods): its counts to the
    /// [`Totals`], kernel polling to the idle status, each vCPU's timeout (grows and shrinks
    /// summed), and the decisions and retention switches among `records` to the recent ones
    /// (at most [`RECENT`]).
    pub fn add_period(&mut self, extras: &PeriodExtras, decisions: u64, ran: RetentionMode, records: Vec<EventRecord>) {
        for v in &extras.vcpus {
            match self.vcpu_timeouts.iter_mut().find(|t| t.cpu == v.cpu) {
                Some(t) => {
                    t.timeout_ns = v.timeout_ns;
                    t.grows += v.grows;
                    t.shrinks += v.shrinks;
                }
                None => self.vcpu_timeouts.push(*v),
            }
        }
        self.totals.add_period(extras, decisions, ran.is_on());
        if let Some(i) = &mut self.idle {
            i.poll_ns += extras.poll_ns;
        }
        self.threads = extras.threads;
        let kept =
            |r: &EventRecord| r.decision.is_some() || r.change.is_some_and(|c| c.cause == gleaner_policy::retention::ChangeCause::Switch);
        for r in records.into_iter().filter(kept) {
            if self.recent.len() == RECENT {
                self.recent.pop_front();
            }
            self.recent.push_back(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The overhead line gives each total as a share of the run, and nothing before it ran.
    #[test]
    fn overhead_is_printed_as_shares_of_the_run() {
        let o = Overhead { probe_ns: 1_000_000_000, probe_worse_ns: 250_000_000, agent_cpu_ns: 30_000_000 };
        assert_eq!(o.line(10.0), "probing 10.0% of the run (2.5% in a plan found worse)   agent CPU 0.30% of a vCPU");
        assert_eq!(o.line(0.0), "probing 0.0% of the run (0.0% in a plan found worse)   agent CPU 0.00% of a vCPU");
        let back: StatusReport =
            serde_json::from_str(&serde_json::to_string(&StatusReport { overhead: o, ..StatusReport::default() }).unwrap()).unwrap();
        assert_eq!(back.overhead, o);
    }

    #[test]
    fn events_are_json_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("e.jsonl");
        let mut log = EventLog::open(&p).unwrap();
        let e = EventRecord {
            decision: Some(Decision::Deactivate { cpu: 1 }),
            ..EventRecord::new(5, EventKind::Consolidate, "0".into(), Metrics::default())
        };
        let period = EventRecord {
            count: Some(3),
            vcpus: Some(vec![VcpuTimeout { cpu: 0, timeout_ns: 20_000, grows: 1, shrinks: 0 }]),
            retention: Some(RetentionMode::Off),
            ..EventRecord::new(6, EventKind::Period, "0".into(), Metrics::default())
        };
        let change = EventRecord {
            retention: Some(RetentionMode::On),
            change: Some(ModeChange {
                from: RetentionMode::Off,
                to: RetentionMode::On,
                cause: gleaner_policy::retention::ChangeCause::Probe,
            }),
            ..EventRecord::new(7, EventKind::Retention, "0".into(), Metrics::default())
        };
        for r in [&e, &e, &period, &change] {
            log.write(r).unwrap();
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<EventRecord> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines, vec![e.clone(), e, period, change]);
        // Typed fields, unset ones left out.
        let v: serde_json::Value = serde_json::from_str(text.lines().nth(3).unwrap()).unwrap();
        assert_eq!(v["change"]["cause"], "probe");
        assert_eq!(v["retention"], "on");
        assert!(v.get("decision").is_none() && v.get("vcpus").is_none());
    }

    #[test]
    fn event_kinds_keep_their_names_and_unknown_ones_are_read() {
        for (k, name) in [(EventKind::Consolidate, "consolidate"), (EventKind::FactorChange, "factor_change"), (EventKind::Exit, "exit")] {
            assert_eq!(serde_json::to_string(&k).unwrap(), format!("\"{name}\""));
            assert_eq!(k.to_string(), name);
            assert_eq!(serde_json::from_str::<EventKind>(&format!("\"{name}\"")).unwrap(), k);
        }
        let period = serde_json::to_string(&EventRecord::new(1, EventKind::Period, "0".into(), Metrics::default())).unwrap();
        let newer = period.replace("\"period\"", "\"hotplug\"");
        let e: EventRecord = serde_json::from_str(&newer).unwrap_or_else(|e| panic!("{e}: {newer}"));
        assert_eq!(e.event, EventKind::Other);
    }
}
