//! The first phase: everything resolved before the first run (binary, kernel, acceleration, pCPUs, runs, halt-poll settings).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use gleaner_os::BadInput;
use gleaner_qemu::guest::{self, GuestSpec};
use gleaner_qemu::kernel::{self as cache, Kernel};
use gleaner_qemu::{accel, Accel};

use super::wake::WakeCosts;
use super::RunOptions;
use crate::experiment::{Experiment, Scenario};
use crate::keys::HaltPoll;

/// Everything resolved before the first run.
pub(super) struct Prepared {
    pub(super) gleaner: PathBuf,
    pub(super) kernel: Kernel,
    pub(super) busybox: PathBuf,
    pub(super) runs: u32,
    pub(super) pcpus: Vec<usize>,
    pub(super) acc: Accel,
    pub(super) deadline: Instant,
    pub(super) halt_polls: Vec<HaltPoll>,
    pub(super) gamma_native: f64,
    pub(super) gamma_vm: f64,
    pub(super) native_instances: usize,
    pub(super) notes: Vec<String>,
    pub(super) wake_costs: Vec<WakeCosts>,
}

impl Prepared {
    /// A guest of this experiment, sharing the gleaner binary's directory when the guest
    /// would not see it (a checkout under /tmp).
    pub(super) fn spec(&self, exp: &Experiment, name: &str, job: String, kernel_args: &[String]) -> GuestSpec {
        let mut g = GuestSpec::new(name)
            .vcpus(exp.vcpus)
            .memory_mib(exp.memory_mib)
            .accel(self.acc)
            .pin(Some(self.pcpus.clone()))
            .cgroup(exp.guest_cgroup)
            .kernel_args(kernel_args.to_vec())
            .job(job);
        if let Some(dir) = self.gleaner.parent() {
            g = g.share(dir);
        }
        g
    }
}

pub(super) fn prepare(exp: &Experiment, opts: &RunOptions) -> anyhow::Result<Prepared> {
    if !opts.gleaner.is_file() {
        return Err(BadInput::new("--gleaner", opts.gleaner.display(), "an existing gleaner binary (cargo build --release)").into());
    }
    let gleaner = opts.gleaner.canonicalize().with_context(|| opts.gleaner.display().to_string())?;
    if !guest::shareable(&gleaner) {
        return Err(BadInput::new("--gleaner", gleaner.display(), "a path outside /dev, /proc and /sys").into());
    }
    let kernel = cache::find_kernel(&opts.cache_dir, opts.kernel.as_deref())?;
    let busybox = guest::find_busybox()?;
    let runs = opts.runs.unwrap_or_else(|| exp.runs_for(opts.quick));
    if runs == 0 {
        return Err(BadInput::new("--runs", runs, ">= 1").into());
    }
    let allowed: Vec<usize> = gleaner_measure::measure::allowed_cpus().into_iter().map(|c| c as usize).collect();
    let pcpus = match opts.pcpus.as_ref().or(exp.pcpus.as_ref()) {
        Some(list) => {
            let p: Vec<usize> = list.iter().map(|c| c as usize).collect();
            if let Some(c) = p.iter().find(|c| !allowed.contains(c)) {
                return Err(BadInput::new("pcpus", list, format!("CPUs this process may use (not {c})")).into());
            }
            p
        }
        None => allowed.iter().copied().take(exp.vcpus as usize).collect(),
    };
    let np = pcpus.len() as f64;
    let acc = accel::resolve(opts.accel, &kernel, &busybox)?;
    let mut notes = Vec::new();
    if acc == Accel::Tcg {
        notes.push("TCG (binary translation) was used: guest CPU time includes emulation, so d_eta_r and d_eta_t measure TCG+virtualization overhead, not KVM's. Compare modes with each other; host halt polling does not apply, and guests see no steal time.".into());
    }
    notes.push("CPU time stands in for cycles (no hardware counters): natively the workload's rusage, for guests the host-side CPU time of all QEMU threads during the step.".into());
    notes.push("vCPU halts are counted host-side as the vCPU threads' voluntary context switches (a halted vCPU's thread sleeps; a wait for QEMU's lock counts too).".into());
    let (native_instances, gamma_native, gamma_vm) = match exp.scenario {
        Scenario::Uc => (1, np, f64::from(exp.vcpus).min(np)),
        Scenario::Oc => (1, np, np / 2.0),
        Scenario::Oc2 => (2, np / 2.0, np / 2.0),
    };
    let halt_polls = if acc == Accel::Kvm { exp.halt_poll.clone() } else { vec![HaltPoll::NotApplicable] };
    let deadline = Instant::now() + Duration::from_secs(exp.timeout_for(opts.quick));
    Ok(Prepared {
        gleaner,
        kernel,
        busybox,
        runs,
        pcpus,
        acc,
        deadline,
        halt_polls,
        gamma_native,
        gamma_vm,
        native_instances,
        notes,
        wake_costs: Vec::new(),
    })
}

pub(super) fn left(d: Instant) -> String {
    let s = d.saturating_duration_since(Instant::now()).as_secs();
    format!("{}m{:02}s left", s / 60, s % 60)
}
