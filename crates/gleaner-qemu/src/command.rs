//! The one QEMU launcher: a builder for the command line and a running guest that owns its
//! process, its temp dir (QMP socket, serial console, QEMU's stderr) and kills it by PID on
//! drop; plus [`wait_until`] for harnesses and tests. [`crate::guest::Guest`] starts the lab's
//! guests with it, and so do the host agent's QEMU tests (`gleaner-host/tests/real_*.rs`), so
//! every test guest on this machine is launched, pinned and cleaned up the same way.
//!
//! ```no_run
//! use std::time::Duration;
//! use gleaner_qemu::{wait_until, Accel, QemuCommand};
//! let vm = QemuCommand::new("demo").cpus(2).memory_mib(64).accel(Accel::Tcg).spawn().unwrap();
//! wait_until("the QMP socket", Duration::from_secs(10), || vm.qmp_socket().exists().then_some(())).unwrap();
//! // dropped: the process group is killed and reaped, the temp dir removed
//! ```
//!
//! Every QEMU runs in its own process group (`kill` reaches threads and helpers it forks),
//! with `PR_SET_PDEATHSIG` so a crashed harness does not leave it running, optionally pinned to
//! host CPUs. The group is signalled by the child's PID only while the child is not yet
//! reaped, so a recycled PID is never hit.

use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::GuestError;

/// How QEMU runs the guest's CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    Kvm,
    Tcg,
}

impl fmt::Display for Accel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        })
    }
}

/// A QEMU command line, built step by step. Defaults: 2 vCPUs, 512 MiB, TCG, machine `pc`,
/// no devices (`-nodefaults`), no display, the first serial port (ttyS0) written to
/// `console.log` in the guest's temp dir, QMP on `qmp.sock` there, QEMU's stdout discarded.
/// The machine's fields can be read; everything is set through the builder.
#[derive(Debug, Clone)]
pub struct QemuCommand {
    /// QEMU's `-name` (seen by the host agent's discovery).
    pub name: String,
    /// The QEMU binary.
    pub qemu: PathBuf,
    pub cpus: u32,
    pub memory_mib: u32,
    pub accel: Accel,
    /// Host CPUs the whole QEMU process is pinned to (`None`: not pinned).
    pub pin: Option<Vec<usize>>,
    debug_threads: bool,
    kernel: Option<PathBuf>,
    initrd: Option<PathBuf>,
    append: Option<String>,
    stdout_serial: bool,
    extra: Vec<OsString>,
}

impl QemuCommand {
    /// A guest named `name` (QEMU's `-name`, seen by the host agent's discovery).
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            qemu: PathBuf::from("qemu-system-x86_64"),
            cpus: 2,
            memory_mib: 512,
            accel: Accel::Tcg,
            debug_threads: true,
            kernel: None,
            initrd: None,
            append: None,
            stdout_serial: false,
            pin: None,
            extra: Vec::new(),
        }
    }
    /// The QEMU binary (default `qemu-system-x86_64` from `PATH`).
    pub fn qemu(mut self, path: impl Into<PathBuf>) -> Self {
        self.qemu = path.into();
        self
    }
    pub fn cpus(mut self, n: u32) -> Self {
        self.cpus = n;
        self
    }
    pub fn memory_mib(mut self, m: u32) -> Self {
        self.memory_mib = m;
        self
    }
    /// `-accel tcg,thread=multi -cpu max` or `-accel kvm -cpu host,-arch-capabilities`.
    pub fn accel(mut self, a: Accel) -> Self {
        self.accel = a;
        self
    }
    /// `-name NAME,debug-threads=on` (the default): vCPU threads named `CPU n/TCG` or `/KVM`.
    pub fn debug_threads(mut self, on: bool) -> Self {
        self.debug_threads = on;
        self
    }
    /// Boot this kernel image directly (`-kernel`); without one the firmware finds nothing
    /// to boot and the vCPUs idle.
    pub fn kernel(mut self, image: impl Into<PathBuf>) -> Self {
        self.kernel = Some(image.into());
        self
    }
    pub fn initrd(mut self, path: impl Into<PathBuf>) -> Self {
        self.initrd = Some(path.into());
        self
    }
    /// The kernel command line (`-append`).
    pub fn append(mut self, cmdline: impl Into<String>) -> Self {
        self.append = Some(cmdline.into());
        self
    }
    /// A second serial port (ttyS1) on QEMU's stdout, which [`RunningQemu::take_stdout`]
    /// hands over (the lab's result port).
    pub fn stdout_serial(mut self) -> Self {
        self.stdout_serial = true;
        self
    }
    /// Pins the whole QEMU process to these host CPUs (`None`: not pinned).
    pub fn pin(mut self, cpus: Option<Vec<usize>>) -> Self {
        self.pin = cpus;
        self
    }
    /// One more QEMU argument, after the ones the builder writes.
    pub fn arg(mut self, a: impl Into<OsString>) -> Self {
        self.extra.push(a.into());
        self
    }
    pub fn args<I: IntoIterator<Item = S>, S: Into<OsString>>(mut self, args: I) -> Self {
        self.extra.extend(args.into_iter().map(Into::into));
        self
    }
    /// The QEMU command for a guest whose temp dir is `dir` (no process attributes).
    pub fn command(&self, dir: &Path) -> Command {
        let mut cmd = Command::new(&self.qemu);
        let name = if self.debug_threads { format!("{},debug-threads=on", self.name) } else { self.name.clone() };
        cmd.arg("-name").arg(name);
        cmd.args(["-machine", "pc", "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"]);
        match self.accel {
            Accel::Tcg => cmd.args(["-accel", "tcg,thread=multi", "-cpu", "max"]),
            Accel::Kvm => cmd.args(["-accel", "kvm", "-cpu", "host,-arch-capabilities"]),
        };
        cmd.arg("-smp").arg(self.cpus.to_string()).arg("-m").arg(self.memory_mib.to_string());
        if let Some(k) = &self.kernel {
            cmd.arg("-kernel").arg(k);
        }
        if let Some(i) = &self.initrd {
            cmd.arg("-initrd").arg(i);
        }
        if let Some(a) = &self.append {
            cmd.arg("-append").arg(a);
        }
        cmd.args(&self.extra);
        cmd.arg("-serial").arg(format!("file:{}", dir.join(CONSOLE).display()));
        if self.stdout_serial {
            cmd.args(["-serial", "stdio"]);
        }
        cmd.arg("-qmp").arg(format!("unix:{},server=on,wait=off", dir.join(QMP).display()));
        cmd
    }

    /// Starts QEMU in its own process group, with a new temp dir.
    pub fn spawn(self) -> Result<RunningQemu, GuestError> {
        self.spawn_in(temp_dir()?)
    }

    /// Starts QEMU in its own process group, in `dir`, where the caller has put files first
    /// (e.g. the initrd); the running QEMU owns it from then on.
    pub fn spawn_in(self, dir: tempfile::TempDir) -> Result<RunningQemu, GuestError> {
        let stderr_path = dir.path().join(STDERR);
        let stderr = fs::File::create(&stderr_path).map_err(|source| GuestError::Io { path: stderr_path.clone(), source })?;
        let mut cmd = self.command(dir.path());
        cmd.stdin(Stdio::null()).stdout(if self.stdout_serial { Stdio::piped() } else { Stdio::null() }).stderr(stderr);
        cmd.process_group(0);
        let pcpus = self.pin.clone();
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe syscalls (prctl, sched_setaffinity) on data it owns.
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
                if let Some(cpus) = &pcpus {
                    let mut set = nix::sched::CpuSet::new();
                    for &c in cpus {
                        set.set(c)?;
                    }
                    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)?;
                }
                Ok(())
            });
        }
        let child =
            cmd.spawn().map_err(|source| GuestError::Spawn { what: format!("{} for guest {}", self.qemu.display(), self.name), source })?;
        let pid = child.id();
        tracing::info!(guest = %self.name, pid, accel = %self.accel, "qemu started");
        Ok(RunningQemu { name: self.name, pid, accel: self.accel, started: Instant::now(), child, reaped: false, dir })
    }
}

/// A guest's temp dir (`gleaner-lab-*` in the system's temp dir).
pub fn temp_dir() -> Result<tempfile::TempDir, GuestError> {
    tempfile::Builder::new().prefix("gleaner-lab-").tempdir().map_err(|source| GuestError::Io { path: std::env::temp_dir(), source })
}

const CONSOLE: &str = "console.log";
const STDERR: &str = "qemu.stderr";
const QMP: &str = "qmp.sock";

/// A running QEMU. Dropping it kills its process group and removes its temp dir.
#[derive(Debug)]
pub struct RunningQemu {
    pub name: String,
    pub pid: u32,
    pub accel: Accel,
    pub started: Instant,
    child: Child,
    reaped: bool,
    dir: tempfile::TempDir,
}

impl RunningQemu {
    /// The guest's temp dir (console, QEMU's stderr, QMP socket, whatever the caller put).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
    pub fn qmp_socket(&self) -> PathBuf {
        self.dir.path().join(QMP)
    }
    /// The file ttyS0 is written to (kernel messages, and what the guest writes there).
    pub fn console_path(&self) -> PathBuf {
        self.dir.path().join(CONSOLE)
    }
    /// The whole console so far.
    pub fn console(&self) -> String {
        fs::read(self.console_path()).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
    }
    /// QEMU's own stderr so far.
    pub fn stderr(&self) -> String {
        fs::read(self.dir.path().join(STDERR)).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
    }
    /// QEMU's stdout (ttyS1), once, when built with [`QemuCommand::stdout_serial`].
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }
    /// True until QEMU has exited (and was reaped here).
    pub fn is_running(&mut self) -> bool {
        if !self.reaped && matches!(self.child.try_wait(), Ok(Some(_))) {
            self.reaped = true;
        }
        !self.reaped
    }
    /// Waits up to `timeout` for QEMU to exit on its own (after the guest powered off).
    pub fn wait_exit(&mut self, timeout: Duration) -> bool {
        wait_until("QEMU to exit", timeout, || (!self.is_running()).then_some(())).is_ok()
    }
    /// Kills the process group now and reaps QEMU (idempotent).
    pub fn kill(&mut self) {
        if self.reaped {
            return;
        }
        // The child is not reaped yet, so its PID (= its process group id) is still ours.
        if let Ok(pgid) = i32::try_from(self.pid) {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGKILL);
        }
        let _ = self.child.wait();
        self.reaped = true;
    }
}

impl Drop for RunningQemu {
    fn drop(&mut self) {
        self.kill();
    }
}

/// [`wait_until`] gave up.
#[derive(Debug, thiserror::Error)]
#[error("timed out after {after:?} waiting for {what}")]
pub struct WaitTimeout {
    pub what: String,
    pub after: Duration,
}

/// Polls `cond` every 20 ms until it returns `Some` (its value is returned) or `timeout`
/// has passed: no fixed sleeps in harnesses.
pub fn wait_until<T>(what: &str, timeout: Duration, mut cond: impl FnMut() -> Option<T>) -> Result<T, WaitTimeout> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = cond() {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            return Err(WaitTimeout { what: what.to_string(), after: timeout });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(c: &Command) -> Vec<String> {
        c.get_args().map(|a| a.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn the_command_line_says_what_the_builder_was_told() {
        let d = Path::new("/tmp/g");
        let c = QemuCommand::new("a").cpus(1).memory_mib(128).kernel("/k").initrd("/i").append("console=ttyS0 x=1").arg("-virtfs").arg("v");
        let a = argv(&c.command(d));
        let s = a.join(" ");
        assert!(s.starts_with("-name a,debug-threads=on -machine pc -nodefaults"), "{s}");
        assert!(s.contains("-accel tcg,thread=multi -cpu max -smp 1 -m 128 -kernel /k -initrd /i"), "{s}");
        assert!(a.contains(&"console=ttyS0 x=1".to_string()), "the command line is one argument: {a:?}");
        assert!(s.contains("-virtfs v -serial file:/tmp/g/console.log -qmp unix:/tmp/g/qmp.sock,server=on,wait=off"), "{s}");
        assert!(!s.contains("stdio"));
        let k = argv(&QemuCommand::new("b").debug_threads(false).accel(Accel::Kvm).stdout_serial().command(d)).join(" ");
        assert!(k.starts_with("-name b -machine"), "{k}");
        assert!(k.contains("-accel kvm -cpu host,-arch-capabilities") && !k.contains("-kernel"), "{k}");
        assert!(k.contains("-serial file:/tmp/g/console.log -serial stdio"), "{k}");
    }

    #[test]
    fn wait_until_returns_the_value_or_names_what_it_waited_for() {
        let mut n = 0;
        assert_eq!(
            wait_until("n to reach 3", Duration::from_secs(5), || {
                n += 1;
                (n >= 3).then_some(n)
            })
            .unwrap(),
            3
        );
        let e = wait_until("never", Duration::from_millis(50), || None::<()>).unwrap_err();
        assert_eq!(e.to_string(), "timed out after 50ms waiting for never");
    }

    #[test]
    fn a_missing_qemu_binary_is_a_spawn_error_naming_the_guest() {
        let e = QemuCommand::new("nope").qemu("/nonexistent/qemu").spawn().unwrap_err();
        assert!(matches!(&e, GuestError::Spawn { what, .. } if what.contains("/nonexistent/qemu for guest nope")), "{e}");
    }
}
