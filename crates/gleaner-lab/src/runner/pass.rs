//! One halt-poll pass of the guests: the host knob, the co-runner, each boot of the measured guests, KVM statistics.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gleaner_os::kvm::HaltPollGuard;
use gleaner_os::sysfs::Sysfs;
use gleaner_policy::IdlePolicy;
use gleaner_qemu::session::{Session, StepResult};
use gleaner_qemu::{Accel, GuestError};
use indicatif::ProgressBar;

use super::job::{co_runner_job, guest_job, Setup, StepKind, StepKindOf};
use super::prepare::{left, Prepared};
use super::wake::{wake_costs, WakeContext, WakeCosts, WakePlace};
use super::SetupStep;
use crate::experiment::{Experiment, Mode, Scenario};
use crate::keys::{HaltPoll, Instance};
use crate::qmp;

/// One measured step, with its guest role and session-clock window.
pub(super) struct Measured {
    pub(super) instance: Instance,
    pub(super) step: StepResult,
    pub(super) begin_s: f64,
    pub(super) end_s: f64,
}

/// What one halt-poll pass of the guests produced.
#[derive(Default)]
pub(super) struct Pass {
    pub(super) measured: Vec<Measured>,
    pub(super) co_runner: Vec<Measured>,
    pub(super) setup: Vec<SetupStep>,
    pub(super) boot_s: BTreeMap<String, f64>,
    pub(super) kvm_stats: BTreeMap<String, Vec<(String, f64)>>,
    pub(super) notes: Vec<String>,
    pub(super) wake_costs: Vec<WakeCosts>,
    /// Runs a boot was to do but did not, and why: (instance, mode, rep, reason).
    pub(super) not_run: Vec<(Instance, String, u32, String)>,
}

/// The boots of the measured guest: (rep numbers, boot group index). One boot for all reps
/// when every mode shares a kernel command line; else one boot per group per round, with the
/// group order rotated by round.
pub(super) fn boot_plan(groups: usize, runs: u32) -> Vec<(Vec<u32>, usize)> {
    if groups == 1 {
        return vec![((1..=runs).collect(), 0)];
    }
    (1..=runs).flat_map(|r| (0..groups).map(move |i| (vec![r], (i + r as usize - 1) % groups))).collect()
}

/// One halt-poll pass of the guests, in named steps: set the host knob, start the co-runner
/// (oc), boot the measured guest(s) once per entry of the boot plan and collect each boot,
/// let the co-runner finish its iteration and collect it, read KVM statistics, kill all.
pub(super) fn guest_pass(
    exp: &Experiment,
    p: &Prepared,
    hp: HaltPoll,
    wargs: &[String],
    quick: bool,
    pb: &ProgressBar,
) -> anyhow::Result<Pass> {
    let _guard = set_halt_poll(p, hp)?;
    let mut pass = Pass::default();
    let mut s = Session::new(p.kernel.clone(), p.busybox.clone());
    let cx = PassCtx { exp, p, hp, epoch: Instant::now() };
    let mut tick = progress_tick(&cx, pb);
    let co = start_co_runner(&cx, quick, &mut s, &mut tick)?;
    let groups = exp.boot_groups();
    let plan = boot_plan(groups.len(), p.runs);
    for (k, (reps, gi)) in plan.iter().enumerate() {
        let (kargs, modes) = &groups[*gi];
        let boot = Boot { reps, modes, kargs, job: guest_job(modes, reps, &p.gleaner, wargs, k == 0) };
        let suffix = if plan.len() == 1 { String::new() } else { format!("-{}", k + 1) };
        let ids = boot_measured(&cx, &mut s, &boot, &suffix, co, &mut tick)?;
        for (inst, id) in ids {
            collect_measured(&cx, &mut s, (inst, id), &boot, &mut pass);
        }
    }
    if let Some(b) = co {
        finish_co_runner(&cx, &mut s, b, &mut pass, &mut tick)?;
    }
    if p.acc == Accel::Kvm {
        collect_kvm_stats(&s, hp, &mut pass);
    }
    s.kill_all();
    Ok(pass)
}

/// What every step of a pass reads: the experiment, what was prepared, the pass's halt-poll
/// setting, and the instant its session clock starts from (steps' `begin_s`/`end_s`).
struct PassCtx<'a> {
    exp: &'a Experiment,
    p: &'a Prepared,
    hp: HaltPoll,
    epoch: Instant,
}

/// Sets the host's `kvm.halt_poll_ns` to `hp` for the pass (KVM and a number only; `n/a`
/// under TCG); restored when the guard drops.
fn set_halt_poll(p: &Prepared, hp: HaltPoll) -> anyhow::Result<Option<HaltPollGuard>> {
    Ok(match hp {
        HaltPoll::Ns(v) if p.acc == Accel::Kvm => Some(HaltPollGuard::set(&Sysfs::new(), v)?),
        _ => None,
    })
}

/// The progress bar's update while a session runs: each running guest's step and the
/// measured steps done so far.
fn progress_tick<'a>(cx: &'a PassCtx, pb: &'a ProgressBar) -> impl FnMut(&Session) + 'a {
    let (exp, p, hp) = (cx.exp, cx.p, cx.hp);
    let before = pb.position();
    move |s: &Session| {
        let parts: Vec<String> = s
            .guests
            .iter()
            .zip(&s.states)
            .filter(|(_, st)| st.done.is_none())
            .map(|(g, st)| {
                let what = match (st.ready_at, st.current_step()) {
                    (None, _) => "booting".to_string(),
                    (Some(_), Some(c)) => c.to_string(),
                    (Some(_), None) => "ready".into(),
                };
                format!("{} {what}", g.name.trim_start_matches("lab-"))
            })
            .collect();
        let now = s
            .states
            .iter()
            .map(|x| x.steps.iter().filter(|st| !matches!(st.0.kind(), StepKind::Co(_) | StepKind::Setup(_))).count())
            .sum::<usize>();
        pb.set_position(before + now as u64);
        pb.set_message(format!("{} [{}, halt_poll {hp}]: {} ({})", exp.name, p.acc, parts.join(", "), left(p.deadline)));
    }
}

/// oc: boots VM B with the co-runner in a loop and waits until its first iteration runs.
fn start_co_runner(cx: &PassCtx, quick: bool, s: &mut Session, tick: &mut dyn FnMut(&Session)) -> anyhow::Result<Option<usize>> {
    let (exp, p) = (cx.exp, cx.p);
    if exp.scenario != Scenario::Oc {
        return Ok(None);
    }
    let args = exp.co_runner_args(quick).unwrap_or_default();
    let b = s.start(&p.spec(exp, &format!("lab-{}-B", exp.name), co_runner_job(&args, &p.gleaner), &[]))?;
    s.drive(
        p.deadline,
        "the co-runner to start in VM B",
        &[b],
        &|s| s.states[b].current_step().is_some() || !s.states[b].steps.is_empty(),
        tick,
    )?;
    Ok(Some(b))
}

/// One boot of the measured guest(s): which reps of which modes, under which kernel
/// command line, and the job that runs them.
struct Boot<'a> {
    reps: &'a [u32],
    modes: &'a [&'a Mode],
    kargs: &'a [String],
    job: String,
}

/// Boots VM A (and for oc2 VM B) for `boot` and drives the session until their jobs are done
/// (the co-runner, if any, must keep running). Returns (instance, guest id) of each.
fn boot_measured(
    cx: &PassCtx,
    s: &mut Session,
    boot: &Boot,
    suffix: &str,
    co: Option<usize>,
    tick: &mut dyn FnMut(&Session),
) -> anyhow::Result<Vec<(Instance, usize)>> {
    let (exp, p) = (cx.exp, cx.p);
    let mut ids = vec![(Instance::A, s.start(&p.spec(exp, &format!("lab-{}-A{suffix}", exp.name), boot.job.clone(), boot.kargs))?)];
    if exp.scenario == Scenario::Oc2 {
        ids.push((Instance::B, s.start(&p.spec(exp, &format!("lab-{}-B{suffix}", exp.name), boot.job.clone(), boot.kargs))?));
    }
    let mut needed: Vec<usize> = ids.iter().map(|x| x.1).collect();
    needed.extend(co);
    let targets: Vec<usize> = ids.iter().map(|x| x.1).collect();
    s.drive(p.deadline, "the workload's steps", &needed, &|s| targets.iter().all(|&g| s.states[g].done.is_some()), tick)?;
    Ok(ids)
}

/// Collects one measured guest after its boot: the runs it did not do (and why), its boot
/// time, its wakeup costs, setup steps and measured steps; then waits for QEMU to exit.
fn collect_measured(cx: &PassCtx, s: &mut Session, (inst, id): (Instance, usize), boot: &Boot, pass: &mut Pass) {
    let (exp, p, hp, epoch) = (cx.exp, cx.p, cx.hp, cx.epoch);
    let name = s.guests[id].name.clone();
    let st = &s.states[id];
    let cpuidle = st.steps.iter().find(|x| x.0.kind() == StepKind::Setup(Setup::Cpuidle)).map(|x| x.0.stdout.trim().to_string());
    for &rep in boot.reps {
        for m in boot.modes {
            let step = StepKind::Measured { mode: m.name.clone(), rep }.name();
            if !st.steps.iter().any(|x| x.0.step == step) {
                let why = match (&cpuidle, m.policy()) {
                    (Some(d), IdlePolicy::Haltpoll { .. }) if d != "haltpoll" => {
                        format!("the guest's cpuidle driver is {d} (not haltpoll): {}", haltpoll_reason(p.acc))
                    }
                    _ => {
                        format!("{name}'s job ended before step {step} (rc {})", st.done.unwrap_or(-1))
                    }
                };
                pass.not_run.push((inst, m.name.clone(), rep, why));
            }
        }
    }
    if let Some(bs) = s.boot_s(id) {
        pass.boot_s.insert(format!("{name}@{hp}"), bs);
    }
    for (r, bi, ei) in &s.states[id].steps {
        let kind = r.kind();
        if kind == StepKind::Setup(Setup::Wakeup) {
            let context = WakeContext { place: WakePlace::of(exp.scenario), halt_poll: Some(hp) };
            if let Some(w) = wake_costs(context, &name, &r.stdout) {
                pass.wake_costs.push(w);
            }
        }
        if kind.is_setup() {
            pass.setup.push(SetupStep { guest: name.clone(), step: r.step.clone(), rc: r.rc, stdout: r.stdout.trim().to_string() });
            continue;
        }
        pass.measured.push(Measured {
            instance: inst,
            step: r.clone(),
            begin_s: (*bi - epoch).as_secs_f64(),
            end_s: (*ei - epoch).as_secs_f64(),
        });
    }
    s.guests[id].wait_exit(Duration::from_secs(5));
}

/// Lets the co-runner finish the iteration under way, then collects its iterations and boot
/// time. An iteration that spans A's whole last step would otherwise never be counted, and
/// that step would have no co-runner rate (seen with short steps under load). Best effort.
fn finish_co_runner(cx: &PassCtx, s: &mut Session, b: usize, pass: &mut Pass, tick: &mut dyn FnMut(&Session)) -> anyhow::Result<()> {
    let (p, hp, epoch) = (cx.p, cx.hp, cx.epoch);
    let a_end = pass.measured.iter().map(|m| m.end_s).fold(0.0, f64::max);
    let wait = p.deadline.min(Instant::now() + Duration::from_secs(30));
    let ended_after = |s: &Session| s.states[b].steps.last().is_some_and(|x| (x.2 - epoch).as_secs_f64() >= a_end);
    match s.drive(wait, "the co-runner's iteration in VM B", &[b], &ended_after, tick) {
        Ok(()) | Err(GuestError::Timeout { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    for (r, bi, ei) in &s.states[b].steps {
        pass.co_runner.push(Measured {
            instance: Instance::B,
            step: r.clone(),
            begin_s: (*bi - epoch).as_secs_f64(),
            end_s: (*ei - epoch).as_secs_f64(),
        });
    }
    if let Some(bs) = s.boot_s(b) {
        pass.boot_s.insert(format!("{}@{hp}", s.guests[b].name), bs);
    }
    Ok(())
}

/// QMP `query-stats` of every guest of the session (KVM only); a failure is a note.
fn collect_kvm_stats(s: &Session, hp: HaltPoll, pass: &mut Pass) {
    for g in &s.guests {
        let stats = qmp::Qmp::connect(&g.qmp_path(), Duration::from_secs(5))
            .and_then(|mut q| q.execute("query-stats", Some(serde_json::json!({"target": "vcpu"}))))
            .map(|v| qmp::flatten_stats(&v));
        match stats {
            Ok(v) => {
                pass.kvm_stats.insert(format!("{}@{hp}", g.name), v);
            }
            Err(e) => pass.notes.push(format!("query-stats on {}: {e}", g.name)),
        }
    }
}

/// Why the guest's cpuidle-haltpoll driver did not load.
pub(super) fn haltpoll_reason(acc: Accel) -> &'static str {
    match acc {
        Accel::Tcg => "cpuidle-haltpoll registers only when kvm_para_available(), i.e. the guest sees KVM's paravirtual CPUID signature, which QEMU provides only with -accel kvm",
        Accel::Kvm => "cpuidle-haltpoll did not register (check the guest kernel's CONFIG_HALTPOLL_CPUIDLE and the console)",
    }
}
