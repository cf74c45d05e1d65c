//! `gleaner lab predict DIR`: the simulator predicts the lab. Every cell of a `gleaner lab
//! matrix` (or one `gleaner lab run`) becomes a gleaner-sim scenario configured from the lab's
//! own measurements ([`model`]); the simulated speedups, co-runner ratios and weighted
//! speedups are put beside the measured ones, with their 95% intervals ([`report`]).
//!
//! ```text
//!  DIR/matrix.json ─┬─ cell dirs/results.json ──> input::LabCell ──> model: Scenario per cell
//!  DIR/results.json ┘   (the lab's own types)          (costs, sizing fit, co-runner, agent)
//!                                                               │ gleaner_sim::run_cases, per seed
//!                                                               v
//!                                   report::Prediction ──> Markdown table | --json
//! ```
//!
//! The lab depends on the simulator, not the other way round: the simulator knows nothing of
//! lab files. `gleaner lab matrix` appends this report to its own when it finishes
//! ([`append_to_matrix_report`]).

pub mod input;
pub mod model;
pub mod report;

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use gleaner_bench::wakeup::Setting;
use gleaner_os::BadInput;
use gleaner_policy::stats::{median, ratio_of_medians_ci};
use gleaner_policy::IdlePolicy;
use gleaner_sim::runner::{Report, VmReport};
use gleaner_sim::scenario::{Scenario, VariantCfg};

pub use crate::cli::PredictArgs;
use crate::results::{co_runner_rate, RowMode};
use crate::runner::WakePlace;
use gleaner_qemu::Accel;
use input::LabCell;
use model::{HostSched, ModelOptions, WakeStat};
use report::{CellPrediction, Compared, Lat, Measured, Mechanics, PolicyPrediction, Prediction, WakeCheck};

impl PredictArgs {
    fn options(&self) -> anyhow::Result<ModelOptions> {
        let mut host = HostSched::detect();
        for (flag, v) in [("--base-slice-us", self.base_slice_us), ("--tick-us", self.tick_us)] {
            if let Some(v) = v {
                if !(0.0..=1e6).contains(&v) {
                    return Err(BadInput::new(flag, v, "0..=1000000 microseconds").into());
                }
            }
        }
        if let Some(b) = self.base_slice_us {
            host.base_slice_us = b;
            host.source = format!("--base-slice-us; {}", host.source);
        }
        if let Some(t) = self.tick_us {
            host.tick_us = t;
            host.source = format!("{}; --tick-us", host.source);
        }
        if !(self.jitter_pct.is_finite() && (0.0..=100.0).contains(&self.jitter_pct)) {
            return Err(BadInput::new("--jitter-pct", self.jitter_pct, "0..=100").into());
        }
        Ok(ModelOptions { host, wake_stat: self.wake_stat, jitter_pct: self.jitter_pct })
    }
}

/// Entry point of `gleaner lab predict`.
pub fn run(a: &PredictArgs) -> anyhow::Result<ExitCode> {
    let opts = a.options()?;
    let seeds = gleaner_sim::parse_seeds(&a.seeds)?;
    let cells = input::load(&a.dir)?;
    let p = gleaner_sim::with_pool(a.jobs, || predict(&a.dir.display().to_string(), &cells, &opts, &seeds, a.scenarios.as_deref()))??;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&p)?);
    } else {
        print!("{}", report::markdown(&p));
    }
    Ok(ExitCode::SUCCESS)
}

/// Predicts every cell (under every host halt-poll setting it was measured with).
pub fn predict(
    source: &str,
    cells: &[LabCell],
    opts: &ModelOptions,
    seeds: &[u64],
    scenarios: Option<&Path>,
) -> anyhow::Result<Prediction> {
    if seeds.is_empty() {
        return Err(BadInput::new("--seeds", "(none)", "at least one seed").into());
    }
    let mut out = Vec::new();
    for cell in cells {
        for pass in &cell.passes {
            let hp = pass.halt_poll;
            let costs = model::choose_costs(cells, hp, opts.wake_stat)?;
            let (c, sc) = predict_cell(cell, pass, costs, opts, seeds)
                .with_context(|| format!("predicting cell {} ({})", cell.name, cell.source.display()))?;
            if let Some(dir) = scenarios {
                std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
                let f = dir.join(format!("{}-{}.toml", cell.name, hp.to_string().replace('/', "")));
                std::fs::write(&f, toml::to_string(&sc)?).with_context(|| f.display().to_string())?;
            }
            out.push(c);
        }
    }
    let all: Vec<&PolicyPrediction> = out.iter().flat_map(|c| c.policies.iter()).filter(|x| x.policy != IdlePolicy::Stock).collect();
    let compared = all.iter().filter(|x| x.within().is_some()).count();
    let within_25 = all.iter().filter(|x| x.within() == Some(true)).count();
    let outside_25_inside_ci = all.iter().filter(|x| x.within() == Some(false) && x.inside_ci() == Some(true)).count();
    Ok(Prediction {
        source: source.to_string(),
        options: opts.clone(),
        seeds: seeds.to_vec(),
        cells: out,
        compared,
        within_25,
        outside_25_inside_ci,
    })
}

/// The scenario of one cell and its prediction.
fn predict_cell(
    cell: &LabCell,
    pass: &input::Pass,
    costs: model::CostChoice,
    opts: &ModelOptions,
    seeds: &[u64],
) -> anyhow::Result<(CellPrediction, Scenario)> {
    let mut notes = cell.notes.clone();
    let sync = model::fit_sync(cell, &opts.host, &costs.table2)?;
    let (a, _) =
        model::kernel_workload(&cell.workload, model::us_ns(cell.workload.params.work_us), model::us_ns(sync.sync_op_us), opts.jitter_pct)?;
    let hp = pass.halt_poll;
    let co_model = cell.co_runner.as_ref().map(|k| model::co_runner_model(pass, k, costs.table2.a_us));
    let b = co_model.as_ref().map(|m| model::co_runner_workload(m, cell.vcpus, opts.jitter_pct));
    let plan = model::agent_plan(cell, pass);
    let halt_poll = cell.accel == Accel::Kvm && hp.polls();
    if cell.accel == Accel::Kvm {
        notes.push("KVM: halt polling simulated with KVM's default parameters (the lab does not record the host's)".into());
    }
    let modes = stock_first(cell, pass)?;
    let variants: Vec<VariantCfg> =
        modes.iter().map(|m| model::variant_for(&m.summary.mode.to_string(), m.policy, &plan, halt_poll)).collect();
    // A TCG guest has no steal clock: the predicted agent reads none, as the lab's did.
    let host = gleaner_sim::scenario::HostCfg { guest_steal: cell.accel == Accel::Kvm, ..model::host_cfg(cell.pcpus, &opts.host) };
    let sc = model::scenario(&cell.name, host.clone(), cell.vcpus, a, b, &costs.table2, variants);
    sc.validate().with_context(|| format!("the simulator scenario of cell {}", cell.name))?;
    let reports: Vec<Report> = seeds
        .iter()
        .map(|&s| gleaner_sim::run_cases(&cell.name, "", &[(hp.to_string(), sc.clone())], s, false))
        .collect::<anyhow::Result<_>>()?;
    let lab = LabWindows::of(pass);
    let mut policies = Vec::new();
    for (i, m) in modes.iter().enumerate() {
        policies.push(policy_prediction(cell, m, i, &reports, &sc, &lab, &mut notes));
    }
    let wake_check = wake_check(cell, pass, &sc, seeds[0])?;
    let c = CellPrediction {
        name: cell.name.clone(),
        workload: cell.workload.workload,
        co_runner: cell.co_runner.as_ref().map(|k| k.workload),
        halt_poll: hp,
        accel: cell.accel,
        pcpus: cell.pcpus,
        vcpus: cell.vcpus,
        host_slice_us: host.slice_us,
        costs,
        sync,
        co_runner_model: co_model,
        agent: plan,
        policies,
        wake_check,
        notes,
    };
    Ok((c, sc))
}

/// The modes of a pass, the stock mode first: it is the baseline of every ratio, as in the lab.
fn stock_first<'a>(cell: &LabCell, pass: &'a input::Pass) -> anyhow::Result<Vec<&'a input::MeasuredMode>> {
    let mut modes: Vec<&input::MeasuredMode> = pass.modes.iter().collect();
    modes.sort_by_key(|m| m.policy != IdlePolicy::Stock);
    if modes.first().is_none_or(|m| m.policy != IdlePolicy::Stock) {
        return Err(
            BadInput::new(format!("modes of cell {}", cell.name), "no stock mode", "a stock mode (speedups are relative to it)").into()
        );
    }
    Ok(modes)
}

/// Mode `m` (variant `i` of the scenario `sc`) predicted over the seeds' `reports`, beside the
/// lab's measurement; notes a simulated workload that did not finish.
fn policy_prediction(
    cell: &LabCell,
    m: &input::MeasuredMode,
    i: usize,
    reports: &[Report],
    sc: &Scenario,
    lab: &LabWindows,
    notes: &mut Vec<String>,
) -> PolicyPrediction {
    let items = cell.workload.params.items as f64;
    let runs: Vec<&[VmReport]> = reports.iter().map(|r| r.cases[0].variants[i].vms.as_slice()).collect();
    let col = |f: &dyn Fn(&[VmReport]) -> Option<f64>| runs.iter().filter_map(|v| f(v)).collect::<Vec<f64>>();
    let wsp: Vec<f64> = reports.iter().filter_map(|r| r.cases[0].variants[i].weighted_speedup).collect();
    let s = &m.summary;
    let mean = |v: Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    let pcpus = |v: &VmReport| (v.wall_ns > 0).then(|| v.cpu_ns as f64 / v.wall_ns as f64);
    let finished = runs.iter().all(|v| v[0].finished);
    if !finished {
        notes.push(format!("{}: the simulated workload did not finish within {} simulated s", s.mode, sc.max_sim_ms / 1000.0));
    }
    PolicyPrediction {
        mode: s.mode.to_string(),
        policy: m.policy,
        simulated_as: sc.variants[i].guest,
        runs_ok: s.runs_ok,
        finished,
        speedup: Compared::new(s.speedup, s.speedup_ci, &col(&|v| v[0].speedup)),
        co_runner_ratio: Compared::new(s.co_runner_ratio, s.co_runner_ratio_ci, &col(&|v| v.get(1).and_then(|b| b.speedup))),
        weighted_speedup: Compared::new(s.weighted_speedup, s.weighted_speedup_ci, &wsp),
        co_runner_ratio_workload: lab.co_runner_ratio(&s.mode),
        mechanics: Mechanics {
            lab_wall_s: s.wall_s,
            sim_wall_s: mean(col(&|v| Some(v[0].wall_ns as f64 / 1e9))),
            lab_host_cpu_per_item_us: s.host_cpu_per_item_us,
            sim_cpu_per_item_us: mean(col(&|v| Some(v[0].cpu_ns as f64 / 1e3 / items))),
            lab_halts_per_item: s.sleeps_per_item,
            sim_halts_per_item: mean(col(&|v| Some(v[0].exits.hlt as f64 / items))),
            lab_vm_a_pcpus: lab.median_of(&s.mode, |w| Some(w.a_pcpus)),
            sim_vm_a_pcpus: mean(col(&|v| pcpus(&v[0]))),
            lab_vm_b_pcpus: lab.median_of(&s.mode, |w| w.b_pcpus),
            sim_vm_b_pcpus: mean(col(&|v| v.get(1).and_then(pcpus))),
            lab_other_pcpus: lab.median_of(&s.mode, |w| w.b_pcpus.map(|b| f64::from(cell.pcpus) - w.a_pcpus - b)),
        },
    }
}

/// One measured step of VM A: its co-runner rate over the workload's own window and the pCPUs
/// both VMs used over the whole step.
struct StepWindow {
    mode: RowMode,
    co_rate: Option<f64>,
    a_pcpus: f64,
    b_pcpus: Option<f64>,
}

/// VM A's steps of one halt-poll setting, with what VM B did meanwhile.
struct LabWindows {
    steps: Vec<StepWindow>,
    stock: Option<RowMode>,
}

impl LabWindows {
    fn of(pass: &input::Pass) -> Self {
        let co = &pass.co_runner;
        let iters: Vec<(f64, f64, u64)> = co.iter().filter_map(|r| Some((r.begin_s, r.end_s, r.items?))).collect();
        let cpu: Vec<(f64, f64, u64)> = co.iter().map(|r| (r.begin_s, r.end_s, r.host_vcpu_ns.iter().sum::<u64>())).collect();
        let steps = pass
            .vm_a
            .iter()
            .map(|r| {
                let (w0, w1) = model::workload_window(r);
                let span = (r.end_s - r.begin_s).max(1e-9);
                StepWindow {
                    mode: r.mode.clone(),
                    co_rate: co_runner_rate(w0, w1, &iters),
                    a_pcpus: r.host_vcpu_ns.iter().sum::<u64>() as f64 / 1e9 / span,
                    // The co-runner's vCPU CPU attributed by overlap, as its items are.
                    b_pcpus: co_runner_rate(r.begin_s, r.end_s, &cpu).map(|ns_per_s| ns_per_s / 1e9),
                }
            })
            .collect();
        let stock = pass.modes.iter().find(|m| m.policy == IdlePolicy::Stock).map(|m| m.summary.mode.clone());
        Self { steps, stock }
    }

    fn median_of(&self, mode: &RowMode, f: impl Fn(&StepWindow) -> Option<f64>) -> Option<f64> {
        median(&self.steps.iter().filter(|w| w.mode == *mode).filter_map(f).collect::<Vec<_>>()).ok()
    }

    fn co_runner_ratio(&self, mode: &RowMode) -> Option<Measured> {
        let rates = |m: &RowMode| self.steps.iter().filter(|w| w.mode == *m).filter_map(|w| w.co_rate).collect::<Vec<f64>>();
        let (mine, stock) = (rates(mode), rates(self.stock.as_ref()?));
        let value = median(&mine).ok()? / median(&stock).ok().filter(|&x| x > 0.0)?;
        let seed = mode.to_string().bytes().fold(0x5eed_u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
        Some(Measured { value, ci: ratio_of_medians_ci(&mine, &stock, seed).ok() })
    }
}

/// The lab's wakeup measurement, run in the simulator with the cell's costs and host: a
/// ping-pong between two pinned threads (the waker computes 500 us, the lab's period), the
/// waiter's vCPU halting (C) or running a yielder that never times out (B), alone and next to
/// the cell's co-runner.
fn wake_check(cell: &LabCell, pass: &input::Pass, sc: &Scenario, seed: u64) -> anyhow::Result<Vec<WakeCheck>> {
    use gleaner_sim::workload::{CacheProfile, GroupCfg, WorkloadCfg};
    let rounds = 300;
    let g = |name: &str, pin: u32, ops: &[&str]| GroupCfg {
        name: name.into(),
        threads: Some(1),
        iterations: Some(rounds),
        pin: vec![pin],
        ops: ops.iter().map(|s| (*s).to_string()).collect(),
    };
    let pp = WorkloadCfg {
        description: "wakeup ping-pong".into(),
        cache: CacheProfile::default(),
        queue_capacity: 1,
        groups: vec![
            g("waker", 0, &["compute 500us", "signal ping", "wait pong"]),
            g("waiter", 1.min(cell.vcpus - 1), &["wait ping", "compute 1us", "signal pong"]),
        ],
    };
    let yielders = model::variant_for("B", IdlePolicy::Yielders, &model::agent_plan(cell, pass), false);
    let stock = VariantCfg { host_halt_poll: sc.variants[0].host_halt_poll, ..VariantCfg::named("C", IdlePolicy::Stock) };
    let co = sc.workloads.get("B").cloned();
    let (mut cases, mut places) = (Vec::new(), Vec::new());
    for (ctx, with) in [(WakePlace::Alone, None), (WakePlace::WithCoRunner, co)] {
        if ctx != WakePlace::Alone && with.is_none() {
            continue;
        }
        let mut s = model::scenario(
            &format!("{}-wake", cell.name),
            sc.host.clone(),
            cell.vcpus,
            pp.clone(),
            with,
            &sc.costs.vm,
            vec![stock.clone(), yielders.clone()],
        );
        s.costs = sc.costs.clone();
        cases.push((ctx.label().to_string(), s));
        places.push(ctx);
    }
    let r = gleaner_sim::run_cases("wake", "", &cases, seed, false)?;
    let mut out = Vec::new();
    for (ci, ctx) in places.iter().enumerate() {
        let lab = if *ctx == WakePlace::Alone { cell.wake_alone() } else { cell.wake_with_co_runner(pass.halt_poll) };
        for (vi, setting) in [(0, Setting::C), (1, Setting::B)] {
            let l = r.cases[ci].variants[vi].vms[0].wake_latency;
            let lab = lab
                .and_then(|w| w.settings.iter().find(|s| s.setting == setting))
                .and_then(|s| Some(Lat { p50_us: s.p50_us?, mean_us: s.mean_us?, p99_us: s.p99_us? }));
            out.push(WakeCheck {
                setting: format!("{setting:?}"),
                context: *ctx,
                lab,
                sim: Lat { p50_us: l.p50_us, mean_us: l.mean_us, p99_us: l.p99_us },
            });
        }
    }
    Ok(out)
}

/// After `gleaner lab matrix`: predicts its cells and appends the report to `matrix.md`
/// (also `prediction.md` and `prediction.json` in `out`). Best effort: a failure is reported
/// in the matrix report, it does not fail the measured matrix.
pub fn append_to_matrix_report(out: &Path) {
    let res = (|| -> anyhow::Result<Prediction> {
        let cells = input::load(&out.join("matrix.json"))?;
        let opts = ModelOptions { host: HostSched::detect(), wake_stat: WakeStat::P50, jitter_pct: 0.0 };
        let p = predict(&out.display().to_string(), &cells, &opts, &[1], None)?;
        std::fs::write(out.join("prediction.json"), serde_json::to_string_pretty(&p)?)?;
        std::fs::write(out.join("prediction.md"), report::markdown(&p))?;
        Ok(p)
    })();
    let section = match res {
        Ok(p) => report::markdown(&p),
        Err(e) => format!("## Simulator prediction (gleaner lab predict)\n\nnot available: {e:#}\n"),
    };
    let md = out.join("matrix.md");
    let mut text = std::fs::read_to_string(&md).unwrap_or_default();
    text.push('\n');
    text.push_str(&section);
    if let Err(e) = std::fs::write(&md, text) {
        eprintln!("lab matrix: writing the prediction into {}: {e}", md.display());
    }
}
