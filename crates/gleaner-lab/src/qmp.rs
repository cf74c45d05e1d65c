//! A minimal QMP (QEMU Machine Protocol) client over the guest's unix socket: enough for
//! `query-status` and `query-stats` (per-vCPU KVM statistics: exits, halt exits, halt polling
//! successes and failures).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("QMP {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("QMP {path}: {what}")]
    Protocol { path: String, what: String },
}

pub struct Qmp {
    path: String,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    /// Connects and negotiates capabilities.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Self, QmpError> {
        let p = path.display().to_string();
        let ioe = |source| QmpError::Io { path: p.clone(), source };
        let s = UnixStream::connect(path).map_err(ioe)?;
        s.set_read_timeout(Some(timeout)).map_err(ioe)?;
        s.set_write_timeout(Some(timeout)).map_err(ioe)?;
        let writer = s.try_clone().map_err(ioe)?;
        let mut q = Self { path: p.clone(), reader: BufReader::new(s), writer };
        let greeting = q.read_msg()?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Protocol { path: p, what: format!("unexpected greeting {greeting}") });
        }
        q.execute("qmp_capabilities", None)?;
        Ok(q)
    }

    fn read_msg(&mut self) -> Result<Value, QmpError> {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .map_err(|source| QmpError::Io { path: self.path.clone(), source })?;
        if n == 0 {
            return Err(QmpError::Protocol { path: self.path.clone(), what: "connection closed".into() });
        }
        serde_json::from_str(&line)
            .map_err(|e| QmpError::Protocol { path: self.path.clone(), what: format!("bad JSON: {e}") })
    }

    /// Runs one command and returns its `return` value (asynchronous events are skipped).
    pub fn execute(&mut self, cmd: &str, args: Option<Value>) -> Result<Value, QmpError> {
        let mut msg = json!({ "execute": cmd });
        if let Some(a) = args {
            msg["arguments"] = a;
        }
        let mut text = msg.to_string();
        text.push('\n');
        self.writer
            .write_all(text.as_bytes())
            .map_err(|source| QmpError::Io { path: self.path.clone(), source })?;
        loop {
            let v = self.read_msg()?;
            if v.get("event").is_some() {
                continue;
            }
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                return Err(QmpError::Protocol { path: self.path.clone(), what: format!("{cmd}: {e}") });
            }
        }
    }
}

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
