//! The kernel idle knobs as the agent changes them: every knob's original value is written to
//! the agent's journal (its state file) *before* the knob is first changed, so the agent on
//! exit, its guardian after `kill -9`, or `gleaner restore` puts it back
//! ([`crate::state::Change`]).
//!
//! ```text
//!  KnobWriter::set_poll_window(journal, ns)   guest_halt_poll_ns (+ governor -> haltpoll)
//!  KnobWriter::set_fixed_poll_window(...)     the same, + grow_start = ns, allow_shrink = N
//!  KnobWriter::set_poll_always(journal, cpu)  cpuN pm_qos_resume_latency_us = n/a
//!  KnobWriter::set_state_disabled(...)        cpuN stateK/disable (menu, ladder)
//!      first change of a knob: journal.record(Change{original}) -> write
//!  KnobWriter::restore_now()                  originals back now (after a calibration);
//!                                             the records stay: undoing twice is harmless
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use gleaner_os::cpuset::CpuSet;
use gleaner_os::idle::{
    IdleKnobs, IdleOffer, HALTPOLL_ALLOW_SHRINK_PARAM, HALTPOLL_GROW_START_PARAM, HALTPOLL_MODULE, HALTPOLL_SHRINK_PARAM,
    HALTPOLL_WINDOW_PARAM, RESUME_LATENCY_NONE, RESUME_LATENCY_POLL,
};

use crate::state::{Change, Guardian, StateFile, UndoCx};

/// The directory whose lock says "an agent drives the kernel idle knobs": they are global
/// (the haltpoll window) or per CPU, and two agents turning them would undo each other.
pub const KNOB_LOCK_DIR: &str = "idle-knobs";

/// Takes the idle-knob lock in `run_dir` (`None`: another agent holds it).
pub fn try_lock_knobs(run_dir: &Path) -> anyhow::Result<Option<gleaner_os::private::DirLock>> {
    let dir = run_dir.join(KNOB_LOCK_DIR);
    gleaner_os::private::create_private_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(gleaner_os::private::try_lock_dir(&dir)?)
}

/// Kernel polling as a measurement may change it: the agent's knob writer and journal
/// (`None`: not root, or another agent drives the knobs; the curve is then measured as the
/// machine is, and P is not measured).
pub type Control<'a> = Option<(&'a mut KnobWriter, &'a mut StateFile)>;

/// Runs `f` with control of the idle knobs of `cpus` under a journal of its own
/// (`RUN_DIR/knobs-<pid>.json`, watched by a guardian), which is undone and removed when
/// `f` returns; `f(None)` where that cannot be had (not root, no usable run dir, another
/// agent drives the knobs: `why` says which). For a calibration outside an agent's run.
pub fn with_knob_journal<T>(run_dir: &Path, cpus: &CpuSet, f: impl FnOnce(Control<'_>, Option<String>) -> T) -> T {
    if !nix::unistd::geteuid().is_root() {
        return f(None, Some("not root".into()));
    }
    let setup = || -> anyhow::Result<Option<(gleaner_os::private::DirLock, StateFile, Guardian, KnobWriter)>> {
        let Some(lock) = try_lock_knobs(run_dir)? else { return Ok(None) };
        let knobs = IdleKnobs::new();
        let offer = knobs.offer(cpus)?;
        let journal = StateFile::create_for_knobs(run_dir, std::process::id().cast_signed())?;
        let mut guardian = Guardian::spawn(journal.path())?;
        guardian.wait_armed(std::time::Duration::from_secs(5))?;
        Ok(Some((lock, journal, guardian, KnobWriter::new(knobs, offer))))
    };
    match setup() {
        Ok(Some((lock, mut journal, guardian, mut writer))) => {
            let out = f(Some((&mut writer, &mut journal)), None);
            let undone = journal.undo(&UndoCx { cgroups: None, knobs: writer.knobs().clone() });
            guardian.dismiss();
            drop(lock);
            if let Err(e) = undone {
                tracing::error!("restoring the idle knobs after a calibration: {e:#}");
            }
            out
        }
        Ok(None) => f(None, Some("another agent drives the idle knobs".into())),
        Err(e) => f(None, Some(format!("{e:#}"))),
    }
}

/// One knob, for "recorded already".
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Param(String),
    Latency(u32),
    State(u32, u32),
    Governor,
    Rcu,
}

/// Changes the idle knobs under a journal (module documentation).
#[derive(Debug)]
pub struct KnobWriter {
    knobs: IdleKnobs,
    offer: IdleOffer,
    /// Knobs changed, with the change that restores each (in the order first changed).
    changed: BTreeMap<Key, (usize, Change)>,
}

impl KnobWriter {
    pub fn new(knobs: IdleKnobs, offer: IdleOffer) -> Self {
        Self { knobs, offer, changed: BTreeMap::new() }
    }

    pub fn offer(&self) -> &IdleOffer {
        &self.offer
    }

    pub fn knobs(&self) -> &IdleKnobs {
        &self.knobs
    }

    /// Records `change` (the knob's original) the first time `key` is changed.
    fn record(&mut self, journal: &mut StateFile, key: Key, change: Change) -> anyhow::Result<()> {
        if !self.changed.contains_key(&key) {
            journal.record(change.clone())?;
            let n = self.changed.len();
            self.changed.insert(key, (n, change));
        }
        Ok(())
    }

    /// Sets the haltpoll governor's window cap (ns), switching the governor to `haltpoll`
    /// first where the haltpoll driver runs under another one.
    pub fn set_poll_window(&mut self, journal: &mut StateFile, ns: u64) -> anyhow::Result<()> {
        if !self.offer.poll_window() {
            anyhow::bail!("this machine offers no haltpoll window ({})", self.offer.describe());
        }
        if ns > 0 && self.offer.governor.as_deref() != Some("haltpoll") {
            let original = self.offer.governor.clone().context("no cpuidle governor to switch from")?;
            self.record(journal, Key::Governor, Change::CpuidleGovernor { original })?;
            self.knobs.set_governor("haltpoll")?;
            self.offer.governor = Some("haltpoll".into());
        }
        self.set_haltpoll_param(journal, HALTPOLL_WINDOW_PARAM, &ns.to_string())
    }

    /// Sets the haltpoll window to a fixed `ns` on every CPU, the window the idle planner
    /// models: the cap, `guest_halt_poll_grow_start` = the cap (a CPU's first halt inside it
    /// grows its own window straight to the cap) and `guest_halt_poll_allow_shrink` = N (an
    /// idle period longer than the cap no longer halves it). Under the kernel's adaptive
    /// rules a CPU whose idle periods are short sits at `grow_start` (50 us) and drops to 0
    /// at every period longer than the cap, so the next short one halts: a ping-pong's p99
    /// read 19-23 us at caps of 65-131 us, and 7.4-7.9 us with the window fixed (this VM,
    /// `gleaner bench workload pingpong`, 2 runs each). With `ns` 0 only the cap is written.
    /// Parameters this kernel lacks are left alone.
    pub fn set_fixed_poll_window(&mut self, journal: &mut StateFile, ns: u64) -> anyhow::Result<()> {
        self.set_poll_window(journal, ns)?;
        if ns == 0 {
            return Ok(());
        }
        for (name, value) in [(HALTPOLL_GROW_START_PARAM, ns.to_string()), (HALTPOLL_ALLOW_SHRINK_PARAM, "N".to_string())] {
            if self.knobs.haltpoll_param(name)?.is_some() {
                self.set_haltpoll_param(journal, name, &value)?;
            }
        }
        Ok(())
    }

    /// Turns shrinking to nothing on (`guest_halt_poll_shrink` 0, `guest_halt_poll_allow_shrink`
    /// Y: a CPU's first halt longer than the cap sets its own window to 0, and its next idle
    /// period inside the cap grows it to the cap again, `grow_start`) or off (`allow_shrink` N,
    /// the fixed window's rule; `shrink` stays 0 until the knobs are restored). How a lowered
    /// cap reaches the CPUs still polling at an older one without switching governors
    /// (`gleaner_policy::guest::WindowReset::Shrink`). Returns false, writing nothing, where
    /// this kernel lacks either parameter.
    pub fn set_shrink_to_nothing(&mut self, journal: &mut StateFile, on: bool) -> anyhow::Result<bool> {
        for name in [HALTPOLL_SHRINK_PARAM, HALTPOLL_ALLOW_SHRINK_PARAM] {
            if self.knobs.haltpoll_param(name)?.is_none() {
                return Ok(false);
            }
        }
        if on {
            self.set_haltpoll_param(journal, HALTPOLL_SHRINK_PARAM, "0")?;
        }
        self.set_haltpoll_param(journal, HALTPOLL_ALLOW_SHRINK_PARAM, if on { "Y" } else { "N" })?;
        Ok(true)
    }

    /// Sets one haltpoll module parameter.
    pub fn set_haltpoll_param(&mut self, journal: &mut StateFile, name: &str, value: &str) -> anyhow::Result<()> {
        let original = self.knobs.haltpoll_param(name)?.with_context(|| format!("haltpoll parameter {name} is missing"))?;
        if original == value && !self.changed.contains_key(&Key::Param(name.into())) {
            return Ok(());
        }
        self.record(journal, Key::Param(name.into()), Change::ModuleParam { module: HALTPOLL_MODULE.into(), name: name.into(), original })?;
        self.knobs.set_haltpoll_param(name, value)?;
        Ok(())
    }

    /// Resets each CPU's own haltpoll window (`IdleKnobs::reset_poll_windows`: a switch of the
    /// governor, with grace periods expedited meanwhile), the expedited-RCU switch journaled
    /// first. Returns whether it switched.
    pub fn reset_poll_windows(&mut self, journal: &mut StateFile) -> anyhow::Result<bool> {
        if let Some(original) = self.knobs.rcu_expedited()? {
            self.record(journal, Key::Rcu, Change::RcuExpedited { original })?;
        }
        Ok(self.knobs.reset_poll_windows()?)
    }

    /// Whether [`Self::restore_now`] resets each CPU's own haltpoll window: it does where it
    /// writes the window cap back, which it changed and which is not at its original now.
    pub fn restore_resets_windows(&self) -> anyhow::Result<bool> {
        let Some((_, Change::ModuleParam { original, .. })) = self.changed.get(&Key::Param(HALTPOLL_WINDOW_PARAM.into())) else {
            return Ok(false);
        };
        Ok(self.knobs.haltpoll_param(HALTPOLL_WINDOW_PARAM)?.is_some_and(|now| now != *original))
    }

    /// Keeps `cpu` polling until work arrives (`true`) or lifts the limit (`false`).
    pub fn set_poll_always(&mut self, journal: &mut StateFile, cpu: u32, on: bool) -> anyhow::Result<()> {
        let original = self.knobs.resume_latency(cpu)?;
        let want = if on { RESUME_LATENCY_POLL } else { RESUME_LATENCY_NONE };
        if original == want && !self.changed.contains_key(&Key::Latency(cpu)) {
            return Ok(());
        }
        self.record(journal, Key::Latency(cpu), Change::ResumeLatency { cpu, original })?;
        self.knobs.set_resume_latency(cpu, want)?;
        Ok(())
    }

    /// Disables (or enables) idle state `state` of `cpu`.
    pub fn set_state_disabled(&mut self, journal: &mut StateFile, cpu: u32, state: u32, disabled: bool) -> anyhow::Result<()> {
        let now = self.knobs.sysfs().cpuidle_states(cpu)?;
        let original =
            now.iter().find(|s| s.index == state).map(|s| s.disabled).with_context(|| format!("cpu{cpu} has no idle state {state}"))?;
        if original == disabled && !self.changed.contains_key(&Key::State(cpu, state)) {
            return Ok(());
        }
        self.record(journal, Key::State(cpu, state), Change::IdleStateDisabled { cpu, state, original })?;
        self.knobs.set_state_disabled(cpu, state, disabled)?;
        Ok(())
    }

    /// Keeps `cpu` from polling in the kernel for a measurement of halted wakeups: the
    /// haltpoll window to 0 (every CPU), no resume latency limit on `cpu`, and, under a
    /// governor that honours it, the POLL state disabled there. Returns what it did.
    pub fn polling_off(&mut self, journal: &mut StateFile, cpu: u32) -> anyhow::Result<String> {
        let mut did = Vec::new();
        if self.offer.haltpoll_params && self.knobs.haltpoll_params()?.get(HALTPOLL_WINDOW_PARAM).is_some_and(|v| v != "0") {
            self.set_haltpoll_param(journal, HALTPOLL_WINDOW_PARAM, "0")?;
            did.push(format!("{HALTPOLL_WINDOW_PARAM} 0"));
        }
        if self.offer.resume_latency && self.knobs.resume_latency(cpu)? == RESUME_LATENCY_POLL {
            self.set_poll_always(journal, cpu, false)?;
            did.push(format!("cpu{cpu} resume latency limit lifted"));
        }
        if let Some(poll) = self.offer.poll_state {
            if self.offer.governor.as_deref().is_some_and(|g| g != "haltpoll") {
                self.set_state_disabled(journal, cpu, poll, true)?;
                did.push(format!("cpu{cpu} state{poll} (POLL) disabled"));
            }
        }
        Ok(if did.is_empty() { "kernel polling already off".into() } else { did.join(", ") })
    }

    /// Makes `cpu` poll until work arrives, for a measurement of polled wakeups (`None`: the
    /// machine cannot: no POLL state or no resume latency file).
    pub fn polling_on(&mut self, journal: &mut StateFile, cpu: u32) -> anyhow::Result<Option<String>> {
        if !self.offer.poll_always() {
            return Ok(None);
        }
        if let Some(poll) = self.offer.poll_state {
            if self.changed.contains_key(&Key::State(cpu, poll)) {
                self.set_state_disabled(journal, cpu, poll, false)?;
            }
        }
        self.set_poll_always(journal, cpu, true)?;
        Ok(Some(format!("cpu{cpu} resume latency limit 0 (n/a)")))
    }

    /// Writes back the original of every knob changed so far, newest first (the journal keeps
    /// the records: the final undo finds them restored already). Errors are collected.
    pub fn restore_now(&mut self) -> Vec<String> {
        let mut changes: Vec<(usize, Change)> = self.changed.values().cloned().collect();
        changes.sort_by_key(|(i, _)| *i);
        let list: Vec<Change> = changes.into_iter().map(|(_, c)| c).collect();
        // `undo_changes` takes them in the order made and undoes the newest first.
        let errors = crate::state::undo_changes(&UndoCx { cgroups: None, knobs: self.knobs.clone() }, &list);
        if let Ok(offer) = self.knobs.offer(&gleaner_os::cpuset::CpuSet::from_iter(std::iter::empty::<u32>())) {
            self.offer.governor = offer.governor;
        }
        errors
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::fs;
    use std::path::Path;

    use gleaner_os::cpuset::CpuSet;
    use gleaner_os::sysfs::Sysfs;
    use gleaner_os::testutil::HaltpollSysfs;

    use super::*;

    /// The agent's tests' guest: the haltpoll sysfs fixture under `governor`, its haltpoll cap
    /// at upstream's 200 us and no other haltpoll parameter (a kernel without the tunables the
    /// tests that need them add).
    pub(crate) fn fixture(root: &Path, governor: &str) {
        HaltpollSysfs::new().governor(governor).params(&[("guest_halt_poll_ns", "200000")]).write(root);
    }

    pub(crate) fn writer(root: &Path) -> KnobWriter {
        let knobs = IdleKnobs::with_roots(Sysfs::with_root(root), root.join("mods"));
        let offer = knobs.offer(&CpuSet::parse("0-1").unwrap()).unwrap();
        KnobWriter::new(knobs, offer)
    }

    /// A sysfs fixture under `root` with `governor`, a journal of agent `pid` in `root/run` and a
    /// writer on them: the set-up of most tests here.
    pub(crate) fn journaled(root: &Path, governor: &str, pid: i32) -> (StateFile, KnobWriter) {
        fixture(root, governor);
        (StateFile::create(&root.join("run"), pid).unwrap(), writer(root))
    }

    fn read(root: &Path, rel: &str) -> String {
        fs::read_to_string(root.join(rel)).unwrap().trim().to_string()
    }

    /// Restoring resets the windows only where it writes the cap back: a cap changed and put
    /// back at its original by a later plan (a window of 0 on a machine whose original is 0)
    /// leaves the windows to the adapter (`IdleActuator::apply`, `WindowReset::Switch`).
    #[test]
    fn restoring_resets_the_windows_only_where_it_writes_the_cap_back() {
        let d = tempfile::tempdir().unwrap();
        let (mut journal, mut w) = journaled(d.path(), "haltpoll", 4243);
        assert!(!w.restore_resets_windows().unwrap(), "nothing changed");
        w.set_poll_always(&mut journal, 0, true).unwrap();
        assert!(!w.restore_resets_windows().unwrap(), "the cap untouched");
        w.set_poll_window(&mut journal, 131_072).unwrap();
        assert!(w.restore_resets_windows().unwrap(), "the cap changed");
        w.set_poll_window(&mut journal, 200_000).unwrap();
        assert!(!w.restore_resets_windows().unwrap(), "the cap back at its original");
        assert!(w.restore_now().is_empty());
        assert!(!w.restore_resets_windows().unwrap(), "restored");
    }

    #[test]
    fn each_knob_is_journaled_once_before_it_changes_and_undone_from_the_journal() {
        let d = tempfile::tempdir().unwrap();
        fixture(d.path(), "haltpoll");
        let run = d.path().join("run");
        let mut journal = StateFile::create(&run, 4242).unwrap();
        let mut w = writer(d.path());
        w.set_poll_window(&mut journal, 1_000_000).unwrap();
        w.set_poll_window(&mut journal, 2_000_000).unwrap();
        w.set_poll_always(&mut journal, 1, true).unwrap();
        assert_eq!(read(d.path(), "module/haltpoll/parameters/guest_halt_poll_ns"), "2000000");
        assert_eq!(read(d.path(), "devices/system/cpu/cpu1/power/pm_qos_resume_latency_us"), "n/a");
        let changes = journal.state().changes.clone();
        assert_eq!(
            changes,
            vec![
                Change::ModuleParam { module: "haltpoll".into(), name: "guest_halt_poll_ns".into(), original: "200000".into() },
                Change::ResumeLatency { cpu: 1, original: "0".into() },
            ]
        );
        let cx = UndoCx { cgroups: None, knobs: w.knobs().clone() };
        journal.undo(&cx).unwrap();
        assert_eq!(read(d.path(), "module/haltpoll/parameters/guest_halt_poll_ns"), "200000");
        assert_eq!(read(d.path(), "devices/system/cpu/cpu1/power/pm_qos_resume_latency_us"), "0");
    }

    #[test]
    fn a_fixed_window_sets_grow_start_and_no_shrink_and_undo_puts_all_three_back() {
        let d = tempfile::tempdir().unwrap();
        HaltpollSysfs::new()
            .params(&[("guest_halt_poll_ns", "200000"), ("guest_halt_poll_grow_start", "50000"), ("guest_halt_poll_allow_shrink", "Y")])
            .write(d.path());
        let mut journal = StateFile::create(&d.path().join("run"), 9).unwrap();
        let mut w = writer(d.path());
        w.set_fixed_poll_window(&mut journal, 131_072).unwrap();
        w.set_fixed_poll_window(&mut journal, 65_536).unwrap();
        let p = |name: &str| read(d.path(), &format!("module/haltpoll/parameters/{name}"));
        assert_eq!(
            (p("guest_halt_poll_ns"), p("guest_halt_poll_grow_start"), p("guest_halt_poll_allow_shrink")),
            ("65536".into(), "65536".into(), "N".into())
        );
        // Each original journaled once, the cap's first (undone last, with the CPUs' windows).
        let names: Vec<String> = journal
            .state()
            .changes
            .iter()
            .filter_map(|c| match c {
                Change::ModuleParam { name, .. } => Some(name.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(names, ["guest_halt_poll_ns", "guest_halt_poll_grow_start", "guest_halt_poll_allow_shrink"]);
        // A zero window writes the cap only.
        w.set_fixed_poll_window(&mut journal, 0).unwrap();
        assert_eq!((p("guest_halt_poll_ns"), p("guest_halt_poll_grow_start")), ("0".into(), "65536".into()));
        assert!(w.restore_now().is_empty());
        assert_eq!(
            (p("guest_halt_poll_ns"), p("guest_halt_poll_grow_start"), p("guest_halt_poll_allow_shrink")),
            ("200000".into(), "50000".into(), "Y".into())
        );
        // A kernel without the two parameters: the cap alone.
        let d = tempfile::tempdir().unwrap();
        let (mut journal, mut w) = journaled(d.path(), "haltpoll", 10);
        w.set_fixed_poll_window(&mut journal, 131_072).unwrap();
        assert_eq!(journal.state().changes.len(), 1);
    }

    #[test]
    fn shrinking_to_nothing_turns_on_and_off_and_restore_puts_both_back() {
        let d = tempfile::tempdir().unwrap();
        HaltpollSysfs::new().params(&[("guest_halt_poll_ns", "200000"), ("guest_halt_poll_allow_shrink", "Y")]).write(d.path());
        let hp = d.path().join("module/haltpoll/parameters");
        let mut journal = StateFile::create(&d.path().join("run"), 11).unwrap();
        let mut w = writer(d.path());
        let p = |name: &str| read(d.path(), &format!("module/haltpoll/parameters/{name}"));
        // A kernel without guest_halt_poll_shrink: nothing written.
        assert!(!w.set_shrink_to_nothing(&mut journal, true).unwrap());
        assert!(journal.state().changes.is_empty());
        fs::write(hp.join("guest_halt_poll_shrink"), "2\n").unwrap();
        w.set_fixed_poll_window(&mut journal, 65_536).unwrap();
        assert_eq!(p("guest_halt_poll_allow_shrink"), "N");
        assert!(w.set_shrink_to_nothing(&mut journal, true).unwrap());
        assert_eq!((p("guest_halt_poll_shrink"), p("guest_halt_poll_allow_shrink")), ("0".into(), "Y".into()));
        assert!(w.set_shrink_to_nothing(&mut journal, false).unwrap());
        assert_eq!((p("guest_halt_poll_shrink"), p("guest_halt_poll_allow_shrink")), ("0".into(), "N".into()));
        let cx = UndoCx { cgroups: None, knobs: w.knobs().clone() };
        journal.undo(&cx).unwrap();
        assert_eq!((p("guest_halt_poll_shrink"), p("guest_halt_poll_allow_shrink")), ("2".into(), "Y".into()));
    }

    #[test]
    fn a_measurement_turns_polling_off_then_on_and_restores_now() {
        let d = tempfile::tempdir().unwrap();
        let (mut journal, mut w) = journaled(d.path(), "menu", 7);
        let did = w.polling_off(&mut journal, 1).unwrap();
        assert!(did.contains("guest_halt_poll_ns 0") && did.contains("state0 (POLL) disabled"), "{did}");
        assert_eq!(read(d.path(), "devices/system/cpu/cpu1/cpuidle/state0/disable"), "1");
        let on = w.polling_on(&mut journal, 1).unwrap().unwrap();
        assert!(on.contains("cpu1"), "{on}");
        assert_eq!(read(d.path(), "devices/system/cpu/cpu1/cpuidle/state0/disable"), "0");
        assert_eq!(read(d.path(), "devices/system/cpu/cpu1/power/pm_qos_resume_latency_us"), "n/a");
        assert!(w.restore_now().is_empty());
        assert_eq!(read(d.path(), "module/haltpoll/parameters/guest_halt_poll_ns"), "200000");
        assert_eq!(read(d.path(), "devices/system/cpu/cpu1/power/pm_qos_resume_latency_us"), "0");
        assert_eq!(read(d.path(), "devices/system/cpu/cpu1/cpuidle/state0/disable"), "0");
        // The journal still names every knob: a second undo finds them back and writes nothing
        // (a write, even of the same value, would move a file's mtime off the one set here).
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        let knob_files = knob_files(d.path());
        assert!(knob_files.len() >= 4, "{knob_files:?}");
        for f in &knob_files {
            fs::File::options().write(true).open(f).unwrap().set_modified(old).unwrap();
        }
        let cx = UndoCx { cgroups: None, knobs: w.knobs().clone() };
        journal.undo(&cx).unwrap();
        for f in &knob_files {
            assert_eq!(fs::metadata(f).unwrap().modified().unwrap(), old, "{} written by the second undo", f.display());
        }
        assert_eq!(read(d.path(), "module/haltpoll/parameters/guest_halt_poll_ns"), "200000");
    }

    /// Every file of the fixture's knobs (module parameters, CPU and cpuidle files).
    fn knob_files(root: &Path) -> Vec<std::path::PathBuf> {
        fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
            for e in fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else {
                    out.push(p);
                }
            }
        }
        let mut out = Vec::new();
        for top in ["module", "devices"] {
            walk(&root.join(top), &mut out);
        }
        out.sort();
        out
    }

    #[test]
    fn a_window_under_another_governor_switches_to_haltpoll_and_back() {
        let d = tempfile::tempdir().unwrap();
        let (mut journal, mut w) = journaled(d.path(), "menu", 8);
        w.set_poll_window(&mut journal, 100_000).unwrap();
        assert_eq!(read(d.path(), "devices/system/cpu/cpuidle/current_governor"), "haltpoll");
        assert!(matches!(journal.state().changes[0], Change::CpuidleGovernor { ref original } if original == "menu"));
        let cx = UndoCx { cgroups: None, knobs: w.knobs().clone() };
        journal.undo(&cx).unwrap();
        assert_eq!(read(d.path(), "devices/system/cpu/cpuidle/current_governor"), "menu");
    }
}
