//! Experiment files (TOML) and the built-in experiments `uc`, `oc`, `oc2`
//! (`crates/gleaner-lab/experiments/*.toml`, compiled in).
//!
//! Commands are argument lists for the `gleaner` binary the guest runs (the host's own,
//! shared over 9p); a mode with `agent = [...]` wraps the workload in
//! `gleaner run AGENT_ARGS -- gleaner WORKLOAD...` (the guest agent), a mode without runs it
//! stock.

use std::path::Path;

use gleaner_os::cpuset::CpuSet;
use gleaner_os::BadInput;
use gleaner_policy::peer::UPSTREAM_HALTPOLL_CAP_NS;
use gleaner_policy::IdlePolicy;
use serde::{Deserialize, Serialize};

use crate::keys::HaltPoll;
use gleaner_qemu::guest::GuestCgroup;

/// The survey's scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// One VM alone; baseline: one native instance.
    Uc,
    /// VM A with the workload next to VM B with the co-runner; baseline: one native instance.
    Oc,
    /// Two VMs with the workload; baseline: two concurrent native instances.
    Oc2,
}

/// A policy named on the command line or in an experiment file.
pub fn parse_policy(s: &str) -> Result<IdlePolicy, BadInput> {
    s.parse().map_err(|_| BadInput::new("policy", s, IdlePolicy::allowed()))
}

/// Kernel command-line arguments a guest running `policy` boots with: `idle=poll` for
/// `poll` (the lab's guests have no POLL state to hold them in), the haltpoll driver forced on
/// (it loads only where the guest sees KVM's paravirtual CPUID leaves) with the policy's cap.
pub fn kernel_args(policy: IdlePolicy) -> Vec<String> {
    match policy {
        IdlePolicy::Poll => vec!["idle=poll".into()],
        IdlePolicy::Haltpoll { cap_ns } if cap_ns == UPSTREAM_HALTPOLL_CAP_NS => vec!["cpuidle_haltpoll.force=1".into()],
        IdlePolicy::Haltpoll { cap_ns } => vec!["cpuidle_haltpoll.force=1".into(), format!("haltpoll.guest_halt_poll_ns={cap_ns}")],
        _ => Vec::new(),
    }
}

/// One way of running the workload in the measured guest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mode {
    pub name: String,
    /// The policy; absent: `gleaner` when `agent` is given, else `stock`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<IdlePolicy>,
    /// Extra arguments of `gleaner run` (agent policies only), e.g. `["--period-ms", "100"]`.
    #[serde(default)]
    pub agent: Option<Vec<String>>,
}

impl Mode {
    pub fn stock(name: &str) -> Self {
        Self { name: name.into(), policy: Some(IdlePolicy::Stock), agent: None }
    }

    /// The mode of `policy`, named after it (a cap's `:` as `-`: `haltpoll-2400us`).
    pub fn of(policy: IdlePolicy) -> Self {
        Self { name: policy.to_string().replace(':', "-"), policy: Some(policy), agent: None }
    }

    /// The policy this mode runs.
    pub fn policy(&self) -> IdlePolicy {
        self.policy.unwrap_or(if self.agent.is_some() { IdlePolicy::Gleaner } else { IdlePolicy::Stock })
    }

    /// Every `gleaner run` argument of this mode (`None`: the agent does not run).
    pub fn agent_args(&self) -> Option<Vec<String>> {
        let base = self.policy().agent_args()?;
        let mut a: Vec<String> = base.iter().map(|s| (*s).to_string()).collect();
        a.extend(self.agent.iter().flatten().cloned());
        Some(a)
    }

    /// Kernel arguments of the boot this mode needs (modes with equal ones share a boot).
    pub fn kernel_args(&self) -> Vec<String> {
        kernel_args(self.policy())
    }
}

/// How much compute a workload item is, in the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compute {
    /// The same iterations as natively (`--iters-per-us` measured on the host): the same
    /// instructions everywhere. Under TCG the compute loop runs almost at native speed but the
    /// guest kernel's synchronization paths (futex, scheduler, IPIs) cost ~20x more CPU, so
    /// the guest run is far more synchronization-bound than the native one.
    #[default]
    Native,
    /// The same share of CPU in synchronization as natively: a sizing guest alone on the pCPUs
    /// measures the synchronization cost per item (the workload with `--work-us 0`) and the
    /// guest's compute rate, and guest runs compute `work_us` times the guest/native
    /// synchronization cost ratio (docs/lab.md).
    Balanced,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub scenario: Scenario,
    #[serde(default = "default_vcpus")]
    pub vcpus: u32,
    #[serde(default = "default_memory")]
    pub memory_mib: u32,
    /// Host CPUs for guests and native baselines (kernel list, e.g. `0-1`); default: the
    /// first `vcpus` CPUs this process may use.
    #[serde(default)]
    pub pcpus: Option<CpuSet>,
    /// `gleaner` arguments of the measured workload (must print a bench JSON document).
    pub workload: Vec<String>,
    /// Arguments added for full runs (e.g. the number of items).
    #[serde(default)]
    pub full_args: Vec<String>,
    /// Arguments added with `--quick`.
    #[serde(default)]
    pub quick_args: Vec<String>,
    /// `gleaner` arguments of the co-runner VM's loop (oc only).
    #[serde(default)]
    pub co_runner: Option<Vec<String>>,
    #[serde(default)]
    pub co_runner_quick_args: Vec<String>,
    #[serde(default = "default_runs")]
    pub runs: u32,
    #[serde(default = "default_quick_runs")]
    pub quick_runs: u32,
    #[serde(default = "default_timeout")]
    pub timeout_s: u64,
    #[serde(default = "default_quick_timeout")]
    pub quick_timeout_s: u64,
    pub modes: Vec<Mode>,
    /// Host `kvm.halt_poll_ns` values to run with under KVM ("default" keeps the host's).
    #[serde(default = "default_halt_poll")]
    pub halt_poll: Vec<HaltPoll>,
    #[serde(default)]
    pub guest_cgroup: GuestCgroup,
    /// Compute per item in the guest: `native` (same iterations) or `guest` (same
    /// microseconds of the guest's own clock).
    #[serde(default)]
    pub compute: Compute,
}

fn default_vcpus() -> u32 {
    2
}
fn default_memory() -> u32 {
    512
}
fn default_runs() -> u32 {
    7
}
fn default_quick_runs() -> u32 {
    5
}
fn default_timeout() -> u64 {
    1800
}
fn default_quick_timeout() -> u64 {
    540
}
fn default_halt_poll() -> Vec<HaltPoll> {
    vec![HaltPoll::Default, HaltPoll::Ns(0)]
}

/// The built-in experiments: (name, TOML text).
pub const BUILTIN: &[(&str, &str)] = &[
    ("uc", include_str!("../experiments/uc.toml")),
    ("oc", include_str!("../experiments/oc.toml")),
    ("oc2", include_str!("../experiments/oc2.toml")),
];

impl Experiment {
    pub fn parse(text: &str, origin: &str) -> Result<Self, BadInput> {
        let e: Experiment = toml::from_str(text)
            .map_err(|err| BadInput::new("experiment file", origin, format!("valid experiment TOML ({})", err.message())))?;
        e.validate(origin)?;
        Ok(e)
    }

    /// A built-in name or a path to a TOML file.
    pub fn load(arg: &str) -> Result<Self, BadInput> {
        if let Some((_, text)) = BUILTIN.iter().find(|(n, _)| *n == arg) {
            return Self::parse(text, arg);
        }
        let p = Path::new(arg);
        let names = BUILTIN.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ");
        let text =
            std::fs::read_to_string(p).map_err(|e| BadInput::new("experiment", arg, format!("{names} or a readable .toml file ({e})")))?;
        Self::parse(&text, arg)
    }

    fn validate(&self, origin: &str) -> Result<(), BadInput> {
        let bad = |what: &str, v: String, allowed: &str| Err(BadInput::new(format!("{what} in {origin}"), v, allowed));
        if !(1..=64).contains(&self.vcpus) {
            return bad("vcpus", self.vcpus.to_string(), "1..=64");
        }
        if !(128..=16384).contains(&self.memory_mib) {
            return bad("memory_mib", self.memory_mib.to_string(), "128..=16384");
        }
        if self.workload.is_empty() {
            return bad("workload", "[]".into(), "gleaner arguments, e.g. [\"bench\", \"workload\", \"pipeline\", \"--json\"]");
        }
        if self.runs == 0 || self.quick_runs == 0 {
            return bad("runs", format!("{}/{}", self.runs, self.quick_runs), ">= 1");
        }
        if self.modes.is_empty() {
            return bad("modes", "[]".into(), "at least one [[modes]] entry");
        }
        for (i, m) in self.modes.iter().enumerate() {
            if m.name.is_empty() || !m.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                return bad("mode name", m.name.clone(), "letters, digits, - and _");
            }
            if m.name == "native" || m.name == "co-runner" || m.name == "setup" {
                return bad("mode name", m.name.clone(), "a name other than native, co-runner and setup (used by the lab)");
            }
            if self.modes[..i].iter().any(|o| o.name == m.name) {
                return bad("mode name", m.name.clone(), "a name no other mode has");
            }
            if m.agent.is_some() && m.policy().agent_args().is_none() {
                return bad(
                    &format!("agent of mode {}", m.name),
                    format!("{:?}", m.agent),
                    &format!("no agent arguments: policy {} does not run the agent", m.policy()),
                );
            }
        }
        if !self.modes.iter().any(|m| m.policy() == IdlePolicy::Stock) {
            return bad(
                "modes",
                self.modes.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", "),
                "a stock mode (policy stock, or no agent): speedups are relative to it",
            );
        }
        if self.scenario == Scenario::Oc && self.co_runner.as_ref().is_none_or(Vec::is_empty) {
            return bad("co_runner", "missing".into(), "gleaner arguments of the co-runner (oc needs one)");
        }
        if self.halt_poll.contains(&HaltPoll::NotApplicable) {
            return bad("halt_poll", HaltPoll::NotApplicable.to_string(), "\"default\" or a number of ns");
        }
        if self.pcpus.as_ref().is_some_and(CpuSet::is_empty) {
            return bad("pcpus", String::new(), "a CPU list like 0-1 or 0,2");
        }
        Ok(())
    }

    /// The stock mode every speedup is relative to (the first one).
    pub fn stock_mode(&self) -> &Mode {
        self.modes.iter().find(|m| m.policy() == IdlePolicy::Stock).unwrap_or(&self.modes[0])
    }

    /// Modes grouped by the guest boot they need (same kernel arguments), in first-use order.
    pub fn boot_groups(&self) -> Vec<(Vec<String>, Vec<&Mode>)> {
        let mut out: Vec<(Vec<String>, Vec<&Mode>)> = Vec::new();
        for m in &self.modes {
            let k = m.kernel_args();
            match out.iter_mut().find(|(a, _)| *a == k) {
                Some((_, ms)) => ms.push(m),
                None => out.push((k, vec![m])),
            }
        }
        out
    }

    pub fn runs_for(&self, quick: bool) -> u32 {
        if quick {
            self.quick_runs
        } else {
            self.runs
        }
    }

    pub fn timeout_for(&self, quick: bool) -> u64 {
        if quick {
            self.quick_timeout_s
        } else {
            self.timeout_s
        }
    }

    pub fn workload_args(&self, quick: bool) -> Vec<String> {
        let mut a = self.workload.clone();
        a.extend(if quick { &self.quick_args } else { &self.full_args }.iter().cloned());
        a
    }

    pub fn co_runner_args(&self, quick: bool) -> Option<Vec<String>> {
        self.co_runner.as_ref().map(|c| {
            let mut a = c.clone();
            if quick {
                a.extend(self.co_runner_quick_args.iter().cloned());
            }
            a
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_parse() {
        for (name, _) in BUILTIN {
            let e = Experiment::load(name).unwrap();
            assert_eq!(&e.name, name);
            assert_eq!(e.stock_mode().policy(), IdlePolicy::Stock, "{name} has a stock mode");
            assert!(e.modes.iter().any(|m| m.policy() == IdlePolicy::Gleaner), "{name} has a Gleaner mode");
            assert_eq!((e.runs, e.quick_runs, e.compute), (7, 5, Compute::Balanced), "{name}: >= 7 full, >= 5 quick runs");
        }
        let oc = Experiment::load("oc").unwrap();
        assert_eq!(oc.scenario, Scenario::Oc);
        assert_eq!(oc.co_runner_args(true).unwrap(), vec!["bench", "workload", "matmul", "--json", "--quick"]);
        assert_eq!(oc.workload_args(false), vec!["bench", "workload", "pipeline", "--json", "--items", "8000"]);
    }

    #[test]
    fn malformed_experiments_are_bad_input() {
        assert!(Experiment::parse("name = 3", "x.toml").is_err());
        let no_co = "name='x'\nscenario='oc'\nworkload=['a']\n[[modes]]\nname='off'\n";
        let e = Experiment::parse(no_co, "x.toml").unwrap_err();
        assert!(e.to_string().contains("co_runner"), "{e}");
        let unknown = "name='x'\nscenario='uc'\nworkload=['a']\nbogus=1\n[[modes]]\nname='off'\n";
        assert!(Experiment::parse(unknown, "x.toml").is_err());
        assert!(Experiment::load("no-such-experiment").unwrap_err().to_string().contains("uc, oc, oc2"));
    }

    #[test]
    fn modes_are_checked_and_typed() {
        let base = "name='x'\nscenario='uc'\nworkload=['a']\n";
        // A mode with agent arguments and no policy means Gleaner.
        let e = Experiment::parse(&format!("{base}[[modes]]\nname='off'\n[[modes]]\nname='on'\nagent=['--no-retention']\n"), "x").unwrap();
        assert_eq!((e.modes[0].policy(), e.modes[1].policy()), (IdlePolicy::Stock, IdlePolicy::Gleaner));
        assert_eq!(e.modes[1].agent_args().unwrap(), ["--no-retention"]);
        let p = Experiment::parse(
            &format!("{base}[[modes]]\nname='s'\n[[modes]]\nname='c'\npolicy='consolidation'\nagent=['--period-ms','100']\n"),
            "x",
        )
        .unwrap();
        assert_eq!(p.modes[1].agent_args().unwrap(), ["--no-retention", "--period-ms", "100"]);
        let err = |t: &str| Experiment::parse(&format!("{base}{t}"), "x").unwrap_err().to_string();
        assert!(err("[[modes]]\nname='s'\n[[modes]]\nname='p'\npolicy='magic'\n").contains("magic"));
        assert!(err("[[modes]]\nname='s'\n[[modes]]\nname='s'\n").contains("no other mode"));
        assert!(err("[[modes]]\nname='g'\npolicy='gleaner'\n").contains("a stock mode"));
        assert!(err("[[modes]]\nname='s'\n[[modes]]\nname='y'\npolicy='yielders'\nagent=[]\n").contains("does not run the agent"));
        assert!(err("[[modes]]\nname='native'\n").contains("other than native"));
        assert_eq!(kernel_args(parse_policy("idle-poll").unwrap()), ["idle=poll"]);
        assert_eq!(kernel_args(IdlePolicy::HALTPOLL), ["cpuidle_haltpoll.force=1"]);
        assert_eq!(
            kernel_args(parse_policy("haltpoll:2400us").unwrap()),
            ["cpuidle_haltpoll.force=1", "haltpoll.guest_halt_poll_ns=2400000"]
        );
        assert_eq!(Mode::of(IdlePolicy::Haltpoll { cap_ns: 2_400_000 }).name, "haltpoll-2400us");
        assert!(parse_policy("x").unwrap_err().to_string().contains(IdlePolicy::allowed()));
    }

    #[test]
    fn empty_experiment_is_bad_input() {
        assert!(Experiment::parse("", "empty.toml").is_err());
    }

    #[test]
    fn cpu_lists_are_kernel_lists_and_a_bad_one_is_named_on_one_line() {
        let base = "name='x'\nscenario='uc'\nworkload=['a']\n[[modes]]\nname='off'\n";
        let e = Experiment::parse(&format!("pcpus='3,0-1'\n{base}"), "x.toml").unwrap();
        assert_eq!(e.pcpus.unwrap().to_vec(), [0, 1, 3]);
        for bad in ["2-1", "x", ""] {
            let err = Experiment::parse(&format!("pcpus='{bad}'\n{base}"), "x.toml").unwrap_err().to_string();
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(err.contains("x.toml") && err.contains("CPU list"), "{err}");
            if !bad.is_empty() {
                assert!(err.contains(&format!("'{bad}'")), "{err}");
            }
        }
    }
}
