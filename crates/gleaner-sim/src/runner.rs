//! Runs a scenario: every case x variant, plus the native baselines, in parallel (rayon), and
//! turns the raw outcomes into the per-VM report.

use std::time::Instant;

use gleaner_policy::num::saturating_u64;
use gleaner_policy::overhead::{overhead, Side};
use rayon::prelude::*;
use serde::Serialize;

use crate::engine::{ms_to_ns, Engine, HaltPoll, Outcome, Setup, SetupVm};
use crate::policy::{AqlHost, HostPolicy, StockHost};
use crate::scenario::{CalibrationUse, Costs, HostPolicyKind, ResolvedCosts, Scenario, VariantCfg};
use crate::stats::{LatencySummary, VmOutcome};
use gleaner_policy::IdlePolicy;

/// The whole result of `gleaner sim`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: String,
    pub description: String,
    pub seed: u64,
    pub cases: Vec<CaseReport>,
    /// Simulator speed (wall clock, measured outside the model); absent with `--no-timing`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub perf: Option<Perf>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Perf {
    pub runs: usize,
    pub events: u64,
    pub stale_events: u64,
    pub simulated_s: f64,
    /// Sum of the runs' thread CPU times (each run is single-threaded).
    pub cpu_s: f64,
    /// Elapsed wall time of the whole command (runs in parallel).
    pub wall_s: f64,
    /// Events per second of one core: events / cpu_s.
    pub events_per_sec: f64,
    pub threads: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    pub name: String,
    pub pcpus: u32,
    pub baseline: String,
    pub variants: Vec<VariantReport>,
    pub native: Vec<NativeReport>,
    /// The VM's costs where they came from a calibration record (absent otherwise: the
    /// scenario's own `[costs]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub costs: Option<CaseCosts>,
}

/// The costs a case ran with, when taken from a calibration record.
#[derive(Debug, Clone, Serialize)]
pub struct CaseCosts {
    /// The VM's costs (ns) as the model charged them.
    pub vm: Costs,
    /// The record they came from: its file and wake-cost curve, and where RV was clamped.
    pub calibration: CalibrationUse,
}

#[derive(Debug, Clone, Serialize)]
pub struct NativeReport {
    pub vm: String,
    pub workload: String,
    pub cores: u32,
    pub finished: bool,
    pub wall_ns: u64,
    pub cpu_ns: u64,
    pub idle_transitions: u64,
    pub idle_transitions_per_s: f64,
    pub wake_latency: LatencySummary,
}

#[derive(Debug, Clone, Serialize)]
pub struct VariantReport {
    pub name: String,
    /// The guest's idle policy, as reports name it ([`report_name`]).
    #[serde(serialize_with = "report_name")]
    pub guest: IdlePolicy,
    pub host_halt_poll: bool,
    pub host: HostPolicyKind,
    pub finished: bool,
    pub sim_ns: u64,
    pub events: u64,
    pub stale_events: u64,
    pub host_plans: u64,
    pub vms: Vec<VmReport>,
    /// Mean over the VMs of their speedup against the baseline variant (Gleaner paper, 7.2).
    pub weighted_speedup: Option<f64>,
}

/// A policy as the simulator's reports name it: by its name, `poll` as `idle_poll` (the
/// name the readers of these reports match on).
fn report_name<S: serde::Serializer>(p: &IdlePolicy, s: S) -> Result<S::Ok, S::Error> {
    match p {
        IdlePolicy::Poll => s.serialize_str("idle_poll"),
        p => s.collect_str(p),
    }
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Exits {
    pub hlt: u64,
    pub ipi: u64,
    pub tsc_deadline: u64,
    pub ple: u64,
    pub io: u64,
    pub total: u64,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct HaltPollReport {
    pub attempts: u64,
    pub successes: u64,
    pub success_rate: Option<f64>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct VsNative {
    pub slowdown: f64,
    pub d_eta_r: f64,
    pub d_eta_t: f64,
    pub omega: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct VmReport {
    pub name: String,
    pub workload: String,
    pub vcpus: u32,
    pub background: bool,
    pub finished: bool,
    pub wall_ns: u64,
    /// pCPU time of the VM's vCPUs (work, switch costs, spinning, polling, yielding).
    pub cpu_ns: u64,
    pub work_ns: u64,
    pub overhead_ns: u64,
    pub spin_ns: u64,
    pub yield_ns: u64,
    pub guest_poll_ns: u64,
    pub host_poll_ns: u64,
    /// Useful work per second of wall time (in CPUs): the throughput of background VMs.
    pub work_rate: f64,
    pub idle_transitions: u64,
    pub idle_transitions_per_s: f64,
    pub exits: Exits,
    pub halt_poll: HaltPollReport,
    pub wake_latency: LatencySummary,
    /// Request latency (workloads with `record` ops: from a request's stamp to its record).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_latency: Option<LatencySummary>,
    pub context_switches: u64,
    pub llc_refs: f64,
    pub llc_misses: f64,
    pub vs_native: Option<VsNative>,
    /// Against the same VM under the baseline variant (wall time, or work rate if background).
    pub speedup: Option<f64>,
    pub gleaner_active_vcpus_at_end: Option<u32>,
    pub gleaner_decisions: u64,
    /// The retention governor and adaptive timeouts (variants with retention that govern).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention: Option<crate::stats::RetentionOutcome>,
}

fn host_policy(kind: HostPolicyKind, aql: &crate::scenario::AqlCfg, sc: &Scenario) -> Box<dyn HostPolicy> {
    match kind {
        HostPolicyKind::Stock => Box::new(StockHost),
        HostPolicyKind::Aql => Box::new(AqlHost::new(sc.host.pcpus, sc.host.sockets, aql)),
    }
}

fn us_to_ns(us: f64) -> u64 {
    saturating_u64((us * 1000.0).round())
}

/// The engine setup of a scenario under a variant.
pub fn setup_for(sc: &Scenario, v: &VariantCfg, seed: u64) -> anyhow::Result<Setup> {
    setup_with_costs(sc, v, seed, &sc.resolve_costs()?)
}

/// Whether the variant's agent polls in the kernel: as configured, else where the costs offer
/// a POLL state (a calibration measured one) and the variant plans retention.
pub fn kernel_polling(v: &VariantCfg, vm_costs: &Costs) -> bool {
    v.gleaner.kernel_polling.unwrap_or_else(|| {
        let planned = v.gleaner.govern || v.gleaner.agent.as_ref().is_some_and(|a| a.means.kernel_polling());
        vm_costs.poll_state && v.guest.retention() && planned
    })
}

/// [`setup_for`] with the scenario's costs resolved already.
pub fn setup_with_costs(sc: &Scenario, v: &VariantCfg, seed: u64, costs: &ResolvedCosts) -> anyhow::Result<Setup> {
    let vm_costs = costs.vm.clone();
    let h = &sc.host;
    let mut gleaner = v.gleaner.clone();
    gleaner.kernel_polling = Some(kernel_polling(v, &vm_costs));
    let mut vms = Vec::new();
    for vm in sc.active_vms() {
        vms.push(SetupVm {
            name: vm.name.clone(),
            workload: sc.workload_of(vm)?,
            vcpus: vm.vcpus,
            pin_offset: vm.pin.then_some(vm.pin_offset),
            background: vm.background,
            guest: if vm.background { IdlePolicy::Stock } else { v.guest },
            gleaner: gleaner.clone(),
            haltpoll: v.haltpoll_params(),
        });
    }
    Ok(Setup {
        pcpus: h.pcpus,
        host_slice_ns: us_to_ns(h.slice_us),
        slice_jitter_pm: h.slice_jitter_pm,
        scheduler: h.scheduler,
        wakeup_preemption: h.wakeup_preemption,
        wakeup_gran_ns: us_to_ns(h.wakeup_granularity_us),
        guest_slice_ns: us_to_ns(h.guest_slice_us),
        halt_poll: (v.host_halt_poll && h.halt_poll_ns > 0).then_some(HaltPoll {
            max_ns: h.halt_poll_ns,
            grow: h.halt_poll_ns_grow,
            grow_start: h.halt_poll_ns_grow_start,
            shrink: h.halt_poll_ns_shrink,
        }),
        ple_window_ns: us_to_ns(h.ple_window_us),
        balance_ns: (h.balance_interval_us > 0.0).then(|| us_to_ns(h.balance_interval_us).max(1)),
        guest_steal: h.guest_steal,
        virt: true,
        costs: vm_costs,
        vms,
        seed,
        stop_at: sc.duration_ms.map(ms_to_ns),
        max_ns: ms_to_ns(sc.max_sim_ms),
        host_policy: host_policy(v.host, &v.aql, sc),
    })
}

/// The native baseline of VM `vm_index`: its workload alone on `min(vcpus, pcpus)` cores.
pub fn native_setup(sc: &Scenario, vm_index: usize, seed: u64) -> anyhow::Result<(Setup, u32)> {
    native_setup_with_costs(sc, vm_index, seed, &sc.resolve_costs()?)
}

/// [`native_setup`] with the scenario's costs resolved already.
pub fn native_setup_with_costs(sc: &Scenario, vm_index: usize, seed: u64, costs: &ResolvedCosts) -> anyhow::Result<(Setup, u32)> {
    let pm = costs.pm.clone();
    let vm = sc.active_vms()[vm_index];
    let cores = vm.vcpus.min(sc.host.pcpus);
    let h = &sc.host;
    Ok((
        Setup {
            pcpus: cores,
            host_slice_ns: us_to_ns(h.slice_us),
            slice_jitter_pm: h.slice_jitter_pm,
            scheduler: h.scheduler,
            wakeup_preemption: h.wakeup_preemption,
            wakeup_gran_ns: us_to_ns(h.wakeup_granularity_us),
            guest_slice_ns: us_to_ns(h.guest_slice_us),
            halt_poll: None,
            ple_window_ns: us_to_ns(h.ple_window_us),
            balance_ns: None,
            guest_steal: true,
            virt: false,
            costs: pm,
            vms: vec![SetupVm {
                name: vm.name.clone(),
                workload: sc.workload_of(vm)?,
                vcpus: cores,
                pin_offset: Some(0),
                background: false,
                guest: IdlePolicy::Stock,
                gleaner: Default::default(),
                haltpoll: Default::default(),
            }],
            seed,
            stop_at: None,
            max_ns: ms_to_ns(sc.max_sim_ms),
            host_policy: Box::new(StockHost),
        },
        cores,
    ))
}

/// CPU time of the calling thread: each run is single-threaded, so this is one core's time
/// spent on it, unaffected by other processes competing for the cores.
fn thread_cpu_s() -> f64 {
    use nix::time::{clock_gettime, ClockId};
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).map_or(0.0, |t| t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9)
}

enum Job {
    Variant { case: usize, var: usize },
    Native { case: usize, vm: usize },
}

struct Done {
    outcome: Outcome,
    secs: f64,
    cores: u32,
}

/// Runs every case, variant and native baseline of `cases` (from [`crate::scenario::expand_cases`]).
pub fn run_cases(name: &str, description: &str, cases: &[(String, Scenario)], seed: u64, timing: bool) -> anyhow::Result<Report> {
    let t0 = Instant::now();
    // Each case's costs once (a calibration record or a bench file is read here, not per run).
    let costs: Vec<ResolvedCosts> = cases.iter().map(|(_, sc)| sc.resolve_costs()).collect::<anyhow::Result<_>>()?;
    let mut jobs = Vec::new();
    for (ci, (_, sc)) in cases.iter().enumerate() {
        for vi in 0..sc.variants().len() {
            jobs.push(Job::Variant { case: ci, var: vi });
        }
        if sc.native {
            for (mi, vm) in sc.active_vms().iter().enumerate() {
                if !vm.background {
                    jobs.push(Job::Native { case: ci, vm: mi });
                }
            }
        }
    }
    let results: Vec<anyhow::Result<Done>> = jobs
        .par_iter()
        .map(|job| {
            let (setup, cores) = match *job {
                Job::Variant { case, var } => {
                    let sc = &cases[case].1;
                    (setup_with_costs(sc, &sc.variants()[var], seed, &costs[case])?, 0)
                }
                Job::Native { case, vm } => native_setup_with_costs(&cases[case].1, vm, seed, &costs[case])?,
            };
            let start = thread_cpu_s();
            let outcome = Engine::new(setup).run();
            Ok(Done { outcome, secs: thread_cpu_s() - start, cores })
        })
        .collect();
    let mut done = Vec::with_capacity(results.len());
    for r in results {
        done.push(r?);
    }
    let mut perf = Perf {
        runs: done.len(),
        events: 0,
        stale_events: 0,
        simulated_s: 0.0,
        cpu_s: 0.0,
        wall_s: 0.0,
        events_per_sec: 0.0,
        threads: rayon::current_num_threads(),
    };
    for d in &done {
        perf.events += d.outcome.events;
        perf.stale_events += d.outcome.stale_events;
        perf.simulated_s += d.outcome.end_ns as f64 / 1e9;
        perf.cpu_s += d.secs;
    }
    perf.wall_s = t0.elapsed().as_secs_f64();
    perf.events_per_sec = if perf.cpu_s > 0.0 { perf.events as f64 / perf.cpu_s } else { 0.0 };

    let mut case_reports = Vec::new();
    let mut it = done.into_iter();
    for ((cname, sc), costs) in cases.iter().zip(costs) {
        let variants = sc.variants();
        let mut outs: Vec<Outcome> = Vec::new();
        for _ in 0..variants.len() {
            outs.push(it.next().expect("one result per job").outcome);
        }
        let mut natives: Vec<Option<(Outcome, u32)>> = vec![None; sc.active_vms().len()];
        if sc.native {
            for (mi, vm) in sc.active_vms().iter().enumerate() {
                if !vm.background {
                    let d = it.next().expect("one result per job");
                    natives[mi] = Some((d.outcome, d.cores));
                }
            }
        }
        let mut report = build_case(cname, sc, &variants, &outs, &natives);
        report.costs = costs.calibration.map(|calibration| CaseCosts { vm: costs.vm, calibration });
        case_reports.push(report);
    }
    Ok(Report { scenario: name.to_string(), description: description.to_string(), seed, cases: case_reports, perf: timing.then_some(perf) })
}

fn build_case(name: &str, sc: &Scenario, variants: &[VariantCfg], outs: &[Outcome], natives: &[Option<(Outcome, u32)>]) -> CaseReport {
    let vms = sc.active_vms();
    let total_vcpus: u32 = vms.iter().map(|v| v.vcpus).sum();
    let baseline = sc.baseline_name();
    let bi = variants.iter().position(|v| v.name == baseline).unwrap_or(0);
    let native: Vec<NativeReport> = natives
        .iter()
        .zip(&vms)
        .filter_map(|(n, vm)| {
            let (o, cores) = n.as_ref()?;
            let v = &o.vms[0];
            let wall = v.wall_ns();
            Some(NativeReport {
                vm: vm.name.clone(),
                workload: vm.workload.clone(),
                cores: *cores,
                finished: v.done_at.is_some(),
                wall_ns: wall,
                cpu_ns: v.run_ns,
                idle_transitions: v.idle_entries,
                idle_transitions_per_s: per_s(v.idle_entries, wall),
                wake_latency: v.lat.summary(),
            })
        })
        .collect();
    let mut reports = Vec::new();
    for (vi, (var, o)) in variants.iter().zip(outs).enumerate() {
        let mut vr = Vec::new();
        let mut speedups = Vec::new();
        for (mi, v) in o.vms.iter().enumerate() {
            let cfg = vms[mi];
            let wall = v.wall_ns();
            let gamma_v = (cfg.vcpus as f64).min(sc.host.pcpus as f64 * cfg.vcpus as f64 / total_vcpus as f64);
            let vs_native = natives[mi].as_ref().and_then(|(n, cores)| {
                let nv = &n.vms[0];
                let base = Side { cpu: nv.run_ns as f64, wall: nv.wall_ns() as f64, gamma: *cores as f64 };
                let target = Side { cpu: v.run_ns as f64, wall: wall as f64, gamma: gamma_v };
                let oh = overhead(base, target).ok()?;
                Some(VsNative { slowdown: wall as f64 / nv.wall_ns() as f64, d_eta_r: oh.d_eta_r, d_eta_t: oh.d_eta_t, omega: oh.omega })
            });
            let speedup = speedup_of(v, &outs[bi].vms[mi]);
            if vi != bi {
                if let Some(s) = speedup {
                    speedups.push(s);
                }
            }
            vr.push(vm_report(v, &cfg.workload, vs_native, speedup));
        }
        let weighted_speedup = if vi == bi {
            Some(1.0)
        } else if speedups.len() == o.vms.len() && !speedups.is_empty() {
            Some(speedups.iter().sum::<f64>() / speedups.len() as f64)
        } else {
            None
        };
        reports.push(VariantReport {
            name: var.name.clone(),
            guest: var.guest,
            host_halt_poll: var.host_halt_poll,
            host: var.host,
            finished: o.finished,
            sim_ns: o.end_ns,
            events: o.events,
            stale_events: o.stale_events,
            host_plans: o.host_plans,
            vms: vr,
            weighted_speedup,
        });
    }
    CaseReport { name: name.to_string(), pcpus: sc.host.pcpus, baseline, variants: reports, native, costs: None }
}

fn per_s(n: u64, ns: u64) -> f64 {
    if ns == 0 {
        0.0
    } else {
        n as f64 * 1e9 / ns as f64
    }
}

fn work_rate(v: &VmOutcome) -> f64 {
    let w = v.wall_ns();
    if w == 0 {
        0.0
    } else {
        v.work_ns as f64 / w as f64
    }
}

fn speedup_of(v: &VmOutcome, base: &VmOutcome) -> Option<f64> {
    if v.background {
        let (a, b) = (work_rate(v), work_rate(base));
        (b > 0.0).then(|| a / b)
    } else {
        (v.done_at.is_some() && base.done_at.is_some() && v.wall_ns() > 0).then(|| base.wall_ns() as f64 / v.wall_ns() as f64)
    }
}

fn vm_report(v: &VmOutcome, workload: &str, vs_native: Option<VsNative>, speedup: Option<f64>) -> VmReport {
    let wall = v.wall_ns();
    VmReport {
        name: v.name.clone(),
        workload: workload.to_string(),
        vcpus: v.vcpus,
        background: v.background,
        finished: v.done_at.is_some(),
        wall_ns: wall,
        cpu_ns: v.run_ns,
        work_ns: v.work_ns,
        overhead_ns: v.overhead_ns,
        spin_ns: v.spin_ns,
        yield_ns: v.yield_ns,
        guest_poll_ns: v.guest_poll_ns,
        host_poll_ns: v.host_poll_ns,
        work_rate: work_rate(v),
        idle_transitions: v.idle_entries,
        idle_transitions_per_s: per_s(v.idle_entries, wall),
        exits: Exits {
            hlt: v.exits_hlt,
            ipi: v.exits_ipi,
            tsc_deadline: v.exits_timer,
            ple: v.exits_ple,
            io: v.exits_io,
            total: v.exits_hlt + v.exits_ipi + v.exits_timer + v.exits_ple + v.exits_io,
        },
        halt_poll: HaltPollReport {
            attempts: v.halt_poll_attempts,
            successes: v.halt_poll_successes,
            success_rate: (v.halt_poll_attempts > 0).then(|| v.halt_poll_successes as f64 / v.halt_poll_attempts as f64),
        },
        wake_latency: v.lat.summary(),
        request_latency: (v.req.summary().count > 0).then(|| v.req.summary()),
        context_switches: v.context_switches,
        llc_refs: v.llc_refs.round(),
        llc_misses: v.llc_misses.round(),
        vs_native,
        speedup,
        gleaner_active_vcpus_at_end: v.gleaner_active_end,
        gleaner_decisions: v.gleaner_decisions,
        retention: v.retention,
    }
}

/// A human-readable table of a report.
pub fn render(r: &Report) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "scenario {} (seed {}){}",
        r.scenario,
        r.seed,
        if r.description.is_empty() { String::new() } else { format!(": {}", r.description) }
    );
    for c in &r.cases {
        render_case(&mut s, c);
    }
    if let Some(p) = &r.perf {
        let _ = writeln!(
            s,
            "\n{} runs, {} events in {:.2} s of run time ({:.1} M events/s per core), {:.3} simulated s, {:.2} s elapsed on {} threads",
            p.runs,
            p.events,
            p.cpu_s,
            p.events_per_sec / 1e6,
            p.simulated_s,
            p.wall_s,
            p.threads
        );
    }
    s
}

/// One case of [`render`]: its header, the native rows, then every variant's VMs.
fn render_case(s: &mut String, c: &CaseReport) {
    use std::fmt::Write;
    let _ = writeln!(s, "\ncase {} ({} pCPUs, baseline {})", c.name, c.pcpus, c.baseline);
    let _ = writeln!(
        s,
        "  {:<14} {:<10} {:>10} {:>9} {:>8} {:>10} {:>9} {:>9} {:>7} {:>8} {:>8}",
        "variant", "vm", "wall_ms", "vs_nat", "speedup", "idle/s", "hlt", "ipi", "poll%", "wake_p50", "wake_p99"
    );
    for n in &c.native {
        let _ = writeln!(
            s,
            "  {:<14} {:<10} {:>10.2} {:>9} {:>8} {:>10.0} {:>9} {:>9} {:>7} {:>8.0} {:>8.0}",
            format!("native/{}c", n.cores),
            n.vm,
            n.wall_ns as f64 / 1e6,
            "1.00",
            "-",
            n.idle_transitions_per_s,
            "-",
            "-",
            "-",
            n.wake_latency.p50_us,
            n.wake_latency.p99_us
        );
    }
    for v in &c.variants {
        for m in &v.vms {
            render_vm(s, &v.name, m);
        }
        if let Some(w) = v.weighted_speedup {
            if v.name != c.baseline {
                let _ = writeln!(s, "  {:<14} weighted speedup {:.2}", v.name, w);
            }
        }
    }
}

/// One VM's row of a variant in [`render`], and its requests' latency where it has them.
fn render_vm(s: &mut String, variant: &str, m: &VmReport) {
    use std::fmt::Write;
    let opt = |x: Option<f64>, d: usize| x.map_or("-".to_string(), |x| format!("{x:.d$}"));
    let _ = writeln!(
        s,
        "  {:<14} {:<10} {:>10} {:>9} {:>8} {:>10.0} {:>9} {:>9} {:>7} {:>8.0} {:>8.0}",
        variant,
        m.name,
        if m.background {
            format!("bg {:.2}", m.work_rate)
        } else {
            format!("{:.2}{}", m.wall_ns as f64 / 1e6, if m.finished { "" } else { "+" })
        },
        opt(m.vs_native.map(|x| x.slowdown), 2),
        opt(m.speedup, 2),
        m.idle_transitions_per_s,
        m.exits.hlt,
        m.exits.ipi,
        opt(m.halt_poll.success_rate.map(|x| x * 100.0), 0),
        m.wake_latency.p50_us,
        m.wake_latency.p99_us
    );
    if let Some(r) = m.request_latency {
        let _ = writeln!(
            s,
            "  {:<14} {:<10} requests {}: latency p50 {:.0} us, p99 {:.0} us, mean {:.1} us",
            "", "", r.count, r.p50_us, r.p99_us, r.mean_us
        );
    }
}
