//! Bad user input is rejected with a `BadInput` naming the value (the binary exits 2).

use std::path::PathBuf;

use clap::Parser;
use gleaner_bench::{run_bench, run_diagnose, BenchArgs, DiagnoseArgs};
use gleaner_os::BadInput;

#[derive(Debug, Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, clap::Subcommand)]
enum Cmd {
    Bench(BenchArgs),
    Diagnose(DiagnoseArgs),
}

fn run(args: &[&str]) -> anyhow::Result<std::process::ExitCode> {
    let cli = Cli::try_parse_from(std::iter::once("gleaner").chain(args.iter().copied())).expect("clap accepts the syntax");
    match cli.cmd {
        Cmd::Bench(a) => run_bench(a),
        Cmd::Diagnose(a) => run_diagnose(a),
    }
}

fn bad_input(args: &[&str]) -> BadInput {
    let err = run(args).expect_err(&format!("{args:?} must be rejected"));
    err.chain().find_map(|c| c.downcast_ref::<BadInput>()).cloned().unwrap_or_else(|| panic!("{args:?}: no BadInput in the chain: {err:#}"))
}

#[test]
fn workload_values() {
    assert_eq!(bad_input(&["bench", "workload", "dedupp"]).what, "workload");
    assert_eq!(bad_input(&["bench", "workload", "pipeline", "--threads", "0"]).what, "--threads");
    assert_eq!(bad_input(&["bench", "workload", "mutex", "--threads", "100000"]).what, "--threads");
    assert_eq!(bad_input(&["bench", "workload", "barrier", "--items", "0"]).what, "--items");
    assert_eq!(bad_input(&["bench", "workload", "barrier", "--work-us=-3"]).what, "--work-us");
    assert_eq!(bad_input(&["bench", "workload", "barrier", "--runs", "0"]).what, "--runs");
}

#[test]
fn wakeup_values() {
    assert_eq!(bad_input(&["bench", "wakeup", "--rounds", "0"]).what, "--rounds");
    assert_eq!(bad_input(&["bench", "wakeup", "--period-us", "0"]).what, "--period-us");
    let e = bad_input(&["bench", "wakeup", "--waiter-cpu", "4095"]);
    assert_eq!((e.what.as_str(), e.value.as_str()), ("--waiter-cpu", "4095"));
    assert_eq!(bad_input(&["bench", "wakeup", "--waker-cpu", "0", "--waiter-cpu", "0", "--setting", "C"]).what, "--setting");
    assert_eq!(bad_input(&["bench", "wakeup", "--rounds", "5", "--plot", "/tmp/x.jpg"]).what, "--plot");
    // Unknown settings are rejected by clap itself (exit 2 too).
    assert!(Cli::try_parse_from(["gleaner", "bench", "wakeup", "--setting", "E"]).is_err());
}

#[test]
fn commands_that_cannot_start() {
    let e = bad_input(&["bench", "run", "--runs", "1", "--", "/nonexistent/gleaner-no-such-program"]);
    assert_eq!(e.what, "command");
    assert_eq!(bad_input(&["bench", "run", "--runs", "0", "--", "true"]).what, "--runs");
}

#[test]
fn unreadable_or_malformed_result_files() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.json");
    let garbage = dir.path().join("garbage.json");
    let empty = dir.path().join("empty.json");
    std::fs::write(&garbage, "{ not json").unwrap();
    std::fs::write(&empty, "").unwrap();
    let p = |x: &PathBuf| x.to_str().unwrap().to_string();
    for (a, b) in [(&missing, &garbage), (&garbage, &garbage), (&empty, &empty)] {
        let e = bad_input(&["bench", "overhead", &p(a), &p(b)]);
        assert_eq!(e.what, "result file");
        assert_eq!(e.value, a.display().to_string());
    }
}

#[test]
fn diagnose_rounds() {
    assert_eq!(bad_input(&["diagnose", "--rounds", "0"]).what, "--rounds");
}
