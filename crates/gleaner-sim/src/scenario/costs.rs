//! A scenario's costs: Table 2's wake-up latencies decomposed into the model's costs, or a
//! calibration record's wake-cost curve in their place, and how the run uses it.

use std::path::{Path, PathBuf};

use gleaner_measure::calibration::{self, CalibrationRecord, RecordError};
use gleaner_measure::report::WakeupDoc;
use gleaner_measure::wakeup::Setting;
use gleaner_policy::idle::WakeCurve;
use gleaner_policy::input::BadInput;
use gleaner_policy::num::saturating_u64;
use serde::{Deserialize, Serialize};

use super::bad;

/// Wake-up latencies of Table 2's four settings, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Table2 {
    pub a_us: f64,
    pub b_us: f64,
    pub c_us: f64,
    pub d_us: f64,
}

/// Costs of the model. By default Table 2 of the Gleaner paper; `bench_json` replaces the VM
/// column with the medians of a `gleaner bench wakeup --json` file; `calibration` takes the
/// VM's wake costs from the agent's calibration record ([`Costs::from_calibration`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CostsCfg {
    pub bench_json: Option<PathBuf>,
    /// The agent's calibration record (`/run/gleaner/calibration.json`, `gleaner calibrate
    /// --json`): RT, IPI, RV by gap and the POLL state from its wake-cost curve (`gleaner sim
    /// --from-calibration` overrides it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibration: Option<PathBuf>,
    pub vm: Table2,
    pub pm: Table2,
    /// CPU time the sender spends on an IPI (the ICR-write exit), in a VM.
    pub ipi_send_us: f64,
    /// Extra latency to resume a vCPU that KVM was halt-polling.
    pub poll_wake_us: f64,
    /// Host CPU time of one pause-loop exit.
    pub ple_exit_us: f64,
}

impl Default for CostsCfg {
    fn default() -> Self {
        Self {
            bench_json: None,
            calibration: None,
            vm: Table2 { a_us: 6.0, b_us: 17.0, c_us: 37.0, d_us: 96.0 },
            pm: Table2 { a_us: 4.0, b_us: 8.0, c_us: 8.0, d_us: 17.0 },
            ipi_send_us: 1.0,
            poll_wake_us: 2.0,
            ple_exit_us: 1.0,
        }
    }
}

/// Costs of one world (VM or native), in nanoseconds, derived from a Table 2 column:
/// `A = RT`, `B = IPI + YW + RT`, `C = IPI + RV + RT`, `D = IPI + PV + RV + RT`, where only
/// one of `RV` (a halted vCPU is slower to wake, as on KVM) and `YW` (a vCPU running a
/// yielding thread is slower to wake, as under QEMU TCG) is non-zero. RV may depend on how
/// long the vCPU was halted (`rv_by_gap`, from a calibration: [`Costs::rv_at`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Costs {
    /// Guest thread switch (RT).
    pub rt: u64,
    /// IPI delivery latency.
    pub ipi: u64,
    /// Resuming a halted vCPU on an idle pCPU (RV; a C1 exit natively); with `rv_by_gap`, its
    /// value after the longest gap (the curve decides).
    pub rv: u64,
    /// Extra delivery latency when the target vCPU runs a yielding thread instead of halting
    /// (YW = B - C when B > C, else 0).
    pub yield_wake: u64,
    /// Taking the pCPU from another vCPU (PV: exit, switch, cache and TLB refill).
    pub pv: u64,
    pub ipi_send: u64,
    pub poll_wake: u64,
    pub ple_exit: u64,
    /// Latency of an interrupt the host injects (a guest timer, a device's completion): the
    /// host kicks the vCPU as it does for an IPI, whatever the vCPU runs, and a halted one pays
    /// RV on top. 0 with a Table 2 column (the paper measured no timers: they wake at once);
    /// with a calibration the IPI's latency (`gleaner sim` docs, "Costs").
    #[serde(skip_serializing_if = "is_zero")]
    pub irq: u64,
    /// RV by the time since the vCPU halted, ascending gaps (empty: `rv` whatever the gap).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rv_by_gap: Vec<RvPoint>,
    /// The guest has the kernel's POLL idle state for the agent to use (a calibration
    /// measured it): a polled vCPU is woken without an IPI, for RT.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub poll_state: bool,
}

/// One point of RV by gap: resuming a vCPU that was halted for `gap_ns` costs `rv_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RvPoint {
    pub gap_ns: u64,
    pub rv_ns: u64,
}

fn us(v: f64) -> u64 {
    saturating_u64((v * 1000.0).round())
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl Costs {
    pub fn from_table2(t: &Table2, ipi_send_us: f64, poll_wake_us: f64, ple_exit_us: f64) -> Self {
        let (a, b, c, d) = (us(t.a_us), us(t.b_us), us(t.c_us), us(t.d_us));
        // Waking a busy vCPU is normally the cheaper case (B <= C): the IPI is the common part.
        // Under binary translation a yielding vCPU can be the slower one; then the common part
        // is C's and the rest of B is the yielder's own delay.
        let common = b.min(c);
        Self {
            rt: a,
            ipi: common.saturating_sub(a),
            rv: c.saturating_sub(common),
            yield_wake: b.saturating_sub(common),
            pv: d.saturating_sub(c),
            ipi_send: us(ipi_send_us),
            poll_wake: us(poll_wake_us),
            ple_exit: us(ple_exit_us),
            irq: 0,
            rv_by_gap: Vec::new(),
            poll_state: false,
        }
    }

    /// RV for a vCPU that was halted for `gap_ns`: `rv` without a curve; with one, linear in
    /// log(gap) between its points and flat outside them (as the agent's planner reads its
    /// wake-cost curve, `WakeCurve::halt_cost_ns`).
    pub fn rv_at(&self, gap_ns: u64) -> u64 {
        let pts = &self.rv_by_gap;
        let (Some(first), Some(last)) = (pts.first(), pts.last()) else { return self.rv };
        if gap_ns <= first.gap_ns {
            return first.rv_ns;
        }
        if gap_ns >= last.gap_ns {
            return last.rv_ns;
        }
        // The first point at or past the gap; it is not the first point (gap > its gap).
        let i = pts.partition_point(|p| p.gap_ns < gap_ns);
        let (a, b) = (pts[i - 1], pts[i]);
        let (la, lb) = ((a.gap_ns as f64).ln(), (b.gap_ns as f64).ln());
        let t = ((gap_ns as f64).ln() - la) / (lb - la);
        saturating_u64((a.rv_ns as f64 + t * (b.rv_ns as f64 - a.rv_ns as f64)).round())
    }

    /// The VM column from the agent's calibration (its wake-cost curve), medians where it has
    /// them: `RT = P` (a wakeup without IPI or exit is the closest measurement of a guest
    /// thread switch; without a POLL state, `base`'s RT, i.e. the scenario's A), `IPI = B -
    /// RT`, `RV(g) = max(0, C(g) - B)` at each measured gap (p50s), `YW = 0`; `PV` and the
    /// assumed exit costs stay `base`'s (the record has no setting D); an injected interrupt
    /// (a guest timer) costs what an IPI does (`irq = IPI`). B and P are the record's means
    /// (it keeps no medians of them).
    pub fn from_calibration(base: &Costs, curve: &WakeCurve) -> Self {
        let rt = curve.poll_ns.unwrap_or(base.rt);
        let b = curve.busy_ns;
        let rv_by_gap: Vec<RvPoint> =
            curve.halted.iter().map(|p| RvPoint { gap_ns: p.gap_ns, rv_ns: p.p50_ns.saturating_sub(b) }).collect();
        Self {
            rt,
            ipi: b.saturating_sub(rt),
            rv: rv_by_gap.last().map_or(0, |p| p.rv_ns),
            yield_wake: 0,
            pv: base.pv,
            ipi_send: base.ipi_send,
            poll_wake: base.poll_wake,
            ple_exit: base.ple_exit,
            // A guest timer on this VM wakes a sleeper as late as an IPI would (scripts/bench/
            // timer-lateness.c; a vCPU kept
            // busy: 29-36 us p50 after 0.1-5 ms sleeps, B 29 us; a halted one 22-59 us, like
            // C(g)): the host delivers both the same way.
            irq: b.saturating_sub(rt),
            rv_by_gap,
            poll_state: curve.poll_ns.is_some(),
        }
    }
}

/// Table 2's VM column from a `gleaner bench wakeup --json` document ([`WakeupDoc`]): each
/// setting's median, its mean where it has none.
pub fn table2_from_bench_json(text: &str, path: &str) -> anyhow::Result<Table2> {
    let doc: WakeupDoc = serde_json::from_str(text)
        .map_err(|e| BadInput::new("costs.bench_json", path, format!("a `gleaner bench wakeup --json` document ({e})")))?;
    let get = |setting: Setting| -> anyhow::Result<f64> {
        let found = doc.settings.iter().find(|r| r.setting == setting).and_then(|r| r.p50_us.or(r.mean_us));
        match found {
            Some(x) if x.is_finite() && x >= 0.0 => Ok(x),
            Some(x) => Err(BadInput::new(format!("costs.bench_json setting {setting:?} p50_us"), x, "a number >= 0").into()),
            None => Err(BadInput::new(
                "costs.bench_json",
                path,
                format!("a measurement of settings A, B, C and D (`gleaner bench wakeup --json`); setting {setting:?} is missing"),
            )
            .into()),
        }
    };
    Ok(Table2 { a_us: get(Setting::A)?, b_us: get(Setting::B)?, c_us: get(Setting::C)?, d_us: get(Setting::D)? })
}

/// Where the agent keeps its calibration record.
pub const DEFAULT_CALIBRATION: &str = calibration::DEFAULT_PATH;

/// The wake-cost curve of an agent calibration record ([`CalibrationRecord`], the agent's own
/// type). Errors name the file, and the field where one is wrong.
pub fn curve_from_calibration(text: &str, path: &str) -> anyhow::Result<WakeCurve> {
    let field = |f: &str| format!("calibration record {path} field {f}");
    let record = CalibrationRecord::from_slice(text.as_bytes()).map_err(|e| match e {
        RecordError::NotJson(e) => bad("calibration record", path, format!("a JSON record as the agent writes it ({e})")),
        RecordError::Schema { found } => bad(
            field("schema"),
            found.map_or_else(|| "missing".to_string(), |v| v.to_string()),
            format!("{} (a wake-cost curve; an older record has none: measure again with `gleaner calibrate`)", calibration::SCHEMA),
        ),
        RecordError::Invalid(e) => {
            bad(format!("calibration record {path}"), e, format!("a record as the agent writes it ({})", calibration::DEFAULT_PATH))
        }
    })?;
    let curve = record.results.curve;
    curve.validate().map_err(|e| bad(field("results.curve.halted"), e, "at least one point, gaps > 0 ns, strictly ascending"))?;
    Ok(curve)
}

/// A calibration record as the VM's costs came from it (for the one-line note and the report).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CalibrationUse {
    pub file: PathBuf,
    /// The record's wake-cost curve (halted by gap, busy B, polling P).
    pub curve: WakeCurve,
    /// Gaps whose halted p50 is below B: RV clamped to 0 there.
    pub clamped_gaps_ns: Vec<u64>,
}

impl CalibrationUse {
    /// One line: which file, what costs were used.
    pub fn describe(&self, vm: &Costs) -> String {
        let us = |ns: u64| format!("{:.1}", ns as f64 / 1000.0);
        let gap = gap_text;
        let rt = match self.curve.poll_ns {
            Some(_) => format!("RT = P {} us", us(vm.rt)),
            None => format!("RT {} us (no POLL state: the scenario's A)", us(vm.rt)),
        };
        let rv = match (vm.rv_by_gap.first(), vm.rv_by_gap.last()) {
            (Some(a), Some(b)) => format!(
                "RV(g) = C(g) - B {}..{} us over gaps {}..{}",
                us(vm.rv_by_gap.iter().map(|p| p.rv_ns).min().unwrap_or(0)),
                us(vm.rv_by_gap.iter().map(|p| p.rv_ns).max().unwrap_or(0)),
                gap(a.gap_ns),
                gap(b.gap_ns)
            ),
            _ => "no halted points".into(),
        };
        format!(
            "costs from calibration {} (halted p50s, B and P means): {rt}, IPI = B - RT {} us, {rv}, YW 0, PV {} us (the scenario's D - C){}",
            self.file.display(),
            us(vm.ipi),
            us(vm.pv),
            if vm.poll_state { "; kernel polling offered to the agent" } else { "" }
        )
    }

    /// A note when some halted wakeup was cheaper than a busy one (RV clamped to 0).
    pub fn clamp_note(&self) -> Option<String> {
        let mut what = Vec::new();
        if !self.clamped_gaps_ns.is_empty() {
            let gaps: Vec<String> = self.clamped_gaps_ns.iter().map(|&g| gap_text(g)).collect();
            what.push(format!(
                "a halted vCPU woke faster than a busy one (C(g) < B {:.1} us) after {}: RV clamped to 0 there",
                self.curve.busy_ns as f64 / 1000.0,
                gaps.join(", ")
            ));
        }
        if self.curve.poll_ns.is_some_and(|p| p > self.curve.busy_ns) {
            what.push("a polling vCPU woke slower than a busy one (P > B): IPI clamped to 0".into());
        }
        (!what.is_empty()).then(|| format!("note: calibration {}: {}", self.file.display(), what.join("; ")))
    }
}

/// The costs of a scenario's two worlds, and the calibration the VM's came from, if any.
#[derive(Debug, Clone)]
pub struct ResolvedCosts {
    pub vm: Costs,
    pub pm: Costs,
    pub calibration: Option<CalibrationUse>,
}

/// An idle gap for people: `50 us`, `3 ms`.
fn gap_text(ns: u64) -> String {
    if ns >= 1_000_000 {
        format!("{} ms", ns as f64 / 1e6)
    } else {
        format!("{} us", ns as f64 / 1e3)
    }
}

/// Reads a calibration record file into its curve (bad input names the file).
pub fn read_calibration(path: &Path) -> anyhow::Result<WakeCurve> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        bad("calibration record", path.display(), format!("a readable file ({e}); the agent keeps one in {DEFAULT_CALIBRATION}"))
    })?;
    curve_from_calibration(&text, &path.display().to_string())
}
