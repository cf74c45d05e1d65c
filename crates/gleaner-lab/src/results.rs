//! Result rows (one per measured run) and the per-mode summary: the survey's reduced
//! resource/temporal efficiency and omega against the native baseline
//! ([`gleaner_policy::overhead`]), the speedup against the stock mode and the Gleaner paper's
//! weighted speedup, each median with a bootstrap 95% confidence interval
//! ([`gleaner_policy::stats::bootstrap_ci`]), and the cost side: host CPU per unit of work,
//! vCPU halts per unit of work and host CPU per avoided halt.
//!
//! The bench output of a step is the same Rust type the bench prints
//! ([`gleaner_measure::report::BenchDoc`], its runs [`gleaner_measure::RunMetrics`]), read with
//! the measurement crate's own reader; the agent's decisions are its `--events` JSON lines,
//! read as [`gleaner_agent::status::EventRecord`]s.

use std::collections::BTreeMap;

use gleaner_agent::status::{EventKind, EventRecord, VcpuTimeout};
use gleaner_measure::report::{self, BenchDoc};
use gleaner_policy::overhead::{overhead, Side};
use gleaner_policy::retention::{ChangeCause, RetentionMode};
use gleaner_policy::stats::{bootstrap_ci, median as median_of, Interval, BOOTSTRAP_RESAMPLES};
use gleaner_policy::IdlePolicy;
use serde::{Deserialize, Serialize};

use crate::keys::policy_or_empty;
pub use crate::keys::{Env, HaltPoll, Instance, RowMode};

/// The bench document in a step's stdout (the whole output, or the first JSON object in it
/// when something else printed too: [`report::from_output`]). Errors say what was wrong.
pub fn parse_bench_output(stdout: &str) -> Result<BenchDoc, String> {
    let doc: BenchDoc = report::from_output(stdout).map_err(|e| e.to_string())?;
    if doc.runs.is_empty() {
        return Err("bench JSON has no runs".into());
    }
    Ok(doc)
}

/// What the guest agent did during one step, from its `--events` JSON lines.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AgentSummary {
    /// Event lines read (and lines that were not an event record).
    pub events: usize,
    pub bad_lines: usize,
    /// vCPUs deactivated, given back, and resets to every vCPU.
    pub consolidations: u64,
    pub restores: u64,
    pub resets: u64,
    /// Fewest and last active vCPUs seen in any event.
    pub min_active: Option<usize>,
    pub last_active: Option<usize>,
    /// Retention timeouts (times a yielder let its vCPU halt), summed over the `period` lines
    /// (and over `timeout` lines, which a log may also hold).
    pub timeouts: u64,
    /// Control periods (`period` lines).
    #[serde(default)]
    pub periods: u64,
    /// Mean active vCPUs over the step, time-weighted: each `period` line's active vCPUs
    /// (at the period's end) weighted by its length (its `t_ms` minus the previous line's).
    #[serde(default)]
    pub mean_active: Option<f64>,
    /// Share of the periods with yielding threads that ran with retention on.
    #[serde(default)]
    pub retention_on_share: Option<f64>,
    /// Changes of retention mode: the governor's switches and its probes.
    #[serde(default)]
    pub retention_switches: u64,
    #[serde(default)]
    pub retention_probes: u64,
    /// Each vCPU's retention timeout in the last `period` line, with its grows and shrinks
    /// summed over the step.
    #[serde(default)]
    pub vcpu_timeouts: Vec<VcpuTimeout>,
    /// The agent's own CPU time over the step (its last `period` or `exit` line; the yielding
    /// threads included), in ms.
    #[serde(default)]
    pub agent_cpu_ms: Option<f64>,
}

impl AgentSummary {
    /// Reads the agent's `--events` JSON lines (a guest's output: counts saturate rather than
    /// overflow).
    pub fn from_events(text: &str) -> Self {
        let mut s = Self::default();
        let (mut last_t_ms, mut weighted, mut total_ms, mut active_sum) = (0u64, 0.0, 0u64, 0usize);
        let (mut governed_periods, mut on_periods) = (0u64, 0u64);
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let Ok(e) = serde_json::from_str::<EventRecord>(line) else {
                s.bad_lines += 1;
                continue;
            };
            s.events += 1;
            let active = e.metrics.active;
            match e.event {
                EventKind::Consolidate => s.consolidations += 1,
                EventKind::Restore => s.restores += 1,
                EventKind::Reset => s.resets += 1,
                EventKind::Timeout => s.timeouts = s.timeouts.saturating_add(e.count.unwrap_or(0)),
                EventKind::Period => {
                    s.periods += 1;
                    s.timeouts = s.timeouts.saturating_add(e.count.unwrap_or(0));
                    let ms = e.t_ms.saturating_sub(last_t_ms);
                    last_t_ms = e.t_ms;
                    weighted += active as f64 * ms as f64;
                    total_ms = total_ms.saturating_add(ms);
                    active_sum = active_sum.saturating_add(active);
                    if let Some(mode) = e.retention {
                        governed_periods += 1;
                        on_periods += u64::from(mode == RetentionMode::On);
                    }
                    for v in e.vcpus.iter().flatten() {
                        match s.vcpu_timeouts.iter_mut().find(|t| t.cpu == v.cpu) {
                            Some(t) => {
                                let (grows, shrinks) = (t.grows.saturating_add(v.grows), t.shrinks.saturating_add(v.shrinks));
                                *t = VcpuTimeout { timeout_ns: v.timeout_ns, grows, shrinks, ..*t }
                            }
                            None => s.vcpu_timeouts.push(*v),
                        }
                    }
                }
                EventKind::Retention => match e.change.map(|c| c.cause) {
                    Some(ChangeCause::Switch) => s.retention_switches += 1,
                    Some(ChangeCause::Probe) => s.retention_probes += 1,
                    _ => {}
                },
                _ => {}
            }
            if let Some(ns) = e.agent_cpu_ns {
                s.agent_cpu_ms = Some(s.agent_cpu_ms.unwrap_or(0.0).max(ns as f64 / 1e6));
            }
            if active > 0 {
                s.min_active = Some(s.min_active.map_or(active, |m| m.min(active)));
                s.last_active = Some(active);
            }
        }
        // All periods at one t_ms (no length to weigh by): the plain per-period mean.
        s.mean_active = match (s.periods, total_ms) {
            (0, _) => None,
            (n, 0) => Some(active_sum as f64 / n as f64),
            (_, t) => Some(weighted / t as f64),
        };
        s.retention_on_share = (governed_periods > 0).then(|| on_periods as f64 / governed_periods as f64);
        s.vcpu_timeouts.sort_by_key(|v| v.cpu);
        s
    }
}

/// One measured run of the workload (native or in a guest) or of the co-runner.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Row {
    pub env: Env,
    pub instance: Instance,
    /// The mode's name (`off`, `gleaner`, ...); `native` for baselines; `co-runner`.
    pub mode: RowMode,
    /// The mode's policy; none for native and co-runner rows.
    #[serde(default, with = "policy_or_empty")]
    pub policy: Option<IdlePolicy>,
    /// Host `kvm.halt_poll_ns` setting.
    pub halt_poll: HaltPoll,
    pub rep: u32,
    pub rc: i32,
    /// Guest-side (or native) measurements from the bench JSON.
    pub wall_ns: u64,
    pub cpu_ns: u64,
    pub vcsw: u64,
    pub nivcsw: u64,
    pub idle_entries: Option<u64>,
    pub steal_ns: u64,
    pub items: Option<u64>,
    pub throughput: Option<f64>,
    /// The cpuidle driver the run saw (guest: `none`, `haltpoll`, ...).
    #[serde(default)]
    pub cpuidle_driver: Option<String>,
    /// Host-side CPU time of the whole QEMU process during the step, and of each vCPU thread.
    pub host_cpu_ns: Option<u64>,
    pub host_vcpu_ns: Vec<u64>,
    /// Host-side time the vCPU threads were runnable but not running (summed), ns.
    #[serde(default)]
    pub host_vcpu_wait_ns: Option<u64>,
    /// Times the vCPU threads blocked on the host (halts, and rarer waits for QEMU's lock).
    #[serde(default)]
    pub vcpu_sleeps: Option<u64>,
    /// Times the host preempted a vCPU thread.
    #[serde(default)]
    pub vcpu_preemptions: Option<u64>,
    /// Host-side window, seconds since the session started.
    pub begin_s: f64,
    pub end_s: f64,
    /// The survey's gamma: ideal effective CPU count available to this run.
    pub gamma: f64,
    /// Co-runner throughput (items/s) while this step ran (oc).
    pub co_runner_rate: Option<f64>,
    /// What the guest agent did in this step (agent policies).
    #[serde(default)]
    pub agent: Option<AgentSummary>,
    pub error: Option<RunError>,
}

/// Why a run gave no measurement. Written as one string (`not run: WHY` or the failure's
/// message), as results documents have always had it, and read back once, here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum RunError {
    /// The run was never started: the policy cannot run in this guest, or the guest's job
    /// ended before its step.
    NotRun(String),
    /// It ran and failed, or printed no bench document.
    Failed(String),
}

const NOT_RUN: &str = "not run: ";

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::NotRun(why) => write!(f, "{NOT_RUN}{why}"),
            RunError::Failed(msg) => f.write_str(msg),
        }
    }
}

impl From<String> for RunError {
    fn from(s: String) -> Self {
        match s.strip_prefix(NOT_RUN) {
            Some(why) => RunError::NotRun(why.to_string()),
            None => RunError::Failed(s),
        }
    }
}

impl From<RunError> for String {
    fn from(e: RunError) -> String {
        e.to_string()
    }
}

impl Row {
    /// CPU cost in the survey's sense: host-side for guests (all QEMU threads), rusage natively.
    pub fn cost_ns(&self) -> u64 {
        self.host_cpu_ns.unwrap_or(self.cpu_ns)
    }
    pub fn ok(&self) -> bool {
        self.rc == 0 && self.error.is_none() && self.wall_ns > 0
    }
    /// Host CPU per unit of work (items, phases, hand-offs), us.
    pub fn host_cpu_per_item_us(&self) -> Option<f64> {
        let items = self.items.filter(|&n| n > 0)? as f64;
        Some(self.host_cpu_ns? as f64 / 1e3 / items)
    }
    /// vCPU halts (host-side sleeps of the vCPU threads) per unit of work.
    pub fn sleeps_per_item(&self) -> Option<f64> {
        let items = self.items.filter(|&n| n > 0)? as f64;
        Some(self.vcpu_sleeps? as f64 / items)
    }

    /// Fills the guest-side fields from a bench document.
    pub fn fill_from_bench(&mut self, stdout: &str) {
        match parse_bench_output(stdout) {
            Ok(doc) => {
                let r = &doc.runs[0];
                self.wall_ns = r.wall_ns;
                self.cpu_ns = r.cpu_ns();
                self.vcsw = r.vcsw;
                self.nivcsw = r.nivcsw;
                self.idle_entries = r.idle_entries;
                self.steal_ns = r.steal_ns;
                self.items = r.items;
                self.throughput = r.throughput;
                self.cpuidle_driver = Some(doc.host.cpuidle_driver.clone().unwrap_or_else(|| "none".into()));
            }
            Err(e) => {
                let head: String = stdout.chars().take(200).collect();
                self.error = Some(RunError::Failed(format!("{e}; output: {head}")));
            }
        }
    }
}

/// The columns of `runs.csv`, each with how to print it.
type Column = (&'static str, fn(&Row) -> String);

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or(String::new(), ToString::to_string)
}

const COLUMNS: &[Column] = &[
    ("env", |r| r.env.to_string()),
    ("instance", |r| r.instance.to_string()),
    ("mode", |r| r.mode.to_string()),
    ("policy", |r| opt(&r.policy)),
    ("halt_poll", |r| r.halt_poll.to_string()),
    ("rep", |r| r.rep.to_string()),
    ("rc", |r| r.rc.to_string()),
    ("wall_ns", |r| r.wall_ns.to_string()),
    ("cpu_ns", |r| r.cpu_ns.to_string()),
    ("vcsw", |r| r.vcsw.to_string()),
    ("nivcsw", |r| r.nivcsw.to_string()),
    ("idle_entries", |r| opt(&r.idle_entries)),
    ("steal_ns", |r| r.steal_ns.to_string()),
    ("items", |r| opt(&r.items)),
    ("throughput", |r| opt(&r.throughput)),
    ("cpuidle_driver", |r| opt(&r.cpuidle_driver)),
    ("host_cpu_ns", |r| opt(&r.host_cpu_ns)),
    ("host_vcpu_ns", |r| r.host_vcpu_ns.iter().map(u64::to_string).collect::<Vec<_>>().join(";")),
    ("host_vcpu_wait_ns", |r| opt(&r.host_vcpu_wait_ns)),
    ("vcpu_sleeps", |r| opt(&r.vcpu_sleeps)),
    ("vcpu_preemptions", |r| opt(&r.vcpu_preemptions)),
    ("begin_s", |r| format!("{:.3}", r.begin_s)),
    ("end_s", |r| format!("{:.3}", r.end_s)),
    ("gamma", |r| r.gamma.to_string()),
    ("co_runner_rate", |r| opt(&r.co_runner_rate)),
    ("consolidations", |r| r.agent.as_ref().map_or(String::new(), |a| a.consolidations.to_string())),
    ("min_active_vcpus", |r| r.agent.as_ref().and_then(|a| a.min_active).map_or(String::new(), |m| m.to_string())),
    ("mean_active_vcpus", |r| r.agent.as_ref().and_then(|a| a.mean_active).map_or(String::new(), |m| format!("{m:.3}"))),
    ("retention_on_share", |r| r.agent.as_ref().and_then(|a| a.retention_on_share).map_or(String::new(), |m| format!("{m:.3}"))),
    ("agent_cpu_ms", |r| r.agent.as_ref().and_then(|a| a.agent_cpu_ms).map_or(String::new(), |m| format!("{m:.1}"))),
    ("error", |r| r.error.as_ref().map(RunError::to_string).unwrap_or_default()),
];

/// The header line of `runs.csv`.
pub fn csv_header() -> String {
    COLUMNS.iter().map(|c| c.0).collect::<Vec<_>>().join(",")
}

pub(crate) fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

pub fn rows_csv(rows: &[Row]) -> String {
    let mut s = csv_header();
    s.push('\n');
    for r in rows {
        s.push_str(&COLUMNS.iter().map(|c| csv_field(&(c.1)(r))).collect::<Vec<_>>().join(","));
        s.push('\n');
    }
    s
}

/// One line of the report's main table: a (halt poll, mode) cell for an instance.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct SummaryRow {
    pub instance: Instance,
    pub mode: RowMode,
    #[serde(default, with = "policy_or_empty")]
    pub policy: Option<IdlePolicy>,
    pub halt_poll: HaltPoll,
    pub runs_ok: usize,
    pub runs: usize,
    /// When no run succeeded: the first failed run's error (e.g. a policy `not run:` here, and
    /// why), so a matrix line says why it is empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<RunError>,
    pub wall_s: Option<f64>,
    /// Bootstrap 95% interval of the median wall time, s.
    #[serde(default)]
    pub wall_ci: Option<Interval>,
    /// Relative spread of the wall time ((p90 - p10) / median) when >= 3 runs.
    pub wall_spread: Option<f64>,
    pub guest_cpu_s: Option<f64>,
    pub host_cpu_s: Option<f64>,
    pub host_vcpu_s: Vec<f64>,
    /// Host CPU per unit of work (median over runs), us.
    #[serde(default)]
    pub host_cpu_per_item_us: Option<f64>,
    /// vCPU halts per unit of work (host-side vCPU thread sleeps, median over runs).
    #[serde(default)]
    pub sleeps_per_item: Option<f64>,
    /// Host time the vCPU threads waited for a pCPU while runnable (median), s.
    #[serde(default)]
    pub vcpu_wait_s: Option<f64>,
    /// Extra host CPU per halt avoided against the stock mode, us: (CPU/item - stock CPU/item)
    /// / (stock halts/item - halts/item), when this mode halts less.
    #[serde(default)]
    pub cpu_per_avoided_halt_us: Option<f64>,
    pub idle_entries: Option<f64>,
    pub d_eta_r: Option<f64>,
    pub d_eta_t: Option<f64>,
    pub omega: Option<f64>,
    /// Wall time of the stock mode / this mode, same instance and halt-poll setting.
    pub speedup: Option<f64>,
    #[serde(default)]
    pub speedup_ci: Option<Interval>,
    pub co_runner_rate: Option<f64>,
    /// This mode's co-runner rate / the stock mode's.
    #[serde(default)]
    pub co_runner_ratio: Option<f64>,
    #[serde(default)]
    pub co_runner_ratio_ci: Option<Interval>,
    /// Gleaner paper 7.2.1: mean of the workload's and the co-runner's speedups vs stock.
    pub weighted_speedup: Option<f64>,
    #[serde(default)]
    pub weighted_speedup_ci: Option<Interval>,
    /// Median vCPUs deactivated by the agent per run, and the fewest active vCPUs seen.
    #[serde(default)]
    pub consolidations: Option<f64>,
    #[serde(default)]
    pub min_active_vcpus: Option<usize>,
    /// Median over runs of the agent's time-weighted mean active vCPUs, and of the share of its
    /// periods with retention on (from its `period` events).
    #[serde(default)]
    pub mean_active_vcpus: Option<f64>,
    #[serde(default)]
    pub retention_on_share: Option<f64>,
    /// Median over runs of the agent's own CPU time per step (ms; its yielding threads
    /// included): what the agent's presence costs inside the guest.
    #[serde(default)]
    pub agent_cpu_ms: Option<f64>,
    /// The cpuidle driver the guest runs had (when all agreed), else `mixed`.
    #[serde(default)]
    pub cpuidle_driver: Option<String>,
    /// Median items per run.
    #[serde(default)]
    pub items: Option<f64>,
    /// VM rows: the share of the CPU the vCPU threads burned (host view) that was the
    /// workload's own compute (steps per item x work per step); the rest is synchronization,
    /// the guest kernel, idle polling and yielding.
    #[serde(default)]
    pub compute_share: Option<f64>,
    /// Stock rows: the largest speedup any idle policy could give, if every vCPU halt of the
    /// run cost only a same-vCPU switch (halts per item x (mean wakeup of a halted vCPU - mean
    /// same-vCPU wakeup), measured in the scenario, taken off the time per item; an upper bound
    /// that puts every halt on the critical path).
    #[serde(default)]
    pub bww_bound: Option<f64>,
}

impl SummaryRow {
    /// Wall time per item, us.
    pub fn wall_per_item_us(&self) -> Option<f64> {
        Some(self.wall_s? * 1e6 / self.items.filter(|&n| n > 0.0)?)
    }
}

/// The blocked-waiter bound of a stock row (see [`SummaryRow::bww_bound`]): `penalty_us` is
/// what waking a halted vCPU costs beyond a same-vCPU wakeup.
pub fn bww_bound(s: &SummaryRow, penalty_us: f64) -> Option<f64> {
    let per_item = s.wall_per_item_us()?;
    let saved = (s.sleeps_per_item? * penalty_us.max(0.0)).min(per_item * 0.999);
    Some(per_item / (per_item - saved))
}

/// The bound as a table shows it: above 10x the halts' penalties add up to (nearly) the whole
/// time per item, so they cannot all be on the critical path (threads halt in parallel) and
/// the bound says only that it is large.
pub fn bound_label(b: f64) -> String {
    if b >= 10.0 {
        "> 10x (halts overlap)".into()
    } else {
        format!("{b:.2}x")
    }
}

fn median(v: &[f64]) -> Option<f64> {
    median_of(v).ok()
}

/// A stable seed per table cell, so a report is reproducible from its rows.
fn seed_of(parts: &[&str]) -> u64 {
    parts
        .iter()
        .flat_map(|p| p.bytes().chain([0xff]))
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

fn ci95(samples: &[&[f64]], seed: u64, stat: impl Fn(&[Vec<f64>]) -> Option<f64>) -> Option<Interval> {
    bootstrap_ci(samples, 0.95, BOOTSTRAP_RESAMPLES, seed, stat).ok()
}

/// Builds the summary. `stock` is the stock mode (speedups relative to it).
pub fn summarize(rows: &[Row], stock: &RowMode) -> Vec<SummaryRow> {
    let native: Vec<&Row> = rows.iter().filter(|r| r.env == Env::Native && r.ok()).collect();
    let native_side = (!native.is_empty()).then(|| Side {
        cpu: median(&native.iter().map(|r| r.cpu_ns as f64).collect::<Vec<_>>()).unwrap_or(0.0),
        wall: median(&native.iter().map(|r| r.wall_ns as f64).collect::<Vec<_>>()).unwrap_or(0.0),
        gamma: native[0].gamma,
    });
    // Lines ordered by environment, then by the keys' text (halt poll, instance, mode).
    let mut groups: BTreeMap<(Env, String, String, String), Vec<&Row>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.mode != RowMode::CoRunner) {
        groups.entry((r.env, r.halt_poll.to_string(), r.instance.to_string(), r.mode.to_string())).or_default().push(r);
    }
    let mut out: Vec<SummaryRow> = Vec::new();
    for ((env, hp_text, inst_text, mode_text), rs) in &groups {
        let (hp, inst, mode) = (&rs[0].halt_poll, &rs[0].instance, &rs[0].mode);
        let ok: Vec<&Row> = rs.iter().copied().filter(|r| r.ok()).collect();
        let col = |f: &dyn Fn(&Row) -> Option<f64>| ok.iter().filter_map(|r| f(r)).collect::<Vec<f64>>();
        let walls = col(&|r| Some(r.wall_ns as f64 / 1e9));
        let wall = median(&walls);
        let host = if *env == Env::Vm { median(&col(&|r| r.host_cpu_ns.map(|x| x as f64))) } else { None };
        let nv = ok.iter().map(|r| r.host_vcpu_ns.len()).max().unwrap_or(0);
        let host_vcpu_s = (0..nv).filter_map(|i| median(&col(&|r| r.host_vcpu_ns.get(i).map(|&x| x as f64)))).map(|x| x / 1e9).collect();
        let (d_eta_r, d_eta_t, omega) = match (env, native_side, wall, host) {
            (Env::Vm, Some(base), Some(w), Some(c)) => match overhead(base, Side { cpu: c, wall: w * 1e9, gamma: ok[0].gamma }) {
                Ok(o) => (Some(o.d_eta_r), Some(o.d_eta_t), Some(o.omega)),
                Err(_) => (None, None, None),
            },
            _ => (None, None, None),
        };
        let spread = gleaner_policy::stats::Summary::of(&walls).ok().filter(|_| walls.len() >= 3).map(|s| s.relative_spread());
        let drivers: Vec<&str> = ok.iter().filter_map(|r| r.cpuidle_driver.as_deref()).collect();
        let cpuidle_driver = drivers.first().map(|d| if drivers.iter().all(|x| x == d) { (*d).to_string() } else { "mixed".into() });
        out.push(SummaryRow {
            instance: *inst,
            mode: mode.clone(),
            policy: rs.first().and_then(|r| r.policy),
            halt_poll: *hp,
            failure: if ok.is_empty() { rs.iter().find_map(|r| r.error.clone()) } else { None },
            runs_ok: ok.len(),
            runs: rs.len(),
            wall_s: wall,
            wall_ci: ci95(&[&walls], seed_of(&[inst_text, mode_text, hp_text, "wall"]), |d| median(&d[0])),
            wall_spread: spread,
            guest_cpu_s: median(&col(&|r| Some(r.cpu_ns as f64))).map(|x| x / 1e9),
            host_cpu_s: host.map(|x| x / 1e9),
            host_vcpu_s,
            host_cpu_per_item_us: median(&col(&Row::host_cpu_per_item_us)),
            sleeps_per_item: median(&col(&Row::sleeps_per_item)),
            vcpu_wait_s: median(&col(&|r| r.host_vcpu_wait_ns.map(|x| x as f64 / 1e9))),
            idle_entries: median(&col(&|r| r.idle_entries.map(|x| x as f64))),
            d_eta_r,
            d_eta_t,
            omega,
            co_runner_rate: median(&col(&|r| r.co_runner_rate)),
            consolidations: median(&col(&|r| r.agent.as_ref().map(|a| a.consolidations as f64))),
            min_active_vcpus: ok.iter().filter_map(|r| r.agent.as_ref()?.min_active).min(),
            mean_active_vcpus: median(&col(&|r| r.agent.as_ref()?.mean_active)),
            retention_on_share: median(&col(&|r| r.agent.as_ref()?.retention_on_share)),
            agent_cpu_ms: median(&col(&|r| r.agent.as_ref()?.agent_cpu_ms)),
            cpuidle_driver,
            items: median(&col(&|r| r.items.map(|n| n as f64))),
            ..Default::default()
        });
    }
    relative_to_stock(&mut out, rows, stock);
    out
}

/// Speedups, co-runner ratios and weighted speedups (with intervals) against the stock mode
/// of the same instance and halt-poll setting, and host CPU per avoided halt.
fn relative_to_stock(out: &mut [SummaryRow], rows: &[Row], stock: &RowMode) {
    let runs_of = |inst: Instance, hp: HaltPoll, mode: &RowMode| -> Vec<&Row> {
        rows.iter().filter(|r| r.ok() && r.instance == inst && r.halt_poll == hp && r.mode == *mode).collect()
    };
    let snapshot = out.to_vec();
    for s in out.iter_mut().filter(|s| s.mode != RowMode::Native) {
        let Some(base) = snapshot.iter().find(|b| b.instance == s.instance && b.halt_poll == s.halt_poll && b.mode == *stock) else {
            continue;
        };
        let (b_rows, m_rows) = (runs_of(s.instance, s.halt_poll, stock), runs_of(s.instance, s.halt_poll, &s.mode));
        let walls = |rs: &[&Row]| rs.iter().map(|r| r.wall_ns as f64).collect::<Vec<_>>();
        let rates = |rs: &[&Row]| rs.iter().filter_map(|r| r.co_runner_rate).collect::<Vec<_>>();
        let (bw, mw, br, mr) = (walls(&b_rows), walls(&m_rows), rates(&b_rows), rates(&m_rows));
        let seed = seed_of(&[&s.instance.to_string(), &s.mode.to_string(), &s.halt_poll.to_string()]);
        let ratio = |d: &[Vec<f64>]| {
            let t = median(&d[1])?;
            (t > 0.0).then(|| median(&d[0]).map(|b| b / t)).flatten()
        };
        if let (Some(b), Some(w)) = (base.wall_s, s.wall_s) {
            s.speedup = Some(b / w);
            s.speedup_ci = ci95(&[&bw, &mw], seed, ratio);
        }
        if let (Some(b), Some(r)) = (base.co_runner_rate, s.co_runner_rate) {
            if b > 0.0 {
                s.co_runner_ratio = Some(r / b);
                s.co_runner_ratio_ci = ci95(&[&mr, &br], seed ^ 1, ratio);
                if let Some(sp) = s.speedup {
                    s.weighted_speedup = Some(0.5 * (sp + r / b));
                    s.weighted_speedup_ci = ci95(&[&bw, &mw, &br, &mr], seed ^ 2, |d| {
                        let sp = median(&d[0])? / median(&d[1]).filter(|&x| x > 0.0)?;
                        let co = median(&d[3])? / median(&d[2]).filter(|&x| x > 0.0)?;
                        Some(0.5 * (sp + co))
                    });
                }
            }
        }
        if let (Some(bc), Some(c), Some(bh), Some(h)) =
            (base.host_cpu_per_item_us, s.host_cpu_per_item_us, base.sleeps_per_item, s.sleeps_per_item)
        {
            if bh - h > 1e-9 {
                s.cpu_per_avoided_halt_us = Some((c - bc) / (bh - h));
            }
        }
    }
}

/// Items per second a co-runner achieved during `[begin, end]` (host seconds on a common
/// clock): each co-runner iteration contributes its items in proportion to its overlap.
pub fn co_runner_rate(begin: f64, end: f64, iterations: &[(f64, f64, u64)]) -> Option<f64> {
    if end <= begin {
        return None;
    }
    let mut items = 0.0;
    let mut any = false;
    for &(b, e, n) in iterations {
        let overlap = (e.min(end) - b.max(begin)).max(0.0);
        if overlap > 0.0 && e > b {
            items += n as f64 * overlap / (e - b);
            any = true;
        }
    }
    any.then(|| items / (end - begin))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench_json(wall: u64, items: u64, driver: Option<&str>) -> String {
        let host = gleaner_measure::report::HostInfo {
            kernel: "6.1".into(),
            cpus: 2,
            allowed_cpus: "0-1".into(),
            virtualized: true,
            hypervisor: None,
            cpuidle_driver: driver.map(str::to_string),
            cpuidle_governor: None,
            git_revision: None,
            date: String::new(),
        };
        let run = gleaner_measure::RunMetrics { wall_ns: wall, user_ns: 50, sys_ns: 5, vcsw: 9, items: Some(items), ..Default::default() };
        let doc = BenchDoc {
            kind: "workload".into(),
            name: "pipeline".into(),
            params: serde_json::json!({}),
            summary: gleaner_measure::report::RunSummary::of(std::slice::from_ref(&run)).unwrap(),
            runs: vec![run],
            host,
        };
        serde_json::to_string_pretty(&doc).unwrap()
    }

    #[test]
    fn parses_the_bench_document_also_after_other_output() {
        let out = bench_json(100, 7, Some("haltpoll"));
        let d = parse_bench_output(&format!("\n{out}\n")).unwrap();
        assert_eq!((d.runs[0].wall_ns, d.runs[0].items), (100, Some(7)));
        let d = parse_bench_output(&format!("agent: started\n{out}\ntrailing")).unwrap();
        assert_eq!(d.host.cpuidle_driver.as_deref(), Some("haltpoll"));
        let mut row = Row::default();
        row.fill_from_bench(&out);
        assert_eq!((row.wall_ns, row.cpu_ns, row.cpuidle_driver.as_deref()), (100, 55, Some("haltpoll")));
    }

    /// The lab reads exactly what `gleaner bench workload --json` writes: a real run's
    /// document, written by the bench's writer, comes back with every key and value.
    #[test]
    fn reads_exactly_what_bench_workload_json_writes() {
        use gleaner_bench::workload::{Workload, WorkloadParams};
        let params = WorkloadParams { threads: 2, ..WorkloadParams::quick(Workload::Pipeline) };
        let doc = gleaner_bench::commands_for_tests::workload_doc(Workload::Pipeline, &params, 2).unwrap();
        let mut out = Vec::new();
        report::write_document(&mut out, &doc).unwrap();
        let text = String::from_utf8(out).unwrap();
        let read = parse_bench_output(&text).unwrap();
        // Compared as JSON values parsed from the same text (float parsing is then the same).
        assert_eq!(serde_json::to_value(&read).unwrap(), serde_json::from_str::<serde_json::Value>(&text).unwrap());
        assert_eq!((read.runs.len(), read.runs[0].wall_ns, read.runs[0].items), (2, doc.runs[0].wall_ns, doc.runs[0].items));
        assert_eq!(read.summary.runs, doc.summary.runs);
    }

    #[test]
    fn malformed_and_empty_bench_output() {
        assert!(parse_bench_output("{\"runs\": [").unwrap_err().contains("bad bench JSON"));
        assert!(parse_bench_output("").unwrap_err().contains("no JSON"));
        let mut row = Row::default();
        row.fill_from_bench("nothing");
        assert!(matches!(&row.error, Some(RunError::Failed(m)) if m.contains("no JSON")), "{:?}", row.error);
    }

    #[test]
    fn agent_events_are_read_as_the_agents_own_type() {
        let m = |active| gleaner_policy::gleaner::Metrics { active, ..Default::default() };
        let ev = |event: EventKind, active, count| EventRecord { count, ..EventRecord::new(1, event, String::new(), m(active)) };
        let lines = [
            ev(EventKind::Consolidate, 1, None),
            ev(EventKind::Timeout, 1, Some(5)),
            ev(EventKind::Restore, 2, None),
            ev(EventKind::Reset, 2, None),
        ]
        .iter()
        .map(|e| serde_json::to_string(e).unwrap())
        .collect::<Vec<_>>()
        .join("\n");
        let s = AgentSummary::from_events(&format!("{lines}\nnot json\n\n"));
        assert_eq!((s.events, s.bad_lines, s.consolidations, s.restores, s.resets, s.timeouts), (4, 1, 1, 1, 1, 5));
        assert_eq!((s.min_active, s.last_active), (Some(1), Some(2)));
        assert_eq!(AgentSummary::from_events(""), AgentSummary::default());
    }

    /// Found with the `lab_guest_port` fuzz target: counts near `u64::MAX` in a guest's event
    /// lines overflowed the sums (a panic with overflow checks, wrapped totals without).
    #[test]
    fn agent_event_counts_near_u64_max_saturate_not_overflow() {
        let m = |active| gleaner_policy::gleaner::Metrics { active, ..Default::default() };
        let vcpu = VcpuTimeout { cpu: 0, timeout_ns: 1, grows: u64::MAX, shrinks: u64::MAX };
        let period = |t_ms| EventRecord {
            count: Some(u64::MAX),
            vcpus: Some(vec![vcpu]),
            ..EventRecord::new(t_ms, EventKind::Period, String::new(), m(usize::MAX))
        };
        let lines = [
            period(u64::MAX),
            period(0),
            period(u64::MAX),
            EventRecord { count: Some(3), ..EventRecord::new(1, EventKind::Timeout, String::new(), m(1)) },
        ]
        .iter()
        .map(|e| serde_json::to_string(e).unwrap())
        .collect::<Vec<_>>()
        .join("\n");
        let s = AgentSummary::from_events(&lines);
        assert_eq!((s.events, s.periods, s.timeouts), (4, 3, u64::MAX));
        assert_eq!((s.vcpu_timeouts[0].grows, s.vcpu_timeouts[0].shrinks), (u64::MAX, u64::MAX));
        assert!(s.mean_active.is_some_and(f64::is_finite), "{:?}", s.mean_active);
    }

    #[test]
    fn period_and_retention_events_give_mean_active_vcpus_retention_share_and_timeouts() {
        use gleaner_policy::retention::{
            ModeChange,
            RetentionMode::{Off, On},
        };
        let m = |active| gleaner_policy::gleaner::Metrics { active, ..Default::default() };
        let vcpu = |cpu, timeout_ns, grows, shrinks| VcpuTimeout { cpu, timeout_ns, grows, shrinks };
        let period = |t_ms, active, mode, timeouts, vcpus: Vec<VcpuTimeout>| EventRecord {
            count: Some(timeouts),
            retention: Some(mode),
            vcpus: Some(vcpus),
            ..EventRecord::new(t_ms, EventKind::Period, String::new(), m(active))
        };
        let change = |t_ms, from, to, cause| EventRecord {
            retention: Some(to),
            change: Some(ModeChange { from, to, cause }),
            ..EventRecord::new(t_ms, EventKind::Retention, String::new(), m(2))
        };
        let lines = [
            EventRecord { retention: Some(On), ..EventRecord::new(0, EventKind::Retention, String::new(), m(0)) },
            // 100 ms on 4 vCPUs, then 300 ms on 2 (time-weighted mean 2.5; per period 3).
            period(100, 4, On, 3, vec![vcpu(1, 50_000, 0, 1), vcpu(0, 80_000, 1, 0)]),
            change(100, On, Off, ChangeCause::Probe),
            period(400, 2, Off, 0, vec![vcpu(0, 80_000, 0, 0), vcpu(1, 40_000, 0, 2)]),
            change(400, Off, On, ChangeCause::ProbeEnd),
            change(400, On, Off, ChangeCause::Switch),
        ]
        .iter()
        .map(|e| serde_json::to_string(e).unwrap())
        .collect::<Vec<_>>()
        .join("\n");
        let s = AgentSummary::from_events(&lines);
        assert_eq!((s.events, s.bad_lines, s.periods, s.timeouts), (6, 0, 2, 3));
        assert!((s.mean_active.unwrap() - 2.5).abs() < 1e-9, "{:?}", s.mean_active);
        assert_eq!(s.retention_on_share, Some(0.5));
        assert_eq!((s.retention_switches, s.retention_probes), (1, 1));
        assert_eq!(s.vcpu_timeouts, [vcpu(0, 80_000, 1, 0), vcpu(1, 40_000, 0, 3)]);
        assert_eq!((s.min_active, s.last_active), (Some(2), Some(2)));
        assert_eq!(s.agent_cpu_ms, None, "agents before agent_cpu_ns wrote none");
        // The agent's own CPU: the largest (last) reading, the closing `exit` line included;
        // `exit` is not a period.
        let cpu = |t_ms, event: EventKind, ns| EventRecord { agent_cpu_ns: Some(ns), ..EventRecord::new(t_ms, event, String::new(), m(2)) };
        let with_cpu =
            [cpu(200, EventKind::Period, 4_000_000), cpu(400, EventKind::Period, 6_000_000), cpu(450, EventKind::Exit, 6_500_000)]
                .iter()
                .map(|e| serde_json::to_string(e).unwrap())
                .collect::<Vec<_>>()
                .join("\n");
        let s = AgentSummary::from_events(&with_cpu);
        assert_eq!((s.periods, s.agent_cpu_ms), (2, Some(6.5)));
        // Without yielding threads (--no-retention) the periods carry no mode: no share.
        let plain = serde_json::to_string(&EventRecord { count: Some(0), ..EventRecord::new(200, EventKind::Period, String::new(), m(3)) })
            .unwrap();
        let s = AgentSummary::from_events(&plain);
        assert_eq!((s.periods, s.mean_active, s.retention_on_share), (1, Some(3.0), None));
        assert!(s.vcpu_timeouts.is_empty());
    }

    #[allow(clippy::too_many_arguments)]
    fn row(env: &str, inst: &str, mode: &str, wall: u64, cpu: u64, host: Option<u64>, gamma: f64, rate: Option<f64>) -> Row {
        Row {
            env: env.parse().unwrap(),
            instance: inst.parse().unwrap(),
            mode: mode.parse().unwrap(),
            halt_poll: HaltPoll::NotApplicable,
            wall_ns: wall,
            cpu_ns: cpu,
            host_cpu_ns: host,
            gamma,
            co_runner_rate: rate,
            ..Default::default()
        }
    }

    #[test]
    fn summary_computes_survey_metrics_and_weighted_speedup() {
        let rows = vec![
            row("native", "native-1", "native", 1_000, 1_500, None, 2.0, None),
            row("vm", "A", "off", 4_000, 3_000, Some(6_000), 1.0, Some(10.0)),
            row("vm", "A", "on", 2_000, 3_000, Some(4_000), 1.0, Some(8.0)),
        ];
        let s = summarize(&rows, &RowMode::mode("off"));
        let on = s.iter().find(|r| r.mode == RowMode::mode("on")).unwrap();
        let off = s.iter().find(|r| r.mode == RowMode::mode("off")).unwrap();
        // d_eta_r = (4000 - 1500) / 1500; d_eta_t = (2000*1 - 1000*2) / 2000 = 0.
        assert!((on.d_eta_r.unwrap() - 2500.0 / 1500.0).abs() < 1e-9);
        assert!(on.d_eta_t.unwrap().abs() < 1e-9);
        assert!((on.omega.unwrap() - 1500.0 / 4000.0).abs() < 1e-9);
        assert_eq!(on.speedup, Some(2.0));
        // WS = (2.0 + 8/10) / 2
        assert!((on.weighted_speedup.unwrap() - 1.4).abs() < 1e-9);
        assert_eq!(off.weighted_speedup, Some(1.0));
        let native = s.iter().find(|r| r.mode == RowMode::Native).unwrap();
        assert_eq!(native.d_eta_r, None);
    }

    #[test]
    fn intervals_cover_the_medians_and_exclude_one_for_a_clear_speedup() {
        let mut rows = Vec::new();
        for i in 0..7u64 {
            rows.push(row("vm", "A", "off", 2_000 + 10 * i, 1, Some(4_000), 1.0, Some(100.0 + i as f64)));
            rows.push(row("vm", "A", "on", 1_000 + 10 * i, 1, Some(4_000), 1.0, Some(150.0 + i as f64)));
        }
        let s = summarize(&rows, &RowMode::mode("off"));
        let on = s.iter().find(|r| r.mode == RowMode::mode("on")).unwrap();
        let (sp, ci) = (on.speedup.unwrap(), on.speedup_ci.unwrap());
        assert!(ci.lo <= sp && sp <= ci.hi && ci.excludes(1.0), "{sp} {ci:?}");
        let (ws, wci) = (on.weighted_speedup.unwrap(), on.weighted_speedup_ci.unwrap());
        assert!(wci.lo <= ws && ws <= wci.hi && wci.lo > 1.15, "{ws} {wci:?}");
        let w = on.wall_ci.unwrap();
        assert!(w.lo <= on.wall_s.unwrap() && on.wall_s.unwrap() <= w.hi);
        // Same rows, same report.
        assert_eq!(summarize(&rows, &RowMode::mode("off")), s);
    }

    #[test]
    fn host_cpu_per_avoided_halt() {
        let mut off = row("vm", "A", "off", 1_000, 1, Some(1_000_000), 1.0, None);
        off.items = Some(100);
        off.vcpu_sleeps = Some(300);
        let mut on = off.clone();
        on.mode = RowMode::mode("on");
        on.host_cpu_ns = Some(3_000_000);
        on.vcpu_sleeps = Some(100);
        let s = summarize(&[off, on], &RowMode::mode("off"));
        let on = s.iter().find(|r| r.mode == RowMode::mode("on")).unwrap();
        // 10 us/item -> 30 us/item for 3 -> 1 halts/item: 10 us per avoided halt.
        assert_eq!((on.host_cpu_per_item_us, on.sleeps_per_item), (Some(30.0), Some(1.0)));
        assert!((on.cpu_per_avoided_halt_us.unwrap() - 10.0).abs() < 1e-9);
    }

    #[test]
    fn the_bww_bound_takes_every_halts_penalty_off_the_time_per_item() {
        let s = SummaryRow { wall_s: Some(1.0), items: Some(1000.0), sleeps_per_item: Some(2.0), ..Default::default() };
        // 1000 us per item, 2 halts x 100 us = 200 us: at most 1000/800 = 1.25x.
        assert!((bww_bound(&s, 100.0).unwrap() - 1.25).abs() < 1e-9);
        assert_eq!(bww_bound(&s, -5.0), Some(1.0));
        assert_eq!(bww_bound(&SummaryRow::default(), 100.0), None);
        // Penalties worth more than the time per item: capped and labelled as such.
        assert_eq!(bound_label(bww_bound(&s, 1e6).unwrap()), "> 10x (halts overlap)");
        assert_eq!(bound_label(1.25), "1.25x");
    }

    #[test]
    fn failed_runs_are_excluded() {
        let mut bad = row("vm", "A", "off", 4_000, 3_000, Some(6_000), 1.0, None);
        bad.rc = 1;
        let s = summarize(&[bad], &RowMode::mode("off"));
        assert_eq!(s[0].runs_ok, 0);
        assert_eq!(s[0].wall_s, None);
        assert!(summarize(&[], &RowMode::mode("off")).is_empty());
    }

    #[test]
    fn co_runner_rate_by_overlap() {
        // Two iterations of 10 items: [0,2] and [2,4]; window [1,3] gets half of each.
        let r = co_runner_rate(1.0, 3.0, &[(0.0, 2.0, 10), (2.0, 4.0, 10)]).unwrap();
        assert!((r - 5.0).abs() < 1e-9);
        assert_eq!(co_runner_rate(5.0, 6.0, &[(0.0, 2.0, 10)]), None);
        assert_eq!(co_runner_rate(1.0, 1.0, &[]), None);
    }

    #[test]
    fn csv_has_header_and_quotes() {
        let mut r = row("vm", "A", "on", 1, 1, Some(2), 1.0, None);
        r.host_vcpu_ns = vec![1, 2];
        r.error = Some(RunError::Failed("bad, \"x\"".into()));
        let csv = rows_csv(&[r]);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], csv_header());
        assert!(lines[1].contains(",1;2,"));
        assert!(lines[1].ends_with("\"bad, \"\"x\"\"\""));
        assert_eq!(lines[0].split(',').count(), COLUMNS.len());
    }
}
