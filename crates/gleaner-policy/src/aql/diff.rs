//! What changes between two plans: the actuator applies only this.

use serde::{Deserialize, Serialize};

use super::cluster::{Plan, Pool};
use super::VcpuId;

/// A pool present in both plans whose pCPUs or quantum changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolChange {
    pub name: String,
    pub old_pcpus: Vec<u32>,
    pub new_pcpus: Vec<u32>,
    pub old_quantum_ns: u64,
    pub new_quantum_ns: u64,
}

/// A vCPU whose pool or quantum changes (`None`: not in that plan).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuMove {
    pub vcpu: VcpuId,
    pub from: Option<String>,
    pub to: Option<String>,
    pub old_quantum_ns: Option<u64>,
    pub new_quantum_ns: Option<u64>,
}

/// Differences from an old plan to a new one. Pools are matched by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanDiff {
    pub pools_added: Vec<Pool>,
    pub pools_removed: Vec<String>,
    pub pools_changed: Vec<PoolChange>,
    pub moves: Vec<VcpuMove>,
}

impl PlanDiff {
    /// Nothing to do.
    pub fn is_empty(&self) -> bool {
        self.pools_added.is_empty() && self.pools_removed.is_empty() && self.pools_changed.is_empty() && self.moves.is_empty()
    }
}

impl Plan {
    /// What must change to go from `old` to `self`.
    pub fn diff(&self, old: &Plan) -> PlanDiff {
        let mut d = PlanDiff::default();
        for p in &self.pools {
            match old.pool(&p.name) {
                None => d.pools_added.push(p.clone()),
                Some(o) if o.pcpus != p.pcpus || o.quantum_ns != p.quantum_ns => d.pools_changed.push(PoolChange {
                    name: p.name.clone(),
                    old_pcpus: o.pcpus.clone(),
                    new_pcpus: p.pcpus.clone(),
                    old_quantum_ns: o.quantum_ns,
                    new_quantum_ns: p.quantum_ns,
                }),
                Some(_) => {}
            }
        }
        for o in &old.pools {
            if self.pool(&o.name).is_none() {
                d.pools_removed.push(o.name.clone());
            }
        }
        let mut ids: Vec<VcpuId> = self.assignment.iter().chain(old.assignment.iter()).map(|a| a.vcpu).collect();
        ids.sort_unstable();
        ids.dedup();
        for id in ids {
            let (n, o) = (self.pool_of(&id), old.pool_of(&id));
            let (nn, on) = (n.map(|p| p.name.clone()), o.map(|p| p.name.clone()));
            let (nq, oq) = (n.map(|p| p.quantum_ns), o.map(|p| p.quantum_ns));
            if nn != on || nq != oq {
                d.moves.push(VcpuMove { vcpu: id, from: on, to: nn, old_quantum_ns: oq, new_quantum_ns: nq });
            }
        }
        d
    }
}
