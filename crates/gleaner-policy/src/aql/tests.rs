use super::*;

const P30: u64 = 30_000_000;

fn approx(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

fn cache_counters(refs: u64, misses: u64, instr: u64) -> VcpuCounters {
    VcpuCounters {
        period_ns: P30,
        io_events: Some(0),
        spin_events: Some(0),
        llc_refs: Some(refs),
        llc_misses: Some(misses),
        instructions: Some(instr),
        run_ns: None,
    }
}

#[test]
fn equation_1_scales_then_saturates() {
    let l = Limits::default(); // 10_000 I/O per s, 5_000 spins per s
    let c = |io, spin| cursors(&VcpuCounters { period_ns: P30, io_events: Some(io), spin_events: Some(spin), ..Default::default() }, &l);
    // 150 I/O in 30 ms = 5000/s = half the limit.
    assert!(approx(c(150, 0).io_int.unwrap(), 50.0));
    assert!(approx(c(300, 0).io_int.unwrap(), 100.0));
    assert!(approx(c(10_000, 0).io_int.unwrap(), 100.0));
    assert!(approx(c(0, 75).con_spin.unwrap(), 50.0));
    assert!(approx(c(0, 0).con_spin.unwrap(), 0.0));
    // Rates, not counts: the same 5000/s over 60 ms gives the same cursor.
    let c60 = cursors(&VcpuCounters { period_ns: 2 * P30, io_events: Some(300), ..Default::default() }, &l);
    assert!(approx(c60.io_int.unwrap(), 50.0));
}

#[test]
fn equations_2_to_5_cache_cursors() {
    let l = Limits::default(); // RR limit 10 per kinstr, MR limit 3 per kinstr
                               // RR 5/k -> LoLCF 50; MR 0.6/k -> 80, capped by 100-50 -> LLCF 50; LLCO 0.
    let k = cursors(&cache_counters(5_000, 600, 1_000_000), &l).cache.unwrap();
    assert!(approx(k.lolcf, 50.0) && approx(k.llcf, 50.0) && approx(k.llco, 0.0), "{k:?}");
    // RR 20/k -> LoLCF 0; MR 0.3/k -> LLCF 90; LLCO 10.
    let k = cursors(&cache_counters(20_000, 300, 1_000_000), &l).cache.unwrap();
    assert!(approx(k.lolcf, 0.0) && approx(k.llcf, 90.0) && approx(k.llco, 10.0), "{k:?}");
    // MR above the limit -> LLCO 100.
    let k = cursors(&cache_counters(20_000, 5_000, 1_000_000), &l).cache.unwrap();
    assert!(approx(k.llcf, 0.0) && approx(k.llco, 100.0), "{k:?}");
    // No references -> pure LoLCF.
    let k = cursors(&cache_counters(0, 0, 1_000_000), &l).cache.unwrap();
    assert!(approx(k.lolcf, 100.0) && approx(k.llcf, 0.0) && approx(k.llco, 0.0), "{k:?}");
    // Equation 2 always holds.
    for (r, m) in [(1, 1), (9_000, 2_999), (10_000, 0), (123_456, 7_890), (3, 50_000)] {
        let k = cursors(&cache_counters(r, m, 1_000_000), &l).cache.unwrap();
        assert!(approx(k.lolcf + k.llcf + k.llco, 100.0), "{k:?}");
        assert!(k.lolcf >= 0.0 && k.llcf >= 0.0 && k.llco >= -1e-9, "{k:?}");
    }
}

#[test]
fn missing_sources_give_missing_cursors() {
    let l = Limits::default();
    let c = cursors(&VcpuCounters { period_ns: P30, io_events: Some(10), ..Default::default() }, &l);
    assert!(c.io_int.is_some() && c.con_spin.is_none() && c.cache.is_none());
    // Two of three LLC counters are not enough.
    let c = cursors(&VcpuCounters { period_ns: P30, llc_refs: Some(1), instructions: Some(10), ..Default::default() }, &l);
    assert!(c.cache.is_none());
    // A zero-length period gives nothing.
    assert_eq!(cursors(&VcpuCounters { io_events: Some(5), ..Default::default() }, &l), Cursors::default());
}

#[test]
fn window_of_four_decides_on_the_average() {
    let mut r = TypeRecognizer::new(4, Limits::default());
    let id = VcpuId { vm: 7, vcpu: 1 };
    let io = VcpuCounters { period_ns: P30, io_events: Some(300), spin_events: Some(0), ..Default::default() };
    let spin = VcpuCounters { period_ns: P30, io_events: Some(0), spin_events: Some(150), ..Default::default() };
    assert!(r.classify(id).is_none());
    for _ in 0..4 {
        r.observe(id, &io);
    }
    assert_eq!(r.classify(id).unwrap().class, VcpuClass::IoInt);
    r.observe(id, &spin);
    r.observe(id, &spin);
    // window: io io spin spin -> IOInt avg 50, ConSpin avg 50: tie goes to IOInt (paper order).
    let c = r.classify(id).unwrap();
    assert_eq!((c.class, c.periods), (VcpuClass::IoInt, 4));
    assert!(approx(c.averages.io_int.unwrap(), 50.0) && approx(c.averages.con_spin.unwrap(), 50.0));
    r.observe(id, &spin);
    assert_eq!(r.classify(id).unwrap().class, VcpuClass::ConSpin);
    // The oldest entries fell out of the window.
    r.observe(id, &spin);
    assert!(approx(r.classify(id).unwrap().averages.io_int.unwrap(), 0.0));
    r.forget(&id);
    assert!(r.classify(id).is_none());
}

#[test]
fn cache_types_and_trashing() {
    let mut r = TypeRecognizer::new(4, Limits::default());
    let llco = VcpuId { vm: 1, vcpu: 0 };
    let llcf = VcpuId { vm: 1, vcpu: 1 };
    let io_plus = VcpuId { vm: 1, vcpu: 2 };
    let lolcf = VcpuId { vm: 1, vcpu: 3 };
    r.observe(llco, &cache_counters(40_000, 20_000, 1_000_000));
    r.observe(llcf, &cache_counters(40_000, 100, 1_000_000));
    r.observe(lolcf, &cache_counters(100, 10, 1_000_000));
    let mut c = cache_counters(40_000, 20_000, 1_000_000);
    c.io_events = Some(1_000_000);
    r.observe(io_plus, &c);
    let get = |id| r.classify(id).unwrap();
    assert_eq!((get(llco).class, get(llco).trashing), (VcpuClass::Llco, true));
    assert_eq!((get(llcf).class, get(llcf).trashing), (VcpuClass::Llcf, false));
    assert_eq!((get(lolcf).class, get(lolcf).trashing), (VcpuClass::Lolcf, false));
    // IOInt+: I/O saturated and a thrashing cache profile. 100 vs LLCO 100: tie -> IOInt.
    assert_eq!((get(io_plus).class, get(io_plus).trashing), (VcpuClass::IoInt, true));
    assert!(get(llco).missing.is_empty());
}

#[test]
fn without_llc_counters_classify_from_what_exists() {
    let mut r = TypeRecognizer::new(4, Limits::default());
    let busy_io = VcpuId { vm: 1, vcpu: 0 };
    let quiet = VcpuId { vm: 1, vcpu: 1 };
    let nothing = VcpuId { vm: 1, vcpu: 2 };
    for _ in 0..4 {
        r.observe(busy_io, &VcpuCounters { period_ns: P30, io_events: Some(240), ..Default::default() });
        r.observe(quiet, &VcpuCounters { period_ns: P30, io_events: Some(30), ..Default::default() });
        r.observe(nothing, &VcpuCounters { period_ns: P30, ..Default::default() });
    }
    let c = r.classify(busy_io).unwrap();
    assert_eq!(c.class, VcpuClass::IoInt); // 80 > 100/3
    assert!(!c.trashing);
    assert_eq!(c.missing, vec![Source::SpinEvents, Source::LlcRefs, Source::LlcMisses, Source::Instructions]);
    assert!(c.averages.cache.is_none() && c.averages.con_spin.is_none());
    assert_eq!(r.classify(quiet).unwrap().class, VcpuClass::CpuBurn); // 10 <= 100/3
    assert_eq!(r.classify(nothing).unwrap().class, VcpuClass::Unknown);
}

#[test]
fn hysteresis_keeps_the_class_near_the_boundary() {
    let id = VcpuId { vm: 1, vcpu: 0 };
    let io = |n| VcpuCounters { period_ns: P30, io_events: Some(n), ..Default::default() };
    // 120 I/O per 30 ms = 40 (IOInt), 90 per 30 ms = 30 (CpuBurn: below 100/3).
    let mut plain = TypeRecognizer::new(1, Limits::default());
    let mut damped = TypeRecognizer::new(1, Limits::default()).with_hysteresis(10.0);
    let mut flips = (0, 0);
    let mut last = (None, None);
    for i in 0..20 {
        let c = io(if i % 2 == 0 { 120 } else { 90 });
        plain.observe(id, &c);
        damped.observe(id, &c);
        let (p, d) = (plain.classify(id).unwrap().class, damped.classify(id).unwrap().class);
        flips.0 += usize::from(last.0.is_some_and(|x| x != p));
        flips.1 += usize::from(last.1.is_some_and(|x| x != d));
        last = (Some(p), Some(d));
    }
    assert_eq!(flips, (19, 0));
    // A clear change still goes through: 300 per 30 ms = 100.
    damped.observe(id, &io(0));
    assert_eq!(damped.classify(id).unwrap().class, VcpuClass::CpuBurn);
    damped.observe(id, &io(300));
    assert_eq!(damped.classify(id).unwrap().class, VcpuClass::IoInt);
}

fn vcpus(vm: u64, n: u32, class: VcpuClass, trashing: bool) -> Vec<VcpuInfo> {
    (0..n).map(|i| VcpuInfo::new(VcpuId { vm, vcpu: i }, class, trashing)).collect()
}

fn figure3() -> (Vec<VcpuInfo>, Topology) {
    let mut v = Vec::new();
    v.extend(vcpus(1, 12, VcpuClass::Llco, true));
    v.extend(vcpus(2, 12, VcpuClass::IoInt, true)); // IOInt+
    v.extend(vcpus(3, 17, VcpuClass::Llcf, false));
    v.extend(vcpus(4, 7, VcpuClass::ConSpin, false)); // ConSpin-
                                                      // Four sockets of four pCPUs, the first reserved for dom0.
    let mut topo = Topology::uniform(4, 4);
    topo.sockets.remove(0);
    (v, topo)
}

fn count(plan: &Plan, pool: &Pool, class: VcpuClass) -> usize {
    pool.vcpus.iter().filter(|id| plan.assignment.iter().any(|a| a.vcpu == **id && a.class == class)).count()
}

#[test]
fn figure_3_example() {
    let (v, topo) = figure3();
    let plan = plan(&v, &topo, &Quanta::paper());
    let summary: Vec<String> = plan
        .pools
        .iter()
        .map(|p| {
            let mut parts = Vec::new();
            for c in [VcpuClass::IoInt, VcpuClass::ConSpin, VcpuClass::Llcf, VcpuClass::Llco] {
                let n = count(&plan, p, c);
                if n > 0 {
                    parts.push(format!("{n}{c}"));
                }
            }
            format!("{} {:?} [{}] {}", p.name, p.pcpus, parts.join(","), p.quantum_ns / 1_000_000)
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            // Socket 1: all 1ms-QLC (IOInt+ 1 ms, LLCO agnostic): a unique cluster.
            "s0-1ms [4, 5, 6, 7] [4IOInt,12LLCO] 1",
            // Socket 2: the last 8 trashing (IOInt+) and the first 8 non-trashing (LLCF).
            "s1-1ms [8, 9] [8IOInt] 1",
            "s1-90ms [10, 11] [8LLCF] 90",
            // Socket 3: 9 LLCF + 7 ConSpin-: 1 LLCF and 3 ConSpin form the default cluster.
            "s2-1ms [12] [4ConSpin] 1",
            "s2-90ms [14, 15] [8LLCF] 90",
            "s2-default [13] [3ConSpin,1LLCF] 30",
        ],
        "{summary:#?}"
    );
    // Each socket got exactly 16 vCPUs, each pCPU runs 4.
    for p in &plan.pools {
        assert_eq!(p.vcpus.len(), 4 * p.pcpus.len(), "{}", p.name);
    }
    assert_eq!(plan.assignment.len(), 48);
    for s in plan.vm_shares() {
        assert!(approx(s.pcpus, s.fair), "{s:?}");
    }
}

/// A small deterministic generator (no RNG crate in the policy).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u32) -> u32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        u32::try_from((self.0 >> 33) % u64::from(n)).expect("below n")
    }
}

#[test]
fn fairness_on_many_random_layouts() {
    let classes =
        [VcpuClass::IoInt, VcpuClass::ConSpin, VcpuClass::Llcf, VcpuClass::Lolcf, VcpuClass::Llco, VcpuClass::CpuBurn, VcpuClass::Unknown];
    let mut g = Lcg(42);
    for case in 0..500 {
        let sockets = 1 + g.next(4);
        let per = 1 + g.next(8);
        let topo = Topology::uniform(sockets, per);
        let vms = 1 + u64::from(g.next(6));
        let mut v = Vec::new();
        for vm in 0..vms {
            let n = 1 + g.next(12);
            for i in 0..n {
                let class = classes[g.next(7) as usize];
                let trashing = class == VcpuClass::Llco || (class.vcpu_type().is_some() && g.next(3) == 0);
                v.push(VcpuInfo::new(VcpuId { vm, vcpu: i }, class, trashing));
            }
        }
        let plan = plan(&v, &topo, &Quanta::paper());
        let ctx = format!("case {case}: {} vCPUs on {sockets}x{per}: {plan:#?}", v.len());
        // Every vCPU exactly once, pCPUs disjoint, each pool non-empty.
        assert_eq!(plan.assignment.len(), v.len(), "{ctx}");
        let mut seen: Vec<u32> = plan.pools.iter().flat_map(|p| p.pcpus.clone()).collect();
        let n_p = seen.len();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), n_p, "{ctx}");
        for p in &plan.pools {
            assert!(!p.pcpus.is_empty() && !p.vcpus.is_empty(), "{ctx}");
            assert!(p.pcpus.iter().all(|c| topo.sockets[p.socket].contains(c)), "{ctx}");
        }
        // Each pool runs floor(k)..=ceil(k) vCPUs per pCPU of its socket.
        let total_v = v.len();
        let total_p = topo.pcpus();
        let mut min_share = f64::INFINITY;
        let mut max_share: f64 = 0.0;
        for p in &plan.pools {
            let on_socket: usize = plan.pools.iter().filter(|q| q.socket == p.socket).map(|q| q.vcpus.len()).sum();
            let np = topo.sockets[p.socket].len();
            let (lo, hi) = (on_socket / np, on_socket.div_ceil(np));
            let share = (p.pcpus.len() as f64 / p.vcpus.len() as f64).min(1.0);
            min_share = min_share.min(share);
            max_share = max_share.max(share);
            if on_socket >= np {
                assert!(p.vcpus.len() >= lo * p.pcpus.len() && p.vcpus.len() <= hi * p.pcpus.len(), "{ctx}");
            }
        }
        // Per-VM share is within the rounding of k of its fair share.
        for s in plan.vm_shares() {
            let slack = s.vcpus as f64 * (max_share - min_share) + 1e-9;
            assert!((s.pcpus - s.fair).abs() <= slack.max(1e-9), "{ctx}\n{s:?}");
        }
        if total_v >= total_p {
            // Every pCPU is used.
            assert_eq!(n_p, total_p, "{ctx}");
        }
    }
}

#[test]
fn agnostic_only_and_fewer_vcpus_than_pcpus() {
    let topo = Topology::uniform(1, 4);
    let v = vcpus(1, 2, VcpuClass::Llco, true);
    let p = plan(&v, &topo, &Quanta::paper());
    assert_eq!(p.pools.len(), 1);
    assert_eq!((p.pools[0].quantum_ns, p.pools[0].pcpus.clone()), (30_000_000, vec![0, 1, 2, 3]));
    assert!(plan(&[], &topo, &Quanta::paper()).pools.is_empty());
}

#[test]
fn quanta_validation() {
    assert!(Quanta::paper().validate().is_ok());
    let mut q = Quanta::paper();
    q.llcf_ns = 120_000_000;
    assert_eq!(q.validate().unwrap_err().name, "llcf_ns");
    q = Quanta::paper();
    q.lolcf_ns = Some(50_000);
    assert!(q.validate().is_err());
}

#[test]
fn diff_between_plans() {
    let (v, topo) = figure3();
    let a = plan(&v, &topo, &Quanta::paper());
    assert!(a.diff(&a).is_empty());
    let from_nothing = a.diff(&Plan::default());
    assert_eq!(from_nothing.pools_added.len(), 6);
    assert_eq!(from_nothing.moves.len(), 48);
    assert!(from_nothing.moves.iter().all(|m| m.from.is_none() && m.to.is_some()));
    let to_nothing = Plan::default().diff(&a);
    assert_eq!(to_nothing.pools_removed.len(), 6);
    assert!(to_nothing.moves.iter().all(|m| m.to.is_none() && m.old_quantum_ns.is_some()));
    // Four ConSpin vCPUs turn LLCF: socket 3 becomes 13 LLCF + 3 ConSpin.
    let mut v2 = v.clone();
    for x in v2.iter_mut().filter(|x| x.id.vm == 4 && x.id.vcpu < 4) {
        x.class = VcpuClass::Llcf;
    }
    let b = plan(&v2, &topo, &Quanta::paper());
    let d = b.diff(&a);
    assert!(d.pools_added.is_empty(), "{d:#?}");
    // 3 ConSpin no longer fill a pCPU: they share pCPU 12 with one LLCF (default pool),
    // the 1 ms cluster disappears and the 12 other LLCF get three pCPUs.
    assert_eq!(d.pools_removed, vec!["s2-1ms".to_string()], "{d:#?}");
    let changed: Vec<&str> = d.pools_changed.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(changed, vec!["s2-90ms", "s2-default"], "{d:#?}");
    // Nothing on sockets 1 and 2 moves.
    assert!(d.moves.iter().all(|m| m.vcpu.vm >= 3), "{d:#?}");
    assert_eq!(b.pool("s2-90ms").unwrap().pcpus, vec![13, 14, 15]);
    assert_eq!(b.pool("s2-default").unwrap().pcpus, vec![12]);
    assert_eq!(b.pool("s2-default").unwrap().vcpus.len(), 4);
}
