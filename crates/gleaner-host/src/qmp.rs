//! A minimal QMP client: per-vCPU KVM statistics (`query-stats`) mapped to vCPU threads
//! (`query-cpus-fast`). TCG guests have no KVM statistics: the reply is empty.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

/// A QMP failure, naming the socket.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("QMP socket {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("QMP socket {}: {reason}", path.display())]
    Protocol { path: PathBuf, reason: String },
}

/// A connected QMP session (capabilities negotiated).
pub struct Qmp {
    path: PathBuf,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    pub fn connect(path: &Path) -> Result<Qmp, QmpError> {
        let io = |source| QmpError::Io { path: path.to_path_buf(), source };
        let s = UnixStream::connect(path).map_err(io)?;
        s.set_read_timeout(Some(Duration::from_secs(2))).map_err(io)?;
        let writer = s.try_clone().map_err(io)?;
        let mut q = Qmp { path: path.to_path_buf(), reader: BufReader::new(s), writer };
        let greeting = q.read_msg()?;
        if greeting.get("QMP").is_none() {
            return Err(q.proto(format!("no greeting: {greeting}")));
        }
        q.execute("qmp_capabilities", None)?;
        Ok(q)
    }

    fn proto(&self, reason: String) -> QmpError {
        QmpError::Protocol { path: self.path.clone(), reason }
    }

    fn read_msg(&mut self) -> Result<Value, QmpError> {
        let mut line = String::new();
        let n = self.reader.read_line(&mut line).map_err(|source| QmpError::Io { path: self.path.clone(), source })?;
        if n == 0 {
            return Err(self.proto("connection closed".into()));
        }
        serde_json::from_str(&line).map_err(|e| self.proto(format!("bad JSON '{}': {e}", line.trim())))
    }

    /// Runs a command; asynchronous events are skipped.
    pub fn execute(&mut self, cmd: &str, args: Option<Value>) -> Result<Value, QmpError> {
        let mut m = json!({ "execute": cmd });
        if let Some(a) = args {
            m["arguments"] = a;
        }
        let text = format!("{m}\n");
        self.writer.write_all(text.as_bytes()).map_err(|source| QmpError::Io { path: self.path.clone(), source })?;
        loop {
            let v = self.read_msg()?;
            if v.get("event").is_some() {
                continue;
            }
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            return Err(self.proto(format!("{cmd}: {}", v.get("error").unwrap_or(&v))));
        }
    }

    /// vCPU thread id -> QOM path.
    pub fn cpu_threads(&mut self) -> Result<BTreeMap<String, i32>, QmpError> {
        let r = self.execute("query-cpus-fast", None)?;
        let mut out = BTreeMap::new();
        for c in r.as_array().into_iter().flatten() {
            if let (Some(p), Some(t)) = (c["qom-path"].as_str(), c["thread-id"].as_i64()) {
                out.insert(p.to_string(), i32::try_from(t).unwrap_or(-1));
            }
        }
        Ok(out)
    }

    /// Per-vCPU KVM statistics: thread id -> (stat name -> value). Empty for TCG.
    pub fn vcpu_stats(&mut self, threads: &BTreeMap<String, i32>) -> Result<BTreeMap<i32, BTreeMap<String, u64>>, QmpError> {
        let r = self.execute("query-stats", Some(json!({ "target": "vcpu" })))?;
        Ok(parse_vcpu_stats(&r, threads))
    }
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
