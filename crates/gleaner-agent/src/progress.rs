//! The workload's own progress counter (`--progress SOURCE`, `progress` in the config): what
//! the guest loop's governors compare levels by where the user knows what the work is
//! (requests served, items processed) better than sync points or bytes do.
//!
//! ```text
//!  SOURCE  a file holding a number (its first token; rewritten or appended to by the workload)
//!          http://HOST:PORT/PATH#NAME   a Prometheus text endpoint: every series of NAME summed
//!  read once a period; the counter's step since the last read is the period's progress (a
//!  counter that went back, restarted, or a read that failed gives none for that period)
//! ```

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// How long a read of a Prometheus endpoint may take before the period goes without it.
const HTTP_TIMEOUT: Duration = Duration::from_millis(100);
/// The most of an endpoint's answer or a file that is read.
const MAX_BYTES: u64 = 4 << 20;

/// Where the counter is read from (module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProgressSource {
    File(PathBuf),
    Prometheus { addr: String, path: String, metric: String },
}

impl ProgressSource {
    /// What `allowed` says of a bad source.
    pub const ALLOWED: &'static str = "a file holding a number, or http://HOST:PORT/PATH#METRIC (a Prometheus text endpoint)";
}

impl FromStr for ProgressSource {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(rest) = s.strip_prefix("http://") {
            let (url, metric) = rest.split_once('#').ok_or("no #METRIC after the URL")?;
            let (addr, path) = match url.find('/') {
                Some(i) => (&url[..i], &url[i..]),
                None => (url, "/metrics"),
            };
            let valid_name = !metric.is_empty() && metric.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
            let host_port = addr.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !host_port || !valid_name {
                return Err("need HOST:PORT and a metric name".into());
            }
            return Ok(Self::Prometheus { addr: addr.into(), path: path.into(), metric: metric.into() });
        }
        if s.is_empty() || s.contains("://") {
            return Err("not a file path or an http:// URL".into());
        }
        Ok(Self::File(PathBuf::from(s)))
    }
}

/// The counter's reader: its last value, to give each period its step.
#[derive(Debug)]
pub struct ProgressReader {
    source: ProgressSource,
    last: Option<f64>,
}

impl ProgressReader {
    pub fn new(source: ProgressSource) -> Self {
        Self { source, last: None }
    }

    /// The counter's step since the last read (`None`: the first read, a failed one, or a
    /// counter that went back).
    pub fn step(&mut self) -> Option<u64> {
        let now = self.read();
        let step = match (self.last, now) {
            (Some(a), Some(b)) if b >= a => Some(gleaner_policy::num::saturating_u64((b - a).round())),
            _ => None,
        };
        if now.is_some() {
            self.last = now;
        }
        step
    }

    fn read(&self) -> Option<f64> {
        match &self.source {
            ProgressSource::File(p) => {
                let mut text = String::new();
                std::fs::File::open(p).ok()?.take(MAX_BYTES).read_to_string(&mut text).ok()?;
                first_number(&text)
            }
            ProgressSource::Prometheus { addr, path, metric } => metric_sum(&http_get(addr, path).ok()?, metric),
        }
    }
}

/// The first whitespace-separated token of `text` as a number.
fn first_number(text: &str) -> Option<f64> {
    text.split_whitespace().next()?.parse().ok().filter(|v: &f64| v.is_finite())
}

/// The sum of every series of `metric` in a Prometheus text exposition (`NAME VALUE`,
/// `NAME{labels} VALUE [TIMESTAMP]`; comments and other metrics skipped); `None` if it has none.
fn metric_sum(text: &str, metric: &str) -> Option<f64> {
    let mut sum = None;
    for line in text.lines().map(str::trim).filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(metric) else { continue };
        let value = if let Some(labels) = rest.strip_prefix('{') {
            labels.split_once('}').map(|(_, v)| v)
        } else if rest.starts_with(' ') || rest.starts_with('\t') {
            Some(rest)
        } else {
            None // another metric whose name starts with this one
        };
        if let Some(v) = value.and_then(first_number) {
            *sum.get_or_insert(0.0) += v;
        }
    }
    sum
}

/// A plain HTTP/1.0 GET of `path` from `addr` (HOST:PORT), within [`HTTP_TIMEOUT`]: the body.
fn http_get(addr: &str, path: &str) -> std::io::Result<String> {
    let sock: SocketAddr = addr.to_socket_addrs()?.next().ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no address"))?;
    let mut s = TcpStream::connect_timeout(&sock, HTTP_TIMEOUT)?;
    s.set_read_timeout(Some(HTTP_TIMEOUT))?;
    s.set_write_timeout(Some(HTTP_TIMEOUT))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: text/plain\r\n\r\n").as_bytes())?;
    let mut text = String::new();
    s.take(MAX_BYTES).read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text.as_str(), ""));
    if head.split_whitespace().nth(1).is_none_or(|code| code != "200") {
        return Err(std::io::Error::other(format!("HTTP status line {:?}", head.lines().next().unwrap_or(""))));
    }
    Ok(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse_and_bad_ones_say_why() {
        assert_eq!("/tmp/done".parse(), Ok(ProgressSource::File("/tmp/done".into())));
        assert_eq!(
            "http://127.0.0.1:9100/metrics#requests_total".parse(),
            Ok(ProgressSource::Prometheus { addr: "127.0.0.1:9100".into(), path: "/metrics".into(), metric: "requests_total".into() })
        );
        assert_eq!(
            "http://localhost:8080#x"
                .parse::<ProgressSource>()
                .map(|s| matches!(s, ProgressSource::Prometheus { path, .. } if path == "/metrics")),
            Ok(true)
        );
        for bad in ["", "http://127.0.0.1:9100/metrics", "http://:9/#a", "http://h/#a", "http://h:1/#bad name", "ftp://x"] {
            assert!(bad.parse::<ProgressSource>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_prometheus_metric_is_the_sum_of_its_series() {
        let text = "# HELP requests_total Requests.\n# TYPE requests_total counter\nrequests_total{code=\"200\"} 10\nrequests_total{code=\"500\"} 2.5 1700000000\nrequests_total_created 99\nother 7\n";
        assert_eq!(metric_sum(text, "requests_total"), Some(12.5));
        assert_eq!(metric_sum("plain 3\n", "plain"), Some(3.0));
        assert_eq!(metric_sum(text, "missing"), None);
        assert_eq!(metric_sum("", "x"), None);
    }

    #[test]
    fn a_file_counter_gives_each_period_its_step() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("count");
        let mut r = ProgressReader::new(ProgressSource::File(p.clone()));
        assert_eq!(r.step(), None, "no file yet");
        std::fs::write(&p, "100\n").unwrap();
        assert_eq!(r.step(), None, "the first read");
        std::fs::write(&p, "160 items\n").unwrap();
        assert_eq!(r.step(), Some(60));
        std::fs::write(&p, "5\n").unwrap();
        assert_eq!(r.step(), None, "went back (restarted)");
        std::fs::write(&p, "garbage\n").unwrap();
        assert_eq!(r.step(), None);
        std::fs::write(&p, "9\n").unwrap();
        assert_eq!(r.step(), Some(4), "from the last good read");
    }

    #[test]
    fn an_endpoint_is_read_over_http() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let served = std::thread::spawn(move || {
            for body in ["work_done 5\n", "work_done 8\n"] {
                let (mut s, _) = listener.accept().unwrap();
                let mut req = Vec::new();
                let mut buf = [0u8; 512];
                while !req.ends_with(b"\r\n\r\n") {
                    let n = s.read(&mut buf).unwrap();
                    assert!(n > 0, "the request ended early: {:?}", String::from_utf8_lossy(&req));
                    req.extend_from_slice(&buf[..n]);
                }
                assert!(String::from_utf8_lossy(&req).starts_with("GET /m HTTP/1.0\r\n"));
                write!(s, "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n{body}").unwrap();
            }
        });
        let mut r = ProgressReader::new(format!("http://{addr}/m#work_done").parse().unwrap());
        assert_eq!(r.step(), None);
        assert_eq!(r.step(), Some(3));
        served.join().unwrap();
        // Nobody listening: no step, no error.
        let mut gone = ProgressReader::new(format!("http://{addr}/m#work_done").parse().unwrap());
        assert_eq!(gone.step(), None);
    }
}
