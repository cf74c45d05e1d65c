//! Scenario files: the host, its VMs and their workloads, the policy variants to compare, the
//! costs, and optional cases (sets of overrides, e.g. Table 1's rows).
//!
//! Every table rejects unknown keys; every value is checked and a bad one is reported as
//! [`gleaner_policy::input::BadInput`] naming the key and what is allowed (exit status 2).

use std::collections::BTreeMap;

use gleaner_policy::gleaner::Params;
use gleaner_policy::guest::GuestConfig;
use gleaner_policy::input::BadInput;
use gleaner_policy::peer::UPSTREAM_HALTPOLL_CAP_NS;
use gleaner_policy::retention::{GovernorConfig, RetentionConfig};
use gleaner_policy::IdlePolicy;
use serde::{Deserialize, Serialize};

use crate::workload::{self, Workload, WorkloadCfg};

mod costs;
pub use costs::{
    curve_from_calibration, read_calibration, table2_from_bench_json, CalibrationUse, Costs, CostsCfg, ResolvedCosts, RvPoint, Table2,
    DEFAULT_CALIBRATION,
};

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

/// The host scheduler's rule for a vCPU that wakes (its thread was blocked: the vCPU halted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HostScheduler {
    /// Fair share by virtual runtime (CFS/EEVDF-like): a waking vCPU is placed at most half a
    /// slice behind the queue's minimum and preempts only if that puts it more than the wakeup
    /// granularity behind the running vCPU.
    #[default]
    Fair,
    /// Xen's credit scheduler (the Gleaner paper's host): a waking vCPU is BOOSTed and preempts
    /// any vCPU that is not, once that one has run Xen's rate limit (1 ms); the boost ends at
    /// the first 10 ms accounting tick it runs through, or when it leaves its pCPU. vCPUs that
    /// never block (polling, yielders) are never boosted: they wait for their turn, by virtual
    /// runtime standing in for credit.
    Credit,
}

/// The physical host and its scheduler.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostCfg {
    pub pcpus: u32,
    #[serde(default = "one32")]
    pub sockets: u32,
    /// Which host scheduler decides what each pCPU runs.
    #[serde(default)]
    pub scheduler: HostScheduler,
    /// Host scheduler time slice for vCPUs (the EEVDF slice; Xen credit's `tslice`).
    #[serde(default = "slice")]
    pub slice_us: f64,
    /// Each host slice drawn uniformly within +-this per mille of `slice_us` (0: every slice
    /// exactly `slice_us`). A real host's pCPUs end slices at their own ticks and interrupts and
    /// drift apart; equal fixed slices keep them in step, so vCPUs that never halt (polling,
    /// yielders) on different pCPUs run and wait together, co-scheduled by accident.
    #[serde(default)]
    pub slice_jitter_pm: u32,
    /// A waking vCPU preempts the running one when its virtual runtime is behind by more than
    /// the wakeup granularity (the fair scheduler's rule; credit has its own, `HostScheduler`).
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
    /// The guests see steal (KVM's paravirtual steal clock): their `/proc/stat` counts the
    /// waits for a pCPU as steal, apart from idle and busy time. False for a guest without it
    /// (QEMU TCG, as the lab's guests run here): the waits are in whatever the vCPU was doing
    /// and steal reads 0.
    #[serde(default = "yes")]
    pub guest_steal: bool,
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
    /// (`gleaner_policy::guest::setup::decide`: the lab's predictor passes it), used
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
        self.validate_host()?;
        self.validate_costs()?;
        self.validate_vms()?;
        let variants = self.variants();
        let mut vn = std::collections::BTreeSet::new();
        for v in &variants {
            if !vn.insert(v.name.as_str()) {
                return Err(bad("variant.name", &v.name, "unique variant names"));
            }
            validate_variant(v)?;
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

    /// The host's table and the run's length.
    fn validate_host(&self) -> anyhow::Result<()> {
        let h = &self.host;
        if h.pcpus == 0 || h.pcpus > 4096 {
            return Err(bad("host.pcpus", h.pcpus, "1..=4096"));
        }
        if h.sockets == 0 || !h.pcpus.is_multiple_of(h.sockets) {
            return Err(bad("host.sockets", h.sockets, format!("a divisor of host.pcpus ({})", h.pcpus)));
        }
        check_pos("host.slice_us", h.slice_us)?;
        if h.slice_jitter_pm > 1000 {
            return Err(bad("host.slice_jitter_pm", h.slice_jitter_pm, "0..=1000 (per mille of host.slice_us)"));
        }
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
        Ok(())
    }

    /// Every cost at least zero.
    fn validate_costs(&self) -> anyhow::Result<()> {
        let c = &self.costs;
        for (col, t) in [("vm", &c.vm), ("pm", &c.pm)] {
            for (k, v) in [("a_us", t.a_us), ("b_us", t.b_us), ("c_us", t.c_us), ("d_us", t.d_us)] {
                check_nonneg(&format!("costs.{col}.{k}"), v)?;
            }
        }
        check_nonneg("costs.ipi_send_us", c.ipi_send_us)?;
        check_nonneg("costs.poll_wake_us", c.poll_wake_us)?;
        check_nonneg("costs.ple_exit_us", c.ple_exit_us)?;
        Ok(())
    }

    /// At least one enabled VM, uniquely named, its vCPUs within the host (when pinned), its
    /// workload ending or the VM in the background (or a duration for the run).
    fn validate_vms(&self) -> anyhow::Result<()> {
        let h = &self.host;
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
        Ok(())
    }
}

/// One variant's values: its agent's parameters, kernel polling only with the planner, no
/// `yielders` guest (always-on yielders are `retention` without the governor), a haltpoll cap
/// named once.
fn validate_variant(v: &VariantCfg) -> anyhow::Result<()> {
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
        if cap_ns != UPSTREAM_HALTPOLL_CAP_NS && table_cap != GuestHaltpollCfg::default().guest_halt_poll_ns && table_cap != cap_ns {
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
    Ok(())
}

#[cfg(test)]
mod tests;
