//! The agent's servers: the live status as one JSON document per connection on a root-only
//! Unix socket, and Prometheus text over HTTP. Both only read the [`SharedStatus`] the agent
//! loop updates.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::stats;
use crate::status::{SharedStatus, StatusReport};
use anyhow::Context;

/// A background server thread; stopping it wakes the accept loop at once (through a pipe the
/// loop polls beside the listener) and joins it. An earlier loop slept 50 ms between
/// non-blocking accepts, and every `gleaner run` waited up to 50 ms for it at exit.
#[derive(Debug)]
pub struct Server {
    /// Dropping the write end wakes the loop (POLLHUP on the read end).
    wake: Option<OwnedFd>,
    thread: Option<JoinHandle<()>>,
    socket: Option<PathBuf>,
}

impl Server {
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.wake.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(s) = self.socket.take() {
            let _ = std::fs::remove_file(s);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Runs `serve` on each connection `listener` accepts, on a thread named `name`, until the
/// returned server is stopped. `listener` must be non-blocking.
fn spawn_server<L: AsFd + Send + 'static, C>(
    name: &str,
    listener: L,
    accept: impl Fn(&L) -> std::io::Result<C> + Send + 'static,
    serve: impl Fn(C) + Send + 'static,
) -> anyhow::Result<Server> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let (wake_rx, wake_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("creating a wake-up pipe")?;
    let thread = std::thread::Builder::new().name(name.into()).spawn(move || loop {
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN), PollFd::new(wake_rx.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) if fds[1].any() != Some(false) => return,
            Ok(_) => {
                // A connection may have gone again before the accept: WouldBlock, poll on.
                if let Ok(conn) = accept(&listener) {
                    serve(conn);
                }
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return,
        }
    })?;
    Ok(Server { wake: Some(wake_tx), thread: Some(thread), socket: None })
}

/// The status socket of agent `pid` in `run_dir`.
pub fn socket_path(run_dir: &Path, pid: i32) -> PathBuf {
    run_dir.join(format!("agent-{pid}.sock"))
}

/// Serves the status as one JSON document per connection on a root-only Unix socket.
pub fn serve_status(path: &Path, status: SharedStatus) -> anyhow::Result<Server> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).with_context(|| format!("chmod {}", path.display()))?;
    listener.set_nonblocking(true)?;
    let accept = |l: &UnixListener| l.accept().map(|(c, _)| c);
    let mut server = spawn_server("gleaner-status", listener, accept, move |mut conn| {
        let _ = conn.set_nonblocking(false);
        let snapshot = status.lock().map(|s| s.clone()).unwrap_or_default();
        if let Ok(text) = serde_json::to_vec(&snapshot) {
            let _ = conn.write_all(&text);
        }
    })?;
    server.socket = Some(path.to_path_buf());
    Ok(server)
}

/// Reads the status of every agent with a socket in `run_dir` (dead sockets are skipped).
pub fn query_all(run_dir: &Path) -> anyhow::Result<Vec<StatusReport>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(run_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("reading {}", run_dir.display())),
    };
    let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "sock")).collect();
    paths.sort();
    for p in paths {
        let Ok(mut s) = UnixStream::connect(&p) else { continue };
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut buf = Vec::new();
        let _ = BufReader::new(&mut s).read_until(0, &mut buf);
        if let Ok(r) = serde_json::from_slice::<StatusReport>(&buf) {
            out.push(r);
        }
    }
    Ok(out)
}

/// How many agents with a socket in `run_dir` run retention: their yielding threads keep vCPUs
/// from halting, so a halted-vCPU wakeup measured meanwhile comes out too cheap. Threads the
/// governor keeps parked count too: its probe periods turn them on.
pub fn retention_agents(run_dir: &Path) -> usize {
    query_all(run_dir).map(|r| r.iter().filter(|s| s.retention).count()).unwrap_or(0)
}

/// Serves Prometheus text format at `http://addr/metrics` (any path answers).
pub fn serve_metrics(addr: &str, status: SharedStatus) -> anyhow::Result<Server> {
    let sock = gleaner_os::input::metrics_addr("--metrics-addr", addr)?;
    let listener = TcpListener::bind(sock)
        .map_err(|e| gleaner_os::BadInput::new("--metrics-addr", addr, format!("a free local PORT or IP:PORT ({e})")))?;
    if let Some(w) = gleaner_os::input::metrics_exposure(sock) {
        tracing::warn!("{w}");
    }
    listener.set_nonblocking(true)?;
    let accept = |l: &TcpListener| l.accept().map(|(c, _)| c);
    spawn_server("gleaner-metrics", listener, accept, move |mut conn| {
        let _ = conn.set_nonblocking(false);
        let _ = conn.set_read_timeout(Some(Duration::from_secs(1)));
        // Read (and ignore) the request line and headers.
        let Ok(clone) = conn.try_clone() else { return };
        let mut reader = BufReader::new(clone);
        let mut line = String::new();
        while reader.read_line(&mut line).map(|n| n > 2).unwrap_or(false) {
            line.clear();
        }
        let body = status.lock().map(|s| prometheus_text(&s)).unwrap_or_default();
        let _ = write!(
            conn,
            "HTTP/1.1 200 OK\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
            body.len(),
            body
        );
    })
}

/// Renders the status in the OpenMetrics text format with `prometheus-client`: every stat
/// declared beside the status ([`crate::status::STATUS_STATS`], [`crate::status::Totals`],
/// [`crate::status::Overhead`], [`crate::status::IdleStatus::STATS`]).
pub fn prometheus_text(s: &StatusReport) -> String {
    use crate::status::{IdleStatus, Overhead, Totals, STATUS_STATS};
    let mut reg = prometheus_client::registry::Registry::with_prefix("gleaner");
    stats::register(&mut reg, STATUS_STATS, s);
    stats::register(&mut reg, Totals::STATS, &s.totals);
    stats::register(&mut reg, Overhead::STATS, &s.overhead);
    if let Some(i) = &s.idle {
        stats::register(&mut reg, IdleStatus::STATS, i);
    }
    let mut out = String::new();
    let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
    out
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use gleaner_policy::retention::{GovernorConfig, PriorStrength, RetentionGovernor, RetentionMode};

    use super::*;
    use crate::status::{IdleStatus, Totals, VcpuTimeout};

    /// A status with every stat set: a governor, two yielding threads, a plan with each
    /// mechanism (one vCPU polled until work), traced wakeups.
    fn rich() -> StatusReport {
        let mut plan = gleaner_policy::idle::IdlePlan::initial_poll([0, 1, 2], 200_000);
        plan.vcpus[1].window_ns = gleaner_policy::idle::plan::ALWAYS;
        plan.vcpus[2].mechanism = gleaner_policy::idle::plan::Mechanism::Yield;
        let mut wake = gleaner_policy::idle::WakeSummary::default();
        wake.poll.count = 9;
        wake.poll.mean_ns = 4_000.0;
        wake.halt.count = 3;
        wake.halt.mean_ns = 61_500.0;
        let mut gov = RetentionGovernor::with_prior(GovernorConfig::default(), RetentionMode::On, PriorStrength::Plain).state();
        gov.switches = 2;
        gov.probes = 5;
        StatusReport {
            agent_pid: 42,
            target: "pid 7".into(),
            retention: true,
            retention_mode: Some(RetentionMode::On),
            governor: Some(gov),
            vcpu_timeouts: vec![
                VcpuTimeout { cpu: 0, timeout_ns: 20_000, grows: 3, shrinks: 1 },
                VcpuTimeout { cpu: 1, timeout_ns: 40_000, grows: 2, shrinks: 0 },
            ],
            consolidation: true,
            all_cpus: "0-3".parse().unwrap(),
            active_cpus: "0-2".parse().unwrap(),
            timeout_us: 150,
            idle_threshold_us: 10,
            period_ms: 200,
            uptime_s: 2.25,
            metrics: gleaner_policy::gleaner::Metrics {
                l_comp_ns: Some(120_000.0),
                g_comp_ns: None,
                l_idle_ns: Some(30_000.0),
                util: 1.25,
                rho: 0.9,
                eta: 0.5,
                active: 3,
                ..Default::default()
            },
            totals: Totals {
                yields: 7,
                timeouts: 4,
                step_asides: 2,
                noise_returns: 1,
                decisions: 3,
                periods: 11,
                yielder_cpu_ns: 1_500_000_000,
                retention_on_periods: 9,
            },
            overhead: crate::status::Overhead { probe_ns: 250_000_000, probe_worse_ns: 50_000_000, agent_cpu_ns: 9_000_000 },
            threads: 5,
            idle: Some(IdleStatus { plan: Some(plan), wake: Some(wake), poll_ns: 1_500_000_000, ..Default::default() }),
            ..StatusReport::default()
        }
    }

    /// The lines of an exposition, sorted: a family's samples come in hash order.
    fn sorted_lines(t: &str) -> Vec<&str> {
        let mut l: Vec<&str> = t.lines().collect();
        l.sort_unstable();
        l
    }

    /// Every name, type, help text and value of the exposition stays what scrapers and
    /// dashboards know (`tests/data/status.prom`).
    #[test]
    fn prometheus_text_keeps_its_names_and_values() {
        let t = prometheus_text(&rich());
        assert_eq!(sorted_lines(&t), sorted_lines(include_str!("../tests/data/status.prom")), "{t}");
        assert!(t.ends_with("# EOF\n"));
    }

    #[test]
    fn prometheus_text_has_metrics() {
        let s = StatusReport {
            active_cpus: "0-1".parse().unwrap(),
            totals: Totals { yields: 7, ..Totals::default() },
            retention_mode: Some(RetentionMode::On),
            vcpu_timeouts: vec![
                VcpuTimeout { cpu: 0, timeout_ns: 20_000, grows: 3, shrinks: 1 },
                VcpuTimeout { cpu: 1, timeout_ns: 40_000, grows: 2, shrinks: 0 },
            ],
            ..StatusReport::default()
        };
        let t = prometheus_text(&s);
        assert!(t.contains("gleaner_active_vcpus 2"), "{t}");
        assert!(t.contains("gleaner_yields_total 7"), "{t}");
        assert!(t.contains("gleaner_retention_on 1"), "{t}");
        assert!(t.contains("gleaner_vcpu_retention_timeout_seconds{cpu=\"1\"} 0.00004"), "{t}");
        assert!(t.contains("gleaner_retention_timeout_grows_total 5"), "{t}");
        assert!(!t.contains("kernel_polling") && !t.contains("vcpu_idle"), "no idle policy, no idle stats: {t}");
        assert!(t.ends_with("# EOF\n"));
    }

    #[test]
    fn prometheus_text_has_the_idle_plan_and_traced_wakeups() {
        let t = prometheus_text(&rich());
        assert!(t.contains("gleaner_kernel_polling_seconds_total 1.5"), "{t}");
        assert!(t.contains("gleaner_vcpu_idle_window_seconds{cpu=\"0\"} 0.0002"), "{t}");
        assert!(!t.contains("gleaner_vcpu_idle_window_seconds{cpu=\"1\"}") && !t.contains("inf"), "{t}");
        assert!(t.contains("gleaner_vcpu_idle_until_work{cpu=\"1\"} 1\n"), "{t}");
        assert!(t.contains("gleaner_vcpu_idle_mechanism{cpu=\"0\",mechanism=\"poll\"} 1\n"), "{t}");
        assert!(t.contains("gleaner_wakeups{target=\"poll\"} 9\n"), "{t}");
        assert!(t.contains("gleaner_wakeup_latency_mean_seconds{target=\"poll\"} 0.000004"), "{t}");
    }

    /// A real scraper's parser reads the exposition: the Prometheus project's strict
    /// OpenMetrics parser (Debian's python3-prometheus-client), for a full status and an empty
    /// one; every declared stat is there with its type.
    #[test]
    fn a_real_openmetrics_parser_reads_the_exposition() {
        use std::io::Write as _;
        const PYTHON: &str = "/usr/bin/python3";
        const PARSE: &str = "import sys\n\
            from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse\n\
            for f in parse(sys.stdin.read()):\n    print(f.name, f.type, len(f.samples))\n";
        for (what, s) in [("full", rich()), ("empty", StatusReport::default())] {
            let text = prometheus_text(&s);
            let mut child = std::process::Command::new(PYTHON)
                .args(["-c", PARSE])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("{PYTHON} is needed to check the exposition with a real parser ({e}): apt-get install python3 python3-prometheus-client"));
            child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
            let out = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!err.contains("No module named"), "the parser is missing: apt-get install python3-prometheus-client ({err})");
            assert!(out.status.success(), "{what} status refused by the OpenMetrics parser: {err}\n{text}");
            let parsed = String::from_utf8_lossy(&out.stdout);
            let kind = |k: stats::Kind| if k == stats::Kind::Counter { "counter" } else { "gauge" };
            let declared = crate::status::STATUS_STATS
                .iter()
                .map(|st| (st.name, st.kind))
                .chain(Totals::STATS.iter().map(|st| (st.name, st.kind)))
                .chain(crate::status::Overhead::STATS.iter().map(|st| (st.name, st.kind)))
                .chain(s.idle.iter().flat_map(|_| IdleStatus::STATS.iter().map(|st| (st.name, st.kind))));
            for (name, k) in declared {
                let line = format!("gleaner_{name} {} ", kind(k));
                assert!(parsed.lines().any(|l| l.starts_with(&line)), "{what}: {line} not parsed: {parsed}");
            }
        }
    }

    #[test]
    fn status_round_trips_over_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let status = Arc::new(Mutex::new(StatusReport { agent_pid: 42, target: "pid 1".into(), ..Default::default() }));
        let server = serve_status(&socket_path(dir.path(), 42), Arc::clone(&status)).unwrap();
        let got = query_all(dir.path()).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].agent_pid, 42);
        server.stop();
        assert!(query_all(dir.path()).unwrap().is_empty(), "socket removed on stop");
    }

    /// The JSON keeps its field names: the totals at the top level, the CPU sets as lists.
    #[test]
    fn status_json_keeps_its_fields() {
        let v = serde_json::to_value(rich()).unwrap();
        for (k, want) in [("yields", 7), ("timeouts", 4), ("step_asides", 2), ("noise_returns", 1), ("decisions", 3), ("periods", 11)] {
            assert_eq!(v[k], want, "{k}: {v}");
        }
        assert_eq!((v["active_cpus"].as_str(), v["all_cpus"].as_str()), (Some("0-2"), Some("0-3")));
        assert_eq!(serde_json::from_value::<StatusReport>(v).unwrap(), rich());
    }
}
