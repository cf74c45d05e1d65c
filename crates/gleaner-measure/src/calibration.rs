//! The agent's calibration record (`RUN_DIR/calibration.json`): what a calibration measured
//! (the wake-cost curve, the yielders' idle threshold), what it depends on, and its schema.
//! The agent writes and reuses it (`gleaner_agent::cache`); the simulator takes a VM's wake
//! costs from it (`gleaner sim --from-calibration`) and the lab reads the agent's reports of
//! it: one type, here below all of them.

use gleaner_os::cpuset::CpuSet;
use gleaner_os::procfs::Procfs;
use gleaner_os::sysfs::Sysfs;
use gleaner_policy::idle::WakeCurve;
use serde::{Deserialize, Serialize};

use crate::wakeup::WakeupConfig;

/// Version of the record's meaning; a record of another version is measured again.
/// 3: a wake-cost curve (halted after 10 us .. 10 ms, busy, polling), measured with kernel
/// polling controlled; 2: three wakeup means and a timeout; 1: medians.
pub const SCHEMA: u32 = 3;

/// What each schema held, for the message that refuses an old record.
pub fn schema_meaning(v: u64) -> &'static str {
    match v {
        1 => "three wakeup medians and a retention timeout",
        2 => "three wakeup means and a retention timeout",
        _ => "unknown to this gleaner",
    }
}

/// The record of the first two online vCPUs (the default managed set).
pub const FILE_NAME: &str = "calibration.json";

/// Where the agent keeps the record of its default vCPUs (its default run dir, [`FILE_NAME`]).
pub const DEFAULT_PATH: &str = "/run/gleaner/calibration.json";

/// What a calibration depends on: when any of it changes, the numbers are measured again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dependencies {
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// `uname -r`.
    pub kernel_release: String,
    /// `/sys/devices/system/cpu/online`.
    pub online_cpus: String,
    /// The vCPU that wakes and the vCPU that waits in the wakeup measurement.
    pub waker_cpu: u32,
    pub waiter_cpu: u32,
    /// cpuidle driver and governor (`None`: no cpuidle). The haltpoll parameters are not a
    /// dependency: the measurement sets them itself (kernel polling off for the halted curve,
    /// on for the polling cost), and agents change them while they run.
    pub cpuidle_driver: Option<String>,
    pub cpuidle_governor: Option<String>,
}

/// One dependency that differs between a record and the machine now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DependencyChange {
    /// e.g. `boot id`, `cpuidle governor`, `haltpoll parameter guest_halt_poll_ns`.
    pub dependency: String,
    pub was: String,
    pub now: String,
}

impl Dependencies {
    /// Reads them from the machine (fixtures through the adapters' roots).
    pub fn read(procfs: &Procfs, sysfs: &Sysfs, cpus: &CpuSet) -> gleaner_os::Result<Self> {
        let (waker_cpu, waiter_cpu) = measured_pair(cpus);
        Ok(Self {
            boot_id: procfs.boot_id()?,
            kernel_release: procfs.kernel_release()?,
            online_cpus: sysfs.online_cpus()?.to_string(),
            waker_cpu,
            waiter_cpu,
            cpuidle_driver: sysfs.cpuidle_driver()?,
            cpuidle_governor: sysfs.cpuidle_governor()?,
        })
    }

    /// The first dependency of `self` (the record's) that differs in `now`.
    pub fn first_change(&self, now: &Self) -> Option<DependencyChange> {
        let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "none".into());
        let scalars = [
            ("boot id", self.boot_id.clone(), now.boot_id.clone()),
            ("kernel release", self.kernel_release.clone(), now.kernel_release.clone()),
            ("online CPUs", self.online_cpus.clone(), now.online_cpus.clone()),
            ("measured vCPUs", format!("{} -> {}", self.waker_cpu, self.waiter_cpu), format!("{} -> {}", now.waker_cpu, now.waiter_cpu)),
            ("cpuidle driver", opt(&self.cpuidle_driver), opt(&now.cpuidle_driver)),
            ("cpuidle governor", opt(&self.cpuidle_governor), opt(&now.cpuidle_governor)),
        ];
        for (name, was, is) in scalars {
            if was != is {
                return Some(DependencyChange { dependency: name.into(), was, now: is });
            }
        }
        None
    }
}

/// The measured numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalibrationResults {
    /// The wake-cost curve: halted after each gap, busy (a yielder), polling (POLL state).
    pub curve: WakeCurve,
    /// A yield longer than this means the workload ran.
    pub idle_threshold_ns: u64,
    /// What was done to kernel polling while measuring.
    pub polling: PollingControl,
}

/// How kernel polling was controlled while the curve was measured (for people).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PollingControl {
    /// For the halted curve and B, e.g. `guest_halt_poll_ns 0`.
    pub halted: String,
    /// For P, e.g. `cpu1 resume latency limit 0 (n/a)`, or why it was not measured.
    pub poll: String,
}

/// The stored calibration of one boot: what it depends on, when and how long it took, the
/// numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalibrationRecord {
    pub schema: u32,
    pub depends_on: Dependencies,
    /// Wall clock at the measurement (for people).
    pub measured_at_unix_s: u64,
    /// `CLOCK_BOOTTIME` at the measurement (ages are computed from it: it does not jump).
    pub measured_at_boottime_ms: u64,
    /// How long the measurement took.
    pub took_ms: u64,
    pub results: CalibrationResults,
}

/// The two vCPUs the wakeup measurement uses for `cpus`: (waker, waiter).
pub fn measured_pair(cpus: &CpuSet) -> (u32, u32) {
    let c = WakeupConfig::for_cpus(cpus);
    (c.waker_cpu, c.waiter_cpu)
}

/// Why bytes are not a record of this schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("not JSON ({0})")]
    NotJson(String),
    /// The schema is another (`found`), or missing (`None`).
    #[error("schema {}; this gleaner reads schema {SCHEMA} (a wake-cost curve)", found.map_or("missing".to_string(), |v| format!("{v} ({})", schema_meaning(v))))]
    Schema { found: Option<u64> },
    /// The schema is this one but a field is missing or wrong.
    #[error("not a calibration record ({0})")]
    Invalid(String),
}

impl CalibrationRecord {
    /// Reads a record: the schema first, so that a record of another schema is refused by
    /// what it is rather than by the first field this gleaner does not know.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, RecordError> {
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| RecordError::NotJson(e.to_string()))?;
        let found = value.get("schema").and_then(serde_json::Value::as_u64);
        if found != Some(u64::from(SCHEMA)) {
            return Err(RecordError::Schema { found });
        }
        serde_json::from_value(value).map_err(|e| RecordError::Invalid(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{calibration_record as record, CALIBRATION_CURVE as CURVE};

    #[test]
    fn a_record_reads_and_others_say_why_not() {
        let r = CalibrationRecord::from_slice(record("3", CURVE).as_bytes()).expect("valid");
        assert_eq!((r.results.curve.busy_ns, r.depends_on.waiter_cpu), (17_000, 1));
        assert_eq!(CalibrationRecord::from_slice(b"{not json").unwrap_err().to_string().split(' ').next(), Some("not"));
        let old = CalibrationRecord::from_slice(record("2", "{}").as_bytes()).unwrap_err();
        assert_eq!(old, RecordError::Schema { found: Some(2) });
        assert!(old.to_string().contains("three wakeup means") && old.to_string().contains("schema 3"), "{old}");
        assert_eq!(CalibrationRecord::from_slice(b"[]").unwrap_err(), RecordError::Schema { found: None });
        let e = CalibrationRecord::from_slice(record("3", &CURVE.replace("\"busy_ns\": 17000, ", "")).as_bytes()).unwrap_err();
        assert!(matches!(&e, RecordError::Invalid(m) if m.contains("busy_ns")), "{e}");
        assert!(CalibrationRecord::from_slice(b"").is_err());
    }
}
