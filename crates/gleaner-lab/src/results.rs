//! Result rows (one per measured run) and the per-mode summary: the survey's reduced
//! resource/temporal efficiency and omega against the native baseline
//! ([`gleaner_policy::overhead`]), Gleaner's speedup and the Gleaner paper's weighted speedup.

use std::collections::BTreeMap;

use gleaner_policy::overhead::{overhead, Side};
use serde::{Deserialize, Serialize};

/// The part of a `gleaner bench` JSON document the lab uses (parsed leniently).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct BenchRun {
    pub wall_ns: u64,
    pub user_ns: u64,
    pub sys_ns: u64,
    pub vcsw: u64,
    pub nivcsw: u64,
    pub idle_entries: Option<u64>,
    pub steal_ns: u64,
    pub cpus_available: u32,
    pub items: Option<u64>,
    pub throughput: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
struct BenchDoc {
    runs: Vec<BenchRun>,
}

/// The bench runs in a step's stdout: the first JSON object in it (other lines, e.g. from
/// the agent, are ignored). Errors say what was wrong.
pub fn parse_bench_output(stdout: &str) -> Result<Vec<BenchRun>, String> {
    let start = stdout.find('{').ok_or_else(|| "no JSON document in the output".to_string())?;
    let mut it = serde_json::Deserializer::from_str(&stdout[start..]).into_iter::<BenchDoc>();
    match it.next() {
        Some(Ok(doc)) if !doc.runs.is_empty() => Ok(doc.runs),
        Some(Ok(_)) => Err("bench JSON has no runs".into()),
        Some(Err(e)) => Err(format!("bad bench JSON: {e}")),
        None => Err("no JSON document in the output".into()),
    }
}

/// One measured run of the workload (native or in a guest) or of the co-runner.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Row {
    /// `native` or `vm`.
    pub env: String,
    /// `native-1`, `A`, `B`.
    pub instance: String,
    /// Gleaner mode in the guest (`off`, `on`, ...); `native` for baselines; `co-runner`.
    pub mode: String,
    /// Host `kvm.halt_poll_ns` setting (`default`, a number, or `n/a` under TCG).
    pub halt_poll: String,
    pub rep: u32,
    pub rc: i32,
    /// Guest-side (or native) measurements from the bench JSON.
    pub wall_ns: u64,
    pub cpu_ns: u64,
    pub vcsw: u64,
    pub nivcsw: u64,
    pub idle_entries: Option<u64>,
    pub steal_ns: u64,
    pub items: Option<u64>,
    pub throughput: Option<f64>,
    /// Host-side CPU time of the whole QEMU process during the step, and of each vCPU thread.
    pub host_cpu_ns: Option<u64>,
    pub host_vcpu_ns: Vec<u64>,
    /// Host-side window, seconds since the guest started.
    pub begin_s: f64,
    pub end_s: f64,
    /// The survey's gamma: ideal effective CPU count available to this run.
    pub gamma: f64,
    /// Co-runner throughput (items/s) while this step ran (oc).
    pub co_runner_rate: Option<f64>,
    pub error: Option<String>,
}

impl Row {
    /// CPU cost in the survey's sense: host-side for guests (all QEMU threads), rusage natively.
    pub fn cost_ns(&self) -> u64 {
        self.host_cpu_ns.unwrap_or(self.cpu_ns)
    }
    pub fn ok(&self) -> bool {
        self.rc == 0 && self.error.is_none() && self.wall_ns > 0
    }
}

pub const CSV_HEADER: &str = "env,instance,mode,halt_poll,rep,rc,wall_ns,cpu_ns,vcsw,nivcsw,idle_entries,steal_ns,items,throughput,host_cpu_ns,host_vcpu_ns,begin_s,end_s,gamma,co_runner_rate,error";

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or(String::new(), ToString::to_string)
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

pub fn rows_csv(rows: &[Row]) -> String {
    let mut s = String::from(CSV_HEADER);
    s.push('\n');
    for r in rows {
        let vcpus = r.host_vcpu_ns.iter().map(u64::to_string).collect::<Vec<_>>().join(";");
        let f = [
            r.env.clone(), r.instance.clone(), r.mode.clone(), r.halt_poll.clone(), r.rep.to_string(), r.rc.to_string(),
            r.wall_ns.to_string(), r.cpu_ns.to_string(), r.vcsw.to_string(), r.nivcsw.to_string(), opt(&r.idle_entries),
            r.steal_ns.to_string(), opt(&r.items), opt(&r.throughput), opt(&r.host_cpu_ns), vcpus,
            format!("{:.3}", r.begin_s), format!("{:.3}", r.end_s), r.gamma.to_string(), opt(&r.co_runner_rate),
            r.error.clone().unwrap_or_default(),
        ];
        s.push_str(&f.iter().map(|x| csv_field(x)).collect::<Vec<_>>().join(","));
        s.push('\n');
    }
    s
}

/// One line of the report's main table: a (halt poll, mode) cell for an instance.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SummaryRow {
    pub instance: String,
    pub mode: String,
    pub halt_poll: String,
    pub runs_ok: usize,
    pub runs: usize,
    pub wall_s: Option<f64>,
    /// Relative spread of the wall time ((p90 - p10) / median) when >= 3 runs.
    pub wall_spread: Option<f64>,
    pub guest_cpu_s: Option<f64>,
    pub host_cpu_s: Option<f64>,
    pub host_vcpu_s: Vec<f64>,
    pub idle_entries: Option<f64>,
    pub d_eta_r: Option<f64>,
    pub d_eta_t: Option<f64>,
    pub omega: Option<f64>,
    /// Wall time of the stock mode / this mode, same instance and halt-poll setting.
    pub speedup: Option<f64>,
    pub co_runner_rate: Option<f64>,
    /// Gleaner paper 7.2.1: mean of the workload's and the co-runner's speedups vs stock.
    pub weighted_speedup: Option<f64>,
}

fn median(v: &[f64]) -> Option<f64> {
    gleaner_policy::stats::median(v).ok()
}

/// Builds the summary. `stock` is the name of the mode without Gleaner (speedups relative to it).
pub fn summarize(rows: &[Row], stock: &str) -> Vec<SummaryRow> {
    let native: Vec<&Row> = rows.iter().filter(|r| r.env == "native" && r.ok()).collect();
    let native_side = (!native.is_empty()).then(|| Side {
        cpu: median(&native.iter().map(|r| r.cpu_ns as f64).collect::<Vec<_>>()).unwrap_or(0.0),
        wall: median(&native.iter().map(|r| r.wall_ns as f64).collect::<Vec<_>>()).unwrap_or(0.0),
        gamma: native[0].gamma,
    });
    let mut groups: BTreeMap<(String, String, String, String), Vec<&Row>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.mode != "co-runner") {
        groups.entry((r.env.clone(), r.halt_poll.clone(), r.instance.clone(), r.mode.clone())).or_default().push(r);
    }
    let mut out: Vec<SummaryRow> = Vec::new();
    for ((env, hp, inst, mode), rs) in &groups {
        let ok: Vec<&&Row> = rs.iter().filter(|r| r.ok()).collect();
        let walls: Vec<f64> = ok.iter().map(|r| r.wall_ns as f64).collect();
        let wall = median(&walls);
        let host = if env == "vm" { median(&ok.iter().filter_map(|r| r.host_cpu_ns).map(|x| x as f64).collect::<Vec<_>>()) } else { None };
        let nv = ok.iter().map(|r| r.host_vcpu_ns.len()).max().unwrap_or(0);
        let host_vcpu_s = (0..nv)
            .filter_map(|i| median(&ok.iter().filter_map(|r| r.host_vcpu_ns.get(i)).map(|&x| x as f64).collect::<Vec<_>>()))
            .map(|x| x / 1e9)
            .collect();
        let (d_eta_r, d_eta_t, omega) = match (env.as_str(), native_side, wall, host) {
            ("vm", Some(base), Some(w), Some(c)) => {
                match overhead(base, Side { cpu: c, wall: w, gamma: ok[0].gamma }) {
                    Ok(o) => (Some(o.d_eta_r), Some(o.d_eta_t), Some(o.omega)),
                    Err(_) => (None, None, None),
                }
            }
            _ => (None, None, None),
        };
        let spread = gleaner_policy::stats::Summary::of(&walls).ok().filter(|_| walls.len() >= 3).map(|s| s.relative_spread());
        out.push(SummaryRow {
            instance: inst.clone(),
            mode: mode.clone(),
            halt_poll: hp.clone(),
            runs_ok: ok.len(),
            runs: rs.len(),
            wall_s: wall.map(|w| w / 1e9),
            wall_spread: spread,
            guest_cpu_s: median(&ok.iter().map(|r| r.cpu_ns as f64).collect::<Vec<_>>()).map(|x| x / 1e9),
            host_cpu_s: host.map(|x| x / 1e9),
            host_vcpu_s,
            idle_entries: median(&ok.iter().filter_map(|r| r.idle_entries).map(|x| x as f64).collect::<Vec<_>>()),
            d_eta_r,
            d_eta_t,
            omega,
            speedup: None,
            co_runner_rate: median(&ok.iter().filter_map(|r| r.co_runner_rate).collect::<Vec<_>>()),
            weighted_speedup: None,
        });
    }
    // Speedups relative to the stock mode of the same instance and halt-poll setting.
    let snapshot = out.clone();
    for s in &mut out {
        if s.mode == "native" {
            continue;
        }
        let Some(base) = snapshot.iter().find(|b| b.instance == s.instance && b.halt_poll == s.halt_poll && b.mode == stock) else { continue };
        if let (Some(bw), Some(w)) = (base.wall_s, s.wall_s) {
            s.speedup = Some(bw / w);
            if let (Some(br), Some(r)) = (base.co_runner_rate, s.co_runner_rate) {
                if br > 0.0 {
                    s.weighted_speedup = Some(0.5 * (bw / w + r / br));
                }
            }
        }
    }
    out
}

/// Items per second a co-runner achieved during `[begin, end]` (host seconds on a common
/// clock): each co-runner iteration contributes its items in proportion to its overlap.
pub fn co_runner_rate(begin: f64, end: f64, iterations: &[(f64, f64, u64)]) -> Option<f64> {
    if end <= begin {
        return None;
    }
    let mut items = 0.0;
    let mut any = false;
    for &(b, e, n) in iterations {
        let overlap = (e.min(end) - b.max(begin)).max(0.0);
        if overlap > 0.0 && e > b {
            items += n as f64 * overlap / (e - b);
            any = true;
        }
    }
    any.then(|| items / (end - begin))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bench_json_with_noise() {
        let out = "agent: started\n{\"kind\":\"workload\",\"name\":\"pipeline\",\"runs\":[{\"wall_ns\":100,\"user_ns\":50,\"sys_ns\":5,\"vcsw\":9,\"idle_entries\":null,\"future_field\":1}],\"summary\":{}}\ntrailing";
        let r = parse_bench_output(out).unwrap();
        assert_eq!(r[0].wall_ns, 100);
        assert_eq!(r[0].user_ns, 50);
        assert_eq!(r[0].idle_entries, None);
    }

    #[test]
    fn malformed_and_empty_bench_output() {
        assert!(parse_bench_output("{\"runs\": [").unwrap_err().contains("bad bench JSON"));
        assert!(parse_bench_output("{\"runs\": []}").unwrap_err().contains("no runs"));
        assert!(parse_bench_output("").unwrap_err().contains("no JSON"));
    }

    #[allow(clippy::too_many_arguments)]
    fn row(env: &str, inst: &str, mode: &str, wall: u64, cpu: u64, host: Option<u64>, gamma: f64, rate: Option<f64>) -> Row {
        Row { env: env.into(), instance: inst.into(), mode: mode.into(), halt_poll: "n/a".into(), wall_ns: wall, cpu_ns: cpu, host_cpu_ns: host, gamma, co_runner_rate: rate, ..Default::default() }
    }

    #[test]
    fn summary_computes_survey_metrics_and_weighted_speedup() {
        let rows = vec![
            row("native", "native-1", "native", 1_000, 1_500, None, 2.0, None),
            row("vm", "A", "off", 4_000, 3_000, Some(6_000), 1.0, Some(10.0)),
            row("vm", "A", "on", 2_000, 3_000, Some(4_000), 1.0, Some(8.0)),
        ];
        let s = summarize(&rows, "off");
        let on = s.iter().find(|r| r.mode == "on").unwrap();
        let off = s.iter().find(|r| r.mode == "off").unwrap();
        // d_eta_r = (4000 - 1500) / 1500; d_eta_t = (2000*1 - 1000*2) / 2000 = 0.
        assert!((on.d_eta_r.unwrap() - 2500.0 / 1500.0).abs() < 1e-9);
        assert!(on.d_eta_t.unwrap().abs() < 1e-9);
        assert!((on.omega.unwrap() - 1500.0 / 4000.0).abs() < 1e-9);
        assert_eq!(on.speedup, Some(2.0));
        // WS = (2.0 + 8/10) / 2
        assert!((on.weighted_speedup.unwrap() - 1.4).abs() < 1e-9);
        assert_eq!(off.weighted_speedup, Some(1.0));
        let native = s.iter().find(|r| r.mode == "native").unwrap();
        assert_eq!(native.d_eta_r, None);
    }

    #[test]
    fn failed_runs_are_excluded() {
        let mut bad = row("vm", "A", "off", 4_000, 3_000, Some(6_000), 1.0, None);
        bad.rc = 1;
        let s = summarize(&[bad], "off");
        assert_eq!(s[0].runs_ok, 0);
        assert_eq!(s[0].wall_s, None);
        assert!(summarize(&[], "off").is_empty());
    }

    #[test]
    fn co_runner_rate_by_overlap() {
        // Two iterations of 10 items: [0,2] and [2,4]; window [1,3] gets half of each.
        let r = co_runner_rate(1.0, 3.0, &[(0.0, 2.0, 10), (2.0, 4.0, 10)]).unwrap();
        assert!((r - 5.0).abs() < 1e-9);
        assert_eq!(co_runner_rate(5.0, 6.0, &[(0.0, 2.0, 10)]), None);
        assert_eq!(co_runner_rate(1.0, 1.0, &[]), None);
    }

    #[test]
    fn csv_has_header_and_quotes() {
        let mut r = row("vm", "A", "on", 1, 1, Some(2), 1.0, None);
        r.host_vcpu_ns = vec![1, 2];
        r.error = Some("bad, \"x\"".into());
        let csv = rows_csv(&[r]);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], CSV_HEADER);
        assert!(lines[1].contains(",1;2,"));
        assert!(lines[1].ends_with("\"bad, \"\"x\"\"\""));
        assert_eq!(lines[0].split(',').count(), 21);
    }
}
