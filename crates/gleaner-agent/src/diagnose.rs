//! What `gleaner diagnose` needs from the agent: the machine's wake-cost curve (the stored
//! calibration record, or measured now with the idle knobs journaled, as `gleaner calibrate`
//! does) and, with `--pid`, a running workload's wakeups traced by the agent's eBPF tracer.
//! The report itself is `gleaner_bench::diagnose`'s; the binary joins the two (the bench
//! crate does not depend on the agent).

use std::time::{Duration, Instant};

use anyhow::Context;
use gleaner_os::bpf::{TracerConfig, WakeTracer};
use gleaner_os::procfs::Procfs;
use gleaner_os::sysfs::Sysfs;
use gleaner_os::BadInput;
use gleaner_policy::idle::{WakeCurve, WakeTrace};

use crate::config::AgentConfig;
use crate::{agent, cache, calibrate, default_run_dir};

/// The curve and where it came from (`calibrate`'s phrase), or why there is none.
/// `run_dir`: where the record lives (default: the agent's).
pub fn wake_curve(recalibrate: bool, run_dir: Option<&std::path::Path>) -> Result<(WakeCurve, String), String> {
    let run_dir = run_dir.map_or_else(default_run_dir, std::path::Path::to_path_buf);
    let cfg = AgentConfig { run_dir, recalibrate, ..AgentConfig::default() };
    let cpus = agent::managed_cpus(&cfg, &Sysfs::new()).map_err(|e| format!("{e:#}"))?;
    let got = cache::obtain(&cfg.cache_policy(), &cache::World::real(), &cpus, || calibrate::measure_journaled(&cfg.run_dir, &cpus));
    match got.results {
        Ok(r) => Ok((r.curve, got.source.describe())),
        Err(inc) => Err(format!("calibration incomplete: {}", inc.error)),
    }
}

/// Longest `--seconds` a trace may run.
pub const MAX_TRACE_S: f64 = 3600.0;

/// Traces the wakeups of process `pid` (its threads and its descendants' at the start) for
/// `seconds`, with the agent's eBPF tracer attached the whole time (root). `progress` is
/// called about once a second with the seconds elapsed.
pub fn trace_pid(pid: i32, seconds: f64, mut progress: impl FnMut(f64)) -> anyhow::Result<WakeTrace> {
    if !(seconds > 0.0 && seconds <= MAX_TRACE_S) {
        return Err(BadInput::new("--seconds", seconds, "a duration in seconds, more than 0 and at most 3600").into());
    }
    let procfs = Procfs::new();
    let pids = procfs.descendants(pid, true).ok().filter(|p| !p.is_empty());
    let Some(pids) = pids.filter(|_| pid > 0) else {
        return Err(BadInput::new("--pid", pid, "the PID of a running process").into());
    };
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!("diagnose --pid traces the scheduler with eBPF, which needs root");
    }
    let cfg = TracerConfig::detect(&Sysfs::new()).context("reading the CPUs and their idle states")?;
    let mut tracer = WakeTracer::load(&cfg).context("loading the wakeup tracer (eBPF)")?;
    tracer.set_managed(&pids).context("following the process")?;
    let before = tracer.read()?;
    tracer.attach().context("attaching the wakeup tracer")?;
    let t0 = Instant::now();
    let end = Duration::from_secs_f64(seconds);
    while t0.elapsed() < end {
        std::thread::sleep((end - t0.elapsed()).min(Duration::from_secs(1)));
        progress(t0.elapsed().as_secs_f64());
        if std::fs::metadata(format!("/proc/{pid}")).is_err() {
            break; // the process ended: what was traced stands
        }
    }
    tracer.detach();
    Ok(tracer.read()?.delta_since(&before))
}
