//! [`WakeTracer`]: the maps, the three programs of [`super::progs`] loaded and verified, their
//! raw tracepoint attachments, and the reading of what they counted as a
//! [`gleaner_policy::idle::WakeTrace`].

use std::collections::BTreeSet;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use gleaner_policy::idle::hist::BUCKETS;
use gleaner_policy::idle::{Log2Hist, TargetState, TraceSource, VcpuGaps, WakeLatency, WakeTrace};
use serde::Serialize;

use super::insn::{AsmError, Insn};
use super::progs::{self, MapFds};
use super::sys::{self, map_type, Map, MapSpec};
use super::TraceError;
use crate::cpuset::CpuSet;
use crate::error::OsError;
use crate::sysfs::Sysfs;
use crate::BadInput;

/// What to trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracerConfig {
    /// The vCPUs whose idle periods [`WakeTracer::read`] reports (latencies are counted on
    /// every CPU).
    pub cpus: CpuSet,
    /// The cpuidle index of the POLL state (`Sysfs::cpuidle_states`), if the CPUs have one:
    /// idle periods spent there count as `poll`, any other state as `halt`.
    pub poll_state: Option<u32>,
}

impl TracerConfig {
    /// Every online CPU, and the index of the state named `POLL` among the first one's cpuidle
    /// states.
    pub fn detect(sysfs: &Sysfs) -> Result<Self, TraceError> {
        let cpus = sysfs.online_cpus()?;
        let poll_state = match cpus.first() {
            Some(c) => sysfs.cpuidle_states(c)?.into_iter().find(|s| s.name == "POLL").map(|s| s.index),
            None => None,
        };
        Ok(Self { cpus, poll_state })
    }
}

/// The programs' cost, summed over them (`BPF_ENABLE_STATS` must be on for them to grow: see
/// [`WakeTracer::enable_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ProgStats {
    /// Time spent in the programs, ns.
    pub run_time_ns: u64,
    /// Times they ran (one per traced event).
    pub run_cnt: u64,
    /// Events a program missed because it was already running on that CPU (an interrupt
    /// inside it).
    pub recursion_misses: u64,
}

impl ProgStats {
    /// Mean cost of one event, ns.
    #[must_use]
    pub fn ns_per_run(&self) -> Option<f64> {
        (self.run_cnt > 0).then(|| self.run_time_ns as f64 / self.run_cnt as f64)
    }

    /// What was added since `earlier`.
    #[must_use]
    pub fn delta_since(&self, earlier: &Self) -> Self {
        Self {
            run_time_ns: self.run_time_ns.saturating_sub(earlier.run_time_ns),
            run_cnt: self.run_cnt.saturating_sub(earlier.run_cnt),
            recursion_misses: self.recursion_misses.saturating_sub(earlier.recursion_misses),
        }
    }

    fn add(&mut self, o: &Self) {
        self.run_time_ns = self.run_time_ns.saturating_add(o.run_time_ns);
        self.run_cnt = self.run_cnt.saturating_add(o.run_cnt);
        self.recursion_misses = self.recursion_misses.saturating_add(o.recursion_misses);
    }
}

/// Keeps the kernel's BPF run-time statistics on while it lives (`BPF_ENABLE_STATS`); they go
/// off when the last holder closes its fd. `kernel.bpf_stats_enabled` is never written.
#[derive(Debug)]
pub struct StatsGuard {
    _fd: OwnedFd,
}

/// One loaded program.
#[derive(Debug)]
struct Prog {
    /// The raw tracepoint it attaches to.
    tracepoint: &'static CStr,
    /// Its name in the kernel (`bpftool prog`).
    name: &'static str,
    fd: OwnedFd,
}

/// The tracer's maps (module documentation of [`super::progs`] for their layouts).
#[derive(Debug)]
struct Maps {
    /// Per-CPU state.
    cpu: Map,
    /// `track_all` (element 0).
    cfg: Map,
    /// Managed tgids.
    managed: Map,
    /// Pending wakeups by task.
    wake: Map,
    /// Latency histograms, `[state][bucket]`.
    lat: Map,
    /// Idle-period histograms, `[cpu][kind][bucket]`.
    gaps: Map,
}

/// Most managed processes at once.
pub const MAX_MANAGED: u32 = 1024;
/// Most wakeups pending at once (an LRU map: the oldest are dropped beyond this).
const MAX_WAKEUPS: u32 = 8192;
const VERIFIER_LOG_BYTES: usize = 1 << 20;

fn u32_of(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The in-kernel scheduler tracer (module documentation of [`super`]). Everything it holds is
/// released when it is dropped: the tracepoint attachments first, then the programs and maps.
#[derive(Debug)]
pub struct WakeTracer {
    /// Open raw tracepoints (empty when detached); declared first so they are closed first.
    links: Vec<OwnedFd>,
    progs: Vec<Prog>,
    maps: Maps,
    cpus: CpuSet,
    /// CPU ids the per-CPU histograms have room for (highest possible CPU + 1).
    cpu_ids: u32,
    managed: BTreeSet<u32>,
    /// Every task counted, managed or not.
    track_all: bool,
    /// The current epoch (`progs::cfg::EPOCH`): 0 while paused, a new one at each resume.
    epoch: u64,
    /// Counting time before the current epoch.
    traced: Duration,
    /// Times the programs were attached.
    attaches: u64,
    counting_since: Option<Instant>,
}

/// Why this process may not trace, from its effective capabilities (`None`: it may, or they
/// could not be read and the kernel will say).
fn privilege_problem() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let caps = sys::parse_cap_eff(&status).ok()?;
    (!sys::caps_allow_tracing(caps)).then(|| "not root (CAP_BPF/CAP_PERFMON needed)".to_string())
}

/// An error from a bpf(2) call, made specific where the errno says what is missing.
fn sys_err(op: &'static str, e: io::Error) -> TraceError {
    match e.raw_os_error() {
        Some(libc::EPERM) => TraceError::Unavailable {
            what: op.to_string(),
            why: privilege_problem()
                .unwrap_or_else(|| "refused although CAP_BPF/CAP_PERFMON are held (kernel lockdown, an LSM or seccomp?)".to_string()),
        },
        Some(libc::ENOSYS) => {
            TraceError::Unavailable { what: op.to_string(), why: "kernel without bpf() (CONFIG_BPF_SYSCALL)".to_string() }
        }
        _ => TraceError::Sys { op, source: e },
    }
}

impl WakeTracer {
    /// Creates the maps and loads (verifies) the programs, not attached. Needs CAP_BPF and
    /// CAP_PERFMON (root).
    pub fn load(cfg: &TracerConfig) -> Result<Self, TraceError> {
        if let Some(why) = privilege_problem() {
            return Err(TraceError::Unavailable { what: "bpf tracing".to_string(), why });
        }
        let possible = Sysfs::new().possible_cpus()?;
        let cpu_ids = possible.last().map_or(1, |c| c.saturating_add(1));
        if !cfg.cpus.is_subset(&possible) {
            let bad = cfg.cpus.difference(&possible);
            return Err(OsError::from(BadInput::new("traced CPUs", bad, format!("possible CPUs {possible}"))).into());
        }
        let maps = Self::create_maps(cpu_ids, possible.len())?;
        let fds = MapFds {
            cpu: maps.cpu.raw_fd(),
            cfg: maps.cfg.raw_fd(),
            managed: maps.managed.raw_fd(),
            wake: maps.wake.raw_fd(),
            lat: maps.lat.raw_fd(),
            gaps: maps.gaps.raw_fd(),
        };
        // Attach order: cpu_idle first and sched_switch last, so the first switches already
        // see idle states and wakeups.
        let progs = vec![
            load_prog(c"cpu_idle", "gl_cpu_idle", progs::cpu_idle(&fds))?,
            load_prog(c"sched_waking", "gl_sched_waking", progs::sched_waking(&fds))?,
            load_prog(c"sched_switch", "gl_sched_switch", progs::sched_switch(&fds, cfg.poll_state))?,
        ];
        Ok(Self {
            links: Vec::new(),
            progs,
            maps,
            cpus: cfg.cpus.clone(),
            cpu_ids,
            managed: BTreeSet::new(),
            track_all: false,
            epoch: 0,
            traced: Duration::ZERO,
            attaches: 0,
            counting_since: None,
        })
    }

    fn create_maps(cpu_ids: u32, possible: usize) -> Result<Maps, TraceError> {
        let nb = u32_of(BUCKETS);
        let create = |op: &'static str, spec: MapSpec| Map::create(spec, possible).map_err(|e| sys_err(op, e));
        Ok(Maps {
            cpu: create(
                "BPF_MAP_CREATE gl_cpu",
                MapSpec {
                    map_type: map_type::PERCPU_ARRAY,
                    key_size: 4,
                    value_size: progs::cpu_state::SIZE,
                    max_entries: 1,
                    name: "gl_cpu",
                },
            )?,
            cfg: create(
                "BPF_MAP_CREATE gl_cfg",
                MapSpec { map_type: map_type::ARRAY, key_size: 4, value_size: progs::cfg::SIZE, max_entries: 1, name: "gl_cfg" },
            )?,
            managed: create(
                "BPF_MAP_CREATE gl_managed",
                MapSpec { map_type: map_type::HASH, key_size: 4, value_size: 4, max_entries: MAX_MANAGED, name: "gl_managed" },
            )?,
            wake: create(
                "BPF_MAP_CREATE gl_wake",
                MapSpec {
                    map_type: map_type::LRU_HASH,
                    key_size: 8,
                    value_size: progs::wake::SIZE,
                    max_entries: MAX_WAKEUPS,
                    name: "gl_wake",
                },
            )?,
            lat: create(
                "BPF_MAP_CREATE gl_lat",
                MapSpec {
                    map_type: map_type::ARRAY,
                    key_size: 4,
                    value_size: progs::hist::SIZE,
                    max_entries: progs::STATES * nb,
                    name: "gl_lat",
                },
            )?,
            gaps: create(
                "BPF_MAP_CREATE gl_gaps",
                MapSpec {
                    map_type: map_type::ARRAY,
                    key_size: 4,
                    value_size: progs::hist::SIZE,
                    max_entries: cpu_ids.saturating_mul(progs::KINDS * nb),
                    name: "gl_gaps",
                },
            )?,
        })
    }

    /// Attaches the programs to their raw tracepoints (unless attached) and counts from now
    /// on, in a new epoch: what the programs kept from before (a CPU's last switch, a wakeup
    /// whose switch-in they did not see) describes events the tracer missed, and is dropped.
    pub fn attach(&mut self) -> Result<(), TraceError> {
        if !self.attached() {
            self.link()?;
        }
        self.resume()
    }

    /// Counts from now on, in a new epoch, attached or not (attached: [`attach`](Self::attach)).
    fn resume(&mut self) -> Result<(), TraceError> {
        if self.counting() {
            return Ok(());
        }
        self.write_cfg(self.epoch.wrapping_add(1).max(1))?;
        self.counting_since = Some(Instant::now());
        Ok(())
    }

    /// Stops counting but stays attached: the programs return at their first test, and
    /// resuming ([`attach`](Self::attach)) patches no kernel text.
    pub fn pause(&mut self) {
        if let Err(e) = self.write_cfg(0) {
            // The update of an array element we created cannot fail but for a lack of
            // memory; then detaching stops the counting instead.
            tracing::warn!("tracer: pausing: {e:#}; detaching instead");
            self.links.clear();
        }
        if let Some(t) = self.counting_since.take() {
            self.traced += t.elapsed();
        }
    }

    fn link(&mut self) -> Result<(), TraceError> {
        let mut links = Vec::with_capacity(self.progs.len());
        for p in &self.progs {
            let link = sys::raw_tracepoint_open(p.tracepoint, p.fd.as_fd()).map_err(|e| match e.raw_os_error() {
                Some(libc::ENOENT) => TraceError::Unavailable {
                    what: format!("raw tracepoint {}", p.tracepoint.to_string_lossy()),
                    why: "not found in this kernel".to_string(),
                },
                // The program reads more arguments than the tracepoint has: sched_switch got
                // its prev_state argument in Linux 5.18.
                Some(libc::EINVAL) => TraceError::Unavailable {
                    what: format!("raw tracepoint {}", p.tracepoint.to_string_lossy()),
                    why: "has other arguments than gleaner reads (sched_switch needs Linux >= 5.18)".to_string(),
                },
                _ => sys_err("BPF_RAW_TRACEPOINT_OPEN", e),
            })?;
            links.push(link);
        }
        self.links = links;
        self.attaches += 1;
        Ok(())
    }

    /// Times the programs were attached since [`load`](Self::load).
    #[must_use]
    pub fn attaches(&self) -> u64 {
        self.attaches
    }

    /// Stops counting and detaches the programs (closes the tracepoint fds); counters and
    /// the managed set stay.
    pub fn detach(&mut self) {
        self.pause();
        self.links.clear();
    }

    /// True while the programs are attached (counting or paused).
    #[must_use]
    pub fn attached(&self) -> bool {
        !self.links.is_empty()
    }

    /// True while the programs count (attached and not paused).
    #[must_use]
    pub fn counting(&self) -> bool {
        self.counting_since.is_some()
    }

    /// Writes the configuration element: `track_all` and `epoch` (0: paused).
    fn write_cfg(&mut self, epoch: u64) -> Result<(), TraceError> {
        let mut v = [0u8; progs::cfg::SIZE as usize];
        let at = |off: i16| usize::try_from(off).unwrap_or(0);
        v[at(progs::cfg::TRACK_ALL)..][..8].copy_from_slice(&u64::from(self.track_all).to_ne_bytes());
        v[at(progs::cfg::EPOCH)..][..8].copy_from_slice(&epoch.to_ne_bytes());
        self.maps.cfg.update(&0u32.to_ne_bytes(), &v, sys::UPDATE_ANY).map_err(|e| sys_err("BPF_MAP_UPDATE_ELEM gl_cfg", e))?;
        if epoch != 0 {
            self.epoch = epoch;
        }
        Ok(())
    }

    /// Replaces the set of managed processes (by tgid, i.e. process id): only their tasks'
    /// wakeups are counted (unless [`track_all`](Self::track_all)).
    pub fn set_managed(&mut self, tgids: &[i32]) -> Result<(), TraceError> {
        let mut new = BTreeSet::new();
        for &t in tgids {
            let id =
                u32::try_from(t).ok().filter(|&u| u > 0).ok_or_else(|| OsError::from(BadInput::new("managed process id", t, "> 0")))?;
            new.insert(id);
        }
        if new.len() > usize::try_from(MAX_MANAGED).unwrap_or(usize::MAX) {
            return Err(OsError::from(BadInput::new("number of managed processes", new.len(), format!("at most {MAX_MANAGED}"))).into());
        }
        for old in self.managed.difference(&new).copied().collect::<Vec<_>>() {
            self.maps.managed.delete(&old.to_ne_bytes()).map_err(|e| sys_err("BPF_MAP_DELETE_ELEM gl_managed", e))?;
            self.managed.remove(&old);
        }
        for id in new.difference(&self.managed).copied().collect::<Vec<_>>() {
            self.maps
                .managed
                .update(&id.to_ne_bytes(), &1u32.to_ne_bytes(), sys::UPDATE_ANY)
                .map_err(|e| sys_err("BPF_MAP_UPDATE_ELEM gl_managed", e))?;
            self.managed.insert(id);
        }
        Ok(())
    }

    /// Counts every task's wakeups, managed or not (a daemon without targets).
    pub fn track_all(&mut self, all: bool) -> Result<(), TraceError> {
        self.track_all = all;
        self.write_cfg(if self.counting() { self.epoch } else { 0 })
    }

    /// Total time counting.
    #[must_use]
    pub fn traced(&self) -> Duration {
        self.traced + self.counting_since.map_or(Duration::ZERO, |t| t.elapsed())
    }

    /// Everything counted since [`load`](Self::load) (take differences of two reads for a
    /// window: `WakeTrace::delta_since`).
    pub fn read(&self) -> Result<WakeTrace, TraceError> {
        let nb = u32_of(BUCKETS);
        let raw = self.maps.lat.lookup_array(progs::STATES * nb).map_err(|e| sys_err("BPF_MAP_LOOKUP_BATCH gl_lat", e))?;
        let mut latency = WakeLatency::default();
        for (i, s) in TargetState::ALL.into_iter().enumerate() {
            *latency.of_mut(s) = hist_at(&raw, i * BUCKETS);
        }
        let raw = self.maps.gaps.lookup_array(self.cpu_ids * progs::KINDS * nb).map_err(|e| sys_err("BPF_MAP_LOOKUP_BATCH gl_gaps", e))?;
        let kinds = usize::try_from(progs::KINDS).unwrap_or(3);
        let at = |cpu: u32, kind: i32| {
            let kind = usize::try_from(kind).unwrap_or(0);
            hist_at(&raw, (usize::try_from(cpu).unwrap_or(usize::MAX) * kinds + kind) * BUCKETS)
        };
        let vcpus = self
            .cpus
            .iter()
            .map(|cpu| VcpuGaps {
                cpu,
                woken: at(cpu, progs::KIND_WOKEN),
                other: at(cpu, progs::KIND_OTHER),
                local: at(cpu, progs::KIND_LOCAL),
            })
            .collect();
        let traced_ns = u64::try_from(self.traced().as_nanos()).unwrap_or(u64::MAX);
        Ok(WakeTrace { source: TraceSource::Bpf, traced_ns, latency, vcpus })
    }

    /// Each program's statistics, by name (`None` where the kernel keeps none: before 5.1).
    #[must_use]
    pub fn prog_stats_each(&self) -> Vec<(&'static str, Option<ProgStats>)> {
        self.progs
            .iter()
            .map(|p| {
                let s = sys::prog_run_stats(p.fd.as_fd()).ok().flatten().map(|(run_time_ns, run_cnt, recursion_misses)| ProgStats {
                    run_time_ns,
                    run_cnt,
                    recursion_misses,
                });
                (p.name, s)
            })
            .collect()
    }

    /// The programs' descriptors (tests compare what the kernel says about them two ways).
    #[cfg(test)]
    pub(crate) fn prog_fds(&self) -> impl Iterator<Item = std::os::fd::BorrowedFd<'_>> {
        self.progs.iter().map(|p| p.fd.as_fd())
    }

    /// The programs' run time and count, summed (they grow only while
    /// [`enable_stats`](Self::enable_stats) is held, by us or anyone).
    #[must_use]
    pub fn prog_stats(&self) -> Option<ProgStats> {
        let mut total = ProgStats::default();
        for (_, s) in self.prog_stats_each() {
            total.add(&s?);
        }
        Some(total)
    }

    /// Turns the kernel's BPF run-time statistics on while the guard lives (CAP_SYS_ADMIN).
    pub fn enable_stats() -> Result<StatsGuard, TraceError> {
        sys::enable_stats().map(|fd| StatsGuard { _fd: fd }).map_err(|e| match e.raw_os_error() {
            Some(libc::EPERM) => TraceError::Unavailable { what: "BPF_ENABLE_STATS".to_string(), why: "needs CAP_SYS_ADMIN".to_string() },
            _ => sys_err("BPF_ENABLE_STATS", e),
        })
    }

    /// Kernel ids of the programs and maps (to check they are gone after drop).
    #[cfg(test)]
    pub(crate) fn object_ids(&self) -> (Vec<u32>, Vec<u32>) {
        let id = |fd: std::os::fd::BorrowedFd<'_>, key: &str| {
            sys::FdInfo::of(fd).ok().and_then(|i| i.u64(key)).and_then(|v| u32::try_from(v).ok()).expect("fdinfo id")
        };
        let progs = self.progs.iter().map(|p| id(p.fd.as_fd(), "prog_id")).collect();
        let m = &self.maps;
        let maps = [&m.cpu, &m.cfg, &m.managed, &m.wake, &m.lat, &m.gaps].iter().map(|m| id(m.fd(), "map_id")).collect();
        (progs, maps)
    }

    /// Loads `insns` as the tracer loads its programs (to see a refusal's report).
    #[cfg(test)]
    pub(crate) fn try_load(name: &'static str, insns: Vec<Insn>) -> Result<(), TraceError> {
        load_prog(c"sched_switch", name, Ok(insns)).map(|_| ())
    }

    /// Counts (a new epoch) or pauses without attaching, for [`test_run`](Self::test_run).
    #[cfg(test)]
    pub(crate) fn set_counting(&mut self, on: bool) -> Result<(), TraceError> {
        if on {
            self.resume()
        } else {
            self.pause();
            Ok(())
        }
    }

    /// Runs program `name` once on this CPU with `args` as its tracepoint arguments
    /// (`BPF_PROG_TEST_RUN`), as if the event had fired.
    #[cfg(test)]
    pub(crate) fn test_run(&self, name: &str, args: &[u64]) -> io::Result<u32> {
        let p = self.progs.iter().find(|p| p.name == name).expect("program name");
        sys::prog_test_run_raw_tp(p.fd.as_fd(), args)
    }
}

/// The histogram whose 40 buckets start at element `first` of a raw `{count, sum}` array.
fn hist_at(raw: &[u8], first: usize) -> Log2Hist {
    let size = usize::try_from(progs::hist::SIZE).unwrap_or(16);
    let word = |elem: usize, off: usize| {
        raw.get(elem * size + off..elem * size + off + 8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_ne_bytes)
    };
    let counts: Vec<u64> = (first..first + BUCKETS).map(|e| word(e, 0)).collect();
    let sums: Vec<u64> = (first..first + BUCKETS).map(|e| word(e, 8)).collect();
    Log2Hist::from_raw(&counts, &sums)
}

/// Loads one program: silently first, and when the kernel refuses it, again with a verifier
/// log to say why.
fn load_prog(tracepoint: &'static CStr, name: &'static str, insns: Result<Vec<Insn>, AsmError>) -> Result<Prog, TraceError> {
    let insns = insns.map_err(|e| TraceError::Verifier { prog: name, log: format!("not assembled: {e}") })?;
    let fd = match sys::prog_load(sys::PROG_TYPE_RAW_TRACEPOINT, &insns, name, None) {
        Ok(fd) => fd,
        Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::ENOSYS)) => return Err(sys_err("BPF_PROG_LOAD", e)),
        Err(first) => {
            let mut log = vec![0u8; VERIFIER_LOG_BYTES];
            match sys::prog_load(sys::PROG_TYPE_RAW_TRACEPOINT, &insns, name, Some(&mut log)) {
                // Refused once, accepted now: the first failure was transient (EAGAIN, ENOMEM).
                Ok(fd) => fd,
                Err(_) => {
                    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                    let text = String::from_utf8_lossy(&log[..end]).trim().to_string();
                    return Err(if text.is_empty() {
                        sys_err("BPF_PROG_LOAD", first)
                    } else {
                        TraceError::Verifier { prog: name, log: text }
                    });
                }
            }
        }
    };
    Ok(Prog { tracepoint, name, fd })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracer_is_send() {
        fn send<T: Send>() {}
        send::<WakeTracer>();
    }

    #[test]
    fn hist_at_reads_counts_and_sums_per_bucket() {
        let mut raw = vec![0u8; 2 * BUCKETS * 16];
        let put = |raw: &mut Vec<u8>, elem: usize, off: usize, v: u64| {
            raw[elem * 16 + off..elem * 16 + off + 8].copy_from_slice(&v.to_ne_bytes())
        };
        put(&mut raw, 3, 0, 2);
        put(&mut raw, 3, 8, 20);
        put(&mut raw, BUCKETS + 5, 0, 1);
        put(&mut raw, BUCKETS + 5, 8, 40);
        let a = hist_at(&raw, 0);
        let b = hist_at(&raw, BUCKETS);
        assert_eq!((a.bucket(3), a.count()), ((2, 20), 2));
        assert_eq!((b.bucket(5), b.count()), ((1, 40), 1));
        assert_eq!(hist_at(&raw, 2 * BUCKETS).count(), 0, "past the end reads as empty");
    }

    #[test]
    fn prog_stats_per_run_and_delta() {
        let a = ProgStats { run_time_ns: 1_000, run_cnt: 10, recursion_misses: 0 };
        let b = ProgStats { run_time_ns: 4_000, run_cnt: 30, recursion_misses: 1 };
        assert_eq!(b.delta_since(&a).ns_per_run(), Some(150.0));
        assert_eq!(ProgStats::default().ns_per_run(), None);
    }
}
