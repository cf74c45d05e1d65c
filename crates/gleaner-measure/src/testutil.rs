//! Test records shared by this crate's tests and the simulator's (feature `testutil`, which
//! only `[dev-dependencies]` turn on): one calibration record, so the reader here and the
//! simulator's reading of it are tested on the same text.

/// A wake-cost curve as a calibration record's `results.curve` holds it (JSON): one gap of
/// 10 us (C 29 us median), B 17 us, P 6 us.
pub const CALIBRATION_CURVE: &str =
    r#"{"halted": [{"gap_ns": 10000, "mean_ns": 30000, "p50_ns": 29000}], "busy_ns": 17000, "poll_ns": 6000}"#;

/// An agent calibration record (`crate::calibration::CalibrationRecord`) of schema `schema`
/// holding `curve` (JSON), its other fields placeholders (waker CPU 0, waiter CPU 1, no
/// cpuidle driver).
pub fn calibration_record(schema: &str, curve: &str) -> String {
    format!(
        r#"{{"schema": {schema}, "depends_on": {{"boot_id": "b", "kernel_release": "6.18", "online_cpus": "0-1", "waker_cpu": 0,
        "waiter_cpu": 1, "cpuidle_driver": null, "cpuidle_governor": null}}, "measured_at_unix_s": 1, "measured_at_boottime_ms": 2,
        "took_ms": 3, "results": {{"curve": {curve}, "idle_threshold_ns": 10000, "polling": {{"halted": "h", "poll": "p"}}}}}}"#
    )
}
