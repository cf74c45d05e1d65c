//! Readers gleaner-os does not offer (yet): per-thread `/proc/<pid>/task/<tid>/io` and
//! `cgroup`, CPU package (socket) ids and the LLC size from sysfs. Same conventions as
//! gleaner-os: a root path for fixtures, errors naming the path, ENOENT/ESRCH = vanished.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gleaner_os::OsError;

/// `/proc/<pid>/task/<tid>/io` fields used as I/O evidence.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskIo {
    /// read-like system calls
    pub syscr: u64,
    /// write-like system calls
    pub syscw: u64,
    pub rchar: u64,
    pub wchar: u64,
}

fn read_proc(path: &Path, pid: i32, tid: Option<i32>) -> Result<String, OsError> {
    match std::fs::read(path) {
        Ok(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH)) => Err(OsError::Vanished { pid, tid }),
        Err(source) => Err(OsError::Read { path: path.to_path_buf(), source }),
    }
}

/// Parses the `io` file (`key: value` lines). Missing keys are an error.
pub fn parse_task_io(path: &Path, text: &str) -> Result<TaskIo, OsError> {
    let mut m = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let (k, v) = line.split_once(':').ok_or_else(|| OsError::Parse {
            path: path.to_path_buf(),
            line: i + 1,
            reason: format!("'{line}' is not 'key: value'"),
        })?;
        let v: u64 = v.trim().parse().map_err(|_| OsError::Parse {
            path: path.to_path_buf(),
            line: i + 1,
            reason: format!("'{}' is not a number", v.trim()),
        })?;
        m.insert(k.trim().to_string(), v);
    }
    let get =
        |k: &str| m.get(k).copied().ok_or_else(|| OsError::Parse { path: path.to_path_buf(), line: 0, reason: format!("no '{k}' field") });
    Ok(TaskIo { syscr: get("syscr")?, syscw: get("syscw")?, rchar: get("rchar")?, wchar: get("wchar")? })
}

/// procfs reads gleaner-os lacks.
#[derive(Debug, Clone)]
pub struct ProcExtra {
    root: PathBuf,
}

impl ProcExtra {
    pub fn new() -> Self {
        Self::with_root("/proc")
    }
    pub fn with_root(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
    fn task(&self, pid: i32, tid: i32) -> PathBuf {
        self.root.join(pid.to_string()).join("task").join(tid.to_string())
    }
    /// `/proc/<pid>/task/<tid>/io`.
    pub fn task_io(&self, pid: i32, tid: i32) -> Result<TaskIo, OsError> {
        let p = self.task(pid, tid).join("io");
        let t = read_proc(&p, pid, Some(tid))?;
        parse_task_io(&p, &t)
    }
    /// The thread's cgroup path in the hierarchy with controller `controller` (v1), or the
    /// unified (`0::`) path when `controller` is `None`.
    pub fn task_cgroup(&self, pid: i32, tid: i32, controller: Option<&str>) -> Result<Option<String>, OsError> {
        let p = self.task(pid, tid).join("cgroup");
        let t = read_proc(&p, pid, Some(tid))?;
        let lines = gleaner_os::procfs::parse_cgroup(&p, &t)?;
        Ok(lines
            .into_iter()
            .find(|(id, ctl, _)| match controller {
                Some(c) => ctl.iter().any(|x| x == c),
                None => *id == 0,
            })
            .map(|(_, _, path)| path))
    }
}

impl Default for ProcExtra {
    fn default() -> Self {
        Self::new()
    }
}

/// sysfs CPU topology reads gleaner-os lacks.
#[derive(Debug, Clone)]
pub struct CpuTopo {
    root: PathBuf,
}

impl CpuTopo {
    pub fn new() -> Self {
        Self::with_root("/sys")
    }
    pub fn with_root(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
    /// `physical_package_id` of `cpu` (its socket); `None` when the file is missing.
    pub fn package_id(&self, cpu: u32) -> Result<Option<u32>, OsError> {
        let p = self.root.join(format!("devices/system/cpu/cpu{cpu}/topology/physical_package_id"));
        match std::fs::read_to_string(&p) {
            Ok(t) => t.trim().parse::<i64>().map(|v| u32::try_from(v.max(0)).ok()).map_err(|_| OsError::Parse {
                path: p.clone(),
                line: 1,
                reason: format!("'{}' is not a package id", t.trim()),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(OsError::Read { path: p, source }),
        }
    }
    /// Size in bytes of the highest-level cache of `cpu` (`cache/index*/{level,size}`).
    pub fn llc_bytes(&self, cpu: u32) -> Result<Option<u64>, OsError> {
        let dir = self.root.join(format!("devices/system/cpu/cpu{cpu}/cache"));
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
    /// Size in bytes of the level-2 cache of `cpu`.
    pub fn l2_bytes(&self, cpu: u32) -> Option<u64> {
        let dir = self.root.join(format!("devices/system/cpu/cpu{cpu}/cache"));
        std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
            let d = e.path();
            let level = std::fs::read_to_string(d.join("level")).ok()?.trim().parse::<u32>().ok()?;
            let ty = std::fs::read_to_string(d.join("type")).ok()?;
            (level == 2 && ty.trim() != "Instruction").then_some(())?;
            parse_size(std::fs::read_to_string(d.join("size")).ok()?.trim())
        })
    }
}

impl Default for CpuTopo {
    fn default() -> Self {
        Self::new()
    }
}

/// `32K`, `8192K`, `16M` -> bytes; `None` when malformed or beyond `u64`.
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
mod tests {
    use super::*;

    #[test]
    fn task_io_valid_malformed_empty() {
        let p = Path::new("/proc/1/task/1/io");
        let ok = "rchar: 10\nwchar: 20\nsyscr: 3\nsyscw: 4\nread_bytes: 0\nwrite_bytes: 0\ncancelled_write_bytes: 0\n";
        assert_eq!(parse_task_io(p, ok).unwrap(), TaskIo { syscr: 3, syscw: 4, rchar: 10, wchar: 20 });
        let e = parse_task_io(p, "rchar: x\n").unwrap_err().to_string();
        assert!(e.contains("/proc/1/task/1/io") && e.contains("line 1"), "{e}");
        let e = parse_task_io(p, "").unwrap_err().to_string();
        assert!(e.contains("no 'syscr' field"), "{e}");
    }

    #[test]
    fn topology_and_cache_on_fixture() {
        let d = tempfile::tempdir().unwrap();
        let c = d.path().join("devices/system/cpu/cpu1");
        std::fs::create_dir_all(c.join("topology")).unwrap();
        std::fs::write(c.join("topology/physical_package_id"), "3\n").unwrap();
        for (i, level, ty, size) in [(0, 1, "Data", "32K"), (2, 2, "Unified", "1024K"), (3, 3, "Unified", "32768K")] {
            let x = c.join(format!("cache/index{i}"));
            std::fs::create_dir_all(&x).unwrap();
            std::fs::write(x.join("level"), format!("{level}\n")).unwrap();
            std::fs::write(x.join("type"), format!("{ty}\n")).unwrap();
            std::fs::write(x.join("size"), format!("{size}\n")).unwrap();
        }
        let t = CpuTopo::with_root(d.path());
        assert_eq!(t.package_id(1).unwrap(), Some(3));
        assert_eq!(t.package_id(0).unwrap(), None);
        assert_eq!(t.llc_bytes(1).unwrap(), Some(32 * 1024 * 1024));
        assert_eq!(t.l2_bytes(1), Some(1024 * 1024));
        std::fs::write(c.join("topology/physical_package_id"), "x\n").unwrap();
        assert!(t.package_id(1).is_err());
        assert_eq!(parse_size("8M"), Some(8 << 20));
        assert_eq!(parse_size(""), None);
    }

    /// Found by fuzzing (`host_procfs`): `77777777777777G` overflowed the multiplication (a
    /// panic with overflow checks, a wrapped size without).
    #[test]
    fn cache_size_beyond_u64_is_refused_not_wrapped() {
        assert_eq!(parse_size("77777777777777G"), None);
        assert_eq!(parse_size("18014398509481984K"), None);
        assert_eq!(parse_size("18014398509481983K"), Some(18_014_398_509_481_983 * 1024));
        assert_eq!(parse_size("18446744073709551615"), Some(u64::MAX));
    }
}
