//! One QEMU guest: an initramfs with busybox that mounts the host's root filesystem read-only
//! over 9p, chroots into it and runs a job script, so the guest runs the host's own `gleaner`
//! binary and Debian-packaged programs.
//!
//! ```text
//!  host                                   guest (initramfs /init, busybox sh)
//!  ----                                   -----------------------------------
//!  qemu -kernel vmlinux -initrd base+job  insmod virtio_pci 9pnet_virtio 9p ...
//!       -virtfs path=/,readonly=on  ----> mount -t 9p hostroot /host (ro)
//!                                         mount proc, sysfs, devtmpfs, tmpfs /tmp /run
//!                                         mount cgroup2 (+cpuset) or v1 cpuset
//!  ttyS0 -> console.log (kernel, stderr)  chroot /host sh /run/gleaner-lab/job.sh
//!  ttyS1 -> QEMU stdout -> reader thread  @@LAB READY / BEGIN s / <stdout> / END s rc=N / DONE
//!           timestamps each line and                   poweroff -f
//!           snapshots QEMU's thread CPU times at markers
//! ```
//!
//! QEMU is started by [`crate::command::QemuCommand`] (the launcher the host agent's tests use
//! too): its own process group, pinned to the experiment's pCPUs, `PR_SET_PDEATHSIG`;
//! [`Guest`]'s `Drop` kills the group by PID and reaps it, and its temp dir goes with it. Waits are bounded by deadlines and poll the interrupt flag.

use std::fmt;
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::command::{Accel, QemuCommand, RunningQemu};
use crate::cpio::Cpio;
use crate::hostproc::{ProcThreads, ThreadCpu};
use crate::interrupt;
use crate::kernel::Kernel;
use crate::GuestError;

/// Which cgroup filesystem the guest mounts for the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum GuestCgroup {
    /// cgroup2 at /sys/fs/cgroup with `+cpuset` in the root's subtree_control.
    #[default]
    V2,
    /// cgroup v1 cpuset at /sys/fs/cgroup/cpuset.
    V1,
}

/// What a guest is and does: its machine (the QEMU command line [`Guest::start`] completes
/// with the kernel, initramfs, 9p shares and result port) and what runs in it.
#[derive(Debug, Clone)]
pub struct GuestSpec {
    /// Name, QEMU binary, vCPUs, memory, acceleration, pinning.
    pub machine: QemuCommand,
    pub cgroup: GuestCgroup,
    /// The job script (POSIX sh, run by the host's `/bin/sh` inside the chroot).
    pub job: String,
    /// Extra kernel command-line arguments (e.g. `idle=poll`).
    pub kernel_args: Vec<String>,
    /// Host directories the guest would not see at their own path (under its tmpfs mounts,
    /// e.g. a checkout in /tmp): each is shared read-only over its own 9p device and mounted
    /// over the guest's tmpfs at the same path.
    pub shares: Vec<PathBuf>,
}

impl GuestSpec {
    pub fn new(name: impl Into<String>) -> Self {
        Self { machine: QemuCommand::new(name), cgroup: GuestCgroup::V2, job: "true\n".into(), kernel_args: Vec::new(), shares: Vec::new() }
    }
    pub fn vcpus(mut self, n: u32) -> Self {
        self.machine = self.machine.cpus(n);
        self
    }
    pub fn memory_mib(mut self, m: u32) -> Self {
        self.machine = self.machine.memory_mib(m);
        self
    }
    pub fn accel(mut self, a: Accel) -> Self {
        self.machine = self.machine.accel(a);
        self
    }
    pub fn pin(mut self, cpus: Option<Vec<usize>>) -> Self {
        self.machine = self.machine.pin(cpus);
        self
    }
    /// The guest's name (QEMU's `-name`).
    pub fn name(&self) -> &str {
        &self.machine.name
    }
    pub fn cgroup(mut self, c: GuestCgroup) -> Self {
        self.cgroup = c;
        self
    }
    pub fn job(mut self, script: impl Into<String>) -> Self {
        self.job = script.into();
        self
    }
    pub fn kernel_args(mut self, args: Vec<String>) -> Self {
        self.kernel_args = args;
        self
    }
    /// Makes `path` (a file's directory, or a directory) visible in the guest at the same
    /// path, also where the guest mounts its own tmpfs (/tmp, /run, /var/tmp).
    pub fn share(mut self, dir: &Path) -> Self {
        if !visible_in_guest(dir) && !self.shares.iter().any(|d| d == dir) {
            self.shares.push(dir.to_path_buf());
        }
        self
    }
    /// The kernel command line.
    pub fn cmdline(&self) -> String {
        let mut s = String::from("console=ttyS0 quiet loglevel=3 panic=-1 mitigations=off rdinit=/init");
        for a in &self.kernel_args {
            s.push(' ');
            s.push_str(a);
        }
        s
    }
}

/// What the reader thread saw on the result port.
#[derive(Debug, Clone, PartialEq)]
pub enum EventKind {
    /// Init mounted everything and is about to run the job.
    Ready,
    Begin(String),
    /// One line of a step's stdout.
    Line(String),
    End {
        step: String,
        rc: i32,
    },
    /// The job script finished.
    Done {
        rc: i32,
    },
    /// Init could not set up the guest.
    Fail(String),
    /// A file the job sends after step `step` (e.g. the agent's `events` JSON lines): the
    /// lines up to [`EventKind::AttachEnd`] belong to it, not to a step's stdout.
    Attach {
        step: String,
        kind: String,
    },
    AttachEnd,
    /// QEMU closed its stdout (it exited).
    Exited,
}

#[derive(Debug, Clone)]
pub struct GuestEvent {
    /// Index of the guest in its session.
    pub guest: usize,
    pub at: Instant,
    pub kind: EventKind,
    /// QEMU's per-thread CPU times, sampled when a marker line arrived.
    pub cpu: Option<Vec<ThreadCpu>>,
}

/// Parses one line of the result port (`\r` already stripped).
pub fn parse_line(line: &str) -> EventKind {
    let Some(m) = line.strip_prefix("@@LAB ") else { return EventKind::Line(line.to_string()) };
    let mut it = m.split_whitespace();
    let rc = |s: Option<&str>| s.and_then(|x| x.strip_prefix("rc=")).and_then(|x| x.parse().ok()).unwrap_or(-1);
    match it.next() {
        Some("READY") => EventKind::Ready,
        Some("BEGIN") => EventKind::Begin(it.next().unwrap_or("").to_string()),
        Some("END") => {
            let step = it.next().unwrap_or("").to_string();
            EventKind::End { step, rc: rc(it.next()) }
        }
        Some("DONE") => EventKind::Done { rc: rc(it.next()) },
        Some("FAIL") => EventKind::Fail(it.collect::<Vec<_>>().join(" ")),
        Some("ATTACH") => {
            let step = it.next().unwrap_or("").to_string();
            EventKind::Attach { step, kind: it.next().unwrap_or("").to_string() }
        }
        Some("ATTACH-END") => EventKind::AttachEnd,
        _ => EventKind::Line(line.to_string()),
    }
}

/// A running guest. Dropping it kills its process group and removes its temp dir.
pub struct Guest {
    pub id: usize,
    pub name: String,
    pub pid: u32,
    pub accel: Accel,
    pub started: Instant,
    qemu: RunningQemu,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl fmt::Debug for Guest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guest").field("name", &self.name).field("pid", &self.pid).finish()
    }
}

const GUEST_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn init_script(kernel: &Kernel, cgroup: GuestCgroup, shares: &[PathBuf]) -> String {
    let modules = kernel.modules.join(" ");
    let share_mounts: String = shares
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let d = shell_quote(&d.display().to_string());
            format!("mkdir -p $H{d} && mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 {SHARE_TAG}{i} $H{d} || fail mount-share-{i}\n")
        })
        .collect();
    let cgroup_setup = match cgroup {
        GuestCgroup::V2 => {
            "mount -t cgroup2 cgroup2 $H/sys/fs/cgroup || fail cgroup2\n\
             echo +cpuset > $H/sys/fs/cgroup/cgroup.subtree_control || fail cpuset-controller\n"
        }
        GuestCgroup::V1 => {
            "mount -t tmpfs cgroup $H/sys/fs/cgroup || fail cgroup-tmpfs\n\
             mkdir -p $H/sys/fs/cgroup/cpuset\n\
             mount -t cgroup -o cpuset cpuset $H/sys/fs/cgroup/cpuset || fail cgroup-v1-cpuset\n"
        }
    };
    format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
R=/dev/ttyS1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
fail() {{ echo "@@LAB FAIL $*" > $R; echo "lab-init: FAIL $*"; poweroff -f; sleep 5; echo o > /proc/sysrq-trigger; }}
for m in {modules}; do insmod /modules/$m.ko || fail insmod-$m; done
H=/host
mkdir -p $H
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot $H || fail mount-9p
mount -t proc proc $H/proc || fail proc
mount -t sysfs sysfs $H/sys || fail sysfs
mount -t devtmpfs devtmpfs $H/dev || fail devtmpfs
mkdir -p $H/dev/shm $H/dev/pts
mount -t tmpfs tmpfs $H/dev/shm
mount -t devpts devpts $H/dev/pts
for d in /tmp /run /var/tmp; do [ -d $H$d ] && mount -t tmpfs tmpfs $H$d; done
{share_mounts}{cgroup_setup}mkdir -p $H/run/gleaner-lab
cp /job.sh $H/run/gleaner-lab/job.sh
echo "@@LAB READY" > $R
cd /host
chroot $H /usr/bin/env -i PATH={GUEST_PATH} HOME=/root TERM=dumb GLEANER_LAB_GUEST=1 /bin/sh /run/gleaner-lab/job.sh > $R 2>/dev/ttyS0
echo "@@LAB DONE rc=$?" > $R
sync
poweroff -f
sleep 5
echo o > /proc/sysrq-trigger
"#
    )
}

/// Quotes a word for POSIX sh.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Shell prelude of every job script: `step NAME CMD...` wraps a command's stdout in markers.
/// `attach STEP KIND FILE` sends FILE (if not empty) as an attachment of STEP, then removes it.
pub const JOB_PRELUDE: &str = r#"step() { n=$1; shift; echo "@@LAB BEGIN $n"; "$@"; rc=$?; echo; echo "@@LAB END $n rc=$rc"; }
attach() { if [ -s "$3" ]; then echo "@@LAB ATTACH $1 $2"; cat "$3"; echo; echo "@@LAB ATTACH-END"; fi; rm -f "$3"; }
"#;

/// Paths the guest covers with its own tmpfs or pseudo filesystems: host files there are
/// invisible inside the guest.
pub const GUEST_HIDDEN: &[&str] = &["/tmp", "/run", "/var/tmp", "/dev", "/proc", "/sys"];

/// Where the guest mounts its own tmpfs: host paths there can be shared back ([`GuestSpec::share`]).
pub const GUEST_TMPFS: &[&str] = &["/tmp", "/run", "/var/tmp"];

/// 9p mount tags of [`GuestSpec::share`] directories: `glshare0`, `glshare1`, ...
const SHARE_TAG: &str = "glshare";

/// QEMU's option syntax doubles a comma inside a value.
fn qemu_opt_escape(v: &str) -> String {
    v.replace(',', ",,")
}

/// True when a host path can be made visible in the guest: visible already, or under one of
/// the guest's tmpfs mounts (then shared with [`GuestSpec::share`]); not under /dev, /proc, /sys.
pub fn shareable(p: &Path) -> bool {
    visible_in_guest(p) || GUEST_TMPFS.iter().any(|h| p.starts_with(h))
}

/// True when a host path is visible inside the guest (not under a guest tmpfs/pseudo fs).
pub fn visible_in_guest(p: &Path) -> bool {
    !GUEST_HIDDEN.iter().any(|h| p.starts_with(h))
}

/// Finds a statically linked busybox on the host.
pub fn find_busybox() -> Result<PathBuf, GuestError> {
    let candidates = ["/bin/busybox", "/usr/bin/busybox", "/usr/lib/initramfs-tools/bin/busybox"];
    for c in candidates {
        let p = Path::new(c);
        if let Ok(bytes) = fs::read(p) {
            if is_static_elf(&bytes) {
                return Ok(p.to_path_buf());
            }
        }
    }
    Err(GuestError::NoBusybox { looked: candidates.join(", ") })
}

/// An ELF64 image without a PT_INTERP program header (no dynamic loader needed).
pub fn is_static_elf(b: &[u8]) -> bool {
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 {
        return false;
    }
    let u16le = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let u64le = |o: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[o..o + 8]);
        u64::from_le_bytes(a)
    };
    let Ok(phoff) = usize::try_from(u64le(32)) else { return false };
    let (phentsize, phnum) = (u16le(54), u16le(56));
    for i in 0..phnum {
        let o = phoff + i * phentsize;
        if o + 4 > b.len() {
            return false;
        }
        if u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]) == 3 {
            return false; // PT_INTERP
        }
    }
    true
}

/// Builds the initramfs (busybox, init, modules, job) for a guest.
pub fn build_initramfs(kernel: &Kernel, spec: &GuestSpec, busybox: &Path) -> Result<Vec<u8>, GuestError> {
    let rd = |p: &Path| fs::read(p).map_err(|source| GuestError::Io { path: p.to_path_buf(), source });
    let mut c = Cpio::new();
    for d in ["bin", "dev", "proc", "sys", "host", "modules", "etc"] {
        c.dir(d);
    }
    c.file("bin/busybox", 0o755, &rd(busybox)?);
    c.symlink("bin/sh", "busybox");
    c.file("init", 0o755, init_script(kernel, spec.cgroup, &spec.shares).as_bytes());
    for m in &kernel.modules {
        c.file(&format!("modules/{m}.ko"), 0o644, &rd(&kernel.module_path(m))?);
    }
    let mut job = String::from("#!/bin/sh\n");
    job.push_str(JOB_PRELUDE);
    job.push_str(&spec.job);
    c.file("job.sh", 0o755, job.as_bytes());
    Ok(c.finish())
}

impl Guest {
    /// Starts QEMU for `spec`; events go to `tx` tagged with `id`.
    pub fn start(id: usize, spec: &GuestSpec, kernel: &Kernel, busybox: &Path, tx: Sender<GuestEvent>) -> Result<Self, GuestError> {
        let tmp = crate::command::temp_dir()?;
        let initrd = tmp.path().join("initramfs.cpio");
        let image = build_initramfs(kernel, spec, busybox)?;
        fs::write(&initrd, image).map_err(|source| GuestError::Io { path: initrd.clone(), source })?;
        let mut cmd = spec
            .machine
            .clone()
            .kernel(kernel.image())
            .initrd(&initrd)
            .append(spec.cmdline())
            .args(["-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"])
            .stdout_serial();
        for (i, d) in spec.shares.iter().enumerate() {
            cmd = cmd.arg("-virtfs").arg(format!(
                "local,path={},mount_tag={SHARE_TAG}{i},security_model=none,readonly=on,multidevs=remap",
                qemu_opt_escape(&d.display().to_string())
            ));
        }
        let mut qemu = cmd.spawn_in(tmp)?;
        let pid = qemu.pid;
        let reader = qemu.take_stdout().map(|out| {
            std::thread::Builder::new()
                .name(format!("lab-serial-{id}"))
                .spawn(move || read_results(id, pid, out, &tx))
                .expect("spawning a thread")
        });
        Ok(Self { id, name: spec.machine.name.clone(), pid, accel: spec.machine.accel, started: qemu.started, qemu, reader })
    }

    pub fn temp_dir(&self) -> &Path {
        self.qemu.dir()
    }

    pub fn qmp_path(&self) -> PathBuf {
        self.qemu.qmp_socket()
    }

    /// The last `n` lines of the guest's console (kernel messages and job stderr) and of
    /// QEMU's own stderr.
    pub fn console_tail(&self, n: usize) -> String {
        let mut s = tail(&self.qemu.console_path(), n);
        let e = tail(&self.qemu.dir().join("qemu.stderr"), n);
        if !e.trim().is_empty() {
            s.push_str("\n[qemu stderr]\n");
            s.push_str(&e);
        }
        s
    }

    /// The whole serial console so far (the guest's stderr goes there).
    pub fn console(&self) -> String {
        self.qemu.console()
    }

    /// Kills the process group now (idempotent) and reaps QEMU.
    pub fn kill(&mut self) {
        self.qemu.kill();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }

    /// Waits up to `timeout` for QEMU to exit on its own (after the guest powered off).
    pub fn wait_exit(&mut self, timeout: Duration) -> bool {
        self.qemu.wait_exit(timeout)
    }

    /// Per-vCPU and other thread CPU times of this QEMU right now.
    pub fn threads(&self) -> Vec<ThreadCpu> {
        ProcThreads::new().snapshot(self.pid)
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        self.kill();
    }
}

fn tail(p: &Path, n: usize) -> String {
    let mut s = String::new();
    if let Ok(mut f) = fs::File::open(p) {
        let _ = f.read_to_string(&mut s);
    }
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn read_results(id: usize, pid: u32, out: impl Read, tx: &Sender<GuestEvent>) {
    let procs = ProcThreads::new();
    let mut r = BufReader::new(out);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match r.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let at = Instant::now();
        let line = String::from_utf8_lossy(&buf);
        let line = line.trim_end_matches(['\n', '\r']).trim_start_matches('\r');
        let kind = parse_line(line);
        let cpu = match kind {
            EventKind::Begin(_) | EventKind::End { .. } => Some(procs.snapshot(pid)),
            _ => None,
        };
        if tx.send(GuestEvent { guest: id, at, kind, cpu }).is_err() {
            return;
        }
    }
    let _ = tx.send(GuestEvent { guest: id, at: Instant::now(), kind: EventKind::Exited, cpu: None });
}

/// Receives the next event before `deadline`, polling the interrupt flag.
pub fn next_event(
    rx: &Receiver<GuestEvent>,
    deadline: Instant,
    what: &dyn Fn() -> (String, String, String),
) -> Result<GuestEvent, GuestError> {
    loop {
        if interrupt::requested() {
            return Err(GuestError::Interrupted);
        }
        let now = Instant::now();
        if now >= deadline {
            let (guest, waiting_for, console) = what();
            return Err(GuestError::Timeout { guest, waiting_for, after_s: 0.0, console });
        }
        match rx.recv_timeout((deadline - now).min(Duration::from_millis(100))) {
            Ok(ev) => return Ok(ev),
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => {
                let (guest, _, console) = what();
                return Err(GuestError::GuestFailed { guest, what: "all result channels closed".into(), console });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_markers() {
        assert_eq!(parse_line("@@LAB READY"), EventKind::Ready);
        assert_eq!(parse_line("@@LAB BEGIN 1-off"), EventKind::Begin("1-off".into()));
        assert_eq!(parse_line("@@LAB END 1-off rc=0"), EventKind::End { step: "1-off".into(), rc: 0 });
        assert_eq!(parse_line("@@LAB DONE rc=3"), EventKind::Done { rc: 3 });
        assert_eq!(parse_line("@@LAB FAIL mount-9p"), EventKind::Fail("mount-9p".into()));
        assert_eq!(parse_line("@@LAB ATTACH on.1 events"), EventKind::Attach { step: "on.1".into(), kind: "events".into() });
        assert_eq!(parse_line("@@LAB ATTACH-END"), EventKind::AttachEnd);
    }

    #[test]
    fn malformed_markers_are_lines_or_defaults() {
        assert_eq!(parse_line("{\"runs\": []}"), EventKind::Line("{\"runs\": []}".into()));
        assert_eq!(parse_line("@@LAB WHAT"), EventKind::Line("@@LAB WHAT".into()));
        assert_eq!(parse_line("@@LAB END x rc=abc"), EventKind::End { step: "x".into(), rc: -1 });
        assert_eq!(parse_line(""), EventKind::Line(String::new()));
    }

    #[test]
    fn static_elf_detection() {
        // A known static binary: Debian's busybox-static (which .ci/run installs), read
        // directly (find_busybox returns only what this function accepts).
        let bb = fs::read("/bin/busybox").unwrap_or_else(|e| panic!("this test needs /bin/busybox: apt-get install busybox-static ({e})"));
        assert!(is_static_elf(&bb), "busybox-static should be static");
        let sh = fs::read("/bin/sh").unwrap();
        assert!(!is_static_elf(&sh));
        assert!(!is_static_elf(b""));
        assert!(!is_static_elf(b"\x7fELF garbage"));
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("abc"), "abc");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn guest_visibility() {
        assert!(visible_in_guest(Path::new("/work/main/target/release/gleaner")));
        assert!(!visible_in_guest(Path::new("/tmp/x/gleaner")));
        assert!(!visible_in_guest(Path::new("/run/user/gleaner")));
    }
}
