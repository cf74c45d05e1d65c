//! `--metrics-addr`: Prometheus text exposition on a tiny HTTP server thread.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use gleaner_policy::aql::{Classification, Plan, VcpuId};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// The host agent's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    cursor: Family<Labels, Gauge<f64, AtomicU64>>,
    class: Family<Labels, Gauge>,
    pool_pcpus: Family<Labels, Gauge>,
    pool_vcpus: Family<Labels, Gauge>,
    pool_quantum: Family<Labels, Gauge<f64, AtomicU64>>,
    periods: Counter,
    plan_changes: Counter,
    text: Arc<Mutex<String>>,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("gleaner_host");
        let cursor = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        let class = Family::<Labels, Gauge>::default();
        let pool_pcpus = Family::<Labels, Gauge>::default();
        let pool_vcpus = Family::<Labels, Gauge>::default();
        let pool_quantum = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        let periods = Counter::default();
        let plan_changes = Counter::default();
        registry.register("vcpu_cursor_percent", "Window-average type cursor of a vCPU (absent: source missing)", cursor.clone());
        registry.register("vcpu_class", "1 for the vCPU's current class", class.clone());
        registry.register("pool_pcpus", "pCPUs in a pool", pool_pcpus.clone());
        registry.register("pool_vcpus", "vCPUs in a pool", pool_vcpus.clone());
        registry.register("pool_quantum_seconds", "EEVDF slice of the pool's vCPU threads", pool_quantum.clone());
        registry.register("periods", "Monitoring periods", periods.clone());
        registry.register("plan_changes", "Plans applied that differed from the previous one", plan_changes.clone());
        Self {
            registry,
            cursor,
            class,
            pool_pcpus,
            pool_vcpus,
            pool_quantum,
            periods,
            plan_changes,
            text: Arc::new(Mutex::new(String::new())),
        }
    }

    pub fn period(&self) {
        self.periods.inc();
    }

    /// Updates the vCPU and pool series and re-renders the text.
    pub fn update(&self, classes: &[(VcpuId, String, Classification)], plan: &Plan, changed: bool) {
        if changed {
            self.plan_changes.inc();
        }
        self.cursor.clear();
        self.class.clear();
        for (id, vm, c) in classes {
            let base =
                vec![("vm".to_string(), vm.clone()), ("pid".to_string(), id.vm.to_string()), ("vcpu".to_string(), id.vcpu.to_string())];
            let a = &c.averages;
            let put = |name: &str, v: Option<f64>| {
                if let Some(v) = v {
                    let mut l = base.clone();
                    l.push(("cursor".into(), name.into()));
                    self.cursor.get_or_create(&l).set(v);
                }
            };
            put("IOInt", a.io_int);
            put("ConSpin", a.con_spin);
            put("LLCF", a.cache.map(|k| k.llcf));
            put("LoLCF", a.cache.map(|k| k.lolcf));
            put("LLCO", a.cache.map(|k| k.llco));
            let mut l = base.clone();
            l.push(("class".into(), c.class.name().into()));
            self.class.get_or_create(&l).set(1);
        }
        self.pool_pcpus.clear();
        self.pool_vcpus.clear();
        self.pool_quantum.clear();
        for p in &plan.pools {
            let l = vec![("pool".to_string(), p.name.clone())];
            self.pool_pcpus.get_or_create(&l).set(i64::try_from(p.pcpus.len()).unwrap_or(i64::MAX));
            self.pool_vcpus.get_or_create(&l).set(i64::try_from(p.vcpus.len()).unwrap_or(i64::MAX));
            self.pool_quantum.get_or_create(&l).set(p.quantum_ns as f64 / 1e9);
        }
        self.render();
    }

    pub fn render(&self) -> String {
        let mut s = String::new();
        if encode(&mut s, &self.registry).is_err() {
            s.clear();
        }
        if let Ok(mut t) = self.text.lock() {
            t.clone_from(&s);
        }
        s
    }

    /// Serves the last rendered text at any path of `addr`, from a background thread.
    pub fn serve(&self, addr: SocketAddr) -> anyhow::Result<SocketAddr> {
        let l = TcpListener::bind(addr).map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
        let local = l.local_addr()?;
        let text = Arc::clone(&self.text);
        std::thread::Builder::new().name("gleaner-metrics".into()).spawn(move || {
            for mut s in l.incoming().flatten() {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf);
                let body = text.lock().map(|t| t.clone()).unwrap_or_default();
                let _ = write!(
                    s,
                    "HTTP/1.0 200 OK\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\nContent-Length: {}\r\n\r\n{}",
                    body.len(),
                    body
                );
            }
        })?;
        Ok(local)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gleaner_policy::aql::*;

    #[test]
    fn renders_and_serves() {
        let m = Metrics::new();
        let mut r = TypeRecognizer::new(1, Limits::default());
        let id = VcpuId { vm: 42, vcpu: 0 };
        r.observe(id, &VcpuCounters { period_ns: 30_000_000, io_events: Some(300), ..Default::default() });
        let c = r.classify(id).unwrap();
        let p = plan(&[VcpuInfo::from_classification(id, &c)], &Topology::uniform(1, 2), &Quanta::paper());
        m.period();
        m.update(&[(id, "web".into(), c)], &p, true);
        let addr = m.serve("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        assert!(body.starts_with("HTTP/1.0 200 OK"), "{body}");
        assert!(body.contains(r#"gleaner_host_vcpu_cursor_percent{vm="web",pid="42",vcpu="0",cursor="IOInt"} 100.0"#), "{body}");
        assert!(body.contains(r#"gleaner_host_vcpu_class{vm="web",pid="42",vcpu="0",class="IOInt"} 1"#), "{body}");
        assert!(body.contains(r#"gleaner_host_pool_quantum_seconds{pool="s0-1ms"} 0.001"#), "{body}");
        assert!(!body.contains("ConSpin"), "missing sources must not appear: {body}");
    }
}
