//! Section 3.5: two-level clustering. Algorithm 1 spreads vCPUs over sockets (thrashing first,
//! a fair number per socket, VMs kept together); algorithm 2 groups a socket's vCPUs by
//! quantum-length compatibility (QLC) and gives each cluster whole pCPUs so every pCPU runs
//! about `k = vCPUs/pCPUs` vCPUs; the pCPU where a cluster does not fill its share is shared
//! with the next clusters' vCPUs in a *default* pool that runs with the default quantum.
//!
//! ```text
//!  all vCPUs --(alg. 1)--> trashing [LLCO, IOInt+, ConSpin+] ++ non-trashing [LoLCF.., rest]
//!                          socket s takes the next n_s (n_s ~ vCPUs * pCPUs(s) / pCPUs)
//!  socket  --(alg. 2)--> clusters by best quantum (1 ms: IOInt, ConSpin; 90 ms: LLCF; ...)
//!                        LoLCF/LLCO (agnostic) fill clusters up to whole pCPUs
//!                        pCPU p takes k vCPUs of the current cluster; if the cluster has
//!                        fewer left, p also takes vCPUs of the next clusters -> default pool
//! ```
//!
//! Deviations from the paper's pseudo-code, for cases it leaves open: a cluster with exactly
//! `k` vCPUs left takes the pCPU itself (line 14's `k < size` would send it to the default
//! pool with nothing borrowed); `k` need not be an integer (pCPUs get `floor(k)` or
//! `ceil(k)` vCPUs); pCPUs left without vCPUs (fewer vCPUs than pCPUs) join the pool with the
//! most vCPUs per pCPU; agnostic vCPUs left after balancing join the clusters in turn, one
//! pCPU's worth at a time, or form a default-quantum pool when the socket has no other vCPU.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::recognizer::Classification;
use super::{VcpuClass, VcpuId, VcpuType};

/// The best quantum per type (section 3.4); `None` = quantum agnostic (used for balancing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quanta {
    pub io_int_ns: u64,
    pub con_spin_ns: u64,
    pub llcf_ns: u64,
    pub lolcf_ns: Option<u64>,
    pub llco_ns: Option<u64>,
    /// The default quantum (Xen's 30 ms): default pools, CpuBurn and Unknown vCPUs.
    pub default_ns: u64,
}

/// A quantum outside what the EEVDF slice accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("quantum {name} = {value_ns} ns is outside 100 us ..= 100 ms (the EEVDF slice range)")]
pub struct QuantaError {
    pub name: &'static str,
    pub value_ns: u64,
}

impl Quanta {
    /// Smallest slice `sched_setattr` accepts for SCHED_OTHER (0.1 ms).
    pub const MIN_NS: u64 = 100_000;
    /// Largest slice `sched_setattr` accepts for SCHED_OTHER (100 ms).
    pub const MAX_NS: u64 = 100_000_000;

    /// The paper's calibration (Fig. 2): IOInt and ConSpin 1 ms, LLCF 90 ms, LoLCF and LLCO
    /// agnostic, default 30 ms.
    pub fn paper() -> Self {
        Self { io_int_ns: 1_000_000, con_spin_ns: 1_000_000, llcf_ns: 90_000_000, lolcf_ns: None, llco_ns: None, default_ns: 30_000_000 }
    }

    /// Every quantum within the EEVDF slice range.
    pub fn validate(&self) -> Result<(), QuantaError> {
        let check = |name, v: u64| {
            if (Self::MIN_NS..=Self::MAX_NS).contains(&v) {
                Ok(())
            } else {
                Err(QuantaError { name, value_ns: v })
            }
        };
        check("io_int_ns", self.io_int_ns)?;
        check("con_spin_ns", self.con_spin_ns)?;
        check("llcf_ns", self.llcf_ns)?;
        if let Some(v) = self.lolcf_ns {
            check("lolcf_ns", v)?;
        }
        if let Some(v) = self.llco_ns {
            check("llco_ns", v)?;
        }
        check("default_ns", self.default_ns)
    }

    /// The best quantum of a type; `None` when agnostic.
    pub fn for_type(&self, t: VcpuType) -> Option<u64> {
        match t {
            VcpuType::IoInt => Some(self.io_int_ns),
            VcpuType::ConSpin => Some(self.con_spin_ns),
            VcpuType::Llcf => Some(self.llcf_ns),
            VcpuType::Lolcf => self.lolcf_ns,
            VcpuType::Llco => self.llco_ns,
        }
    }

    /// The quantum a class is clustered by; `None` when agnostic. CpuBurn and Unknown vCPUs
    /// get the default quantum.
    pub fn for_class(&self, c: VcpuClass) -> Option<u64> {
        match c.vcpu_type() {
            Some(t) => self.for_type(t),
            None => Some(self.default_ns),
        }
    }
}

/// The pCPUs available to pools, per socket (reserved pCPUs already left out).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    pub sockets: Vec<Vec<u32>>,
}

impl Topology {
    /// `sockets` sockets of `per_socket` pCPUs numbered consecutively from 0.
    pub fn uniform(sockets: u32, per_socket: u32) -> Self {
        Self { sockets: (0..sockets).map(|s| (s * per_socket..(s + 1) * per_socket).collect()).collect() }
    }

    /// All pCPUs.
    pub fn pcpus(&self) -> usize {
        self.sockets.iter().map(Vec::len).sum()
    }
}

/// A vCPU as the clustering sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuInfo {
    pub id: VcpuId,
    pub class: VcpuClass,
    /// LLC disturber (LLCO, IOInt+, ConSpin+).
    pub trashing: bool,
}

impl VcpuInfo {
    pub fn new(id: VcpuId, class: VcpuClass, trashing: bool) -> Self {
        Self { id, class, trashing: trashing || class == VcpuClass::Llco }
    }

    pub fn from_classification(id: VcpuId, c: &Classification) -> Self {
        Self::new(id, c.class, c.trashing)
    }
}

/// Kind of pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    /// A cluster: its vCPUs share their best quantum (plus agnostic vCPUs for balance).
    Qlc,
    /// pCPUs shared by vCPUs of different clusters: the default quantum (alg. 2, line 22).
    Default,
}

/// A pCPU pool: a cpuset whose vCPU threads all run with `quantum_ns`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pool {
    /// Stable name: `s<socket>-<quantum>` or `s<socket>-default` (also the diff key).
    pub name: String,
    pub socket: usize,
    pub kind: PoolKind,
    pub quantum_ns: u64,
    pub pcpus: Vec<u32>,
    pub vcpus: Vec<VcpuId>,
}

/// Where one vCPU goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuAssignment {
    pub vcpu: VcpuId,
    pub class: VcpuClass,
    /// Index into [`Plan::pools`].
    pub pool: usize,
}

/// Pools and the vCPU -> pool assignment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub pools: Vec<Pool>,
    /// Sorted by vCPU.
    pub assignment: Vec<VcpuAssignment>,
}

/// A VM's CPU share under a plan.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct VmShare {
    pub vm: u64,
    pub vcpus: usize,
    /// Sum over its vCPUs of `pCPUs(pool) / vCPUs(pool)`, each capped at 1.
    pub pcpus: f64,
    /// What an ideal fair scheduler would give: `vcpus * min(1, pCPUs / vCPUs)`.
    pub fair: f64,
}

impl Plan {
    /// The pool of `id`.
    pub fn pool_of(&self, id: &VcpuId) -> Option<&Pool> {
        let i = self.assignment.binary_search_by(|a| a.vcpu.cmp(id)).ok()?;
        self.pools.get(self.assignment[i].pool)
    }

    /// The pool named `name`.
    pub fn pool(&self, name: &str) -> Option<&Pool> {
        self.pools.iter().find(|p| p.name == name)
    }

    /// Per-VM CPU share vs its fair share (section 3.5's fairness).
    pub fn vm_shares(&self) -> Vec<VmShare> {
        let total_v = self.assignment.len();
        let total_p: usize = self.pools.iter().map(|p| p.pcpus.len()).sum();
        let mut out: BTreeMap<u64, VmShare> = BTreeMap::new();
        for a in &self.assignment {
            let p = &self.pools[a.pool];
            let each = (p.pcpus.len() as f64 / p.vcpus.len() as f64).min(1.0);
            let fair = (total_p as f64 / total_v as f64).min(1.0);
            let e = out.entry(a.vcpu.vm).or_insert(VmShare { vm: a.vcpu.vm, vcpus: 0, pcpus: 0.0, fair: 0.0 });
            e.vcpus += 1;
            e.pcpus += each;
            e.fair += fair;
        }
        out.into_values().collect()
    }
}

/// Formats a quantum for pool names: `1ms`, `90ms`, `500us`.
pub(crate) fn quantum_label(ns: u64) -> String {
    if ns.is_multiple_of(1_000_000) {
        format!("{}ms", ns / 1_000_000)
    } else {
        format!("{}us", ns / 1_000)
    }
}

/// Splits `total` into parts proportional to `weights` (largest remainder, ties to the first).
fn proportional(total: usize, weights: &[usize]) -> Vec<usize> {
    let sum: usize = weights.iter().sum();
    if sum == 0 {
        return vec![0; weights.len()];
    }
    let mut parts: Vec<usize> = weights.iter().map(|w| total * w / sum).collect();
    let mut rem: Vec<(usize, usize)> = weights.iter().enumerate().map(|(i, w)| (total * w % sum, i)).collect();
    rem.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let missing = total - parts.iter().sum::<usize>();
    for &(_, i) in rem.iter().take(missing) {
        parts[i] += 1;
    }
    parts
}

/// Computes the plan: algorithm 1 over the sockets, algorithm 2 on each.
pub fn plan(vcpus: &[VcpuInfo], topo: &Topology, quanta: &Quanta) -> Plan {
    // Algorithm 1, line 3: vCPUs of a VM follow each other (VMs in order of first appearance).
    let mut vm_order: Vec<u64> = Vec::new();
    for v in vcpus {
        if !vm_order.contains(&v.id.vm) {
            vm_order.push(v.id.vm);
        }
    }
    let mut ordered: Vec<VcpuInfo> = Vec::with_capacity(vcpus.len());
    for vm in &vm_order {
        ordered.extend(vcpus.iter().filter(|v| v.id.vm == *vm));
    }
    // Lines 4-10: thrashing / non-trashing; line 11: LoLCF first among the non-trashing.
    let trashing: Vec<VcpuInfo> = ordered.iter().filter(|v| v.trashing).copied().collect();
    let mut non_trashing: Vec<VcpuInfo> = ordered.iter().filter(|v| !v.trashing).copied().collect();
    non_trashing.sort_by_key(|v| v.class != VcpuClass::Lolcf); // stable
                                                               // Lines 12-17: each socket takes its fair number, trashing first.
    let weights: Vec<usize> = topo.sockets.iter().map(Vec::len).collect();
    let per_socket = proportional(vcpus.len(), &weights);
    let mut queue: VecDeque<VcpuInfo> = trashing.into_iter().chain(non_trashing).collect();
    let mut plan = Plan::default();
    for (s, pcpus) in topo.sockets.iter().enumerate() {
        let take = per_socket[s].min(queue.len());
        let mine: Vec<VcpuInfo> = queue.drain(..take).collect();
        socket_plan(s, pcpus, &mine, quanta, &mut plan);
    }
    let mut assignment = Vec::new();
    for (i, p) in plan.pools.iter().enumerate() {
        for v in &p.vcpus {
            let class = vcpus.iter().find(|x| x.id == *v).map_or(VcpuClass::Unknown, |x| x.class);
            assignment.push(VcpuAssignment { vcpu: *v, class, pool: i });
        }
    }
    assignment.sort_by_key(|a| a.vcpu);
    plan.assignment = assignment;
    plan
}

/// Algorithm 2 on one socket; appends the socket's pools to `plan`.
fn socket_plan(socket: usize, pcpus: &[u32], vcpus: &[VcpuInfo], quanta: &Quanta, plan: &mut Plan) {
    if vcpus.is_empty() || pcpus.is_empty() {
        return;
    }
    let (mut clusters, mut agnostic) = clusters_by_quantum(vcpus, quanta);
    // Line 11: k vCPUs per pCPU; with a fractional k the first pCPUs take one more.
    let (nv, np) = (vcpus.len(), pcpus.len());
    let caps: Vec<usize> = (0..np).map(|i| nv / np + usize::from(i < nv % np)).collect();
    let pos = fill_to_boundaries(&mut clusters, &mut agnostic, &caps);
    spread_leftover(&mut clusters, agnostic, &caps, pos, quanta);
    let h = hand_out(pcpus, &caps, clusters);
    let mut pools = socket_pools(socket, h.pools, h.default, quanta);
    give_idle(&mut pools, h.idle);
    plan.pools.extend(pools);
}

/// Lines 2-7: the socket's vCPUs in clusters by best quantum, ascending; agnostic vCPUs set
/// aside (line 5).
fn clusters_by_quantum(vcpus: &[VcpuInfo], quanta: &Quanta) -> (BTreeMap<u64, Vec<VcpuId>>, VecDeque<VcpuId>) {
    let mut clusters: BTreeMap<u64, Vec<VcpuId>> = BTreeMap::new();
    let mut agnostic: VecDeque<VcpuId> = VecDeque::new();
    for v in vcpus {
        match quanta.for_class(v.class) {
            Some(q) => clusters.entry(q).or_default().push(v.id),
            None => agnostic.push_back(v.id),
        }
    }
    (clusters, agnostic)
}

/// Line 10: agnostic vCPUs fill each cluster up to a pCPU boundary (`caps`: vCPUs per pCPU);
/// returns the first pCPU the clusters leave.
fn fill_to_boundaries(clusters: &mut BTreeMap<u64, Vec<VcpuId>>, agnostic: &mut VecDeque<VcpuId>, caps: &[usize]) -> usize {
    let np = caps.len();
    let (mut pos, mut room) = (0usize, 0usize);
    for members in clusters.values_mut() {
        let mut m = members.len();
        let absorbed = room.min(m); // taken by the previous cluster's shared pCPU
        room -= absorbed;
        m -= absorbed;
        if m == 0 {
            continue;
        }
        let mut consumed = 0;
        while consumed < m && pos < np {
            consumed += caps[pos];
            pos += 1;
        }
        let deficit = consumed.saturating_sub(m);
        let fill = deficit.min(agnostic.len());
        members.extend(agnostic.drain(..fill));
        room = deficit - fill;
    }
    pos
}

/// Leftover agnostic vCPUs: one pCPU's worth at a time (from pCPU `pos` on) to the clusters in
/// turn, or a cluster of their own at the default quantum when there is none.
fn spread_leftover(
    clusters: &mut BTreeMap<u64, Vec<VcpuId>>,
    mut agnostic: VecDeque<VcpuId>,
    caps: &[usize],
    mut pos: usize,
    quanta: &Quanta,
) {
    if !agnostic.is_empty() {
        if clusters.is_empty() {
            clusters.insert(quanta.default_ns, agnostic.drain(..).collect());
        } else {
            let keys: Vec<u64> = clusters.keys().copied().collect();
            let mut turn = 0;
            while !agnostic.is_empty() {
                let chunk = caps.get(pos).copied().unwrap_or(1).max(1).min(agnostic.len());
                pos += 1;
                let c = clusters.get_mut(&keys[turn % keys.len()]).expect("key exists");
                c.extend(agnostic.drain(..chunk));
                turn += 1;
            }
        }
    }
}

/// What [`hand_out`] gave each pCPU of a socket.
struct HandOut {
    /// Per cluster (ascending quantum): the quantum, its pCPUs and vCPUs.
    pools: Vec<(u64, Vec<u32>, Vec<VcpuId>)>,
    /// The pCPUs shared by vCPUs of different clusters, and those vCPUs.
    default: (Vec<u32>, Vec<VcpuId>),
    /// The pCPUs left without vCPUs.
    idle: Vec<u32>,
}

/// Lines 12-30: hands out the pCPUs (`caps[j]` vCPUs to pCPU `j`) to the clusters in turn; a
/// pCPU whose vCPUs come from more than one cluster goes to the default pool.
fn hand_out(pcpus: &[u32], caps: &[usize], clusters: BTreeMap<u64, Vec<VcpuId>>) -> HandOut {
    let keys: Vec<u64> = clusters.keys().copied().collect();
    let mut left: Vec<VecDeque<VcpuId>> = clusters.into_values().map(VecDeque::from).collect();
    let n = left.len();
    let mut pool_pcpus: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut pool_vcpus: Vec<Vec<VcpuId>> = vec![Vec::new(); n];
    let (mut def_pcpus, mut def_vcpus) = (Vec::new(), Vec::new());
    let mut idle = Vec::new();
    let mut i = 0;
    for (j, &p) in pcpus.iter().enumerate() {
        let k = caps[j];
        while i < n && left[i].is_empty() {
            i += 1;
        }
        if k == 0 || i == n {
            idle.push(p);
            continue;
        }
        if left[i].len() >= k {
            pool_pcpus[i].push(p);
            pool_vcpus[i].extend(left[i].drain(..k));
            continue;
        }
        let mut s: Vec<VcpuId> = left[i].drain(..).collect();
        let mut borrowed = false;
        for next in left.iter_mut().skip(i + 1) {
            let want = k - s.len();
            if want == 0 {
                break;
            }
            let got = want.min(next.len());
            borrowed |= got > 0;
            s.extend(next.drain(..got));
        }
        if borrowed {
            def_pcpus.push(p);
            def_vcpus.extend(s);
        } else {
            pool_pcpus[i].push(p);
            pool_vcpus[i].extend(s);
        }
        i += 1;
    }
    let pools = keys.into_iter().zip(pool_pcpus).zip(pool_vcpus).map(|((q, p), v)| (q, p, v)).collect();
    HandOut { pools, default: (def_pcpus, def_vcpus), idle }
}

/// The socket's pools: one per cluster that got pCPUs, then the default pool if any pCPU is
/// shared.
fn socket_pools(
    socket: usize,
    clusters: Vec<(u64, Vec<u32>, Vec<VcpuId>)>,
    default: (Vec<u32>, Vec<VcpuId>),
    quanta: &Quanta,
) -> Vec<Pool> {
    let mut pools: Vec<Pool> = Vec::new();
    for (q, pcpus, vcpus) in clusters {
        if !pcpus.is_empty() {
            pools.push(Pool { name: format!("s{socket}-{}", quantum_label(q)), socket, kind: PoolKind::Qlc, quantum_ns: q, pcpus, vcpus });
        }
    }
    let (def_pcpus, def_vcpus) = default;
    if !def_pcpus.is_empty() {
        pools.push(Pool {
            name: format!("s{socket}-default"),
            socket,
            kind: PoolKind::Default,
            quantum_ns: quanta.default_ns,
            pcpus: def_pcpus,
            vcpus: def_vcpus,
        });
    }
    pools
}

/// pCPUs without vCPUs join the most loaded pool (work conserving, fairer).
fn give_idle(pools: &mut [Pool], idle: Vec<u32>) {
    for p in idle {
        if let Some(pool) = pools.iter_mut().max_by(|a, b| {
            let la = a.vcpus.len() as f64 / a.pcpus.len() as f64;
            let lb = b.vcpus.len() as f64 / b.pcpus.len() as f64;
            la.total_cmp(&lb).then(b.name.cmp(&a.name))
        }) {
            pool.pcpus.push(p);
            pool.pcpus.sort_unstable();
        }
    }
}
