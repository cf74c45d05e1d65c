//! An in-kernel scheduler tracer, written in Rust down to the eBPF instructions: no C
//! toolchain, libbpf, libelf or bpftool at build or run time.
//!
//! [`WakeTracer`] measures, online and cheaply, what `gleaner_policy::idle::WakeTrace`
//! specifies: the managed workload's wakeup latency (from `sched_waking` to the woken task
//! running) by the state of the vCPU it was woken onto (busy, polling in cpuidle's POLL
//! state, halted, idle without a known state), and each vCPU's idle periods split into those
//! ended by a wakeup of a managed task from another CPU (`woken`) and the rest (`other`).
//!
//! ```text
//!  insn   the encoder: const fns for the 8-byte bpf_insn, Asm (labels, ld_imm64 map fds)
//!  sys    bpf(2): map create/lookup/update/delete/next-key/batch, prog load (verifier log),
//!         raw tracepoint open, test run, enable stats, fd by id; fdinfo and CapEff readers
//!  progs  the three programs (sched_waking, cpu_idle, sched_switch) and the map layouts
//!  wake   WakeTracer: load, attach/detach (duty cycling), set_managed, track_all, read
//! ```
//!
//! ```no_run
//! # fn main() -> Result<(), gleaner_os::bpf::TraceError> {
//! use gleaner_os::{bpf::{TracerConfig, WakeTracer}, sysfs::Sysfs};
//! let mut t = WakeTracer::load(&TracerConfig::detect(&Sysfs::new())?)?;
//! t.set_managed(&[4242])?;
//! t.attach()?;
//! let before = t.read()?;
//! std::thread::sleep(std::time::Duration::from_millis(100));
//! let window = t.read()?.delta_since(&before);
//! t.detach(); // tracing costs every scheduler event a little (docs/os.md): duty-cycle it
//! println!("{} wakeups, p50 {:?} ns", window.latency.all().count(), window.latency.all().quantile_ns(0.5));
//! # Ok(()) }
//! ```
//!
//! See docs/os.md ("The scheduler tracer") for the design, its cost and its limits.

use std::io;

pub mod insn;
pub mod progs;
pub mod sys;
mod wake;

#[cfg(test)]
mod tests;

pub use wake::{ProgStats, StatsGuard, TracerConfig, WakeTracer, MAX_MANAGED};

use crate::error::OsError;

/// Why tracing is not possible or failed.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// This kernel or this process cannot trace; `what` names the missing piece, `why` says
    /// what would be needed ("not root (CAP_BPF/CAP_PERFMON needed)", "not found in this
    /// kernel").
    #[error("{what}: {why}")]
    Unavailable { what: String, why: String },
    /// The kernel's verifier refused a program (gleaner's bug, or a kernel it was not written
    /// for); `log` is the verifier's log, the message shows its end.
    #[error("the kernel's verifier refused program {prog}: {}", log_tail(log))]
    Verifier { prog: &'static str, log: String },
    /// A bpf(2) command failed (`op` names it and the map).
    #[error("{op} failed")]
    Sys {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    /// Reading the CPU topology, or a bad argument (`OsError::BadInput`).
    #[error(transparent)]
    Os(#[from] OsError),
}

/// The last lines of a verifier log: where it stopped, and why.
fn log_tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}
