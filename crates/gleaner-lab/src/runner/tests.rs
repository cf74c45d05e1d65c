//! Unit tests of the runner: job scripts and step names, argument helpers, the boot plan, compute shares, wake contexts.

use std::path::Path;

use gleaner_policy::IdlePolicy;

use super::pass::boot_plan;
use super::rows::add_compute_shares;
use super::{
    bench_workload_params, calibrated_rate, co_runner_job, guest_job, mode_command, with_flag, Setup, StepKind, WakeContext, WakePlace,
    GUEST_EVENTS,
};
use crate::experiment::{Experiment, Mode, Scenario};
use crate::keys::RowMode;
use crate::results::SummaryRow;

const G: &str = "/work/main/target/release/gleaner";

#[test]
fn jobs_rotate_modes_wrap_the_agent_and_attach_its_events() {
    let exp = Experiment::load("oc").unwrap();
    let groups = exp.boot_groups();
    assert_eq!(groups.len(), 1, "oc's modes share one boot");
    let w = exp.workload_args(true);
    assert_eq!(w, ["bench", "workload", "pipeline", "--json", "--items", "3000"]);
    let job = guest_job(&groups[0].1, &[1, 2], Path::new(G), &w, false);
    let lines: Vec<&str> = job.lines().collect();
    assert_eq!(lines[0], format!("step setup.calibrate {G} calibrate --json"));
    let steps: Vec<&str> =
        lines.iter().filter(|l| l.starts_with("step ") && !l.starts_with("step setup.")).map(|l| l.split(' ').nth(1).unwrap()).collect();
    assert_eq!(steps, ["off.1", "gleaner.1", "gleaner.2", "off.2"]);
    assert!(lines.contains(&format!("step off.1 {G} bench workload pipeline --json --items 3000").as_str()), "{job}");
    assert!(
        lines.contains(
            &format!("step gleaner.1 {G} run --events {GUEST_EVENTS} -- {G} bench workload pipeline --json --items 3000").as_str()
        ),
        "{job}"
    );
    assert!(lines.contains(&format!("attach gleaner.1 events {GUEST_EVENTS}").as_str()));
    let co = co_runner_job(&exp.co_runner_args(true).unwrap(), Path::new(G));
    assert!(co.contains(&format!("step co.$i {G} bench workload matmul --json --quick")));
}

#[test]
fn every_policy_has_its_command() {
    let w = vec!["bench".to_string(), "workload".into(), "condvar".into()];
    let cmd = |p| mode_command(Path::new("/g"), &w, &Mode::of(p));
    assert_eq!(cmd(IdlePolicy::Stock), "/g bench workload condvar");
    assert_eq!(cmd(IdlePolicy::Poll), "/g bench workload condvar");
    assert_eq!(cmd(IdlePolicy::Yielders), "/g bench yielders -- /g bench workload condvar");
    assert_eq!(cmd(IdlePolicy::Retention), format!("/g run --no-consolidation --events {GUEST_EVENTS} -- /g bench workload condvar"));
    assert_eq!(cmd(IdlePolicy::Consolidation), format!("/g run --no-retention --events {GUEST_EVENTS} -- /g bench workload condvar"));
    let m = Mode { name: "g2".into(), policy: Some(IdlePolicy::Gleaner), agent: Some(vec!["--period-ms".into(), "100".into()]) };
    assert_eq!(
        mode_command(Path::new("/g"), &w, &m),
        format!("/g run --period-ms 100 --events {GUEST_EVENTS} -- /g bench workload condvar")
    );
}

#[test]
fn flags_are_replaced_not_repeated() {
    let a: Vec<String> = ["bench", "workload", "pipeline", "--work-us", "10", "--items=5"].iter().map(|s| s.to_string()).collect();
    assert_eq!(with_flag(&a, "--work-us", "190"), ["bench", "workload", "pipeline", "--items=5", "--work-us", "190"]);
    assert_eq!(with_flag(&a, "--items", "7"), ["bench", "workload", "pipeline", "--work-us", "10", "--items", "7"]);
    let p = bench_workload_params(&a).unwrap().unwrap();
    assert_eq!((p.work_us, p.items), (10.0, 5));
    assert!(bench_workload_params(&["bench".into(), "workload".into(), "nope".into()]).unwrap().is_err());
    assert!(bench_workload_params(&["bench".into(), "rate".into()]).is_none());
}

#[test]
fn compute_share_is_compute_over_the_cpu_burned_per_item() {
    let args = |w: &str| -> Vec<String> {
        ["bench", "workload", "pipeline", "--threads", "2", "--work-us", w].iter().map(|s| s.to_string()).collect()
    };
    let mut rows = vec![
        // Natively 1000 items, 0.04 s of CPU: 40 us per item, 2 x 10 us compute = 50%.
        SummaryRow { mode: RowMode::Native, items: Some(1000.0), guest_cpu_s: Some(0.04), ..Default::default() },
        // In the guest 2 x 100 us per item out of (0.3 + 0.5) s / 1000 = 800 us: 25%.
        SummaryRow { mode: RowMode::mode("stock"), items: Some(1000.0), host_vcpu_s: vec![0.3, 0.5], ..Default::default() },
        SummaryRow { mode: RowMode::mode("gleaner"), items: None, host_vcpu_s: vec![0.3], ..Default::default() },
    ];
    add_compute_shares(&mut rows, &args("10"), &args("100"));
    assert!((rows[0].compute_share.unwrap() - 0.5).abs() < 1e-9);
    assert!((rows[1].compute_share.unwrap() - 0.25).abs() < 1e-9);
    assert_eq!(rows[2].compute_share, None);
    // Kernels without a fixed number of steps per item get none.
    let mut m = vec![SummaryRow { mode: RowMode::mode("stock"), items: Some(1.0), host_vcpu_s: vec![1.0], ..Default::default() }];
    add_compute_shares(&mut m, &[], &["bench".into(), "workload".into(), "matmul".into()]);
    assert_eq!(m[0].compute_share, None);
}

#[test]
fn boots_interleave_command_lines_round_by_round() {
    assert_eq!(boot_plan(1, 3), vec![(vec![1, 2, 3], 0)]);
    assert_eq!(boot_plan(2, 2), vec![(vec![1], 0), (vec![1], 1), (vec![2], 1), (vec![2], 0)]);
}

#[test]
fn calibration_rate_from_bench_json() {
    assert_eq!(calibrated_rate("{\"params\":{}}"), None);
    assert_eq!(calibrated_rate(""), None);
}

#[test]
fn wake_contexts_read_and_write_as_the_strings_results_always_had() {
    for (text, place, hp) in [
        ("alone", WakePlace::Alone, None),
        ("with co-runner, halt_poll n/a", WakePlace::WithCoRunner, Some("n/a")),
        ("next to VM B, halt_poll 0", WakePlace::NextToVmB, Some("0")),
    ] {
        let c: WakeContext = serde_json::from_str(&format!("\"{text}\"")).unwrap();
        assert_eq!(c, WakeContext { place, halt_poll: hp.map(|h| h.parse().unwrap()) });
        assert_eq!(serde_json::to_string(&c).unwrap(), format!("\"{text}\""));
    }
    let e = serde_json::from_str::<WakeContext>("\"beside B\"").unwrap_err().to_string();
    assert!(e.contains("'beside B'") && e.contains("'alone', 'with co-runner', 'next to VM B'"), "{e}");
    assert_eq!(WakePlace::of(Scenario::Oc), WakePlace::WithCoRunner);
    // A place alone (`WakeCheck::context`) is written as its label too.
    for w in WakePlace::ALL {
        assert_eq!(serde_json::to_string(&w).unwrap(), format!("\"{}\"", w.label()));
    }
}

#[test]
fn step_names_parse_to_what_wrote_them() {
    for k in [
        StepKind::Setup(Setup::Rate),
        StepKind::Setup(Setup::Wakeup),
        StepKind::Setup(Setup::Sync(3)),
        StepKind::Setup(Setup::Calibrate),
        StepKind::Setup(Setup::Cpuidle),
        StepKind::Co(12),
        StepKind::Measured { mode: "gleaner".into(), rep: 2 },
        StepKind::Measured { mode: "idle-poll".into(), rep: 7 },
    ] {
        assert_eq!(StepKind::parse(&k.name()), k);
    }
    assert_eq!(StepKind::parse("exec"), StepKind::Other("exec".into()));
    assert_eq!(StepKind::parse("setup.unknown"), StepKind::Other("setup.unknown".into()));
    // What the co-runner's shell loop names its third iteration.
    let job = co_runner_job(&["x".into()], Path::new("/g"));
    assert!(job.contains("step co.$i "), "{job}");
    assert_eq!(StepKind::parse(&job.split("step ").nth(1).unwrap().split(' ').next().unwrap().replace("$i", "3")), StepKind::Co(3));
}
