//! The prediction beside the measurement: typed results (JSON) and the Markdown tables.

use std::fmt::Write as _;

use gleaner_bench::workload::Workload;
use gleaner_policy::stats::Interval;
use serde::Serialize;

use super::model::{AgentPlan, CoRunnerModel, CostChoice, ModelOptions, SyncFit};
use gleaner_policy::IdlePolicy;
use gleaner_qemu::Accel;

/// The target: predicted within 25% of measured.
pub const TOLERANCE: f64 = 0.25;

/// The whole prediction (`gleaner lab predict --json`, `prediction.json`).
#[derive(Debug, Clone, Serialize)]
pub struct Prediction {
    pub source: String,
    pub options: ModelOptions,
    pub seeds: Vec<u64>,
    pub cells: Vec<CellPrediction>,
    /// Policies (other than stock) compared, those with every predicted ratio within 25%, and
    /// of the others those whose predictions all lie inside the lab's 95% intervals.
    pub compared: usize,
    pub within_25: usize,
    pub outside_25_inside_ci: usize,
}

/// One cell under one host halt-poll setting.
#[derive(Debug, Clone, Serialize)]
pub struct CellPrediction {
    pub name: String,
    pub workload: Workload,
    pub co_runner: Option<Workload>,
    pub halt_poll: crate::results::HaltPoll,
    pub accel: Accel,
    pub pcpus: u32,
    pub vcpus: u32,
    pub host_slice_us: f64,
    pub costs: CostChoice,
    pub sync: SyncFit,
    pub co_runner_model: Option<CoRunnerModel>,
    pub agent: AgentPlan,
    pub policies: Vec<PolicyPrediction>,
    pub wake_check: Vec<WakeCheck>,
    pub notes: Vec<String>,
}

/// A measured value with its 95% interval beside the simulator's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Compared {
    pub measured: Option<f64>,
    pub ci: Option<Interval>,
    /// Mean over the seeds, and the range.
    pub predicted: Option<f64>,
    pub predicted_min: Option<f64>,
    pub predicted_max: Option<f64>,
    /// predicted / measured - 1.
    pub rel_diff: Option<f64>,
    pub within_25: Option<bool>,
    /// The prediction lies inside the measurement's 95% interval.
    pub in_ci: Option<bool>,
}

impl Compared {
    pub fn new(measured: Option<f64>, ci: Option<Interval>, predicted: &[f64]) -> Self {
        let p = (!predicted.is_empty()).then(|| predicted.iter().sum::<f64>() / predicted.len() as f64);
        let rel = match (measured, p) {
            (Some(m), Some(p)) if m > 0.0 => Some(p / m - 1.0),
            _ => None,
        };
        Self {
            measured,
            ci,
            predicted: p,
            predicted_min: predicted.iter().copied().reduce(f64::min),
            predicted_max: predicted.iter().copied().reduce(f64::max),
            rel_diff: rel,
            within_25: rel.map(|r| r.abs() <= TOLERANCE + 1e-12),
            in_ci: match (ci, p) {
                (Some(c), Some(p)) => Some(!c.excludes(p)),
                _ => None,
            },
        }
    }
}

/// A lab value recomputed from the rows, with its 95% interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Measured {
    pub value: f64,
    pub ci: Option<Interval>,
}

/// Where the time and CPU went, lab beside simulator (medians over the lab's runs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Mechanics {
    pub lab_wall_s: Option<f64>,
    pub sim_wall_s: Option<f64>,
    /// Lab: host CPU of all QEMU threads during the step (agent start-up included); sim:
    /// pCPU time of VM A's vCPUs.
    pub lab_host_cpu_per_item_us: Option<f64>,
    pub sim_cpu_per_item_us: Option<f64>,
    /// Lab: vCPU thread sleeps on the host; sim: HLT exits.
    pub lab_halts_per_item: Option<f64>,
    pub sim_halts_per_item: Option<f64>,
    /// pCPUs VM A's and VM B's vCPUs used on average over VM A's step (lab) or run (sim).
    pub lab_vm_a_pcpus: Option<f64>,
    pub sim_vm_a_pcpus: Option<f64>,
    pub lab_vm_b_pcpus: Option<f64>,
    pub sim_vm_b_pcpus: Option<f64>,
    /// pCPUs neither VM used during the lab's steps: idle, or taken by other processes.
    pub lab_other_pcpus: Option<f64>,
}

/// One policy of one cell.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyPrediction {
    pub mode: String,
    pub policy: IdlePolicy,
    /// What the simulator ran for it.
    pub simulated_as: IdlePolicy,
    pub runs_ok: usize,
    pub finished: bool,
    pub speedup: Compared,
    pub co_runner_ratio: Compared,
    pub weighted_speedup: Compared,
    /// The lab's co-runner ratio over the workload's own window (without the agent's start-up,
    /// which the step window includes): what the simulator's ratio corresponds to.
    pub co_runner_ratio_workload: Option<Measured>,
    pub mechanics: Mechanics,
}

impl PolicyPrediction {
    fn all(&self, f: impl Fn(&Compared) -> Option<bool>) -> Option<bool> {
        let v: Vec<bool> = [self.speedup, self.co_runner_ratio, self.weighted_speedup].iter().filter_map(f).collect();
        (!v.is_empty()).then(|| v.iter().all(|x| *x))
    }

    /// Every compared ratio within 25% (`None`: nothing measured to compare).
    pub fn within(&self) -> Option<bool> {
        self.all(|c| c.within_25)
    }

    /// Every predicted ratio inside the lab's 95% interval (`None`: no intervals).
    pub fn inside_ci(&self) -> Option<bool> {
        self.all(|c| c.in_ci)
    }
}

/// Latency summary in us.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Lat {
    pub p50_us: f64,
    pub mean_us: f64,
    pub p99_us: f64,
}

/// The lab's wakeup measurement beside the simulator's run of the same ping-pong.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WakeCheck {
    /// `B` (the waiter's vCPU runs a yielder) or `C` (it halts).
    pub setting: String,
    /// Alone or next to the co-runner (written `alone`, `with co-runner`).
    pub context: crate::runner::WakePlace,
    pub lab: Option<Lat>,
    pub sim: Lat,
}

fn f(v: Option<f64>, d: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.d$}"))
}

fn with_ci(v: Option<f64>, c: Option<Interval>) -> String {
    match (v, c) {
        (Some(v), Some(c)) => format!("{v:.2} [{:.2}, {:.2}]", c.lo, c.hi),
        (v, _) => f(v, 2),
    }
}

/// The relative difference, marked when the prediction lies inside the lab's 95% interval.
fn diff(c: &Compared) -> String {
    let d = c.rel_diff.map_or("-".into(), |r| format!("{:+.0}%", r * 100.0));
    if c.in_ci == Some(true) && c.rel_diff.is_some_and(|r| r != 0.0) {
        format!("{d} (in CI)")
    } else {
        d
    }
}

fn predicted(c: &Compared) -> String {
    match (c.predicted, c.predicted_min, c.predicted_max) {
        (Some(p), Some(lo), Some(hi)) if hi - lo > 0.005 => format!("{p:.2} ({lo:.2}-{hi:.2})"),
        (p, _, _) => f(p, 2),
    }
}

fn simulated_as(p: &PolicyPrediction) -> String {
    match p.policy {
        IdlePolicy::Yielders => format!("{}, no timeout", p.simulated_as),
        _ => p.simulated_as.to_string(),
    }
}

fn verdict(p: &PolicyPrediction) -> String {
    let failed: Vec<&str> = [("speedup", p.speedup), ("co-runner", p.co_runner_ratio), ("weighted", p.weighted_speedup)]
        .iter()
        .filter(|(_, c)| c.within_25 == Some(false))
        .map(|(n, _)| *n)
        .collect();
    match p.within() {
        None => "not measured".into(),
        Some(true) => "yes".into(),
        Some(false) => format!("no ({})", failed.join(", ")),
    }
}

/// The main table: per cell and policy, the lab's ratios (with 95% intervals) beside the
/// simulator's, their relative difference, and whether all are within 25%.
pub fn table(p: &Prediction) -> String {
    let mut t = String::from(
        "| cell | halt poll | policy (simulated as) | speedup: lab [95% CI] | sim | diff | co-runner ratio: lab [95% CI] | lab, workload window | sim | diff | weighted speedup: lab [95% CI] | sim | diff | within 25% |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for c in &p.cells {
        for x in &c.policies {
            let _ = writeln!(
                t,
                "| {} | {} | {} ({}) | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                c.name,
                c.halt_poll,
                x.mode,
                simulated_as(x),
                with_ci(x.speedup.measured, x.speedup.ci),
                predicted(&x.speedup),
                diff(&x.speedup),
                with_ci(x.co_runner_ratio.measured, x.co_runner_ratio.ci),
                x.co_runner_ratio_workload.map_or("-".into(), |m| with_ci(Some(m.value), m.ci)),
                predicted(&x.co_runner_ratio),
                diff(&x.co_runner_ratio),
                with_ci(x.weighted_speedup.measured, x.weighted_speedup.ci),
                predicted(&x.weighted_speedup),
                diff(&x.weighted_speedup),
                verdict(x),
            );
        }
    }
    t
}

/// Per cell: the model's inputs, where time and CPU went, and the wakeup check.
pub fn details(p: &Prediction) -> String {
    let mut s = String::new();
    for c in &p.cells {
        cell_inputs(&mut s, c);
        mechanics_table(&mut s, c);
        wake_table(&mut s, c);
        s.push('\n');
    }
    s
}

/// A cell's heading and the model's inputs: Table 2 and the costs, the synchronization fit,
/// the host, the co-runner, the agent and the notes.
fn cell_inputs(s: &mut String, c: &CellPrediction) {
    let t = &c.costs.table2;
    let k = &c.costs.costs_ns;
    let _ = writeln!(s, "### {} (halt poll {})\n", c.name, c.halt_poll);
    let _ = writeln!(
        s,
        "- Table 2 (us): A {:.1}, B {:.1}, C {:.1}, D {:.1} ({}); costs: RT {:.1}, IPI {:.1}, RV {:.1}, YW {:.1}, PV {:.1} us",
        t.a_us,
        t.b_us,
        t.c_us,
        t.d_us,
        c.costs.source,
        k.rt as f64 / 1e3,
        k.ipi as f64 / 1e3,
        k.rv as f64 / 1e3,
        k.yield_wake as f64 / 1e3,
        k.pv as f64 / 1e3
    );
    let _ = writeln!(
        s,
        "- synchronization: {:.1} us of CPU after each of {:.0} operations per item, fitted so the simulated sizing run costs {:.1} us per item (lab: {} us; {:.1} us without it){}",
        c.sync.sync_op_us,
        c.sync.ops_per_item,
        c.sync.simulated_us_per_item,
        f(c.sync.measured_us_per_item, 1),
        c.sync.simulated_without_us_per_item,
        if c.sync.note.is_empty() { String::new() } else { format!("; {}", c.sync.note) }
    );
    let _ = writeln!(s, "- host: {} pCPUs, slice {:.0} us; {} vCPUs per VM, {}", c.pcpus, c.host_slice_us, c.vcpus, c.accel);
    if let Some(m) = &c.co_runner_model {
        let _ = writeln!(
            s,
            "- co-runner: {} ({} threads, {} items) per iteration: start-up {:.0} ms of CPU, kernel {:.0} ms of CPU ({})",
            m.workload,
            m.threads,
            m.items,
            m.startup_cpu_us / 1e3,
            m.kernel_cpu_us / 1e3,
            m.source
        );
    }
    let _ = writeln!(
        s,
        "- agent at start: {}; lab agent timeouts: {}",
        c.agent.why,
        c.agent.lab_timeouts.map_or("-".into(), |n| n.to_string())
    );
    for n in &c.notes {
        let _ = writeln!(s, "- note: {n}");
    }
}

/// Per policy, where time and CPU went in the lab and in the simulator.
fn mechanics_table(s: &mut String, c: &CellPrediction) {
    s.push_str("\n| policy | wall s lab / sim | CPU us/item lab / sim | halts/item lab / sim | VM A pCPUs lab / sim | VM B pCPUs lab / sim | other pCPUs (lab) |\n|---|---|---|---|---|---|---|\n");
    for x in &c.policies {
        let m = &x.mechanics;
        let _ = writeln!(
            s,
            "| {} | {} / {}{} | {} / {} | {} / {} | {} / {} | {} / {} | {} |",
            x.mode,
            f(m.lab_wall_s, 2),
            f(m.sim_wall_s, 2),
            if x.finished { "" } else { "+" },
            f(m.lab_host_cpu_per_item_us, 0),
            f(m.sim_cpu_per_item_us, 0),
            f(m.lab_halts_per_item, 2),
            f(m.sim_halts_per_item, 2),
            f(m.lab_vm_a_pcpus, 2),
            f(m.sim_vm_a_pcpus, 2),
            f(m.lab_vm_b_pcpus, 2),
            f(m.sim_vm_b_pcpus, 2),
            f(m.lab_other_pcpus, 2)
        );
    }
}

/// The wakeup latencies measured in the lab beside the simulated ones, when checked.
fn wake_table(s: &mut String, c: &CellPrediction) {
    if !c.wake_check.is_empty() {
        s.push_str("\n| wakeup | context | lab p50 / mean / p99 us | sim p50 / mean / p99 us |\n|---|---|---|---|\n");
        for w in &c.wake_check {
            let lab = w.lab.map_or("-".into(), |l| format!("{:.0} / {:.0} / {:.0}", l.p50_us, l.mean_us, l.p99_us));
            let _ =
                writeln!(s, "| {} | {} | {lab} | {:.0} / {:.0} / {:.0} |", w.setting, w.context, w.sim.p50_us, w.sim.mean_us, w.sim.p99_us);
        }
    }
}

/// The whole Markdown report.
pub fn markdown(p: &Prediction) -> String {
    let mut s = String::from("## Simulator prediction (gleaner lab predict)\n\n");
    let _ = writeln!(
        s,
        "Each cell simulated with gleaner-sim configured from the lab's own measurements (docs/sim.md, \"Predicting the lab\"); seeds {:?}, wake-up costs from the {} of the lab's measurements. Speedups and co-runner ratios are against the stock mode, as in the lab; \"(in CI)\" marks a prediction inside the lab's 95% interval. **{} of {} policies** have every predicted ratio within 25% of the measured one; of the other {}, {} have every prediction inside the lab's intervals.\n",
        p.seeds,
        match p.options.wake_stat {
            super::model::WakeStat::P50 => "medians",
            super::model::WakeStat::Mean => "means",
        },
        p.within_25,
        p.compared,
        p.compared - p.within_25,
        p.outside_25_inside_ci
    );
    s.push_str(&table(p));
    s.push('\n');
    s.push_str(&details(p));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compared_measures_the_relative_difference_and_the_interval() {
        let c = Compared::new(Some(0.8), Some(Interval { lo: 0.6, hi: 0.9 }), &[0.9, 1.1]);
        assert_eq!(c.predicted, Some(1.0));
        assert!((c.rel_diff.unwrap() - 0.25).abs() < 1e-12);
        assert_eq!(c.within_25, Some(true), "exactly 25% is within");
        assert_eq!(c.in_ci, Some(false));
        assert_eq!((c.predicted_min, c.predicted_max), (Some(0.9), Some(1.1)));
        let c = Compared::new(Some(0.5), None, &[0.7]);
        assert_eq!((c.within_25, c.in_ci), (Some(false), None));
        let c = Compared::new(None, None, &[0.7]);
        assert_eq!((c.rel_diff, c.within_25), (None, None));
        assert_eq!(Compared::new(Some(1.0), None, &[]).predicted, None);
    }
}
