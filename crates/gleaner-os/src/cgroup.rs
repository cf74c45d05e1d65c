//! cpuset cgroups, v1 (`/sys/fs/cgroup/cpuset`) and v2 (unified hierarchy with the cpuset
//! controller): detect the layout, create `gleaner*` child groups, set their CPUs, move
//! processes and threads, remove them again.
//!
//! ```text
//!   Cgroups::detect()          /proc/self/mountinfo -> Layout::V1 { cpuset_root } | Layout::V2 { root }
//!     .create(parent, "gleaner-run-42") -> CpusetCgroup
//!         v1: mkdir, copy cpuset.mems + cpuset.cpus from the parent
//!         v2: '+cpuset' into cgroup.subtree_control of each ancestor lacking it (recorded), mkdir
//!     .set_cpus(&cpus) / .add_process(pid) / .procs() / .threads()
//!     .remove()                move stragglers to the parent, rmdir (retry on EBUSY),
//!                              v2: undo the '+cpuset' we added where no other child remains
//! ```
//!
//! Only groups whose name starts with `gleaner` are created or removed
//! ([`OsError::NotGleanerCgroup`]). Fixtures are plain directories: [`CpusetCgroup::remove`]
//! checks the filesystem magic (`statfs`) and on a real cgroupfs uses `rmdir` (the kernel
//! drops the interface files), elsewhere `remove_dir_all`, and on a fixture it moves
//! stragglers in a single pass instead of waiting for the group to empty.

use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cpuset::CpuSet;
use crate::error::{OsError, Result};
use crate::procfs::Procfs;
use crate::util::{self, parse_err};

/// Where the cpuset controller is mounted.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Layout {
    /// cgroup v1 hierarchy with the cpuset controller (e.g. `/sys/fs/cgroup/cpuset`).
    V1 { cpuset_root: PathBuf },
    /// cgroup v2 unified hierarchy whose root offers the cpuset controller.
    V2 { root: PathBuf },
}

impl Layout {
    /// The hierarchy root directory.
    pub fn root(&self) -> &Path {
        match self {
            Layout::V1 { cpuset_root } => cpuset_root,
            Layout::V2 { root } => root,
        }
    }
    /// 1 or 2.
    pub fn version(&self) -> u8 {
        match self {
            Layout::V1 { .. } => 1,
            Layout::V2 { .. } => 2,
        }
    }
}

/// Entry point: a detected or given cpuset hierarchy.
#[derive(Debug, Clone)]
pub struct Cgroups {
    layout: Layout,
}

/// Name prefix of every cgroup gleaner creates or removes.
pub const GLEANER_PREFIX: &str = "gleaner";

/// How long [`CpusetCgroup::remove`] keeps retrying while the group is busy.
const REMOVE_DEADLINE: Duration = Duration::from_secs(2);

impl Cgroups {
    /// Finds the cpuset controller from `/proc/self/mountinfo`.
    pub fn detect() -> Result<Cgroups> {
        Self::detect_in(&Procfs::new(), Path::new("/"))
    }

    /// Like [`Cgroups::detect`] on a fixture: mount points from `procfs`'s
    /// `self/mountinfo` are looked up below `fs_root`.
    ///
    /// Prefers a cgroup v1 mount with the `cpuset` option; else the first cgroup2 mount
    /// whose `cgroup.controllers` lists `cpuset`. Otherwise [`OsError::NoCpuset`] says
    /// what was found.
    pub fn detect_in(procfs: &Procfs, fs_root: &Path) -> Result<Cgroups> {
        let mounts = procfs.mountinfo()?;
        let rebase = |p: &Path| -> PathBuf { fs_root.join(p.strip_prefix("/").unwrap_or(p)) };
        if let Some(m) = mounts.iter().find(|m| m.fstype == "cgroup" && m.super_options.iter().any(|o| o == "cpuset")) {
            return Ok(Cgroups { layout: Layout::V1 { cpuset_root: rebase(&m.mount_point) } });
        }
        let mut found = Vec::new();
        for m in mounts.iter().filter(|m| m.fstype == "cgroup2") {
            let root = rebase(&m.mount_point);
            let ctl_path = root.join("cgroup.controllers");
            let ctl = util::read_opt(&ctl_path)?.unwrap_or_default();
            if ctl.split_whitespace().any(|c| c == "cpuset") {
                return Ok(Cgroups { layout: Layout::V2 { root } });
            }
            found.push(format!("cgroup2 at {} with controllers '{}'", m.mount_point.display(), ctl.trim()));
        }
        let v1: Vec<String> = mounts
            .iter()
            .filter(|m| m.fstype == "cgroup")
            .map(|m| format!("{} ({})", m.mount_point.display(), m.super_options.join(",")))
            .collect();
        if !v1.is_empty() {
            found.push(format!("cgroup v1 without cpuset: {}", v1.join(", ")));
        }
        let reason = if found.is_empty() {
            "no cgroup or cgroup2 filesystem is mounted".to_string()
        } else {
            format!("found {}; mount cgroup2 with the cpuset controller enabled, or the cgroup v1 cpuset controller", found.join("; "))
        };
        Err(OsError::NoCpuset { reason })
    }

    /// A given layout (fixtures, or a root chosen by the user).
    pub fn with_layout(layout: Layout) -> Cgroups {
        Cgroups { layout }
    }

    /// The layout in use.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The hierarchy root.
    pub fn root(&self) -> &Path {
        self.layout.root()
    }

    /// Resolves a group path: absolute paths under the root are kept; others (including
    /// `/proc/<pid>/cgroup` style `/a/b`) are taken relative to the root. `..` is refused.
    fn resolve(&self, p: &Path) -> Result<PathBuf> {
        if p.components().any(|c| c == Component::ParentDir) {
            return Err(crate::BadInput::new("cgroup path", p.display(), "a path without '..'").into());
        }
        if p.starts_with(self.root()) {
            return Ok(p.to_path_buf());
        }
        Ok(self.root().join(p.strip_prefix("/").unwrap_or(p)))
    }

    /// Creates the child group `name` under `parent_rel` (relative to the root; `""` for
    /// the root itself) and prepares it so tasks can be attached.
    pub fn create(&self, parent_rel: &Path, name: &str) -> Result<CpusetCgroup> {
        self.create_inner(parent_rel, name, false)
    }

    /// Like [`Cgroups::create`] for groups that will hold single threads of a process that
    /// lives in `parent_rel` (host side: QEMU vCPU threads in per-pool cpusets).
    ///
    /// v2: the group is made `threaded` *before* `+cpuset` is enabled in the parent, the
    /// order the kernel needs when the parent holds processes (a populated domain may only
    /// enable threaded controllers once its children are threaded). v1: same as `create`.
    pub fn create_threaded(&self, parent_rel: &Path, name: &str) -> Result<CpusetCgroup> {
        self.create_inner(parent_rel, name, true)
    }

    fn create_inner(&self, parent_rel: &Path, name: &str, threaded: bool) -> Result<CpusetCgroup> {
        let parent = self.resolve(parent_rel)?;
        let path = parent.join(name);
        if !name.starts_with(GLEANER_PREFIX) || name.contains('/') {
            return Err(OsError::NotGleanerCgroup { path });
        }
        let mut group = CpusetCgroup { path, parent, layout: self.layout.clone(), enabled_cpuset_in: Vec::new() };
        match group.prepare(threaded) {
            Ok(()) => {
                tracing::debug!(path = %group.path.display(), threaded, "created cpuset cgroup");
                Ok(group)
            }
            Err(e) => {
                // Roll back whatever was done: our directory (if made) and +cpuset writes.
                if group.path.is_dir() {
                    let _ = if is_cgroupfs(&group.path) { std::fs::remove_dir(&group.path) } else { std::fs::remove_dir_all(&group.path) };
                }
                undo_subtree_control(&group.enabled_cpuset_in, &group.path);
                Err(e)
            }
        }
    }

    /// An existing group (attach mode): `path` absolute under the root, or relative to it.
    pub fn open(&self, path: impl AsRef<Path>) -> Result<CpusetCgroup> {
        let path = self.resolve(path.as_ref())?;
        self.open_existing(&path)?.ok_or_else(|| OsError::Dir {
            op: "open",
            path,
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        })
    }

    /// Like [`Cgroups::open`], but a group that does not exist (any more) is `None`, not an
    /// error: for undoing changes, where a group already removed is already undone.
    pub fn open_existing(&self, path: impl AsRef<Path>) -> Result<Option<CpusetCgroup>> {
        let path = self.resolve(path.as_ref())?;
        if !path.is_dir() {
            return Ok(None);
        }
        let parent = path.parent().map(Path::to_path_buf).unwrap_or_else(|| path.clone());
        Ok(Some(CpusetCgroup { path, parent, layout: self.layout.clone(), enabled_cpuset_in: Vec::new() }))
    }

    /// The cpuset group process `pid` is in (v1: the line naming the `cpuset` controller in
    /// `/proc/<pid>/cgroup`; v2: the `0::` line). Assumes the hierarchy is mounted at its
    /// root (not a container's sub-mount).
    pub fn group_of(&self, procfs: &Procfs, pid: i32) -> Result<CpusetCgroup> {
        let lines = procfs.cgroup_of(pid)?;
        let line = match self.layout {
            Layout::V1 { .. } => lines.iter().find(|(_, c, _)| c.iter().any(|c| c == "cpuset")),
            Layout::V2 { .. } => lines.iter().find(|(id, c, _)| *id == 0 && c.is_empty()),
        };
        let Some((_, _, rel)) = line else {
            return Err(OsError::NoCpuset { reason: format!("process {pid} is in no cgroup v{} hierarchy", self.layout.version()) });
        };
        self.open(rel)
    }

    /// Every directory named `gleaner*` under the root (any depth), children before their
    /// parents so they can be removed in order (used by `restore` after a crash).
    pub fn list_gleaner_groups(&self) -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        walk(self.root(), 0, &mut out)?;
        Ok(out)
    }
}

/// On a plain directory (a test fixture) `mkdir` does not make the interface files the
/// kernel would; create them empty so the rest of the code runs unchanged.
fn seed_fixture_files(path: &Path, layout: &Layout) -> Result<()> {
    let files: &[&str] = match layout {
        Layout::V1 { .. } => &["cgroup.procs", "tasks", "cpuset.cpus", "cpuset.mems", "cpuset.effective_cpus"],
        Layout::V2 { .. } => &[
            "cgroup.procs",
            "cgroup.threads",
            "cgroup.subtree_control",
            "cpuset.cpus",
            "cpuset.mems",
            "cpuset.cpus.effective",
            "cgroup.type",
        ],
    };
    for f in files {
        let p = path.join(f);
        let init = if *f == "cgroup.type" { "domain\n" } else { "" };
        std::fs::write(&p, init).map_err(|source| OsError::Write { path: p, value: String::new(), source })?;
    }
    Ok(())
}

fn walk(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> Result<()> {
    if depth > 32 {
        return Ok(());
    }
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(OsError::Dir { op: "list", path: dir.to_path_buf(), source }),
    };
    let mut subdirs: Vec<PathBuf> =
        rd.filter_map(|e| e.ok()).filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false)).map(|e| e.path()).collect();
    subdirs.sort();
    for d in subdirs {
        walk(&d, depth + 1, out)?;
        if d.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(GLEANER_PREFIX)) {
            out.push(d);
        }
    }
    Ok(())
}

/// Writes `-cpuset` to the `cgroup.subtree_control` files we enabled, deepest first, where
/// no child remains other than the directories on the path to `removed`. Best effort: failures are logged.
fn undo_subtree_control(enabled: &[PathBuf], removed: &Path) {
    for dir in enabled.iter().rev() {
        let others = std::fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                    .map(|e| e.path())
                    .filter(|p| !removed.starts_with(p))
                    .count()
            })
            .unwrap_or(1);
        if others > 0 {
            tracing::debug!(dir = %dir.display(), "other child groups remain; leaving +cpuset");
            return;
        }
        if let Err(e) = util::write(&dir.join("cgroup.subtree_control"), "-cpuset") {
            tracing::warn!(error = %e, "could not undo +cpuset");
            return;
        }
    }
}

/// True when `path` is on a real cgroup (v1 or v2) filesystem.
pub fn is_cgroupfs(path: &Path) -> bool {
    use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC};
    statfs(path).map(|s| s.filesystem_type() == CGROUP_SUPER_MAGIC || s.filesystem_type() == CGROUP2_SUPER_MAGIC).unwrap_or(false)
}

/// One cpuset cgroup. Cloning gives a second handle to the same directory.
#[derive(Debug, Clone)]
pub struct CpusetCgroup {
    path: PathBuf,
    parent: PathBuf,
    layout: Layout,
    /// v2: directories where this group's creation wrote `+cpuset` (undone by `remove`).
    enabled_cpuset_in: Vec<PathBuf>,
}

impl CpusetCgroup {
    /// Steps of `Cgroups::create*`; on error the caller rolls back what `self` records.
    fn prepare(&mut self, threaded: bool) -> Result<()> {
        let v2_root = match &self.layout {
            Layout::V2 { root } => Some(root.clone()),
            Layout::V1 { .. } => None,
        };
        // v2: each ancestor from the root down to the parent must delegate cpuset. For a
        // threaded group the parent itself is done after the child is threaded.
        let mut dirs = Vec::new();
        if let Some(root) = &v2_root {
            let mut d = self.parent.as_path();
            dirs.push(d.to_path_buf());
            while d != root.as_path() {
                match d.parent() {
                    Some(up) => {
                        dirs.push(up.to_path_buf());
                        d = up;
                    }
                    None => break,
                }
            }
            dirs.reverse();
            let upto = if threaded { dirs.len() - 1 } else { dirs.len() };
            for dir in &dirs[..upto] {
                self.enable_cpuset(dir)?;
            }
        }
        let real = is_cgroupfs(&self.parent);
        std::fs::create_dir(&self.path).map_err(|source| OsError::Dir { op: "create", path: self.path.clone(), source })?;
        if !real {
            seed_fixture_files(&self.path, &self.layout)?;
        }
        match self.layout {
            Layout::V1 { .. } => {
                // A new v1 cpuset has empty cpus/mems: nothing could be attached to it.
                for f in ["cpuset.mems", "cpuset.cpus"] {
                    let v = util::read(&self.parent.join(f))?;
                    util::write(&self.path.join(f), v.trim())?;
                }
            }
            Layout::V2 { .. } if threaded => {
                self.set_threaded()?;
                if let Some(parent) = dirs.last() {
                    self.enable_cpuset(&parent.clone())?;
                }
            }
            Layout::V2 { .. } => {}
        }
        Ok(())
    }

    /// Writes `+cpuset` to `dir`'s `cgroup.subtree_control` unless it is there; records it.
    fn enable_cpuset(&mut self, dir: &Path) -> Result<()> {
        let sc = dir.join("cgroup.subtree_control");
        let cur = util::read(&sc)?;
        if !cur.split_whitespace().any(|c| c == "cpuset") {
            util::write(&sc, "+cpuset")?;
            self.enabled_cpuset_in.push(dir.to_path_buf());
        }
        Ok(())
    }

    /// Absolute path of the group directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory stragglers are moved to on removal.
    pub fn parent(&self) -> &Path {
        &self.parent
    }

    /// The hierarchy's layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// True when `create` enabled the cpuset controller in some ancestor (v2).
    pub fn enabled_cpuset_in(&self) -> &[PathBuf] {
        &self.enabled_cpuset_in
    }

    /// True while the directory exists.
    pub fn exists(&self) -> bool {
        self.path.is_dir()
    }

    /// Sets `cpuset.cpus`. The empty set is refused (v2 would read it as "inherit the
    /// parent's CPUs", v1 would strand the tasks).
    pub fn set_cpus(&self, cpus: &CpuSet) -> Result<()> {
        if cpus.is_empty() {
            return Err(crate::BadInput::new("cpuset", "(empty)", "at least one CPU").into());
        }
        util::write(&self.path.join("cpuset.cpus"), &cpus.to_string())
    }

    /// `cpuset.cpus` as configured (v2: empty means inherited).
    pub fn cpus(&self) -> Result<CpuSet> {
        read_cpus(&self.path.join("cpuset.cpus"))
    }

    /// The CPUs actually usable (v1 `cpuset.effective_cpus`, v2 `cpuset.cpus.effective`);
    /// falls back to `cpuset.cpus` when the file is missing or empty (old v1 kernels,
    /// fixtures).
    pub fn effective_cpus(&self) -> Result<CpuSet> {
        let p = self.path.join(match self.layout {
            Layout::V1 { .. } => "cpuset.effective_cpus",
            Layout::V2 { .. } => "cpuset.cpus.effective",
        });
        if util::read_opt(&p)?.is_some_and(|t| !t.trim().is_empty()) {
            read_cpus(&p)
        } else {
            self.cpus()
        }
    }

    /// Moves process `pid` (all its threads) into the group.
    pub fn add_process(&self, pid: i32) -> Result<()> {
        write_id(&self.path.join("cgroup.procs"), pid, None)
    }

    /// The file a freshly forked, single-threaded child writes `0` to, to join this group
    /// before `exec`. v1: `tasks`, which moves only the calling thread and so skips the
    /// kernel's global threadgroup lock that a `cgroup.procs` write takes (and that waits
    /// for an RCU grace period: 5-19 ms per new group measured here, against 0.25 ms); for a
    /// single-threaded process the thread is the process. v2: `cgroup.procs` (a domain group
    /// takes no single threads).
    pub fn self_join_file(&self) -> PathBuf {
        match self.layout {
            Layout::V1 { .. } => self.path.join("tasks"),
            Layout::V2 { .. } => self.path.join("cgroup.procs"),
        }
    }

    /// Moves one thread into the group (v1 `tasks`; v2 `cgroup.threads`, which only works
    /// in a threaded subtree).
    pub fn add_thread(&self, tid: i32) -> Result<()> {
        write_id(&self.path.join(self.threads_file()), tid, Some(tid))
    }

    fn threads_file(&self) -> &'static str {
        match self.layout {
            Layout::V1 { .. } => "tasks",
            Layout::V2 { .. } => "cgroup.threads",
        }
    }

    /// v2: makes the group threaded (`cgroup.type` = `threaded`), so single threads of a
    /// process (e.g. QEMU vCPU threads) can be placed in it and its siblings. The process
    /// itself must live in the threaded domain (the nearest non-threaded ancestor). On v1
    /// every cpuset already takes single threads: nothing to do.
    pub fn set_threaded(&self) -> Result<()> {
        match self.layout {
            Layout::V1 { .. } => Ok(()),
            Layout::V2 { .. } => util::write(&self.path.join("cgroup.type"), "threaded"),
        }
    }

    /// True when single threads can be moved into this group (always on v1; v2: `cgroup.type`
    /// is `threaded`).
    pub fn is_threaded(&self) -> Result<bool> {
        match self.layout {
            Layout::V1 { .. } => Ok(true),
            Layout::V2 { .. } => Ok(util::read_opt(&self.path.join("cgroup.type"))?.is_some_and(|t| t.trim() == "threaded")),
        }
    }

    /// Process ids in the group.
    pub fn procs(&self) -> Result<Vec<i32>> {
        read_ids(&self.path.join("cgroup.procs"))
    }

    /// Thread ids in the group (v1 `tasks`, v2 `cgroup.threads`).
    pub fn threads(&self) -> Result<Vec<i32>> {
        read_ids(&self.path.join(self.threads_file()))
    }

    /// Moves remaining processes and threads to the parent, removes the directory (retrying
    /// while the kernel reports it busy, up to 2 s) and, on v2, undoes the `+cpuset` that
    /// `create` added where no other child group needs it.
    pub fn remove(self) -> Result<()> {
        let name_ok = self.path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(GLEANER_PREFIX));
        if !name_ok {
            return Err(OsError::NotGleanerCgroup { path: self.path });
        }
        if !self.exists() {
            undo_subtree_control(&self.enabled_cpuset_in, &self.path);
            return Ok(());
        }
        let real = is_cgroupfs(&self.path);
        let deadline = Instant::now() + REMOVE_DEADLINE;
        loop {
            self.move_stragglers()?;
            let r = if real { std::fs::remove_dir(&self.path) } else { std::fs::remove_dir_all(&self.path) };
            match r {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) if real && e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(source) => return Err(OsError::Dir { op: "remove", path: self.path, source }),
            }
        }
        undo_subtree_control(&self.enabled_cpuset_in, &self.path);
        tracing::debug!(path = %self.path.display(), "removed cpuset cgroup");
        Ok(())
    }

    /// Moves every process (and, v1 or a threaded v2 group, every thread) of this group to
    /// the parent.
    pub fn move_stragglers(&self) -> Result<()> {
        if let Layout::V2 { .. } = self.layout {
            if self.is_threaded()? {
                // Threads of a threaded group must stay in their threaded subtree: move them
                // to the parent one by one (cgroup.procs is not writable here).
                for tid in self.threads()? {
                    match write_id(&self.parent.join("cgroup.threads"), tid, Some(tid)) {
                        Ok(()) | Err(OsError::Vanished { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
                return Ok(());
            }
        }
        for pid in self.procs()? {
            match write_id(&self.parent.join("cgroup.procs"), pid, None) {
                Ok(()) | Err(OsError::Vanished { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        if let Layout::V1 { .. } = self.layout {
            for tid in self.threads()? {
                match write_id(&self.parent.join("tasks"), tid, Some(tid)) {
                    Ok(()) | Err(OsError::Vanished { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }
}

fn read_cpus(path: &Path) -> Result<CpuSet> {
    let t = util::read(path)?;
    CpuSet::parse(&t).map_err(|e| parse_err(path, 1, e.to_string()))
}

/// Parses a list of ids, one per line (`cgroup.procs`, `tasks`).
pub fn parse_ids(path: &Path, text: &str) -> Result<Vec<i32>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.is_empty() {
            continue;
        }
        out.push(l.parse::<i32>().map_err(|_| parse_err(path, i + 1, format!("'{l}' is not a pid")))?);
    }
    Ok(out)
}

fn read_ids(path: &Path) -> Result<Vec<i32>> {
    let t = util::read(path)?;
    parse_ids(path, &t)
}

fn write_id(path: &Path, id: i32, tid: Option<i32>) -> Result<()> {
    match util::write(path, &id.to_string()) {
        Err(OsError::Write { source, .. }) if source.raw_os_error() == Some(libc::ESRCH) => Err(OsError::Vanished { pid: id, tid }),
        r => r,
    }
}

#[cfg(test)]
mod tests;
