//! KVM statistics of lab guests over QMP (the client itself is `gleaner_os::qmp`):
//! `query-stats` flattened to (name, value) pairs: exits, halt exits, halt polling successes
//! and failures.

use serde_json::Value;

pub use gleaner_os::qmp::{Qmp, QmpError};

/// Flattens a `query-stats` reply into `(provider/target[/vcpu] name, value)` pairs for the
/// numeric statistics (histograms are summed).
pub fn flatten_stats(reply: &Value) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for entry in reply.as_array().into_iter().flatten() {
        let provider = entry.get("provider").and_then(Value::as_str).unwrap_or("?");
        let qom = entry.get("qom-path").and_then(Value::as_str).unwrap_or("vm");
        for s in entry.get("stats").and_then(Value::as_array).into_iter().flatten() {
            let Some(name) = s.get("name").and_then(Value::as_str) else { continue };
            let v = match s.get("value") {
                Some(Value::Number(n)) => n.as_f64(),
                Some(Value::Array(a)) => Some(a.iter().filter_map(Value::as_f64).sum()),
                Some(Value::Bool(b)) => Some(if *b { 1.0 } else { 0.0 }),
                _ => None,
            };
            if let Some(v) = v {
                out.push((format!("{provider}:{qom}:{name}"), v));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn flattens_kvm_vcpu_stats() {
        let reply = json!([
            {"provider":"kvm","qom-path":"/machine/unattached/device[0]","stats":[
                {"name":"halt_exits","value":12},
                {"name":"halt_poll_success_ns","value":3000},
                {"name":"halt_wait_hist","value":[1,2,3]}
            ]}
        ]);
        let f = flatten_stats(&reply);
        assert_eq!(f.len(), 3);
        assert_eq!(f[0], ("kvm:/machine/unattached/device[0]:halt_exits".into(), 12.0));
        assert_eq!(f[2].1, 6.0);
    }

    #[test]
    fn malformed_and_empty_stats() {
        assert!(flatten_stats(&json!({"not":"a list"})).is_empty());
        assert!(flatten_stats(&json!([{"provider":"kvm","stats":[{"value":1}]}])).is_empty());
        assert!(flatten_stats(&json!([])).is_empty());
    }
}
