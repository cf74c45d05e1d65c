//! The idle policies a VM's tenant could pick for its idle vCPUs, and the agent's forms: one
//! type for every front end that runs or models them (`gleaner compare`, the lab, the
//! simulator), written and read as the names people type.
//!
//! ```text
//!  stock            the machine as found (these VMs: halt at once)
//!  haltpoll[:CAP]   the kernel's guest haltpoll, each vCPU's window adapting below CAP
//!                   (default the upstream 200 us; e.g. haltpoll:2400us, a vendor's tuning)
//!  poll             never halt: every vCPU's PM QoS resume latency "n/a" (the POLL state
//!                   only), or `idle=poll` on a guest's kernel command line
//!  yielders         a never-sleeping SCHED_IDLE sched_yield() thread per vCPU (naive retention)
//!  retention        gleaner run --no-consolidation
//!  consolidation    gleaner run --no-retention
//!  gleaner          gleaner run
//! ```

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The upstream `guest_halt_poll_ns`: the cap of `haltpoll` without one.
pub const UPSTREAM_HALTPOLL_CAP_NS: u64 = 200_000;

/// The largest haltpoll cap a policy may name, ns: the module parameter is an `unsigned int`.
pub const MAX_HALTPOLL_CAP_NS: u64 = u32::MAX as u64;

/// An idle policy (module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IdlePolicy {
    Stock,
    /// The guest haltpoll governor under `cap_ns` (`guest_halt_poll_ns`), the other
    /// parameters at their upstream defaults (grow 2 from 50 us, shrink 2).
    Haltpoll {
        cap_ns: u64,
    },
    Poll,
    Yielders,
    Retention,
    Consolidation,
    Gleaner,
}

/// Every policy by its plain name, in the order documents list them (`haltpoll` at the
/// upstream cap).
pub const ALL: [IdlePolicy; 7] = [
    IdlePolicy::Stock,
    IdlePolicy::HALTPOLL,
    IdlePolicy::Poll,
    IdlePolicy::Yielders,
    IdlePolicy::Retention,
    IdlePolicy::Consolidation,
    IdlePolicy::Gleaner,
];

impl IdlePolicy {
    /// The kernel's guest haltpoll at its upstream defaults.
    pub const HALTPOLL: IdlePolicy = IdlePolicy::Haltpoll { cap_ns: UPSTREAM_HALTPOLL_CAP_NS };

    /// The policy's family name (`haltpoll` whatever its cap).
    pub fn family(self) -> &'static str {
        match self {
            Self::Stock => "stock",
            Self::Haltpoll { .. } => "haltpoll",
            Self::Poll => "poll",
            Self::Yielders => "yielders",
            Self::Retention => "retention",
            Self::Consolidation => "consolidation",
            Self::Gleaner => "gleaner",
        }
    }

    /// The policy is a setting of the kernel's idle knobs (the haltpoll parameters, per-CPU
    /// resume latency limits), which whoever runs it turns and puts back.
    pub fn sets_idle_knobs(self) -> bool {
        matches!(self, Self::Haltpoll { .. } | Self::Poll)
    }

    /// The agent runs (`gleaner run` in one of its forms).
    pub fn is_agent(self) -> bool {
        matches!(self, Self::Retention | Self::Consolidation | Self::Gleaner)
    }

    /// The agent keeps idle vCPUs from halting.
    pub fn retention(self) -> bool {
        matches!(self, Self::Retention | Self::Gleaner)
    }

    /// The agent consolidates.
    pub fn consolidation(self) -> bool {
        matches!(self, Self::Consolidation | Self::Gleaner)
    }

    /// `gleaner run` arguments of the agent's forms; `None` for the others.
    pub fn agent_args(self) -> Option<&'static [&'static str]> {
        match self {
            Self::Retention => Some(&["--no-consolidation"]),
            Self::Consolidation => Some(&["--no-retention"]),
            Self::Gleaner => Some(&[]),
            _ => None,
        }
    }

    /// What `allowed` says in an error about a policy name.
    pub fn allowed() -> &'static str {
        "stock, haltpoll, haltpoll:CAP (e.g. haltpoll:2400us; 1 ns .. 4.29 s), poll, yielders (or naive), retention, consolidation, gleaner"
    }
}

impl fmt::Display for IdlePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Haltpoll { cap_ns } if cap_ns != UPSTREAM_HALTPOLL_CAP_NS => {
                if cap_ns.is_multiple_of(1000) {
                    write!(f, "haltpoll:{}us", cap_ns / 1000)
                } else {
                    write!(f, "haltpoll:{cap_ns}ns")
                }
            }
            p => f.write_str(p.family()),
        }
    }
}

/// Why a name is not a policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{name}' is not an idle policy; allowed: {}", IdlePolicy::allowed())]
pub struct UnknownPolicy {
    pub name: String,
}

impl FromStr for IdlePolicy {
    type Err = UnknownPolicy;

    /// A policy by name; `naive` (compare's old name), `idle-poll` (the lab's) and `idle_poll`
    /// (the simulator's) read as `yielders` and `poll`. A cap is a number with `ns`, `us` (the
    /// default) or `ms`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || UnknownPolicy { name: s.to_string() };
        Ok(match s {
            "stock" => Self::Stock,
            "haltpoll" => Self::HALTPOLL,
            "poll" | "idle-poll" | "idle_poll" => Self::Poll,
            "yielders" | "naive" => Self::Yielders,
            "retention" => Self::Retention,
            "consolidation" => Self::Consolidation,
            "gleaner" => Self::Gleaner,
            _ => {
                let cap = s.strip_prefix("haltpoll:").ok_or_else(bad)?;
                let (digits, unit) = match cap.find(|c: char| !c.is_ascii_digit()) {
                    Some(i) => cap.split_at(i),
                    None => (cap, "us"),
                };
                let scale = match unit {
                    "ns" => 1,
                    "us" => 1_000,
                    "ms" => 1_000_000,
                    _ => return Err(bad()),
                };
                let cap_ns = digits.parse::<u64>().ok().and_then(|n| n.checked_mul(scale)).ok_or_else(bad)?;
                if cap_ns == 0 || cap_ns > MAX_HALTPOLL_CAP_NS {
                    return Err(bad());
                }
                Self::Haltpoll { cap_ns }
            }
        })
    }
}

impl Serialize for IdlePolicy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for IdlePolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_old_names_read() {
        for p in ALL.into_iter().chain([IdlePolicy::Haltpoll { cap_ns: 2_400_000 }, IdlePolicy::Haltpoll { cap_ns: 1_500 }]) {
            assert_eq!(p.to_string().parse::<IdlePolicy>(), Ok(p), "{p}");
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(serde_json::from_str::<IdlePolicy>(&json).unwrap(), p);
        }
        assert_eq!(ALL.map(|p| p.to_string()), ["stock", "haltpoll", "poll", "yielders", "retention", "consolidation", "gleaner"]);
        assert_eq!("naive".parse(), Ok(IdlePolicy::Yielders));
        assert_eq!("idle-poll".parse(), Ok(IdlePolicy::Poll));
        assert_eq!("idle_poll".parse(), Ok(IdlePolicy::Poll));
        assert_eq!("haltpoll:200us".parse(), Ok(IdlePolicy::HALTPOLL));
        assert_eq!(IdlePolicy::Haltpoll { cap_ns: 200_000 }.to_string(), "haltpoll");
        assert_eq!("haltpoll:2400".parse(), Ok(IdlePolicy::Haltpoll { cap_ns: 2_400_000 }));
        assert_eq!("haltpoll:3ms".parse(), Ok(IdlePolicy::Haltpoll { cap_ns: 3_000_000 }));
        assert_eq!(IdlePolicy::Haltpoll { cap_ns: 2_400_000 }.to_string(), "haltpoll:2400us");
    }

    #[test]
    fn bad_names_and_caps_say_what_is_allowed() {
        for bad in ["", "foo", "haltpoll:", "haltpoll:0us", "haltpoll:12s", "haltpoll:-1", "haltpoll:99999999ms", "Stock"] {
            let e = bad.parse::<IdlePolicy>().unwrap_err();
            assert_eq!(e.name, bad);
            assert!(e.to_string().contains("haltpoll:CAP"), "{e}");
        }
        assert!(serde_json::from_str::<IdlePolicy>("\"nope\"").is_err());
    }

    #[test]
    fn the_agent_forms_say_what_they_run() {
        assert_eq!(IdlePolicy::Retention.agent_args(), Some(&["--no-consolidation"][..]));
        assert!(IdlePolicy::Gleaner.retention() && IdlePolicy::Gleaner.consolidation());
        assert!(!IdlePolicy::Poll.is_agent() && IdlePolicy::Poll.agent_args().is_none());
        assert!(IdlePolicy::Consolidation.consolidation() && !IdlePolicy::Consolidation.retention());
    }
}
