//! The latency kernels run briefly for real on two CPUs (plausible, checked numbers), and
//! deliberately broken runs are caught instead of looking fast. The tests take turns
//! (`serial`): two kernels at once would share the two CPUs they each pin to.

use std::time::{Duration, Instant};

use gleaner_bench::measure::allowed_cpu_set;
use gleaner_bench::report::{from_output, write_document, BenchDoc};
use gleaner_bench::workload::latency::{
    run_latency, LatencyCheckFailed, LatencyKernel, LatencyOutcome, LatencyParams, LatencyPlan, OpenloopParams, PingpongParams,
};
use gleaner_bench::workload::Fault;
use serial_test::serial;

/// The first two CPUs this process may use: the kernels exist to measure cross-CPU wakeups.
fn two_cpus() -> (u32, u32) {
    let cpus = allowed_cpu_set().to_vec();
    assert!(cpus.len() >= 2, "the latency kernel tests need two CPUs this process may use; it may use {cpus:?}");
    (cpus[0], cpus[1])
}

fn pingpong(rounds: u64) -> PingpongParams {
    let (client_cpu, server_cpu) = two_cpus();
    PingpongParams { client_cpu, server_cpu, rounds: Some(rounds), duration_ms: None, ..PingpongParams::for_cpus(&allowed_cpu_set()) }
}

fn openloop(duration_ms: u64, rate_per_s: u32) -> OpenloopParams {
    let (client_cpu, server_cpu) = two_cpus();
    OpenloopParams { client_cpu, server_cpu, duration_ms, rate_per_s, ..OpenloopParams::for_cpus(&allowed_cpu_set()) }
}

/// What holds for every healthy run: a sample per item, all positive, ordered percentiles.
fn assert_plausible(out: &LatencyOutcome) {
    let k = out.kernel;
    assert_eq!(out.samples_ns.len() as u64, out.items, "{k}");
    assert!(out.samples_ns.iter().all(|&s| s > 0), "{k}: a latency of 0 ns");
    let s = out.summary().unwrap_or_else(|| panic!("{k}: no latency summary"));
    assert_eq!(s.samples, out.items);
    assert!(s.min_ns > 0, "{k}: {s:?}");
    assert!(s.min_ns as f64 <= s.p50_ns && s.p50_ns <= s.p90_ns && s.p90_ns <= s.p99_ns, "{k}: {s:?}");
    assert!(s.p99_ns <= s.p999_ns && s.p999_ns <= s.max_ns as f64, "{k}: {s:?}");
    assert!(s.mean_ns >= s.min_ns as f64 && s.mean_ns <= s.max_ns as f64, "{k}: {s:?}");
    // Every sample is a real hand-off within the run's window.
    assert!(s.max_ns <= out.window_ns, "{k}: max {} ns > window {} ns", s.max_ns, out.window_ns);
}

#[test]
#[serial(latency_kernels)]
fn pingpong_times_every_round_trip_between_two_cpus() {
    let p = pingpong(300);
    let a = run_latency(&LatencyParams::Pingpong(p.clone())).unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(a.items, 300);
    assert_plausible(&a);
    let s = a.summary().unwrap();
    // A closed loop has no requested rate: the keys are absent.
    assert_eq!((s.requested_per_s, s.achieved_per_s, s.send_lag_p50_ns), (None, None, None));
    // The rounds are back to back: they fill the window.
    let total: u64 = a.samples_ns.iter().sum();
    assert!(total <= a.window_ns, "{total} ns of round trips in a {} ns window", a.window_ns);
    // Same rounds, same answers.
    let b = run_latency(&LatencyParams::Pingpong(p)).unwrap();
    assert_eq!(a.checksum, b.checksum);
}

#[test]
#[serial(latency_kernels)]
fn pingpong_runs_for_its_duration_with_think_time() {
    let p = PingpongParams { rounds: None, duration_ms: Some(150), think_us: 200, ..pingpong(1) };
    let t = Instant::now();
    let out = run_latency(&LatencyParams::Pingpong(p)).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(out.window_ns >= 150_000_000, "{} ns", out.window_ns);
    assert!(t.elapsed() < Duration::from_secs(10));
    // A round takes at least the think time: at most 150 ms / 200 us of them.
    assert!(out.items >= 1 && out.items <= 750, "{} rounds", out.items);
    assert_plausible(&out);
}

#[test]
#[serial(latency_kernels)]
fn pingpong_on_one_cpu_is_allowed() {
    let (cpu, _) = two_cpus();
    let p = PingpongParams { client_cpu: cpu, server_cpu: cpu, ..pingpong(50) };
    let out = run_latency(&LatencyParams::Pingpong(p)).unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(out.items, 50);
    assert_plausible(&out);
}

/// 300 ms at 2000 requests/s: the number of requests is fixed by the seed (the schedule is
/// drawn before the run), every one is answered, and the achieved rate is that count over the
/// window (300 ms, or until the last reply if later), so it is within 20 % of the requested
/// rate unless the last reply comes more than about 50 ms late.
#[test]
#[serial(latency_kernels)]
fn openloop_answers_every_scheduled_request_at_the_requested_rate() {
    let p = LatencyParams::Openloop(openloop(300, 2000));
    let plan = LatencyPlan::new(&p).unwrap();
    let n = plan.schedule().len() as u64;
    // Seed 1: the count of a Poisson process with mean 600 (standard deviation 24.5).
    assert!((480..=720).contains(&n), "{n} requests scheduled");
    let out = plan.run().unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(out.items, n, "every scheduled request is answered");
    assert_plausible(&out);
    assert_eq!(out.send_lag_ns.len() as u64, n);
    let s = out.summary().unwrap();
    assert_eq!(s.requested_per_s, Some(2000.0));
    let achieved = s.achieved_per_s.unwrap();
    assert!(out.window_ns >= 300_000_000);
    assert!((achieved - n as f64 / (out.window_ns as f64 / 1e9)).abs() < 1e-6);
    assert!((achieved / 2000.0 - 1.0).abs() < 0.2, "achieved {achieved:.0}/s of 2000/s ({n} requests in {} ns)", out.window_ns);
    // The same schedule and work give the same answers.
    assert_eq!(plan.run().unwrap().checksum, out.checksum);
    // Latency is counted from the scheduled time: never shorter than the server's work.
    assert!(s.min_ns as f64 >= 5_000.0 * 0.5, "{s:?}");
}

#[test]
#[serial(latency_kernels)]
fn openloop_drains_and_checks_a_backlog_when_the_server_is_slow() {
    // 90 % load: requests queue up behind each other (the sender never waits for the server),
    // and every one is still answered, in order, with its work done.
    let p = OpenloopParams { work_us: 450.0, ..openloop(200, 2000) };
    let plan = LatencyPlan::new(&LatencyParams::Openloop(p)).unwrap();
    let out = plan.run().unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(out.items, plan.schedule().len() as u64);
    assert_plausible(&out);
    let s = out.summary().unwrap();
    assert!(s.p50_ns > 450_000.0 * 0.5, "{s:?}");
}

fn assert_check_failed(p: LatencyParams, what: &str) {
    let k = p.kernel();
    let err = run_latency(&p).expect_err(&format!("{k} with a fault must fail"));
    let cf = err.downcast_ref::<LatencyCheckFailed>().unwrap_or_else(|| panic!("{k}: not a check failure: {err:#}"));
    assert_eq!(cf.kernel, k);
    assert!(cf.detail.contains(what), "{k}: {}", cf.detail);
}

#[test]
#[serial(latency_kernels)]
fn openloop_catches_a_dropped_or_wrong_reply() {
    let p = |fault| LatencyParams::Openloop(OpenloopParams { fault: Some(fault), ..openloop(100, 2000) });
    assert_check_failed(p(Fault::DropOneItem), "was not answered");
    assert_check_failed(p(Fault::CorruptOneItem), "expected");
}

#[test]
#[serial(latency_kernels)]
fn pingpong_catches_a_wrong_reply_and_stalls_on_a_dropped_one_instead_of_hanging() {
    assert_check_failed(LatencyParams::Pingpong(PingpongParams { fault: Some(Fault::CorruptOneItem), ..pingpong(20) }), "expected");
    let p = PingpongParams { fault: Some(Fault::DropOneItem), stall_timeout_ms: Some(300), ..pingpong(20) };
    let t = Instant::now();
    let err = run_latency(&LatencyParams::Pingpong(p)).expect_err("a dropped reply must fail the run");
    assert!(format!("{err:#}").contains("no progress"), "{err:#}");
    assert!(t.elapsed() < Duration::from_secs(20));
}

#[test]
#[serial(latency_kernels)]
fn a_latency_document_is_a_bench_document_with_latency() {
    let p = LatencyParams::Pingpong(pingpong(100));
    let doc = gleaner_bench::commands_for_tests::latency_doc(&p, 2).unwrap();
    assert_eq!((doc.kind.as_str(), doc.name.as_str(), doc.runs.len()), ("workload", "pingpong", 2));
    assert_eq!(doc.params["rounds"], 100);
    assert_eq!(doc.params["item_unit"], "round trips");
    for r in &doc.runs {
        assert_eq!(r.items, Some(100));
        assert_eq!(r.latency.as_ref().map(|l| l.samples), Some(100));
        assert!(r.throughput.is_some_and(|t| t > 0.0));
    }
    let mut out = Vec::new();
    write_document(&mut out, &doc).unwrap();
    let back: BenchDoc = from_output(&String::from_utf8(out).unwrap()).unwrap();
    assert_eq!((&back.name, &back.params, back.runs.len()), (&doc.name, &doc.params, 2));
    for (b, d) in back.runs.iter().zip(&doc.runs) {
        let (bl, dl) = (b.latency.as_ref().unwrap(), d.latency.as_ref().unwrap());
        assert_eq!((bl.samples, bl.min_ns, bl.max_ns, b.items), (dl.samples, dl.min_ns, dl.max_ns, d.items));
        // serde_json reads floats back to within an ulp or so.
        for (x, y) in [(bl.p50_ns, dl.p50_ns), (bl.p99_ns, dl.p99_ns), (bl.p999_ns, dl.p999_ns), (bl.mean_ns, dl.mean_ns)] {
            assert!((x - y).abs() <= 1e-9 * y.abs(), "{x} vs {y}");
        }
    }
    assert_eq!(LatencyKernel::parse("openloop"), Some(LatencyKernel::Openloop));
    assert_eq!(LatencyKernel::parse("pipeline"), None);
}
