//! The kernel's idle knobs a guest can turn at run time: what keeps an idle vCPU polling
//! instead of halting, so that a wakeup needs no IPI and no vCPU wakeup by the host.
//!
//! | knob | file | scope | effect |
//! |---|---|---|---|
//! | guest haltpoll window | `module/haltpoll/parameters/guest_halt_poll_ns` (and `_grow`, `_grow_start`, `_shrink`, `_allow_shrink`) | every CPU | the `haltpoll` cpuidle governor polls up to this long before it halts, adapting each CPU's own window below it to the idle periods it sees |
//! | per-CPU resume latency | `devices/system/cpu/cpuN/power/pm_qos_resume_latency_us` | one CPU | `n/a` (a 0 us limit): every governor picks the POLL state, the CPU never halts; `0`: no limit |
//! | per-state disable | `devices/system/cpu/cpuN/cpuidle/stateK/disable` | one CPU | `menu`/`ladder` skip a disabled state; the `haltpoll` governor ignores it (measured: POLL still used with `state0/disable` = 1) |
//! | cpuidle governor | `devices/system/cpu/cpuidle/current_governor` | every CPU | `haltpoll`, `menu`, `ladder`, ... |
//! | `cpuidle-haltpoll` | `modprobe cpuidle-haltpoll force=1` | every CPU | registers the haltpoll driver and governor where it is a module not loaded and no other cpuidle driver is registered |
//! | expedited RCU | `kernel/rcu_expedited` | the kernel | `1`: grace periods by IPI, ~1 ms instead of two ticks; set only for the duration of a governor switch ([`IdleKnobs::reset_poll_windows`]) |
//!
//! Every writer returns the value it replaced, so the caller can journal it before the change
//! and write it back on exit (`gleaner-agent`'s state file, undone by the agent, its guardian
//! after `kill -9`, or `gleaner restore`). [`IdleKnobs::offer`] says which of them this machine
//! has.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::cpuset::CpuSet;
use crate::error::{OsError, Result};
use crate::sysfs::Sysfs;
use crate::util;

/// The module whose parameters set the haltpoll governor's window.
pub const HALTPOLL_MODULE: &str = "haltpoll";
/// The cap of the haltpoll governor's per-CPU poll window, ns.
pub const HALTPOLL_WINDOW_PARAM: &str = "guest_halt_poll_ns";
/// The window a CPU's own grows to first (50 us upstream).
pub const HALTPOLL_GROW_START_PARAM: &str = "guest_halt_poll_grow_start";
/// Whether an idle period longer than the cap halves a CPU's own window (`Y` upstream).
pub const HALTPOLL_ALLOW_SHRINK_PARAM: &str = "guest_halt_poll_allow_shrink";
/// What a CPU's own window is divided by when it shrinks (2 upstream; 0 sets it to 0).
pub const HALTPOLL_SHRINK_PARAM: &str = "guest_halt_poll_shrink";
/// `pm_qos_resume_latency_us` value that keeps a CPU polling (a 0 us limit).
pub const RESUME_LATENCY_POLL: &str = "n/a";
/// `pm_qos_resume_latency_us` value of no limit (what the kernel reads back as `0`).
pub const RESUME_LATENCY_NONE: &str = "0";
/// The haltpoll cpuidle driver's module.
pub const HALTPOLL_DRIVER_MODULE: &str = "cpuidle_haltpoll";
/// The kernel's switch to expedited RCU grace periods, under the sysfs root.
pub const RCU_EXPEDITED: &str = "kernel/rcu_expedited";

/// How the `cpuidle-haltpoll` driver is present.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModuleState {
    /// Built into the kernel (`/sys/module/cpuidle_haltpoll` without `initstate`).
    Builtin,
    /// A module, loaded.
    Loaded,
    /// A module of the running kernel, not loaded (`/lib/modules/<release>/...`).
    Loadable,
    /// Neither.
    Absent,
}

/// What the machine offers to keep idle vCPUs from halting (read by [`IdleKnobs::offer`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdleOffer {
    /// cpuidle driver (`haltpoll`, `intel_idle`, `acpi_idle`); `None`: no cpuidle (the
    /// default idle halts at once).
    pub driver: Option<String>,
    /// cpuidle governor now.
    pub governor: Option<String>,
    /// Governors the kernel has (`available_governors`).
    pub governors: Vec<String>,
    /// The governor can be switched (`current_governor` exists).
    pub governor_switchable: bool,
    /// Index of the POLL state on the managed CPUs (`None`: some CPU has none).
    pub poll_state: Option<u32>,
    /// The haltpoll governor's window can be set: its module parameters exist.
    pub haltpoll_params: bool,
    /// Every managed CPU has a `pm_qos_resume_latency_us` file.
    pub resume_latency: bool,
    /// The haltpoll cpuidle driver.
    pub haltpoll_driver: ModuleState,
}

impl IdleOffer {
    /// The kernel's own polling exists: a POLL state some governor enters.
    pub fn kernel_polling(&self) -> bool {
        self.driver.is_some() && self.poll_state.is_some()
    }

    /// Per-CPU "never halt" through the resume latency limit (any governor with a POLL state).
    pub fn poll_always(&self) -> bool {
        self.kernel_polling() && self.resume_latency
    }

    /// A bounded, adaptive poll window through the haltpoll governor: it runs now, or the
    /// haltpoll driver runs and the governor can be switched to it.
    pub fn poll_window(&self) -> bool {
        self.kernel_polling()
            && self.haltpoll_params
            && (self.governor.as_deref() == Some("haltpoll")
                || (self.driver.as_deref() == Some("haltpoll")
                    && self.governor_switchable
                    && self.governors.iter().any(|g| g == "haltpoll")))
    }

    /// One line for people: what is there and what can be used.
    pub fn describe(&self) -> String {
        let driver = self.driver.as_deref().unwrap_or("none");
        let governor = self.governor.as_deref().unwrap_or("none");
        let yes = |b: bool| if b { "yes" } else { "no" };
        format!(
            "cpuidle driver {driver}, governor {governor}; POLL state: {}; haltpoll window: {}; per-CPU always-poll (resume latency): {}; cpuidle-haltpoll: {:?}",
            self.poll_state.map_or("none".to_string(), |i| format!("state{i}")),
            yes(self.poll_window()),
            yes(self.poll_always()),
            self.haltpoll_driver
        )
    }
}

/// Reads and writes the idle knobs under a sysfs root (module documentation).
#[derive(Debug, Clone)]
pub struct IdleKnobs {
    sysfs: Sysfs,
    /// `/lib/modules/<release>` (where a loadable module would be), for the offer.
    modules_dir: PathBuf,
}

impl Default for IdleKnobs {
    fn default() -> Self {
        Self::new()
    }
}

impl IdleKnobs {
    /// The real `/sys` and the running kernel's module directory.
    pub fn new() -> Self {
        Self::with_roots(Sysfs::new(), PathBuf::from("/lib/modules").join(crate::kernel_release()))
    }

    /// A sysfs tree and module directory of a fixture.
    pub fn with_roots(sysfs: Sysfs, modules_dir: impl Into<PathBuf>) -> Self {
        Self { sysfs, modules_dir: modules_dir.into() }
    }

    pub fn sysfs(&self) -> &Sysfs {
        &self.sysfs
    }

    fn cpu_dir(&self) -> PathBuf {
        self.sysfs.root().join("devices/system/cpu")
    }

    fn resume_latency_path(&self, cpu: u32) -> PathBuf {
        self.cpu_dir().join(format!("cpu{cpu}/power/pm_qos_resume_latency_us"))
    }

    fn governor_path(&self) -> PathBuf {
        self.cpu_dir().join("cpuidle/current_governor")
    }

    /// What the machine offers for `cpus`.
    pub fn offer(&self, cpus: &CpuSet) -> Result<IdleOffer> {
        let driver = self.sysfs.cpuidle_driver()?;
        let governor = self.sysfs.cpuidle_governor()?;
        let governors = util::read_opt(&self.cpu_dir().join("cpuidle/available_governors"))?
            .map(|t| t.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default();
        let mut poll_state = None;
        for (i, cpu) in cpus.iter().enumerate() {
            let here = self.sysfs.cpuidle_states(cpu)?.into_iter().find(|s| s.name == "POLL").map(|s| s.index);
            if i == 0 {
                poll_state = here;
            } else if poll_state != here {
                poll_state = None;
                break;
            }
        }
        let haltpoll_params = self.sysfs.module_params(HALTPOLL_MODULE)?.contains_key(HALTPOLL_WINDOW_PARAM);
        let resume_latency = !cpus.is_empty() && cpus.iter().all(|c| self.resume_latency_path(c).is_file());
        Ok(IdleOffer {
            driver,
            governor,
            governors,
            governor_switchable: self.governor_path().is_file(),
            poll_state,
            haltpoll_params,
            resume_latency,
            haltpoll_driver: self.haltpoll_driver_state(),
        })
    }

    /// How the haltpoll cpuidle driver is present.
    pub fn haltpoll_driver_state(&self) -> ModuleState {
        let dir = self.sysfs.root().join("module").join(HALTPOLL_DRIVER_MODULE);
        if dir.is_dir() {
            return if dir.join("initstate").exists() { ModuleState::Loaded } else { ModuleState::Builtin };
        }
        let file = self.modules_dir.join("kernel/drivers/cpuidle/cpuidle-haltpoll.ko");
        let loadable = ["", ".xz", ".zst", ".gz"].iter().any(|ext| {
            let mut p = file.clone().into_os_string();
            p.push(ext);
            PathBuf::from(p).is_file()
        });
        if loadable {
            ModuleState::Loadable
        } else {
            ModuleState::Absent
        }
    }

    /// The haltpoll module's parameters now (empty without the module).
    pub fn haltpoll_params(&self) -> Result<std::collections::BTreeMap<String, String>> {
        self.sysfs.module_params(HALTPOLL_MODULE)
    }

    /// One haltpoll parameter (`None`: this kernel lacks it, or the module is not loaded).
    pub fn haltpoll_param(&self, name: &str) -> Result<Option<String>> {
        self.sysfs.module_param(HALTPOLL_MODULE, name)
    }

    /// Writes one haltpoll parameter; returns the value it replaced.
    pub fn set_haltpoll_param(&self, name: &str, value: &str) -> Result<String> {
        self.sysfs.write_module_param(HALTPOLL_MODULE, name, value)
    }

    /// Sets every CPU's own poll window of the haltpoll governor back to 0 by switching the
    /// governor away and back (its `enable` starts each CPU at 0). Lowering
    /// `guest_halt_poll_ns` alone does not: a CPU shrinks its window only after it halts, and
    /// a workload whose idle periods are shorter than the window never halts, so it kept
    /// polling at the old window after the knob was put back (measured: a stock run right
    /// after a polling one at 2,000 requests/s polled 0.45 vCPU). Returns whether it did
    /// (the haltpoll governor runs and another one exists to switch through).
    ///
    /// Each switch waits for an RCU grace period (`cpuidle_switch_governor` uninstalls the idle
    /// handler and synchronizes), 8-16 ms here for each of the two writes: the switch was most
    /// of a short `gleaner run`'s exit. Grace periods are expedited meanwhile
    /// ([`RCU_EXPEDITED`] set to 1 where it reads 0, and put back before returning, also on
    /// error): 0.1-4 ms a write on a development VM. A caller that journals knobs records
    /// [`Self::rcu_expedited`] first, in case it is killed in between.
    pub fn reset_poll_windows(&self) -> Result<bool> {
        if self.sysfs.cpuidle_governor()?.as_deref() != Some("haltpoll") || !self.governor_path().is_file() {
            return Ok(false);
        }
        let available = util::read_opt(&self.cpu_dir().join("cpuidle/available_governors"))?.unwrap_or_default();
        let Some(other) = ["menu", "ladder", "teo"].into_iter().find(|g| available.split_whitespace().any(|a| a == *g)) else {
            return Ok(false);
        };
        let path = self.governor_path();
        let expedited = self.expedite_rcu()?;
        let switched = util::write(&path, other).and_then(|()| util::write(&path, "haltpoll"));
        if expedited {
            self.set_rcu_expedited("0")?;
        }
        switched.map(|()| true)
    }

    fn rcu_expedited_path(&self) -> PathBuf {
        self.sysfs.root().join(RCU_EXPEDITED)
    }

    /// The kernel's expedited-RCU switch as it reads (`None`: this kernel has none).
    pub fn rcu_expedited(&self) -> Result<Option<String>> {
        Ok(util::read_opt(&self.rcu_expedited_path())?.map(|v| v.trim().to_string()))
    }

    /// Writes the expedited-RCU switch; returns the value it replaced.
    pub fn set_rcu_expedited(&self, value: &str) -> Result<String> {
        let path = self.rcu_expedited_path();
        let old = util::read(&path)?.trim().to_string();
        util::write(&path, value)?;
        Ok(old)
    }

    /// Turns expedited grace periods on where they are off; true if it did (the caller puts
    /// `0` back). A kernel without the switch, or one already expediting, is left alone.
    fn expedite_rcu(&self) -> Result<bool> {
        if self.rcu_expedited()?.as_deref() != Some("0") {
            return Ok(false);
        }
        self.set_rcu_expedited("1")?;
        Ok(true)
    }

    /// `cpu`'s resume latency limit as the kernel shows it (`0`: none, `n/a`: 0 us).
    pub fn resume_latency(&self, cpu: u32) -> Result<String> {
        Ok(util::read(&self.resume_latency_path(cpu))?.trim().to_string())
    }

    /// Sets `cpu`'s resume latency limit (write back what [`Self::resume_latency`] read to
    /// restore it: `0` and `n/a` round-trip); returns the value it replaced.
    pub fn set_resume_latency(&self, cpu: u32, value: &str) -> Result<String> {
        let path = self.resume_latency_path(cpu);
        let old = util::read(&path)?.trim().to_string();
        util::write(&path, value)?;
        Ok(old)
    }

    /// Keeps `cpu` polling (`true`: a 0 us resume latency limit) or lifts the limit; returns
    /// the value it replaced.
    pub fn set_poll_always(&self, cpu: u32, on: bool) -> Result<String> {
        self.set_resume_latency(cpu, if on { RESUME_LATENCY_POLL } else { RESUME_LATENCY_NONE })
    }

    /// Disables (or enables) idle state `state` of `cpu`; returns whether it was disabled.
    pub fn set_state_disabled(&self, cpu: u32, state: u32, disabled: bool) -> Result<bool> {
        let was = self.state_disabled(cpu, state)?;
        util::write(&self.state_disable_path(cpu, state), if disabled { "1" } else { "0" })?;
        Ok(was)
    }

    /// Whether idle state `state` of `cpu` is disabled (its `disable` file).
    pub fn state_disabled(&self, cpu: u32, state: u32) -> Result<bool> {
        let path = self.state_disable_path(cpu, state);
        let text = util::read(&path)?;
        Ok(util::parse_u64(&path, 1, "disable", text.trim())? != 0)
    }

    fn state_disable_path(&self, cpu: u32, state: u32) -> PathBuf {
        self.cpu_dir().join(format!("cpu{cpu}/cpuidle/state{state}/disable"))
    }

    /// Switches the cpuidle governor; returns the one it replaced. The name must be one the
    /// kernel lists.
    pub fn set_governor(&self, name: &str) -> Result<String> {
        let available = util::read_opt(&self.cpu_dir().join("cpuidle/available_governors"))?.unwrap_or_default();
        if !available.split_whitespace().any(|g| g == name) {
            return Err(crate::BadInput::new("cpuidle governor", name, format!("one of: {}", available.trim())).into());
        }
        let path = self.governor_path();
        let old = util::read(&path)?.trim().to_string();
        util::write(&path, name)?;
        Ok(old)
    }

    /// Loads `cpuidle-haltpoll` with `force=1` (`modprobe`); `Ok(false)` when there is nothing
    /// to load (built in, loaded already, or absent).
    pub fn load_haltpoll_driver(&self) -> Result<bool> {
        if self.haltpoll_driver_state() != ModuleState::Loadable {
            return Ok(false);
        }
        run_modprobe(&["cpuidle-haltpoll", "force=1"])?;
        Ok(true)
    }

    /// Unloads `cpuidle-haltpoll` (after [`Self::load_haltpoll_driver`] loaded it).
    pub fn unload_haltpoll_driver(&self) -> Result<()> {
        if self.haltpoll_driver_state() != ModuleState::Loaded {
            return Ok(());
        }
        run_modprobe(&["-r", "cpuidle-haltpoll"])
    }

    /// The time (us) each of `cpus` spent in state `state` (`time` of `stateK`): the POLL
    /// state's time is polling the kernel counts as idle in `/proc/stat`.
    pub fn state_time_us(&self, cpus: &CpuSet, state: u32) -> Result<Vec<(u32, u64)>> {
        cpus.iter()
            .map(|cpu| {
                let p = self.cpu_dir().join(format!("cpu{cpu}/cpuidle/state{state}/time"));
                let t = util::read(&p)?;
                Ok((cpu, util::parse_u64(&p, 1, "time", t.trim())?))
            })
            .collect()
    }
}

fn run_modprobe(args: &[&str]) -> Result<()> {
    let out = std::process::Command::new("modprobe").args(args).output().map_err(|source| OsError::Syscall {
        call: "exec modprobe",
        tid: 0,
        source,
    })?;
    if out.status.success() {
        Ok(())
    } else {
        let msg = String::from_utf8_lossy(&out.stderr).trim().to_string();
        Err(OsError::Syscall { call: "modprobe", tid: 0, source: std::io::Error::other(format!("modprobe {}: {msg}", args.join(" "))) })
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::Path;

    use super::*;

    /// A haltpoll guest of 2 CPUs, as on the development VMs (cap 0, the driver built in).
    fn fixture(root: &Path) {
        crate::testutil::HaltpollSysfs::new().write(root);
    }

    fn knobs(root: &Path) -> IdleKnobs {
        IdleKnobs::with_roots(Sysfs::with_root(root), root.join("lib-modules"))
    }

    #[test]
    fn a_haltpoll_guest_offers_the_window_and_always_poll() {
        let d = tempfile::tempdir().unwrap();
        fixture(d.path());
        let o = knobs(d.path()).offer(&CpuSet::parse("0-1").unwrap()).unwrap();
        assert_eq!(o.poll_state, Some(0));
        assert!(o.poll_window() && o.poll_always() && o.kernel_polling());
        assert_eq!(o.haltpoll_driver, ModuleState::Builtin);
        assert!(o.describe().contains("haltpoll window: yes"), "{}", o.describe());
    }

    #[test]
    fn a_guest_without_cpuidle_offers_nothing_but_yielders() {
        let d = tempfile::tempdir().unwrap();
        let cpu = d.path().join("devices/system/cpu");
        fs::create_dir_all(cpu.join("cpu0/power")).unwrap();
        fs::write(cpu.join("cpu0/power/pm_qos_resume_latency_us"), "0\n").unwrap();
        let o = knobs(d.path()).offer(&CpuSet::parse("0").unwrap()).unwrap();
        assert_eq!((o.driver.clone(), o.poll_state), (None, None));
        assert!(!o.kernel_polling() && !o.poll_always() && !o.poll_window());
        assert_eq!(o.haltpoll_driver, ModuleState::Absent);
        // A loadable module is found in the kernel's module directory.
        let m = d.path().join("lib-modules/kernel/drivers/cpuidle");
        fs::create_dir_all(&m).unwrap();
        fs::write(m.join("cpuidle-haltpoll.ko.xz"), "").unwrap();
        assert_eq!(knobs(d.path()).haltpoll_driver_state(), ModuleState::Loadable);
    }

    #[test]
    fn the_menu_governor_offers_always_poll_but_no_window_unless_haltpoll_can_run() {
        let d = tempfile::tempdir().unwrap();
        fixture(d.path());
        let cpu = d.path().join("devices/system/cpu/cpuidle");
        fs::write(cpu.join("current_governor"), "menu\n").unwrap();
        let cpus = CpuSet::parse("0-1").unwrap();
        // The haltpoll driver runs: the governor can be switched back to haltpoll.
        assert!(knobs(d.path()).offer(&cpus).unwrap().poll_window());
        fs::write(cpu.join("current_driver"), "acpi_idle\n").unwrap();
        let o = knobs(d.path()).offer(&cpus).unwrap();
        assert!(o.poll_always() && !o.poll_window());
    }

    #[test]
    fn writers_return_what_they_replaced_and_round_trip() {
        let d = tempfile::tempdir().unwrap();
        fixture(d.path());
        let k = knobs(d.path());
        assert_eq!(k.set_haltpoll_param(HALTPOLL_WINDOW_PARAM, "200000").unwrap(), "0");
        assert_eq!(k.haltpoll_params().unwrap()[HALTPOLL_WINDOW_PARAM], "200000");
        assert_eq!(k.set_poll_always(1, true).unwrap(), "0");
        assert_eq!(k.resume_latency(1).unwrap(), "n/a");
        assert_eq!(k.set_resume_latency(1, "0").unwrap(), "n/a");
        assert!(!k.set_state_disabled(0, 1, true).unwrap());
        assert!(k.set_state_disabled(0, 1, false).unwrap());
        assert_eq!(k.set_governor("menu").unwrap(), "haltpoll");
        let e = k.set_governor("teo").unwrap_err();
        assert!(format!("{e:#}").contains("argument rejected"), "{e:#}");
        assert_eq!(k.state_time_us(&CpuSet::parse("0-1").unwrap(), 0).unwrap(), vec![(0, 1000), (1, 1000)]);
        // Nothing to load where the driver is built in.
        assert!(!k.load_haltpoll_driver().unwrap());
        // The per-CPU windows reset through another governor, back on haltpoll.
        assert_eq!(k.set_governor("haltpoll").unwrap(), "menu");
        // Where the kernel has the expedited-RCU switch, the reset leaves it as it found it.
        fs::create_dir_all(d.path().join("kernel")).unwrap();
        fs::write(d.path().join(RCU_EXPEDITED), "0\n").unwrap();
        assert_eq!(k.rcu_expedited().unwrap().as_deref(), Some("0"));
        assert!(k.reset_poll_windows().unwrap());
        assert_eq!(k.rcu_expedited().unwrap().as_deref(), Some("0"));
        fs::write(d.path().join(RCU_EXPEDITED), "1\n").unwrap();
        assert!(k.reset_poll_windows().unwrap());
        assert_eq!(k.rcu_expedited().unwrap().as_deref(), Some("1"), "an expediting kernel is left expediting");
        assert!(k.reset_poll_windows().unwrap());
        assert_eq!(std::fs::read_to_string(d.path().join("devices/system/cpu/cpuidle/current_governor")).unwrap(), "haltpoll");
        k.set_governor("menu").unwrap();
        assert!(!k.reset_poll_windows().unwrap(), "not under another governor");
    }

    #[test]
    fn missing_knobs_name_their_path() {
        let d = tempfile::tempdir().unwrap();
        let k = knobs(d.path());
        let e = k.set_poll_always(3, true).unwrap_err();
        assert!(e.to_string().contains("cpu3/power/pm_qos_resume_latency_us"), "{e}");
        let e = k.set_haltpoll_param(HALTPOLL_WINDOW_PARAM, "1").unwrap_err();
        assert!(e.to_string().contains("guest_halt_poll_ns"), "{e}");
    }
}
