//! The typed keys of a lab row and summary line: where a run ran ([`Env`]), which instance
//! ([`Instance`]), what it measured ([`RowMode`]) and the host's halt-poll setting
//! ([`HaltPoll`]). Each is written as the text results documents, CSV files and reports show
//! (`vm`, `A`, `native-1`, `co-runner`, `default`, `0`, `n/a`) and read back from it once,
//! here.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Serializes through `Display` and deserializes through `FromStr`, as the names people read.
macro_rules! as_text {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

/// Where a run ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Env {
    /// On the host, no VM: the survey's baseline.
    #[default]
    Native,
    Vm,
}

impl fmt::Display for Env {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Native => "native",
            Self::Vm => "vm",
        })
    }
}

impl FromStr for Env {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "native" => Ok(Self::Native),
            "vm" => Ok(Self::Vm),
            _ => Err(format!("environment '{s}': allowed native, vm")),
        }
    }
}

/// Which instance of the workload (or of the co-runner) a run was.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Instance {
    /// A native instance, numbered from 1 (`native-1`).
    Native(u32),
    /// VM A: the measured guest.
    #[default]
    A,
    /// VM B: the co-runner's guest (oc), or the second measured guest (oc2).
    B,
}

impl fmt::Display for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Native(n) => write!(f, "native-{n}"),
            Self::A => f.write_str("A"),
            Self::B => f.write_str("B"),
        }
    }
}

impl FromStr for Instance {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "A" => Ok(Self::A),
            "B" => Ok(Self::B),
            _ => s
                .strip_prefix("native-")
                .and_then(|n| n.parse().ok())
                .map(Self::Native)
                .ok_or_else(|| format!("instance '{s}': allowed A, B, native-N")),
        }
    }
}

as_text!(Instance);

/// What a row measured: a mode of the experiment, a native baseline, or the co-runner.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RowMode {
    /// A native baseline run (`native`).
    #[default]
    Native,
    /// VM B's co-runner (`co-runner`).
    CoRunner,
    /// The experiment's mode of this name.
    Mode(String),
}

impl RowMode {
    /// The experiment's mode `name`.
    pub fn mode(name: &str) -> Self {
        Self::Mode(name.to_string())
    }
}

impl fmt::Display for RowMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Native => f.write_str("native"),
            Self::CoRunner => f.write_str("co-runner"),
            Self::Mode(name) => f.write_str(name),
        }
    }
}

impl FromStr for RowMode {
    type Err = std::convert::Infallible;
    /// `native` and `co-runner` are the lab's (experiments may not name a mode so); anything
    /// else is a mode's name.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "native" => Self::Native,
            "co-runner" => Self::CoRunner,
            name => Self::Mode(name.to_string()),
        })
    }
}

as_text!(RowMode);

/// The host's `kvm.halt_poll_ns` for a pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HaltPoll {
    /// The host's own setting, left as found (`default`).
    #[default]
    Default,
    /// Set to this many ns for the pass.
    Ns(u64),
    /// No host halt polling to set: TCG guests, native runs (`n/a`).
    NotApplicable,
}

impl HaltPoll {
    /// The host halt-polls halted vCPUs in this pass (a KVM pass not at 0).
    pub fn polls(self) -> bool {
        !matches!(self, Self::Ns(0) | Self::NotApplicable)
    }
}

impl fmt::Display for HaltPoll {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Default => f.write_str("default"),
            Self::Ns(ns) => write!(f, "{ns}"),
            Self::NotApplicable => f.write_str("n/a"),
        }
    }
}

impl FromStr for HaltPoll {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "default" => Ok(Self::Default),
            "n/a" => Ok(Self::NotApplicable),
            _ => s.parse().map(Self::Ns).map_err(|_| format!("halt poll '{s}': allowed \"default\", a number of ns, \"n/a\"")),
        }
    }
}

as_text!(HaltPoll);

/// A row's idle policy as results documents write it: its name, empty for rows that run no
/// policy (native baselines, the co-runner). Use with `#[serde(default, with = "...")]`.
pub mod policy_or_empty {
    use gleaner_policy::IdlePolicy;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(p: &Option<IdlePolicy>, s: S) -> Result<S::Ok, S::Error> {
        match p {
            Some(p) => s.collect_str(p),
            None => s.serialize_str(""),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IdlePolicy>, D::Error> {
        match Option::<String>::deserialize(d)?.as_deref() {
            None | Some("") => Ok(None),
            Some(name) => name.parse().map(Some).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_read_what_they_write() {
        for i in [Instance::Native(2), Instance::A, Instance::B] {
            assert_eq!(i.to_string().parse::<Instance>(), Ok(i));
        }
        for m in [RowMode::Native, RowMode::CoRunner, RowMode::mode("gleaner")] {
            assert_eq!(m.to_string().parse::<RowMode>().unwrap(), m);
        }
        for h in [HaltPoll::Default, HaltPoll::Ns(0), HaltPoll::Ns(200_000), HaltPoll::NotApplicable] {
            assert_eq!(serde_json::from_str::<HaltPoll>(&serde_json::to_string(&h).unwrap()).unwrap(), h);
        }
        assert_eq!(serde_json::to_string(&(Env::Vm, Instance::Native(1), HaltPoll::NotApplicable)).unwrap(), r#"["vm","native-1","n/a"]"#);
        assert!("native-x".parse::<Instance>().is_err() && "C".parse::<Instance>().is_err());
        assert!("-1".parse::<HaltPoll>().unwrap_err().contains("default"));
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct P(#[serde(default, with = "policy_or_empty")] Option<gleaner_policy::IdlePolicy>);
        assert_eq!(serde_json::to_string(&P(None)).unwrap(), r#""""#);
        assert_eq!(serde_json::from_str::<P>(r#""idle-poll""#).unwrap(), P(Some(gleaner_policy::IdlePolicy::Poll)));
        let e = serde_json::from_str::<P>(r#""magic""#).unwrap_err().to_string();
        assert!(e.contains("magic") && e.contains("haltpoll:CAP"), "{e}");
        assert!(!HaltPoll::Ns(0).polls() && !HaltPoll::NotApplicable.polls() && HaltPoll::Default.polls());
    }
}
