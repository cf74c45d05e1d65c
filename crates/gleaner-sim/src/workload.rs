//! Workloads as thread programs: groups of identical threads, each running a body of
//! operations (compute bursts and synchronization) a number of times.
//!
//! Operations are written as short strings in scenario files and in the built-ins:
//!
//! ```text
//!   compute 50us          a CPU burst of 50 us
//!   compute 50us +-20%    uniformly drawn in [40 us, 60 us] from the seeded RNG
//!   lock NAME / unlock NAME            a blocking mutex (FIFO hand-off to the first waiter)
//!   push NAME / pop NAME               a bounded queue (mutex + two condvars, like PARSEC's);
//!                                      `pop` on a closed, empty queue ends the thread
//!   signal NAME / wait NAME            a condvar with its predicate counter (wake-up tokens)
//!   barrier NAME                       a blocking barrier over every thread that names it
//!   spin_barrier NAME                  a user-level spinning barrier (burns CPU, PLE exits)
//!   sleep 55us                         nanosleep (arms a timer: a TSC_DEADLINE exit in a VM)
//!   io 100us                           a blocking I/O request (an I/O exit, then an interrupt)
//!   arrive 2000/s                      sleep until the thread's next arrival of a Poisson
//!                                      process at that rate (an open loop's sender), and
//!                                      stamp the request with its scheduled time
//!   stamp                              stamp the request with the current time (a closed loop)
//!   record                             record now - the request's stamp: the request latency
//! ```
//!
//! A request's stamp travels with it: `push` puts the pushing thread's stamp into the queue
//! (or hands it to the thread it wakes), `pop` gives the popping thread the stamp of the item
//! it takes, in FIFO order. `signal`/`wait` hand no item over: a closed loop stamps and records
//! on the same thread. A VM whose workload records reports the request latency's p50/p99.
//!
//! A group's `iterations` bounds its loop; without it the group runs until one of its input
//! queues closes (a queue closes when every thread that pushes to it has ended), or forever
//! (background load such as matmul or freqsleep).

use std::collections::BTreeMap;

use gleaner_policy::num::saturating_u64;
use serde::{Deserialize, Serialize};

use crate::queue::Ns;

/// One operation of a thread body, with names resolved to per-VM object indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Compute {
        mean_ns: Ns,
        jitter_pm: u32,
    },
    Lock(u32),
    Unlock(u32),
    Push(u32),
    Pop(u32),
    Signal(u32),
    Wait(u32),
    Barrier(u32),
    SpinBarrier(u32),
    Sleep(Ns),
    Io(Ns),
    /// Sleep to the next arrival of a Poisson process with this mean gap.
    Arrive {
        mean_gap_ns: Ns,
    },
    Stamp,
    Record,
}

/// How a workload uses the last-level cache (for AQL's LLC cursors and the cost of cache refills
/// after a vCPU switch).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheProfile {
    /// LLC references per microsecond of computation.
    pub refs_per_us: f64,
    /// Fraction of references that miss in steady state.
    pub miss_ratio: f64,
    /// Working set that must be refilled after another vCPU ran on the pCPU.
    pub wss_kb: f64,
    /// Extra computation per KiB refilled (0: switches cost no refill time).
    pub refill_ns_per_kb: f64,
}

impl Default for CacheProfile {
    fn default() -> Self {
        Self { refs_per_us: 5.0, miss_ratio: 0.05, wss_kb: 256.0, refill_ns_per_kb: 0.0 }
    }
}

/// A workload as written in a scenario file (`[workload.NAME]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadCfg {
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub cache: CacheProfile,
    /// Capacity of every queue of this workload.
    #[serde(default = "default_capacity")]
    pub queue_capacity: u32,
    #[serde(rename = "group")]
    pub groups: Vec<GroupCfg>,
}

fn default_capacity() -> u32 {
    32
}

/// A group of threads running the same body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupCfg {
    pub name: String,
    /// Number of threads; default: the VM's `threads` (itself defaulting to its vCPU count).
    #[serde(default)]
    pub threads: Option<u32>,
    /// Loop count; omitted: until an input queue closes, or forever.
    #[serde(default)]
    pub iterations: Option<u64>,
    /// Pin thread i of the group to vCPU `pin[i % len]`.
    #[serde(default)]
    pub pin: Vec<u32>,
    pub ops: Vec<String>,
}

/// A resolved group: its program and thread count.
#[derive(Debug, Clone)]
pub struct Group {
    pub name: String,
    pub threads: u32,
    pub iterations: Option<u64>,
    pub pin: Vec<u32>,
    pub ops: Vec<Op>,
}

/// A resolved workload, ready for the engine.
#[derive(Debug, Clone)]
pub struct Workload {
    pub name: String,
    pub cache: CacheProfile,
    pub groups: Vec<Group>,
    pub mutexes: u32,
    pub queues: Vec<u32>,
    pub conds: u32,
    /// Participants of each barrier (every thread that names it).
    pub barriers: Vec<u32>,
    pub spin_barriers: Vec<u32>,
    /// Number of threads pushing to each queue (it closes when they have all ended).
    pub queue_producers: Vec<u32>,
    /// Whether some thread never ends (no iterations and no input queue).
    pub runs_forever: bool,
    /// Whether a thread records request latencies (then queues carry the requests' stamps).
    pub records: bool,
}

/// Parses a duration such as `50us`, `1.5ms`, `200ns`, `2s`.
pub fn parse_duration(s: &str) -> Option<Ns> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("ns") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix("us") {
        (n, 1e3)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e6)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e9)
    } else {
        return None;
    };
    let v: f64 = num.trim().parse().ok()?;
    if !v.is_finite() || v < 0.0 {
        return None;
    }
    let ns = (v * mult).round();
    (ns < 1e18).then_some(saturating_u64(ns))
}

const OPS_ALLOWED: &str = "compute DURATION [+-N%], lock M, unlock M, push Q, pop Q, signal C, wait C, \
     barrier B, spin_barrier B, sleep DURATION, io DURATION, arrive RATE/s, stamp, record \
     (DURATION like 50us, 1.5ms, 200ns; RATE a number of requests per second, 0.001..=10000000)";

#[derive(Default)]
struct Names {
    mutex: BTreeMap<String, u32>,
    queue: BTreeMap<String, u32>,
    cond: BTreeMap<String, u32>,
    barrier: BTreeMap<String, u32>,
    spin: BTreeMap<String, u32>,
}

fn intern(map: &mut BTreeMap<String, u32>, name: &str) -> u32 {
    let n = map.len() as u32;
    *map.entry(name.to_string()).or_insert(n)
}

fn parse_op(names: &mut Names, s: &str, key: &str) -> anyhow::Result<Op> {
    let bad = || gleaner_policy::input::BadInput::new(key, s, OPS_ALLOWED);
    let words: Vec<&str> = s.split_whitespace().collect();
    let (&verb, rest) = words.split_first().ok_or_else(bad)?;
    let dur = |w: Option<&&str>| w.and_then(|w| parse_duration(w)).ok_or_else(bad);
    let name = |rest: &[&str]| -> anyhow::Result<String> {
        match rest {
            [n] => Ok((*n).to_string()),
            _ => Err(bad().into()),
        }
    };
    Ok(match verb {
        "compute" => {
            let mean_ns = dur(rest.first())?;
            let jitter_pm = match rest.get(1..) {
                Some([]) | None => 0,
                Some([j]) => {
                    let p: f64 = j
                        .strip_prefix("+-")
                        .and_then(|j| j.strip_suffix('%'))
                        .and_then(|j| j.parse().ok())
                        .filter(|p: &f64| (0.0..=100.0).contains(p))
                        .ok_or_else(bad)?;
                    gleaner_policy::num::saturating_u32((p * 10.0).round())
                }
                Some(_) => return Err(bad().into()),
            };
            Op::Compute { mean_ns, jitter_pm }
        }
        "sleep" if rest.len() == 1 => Op::Sleep(dur(rest.first())?),
        "io" if rest.len() == 1 => Op::Io(dur(rest.first())?),
        "arrive" if rest.len() == 1 => {
            let rate: f64 = rest[0].strip_suffix("/s").and_then(|r| r.parse().ok()).ok_or_else(bad)?;
            if !(0.001..=1e7).contains(&rate) {
                return Err(bad().into());
            }
            Op::Arrive { mean_gap_ns: saturating_u64((1e9 / rate).round()).max(1) }
        }
        "stamp" if rest.is_empty() => Op::Stamp,
        "record" if rest.is_empty() => Op::Record,
        "lock" => Op::Lock(intern(&mut names.mutex, &name(rest)?)),
        "unlock" => Op::Unlock(intern(&mut names.mutex, &name(rest)?)),
        "push" => Op::Push(intern(&mut names.queue, &name(rest)?)),
        "pop" => Op::Pop(intern(&mut names.queue, &name(rest)?)),
        "signal" => Op::Signal(intern(&mut names.cond, &name(rest)?)),
        "wait" => Op::Wait(intern(&mut names.cond, &name(rest)?)),
        "barrier" => Op::Barrier(intern(&mut names.barrier, &name(rest)?)),
        "spin_barrier" => Op::SpinBarrier(intern(&mut names.spin, &name(rest)?)),
        _ => return Err(bad().into()),
    })
}

impl WorkloadCfg {
    /// Resolves names and thread counts for a VM with `default_threads` threads and `vcpus` vCPUs.
    pub fn resolve(&self, name: &str, default_threads: u32, vcpus: u32) -> anyhow::Result<Workload> {
        self.check_tables(name)?;
        let mut names = Names::default();
        let mut groups = Vec::new();
        for g in &self.groups {
            groups.push(resolve_group(g, name, default_threads, vcpus, &mut names)?);
        }
        let users = count_users(&groups, &names, name)?;
        let records = groups.iter().any(|g| g.ops.contains(&Op::Record));
        Ok(Workload {
            name: name.to_string(),
            cache: self.cache,
            groups,
            mutexes: names.mutex.len() as u32,
            queues: vec![self.queue_capacity; names.queue.len()],
            conds: names.cond.len() as u32,
            barriers: users.barriers,
            spin_barriers: users.spin_barriers,
            queue_producers: users.queue_producers,
            runs_forever: users.runs_forever,
            records,
        })
    }

    /// At least one group, a queue capacity, and the cache profile's numbers in range.
    fn check_tables(&self, name: &str) -> anyhow::Result<()> {
        if self.groups.is_empty() {
            return Err(gleaner_policy::input::BadInput::new(format!("workload.{name}.group"), "[]", "at least one group").into());
        }
        if self.queue_capacity == 0 {
            return Err(gleaner_policy::input::BadInput::new(format!("workload.{name}.queue_capacity"), 0, ">= 1").into());
        }
        let c = &self.cache;
        for (k, v) in [("refs_per_us", c.refs_per_us), ("wss_kb", c.wss_kb), ("refill_ns_per_kb", c.refill_ns_per_kb)] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(gleaner_policy::input::BadInput::new(format!("workload.{name}.cache.{k}"), v, "a number >= 0").into());
            }
        }
        if !(0.0..=1.0).contains(&c.miss_ratio) {
            return Err(gleaner_policy::input::BadInput::new(format!("workload.{name}.cache.miss_ratio"), c.miss_ratio, "0..=1").into());
        }
        Ok(())
    }
}

/// One thread group: its thread count, its ops parsed (sync objects named in `names`), a body
/// that advances time, pins within the VM and a loop count of at least one.
fn resolve_group(g: &GroupCfg, name: &str, default_threads: u32, vcpus: u32, names: &mut Names) -> anyhow::Result<Group> {
    let key = |what: &str| format!("workload.{name}.group.{}.{what}", g.name);
    let threads = g.threads.unwrap_or(default_threads);
    if threads == 0 || threads > 1 << 20 {
        return Err(gleaner_policy::input::BadInput::new(key("threads"), threads, "1..=1048576").into());
    }
    let mut ops = Vec::new();
    for s in &g.ops {
        ops.push(parse_op(names, s, &key("ops"))?);
    }
    let advances = ops.iter().any(|o| match o {
        Op::Compute { mean_ns, .. } => *mean_ns > 0,
        Op::Sleep(ns) | Op::Io(ns) => *ns > 0,
        Op::Arrive { .. } => true,
        _ => false,
    });
    if !advances {
        return Err(gleaner_policy::input::BadInput::new(
            key("ops"),
            g.ops.join("; "),
            "a body with at least one compute, sleep or io of non-zero length",
        )
        .into());
    }
    if let Some(&bad) = g.pin.iter().find(|&&p| p >= vcpus) {
        return Err(gleaner_policy::input::BadInput::new(key("pin"), bad, format!("vCPU indices 0..{vcpus}")).into());
    }
    if g.iterations == Some(0) {
        return Err(gleaner_policy::input::BadInput::new(key("iterations"), 0, ">= 1 (or omit it)").into());
    }
    Ok(Group { name: g.name.clone(), threads, iterations: g.iterations, pin: g.pin.clone(), ops })
}

/// Who uses each sync object: the producers of each queue and the threads at each barrier.
#[derive(Debug)]
struct Users {
    queue_producers: Vec<u32>,
    barriers: Vec<u32>,
    spin_barriers: Vec<u32>,
    /// Some group loops forever and pops nothing (it ends only with the run).
    runs_forever: bool,
}

/// Counts each sync object's users over the groups; threads at a barrier must all run a
/// known number of iterations.
fn count_users(groups: &[Group], names: &Names, name: &str) -> anyhow::Result<Users> {
    let nq = names.queue.len();
    let mut u = Users {
        queue_producers: vec![0u32; nq],
        barriers: vec![0u32; names.barrier.len()],
        spin_barriers: vec![0u32; names.spin.len()],
        runs_forever: false,
    };
    for g in groups {
        let mut seen_q = vec![false; nq];
        let mut seen_b = vec![false; u.barriers.len()];
        let mut seen_s = vec![false; u.spin_barriers.len()];
        let mut pops = false;
        for op in &g.ops {
            match *op {
                Op::Push(q) => seen_q[q as usize] = true,
                Op::Pop(_) => pops = true,
                Op::Barrier(b) => seen_b[b as usize] = true,
                Op::SpinBarrier(b) => seen_s[b as usize] = true,
                _ => {}
            }
        }
        for (count, seen) in [(&mut u.queue_producers, &seen_q), (&mut u.barriers, &seen_b), (&mut u.spin_barriers, &seen_s)] {
            for (i, s) in seen.iter().enumerate() {
                if *s {
                    count[i] += g.threads;
                }
            }
        }
        if g.iterations.is_none() && !pops {
            u.runs_forever = true;
        }
        if (seen_b.iter().any(|s| *s) || seen_s.iter().any(|s| *s)) && g.iterations.is_none() {
            return Err(gleaner_policy::input::BadInput::new(
                format!("workload.{name}.group.{}.iterations", g.name),
                "none",
                "a loop count: threads at a barrier must all run a known number of iterations",
            )
            .into());
        }
    }
    Ok(u)
}

/// Names of the built-in workloads, with a one-line description.
pub const BUILTINS: &[(&str, &str)] = &[
    ("dedup", "PARSEC dedup-like 5-stage pipeline (1 + 3xN + 1 threads, queues, a hash-table mutex)"),
    ("streamcluster", "PARSEC streamcluster-like: 60 us computations between barriers"),
    ("matmul", "CPU hog: 10 ms bursts, no synchronization (LLC friendly)"),
    ("freqsleep", "nanosleep(1) in a loop on every thread (55 us with timer slack)"),
    ("mutex", "lock-heavy: 20 us of work, then 4 us inside one shared mutex"),
    ("condvar", "producer/consumer hand-off through a condvar, 15 us per item"),
    ("spinbarrier", "60 us computations between user-level spinning barriers"),
    ("barrier-coarse", "2 ms computations between barriers"),
    ("pipeline-coarse", "the dedup pipeline with 10x longer stages"),
    ("blackscholes", "embarrassingly parallel 5 ms bursts"),
    ("pingpong", "two threads waking each other through condvars (Table 2's wake-up test)"),
];

fn ops(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn group(name: &str, threads: u32, iterations: Option<u64>, body: &[&str]) -> GroupCfg {
    GroupCfg { name: name.into(), threads: Some(threads), iterations, pin: Vec::new(), ops: ops(body) }
}

fn scaled(base: f64, scale: f64) -> u64 {
    saturating_u64((base * scale).round()).max(1)
}

fn dedup(t: u32, scale: f64, forever: bool, stretch: f64) -> WorkloadCfg {
    let items = (!forever).then(|| scaled(2000.0, scale));
    let d = |us: f64| format!("{}ns", saturating_u64((us * 1000.0 * stretch).round()));
    WorkloadCfg {
        description: "dedup-like pipeline".into(),
        cache: CacheProfile { refs_per_us: 20.0, miss_ratio: 0.05, wss_kb: 256.0, refill_ns_per_kb: 0.0 },
        queue_capacity: 32,
        groups: vec![
            group("fragment", 1, items, &[&format!("compute {} +-20%", d(20.0)), "push chunks"]),
            group("refine", t, None, &["pop chunks", &format!("compute {} +-50%", d(25.0)), "push refined"]),
            group(
                "dedup",
                t,
                None,
                &[
                    "pop refined",
                    "lock hashtable",
                    &format!("compute {}", d(3.0)),
                    "unlock hashtable",
                    &format!("compute {} +-50%", d(10.0)),
                    "push unique",
                ],
            ),
            group("compress", t, None, &["pop unique", &format!("compute {} +-50%", d(40.0)), "push compressed"]),
            group("reorder", 1, None, &["pop compressed", &format!("compute {}", d(4.0))]),
        ],
    }
}

/// The built-in workload `name` for `threads` threads (per stage for pipelines), scaled by
/// `scale` (amount of work), looping forever if `forever` (background VMs).
pub fn builtin(name: &str, threads: u32, scale: f64, forever: bool) -> Option<WorkloadCfg> {
    let it = |base: f64| (!forever).then(|| scaled(base, scale));
    // Barrier workloads need a loop count; as background load they run "forever".
    let it_b = |base: f64| Some(if forever { u64::MAX } else { scaled(base, scale) });
    let simple = |desc: &str, cache: CacheProfile, groups: Vec<GroupCfg>| WorkloadCfg {
        description: desc.into(),
        cache,
        queue_capacity: 32,
        groups,
    };
    let cpu = CacheProfile { refs_per_us: 2.0, miss_ratio: 0.02, wss_kb: 32.0, refill_ns_per_kb: 0.0 };
    Some(match name {
        "dedup" => dedup(threads, scale, forever, 1.0),
        "pipeline-coarse" => dedup(threads, scale / 10.0, forever, 10.0),
        "streamcluster" => simple(
            "barrier-intensive",
            CacheProfile { refs_per_us: 30.0, miss_ratio: 0.4, wss_kb: 16384.0, refill_ns_per_kb: 0.0 },
            vec![group("worker", threads, it_b(1500.0), &["compute 60us +-20%", "barrier step"])],
        ),
        "matmul" => simple(
            "CPU hog",
            CacheProfile { refs_per_us: 40.0, miss_ratio: 0.02, wss_kb: 2048.0, refill_ns_per_kb: 10.0 },
            vec![group("worker", threads, it(10.0), &["compute 10ms"])],
        ),
        "freqsleep" => simple("sleep loop", cpu, vec![group("sleeper", threads, it(2000.0), &["sleep 55us", "compute 2us"])]),
        "mutex" => simple(
            "lock-heavy",
            CacheProfile::default(),
            vec![group("worker", threads, it(3000.0), &["compute 20us +-30%", "lock m", "compute 4us", "unlock m"])],
        ),
        "condvar" => {
            let half = (threads / 2).max(1);
            simple(
                "producer/consumer",
                CacheProfile::default(),
                vec![
                    group("producer", half, it(3000.0), &["compute 15us +-30%", "signal items"]),
                    group("consumer", half, it(3000.0), &["wait items", "compute 15us +-30%"]),
                ],
            )
        }
        "spinbarrier" => simple(
            "spin barriers",
            CacheProfile::default(),
            vec![group("worker", threads, it_b(1500.0), &["compute 60us +-20%", "spin_barrier step"])],
        ),
        "barrier-coarse" => simple(
            "coarse barriers",
            CacheProfile::default(),
            vec![group("worker", threads, it_b(50.0), &["compute 2ms +-10%", "barrier step"])],
        ),
        "blackscholes" => simple("parallel", cpu, vec![group("worker", threads, it(20.0), &["compute 5ms +-5%"])]),
        "pingpong" => simple(
            "wake-up ping-pong",
            cpu,
            vec![
                GroupCfg {
                    name: "ping".into(),
                    threads: Some(1),
                    iterations: Some(scaled(2000.0, scale)),
                    pin: vec![0],
                    ops: ops(&["compute 50us", "signal ping", "wait pong"]),
                },
                GroupCfg {
                    name: "pong".into(),
                    threads: Some(1),
                    iterations: Some(scaled(2000.0, scale)),
                    pin: vec![1],
                    ops: ops(&["wait ping", "compute 1us", "signal pong"]),
                },
            ],
        ),
        _ => return None,
    })
}

/// Allowed workload names for error messages.
pub fn builtin_names() -> String {
    BUILTINS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("50us"), Some(50_000));
        assert_eq!(parse_duration("1.5ms"), Some(1_500_000));
        assert_eq!(parse_duration("200ns"), Some(200));
        assert_eq!(parse_duration("2s"), Some(2_000_000_000));
        assert_eq!(parse_duration("-1us"), None);
        assert_eq!(parse_duration("10"), None);
        assert_eq!(parse_duration(""), None);
    }

    #[test]
    fn every_builtin_resolves() {
        for (name, _) in BUILTINS {
            let w = builtin(name, 4, 1.0, false).expect("builtin");
            let r = w.resolve(name, 4, 4).expect("resolves");
            assert!(!r.groups.is_empty());
            if *name != "matmul" && *name != "blackscholes" && *name != "freqsleep" {
                assert!(!r.runs_forever, "{name}");
            }
        }
        let fg = builtin("matmul", 4, 1.0, true).expect("builtin").resolve("matmul", 4, 4).expect("ok");
        assert!(fg.runs_forever);
    }

    #[test]
    fn dedup_counts_producers_and_barriers() {
        let w = builtin("dedup", 3, 1.0, false).expect("b").resolve("dedup", 3, 3).expect("ok");
        assert_eq!(w.queues.len(), 4);
        assert_eq!(w.queue_producers, vec![1, 3, 3, 3]);
        let s = builtin("streamcluster", 5, 1.0, false).expect("b").resolve("s", 5, 5).expect("ok");
        assert_eq!(s.barriers, vec![5]);
    }

    #[test]
    fn request_ops_parse_and_mark_the_workload_as_recording() {
        let cfg = WorkloadCfg {
            description: String::new(),
            cache: CacheProfile::default(),
            queue_capacity: 4,
            groups: vec![
                group("s", 1, Some(10), &["arrive 2000/s", "push q"]),
                group("r", 1, None, &["pop q", "compute 1us", "stamp", "record"]),
            ],
        };
        let w = cfg.resolve("w", 1, 2).expect("ok");
        assert_eq!(w.groups[0].ops[0], Op::Arrive { mean_gap_ns: 500_000 });
        assert_eq!(w.groups[1].ops[2..], [Op::Stamp, Op::Record]);
        assert!(w.records);
        assert!(!builtin("dedup", 2, 1.0, false).expect("b").resolve("d", 2, 2).expect("ok").records);
        for bad in ["arrive 2000", "arrive 0/s", "arrive -5/s", "arrive fast/s", "stamp now", "record x"] {
            let c = WorkloadCfg { groups: vec![group("g", 1, Some(1), &["compute 1us", bad])], ..cfg.clone() };
            let e = c.resolve("w", 1, 1).expect_err(bad);
            let b = e.downcast_ref::<gleaner_policy::input::BadInput>().expect("BadInput");
            assert!(b.allowed.contains("arrive RATE/s"), "{bad}: {}", b.allowed);
        }
        // An arrival advances time: a sender needs no compute.
        let only = WorkloadCfg { groups: vec![group("g", 1, Some(1), &["arrive 10/s"])], ..cfg };
        assert!(only.resolve("w", 1, 1).is_ok());
    }

    #[test]
    fn bad_ops_name_the_key_and_allowed_forms() {
        let cfg = WorkloadCfg {
            description: String::new(),
            cache: CacheProfile::default(),
            queue_capacity: 4,
            groups: vec![group("g", 1, Some(1), &["compute 5 parsecs"])],
        };
        let e = cfg.resolve("w", 1, 1).expect_err("bad op");
        let b = e.downcast_ref::<gleaner_policy::input::BadInput>().expect("BadInput");
        assert_eq!(b.what, "workload.w.group.g.ops");
        assert!(b.allowed.contains("compute DURATION"));
        let cfg2 = WorkloadCfg { groups: vec![group("g", 1, Some(1), &["lock a", "unlock a"])], ..cfg.clone() };
        assert!(cfg2.resolve("w", 1, 1).is_err(), "a body that never advances time is refused");
        let cfg3 = WorkloadCfg { groups: vec![group("g", 1, None, &["compute 1us", "barrier b"])], ..cfg };
        assert!(cfg3.resolve("w", 1, 1).is_err(), "barriers need iterations");
    }
}
