//! Leave no trace: every change the agent makes is recorded in a state file *before* it is made,
//! and undone from that record on exit, by the guardian process after `kill -9`, or by
//! `gleaner restore` after a crash. The mechanism (private atomic file, checked load, undo
//! loop that goes on past failures) is [`gleaner_os::journal`], shared with the host agent;
//! this module holds the agent's changes and how each is undone.
//!
//! ```text
//!   agent ──writes──> /run/gleaner/agent-<pid>.json   (changes, in order)
//!     │ stdin pipe
//!     ▼
//!   guardian (`gleaner __guardian`): blocks reading the pipe; EOF means the agent is gone.
//!     If the state file still exists the agent died without cleaning up: undo it (< 1 s).
//! ```

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

use anyhow::Context;
use gleaner_os::cgroup::Cgroups;
use gleaner_os::cpuset::CpuSet;
use gleaner_os::idle::IdleKnobs;
use gleaner_os::journal::{self, Journal, Undo};
use gleaner_os::procfs::alive;
use gleaner_os::OsError;
use serde::{Deserialize, Serialize};

/// One change, recorded before it is made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Change {
    /// We created the cpuset cgroup `path`; whatever is left in it goes to `fallback`.
    CreatedCgroup { path: PathBuf, fallback: PathBuf },
    /// We moved process `pid` from cgroup `from` into `to`.
    MovedProcess { pid: i32, from: PathBuf, to: PathBuf },
    /// We changed `cpuset.cpus` of an existing cgroup; `original` is the value to put back.
    SetCpus { path: PathBuf, original: String },
    /// We enabled the cpuset controller in `dir/cgroup.subtree_control` (cgroup v2).
    EnabledCpuset { dir: PathBuf },
    /// We set a kernel module parameter (the guest haltpoll window); `original` goes back.
    ModuleParam { module: String, name: String, original: String },
    /// We set `cpu`'s resume latency limit (`pm_qos_resume_latency_us`); `original` as the
    /// kernel showed it (`0`: no limit, `n/a`: 0 us), which writes back as it was.
    ResumeLatency { cpu: u32, original: String },
    /// We disabled (or enabled) idle state `state` of `cpu`; `original`: it was disabled.
    IdleStateDisabled { cpu: u32, state: u32, original: bool },
    /// We switched the cpuidle governor.
    CpuidleGovernor { original: String },
    /// We loaded the `cpuidle-haltpoll` driver; it is unloaded again.
    LoadedHaltpollDriver,
    /// We may set the kernel's expedited-RCU switch (`kernel/rcu_expedited`) for a governor
    /// switch (`IdleKnobs::reset_poll_windows` puts it back itself; this covers a kill in
    /// between); `original` goes back.
    RcuExpedited { original: String },
    /// Thread `tid` (started `start_ticks` after boot: /proc/TID/stat field 22, which tells a
    /// reused id apart) of the workload pinned itself to `cpus`. Undone after every other
    /// change ([`undo_order`]): a kernel before 6.2 sets a moved thread's mask to its new
    /// cpuset's, so the guardian gives the program its pin back after moving it home.
    Pinned { tid: i32, start_ticks: u64, cpus: String },
}

impl Change {
    /// True for the kernel idle knobs (not cgroups).
    pub fn is_idle_knob(&self) -> bool {
        matches!(
            self,
            Change::ModuleParam { .. }
                | Change::ResumeLatency { .. }
                | Change::IdleStateDisabled { .. }
                | Change::CpuidleGovernor { .. }
                | Change::LoadedHaltpollDriver
                | Change::RcuExpedited { .. }
        )
    }
}

/// What undoing changes needs: the cgroup tree (`None` where there is no cpuset controller:
/// a cgroup change then cannot be undone and says so) and the idle knobs' sysfs.
#[derive(Debug)]
pub struct UndoCx {
    pub cgroups: Option<Cgroups>,
    pub knobs: IdleKnobs,
}

impl UndoCx {
    /// The real machine.
    pub fn real() -> Self {
        Self { cgroups: Cgroups::detect().ok(), knobs: IdleKnobs::new() }
    }

    fn cgroups(&self) -> anyhow::Result<&Cgroups> {
        self.cgroups.as_ref().context("no cpuset cgroup controller to undo a cgroup change with")
    }
}

/// The state file of one agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentState {
    pub agent_pid: i32,
    pub changes: Vec<Change>,
}

/// The state file on disk, rewritten atomically on every change.
#[derive(Debug)]
pub struct StateFile {
    journal: Journal<AgentState>,
}

impl StateFile {
    /// Creates `run_dir/agent-<pid>.json` (and `run_dir`, mode 0700).
    pub fn create(run_dir: &Path, agent_pid: i32) -> anyhow::Result<Self> {
        Self::create_at(run_dir, state_path(run_dir, agent_pid), agent_pid)
    }

    /// Creates the journal of idle knobs turned outside an agent's run (a calibration, the
    /// haltpoll runs of `compare`), `run_dir/knobs-<pid>.json`: restored by the same means as
    /// an agent's.
    pub fn create_for_knobs(run_dir: &Path, pid: i32) -> anyhow::Result<Self> {
        Self::create_at(run_dir, run_dir.join(format!("{KNOBS_PREFIX}{pid}.json")), pid)
    }

    fn create_at(run_dir: &Path, path: PathBuf, agent_pid: i32) -> anyhow::Result<Self> {
        create_private_dir(run_dir)?;
        let journal = Journal::create(&path, AgentState { agent_pid, changes: Vec::new() })
            .with_context(|| format!("writing the state file {}", path.display()))?;
        Ok(Self { journal })
    }

    pub fn path(&self) -> &Path {
        self.journal.path()
    }

    pub fn state(&self) -> &AgentState {
        self.journal.doc()
    }

    /// Records a change (call before making it). The file is replaced atomically, never
    /// through a symbolic link (a full /run fails here, naming the file, and leaves no partial
    /// file behind).
    pub fn record(&mut self, change: Change) -> anyhow::Result<()> {
        self.journal.record(|s| s.changes.push(change)).with_context(|| format!("writing the state file {}", self.journal.path().display()))
    }

    /// Undoes every recorded change (newest first) and removes the file. Errors are collected:
    /// one failed step does not stop the others. Killed half-way, the file (still naming every
    /// change) lets the guardian or `gleaner restore` finish: each step is idempotent.
    pub fn undo(self, cx: &UndoCx) -> anyhow::Result<()> {
        let errors = journal::undo_each(cx, undo_order(&self.state().changes), |i| {
            if i == 0 {
                crate::seam::stop_at(crate::seam::MID_RESTORE);
            }
        });
        let _ = self.journal.discard();
        if errors.is_empty() {
            Ok(())
        } else {
            anyhow::bail!("restore incomplete: {}", errors.join("; "))
        }
    }
}

/// The state file of knobs turned outside an agent's run starts with this (then the pid).
pub const KNOBS_PREFIX: &str = "knobs-";

/// The pid of a state file's name: `agent-<pid>.json` or `knobs-<pid>.json`.
fn state_file_pid(name: &str) -> Option<i32> {
    let rest = name.strip_prefix("agent-").or_else(|| name.strip_prefix(KNOBS_PREFIX))?;
    rest.strip_suffix(".json")?.parse().ok()
}

/// Where agent `pid` keeps its state file.
pub fn state_path(run_dir: &Path, pid: i32) -> PathBuf {
    run_dir.join(format!("agent-{pid}.json"))
}

/// The largest state file an agent writes is a few KB; anything bigger is not one.
const MAX_STATE_BYTES: u64 = 4 << 20;

/// Creates `dir` readable by root only (mode 0700), and refuses one that exists but is not
/// private: a symbolic link, another user's, or writable by others. Everything in it is read
/// and acted on as root.
pub fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    gleaner_os::private::create_private_dir(dir).context("the run directory must be root's alone")
}

/// Reads an agent's state file: never through a symbolic link, and only if it is a regular
/// file of ours that nobody else can write. `None` when it is missing.
pub fn read_state(path: &Path) -> anyhow::Result<Option<AgentState>> {
    match Journal::load(path, MAX_STATE_BYTES) {
        Err(OsError::Parse { reason, .. }) => {
            Err(gleaner_os::BadInput::new("state file", path.display(), format!("an agent state file ({reason})")).into())
        }
        r => Ok(r?),
    }
}

/// Undoes `changes` newest first; returns the errors met (empty on success).
pub fn undo_changes(cx: &UndoCx, changes: &[Change]) -> Vec<String> {
    journal::undo_each(cx, undo_order(changes), |_| {})
}

/// The order changes are undone in: newest first, the remembered pins last (after the moves
/// and cpuset writes that a kernel before 6.2 lets reset them).
pub fn undo_order(changes: &[Change]) -> impl Iterator<Item = &Change> {
    let pin = |c: &&Change| matches!(c, Change::Pinned { .. });
    changes.iter().rev().filter(move |c| !pin(c)).chain(changes.iter().filter(pin))
}

impl Undo for Change {
    type Context = UndoCx;
    type Error = anyhow::Error;

    fn undo(&self, cx: &UndoCx) -> anyhow::Result<()> {
        undo_one(cx, self)
    }
}

/// Undoes one change. Idempotent: what is already undone (a group gone, a process moved
/// back, cpus already at their original value) is left alone.
fn undo_one(cx: &UndoCx, change: &Change) -> anyhow::Result<()> {
    match change {
        Change::SetCpus { path, original } => undo_set_cpus(cx, path, original)?,
        Change::MovedProcess { pid, from, to } => undo_moved_process(cx, *pid, from, to)?,
        Change::EnabledCpuset { dir } => undo_enabled_cpuset(dir)?,
        Change::CreatedCgroup { path, fallback } => undo_created_cgroup(cx, path, fallback)?,
        Change::ModuleParam { module, name, original } => undo_module_param(cx, module, name, original)?,
        Change::ResumeLatency { cpu, original } => {
            if cx.knobs.resume_latency(*cpu)? != *original {
                cx.knobs.set_resume_latency(*cpu, original)?;
            }
        }
        Change::IdleStateDisabled { cpu, state, original } => {
            // Already back: nothing to write (as for every other knob).
            if cx.knobs.state_disabled(*cpu, *state)? != *original {
                cx.knobs.set_state_disabled(*cpu, *state, *original)?;
            }
        }
        Change::CpuidleGovernor { original } => {
            if cx.knobs.sysfs().cpuidle_governor()?.as_deref() != Some(original.as_str()) {
                cx.knobs.set_governor(original)?;
            }
        }
        Change::LoadedHaltpollDriver => cx.knobs.unload_haltpoll_driver()?,
        Change::RcuExpedited { original } => {
            if cx.knobs.rcu_expedited()?.is_some_and(|now| now != *original) {
                cx.knobs.set_rcu_expedited(original)?;
            }
        }
        Change::Pinned { tid, start_ticks, cpus } => undo_pinned(*tid, *start_ticks, cpus)?,
    }
    Ok(())
}

/// Puts a group's cpus back to `original` (when it still exists and they differ).
fn undo_set_cpus(cx: &UndoCx, path: &Path, original: &str) -> anyhow::Result<()> {
    if let Some(cg) = cx.cgroups()?.open_existing(path)? {
        let cpus = CpuSet::parse(original).map_err(|e| anyhow::anyhow!("recorded cpus '{original}': {e}"))?;
        // Unchanged (a write refused, or undone before a kill): nothing to
        // write, so a read-only cpuset.cpus is not a failed restore.
        if cg.cpus().ok().as_ref() != Some(&cpus) {
            cg.set_cpus(&cpus)?;
        }
    }
    Ok(())
}

/// Moves a process back from `to` to `from`.
fn undo_moved_process(cx: &UndoCx, pid: i32, from: &Path, to: &Path) -> anyhow::Result<()> {
    let cgroups = cx.cgroups()?;
    // Only move it back if it is still where we put it (and where it came from exists).
    if let (Some(src), Some(dest)) = (cgroups.open_existing(to)?, cgroups.open_existing(from)?) {
        if src.procs().unwrap_or_default().contains(&pid) {
            ignore_vanished(dest.add_process(pid))?;
        }
    }
    Ok(())
}

/// Disables the cpuset controller for the children of `dir` again.
fn undo_enabled_cpuset(dir: &Path) -> anyhow::Result<()> {
    // Only while no child group (ours is gone by now) could depend on it.
    let busy = std::fs::read_dir(dir).map(|d| d.flatten().any(|e| e.file_type().is_ok_and(|t| t.is_dir()))).unwrap_or(true);
    if !busy {
        std::fs::write(dir.join("cgroup.subtree_control"), "-cpuset").with_context(|| format!("disabling cpuset in {}", dir.display()))?;
    }
    Ok(())
}

/// Removes a group the agent created, its processes moved to `fallback` (or the root) first.
fn undo_created_cgroup(cx: &UndoCx, path: &Path, fallback: &Path) -> anyhow::Result<()> {
    let cgroups = cx.cgroups()?;
    // Removed already (by us before a kill, or by someone else): nothing to undo.
    if let Some(cg) = cgroups.open_existing(path)? {
        // Whatever is left goes back where the agent came from, or to the root.
        let dest = match cgroups.open_existing(fallback)? {
            Some(d) => d,
            None => cgroups.open(cgroups.root())?,
        };
        for pid in cg.procs().unwrap_or_default() {
            ignore_vanished(dest.add_process(pid))?;
        }
        cg.remove()?;
    }
    Ok(())
}

/// Writes a module parameter's original value back (and resets the CPUs' own poll windows
/// after the haltpoll window's cap).
fn undo_module_param(cx: &UndoCx, module: &str, name: &str, original: &str) -> anyhow::Result<()> {
    let sysfs = cx.knobs.sysfs();
    // Already back (undone before a kill) or the module gone: nothing to write.
    let now = sysfs.module_params(module)?;
    if now.get(name).is_some_and(|v| v != original) {
        sysfs.write_module_param(module, name, original)?;
        if module == gleaner_os::idle::HALTPOLL_MODULE && name == gleaner_os::idle::HALTPOLL_WINDOW_PARAM {
            // Each CPU's own window, grown under ours, back to 0 (the cap alone
            // would leave them polling where idle periods stay short).
            cx.knobs.reset_poll_windows()?;
        }
    }
    Ok(())
}

/// Puts a thread's remembered affinity back.
fn undo_pinned(tid: i32, start_ticks: u64, cpus: &str) -> anyhow::Result<()> {
    // Only the thread that pinned itself: gone, or its id reused since, is left alone.
    let same = gleaner_os::procfs::Procfs::new().process_stat(tid).is_ok_and(|st| st.starttime_ticks == start_ticks);
    let want = CpuSet::parse(cpus).map_err(|e| anyhow::anyhow!("recorded pin '{cpus}': {e}"))?;
    if same && gleaner_os::sched::affinity(tid).is_ok_and(|now| now != want) {
        ignore_vanished(gleaner_os::sched::set_affinity(tid, &want))?;
    }
    Ok(())
}

/// A process that exited between listing and moving is not an error.
fn ignore_vanished(r: gleaner_os::Result<()>) -> anyhow::Result<()> {
    match r {
        Ok(()) => Ok(()),
        Err(e) if is_vanished(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn is_vanished(e: &gleaner_os::OsError) -> bool {
    e.is_vanished()
}

/// Undoes what dead agents left: state files whose agent is gone, then `gleaner-agent-<pid>`
/// cgroups of dead agents without a state file. Returns a line per thing restored.
pub fn restore_dead(run_dir: &Path, cx: &UndoCx) -> anyhow::Result<Vec<String>> {
    let mut done = Vec::new();
    let mut errors = Vec::new();
    if let Ok(entries) = std::fs::read_dir(run_dir) {
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            // Status sockets of dead agents.
            if let Some(pid) = name.strip_prefix("agent-").and_then(|s| s.strip_suffix(".sock")).and_then(|s| s.parse::<i32>().ok()) {
                if !alive(pid) && std::fs::remove_file(&p).is_ok() {
                    done.push(format!("removed stale socket {}", p.display()));
                }
                continue;
            }
            let Some(pid) = state_file_pid(&name) else {
                continue;
            };
            if alive(pid) && pid != std::process::id().cast_signed() {
                continue;
            }
            // A state file that is not ours alone (a symlink, another user's, writable by
            // others) is neither followed nor acted on; the others are still restored.
            let state = match read_state(&p) {
                Ok(Some(state)) => state,
                Ok(None) => continue,
                Err(e) => {
                    errors.push(format!("{e:#}"));
                    continue;
                }
            };
            let errs = undo_changes(cx, &state.changes);
            if errs.is_empty() {
                let _ = std::fs::remove_file(&p);
                done.push(format!("restored {} change(s) of dead agent {pid} ({})", state.changes.len(), p.display()));
            } else {
                errors.extend(errs);
            }
        }
    }
    let groups = match &cx.cgroups {
        Some(cgroups) => cgroups.list_gleaner_groups()?,
        None => Vec::new(),
    };
    for cg in groups {
        let name = cg.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let Some(pid) = name.strip_prefix("gleaner-agent-").and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if alive(pid) {
            continue;
        }
        let parent = cg.parent().map(Path::to_path_buf).unwrap_or_default();
        let errs = undo_changes(cx, &[Change::CreatedCgroup { path: cg.clone(), fallback: parent }]);
        if errs.is_empty() {
            done.push(format!("removed orphan cgroup {}", cg.display()));
        } else {
            errors.extend(errs);
        }
    }
    if errors.is_empty() {
        Ok(done)
    } else {
        anyhow::bail!("restore incomplete: {}", errors.join("; "))
    }
}

/// The guardian process of an agent. Dropping the handle (or the agent dying) closes its pipe.
#[derive(Debug)]
pub struct Guardian {
    child: Child,
    pipe: Option<ChildStdin>,
    /// The guardian writes one line here once it is armed (see [`Guardian::wait_armed`]).
    ready: Option<std::process::ChildStdout>,
}

impl Guardian {
    /// Starts `gleaner __guardian --state FILE`.
    pub fn spawn(state_file: &Path) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("locating the gleaner binary")?;
        let mut child = Command::new(exe)
            .arg("__guardian")
            .arg("--state")
            .arg(state_file)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the guardian process")?;
        let pipe = child.stdin.take();
        let ready = child.stdout.take();
        Ok(Self { child, pipe, ready })
    }

    /// Waits (at most `timeout`) until the guardian says it is armed: started, signals
    /// ignored, reading its pipe. The agent calls this right before starting the workload, so
    /// the guardian's start-up (an exec of this binary: milliseconds natively, ~100 ms of vCPU
    /// time in an emulated guest) never competes with the workload, and a `kill -9` at any
    /// moment after the workload started is covered. A guardian that exited is an error; one
    /// that is merely slow is waited for no longer than `timeout` (it still arms later).
    pub fn wait_armed(&mut self, timeout: std::time::Duration) -> anyhow::Result<()> {
        use std::io::Read;
        let Some(mut out) = self.ready.take() else {
            return Ok(());
        };
        if !gleaner_os::fd::wait_readable(&out, timeout) {
            tracing::warn!("the guardian did not report within {} ms; starting the workload anyway", timeout.as_millis());
            return Ok(());
        }
        let mut b = [0u8; 1];
        match out.read(&mut b) {
            Ok(1) => Ok(()),
            _ => anyhow::bail!("the guardian process exited before it was armed"),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Closes the pipe and reaps the guardian, which undoes whatever the state file still
    /// records.
    pub fn finish(mut self) {
        self.pipe.take();
        let _ = self.child.wait();
    }

    /// The agent undid its changes itself and removed the state file: the guardian has
    /// nothing left to do. Kill and reap it instead of waiting for it to finish starting up
    /// (exec, argument parsing) only to find no file: on a loaded machine that wait was a
    /// visible part of a short `gleaner run`.
    pub fn dismiss(mut self) {
        let _ = self.child.kill();
        self.pipe.take();
        let _ = self.child.wait();
    }
}

/// Body of `gleaner __guardian`: wait for the agent to go away, then undo what it left.
pub fn guardian_main(state_file: &Path) -> anyhow::Result<()> {
    use nix::sys::signal::{signal, SigHandler, Signal};
    // Test seam: a slow guardian start (as in an emulated guest), so a test can tell whether
    // the agent waits for it (tests/agent.rs, the_workload_starts_only_once_the_guardian_is_armed).
    if let Some(ms) = std::env::var("GLEANER_GUARDIAN_ARM_DELAY_MS").ok().and_then(|v| v.parse::<u64>().ok()) {
        std::thread::sleep(std::time::Duration::from_millis(ms.min(2000)));
    }
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP, Signal::SIGPIPE] {
        // SAFETY: installing SIG_IGN has no handler code to be async-signal-safe.
        unsafe { signal(s, SigHandler::SigIgn) }.context("ignoring signals")?;
    }
    // Armed: tell the agent (Guardian::wait_armed), which then starts the workload.
    {
        use std::io::Write;
        let mut out = std::io::stdout();
        let _ = out.write_all(b"\n").and_then(|()| out.flush());
    }
    let mut buf = [0u8; 64];
    let mut stdin = std::io::stdin();
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    // The agent is gone. A state file left means it did not finish its own restore.
    let Some(state) = read_state(state_file)? else {
        return Ok(());
    };
    let errors = undo_changes(&UndoCx::real(), &state.changes);
    // The socket first: a state file gone means this guardian is done (the tests, and a
    // `gleaner restore` run meanwhile, wait for that).
    let _ = std::fs::remove_file(state_file.with_extension("sock"));
    let _ = std::fs::remove_file(state_file);
    if errors.is_empty() {
        eprintln!(
            "gleaner: guardian: agent {} ended without restoring; undid its {} recorded change(s) from {}",
            state.agent_pid,
            state.changes.len(),
            state_file.display()
        );
        Ok(())
    } else {
        anyhow::bail!("guardian restore incomplete: {}", errors.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_are_given_back_after_every_move_and_cpuset_write() {
        let cg = || PathBuf::from("/sys/fs/cgroup/gleaner-agent-1");
        let pin = |tid, cpus: &str| Change::Pinned { tid, start_ticks: 7, cpus: cpus.into() };
        let changes = vec![
            Change::CreatedCgroup { path: cg(), fallback: "/sys/fs/cgroup".into() },
            pin(11, "1"),
            Change::SetCpus { path: cg(), original: "0-1".into() },
            pin(12, "0"),
            pin(11, "0"),
            Change::MovedProcess { pid: 10, from: "/sys/fs/cgroup".into(), to: cg() },
        ];
        let order: Vec<&Change> = undo_order(&changes).collect();
        let expected = [&changes[5], &changes[2], &changes[0], &changes[1], &changes[3], &changes[4]];
        assert_eq!(order, expected, "the moves newest first, then the pins as they were made (the latest pin of a thread last)");
        let json = serde_json::to_value(&changes[1]).unwrap();
        assert_eq!(serde_json::from_value::<Change>(json).unwrap(), changes[1]);
    }

    #[test]
    fn a_pin_of_a_thread_gone_or_reused_is_left_alone() {
        // No such thread: nothing to do, no error (pid_max is far below this id).
        let gone = Change::Pinned { tid: i32::MAX - 1, start_ticks: 1, cpus: "0".into() };
        assert!(undo_changes(&UndoCx { cgroups: None, knobs: IdleKnobs::new() }, &[gone]).is_empty());
        // This thread, but another start time: an id reused since the pin was seen.
        let me = i32::try_from(std::process::id()).unwrap();
        let before = gleaner_os::sched::affinity(me).unwrap();
        let reused = Change::Pinned { tid: me, start_ticks: u64::MAX, cpus: "0".into() };
        assert!(undo_changes(&UndoCx { cgroups: None, knobs: IdleKnobs::new() }, &[reused]).is_empty());
        assert_eq!(gleaner_os::sched::affinity(me).unwrap(), before, "a reused id was pinned");
    }
}
