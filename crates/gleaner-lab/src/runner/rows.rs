//! The rows of a guest pass, and the summary's compute shares and blocked-waiter bounds.

use gleaner_policy::IdlePolicy;
use gleaner_qemu::session::StepResult;

use super::job::{StepKind, StepKindOf};
use super::pass::{haltpoll_reason, Measured, Pass};
use super::prepare::Prepared;
use super::sizing::bench_workload_params;
use super::wake::{WakeCosts, WakePlace};
use crate::experiment::{Experiment, Mode};
use crate::keys::{Env, HaltPoll, Instance, RowMode};
use crate::results::{self, parse_bench_output, AgentSummary, Row, RunError, SummaryRow};

/// The rows of a pass: measured steps (with the co-runner's rate during each) and the
/// co-runner's iterations.
pub(super) fn pass_rows(exp: &Experiment, p: &Prepared, hp: HaltPoll, pass: &Pass) -> Vec<Row> {
    let co_iters = co_runner_items(pass);
    let mut rows = Vec::new();
    for m in &pass.measured {
        rows.push(measured_row(exp, p, hp, m, &co_iters));
    }
    for (inst, mode, rep, why) in &pass.not_run {
        let policy = exp.modes.iter().find(|x| &x.name == mode).map(Mode::policy);
        rows.push(Row {
            env: Env::Vm,
            instance: *inst,
            mode: RowMode::mode(mode),
            policy,
            halt_poll: hp,
            rep: *rep,
            rc: -1,
            gamma: p.gamma_vm,
            error: Some(RunError::NotRun(why.clone())),
            ..Default::default()
        });
    }
    for m in &pass.co_runner {
        rows.push(co_runner_row(p, hp, m));
    }
    rows
}

/// The co-runner's successful iterations: (begin s, end s, items).
fn co_runner_items(pass: &Pass) -> Vec<(f64, f64, u64)> {
    pass.co_runner
        .iter()
        .filter(|m| m.step.rc == 0)
        .filter_map(|m| Some((m.begin_s, m.end_s, parse_bench_output(&m.step.stdout).ok()?.runs.first()?.items?)))
        .collect()
}

/// Fills `row`'s host-side fields from the step's QEMU threads (vCPU CPU time in vCPU order,
/// waits, halts, preemptions).
fn host_fields(row: &mut Row, r: &StepResult) {
    let mut vcpus: Vec<(u32, u64)> = r.vcpu_threads().filter_map(|t| t.vcpu().map(|v| (v, t.run_ns))).collect();
    vcpus.sort_unstable();
    row.host_cpu_ns = Some(r.host_cpu_ns());
    row.host_vcpu_ns = vcpus.into_iter().map(|v| v.1).collect();
    row.host_vcpu_wait_ns = Some(r.vcpu_threads().map(|t| t.wait_ns).sum());
    row.vcpu_sleeps = Some(r.vcpu_threads().map(|t| t.voluntary).sum());
    row.vcpu_preemptions = Some(r.vcpu_threads().map(|t| t.involuntary).sum());
}

/// The row of one measured step, with the co-runner's rate during it (`co_iters`); a failed
/// run when a haltpoll mode ran under another cpuidle driver.
fn measured_row(exp: &Experiment, p: &Prepared, hp: HaltPoll, m: &Measured, co_iters: &[(f64, f64, u64)]) -> Row {
    let r = &m.step;
    let (mode_name, rep) = r.step.rsplit_once('.').unwrap_or((r.step.as_str(), "0"));
    let mode = exp.modes.iter().find(|x| x.name == mode_name);
    let policy = mode.map(Mode::policy);
    let mut row = Row {
        env: Env::Vm,
        instance: m.instance,
        mode: RowMode::mode(mode_name),
        policy,
        halt_poll: hp,
        rep: rep.parse().unwrap_or(0),
        rc: r.rc,
        begin_s: m.begin_s,
        end_s: m.end_s,
        gamma: p.gamma_vm,
        co_runner_rate: results::co_runner_rate(m.begin_s, m.end_s, co_iters),
        // An agent that decided nothing writes no events: an empty summary, not a failure.
        agent: policy
            .filter(|x| x.agent_args().is_some())
            .map(|_| r.attachments.get("events").map_or_else(AgentSummary::default, |e| AgentSummary::from_events(e))),
        ..Default::default()
    };
    host_fields(&mut row, r);
    row.fill_from_bench(&r.stdout);
    if row.error.is_none() && matches!(policy, Some(IdlePolicy::Haltpoll { .. })) && row.cpuidle_driver.as_deref() != Some("haltpoll") {
        row.error = Some(RunError::Failed(format!(
            "the guest's cpuidle driver is {} (not haltpoll): {}",
            row.cpuidle_driver.as_deref().unwrap_or("unknown"),
            haltpoll_reason(p.acc)
        )));
    }
    row
}

/// The row of one co-runner iteration.
fn co_runner_row(p: &Prepared, hp: HaltPoll, m: &Measured) -> Row {
    let mut row = Row {
        env: Env::Vm,
        instance: Instance::B,
        mode: RowMode::CoRunner,
        halt_poll: hp,
        rep: match m.step.kind() {
            StepKind::Co(n) => n,
            _ => 0,
        },
        rc: m.step.rc,
        begin_s: m.begin_s,
        end_s: m.end_s,
        gamma: p.gamma_vm,
        ..Default::default()
    };
    host_fields(&mut row, &m.step);
    row.fill_from_bench(&m.step.stdout);
    row
}

/// The share of the CPU that was the workload's compute, per row (see
/// [`SummaryRow::compute_share`]): for VM rows of the vCPU threads' host CPU, for native rows of
/// the workload's own CPU time. Only for bench kernels with a fixed number of compute steps.
pub(super) fn add_compute_shares(summary: &mut [SummaryRow], native_args: &[String], guest_args: &[String]) {
    let compute_us = |args: &[String]| -> Option<f64> {
        let p = bench_workload_params(args)?.ok()?;
        let w = gleaner_bench::workload::Workload::parse(args.get(2)?).ok()?;
        Some(w.compute_steps_per_item(p.threads)? * p.work_us)
    };
    let (native, guest) = (compute_us(native_args), compute_us(guest_args));
    for s in summary.iter_mut() {
        let (compute, cpu_s) = if s.mode == RowMode::Native {
            (native, s.guest_cpu_s)
        } else {
            (guest, (!s.host_vcpu_s.is_empty()).then(|| s.host_vcpu_s.iter().sum::<f64>()))
        };
        let (Some(c), Some(cpu), Some(n)) = (compute, cpu_s, s.items.filter(|&n| n > 0.0)) else {
            continue;
        };
        let per_item = cpu * 1e6 / n;
        if per_item > 0.0 {
            s.compute_share = Some((c / per_item).min(1.0));
        }
    }
}

/// Mean wakeup latency of a setting, us.
fn mean_us(w: &WakeCosts, setting: gleaner_bench::wakeup::Setting) -> Option<f64> {
    w.settings.iter().find(|s| s.setting == setting)?.mean_us
}

/// The blocked-waiter bound of each stock row, from the wakeup costs measured in the
/// scenario's conditions (the first non-`alone` measurement, else `alone`).
pub(super) fn add_bww_bounds(summary: &mut [SummaryRow], wake: &[WakeCosts], notes: &mut Vec<String>) {
    use gleaner_bench::wakeup::Setting;
    let Some(w) = wake.iter().find(|w| w.context.place != WakePlace::Alone).or_else(|| wake.first()) else {
        return;
    };
    let (Some(a), Some(c)) = (mean_us(w, Setting::A), mean_us(w, Setting::C)) else {
        return;
    };
    let penalty = c - a;
    for s in summary.iter_mut().filter(|s| s.policy == Some(IdlePolicy::Stock)) {
        s.bww_bound = results::bww_bound(s, penalty);
        if let (Some(b), Some(h), Some(t)) = (s.bww_bound, s.sleeps_per_item, s.wall_per_item_us()) {
            notes.push(format!(
                "blocked-waiter bound, VM {} {} (halt poll {}): stock halts {h:.2} times per item and takes {t:.0} us per item; a halted vCPU wakes in {c:.0} us on average vs {a:.0} us on the same vCPU ({}), so removing every halt's penalty could speed it up at most {b:.2}x",
                s.instance, s.mode, s.halt_poll, w.context
            ));
        }
    }
}
