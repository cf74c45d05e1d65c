//! Everything a run changes or holds, in one place, undone by [`Session::finish`] on every
//! exit path: the journal (state file) and its guardian, the locks, the workload's cgroup,
//! the idle knobs, the yielding threads, the servers.
//!
//! ```text
//!  open_journal     (root) state file + guardian: from here a kill -9 is covered
//!  take_idle_knobs  the idle-knob lock; a KnobWriter on the journal
//!  take_target      the workload's cgroup (created, or the given one taken over and locked);
//!                   the pins of an attached process's threads, seen before it moves
//!  finish           yielders stop -> journal undone (cgroups and knobs, newest first) ->
//!                   pins put back where the kernel reset them -> guardian dismissed (or
//!                   left to finish) -> servers stop
//! ```

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use gleaner_os::cgroup::Cgroups;
use gleaner_os::idle::IdleKnobs;
use gleaner_os::pins::PinWatch;
use gleaner_os::procfs::Procfs;
use gleaner_os::BadInput;

use super::apply::IdleActuator;
use super::target::{lock_managed, own_cpuset_cgroup, Managed};
use super::{RunContext, Target};
use crate::config::AgentConfig;
use crate::knobs::KnobWriter;
use crate::server::{self, Server};
use crate::state::{Change, Guardian, StateFile, UndoCx};
use crate::status::SharedStatus;
use crate::yielders::Yielders;

/// What a run holds (module documentation).
#[derive(Debug)]
pub(crate) struct Session {
    /// `flock`s: the managed cgroup (a second agent asked to manage it is refused) and the
    /// idle knobs (one agent drives them).
    pub(crate) locks: Vec<gleaner_os::private::DirLock>,
    pub(crate) state: Option<StateFile>,
    pub(crate) guardian: Option<Guardian>,
    pub(crate) cgroups: Option<Cgroups>,
    pub(crate) yielders: Option<Yielders>,
    pub(crate) knobs: Option<IdleActuator>,
    pub(crate) servers: Vec<Server>,
    /// The workload's threads that pinned themselves (while there are any, consolidation
    /// keeps every vCPU).
    pub(crate) pins: PinWatch,
}

/// The status socket in the (private) run directory.
pub(crate) fn serve_status(cfg: &AgentConfig, status: &SharedStatus) -> anyhow::Result<Server> {
    crate::state::create_private_dir(&cfg.run_dir)?;
    server::serve_status(&server::socket_path(&cfg.run_dir, std::process::id().cast_signed()), Arc::clone(status))
}

/// Journals every pin `pins` remembers that `state` does not hold yet (call after observing,
/// before the next move or cpuset write), so that the guardian of a killed agent can give a
/// program its pins back on a kernel before 6.2.
pub(crate) fn journal_pins(state: &mut StateFile, pins: &PinWatch) -> anyhow::Result<()> {
    // The journal's pins, read once: a workload of many threads is journaled in one pass.
    let known: std::collections::HashSet<(i32, String)> = state
        .state()
        .changes
        .iter()
        .filter_map(|c| match c {
            Change::Pinned { tid, cpus, .. } => Some((*tid, cpus.clone())),
            _ => None,
        })
        .collect();
    for (tid, cpus) in pins.pins() {
        let cpus = cpus.to_string();
        if known.contains(&(tid, cpus.clone())) {
            continue;
        }
        // A thread gone since it was seen has nothing to give back.
        if let Ok(st) = Procfs::new().process_stat(tid) {
            state.record(Change::Pinned { tid, start_ticks: st.starttime_ticks, cpus })?;
        }
    }
    Ok(())
}

impl Session {
    pub(crate) fn new(cgroups: Option<Cgroups>) -> Self {
        Self {
            locks: Vec::new(),
            state: None,
            guardian: None,
            cgroups,
            yielders: None,
            knobs: None,
            servers: Vec::new(),
            pins: PinWatch::default(),
        }
    }

    /// The state file and its guardian (root only: only root changes anything the journal
    /// would record). The status socket opens right after, so the guardian removes it too.
    pub(crate) fn open_journal(&mut self, cfg: &AgentConfig, status: &SharedStatus, socket: bool) -> anyhow::Result<()> {
        crate::seam::stop_at(crate::seam::BEFORE_JOURNAL);
        let state = StateFile::create(&cfg.run_dir, std::process::id().cast_signed())?;
        self.guardian = Some(Guardian::spawn(state.path())?);
        self.state = Some(state);
        if socket {
            self.servers.push(serve_status(cfg, status)?);
        }
        Ok(())
    }

    /// Takes the idle-knob lock and a knob writer on the journal; `Err(why)` when this agent
    /// may not turn the knobs (no journal: not root; another agent drives them).
    pub(crate) fn take_idle_knobs(&mut self, cfg: &AgentConfig, cpus: &gleaner_os::cpuset::CpuSet) -> Result<(), String> {
        if self.state.is_none() {
            return Err("not root".into());
        }
        let lock = match crate::knobs::try_lock_knobs(&cfg.run_dir) {
            Ok(Some(l)) => l,
            Ok(None) => return Err("another agent drives the idle knobs".into()),
            Err(e) => return Err(format!("{e:#}")),
        };
        let knobs = IdleKnobs::new();
        let offer = knobs.offer(cpus).map_err(|e| format!("{e:#}"))?;
        self.locks.push(lock);
        self.knobs = Some(IdleActuator::new(KnobWriter::new(knobs, offer)));
        Ok(())
    }

    /// Consolidation's set-up, each change journaled before it is made: the workload's cgroup
    /// (created, or the given one taken over and locked).
    pub(crate) fn take_target(&mut self, ctx: &RunContext<'_>) -> anyhow::Result<Managed> {
        let RunContext { target, cpus, procfs, .. } = *ctx;
        let agent_pid = std::process::id().cast_signed();
        let mut managed = Managed { cgroup: None, root_pid: None };
        let cgroups = self.cgroups.as_ref().context("cgroups vanished")?;
        // An existing group to take over is opened and locked before any change: a second
        // agent on it stops here, having done nothing.
        let given = match target {
            Target::Cgroup(p) => {
                let cg = cgroups.open(p).map_err(|e| BadInput::new("--cgroup", p.display(), format!("an existing cpuset cgroup ({e})")))?;
                self.locks.push(lock_managed(cg.path(), "--cgroup")?);
                Some(cg)
            }
            _ => None,
        };
        let state = self.state.as_mut().context("consolidation without a journal")?;
        let fallback = own_cpuset_cgroup(cgroups, procfs, agent_pid)?;
        self.pins = PinWatch::new(cpus.clone());
        match target {
            Target::Command(_) | Target::Pid(_) => {
                let name = format!("gleaner-agent-{agent_pid}");
                let path = cgroups.root().join(&name);
                state.record(Change::CreatedCgroup { path: path.clone(), fallback: fallback.clone() })?;
                crate::seam::stop_at(crate::seam::JOURNALED);
                let cg = cgroups.create(Path::new(""), &name)?;
                self.locks.push(lock_managed(cg.path(), "cgroup")?);
                for dir in cg.enabled_cpuset_in() {
                    state.record(Change::EnabledCpuset { dir: dir.clone() })?;
                }
                cg.set_cpus(cpus)?;
                if let Target::Pid(pid) = target {
                    let pids = procfs.descendants(*pid, true).unwrap_or_default();
                    for p in pids {
                        let from = own_cpuset_cgroup(cgroups, procfs, p)?;
                        // Its threads' pins, against the cpuset they are in now: a kernel
                        // before 6.2 resets them to the new group's on the move.
                        if let Ok(source) = cgroups.open(&from).and_then(|g| g.cpus()) {
                            self.pins.observe_more(&procfs.tasks(p).unwrap_or_default(), &source.intersection(cpus));
                            journal_pins(state, &self.pins)?;
                        }
                        state.record(Change::MovedProcess { pid: p, from, to: cg.path().to_path_buf() })?;
                        cg.add_process(p).with_context(|| format!("moving pid {p} into {}", cg.path().display()))?;
                    }
                    self.pins.reapply();
                    managed.root_pid = Some(*pid);
                }
                managed.cgroup = Some(cg);
            }
            Target::System => unreachable!("no consolidation without a workload"),
            Target::Cgroup(_) => {
                let cg = given.context("the --cgroup group was opened above")?;
                let original = cg.cpus()?;
                self.pins.observe_more(&cg.threads().unwrap_or_default(), &original.intersection(cpus));
                journal_pins(state, &self.pins)?;
                state.record(Change::SetCpus { path: cg.path().to_path_buf(), original: original.to_string() })?;
                cg.set_cpus(cpus)?;
                self.pins.reapply();
                managed.cgroup = Some(cg);
            }
        }
        Ok(managed)
    }

    /// Waits (at most 5 s) until the guardian is armed: called right before the workload
    /// starts.
    pub(crate) fn guardian_armed(&mut self) -> anyhow::Result<()> {
        if let Some(g) = self.guardian.as_mut() {
            g.wait_armed(Duration::from_secs(5))?;
        }
        Ok(())
    }

    /// Undoes everything, in reverse order of setup. Runs on every exit path.
    pub(crate) fn finish(&mut self) -> anyhow::Result<()> {
        if let Some(mut y) = self.yielders.take() {
            y.stop();
        }
        let mut result = Ok(());
        let mut undone = false;
        let knobs = self.knobs.take().map_or_else(IdleKnobs::new, |k| k.writer().knobs().clone());
        if let Some(state) = self.state.take() {
            result = state.undo(&UndoCx { cgroups: self.cgroups.clone(), knobs });
            // Moved back, a thread has its own mask again since Linux 6.2; before, the move
            // set it to the cgroup's.
            self.pins.reapply();
            // `undo` removes the state file even when a step failed: nothing is left for the
            // guardian (`gleaner restore` finds orphan groups by name).
            undone = true;
        }
        if let Some(g) = self.guardian.take() {
            if undone {
                g.dismiss();
            } else {
                g.finish();
            }
        }
        self.locks.clear();
        for s in self.servers.drain(..) {
            s.stop();
        }
        result
    }
}
