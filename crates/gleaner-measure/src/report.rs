//! Result documents (`--json`) and their provenance: written by `gleaner bench` with
//! [`write_document`], read back as the same types by `bench overhead` ([`BenchDoc::load`]) and
//! from a guest's output by the lab ([`from_output`]).

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use gleaner_os::procfs::Procfs;
use gleaner_os::sysfs::Sysfs;
use gleaner_os::BadInput;
use gleaner_policy::stats::Summary;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::measure::RunMetrics;
use crate::wakeup::{Primitive, SettingResult};

/// Where and when a result was measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HostInfo {
    pub kernel: String,
    /// Online CPUs.
    pub cpus: u32,
    /// CPUs this process was allowed to use (kernel list format).
    pub allowed_cpus: String,
    pub virtualized: bool,
    pub hypervisor: Option<String>,
    pub cpuidle_driver: Option<String>,
    pub cpuidle_governor: Option<String>,
    /// `git rev-parse` of the gleaner source tree, when available.
    pub git_revision: Option<String>,
    /// UTC, RFC 3339.
    pub date: String,
}

impl HostInfo {
    pub fn collect(procfs: &Procfs, sysfs: &Sysfs) -> HostInfo {
        let virt = gleaner_os::virt::detect(procfs, sysfs).unwrap_or_default();
        HostInfo {
            kernel: gleaner_os::kernel_release(),
            cpus: sysfs.online_cpus().map(|c| u32::try_from(c.len()).unwrap_or(0)).unwrap_or(0),
            allowed_cpus: crate::measure::allowed_cpu_set().to_string(),
            virtualized: virt.virtualized,
            hypervisor: virt.hypervisor,
            cpuidle_driver: sysfs.cpuidle_driver().ok().flatten(),
            cpuidle_governor: sysfs.cpuidle_governor().ok().flatten(),
            git_revision: git_revision(),
            date: utc_now(),
        }
    }
}

fn git_revision() -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "--short=12", "HEAD"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string()).filter(|s| !s.is_empty())
}

/// Current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    format_utc(secs)
}

/// Format seconds since the epoch (civil-from-days, Howard Hinnant's algorithm).
pub fn format_utc(secs: u64) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Summary of several runs (all statistics over runs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub runs: usize,
    pub wall_ns: Summary,
    /// user + sys.
    pub cpu_ns: Summary,
    pub user_ns: Summary,
    pub sys_ns: Summary,
    pub vcsw: Summary,
    pub nivcsw: Summary,
    pub steal_ns: Summary,
    pub idle_entries: Option<Summary>,
    pub idle_entries_per_s: Option<Summary>,
    pub throughput: Option<Summary>,
}

fn summ(runs: &[RunMetrics], f: impl Fn(&RunMetrics) -> f64) -> anyhow::Result<Summary> {
    let v: Vec<f64> = runs.iter().map(f).collect();
    Summary::of(&v).context("summarizing runs")
}

fn summ_opt(runs: &[RunMetrics], f: impl Fn(&RunMetrics) -> Option<f64>) -> Option<Summary> {
    let v: Option<Vec<f64>> = runs.iter().map(f).collect();
    v.and_then(|v| Summary::of(&v).ok())
}

impl RunSummary {
    pub fn of(runs: &[RunMetrics]) -> anyhow::Result<RunSummary> {
        Ok(RunSummary {
            runs: runs.len(),
            wall_ns: summ(runs, |r| r.wall_ns as f64)?,
            cpu_ns: summ(runs, |r| r.cpu_ns() as f64)?,
            user_ns: summ(runs, |r| r.user_ns as f64)?,
            sys_ns: summ(runs, |r| r.sys_ns as f64)?,
            vcsw: summ(runs, |r| r.vcsw as f64)?,
            nivcsw: summ(runs, |r| r.nivcsw as f64)?,
            steal_ns: summ(runs, |r| r.steal_ns as f64)?,
            idle_entries: summ_opt(runs, |r| r.idle_entries.map(|x| x as f64)),
            idle_entries_per_s: summ_opt(runs, |r| r.idle_entries_per_s),
            throughput: summ_opt(runs, |r| r.throughput),
        })
    }
}

/// The document of `bench workload --json` and `bench run --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchDoc {
    /// `workload` or `run`.
    pub kind: String,
    /// Kernel name, or the command line.
    pub name: String,
    /// Kernel parameters, or `{ "command": [...] }`.
    pub params: serde_json::Value,
    pub runs: Vec<RunMetrics>,
    pub summary: RunSummary,
    pub host: HostInfo,
}

impl BenchDoc {
    /// Read a result file; unreadable or malformed files are [`BadInput`].
    pub fn load(path: &Path) -> anyhow::Result<BenchDoc> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            BadInput::new("result file", path.display(), format!("a readable file written by `gleaner bench workload|run --json` ({e})"))
        })?;
        let doc: BenchDoc = serde_json::from_str(&text).map_err(|e| {
            BadInput::new("result file", path.display(), format!("a JSON document of `gleaner bench workload|run --json` ({e})"))
        })?;
        if doc.runs.is_empty() {
            return Err(BadInput::new("result file", path.display(), "a document with at least one run").into());
        }
        Ok(doc)
    }
}

/// The document of `bench wakeup --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WakeupDoc {
    /// Always `wakeup`.
    pub kind: String,
    /// The primitive measured (written by name; a document that describes it in words, as
    /// `bench wakeup` wrote it before, reads too).
    #[serde(deserialize_with = "primitive_by_name_or_description")]
    pub primitive: Primitive,
    pub rounds: u32,
    pub warmup: u32,
    pub period_us: u64,
    pub settings: Vec<SettingResult>,
    pub host: HostInfo,
}

fn primitive_by_name_or_description<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Primitive, D::Error> {
    let s = String::deserialize(d)?;
    [Primitive::Condvar, Primitive::Mutex]
        .into_iter()
        .find(|p| serde_json::to_value(p).is_ok_and(|v| v == s.as_str()) || p.describe() == s)
        .ok_or_else(|| serde::de::Error::custom(format!("primitive '{s}': allowed condvar, mutex")))
}

/// Write `doc` as `gleaner bench ... --json` prints it: pretty JSON and a newline.
pub fn write_document<T: Serialize>(mut out: impl Write, doc: &T) -> std::io::Result<()> {
    serde_json::to_writer_pretty(&mut out, doc)?;
    writeln!(out)
}

/// Why a command's output held no document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutputError {
    #[error("no JSON document in the output")]
    Missing,
    /// `error` is why the document did not parse; `whole` why the whole output did not.
    #[error("bad bench JSON: {error} (whole output: {whole})")]
    Malformed { error: String, whole: String },
}

/// The document in a command's output: the whole output, or else the first JSON object in it
/// (from the first `{`, then from each later line that starts with `{`) when other lines were
/// printed too, as a guest's console shows them. What follows the document is ignored.
pub fn from_output<T: DeserializeOwned>(stdout: &str) -> Result<T, OutputError> {
    let t = stdout.trim();
    let whole = match serde_json::from_str::<T>(t) {
        Ok(d) => return Ok(d),
        Err(e) => e.to_string(),
    };
    let first = t.find('{').ok_or(OutputError::Missing)?;
    let line_starts = t[first..].match_indices("\n{").map(|(i, _)| first + i + 1);
    let mut error = None;
    for start in std::iter::once(first).chain(line_starts) {
        match serde_json::Deserializer::from_str(&t[start..]).into_iter::<T>().next() {
            Some(Ok(d)) => return Ok(d),
            Some(Err(e)) => {
                error.get_or_insert_with(|| e.to_string());
            }
            None => {}
        }
    }
    Err(error.map_or(OutputError::Missing, |error| OutputError::Malformed { error, whole }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(items: u64) -> BenchDoc {
        let run = RunMetrics { wall_ns: 100, user_ns: 50, sys_ns: 5, items: Some(items), ..Default::default() };
        BenchDoc {
            kind: "workload".into(),
            name: "pipeline".into(),
            params: serde_json::json!({}),
            summary: RunSummary::of(std::slice::from_ref(&run)).unwrap(),
            runs: vec![run],
            host: HostInfo::default(),
        }
    }

    fn written(d: &BenchDoc) -> String {
        let mut out = Vec::new();
        write_document(&mut out, d).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn reads_the_document_alone_or_among_other_lines() {
        let d = doc(7);
        assert_eq!(from_output::<BenchDoc>(&written(&d)).unwrap(), d);
        // An agent's JSON event line before the document: the next line starting with `{`.
        let noisy = format!("gleaner: started\n{{\"event\":\"start\"}}\n{}trailing", written(&d));
        assert_eq!(from_output::<BenchDoc>(&noisy).unwrap(), d);
    }

    #[test]
    fn a_latency_kernels_document_reads_back_with_its_latency() {
        let mut d = doc(3);
        let mut lat = crate::measure::LatencySummary::of(&[1_000, 2_000, 90_000]).unwrap();
        lat.requested_per_s = Some(2000.0);
        lat.achieved_per_s = Some(1990.0);
        d.name = "openloop".into();
        d.runs[0].latency = Some(lat);
        let text = written(&d);
        assert!(text.contains("\"p999_ns\""), "{text}");
        assert_eq!(from_output::<BenchDoc>(&text).unwrap(), d);
        // Throughput kernels' documents do not change: no latency key.
        assert!(!written(&doc(3)).contains("latency"));
    }

    #[test]
    fn malformed_and_empty_output() {
        assert!(matches!(from_output::<BenchDoc>("{\"runs\": ["), Err(OutputError::Malformed { .. })));
        assert_eq!(from_output::<BenchDoc>(""), Err(OutputError::Missing));
        assert_eq!(from_output::<BenchDoc>("nothing here"), Err(OutputError::Missing));
    }

    #[test]
    fn utc_formatting() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_utc(1_700_000_000), "2023-11-14T22:13:20Z");
    }
}
