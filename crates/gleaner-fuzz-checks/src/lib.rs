//! The checks behind gleaner's fuzz targets: one function per target, each taking the raw
//! input bytes and panicking when a parser panics or breaks a property.
//!
//! `fuzz/fuzz_targets/<name>.rs` (libFuzzer, `scripts/fuzz.sh`) calls [`TARGETS`]`[name]`; the
//! `corpus` test of this crate replays every checked-in seed and regression input in
//! `fuzz/corpus/<name>/` through the same function, so `cargo test --workspace` runs them on
//! stable without libFuzzer. See docs/fuzzing.md.
//!
//! Text parsers get the input as lossy UTF-8 (the files are read with `read_to_string` or
//! `from_utf8_lossy`, so only UTF-8 reaches them). Targets that read a directory tree write
//! the input into a fresh temp-dir fixture (under `TMPDIR`) with the layout the reader
//! expects.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::path::Path;

use gleaner_os::cpuset::{CpuSet, MAX_CPUS};
use gleaner_os::procfs::{self, Procfs};

/// A fuzz target's check.
pub type Check = fn(&[u8]);

/// Every target: (name, check). The names are the `fuzz/fuzz_targets/*.rs` files and the
/// `fuzz/corpus/*` directories.
pub const TARGETS: &[(&str, Check)] = &[
    ("cpu_list", cpu_list),
    ("procfs_stat", procfs_stat),
    ("procfs_status", procfs_status),
    ("procfs_schedstat", procfs_schedstat),
    ("procfs_task_stat", procfs_task_stat),
    ("procfs_tasks", procfs_tasks),
    ("cgroup_files", cgroup_files),
    ("agent_config", agent_config),
    ("host_config", host_config),
    ("lab_experiment", lab_experiment),
    ("sim_scenario", sim_scenario),
    ("qmp", qmp),
    ("bench_json", bench_json),
    ("lab_guest_port", lab_guest_port),
    ("host_procfs", host_procfs),
];

/// The check of target `name`.
pub fn check(name: &str) -> Option<Check> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, c)| *c)
}

fn text(data: &[u8]) -> Cow<'_, str> {
    String::from_utf8_lossy(data)
}

const P: &str = "/fuzz/input";

/// CPU lists (`cpuset.cpus`, `/sys/devices/system/cpu/online`, `--cpus`, `pcpus`): a parsed
/// set prints in canonical form, which parses back to the same set and prints the same; no
/// id reaches [`MAX_CPUS`]; errors quote the input.
pub fn cpu_list(data: &[u8]) {
    let s = text(data);
    match CpuSet::parse(&s) {
        Ok(set) => {
            assert!(set.len() <= MAX_CPUS as usize, "{} CPUs from {s:?}", set.len());
            assert!(set.last().is_none_or(|l| l < MAX_CPUS), "CPU {:?} from {s:?}", set.last());
            let canon = set.to_string();
            assert!(!canon.contains(char::is_whitespace), "{canon:?}");
            let back = CpuSet::parse(&canon).unwrap_or_else(|e| panic!("canonical form {canon:?} of {s:?} does not parse: {e}"));
            assert_eq!(back, set, "{s:?} -> {canon:?}");
            assert_eq!(back.to_string(), canon);
            let json = serde_json::to_string(&set).expect("a CpuSet serializes");
            assert_eq!(serde_json::from_str::<CpuSet>(&json).expect("and deserializes"), set);
            // The lab's `--pcpus` takes the same lists, the empty one refused.
            let lab = gleaner_lab::cli::cpu_list("--pcpus", &s).ok();
            assert_eq!(lab, (!set.is_empty()).then_some(set), "{s:?}");
        }
        Err(e) => {
            assert_eq!(e.input, s, "the error quotes the input");
            assert!(e.to_string().starts_with("invalid CPU list"), "{e}");
            let lab = gleaner_lab::cli::cpu_list("--pcpus", &s).unwrap_err();
            assert!(lab.to_string().contains(&format!("'{s}'")), "the lab's error names the value: {lab}");
        }
    }
}

/// `/proc/stat`: a parsed file has the total and at least one CPU; the derived times (ns at
/// any tick rate, busy/idle/total ticks, deltas) are computed without overflow; a counter's
/// delta to itself is zero. The same text read through [`Procfs::stat`] and a kept-open
/// [`procfs::StatFile`] gives the same result.
pub fn procfs_stat(data: &[u8]) {
    let s = text(data);
    let r = procfs::parse_stat(Path::new(P), &s, 100);
    if let Ok(st) = &r {
        assert!(!st.cpus.is_empty());
        for t in std::iter::once(&st.total).chain(st.cpus.values()) {
            for hz in [0, 1, 100, 1000] {
                let _ = (t.busy_ns(hz), t.idle_ns(hz), t.steal_ns(hz));
            }
            let _ = (t.busy_ticks(), t.idle_ticks(), t.total_ticks());
            assert_eq!(t.delta(t), procfs::CpuTimes::default());
            let d = t.delta(&st.total);
            assert!(d.user <= t.user && d.idle <= t.idle && d.steal <= t.steal);
        }
    }
    if std::str::from_utf8(data).is_ok() {
        let dir = fixture(&[("stat", data)]);
        let p = Procfs::with_root(dir.path());
        let via_file = p.stat();
        assert_eq!(via_file.is_ok(), r.is_ok(), "{via_file:?} vs {r:?}");
        if let (Ok(a), Ok(b)) = (&via_file, &r) {
            assert_eq!(a, b);
        }
        let kept = p.open_stat().expect("the fixture exists").read();
        assert_eq!(kept.ok(), via_file.ok(), "a kept-open /proc/stat reads the whole text");
    }
}

/// `/proc/<pid>/task/<tid>/status`: the name is trimmed; the kept-open reader (one `pread`
/// into a growing buffer) and the plain read agree.
pub fn procfs_status(data: &[u8]) {
    let s = text(data);
    let r = procfs::parse_status(Path::new(P), &s);
    if let Ok(st) = &r {
        assert_eq!(st.name.trim(), st.name);
        assert!(!st.state.is_whitespace());
    }
    let dir = fixture(&[("1/task/1/status", data)]);
    let p = Procfs::with_root(dir.path());
    let via_file = p.task_status(1, 1);
    assert_eq!(via_file.as_ref().ok(), r.as_ref().ok(), "lossy UTF-8 read of the same text");
    if std::str::from_utf8(data).is_ok() {
        let kept = p.open_task_status(1, 1).expect("the fixture exists").read();
        assert_eq!(kept.ok(), r.ok(), "a kept-open status file reads the whole text");
    }
}

/// `/proc/<pid>/task/<tid>/schedstat` and `/proc/loadavg`: a parsed schedstat prints back to
/// a line that parses the same; the kept-open readers (fixed buffers of 96 and 128 bytes)
/// agree with the plain parsers on texts that fit and refuse longer ones.
pub fn procfs_schedstat(data: &[u8]) {
    let s = text(data);
    let r = procfs::parse_schedstat(Path::new(P), &s);
    if let Ok(st) = &r {
        let line = format!("{} {} {}\n", st.run_ns, st.wait_ns, st.timeslices);
        assert_eq!(procfs::parse_schedstat(Path::new(P), &line).ok(), Some(*st));
    }
    let runnable = procfs::parse_loadavg_runnable(data);
    let dir = fixture(&[("1/task/1/schedstat", data), ("loadavg", data)]);
    let p = Procfs::with_root(dir.path());
    let kept = p.open_task_schedstat(1, 1).expect("the fixture exists").read();
    if data.len() >= 96 {
        assert!(kept.is_err(), "{} bytes of schedstat read as {kept:?}", data.len());
    } else if std::str::from_utf8(data).is_ok() {
        assert_eq!(kept.ok(), r.as_ref().ok().copied(), "kept-open schedstat vs parse of {s:?}");
    }
    let kept = p.open_loadavg().expect("the fixture exists").runnable();
    if data.len() >= 128 {
        assert!(kept.is_err(), "{} bytes of loadavg read as {kept:?}", data.len());
    } else {
        assert_eq!(kept.ok(), runnable, "kept-open loadavg vs parse of {s:?}");
    }
}

/// `/proc/<pid>/task/<tid>/stat` (`pid (comm) state ppid ...`): comm is the text between the
/// first `(` and the last `)`.
pub fn procfs_task_stat(data: &[u8]) {
    let s = text(data);
    if let Ok(st) = procfs::parse_task_stat(Path::new(P), &s) {
        let (open, close) = (s.find('(').expect("parsed"), s.rfind(')').expect("parsed"));
        assert_eq!(st.comm, s[open + 1..close]);
    }
}

/// Task lists and the process tree read from directories: `/proc/<pid>/task/*`,
/// `task/<tid>/children` and the parent pid in `/proc/<pid>/stat`.
///
/// Input: one process per line, `PIDDIR PPID TID,TID,... [| CHILDREN...]`: the directory name
/// of the process, the text of its stat line's ppid field, its task directory names, and the
/// text of each task's `children` file (absent without `|`; like the kernel, all tasks of a
/// process have one or none, so a process's second line is skipped). The first line's process is
/// queried: task ids are sorted numbers; children (minus itself) are among its descendants;
/// the walk ends (cycles included); `tree_threads` lists only descendants' threads.
pub fn procfs_tasks(data: &[u8]) {
    let s = text(data);
    let dir = tempfile::tempdir().expect("a temp dir (TMPDIR)");
    let mut first = None;
    let mut seen = BTreeSet::new();
    for line in s.lines().take(32) {
        let (head, children) = match line.split_once('|') {
            Some((h, c)) => (h, Some(c)),
            None => (line, None),
        };
        let mut it = head.split_whitespace();
        let (Some(pid), Some(ppid)) = (it.next(), it.next()) else { continue };
        if !component(pid) || !seen.insert(pid) {
            continue;
        }
        let tids: Vec<&str> = it.next().unwrap_or("").split(',').filter(|t| component(t)).take(16).collect();
        let pdir = dir.path().join(pid);
        std::fs::create_dir_all(pdir.join("task")).expect("fixture dir");
        let mut fields: Vec<String> = (3..=52).map(|n| n.to_string()).collect();
        fields[0] = "S".into();
        fields[1] = ppid.to_string();
        std::fs::write(pdir.join("stat"), format!("{pid} (p) {}\n", fields.join(" "))).expect("fixture file");
        for t in tids {
            let tdir = pdir.join("task").join(t);
            std::fs::create_dir_all(&tdir).expect("fixture dir");
            if let Some(c) = children {
                std::fs::write(tdir.join("children"), c).expect("fixture file");
            }
        }
        first = first.or(Some(pid.to_string()));
    }
    let Some(pid) = first.and_then(|p| p.parse::<i32>().ok()) else { return };
    let p = Procfs::with_root(dir.path());
    let sorted = |v: &[i32]| v.windows(2).all(|w| w[0] <= w[1]);
    if let Ok(tids) = p.tasks(pid) {
        assert!(sorted(&tids), "{tids:?}");
    }
    if let Ok(pids) = p.pids() {
        assert!(sorted(&pids) && pids.iter().all(|&p| p > 0), "{pids:?}");
    }
    let kids = p.children(pid);
    let with = p.descendants(pid, true);
    let without = p.descendants(pid, false);
    assert_eq!(with.is_ok(), without.is_ok());
    if let (Ok(with), Ok(without)) = (&with, &without) {
        assert!(!without.contains(&pid), "{without:?}");
        let mut expect: BTreeSet<i32> = without.iter().copied().collect();
        assert_eq!(expect.len(), without.len(), "no duplicates");
        expect.insert(pid);
        assert_eq!(with, &expect.into_iter().collect::<Vec<_>>());
        if let Ok(kids) = &kids {
            assert!(kids.iter().filter(|&&k| k != pid).all(|k| without.contains(k)), "{kids:?} not in {without:?}");
        }
        if let Ok(threads) = p.tree_threads(pid) {
            assert!(threads.iter().all(|(p, _)| with.contains(p)), "{threads:?}");
        }
    }
}

/// A path component a fixture can hold (at most NAME_MAX = 255 bytes).
fn component(s: &str) -> bool {
    !s.is_empty() && s.len() <= 255 && s != "." && s != ".." && !s.contains(['/', '\0'])
}

/// A temp dir with `files` (path relative to it, content).
fn fixture(files: &[(&str, &[u8])]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temp dir (TMPDIR)");
    for (rel, content) in files {
        let p = dir.path().join(rel);
        std::fs::create_dir_all(p.parent().expect("a relative file path")).expect("fixture dir");
        std::fs::write(&p, content).expect("fixture file");
    }
    dir
}

/// cgroup files: `/proc/self/mountinfo` (how the cpuset hierarchy is found),
/// `/proc/<pid>/cgroup`, `cgroup.procs` / `tasks` and `cpuset.cpus` (all on the same text).
pub fn cgroup_files(data: &[u8]) {
    let s = text(data);
    let path = Path::new(P);
    if let Ok(mounts) = procfs::parse_mountinfo(path, &s) {
        assert!(mounts.len() <= s.lines().count());
        for m in &mounts {
            assert!(!m.fstype.is_empty() && !m.fstype.contains(char::is_whitespace), "{m:?}");
        }
    }
    if let Ok(lines) = procfs::parse_cgroup(path, &s) {
        assert_eq!(lines.len(), s.lines().filter(|l| !l.trim().is_empty()).count());
        for (_, controllers, _) in &lines {
            assert!(controllers.iter().all(|c| !c.is_empty() && !c.contains(',')), "{controllers:?}");
        }
    }
    if let Ok(ids) = gleaner_os::cgroup::parse_ids(path, &s) {
        assert_eq!(ids.len(), s.lines().filter(|l| !l.trim().is_empty()).count());
    }
    cpu_list(data);
}

/// Re-serializes a parsed config: the text must parse again (a valid config stays valid when
/// saved) and print the same (NaN != NaN, so the texts are compared).
fn toml_round_trip<T: serde::Serialize + PartialEq + std::fmt::Debug, E: std::fmt::Display>(v: &T, parse: impl Fn(&str) -> Result<T, E>) {
    let text = toml::to_string(v).unwrap_or_else(|e| panic!("a parsed value does not serialize: {e}: {v:?}"));
    let back = parse(&text).unwrap_or_else(|e| panic!("the serialized form does not parse: {e}\n{text}"));
    assert_eq!(toml::to_string(&back).expect("serializes"), text);
    if !text.contains("nan") {
        assert_eq!(&back, v);
    }
}

/// The guest agent's TOML configuration (`AgentConfig::parse`, which validates): a valid
/// config round-trips; every error is bad input (exit status 2).
pub fn agent_config(data: &[u8]) {
    use gleaner_agent::config::AgentConfig;
    let s = text(data);
    match AgentConfig::parse(&s) {
        Ok(cfg) => {
            cfg.validate().expect("a parsed config is valid");
            toml_round_trip(&cfg, AgentConfig::parse);
        }
        Err(e) => assert!(e.chain().any(|c| c.is::<gleaner_os::BadInput>()), "not BadInput: {e:#}"),
    }
}

/// The host agent's TOML configuration (`HostConfig::parse`).
pub fn host_config(data: &[u8]) {
    use gleaner_host::config::HostConfig;
    let s = text(data);
    let path = Path::new("/fuzz/host.toml");
    if let Ok(cfg) = HostConfig::parse(&s, path) {
        cfg.quanta.validate().expect("parsed quanta are valid");
        toml_round_trip(&cfg, |t| HostConfig::parse(t, path));
    }
}

/// Lab experiment files: a valid experiment round-trips; its stock mode is stock; every mode
/// is in exactly one boot group; `pcpus` is a non-empty CPU list.
pub fn lab_experiment(data: &[u8]) {
    use gleaner_lab::experiment::Experiment;
    use gleaner_policy::IdlePolicy;
    let s = text(data);
    let Ok(e) = Experiment::parse(&s, "fuzz.toml") else { return };
    assert_eq!(e.stock_mode().policy(), IdlePolicy::Stock);
    let grouped: usize = e.boot_groups().iter().map(|(_, ms)| ms.len()).sum();
    assert_eq!(grouped, e.modes.len());
    if let Some(p) = &e.pcpus {
        assert!(!p.is_empty(), "{p:?}");
    }
    for quick in [false, true] {
        assert!(e.workload_args(quick).len() >= e.workload.len());
        let _ = (e.runs_for(quick), e.timeout_for(quick), e.co_runner_args(quick));
    }
    for m in &e.modes {
        let _ = (m.agent_args(), m.kernel_args());
    }
    toml_round_trip(&e, |t| Experiment::parse(t, "fuzz.toml"));
}

/// Simulator scenario files (`expand_cases`: parse, validate, apply each case's overrides):
/// every case's scenario is valid, names its VMs' workloads and has a baseline variant.
pub fn sim_scenario(data: &[u8]) {
    use gleaner_sim::scenario;
    let s = text(data);
    let Ok(cases) = scenario::expand_cases(&s, "fuzz.toml") else { return };
    assert!(!cases.is_empty());
    for (_, sc) in &cases {
        sc.validate().expect("an expanded case is valid");
        for vm in sc.active_vms() {
            sc.workload_of(vm).expect("validate resolved every workload");
        }
        let base = sc.baseline_name();
        assert!(sc.variants().iter().any(|v| v.name == base), "{base}");
    }
}

/// QMP: the client's handshake and command loop on the input as the server's byte stream
/// (over a socketpair), then the host's and the lab's readers of `query-cpus-fast` and
/// `query-stats` replies on each JSON line of it.
pub fn qmp(data: &[u8]) {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    // The whole server side fits in the socket buffer: written before the client reads, so
    // nothing blocks (larger inputs are cut).
    let data = &data[..data.len().min(64 * 1024)];
    let (client, mut server) = UnixStream::pair().expect("socketpair");
    server.write_all(data).expect("write to the socketpair");
    server.shutdown(std::net::Shutdown::Write).expect("shutdown");
    let path = Path::new("/fuzz/qmp.sock");
    let timeout = std::time::Duration::from_secs(1);
    use gleaner_host::qmp::VcpuQueries;
    match gleaner_os::qmp::Qmp::from_stream(client, path, timeout) {
        Ok(mut q) => {
            let threads = q.cpu_threads();
            let stats = threads.as_ref().ok().map(|t| q.vcpu_stats(t));
            for e in [threads.err(), stats.and_then(Result::err)].into_iter().flatten() {
                assert!(e.to_string().contains("/fuzz/qmp.sock"), "{e}");
            }
        }
        Err(e) => assert!(e.to_string().contains("/fuzz/qmp.sock"), "{e}"),
    }
    for line in text(data).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let reply = v.get("return").unwrap_or(&v);
        let threads = gleaner_host::qmp::parse_cpu_threads(reply);
        let stats = gleaner_host::qmp::parse_vcpu_stats(reply, &threads);
        assert!(stats.keys().all(|tid| threads.values().any(|t| t == tid)));
        for (_, value) in gleaner_lab::qmp::flatten_stats(reply) {
            assert!(!value.is_nan(), "a statistic from JSON numbers is a number");
        }
    }
}

/// Bench JSON as the lab reads it from a guest's output (`gleaner_measure::report::from_output`:
/// the first `{` onwards, or a later line starting with `{`, when the whole output is not one
/// document), a result row filled from it, the calibrated rate; the
/// simulator's Table 2 reader of `bench wakeup --json` files.
pub fn bench_json(data: &[u8]) {
    use gleaner_lab::results::{parse_bench_output, Row};
    let s = text(data);
    let doc = parse_bench_output(&s);
    if let Ok(d) = &doc {
        assert!(!d.runs.is_empty());
        let _ = gleaner_measure::report::RunSummary::of(&d.runs);
    }
    let mut row = Row::default();
    row.fill_from_bench(&s);
    assert_eq!(row.error.is_none(), doc.is_ok(), "{:?}", row.error);
    if let Some(r) = gleaner_lab::runner::calibrated_rate(&s) {
        assert!(r > 0.0);
    }
    if let Ok(t) = gleaner_sim::scenario::table2_from_bench_json(&s, "fuzz.json") {
        for v in [t.a_us, t.b_us, t.c_us, t.d_us] {
            assert!(v.is_finite() && v >= 0.0, "{t:?}");
        }
    }
}

/// What a lab guest sends back on its result port: marker lines (`@@LAB ...`) and the
/// agent's `--events` JSON lines, summarized.
pub fn lab_guest_port(data: &[u8]) {
    use gleaner_qemu::guest::{parse_line, EventKind};
    let s = text(data);
    for line in s.lines() {
        let k = parse_line(line);
        if !line.starts_with("@@LAB ") {
            assert!(matches!(&k, EventKind::Line(l) if l == line), "{k:?}");
        }
    }
    let sum = gleaner_lab::results::AgentSummary::from_events(&s);
    assert_eq!(sum.events + sum.bad_lines, s.lines().filter(|l| !l.trim().is_empty()).count());
    assert!(sum.periods <= sum.events as u64);
    if let Some(m) = sum.mean_active {
        assert!(m.is_finite() && m >= 0.0, "{m}");
    }
    if let Some(r) = sum.retention_on_share {
        assert!((0.0..=1.0).contains(&r), "{r}");
    }
    assert!(sum.vcpu_timeouts.windows(2).all(|w| w[0].cpu < w[1].cpu));
}

/// The host agent's procfs readers: VM discovery from a process's `comm`, `cmdline` and
/// thread names (any user can start a process with any of these), `task/<tid>/io`, cache
/// sizes. Input: the NUL-separated command line; its first element's base name (cut to 15
/// bytes, like the kernel) is `comm`, and each element also names a thread. The discovered
/// vCPUs are sorted, and no thread is both a vCPU and another thread.
pub fn host_procfs(data: &[u8]) {
    use gleaner_host::discover;
    let s = text(data);
    let path = Path::new(P);
    let _ = gleaner_os::procfs::parse_task_io(path, &s);
    for line in s.lines() {
        let _ = gleaner_os::sysfs::parse_size(line.trim());
    }
    let argv = procfs::parse_cmdline(&s);
    let exe = argv.first().map_or("", |a| a.rsplit('/').next().unwrap_or(a));
    let comm: String = exe.chars().filter(|&c| c != '\n').take(15).collect();
    let mut files: Vec<(String, Vec<u8>)> = vec![("7/comm".into(), format!("{comm}\n").into_bytes()), ("7/cmdline".into(), data.to_vec())];
    for (i, name) in argv.iter().take(16).enumerate() {
        let tid = 7 + i;
        let name: String = name.chars().filter(|&c| c != '\n').collect();
        files.push((format!("7/task/{tid}/comm"), format!("{name}\n").into_bytes()));
        files.push((format!("7/task/{tid}/schedstat"), format!("{} 0 1\n", 1000 * i).into_bytes()));
    }
    let refs: Vec<(&str, &[u8])> = files.iter().map(|(p, c)| (p.as_str(), c.as_slice())).collect();
    let dir = fixture(&refs);
    let vm = discover::inspect(&Procfs::with_root(dir.path()), 7).expect("the fixture is readable");
    if let Some(vm) = vm {
        assert!(vm.vcpus.windows(2).all(|w| w[0].index <= w[1].index), "{:?}", vm.vcpus);
        assert!(vm.vcpus.iter().all(|v| !vm.other_threads.contains(&v.tid)), "{vm:?}");
        assert_eq!(discover::identify(&comm, &argv), Some(vm.vmm));
    }
}
