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

use anyhow::Context;
use gleaner_policy::retention::RetentionMode;

use crate::status::{SharedStatus, StatusReport};

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

/// Renders the status in the OpenMetrics text format with `prometheus-client`.
pub fn prometheus_text(s: &StatusReport) -> String {
    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::registry::Registry;
    use std::sync::atomic::AtomicU64;

    let mut reg = Registry::with_prefix("gleaner");
    let gauge = |reg: &mut Registry, name: &str, help: &str, v: f64| {
        let g: Gauge<f64, AtomicU64> = Gauge::default();
        g.set(v);
        reg.register(name, help, g);
    };
    let counter = |reg: &mut Registry, name: &str, help: &str, v: u64| {
        let c: Counter = Counter::default();
        c.inc_by(v);
        reg.register(name, help, c);
    };
    let m = &s.metrics;
    let active = gleaner_os::cpuset::CpuSet::parse(&s.active_cpus).map(|c| c.len()).unwrap_or(0);
    gauge(&mut reg, "active_vcpus", "vCPUs the workload may run on", active as f64);
    gauge(&mut reg, "rho", "Load factor", m.rho);
    gauge(&mut reg, "eta", "Granularity factor", m.eta);
    gauge(&mut reg, "l_comp_seconds", "Computation length between idle periods", m.l_comp_ns.unwrap_or(f64::NAN) / 1e9);
    gauge(&mut reg, "g_comp_seconds", "Computation granularity", m.g_comp_ns.unwrap_or(f64::NAN) / 1e9);
    gauge(&mut reg, "l_idle_seconds", "Idle period length", m.l_idle_ns.unwrap_or(f64::NAN) / 1e9);
    gauge(&mut reg, "utilization_vcpus", "Workload utilization in vCPUs", m.util);
    gauge(
        &mut reg,
        "retention_timeout_seconds",
        "Retention timeout (configured, or the cap of the adaptive ones)",
        s.timeout_us as f64 / 1e6,
    );
    gauge(&mut reg, "retention_on", "Retention on (1) or off (0) now", f64::from(u8::from(s.retention_mode == Some(RetentionMode::On))));
    let per_cpu: Family<Vec<(String, String)>, Gauge<f64, AtomicU64>> = Family::default();
    for v in &s.vcpu_timeouts {
        per_cpu.get_or_create(&vec![("cpu".to_string(), v.cpu.to_string())]).set(v.timeout_ns as f64 / 1e9);
    }
    reg.register("vcpu_retention_timeout_seconds", "Adaptive retention timeout of each vCPU's yielding thread", per_cpu);
    counter(&mut reg, "retention_timeout_grows", "Times a vCPU's adaptive timeout grew", s.vcpu_timeouts.iter().map(|v| v.grows).sum());
    counter(
        &mut reg,
        "retention_timeout_shrinks",
        "Times a vCPU's adaptive timeout shrank",
        s.vcpu_timeouts.iter().map(|v| v.shrinks).sum(),
    );
    counter(
        &mut reg,
        "retention_switches",
        "Times the governor switched retention's baseline mode",
        s.governor.map(|g| g.switches).unwrap_or(0),
    );
    counter(&mut reg, "retention_probes", "Probe epochs the governor ran in the other mode", s.governor.map(|g| g.probes).unwrap_or(0));
    counter(&mut reg, "yields", "sched_yield calls of the yielding threads", s.yields);
    counter(&mut reg, "timeouts", "Retention timeouts", s.timeouts);
    counter(&mut reg, "step_asides", "Yielding threads stepping aside for a thread waiting on another vCPU", s.step_asides);
    counter(
        &mut reg,
        "noise_yields",
        "Slow yields with no other task run (interrupts, host preemption): not counted as work",
        s.noise_returns,
    );
    counter(&mut reg, "decisions", "Controller decisions", s.decisions);
    counter(&mut reg, "periods", "Control periods", s.periods);
    gauge(&mut reg, "yielder_cpu_seconds", "CPU time of the yielding threads", s.yielder_cpu_ns as f64 / 1e9);
    if let Some(i) = &s.idle {
        idle_metrics(&mut reg, i);
    }
    let mut out = String::new();
    let _ = encode(&mut out, &reg);
    out
}

/// The idle policy's metrics: each vCPU's mechanism and window, kernel polling, the traced
/// wakeups by target state.
fn idle_metrics(reg: &mut prometheus_client::registry::Registry, i: &crate::status::IdleStatus) {
    use gleaner_policy::idle::plan::{Mechanism, ALWAYS};
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    use std::sync::atomic::AtomicU64;
    type Labels = Vec<(String, String)>;
    let kernel_polling: Counter<f64, AtomicU64> = Counter::default();
    kernel_polling.inc_by(i.poll_ns as f64 / 1e9);
    reg.register(
        "kernel_polling_seconds",
        "Time the managed vCPUs polled in the kernel's POLL state (idle for /proc/stat)",
        kernel_polling,
    );
    if let Some(p) = &i.plan {
        let window: Family<Labels, Gauge<f64, AtomicU64>> = Family::default();
        let always: Family<Labels, Gauge> = Family::default();
        let mechanism: Family<Labels, Gauge> = Family::default();
        for v in &p.vcpus {
            let cpu = ("cpu".to_string(), v.cpu.to_string());
            // prometheus-client writes an infinite float as `inf`, which OpenMetrics does not
            // read: "until work arrives" is a gauge of its own.
            always.get_or_create(&vec![cpu.clone()]).set(i64::from(v.window_ns == ALWAYS));
            if v.window_ns != ALWAYS {
                window.get_or_create(&vec![cpu.clone()]).set(v.window_ns as f64 / 1e9);
            }
            for m in [Mechanism::Halt, Mechanism::Poll, Mechanism::Yield] {
                let name = serde_json::to_value(m).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
                mechanism.get_or_create(&vec![cpu.clone(), ("mechanism".to_string(), name)]).set(i64::from(v.mechanism == m));
            }
        }
        reg.register(
            "vcpu_idle_window_seconds",
            "How long an idle vCPU is kept from halting (vCPUs kept until work arrives: see vcpu_idle_until_work)",
            window,
        );
        reg.register("vcpu_idle_until_work", "1 where an idle vCPU is kept from halting until work arrives", always);
        reg.register("vcpu_idle_mechanism", "What keeps each vCPU from halting (1 for the one in use)", mechanism);
        let g: Gauge<f64, AtomicU64> = Gauge::default();
        g.set(p.poll_window_ns as f64 / 1e9);
        reg.register("poll_window_seconds", "The haltpoll governor's cap (guest_halt_poll_ns) the agent set", g);
    }
    if let Some(w) = &i.wake {
        let count: Family<Labels, Gauge> = Family::default();
        let mean: Family<Labels, Gauge<f64, AtomicU64>> = Family::default();
        for (state, l) in [("busy", w.busy), ("poll", w.poll), ("halt", w.halt), ("idle", w.idle)] {
            let labels = vec![("target".to_string(), state.to_string())];
            count.get_or_create(&labels).set(i64::try_from(l.count).unwrap_or(i64::MAX));
            mean.get_or_create(&labels).set(l.mean_ns / 1e9);
        }
        reg.register("wakeups", "The workload's wakeups in the last traced period, by the state of the vCPU woken onto", count);
        reg.register("wakeup_latency_mean_seconds", "Their mean latency, sched_waking to running", mean);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::status::VcpuTimeout;

    #[test]
    fn prometheus_text_has_metrics() {
        let s = StatusReport {
            active_cpus: "0-1".into(),
            yields: 7,
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
        assert!(t.ends_with("# EOF\n"));
    }

    #[test]
    fn prometheus_text_has_the_idle_plan_and_traced_wakeups() {
        use gleaner_policy::idle::plan::ALWAYS;
        let mut plan = gleaner_policy::idle::IdlePlan::initial_poll([0, 1], 200_000);
        plan.vcpus[1].window_ns = ALWAYS;
        let mut wake = gleaner_policy::idle::WakeSummary::default();
        wake.poll.count = 9;
        wake.poll.mean_ns = 4_000.0;
        let s = StatusReport {
            idle: Some(crate::status::IdleStatus { plan: Some(plan), wake: Some(wake), poll_ns: 1_500_000_000, ..Default::default() }),
            ..StatusReport::default()
        };
        let t = prometheus_text(&s);
        assert!(t.contains("gleaner_kernel_polling_seconds_total 1.5"), "{t}");
        assert!(t.contains("gleaner_vcpu_idle_window_seconds{cpu=\"0\"} 0.0002"), "{t}");
        assert!(!t.contains("gleaner_vcpu_idle_window_seconds{cpu=\"1\"}") && !t.contains("inf"), "{t}");
        assert!(t.contains("gleaner_vcpu_idle_until_work{cpu=\"1\"} 1"), "{t}");
        assert!(t.contains("gleaner_vcpu_idle_mechanism{cpu=\"0\",mechanism=\"poll\"} 1"), "{t}");
        assert!(t.contains("gleaner_wakeups{target=\"poll\"} 9"), "{t}");
        assert!(t.contains("gleaner_wakeup_latency_mean_seconds{target=\"poll\"} 0.000004"), "{t}");
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
}
