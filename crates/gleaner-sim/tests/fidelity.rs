//! Fidelity against the papers, on the built-in scenarios (tolerances stated per test), plus
//! determinism and bad input. docs/sim.md has the side-by-side tables.

use gleaner_sim::runner::{CaseReport, Report};
use gleaner_sim::stats::spearman;
use gleaner_sim::{load_scenario, run_text, sweep_text, SCENARIOS};

fn run(name: &str) -> Report {
    let (n, text) = load_scenario(name).expect("built-in");
    run_text(&n, &text, None, false).expect("runs")
}

fn case<'a>(r: &'a Report, name: &str) -> &'a CaseReport {
    r.cases.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("case {name}"))
}

/// Table 2: A < B < C < D in the VM, each within 10% of the paper's 6/17/37/96 us (the costs are
/// calibrated from that table, so this checks that the engine composes them on the right paths).
#[test]
fn table2_ordering_and_values() {
    let r = run("table2");
    let p50 = |c: &str| case(&r, c).variants[0].vms[0].wake_latency.p50_us;
    let (a, b, c, d) = (p50("A"), p50("B"), p50("C"), p50("D"));
    assert!(a < b && b < c && c < d, "A {a} B {b} C {c} D {d}");
    for (got, want) in [(a, 6.0), (b, 17.0), (c, 37.0), (d, 96.0)] {
        assert!((got - want).abs() <= 0.1 * want + 1.0, "got {got} want {want}");
    }
    let native = |c: &str| case(&r, c).native[0].wake_latency.p50_us;
    assert!(native("A") < native("C"), "PM: same core is cheaper");
    assert!(native("C") < c, "VM is slower than PM");
}

/// `scripts/sim/table2-hosts.toml`'s text.
fn table2_hosts() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/sim/table2-hosts.toml");
    std::fs::read_to_string(path).expect("scripts/sim/table2-hosts.toml")
}

/// The first variant's first VM's wake-up latency in case `c`.
fn lat(r: &Report, c: &str) -> gleaner_sim::stats::LatencySummary {
    case(r, c).variants[0].vms[0].wake_latency
}

/// Table 2's D and E on an EEVDF-like host (`scripts/sim/table2-hosts.toml`: no wakeup
/// granularity, a 4 ms tick's slices drawn +-50%, a round every 1 ms as `gleaner bench wakeup`
/// runs them): a vCPU kept from halting next to a co-runner waits for its turn, half the time
/// off its pCPU for half a slice on average (this VM's kernel, HZ=250, `bench wakeup --setting
/// E`: mean 901-914 us, p99 3.9-4.0 ms, 3 runs), far longer than a halted one that is woken and
/// placed (D). With slices of one fixed length the pCPUs stay in step, and so do the two
/// vCPUs: the built-in table2's E (a closed ping-pong) never waits.
#[test]
fn on_an_eevdf_host_a_retained_vcpu_waits_for_its_turn() {
    let text = table2_hosts();
    let r = run_text("table2-hosts", &text, None, false).expect("runs");
    let (d, e, lockstep) = (lat(&r, "D"), lat(&r, "E"), lat(&r, "E-lockstep"));
    let slice_us = 4000.0;
    assert!(e.mean_us > 5.0 * d.mean_us, "E {} us against D {} us", e.mean_us, d.mean_us);
    assert!((0.125..=0.3).contains(&(e.mean_us / slice_us)), "E's mean {} us against a {slice_us} us slice", e.mean_us);
    assert!(e.p99_us >= slice_us * 0.75, "E's p99 {} us", e.p99_us);
    assert!(lockstep.mean_us < e.mean_us / 2.0, "in step {} us against drifting {} us", lockstep.mean_us, e.mean_us);
    let closed = lat(&run("table2"), "E");
    assert!(closed.p99_us < 100.0, "table2's E in step: p99 {} us", closed.p99_us);
}

/// Table 2's D and E on Xen's credit scheduler (`scripts/sim/table2-hosts.toml`, 30 ms slices):
/// the halted vCPU wakes BOOSTed and takes its pCPU from the co-runner, after at most the 1 ms
/// rate limit (the co-runner got the pCPU when the waiter halted, less than a 1 ms round
/// before); the retained one is never boosted and waits for the co-runner's slice, which
/// here is 30 ms. On the fair host without wakeup preemption D would wait as E does, so D's
/// figure is the boost's.
#[test]
fn on_a_credit_host_a_woken_vcpu_is_boosted_and_a_retained_one_waits_for_a_slice() {
    let text = table2_hosts();
    let r = run_text("table2-hosts", &text, None, false).expect("runs");
    let (d, e) = (lat(&r, "D-credit"), lat(&r, "E-credit"));
    assert!(d.p99_us <= 1100.0, "D on credit: p99 {} us, more than the rate limit and a wake", d.p99_us);
    // ... and the rate limit binds: the co-runner keeps the pCPU it got under 1 ms before.
    assert!(d.p99_us >= 500.0, "D on credit: p99 {} us, as if there were no rate limit", d.p99_us);
    assert!(d.p50_us <= 1.1 * lat(&r, "D").p50_us, "D on credit: p50 {} us against fair's {}", d.p50_us, lat(&r, "D").p50_us);
    assert!(e.p99_us >= 10_000.0, "E on credit: p99 {} us, not a co-runner's 30 ms slice", e.p99_us);
    // The same D on the fair host with wakeup preemption off: the woken vCPU waits its turn.
    let off = text.replace("wakeup_granularity_us = 0.0", "wakeup_granularity_us = 0.0\nwakeup_preemption = false");
    let r = run_text("table2-hosts", &off, None, false).expect("runs");
    let (fair, credit) = (lat(&r, "D"), lat(&r, "D-credit"));
    assert!(fair.mean_us > 2.0 * credit.mean_us, "without preemption fair D {} us, credit D {} us", fair.mean_us, credit.mean_us);
}

/// Table 1: dedup's slowdown against native grows with vCPUs (1 -> 4 -> 16, strictly), and is
/// worse next to an equal-sized VM (more than 1.25x the dedicated wall time next to
/// streamcluster and 1.4x next to matmul; the paper has 1.7-3.9x and 4.8-12.3x), with matmul
/// worse than streamcluster at 16 vCPUs as in the paper.
#[test]
fn table1_trend() {
    let r = run("table1");
    let slow = |c: &str| case(&r, c).variants[0].vms[0].vs_native.expect("native baseline").slowdown;
    let wall = |c: &str| case(&r, c).variants[0].vms[0].wall_ns as f64;
    let (d1, d4, d16) = (slow("dedicated-1"), slow("dedicated-4"), slow("dedicated-16"));
    assert!(d1 < d4 && d4 < d16, "dedicated: {d1} {d4} {d16}");
    assert!(d1 < 1.1, "one vCPU barely suffers: {d1}");
    for n in [4, 16] {
        for other in ["streamcluster", "matmul"] {
            let ratio = wall(&format!("{other}-{n}")) / wall(&format!("dedicated-{n}"));
            let min = if other == "matmul" { 1.4 } else { 1.25 };
            assert!(ratio > min, "{other}-{n} vs dedicated: {ratio}");
        }
    }
    assert!(wall("matmul-16") > wall("streamcluster-16"));
}

/// Figure 1: over the built-in workloads, slowdown next to matmul (setting D) rises with the
/// frequency of idle transitions measured alone (setting C): Spearman > 0.7.
#[test]
fn fig1_correlation() {
    let r = run("fig1");
    let mut x = Vec::new();
    let mut y = Vec::new();
    for c in r.cases.iter().filter(|c| c.name.starts_with("C-")) {
        let w = &c.name[2..];
        let alone = &c.variants[0].vms[0];
        let d = case(&r, &format!("D-{w}"));
        x.push(alone.idle_transitions_per_s);
        y.push(d.variants[0].vms[0].vs_native.expect("native").slowdown);
    }
    let rho = spearman(&x, &y).expect("defined");
    assert!(rho > 0.7, "Spearman {rho}: x {x:?} y {y:?}");
}

/// Figure 7: on an oversubscribed host Gleaner speeds up the barrier-heavy workload by a large
/// factor (>= 1.5x here; the paper reports up to 16x), never slows a workload down by more than
/// 5%, and the weighted speedup stays within [0.8, 1.5] (paper: 0.7-1.4, mean 1.02).
#[test]
fn fig7_shape() {
    let r = run("fig7");
    // The paper's Gleaner, and today's agent at its own 200 ms period (docs/sim.md: the agent
    // at 10 ms loses; that variant is shown, not held to the shape). The agent's retention is
    // priced by the steal its VM meets here, and its consolidation measures every vCPU before
    // a step and judges each against them: it is held to issue 45's floor, 0.98x of stock.
    for variant in ["gleaner", "agent"] {
        for c in &r.cases {
            let g = c.variants.iter().find(|v| v.name == variant).expect("variant");
            let s = g.vms[0].speedup.expect("finished");
            let floor = if variant == "agent" { 0.98 } else { 0.95 };
            assert!(s >= floor, "{variant} {}: speedup {s}", c.name);
            let w = g.weighted_speedup.expect("weighted");
            assert!((0.8..=1.5).contains(&w), "{variant} {}: weighted speedup {w}", c.name);
        }
    }
    let sc = case(&r, "streamcluster").variants[1].vms[0].speedup.expect("speedup");
    assert!(sc >= 1.5, "streamcluster speedup {sc}");
}

#[test]
fn same_seed_gives_byte_identical_json_and_seeds_matter() {
    let (n, text) = load_scenario("fig7").expect("built-in");
    let a = serde_json::to_string(&run_text(&n, &text, Some(3), false).expect("a")).expect("json");
    let b = serde_json::to_string(&run_text(&n, &text, Some(3), false).expect("b")).expect("json");
    assert_eq!(a, b);
    let c = serde_json::to_string(&run_text(&n, &text, Some(4), false).expect("c")).expect("json");
    assert_ne!(a, c, "the seed drives the compute-time jitter");
    assert!(!a.contains("events_per_sec"), "no wall-clock numbers without timing");
    let t = run_text(&n, &text, Some(3), true).expect("timed");
    assert!(t.perf.expect("perf").events > 0);
}

#[test]
fn aql_host_policy_runs_and_changes_slices() {
    let r = run("aql");
    let aql = r.cases[0].variants.iter().find(|v| v.name == "aql").expect("aql variant");
    assert!(aql.host_plans > 0, "AQL applied plans");
    assert!(aql.vms[0].finished);
    // Regression: the spin-barrier VM was typed LoLCF, put in the 90 ms pool with the hog and
    // ran 27x slower than with the fixed slice. Typed ConSpin it gets a 1 ms pool of its own.
    let stock = r.cases[0].variants.iter().find(|v| v.name == "stock").expect("stock variant");
    let (a, s) = (aql.vms[0].wall_ns as f64, stock.vms[0].wall_ns as f64);
    assert!(a < s / 1.5, "AQL spin VM {a} ns should beat the fixed slice {s} ns by 1.5x");
}

/// The `scale` scenario's descriptions (`gleaner sim --list`'s and the file's) count the
/// threads each VM's pipeline has as the scenario builds them (1 + 3 x 85 + 1).
#[test]
fn the_scale_scenarios_descriptions_count_the_threads_it_builds() {
    let (n, text) = load_scenario("scale").expect("built-in");
    let sc = gleaner_sim::scenario::parse(&text, &n).expect("valid");
    let listed = SCENARIOS.iter().find(|(name, _, _)| *name == "scale").expect("listed").1;
    assert_eq!(sc.vms.len(), 4, "{listed}");
    for vm in &sc.vms {
        let threads: u32 = sc.workload_of(vm).expect("resolves").groups.iter().map(|g| g.threads).sum();
        assert_eq!(threads, 257, "{}", vm.name);
        for d in [listed, sc.description.as_str()] {
            assert!(d.contains(&format!("x {threads} pipeline threads")), "{} builds {threads} threads: {d}", vm.name);
        }
    }
}

fn bad(text: &str) -> gleaner_policy::input::BadInput {
    let e = run_text("t", text, None, false).expect_err("refused");
    e.chain().find_map(|c| c.downcast_ref::<gleaner_policy::input::BadInput>()).cloned().unwrap_or_else(|| panic!("{e:#}"))
}

#[test]
fn bad_input_names_the_key() {
    let ok = "name = \"t\"\n[host]\npcpus = 2\n[[vm]]\nname = \"a\"\nvcpus = 2\nworkload = \"mutex\"\nscale = 0.01\n";
    assert!(run_text("t", ok, None, false).is_ok());
    assert!(bad(&ok.replace("[host]", "[host]\nbogus = 1")).value.contains("bogus"));
    assert_eq!(bad(&ok.replace("pcpus = 2", "pcpus = 0")).what, "host.pcpus");
    assert_eq!(bad(&ok.replace("scale = 0.01", "scale = 0.01\npin = true").replace("vcpus = 2", "vcpus = 3")).what, "vm.a.vcpus");
    assert_eq!(bad(&format!("{ok}[costs]\nple_exit_us = -1.0\n")).what, "costs.ple_exit_us");
    let forever = ok.replace("\"mutex\"", "\"w\"") + "[workload.w]\n[[workload.w.group]]\nname = \"g\"\nops = [\"compute 1ms\"]\n";
    assert_eq!(bad(&forever).what, "vm.a.background");
    assert!(bad("this is not toml").what.starts_with("scenario"));
    assert!(load_scenario("no-such-scenario").is_err());
    assert!(sweep_text(ok, &["host.pcpus".into()]).is_err());
    let swept = sweep_text(ok, &["host.pcpus+vm.0.vcpus=1,2".into()]).expect("sweep");
    let r = run_text("t", &swept, None, false).expect("runs");
    assert_eq!(r.cases.len(), 2);
    assert_eq!(r.cases[0].pcpus, 1);
}

/// Figure 6 under the host agent's damping (`scripts/sim/aql-damping.toml`: decide every window,
/// confirm changes, recognizer hysteresis 10). When the host confirmed whole plans, one
/// quantum-agnostic vCPU placed differently at every decision kept the ConSpin VM out of the
/// 1 ms pool for good (S1 weighted speedup 0.83, ConSpin 0.62). Confirmed per vCPU, a change
/// towards a shorter quantum at once, the ConSpin VM gains in every case that has one, as in
/// the paper's rule, and the mix does not lose.
#[test]
fn figure6_shape_holds_with_the_host_agents_damping() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/sim/aql-damping.toml");
    let text = std::fs::read_to_string(path).expect("scripts/sim/aql-damping.toml");
    let r = run_text(path, &text, None, false).expect("runs");
    for c in &r.cases {
        let host = c.variants.iter().find(|v| v.name == "aql-host").expect("aql-host variant");
        let w = host.weighted_speedup.expect("weighted");
        assert!(w >= 0.95, "{}: weighted speedup {w} with the host's damping", c.name);
        if let Some(spin) = host.vms.iter().find(|v| v.name == "conspin") {
            let s = spin.speedup.expect("speedup");
            assert!(s >= 2.0, "{}: ConSpin speedup {s} with the host's damping", c.name);
        }
    }
}

fn fixture(name: &str) -> String {
    format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A calibration record that restates Table 2's VM column (C 37 us at every gap, B 17 us, no
/// POLL state, so RT stays A) gives the same runs as the column itself: the curve, the RV it
/// gives at every gap and the planner's curve change nothing where they say the same. Only
/// the report's costs section tells them apart.
#[test]
fn a_calibration_restating_table2_changes_nothing() {
    let file = fixture("calibration-table2.json");
    for name in ["table2", "idle-policies", "fig7"] {
        let (n, text) = load_scenario(name).expect("built-in");
        let plain = run_text(&n, &text, None, false).expect("runs");
        let cases = gleaner_sim::cli_cases(&n, &text, Some(std::path::Path::new(&file))).expect("the record is valid");
        let mut cal = gleaner_sim::run_cases(&cases[0].1.name, &cases[0].1.description, &cases, plain.seed, false).expect("runs");
        for c in &mut cal.cases {
            let costs = c.costs.take().expect("the costs section names the record");
            assert_eq!(costs.calibration.file.to_str(), Some(file.as_str()));
            assert_eq!((costs.vm.rt, costs.vm.ipi, costs.vm.rv, costs.vm.yield_wake), (6_000, 11_000, 20_000, 0));
        }
        let json = |r: &Report| serde_json::to_string(r).expect("json");
        assert!(json(&cal) == json(&plain), "{name}: a calibration restating Table 2 changed the runs");
    }
}

/// A Gleaner VM on the calibration fixture's costs (C 20.4-60.1 us by gap, B 17.5 us, P 6 us)
/// polls in the kernel by default: the planner picks kernel polling for the built-in
/// ping-pong, and a polled wakeup costs P (no IPI) where a halted one costs C. With kernel
/// polling off the same agent has only its yielders.
#[test]
fn the_agent_polls_in_the_kernel_where_a_calibration_offers_it() {
    let text = format!(
        "name = \"kp\"\nnative = false\n[host]\npcpus = 2\n[[vm]]\nname = \"pp\"\nvcpus = 2\nworkload = \"pingpong\"\npin = true\n\
         [[variant]]\nname = \"stock\"\nhost_halt_poll = false\n\
         [[variant]]\nname = \"gleaner\"\nguest = \"gleaner\"\nhost_halt_poll = false\n\
         [[variant]]\nname = \"yielders\"\nguest = \"gleaner\"\nhost_halt_poll = false\n[variant.gleaner]\nkernel_polling = false\n\
         [costs]\ncalibration = {:?}\n",
        fixture("calibration.json")
    );
    let r = run_text("kp", &text, None, false).expect("runs");
    let vm = |v: &str| &r.cases[0].variants.iter().find(|x| x.name == v).expect("variant").vms[0];
    let (stock, polled, yielders) = (vm("stock"), vm("gleaner"), vm("yielders"));
    assert!(stock.finished && polled.finished && yielders.finished);
    // Stock: every wakeup is a halted one, after ~50 us (pong) or a few us (ping): C ~ 20.5 us.
    assert!((stock.wake_latency.p50_us - 20.5).abs() <= 1.5, "stock {:?}", stock.wake_latency);
    // The first period (2.5 ms) polls the kernel's upstream 200 us window; the planner's plan
    // polls from then on: far more polling than that period could hold, almost no halts, and
    // the wakeups cost P.
    assert!(polled.guest_poll_ns > 20 * 2_500_000, "polled {} ns", polled.guest_poll_ns);
    assert_eq!(polled.yield_ns, 0, "no yielding threads where the kernel polls");
    assert!(polled.exits.hlt * 20 < stock.exits.hlt, "halts: {} vs stock {}", polled.exits.hlt, stock.exits.hlt);
    assert!(polled.wake_latency.p50_us <= 6.0 + 1.0, "a polled wakeup costs P: {:?}", polled.wake_latency);
    assert!(polled.wall_ns < stock.wall_ns, "and the ping-pong runs faster: {} vs {}", polled.wall_ns, stock.wall_ns);
    let g = polled.retention.expect("the governor");
    assert!(g.on_periods * 10 >= g.periods * 8, "retention (polling) on most periods: {g:?}");
    // Off: the agent has its yielders only and never polls.
    assert_eq!(yielders.guest_poll_ns, 0);
    assert!(yielders.wake_latency.p50_us > polled.wake_latency.p50_us + 5.0, "{:?}", yielders.wake_latency);
}

/// The open-loop kernel pins its threads apart (sender and receiver on vCPU 0, server on vCPU
/// 1): the agent (`keep_pinned`, its default) leaves such a workload on every vCPU, while the
/// paper's cpuset (`keep_pinned = false`) moves pinned threads too, as Linux does when a cpuset
/// no longer meets a thread's own affinity: a light open loop on a Gleaner VM that polls (the
/// calibration fixture's costs) then ends on one vCPU, with every request answered and the
/// cross-vCPU wakeups (IPIs) gone after the first periods.
#[test]
fn pinned_threads_keep_their_vcpus_unless_the_paper_s_cpuset_moves_them() {
    let (n, text) = load_scenario("vm-matrix").expect("built-in");
    let mut cases = gleaner_sim::cli_cases(&n, &text, Some(std::path::Path::new(&fixture("calibration.json")))).expect("valid");
    cases.retain(|(name, _)| name == "openloop-200");
    let mut paper = cases[0].1.variants.iter().find(|v| v.name == "gleaner").expect("a gleaner variant").clone();
    paper.name = "gleaner-moves-pins".into();
    paper.gleaner.params.keep_pinned = false;
    cases[0].1.variants.push(paper);
    let r = gleaner_sim::run_cases("vm-matrix", "", &cases, 1, false).expect("runs");
    let vm = |v: &str| &r.cases[0].variants.iter().find(|x| x.name == v).expect("variant").vms[0];
    let (stock, kept, moved) = (vm("stock"), vm("gleaner"), vm("gleaner-moves-pins"));
    assert_eq!(kept.gleaner_active_vcpus_at_end, Some(2), "the pinned workload keeps both vCPUs: {kept:?}");
    assert_eq!(moved.gleaner_active_vcpus_at_end, Some(1), "the paper's cpuset consolidates it: {moved:?}");
    for v in [kept, moved] {
        assert_eq!(v.request_latency.expect("records").count, 2000, "every request answered");
    }
    // Stock pays two IPIs a request (server and receiver on other vCPUs); consolidated, the
    // three threads share vCPU 0 and wake each other without one (its plan polls a window
    // on these costs, so the 5 ms gaps still end in halts: faster, not by a fixed factor).
    assert!(moved.exits.ipi * 10 < stock.exits.ipi, "IPIs {} vs stock {}", moved.exits.ipi, stock.exits.ipi);
    let (s, g) = (stock.request_latency.expect("stock").p50_us, moved.request_latency.expect("gleaner").p50_us);
    assert!(g < s, "one polling vCPU answers faster: p50 {g} vs stock {s}");
}

/// The model against this development VM's own measurements (docs/sim.md, "Predicting the real
/// VM"; the documents and the calibration record are kept in docs/data): at least the 21 of 30
/// ratios to stock within 25% it had when they were taken, among them every p50 of the
/// ping-pong and of the open loop at 200 and 2,000 requests/s.
#[test]
fn vm_matrix_predicts_the_stored_measurements_of_the_development_vm() {
    let dir = std::path::PathBuf::from(format!("{}/../../docs/data/current/vm-matrix/vm1", env!("CARGO_MANIFEST_DIR")));
    let args = gleaner_sim::PredictArgs {
        measured: Some(dir.clone()),
        from_calibration: Some(dir.join("calibration.json")),
        seed: None,
        json: true,
    };
    let p = gleaner_sim::run_predict(&args).expect("predicts");
    assert_eq!(p.compared, 30, "every ratio measured: {p:?}");
    assert!(p.within >= 21, "{} of 30 within 25%:\n{}", p.within, gleaner_sim::predict::render(&p));
    for r in p.rows.iter().filter(|r| {
        r.metric == gleaner_sim::predict::Ratio::LatencyP50 && ["pingpong", "openloop-200", "openloop-2000"].contains(&r.case.as_str())
    }) {
        assert_eq!(r.within_tolerance, Some(true), "{r:?}");
    }
}

/// `scripts/sim/vm-matrix-scale.toml` (vm-matrix's latency kernels at 16 and 64 vCPUs, alone and
/// next to a matmul VM) parses into its eight cases and every case runs to the end; on the
/// Table 2 costs, guest haltpoll answers the ping-pong pairs faster than stock alone, as on the
/// 2-vCPU VM.
#[test]
fn the_scaled_vm_matrix_runs() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/sim/vm-matrix-scale.toml");
    let text = std::fs::read_to_string(path).expect("scripts/sim/vm-matrix-scale.toml");
    let cases = gleaner_sim::scenario::expand_cases(&text, "vm-matrix-scale").expect("parses");
    assert_eq!(cases.len(), 8);
    let small: Vec<_> = cases.into_iter().filter(|(n, _)| n == "pp-16").collect();
    let r = gleaner_sim::run_cases("vm-matrix-scale", "", &small, 1, false).expect("runs");
    let p50 = |v: &str| {
        let vm = &r.cases[0].variants.iter().find(|x| x.name == v).expect("variant").vms[0];
        assert!(vm.finished, "{v} finished");
        vm.request_latency.expect("records").p50_us
    };
    assert!(p50("haltpoll") * 2.0 < p50("stock"), "haltpoll {} vs stock {}", p50("haltpoll"), p50("stock"));
}
