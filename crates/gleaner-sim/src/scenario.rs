//! Scenario files: the host, its VMs and their workloads, the policy variants to compare, the
//! costs, and optional cases (sets of overrides, e.g. Table 1's rows).
//!
//! Every table rejects unknown keys; every value is checked and a bad one is reported as
//! [`gleaner_policy::input::BadInput`] naming the key and what is allowed (exit status 2).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gleaner_measure::calibration::{self, CalibrationRecord, RecordError};
use gleaner_measure::report::WakeupDoc;
use gleaner_measure::wakeup::Setting;
use gleaner_policy::gleaner::Params;
use gleaner_policy::guest::GuestConfig;
use gleaner_policy::idle::WakeCurve;
use gleaner_policy::input::BadInput;
use gleaner_policy::num::saturating_u64;
use gleaner_policy::peer::UPSTREAM_HALTPOLL_CAP_NS;
use gleaner_policy::retention::{GovernorConfig, RetentionConfig};
use gleaner_policy::IdlePolicy;
use serde::{Deserialize, Serialize};

use crate::workload::{self, Workload, WorkloadCfg};

/// A whole scenario file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// RNG seed (the `--seed` flag overrides it).
    #[serde(default = "one")]
    pub seed: u64,
    /// Stop every run at this simulated time (needed when only background VMs run).
    #[serde(default)]
    pub duration_ms: Option<f64>,
    /// Safety stop: a run that has not finished by then is reported unfinished.
    #[serde(default = "max_sim")]
    pub max_sim_ms: f64,
    /// Also run each foreground workload natively (no virtualization) as the baseline.
    #[serde(default = "yes")]
    pub native: bool,
    pub host: HostCfg,
    #[serde(rename = "vm")]
    pub vms: Vec<VmCfg>,
    #[serde(default, rename = "variant")]
    pub variants: Vec<VariantCfg>,
    /// Variant that speedups and weighted speedups are relative to (default: the first).
    #[serde(default)]
    pub baseline: Option<String>,
    #[serde(default)]
    pub costs: CostsCfg,
    #[serde(default, rename = "workload")]
    pub workloads: BTreeMap<String, WorkloadCfg>,
    /// Cases: named sets of overrides applied to this file (`"host.pcpus" = 4`).
    #[serde(default, rename = "case")]
    pub cases: Vec<CaseCfg>,
}

fn one() -> u64 {
    1
}
fn yes() -> bool {
    true
}
fn max_sim() -> f64 {
    60_000.0
}

/// One case: overrides by dotted key (`vm.1.enabled`, `host.pcpus`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseCfg {
    pub name: String,
    #[serde(default)]
    pub set: toml::Table,
}

/// The physical host and its scheduler.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostCfg {
    pub pcpus: u32,
    #[serde(default = "one32")]
    pub sockets: u32,
    /// Host scheduler time slice for vCPUs (the EEVDF slice).
    #[serde(default = "slice")]
    pub slice_us: f64,
    /// A waking vCPU preempts the running one when its virtual runtime is behind by more than
    /// the wakeup granularity.
    #[serde(default = "yes")]
    pub wakeup_preemption: bool,
    #[serde(default = "gran")]
    pub wakeup_granularity_us: f64,
    /// Guest scheduler time slice (round robin among runnable threads of a vCPU).
    #[serde(default = "slice")]
    pub guest_slice_us: f64,
    /// KVM `halt_poll_ns` (the maximum per-vCPU poll window; 0 disables halt polling).
    #[serde(default = "hpn")]
    pub halt_poll_ns: u64,
    /// KVM `halt_poll_ns_grow`.
    #[serde(default = "two")]
    pub halt_poll_ns_grow: u64,
    /// KVM `halt_poll_ns_grow_start`.
    #[serde(default = "hpgs")]
    pub halt_poll_ns_grow_start: u64,
    /// KVM `halt_poll_ns_shrink` (0: reset the window to 0 on a long halt).
    #[serde(default)]
    pub halt_poll_ns_shrink: u64,
    /// Pause-loop exiting: a spinning vCPU exits after this much spinning.
    #[serde(default = "ple")]
    pub ple_window_us: f64,
    /// Periodic load balancing of the host (0: none, only idle pCPUs pull queued vCPUs): every
    /// interval a queued vCPU moves from the pCPU with the most vCPUs to the one with the
    /// fewest while they differ by two or more. Without it, vCPUs that never halt (idle=poll,
    /// yielders) keep whatever imbalance they start with.
    #[serde(default)]
    pub balance_interval_us: f64,
}

fn one32() -> u32 {
    1
}
fn slice() -> f64 {
    3000.0
}
fn gran() -> f64 {
    1000.0
}
fn hpn() -> u64 {
    200_000
}
fn two() -> u64 {
    2
}
fn hpgs() -> u64 {
    10_000
}
fn ple() -> f64 {
    20.0
}

/// One VM and the workload it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmCfg {
    pub name: String,
    pub vcpus: u32,
    /// A built-in workload (`gleaner sim --list`) or a `[workload.NAME]` of this file.
    pub workload: String,
    /// Threads (per stage for pipelines); default: the vCPU count.
    #[serde(default)]
    pub threads: Option<u32>,
    /// Multiplies the amount of work of built-in workloads.
    #[serde(default = "onef")]
    pub scale: f64,
    /// Background load (matmul, freqsleep) that loops until the foreground VMs finish.
    #[serde(default)]
    pub background: bool,
    /// Pin vCPU i to pCPU `pin_offset + i`.
    #[serde(default)]
    pub pin: bool,
    #[serde(default)]
    pub pin_offset: u32,
    /// A disabled VM is ignored (useful in cases).
    #[serde(default = "yes")]
    pub enabled: bool,
}

fn onef() -> f64 {
    1.0
}

/// Which host policy assigns pools and slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostPolicyKind {
    /// One pool of every pCPU with the fixed `host.slice_us`.
    Stock,
    /// AQL_Sched: vCPU typing and per-type pools/slices (`gleaner_policy::aql`).
    Aql,
}

/// A policy configuration to run the scenario under.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariantCfg {
    pub name: String,
    /// Idle policy of the foreground VMs' guests (background VMs always run stock): `stock`
    /// (halt at once), `haltpoll` or `haltpoll:CAP` (cpuidle-haltpoll, its parameters in
    /// `haltpoll`; a cap named here is its `guest_halt_poll_ns`), `poll` (`idle=poll`: never
    /// halt), `retention`, `consolidation`, `gleaner` (the agent's mechanisms).
    #[serde(default = "stock")]
    pub guest: IdlePolicy,
    /// KVM halt polling on the host.
    #[serde(default = "yes")]
    pub host_halt_poll: bool,
    #[serde(default = "stock_host")]
    pub host: HostPolicyKind,
    #[serde(default)]
    pub gleaner: GleanerCfg,
    #[serde(default)]
    pub haltpoll: GuestHaltpollCfg,
    /// The AQL loop's damping (`host = "aql"` only).
    #[serde(default)]
    pub aql: AqlCfg,
}

/// How the AQL host loop (`gleaner_policy::aql::AqlController`) is damped. The default is the
/// paper's rule; `gleaner host run`'s defaults are `window = 4, decide_every = 4, confirm =
/// true, hysteresis_points = 10`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AqlCfg {
    /// The type recognizer's window in periods.
    pub window: usize,
    /// Periods between decisions.
    pub decide_every: usize,
    /// Apply a changed plan only when two consecutive decisions agree on it.
    pub confirm: bool,
    /// Cursor points by which another type must win to change a vCPU's type.
    pub hysteresis_points: f64,
}

impl Default for AqlCfg {
    fn default() -> Self {
        Self { window: 4, decide_every: 1, confirm: false, hysteresis_points: 0.0 }
    }
}

impl AqlCfg {
    /// Ranges: window and decide_every 1..=1000, hysteresis 0..=100.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=1000).contains(&self.window) || !(1..=1000).contains(&self.decide_every) {
            return Err(format!("aql window {} / decide_every {}: allowed 1..=1000", self.window, self.decide_every));
        }
        if !(0.0..=100.0).contains(&self.hysteresis_points) {
            return Err(format!("aql hysteresis_points {}: allowed 0..=100", self.hysteresis_points));
        }
        Ok(())
    }
}

fn stock() -> IdlePolicy {
    IdlePolicy::Stock
}
fn stock_host() -> HostPolicyKind {
    HostPolicyKind::Stock
}

impl VariantCfg {
    pub fn named(name: &str, guest: IdlePolicy) -> Self {
        Self {
            name: name.into(),
            guest,
            host_halt_poll: true,
            host: HostPolicyKind::Stock,
            gleaner: GleanerCfg::default(),
            haltpoll: GuestHaltpollCfg::default(),
            aql: AqlCfg::default(),
        }
    }

    /// The guest haltpoll parameters this variant runs with: `haltpoll`'s, with the cap the
    /// policy names (`haltpoll:CAP`) where it names one other than the upstream default.
    pub fn haltpoll_params(&self) -> GuestHaltpollCfg {
        match self.guest {
            IdlePolicy::Haltpoll { cap_ns } if cap_ns != UPSTREAM_HALTPOLL_CAP_NS => {
                GuestHaltpollCfg { guest_halt_poll_ns: cap_ns, ..self.haltpoll.clone() }
            }
            _ => self.haltpoll.clone(),
        }
    }
}

/// Gleaner agent settings in the simulated guest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GleanerCfg {
    /// Controller period.
    pub period_ms: f64,
    /// Duration of one `sched_yield()` call with nothing else runnable.
    pub yield_us: f64,
    pub params: Params,
    /// The yielding threads' detector; `adapt` (default on) adapts each vCPU's timeout, with
    /// `timeout_ns` as its start and cap.
    pub retention: RetentionConfig,
    /// Run the agent's idle planner and retention governor (`GuestController` with its
    /// defaults: per-vCPU windows, every period one epoch, starting on since the variant asked
    /// for retention). `false`: every vCPU yields all run with the detector's adaptive timeout
    /// (`retention.timeout_ns` its cap), the paper's Gleaner.
    pub govern: bool,
    pub governor: GovernorConfig,
    /// The agent's own guest-loop configuration, as the agent makes it from its calibration
    /// (`gleaner_agent::agent::setup::IdleSetup::decide`: the lab's predictor passes it), used
    /// instead of one derived from this variant: its idle means, wake-cost curve, planner,
    /// governor and prior. The engine still sets the vCPUs, and consolidation from `guest`.
    /// `None`: derived (yielders, the model's curve, `govern`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<GuestConfig>,
    /// The agent's kernel polling (the cpuidle POLL state: the haltpoll window shared by the
    /// VM's vCPUs, and polling until work on single vCPUs) as the planner's mechanism instead
    /// of yielding threads, as the real agent uses it where the guest has a POLL state. Only
    /// with `guest = "retention"` or `"gleaner"` and the planner (`govern = true`, or an
    /// `agent` configuration that offers kernel polling). Default: on when the costs come from
    /// a calibration that measured a POLL state (`costs.calibration`), else off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_polling: Option<bool>,
}

impl Default for GleanerCfg {
    fn default() -> Self {
        Self {
            period_ms: 10.0,
            yield_us: 1.0,
            params: Params::default(),
            retention: RetentionConfig::default(),
            govern: true,
            governor: GovernorConfig::default(),
            agent: None,
            kernel_polling: None,
        }
    }
}

/// cpuidle-haltpoll module parameters of the guest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GuestHaltpollCfg {
    pub guest_halt_poll_ns: u64,
    pub guest_halt_poll_grow: u64,
    pub guest_halt_poll_grow_start: u64,
    pub guest_halt_poll_shrink: u64,
}

impl Default for GuestHaltpollCfg {
    fn default() -> Self {
        Self { guest_halt_poll_ns: 200_000, guest_halt_poll_grow: 2, guest_halt_poll_grow_start: 50_000, guest_halt_poll_shrink: 2 }
    }
}

/// Wake-up latencies of Table 2's four settings, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Table2 {
    pub a_us: f64,
    pub b_us: f64,
    pub c_us: f64,
    pub d_us: f64,
}

/// Costs of the model. By default Table 2 of the Gleaner paper; `bench_json` replaces the VM
/// column with the medians of a `gleaner bench wakeup --json` file; `calibration` takes the
/// VM's wake costs from the agent's calibration record ([`Costs::from_calibration`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CostsCfg {
    pub bench_json: Option<PathBuf>,
    /// The agent's calibration record (`/run/gleaner/calibration.json`, `gleaner calibrate
    /// --json`): RT, IPI, RV by gap and the POLL state from its wake-cost curve (`gleaner sim
    /// --from-calibration` overrides it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibration: Option<PathBuf>,
    pub vm: Table2,
    pub pm: Table2,
    /// CPU time the sender spends on an IPI (the ICR-write exit), in a VM.
    pub ipi_send_us: f64,
    /// Extra latency to resume a vCPU that KVM was halt-polling.
    pub poll_wake_us: f64,
    /// Host CPU time of one pause-loop exit.
    pub ple_exit_us: f64,
}

impl Default for CostsCfg {
    fn default() -> Self {
        Self {
            bench_json: None,
            calibration: None,
            vm: Table2 { a_us: 6.0, b_us: 17.0, c_us: 37.0, d_us: 96.0 },
            pm: Table2 { a_us: 4.0, b_us: 8.0, c_us: 8.0, d_us: 17.0 },
            ipi_send_us: 1.0,
            poll_wake_us: 2.0,
            ple_exit_us: 1.0,
        }
    }
}

/// Costs of one world (VM or native), in nanoseconds, derived from a Table 2 column:
/// `A = RT`, `B = IPI + YW + RT`, `C = IPI + RV + RT`, `D = IPI + PV + RV + RT`, where only
/// one of `RV` (a halted vCPU is slower to wake, as on KVM) and `YW` (a vCPU running a
/// yielding thread is slower to wake, as under QEMU TCG) is non-zero. RV may depend on how
/// long the vCPU was halted (`rv_by_gap`, from a calibration: [`Costs::rv_at`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Costs {
    /// Guest thread switch (RT).
    pub rt: u64,
    /// IPI delivery latency.
    pub ipi: u64,
    /// Resuming a halted vCPU on an idle pCPU (RV; a C1 exit natively); with `rv_by_gap`, its
    /// value after the longest gap (the curve decides).
    pub rv: u64,
    /// Extra delivery latency when the target vCPU runs a yielding thread instead of halting
    /// (YW = B - C when B > C, else 0).
    pub yield_wake: u64,
    /// Taking the pCPU from another vCPU (PV: exit, switch, cache and TLB refill).
    pub pv: u64,
    pub ipi_send: u64,
    pub poll_wake: u64,
    pub ple_exit: u64,
    /// Latency of an interrupt the host injects (a guest timer, a device's completion): the
    /// host kicks the vCPU as it does for an IPI, whatever the vCPU runs, and a halted one pays
    /// RV on top. 0 with a Table 2 column (the paper measured no timers: they wake at once);
    /// with a calibration the IPI's latency (`gleaner sim` docs, "Costs").
    #[serde(skip_serializing_if = "is_zero")]
    pub irq: u64,
    /// RV by the time since the vCPU halted, ascending gaps (empty: `rv` whatever the gap).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rv_by_gap: Vec<RvPoint>,
    /// The guest has the kernel's POLL idle state for the agent to use (a calibration
    /// measured it): a polled vCPU is woken without an IPI, for RT.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub poll_state: bool,
}

/// One point of RV by gap: resuming a vCPU that was halted for `gap_ns` costs `rv_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RvPoint {
    pub gap_ns: u64,
    pub rv_ns: u64,
}

fn us(v: f64) -> u64 {
    saturating_u64((v * 1000.0).round())
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl Costs {
    pub fn from_table2(t: &Table2, ipi_send_us: f64, poll_wake_us: f64, ple_exit_us: f64) -> Self {
        let (a, b, c, d) = (us(t.a_us), us(t.b_us), us(t.c_us), us(t.d_us));
        // Waking a busy vCPU is normally the cheaper case (B <= C): the IPI is the common part.
        // Under binary translation a yielding vCPU can be the slower one; then the common part
        // is C's and the rest of B is the yielder's own delay.
        let common = b.min(c);
        Self {
            rt: a,
            ipi: common.saturating_sub(a),
            rv: c.saturating_sub(common),
            yield_wake: b.saturating_sub(common),
            pv: d.saturating_sub(c),
            ipi_send: us(ipi_send_us),
            poll_wake: us(poll_wake_us),
            ple_exit: us(ple_exit_us),
            irq: 0,
            rv_by_gap: Vec::new(),
            poll_state: false,
        }
    }

    /// RV for a vCPU that was halted for `gap_ns`: `rv` without a curve; with one, linear in
    /// log(gap) between its points and flat outside them (as the agent's planner reads its
    /// wake-cost curve, `WakeCurve::halt_cost_ns`).
    pub fn rv_at(&self, gap_ns: u64) -> u64 {
        let pts = &self.rv_by_gap;
        let (Some(first), Some(last)) = (pts.first(), pts.last()) else { return self.rv };
        if gap_ns <= first.gap_ns {
            return first.rv_ns;
        }
        if gap_ns >= last.gap_ns {
            return last.rv_ns;
        }
        // The first point at or past the gap; it is not the first point (gap > its gap).
        let i = pts.partition_point(|p| p.gap_ns < gap_ns);
        let (a, b) = (pts[i - 1], pts[i]);
        let (la, lb) = ((a.gap_ns as f64).ln(), (b.gap_ns as f64).ln());
        let t = ((gap_ns as f64).ln() - la) / (lb - la);
        saturating_u64((a.rv_ns as f64 + t * (b.rv_ns as f64 - a.rv_ns as f64)).round())
    }

    /// The VM column from the agent's calibration (its wake-cost curve), medians where it has
    /// them: `RT = P` (a wakeup without IPI or exit is the closest measurement of a guest
    /// thread switch; without a POLL state, `base`'s RT, i.e. the scenario's A), `IPI = B -
    /// RT`, `RV(g) = max(0, C(g) - B)` at each measured gap (p50s), `YW = 0`; `PV` and the
    /// assumed exit costs stay `base`'s (the record has no setting D); an injected interrupt
    /// (a guest timer) costs what an IPI does (`irq = IPI`). B and P are the record's means
    /// (it keeps no medians of them).
    pub fn from_calibration(base: &Costs, curve: &WakeCurve) -> Self {
        let rt = curve.poll_ns.unwrap_or(base.rt);
        let b = curve.busy_ns;
        let rv_by_gap: Vec<RvPoint> =
            curve.halted.iter().map(|p| RvPoint { gap_ns: p.gap_ns, rv_ns: p.p50_ns.saturating_sub(b) }).collect();
        Self {
            rt,
            ipi: b.saturating_sub(rt),
            rv: rv_by_gap.last().map_or(0, |p| p.rv_ns),
            yield_wake: 0,
            pv: base.pv,
            ipi_send: base.ipi_send,
            poll_wake: base.poll_wake,
            ple_exit: base.ple_exit,
            // A guest timer on this VM wakes a sleeper as late as an IPI would (scripts/bench/
            // timer-lateness.c; a vCPU kept
            // busy: 29-36 us p50 after 0.1-5 ms sleeps, B 29 us; a halted one 22-59 us, like
            // C(g)): the host delivers both the same way.
            irq: b.saturating_sub(rt),
            rv_by_gap,
            poll_state: curve.poll_ns.is_some(),
        }
    }
}

/// Table 2's VM column from a `gleaner bench wakeup --json` document ([`WakeupDoc`]): each
/// setting's median, its mean where it has none.
pub fn table2_from_bench_json(text: &str, path: &str) -> anyhow::Result<Table2> {
    let doc: WakeupDoc = serde_json::from_str(text)
        .map_err(|e| BadInput::new("costs.bench_json", path, format!("a `gleaner bench wakeup --json` document ({e})")))?;
    let get = |setting: Setting| -> anyhow::Result<f64> {
        let found = doc.settings.iter().find(|r| r.setting == setting).and_then(|r| r.p50_us.or(r.mean_us));
        match found {
            Some(x) if x.is_finite() && x >= 0.0 => Ok(x),
            Some(x) => Err(BadInput::new(format!("costs.bench_json setting {setting:?} p50_us"), x, "a number >= 0").into()),
            None => Err(BadInput::new(
                "costs.bench_json",
                path,
                format!("a measurement of settings A, B, C and D (`gleaner bench wakeup --json`); setting {setting:?} is missing"),
            )
            .into()),
        }
    };
    Ok(Table2 { a_us: get(Setting::A)?, b_us: get(Setting::B)?, c_us: get(Setting::C)?, d_us: get(Setting::D)? })
}

/// Where the agent keeps its calibration record.
pub const DEFAULT_CALIBRATION: &str = calibration::DEFAULT_PATH;

/// The wake-cost curve of an agent calibration record ([`CalibrationRecord`], the agent's own
/// type). Errors name the file, and the field where one is wrong.
pub fn curve_from_calibration(text: &str, path: &str) -> anyhow::Result<WakeCurve> {
    let field = |f: &str| format!("calibration record {path} field {f}");
    let record = CalibrationRecord::from_slice(text.as_bytes()).map_err(|e| match e {
        RecordError::NotJson(e) => bad("calibration record", path, format!("a JSON record as the agent writes it ({e})")),
        RecordError::Schema { found } => bad(
            field("schema"),
            found.map_or_else(|| "missing".to_string(), |v| v.to_string()),
            format!("{} (a wake-cost curve; an older record has none: measure again with `gleaner calibrate`)", calibration::SCHEMA),
        ),
        RecordError::Invalid(e) => {
            bad(format!("calibration record {path}"), e, format!("a record as the agent writes it ({})", calibration::DEFAULT_PATH))
        }
    })?;
    let curve = record.results.curve;
    curve.validate().map_err(|e| bad(field("results.curve.halted"), e, "at least one point, gaps > 0 ns, strictly ascending"))?;
    Ok(curve)
}

/// A calibration record as the VM's costs came from it (for the one-line note and the report).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CalibrationUse {
    pub file: PathBuf,
    /// The record's wake-cost curve (halted by gap, busy B, polling P).
    pub curve: WakeCurve,
    /// Gaps whose halted p50 is below B: RV clamped to 0 there.
    pub clamped_gaps_ns: Vec<u64>,
}

impl CalibrationUse {
    /// One line: which file, what costs were used.
    pub fn describe(&self, vm: &Costs) -> String {
        let us = |ns: u64| format!("{:.1}", ns as f64 / 1000.0);
        let gap = gap_text;
        let rt = match self.curve.poll_ns {
            Some(_) => format!("RT = P {} us", us(vm.rt)),
            None => format!("RT {} us (no POLL state: the scenario's A)", us(vm.rt)),
        };
        let rv = match (vm.rv_by_gap.first(), vm.rv_by_gap.last()) {
            (Some(a), Some(b)) => format!(
                "RV(g) = C(g) - B {}..{} us over gaps {}..{}",
                us(vm.rv_by_gap.iter().map(|p| p.rv_ns).min().unwrap_or(0)),
                us(vm.rv_by_gap.iter().map(|p| p.rv_ns).max().unwrap_or(0)),
                gap(a.gap_ns),
                gap(b.gap_ns)
            ),
            _ => "no halted points".into(),
        };
        format!(
            "costs from calibration {} (halted p50s, B and P means): {rt}, IPI = B - RT {} us, {rv}, YW 0, PV {} us (the scenario's D - C){}",
            self.file.display(),
            us(vm.ipi),
            us(vm.pv),
            if vm.poll_state { "; kernel polling offered to the agent" } else { "" }
        )
    }

    /// A note when some halted wakeup was cheaper than a busy one (RV clamped to 0).
    pub fn clamp_note(&self) -> Option<String> {
        let mut what = Vec::new();
        if !self.clamped_gaps_ns.is_empty() {
            let gaps: Vec<String> = self.clamped_gaps_ns.iter().map(|&g| gap_text(g)).collect();
            what.push(format!(
                "a halted vCPU woke faster than a busy one (C(g) < B {:.1} us) after {}: RV clamped to 0 there",
                self.curve.busy_ns as f64 / 1000.0,
                gaps.join(", ")
            ));
        }
        if self.curve.poll_ns.is_some_and(|p| p > self.curve.busy_ns) {
            what.push("a polling vCPU woke slower than a busy one (P > B): IPI clamped to 0".into());
        }
        (!what.is_empty()).then(|| format!("note: calibration {}: {}", self.file.display(), what.join("; ")))
    }
}

/// The costs of a scenario's two worlds, and the calibration the VM's came from, if any.
#[derive(Debug, Clone)]
pub struct ResolvedCosts {
    pub vm: Costs,
    pub pm: Costs,
    pub calibration: Option<CalibrationUse>,
}

/// An idle gap for people: `50 us`, `3 ms`.
fn gap_text(ns: u64) -> String {
    if ns >= 1_000_000 {
        format!("{} ms", ns as f64 / 1e6)
    } else {
        format!("{} us", ns as f64 / 1e3)
    }
}

/// Reads a calibration record file into its curve (bad input names the file).
pub fn read_calibration(path: &Path) -> anyhow::Result<WakeCurve> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        bad("calibration record", path.display(), format!("a readable file ({e}); the agent keeps one in {DEFAULT_CALIBRATION}"))
    })?;
    curve_from_calibration(&text, &path.display().to_string())
}

fn bad(key: impl Into<String>, value: impl std::fmt::Display, allowed: impl Into<String>) -> anyhow::Error {
    BadInput::new(key, value, allowed).into()
}

fn check_pos(key: &str, v: f64) -> anyhow::Result<()> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(bad(key, v, "a number > 0"))
    }
}

fn check_nonneg(key: &str, v: f64) -> anyhow::Result<()> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(bad(key, v, "a number >= 0"))
    }
}

/// Parses a scenario document. Errors name the key (`toml` reports the unknown or mistyped key).
pub fn parse(text: &str, origin: &str) -> anyhow::Result<Scenario> {
    let sc: Scenario = toml::from_str(text).map_err(|e| {
        let msg = e.message().to_string();
        let span = e.span().map(|s| {
            let line = text[..s.start.min(text.len())].matches('\n').count() + 1;
            format!(" (line {line})")
        });
        BadInput::new(format!("scenario {origin}{}", span.unwrap_or_default()), msg.trim(), "the keys documented in docs/sim.md")
    })?;
    sc.validate()?;
    Ok(sc)
}

/// Applies a dotted-key override (`host.pcpus`, `vm.0.vcpus`, `variant.1.guest`) to a TOML value.
pub fn apply_override(doc: &mut toml::Value, key: &str, value: toml::Value) -> anyhow::Result<()> {
    let parts: Vec<&str> = key.split('.').collect();
    let mut cur = doc;
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        cur = match cur {
            toml::Value::Table(t) => {
                if last {
                    t.insert((*part).to_string(), value);
                    return Ok(());
                }
                t.entry((*part).to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()))
            }
            toml::Value::Array(a) => {
                let idx: usize = part.parse().map_err(|_| bad(format!("override key {key}"), part, "an array index (e.g. vm.0.vcpus)"))?;
                let len = a.len();
                let slot = a.get_mut(idx).ok_or_else(|| bad(format!("override key {key}"), idx, format!("0..{len}")))?;
                if last {
                    *slot = value;
                    return Ok(());
                }
                slot
            }
            _ => return Err(bad(format!("override key {key}"), part, "a path through tables and arrays")),
        };
    }
    Err(bad("override key", key, "a non-empty dotted key"))
}

/// The scenario for one case: the base document with the case's overrides (cases removed).
pub fn expand_cases(text: &str, origin: &str) -> anyhow::Result<Vec<(String, Scenario)>> {
    let base = parse(text, origin)?;
    if base.cases.is_empty() {
        return Ok(vec![("default".into(), base)]);
    }
    let doc: toml::Value = toml::from_str(text).map_err(|e| bad(format!("scenario {origin}"), e.message(), "TOML"))?;
    let mut out = Vec::new();
    for case in &base.cases {
        let mut d = doc.clone();
        if let toml::Value::Table(t) = &mut d {
            t.remove("case");
        }
        for (k, v) in &case.set {
            apply_override(&mut d, k, v.clone())?;
        }
        let sc: Scenario = d.try_into().map_err(|e: toml::de::Error| {
            bad(format!("case {} of {origin}", case.name), e.message().trim(), "the keys documented in docs/sim.md")
        })?;
        sc.validate().map_err(|e| e.context(format!("case {}", case.name)))?;
        out.push((case.name.clone(), sc));
    }
    Ok(out)
}

impl Scenario {
    /// The variants to run (a single `stock` if none is given).
    pub fn variants(&self) -> Vec<VariantCfg> {
        if self.variants.is_empty() {
            vec![VariantCfg::named("stock", IdlePolicy::Stock)]
        } else {
            self.variants.clone()
        }
    }

    pub fn baseline_name(&self) -> String {
        self.baseline.clone().unwrap_or_else(|| self.variants()[0].name.clone())
    }

    /// VMs that take part (enabled).
    pub fn active_vms(&self) -> Vec<&VmCfg> {
        self.vms.iter().filter(|v| v.enabled).collect()
    }

    /// The resolved costs of the VM and native worlds.
    pub fn costs(&self) -> anyhow::Result<(Costs, Costs)> {
        let r = self.resolve_costs()?;
        Ok((r.vm, r.pm))
    }

    /// The costs of the VM and native worlds, and the calibration record the VM's came from
    /// (`costs.calibration`, read here).
    pub fn resolve_costs(&self) -> anyhow::Result<ResolvedCosts> {
        let c = &self.costs;
        let vm_t2 = match &c.bench_json {
            Some(p) => {
                let text =
                    std::fs::read_to_string(p).map_err(|e| bad("costs.bench_json", p.display(), format!("a readable file ({e})")))?;
                table2_from_bench_json(&text, &p.display().to_string())?
            }
            None => c.vm,
        };
        let mut vm = Costs::from_table2(&vm_t2, c.ipi_send_us, c.poll_wake_us, c.ple_exit_us);
        let pm = Costs::from_table2(&c.pm, 0.0, 0.0, 0.0);
        let calibration = match &c.calibration {
            Some(p) => {
                let curve = read_calibration(p)?;
                vm = Costs::from_calibration(&vm, &curve);
                let clamped_gaps_ns = curve.halted.iter().filter(|h| h.p50_ns < curve.busy_ns).map(|h| h.gap_ns).collect();
                Some(CalibrationUse { file: p.clone(), curve, clamped_gaps_ns })
            }
            None => None,
        };
        Ok(ResolvedCosts { vm, pm, calibration })
    }

    /// Resolves a VM's workload (built-in or from this file).
    pub fn workload_of(&self, vm: &VmCfg) -> anyhow::Result<Workload> {
        let threads = vm.threads.unwrap_or(vm.vcpus);
        if let Some(w) = self.workloads.get(&vm.workload) {
            return w.resolve(&vm.workload, threads, vm.vcpus);
        }
        let w = workload::builtin(&vm.workload, threads, vm.scale, vm.background).ok_or_else(|| {
            let mut allowed = workload::builtin_names();
            for k in self.workloads.keys() {
                allowed.push_str(", ");
                allowed.push_str(k);
            }
            bad(format!("vm.{}.workload", vm.name), &vm.workload, allowed)
        })?;
        w.resolve(&vm.workload, threads, vm.vcpus)
    }

    /// Checks every value; errors name the key and what is allowed.
    pub fn validate(&self) -> anyhow::Result<()> {
        let h = &self.host;
        if h.pcpus == 0 || h.pcpus > 4096 {
            return Err(bad("host.pcpus", h.pcpus, "1..=4096"));
        }
        if h.sockets == 0 || !h.pcpus.is_multiple_of(h.sockets) {
            return Err(bad("host.sockets", h.sockets, format!("a divisor of host.pcpus ({})", h.pcpus)));
        }
        check_pos("host.slice_us", h.slice_us)?;
        check_pos("host.guest_slice_us", h.guest_slice_us)?;
        check_nonneg("host.wakeup_granularity_us", h.wakeup_granularity_us)?;
        check_pos("host.ple_window_us", h.ple_window_us)?;
        check_nonneg("host.balance_interval_us", h.balance_interval_us)?;
        if h.halt_poll_ns_grow == 0 {
            return Err(bad("host.halt_poll_ns_grow", 0, ">= 1"));
        }
        check_pos("max_sim_ms", self.max_sim_ms)?;
        if let Some(d) = self.duration_ms {
            check_pos("duration_ms", d)?;
        }
        let c = &self.costs;
        for (col, t) in [("vm", &c.vm), ("pm", &c.pm)] {
            for (k, v) in [("a_us", t.a_us), ("b_us", t.b_us), ("c_us", t.c_us), ("d_us", t.d_us)] {
                check_nonneg(&format!("costs.{col}.{k}"), v)?;
            }
        }
        check_nonneg("costs.ipi_send_us", c.ipi_send_us)?;
        check_nonneg("costs.poll_wake_us", c.poll_wake_us)?;
        check_nonneg("costs.ple_exit_us", c.ple_exit_us)?;
        let vms = self.active_vms();
        if vms.is_empty() {
            return Err(bad("vm", "[]", "at least one enabled [[vm]]"));
        }
        let mut names = std::collections::BTreeSet::new();
        for vm in &vms {
            if !names.insert(vm.name.as_str()) {
                return Err(bad("vm.name", &vm.name, "unique VM names"));
            }
            let k = |f: &str| format!("vm.{}.{f}", vm.name);
            if vm.vcpus == 0 || vm.vcpus > 4096 {
                return Err(bad(k("vcpus"), vm.vcpus, "1..=4096"));
            }
            if vm.pin && vm.pin_offset.saturating_add(vm.vcpus) > h.pcpus {
                return Err(bad(
                    k("vcpus"),
                    vm.vcpus,
                    format!("at most host.pcpus - pin_offset = {} when pin = true", h.pcpus.saturating_sub(vm.pin_offset)),
                ));
            }
            check_pos(&k("scale"), vm.scale)?;
            let w = self.workload_of(vm)?;
            if w.runs_forever && !vm.background && self.duration_ms.is_none() {
                return Err(bad(k("background"), false, format!("true (workload {} never ends), or set duration_ms", vm.workload)));
            }
        }
        if vms.iter().all(|v| v.background) && self.duration_ms.is_none() {
            return Err(bad("duration_ms", "none", "a duration when every VM is background"));
        }
        let variants = self.variants();
        let mut vn = std::collections::BTreeSet::new();
        for v in &variants {
            if !vn.insert(v.name.as_str()) {
                return Err(bad("variant.name", &v.name, "unique variant names"));
            }
            let k = |f: &str| format!("variant.{}.{f}", v.name);
            check_pos(&k("gleaner.period_ms"), v.gleaner.period_ms)?;
            check_pos(&k("gleaner.yield_us"), v.gleaner.yield_us)?;
            v.gleaner.params.validate().map_err(|e| bad(k("gleaner.params"), e, "see gleaner_policy::gleaner::Params"))?;
            v.gleaner.governor.validate().map_err(|e| bad(k("gleaner.governor"), e, "see gleaner_policy::retention::GovernorConfig"))?;
            v.aql.validate().map_err(|e| bad(k("aql"), e, "window, decide_every 1..=1000; hysteresis_points 0..=100"))?;
            let planned = v.gleaner.govern || v.gleaner.agent.is_some();
            if v.gleaner.kernel_polling == Some(true) && !(v.guest.retention() && planned) {
                return Err(bad(
                    k("gleaner.kernel_polling"),
                    true,
                    "false, or guest = \"retention\" or \"gleaner\" with govern = true (kernel polling is the idle planner's mechanism)",
                ));
            }
            if v.gleaner.retention.timeout_ns == 0 {
                return Err(bad(k("gleaner.retention.timeout_ns"), 0, ">= 1"));
            }
            if v.guest == IdlePolicy::Yielders {
                return Err(bad(
                    k("guest"),
                    v.guest,
                    "stock, haltpoll, haltpoll:CAP, poll, retention, consolidation, gleaner (always-on yielders are \
                     guest = \"retention\" with [variant.gleaner] govern = false and a long retention.timeout_ns)",
                ));
            }
            let table_cap = v.haltpoll.guest_halt_poll_ns;
            if let IdlePolicy::Haltpoll { cap_ns } = v.guest {
                if cap_ns != UPSTREAM_HALTPOLL_CAP_NS && table_cap != GuestHaltpollCfg::default().guest_halt_poll_ns && table_cap != cap_ns
                {
                    return Err(bad(
                        k("haltpoll.guest_halt_poll_ns"),
                        table_cap,
                        format!("{cap_ns} (the cap guest = \"{}\" names), or no cap in guest", v.guest),
                    ));
                }
            }
            if v.haltpoll.guest_halt_poll_grow == 0 {
                return Err(bad(k("haltpoll.guest_halt_poll_grow"), 0, ">= 1"));
            }
        }
        if let Some(b) = &self.baseline {
            if !vn.contains(b.as_str()) {
                return Err(bad("baseline", b, vn.iter().copied().collect::<Vec<_>>().join(", ")));
            }
        }
        for case in &self.cases {
            if case.name.is_empty() {
                return Err(bad("case.name", "", "a non-empty name"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    // An agent record of schema `schema` holding `curve` (JSON): the one gleaner-measure's
    // reader is tested on.
    use gleaner_measure::testutil::{calibration_record as record, CALIBRATION_CURVE};

    use super::*;

    const MIN: &str = "name = \"t\"\n[host]\npcpus = 4\n[[vm]]\nname = \"a\"\nvcpus = 4\nworkload = \"mutex\"\nscale = 0.1\n";

    fn err_of(text: &str) -> BadInput {
        let e = parse(text, "test").expect_err("must be refused");
        e.chain().find_map(|c| c.downcast_ref::<BadInput>()).cloned().unwrap_or_else(|| panic!("not BadInput: {e:#}"))
    }

    #[test]
    fn minimal_scenario_parses() {
        let s = parse(MIN, "test").expect("valid");
        assert_eq!(s.host.pcpus, 4);
        assert_eq!(s.variants()[0].name, "stock");
    }

    #[test]
    fn unknown_key_is_named() {
        let b = err_of(&MIN.replace("pcpus = 4", "pcpus = 4\npcpu = 3"));
        assert!(b.value.contains("pcpu"), "{b}");
    }

    #[test]
    fn zero_cpus_and_overpinning_are_refused() {
        assert_eq!(err_of(&MIN.replace("pcpus = 4", "pcpus = 0")).what, "host.pcpus");
        let b = err_of(&MIN.replace("scale = 0.1", "scale = 0.1\npin = true").replace("vcpus = 4", "vcpus = 8"));
        assert_eq!(b.what, "vm.a.vcpus");
        assert!(b.allowed.contains("at most"));
    }

    /// Found with the `sim_scenario` fuzz target: `pin_offset = 4294967295` overflowed the pinning
    /// check (a panic with overflow checks; without, `u32::MAX + 4` wrapped to 3 and passed, so
    /// vCPUs were pinned to pCPUs that do not exist).
    #[test]
    fn pin_offset_near_u32_max_is_refused_not_wrapped() {
        let b = err_of(&MIN.replace("scale = 0.1", "scale = 0.1\npin = true\npin_offset = 4294967295"));
        assert_eq!((b.what.as_str(), b.value.as_str()), ("vm.a.vcpus", "4"));
        assert!(b.allowed.contains("pin_offset = 0"), "{b}");
    }

    #[test]
    fn negative_cost_is_refused() {
        let b = err_of(&format!("{MIN}[costs.vm]\na_us = -1.0\nb_us = 1.0\nc_us = 2.0\nd_us = 3.0\n"));
        assert_eq!(b.what, "costs.vm.a_us");
    }

    #[test]
    fn unknown_workload_lists_allowed() {
        let b = err_of(&MIN.replace("\"mutex\"", "\"nope\""));
        assert_eq!(b.what, "vm.a.workload");
        assert!(b.allowed.contains("dedup"));
    }

    #[test]
    fn malformed_and_empty_files_are_bad_input() {
        let b = err_of("name = \"x\"\n[host\npcpus = 1");
        assert!(b.what.starts_with("scenario test"));
        let b = err_of("");
        assert!(b.value.contains("missing"), "{b}");
    }

    #[test]
    fn costs_decompose_table2() {
        let c = Costs::from_table2(&CostsCfg::default().vm, 1.0, 2.0, 1.0);
        assert_eq!((c.rt, c.ipi, c.rv, c.yield_wake, c.pv), (6_000, 11_000, 20_000, 0, 59_000));
    }

    /// Under QEMU TCG a vCPU kept busy by a yielder wakes slower than a halted one (lab sample:
    /// B 376 us, C 94 us): the decomposition must not turn that into a zero RV and an IPI that
    /// every wake-up pays.
    #[test]
    fn costs_decompose_a_slow_busy_vcpu() {
        let t = Table2 { a_us: 46.0, b_us: 376.0, c_us: 94.0, d_us: 130.0 };
        let c = Costs::from_table2(&t, 1.0, 2.0, 1.0);
        assert_eq!((c.rt, c.ipi, c.rv, c.yield_wake, c.pv), (46_000, 48_000, 0, 282_000, 36_000));
        assert_eq!(c.rt + c.ipi + c.yield_wake, 376_000, "B");
        assert_eq!(c.rt + c.ipi + c.rv, 94_000, "C");
    }

    /// A `gleaner bench wakeup --json` document with these (setting, p50 us) results.
    fn wakeup_doc(p50s: &[(&str, f64)]) -> String {
        let settings: Vec<String> = p50s
            .iter()
            .map(|(s, p50)| {
                format!(
                    r#"{{"setting":"{s}","description":"","waker_cpu":0,"waiter_cpu":1,"samples":10,"mean_us":{},"p50_us":{p50},
                    "p90_us":null,"p99_us":null,"min_us":null,"max_us":null,"discarded":0,"lost":0,"warmup":10,"samples_ns":[]}}"#,
                    p50 + 1.0
                )
            })
            .collect();
        format!(
            r#"{{"kind":"wakeup","primitive":"condvar","rounds":10,"warmup":10,"period_us":500,"settings":[{}],
            "host":{{"kernel":"6.18","cpus":2,"allowed_cpus":"0-1","virtualized":true,"hypervisor":null,"cpuidle_driver":null,
            "cpuidle_governor":null,"git_revision":null,"date":"2026-12-01T00:00:00Z"}}}}"#,
            settings.join(",")
        )
    }

    #[test]
    fn bench_json_valid_malformed_empty() {
        let j = wakeup_doc(&[("A", 4.0), ("B", 28.0), ("C", 50.0), ("D", 150.0)]);
        let t = table2_from_bench_json(&j, "x").expect("valid");
        assert_eq!((t.a_us, t.b_us, t.c_us, t.d_us), (4.0, 28.0, 50.0, 150.0));
        assert!(table2_from_bench_json("{not json", "x").is_err());
        let e = table2_from_bench_json("", "x").expect_err("empty");
        assert!(e.downcast_ref::<BadInput>().is_some());
        let e = table2_from_bench_json(&wakeup_doc(&[("A", 4.0), ("B", 28.0), ("C", 50.0)]), "x").expect_err("no D");
        assert!(e.to_string().contains("setting D is missing"), "{e}");
        // A document that is not `bench wakeup`'s is refused, naming the file.
        let e = table2_from_bench_json(r#"{"results":[{"setting":"A","p50_us":4}]}"#, "old.json").expect_err("not a WakeupDoc");
        let b = e.downcast_ref::<BadInput>().expect("bad input");
        assert!(b.value == "old.json" && b.allowed.contains("gleaner bench wakeup --json"), "{b}");
    }

    fn rv_costs(points: &[(u64, u64)]) -> Costs {
        let mut c = Costs::from_table2(&CostsCfg::default().vm, 1.0, 2.0, 1.0);
        c.rv_by_gap = points.iter().map(|&(gap_ns, rv_ns)| RvPoint { gap_ns, rv_ns }).collect();
        c
    }

    /// RV by gap: the points themselves, linear in log(gap) between them (log spacing: the
    /// middle of 10 us..1 ms is 100 us, not 505 us), flat beyond the ends, any direction.
    #[test]
    fn rv_interpolates_in_log_gap_and_clamps_at_the_ends() {
        let c = rv_costs(&[(10_000, 2_000), (1_000_000, 22_000), (10_000_000, 42_000), (30_000_000, 30_000)]);
        assert_eq!(c.rv_at(10_000), 2_000);
        assert_eq!(c.rv_at(1_000_000), 22_000);
        assert_eq!(c.rv_at(10_000_000), 42_000);
        assert_eq!((c.rv_at(0), c.rv_at(9_999)), (2_000, 2_000), "flat below the first gap");
        assert_eq!(c.rv_at(u64::MAX), 30_000, "flat past the last gap");
        assert_eq!(c.rv_at(100_000), 12_000, "halfway in log(gap)");
        assert_eq!(c.rv_at(505_000), 12_000 + saturating_u64((10_000.0 * (5.05f64).ln() / 10f64.ln()).round()));
        assert_eq!(c.rv_at(3_162_278), 32_000, "sqrt(10) ms: halfway between 1 and 10 ms");
        let down = c.rv_at(17_320_508); // sqrt(300) ms: halfway from 10 to 30 ms, RV falling
        assert_eq!(down, 36_000);
        // Monotone between points with rising costs.
        let mut last = 0;
        for g in (10_000..10_000_000).step_by(9_973) {
            let rv = c.rv_at(g);
            assert!(rv >= last, "{g}: {rv} < {last}");
            last = rv;
        }
        // No curve: the constant RV at every gap (today's costs, unchanged).
        let flat = rv_costs(&[]);
        assert!([0, 10_000, 5_000_000, u64::MAX].iter().all(|&g| flat.rv_at(g) == flat.rv));
        let one = rv_costs(&[(50_000, 7_000)]);
        assert!([0, 50_000, u64::MAX].iter().all(|&g| one.rv_at(g) == 7_000));
    }

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/calibration.json")
    }

    /// The fixture (an agent record of a haltpoll guest: C 20.4..60.1 us by gap, B 17.5 us,
    /// P 6 us) becomes the VM column: RT = P, IPI = B - RT, RV(g) = C(g) - B, YW 0; PV and
    /// the exit costs stay the scenario's.
    #[test]
    fn a_calibration_record_maps_to_the_vm_column() {
        let curve = read_calibration(&fixture()).expect("fixture");
        let base = Costs::from_table2(&CostsCfg::default().vm, 1.0, 2.0, 1.0);
        let c = Costs::from_calibration(&base, &curve);
        assert_eq!((c.rt, c.ipi, c.yield_wake, c.pv, c.ipi_send, c.poll_wake), (6_000, 11_500, 0, 59_000, 1_000, 2_000));
        let rv: Vec<(u64, u64)> = c.rv_by_gap.iter().map(|p| (p.gap_ns, p.rv_ns)).collect();
        assert_eq!(
            rv,
            vec![
                (10_000, 2_900),
                (30_000, 3_100),
                (100_000, 3_400),
                (300_000, 5_500),
                (1_000_000, 7_300),
                (3_000_000, 41_800),
                (10_000_000, 42_600)
            ]
        );
        assert_eq!(c.rv, 42_600, "the constant RV is the longest gap's");
        assert!(c.poll_state);
        // Each setting is restated: B = IPI + RT, C(g) = IPI + RV(g) + RT.
        assert_eq!(c.ipi + c.rt, curve.busy_ns);
        assert!(curve.halted.iter().all(|h| c.ipi + c.rv_at(h.gap_ns) + c.rt == h.p50_ns));
        // Through the scenario key: the report keeps the file and the record's curve.
        let sc = parse(&format!("{MIN}[costs]\ncalibration = {:?}\n", fixture().display().to_string()), "t").expect("valid");
        let r = sc.resolve_costs().expect("resolves");
        assert_eq!(r.vm, c);
        let used = r.calibration.expect("from the record");
        assert_eq!((used.file.as_path(), &used.curve), (fixture().as_path(), &curve));
        assert!(used.clamp_note().is_none());
        let line = used.describe(&r.vm);
        assert!(line.contains("calibration.json") && line.contains("RT = P 6.0 us") && line.contains("IPI = B - RT 11.5 us"), "{line}");
        assert!(!line.contains('\n'));
    }

    /// Without a POLL state RT stays the scenario's A; a halted wakeup cheaper than a busy one
    /// clamps RV to 0 at that gap, and says so.
    #[test]
    fn a_calibration_without_poll_keeps_a_and_clamps_rv_at_zero() {
        let j = record(
            "3",
            r#"{"halted": [{"gap_ns": 10000, "mean_ns": 15000, "p50_ns": 14000},
            {"gap_ns": 1000000, "mean_ns": 40000, "p50_ns": 38000}], "busy_ns": 16000, "poll_ns": null}"#,
        );
        let curve = curve_from_calibration(&j, "x.json").expect("valid");
        let base = Costs::from_table2(&CostsCfg::default().vm, 1.0, 2.0, 1.0);
        let c = Costs::from_calibration(&base, &curve);
        assert_eq!((c.rt, c.ipi, c.rv_at(10_000), c.rv_at(1_000_000), c.poll_state), (6_000, 10_000, 0, 22_000, false));
        let used = CalibrationUse { file: "x.json".into(), curve, clamped_gaps_ns: vec![10_000] };
        let note = used.clamp_note().expect("a note");
        assert!(note.contains("x.json") && note.contains("10 us") && note.contains("clamped"), "{note}");
        assert!(used.describe(&c).contains("no POLL state"));
    }

    #[test]
    fn bad_calibration_records_name_the_file_and_the_field() {
        let one = |e: anyhow::Error| {
            let b = e.chain().find_map(|c| c.downcast_ref::<BadInput>()).cloned().unwrap_or_else(|| panic!("not BadInput: {e:#}"));
            assert_eq!(format!("{e:#}").lines().count(), 1, "{e:#}");
            b
        };
        let b = one(read_calibration(Path::new("/nonexistent/calibration.json")).expect_err("missing"));
        assert_eq!((b.what.as_str(), b.value.as_str()), ("calibration record", "/nonexistent/calibration.json"));
        assert!(b.allowed.contains("a readable file"), "{b}");
        let b = one(curve_from_calibration("{not json", "c.json").expect_err("malformed"));
        assert_eq!(b.value, "c.json");
        assert!(b.allowed.contains("as the agent writes it"), "{b}");
        let curve = CALIBRATION_CURVE;
        for (text, what, value) in [
            (record("2", curve), "calibration record c.json field schema", "2"),
            (record("3", curve).replace("\"schema\": 3, ", ""), "calibration record c.json field schema", "missing"),
            ("[]".to_string(), "calibration record c.json field schema", "missing"),
            (record("3", "null"), "calibration record c.json", "invalid type: null"),
            (record("3", &curve.replace("\"busy_ns\": 17000, ", "")), "calibration record c.json", "missing field `busy_ns`"),
            (record("3", &curve.replace("17000", "-1")), "calibration record c.json", "invalid value"),
            (
                record("3", r#"{"halted": [], "busy_ns": 1, "poll_ns": null}"#),
                "calibration record c.json field results.curve.halted",
                "at least one",
            ),
        ] {
            let b = one(curve_from_calibration(&text, "c.json").expect_err(&text));
            assert_eq!(b.what, what, "{text}");
            assert!(b.value.contains(value), "{text}: {b}");
        }
        // Through a scenario: the same one line (the key is the file's).
        let sc = parse(&format!("{MIN}[costs]\ncalibration = \"/nonexistent/c.json\"\n"), "t").expect("the key parses");
        assert_eq!(one(sc.resolve_costs().expect_err("missing file")).what, "calibration record");
    }

    #[test]
    fn kernel_polling_needs_the_planners_retention() {
        let text = |guest: &str, govern: bool| {
            format!("{MIN}[[variant]]\nname = \"g\"\nguest = \"{guest}\"\n[variant.gleaner]\ngovern = {govern}\nkernel_polling = true\n")
        };
        assert!(parse(&text("gleaner", true), "t").is_ok());
        assert!(parse(&text("retention", true), "t").is_ok());
        for (guest, govern) in [("stock", true), ("consolidation", true), ("haltpoll", true), ("gleaner", false)] {
            let b = err_of(&text(guest, govern));
            assert_eq!(b.what, "variant.g.gleaner.kernel_polling", "{guest} {govern}");
        }
    }

    /// The variant's guest is an [`IdlePolicy`]: `idle_poll` still reads as `poll`; a cap named
    /// in the policy is the haltpoll cap, and naming another in `[variant.haltpoll]` is
    /// refused; always-on yielders say how to model them.
    #[test]
    fn variant_guests_are_idle_policies() {
        let variant = |guest: &str, extra: &str| format!("{MIN}[[variant]]\nname = \"v\"\nguest = \"{guest}\"\n{extra}");
        let sc = parse(&variant("idle_poll", ""), "t").expect("the simulator's old name");
        assert_eq!(sc.variants[0].guest, IdlePolicy::Poll);
        let sc = parse(&variant("haltpoll:400us", ""), "t").expect("a cap");
        assert_eq!(sc.variants[0].haltpoll_params().guest_halt_poll_ns, 400_000);
        let sc = parse(&variant("haltpoll", "[variant.haltpoll]\nguest_halt_poll_ns = 50000\n"), "t").expect("the table's cap");
        assert_eq!(sc.variants[0].haltpoll_params().guest_halt_poll_ns, 50_000);
        let b = err_of(&variant("haltpoll:400us", "[variant.haltpoll]\nguest_halt_poll_ns = 50000\n"));
        assert_eq!(b.what, "variant.v.haltpoll.guest_halt_poll_ns");
        let b = err_of(&variant("yielders", ""));
        assert_eq!(b.what, "variant.v.guest");
        assert!(b.allowed.contains("govern = false"), "{b}");
        assert!(err_of(&variant("naiv", "")).value.contains("naiv"));
    }

    #[test]
    fn overrides_and_cases() {
        let text = format!("{MIN}[[case]]\nname = \"two\"\nset = {{ \"host.pcpus\" = 2, \"vm.0.vcpus\" = 2 }}\n");
        let cases = expand_cases(&text, "t").expect("cases");
        assert_eq!(cases.len(), 1);
        assert_eq!(cases[0].1.host.pcpus, 2);
        assert_eq!(cases[0].1.vms[0].vcpus, 2);
        let bad_case = format!("{MIN}[[case]]\nname = \"x\"\nset = {{ \"vm.5.vcpus\" = 2 }}\n");
        assert!(expand_cases(&bad_case, "t").is_err());
    }
}
