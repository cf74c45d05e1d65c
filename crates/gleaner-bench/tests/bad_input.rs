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
        Cmd::Diagnose(a) => run_diagnose(a, &gleaner_bench::diagnose::Standalone),
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
fn latency_kernel_values() {
    let e = bad_input(&["bench", "workload", "openloop", "--rate", "0"]);
    assert_eq!((e.what.as_str(), e.value.as_str(), e.allowed.as_str()), ("--rate", "0", "1..=200000 requests per second"));
    assert_eq!(bad_input(&["bench", "workload", "openloop", "--rate", "200001"]).what, "--rate");
    let e = bad_input(&["bench", "workload", "pingpong", "--client-cpu", "4095"]);
    assert_eq!((e.what.as_str(), e.value.as_str()), ("--client-cpu", "4095"));
    assert!(e.allowed.starts_with("a CPU this process may use"), "{e}");
    assert_eq!(bad_input(&["bench", "workload", "openloop", "--server-cpu", "4095"]).what, "--server-cpu");
    assert_eq!(bad_input(&["bench", "workload", "pingpong", "--duration-ms", "0"]).what, "--duration-ms");
    assert_eq!(bad_input(&["bench", "workload", "openloop", "--duration-ms", "60001"]).what, "--duration-ms");
    assert_eq!(bad_input(&["bench", "workload", "pingpong", "--rounds", "0"]).what, "--rounds");
    assert_eq!(bad_input(&["bench", "workload", "pingpong", "--think-us", "1000001"]).what, "--think-us");
    assert_eq!(bad_input(&["bench", "workload", "pingpong", "--runs", "0"]).what, "--runs");
    // More work per request than the rate leaves time for: the queue would grow without bound.
    let e = bad_input(&["bench", "workload", "openloop", "--rate", "10000", "--work-us", "150"]);
    assert_eq!(e.what, "--work-us");
    assert!(e.allowed.contains("at most 100 microseconds"), "{e}");
    // Too short for one expected request.
    assert_eq!(bad_input(&["bench", "workload", "openloop", "--rate", "1", "--duration-ms", "999"]).what, "--duration-ms");
    // Flags of one kind of kernel given to another.
    assert_eq!(bad_input(&["bench", "workload", "pingpong", "--rate", "5"]).what, "--rate");
    assert_eq!(bad_input(&["bench", "workload", "pingpong", "--work-us", "5"]).what, "--work-us");
    assert_eq!(bad_input(&["bench", "workload", "openloop", "--items", "5"]).what, "--items");
    assert_eq!(bad_input(&["bench", "workload", "openloop", "--think-us", "5"]).what, "--think-us");
    assert_eq!(bad_input(&["bench", "workload", "openloop", "--threads", "2"]).what, "--threads");
    assert_eq!(bad_input(&["bench", "workload", "pipeline", "--client-cpu", "0"]).what, "--client-cpu");
    assert_eq!(bad_input(&["bench", "workload", "barrier", "--duration-ms", "100"]).what, "--duration-ms");
    // --rounds and --duration-ms together: clap refuses (exit 2 too).
    assert!(Cli::try_parse_from(["gleaner", "bench", "workload", "pingpong", "--rounds", "5", "--duration-ms", "5"]).is_err());
    // An unknown kernel's error lists every kernel.
    let e = bad_input(&["bench", "workload", "ping-pong"]);
    assert!(e.allowed.contains("freqsleep") && e.allowed.contains("pingpong, openloop"), "{e}");
}

#[test]
fn latency_defaults_and_cpu_choice() {
    use gleaner_bench::workload::latency::LatencyParams;
    use gleaner_bench::{latency_params, WorkloadArgs};
    #[derive(Debug, Parser)]
    struct W {
        #[command(flatten)]
        a: WorkloadArgs,
    }
    let allowed: gleaner_os::cpuset::CpuSet = [2, 5, 7].into_iter().collect();
    let resolve = |args: &[&str]| {
        let w = W::try_parse_from(std::iter::once("workload").chain(args.iter().copied())).unwrap();
        let k = gleaner_bench::workload::latency::LatencyKernel::parse(&w.a.name).unwrap();
        latency_params(k, &w.a, &allowed)
    };
    let LatencyParams::Openloop(o) = resolve(&["openloop"]).unwrap() else { panic!("not openloop") };
    assert_eq!((o.client_cpu, o.server_cpu, o.rate_per_s, o.duration_ms, o.work_us, o.seed), (2, 5, 2000, 2000, 5.0, 1));
    let LatencyParams::Pingpong(p) = resolve(&["pingpong", "--quick"]).unwrap() else { panic!("not pingpong") };
    assert_eq!((p.client_cpu, p.server_cpu, p.duration_ms, p.rounds, p.think_us), (2, 5, Some(200), None, 0));
    // A CPU given for one side moves the other side's default off it.
    let LatencyParams::Pingpong(p) = resolve(&["pingpong", "--server-cpu", "2", "--rounds", "9"]).unwrap() else { panic!() };
    assert_eq!((p.client_cpu, p.server_cpu, p.duration_ms, p.rounds), (5, 2, None, Some(9)));
    let LatencyParams::Openloop(o) = resolve(&["openloop", "--client-cpu", "5"]).unwrap() else { panic!() };
    assert_eq!((o.client_cpu, o.server_cpu), (5, 2));
    // The same CPU for both is allowed when asked for.
    let LatencyParams::Openloop(o) = resolve(&["openloop", "--client-cpu", "7", "--server-cpu", "7"]).unwrap() else { panic!() };
    assert_eq!((o.client_cpu, o.server_cpu), (7, 7));
    assert_eq!(resolve(&["openloop", "--server-cpu", "3"]).unwrap_err().what, "--server-cpu");
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
    assert!(Cli::try_parse_from(["gleaner", "bench", "wakeup", "--setting", "F"]).is_err());
    assert_eq!(bad_input(&["bench", "wakeup", "--setting", "E", "--primitive", "mutex"]).what, "--setting");
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
