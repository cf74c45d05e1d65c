//! One guest loop, two adapters: the same readings through one `GuestController` give steps
//! that the agent's adapter (`IdleActuator`, writing the kernel's idle knobs under a sysfs
//! fixture) and the simulator's (`Engine::kernel_poll_apply`, through `gleaner_sim::knob_probe`)
//! must carry out alike, step by step: the haltpoll cap, the vCPUs polling until work,
//! shrinking, and whether each vCPU's own window was reset. The readings go through a
//! ping-pong, a quiet stretch, a saturated one (once moving bytes, so that the ladder probes
//! the yielders, under which both leave the kernel as found) and a light server, so that every
//! kind of change happens (checked at the end).

use std::fs;
use std::path::Path;
use std::time::{Duration, SystemTime};

use gleaner_agent::agent::apply::IdleActuator;
use gleaner_agent::knobs::KnobWriter;
use gleaner_agent::state::StateFile;
use gleaner_os::cpuset::CpuSet;
use gleaner_os::idle::IdleKnobs;
use gleaner_os::sysfs::Sysfs;
use gleaner_os::testutil::HaltpollSysfs;
use gleaner_policy::gleaner::{Snapshot, VcpuSample};
use gleaner_policy::guest::setup::{self, Offer, Prior, SetupInput};
use gleaner_policy::guest::{GuestController, GuestReading, StartConfig, VcpuIdle, WindowReset};
use gleaner_policy::idle::plan::ALWAYS;
use gleaner_policy::idle::{CurvePoint, IdlePlan, Log2Hist, Mechanism, PlanConfig, TraceSource, WakeCurve, WakeTrace};
use gleaner_policy::retention::{GovernorConfig, WorkloadIo};
use gleaner_sim::knob_probe::{KnobProbe, KnobView};

const PERIOD: u64 = 200_000_000;

/// What the agent's writes left under the fixture, in the simulator's terms. `switched`: the
/// cpuidle governor file was written since it was last stamped (a reset of every CPU's window).
fn agent_view(root: &Path) -> KnobView {
    let read = |p: &str| fs::read_to_string(root.join(p)).unwrap().trim().to_string();
    let hp = |k: &str| read(&format!("module/haltpoll/parameters/{k}"));
    let governor = root.join("devices/system/cpu/cpuidle/current_governor");
    let switched = fs::metadata(&governor).unwrap().modified().unwrap() > SystemTime::UNIX_EPOCH + Duration::from_secs(1);
    KnobView {
        cap_ns: hp("guest_halt_poll_ns").parse().unwrap(),
        always: (0..2).filter(|c| read(&format!("devices/system/cpu/cpu{c}/power/pm_qos_resume_latency_us")) == "n/a").collect(),
        shrink: hp("guest_halt_poll_allow_shrink") == "Y" && hp("guest_halt_poll_shrink") == "0",
        windows_reset: switched,
    }
}

fn stamp(root: &Path) {
    let f = fs::File::options().write(true).open(root.join("devices/system/cpu/cpuidle/current_governor")).unwrap();
    f.set_modified(SystemTime::UNIX_EPOCH).unwrap();
}

fn curve() -> WakeCurve {
    let pt = |g: u64, m: u64| CurvePoint { gap_ns: g * 1000, mean_ns: m * 1000, p50_ns: m * 1000 };
    WakeCurve::new(vec![pt(10, 49), pt(100, 46), pt(1000, 58), pt(10_000, 116)], 40_000, Some(7_000))
}

/// A period: each vCPU idle `idle` of it in `gaps` woken idle periods of `gap_ns`, the
/// workload making `sync` sync points, traced whole.
fn period(idle: [f64; 2], gaps: [u64; 2], gap_ns: [u64; 2], sync: u64, wake_ns: u64) -> GuestReading {
    let mut t = WakeTrace::empty(TraceSource::Bpf, [0, 1]);
    t.traced_ns = PERIOD;
    let mut vcpus = Vec::new();
    let mut idles = Vec::new();
    for c in 0..2 {
        let mut h = Log2Hist::default();
        h.record_n(gap_ns[c], gaps[c]);
        t.vcpus[c].woken = h;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // a share of a period
        let idle_ns = (PERIOD as f64 * idle[c]) as u64;
        let cpu = u32::try_from(c).unwrap();
        vcpus.push(VcpuSample { cpu, t_work_ns: PERIOD - idle_ns, t_yield_ns: 0, t_idle_ns: idle_ns, s_yield: gaps[c] });
        idles.push(VcpuIdle { cpu, idle_ns, entries: Some(gaps[c]), poll_ns: 0, yield_ns: 0, steal_ns: 0 });
    }
    t.latency.halt.record_n(wake_ns, sync);
    GuestReading {
        snapshot: Snapshot { period_ns: PERIOD, vcpus, s_work: sync, pinned: Vec::new() },
        idle: idles,
        trace: Some(t),
        caught: Vec::new(),
        io: WorkloadIo::default(),
        counter: None,
        agent_work_ns: 0,
        trace_missed: 0.0,
    }
}

#[test]
fn the_agents_and_the_simulators_adapters_carry_out_the_same_steps() {
    let d = tempfile::tempdir().unwrap();
    // A haltpoll guest as these VMs boot: cap 0, upstream grow/shrink, both CPUs with a POLL state.
    HaltpollSysfs::new().write(d.path());
    let knobs = IdleKnobs::with_roots(Sysfs::with_root(d.path()), d.path().join("mods"));
    let offer = knobs.offer(&CpuSet::parse("0-1").unwrap()).unwrap();
    let mut agent = IdleActuator::new(KnobWriter::new(knobs, offer));
    let mut journal = StateFile::create(&d.path().join("run"), 4242).unwrap();
    let mut sim = KnobProbe::new(2);

    let c = curve();
    let input = SetupInput {
        cpus: vec![0, 1],
        retention: true,
        fixed_yield_ns: None,
        curve: Ok(&c),
        offer: Some(Offer { kernel_polling: true, poll_window: true, poll_always: true }),
        kernel_polling: Ok(true),
        workload: true,
        governor: Some(GovernorConfig::default()),
        prior: Prior::Calibrated,
        plan: PlanConfig { vm_share: 1.0, ..PlanConfig::default() },
        start: StartConfig { trace_after_ns: 0, ..StartConfig::default() },
        consolidation: None,
        period_ns: PERIOD,
        priors: gleaner_policy::guest::LoopPriors::DEFAULT,
        curve_is_prior: false,
        yielders: setup::YielderStart::default(),
    };
    let mut g = GuestController::new(setup::decide(input).guest);

    // The start plan, as both adapters apply it before the workload runs.
    stamp(d.path());
    agent.apply(&mut journal, g.applied(), g.mode().is_on(), WindowReset::Keep).unwrap();
    let start = sim.apply(g.applied(), g.mode().is_on(), WindowReset::Keep);
    assert_eq!(agent_view(d.path()), start, "the start plan");
    assert_eq!(start.always, vec![0, 1], "the start polls until work");

    let pingpong = period([0.3, 0.3], [8_000, 8_000], [6_000, 6_000], 16_000, 30_000);
    let quiet = period([1.0, 1.0], [0, 0], [0, 0], 0, 0);
    let saturated = period([0.005, 0.005], [200, 200], [5_000, 5_000], 20_000, 30_000);
    let server = period([0.95, 0.9], [10, 200], [5_000_000, 5_000_000], 400, 60_000);
    // The server again with its vCPUs polling far more than the plan estimates: a stale window,
    // brought down by a shrink.
    let mut stale = server.clone();
    for v in &mut stale.idle {
        v.poll_ns = PERIOD * 9 / 10;
    }
    // Saturated with its work measured (bytes moved): the upper level is the yielders, probed
    // from the first periods, under which the kernel is as found.
    let mut moving = saturated.clone();
    moving.io = WorkloadIo { bytes: 100_000_000, calls: 200_000 };
    let phases = [(&pingpong, 12), (&quiet, 8), (&saturated, 10), (&server, 14), (&pingpong, 10), (&moving, 10), (&server, 6), (&stale, 6)];
    let mut seen = Vec::new();
    let mut yielded = 0;
    for (k, r) in phases.iter().flat_map(|(r, n)| std::iter::repeat_n(*r, *n)).enumerate() {
        let s = g.step(r);
        stamp(d.path());
        agent.apply(&mut journal, &s.plan, s.mode.is_on(), s.reset_poll_windows).unwrap();
        let a = agent_view(d.path());
        let b = sim.apply(&s.plan, s.mode.is_on(), s.reset_poll_windows);
        assert_eq!(a, b, "period {k}: the adapters disagree on {:?} ({:?}, reset {:?})", s.plan, s.mode, s.reset_poll_windows);
        if s.plan.vcpus.iter().any(|v| v.mechanism == Mechanism::Yield) {
            // Both adapters give the yielders their windows from the plan (`yield_window`).
            assert_eq!(s.plan, IdlePlan::yield_always([0, 1]), "period {k}");
            assert!((0..2).all(|c| s.plan.yield_window(c, s.mode.is_on()) == ALWAYS), "period {k}: {:?}", s.plan);
            assert_eq!((a.cap_ns, a.always.len()), (0, 0), "period {k}: the kernel as found under the yielders");
            yielded += 1;
        }
        seen.push((a, s.reset_poll_windows));
    }
    assert!(yielded > 0, "the yielders were probed on the saturated VM that moves bytes");
    // Every kind of change was carried out: a window, polling until work, the machine's own
    // settings, a shrink and a reset.
    assert!(seen.iter().any(|(v, _)| v.cap_ns > 0), "{seen:?}");
    assert!(seen.iter().any(|(v, _)| !v.always.is_empty()), "{seen:?}");
    assert!(seen.iter().any(|(v, _)| v.cap_ns == 0 && v.always.is_empty()), "{seen:?}");
    assert!(seen.iter().any(|(v, _)| v.windows_reset), "{seen:?}");
    assert!(seen.iter().any(|(_, r)| *r == WindowReset::Shrink), "{seen:?}");
}
