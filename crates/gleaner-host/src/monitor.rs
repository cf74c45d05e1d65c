//! Per-period readings of every vCPU, turned into [`VcpuCounters`] for the policy.
//!
//! | counter | source (first available) | missing when |
//! |---|---|---|
//! | `io_events` | QMP `query-stats` `io_exits + mmio_exits` (KVM); else the vCPU thread's read/write system calls (`/proc/<pid>/task/<tid>/io` `syscr + syscw`: device emulation done by that vCPU thread) | the thread's io file is unreadable |
//! | `spin_events` | a KVM pause-loop-exit statistic in `query-stats` (`pause_exits`/`ple_exits`) | always on stock kernels (KVM counts PLE exits in no statistic) and for TCG guests |
//! | `llc_refs`, `llc_misses`, `instructions` | `perf_event_open` hardware counters on the vCPU thread | no PMU (most VMs, including the development machines) |
//! | `run_ns` | `/proc/<pid>/task/<tid>/schedstat` | - |

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use gleaner_os::procfs::Procfs;
use gleaner_policy::aql::{VcpuCounters, VcpuId};
use serde::Serialize;

use crate::discover::Vm;
use crate::perf::LlcCounters;
use crate::qmp::{Qmp, VcpuQueries};

/// KVM statistics counted as spin events if a kernel exposes one.
const SPIN_STATS: [&str; 2] = ["pause_exits", "ple_exits"];

#[derive(Debug, Clone, Copy, Default)]
struct Raw {
    run_ns: u64,
    syscalls: Option<u64>,
    kvm_io: Option<u64>,
    kvm_spin: Option<u64>,
    llc: Option<(u64, u64, u64)>,
}

/// One vCPU over one period.
#[derive(Debug, Clone, Serialize)]
pub struct VcpuReading {
    pub id: VcpuId,
    pub vm_name: String,
    pub tid: i32,
    pub counters: VcpuCounters,
    /// Where `io_events` came from.
    pub io_source: Option<&'static str>,
}

/// A VM's non-vCPU threads over one period (the VM's own I/O activity; not per vCPU).
#[derive(Debug, Clone, Serialize)]
pub struct VmIo {
    pub pid: i32,
    pub syscalls: u64,
    pub voluntary_switches: u64,
}

/// Why sources are missing on this host.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SourceReport {
    pub io: String,
    pub spin: String,
    pub llc: String,
}

#[derive(Debug)]
struct VmState {
    qmp: Option<Qmp>,
    qmp_threads: BTreeMap<String, i32>,
    qmp_error: Option<String>,
}

/// Keeps the previous raw readings and turns them into per-period counters.
#[derive(Debug)]
pub struct Monitor {
    procfs: Procfs,
    prev: BTreeMap<i32, (Instant, Raw)>,
    prev_vm: BTreeMap<i32, (u64, u64)>,
    vms: BTreeMap<i32, VmState>,
    llc: BTreeMap<i32, LlcCounters>,
    llc_reason: Option<String>,
    saw_kvm_stats: bool,
}

impl Monitor {
    /// A monitor reading `procfs` (per-thread schedstat, io, status).
    pub fn with_procfs(procfs: Procfs) -> Self {
        let llc_reason = crate::perf::probe().err();
        Self {
            procfs,
            prev: BTreeMap::new(),
            prev_vm: BTreeMap::new(),
            vms: BTreeMap::new(),
            llc: BTreeMap::new(),
            llc_reason,
            saw_kvm_stats: false,
        }
    }

    /// What is missing and why, for the output.
    pub fn sources(&self) -> SourceReport {
        let qmp_err: Vec<String> = self.vms.iter().filter_map(|(pid, v)| v.qmp_error.as_ref().map(|e| format!("pid {pid}: {e}"))).collect();
        SourceReport {
            io: if self.saw_kvm_stats {
                "KVM io_exits+mmio_exits via QMP query-stats where available, else vCPU-thread syscalls".into()
            } else {
                format!(
                    "vCPU-thread read/write syscalls (/proc/<pid>/task/<tid>/io); no KVM statistics{}",
                    if qmp_err.is_empty() { String::new() } else { format!(" ({})", qmp_err.join("; ")) }
                )
            },
            spin: "missing: stock KVM exposes no pause-loop-exit statistic (and TCG guests have no KVM statistics)".into(),
            llc: match &self.llc_reason {
                Some(r) => format!("missing: {r}"),
                None => "perf_event_open hardware counters".into(),
            },
        }
    }

    fn kvm_stats(&mut self, vm: &Vm) -> BTreeMap<i32, BTreeMap<String, u64>> {
        let st = self.vms.entry(vm.pid).or_insert_with(|| VmState { qmp: None, qmp_threads: BTreeMap::new(), qmp_error: None });
        let Some(sock) = &vm.qmp_socket else { return BTreeMap::new() };
        if st.qmp.is_none() && st.qmp_error.is_none() {
            match Qmp::connect(sock, crate::qmp::TIMEOUT).and_then(|mut q| q.cpu_threads().map(|t| (q, t))) {
                Ok((q, t)) => {
                    st.qmp = Some(q);
                    st.qmp_threads = t;
                }
                Err(e) => st.qmp_error = Some(e.to_string()),
            }
        }
        let Some(q) = st.qmp.as_mut() else { return BTreeMap::new() };
        match q.vcpu_stats(&st.qmp_threads) {
            Ok(s) => s,
            Err(e) => {
                st.qmp = None;
                st.qmp_error = Some(e.to_string());
                BTreeMap::new()
            }
        }
    }

    fn raw(&mut self, vm: &Vm, tid: i32, kvm: Option<&BTreeMap<String, u64>>) -> Option<Raw> {
        let run_ns = self.procfs.task_schedstat(vm.pid, tid).ok()?.run_ns;
        let syscalls = self.procfs.task_io(vm.pid, tid).ok().map(|io| io.syscr + io.syscw);
        let kvm_io = kvm.and_then(|m| Some(m.get("io_exits")? + m.get("mmio_exits").copied().unwrap_or(0)));
        let kvm_spin = kvm.and_then(|m| SPIN_STATS.iter().find_map(|n| m.get(*n).copied()));
        if self.llc_reason.is_none() && !self.llc.contains_key(&tid) {
            match LlcCounters::open(tid) {
                Ok(c) => {
                    self.llc.insert(tid, c);
                }
                Err(e) => self.llc_reason = Some(format!("perf_event_open on tid {tid}: {e}")),
            }
        }
        let llc = self.llc.get(&tid).and_then(|c| c.read().ok());
        Some(Raw { run_ns, syscalls, kvm_io, kvm_spin, llc })
    }

    /// Reads every vCPU; returns the counters of the period since the previous call (vCPUs
    /// seen for the first time have no period yet) and the VMs' own I/O activity.
    pub fn sample(&mut self, vms: &[Vm]) -> (Vec<VcpuReading>, Vec<VmIo>) {
        let now = Instant::now();
        let mut out = Vec::new();
        let mut vm_io = Vec::new();
        let mut live = BTreeSet::new();
        for vm in vms {
            let stats = self.kvm_stats(vm);
            if !stats.is_empty() {
                self.saw_kvm_stats = true;
            }
            for v in &vm.vcpus {
                live.insert(v.tid);
                let Some(raw) = self.raw(vm, v.tid, stats.get(&v.tid)) else { continue };
                if let Some((t0, old)) = self.prev.insert(v.tid, (now, raw)) {
                    let d = |a: Option<u64>, b: Option<u64>| Some(a?.saturating_sub(b?));
                    let (io, src) = match d(raw.kvm_io, old.kvm_io) {
                        Some(x) => (Some(x), Some("kvm:io_exits+mmio_exits")),
                        None => {
                            let x = d(raw.syscalls, old.syscalls);
                            (x, x.map(|_| "proc:task-io-syscalls"))
                        }
                    };
                    let llc = match (raw.llc, old.llc) {
                        (Some(a), Some(b)) => Some((a.0.saturating_sub(b.0), a.1.saturating_sub(b.1), a.2.saturating_sub(b.2))),
                        _ => None,
                    };
                    out.push(VcpuReading {
                        id: VcpuId { vm: u64::try_from(vm.pid).unwrap_or(0), vcpu: v.index },
                        vm_name: vm.name.clone(),
                        tid: v.tid,
                        counters: VcpuCounters {
                            period_ns: u64::try_from(now.duration_since(t0).as_nanos()).unwrap_or(u64::MAX),
                            io_events: io,
                            spin_events: d(raw.kvm_spin, old.kvm_spin),
                            llc_refs: llc.map(|l| l.0),
                            llc_misses: llc.map(|l| l.1),
                            instructions: llc.map(|l| l.2),
                            run_ns: Some(raw.run_ns.saturating_sub(old.run_ns)),
                        },
                        io_source: src,
                    });
                }
            }
            let (mut sc, mut vcs) = (0u64, 0u64);
            for &t in &vm.other_threads {
                sc += self.procfs.task_io(vm.pid, t).map(|io| io.syscr + io.syscw).unwrap_or(0);
                vcs += self.procfs.task_status(vm.pid, t).map(|s| s.voluntary_ctxt_switches).unwrap_or(0);
            }
            if let Some((s0, v0)) = self.prev_vm.insert(vm.pid, (sc, vcs)) {
                vm_io.push(VmIo { pid: vm.pid, syscalls: sc.saturating_sub(s0), voluntary_switches: vcs.saturating_sub(v0) });
            }
        }
        self.prev.retain(|t, _| live.contains(t));
        self.llc.retain(|t, _| live.contains(t));
        let pids: BTreeSet<i32> = vms.iter().map(|v| v.pid).collect();
        self.vms.retain(|p, _| pids.contains(p));
        self.prev_vm.retain(|p, _| pids.contains(p));
        (out, vm_io)
    }
}
