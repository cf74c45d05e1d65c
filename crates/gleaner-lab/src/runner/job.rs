//! The guests' job scripts (setup steps, each mode's command, the co-runner's loop) and the step names they report under.

use std::path::Path;

use gleaner_policy::IdlePolicy;
use gleaner_qemu::guest::shell_quote;
use gleaner_qemu::session::StepResult;

use crate::experiment::Mode;

/// Where the agent policies write their events inside the guest (sent back as an attachment).
pub const GUEST_EVENTS: &str = "/run/gleaner-lab/events.jsonl";

pub(super) fn cmd_line(gleaner: &Path, args: &[String]) -> String {
    std::iter::once(gleaner.display().to_string()).chain(args.iter().cloned()).map(|a| shell_quote(&a)).collect::<Vec<_>>().join(" ")
}

/// The shell command of a mode: the workload stock, under naive yielders, or under the agent.
pub fn mode_command(gleaner: &Path, workload: &[String], mode: &Mode) -> String {
    let wrap = |prefix: &[&str]| {
        let mut a: Vec<String> = prefix.iter().map(|s| (*s).to_string()).collect();
        a.push(gleaner.display().to_string());
        a.extend(workload.iter().cloned());
        cmd_line(gleaner, &a)
    };
    match (mode.policy(), mode.agent_args()) {
        (IdlePolicy::Yielders, _) => wrap(&["bench", "yielders", "--"]),
        (_, Some(agent)) => {
            let mut a = vec!["run".to_string()];
            a.extend(agent);
            a.extend(["--events".to_string(), GUEST_EVENTS.to_string(), "--".to_string(), gleaner.display().to_string()]);
            a.extend(workload.iter().cloned());
            cmd_line(gleaner, &a)
        }
        (_, None) => cmd_line(gleaner, workload),
    }
}

/// A setup step of a guest's job (named `setup.NAME`): sizing and provenance, not measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    /// The guest's compute rate (the sizing guest).
    Rate,
    /// Table 2's wakeup latencies.
    Wakeup,
    /// One of the sizing guest's synchronization runs.
    Sync(u32),
    /// The agent's calibration at boot.
    Calibrate,
    /// Which cpuidle driver the guest runs.
    Cpuidle,
}

/// What a step of a guest's job is, from its name. The job's shell carries names; the host
/// writes them with [`StepKind::name`] and reads them back with [`StepKind::parse`] only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepKind {
    Setup(Setup),
    /// The co-runner's `n`-th iteration (`co.N`).
    Co(u32),
    /// A measured run, `MODE.REP`.
    Measured {
        mode: String,
        rep: u32,
    },
    /// Anything else (a job the lab did not write).
    Other(String),
}

const SETUP_PREFIX: &str = "setup.";
const CO_PREFIX: &str = "co.";

impl StepKind {
    pub fn name(&self) -> String {
        match self {
            StepKind::Setup(s) => {
                let n = match s {
                    Setup::Rate => "rate".to_string(),
                    Setup::Wakeup => "wakeup".into(),
                    Setup::Sync(i) => format!("sync{i}"),
                    Setup::Calibrate => "calibrate".into(),
                    Setup::Cpuidle => "cpuidle".into(),
                };
                format!("{SETUP_PREFIX}{n}")
            }
            StepKind::Co(n) => format!("{CO_PREFIX}{n}"),
            StepKind::Measured { mode, rep } => format!("{mode}.{rep}"),
            StepKind::Other(s) => s.clone(),
        }
    }

    pub fn parse(name: &str) -> StepKind {
        if let Some(n) = name.strip_prefix(SETUP_PREFIX) {
            // The names `name` writes, read back through it (one table: its match).
            let fixed = [Setup::Rate, Setup::Wakeup, Setup::Calibrate, Setup::Cpuidle].into_iter();
            let setup = fixed
                .map(StepKind::Setup)
                .find(|k| k.name() == name)
                .or_else(|| n.strip_prefix("sync").and_then(|i| i.parse().ok()).map(|i| StepKind::Setup(Setup::Sync(i))));
            return setup.unwrap_or_else(|| StepKind::Other(name.into()));
        }
        if let Some(n) = name.strip_prefix(CO_PREFIX).and_then(|n| n.parse().ok()) {
            return StepKind::Co(n);
        }
        match name.rsplit_once('.').and_then(|(m, r)| Some((m, r.parse().ok()?))) {
            Some((mode, rep)) if !mode.is_empty() => StepKind::Measured { mode: mode.into(), rep },
            _ => StepKind::Other(name.into()),
        }
    }

    pub fn is_setup(&self) -> bool {
        matches!(self, StepKind::Setup(_))
    }
}

/// What a step of the guest fixture's is, to the lab.
pub trait StepKindOf {
    /// [`StepKind::parse`] of the step's name.
    fn kind(&self) -> StepKind;
}

impl StepKindOf for StepResult {
    fn kind(&self) -> StepKind {
        StepKind::parse(&self.step)
    }
}

/// `step NAME CMD` of a job.
pub(super) fn step_line(kind: &StepKind, cmd: &str) -> String {
    format!("step {} {cmd}\n", kind.name())
}

/// A measured guest's job for one boot: setup steps, then for each rep every mode once, in an
/// order rotated by the rep (`rep` 1: m1 m2 m3, rep 2: m2 m3 m1, ...), so no mode always
/// runs first after boot or right after another.
pub fn guest_job(modes: &[&Mode], reps: &[u32], gleaner: &Path, workload: &[String], wakeup: bool) -> String {
    let mut s = String::new();
    if wakeup {
        s.push_str(&step_line(&StepKind::Setup(Setup::Wakeup), &cmd_line(gleaner, &wakeup_args())));
    }
    if modes.iter().any(|m| m.agent_args().is_some()) {
        s.push_str(&step_line(&StepKind::Setup(Setup::Calibrate), &cmd_line(gleaner, &["calibrate".into(), "--json".into()])));
    }
    if modes.iter().any(|m| matches!(m.policy(), IdlePolicy::Haltpoll { .. })) {
        // Runs that would silently measure stock are not worth their time: stop here when the
        // guest's haltpoll cpuidle driver did not register (the lab reports them as not run).
        s.push_str(&step_line(&StepKind::Setup(Setup::Cpuidle), &format!("cat {CPUIDLE_DRIVER}")));
        s.push_str(&format!("[ \"$(cat {CPUIDLE_DRIVER})\" = haltpoll ] || exit 0\n"));
    }
    for &rep in reps {
        let n = modes.len();
        for i in 0..n {
            let m = modes[(i + rep as usize - 1) % n];
            let name = StepKind::Measured { mode: m.name.clone(), rep }.name();
            s.push_str(&format!("step {name} {}\n", mode_command(gleaner, workload, m)));
            if m.agent_args().is_some() {
                s.push_str(&format!("attach {name} events {GUEST_EVENTS}\n"));
            }
        }
    }
    s
}

const CPUIDLE_DRIVER: &str = "/sys/devices/system/cpu/cpuidle/current_driver";

/// The wakeup measurement of the lab's setup steps: Table 2 settings A, B, C, 300 rounds each
/// 500 us apart (about 1 s natively; a few seconds under TCG next to a co-runner).
pub(super) fn wakeup_args() -> Vec<String> {
    ["bench", "wakeup", "--setting", "A,B,C", "--rounds", "300", "--period-us", "500", "--json"].iter().map(|s| (*s).to_string()).collect()
}

/// The co-runner guest's job: the co-runner in a loop until the guest is killed.
pub fn co_runner_job(args: &[String], gleaner: &Path) -> String {
    // The iteration's number comes from the shell: `co.$i` is `StepKind::Co(i)`'s name.
    format!("i=0\nwhile :; do i=$((i+1)); step {CO_PREFIX}$i {}; done\n", cmd_line(gleaner, args))
}
