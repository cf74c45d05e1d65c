//! Event core and schedulers: small setups with exact or tightly bounded answers.

use gleaner_policy::IdlePolicy;
use gleaner_sim::engine::{Engine, HaltPoll, Outcome, Setup, SetupVm};
use gleaner_sim::policy::StockHost;
use gleaner_sim::scenario::{Costs, CostsCfg, RvPoint};
use gleaner_sim::workload::{CacheProfile, GroupCfg, WorkloadCfg};

fn wl(groups: Vec<GroupCfg>) -> WorkloadCfg {
    WorkloadCfg {
        description: String::new(),
        cache: CacheProfile { refill_ns_per_kb: 0.0, ..CacheProfile::default() },
        queue_capacity: 4,
        groups,
    }
}

fn group(name: &str, threads: u32, iterations: Option<u64>, pin: Vec<u32>, ops: &[&str]) -> GroupCfg {
    GroupCfg { name: name.into(), threads: Some(threads), iterations, pin, ops: ops.iter().map(|s| s.to_string()).collect() }
}

fn vm(name: &str, w: WorkloadCfg, vcpus: u32, pin: Option<u32>, background: bool, guest: IdlePolicy) -> SetupVm {
    SetupVm {
        name: name.into(),
        workload: w.resolve(name, vcpus, vcpus).expect("workload resolves"),
        vcpus,
        pin_offset: pin,
        background,
        guest,
        gleaner: Default::default(),
        haltpoll: Default::default(),
    }
}

fn costs() -> Costs {
    let c = CostsCfg::default();
    Costs::from_table2(&c.vm, c.ipi_send_us, c.poll_wake_us, c.ple_exit_us)
}

fn setup(pcpus: u32, vms: Vec<SetupVm>) -> Setup {
    Setup {
        pcpus,
        host_slice_ns: 3_000_000,
        slice_jitter_pm: 0,
        scheduler: Default::default(),
        wakeup_preemption: true,
        wakeup_gran_ns: 1_000_000,
        guest_slice_ns: 3_000_000,
        halt_poll: None,
        ple_window_ns: 20_000,
        balance_ns: None,
        guest_steal: true,
        virt: true,
        costs: costs(),
        vms,
        seed: 7,
        stop_at: None,
        max_ns: 10_000_000_000,
        host_policy: Box::new(StockHost),
    }
}

fn run(s: Setup) -> Outcome {
    Engine::new(s).run()
}

#[test]
fn lone_compute_thread_takes_exactly_its_work_plus_start_costs() {
    let w = wl(vec![group("g", 1, Some(10), vec![], &["compute 100us"])]);
    let o = run(setup(1, vec![vm("a", w, 1, None, false, IdlePolicy::Stock)]));
    assert!(o.finished);
    let c = costs();
    // resume of the initially halted vCPU (RV) + one thread switch (RT) + 10 x 100 us
    assert_eq!(o.vms[0].done_at, Some(c.rv + c.rt + 1_000_000));
    assert_eq!(o.vms[0].work_ns, 1_000_000);
}

#[test]
fn two_vcpus_share_one_pcpu_fairly() {
    let hog = || wl(vec![group("g", 1, None, vec![], &["compute 10ms"])]);
    let mut s = setup(1, vec![vm("a", hog(), 1, None, true, IdlePolicy::Stock), vm("b", hog(), 1, None, true, IdlePolicy::Stock)]);
    s.stop_at = Some(300_000_000);
    let o = run(s);
    let (a, b) = (o.vms[0].work_ns as f64, o.vms[1].work_ns as f64);
    assert!((a / b - 1.0).abs() < 0.05, "fair share: {a} vs {b}");
    assert!(a + b > 0.95 * 300e6, "the pCPU is never idle: {}", a + b);
}

#[test]
fn guest_round_robin_shares_a_vcpu() {
    let w = wl(vec![group("g", 2, None, vec![0], &["compute 1ms"])]);
    let mut s = setup(1, vec![vm("a", w, 1, None, true, IdlePolicy::Stock)]);
    s.stop_at = Some(60_000_000);
    let o = run(s);
    // 2 threads rotating every 3 ms guest slice: about 20 switches in 60 ms.
    assert!(o.vms[0].context_switches >= 15, "switches {}", o.vms[0].context_switches);
}

/// Ping-pong between two pinned threads: the wake-up latency is the composition of the costs.
fn pingpong(same_vcpu: bool, guest: IdlePolicy, hog: bool, halt_poll: bool) -> Outcome {
    let w = wl(vec![
        group("ping", 1, Some(200), vec![0], &["compute 50us", "signal ping", "wait pong"]),
        group("pong", 1, Some(200), vec![if same_vcpu { 0 } else { 1 }], &["wait ping", "compute 30us", "signal pong"]),
    ]);
    let mut vms = vec![vm("app", w, 2, Some(0), false, guest)];
    if hog {
        vms.push(vm("hog", wl(vec![group("g", 2, None, vec![], &["compute 10ms"])]), 2, Some(0), true, IdlePolicy::Stock));
    }
    let mut s = setup(2, vms);
    if halt_poll {
        s.halt_poll = Some(HaltPoll { max_ns: 200_000, grow: 2, grow_start: 10_000, shrink: 0 });
    }
    run(s)
}

#[test]
fn wakeup_costs_compose_as_in_table2() {
    let c = costs();
    let p50 = |o: &Outcome| o.vms[0].lat.summary().p50_us;
    let a = p50(&pingpong(true, IdlePolicy::Stock, false, false));
    let cc = p50(&pingpong(false, IdlePolicy::Stock, false, false));
    let d = p50(&pingpong(false, IdlePolicy::Stock, true, false));
    // 1 us histogram buckets: the p50 is rounded down to the microsecond.
    let us = |ns: u64| ns as f64 / 1000.0;
    assert!((a - us(c.rt)).abs() <= 1.0, "A {a}");
    assert!((cc - us(c.ipi + c.rv + c.rt)).abs() <= 1.0, "C {cc}");
    assert!((d - us(c.ipi + c.pv + c.rv + c.rt)).abs() <= 1.0, "D {d}");
}

#[test]
fn retention_keeps_the_vcpu_and_pays_only_the_ipi() {
    let c = costs();
    let o = pingpong(false, IdlePolicy::Retention, false, false);
    let b = o.vms[0].lat.summary().p50_us;
    // The agent's first period (a quarter of 10 ms) halts while it sees the workload (about
    // 15 wakeups per vCPU); then the planner's window (131 us) is longer than the idle periods
    // (at most 50 us), and every work period is longer than the idle threshold (20 us): no
    // more halts. (With work periods under the threshold the detector sees one long idle
    // stretch and lets the vCPU halt.)
    assert!((b - (c.ipi + c.rt) as f64 / 1000.0).abs() <= 1.0, "B {b}");
    assert!(o.vms[0].exits_hlt < 40, "the yielder keeps vCPUs from halting after the first period: {}", o.vms[0].exits_hlt);
    assert!(o.vms[0].yield_ns > 0);
}

/// Under QEMU TCG a vCPU running a yielder is the slower one to wake (B > C): yielding vCPUs
/// pay B, halted ones C, each from its own Table 2 value.
#[test]
fn a_slow_busy_vcpu_pays_b_and_a_halted_one_c() {
    let t = gleaner_sim::scenario::Table2 { a_us: 40.0, b_us: 400.0, c_us: 90.0, d_us: 90.0 };
    let c = Costs::from_table2(&t, 1.0, 2.0, 1.0);
    let p50 = |guest| {
        let w = wl(vec![
            group("ping", 1, Some(200), vec![0], &["compute 500us", "signal ping", "wait pong"]),
            group("pong", 1, Some(200), vec![1], &["wait ping", "compute 30us", "signal pong"]),
        ]);
        let mut s = setup(2, vec![vm("app", w, 2, Some(0), false, guest)]);
        s.costs = c.clone();
        s.vms[0].gleaner.retention.timeout_ns = 10_000_000_000;
        // Retention pinned on: this measures what a yielding vCPU pays. (Governed, retention
        // that is 4x slower to wake is a decisive loss and goes off within 9 periods.)
        s.vms[0].gleaner.govern = false;
        run(s).vms[0].lat.summary().p50_us
    };
    // 1 us histogram buckets: the p50 is rounded down to the microsecond.
    assert!((p50(IdlePolicy::Stock) - 90.0).abs() <= 1.0, "C");
    assert!((p50(IdlePolicy::Retention) - 400.0).abs() <= 1.0, "B");
}

/// A ping-pong whose ping sleeps `gap` before each signal (so both vCPUs halt about that
/// long), priced by a haltpoll guest's measured wake costs (C 20.4 us after 10 us idle .. 24.8
/// after 1 ms, 59.3 after 3 ms, 60.1 after 10 ms; B 17.5 us; RT 6 us: RV(g) = C(g) - B, IPI =
/// B - RT) or, `flat`, by the same costs without RV's gap curve.
fn sleepy_pingpong(gap: &str, flat: bool) -> Outcome {
    let mut c = costs();
    (c.rt, c.ipi, c.yield_wake) = (6_000, 11_500, 0);
    let c_by_gap = [
        (10_000, 20_400),
        (30_000, 20_600),
        (100_000, 20_900),
        (300_000, 23_000),
        (1_000_000, 24_800),
        (3_000_000, 59_300),
        (10_000_000, 60_100),
    ];
    if !flat {
        c.rv_by_gap = c_by_gap.iter().map(|&(gap_ns, c)| RvPoint { gap_ns, rv_ns: c - 17_500 }).collect();
    }
    c.rv = 60_100 - 17_500;
    let w = wl(vec![
        group("ping", 1, Some(100), vec![0], &[&format!("sleep {gap}"), "signal ping", "wait pong"]),
        group("pong", 1, Some(100), vec![1], &["wait ping", "compute 1us", "signal pong"]),
    ]);
    let mut s = setup(2, vec![vm("app", w, 2, Some(0), false, IdlePolicy::Stock)]);
    s.costs = c;
    run(s)
}

/// The host polls a halted vCPU for a while: with RV by gap, waking after a long idle period
/// costs more than after a short one, as the calibration measured (p50 20.7 us at 50 us,
/// 59.3 us at 3 ms); without the curve the gap changes nothing.
#[test]
fn a_halt_costs_more_after_a_longer_idle_gap() {
    let lat = |o: &Outcome| o.vms[0].lat.summary();
    let (short, long) = (sleepy_pingpong("50us", false), sleepy_pingpong("3ms", false));
    let (s, l) = (lat(&short), lat(&long));
    // Per round: the timer wakes ping after the sleep (RV + RT), ping wakes pong, idle about
    // as long (IPI + RV + RT: C), pong wakes ping, idle a few us (C at the shortest gaps).
    assert!((s.p50_us - 20.7).abs() <= 1.0, "short gaps: C(50 us) ~ 20.7 us: {s:?}");
    assert!(l.p50_us > s.p50_us + 20.0, "long gaps cost more: {s:?} vs {l:?}");
    assert!((l.max_us - 59.3).abs() <= 1.5, "pong woken after ~3 ms idle: C(3 ms) 59.3 us: {l:?}");
    let (fs, fl) = (lat(&sleepy_pingpong("50us", true)), lat(&sleepy_pingpong("3ms", true)));
    assert!((fs.p50_us - fl.p50_us).abs() <= 1.0 && (fs.max_us - fl.max_us).abs() <= 1.0, "flat: {fs:?} vs {fl:?}");
}

#[test]
fn kvm_halt_polling_catches_short_halts() {
    let o = pingpong(false, IdlePolicy::Stock, false, true);
    let v = &o.vms[0];
    assert!(v.halt_poll_attempts > 300, "attempts {}", v.halt_poll_attempts);
    let rate = v.halt_poll_successes as f64 / v.halt_poll_attempts as f64;
    assert!(rate > 0.9, "50 us halts fit in the grown window: {rate}");
    let c = costs();
    assert!(v.lat.summary().p50_us < (c.ipi + c.rv + c.rt) as f64 / 1000.0, "polling beats a full resume");
    // Next to a hog, KVM does not poll when another task wants the pCPU.
    let o = pingpong(false, IdlePolicy::Stock, true, true);
    let v = &o.vms[0];
    assert!(v.halt_poll_successes * 10 <= v.exits_hlt, "polls {} of {} halts", v.halt_poll_successes, v.exits_hlt);
}

#[test]
fn halt_poll_window_shrinks_on_long_halts() {
    // 1 ms sleeps: every halt is longer than halt_poll_ns, so the window resets to 0.
    let w = wl(vec![group("g", 1, Some(200), vec![], &["sleep 1ms", "compute 5us"])]);
    let mut s = setup(1, vec![vm("a", w, 1, None, false, IdlePolicy::Stock)]);
    s.halt_poll = Some(HaltPoll { max_ns: 200_000, grow: 2, grow_start: 10_000, shrink: 0 });
    let o = run(s);
    let v = &o.vms[0];
    assert_eq!(v.halt_poll_successes, 0);
    assert!(v.halt_poll_attempts <= v.exits_hlt / 2, "attempts {} halts {}", v.halt_poll_attempts, v.exits_hlt);
    assert_eq!(v.exits_timer, 200, "one TSC-deadline write per sleep");
}

#[test]
fn idle_poll_never_halts_and_costs_cpu() {
    let w = wl(vec![group("g", 2, Some(100), vec![], &["compute 20us", "lock m", "compute 20us", "unlock m", "sleep 50us"])]);
    let o = run(setup(2, vec![vm("a", w, 2, None, false, IdlePolicy::Poll)]));
    assert!(o.finished);
    let v = &o.vms[0];
    assert_eq!(v.exits_hlt, 0);
    assert!(v.guest_poll_ns > 0);
    assert!(v.run_ns as f64 > 1.8 * v.done_at.expect("done") as f64, "both vCPUs run all the time");
}

#[test]
fn mutex_and_queues_conserve_work() {
    let w = wl(vec![
        group("prod", 2, Some(300), vec![], &["compute 10us", "push q"]),
        group("cons", 3, None, vec![], &["pop q", "lock m", "compute 5us", "unlock m"]),
    ]);
    let o = run(setup(4, vec![vm("a", w, 4, None, false, IdlePolicy::Stock)]));
    assert!(o.finished, "consumers end when the queue closes");
    assert_eq!(o.vms[0].work_ns, 600 * 10_000 + 600 * 5_000);
}

#[test]
fn barrier_and_spin_barrier_release_everyone() {
    let w = wl(vec![group("g", 4, Some(50), vec![], &["compute 30us +-50%", "barrier b", "compute 10us", "spin_barrier s"])]);
    let o = run(setup(4, vec![vm("a", w, 4, None, false, IdlePolicy::Stock)]));
    assert!(o.finished);
    assert!(o.vms[0].spin_ns > 0);
    // Over-subscribed spin barrier: 4 threads on 2 vCPUs still finish (guest slices rotate).
    let w = wl(vec![group("g", 4, Some(5), vec![], &["compute 30us", "spin_barrier s"])]);
    let o = run(setup(2, vec![vm("a", w, 2, None, false, IdlePolicy::Stock)]));
    assert!(o.finished);
}

#[test]
fn spinning_vcpus_take_pause_loop_exits() {
    let w = wl(vec![group("g", 2, Some(20), vec![], &["compute 200us +-90%", "spin_barrier s"])]);
    let o = run(setup(2, vec![vm("a", w, 2, None, false, IdlePolicy::Stock)]));
    assert!(o.vms[0].exits_ple > 0);
}

#[test]
fn native_has_no_exits() {
    let w = wl(vec![group("g", 2, Some(100), vec![], &["compute 20us", "lock m", "compute 20us", "unlock m", "sleep 50us"])]);
    let mut s = setup(2, vec![vm("a", w, 2, Some(0), false, IdlePolicy::Stock)]);
    s.virt = false;
    let o = run(s);
    let v = &o.vms[0];
    assert!(o.finished);
    assert_eq!(v.exits_hlt + v.exits_ipi + v.exits_timer + v.exits_ple + v.exits_io, 0);
    assert!(v.idle_entries > 0);
}

#[test]
fn consolidation_shrinks_an_underused_vm() {
    // 8 threads taking turns on one mutex: about one vCPU of work spread over 8 vCPUs.
    let w = wl(vec![group("g", 8, Some(4000), vec![], &["compute 5us", "lock m", "compute 10us", "unlock m"])]);
    let o = run(setup(8, vec![vm("a", w, 8, None, false, IdlePolicy::Gleaner)]));
    assert!(o.finished);
    let v = &o.vms[0];
    assert!(v.gleaner_decisions > 0);
    assert!(v.gleaner_active_end.expect("controller") < 8, "active at end {:?}", v.gleaner_active_end);
}

#[test]
fn the_governor_keeps_retention_where_it_pays_and_drops_it_where_it_cannot() {
    // A barrier code alone on its pCPUs: retention saves every halted wakeup and pays.
    let barrier = |n| wl(vec![group("g", 4, Some(n), vec![], &["compute 60us +-20%", "barrier b"])]);
    // The idle planner plans a vCPU from 8 woken idle periods: at 40 ms periods it has enough.
    let app = |n| {
        let mut app = vm("app", barrier(n), 4, None, false, IdlePolicy::Retention);
        app.gleaner.period_ms = 40.0;
        app
    };
    let o = run(setup(4, vec![app(20_000)]));
    let r = o.vms[0].retention.expect("a governed retention variant");
    assert!(o.finished && r.periods > 20, "{r:?}");
    assert!(r.probes > 0, "{r:?}");
    assert_eq!(r.switches, 0, "{r:?}");
    assert!(r.on_periods * 10 > r.periods * 8, "retention on most of the run: {r:?}");
    assert!(o.vms[0].yield_ns > 0, "on means the planned windows yield: {r:?}");
    // The same next to a CPU hog on the shared pCPUs: its vCPUs meet steal, and a vCPU held
    // runnable takes turns the host charges to the VM (docs/agent.md, "On a host that shares
    // its pCPUs"): priced by that contention, the plan holds them far less.
    let hog = wl(vec![group("h", 4, None, vec![], &["compute 10ms"])]);
    let o = run(setup(4, vec![app(3000), vm("hog", hog, 4, None, true, IdlePolicy::Stock)]));
    assert!(o.finished);
    let yielding = |v: &gleaner_sim::stats::VmOutcome| v.yield_ns as f64 / (v.end_ns.max(1) * u64::from(v.vcpus)) as f64;
    let shared = yielding(&o.vms[0]);
    let alone_share = yielding(&run(setup(4, vec![app(3000)])).vms[0]);
    assert!(shared < 0.5 * alone_share, "yielding {shared:.3} of the vCPUs' time next to the hog, {alone_share:.3} alone");
    // A guest without a steal clock (TCG) sees none of the contention and holds them as its
    // calibration says.
    let hog = wl(vec![group("h", 4, None, vec![], &["compute 10ms"])]);
    let mut blind = setup(4, vec![app(3000), vm("hog", hog, 4, None, true, IdlePolicy::Stock)]);
    blind.guest_steal = false;
    let blind = yielding(&run(blind).vms[0]);
    assert!(blind > 0.5 * alone_share, "yielding {blind:.3} without a steal clock, {alone_share:.3} alone");
    // Long compute bursts with few sync points: nothing for retention to speed up. The
    // planner sees too few wakeups to give any vCPU a window (or the governor turns retention
    // off): the yielders take almost nothing.
    let coarse = wl(vec![group("g", 4, Some(60), vec![], &["compute 5ms +-50%", "barrier b"])]);
    let o = run(setup(4, vec![vm("app", coarse, 4, None, false, IdlePolicy::Retention)]));
    let v = &o.vms[0];
    assert!(v.retention.is_some(), "a governed retention variant");
    let vcpu_ns = v.end_ns * u64::from(v.vcpus);
    assert!(v.yield_ns * 100 < vcpu_ns, "yielders took {} of {} ns: {:?}", v.yield_ns, vcpu_ns, v.retention);
}

#[test]
fn an_ungoverned_fixed_timeout_is_the_old_retention() {
    // `govern = false` and `adapt = false`: no governor record, the configured timeout.
    let w = wl(vec![group("g", 4, Some(500), vec![], &["compute 60us", "barrier b"])]);
    let mut app = vm("app", w, 4, None, false, IdlePolicy::Retention);
    app.gleaner.govern = false;
    app.gleaner.retention.adapt = false;
    let o = run(setup(4, vec![app]));
    assert!(o.finished);
    assert!(o.vms[0].retention.is_none());
}

/// An open loop: a sender on vCPU 0 pushes requests at Poisson arrivals, a server on vCPU 1
/// answers each after `work`, a receiver on vCPU 0 records the request latency.
fn openloop(rate: u32, requests: u64, guest: IdlePolicy) -> Outcome {
    let arrive = format!("arrive {rate}/s");
    let mut w = wl(vec![
        group("sender", 1, Some(requests), vec![0], &[&arrive, "push requests"]),
        group("server", 1, None, vec![1], &["pop requests", "compute 5us", "push replies"]),
        group("receiver", 1, None, vec![0], &["pop replies", "compute 500ns", "record"]),
    ]);
    w.queue_capacity = 1_000_000;
    run(setup(2, vec![vm("app", w, 2, Some(0), false, guest)]))
}

#[test]
fn an_open_loop_records_every_request_from_its_scheduled_arrival() {
    let c = costs();
    let o = openloop(1000, 2000, IdlePolicy::Stock);
    let r = o.vms[0].req.summary();
    assert_eq!(r.count, 2000, "every request answered once");
    // Poisson arrivals at 1000/s: 2000 requests take about 2 s (sd of the sum ~ 45 ms).
    let wall_s = o.vms[0].wall_ns() as f64 / 1e9;
    assert!((1.85..2.15).contains(&wall_s), "2000 arrivals at 1000/s took {wall_s} s");
    // Alone at 1000/s every hop wakes a halted vCPU: the sender's timer (a halted vCPU, no
    // IPI), the server (an IPI to a halted vCPU), the receiver (the same), plus 5.5 us of work.
    let us = |ns: u64| ns as f64 / 1000.0;
    let expect = us(c.rv + c.rt) + 2.0 * us(c.ipi + c.rv + c.rt) + 5.5;
    assert!((r.p50_us - expect).abs() <= 3.0, "p50 {} expected about {expect}", r.p50_us);
    // The wake-up latency histogram holds the hops, not the requests.
    assert!(o.vms[0].lat.summary().count >= 2 * 2000);
}

#[test]
fn idle_poll_shortens_the_open_loop_to_its_work() {
    let stock = openloop(2000, 2000, IdlePolicy::Stock).vms[0].req.summary();
    let poll = openloop(2000, 2000, IdlePolicy::Poll).vms[0].req.summary();
    assert!(poll.p50_us * 3.0 < stock.p50_us, "idle=poll {} vs stock {}", poll.p50_us, stock.p50_us);
    // No IPIs and no halts: the work (5.5 us) and three guest thread switches.
    assert!(poll.p50_us < 5.5 + 3.0 * costs().rt as f64 / 1000.0 + 1.0, "idle=poll p50 {}", poll.p50_us);
}

#[test]
fn a_closed_loop_stamps_and_records_on_one_thread() {
    let w = wl(vec![
        group("client", 1, Some(300), vec![0], &["stamp", "compute 1us", "signal ping", "wait pong", "record"]),
        group("server", 1, Some(300), vec![1], &["wait ping", "compute 1us", "signal pong"]),
    ]);
    let o = run(setup(2, vec![vm("app", w, 2, Some(0), false, IdlePolicy::Stock)]));
    let r = o.vms[0].req.summary();
    assert_eq!(r.count, 300);
    // A round trip: the client's 1 us, two wakes of a halted vCPU, the server's 1 us.
    let c = costs();
    let expect = 2.0 + 2.0 * (c.ipi + c.rv + c.rt) as f64 / 1000.0;
    assert!((r.p50_us - expect).abs() <= 3.0, "round trip p50 {} expected about {expect}", r.p50_us);
}

#[test]
fn a_workload_without_records_reports_no_request_latency() {
    let w =
        wl(vec![group("p", 1, Some(100), vec![], &["compute 10us", "push q"]), group("c", 1, None, vec![], &["pop q", "compute 10us"])]);
    let o = run(setup(2, vec![vm("app", w, 2, Some(0), false, IdlePolicy::Stock)]));
    assert_eq!(o.vms[0].req.summary().count, 0);
}

/// A sleeper's lateness: the time from its scheduled arrival to running, on a vCPU that halts
/// (stock) or polls (idle=poll), with injected interrupts free (Table 2's world) or costing
/// `irq` (a calibrated one: the host delivers a guest timer as it delivers an IPI).
fn timer_lateness(guest: IdlePolicy, irq: u64) -> f64 {
    let w = wl(vec![group("sleeper", 1, Some(300), vec![0], &["arrive 1000/s", "record"])]);
    let mut s = setup(1, vec![vm("app", w, 1, Some(0), false, guest)]);
    s.costs.irq = irq;
    run(s).vms[0].req.summary().p50_us
}

#[test]
fn a_timer_reaches_the_guest_through_the_host_where_the_costs_say_so() {
    let c = costs();
    let us = |ns: u64| ns as f64 / 1000.0;
    let close = |got: f64, want: f64| assert!((got - want).abs() <= 1.5, "got {got} want {want}");
    // Halted: the resume (RV) and the switch (RT); polling: the switch alone.
    close(timer_lateness(IdlePolicy::Stock, 0), us(c.rv + c.rt));
    close(timer_lateness(IdlePolicy::Poll, 0), us(c.rt));
    // Through the host: the interrupt's latency first, whatever the vCPU was doing.
    close(timer_lateness(IdlePolicy::Stock, 25_000), 25.0 + us(c.rv + c.rt));
    close(timer_lateness(IdlePolicy::Poll, 25_000), 25.0 + us(c.rt));
}
