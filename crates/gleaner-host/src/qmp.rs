//! QMP queries of the host agent (the client itself is `gleaner_os::qmp`): per-vCPU KVM statistics (`query-stats`) mapped to vCPU threads
//! (`query-cpus-fast`). TCG guests have no KVM statistics: the reply is empty.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

pub use gleaner_os::qmp::{Qmp, QmpError};

/// How long the host agent waits for one QMP answer.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// The vCPU queries the host agent needs, on the shared client.
pub trait VcpuQueries {
    /// vCPU thread id -> QOM path.
    fn cpu_threads(&mut self) -> Result<BTreeMap<String, i32>, QmpError>;
    /// Per-vCPU KVM statistics: thread id -> (stat name -> value). Empty for TCG.
    fn vcpu_stats(&mut self, threads: &BTreeMap<String, i32>) -> Result<BTreeMap<i32, BTreeMap<String, u64>>, QmpError>;
}

impl VcpuQueries for Qmp {
    fn cpu_threads(&mut self) -> Result<BTreeMap<String, i32>, QmpError> {
        let r = self.execute("query-cpus-fast", None)?;
        Ok(parse_cpu_threads(&r))
    }

    fn vcpu_stats(&mut self, threads: &BTreeMap<String, i32>) -> Result<BTreeMap<i32, BTreeMap<String, u64>>, QmpError> {
        let r = self.execute("query-stats", Some(json!({ "target": "vcpu" })))?;
        Ok(parse_vcpu_stats(&r, threads))
    }
}

/// Parses a `query-cpus-fast` reply (`[{qom-path, thread-id, ...}]`): QOM path -> thread id
/// (-1 when the id does not fit a tid).
pub fn parse_cpu_threads(r: &Value) -> BTreeMap<String, i32> {
    let mut out = BTreeMap::new();
    for c in r.as_array().into_iter().flatten() {
        if let (Some(p), Some(t)) = (c["qom-path"].as_str(), c["thread-id"].as_i64()) {
            out.insert(p.to_string(), i32::try_from(t).unwrap_or(-1));
        }
    }
    out
}

/// Parses a `query-stats` reply (`[{provider, qom-path, stats: [{name, value}]}]`); only
/// scalar values are kept.
pub fn parse_vcpu_stats(r: &Value, threads: &BTreeMap<String, i32>) -> BTreeMap<i32, BTreeMap<String, u64>> {
    let mut out: BTreeMap<i32, BTreeMap<String, u64>> = BTreeMap::new();
    for e in r.as_array().into_iter().flatten() {
        let Some(tid) = e["qom-path"].as_str().and_then(|p| threads.get(p)) else { continue };
        let m = out.entry(*tid).or_default();
        for s in e["stats"].as_array().into_iter().flatten() {
            if let (Some(n), Some(v)) = (s["name"].as_str(), s["value"].as_u64()) {
                m.insert(n.to_string(), v);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_stats_valid_malformed_empty() {
        let threads: BTreeMap<String, i32> = [("/machine/unattached/device[0]".to_string(), 11)].into_iter().collect();
        let r = json!([{ "provider": "kvm", "qom-path": "/machine/unattached/device[0]",
            "stats": [{ "name": "io_exits", "value": 7 }, { "name": "mmio_exits", "value": 3 },
                      { "name": "halt_poll_fail_hist", "value": [1, 2] }] }]);
        let s = parse_vcpu_stats(&r, &threads);
        assert_eq!(s[&11]["io_exits"], 7);
        assert_eq!(s[&11].len(), 2);
        assert!(parse_vcpu_stats(&json!({"bogus": 1}), &threads).is_empty());
        assert!(parse_vcpu_stats(&json!([]), &threads).is_empty());
    }
}
