//! Native baseline runs: the workload as a host process pinned to the experiment's pCPUs, in
//! its own process group, with a deadline; killed by PID group on drop.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gleaner_qemu::{interrupt, GuestError};

/// A running native process.
#[derive(Debug)]
pub struct NativeProc {
    child: Child,
    pub pid: u32,
    out: Option<std::thread::JoinHandle<String>>,
    err: Option<std::thread::JoinHandle<String>>,
    pub started: Instant,
}

impl NativeProc {
    pub fn spawn(program: &Path, args: &[String], pcpus: &[usize]) -> Result<Self, GuestError> {
        let mut cmd = Command::new(program);
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.process_group(0);
        let cpus = pcpus.to_vec();
        // SAFETY: runs in the forked child before exec; only async-signal-safe syscalls.
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
                let mut set = nix::sched::CpuSet::new();
                for &c in &cpus {
                    set.set(c)?;
                }
                nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)?;
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|source| GuestError::Spawn { what: program.display().to_string(), source })?;
        let pid = child.id();
        let collect = |pipe: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut s = String::new();
                if let Some(mut o) = pipe {
                    let _ = o.read_to_string(&mut s);
                }
                s
            })
        };
        let out = collect(child.stdout.take().map(|o| Box::new(o) as Box<dyn Read + Send>));
        let err = collect(child.stderr.take().map(|o| Box::new(o) as Box<dyn Read + Send>));
        Ok(Self { child, pid, out: Some(out), err: Some(err), started: Instant::now() })
    }

    /// Waits for exit before `deadline`; returns (exit code, stdout, wall time). A failed
    /// run's stderr is appended to its stdout after a `[stderr]` line.
    pub fn wait(mut self, deadline: Instant, name: &str) -> Result<(i32, String, Duration), GuestError> {
        loop {
            if interrupt::requested() {
                return Err(GuestError::Interrupted);
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                let wall = self.started.elapsed();
                let mut out = self.out.take().and_then(|h| h.join().ok()).unwrap_or_default();
                let err = self.err.take().and_then(|h| h.join().ok()).unwrap_or_default();
                let rc = st.code().unwrap_or(-1);
                if rc != 0 {
                    out.push_str("\n[stderr]\n");
                    out.push_str(&err);
                }
                return Ok((rc, out, wall));
            }
            if Instant::now() >= deadline {
                return Err(GuestError::Timeout {
                    guest: name.to_string(),
                    waiting_for: "native run to finish".into(),
                    after_s: self.started.elapsed().as_secs_f64(),
                    console: String::new(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NativeProc {
    fn drop(&mut self) {
        // The group may outlive its leader (children of `gleaner run`): kill it by PID.
        if let Ok(pg) = i32::try_from(self.pid) {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pg), nix::sys::signal::Signal::SIGKILL);
        }
        let _ = self.child.wait();
        for h in [self.out.take(), self.err.take()].into_iter().flatten() {
            let _ = h.join();
        }
    }
}
