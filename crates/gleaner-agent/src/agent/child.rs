//! The workload as a child process: checking and starting the command (inside its cgroup
//! from the first instruction), waiting for it with a timeout, and the agent's own CPU time.

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use gleaner_os::cgroup::CpusetCgroup;
use gleaner_os::rusage::Rusage;
use gleaner_os::BadInput;

use super::{pending_signal, Outcome, RunOptions};

/// Waits for the end of the period, the workload's exit or a signal; `true` when the run ends
/// (the exit status or the signal recorded in `outcome`; a signal is passed on to a workload
/// of ours, which gets 5 s to go).
pub(crate) fn wait_period(
    waiter: Option<&ChildWaiter>,
    period: Duration,
    child_pid: Option<i32>,
    workload_start: Instant,
    outcome: &mut Outcome,
) -> anyhow::Result<bool> {
    if let Some(w) = waiter {
        if let Some((code, ru)) = w.wait(period)? {
            outcome.workload_wall_ns = duration_ns(workload_start.elapsed());
            outcome.exit_code = Some(code);
            outcome.rusage = Some(ru);
            return Ok(true);
        }
    } else {
        sleep_interruptible(period);
    }
    let Some(sig) = pending_signal() else { return Ok(false) };
    outcome.signal = Some(sig);
    if let Some(pid) = child_pid {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::try_from(sig).ok());
        if let Some((code, ru)) = waiter.map(|w| w.wait(Duration::from_secs(5))).transpose()?.flatten() {
            outcome.exit_code = Some(code);
            outcome.rusage = Some(ru);
        }
    }
    Ok(true)
}

/// Starts `argv` with its own stdin/stderr; it joins `cgroup` before exec, so every thread it
/// ever creates is inside.
pub(crate) fn spawn_command(argv: &[String], cgroup: Option<&CpusetCgroup>, opts: &RunOptions) -> anyhow::Result<i32> {
    let (prog, args) = argv.split_first().ok_or_else(|| BadInput::new("command", "(empty)", "a program and its arguments after --"))?;
    let mut cmd = Command::new(prog);
    cmd.args(args);
    if let Some(p) = &opts.stdout_to {
        let f = std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
        cmd.stdout(f);
    }
    if let Some(p) = &opts.stderr_to {
        let f = std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
        cmd.stderr(f);
    }
    if let Some(cg) = cgroup {
        // v1 `tasks`: the child is single-threaded here, and a thread move skips the kernel lock
        // a `cgroup.procs` write waits on (5-19 ms per new group measured here).
        let join = CString::new(cg.self_join_file().into_os_string().into_encoded_bytes()).context("cgroup path")?;
        // SAFETY: the closure runs in the forked child before exec and only calls the
        // async-signal-safe open(2), write(2) and close(2) on memory allocated before fork.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(join.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let r = libc::write(fd, b"0\n".as_ptr().cast(), 2);
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if r < 0 {
                    return Err(err);
                }
                Ok(())
            });
        }
    }
    let child = cmd.spawn().map_err(|e| BadInput::new("command", prog, format!("a program that can be started ({e})")))?;
    Ok(child.id().cast_signed())
}

/// Fails early (before any change) if `argv[0]` cannot be found or executed.
pub fn check_program(argv: &[String]) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let prog = argv.first().ok_or_else(|| BadInput::new("command", "(empty)", "a program and its arguments after --"))?;
    let runnable = |p: &Path| p.is_file() && p.metadata().map(|m| m.permissions().mode() & 0o111 != 0).unwrap_or(false);
    let found = if prog.contains('/') {
        runnable(Path::new(prog))
    } else {
        std::env::var_os("PATH").map(|path| std::env::split_paths(&path).any(|d| runnable(&d.join(prog)))).unwrap_or(false)
    };
    if found {
        Ok(())
    } else {
        Err(BadInput::new("command", prog, "an executable file, or a program on PATH").into())
    }
}

/// Waits for a child with a timeout, through a pidfd (no polling loop).
pub(crate) struct ChildWaiter {
    pid: i32,
    pidfd: std::os::fd::OwnedFd,
}

impl ChildWaiter {
    pub(crate) fn new(pid: i32) -> anyhow::Result<Self> {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("pidfd_open");
        }
        let fd = i32::try_from(fd).context("pidfd out of range")?;
        // SAFETY: `fd` is a freshly opened descriptor that nothing else owns.
        let pidfd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        Ok(Self { pid, pidfd })
    }

    /// Returns the exit code and rusage if the child exited within `timeout` (or a signal
    /// interrupted the wait and it has exited).
    pub(crate) fn wait(&self, timeout: Duration) -> anyhow::Result<Option<(i32, Rusage)>> {
        if !gleaner_os::fd::wait_readable(&self.pidfd, timeout) {
            return Ok(None);
        }
        let (status, ru) = gleaner_os::rusage::wait4(self.pid).with_context(|| format!("waiting for pid {}", self.pid))?;
        Ok(Some((status.code(), ru)))
    }
}

/// The agent's own CPU time so far (every thread), if it can be read.
pub(crate) fn self_cpu_ns() -> Option<u64> {
    gleaner_os::rusage::self_rusage().ok().map(|r| r.user_ns + r.sys_ns)
}

pub(crate) fn sleep_interruptible(d: Duration) {
    let end = Instant::now() + d;
    while pending_signal().is_none() {
        let now = Instant::now();
        if now >= end {
            break;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(50)));
    }
}

pub(crate) fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
