//! The simulator configured from one lab cell (docs/sim.md, "Predicting the lab"):
//!
//! ```text
//!  lab cell                                  gleaner-sim scenario
//!  --------                                  --------------------
//!  pCPUs, VM A/B vCPUs                 --->  host.pcpus, vm A (foreground), vm B (background)
//!  guest_args (bench workload ...)     --->  VM A's kernel as thread programs: work_us per step,
//!                                            + a fitted CPU cost after every synchronization
//!  sizing: guest sync CPU per item     --->  that cost, fitted so the kernel with --work-us 0
//!                                            alone on the pCPUs costs the same CPU per item
//!  wake costs: A, B, C alone; C next   --->  Table 2 column: RT, IPI, RV | YW, PV
//!  to VM B (= the paper's D)
//!  co-runner rows (window, wall, CPU)  --->  VM B: start-up + kernel per iteration, looped
//!  host EEVDF slice, tick; TCG         --->  host.slice_us; no KVM halt polling
//!  policies                            --->  variants (stock, yielders = retention without
//!                                            timeout, idle_poll, haltpoll, retention, ...);
//!                                            the agent's start-up verdict decides retention
//! ```

use std::collections::BTreeMap;

use gleaner_bench::wakeup::{Setting, SettingResult};
use gleaner_bench::workload::Workload;
use gleaner_measure::calibration::{CalibrationResults, PollingControl};
use gleaner_os::BadInput;
use gleaner_policy::gleaner::Params;
use gleaner_policy::guest::setup::{self, SetupInput, YielderStart};
use gleaner_policy::guest::{GuestConfig, DEFAULT_PERIOD_NS};
use gleaner_policy::idle::{CurvePoint, WakeCurve};
use gleaner_policy::retention::{GovernorConfig, RetentionConfig, RetentionVerdict};
use gleaner_policy::stats::median;
use gleaner_policy::IdlePolicy;
use gleaner_sim::scenario::{Costs, CostsCfg, GleanerCfg, GuestHaltpollCfg, HostCfg, HostPolicyKind, Scenario, Table2, VariantCfg, VmCfg};
use gleaner_sim::workload::{CacheProfile, GroupCfg, WorkloadCfg};
use serde::Serialize;

use super::input::{Kernel, LabCell, Pass};
use crate::results::{HaltPoll, Row};

/// Items of the lab's sizing runs (`runner::size_workload`: the kernel with `--work-us 0`).
pub const SIZING_ITEMS: u64 = 2000;

/// The statistic of the lab's wakeup measurements the costs are taken from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum WakeStat {
    /// Medians: the typical wake-up.
    P50,
    /// Means: what a throughput pays per wake-up on average, tails included.
    Mean,
}

/// The host scheduler of the Linux the lab ran on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostSched {
    /// EEVDF base slice (`base_slice_ns`), us.
    pub base_slice_us: f64,
    /// Scheduler tick (1 s / CONFIG_HZ), us: without HRTICK a slice that has run out is noticed
    /// at the next tick, so a CPU-bound vCPU keeps its pCPU for whole ticks.
    pub tick_us: f64,
    /// Where the two values came from.
    pub source: String,
}

impl HostSched {
    /// EEVDF's default on `online_cpus` CPUs: 0.75 ms x (1 + log2(min(CPUs, 8))) (the kernel's
    /// logarithmic tunable scaling), with a tick of 1 s / `hz`.
    pub fn default_for(online_cpus: usize, hz: u32) -> Self {
        let n = online_cpus.clamp(1, 8);
        let factor = 1 + n.ilog2();
        Self {
            base_slice_us: 750.0 * f64::from(factor),
            tick_us: 1e6 / f64::from(hz.max(1)),
            source: format!("0.75 ms x (1 + log2({n} CPUs)); tick of CONFIG_HZ={hz}"),
        }
    }

    /// This machine's: `base_slice_ns` from debugfs or procfs when readable, else the default
    /// for its online CPUs; `CONFIG_HZ` from /boot/config-RELEASE when readable, else 250
    /// (Debian's and this development machine's setting).
    pub fn detect() -> Self {
        let online = gleaner_os::sysfs::Sysfs::new().online_cpus().map(|c| c.len()).unwrap_or(1);
        let release = nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default();
        let config = std::fs::read_to_string(format!("/boot/config-{release}")).ok();
        let hz = config.as_deref().and_then(config_hz);
        let mut h = Self::default_for(online, hz.unwrap_or(250));
        if hz.is_none() {
            h.source = h.source.replace("tick of CONFIG_HZ=250", "tick of CONFIG_HZ=250 (assumed: no /boot/config)");
        }
        let debugfs = || {
            gleaner_os::sysfs::Sysfs::new()
                .debug_sched_base_slice_ns()
                .ok()
                .flatten()
                .map(|ns| (ns, "/sys/kernel/debug/sched/base_slice_ns"))
        };
        let procfs = || {
            gleaner_os::procfs::Procfs::new().sched_base_slice_ns().ok().flatten().map(|ns| (ns, "/proc/sys/kernel/sched_base_slice_ns"))
        };
        // The later source wins, as before: /proc/sys where a kernel has it, else debugfs.
        if let Some((ns, f)) = procfs().or_else(debugfs) {
            h.base_slice_us = ns as f64 / 1000.0;
            h.source = format!("{f}; tick of CONFIG_HZ={}", hz.unwrap_or(250));
        }
        h
    }

    /// The slice a CPU-bound vCPU gets: the base slice rounded up to whole ticks.
    pub fn slice_us(&self) -> f64 {
        if self.tick_us > 0.0 {
            (self.base_slice_us / self.tick_us).ceil() * self.tick_us
        } else {
            self.base_slice_us
        }
    }
}

/// `CONFIG_HZ` of a kernel config file.
pub fn config_hz(text: &str) -> Option<u32> {
    text.lines().find_map(|l| l.strip_prefix("CONFIG_HZ=")).and_then(|v| v.trim().parse().ok())
}

/// How the model is built (the command's options).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelOptions {
    pub host: HostSched,
    pub wake_stat: WakeStat,
    /// Uniform jitter of every compute step, percent (0: the kernels' fixed compute).
    pub jitter_pct: f64,
}

/// The Table 2 column the costs come from, and from which measurements.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CostChoice {
    pub table2: Table2,
    pub costs_ns: Costs,
    pub source: String,
}

fn stat_of(s: &SettingResult, stat: WakeStat) -> Option<f64> {
    match stat {
        WakeStat::P50 => s.p50_us,
        WakeStat::Mean => s.mean_us.or(s.p50_us),
    }
}

fn setting(w: &crate::runner::WakeCosts, s: Setting) -> Option<&SettingResult> {
    w.settings.iter().find(|x| x.setting == s)
}

/// Table 2 from the lab's wakeup measurements, pooled over the cells given (a matrix's cells
/// share the host, QEMU and guest kernel, so the costs are the same for all of them):
///
/// - A, B, C: per setting, the smallest value over the cells' measurements in a guest alone on
///   the pCPUs (the sizing guests; VM A next to VM B where none was taken). Each is a median
///   (or mean) of 300 rounds, but a guest alone still shares the machine with everything else
///   running on it, and a busy moment inflates one cell's value many times (lab sample: B
///   58, 109, 376 and 7053 us in four sizing guests of one matrix); the smallest is the least
///   disturbed.
/// - D = C + PV, with PV the median over the cells of C next to VM B minus C alone (medians:
///   the model simulates the waiting for the co-runner's vCPU itself).
pub fn choose_costs(cells: &[LabCell], hp: HaltPoll, stat: WakeStat) -> anyhow::Result<CostChoice> {
    let get = |w: &crate::runner::WakeCosts, s: Setting, stat: WakeStat| setting(w, s).and_then(|r| stat_of(r, stat));
    let alone: Vec<&crate::runner::WakeCosts> = cells.iter().filter_map(LabCell::wake_alone).collect();
    let with_co: Vec<&crate::runner::WakeCosts> = cells.iter().filter_map(|c| c.wake_with_co_runner(hp)).collect();
    let (base, where_) = if alone.is_empty() {
        (&with_co, "next to the co-runner (no measurement alone: these include waiting for the co-runner)")
    } else {
        (&alone, "alone")
    };
    let names = || cells.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ");
    let pick = |s: Setting| -> anyhow::Result<(f64, String)> {
        base.iter().filter_map(|w| get(w, s, stat).map(|v| (v, w.guest.clone()))).min_by(|a, b| a.0.total_cmp(&b.0)).ok_or_else(|| {
            BadInput::new(
                format!("wakeup setting {s:?} of {}", names()),
                "missing",
                "lab results with the wakeup measurement (setup.wakeup, settings A, B and C)",
            )
            .into()
        })
    };
    let (a, b, c) = (pick(Setting::A)?, pick(Setting::B)?, pick(Setting::C)?);
    let diffs: Vec<f64> = cells
        .iter()
        .filter_map(|cell| {
            Some(get(cell.wake_with_co_runner(hp)?, Setting::C, WakeStat::P50)? - get(cell.wake_alone()?, Setting::C, WakeStat::P50)?)
        })
        .collect();
    let pv = median(&diffs).unwrap_or(0.0).max(0.0);
    let table2 = Table2 { a_us: a.0, b_us: b.0, c_us: c.0, d_us: c.0 + pv };
    let d = CostsCfg::default();
    let costs_ns = Costs::from_table2(&table2, d.ipi_send_us, d.poll_wake_us, d.ple_exit_us);
    let stat_name = match stat {
        WakeStat::P50 => "p50",
        WakeStat::Mean => "mean",
    };
    let source = format!(
        "smallest {stat_name} {where_} over {} measurement(s): A {}, B {}, C {}; D = C + {pv:.1} us, the median of C p50 next to VM B minus C p50 alone over {} cell(s)",
        base.len(),
        a.1,
        b.1,
        c.1,
        diffs.len()
    );
    Ok(CostChoice { table2, costs_ns, source })
}

/// Microseconds to nanoseconds (negative and NaN to 0, saturating above).
pub(crate) fn us_ns(us: f64) -> u64 {
    gleaner_policy::num::saturating_u64((us * 1000.0).round())
}

fn compute(ns: u64, jitter_pct: f64) -> String {
    if jitter_pct > 0.0 {
        format!("compute {ns}ns +-{jitter_pct}%")
    } else {
        format!("compute {ns}ns")
    }
}

fn group(name: &str, threads: u32, iterations: Option<u64>, pin: Vec<u32>, ops: Vec<String>) -> GroupCfg {
    GroupCfg { name: name.into(), threads: Some(threads), iterations, pin, ops }
}

/// `total` split into `parts` near-equal shares, as the bench kernels split their items.
fn share(total: u64, parts: u64, i: u64) -> u64 {
    total / parts + u64::from(i < total % parts)
}

fn threads_u32(k: &Kernel) -> u32 {
    u32::try_from(k.params.threads).unwrap_or(u32::MAX).max(1)
}

/// The simulator's version of a bench kernel (crates/gleaner-bench/src/workload/kernels.rs):
/// `work_ns` per compute step, and `sync_ns` of CPU after every synchronization operation
/// (what the guest kernel's futex and scheduler paths cost beyond the thread switches the
/// simulator charges itself). Returns the workload and its synchronization operations per item.
pub fn kernel_workload(k: &Kernel, work_ns: u64, sync_ns: u64, jitter_pct: f64) -> anyhow::Result<(WorkloadCfg, f64)> {
    let t = threads_u32(k);
    let items = k.params.items;
    let s = compute(sync_ns.max(1), 0.0);
    let w = compute(work_ns, jitter_pct);
    let ops = |v: &[&str]| v.iter().map(|x| (*x).to_string()).collect::<Vec<_>>();
    let (groups, capacity, per_item) = match k.workload {
        // source -> q1 -> stage A (t) -> q2 -> stage B (t) -> q3 -> sink; queues of 2t.
        Workload::Pipeline => (
            vec![
                group("source", 1, Some(items), vec![], ops(&["push q1", &s])),
                group("stage-a", t, None, vec![], ops(&["pop q1", &s, &w, "push q2", &s])),
                group("stage-b", t, None, vec![], ops(&["pop q2", &s, &w, "push q3", &s])),
                group("sink", 1, None, vec![], ops(&["pop q3", &s])),
            ],
            2 * t,
            6.0,
        ),
        // Producer/consumer pairs through one-slot mailboxes (a queue of capacity 1).
        Workload::Condvar => {
            let pairs = u64::from((t / 2).max(1));
            let mut g = Vec::new();
            for i in 0..pairs {
                let n = share(items, pairs, i);
                if n == 0 {
                    continue;
                }
                let q = format!("mailbox{i}");
                g.push(group(&format!("producer{i}"), 1, Some(n), vec![], vec![w.clone(), format!("push {q}"), s.clone()]));
                g.push(group(&format!("consumer{i}"), 1, None, vec![], vec![format!("pop {q}"), s.clone(), w.clone()]));
            }
            (g, 1, 2.0)
        }
        // Phases of compute separated by a blocking barrier (items = phases).
        Workload::Barrier => (vec![group("worker", t, Some(items), vec![], ops(&[&w, "barrier phase", &s]))], 1, f64::from(t)),
        Workload::SpinBarrier => (vec![group("worker", t, Some(items), vec![], ops(&[&w, "spin_barrier phase", &s]))], 1, f64::from(t)),
        // Contended short critical sections (an eighth of the work inside the lock).
        Workload::Mutex => {
            let inside = compute((work_ns / 8).max(1), jitter_pct);
            let body = ops(&[&w, "lock m", &inside, "unlock m", &s]);
            let (n, extra) = (items / u64::from(t), items % u64::from(t));
            let mut g = vec![];
            if extra > 0 {
                g.push(group("worker-long", u32::try_from(extra).unwrap_or(u32::MAX), Some(n + 1), vec![], body.clone()));
            }
            if n > 0 {
                g.push(group("worker", t - u32::try_from(extra).unwrap_or(0), Some(n), vec![], body));
            }
            (g, 1, 1.0)
        }
        Workload::Matmul | Workload::Freqsleep => {
            return Err(BadInput::new(
                "guest workload",
                k.workload,
                "pipeline, condvar, barrier, spin-barrier or mutex (matmul and freqsleep are co-runners)",
            )
            .into())
        }
    };
    let cfg = WorkloadCfg {
        description: format!("bench workload {} (threads {t}, items {items})", k.workload),
        cache: CacheProfile::default(),
        queue_capacity: capacity.max(1),
        groups,
    };
    Ok((cfg, per_item))
}

/// VM B's loop as the lab runs it: every iteration starts the gleaner binary in the guest
/// (CPU-bound under TCG, and a large share of each iteration) and then runs the kernel.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CoRunnerModel {
    pub workload: Workload,
    pub threads: u32,
    pub items: u64,
    /// CPU of the start-up per iteration (all vCPUs), us.
    pub startup_cpu_us: f64,
    /// CPU of the kernel per iteration (all threads), us.
    pub kernel_cpu_us: f64,
    /// Co-runner iterations these were measured from (0: defaults, no rows).
    pub iterations: usize,
    pub source: String,
}

/// The workload's own window of a measured step: the bench's wall time ends where the step
/// ends (agent start-up, if any, comes before it).
pub fn workload_window(r: &Row) -> (f64, f64) {
    (r.end_s - r.wall_ns as f64 / 1e9, r.end_s)
}

/// The co-runner model from the lab's co-runner iterations: those inside the workload windows
/// of VM A's stock runs (what the policies are compared with), else all. Per iteration, the
/// vCPU threads' host CPU is split between start-up and kernel in proportion to their wall
/// times (the window minus the kernel's wall time, and the kernel's wall time): next to VM A,
/// VM B's vCPUs take about the same share of the pCPUs in both phases (lab samples: 1.0 +-
/// 0.1 pCPU over whole iterations, both vCPUs alike).
pub fn co_runner_model(pass: &Pass, k: &Kernel, rt_us: f64) -> CoRunnerModel {
    let co: Vec<&Row> = pass.co_runner.iter().filter(|r| r.items.is_some()).collect();
    let stock: Vec<(f64, f64)> = pass.runs_of(IdlePolicy::Stock).map(workload_window).collect();
    let inside: Vec<&Row> = co.iter().copied().filter(|c| stock.iter().any(|&(b, e)| c.begin_s >= b && c.end_s <= e)).collect();
    let (used, which) = if inside.len() >= 3 { (inside, "inside stock workload windows") } else { (co, "all") };
    let threads = threads_u32(k);
    let items = k.params.items;
    if used.is_empty() {
        let kernel_cpu_us = match k.workload {
            Workload::Freqsleep => items as f64 * rt_us,
            _ => 10_000.0 * f64::from(threads),
        };
        return CoRunnerModel {
            workload: k.workload,
            threads,
            items,
            startup_cpu_us: 0.0,
            kernel_cpu_us,
            iterations: 0,
            source: "defaults (no co-runner rows): no start-up; matmul 10 ms bursts, freqsleep one thread switch of CPU per sleep".into(),
        };
    }
    let split: Vec<(f64, f64)> = used
        .iter()
        .map(|r| {
            let cpu = r.host_vcpu_ns.iter().sum::<u64>() as f64 / 1e3;
            let window = (r.end_s - r.begin_s).max(1e-9);
            let kernel = (r.wall_ns as f64 / 1e9 / window).clamp(0.0, 1.0);
            (cpu * (1.0 - kernel), cpu * kernel)
        })
        .collect();
    CoRunnerModel {
        workload: k.workload,
        threads,
        items,
        startup_cpu_us: median(&split.iter().map(|x| x.0).collect::<Vec<_>>()).unwrap_or(0.0),
        kernel_cpu_us: median(&split.iter().map(|x| x.1).collect::<Vec<_>>()).unwrap_or(0.0).max(1.0),
        iterations: used.len(),
        source: format!("medians over {} co-runner iterations ({which})", used.len()),
    }
}

/// The sleep of `nanosleep(1 ns)` with the default 50 us timer slack.
const FREQSLEEP_SLEEP: &str = "sleep 50us";

/// VM B's workload from its model: per iteration the start-up on every vCPU, a barrier, the
/// kernel's threads, a barrier; without a start-up, the kernel alone in a loop.
pub fn co_runner_workload(m: &CoRunnerModel, vcpus: u32, jitter_pct: f64) -> WorkloadCfg {
    let t = m.threads.max(1);
    // Loops at barriers need a count; this one outlasts any run (and fits a TOML integer).
    let forever = Some(i64::MAX as u64);
    let startup = m.startup_cpu_us > 0.0;
    let start: Vec<String> =
        if startup { vec![compute(us_ns(m.startup_cpu_us / f64::from(t)).max(1), jitter_pct), "barrier go".into()] } else { vec![] };
    let end: Vec<String> = if startup { vec!["barrier done".into()] } else { vec![] };
    let iterations = if startup { forever } else { None };
    let mut groups = Vec::new();
    match m.workload {
        Workload::Freqsleep => {
            // One sleeper per vCPU (the kernel pins them), each with its share of the sleeps.
            let per_sleep = compute(us_ns(m.kernel_cpu_us / m.items.max(1) as f64).max(1), jitter_pct);
            for i in 0..t {
                let n = if startup { share(m.items, u64::from(t), u64::from(i)) } else { 1 };
                let mut ops = start.clone();
                for _ in 0..n {
                    ops.push(FREQSLEEP_SLEEP.into());
                    ops.push(per_sleep.clone());
                }
                ops.extend(end.iter().cloned());
                groups.push(group(&format!("sleeper{i}"), 1, iterations, vec![i % vcpus.max(1)], ops));
            }
        }
        _ => {
            let mut ops = start;
            ops.push(compute(us_ns(m.kernel_cpu_us / f64::from(t)).max(1), jitter_pct));
            ops.extend(end);
            groups.push(group("worker", t, iterations, vec![], ops));
        }
    }
    WorkloadCfg {
        description: format!("co-runner loop: start-up, then {} on {t} threads", m.workload),
        cache: CacheProfile::default(),
        queue_capacity: 1,
        groups,
    }
}

/// What the guest agent decides at start, as the simulator will apply it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentPlan {
    /// Retention starts on (the governor's prior): a busy vCPU wakes clearly faster than a
    /// halted one on the curve the agent started from.
    pub retention: bool,
    pub verdict: Option<RetentionVerdict>,
    /// The yielding threads' configuration (parked until the plan gives each vCPU a window).
    pub config: RetentionConfig,
    pub why: String,
    /// Retention timeouts the lab's agent reported over its retention and gleaner runs
    /// (`None` without rows): 0 is consistent with retention off.
    pub lab_timeouts: Option<u64>,
    /// The agent's own guest loop configuration (`gleaner_policy::guest::setup::decide` with the
    /// agent's defaults on that calibration), which
    /// the simulator runs: its means, curve, planner, governor and prior (`None`: no curve, the
    /// agent retains nothing).
    pub guest: Option<GuestConfig>,
}

/// The agent's start-up configuration, made by the agent's own policy code
/// (`gleaner_policy::guest::setup::decide` on `SetupInput::defaults`: the agent with no flags,
/// the same decision, its tests check) from the calibration
/// it started with: the one it recorded at VM A's boots (`gleaner calibrate`, in results that
/// have it; the first boot's, said in `why` when they disagree), else a flat curve from the
/// medians the lab measured in VM A next to VM B (setting C, halted, after 500 us, the lab's
/// period; setting B, a busy vCPU). The machine's kernel polling is not known from the results:
/// the agent is taken to have yielding threads only, as the lab's guests do.
pub fn agent_plan(cell: &LabCell, pass: &Pass) -> AgentPlan {
    let lab_timeouts = cell.per_run.then(|| {
        pass.vm_a
            .iter()
            .filter(|r| matches!(r.policy, Some(IdlePolicy::Retention | IdlePolicy::Gleaner)))
            .filter_map(|r| r.agent.as_ref().map(|a| a.timeouts))
            .sum()
    });
    let (results, from) = if let Some((guest, first)) = cell.calibrations.first() {
        let agree = cell.calibrations.iter().all(|(_, x)| x.curve.yielders_can_pay() == first.curve.yielders_can_pay());
        let disagree = if agree { String::new() } else { format!("; {} boots, curves disagree", cell.calibrations.len()) };
        (Ok(first.clone()), format!("the wake-cost curve the agent calibrated at boot ({guest}{disagree})"))
    } else {
        let w = cell.wake_with_co_runner(pass.halt_poll).or(cell.wake_alone());
        let p50 = |s: Setting| w.and_then(|w| setting(w, s)).and_then(|r| r.p50_us);
        match (p50(Setting::B), p50(Setting::C)) {
            (Some(b), Some(c)) => {
                let halted = us_ns(c);
                let curve = WakeCurve::new(vec![CurvePoint { gap_ns: 500_000, mean_ns: halted, p50_ns: halted }], us_ns(b), None);
                let polling = PollingControl { halted: "the lab's setting C".into(), poll: "not measured".into() };
                let results = CalibrationResults { curve, idle_threshold_ns: RetentionConfig::default().idle_threshold_ns, polling };
                (
                    Ok(results),
                    format!(
                        "the lab's wakeup medians as a flat curve, B p50 {b:.0} us and C p50 {c:.0} us ({})",
                        w.map_or(String::new(), |w| w.context.to_string())
                    ),
                )
            }
            _ => (Err("no wakeup measurement".to_string()), "no wakeup measurement".to_string()),
        }
    };
    let cpus: Vec<u32> = (0..cell.vcpus.max(1)).collect();
    let planned = results.as_ref().map(|r| &r.curve).map_err(Clone::clone);
    let curve = planned.as_ref().ok().copied();
    let idle_threshold_ns = results.as_ref().map_or(YielderStart::default().idle_threshold_ns, |r| r.idle_threshold_ns);
    let threshold = YielderStart { idle_threshold_ns, ..YielderStart::default() };
    let input = SetupInput { yielders: threshold, ..SetupInput::defaults(cpus, planned) };
    let setup = setup::decide(input);
    let retention = curve.is_some() && setup.guest.prior.is_on();
    let verdict = curve.map(|_| if retention { RetentionVerdict::Pays } else { RetentionVerdict::NoHaltPenalty });
    let why = format!(
        "{from}{}: retention {}",
        curve.map_or(String::new(), |c| format!(": {}", c.describe())),
        match (curve, retention) {
            (None, _) => "off (no curve to plan from)",
            (Some(_), true) => "starts on, windows planned per vCPU",
            (Some(_), false) => "starts off (a busy vCPU wakes barely faster than a halted one), probed by the governor",
        }
    );
    let config =
        setup.yielders.unwrap_or_else(|| RetentionConfig { idle_threshold_ns: threshold.idle_threshold_ns, ..RetentionConfig::default() });
    AgentPlan { retention, verdict, config, why, lab_timeouts, guest: curve.map(|_| setup.guest) }
}

/// Retention that never times out within a run: the naive always-on yielders.
const NO_TIMEOUT_NS: u64 = 3_600_000_000_000;

/// The simulator's variant for a lab policy: stock, yielders (retention without a timeout),
/// idle=poll, guest haltpoll, and the agent's policies as the agent runs them (retention only
/// when its start-up verdict says it pays).
pub fn variant_for(name: &str, policy: IdlePolicy, plan: &AgentPlan, halt_poll: bool) -> VariantCfg {
    let guest = if policy == IdlePolicy::Yielders { IdlePolicy::Retention } else { policy };
    // Naive yielders never time out, adapt or stop. The agent's policies run the agent's own
    // guest loop configuration (`plan.guest`): its planner gives each vCPU a window from the
    // curve it calibrated, and its governor starts where the agent's did.
    let yielders = policy == IdlePolicy::Yielders;
    let agent = policy.retention();
    // The agent's yielders start parked with no window (timeout 0) until the plan gives them one;
    // the simulator's detector wants a cap of at least 1 ns meanwhile.
    let retention = if yielders {
        RetentionConfig { timeout_ns: NO_TIMEOUT_NS, adapt: false, ..RetentionConfig::default() }
    } else {
        RetentionConfig { timeout_ns: plan.config.timeout_ns.max(1), ..plan.config }
    };
    VariantCfg {
        name: name.into(),
        guest,
        host_halt_poll: halt_poll,
        host: HostPolicyKind::Stock,
        gleaner: GleanerCfg {
            // The agent's defaults (its configuration's, which are the policy's).
            period_ms: DEFAULT_PERIOD_NS as f64 / 1e6,
            yield_us: GleanerCfg::default().yield_us,
            params: Params::default(),
            retention,
            govern: !yielders,
            governor: GovernorConfig::default(),
            agent: if agent { plan.guest.clone() } else { None },
            kernel_polling: None,
        },
        haltpoll: GuestHaltpollCfg::default(),
        aql: gleaner_sim::scenario::AqlCfg::default(),
    }
}

/// Guest scheduler slice: Debian's 6.1 guest kernel runs CFS (12 ms period over up to three
/// runnable threads per vCPU here) with a 4 ms tick (CONFIG_HZ=250).
pub const GUEST_SLICE_US: f64 = 4000.0;

/// The simulator's host: the lab's pCPUs, the EEVDF slice in whole ticks, wake-up preemption
/// with no granularity (EEVDF has none), periodic load balancing, KVM halt polling only under
/// KVM.
pub fn host_cfg(pcpus: u32, host: &HostSched) -> HostCfg {
    HostCfg {
        pcpus,
        sockets: 1,
        slice_us: host.slice_us(),
        slice_jitter_pm: 0,
        scheduler: Default::default(),
        wakeup_preemption: true,
        wakeup_granularity_us: 0.0,
        guest_slice_us: GUEST_SLICE_US,
        halt_poll_ns: 200_000,
        halt_poll_ns_grow: 2,
        halt_poll_ns_grow_start: 10_000,
        halt_poll_ns_shrink: 0,
        ple_window_us: 20.0,
        balance_interval_us: HOST_BALANCE_US,
        // Under KVM the guests have a steal clock; the predictor turns it off for a TCG cell.
        guest_steal: true,
    }
}

/// Linux's periodic load balancing between the two pCPUs: the domain's interval is its weight
/// in ms (2 ms for 2 CPUs) times `busy_factor` (16) while the CPUs are busy.
pub const HOST_BALANCE_US: f64 = 32_000.0;

/// A scenario of VM A (workload `a`) and optionally VM B (background workload `b`).
pub fn scenario(
    name: &str,
    host: HostCfg,
    vcpus: u32,
    a: WorkloadCfg,
    b: Option<WorkloadCfg>,
    costs: &Table2,
    variants: Vec<VariantCfg>,
) -> Scenario {
    let vm = |n: &str, background: bool| VmCfg {
        name: n.into(),
        vcpus,
        workload: n.into(),
        threads: None,
        scale: 1.0,
        background,
        pin: false,
        pin_offset: 0,
        enabled: true,
    };
    let mut workloads = BTreeMap::new();
    workloads.insert("A".to_string(), a);
    let mut vms = vec![vm("A", false)];
    if let Some(b) = b {
        workloads.insert("B".to_string(), b);
        vms.push(vm("B", true));
    }
    Scenario {
        name: name.into(),
        description: "configured from lab results (gleaner lab predict)".into(),
        seed: 1,
        duration_ms: None,
        max_sim_ms: 600_000.0,
        native: false,
        host,
        vms,
        baseline: variants.first().map(|v| v.name.clone()),
        variants,
        costs: CostsCfg { vm: *costs, ..CostsCfg::default() },
        workloads,
        cases: Vec::new(),
    }
}

/// The fitted CPU per synchronization operation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SyncFit {
    /// CPU per item of the kernel with no compute, in a guest alone on the pCPUs (sizing), us.
    pub measured_us_per_item: Option<f64>,
    /// The same in the simulator with the fitted cost, and with none, us.
    pub simulated_us_per_item: f64,
    pub simulated_without_us_per_item: f64,
    pub ops_per_item: f64,
    /// The fitted CPU after every synchronization operation, us.
    pub sync_op_us: f64,
    pub note: String,
}

/// CPU per item (us) of VM A's kernel with no compute, alone on the pCPUs, with `sync_ns` per
/// operation: the simulator's version of the lab's sizing run.
fn sizing_cpu_per_item(k: &Kernel, pcpus: u32, vcpus: u32, host: &HostSched, costs: &Table2, sync_ns: u64) -> anyhow::Result<f64> {
    let mut sk = k.clone();
    sk.params.items = SIZING_ITEMS;
    let (w, _) = kernel_workload(&sk, 0, sync_ns, 0.0)?;
    let sc = scenario(
        "sizing",
        host_cfg(pcpus, host),
        vcpus,
        w,
        None,
        costs,
        vec![VariantCfg { host_halt_poll: false, ..VariantCfg::named("stock", IdlePolicy::Stock) }],
    );
    sc.validate()?;
    let r = gleaner_sim::run_cases("sizing", "", &[("sizing".into(), sc)], 1, false)?;
    let vm = &r.cases[0].variants[0].vms[0];
    Ok((vm.work_ns + vm.overhead_ns + vm.spin_ns) as f64 / 1e3 / SIZING_ITEMS as f64)
}

/// Fits the CPU per synchronization operation so that the simulated sizing run costs the CPU
/// per item the lab measured (a few fixed-point steps; the cost enters almost linearly).
pub fn fit_sync(cell: &LabCell, host: &HostSched, costs: &Table2) -> anyhow::Result<SyncFit> {
    let k = &cell.workload;
    let (_, ops) = kernel_workload(k, 0, 1, 0.0)?;
    let f = |s_ns: u64| sizing_cpu_per_item(k, cell.pcpus, cell.vcpus, host, costs, s_ns);
    let without = f(0)?;
    let Some(target) = cell.sizing.as_ref().and_then(|s| s.guest_sync_us_per_item) else {
        return Ok(SyncFit {
            measured_us_per_item: None,
            simulated_us_per_item: without,
            simulated_without_us_per_item: without,
            ops_per_item: ops,
            sync_op_us: 0.0,
            note: "no sizing measurement: synchronization costs only the Table 2 thread switches".into(),
        });
    };
    let mut s_us = ((target - without) / ops).max(0.0);
    let mut sim = f(us_ns(s_us))?;
    for _ in 0..5 {
        if (sim - target).abs() <= 0.01 * target {
            break;
        }
        let next = (s_us + (target - sim) / ops).max(0.0);
        if next == s_us {
            break;
        }
        s_us = next;
        sim = f(us_ns(s_us))?;
    }
    let note = if s_us == 0.0 && without > target {
        format!("the Table 2 costs alone already cost {without:.1} us per item (measured {target:.1})")
    } else {
        String::new()
    };
    Ok(SyncFit {
        measured_us_per_item: Some(target),
        simulated_us_per_item: sim,
        simulated_without_us_per_item: without,
        ops_per_item: ops,
        sync_op_us: s_us,
        note,
    })
}
