//! Replays the guest loop on readings an agent dumped (`GLEANER_DUMP_READINGS=FILE gleaner run
//! ...`): one `GuestReading` per line; prints each period's plan per vCPU with its estimate.
//!
//! `cargo run --release -p gleaner-policy --example replay -- FILE CURVE.json [budget]`
//! (CURVE.json: the `curve` of `gleaner calibrate --json`'s `results`).

use gleaner_policy::guest::{GuestConfig, GuestController, GuestReading};
use gleaner_policy::idle::{Means, PlanConfig, WakeCurve};
use gleaner_policy::retention::RetentionMode;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(readings), Some(curve)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: replay READINGS.jsonl CURVE.json [budget]");
        std::process::exit(2);
    };
    let curve: WakeCurve = serde_json::from_str(&std::fs::read_to_string(curve)?)?;
    let budget = args.get(3).map_or(Ok(1.0), |b| b.parse())?;
    let text = std::fs::read_to_string(readings)?;
    let mut g: Option<GuestController> = None;
    for (k, line) in text.lines().enumerate() {
        let r: GuestReading = serde_json::from_str(line)?;
        let g = g.get_or_insert_with(|| {
            GuestController::new(GuestConfig {
                cpus: r.idle.iter().map(|v| v.cpu).collect(),
                consolidation: None,
                plan: PlanConfig { budget, ..PlanConfig::default() },
                means: Means { poll_window: true, poll_always: true, yielders: false },
                curve: Some(curve.clone()),
                governor: None,
                prior: RetentionMode::On,
                fixed_yield_ns: None,
                start: gleaner_policy::guest::StartConfig::default(),
                period_ns: r.snapshot.period_ns,
                priors: gleaner_policy::guest::LoopPriors::DEFAULT,
            })
        });
        let s = g.step(&r);
        let traced = r.trace.as_ref().map_or(0, |t| t.traced_ns);
        print!("period {k:3} traced {:6.1} ms:", traced as f64 / 1e6);
        for v in &s.plan.vcpus {
            let gaps = r.trace.as_ref().and_then(|t| t.gaps(v.cpu)).map(|g| (g.woken.count(), g.local.count(), g.other.count()));
            print!(
                "  cpu{} {:?} {} cost {:.2} caught {:.2} gaps(w,l,o) {:?} idle {:.0} ms poll {:.0} ms |",
                v.cpu,
                v.mechanism,
                if v.window_ns == u64::MAX { "always".to_string() } else { format!("{} us", v.window_ns / 1000) },
                v.estimate.cost_share,
                v.estimate.caught_share,
                gaps,
                r.idle.iter().find(|i| i.cpu == v.cpu).map_or(0.0, |i| i.idle_ns as f64 / 1e6),
                r.idle.iter().find(|i| i.cpu == v.cpu).map_or(0.0, |i| i.poll_ns as f64 / 1e6),
            );
        }
        println!();
        for (gaps, obs) in g.seen() {
            let all = gaps.all();
            println!(
                "    seen cpu{}: {} periods, {:.2} of {:.1} ms idle; sum_min(32 us) {:.2}",
                gaps.cpu,
                all.count(),
                all.sum_ns() as f64 / obs.max(1) as f64,
                obs as f64 / 1e6,
                all.sum_min_ns(32_768) / obs.max(1) as f64
            );
        }
    }
    Ok(())
}
