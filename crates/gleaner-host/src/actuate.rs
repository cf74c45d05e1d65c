//! Applies plans: one cpuset cgroup per pool, vCPU threads moved into it, their EEVDF slice
//! set to the pool's quantum. Every change is recorded in the state file *before* it is made,
//! and [`restore`] undoes all of it (on exit, on a signal, or after a crash). The state file
//! is a [`gleaner_os::journal::Journal`] (the agent's mechanism too) holding a [`State`]: a
//! snapshot of what was changed, per thread, process and group.
//!
//! ```text
//!  cgroup v1 (cpuset hierarchy)           cgroup v2 (threads of one process need a threaded subtree)
//!   <root>/gleaner-aql-s0-1ms   tasks      <root>/gleaner-aql-vm<pid>/            (the VM's process)
//!   <root>/gleaner-aql-s0-90ms  tasks             gleaner-aql-s0-1ms   threaded  cgroup.threads
//!   <root>/gleaner-aql-s0-default                 gleaner-aql-s0-90ms  threaded
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use gleaner_os::cgroup::{Cgroups, CpusetCgroup, Layout};
use gleaner_os::cpuset::CpuSet;
use gleaner_os::journal::{self, Journal, Undo};
use gleaner_os::procfs::Procfs;
use gleaner_os::sched;
use gleaner_policy::aql::Plan;
use serde::{Deserialize, Serialize};

/// Prefix of every cgroup the host agent creates.
pub const PREFIX: &str = "gleaner-aql";

/// What a vCPU thread looked like before we touched it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadRecord {
    pub pid: i32,
    pub tid: i32,
    pub comm: String,
    /// Its cpuset cgroup (v1) relative to the hierarchy root, e.g. `/` or `/machine/vm1`.
    pub cgroup: Option<String>,
    pub affinity: CpuSet,
    pub slice_ns: u64,
}

/// A process moved into a per-VM group (v2 only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRecord {
    pub pid: i32,
    pub comm: String,
    pub cgroup: String,
}

/// The state file: everything needed to undo our changes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    pub agent_pid: i32,
    /// cpuset hierarchy root and version.
    pub cgroup_root: PathBuf,
    pub cgroup_version: u8,
    /// Groups we created, in creation order.
    pub groups: Vec<PathBuf>,
    pub threads: BTreeMap<i32, ThreadRecord>,
    pub processes: BTreeMap<i32, ProcessRecord>,
    /// The plan in force.
    pub plan: Plan,
}

/// A host state file is a few hundred KB at most; anything bigger is not one.
const MAX_STATE_BYTES: u64 = 16 << 20;

impl State {
    /// Reads the state file, never through a symbolic link and only if it is root's alone
    /// (`gleaner_os::private`): the host agent acts on what it says.
    pub fn load(path: &Path) -> anyhow::Result<Option<State>> {
        Journal::load(path, MAX_STATE_BYTES).context("cannot read the state file")
    }
}

/// What undoing a thread's or a process's record needs.
#[derive(Debug, Clone)]
pub struct HostOs {
    pub cgroups: Cgroups,
    pub procfs: Procfs,
}

/// Puts a vCPU thread back: its cgroup (v1), affinity and slice. A thread that is gone (or
/// whose id now names another thread) has nothing to undo.
impl Undo for ThreadRecord {
    type Context = HostOs;
    type Error = String;

    fn undo(&self, os: &HostOs) -> Result<(), String> {
        restore_thread(&os.cgroups, &os.procfs, self)
    }
}

/// Puts a VMM process back into its cgroup (v2).
impl Undo for ProcessRecord {
    type Context = HostOs;
    type Error = String;

    fn undo(&self, os: &HostOs) -> Result<(), String> {
        restore_process(&os.cgroups, &os.procfs, self)
    }
}

/// Applies plans and keeps the state file current.
#[derive(Debug)]
pub struct Actuator {
    cgroups: Cgroups,
    procfs: Procfs,
    journal: Journal<State>,
    /// Live handles of the groups we created (they remember v2 `+cpuset` to undo).
    live: BTreeMap<PathBuf, CpusetCgroup>,
    /// Non-fatal problems (e.g. a realtime vCPU thread cannot take a slice).
    pub warnings: Vec<String>,
}

/// A vCPU thread the plan places: (pid, tid, vcpu index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub pid: i32,
    pub tid: i32,
    pub pool: usize,
}

/// The group of each (pool index, VM pid) of a plan.
type PoolPaths = BTreeMap<(usize, i32), PathBuf>;

impl Actuator {
    /// Refuses to start when a state file from a live agent exists; a stale one is restored
    /// first (crash recovery).
    pub fn open(cgroups: Cgroups, procfs: Procfs, state_path: PathBuf) -> anyhow::Result<Self> {
        if let Some(old) = State::load(&state_path)? {
            let alive = old.agent_pid != std::process::id().cast_signed() && procfs.alive(old.agent_pid);
            if alive {
                anyhow::bail!(
                    "another gleaner host agent (pid {}) owns {}; stop it or run `gleaner host restore`",
                    old.agent_pid,
                    state_path.display()
                );
            }
            tracing::warn!("restoring the changes of a previous run that did not clean up");
            restore(&cgroups, &procfs, &old).context("restoring a previous run's changes")?;
            journal::remove_file(&state_path).ok();
        }
        let state = State {
            agent_pid: i32::try_from(std::process::id()).unwrap_or(0),
            cgroup_root: cgroups.root().to_path_buf(),
            cgroup_version: cgroups.layout().version(),
            ..State::default()
        };
        let journal = Journal::create(state_path, state).context("cannot write the state file")?;
        Ok(Self { cgroups, procfs, journal, live: BTreeMap::new(), warnings: Vec::new() })
    }

    pub fn state(&self) -> &State {
        self.journal.doc()
    }

    /// Records in the state file (before the change it describes is made).
    fn record(&mut self, change: impl FnOnce(&mut State)) -> anyhow::Result<()> {
        self.journal.record(change).context("cannot write the state file")
    }

    fn os(&self) -> HostOs {
        HostOs { cgroups: self.cgroups.clone(), procfs: self.procfs.clone() }
    }

    fn group_name(pool: &str) -> String {
        format!("{PREFIX}-{pool}")
    }

    /// Creates (recording it first) or returns the group at `parent_rel/name`.
    fn ensure_group(&mut self, parent_rel: &Path, name: &str, threaded: bool) -> anyhow::Result<PathBuf> {
        let path = self.cgroups.root().join(parent_rel).join(name);
        if self.live.contains_key(&path) {
            return Ok(path);
        }
        if !self.state().groups.contains(&path) {
            self.record(|s| s.groups.push(path.clone()))?;
        }
        let g = if path.is_dir() { self.cgroups.open(&path)? } else { self.cgroups.create(parent_rel, name)? };
        if threaded && !g.is_threaded()? {
            g.set_threaded()?;
        }
        self.live.insert(path.clone(), g);
        Ok(path)
    }

    fn record_thread(&mut self, pid: i32, tid: i32) -> anyhow::Result<bool> {
        if self.state().threads.contains_key(&tid) {
            return Ok(true);
        }
        let comm = match self.procfs.task_comm(pid, tid) {
            Ok(c) => c,
            Err(e) if e.is_vanished() => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let cgroup = match self.cgroups.layout() {
            Layout::V1 { .. } => self.procfs.task_cgroup(pid, tid, Some("cpuset")).ok().flatten(),
            Layout::V2 { .. } => None,
        };
        let affinity = sched::affinity(tid)?;
        let slice_ns = u64::try_from(sched::slice(tid)?.as_nanos()).unwrap_or(u64::MAX);
        self.record(|s| {
            s.threads.insert(tid, ThreadRecord { pid, tid, comm, cgroup, affinity, slice_ns });
        })?;
        Ok(true)
    }

    fn record_process(&mut self, pid: i32) -> anyhow::Result<()> {
        if self.state().processes.contains_key(&pid) {
            return Ok(());
        }
        let comm = self.procfs.comm(pid)?;
        let cgroup = self.procfs.task_cgroup(pid, pid, None)?.unwrap_or_else(|| "/".into());
        self.record(|s| {
            s.processes.insert(pid, ProcessRecord { pid, comm, cgroup });
        })?;
        Ok(())
    }

    /// Brings the host to `plan`. `placements` maps each assigned vCPU thread to its pool.
    pub fn apply(&mut self, plan: &Plan, placements: &[Placement]) -> anyhow::Result<()> {
        let v2 = matches!(self.cgroups.layout(), Layout::V2 { .. });
        self.record(|s| s.plan = plan.clone())?;
        let (wanted, pool_path) = self.ensure_pools(plan, placements, v2)?;
        self.place_threads(plan, placements, &pool_path, v2)?;
        let (gone_threads, gone_processes) = self.release_unplaced(placements);
        let (removed, result) = self.remove_unwanted(&wanted);
        self.record(|s| {
            s.threads.retain(|tid, _| !gone_threads.contains(tid));
            s.processes.retain(|pid, _| !gone_processes.contains(pid));
            s.groups.retain(|g| !removed.contains(g));
        })?;
        result
    }

    /// Creates the pool groups of the placements (under a group per VM on cgroup v2) and sets
    /// their CPUs; returns the groups wanted and each (pool, pid)'s group.
    fn ensure_pools(&mut self, plan: &Plan, placements: &[Placement], v2: bool) -> anyhow::Result<(Vec<PathBuf>, PoolPaths)> {
        let mut wanted: Vec<PathBuf> = Vec::new();
        let mut pool_path: PoolPaths = BTreeMap::new();
        for pl in placements {
            let pool = &plan.pools[pl.pool];
            let cpus: CpuSet = pool.pcpus.iter().copied().collect();
            let path = if v2 {
                let vm = format!("{PREFIX}-vm{}", pl.pid);
                let vm_path = self.ensure_group(Path::new(""), &vm, false)?;
                let p = self.ensure_group(Path::new(&vm), &Self::group_name(&pool.name), true)?;
                wanted.push(vm_path);
                p
            } else {
                self.ensure_group(Path::new(""), &Self::group_name(&pool.name), false)?
            };
            let g = &self.live[&path];
            if g.cpus().ok().as_ref() != Some(&cpus) {
                g.set_cpus(&cpus).with_context(|| format!("pool {}", pool.name))?;
            }
            wanted.push(path.clone());
            pool_path.insert((pl.pool, pl.pid), path);
        }
        Ok((wanted, pool_path))
    }

    /// Moves each placed thread (recorded first) into its pool's group, its process into its
    /// VM's group on cgroup v2, and sets the pool's quantum as its slice; a vanished thread is
    /// skipped.
    fn place_threads(&mut self, plan: &Plan, placements: &[Placement], pool_path: &PoolPaths, v2: bool) -> anyhow::Result<()> {
        for pl in placements {
            if !self.record_thread(pl.pid, pl.tid)? {
                continue; // vanished
            }
            let path = pool_path[&(pl.pool, pl.pid)].clone();
            if v2 {
                self.record_process(pl.pid)?;
                let vm_path = path.parent().map(Path::to_path_buf).unwrap_or_default();
                let vm_group = &self.live[&vm_path];
                if !vm_group.procs().unwrap_or_default().contains(&pl.pid) {
                    vm_group.add_process(pl.pid)?;
                }
            }
            let g = &self.live[&path];
            match g.add_thread(pl.tid) {
                Ok(()) => {}
                Err(e) if e.is_vanished() => continue,
                Err(e) => return Err(e.into()),
            }
            let q = Duration::from_nanos(plan.pools[pl.pool].quantum_ns);
            match sched::set_slice(pl.tid, q) {
                Ok(()) => {}
                Err(gleaner_os::OsError::BadInput(b)) => self.warnings.push(format!("tid {}: slice not set: {b}", pl.tid)),
                Err(e) if e.is_vanished() => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Threads and processes no longer placed: gives them back their original settings (what
    /// fails becomes a warning); returns their tids and pids.
    fn release_unplaced(&mut self, placements: &[Placement]) -> (Vec<i32>, Vec<i32>) {
        let placed: Vec<i32> = placements.iter().map(|p| p.tid).collect();
        let os = self.os();
        let st = self.journal.doc();
        let gone_threads: Vec<&ThreadRecord> = st.threads.values().filter(|r| !placed.contains(&r.tid)).collect();
        let mut failed = journal::undo_each(&os, gone_threads.iter().copied(), |_| {});
        let gone_threads: Vec<i32> = gone_threads.iter().map(|r| r.tid).collect();
        let pids: Vec<i32> = placements.iter().map(|p| p.pid).collect();
        let gone_processes: Vec<&ProcessRecord> = st.processes.values().filter(|r| !pids.contains(&r.pid)).collect();
        failed.extend(journal::undo_each(&os, gone_processes.iter().copied(), |_| {}));
        let gone_processes: Vec<i32> = gone_processes.iter().map(|r| r.pid).collect();
        self.warnings.extend(failed);
        (gone_threads, gone_processes)
    }

    /// Removes the recorded groups not `wanted`, children first, up to the first that cannot
    /// be; returns those removed and the error, if any.
    fn remove_unwanted(&mut self, wanted: &[PathBuf]) -> (Vec<PathBuf>, anyhow::Result<()>) {
        let unwanted: Vec<PathBuf> = self.journal.doc().groups.iter().rev().filter(|g| !wanted.contains(g)).cloned().collect();
        let mut removed = Vec::new();
        let mut result = Ok(());
        for path in unwanted {
            if let Some(g) = self.live.remove(&path) {
                if let Err(e) = g.remove() {
                    result = Err(anyhow::Error::from(e).context(format!("removing {}", path.display())));
                    break;
                }
            }
            removed.push(path);
        }
        (removed, result)
    }

    /// Undoes everything and deletes the state file.
    ///
    /// Threads and processes are put back best effort (what cannot be becomes a warning, as
    /// before: a thread may have changed since); a group that cannot be removed fails the
    /// restore and keeps the state file for `gleaner host restore`.
    pub fn restore_all(&mut self) -> anyhow::Result<()> {
        let os = self.os();
        let st = self.journal.doc();
        let mut failed = journal::undo_each(&os, st.threads.values(), |_| {});
        failed.extend(journal::undo_each(&os, st.processes.values(), |_| {}));
        let mut errors = Vec::new();
        for path in st.groups.iter().rev() {
            if let Some(g) = self.live.remove(path) {
                if let Err(e) = g.remove() {
                    errors.push(format!("{}: {e}", path.display()));
                }
            }
        }
        if !errors.is_empty() {
            anyhow::bail!(
                "could not remove {} (the state file {} is kept for `gleaner host restore`)",
                errors.join(", "),
                self.journal.path().display()
            );
        }
        let fresh =
            State { agent_pid: st.agent_pid, cgroup_root: st.cgroup_root.clone(), cgroup_version: st.cgroup_version, ..State::default() };
        self.warnings.extend(failed);
        self.journal.clear(fresh).context("cannot remove the state file")?;
        Ok(())
    }
}

/// True if the recorded thread is still the same thread (same process, same name).
fn same_thread(procfs: &Procfs, rec: &ThreadRecord) -> bool {
    procfs.task_comm(rec.pid, rec.tid).is_ok_and(|c| c == rec.comm)
}

/// Puts a thread back; every step is tried, the failures are returned (logged too).
fn restore_thread(cgroups: &Cgroups, procfs: &Procfs, rec: &ThreadRecord) -> Result<(), String> {
    if !same_thread(procfs, rec) {
        return Ok(());
    }
    let mut failed = Vec::new();
    if let Some(cg) = &rec.cgroup {
        match cgroups.open(cg) {
            Ok(g) => {
                if let Err(e) = g.add_thread(rec.tid) {
                    if !e.is_vanished() {
                        tracing::warn!(tid = rec.tid, error = %e, "could not move thread back to {cg}");
                        failed.push(format!("moving tid {} back to {cg}: {e}", rec.tid));
                    }
                }
            }
            Err(e) => {
                tracing::warn!(tid = rec.tid, error = %e, "original cgroup {cg} is gone");
                failed.push(format!("tid {}: original cgroup {cg}: {e}", rec.tid));
            }
        }
    }
    if let Err(e) = sched::set_affinity(rec.tid, &rec.affinity) {
        if !e.is_vanished() {
            tracing::warn!(tid = rec.tid, error = %e, "could not restore affinity");
            failed.push(format!("tid {}: affinity: {e}", rec.tid));
        }
    }
    // Clear our custom slice; if the thread had a custom one before, put it back.
    if sched::reset_slice(rec.tid).is_ok() {
        let now = sched::slice(rec.tid).map(|d| u64::try_from(d.as_nanos()).unwrap_or(0)).unwrap_or(0);
        if now != rec.slice_ns && rec.slice_ns > 0 {
            if let Err(e) = sched::set_slice(rec.tid, Duration::from_nanos(rec.slice_ns)) {
                tracing::warn!(tid = rec.tid, error = %e, "could not restore slice");
                failed.push(format!("tid {}: slice: {e}", rec.tid));
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join(", "))
    }
}

/// Puts a process back into its cgroup; the failure is returned (logged too).
fn restore_process(cgroups: &Cgroups, procfs: &Procfs, rec: &ProcessRecord) -> Result<(), String> {
    if procfs.comm(rec.pid).ok().as_deref() != Some(rec.comm.as_str()) {
        return Ok(());
    }
    let r = cgroups.open(&rec.cgroup).and_then(|g| g.add_process(rec.pid));
    r.map_err(|e| {
        tracing::warn!(pid = rec.pid, error = %e, "could not move process back to {}", rec.cgroup);
        format!("moving pid {} back to {}: {e}", rec.pid, rec.cgroup)
    })
}

/// Crash recovery: undo a state file's changes, then remove any leftover `gleaner-aql*`
/// group. Returns the groups removed.
///
/// Threads and processes are put back best effort: what cannot be is logged (as a warning)
/// and does not stop the rest.
pub fn restore(cgroups: &Cgroups, procfs: &Procfs, state: &State) -> anyhow::Result<Vec<PathBuf>> {
    let os = HostOs { cgroups: cgroups.clone(), procfs: procfs.clone() };
    journal::undo_each(&os, state.threads.values(), |_| {});
    journal::undo_each(&os, state.processes.values(), |_| {});
    sweep(cgroups)
}

/// Removes every `gleaner-aql*` group (children first), moving stragglers to the parent.
pub fn sweep(cgroups: &Cgroups) -> anyhow::Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    for path in cgroups.list_gleaner_groups()? {
        if path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(PREFIX)) {
            cgroups.open(&path)?.remove().with_context(|| format!("removing {}", path.display()))?;
            removed.push(path);
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gleaner_policy::aql::{plan, Quanta, Topology, VcpuClass, VcpuId, VcpuInfo};

    /// A helper thread of this test process, parked until dropped.
    struct Parked {
        tid: i32,
        tx: std::sync::mpsc::Sender<()>,
        h: Option<std::thread::JoinHandle<()>>,
    }
    impl Parked {
        fn new() -> Self {
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let (ttx, trx) = std::sync::mpsc::channel();
            let h = std::thread::Builder::new()
                .name("gl-fixture-vcpu".into())
                .spawn(move || {
                    ttx.send(sched::gettid()).unwrap();
                    let _ = rx.recv();
                })
                .unwrap();
            Parked { tid: trx.recv().unwrap(), tx, h: Some(h) }
        }
    }
    impl Drop for Parked {
        fn drop(&mut self) {
            let _ = self.tx.send(());
            if let Some(h) = self.h.take() {
                let _ = h.join();
            }
        }
    }

    fn two_pool_plan() -> Plan {
        let a = VcpuId { vm: 1, vcpu: 0 };
        let b = VcpuId { vm: 1, vcpu: 1 };
        plan(
            &[VcpuInfo::new(a, VcpuClass::IoInt, false), VcpuInfo::new(b, VcpuClass::Llcf, false)],
            &Topology::uniform(1, 2),
            &Quanta::paper(),
        )
    }

    /// A fake cgroup tree: the root holds cpuset files and `tasks`/`cgroup.procs`.
    fn v1_fixture(root: &Path) {
        std::fs::write(root.join("cpuset.cpus"), "0-1\n").unwrap();
        std::fs::write(root.join("cpuset.mems"), "0\n").unwrap();
        std::fs::write(root.join("tasks"), "").unwrap();
        std::fs::write(root.join("cgroup.procs"), "").unwrap();
    }

    #[test]
    fn v1_fixture_apply_records_then_restores() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("cpuset");
        std::fs::create_dir_all(&root).unwrap();
        v1_fixture(&root);
        let state = d.path().join("run/state.json");
        let pid = i32::try_from(std::process::id()).unwrap();
        let (t0, t1) = (Parked::new(), Parked::new());
        let cg = Cgroups::with_layout(Layout::V1 { cpuset_root: root.clone() });
        let mut act = Actuator::open(cg, Procfs::new(), state.clone()).unwrap();
        let p = two_pool_plan();
        let pl = [Placement { pid, tid: t0.tid, pool: 0 }, Placement { pid, tid: t1.tid, pool: 1 }];
        act.apply(&p, &pl).unwrap();
        // Groups made, CPUs written, thread ids written to `tasks`, slices set (real syscall on
        // our own threads).
        assert_eq!(std::fs::read_to_string(root.join("gleaner-aql-s0-1ms/cpuset.cpus")).unwrap(), "0");
        assert_eq!(std::fs::read_to_string(root.join("gleaner-aql-s0-90ms/cpuset.cpus")).unwrap(), "1");
        assert_eq!(std::fs::read_to_string(root.join("gleaner-aql-s0-1ms/tasks")).unwrap().trim(), t0.tid.to_string());
        assert_eq!(sched::slice(t0.tid).unwrap(), Duration::from_millis(1));
        assert_eq!(sched::slice(t1.tid).unwrap(), Duration::from_millis(90));
        // The state file was written and names both threads and both groups.
        let st = State::load(&state).unwrap().unwrap();
        assert_eq!(st.threads.len(), 2);
        assert_eq!(st.groups.len(), 2);
        assert_eq!(st.plan, p);
        let before = st.threads[&t0.tid].slice_ns;
        // Re-applying the same plan changes nothing; an empty plan gives everything back.
        act.apply(&p, &pl).unwrap();
        act.apply(&Plan::default(), &[]).unwrap();
        assert!(!root.join("gleaner-aql-s0-1ms").exists());
        assert_eq!(u64::try_from(sched::slice(t0.tid).unwrap().as_nanos()).unwrap(), before);
        act.apply(&p, &pl).unwrap();
        act.restore_all().unwrap();
        assert!(!state.exists());
        assert!(!root.join("gleaner-aql-s0-90ms").exists());
        assert_eq!(u64::try_from(sched::slice(t1.tid).unwrap().as_nanos()).unwrap(), before);
    }

    #[test]
    fn v2_fixture_uses_per_vm_threaded_groups() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("unified");
        std::fs::create_dir_all(&root).unwrap();
        for f in ["cgroup.procs", "cgroup.threads", "cpuset.cpus", "cgroup.subtree_control"] {
            std::fs::write(root.join(f), "").unwrap();
        }
        let pid = i32::try_from(std::process::id()).unwrap();
        let t0 = Parked::new();
        let cg = Cgroups::with_layout(Layout::V2 { root: root.clone() });
        let mut act = Actuator::open(cg, Procfs::new(), d.path().join("s.json")).unwrap();
        let mut p = two_pool_plan();
        // Our test process stands in for the VMM (vm id = our pid).
        for pool in &mut p.pools {
            for v in &mut pool.vcpus {
                v.vm = u64::try_from(pid).unwrap();
            }
        }
        // What the kernel would show once the groups exist: the per-VM domain and its child.
        let vm_dir = root.join(format!("gleaner-aql-vm{pid}"));
        for g in ["", "gleaner-aql-s0-1ms"] {
            let x = vm_dir.join(g);
            std::fs::create_dir_all(&x).unwrap();
            for f in ["cgroup.procs", "cgroup.threads", "cpuset.cpus", "cgroup.subtree_control"] {
                std::fs::write(x.join(f), "").unwrap();
            }
            std::fs::write(x.join("cgroup.type"), "domain\n").unwrap();
        }
        act.apply(&p, &[Placement { pid, tid: t0.tid, pool: 0 }]).unwrap();
        let pool = vm_dir.join("gleaner-aql-s0-1ms");
        assert_eq!(std::fs::read_to_string(pool.join("cgroup.type")).unwrap(), "threaded");
        assert_eq!(std::fs::read_to_string(pool.join("cpuset.cpus")).unwrap(), "0");
        assert_eq!(std::fs::read_to_string(pool.join("cgroup.threads")).unwrap(), t0.tid.to_string());
        assert_eq!(std::fs::read_to_string(vm_dir.join("cgroup.procs")).unwrap(), pid.to_string());
        let st = act.state().clone();
        assert_eq!(
            st.processes[&pid].cgroup,
            Procfs::new().cgroup_of(pid).unwrap().into_iter().find(|l| l.0 == 0).map(|l| l.2).unwrap_or_else(|| "/".into())
        );
        act.restore_all().unwrap();
        assert!(!vm_dir.exists());
    }

    #[test]
    fn state_file_valid_malformed_empty() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.json");
        assert!(State::load(&p).unwrap().is_none());
        let s = State { agent_pid: 1, groups: vec![PathBuf::from("/x/gleaner-aql-a")], ..State::default() };
        Journal::create(&p, s.clone()).unwrap();
        assert_eq!(State::load(&p).unwrap().unwrap(), s);
        std::fs::write(&p, "{").unwrap();
        assert!(format!("{:#}", State::load(&p).unwrap_err()).contains("s.json"));
        std::fs::write(&p, "").unwrap();
        assert!(State::load(&p).is_err());
    }
}
