//! Experiment files (TOML) and the built-in experiments `uc`, `oc`, `oc2`
//! (`crates/gleaner-lab/experiments/*.toml`, compiled in).
//!
//! Commands are argument lists for the `gleaner` binary the guest runs (the host's own,
//! shared over 9p); a mode with `agent = [...]` wraps the workload in
//! `gleaner run AGENT_ARGS -- gleaner WORKLOAD...` (the guest agent), a mode without runs it
//! stock.

use std::path::Path;

use gleaner_os::BadInput;
use serde::{Deserialize, Serialize};

use crate::guest::GuestCgroup;

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

/// A Gleaner setting inside the guest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mode {
    pub name: String,
    /// Arguments of `gleaner run` (e.g. `["--no-consolidation"]`); absent: stock run.
    #[serde(default)]
    pub agent: Option<Vec<String>>,
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
    pub pcpus: Option<String>,
    /// `gleaner` arguments of the measured workload (must print a bench JSON document).
    pub workload: Vec<String>,
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
    pub halt_poll: Vec<String>,
    #[serde(default)]
    pub guest_cgroup: GuestCgroup,
}

fn default_vcpus() -> u32 {
    2
}
fn default_memory() -> u32 {
    512
}
fn default_runs() -> u32 {
    5
}
fn default_quick_runs() -> u32 {
    2
}
fn default_timeout() -> u64 {
    1800
}
fn default_quick_timeout() -> u64 {
    540
}
fn default_halt_poll() -> Vec<String> {
    vec!["default".into(), "0".into()]
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
        let text = std::fs::read_to_string(p)
            .map_err(|e| BadInput::new("experiment", arg, format!("{names} or a readable .toml file ({e})")))?;
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
        for m in &self.modes {
            if m.name.is_empty() || !m.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                return bad("mode name", m.name.clone(), "letters, digits, - and _");
            }
        }
        if self.scenario == Scenario::Oc && self.co_runner.as_ref().is_none_or(Vec::is_empty) {
            return bad("co_runner", "missing".into(), "gleaner arguments of the co-runner (oc needs one)");
        }
        for h in &self.halt_poll {
            if h != "default" && h.parse::<u64>().is_err() {
                return bad("halt_poll", h.clone(), "\"default\" or a number of ns");
            }
        }
        if let Some(p) = &self.pcpus {
            if parse_cpu_list(p).is_none() {
                return bad("pcpus", p.clone(), "a CPU list like 0-1 or 0,2");
            }
        }
        Ok(())
    }

    pub fn runs_for(&self, quick: bool) -> u32 {
        if quick { self.quick_runs } else { self.runs }
    }

    pub fn timeout_for(&self, quick: bool) -> u64 {
        if quick { self.quick_timeout_s } else { self.timeout_s }
    }

    pub fn workload_args(&self, quick: bool) -> Vec<String> {
        let mut a = self.workload.clone();
        if quick {
            a.extend(self.quick_args.iter().cloned());
        }
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

/// Parses a kernel CPU list (`0-3,5`).
pub fn parse_cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.trim().split(',') {
        let part = part.trim();
        if let Some((a, b)) = part.split_once('-') {
            let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
            if a > b {
                return None;
            }
            out.extend(a..=b);
        } else {
            out.push(part.parse().ok()?);
        }
    }
    out.sort_unstable();
    out.dedup();
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_parse() {
        for (name, _) in BUILTIN {
            let e = Experiment::load(name).unwrap();
            assert_eq!(&e.name, name);
            assert!(e.modes.iter().any(|m| m.agent.is_none()), "{name} has a stock mode");
            assert!(e.modes.iter().any(|m| m.agent.is_some()), "{name} has a Gleaner mode");
        }
        let oc = Experiment::load("oc").unwrap();
        assert_eq!(oc.scenario, Scenario::Oc);
        assert_eq!(oc.co_runner_args(true).unwrap(), vec!["bench", "workload", "matmul", "--json", "--quick"]);
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
    fn empty_experiment_is_bad_input() {
        assert!(Experiment::parse("", "empty.toml").is_err());
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-1"), Some(vec![0, 1]));
        assert_eq!(parse_cpu_list("3,0-1"), Some(vec![0, 1, 3]));
        assert_eq!(parse_cpu_list("2-1"), None);
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("x"), None);
    }
}
