//! Sizing the workload (the compute rate natively and in a guest, the work per step) and its helpers on bench arguments and output.

use std::time::Instant;

use gleaner_os::BadInput;
use gleaner_qemu::session::{self, StepResult};
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use super::job::{cmd_line, step_line, wakeup_args, Setup, StepKind, StepKindOf};
use super::prepare::Prepared;
use super::wake::{wake_costs, WakeContext, WakePlace};
use crate::experiment::{Compute, Experiment};
use crate::native::NativeProc;
use crate::results::parse_bench_output;

/// `params.iters_per_us` of a bench JSON document.
pub fn calibrated_rate(stdout: &str) -> Option<f64> {
    let doc = parse_bench_output(stdout).ok()?;
    doc.params.get("iters_per_us")?.as_f64().filter(|r| *r > 0.0)
}

/// `args` with `flag VALUE` set (an earlier `flag V` or `flag=V` removed).
pub fn with_flag(args: &[String], flag: &str, value: &str) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len() + 2);
    let mut skip = false;
    for a in args {
        if skip {
            skip = false;
        } else if a == flag {
            skip = true;
        } else if !a.starts_with(&format!("{flag}=")) {
            out.push(a.clone());
        }
    }
    out.extend([flag.to_string(), value.to_string()]);
    out
}

/// The typed parameters of a `bench workload NAME ...` argument list; `None` for other
/// commands.
pub fn bench_workload_params(args: &[String]) -> Option<Result<gleaner_bench::workload::WorkloadParams, BadInput>> {
    #[derive(clap::Parser)]
    struct P {
        #[command(flatten)]
        a: gleaner_bench::WorkloadArgs,
    }
    use clap::Parser as _;
    if args.len() < 3 || args[0] != "bench" || args[1] != "workload" {
        return None;
    }
    let parsed = P::try_parse_from(std::iter::once("workload").chain(args[2..].iter().map(String::as_str)))
        .map_err(|e| BadInput::new("workload", args.join(" "), format!("valid `gleaner bench workload` arguments ({})", e.kind())));
    Some(parsed.and_then(|p| gleaner_bench::workload_params(&p.a).map(|x| x.1)))
}

/// Median CPU time per item, us, of bench documents (runs that failed are skipped).
fn cpu_per_item_us(outputs: &[String]) -> Option<f64> {
    let v: Vec<f64> = outputs
        .iter()
        .filter_map(|o| {
            let d = parse_bench_output(o).ok()?;
            let r = d.runs.first()?;
            Some(r.cpu_ns() as f64 / 1e3 / r.items.filter(|&n| n > 0)? as f64)
        })
        .collect();
    gleaner_policy::stats::median(&v).ok()
}

/// What sizing found (kept in the results).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sizing {
    pub compute: Compute,
    pub native_iters_per_us: f64,
    pub guest_iters_per_us: Option<f64>,
    /// CPU time per item with no compute (synchronization alone), us: natively and in a guest
    /// alone on the pCPUs.
    pub native_sync_us_per_item: Option<f64>,
    pub guest_sync_us_per_item: Option<f64>,
    /// `work_us` natively and in the guests.
    pub native_work_us: f64,
    pub guest_work_us: f64,
}

/// Items of a sizing run (no compute: synchronization alone).
const SIZING_ITEMS: u64 = 2000;
const SIZING_RUNS: u32 = 3;

/// The workload's arguments for (native, guest) runs, fixing the compute per item (see
/// [`Compute`]): the compute rate is measured natively and, for `balanced`, in one guest
/// booted alone on the pCPUs, with the synchronization cost per item on both sides.
pub(super) fn size_workload(
    exp: &Experiment,
    p: &mut Prepared,
    quick: bool,
    pb: &ProgressBar,
) -> anyhow::Result<(Vec<String>, Vec<String>, Option<Sizing>)> {
    let w = exp.workload_args(quick);
    let params = match bench_workload_params(&w) {
        None => return Ok((w.clone(), w, None)),
        Some(p) => p?,
    };
    if params.iters_per_us.is_some() {
        return Ok((w.clone(), w, None));
    }
    pb.set_message(format!("{}: measuring the compute rate natively", exp.name));
    let rate_args = vec!["bench".to_string(), "rate".into(), "--trials".into(), "20".into()];
    let native_rate = native_compute_rate(p, &rate_args)?;
    let native = with_flag(&w, "--iters-per-us", &format!("{native_rate:.3}"));
    let mut sizing = Sizing {
        compute: exp.compute,
        native_iters_per_us: native_rate,
        guest_iters_per_us: None,
        native_sync_us_per_item: None,
        guest_sync_us_per_item: None,
        native_work_us: params.work_us,
        guest_work_us: params.work_us,
    };
    if exp.compute == Compute::Native || params.work_us == 0.0 {
        p.notes.push(format!("compute per item fixed for native and guest runs with --iters-per-us {native_rate:.3} (measured natively): the same instructions everywhere"));
        return Ok((native.clone(), native, Some(sizing)));
    }
    // Synchronization cost per item: the workload with no compute, natively...
    let sync_args = with_flag(&with_flag(&w, "--work-us", "0"), "--items", &SIZING_ITEMS.to_string());
    pb.set_message(format!("{}: measuring the synchronization cost per item natively", exp.name));
    let native_out = native_sync_runs(p, &sync_args)?;
    // ...and in one guest alone on the pCPUs, with the guest's compute rate.
    pb.set_message(format!("{}: sizing guest (compute rate, synchronization cost per item)", exp.name));
    let steps = sizing_guest(exp, p, &rate_args, &sync_args)?;
    let guest_rate = steps.iter().find(|s| s.kind() == StepKind::Setup(Setup::Rate)).and_then(|s| s.stdout.trim().parse::<f64>().ok());
    let guest_out: Vec<String> =
        steps.iter().filter(|s| matches!(s.kind(), StepKind::Setup(Setup::Sync(_)))).map(|s| s.stdout.clone()).collect();
    let (Some(gr), Some(ns), Some(gs)) = (guest_rate, cpu_per_item_us(&native_out), cpu_per_item_us(&guest_out)) else {
        anyhow::bail!(
            "sizing the workload failed (guest steps: {})",
            steps.iter().map(|s| format!("{} rc {}", s.step, s.rc)).collect::<Vec<_>>().join(", ")
        );
    };
    let k = (gs / ns.max(1e-3)).clamp(1.0, 1000.0);
    sizing.guest_iters_per_us = Some(gr);
    sizing.native_sync_us_per_item = Some(ns);
    sizing.guest_sync_us_per_item = Some(gs);
    sizing.guest_work_us = (params.work_us * k * 10.0).round() / 10.0;
    p.notes.push(format!(
        "balanced compute: synchronization alone costs {ns:.1} us of CPU per item natively and {gs:.1} us in a guest alone on the pCPUs ({k:.1}x), so guest runs compute {:.1} us per step where native runs compute {} us, at each side's measured rate ({native_rate:.0} and {gr:.0} iterations/us): both spend the same share of their CPU on synchronization",
        sizing.guest_work_us, params.work_us
    ));
    let guest = with_flag(&with_flag(&w, "--iters-per-us", &format!("{gr:.3}")), "--work-us", &format!("{}", sizing.guest_work_us));
    Ok((native, guest, Some(sizing)))
}

/// The compute rate `gleaner bench rate` measures natively on the pCPUs, iterations/us.
fn native_compute_rate(p: &Prepared, rate_args: &[String]) -> anyhow::Result<f64> {
    let (_, out, _) = NativeProc::spawn(&p.gleaner, rate_args, &p.pcpus)?.wait(p.deadline, "native compute rate")?;
    out.trim().parse().map_err(|_| anyhow::anyhow!("`gleaner bench rate` printed {:?}, not a number", out.trim()))
}

/// The outputs of the native sizing runs (the workload with no compute).
fn native_sync_runs(p: &Prepared, sync_args: &[String]) -> anyhow::Result<Vec<String>> {
    let mut native_out = Vec::new();
    for _ in 0..SIZING_RUNS {
        native_out.push(NativeProc::spawn(&p.gleaner, sync_args, &p.pcpus)?.wait(p.deadline, "native sizing")?.1);
    }
    Ok(native_out)
}

/// Boots one guest alone on the pCPUs for the compute rate, the wakeup costs (kept in `p`)
/// and the sizing runs; returns its steps.
fn sizing_guest(exp: &Experiment, p: &mut Prepared, rate_args: &[String], sync_args: &[String]) -> anyhow::Result<Vec<StepResult>> {
    let mut job = step_line(&StepKind::Setup(Setup::Rate), &cmd_line(&p.gleaner, rate_args))
        + &step_line(&StepKind::Setup(Setup::Wakeup), &cmd_line(&p.gleaner, &wakeup_args()));
    for i in 0..SIZING_RUNS {
        job.push_str(&step_line(&StepKind::Setup(Setup::Sync(i)), &cmd_line(&p.gleaner, sync_args)));
    }
    let spec = p.spec(exp, &format!("lab-{}-sizing", exp.name), job, &[]);
    let timeout = p.deadline.saturating_duration_since(Instant::now());
    let (_, steps, _) = session::run_single(&p.kernel, &p.busybox, &spec, timeout)?;
    match steps.iter().find(|s| s.kind() == StepKind::Setup(Setup::Wakeup)) {
        Some(s) => match wake_costs(WakeContext { place: WakePlace::Alone, halt_poll: None }, spec.name(), &s.stdout) {
            Some(w) => p.wake_costs.push(w),
            None => p.notes.push(format!(
                "{}: setup.wakeup (rc {}) printed no wakeup document: {}",
                spec.name(),
                s.rc,
                s.stdout.chars().take(200).collect::<String>()
            )),
        },
        None => p.notes.push(format!(
            "{}: no setup.wakeup step (steps: {})",
            spec.name(),
            steps.iter().map(|s| s.step.as_str()).collect::<Vec<_>>().join(", ")
        )),
    }
    Ok(steps)
}
