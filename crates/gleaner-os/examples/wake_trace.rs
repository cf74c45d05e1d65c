//! Traces every task's wakeups and every vCPU's idle periods for a few seconds with
//! `gleaner_os::bpf::WakeTracer`, then prints the histograms and what the programs cost per
//! event (`BPF_ENABLE_STATS`).
//!
//! `cargo run -p gleaner-os --release --example wake_trace -- [SECONDS] [--ping-pong]` (root).
//! `--ping-pong` runs a light load meanwhile: two threads on the first and last online CPU
//! hand a token back and forth through a Mutex + Condvar, pausing 200 us between hand-overs.
//! `--paused` attaches the programs but pauses them at once (what they cost between the
//! agent's slices; `scripts/bench/tracer-cost.sh` compares that with detached and counting).
//! `--cycle=MS` counts MS milliseconds of every second, as the agent's slices do: attached for
//! the slice and detached after it; with `--paused` too, attached throughout and paused
//! between slices.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use gleaner_os::bpf::{ProgStats, TracerConfig, WakeTracer};
use gleaner_os::cpuset::CpuSet;
use gleaner_os::sched;
use gleaner_os::sysfs::Sysfs;
use gleaner_policy::idle::{Log2Hist, TargetState, WakeTrace};

fn describe(h: &Log2Hist) -> String {
    match (h.mean_ns(), h.quantile_ns(0.5), h.quantile_ns(0.99)) {
        (Some(mean), Some(p50), Some(p99)) => {
            format!("{:>7} | mean {:>9.1} us | p50 {:>9.1} us | p99 {:>9.1} us", h.count(), mean / 1e3, p50 / 1e3, p99 / 1e3)
        }
        _ => format!("{:>7} |", 0),
    }
}

/// The ping-pong of the tests, until `stop`; returns the number of hand-overs.
fn ping_pong(cpus: [u32; 2], stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let shared = Arc::new((Mutex::new((0usize, 0u64)), Condvar::new()));
        let threads: Vec<_> = (0..2usize)
            .map(|me| {
                let (shared, stop) = (Arc::clone(&shared), Arc::clone(&stop));
                let cpu = CpuSet::parse(&cpus[me].to_string()).expect("a CPU number");
                std::thread::spawn(move || {
                    sched::set_affinity(0, &cpu).expect("pin the ping-pong thread");
                    let (lock, cv) = &*shared;
                    loop {
                        let mut g = lock.lock().expect("lock");
                        while g.0 != me && !stop.load(Ordering::Relaxed) {
                            g = cv.wait_timeout(g, Duration::from_millis(50)).expect("wait").0;
                        }
                        drop(g);
                        if stop.load(Ordering::Relaxed) {
                            cv.notify_all();
                            return;
                        }
                        std::thread::sleep(Duration::from_micros(200));
                        let mut g = lock.lock().expect("lock");
                        g.0 = 1 - me;
                        g.1 += 1;
                        drop(g);
                        cv.notify_one();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("ping-pong thread");
        }
        let n = shared.0.lock().expect("lock").1;
        n
    })
}

/// The command line: SECONDS and the options (module documentation).
struct Options {
    seconds: f64,
    with_load: bool,
    paused: bool,
    cycle: Option<u64>,
}

/// Reads the command line.
fn options() -> anyhow::Result<Options> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let seconds: f64 = args.iter().find(|a| !a.starts_with("--")).map_or(Ok(3.0), |s| s.parse()).context("SECONDS must be a number")?;
    let with_load = args.iter().any(|a| a == "--ping-pong");
    let paused = args.iter().any(|a| a == "--paused");
    let cycle = match args.iter().find_map(|a| a.strip_prefix("--cycle=")) {
        Some(ms) => Some(
            ms.parse::<u64>().ok().filter(|ms| (1..1000).contains(ms)).with_context(|| format!("--cycle={ms}: milliseconds in 1..=999"))?,
        ),
        None => None,
    };
    if let Some(bad) =
        args.iter().find(|a| a.starts_with("--") && !matches!(a.as_str(), "--ping-pong" | "--paused") && !a.starts_with("--cycle="))
    {
        anyhow::bail!("unknown option {bad}: allowed are SECONDS, --ping-pong, --paused, --cycle=MS");
    }
    Ok(Options { seconds, with_load, paused, cycle })
}

fn main() -> anyhow::Result<()> {
    let Options { seconds, with_load, paused, cycle } = options()?;

    let sysfs = Sysfs::new();
    let cfg = TracerConfig::detect(&sysfs)?;
    let _stats = WakeTracer::enable_stats().context("turning BPF run-time statistics on")?;
    let t0 = Instant::now();
    let mut tracer = WakeTracer::load(&cfg).context("loading the tracer")?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    tracer.track_all(true)?;

    let stop = Arc::new(AtomicBool::new(false));
    let load = with_load.then(|| {
        let pair = [cfg.cpus.first().unwrap_or(0), cfg.cpus.last().unwrap_or(0)];
        ping_pong(pair, Arc::clone(&stop))
    });
    std::thread::sleep(Duration::from_millis(100)); // the load settles
    let (trace0, stats0) = (tracer.read()?, tracer.prog_stats());
    let each0 = tracer.prog_stats_each();
    let t1 = Instant::now();
    trace_for(&mut tracer, seconds, paused, cycle, t1)?;
    tracer.detach();
    let wall_s = t1.elapsed().as_secs_f64();
    let trace = tracer.read()?.delta_since(&trace0);
    let each = tracer.prog_stats_each();
    let stats = tracer.prog_stats();
    stop.store(true, Ordering::Relaxed);
    let handovers = load.map(|h| h.join().expect("ping-pong"));

    let traced_s = trace.traced_ns as f64 / 1e9;
    println!(
        "{} {wall_s:.2} s, counted {traced_s:.2} s on CPUs {} (POLL state {:?}), tracer loaded in {load_ms:.1} ms{}",
        if paused { "attached, paused," } else { "attached" },
        cfg.cpus,
        cfg.poll_state,
        handovers.map(|n| format!(", ping-pong hand-overs {n}")).unwrap_or_default()
    );
    print_histograms(&trace);
    println!("\nprogram cost while attached{} (BPF_ENABLE_STATS):", if paused { " and paused" } else { "" });
    print_costs(&each, &each0, wall_s);
    if let (Some(a), Some(b)) = (stats, stats0) {
        print_total_cost(&a.delta_since(&b), wall_s, cfg.cpus.len());
    }
    Ok(())
}

/// Traces for `seconds` from `t1`: attached throughout (paused at once with `paused`), or with
/// `cycle` attached for that many milliseconds of every second and detached (or paused) for
/// the rest.
fn trace_for(tracer: &mut WakeTracer, seconds: f64, paused: bool, cycle: Option<u64>, t1: Instant) -> anyhow::Result<()> {
    match cycle {
        None => {
            tracer.attach()?;
            if paused {
                tracer.pause();
            }
            std::thread::sleep(Duration::from_secs_f64(seconds));
        }
        Some(ms) => {
            let (slice, rest) = (Duration::from_millis(ms), Duration::from_millis(1000 - ms));
            while t1.elapsed().as_secs_f64() < seconds {
                tracer.attach()?;
                std::thread::sleep(slice);
                if paused {
                    tracer.pause()
                } else {
                    tracer.detach()
                }
                std::thread::sleep(rest);
            }
        }
    }
    Ok(())
}

/// The wakeup latencies by target vCPU state, the idle periods by vCPU, and every latency's
/// log2 bucket.
fn print_histograms(trace: &WakeTrace) {
    println!("\nwakeup latency by target vCPU state (all tasks):   count | mean | p50 | p99");
    for s in TargetState::ALL {
        println!("  {:<5} {}", s.name(), describe(trace.latency.of(s)));
    }
    println!("  all   {}", describe(&trace.latency.all()));
    println!("\nidle periods by vCPU:");
    for g in &trace.vcpus {
        println!("  cpu{} woken {}", g.cpu, describe(&g.woken));
        println!("  cpu{} other {}", g.cpu, describe(&g.other));
        println!("  cpu{} local {}", g.cpu, describe(&g.local));
    }
    println!("\nall latencies, log2 buckets [2^i, 2^(i+1)) ns: bucket count mean_us");
    for (i, c, sum) in trace.latency.all().iter() {
        println!("  {i:>2} {c:>7} {:>10.2}", sum as f64 / c as f64 / 1e3);
    }
}

/// Each program's runs and cost over `wall_s`, from its statistics before and after.
fn print_costs(each: &[(&str, Option<ProgStats>)], each0: &[(&str, Option<ProgStats>)], wall_s: f64) {
    for ((name, after), (_, before)) in each.iter().zip(each0) {
        if let (Some(a), Some(b)) = (after, before) {
            let d = a.delta_since(b);
            println!(
                "  {name:<16} {:>8} runs {:>9.0} /s {:>7.1} ns/run  recursion misses {}",
                d.run_cnt,
                d.run_cnt as f64 / wall_s,
                d.ns_per_run().unwrap_or(0.0),
                d.recursion_misses
            );
        }
    }
}

/// All programs' runs over `wall_s` together, and their share of `cpus` CPUs.
fn print_total_cost(d: &ProgStats, wall_s: f64, cpus: usize) {
    let share = d.run_time_ns as f64 / (wall_s * 1e9 * cpus as f64) * 100.0;
    println!(
        "  {:<16} {:>8} runs {:>9.0} /s {:>7.1} ns/run  = {share:.3}% of {} CPUs",
        "total",
        d.run_cnt,
        d.run_cnt as f64 / wall_s,
        d.ns_per_run().unwrap_or(0.0),
        cpus
    );
}
