//! The engine on small fixtures.

use super::{ns_f64, round_at_least_1, Counters, Engine, Host, Idle, Ns, Vcpu, WindowReset, NONE};
use std::mem::{offset_of, size_of};

use crate::knob_probe::two_pcpu_engine;

/// A woken thread's vCPU: its previous one if idle, else the first idle one after it in the
/// VM's order, wrapping around; else the previous one; else (not allowed) the least loaded.
#[test]
fn a_woken_thread_takes_the_next_idle_vcpu_after_its_last_wrapping_around() {
    let mut e = two_pcpu_engine(4);
    e.threads[0].vcpu = 2;
    // (loads, allowed, the vCPU picked, why), thread 0 last on vCPU 2.
    let cases: [([u32; 4], [bool; 4], u32, &str); 6] = [
        ([1, 0, 1, 1], [true; 4], 1, "wraps around past the last vCPU"),
        ([0, 0, 1, 0], [true; 4], 3, "the next after the previous one first"),
        ([0, 0, 1, 0], [true, true, true, false], 0, "only allowed vCPUs"),
        ([1, 1, 0, 1], [true; 4], 2, "the previous one when idle"),
        ([2, 1, 3, 1], [true; 4], 2, "none idle: the previous one"),
        ([2, 1, 3, 1], [true, true, false, true], 1, "the previous one not allowed: the least loaded allowed"),
    ];
    for (load, allowed, want, why) in cases {
        e.vload = load.to_vec();
        e.allowed = allowed.to_vec();
        assert_eq!(e.select_vcpu(0), want, "{why}");
    }
}

/// Four always-runnable vCPUs stacked on one of two pCPUs (three queued behind a running
/// one, which only an idle pCPU would pull): a balancing pass leaves two on each.
#[test]
fn periodic_balancing_moves_queued_vcpus_to_the_lighter_pcpu() {
    let mut e = two_pcpu_engine(4);
    e.pcpus[0].cur = 0;
    e.vcpus[0].host = Host::Running(0);
    e.idle_pcpus = 0;
    for v in 1..4 {
        e.enqueue_on(0, v);
    }
    e.pcpus[1].cur = NONE;
    e.on_host_balance();
    let load = |e: &Engine, p: usize| e.pcpus[p].rq.len() + usize::from(e.pcpus[p].cur != NONE);
    assert_eq!((load(&e, 0), load(&e, 1)), (2, 2));
    assert_eq!(e.pcpus[1].rq, vec![1, 2], "the oldest queued vCPUs move");
    e.on_host_balance();
    assert_eq!(e.pcpus[1].rq, vec![1, 2], "a balanced host stays as it is");
}

/// The agent's kernel polling as applied: a lowered cap leaves each vCPU's own window (the
/// haltpoll governor shrinks it only after a long halt, and the agent turns that off); a
/// reset zeroes them and lets nothing poll for the governor switch; the machine's own
/// settings (a plan that retains nothing) zero them without that pause.
#[test]
fn a_lowered_poll_window_stays_until_a_reset_which_pauses_polling() {
    use gleaner_policy::idle::IdlePlan;
    let mut e = two_pcpu_engine(2);
    e.vms[0].kpoll = Some(super::KernelPolling { cap_ns: 0, always: vec![false; 2], reset_until: 0, shrink: false });
    e.now = 1_000_000_000;
    e.kernel_poll_apply(0, true, &IdlePlan::initial_poll([0, 1], 1_048_576), true, WindowReset::Keep);
    for v in 0..2 {
        e.vcpus[v].guest_poll_limit = 1_048_576; // grown to the cap
    }
    e.kernel_poll_apply(0, true, &IdlePlan::initial_poll([0, 1], 65_536), true, WindowReset::Keep);
    let limits = |e: &Engine| e.vcpus.iter().map(|v| v.guest_poll_limit).collect::<Vec<_>>();
    assert_eq!(limits(&e), vec![1_048_576; 2], "a lowered cap alone leaves the vCPUs' windows");
    assert_eq!(e.vms[0].kpoll.as_ref().map(|k| (k.cap_ns, k.reset_until)), Some((65_536, 0)));
    e.kernel_poll_apply(0, true, &IdlePlan::initial_poll([0, 1], 65_536), true, WindowReset::Switch);
    assert_eq!(limits(&e), vec![0; 2]);
    assert_eq!(e.vms[0].kpoll.as_ref().map(|k| k.reset_until), Some(1_000_000_000 + super::GOVERNOR_SWITCH_NS));
    for v in 0..2 {
        e.vcpus[v].guest_poll_limit = 65_536;
    }
    e.now += super::GOVERNOR_SWITCH_NS;
    e.kernel_poll_apply(0, true, &IdlePlan::halt([0, 1]), true, WindowReset::Keep);
    assert_eq!(limits(&e), vec![0; 2], "the machine's settings restored, windows reset");
    assert_eq!(e.vms[0].kpoll.as_ref().map(|k| (k.cap_ns, k.reset_until)), Some((0, 1_000_000_000 + super::GOVERNOR_SWITCH_NS)));
    // A cap already back at the stock 0 (vCPU 0 polled until work) restores nothing that
    // resets: the windows stay, unless the guest loop asks for the switch with the stock plan.
    let until_work = || {
        let mut p = IdlePlan::initial_poll([0, 1], 0);
        p.poll_always = vec![0];
        p
    };
    for reset in [WindowReset::Keep, WindowReset::Switch] {
        e.kernel_poll_apply(0, true, &until_work(), true, WindowReset::Keep);
        for v in 0..2 {
            e.vcpus[v].guest_poll_limit = 200_000; // grown under an earlier cap
        }
        e.kernel_poll_apply(0, true, &IdlePlan::halt([0, 1]), true, reset);
        let want = if reset == WindowReset::Switch { 0 } else { 200_000 };
        assert_eq!(limits(&e), vec![want; 2], "{reset:?}");
    }
}

/// A shrink (the agent's first answer to a stale window) pauses nothing: while it is on, a
/// vCPU's halt past the cap zeroes its own window and its next idle period inside the cap
/// grows it to the cap; the next apply turns it off, and a long halt then keeps the window.
#[test]
fn a_shrink_zeroes_a_window_at_its_next_long_halt_and_ends_at_the_next_apply() {
    use gleaner_policy::idle::IdlePlan;
    let mut e = two_pcpu_engine(2);
    e.vms[0].kpoll = Some(super::KernelPolling { cap_ns: 0, always: vec![false; 2], reset_until: 0, shrink: false });
    e.now = 1_000_000_000;
    e.kernel_poll_apply(0, true, &IdlePlan::initial_poll([0, 1], 65_536), true, WindowReset::Shrink);
    assert_eq!(e.vms[0].kpoll.as_ref().map(|k| (k.reset_until, k.shrink)), Some((0, true)));
    for v in 0..2 {
        e.vcpus[v].guest_poll_limit = 1_048_576; // stale: grown to an older cap
    }
    let idle = |e: &mut Engine, v: u32, ns: u64| {
        e.vcpus[v as usize].idle_since = e.now;
        e.now += ns;
        e.haltpoll_adjust(v);
    };
    idle(&mut e, 0, 500_000); // polled through: no halt, no change
    assert_eq!(e.vcpus[0].guest_poll_limit, 1_048_576);
    idle(&mut e, 0, 2_000_000); // halted past the cap
    assert_eq!(e.vcpus[0].guest_poll_limit, 0);
    idle(&mut e, 0, 20_000); // halted at once, inside the cap: grown to it
    assert_eq!(e.vcpus[0].guest_poll_limit, 65_536);
    e.kernel_poll_apply(0, true, &IdlePlan::initial_poll([0, 1], 65_536), true, WindowReset::Keep);
    assert_eq!(e.vms[0].kpoll.as_ref().map(|k| k.shrink), Some(false));
    idle(&mut e, 1, 2_000_000);
    assert_eq!(e.vcpus[1].guest_poll_limit, 1_048_576, "shrinking off: a long halt keeps the window");
}

/// The planner's curve is the model's: without an RV curve today's two flat points; with
/// one, a halted point per gap (`IPI + RV(g) + RT`, `+ PV` on shared pCPUs); the POLL
/// point `RT` only where the agent may poll.
#[test]
fn the_planners_curve_follows_the_costs() {
    use crate::scenario::{Costs, CostsCfg, RvPoint};
    let c = Costs::from_table2(&CostsCfg::default().vm, 1.0, 2.0, 1.0);
    let flat = super::model_curve(&c, false, false);
    let gaps: Vec<(u64, u64)> = flat.halted.iter().map(|p| (p.gap_ns, p.mean_ns)).collect();
    assert_eq!((gaps, flat.busy_ns, flat.poll_ns), (vec![(10_000, 37_000), (10_000_000, 37_000)], 17_000, None));
    let mut g = c.clone();
    g.rv_by_gap = vec![RvPoint { gap_ns: 50_000, rv_ns: 3_000 }, RvPoint { gap_ns: 3_000_000, rv_ns: 42_000 }];
    let curve = super::model_curve(&g, true, true);
    let pts: Vec<(u64, u64, u64)> = curve.halted.iter().map(|p| (p.gap_ns, p.mean_ns, p.p50_ns)).collect();
    assert_eq!(pts, vec![(50_000, 79_000, 79_000), (3_000_000, 118_000, 118_000)], "IPI 11 + RV + RT 6 + PV 59 us");
    assert_eq!((curve.busy_ns, curve.poll_ns), (17_000, Some(6_000)));
    assert!(curve.validate().is_ok());
}

#[test]
fn vcpu_hot_fields_share_cache_lines() {
    // Line 1: the per-event step; line 2: queue and host state; line 3: settle's counters.
    assert!(offset_of!(Vcpu, idle) + size_of::<Idle>() <= 64);
    assert!(offset_of!(Vcpu, rq) >= 64 && offset_of!(Vcpu, last_p) + 4 <= 128);
    assert_eq!(offset_of!(Vcpu, c), 128);
    assert!(offset_of!(Counters, hpoll_ns) + 8 <= 64);
    assert!(size_of::<Vcpu>() <= 7 * 64, "the yielder's detector stays out of line");
}

#[test]
fn the_llc_counts_follow_the_work_and_the_refills() {
    let cache = crate::workload::CacheProfile { refs_per_us: 20.0, miss_ratio: 0.05, wss_kb: 256.0, refill_ns_per_kb: 0.0 };
    // 2 ms of work: 40,000 references, 2,000 of them misses; 3 refills of 256 KiB at 16
    // references a KiB: 12,288 more, every one a miss.
    let c = Counters { work_ns: 2_000_000, refills: 3, ..Counters::default() };
    assert_eq!(c.llc(&cache), (52_288.0, 14_288.0));
    assert_eq!(Counters::default().llc(&cache), (0.0, 0.0));
}

#[test]
#[allow(clippy::cast_precision_loss)]
fn ns_f64_is_as() {
    for n in [0, 1, 2, 999, 1 << 52, (1 << 53) + 1, (1 << 63) - 1, 1 << 63, (1 << 63) + 12345, Ns::MAX] {
        assert_eq!(ns_f64(n).to_bits(), (n as f64).to_bits(), "n = {n}");
    }
}

#[test]
fn round_at_least_1_matches_the_float_expression() {
    let mut xs = vec![
        f64::NAN,
        f64::NEG_INFINITY,
        f64::INFINITY,
        -1e300,
        -3.5,
        -0.5,
        0.0,
        0.49999999999999994,
        0.5,
        0.9999999999999999,
        1.0,
        1.4999999999999998,
        1.5,
        2.5,
        3.5,
        1e15 + 0.5,
        4503599627370495.5,
        4503599627370496.0,
        9007199254740993.0,
        1.8446744073709552e19,
        1e30,
    ];
    let mut s: u64 = 1;
    for _ in 0..100_000 {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let m = (s >> 11) as f64 / (1u64 << 53) as f64;
        xs.push(m * 200_000.0 - 1000.0);
        xs.push((s >> 44) as f64 + 0.5);
    }
    for x in xs {
        assert_eq!(round_at_least_1(x), gleaner_policy::num::saturating_u64(x.round()).max(1), "x = {x:?}");
    }
}
