//! Helpers of tests: this crate's tests on the real machine (`#[cfg(test)]`), and the fake
//! sysfs tree of a haltpoll guest that this crate's, the agent's and the workspace's tests
//! build (feature `testutil`, which only `[dev-dependencies]` turn on).

use std::fs;
use std::path::Path;

/// A thread of this process that waits, doing nothing, until released: something to move
/// between cgroups or to read in /proc.
#[cfg(test)]
pub(crate) struct ParkedThread {
    pub(crate) tid: i32,
    release: std::sync::mpsc::Sender<()>,
    handle: std::thread::JoinHandle<()>,
}

#[cfg(test)]
impl ParkedThread {
    pub(crate) fn start() -> Self {
        let (tx, rx) = std::sync::mpsc::channel();
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let handle = std::thread::spawn(move || {
            tx.send(crate::sched::gettid()).unwrap();
            let _ = wait.recv();
        });
        let tid = rx.recv().unwrap();
        Self { tid, release, handle }
    }

    /// Lets the thread end and waits for it.
    pub(crate) fn finish(self) {
        let _ = self.release.send(());
        self.handle.join().unwrap();
    }
}

/// The haltpoll module's parameters as the development VMs boot: the cap 0 (halt polling off),
/// the window's growth and shrinking as upstream sets them.
pub const HALTPOLL_BOOT_PARAMS: [(&str, &str); 5] = [
    ("guest_halt_poll_ns", "0"),
    ("guest_halt_poll_grow", "2"),
    ("guest_halt_poll_grow_start", "50000"),
    ("guest_halt_poll_shrink", "2"),
    ("guest_halt_poll_allow_shrink", "Y"),
];

/// A fake sysfs tree (the root a `Sysfs::with_root` reads) of a haltpoll guest of 2 CPUs, as on
/// the development VMs: CPUs 0-1 online; the `haltpoll` cpuidle driver (built in:
/// `module/cpuidle_haltpoll`) under a governor (default `haltpoll`; `ladder menu haltpoll`
/// available, with the kernel's trailing space); on each CPU the states POLL and `haltpoll
/// idle` (usage 10, time 1000 and 2000 us, enabled) and no resume latency limit (`0`); the
/// haltpoll module's parameters (default [`HALTPOLL_BOOT_PARAMS`]).
///
/// `HaltpollSysfs::new().governor("menu").param("guest_halt_poll_ns", "200000").write(root)`
#[derive(Debug, Clone)]
pub struct HaltpollSysfs {
    governor: String,
    params: Vec<(String, String)>,
}

impl Default for HaltpollSysfs {
    fn default() -> Self {
        Self { governor: "haltpoll".into(), params: HALTPOLL_BOOT_PARAMS.iter().map(|&(k, v)| (k.into(), v.into())).collect() }
    }
}

impl HaltpollSysfs {
    /// The guest as it boots (see the type).
    pub fn new() -> Self {
        Self::default()
    }

    /// The cpuidle governor running.
    #[must_use]
    pub fn governor(mut self, name: &str) -> Self {
        name.clone_into(&mut self.governor);
        self
    }

    /// One haltpoll parameter's value (added if this kernel lacked it).
    #[must_use]
    pub fn param(mut self, name: &str, value: &str) -> Self {
        match self.params.iter_mut().find(|(k, _)| k == name) {
            Some((_, v)) => value.clone_into(v),
            None => self.params.push((name.into(), value.into())),
        }
        self
    }

    /// Exactly these haltpoll parameters: a kernel without the others.
    #[must_use]
    pub fn params(mut self, params: &[(&str, &str)]) -> Self {
        self.params = params.iter().map(|&(k, v)| (k.into(), v.into())).collect();
        self
    }

    /// Writes the tree under `root` (panics on an I/O error: a test's set-up).
    pub fn write(&self, root: &Path) {
        let cpu = root.join("devices/system/cpu");
        fs::create_dir_all(cpu.join("cpuidle")).unwrap();
        fs::write(cpu.join("online"), "0-1\n").unwrap();
        fs::write(cpu.join("cpuidle/current_driver"), "haltpoll\n").unwrap();
        fs::write(cpu.join("cpuidle/current_governor"), format!("{}\n", self.governor)).unwrap();
        fs::write(cpu.join("cpuidle/available_governors"), "ladder menu haltpoll \n").unwrap();
        for c in 0..2 {
            for (k, name) in [(0, "POLL"), (1, "haltpoll idle")] {
                let s = cpu.join(format!("cpu{c}/cpuidle/state{k}"));
                fs::create_dir_all(&s).unwrap();
                let time = (1000 * (k + 1)).to_string();
                for (f, v) in [("name", name), ("usage", "10"), ("time", &time), ("disable", "0")] {
                    fs::write(s.join(f), format!("{v}\n")).unwrap();
                }
            }
            fs::create_dir_all(cpu.join(format!("cpu{c}/power"))).unwrap();
            fs::write(cpu.join(format!("cpu{c}/power/pm_qos_resume_latency_us")), "0\n").unwrap();
        }
        let hp = root.join("module/haltpoll/parameters");
        fs::create_dir_all(&hp).unwrap();
        for (k, v) in &self.params {
            fs::write(hp.join(k), format!("{v}\n")).unwrap();
        }
        fs::create_dir_all(root.join("module/cpuidle_haltpoll/parameters")).unwrap();
    }
}
