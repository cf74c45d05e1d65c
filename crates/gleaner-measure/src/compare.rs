//! The document of `gleaner compare`: a workload run under each idle policy a tenant can pick,
//! in turn, with what each run cost in CPU counted honestly, and the summaries per policy.
//! `gleaner-agent` writes it; `gleaner-bench` plots it (latency against CPU); both read it as
//! these types.
//!
//! ```text
//!  CPU of a run = busy time of the managed vCPUs (/proc/stat: the workload, yielding threads,
//!                 the agent, anything else running there)
//!               + kernel polling (the cpuidle POLL state's time, which /proc/stat counts idle)
//!  retention CPU = polling + the yielding threads' (naive) or the agent's own CPU (gleaner)
//! ```

use gleaner_policy::idle::WakeSummary;
use gleaner_policy::stats::{median_ci, Interval, Summary};
use serde::{Deserialize, Serialize};

use crate::measure::RunMetrics;

/// The idle policies a comparison runs: one type for compare, the lab and the simulator.
pub use gleaner_policy::IdlePolicy as Policy;

/// One measured run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyRun {
    /// The policy (the key `mode`, as compare wrote it when it knew only stock and gleaner;
    /// `naive` in older documents reads as `yielders`).
    #[serde(rename = "mode")]
    pub policy: Policy,
    /// The round the run belonged to (0-based; every round runs each policy once). `None` in
    /// documents written before rounds were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<u32>,
    #[serde(flatten)]
    pub metrics: RunMetrics,
    /// User + system CPU time of the workload, ns.
    pub cpu_ns: u64,
    /// Kernel polling on the managed vCPUs during the run (the POLL state's time), ns.
    pub poll_ns: u64,
    /// CPU time of the policy's own threads: the yielding threads (naive) or the agent with
    /// its yielding threads (gleaner), ns.
    pub policy_cpu_ns: u64,
    /// Busy time of the managed vCPUs plus their kernel polling, ns: everything the run
    /// took from the vCPUs.
    pub total_cpu_ns: u64,
    pub agent_cpu_ns: Option<u64>,
    /// Peak resident memory of the agent: `None`, since the agent runs inside compare and
    /// the process's peak is compare's own (its calibration and workload output buffers).
    pub agent_maxrss_kib: Option<u64>,
    pub decisions: Option<u64>,
    /// Share of the agent's control periods that ran with retention on.
    pub retention_on_share: Option<f64>,
    /// The workload's wakeups as the agent's tracer saw them (gleaner runs).
    #[serde(default)]
    pub wake: Option<WakeSummary>,
    /// CPU time of the agent's eBPF programs (gleaner runs with the tracer).
    #[serde(default)]
    pub tracer_cpu_ns: Option<u64>,
}

impl PolicyRun {
    /// A run of `policy` with `metrics` and nothing else measured: no round, no CPU times, no
    /// agent figures (fill in what was measured with struct update syntax).
    pub fn new(policy: Policy, metrics: RunMetrics) -> Self {
        Self {
            policy,
            round: None,
            metrics,
            cpu_ns: 0,
            poll_ns: 0,
            policy_cpu_ns: 0,
            total_cpu_ns: 0,
            agent_cpu_ns: None,
            agent_maxrss_kib: None,
            decisions: None,
            retention_on_share: None,
            wake: None,
            tracer_cpu_ns: None,
        }
    }
}

/// The runs of one policy, summarized (medians with min..max and the rest in `Summary`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicySummary {
    pub policy: Policy,
    pub runs: usize,
    pub wall_s: Summary,
    /// Items per second (built-in kernels).
    pub throughput: Option<Summary>,
    /// The latency kernels' own latency, us.
    pub latency_p50_us: Option<Summary>,
    pub latency_p99_us: Option<Summary>,
    pub latency_mean_us: Option<Summary>,
    /// vCPUs busy, polling and in total over the run's wall time.
    pub busy_vcpus: Summary,
    pub poll_vcpus: Summary,
    pub total_vcpus: Summary,
    /// The policy's own threads, in vCPUs.
    pub policy_vcpus: Summary,
    /// Everything the run took from the vCPUs per item, us (built-in kernels).
    pub total_cpu_per_item_us: Option<Summary>,
}

/// Medians of a policy against stock's: > 1 is better than stock for speedup (wall time)
/// and for the latency ratios (stock latency / policy latency).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct VsStock {
    pub policy: Policy,
    pub speedup: f64,
    pub latency_p50: Option<f64>,
    pub latency_p99: Option<f64>,
    /// Total CPU per item (or per second) relative to stock's (> 1: more CPU).
    pub cpu: f64,
}

/// One policy against another, round by round: each ratio is of two runs of the same round,
/// so a stretch of minutes in which the machine is slower for every policy cancels out of it
/// (it does not cancel out of a ratio of medians). Oriented as [`VsStock`]: above 1 means
/// `policy` did better than `against` (`against`'s latency or wall time over `policy`'s, or
/// `policy`'s throughput over `against`'s). Each field summarizes the ratios of the rounds that
/// have both runs and the metric, with a 95% interval of their median ([`RoundRatios`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PerRound {
    pub policy: Policy,
    pub against: Policy,
    /// Rounds paired.
    pub rounds: usize,
    pub speedup: Option<RoundRatios>,
    pub throughput: Option<RoundRatios>,
    pub latency_p50: Option<RoundRatios>,
    pub latency_p99: Option<RoundRatios>,
    pub latency_mean: Option<RoundRatios>,
}

/// The ratios of one metric over the paired rounds: their summary (median [min..max]) and a
/// 95% bootstrap interval of the median (seeded: the same rounds give the same interval). An
/// interval that holds 1 says the rounds cannot tell the two policies apart.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RoundRatios {
    #[serde(flatten)]
    pub summary: Summary,
    pub median_ci95: Interval,
}

/// The bootstrap's seed for [`RoundRatios::median_ci95`]: fixed, so that a document summarized
/// again (`compare --from`) gives the same intervals.
const ROUND_CI_SEED: u64 = 0x6c65_616e;

impl RoundRatios {
    /// The ratios' summary and median interval; `None` without any.
    pub fn of(ratios: &[f64]) -> Option<Self> {
        Some(Self { summary: Summary::of(ratios).ok()?, median_ci95: median_ci(ratios, ROUND_CI_SEED).ok()? })
    }
}

/// `gleaner compare --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareDoc {
    pub command: Vec<String>,
    /// Runs of each policy.
    pub runs: u32,
    pub cpus: String,
    pub policies: Vec<Policy>,
    /// What the machine offers to keep idle vCPUs from halting, in one line.
    pub machine: String,
    /// Where the agent's calibration came from, in one line.
    pub calibration: Option<String>,
    /// Why a policy ran differently than asked, or a note about the measurement.
    pub notes: Vec<String>,
    pub samples: Vec<PolicyRun>,
    pub summaries: Vec<PolicySummary>,
    pub vs_stock: Vec<VsStock>,
    /// Every later policy (in [`Policy`]'s order) against every earlier one, round by round
    /// (absent in documents written before rounds were recorded).
    #[serde(default)]
    pub per_round: Vec<PerRound>,
}

impl CompareDoc {
    /// The summary of `p`.
    pub fn summary(&self, p: Policy) -> Option<&PolicySummary> {
        self.summaries.iter().find(|s| s.policy == p)
    }

    /// `policy` against `against`, round by round, if both ran.
    pub fn per_round(&self, policy: Policy, against: Policy) -> Option<&PerRound> {
        self.per_round.iter().find(|r| r.policy == policy && r.against == against)
    }
}

/// The order of the `n` policies in round `round` (indices into the list): a Williams design,
/// so that over `n` rounds (even `n`; `2n` for odd) every policy takes every place equally
/// often *and* follows every other policy equally often. A plain rotation balances only the
/// places: with it a policy always follows the same one, and whatever a run leaves behind on
/// the machine (a host that throttles a VM after seconds of two busy vCPUs, caches, the
/// haltpoll governor's windows) lands on the same neighbour every round.
pub fn round_order(n: usize, round: usize) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    // The first row 0, 1, n-1, 2, n-2, ...; each round adds its number to every entry.
    let first: Vec<usize> = (0..n).map(|j| if j % 2 == 1 { j.div_ceil(2) } else { (n - j / 2) % n }).collect();
    let row: Vec<usize> = first.iter().map(|&v| (v + round) % n).collect();
    // Odd n: the second n rounds are the first n reversed.
    if n % 2 == 1 && (round / n) % 2 == 1 {
        row.into_iter().rev().collect()
    } else {
        row
    }
}

/// Rounds after which [`round_order`] has balanced places and predecessors for `n` policies:
/// `n` when even, `2n` when odd (its second `n` rounds are the first ones reversed).
pub fn balanced_rounds(n: usize) -> usize {
    if n.is_multiple_of(2) {
        n
    } else {
        2 * n
    }
}

/// Pairs the runs of each round (module [`PerRound`]): for every two policies that ran, the
/// later in [`Policy`]'s order (stock first, the agent's forms last, `gleaner` the very last)
/// against the earlier. Runs without a round are left out.
pub fn per_round(samples: &[PolicyRun]) -> Vec<PerRound> {
    let find = |p: Policy, round: u32| samples.iter().find(|s| s.policy == p && s.round == Some(round));
    let rounds: std::collections::BTreeSet<u32> = samples.iter().filter_map(|s| s.round).collect();
    let ran: Vec<Policy> = samples.iter().map(|s| s.policy).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    let mut out = Vec::new();
    for (i, &against) in ran.iter().enumerate() {
        for &policy in &ran[i + 1..] {
            let pairs: Vec<(&PolicyRun, &PolicyRun)> = rounds.iter().filter_map(|&r| Some((find(policy, r)?, find(against, r)?))).collect();
            if pairs.is_empty() {
                continue;
            }
            // Each ratio is above 1 when `policy`'s value beats `against`'s in that round.
            let ratios = |f: &dyn Fn(&PolicyRun) -> Option<f64>, lower_is_better: bool| {
                let v: Vec<f64> = pairs
                    .iter()
                    .filter_map(|(p, a)| {
                        let (p, a) = (f(p)?, f(a)?);
                        let (num, den) = if lower_is_better { (a, p) } else { (p, a) };
                        (den > 0.0 && num.is_finite()).then(|| num / den)
                    })
                    .collect();
                RoundRatios::of(&v)
            };
            let lat = |g: fn(&crate::measure::LatencySummary) -> f64| ratios(&move |r: &PolicyRun| r.metrics.latency.as_ref().map(g), true);
            out.push(PerRound {
                policy,
                against,
                rounds: pairs.len(),
                speedup: ratios(&|r| Some(r.metrics.wall_ns as f64), true),
                throughput: ratios(&|r| r.metrics.throughput, false),
                latency_p50: lat(|l| l.p50_ns),
                latency_p99: lat(|l| l.p99_ns),
                latency_mean: lat(|l| l.mean_ns),
            });
        }
    }
    out
}

fn summary(v: &[f64]) -> Option<Summary> {
    Summary::of(v).ok()
}

/// Summarizes the runs of each policy, in the order given.
pub fn summarize(policies: &[Policy], samples: &[PolicyRun]) -> (Vec<PolicySummary>, Vec<VsStock>) {
    let mut out = Vec::new();
    for &p in policies {
        let runs: Vec<&PolicyRun> = samples.iter().filter(|s| s.policy == p).collect();
        if runs.is_empty() {
            continue;
        }
        let pick = |f: &dyn Fn(&PolicyRun) -> Option<f64>| -> Vec<f64> { runs.iter().filter_map(|r| f(r)).collect() };
        let wall = |r: &PolicyRun| r.metrics.wall_ns.max(1) as f64;
        let vcpus = |ns: u64, r: &PolicyRun| ns as f64 / wall(r);
        let lat = |f: fn(&crate::measure::LatencySummary) -> f64| summary(&pick(&|r| r.metrics.latency.as_ref().map(|l| f(l) / 1e3)));
        let Some(wall_s) = summary(&pick(&|r| Some(wall(r) / 1e9))) else { continue };
        out.push(PolicySummary {
            policy: p,
            runs: runs.len(),
            wall_s,
            throughput: summary(&pick(&|r| r.metrics.throughput)),
            latency_p50_us: lat(|l| l.p50_ns),
            latency_p99_us: lat(|l| l.p99_ns),
            latency_mean_us: lat(|l| l.mean_ns),
            busy_vcpus: summary(&pick(&|r| Some(vcpus(r.metrics.busy_ns, r)))).unwrap_or(wall_s),
            poll_vcpus: summary(&pick(&|r| Some(vcpus(r.poll_ns, r)))).unwrap_or(wall_s),
            total_vcpus: summary(&pick(&|r| Some(vcpus(r.total_cpu_ns, r)))).unwrap_or(wall_s),
            policy_vcpus: summary(&pick(&|r| Some(vcpus(r.policy_cpu_ns, r)))).unwrap_or(wall_s),
            total_cpu_per_item_us: summary(&pick(&|r| r.metrics.items.filter(|&i| i > 0).map(|i| r.total_cpu_ns as f64 / 1e3 / i as f64))),
        });
    }
    let stock = out.iter().find(|s| s.policy == Policy::Stock).cloned();
    let vs = match stock {
        None => Vec::new(),
        Some(st) => out
            .iter()
            .filter(|s| s.policy != Policy::Stock)
            .map(|s| {
                let ratio = |a: Option<&Summary>, b: Option<&Summary>| match (a, b) {
                    (Some(a), Some(b)) if b.p50 > 0.0 => Some(a.p50 / b.p50),
                    _ => None,
                };
                let cpu = match (&s.total_cpu_per_item_us, &st.total_cpu_per_item_us) {
                    (Some(a), Some(b)) if b.p50 > 0.0 => a.p50 / b.p50,
                    _ => s.total_vcpus.p50 * s.wall_s.p50 / (st.total_vcpus.p50 * st.wall_s.p50).max(f64::MIN_POSITIVE),
                };
                VsStock {
                    policy: s.policy,
                    speedup: st.wall_s.p50 / s.wall_s.p50,
                    latency_p50: ratio(st.latency_p50_us.as_ref(), s.latency_p50_us.as_ref()),
                    latency_p99: ratio(st.latency_p99_us.as_ref(), s.latency_p99_us.as_ref()),
                    cpu,
                }
            })
            .collect(),
    };
    (out, vs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::LatencySummary;

    fn run(policy: Policy, wall_ms: u64, p50_us: f64, busy_ms: u64, poll_ms: u64) -> PolicyRun {
        let latency =
            Some(LatencySummary { samples: 100, p50_ns: p50_us * 1e3, p99_ns: p50_us * 2e3, mean_ns: p50_us * 1e3, ..Default::default() });
        let metrics =
            RunMetrics { wall_ns: wall_ms * 1_000_000, busy_ns: busy_ms * 1_000_000, items: Some(1000), latency, ..Default::default() };
        PolicyRun { poll_ns: poll_ms * 1_000_000, total_cpu_ns: (busy_ms + poll_ms) * 1_000_000, ..PolicyRun::new(policy, metrics) }
    }

    #[test]
    fn summaries_count_polling_as_cpu_and_compare_with_stock() {
        let samples = vec![
            run(Policy::Stock, 1000, 40.0, 300, 0),
            run(Policy::HALTPOLL, 1000, 5.0, 400, 600),
            run(Policy::Stock, 1000, 42.0, 300, 0),
            run(Policy::HALTPOLL, 1000, 4.0, 400, 600),
        ];
        let (s, vs) = summarize(&[Policy::Stock, Policy::HALTPOLL], &samples);
        assert_eq!(s.len(), 2);
        let h = &s[1];
        assert!((h.total_vcpus.p50 - 1.0).abs() < 1e-9 && (h.poll_vcpus.p50 - 0.6).abs() < 1e-9);
        assert!((h.total_cpu_per_item_us.unwrap().p50 - 1000.0).abs() < 1e-9);
        assert_eq!(vs.len(), 1);
        assert!((vs[0].latency_p50.unwrap() - 41.0 / 4.5).abs() < 1e-9, "{vs:?}");
        assert!((vs[0].cpu - 1000.0 / 300.0).abs() < 1e-9);
        assert!((vs[0].speedup - 1.0).abs() < 1e-12);
    }

    fn in_round(mut r: PolicyRun, round: u32) -> PolicyRun {
        r.round = Some(round);
        r
    }

    /// The machine turns twice as slow in the middle of round 2, between stock's run and
    /// haltpoll's, and stays slow. Haltpoll is 1.25x better than stock at either speed. The
    /// ratio of medians compares stock's fast median with haltpoll's slow one and says haltpoll
    /// is worse; the per-round ratio says 1.25x, with the one split round as its minimum.
    #[test]
    fn per_round_ratios_cancel_a_slow_stretch_that_ratios_of_medians_do_not() {
        let stock_speed = [1.0, 1.0, 1.0, 2.0, 2.0];
        let haltpoll_speed = [1.0, 1.0, 2.0, 2.0, 2.0];
        let mut samples = Vec::new();
        for i in 0..5 {
            let round = u32::try_from(i).unwrap();
            samples.push(in_round(run(Policy::Stock, 1000, 50.0 * stock_speed[i], 300, 0), round));
            samples.push(in_round(run(Policy::HALTPOLL, 1000, 40.0 * haltpoll_speed[i], 300, 0), round));
        }
        let (_, vs) = summarize(&[Policy::Stock, Policy::HALTPOLL], &samples);
        assert!((vs[0].latency_p50.unwrap() - 50.0 / 80.0).abs() < 1e-9, "{vs:?}");
        let pr = per_round(&samples);
        assert_eq!(pr.len(), 1, "{pr:?}");
        let r = &pr[0];
        assert_eq!((r.policy, r.against, r.rounds), (Policy::HALTPOLL, Policy::Stock, 5));
        let p50 = r.latency_p50.unwrap().summary;
        assert!((p50.p50 - 1.25).abs() < 1e-9 && (p50.min - 0.625).abs() < 1e-9 && (p50.max - 1.25).abs() < 1e-9, "{p50:?}");
        assert!((r.speedup.unwrap().summary.p50 - 1.0).abs() < 1e-12);
        // Four rounds of five at 1.25: the median's interval is 1.25 at both ends or holds
        // the split round's 0.625 at its low end, never above 1.25.
        let ci = r.latency_p50.unwrap().median_ci95;
        assert!(ci.lo >= 0.625 - 1e-9 && (ci.hi - 1.25).abs() < 1e-9, "{ci:?}");
        assert!(r.throughput.is_none(), "no throughput in these runs");
    }

    #[test]
    fn per_round_pairs_only_runs_of_the_same_round_and_later_policies_against_earlier_ones() {
        let samples = vec![
            in_round(run(Policy::Gleaner, 1000, 10.0, 300, 0), 0),
            in_round(run(Policy::Stock, 1000, 20.0, 300, 0), 0),
            in_round(run(Policy::Yielders, 500, 40.0, 300, 0), 0),
            // Round 1 lost its stock run; a run without a round pairs with nothing.
            in_round(run(Policy::Gleaner, 1000, 10.0, 300, 0), 1),
            in_round(run(Policy::Yielders, 500, 5.0, 300, 0), 1),
            run(Policy::Stock, 1000, 1.0, 300, 0),
        ];
        let pr = per_round(&samples);
        let names: Vec<(Policy, Policy, usize)> = pr.iter().map(|r| (r.policy, r.against, r.rounds)).collect();
        assert_eq!(
            names,
            [(Policy::Yielders, Policy::Stock, 1), (Policy::Gleaner, Policy::Stock, 1), (Policy::Gleaner, Policy::Yielders, 2)]
        );
        let gn = &pr[2];
        // Round 0: naive 40 over gleaner 10 = 4; round 1: 5 / 10 = 0.5; median 2.25.
        let l = gn.latency_p50.unwrap().summary;
        assert!((l.p50 - 2.25).abs() < 1e-9 && (l.min - 0.5).abs() < 1e-9 && (l.max - 4.0).abs() < 1e-9, "{l:?}");
        // Wall: naive's 500 ms over gleaner's 1000 ms in both rounds.
        assert!((gn.speedup.unwrap().summary.p50 - 0.5).abs() < 1e-9);
        // Two rounds that disagree (0.5 and 4): the interval of their median holds 1.
        assert!(!gn.latency_p50.unwrap().median_ci95.excludes(1.0));
    }

    #[test]
    fn round_orders_balance_places_and_predecessors() {
        for n in 1..=6usize {
            let rounds = balanced_rounds(n);
            let mut place = vec![vec![0usize; n]; n];
            let mut follows = vec![vec![0usize; n]; n];
            for r in 0..rounds {
                let row = round_order(n, r);
                let mut sorted = row.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "n {n} round {r}: {row:?}");
                for (j, &p) in row.iter().enumerate() {
                    place[p][j] += 1;
                }
                for w in row.windows(2) {
                    follows[w[0]][w[1]] += 1;
                }
            }
            let per_place = rounds / n;
            assert!(place.iter().flatten().all(|&c| c == per_place), "n {n}: places {place:?}");
            let per_pair = if n % 2 == 0 { 1 } else { 2 };
            for (a, row) in follows.iter().enumerate() {
                for (b, &c) in row.iter().enumerate() {
                    assert_eq!(c, if a == b { 0 } else { per_pair }, "n {n}: {a} before {b}: {follows:?}");
                }
            }
        }
        assert_eq!(round_order(4, 0), [0, 1, 3, 2]);
        assert!(round_order(0, 3).is_empty());
    }

    #[test]
    fn a_document_without_rounds_still_reads() {
        let v = serde_json::json!({
            "command": ["x"], "runs": 1, "cpus": "0", "policies": ["stock"], "machine": "",
            "calibration": null, "notes": [], "samples": [], "summaries": [], "vs_stock": []
        });
        let d: CompareDoc = serde_json::from_value(v).unwrap();
        assert!(d.per_round.is_empty());
        let r = serde_json::to_value(run(Policy::Stock, 1, 1.0, 1, 0)).unwrap();
        assert!(r.get("round").is_none());
    }

    #[test]
    fn a_run_keeps_the_mode_key_and_policies_their_names() {
        let v = serde_json::to_value(run(Policy::Yielders, 1, 1.0, 1, 0)).unwrap();
        assert_eq!(v["mode"], "yielders");
        assert!(v.get("wall_ns").is_some() && v.get("total_cpu_ns").is_some());
        let back: PolicyRun = serde_json::from_value(v).unwrap();
        assert_eq!(back.policy, Policy::Yielders);
        // Written by an older compare.
        let mut old = serde_json::to_value(run(Policy::Yielders, 1, 1.0, 1, 0)).unwrap();
        old["mode"] = "naive".into();
        assert_eq!(serde_json::from_value::<PolicyRun>(old).unwrap().policy, Policy::Yielders);
    }
}
