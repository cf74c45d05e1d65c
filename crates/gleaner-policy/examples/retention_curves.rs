//! The curves behind the retention policies in docs/agent.md, from synthetic traces:
//!
//! 1. the adaptive timeout over time for bimodal idle periods (and what it catches);
//! 2. the governor's mode over time when the host starts and stops polling halted vCPUs.
//!
//! `cargo run --release -p gleaner-policy --example retention_curves`

use gleaner_policy::retention::synthetic::{bimodal, drive_governor, drive_idle_periods, EpochModel};
use gleaner_policy::retention::{GovernorConfig, IdleDetector, RetentionConfig, RetentionGovernor, RetentionMode};

fn main() {
    timeouts();
    governor();
}

/// (caught, caught when awake, spin per long period in us, median timeout in us) over the
/// periods after the first 1000.
fn stats(adapt: bool, periods: &[u64]) -> (f64, f64, f64, u64) {
    let mut d = detector(adapt);
    let out = drive_idle_periods(&mut d, periods, 20_000, 1_000, true);
    let tail = &out[1000..];
    let short = |p: &&gleaner_policy::retention::synthetic::PeriodOutcome| p.length_ns == 15_000;
    let frac = |v: Vec<bool>| v.iter().filter(|&&c| c).count() as f64 / v.len().max(1) as f64;
    let caught = frac(tail.iter().filter(short).map(|p| p.caught).collect());
    let awake = frac(tail.windows(2).filter(|w| w[0].caught && w[1].length_ns == 15_000).map(|w| w[1].caught).collect());
    let longs: Vec<_> = tail.iter().filter(|p| p.length_ns > 15_000).collect();
    let spin_per_long = longs.iter().map(|p| p.spin_ns).sum::<u64>() as f64 / 1e3 / longs.len().max(1) as f64;
    let mut t: Vec<u64> = tail.iter().map(|p| p.timeout_ns).collect();
    t.sort_unstable();
    (caught, awake, spin_per_long, t[t.len() / 2] / 1000)
}

fn detector(adapt: bool) -> IdleDetector {
    IdleDetector::new(RetentionConfig {
        idle_threshold_ns: 10_000,
        timeout_ns: 100_000,
        min_sleep_ns: 50_000,
        max_sleep_ns: 20_000_000,
        adapt,
        ..RetentionConfig::default()
    })
}

fn timeouts() {
    println!("## Adaptive timeout, bimodal idle periods (15 us or 2 ms), 20 us of work between");
    println!("cap 100 us, floor 10 us, grow x2, shrink /2, first sleep 50 us, 1 us yields; 20,000 periods\n");
    println!(
        "{:>7} | {:>9} {:>9} {:>10} | {:>9} {:>9} {:>10} {:>8}",
        "p(long)", "caught", "awake", "spin/long", "caught", "awake", "spin/long", "median T"
    );
    println!("{:>7} | {:^30} | {:^39}", "", "fixed 100 us", "adaptive");
    for p_long in [0.0, 0.05, 0.1, 0.3, 0.5, 0.9, 1.0] {
        let periods = bimodal(20_000, 15_000, 2_000_000, p_long, 7);
        let (fc, fa, fs, _) = stats(false, &periods);
        let (ac, aa, as_, am) = stats(true, &periods);
        println!("{p_long:>7.2} | {fc:>9.2} {fa:>9.2} {fs:>8.0}us | {ac:>9.2} {aa:>9.2} {as_:>8.0}us {am:>6}us");
    }
    println!("\ncaught: short periods that never halted the vCPU; awake: the same among short periods");
    println!("that follow a caught one (the thread was yielding when they began); spin/long: the");
    println!("thread's spinning during a long period (timeouts before it let the vCPU halt)\n");
    println!("\n### Timeout over time, p(long) = 0.1 (one row per 40 idle periods; # = 5 us)\n");
    let periods = bimodal(2_000, 15_000, 2_000_000, 0.1, 3);
    let mut d = detector(true);
    let out = drive_idle_periods(&mut d, &periods, 20_000, 1_000, true);
    for chunk in out.chunks(40).take(25) {
        let p = chunk[chunk.len() - 1];
        let longs = chunk.iter().filter(|p| p.length_ns > 15_000).count();
        let caught = chunk.iter().filter(|p| p.length_ns == 15_000 && p.caught).count();
        let shorts = chunk.len() - longs;
        println!(
            "t={:>7.1} ms  T={:>3} us {:<21} caught {caught:>2}/{shorts:<2} short, {longs} long",
            p.start_ns as f64 / 1e6,
            p.timeout_ns / 1000,
            "#".repeat((p.timeout_ns / 5_000) as usize)
        );
    }
}

fn governor() {
    println!("\n## Governor, barrier-like workload (5000 sync points/s), 200 ms epochs");
    println!("host polls (retention -7%, 0.6 vCPU burned) until epoch 150, then not (+25%) until 400, then polls again; readings +-2%\n");
    let model = |k: usize| {
        let gain = if (150..400).contains(&k) { 0.25 } else { -0.07 };
        EpochModel {
            rate_per_s: 5_000.0,
            on_gain: gain,
            burn_vcpus: 0.6,
            noise: 0.02,
            epoch_ns: 200_000_000,
            active_vcpus: 2,
            wakes_per_s: 0.0,
            wake_off_ns: 0.0,
            wake_on_ns: 0.0,
            probe_share: 1.0,
            io_bytes_per_s: 0.0,
            io_on_gain: 0.0,
        }
    };
    for prior in [RetentionMode::On, RetentionMode::Off] {
        let mut g = RetentionGovernor::new(GovernorConfig::default(), prior);
        let trace = drive_governor(&mut g, 600, 1, model);
        println!("prior {prior:?} (one character per epoch: # on, . off; | marks a switch)");
        for (row, chunk) in trace.chunks(100).enumerate() {
            let line: String = chunk
                .iter()
                .map(|(m, s)| match (s.change.map(|c| c.cause), m.is_on()) {
                    (Some(gleaner_policy::retention::ChangeCause::Switch), _) => '|',
                    (_, true) => '#',
                    (_, false) => '.',
                })
                .collect();
            println!("  {:>3}-{:<3} {line}", row * 100, row * 100 + 99);
        }
        let s = g.state();
        println!("  {} probes, {} comparisons, {} switches\n", s.probes, s.comparisons, s.switches);
    }
}
