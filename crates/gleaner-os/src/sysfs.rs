//! Readers (and one writer) for `/sys`: online CPUs, CPU packages and cache sizes, cpuidle, module parameters
//! (haltpoll, kvm halt polling), hypervisor type and DMI strings.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::cpuset::CpuSet;
use crate::error::{OsError, Result};
use crate::util::{self, parse_err, parse_u64, Reread};

/// The cpuidle counters of some CPUs (each state's `usage` and `time`), kept open and re-read
/// with one `pread` each: what a sampler reads every period. Reading them as
/// [`Sysfs::cpuidle_states`] does (a directory listing and four files a state, five syscalls
/// a file) was 80 of the agent's ~130 syscalls a period on 2 vCPUs, which it spent in one
/// stretch of 0.5-1 ms on a vCPU a woken workload thread then waited for. A state's name
/// is read once: a CPU's states change only with the cpuidle driver (reopen then).
#[derive(Debug)]
pub struct IdleCounters {
    cpus: Vec<(u32, Vec<StateFiles>)>,
}

#[derive(Debug)]
struct StateFiles {
    /// The state is `POLL` (the kernel's polling loop).
    poll: bool,
    usage: Reread,
    time: Reread,
}

/// One CPU's idle counters, summed over its states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct IdleCount {
    pub cpu: u32,
    /// Times any idle state was entered.
    pub entries: u64,
    /// Time in any idle state, ns.
    pub idle_ns: u64,
    /// Time in the `POLL` state, ns.
    pub poll_ns: u64,
}

impl IdleCounters {
    /// Every CPU's counters now (an error names the file: a driver change removed it).
    pub fn read(&self) -> Result<Vec<IdleCount>> {
        let mut buf = [0u8; 32];
        let mut num = |f: &Reread, what: &str| -> Result<u64> { parse_u64(&f.path, 1, what, f.read_short_str(&mut buf, what)?) };
        let mut out = Vec::with_capacity(self.cpus.len());
        for (cpu, states) in &self.cpus {
            let mut c = IdleCount { cpu: *cpu, entries: 0, idle_ns: 0, poll_ns: 0 };
            for s in states {
                c.entries += num(&s.usage, "usage")?;
                let ns = num(&s.time, "time")?.saturating_mul(1000);
                c.idle_ns += ns;
                if s.poll {
                    c.poll_ns += ns;
                }
            }
            out.push(c);
        }
        Ok(out)
    }
}

/// Access to a sysfs tree.
#[derive(Debug, Clone)]
pub struct Sysfs {
    root: PathBuf,
}

/// One cpuidle state of one CPU (`/sys/devices/system/cpu/cpuN/cpuidle/stateK`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IdleState {
    /// K in `stateK`.
    pub index: u32,
    /// `POLL`, `haltpoll`, `C1`, ...
    pub name: String,
    /// Times the state was entered.
    pub usage: u64,
    /// Total residency, microseconds.
    pub time_us: u64,
    /// True when the state is disabled (`disable` is 1).
    pub disabled: bool,
}

/// DMI identification strings (`/sys/class/dmi/id`); `None` where the file is missing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Dmi {
    pub sys_vendor: Option<String>,
    pub product_name: Option<String>,
    pub bios_vendor: Option<String>,
}

impl Default for Sysfs {
    fn default() -> Self {
        Self::new()
    }
}

impl Sysfs {
    /// The real `/sys`.
    pub fn new() -> Self {
        Sysfs { root: PathBuf::from("/sys") }
    }

    /// A sysfs tree at `root` (a fixture).
    pub fn with_root(root: impl Into<PathBuf>) -> Self {
        Sysfs { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn cpu_dir(&self) -> PathBuf {
        self.root.join("devices/system/cpu")
    }

    fn read_cpulist(&self, path: &Path) -> Result<CpuSet> {
        let text = util::read(path)?;
        CpuSet::parse(&text).map_err(|e| parse_err(path, 1, e.to_string()))
    }

    /// `devices/system/cpu/online`.
    pub fn online_cpus(&self) -> Result<CpuSet> {
        self.read_cpulist(&self.cpu_dir().join("online"))
    }

    /// `physical_package_id` of `cpu` (its socket); `None` when the file is missing.
    pub fn package_id(&self, cpu: u32) -> Result<Option<u32>> {
        let p = self.cpu_dir().join(format!("cpu{cpu}/topology/physical_package_id"));
        match util::read_opt(&p)? {
            None => Ok(None),
            Some(t) => t
                .trim()
                .parse::<i64>()
                .map(|v| u32::try_from(v.max(0)).ok())
                .map_err(|_| parse_err(&p, 1, format!("'{}' is not a package id", t.trim()))),
        }
    }

    /// `cpus` grouped by package (socket) id, in id order; CPUs without a
    /// `physical_package_id` count as package 0.
    pub fn cpus_by_package(&self, cpus: &CpuSet) -> Result<BTreeMap<u32, CpuSet>> {
        let mut out: BTreeMap<u32, CpuSet> = BTreeMap::new();
        for c in cpus.iter() {
            out.entry(self.package_id(c)?.unwrap_or(0)).or_default().insert(c);
        }
        Ok(out)
    }

    /// Size in bytes of the highest-level cache of `cpu` (`cache/index*/{level,size}`);
    /// `None` when sysfs lists no cache.
    pub fn llc_bytes(&self, cpu: u32) -> Result<Option<u64>> {
        let dir = self.cpu_dir().join(format!("cpu{cpu}/cache"));
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(OsError::Dir { op: "list", path: dir, source }),
        };
        let mut best: Option<(u32, u64)> = None;
        for e in rd.flatten() {
            let d = e.path();
            if !d.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("index")) {
                continue;
            }
            let level = std::fs::read_to_string(d.join("level")).ok().and_then(|t| t.trim().parse::<u32>().ok());
            let size = std::fs::read_to_string(d.join("size")).ok().and_then(|t| parse_size(t.trim()));
            if let (Some(l), Some(s)) = (level, size) {
                if best.is_none_or(|(bl, _)| l > bl) {
                    best = Some((l, s));
                }
            }
        }
        Ok(best.map(|(_, s)| s))
    }

    /// Size in bytes of the level-2 data or unified cache of `cpu`, if sysfs lists one.
    pub fn l2_bytes(&self, cpu: u32) -> Option<u64> {
        let dir = self.cpu_dir().join(format!("cpu{cpu}/cache"));
        std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
            let d = e.path();
            let level = std::fs::read_to_string(d.join("level")).ok()?.trim().parse::<u32>().ok()?;
            let ty = std::fs::read_to_string(d.join("type")).ok()?;
            (level == 2 && ty.trim() != "Instruction").then_some(())?;
            parse_size(std::fs::read_to_string(d.join("size")).ok()?.trim())
        })
    }

    /// `devices/system/cpu/possible`.
    pub fn possible_cpus(&self) -> Result<CpuSet> {
        self.read_cpulist(&self.cpu_dir().join("possible"))
    }

    /// EEVDF's base slice in ns from debugfs (`kernel/debug/sched/base_slice_ns`; needs debugfs
    /// mounted and root), `None` when not readable there.
    pub fn debug_sched_base_slice_ns(&self) -> Result<Option<u64>> {
        let path = self.root.join("kernel/debug/sched/base_slice_ns");
        match util::read_opt(&path) {
            Ok(v) => v.map(|t| parse_u64(&path, 1, "base slice", t.trim())).transpose(),
            // debugfs is root's (0700): an unprivileged reader just does not see it.
            Err(OsError::Read { source, .. }) if source.kind() == std::io::ErrorKind::PermissionDenied => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The cpuidle driver (`haltpoll`, `intel_idle`, `acpi_idle`), `None` when cpuidle is
    /// absent or reports `none`.
    pub fn cpuidle_driver(&self) -> Result<Option<String>> {
        let v = util::read_opt(&self.cpu_dir().join("cpuidle/current_driver"))?;
        Ok(v.map(|s| s.trim().to_string()).filter(|s| !s.is_empty() && s != "none"))
    }

    /// The cpuidle governor (`current_governor`, or `current_governor_ro` on kernels that
    /// cannot switch), `None` when cpuidle is absent.
    pub fn cpuidle_governor(&self) -> Result<Option<String>> {
        let dir = self.cpu_dir().join("cpuidle");
        let v = match util::read_opt(&dir.join("current_governor"))? {
            Some(v) => Some(v),
            None => util::read_opt(&dir.join("current_governor_ro"))?,
        };
        Ok(v.map(|s| s.trim().to_string()).filter(|s| !s.is_empty() && s != "none"))
    }

    /// The idle states of `cpu`, by index; empty when the CPU has no cpuidle directory.
    pub fn cpuidle_states(&self, cpu: u32) -> Result<Vec<IdleState>> {
        let dir = self.cpu_dir().join(format!("cpu{cpu}/cpuidle"));
        if !dir.is_dir() {
            return Ok(Vec::new());
        }
        let mut states = Vec::new();
        for name in util::list_dir(&dir)? {
            let Some(index) = name.strip_prefix("state").and_then(|k| k.parse::<u32>().ok()) else { continue };
            let sdir = dir.join(&name);
            let read_u64 = |f: &str| -> Result<u64> {
                let p = sdir.join(f);
                let t = util::read(&p)?;
                parse_u64(&p, 1, f, &t)
            };
            let sname = util::read(&sdir.join("name"))?.trim().to_string();
            let disabled = match util::read_opt(&sdir.join("disable"))? {
                Some(t) => parse_u64(&sdir.join("disable"), 1, "disable", &t)? != 0,
                None => false,
            };
            states.push(IdleState { index, name: sname, usage: read_u64("usage")?, time_us: read_u64("time")?, disabled });
        }
        states.sort_by_key(|s| s.index);
        Ok(states)
    }

    /// Sum of `usage` over all idle states of `cpus`: how many times those CPUs went idle.
    /// `None` when no CPU of the set has cpuidle states.
    pub fn total_idle_entries(&self, cpus: &CpuSet) -> Result<Option<u64>> {
        // Called every sampling period: read only the `usage` files (a quarter of the reads
        // `cpuidle_states` does).
        let mut total = None;
        for cpu in cpus {
            let dir = self.cpu_dir().join(format!("cpu{cpu}/cpuidle"));
            let names = match std::fs::read_dir(&dir) {
                Ok(rd) => rd.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.starts_with("state")).collect::<Vec<_>>(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => return Err(OsError::Dir { op: "list", path: dir, source }),
            };
            for n in names {
                let p = dir.join(n).join("usage");
                let t = util::read(&p)?;
                *total.get_or_insert(0) += parse_u64(&p, 1, "usage", &t)?;
            }
        }
        Ok(total)
    }

    /// The idle-state counters of `cpus`, their files opened once (see [`IdleCounters`]);
    /// a CPU without cpuidle states is left out.
    pub fn idle_counters(&self, cpus: &CpuSet) -> Result<IdleCounters> {
        let mut out = Vec::new();
        for cpu in cpus {
            let dir = self.cpu_dir().join(format!("cpu{cpu}/cpuidle"));
            if !dir.is_dir() {
                continue;
            }
            let mut states = Vec::new();
            for name in util::list_dir(&dir)? {
                if name.strip_prefix("state").and_then(|k| k.parse::<u32>().ok()).is_none() {
                    continue;
                }
                let sdir = dir.join(&name);
                let poll = util::read(&sdir.join("name"))?.trim() == "POLL";
                states.push(StateFiles { poll, usage: Reread::open(sdir.join("usage"))?, time: Reread::open(sdir.join("time"))? });
            }
            if !states.is_empty() {
                out.push((cpu, states));
            }
        }
        Ok(IdleCounters { cpus: out })
    }

    fn param_dir(&self, module: &str) -> Result<PathBuf> {
        check_name("module name", module)?;
        Ok(self.root.join("module").join(module).join("parameters"))
    }

    /// Parameters of a kernel module (`module/<m>/parameters/*`), trimmed; empty when the
    /// module is not loaded. Write-only parameters are left out.
    pub fn module_params(&self, module: &str) -> Result<BTreeMap<String, String>> {
        let dir = self.param_dir(module)?;
        let mut out = BTreeMap::new();
        if !dir.is_dir() {
            return Ok(out);
        }
        for name in util::list_dir(&dir)? {
            match std::fs::read_to_string(dir.join(&name)) {
                Ok(v) => {
                    out.insert(name, v.trim().to_string());
                }
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {}
                Err(source) => return Err(OsError::Read { path: dir.join(&name), source }),
            }
        }
        Ok(out)
    }

    /// One parameter of a kernel module, trimmed; `None` when the module or the parameter is
    /// absent, or it is write-only (one file read, where [`Self::module_params`] reads them all).
    pub fn module_param(&self, module: &str, name: &str) -> Result<Option<String>> {
        check_name("module parameter", name)?;
        let path = self.param_dir(module)?.join(name);
        match std::fs::read_to_string(&path) {
            Ok(v) => Ok(Some(v.trim().to_string())),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied) => Ok(None),
            Err(source) => Err(OsError::Read { path, source }),
        }
    }

    /// Writes a module parameter and returns its previous value (trimmed) so the caller can
    /// restore it.
    pub fn write_module_param(&self, module: &str, name: &str, value: &str) -> Result<String> {
        check_name("module parameter", name)?;
        let path = self.param_dir(module)?.join(name);
        let old = util::read(&path)?.trim().to_string();
        util::write(&path, value)?;
        Ok(old)
    }

    /// `/sys/hypervisor/type` (`xen`, ...), `None` when absent.
    pub fn hypervisor_type(&self) -> Result<Option<String>> {
        let v = util::read_opt(&self.root.join("hypervisor/type"))?;
        Ok(v.map(|s| s.trim().to_string()).filter(|s| !s.is_empty()))
    }

    /// DMI strings; missing files give `None`.
    pub fn dmi(&self) -> Result<Dmi> {
        let dir = self.root.join("class/dmi/id");
        let get = |f: &str| -> Result<Option<String>> {
            match std::fs::read_to_string(dir.join(f)) {
                Ok(s) => Ok(Some(s.trim().to_string()).filter(|s| !s.is_empty())),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied) => Ok(None),
                Err(source) => Err(OsError::Read { path: dir.join(f), source }),
            }
        };
        Ok(Dmi { sys_vendor: get("sys_vendor")?, product_name: get("product_name")?, bios_vendor: get("bios_vendor")? })
    }
}

/// Rejects names that would escape their directory.
fn check_name(what: &str, name: &str) -> Result<()> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(crate::BadInput::new(what, name, "a plain file name (no '/', not '.' or '..')").into());
    }
    Ok(())
}

/// A sysfs cache size (`32K`, `8192K`, `16M`) in bytes; `None` when malformed or beyond `u64`.
pub fn parse_size(s: &str) -> Option<u64> {
    let (num, mul) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1024),
        'M' | 'm' => (&s[..s.len() - 1], 1024 * 1024),
        'G' | 'g' => (&s[..s.len() - 1], 1024 * 1024 * 1024),
        _ => (s, 1),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mul)
}

#[cfg(test)]
mod tests;
