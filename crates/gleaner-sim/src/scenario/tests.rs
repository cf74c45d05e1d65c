//! Scenario files: parsing, validation and costs.

// An agent record of schema `schema` holding `curve` (JSON): the one gleaner-measure's
// reader is tested on.
use gleaner_measure::testutil::{calibration_record as record, CALIBRATION_CURVE};

use std::path::{Path, PathBuf};

use gleaner_policy::num::saturating_u64;

use super::*;

const MIN: &str = "name = \"t\"\n[host]\npcpus = 4\n[[vm]]\nname = \"a\"\nvcpus = 4\nworkload = \"mutex\"\nscale = 0.1\n";

fn err_of(text: &str) -> BadInput {
    let e = parse(text, "test").expect_err("must be refused");
    e.chain().find_map(|c| c.downcast_ref::<BadInput>()).cloned().unwrap_or_else(|| panic!("not BadInput: {e:#}"))
}

#[test]
fn minimal_scenario_parses() {
    let s = parse(MIN, "test").expect("valid");
    assert_eq!(s.host.pcpus, 4);
    assert_eq!(s.variants()[0].name, "stock");
}

#[test]
fn unknown_key_is_named() {
    let b = err_of(&MIN.replace("pcpus = 4", "pcpus = 4\npcpu = 3"));
    assert!(b.value.contains("pcpu"), "{b}");
}

#[test]
fn the_host_scheduler_is_fair_unless_named_and_an_unknown_one_is_refused() {
    assert_eq!(parse(MIN, "test").expect("valid").host.scheduler, HostScheduler::Fair);
    let s = parse(&MIN.replace("pcpus = 4", "pcpus = 4\nscheduler = \"credit\""), "test").expect("valid");
    assert_eq!(s.host.scheduler, HostScheduler::Credit);
    let b = err_of(&MIN.replace("pcpus = 4", "pcpus = 4\nscheduler = \"xen\""));
    assert!(b.value.contains("xen") && b.value.contains("`credit`"), "{b}");
}

#[test]
fn zero_cpus_and_overpinning_are_refused() {
    assert_eq!(err_of(&MIN.replace("pcpus = 4", "pcpus = 0")).what, "host.pcpus");
    let b = err_of(&MIN.replace("pcpus = 4", "pcpus = 4\nslice_jitter_pm = 1001"));
    assert_eq!((b.what.as_str(), b.allowed.contains("per mille")), ("host.slice_jitter_pm", true), "{b}");
    let b = err_of(&MIN.replace("scale = 0.1", "scale = 0.1\npin = true").replace("vcpus = 4", "vcpus = 8"));
    assert_eq!(b.what, "vm.a.vcpus");
    assert!(b.allowed.contains("at most"));
}

/// Found with the `sim_scenario` fuzz target: `pin_offset = 4294967295` overflowed the pinning
/// check (a panic with overflow checks; without, `u32::MAX + 4` wrapped to 3 and passed, so
/// vCPUs were pinned to pCPUs that do not exist).
#[test]
fn pin_offset_near_u32_max_is_refused_not_wrapped() {
    let b = err_of(&MIN.replace("scale = 0.1", "scale = 0.1\npin = true\npin_offset = 4294967295"));
    assert_eq!((b.what.as_str(), b.value.as_str()), ("vm.a.vcpus", "4"));
    assert!(b.allowed.contains("pin_offset = 0"), "{b}");
}

#[test]
fn negative_cost_is_refused() {
    let b = err_of(&format!("{MIN}[costs.vm]\na_us = -1.0\nb_us = 1.0\nc_us = 2.0\nd_us = 3.0\n"));
    assert_eq!(b.what, "costs.vm.a_us");
}

#[test]
fn unknown_workload_lists_allowed() {
    let b = err_of(&MIN.replace("\"mutex\"", "\"nope\""));
    assert_eq!(b.what, "vm.a.workload");
    assert!(b.allowed.contains("dedup"));
}

#[test]
fn malformed_and_empty_files_are_bad_input() {
    let b = err_of("name = \"x\"\n[host\npcpus = 1");
    assert!(b.what.starts_with("scenario test"));
    let b = err_of("");
    assert!(b.value.contains("missing"), "{b}");
}

#[test]
fn costs_decompose_table2() {
    let c = Costs::from_table2(&CostsCfg::default().vm, 1.0, 2.0, 1.0);
    assert_eq!((c.rt, c.ipi, c.rv, c.yield_wake, c.pv), (6_000, 11_000, 20_000, 0, 59_000));
}

/// Under QEMU TCG a vCPU kept busy by a yielder wakes slower than a halted one (lab sample:
/// B 376 us, C 94 us): the decomposition must not turn that into a zero RV and an IPI that
/// every wake-up pays.
#[test]
fn costs_decompose_a_slow_busy_vcpu() {
    let t = Table2 { a_us: 46.0, b_us: 376.0, c_us: 94.0, d_us: 130.0 };
    let c = Costs::from_table2(&t, 1.0, 2.0, 1.0);
    assert_eq!((c.rt, c.ipi, c.rv, c.yield_wake, c.pv), (46_000, 48_000, 0, 282_000, 36_000));
    assert_eq!(c.rt + c.ipi + c.yield_wake, 376_000, "B");
    assert_eq!(c.rt + c.ipi + c.rv, 94_000, "C");
}

/// A `gleaner bench wakeup --json` document with these (setting, p50 us) results.
fn wakeup_doc(p50s: &[(&str, f64)]) -> String {
    let settings: Vec<String> = p50s
        .iter()
        .map(|(s, p50)| {
            format!(
                r#"{{"setting":"{s}","description":"","waker_cpu":0,"waiter_cpu":1,"samples":10,"mean_us":{},"p50_us":{p50},
                "p90_us":null,"p99_us":null,"min_us":null,"max_us":null,"discarded":0,"lost":0,"warmup":10,"samples_ns":[]}}"#,
                p50 + 1.0
            )
        })
        .collect();
    format!(
        r#"{{"kind":"wakeup","primitive":"condvar","rounds":10,"warmup":10,"period_us":500,"settings":[{}],
        "host":{{"kernel":"6.18","cpus":2,"allowed_cpus":"0-1","virtualized":true,"hypervisor":null,"cpuidle_driver":null,
        "cpuidle_governor":null,"git_revision":null,"date":"2026-12-01T00:00:00Z"}}}}"#,
        settings.join(",")
    )
}

#[test]
fn bench_json_valid_malformed_empty() {
    let j = wakeup_doc(&[("A", 4.0), ("B", 28.0), ("C", 50.0), ("D", 150.0)]);
    let t = table2_from_bench_json(&j, "x").expect("valid");
    assert_eq!((t.a_us, t.b_us, t.c_us, t.d_us), (4.0, 28.0, 50.0, 150.0));
    assert!(table2_from_bench_json("{not json", "x").is_err());
    let e = table2_from_bench_json("", "x").expect_err("empty");
    assert!(e.downcast_ref::<BadInput>().is_some());
    let e = table2_from_bench_json(&wakeup_doc(&[("A", 4.0), ("B", 28.0), ("C", 50.0)]), "x").expect_err("no D");
    assert!(e.to_string().contains("setting D is missing"), "{e}");
    // A document that is not `bench wakeup`'s is refused, naming the file.
    let e = table2_from_bench_json(r#"{"results":[{"setting":"A","p50_us":4}]}"#, "old.json").expect_err("not a WakeupDoc");
    let b = e.downcast_ref::<BadInput>().expect("bad input");
    assert!(b.value == "old.json" && b.allowed.contains("gleaner bench wakeup --json"), "{b}");
}

fn rv_costs(points: &[(u64, u64)]) -> Costs {
    let mut c = Costs::from_table2(&CostsCfg::default().vm, 1.0, 2.0, 1.0);
    c.rv_by_gap = points.iter().map(|&(gap_ns, rv_ns)| RvPoint { gap_ns, rv_ns }).collect();
    c
}

/// RV by gap: the points themselves, linear in log(gap) between them (log spacing: the
/// middle of 10 us..1 ms is 100 us, not 505 us), flat beyond the ends, any direction.
#[test]
fn rv_interpolates_in_log_gap_and_clamps_at_the_ends() {
    let c = rv_costs(&[(10_000, 2_000), (1_000_000, 22_000), (10_000_000, 42_000), (30_000_000, 30_000)]);
    assert_eq!(c.rv_at(10_000), 2_000);
    assert_eq!(c.rv_at(1_000_000), 22_000);
    assert_eq!(c.rv_at(10_000_000), 42_000);
    assert_eq!((c.rv_at(0), c.rv_at(9_999)), (2_000, 2_000), "flat below the first gap");
    assert_eq!(c.rv_at(u64::MAX), 30_000, "flat past the last gap");
    assert_eq!(c.rv_at(100_000), 12_000, "halfway in log(gap)");
    assert_eq!(c.rv_at(505_000), 12_000 + saturating_u64((10_000.0 * (5.05f64).ln() / 10f64.ln()).round()));
    assert_eq!(c.rv_at(3_162_278), 32_000, "sqrt(10) ms: halfway between 1 and 10 ms");
    let down = c.rv_at(17_320_508); // sqrt(300) ms: halfway from 10 to 30 ms, RV falling
    assert_eq!(down, 36_000);
    // Monotone between points with rising costs.
    let mut last = 0;
    for g in (10_000..10_000_000).step_by(9_973) {
        let rv = c.rv_at(g);
        assert!(rv >= last, "{g}: {rv} < {last}");
        last = rv;
    }
    // No curve: the constant RV at every gap (today's costs, unchanged).
    let flat = rv_costs(&[]);
    assert!([0, 10_000, 5_000_000, u64::MAX].iter().all(|&g| flat.rv_at(g) == flat.rv));
    let one = rv_costs(&[(50_000, 7_000)]);
    assert!([0, 50_000, u64::MAX].iter().all(|&g| one.rv_at(g) == 7_000));
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/calibration.json")
}

/// The fixture (an agent record of a haltpoll guest: C 20.4..60.1 us by gap, B 17.5 us,
/// P 6 us) becomes the VM column: RT = P, IPI = B - RT, RV(g) = C(g) - B, YW 0; PV and
/// the exit costs stay the scenario's.
#[test]
fn a_calibration_record_maps_to_the_vm_column() {
    let curve = read_calibration(&fixture()).expect("fixture");
    let base = Costs::from_table2(&CostsCfg::default().vm, 1.0, 2.0, 1.0);
    let c = Costs::from_calibration(&base, &curve);
    assert_eq!((c.rt, c.ipi, c.yield_wake, c.pv, c.ipi_send, c.poll_wake), (6_000, 11_500, 0, 59_000, 1_000, 2_000));
    let rv: Vec<(u64, u64)> = c.rv_by_gap.iter().map(|p| (p.gap_ns, p.rv_ns)).collect();
    assert_eq!(
        rv,
        vec![
            (10_000, 2_900),
            (30_000, 3_100),
            (100_000, 3_400),
            (300_000, 5_500),
            (1_000_000, 7_300),
            (3_000_000, 41_800),
            (10_000_000, 42_600)
        ]
    );
    assert_eq!(c.rv, 42_600, "the constant RV is the longest gap's");
    assert!(c.poll_state);
    // Each setting is restated: B = IPI + RT, C(g) = IPI + RV(g) + RT.
    assert_eq!(c.ipi + c.rt, curve.busy_ns);
    assert!(curve.halted.iter().all(|h| c.ipi + c.rv_at(h.gap_ns) + c.rt == h.p50_ns));
    // Through the scenario key: the report keeps the file and the record's curve.
    let sc = parse(&format!("{MIN}[costs]\ncalibration = {:?}\n", fixture().display().to_string()), "t").expect("valid");
    let r = sc.resolve_costs().expect("resolves");
    assert_eq!(r.vm, c);
    let used = r.calibration.expect("from the record");
    assert_eq!((used.file.as_path(), &used.curve), (fixture().as_path(), &curve));
    assert!(used.clamp_note().is_none());
    let line = used.describe(&r.vm);
    assert!(line.contains("calibration.json") && line.contains("RT = P 6.0 us") && line.contains("IPI = B - RT 11.5 us"), "{line}");
    assert!(!line.contains('\n'));
}

/// Without a POLL state RT stays the scenario's A; a halted wakeup cheaper than a busy one
/// clamps RV to 0 at that gap, and says so.
#[test]
fn a_calibration_without_poll_keeps_a_and_clamps_rv_at_zero() {
    let j = record(
        "3",
        r#"{"halted": [{"gap_ns": 10000, "mean_ns": 15000, "p50_ns": 14000},
        {"gap_ns": 1000000, "mean_ns": 40000, "p50_ns": 38000}], "busy_ns": 16000, "poll_ns": null}"#,
    );
    let curve = curve_from_calibration(&j, "x.json").expect("valid");
    let base = Costs::from_table2(&CostsCfg::default().vm, 1.0, 2.0, 1.0);
    let c = Costs::from_calibration(&base, &curve);
    assert_eq!((c.rt, c.ipi, c.rv_at(10_000), c.rv_at(1_000_000), c.poll_state), (6_000, 10_000, 0, 22_000, false));
    let used = CalibrationUse { file: "x.json".into(), curve, clamped_gaps_ns: vec![10_000] };
    let note = used.clamp_note().expect("a note");
    assert!(note.contains("x.json") && note.contains("10 us") && note.contains("clamped"), "{note}");
    assert!(used.describe(&c).contains("no POLL state"));
}

#[test]
fn bad_calibration_records_name_the_file_and_the_field() {
    let one = |e: anyhow::Error| {
        let b = e.chain().find_map(|c| c.downcast_ref::<BadInput>()).cloned().unwrap_or_else(|| panic!("not BadInput: {e:#}"));
        assert_eq!(format!("{e:#}").lines().count(), 1, "{e:#}");
        b
    };
    let b = one(read_calibration(Path::new("/nonexistent/calibration.json")).expect_err("missing"));
    assert_eq!((b.what.as_str(), b.value.as_str()), ("calibration record", "/nonexistent/calibration.json"));
    assert!(b.allowed.contains("a readable file"), "{b}");
    let b = one(curve_from_calibration("{not json", "c.json").expect_err("malformed"));
    assert_eq!(b.value, "c.json");
    assert!(b.allowed.contains("as the agent writes it"), "{b}");
    let curve = CALIBRATION_CURVE;
    for (text, what, value) in [
        (record("2", curve), "calibration record c.json field schema", "2"),
        (record("3", curve).replace("\"schema\": 3, ", ""), "calibration record c.json field schema", "missing"),
        ("[]".to_string(), "calibration record c.json field schema", "missing"),
        (record("3", "null"), "calibration record c.json", "invalid type: null"),
        (record("3", &curve.replace("\"busy_ns\": 17000, ", "")), "calibration record c.json", "missing field `busy_ns`"),
        (record("3", &curve.replace("17000", "-1")), "calibration record c.json", "invalid value"),
        (
            record("3", r#"{"halted": [], "busy_ns": 1, "poll_ns": null}"#),
            "calibration record c.json field results.curve.halted",
            "at least one",
        ),
    ] {
        let b = one(curve_from_calibration(&text, "c.json").expect_err(&text));
        assert_eq!(b.what, what, "{text}");
        assert!(b.value.contains(value), "{text}: {b}");
    }
    // Through a scenario: the same one line (the key is the file's).
    let sc = parse(&format!("{MIN}[costs]\ncalibration = \"/nonexistent/c.json\"\n"), "t").expect("the key parses");
    assert_eq!(one(sc.resolve_costs().expect_err("missing file")).what, "calibration record");
}

#[test]
fn kernel_polling_needs_the_planners_retention() {
    let text = |guest: &str, govern: bool| {
        format!("{MIN}[[variant]]\nname = \"g\"\nguest = \"{guest}\"\n[variant.gleaner]\ngovern = {govern}\nkernel_polling = true\n")
    };
    assert!(parse(&text("gleaner", true), "t").is_ok());
    assert!(parse(&text("retention", true), "t").is_ok());
    for (guest, govern) in [("stock", true), ("consolidation", true), ("haltpoll", true), ("gleaner", false)] {
        let b = err_of(&text(guest, govern));
        assert_eq!(b.what, "variant.g.gleaner.kernel_polling", "{guest} {govern}");
    }
}

/// The variant's guest is an [`IdlePolicy`]: `idle_poll` still reads as `poll`; a cap named
/// in the policy is the haltpoll cap, and naming another in `[variant.haltpoll]` is
/// refused; always-on yielders say how to model them.
#[test]
fn variant_guests_are_idle_policies() {
    let variant = |guest: &str, extra: &str| format!("{MIN}[[variant]]\nname = \"v\"\nguest = \"{guest}\"\n{extra}");
    let sc = parse(&variant("idle_poll", ""), "t").expect("the simulator's old name");
    assert_eq!(sc.variants[0].guest, IdlePolicy::Poll);
    let sc = parse(&variant("haltpoll:400us", ""), "t").expect("a cap");
    assert_eq!(sc.variants[0].haltpoll_params().guest_halt_poll_ns, 400_000);
    let sc = parse(&variant("haltpoll", "[variant.haltpoll]\nguest_halt_poll_ns = 50000\n"), "t").expect("the table's cap");
    assert_eq!(sc.variants[0].haltpoll_params().guest_halt_poll_ns, 50_000);
    let b = err_of(&variant("haltpoll:400us", "[variant.haltpoll]\nguest_halt_poll_ns = 50000\n"));
    assert_eq!(b.what, "variant.v.haltpoll.guest_halt_poll_ns");
    let b = err_of(&variant("yielders", ""));
    assert_eq!(b.what, "variant.v.guest");
    assert!(b.allowed.contains("govern = false"), "{b}");
    assert!(err_of(&variant("naiv", "")).value.contains("naiv"));
}

#[test]
fn overrides_and_cases() {
    let text = format!("{MIN}[[case]]\nname = \"two\"\nset = {{ \"host.pcpus\" = 2, \"vm.0.vcpus\" = 2 }}\n");
    let cases = expand_cases(&text, "t").expect("cases");
    assert_eq!(cases.len(), 1);
    assert_eq!(cases[0].1.host.pcpus, 2);
    assert_eq!(cases[0].1.vms[0].vcpus, 2);
    let bad_case = format!("{MIN}[[case]]\nname = \"x\"\nset = {{ \"vm.5.vcpus\" = 2 }}\n");
    assert!(expand_cases(&bad_case, "t").is_err());
}
