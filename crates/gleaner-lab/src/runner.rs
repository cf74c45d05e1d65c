//! Runs an experiment: native baseline runs on the host, then the guests of the scenario
//! (for each host halt-poll setting under KVM), with Gleaner modes interleaved run by run
//! inside the measured guest; collects rows and writes results and the report.
//!
//! ```text
//!  uc : native x R          | VM A: off.1 on.1 off.2 on.2 ...
//!  oc : native x R          | VM B: co.1 co.2 co.3 ... (loop, started first)
//!                           | VM A: off.1 on.1 off.2 on.2 ...  (started once B runs)
//!  oc2: native pair x R     | VM A and VM B: off.1 on.1 ... (both at once)
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use gleaner_os::BadInput;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::accel::{self, shell_quote};
use crate::cache::{self, KernelMeta};
use crate::experiment::{parse_cpu_list, Experiment, Scenario};
use crate::guest::{self, Accel, GuestSpec, LabError};
use crate::knobs::HaltPollGuard;
use crate::native::NativeProc;
use crate::qmp;
use crate::results::{self, parse_bench_output, Row, SummaryRow};
use crate::session::Session;

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub out: PathBuf,
    pub quick: bool,
    /// The gleaner binary run natively and inside the guests.
    pub gleaner: PathBuf,
    /// auto, kvm or tcg.
    pub accel: String,
    pub kernel: Option<String>,
    pub cache_dir: PathBuf,
    /// Overrides the experiment's pCPU list.
    pub pcpus: Option<String>,
    /// Overrides the number of runs per mode.
    pub runs: Option<u32>,
    /// Show a progress bar on stderr.
    pub progress: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct LabResults {
    pub experiment: Experiment,
    pub quick: bool,
    pub accel: Accel,
    pub kernel: KernelMeta,
    pub qemu_version: String,
    pub host_kernel: String,
    pub gleaner: String,
    pub pcpus: Vec<usize>,
    pub runs_per_mode: u32,
    pub started_unix_s: u64,
    pub duration_s: f64,
    /// Seconds from QEMU start to the guest's init reporting READY, per guest and pass.
    pub boot_s: BTreeMap<String, f64>,
    pub rows: Vec<Row>,
    pub summary: Vec<SummaryRow>,
    /// QMP `query-stats` per guest and pass (KVM only).
    pub kvm_stats: BTreeMap<String, Vec<(String, f64)>>,
    pub notes: Vec<String>,
}

fn cmd_line(gleaner: &Path, args: &[String]) -> String {
    std::iter::once(gleaner.display().to_string())
        .chain(args.iter().cloned())
        .map(|a| shell_quote(&a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The shell command of a mode: stock, or wrapped in the guest agent.
pub fn mode_command(gleaner: &Path, workload: &[String], agent: Option<&[String]>) -> String {
    match agent {
        None => cmd_line(gleaner, workload),
        Some(a) => {
            let mut args = vec!["run".to_string()];
            args.extend(a.iter().cloned());
            args.push("--".into());
            args.push(gleaner.display().to_string());
            args.extend(workload.iter().cloned());
            cmd_line(gleaner, &args)
        }
    }
}

/// The agent's start-up decisions in a guest console, each distinct line with its count:
/// the calibrated retention timeout, or retention off and why. Numbers differ run to run, so
/// lines group by their text before the first parenthesis with digits left out; the first
/// line of each group is kept whole.
pub fn agent_decisions(console: &str) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for l in console.lines().map(str::trim) {
        let Some(rest) = l.strip_prefix("gleaner: ") else { continue };
        if !(rest.starts_with("retention off:") || rest.starts_with("calibrated retention timeout") || rest.starts_with("consolidation disabled:")) {
            continue;
        }
        let key = |t: &str| -> String { t.split(" (").next().unwrap_or(t).chars().filter(|c| !c.is_ascii_digit()).collect() };
        match out.iter_mut().find(|(k, _)| key(k) == key(rest)) {
            Some(e) => e.1 += 1,
            None => out.push((rest.to_string(), 1)),
        }
    }
    out
}

/// The measured guest's job: modes interleaved run by run (`off.1 on.1 off.2 on.2 ...`).
pub fn workload_job(exp: &Experiment, gleaner: &Path, quick: bool, runs: u32) -> String {
    workload_job_with(exp, &exp.workload_args(quick), gleaner, runs)
}

fn workload_job_with(exp: &Experiment, w: &[String], gleaner: &Path, runs: u32) -> String {
    let mut s = String::new();
    for rep in 1..=runs {
        for m in &exp.modes {
            s.push_str(&format!("step {}.{rep} {}\n", m.name, mode_command(gleaner, w, m.agent.as_deref())));
        }
    }
    s
}

/// `params.iters_per_us` of a bench JSON document.
pub fn calibrated_rate(stdout: &str) -> Option<f64> {
    let start = stdout.find('{')?;
    let v: serde_json::Value = serde_json::Deserializer::from_str(&stdout[start..]).into_iter().next()?.ok()?;
    v.get("params")?.get("iters_per_us")?.as_f64().filter(|r| *r > 0.0)
}

/// The co-runner guest's job: the co-runner in a loop until the guest is killed.
pub fn co_runner_job(args: &[String], gleaner: &Path) -> String {
    format!("i=0\nwhile :; do i=$((i+1)); step co.$i {}; done\n", cmd_line(gleaner, args))
}

fn allowed_cpus() -> Vec<usize> {
    nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .map(|set| (0..nix::sched::CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect())
        .unwrap_or_else(|_| vec![0])
}

fn qemu_version() -> String {
    std::process::Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).lines().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn fill_from_bench(row: &mut Row, stdout: &str) {
    match parse_bench_output(stdout) {
        Ok(runs) => {
            let r = &runs[0];
            row.wall_ns = r.wall_ns;
            row.cpu_ns = r.user_ns + r.sys_ns;
            row.vcsw = r.vcsw;
            row.nivcsw = r.nivcsw;
            row.idle_entries = r.idle_entries;
            row.steal_ns = r.steal_ns;
            row.items = r.items;
            row.throughput = r.throughput;
        }
        Err(e) => {
            let head: String = stdout.chars().take(200).collect();
            row.error = Some(format!("{e}; output: {head}"));
        }
    }
}

/// Runs `exp` and writes results and the report into `opts.out`.
pub fn run_experiment(exp: &Experiment, opts: &RunOptions) -> anyhow::Result<LabResults> {
    let t0 = Instant::now();
    let started_unix_s = now_unix();
    if !opts.gleaner.is_file() {
        return Err(BadInput::new("--gleaner", opts.gleaner.display(), "an existing gleaner binary (cargo build --release)").into());
    }
    let gleaner = opts.gleaner.canonicalize().with_context(|| opts.gleaner.display().to_string())?;
    if !guest::visible_in_guest(&gleaner) {
        return Err(BadInput::new("--gleaner", gleaner.display(), format!("a path outside {} (the guest mounts its own filesystems there)", guest::GUEST_HIDDEN.join(", "))).into());
    }
    let kernel = cache::find_kernel(&opts.cache_dir, opts.kernel.as_deref())?;
    let busybox = guest::find_busybox()?;
    let runs = opts.runs.unwrap_or_else(|| exp.runs_for(opts.quick));
    let allowed = allowed_cpus();
    let pcpus = match opts.pcpus.as_deref().or(exp.pcpus.as_deref()) {
        Some(list) => {
            let p = parse_cpu_list(list).ok_or_else(|| BadInput::new("pcpus", list, "a CPU list like 0-1"))?;
            if let Some(c) = p.iter().find(|c| !allowed.contains(c)) {
                return Err(BadInput::new("pcpus", list, format!("CPUs this process may use (not {c})")).into());
            }
            p
        }
        None => allowed.iter().copied().take(exp.vcpus as usize).collect(),
    };
    let np = pcpus.len() as f64;
    let deadline = t0 + Duration::from_secs(exp.timeout_for(opts.quick));
    let mut notes = Vec::new();
    let acc = accel::resolve(&opts.accel, &kernel, &busybox)?;
    if acc == Accel::Tcg {
        notes.push("TCG (binary translation) was used: guest CPU time includes emulation, so d_eta_r and d_eta_t measure TCG+virtualization overhead, not KVM's. Compare Gleaner modes with each other; host halt polling does not apply.".into());
    }
    notes.push("CPU time stands in for cycles (no hardware counters): natively the workload's rusage, for guests the host-side CPU time of all QEMU threads during the step.".into());

    let (n_inst, gamma_native, gamma_vm) = match exp.scenario {
        Scenario::Uc => (1, np, f64::from(exp.vcpus).min(np)),
        Scenario::Oc => (1, np, np / 2.0),
        Scenario::Oc2 => (2, np / 2.0, np / 2.0),
    };
    let halt_polls: Vec<String> = if acc == Accel::Kvm { exp.halt_poll.clone() } else { vec!["n/a".into()] };
    let vm_steps = runs as usize * exp.modes.len() * if exp.scenario == Scenario::Oc2 { 2 } else { 1 } * halt_polls.len();
    let total = runs as usize + vm_steps;
    let pb = if opts.progress { ProgressBar::new(total as u64) } else { ProgressBar::hidden() };
    pb.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:25}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let left = |d: Instant| {
        let s = d.saturating_duration_since(Instant::now()).as_secs();
        format!("{}m{:02}s left", s / 60, s % 60)
    };

    // --- Calibration: fix the amount of compute per item across native and guest runs ---
    let mut wargs = exp.workload_args(opts.quick);
    if wargs.first().is_some_and(|a| a == "bench") && !wargs.iter().any(|a| a == "--iters-per-us") {
        pb.set_message(format!("{}: calibrating the compute rate natively", exp.name));
        let p = NativeProc::spawn(&gleaner, &wargs, &pcpus)?;
        let (_, out, _) = p.wait(deadline, "native calibration")?;
        match calibrated_rate(&out) {
            Some(rate) => {
                wargs.push("--iters-per-us".into());
                wargs.push(format!("{rate:.3}"));
                notes.push(format!("compute per item fixed for native and guest runs with --iters-per-us {rate:.3} (calibrated natively)"));
            }
            None => notes.push("could not read iters_per_us from a native run: each run calibrates its own compute rate".into()),
        }
    }

    // --- Native baseline ---
    let mut rows: Vec<Row> = Vec::new();
    for rep in 1..=runs {
        pb.set_message(format!("{}: native x{n_inst} run {rep}/{runs} ({})", exp.name, left(deadline)));
        let procs: Vec<NativeProc> = (0..n_inst)
            .map(|_| NativeProc::spawn(&gleaner, &wargs, &pcpus))
            .collect::<Result<_, _>>()?;
        for (i, p) in procs.into_iter().enumerate() {
            let (rc, out, wall) = p.wait(deadline, "native baseline")?;
            let mut row = Row { env: "native".into(), instance: format!("native-{}", i + 1), mode: "native".into(), halt_poll: "n/a".into(), rep, rc, gamma: gamma_native, end_s: wall.as_secs_f64(), ..Default::default() };
            fill_from_bench(&mut row, &out);
            if rc != 0 && row.error.is_none() {
                row.error = Some(format!("exit {rc}: {}", out.chars().take(300).collect::<String>()));
            }
            rows.push(row);
        }
        pb.inc(1);
    }

    // --- Guests ---
    let mut boot_s = BTreeMap::new();
    let mut kvm_stats = BTreeMap::new();
    let a_job = workload_job_with(exp, &wargs, &gleaner, runs);
    let base_spec = |name: &str, job: String| {
        GuestSpec::new(name).vcpus(exp.vcpus).memory_mib(exp.memory_mib).accel(acc).pin(Some(pcpus.clone())).cgroup(exp.guest_cgroup).job(job)
    };
    for hp in &halt_polls {
        let _guard = match hp.parse::<u64>() {
            Ok(v) if acc == Accel::Kvm => Some(HaltPollGuard::set(Path::new("/sys"), v)?),
            _ => None,
        };
        let mut s = Session::new(kernel.clone(), busybox.clone());
        let epoch = Instant::now();
        let done_steps = |s: &Session| s.states.iter().map(|x| x.steps.iter().filter(|st| !st.0.step.starts_with("co.")).count()).sum::<usize>();
        let before = pb.position();
        let mut tick = |s: &Session| {
            let parts: Vec<String> = s
                .guests
                .iter()
                .zip(&s.states)
                .map(|(g, st)| {
                    let what = match (st.ready_at, st.current_step()) {
                        (None, _) => "booting".to_string(),
                        (Some(_), Some(c)) => c.to_string(),
                        (Some(_), None) => if st.done.is_some() { "done".into() } else { "ready".into() },
                    };
                    format!("{} {}", g.name.rsplit('-').next().unwrap_or(""), what)
                })
                .collect();
            pb.set_position(before + done_steps(s) as u64);
            pb.set_message(format!("{} [{acc}, halt_poll {hp}]: {} ({})", exp.name, parts.join(", "), left(deadline)));
        };
        let (a, b) = match exp.scenario {
            Scenario::Uc => {
                let a = s.start(&base_spec(&format!("lab-{}-A", exp.name), a_job.clone()))?;
                s.drive(deadline, "the workload's steps in VM A", &[a], &|s| s.states[0].done.is_some(), &mut tick)?;
                (a, None)
            }
            Scenario::Oc => {
                let co = exp.co_runner_args(opts.quick).unwrap_or_default();
                let b = s.start(&base_spec(&format!("lab-{}-B", exp.name), co_runner_job(&co, &gleaner)))?;
                s.drive(deadline, "the co-runner to start in VM B", &[b], &|s| s.states[0].current_step().is_some() || !s.states[0].steps.is_empty(), &mut tick)?;
                let a = s.start(&base_spec(&format!("lab-{}-A", exp.name), a_job.clone()))?;
                s.drive(deadline, "the workload's steps in VM A", &[a, b], &|s| s.states[a].done.is_some(), &mut tick)?;
                // Let the co-runner finish the iteration under way: an iteration that spans
                // A's whole last step would otherwise never be counted, and that step would
                // have no co-runner rate (seen with short steps under load). Best effort.
                if let Some(a_end) = s.states[a].steps.last().map(|x| x.2) {
                    let wait = deadline.min(Instant::now() + Duration::from_secs(30));
                    let ended_after = |s: &Session| s.states[b].steps.last().is_some_and(|x| x.2 >= a_end);
                    match s.drive(wait, "the co-runner's iteration in VM B", &[b], &ended_after, &mut tick) {
                        Ok(()) | Err(LabError::Timeout { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                (a, Some(b))
            }
            Scenario::Oc2 => {
                let a = s.start(&base_spec(&format!("lab-{}-A", exp.name), a_job.clone()))?;
                let b = s.start(&base_spec(&format!("lab-{}-B", exp.name), a_job.clone()))?;
                s.drive(deadline, "the workload's steps in VMs A and B", &[a, b], &|s| s.states.iter().all(|x| x.done.is_some()), &mut tick)?;
                (a, Some(b))
            }
        };
        if acc == Accel::Kvm {
            for g in &s.guests {
                let stats = qmp::Qmp::connect(&g.qmp_path(), Duration::from_secs(5))
                    .and_then(|mut q| q.execute("query-stats", Some(serde_json::json!({"target": "vcpu"}))))
                    .map(|v| qmp::flatten_stats(&v));
                match stats {
                    Ok(v) => {
                        kvm_stats.insert(format!("{}@{hp}", g.name), v);
                    }
                    Err(e) => notes.push(format!("query-stats on {}: {e}", g.name)),
                }
            }
        }
        s.kill_all();
        // What the agent decided inside each measured guest (retention on or off, and why):
        // the verdict depends on the guest's own wakeup costs, so the report must say it.
        for id in std::iter::once(a).chain(if exp.scenario == Scenario::Oc2 { b } else { None }) {
            for (line, n) in agent_decisions(&s.guests[id].console()) {
                notes.push(format!("{} (halt_poll {hp}), {n} run(s): {line}", s.guests[id].name));
            }
        }
        for id in std::iter::once(a).chain(b) {
            if let Some(bs) = s.boot_s(id) {
                boot_s.insert(format!("{}@{hp}", s.guests[id].name), bs);
            }
        }
        // Co-runner iterations on the session clock (oc).
        let co_iters: Vec<(f64, f64, u64)> = match (exp.scenario, b) {
            (Scenario::Oc, Some(b)) => s.states[b]
                .steps
                .iter()
                .filter(|(r, _, _)| r.rc == 0)
                .filter_map(|(r, bi, ei)| {
                    let items = parse_bench_output(&r.stdout).ok()?.first()?.items?;
                    Some(((*bi - epoch).as_secs_f64(), (*ei - epoch).as_secs_f64(), items))
                })
                .collect(),
            _ => Vec::new(),
        };
        for id in std::iter::once(a).chain(if exp.scenario == Scenario::Oc2 { b } else { None }) {
            let inst = if id == a { "A" } else { "B" };
            for (r, bi, ei) in &s.states[id].steps {
                let (mode, rep) = r.step.rsplit_once('.').unwrap_or((r.step.as_str(), "0"));
                let mut vcpus: Vec<(u32, u64)> = r.host_threads.iter().filter_map(|t| t.vcpu().map(|v| (v, t.run_ns))).collect();
                vcpus.sort_unstable();
                let (b_s, e_s) = ((*bi - epoch).as_secs_f64(), (*ei - epoch).as_secs_f64());
                let mut row = Row {
                    env: "vm".into(),
                    instance: inst.into(),
                    mode: mode.into(),
                    halt_poll: hp.clone(),
                    rep: rep.parse().unwrap_or(0),
                    rc: r.rc,
                    host_cpu_ns: Some(r.host_cpu_ns()),
                    host_vcpu_ns: vcpus.into_iter().map(|v| v.1).collect(),
                    begin_s: b_s,
                    end_s: e_s,
                    gamma: gamma_vm,
                    co_runner_rate: results::co_runner_rate(b_s, e_s, &co_iters),
                    ..Default::default()
                };
                fill_from_bench(&mut row, &r.stdout);
                rows.push(row);
            }
        }
        if let (Scenario::Oc, Some(b)) = (exp.scenario, b) {
            for (r, bi, ei) in &s.states[b].steps {
                let mut row = Row {
                    env: "vm".into(),
                    instance: "B".into(),
                    mode: "co-runner".into(),
                    halt_poll: hp.clone(),
                    rep: r.step.trim_start_matches("co.").parse().unwrap_or(0),
                    rc: r.rc,
                    host_cpu_ns: Some(r.host_cpu_ns()),
                    begin_s: (*bi - epoch).as_secs_f64(),
                    end_s: (*ei - epoch).as_secs_f64(),
                    gamma: gamma_vm,
                    ..Default::default()
                };
                fill_from_bench(&mut row, &r.stdout);
                rows.push(row);
            }
        }
    }
    pb.finish_and_clear();
    let stock = exp.modes.iter().find(|m| m.agent.is_none()).map_or("off".to_string(), |m| m.name.clone());
    let summary = results::summarize(&rows, &stock);
    let failed = rows.iter().filter(|r| !r.ok() && r.mode != "co-runner").count();
    if failed > 0 {
        notes.push(format!("{failed} run(s) failed or printed no bench JSON: see the error column of runs.csv"));
    }
    Ok(LabResults {
        experiment: exp.clone(),
        quick: opts.quick,
        accel: acc,
        kernel: kernel.meta.clone(),
        qemu_version: qemu_version(),
        host_kernel: nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default(),
        gleaner: gleaner.display().to_string(),
        pcpus,
        runs_per_mode: runs,
        started_unix_s,
        duration_s: t0.elapsed().as_secs_f64(),
        boot_s,
        rows,
        summary,
        kvm_stats,
        notes,
    })
}

/// Turns a lab error into the message the user sees (the typed error keeps its details).
pub fn is_interrupt(e: &anyhow::Error) -> bool {
    e.chain().any(|c| matches!(c.downcast_ref::<LabError>(), Some(LabError::Interrupted)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_decisions_are_grouped_and_counted() {
        let console = "[    1.2] random: crng init done\n\
            gleaner: retention off: the host polls halted vCPUs for at least the 30 us timeout (wakeup p50: 9 us busy vCPU)\n\
            @@LAB BEGIN on.1\n\
            gleaner: retention off: the host polls halted vCPUs for at least the 41 us timeout (wakeup p50: 8 us busy vCPU)\n\
            gleaner: calibrated retention timeout 120 us (wakeup p50: 50 us busy vCPU)\n\
            gleaner: something else\n";
        let d = agent_decisions(console);
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(d[0].0.contains("the 30 us timeout (wakeup p50: 9 us") && d[0].1 == 2, "{d:?}");
        assert!(d[1].0.starts_with("calibrated retention timeout 120 us") && d[1].1 == 1, "{d:?}");
        assert!(agent_decisions("").is_empty());
    }

    #[test]
    fn jobs_interleave_modes_and_wrap_the_agent() {
        let exp = Experiment::load("oc").unwrap();
        let g = Path::new("/work/main/target/release/gleaner");
        let job = workload_job(&exp, g, true, 2);
        let lines: Vec<&str> = job.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0], "step off.1 /work/main/target/release/gleaner bench workload pipeline --json --quick --items 6000");
        assert_eq!(
            lines[1],
            "step on.1 /work/main/target/release/gleaner run -- /work/main/target/release/gleaner bench workload pipeline --json --quick --items 6000"
        );
        assert!(lines[3].starts_with("step on.2 "));
        let co = co_runner_job(&exp.co_runner_args(true).unwrap(), g);
        assert!(co.contains("step co.$i /work/main/target/release/gleaner bench workload matmul --json --quick"));
    }

    #[test]
    fn calibration_rate_from_bench_json() {
        assert_eq!(calibrated_rate("{\"params\":{\"iters_per_us\":61.5},\"runs\":[]}"), Some(61.5));
        assert_eq!(calibrated_rate("{\"params\":{}}"), None);
        assert_eq!(calibrated_rate(""), None);
    }

    #[test]
    fn agent_flags_go_before_the_separator() {
        let c = mode_command(Path::new("/g"), &["bench".into()], Some(&["--no-retention".into()]));
        assert_eq!(c, "/g run --no-retention -- /g bench");
    }
}
