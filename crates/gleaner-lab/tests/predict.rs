//! `gleaner lab predict`: the simulator configured from lab results. Fixtures (trimmed from a
//! `gleaner lab matrix --quick` run under TCG): `fixtures/oc-condvar-freqsleep.results.json`
//! (one cell with its runs) and `fixtures/matrix-old/matrix.json` (a matrix.json as written
//! before `halt_poll` was written once, without the cell's results.json).

use std::path::{Path, PathBuf};

use gleaner_agent::config::AgentConfig;
use gleaner_bench::workload::Workload;
use gleaner_lab::predict::input::{self, LabCell};
use gleaner_lab::predict::model::{self, HostSched, ModelOptions, WakeStat};
use gleaner_lab::predict::{predict, report};
use gleaner_lab::results::{HaltPoll, Instance, RowMode};
use gleaner_os::BadInput;
use gleaner_policy::retention::{RetentionMode, RetentionVerdict};
use gleaner_policy::IdlePolicy;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn cell() -> LabCell {
    let mut cells = input::load(&fixture("oc-condvar-freqsleep.results.json")).expect("fixture loads");
    assert_eq!(cells.len(), 1);
    cells.remove(0)
}

/// The host of the lab machine, fixed so the tests do not depend on the machine running them.
fn opts(jitter_pct: f64) -> ModelOptions {
    ModelOptions { host: HostSched::default_for(2, 250), wake_stat: WakeStat::P50, jitter_pct }
}

fn bad_input(e: &anyhow::Error) -> BadInput {
    e.chain().find_map(|c| c.downcast_ref::<BadInput>()).cloned().unwrap_or_else(|| panic!("not BadInput: {e:#}"))
}

#[test]
fn a_results_file_becomes_a_cell_with_the_guests_kernel_and_costs() {
    let c = cell();
    assert_eq!((c.name.as_str(), c.pcpus, c.vcpus, c.accel), ("oc-condvar-freqsleep", 2, 2, gleaner_qemu::Accel::Tcg));
    assert_eq!(c.workload.workload, Workload::Condvar);
    // `--threads` absent: the kernel's default on the guest's 2 vCPUs.
    assert_eq!((c.workload.params.threads, c.workload.params.items, c.workload.params.work_us), (2, 4000, 80.2));
    let co = c.co_runner.as_ref().expect("oc has a co-runner");
    assert_eq!((co.workload, co.params.threads, co.params.items), (Workload::Freqsleep, 2, 900));
    assert_eq!(c.passes.len(), 1, "one halt-poll setting");
    let pass = &c.passes[0];
    let modes: Vec<String> = pass.modes.iter().map(|m| m.summary.mode.to_string()).collect();
    assert_eq!(modes, ["consolidation", "stock", "yielders"]);
    assert_eq!(pass.halt_poll, HaltPoll::NotApplicable);
    assert!(pass.vm_a.iter().all(|r| r.ok() && r.instance == Instance::A) && !pass.vm_a.is_empty());
    assert!(pass.co_runner.iter().all(|r| r.ok() && r.mode == RowMode::CoRunner) && !pass.co_runner.is_empty());
    assert!(c.wake_alone().is_some() && c.wake_with_co_runner(HaltPoll::NotApplicable).is_some());

    // Table 2 from the sizing guest (alone): A, B, C medians; D adds the median extra of C
    // next to the co-runner.
    let costs = model::choose_costs(std::slice::from_ref(&c), HaltPoll::NotApplicable, WakeStat::P50).expect("costs");
    let t = costs.table2;
    assert_eq!((t.a_us, t.b_us, t.c_us), (36.225, 57.955, 76.83500000000001));
    assert!((t.d_us - 89.675).abs() < 1e-9, "D = C + (89.675 - 76.835): {}", t.d_us);
    assert_eq!(costs.costs_ns.yield_wake, 0, "B < C here: the busy vCPU is the faster to wake");
}

#[test]
fn the_scenario_has_the_labs_host_vms_kernel_and_co_runner() {
    let c = cell();
    let costs = model::choose_costs(std::slice::from_ref(&c), HaltPoll::NotApplicable, WakeStat::P50).unwrap();
    let (a, per_item) = model::kernel_workload(&c.workload, 80_200, 30_000, 0.0).unwrap();
    assert_eq!(per_item, 2.0, "put and take");
    let names: Vec<&str> = a.groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["producer0", "consumer0"]);
    assert_eq!(a.groups[0].ops, ["compute 80200ns", "push mailbox0", "compute 30000ns"]);
    assert_eq!(a.groups[0].iterations, Some(4000));
    assert_eq!(a.queue_capacity, 1, "a one-slot mailbox");

    let m = model::co_runner_model(&c.passes[0], c.co_runner.as_ref().unwrap(), costs.table2.a_us);
    assert!(m.iterations >= 3 && m.startup_cpu_us > m.kernel_cpu_us, "start-up dominates the lab's freqsleep loop: {m:?}");
    let b = model::co_runner_workload(&m, c.vcpus, 0.0);
    assert_eq!(b.groups.len(), 2, "one pinned sleeper per vCPU");
    assert_eq!(b.groups[1].pin, [1]);
    assert_eq!(b.groups[0].ops.iter().filter(|o| o.starts_with("sleep")).count(), 450);

    let plan = model::agent_plan(&c, &c.passes[0]);
    let variants = vec![
        model::variant_for("stock", IdlePolicy::Stock, &plan, false),
        model::variant_for("yielders", IdlePolicy::Yielders, &plan, false),
    ];
    let host = model::host_cfg(c.pcpus, &HostSched::default_for(2, 250));
    assert_eq!((host.pcpus, host.slice_us, host.wakeup_granularity_us), (2, 4000.0, 0.0));
    let sc = model::scenario(&c.name, host, c.vcpus, a, Some(b), &costs.table2, variants);
    sc.validate().expect("a valid simulator scenario");
    assert_eq!(sc.vms.len(), 2);
    assert!(!sc.vms[0].background && sc.vms[1].background);
    assert_eq!(sc.baseline.as_deref(), Some("stock"));
    // It is a scenario file like any other: `gleaner sim` can run what `--scenarios` writes.
    let text = toml::to_string(&sc).unwrap();
    gleaner_sim::scenario::parse(&text, "written").expect("the written scenario parses back");
}

#[test]
fn the_sizing_fit_reproduces_the_guests_synchronization_cpu() {
    let c = cell();
    let costs = model::choose_costs(std::slice::from_ref(&c), HaltPoll::NotApplicable, WakeStat::P50).unwrap();
    let fit = model::fit_sync(&c, &HostSched::default_for(2, 250), &costs.table2).unwrap();
    let target = fit.measured_us_per_item.expect("the fixture has a sizing");
    assert!((fit.simulated_us_per_item - target).abs() <= 0.02 * target, "{fit:?}");
    assert!(fit.sync_op_us > 0.0 && fit.simulated_without_us_per_item < target, "{fit:?}");
}

#[test]
fn every_lab_policy_maps_to_a_simulator_variant() {
    let cfg = AgentConfig::default();
    let c = cell();
    let plan = model::agent_plan(&c, &c.passes[0]);
    let guest = |p| model::variant_for(p, p.parse::<IdlePolicy>().unwrap(), &plan, false).guest;
    for (p, sim) in [
        ("stock", IdlePolicy::Stock),
        ("yielders", IdlePolicy::Retention),
        ("idle-poll", IdlePolicy::Poll),
        ("haltpoll", IdlePolicy::HALTPOLL),
        ("retention", IdlePolicy::Retention),
        ("consolidation", IdlePolicy::Consolidation),
        ("gleaner", IdlePolicy::Gleaner),
    ] {
        assert_eq!(guest(p), sim, "{p}");
    }
    let y = model::variant_for("yielders", IdlePolicy::Yielders, &plan, false);
    assert!(y.gleaner.retention.timeout_ns >= 3_600_000_000_000, "naive yielders never time out");
    assert!(y.gleaner.agent.is_none() && !y.gleaner.govern);
    // The agent's policies run the agent's own guest loop configuration, at its period.
    let g = model::variant_for("gleaner", IdlePolicy::Gleaner, &plan, true);
    assert_eq!(g.gleaner.agent, plan.guest, "the agent's own configuration");
    assert_eq!(g.gleaner.period_ms, cfg.period_ms as f64, "the agent's period");
    assert!(g.host_halt_poll);
    assert!(model::variant_for("consolidation", IdlePolicy::Consolidation, &plan, false).gleaner.agent.is_none());
    // The fixture's agent measured B 181 us > C 90 us next to VM B: nothing to hide. The agent
    // starts retention off (the governor probes it) and plans from the lab's flat curve.
    assert_eq!((plan.retention, plan.verdict), (false, Some(RetentionVerdict::NoHaltPenalty)));
    let gc = plan.guest.as_ref().expect("a curve to plan from");
    assert_eq!(gc.prior, RetentionMode::Off);
    assert!(gc.means.yielders && gc.curve.as_ref().is_some_and(|c| c.busy_ns.abs_diff(181_000) < 1_000), "{gc:?}");
    assert!(plan.why.contains("B p50 181 us and C p50 90 us"), "{}", plan.why);
    // Results that record the agent's own calibration at boot are taken at their word.
    let mut c = cell();
    let pt = |gap_us: u64, mean_us: u64| gleaner_policy::idle::CurvePoint {
        gap_ns: gap_us * 1000,
        mean_ns: mean_us * 1000,
        p50_ns: mean_us * 1000,
    };
    // A halted vCPU 80-90 us, a busy one 20 us: yielding threads can pay.
    let curve = gleaner_policy::idle::WakeCurve::new(vec![pt(100, 80), pt(500, 90)], 20_000, None);
    c.calibrations = vec![(
        "lab-x-A".into(),
        gleaner_measure::calibration::CalibrationResults {
            curve: curve.clone(),
            idle_threshold_ns: 30_000,
            polling: gleaner_measure::calibration::PollingControl { halted: "as found".into(), poll: "not measured".into() },
        },
    )];
    let p = model::agent_plan(&c, &c.passes[0]);
    assert!(p.retention && p.why.contains("calibrated at boot"), "{}", p.why);
    assert_eq!(p.config.idle_threshold_ns, 30_000);
    let gc = p.guest.as_ref().expect("the calibrated curve");
    assert_eq!((gc.prior, gc.curve.as_ref()), (RetentionMode::On, Some(&curve)));
    assert_eq!(model::variant_for("gleaner", IdlePolicy::Gleaner, &p, false).gleaner.agent.as_ref(), Some(gc));
}

#[test]
fn the_table_puts_prediction_beside_measurement() {
    let c = cell();
    let p = predict("fixture", std::slice::from_ref(&c), &opts(0.0), &[1], None).expect("prediction");
    assert_eq!(p.cells.len(), 1);
    let cp = &p.cells[0];
    assert_eq!(cp.policies[0].mode, "stock", "the baseline first");
    let stock = &cp.policies[0];
    assert_eq!((stock.speedup.predicted, stock.speedup.measured, stock.within()), (Some(1.0), Some(1.0), Some(true)));
    let y = cp.policies.iter().find(|x| x.policy == IdlePolicy::Yielders).unwrap();
    assert_eq!(y.simulated_as, IdlePolicy::Retention);
    let (m, s) = (y.speedup.measured.unwrap(), y.speedup.predicted.unwrap());
    assert!((y.speedup.rel_diff.unwrap() - (s / m - 1.0)).abs() < 1e-12);
    assert!(y.co_runner_ratio_workload.is_some(), "rows give the ratio over the workload's own window");
    assert_eq!(p.compared, 2, "consolidation and yielders");
    let md = report::markdown(&p);
    assert!(md.contains("| cell | halt poll | policy (simulated as) | speedup: lab [95% CI] | sim | diff |"), "{md}");
    assert_eq!(md.lines().filter(|l| l.starts_with("| oc-condvar-freqsleep | n/a |")).count(), 3, "{md}");
    assert!(md.contains("| wakeup | context |"), "the wake-up check is reported");
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(json["cells"][0]["policies"][0]["speedup"]["within_25"], true);
    assert!(json["cells"][0]["costs"]["costs_ns"]["rt"].as_u64().is_some());
}

#[test]
fn predictions_are_deterministic_for_given_seeds() {
    let c = cell();
    let run = |jitter, seeds: &[u64]| {
        serde_json::to_string(&predict("x", std::slice::from_ref(&c), &opts(jitter), seeds, None).unwrap()).unwrap()
    };
    assert_eq!(run(0.0, &[1]), run(0.0, &[1]));
    let a = run(10.0, &[1, 2]);
    assert_eq!(a, run(10.0, &[1, 2]));
    let p = predict("x", std::slice::from_ref(&c), &opts(10.0), &[1, 2], None).unwrap();
    for x in &p.cells[0].policies {
        let s = x.speedup;
        let (lo, mid, hi) = (s.predicted_min.unwrap(), s.predicted.unwrap(), s.predicted_max.unwrap());
        assert!(lo <= mid && mid <= hi, "{s:?}");
    }
}

#[test]
fn bad_input_names_the_path_and_what_is_expected() {
    let dir = tempfile::tempdir().unwrap();
    let e = input::load(&dir.path().join("missing")).unwrap_err();
    let b = bad_input(&e);
    assert!(b.value.ends_with("missing") && b.allowed.contains("matrix.json") && b.allowed.contains("results.json"), "{b}");
    assert!(bad_input(&input::load(dir.path()).unwrap_err()).allowed.contains("matrix.json"), "an empty directory");
    for (name, text) in [("results.json", "{ not json"), ("matrix.json", "{\"cells\": 3}"), ("empty/results.json", "")] {
        let f = dir.path().join(name);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(&f, text).unwrap();
        let b = bad_input(&input::load(&f).unwrap_err());
        assert!(b.value == f.display().to_string() && b.allowed.contains("gleaner lab"), "{name}: {b}");
        assert!(!b.to_string().contains('\n'), "one line: {b}");
    }
    // Results without the wakeup measurement cannot give costs.
    let mut r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("oc-condvar-freqsleep.results.json")).unwrap()).unwrap();
    r["wake_costs"] = serde_json::json!([]);
    let f = dir.path().join("no-wake/results.json");
    std::fs::create_dir_all(f.parent().unwrap()).unwrap();
    std::fs::write(&f, r.to_string()).unwrap();
    let cells = input::load(f.parent().unwrap()).unwrap();
    let e = predict("x", &cells, &opts(0.0), &[1], None).unwrap_err();
    assert!(bad_input(&e).allowed.contains("setup.wakeup"), "{e:#}");
}

/// Regression: matrix.json files written before the fix carry `halt_poll` twice per entry and
/// could not be read back; a matrix without its cells' results.json is predicted from what
/// matrix.json holds.
#[test]
fn matrix_json_with_halt_poll_twice_reads_back() {
    let cells = input::load(&fixture("matrix-old")).expect("an old matrix.json loads");
    assert_eq!(cells.len(), 1);
    let c = &cells[0];
    assert!(!c.per_run && c.notes[0].contains("no results.json"), "{:?}", c.notes);
    assert_eq!((c.pcpus, c.vcpus), (2, 2), "the matrix's own cell experiment");
    assert_eq!(c.passes.len(), 1);
    assert_eq!((c.passes[0].modes.len(), c.passes[0].halt_poll), (3, HaltPoll::NotApplicable));
    // Written again, each entry has the key once.
    let text = std::fs::read_to_string(fixture("matrix-old/matrix.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let m: gleaner_lab::matrix::MatrixResults = serde_json::from_value(v).unwrap();
    let again = serde_json::to_string(&m).unwrap();
    assert_eq!(again.matches("\"halt_poll\"").count(), m.entries.len());
    let back: gleaner_lab::matrix::MatrixResults = serde_json::from_str(&again).expect("reads back without help");
    assert_eq!(back.entries, m.entries);
}

#[test]
fn the_host_scheduler_defaults_follow_eevdf_and_the_tick() {
    let h = HostSched::default_for(2, 250);
    assert_eq!((h.base_slice_us, h.tick_us, h.slice_us()), (1500.0, 4000.0, 4000.0));
    assert_eq!(HostSched::default_for(1, 1000).slice_us(), 1000.0);
    assert_eq!(HostSched::default_for(64, 1000).base_slice_us, 3000.0, "the scaling stops at 8 CPUs");
    assert_eq!(model::config_hz("# CONFIG_HZ_100 is not set\nCONFIG_HZ_250=y\nCONFIG_HZ=250\n"), Some(250));
    assert_eq!(model::config_hz("CONFIG_HZ_250=y\n"), None);
}

#[test]
fn a_finished_matrix_gets_the_prediction_appended_to_its_report() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture("matrix-old/matrix.json"), dir.path().join("matrix.json")).unwrap();
    std::fs::write(dir.path().join("matrix.md"), "# gleaner lab matrix\n").unwrap();
    gleaner_lab::predict::append_to_matrix_report(dir.path());
    let md = std::fs::read_to_string(dir.path().join("matrix.md")).unwrap();
    assert!(
        md.starts_with("# gleaner lab matrix\n") && md.contains("## Simulator prediction") && md.contains("| oc-condvar-freqsleep | n/a |"),
        "{md}"
    );
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("prediction.json")).unwrap()).unwrap();
    assert_eq!(json["cells"][0]["name"], "oc-condvar-freqsleep");
    assert!(dir.path().join("prediction.md").is_file());
    // A prediction that cannot be made is said in the report; the matrix itself stands.
    let empty = tempfile::tempdir().unwrap();
    std::fs::write(empty.path().join("matrix.md"), "# m\n").unwrap();
    gleaner_lab::predict::append_to_matrix_report(empty.path());
    let md = std::fs::read_to_string(empty.path().join("matrix.md")).unwrap();
    assert!(md.contains("not available: invalid lab results"), "{md}");
}

/// A results file whose row names a policy this gleaner does not know is refused in one line
/// that names the file and what is allowed.
#[test]
fn a_results_file_with_an_unknown_policy_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(fixture("oc-condvar-freqsleep.results.json")).unwrap();
    assert!(text.contains("\"policy\":\"yielders\""), "the fixture names its policies");
    let f = dir.path().join("results.json");
    std::fs::write(&f, text.replacen("\"policy\":\"yielders\"", "\"policy\":\"magic\"", 1)).unwrap();
    let e = input::load(&f).unwrap_err();
    let b = bad_input(&e);
    assert_eq!(format!("{e:#}").lines().count(), 1, "{e:#}");
    assert!(b.value.contains("results.json") && b.allowed.contains("'magic' is not an idle policy"), "{b}");
}
