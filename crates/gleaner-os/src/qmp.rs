//! A minimal QMP (QEMU Machine Protocol) client over a QEMU monitor's Unix socket: connect,
//! negotiate capabilities, run commands. The host agent uses it for `query-cpus-fast` and
//! per-vCPU `query-stats`, the lab for KVM statistics of its guests.

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
#[derive(Debug)]
pub struct Qmp {
    path: PathBuf,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    /// Connects to `path` and negotiates capabilities; every read and write waits at most
    /// `timeout`.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Qmp, QmpError> {
        let s = UnixStream::connect(path).map_err(|source| QmpError::Io { path: path.to_path_buf(), source })?;
        Self::from_stream(s, path, timeout)
    }

    /// Negotiates capabilities on an already connected stream (`path` names it in errors);
    /// every read and write waits at most `timeout`.
    pub fn from_stream(s: UnixStream, path: &Path, timeout: Duration) -> Result<Qmp, QmpError> {
        let io = |source| QmpError::Io { path: path.to_path_buf(), source };
        s.set_read_timeout(Some(timeout)).map_err(io)?;
        s.set_write_timeout(Some(timeout)).map_err(io)?;
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

    /// Runs one command and returns its `return` value; asynchronous events are skipped.
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A fake QMP server: greeting, then one canned answer per request line.
    fn serve(answers: Vec<&'static str>) -> (tempfile::TempDir, PathBuf, std::thread::JoinHandle<()>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        let l = UnixListener::bind(&path).unwrap();
        let h = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut w = s.try_clone().unwrap();
            let mut r = BufReader::new(s);
            w.write_all(b"{\"QMP\": {\"version\": {}}}\n").unwrap();
            for a in answers {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                w.write_all(a.as_bytes()).unwrap();
                w.write_all(b"\n").unwrap();
            }
        });
        (dir, path, h)
    }

    #[test]
    fn executes_and_skips_events() {
        // An asynchronous event arrives before the answer to `query-status`.
        let (_d, path, h) = serve(vec![r#"{"return": {}}"#, "{\"event\": \"STOP\"}\n{\"return\": {\"status\": \"running\"}}"]);
        let mut q = Qmp::connect(&path, Duration::from_secs(2)).unwrap();
        let r = q.execute("query-status", None).unwrap();
        assert_eq!(r["status"], "running");
        drop(q);
        h.join().unwrap();
    }

    #[test]
    fn errors_name_the_socket() {
        let (_d, path, h) = serve(vec![r#"{"return": {}}"#, r#"{"error": {"class": "GenericError"}}"#]);
        let mut q = Qmp::connect(&path, Duration::from_secs(2)).unwrap();
        let e = q.execute("bogus", None).unwrap_err().to_string();
        assert!(e.contains("qmp.sock") && e.contains("GenericError"), "{e}");
        drop(q);
        h.join().unwrap();
        let e = Qmp::connect(Path::new("/nonexistent/qmp.sock"), Duration::from_secs(1)).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/qmp.sock"), "{e}");
    }
}
