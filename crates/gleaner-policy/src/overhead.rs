//! The survey's virtualization-overhead metrics (virtualization-overhead-of-multithreading,
//! section 3).
//!
//! A *base* run (the survey's physical/native execution `P(S_w)`) and a *target* run (the
//! virtualized execution `V(S_w)` on `P(S_v)`, or any configuration compared to the base) of
//! the same workload `W` give:
//!
//! - reduced resource efficiency (system effects, section 3.1):
//!   `d_eta_r = (C_v - C_p) / C_p`, with `C` the CPU cycles used. Without hardware counters
//!   the callers pass CPU time (user + sys) as the cycle proxy.
//! - reduced temporal efficiency (application effects, section 3.2):
//!   `d_eta_t = (t_v * gamma_v - t_p * gamma_p) / (t_p * gamma_p)`, with `t` the wall-clock
//!   time and `gamma` the *ideal effective CPU count* available to the workload on each side
//!   (e.g. `gamma_v = gamma_p / 2` when two identical VMs share the pCPUs, section 4.3).
//! - the overhead impact factor (section 5.2): `omega = (1 + d_eta_t) / (1 + d_eta_r)`.
//!
//! ```text
//!   omega > 1: the extra cost lands on the critical path (wall time grows more than CPU time)
//!   omega < 1: extra CPU time is spent off the critical path (e.g. halt polling)
//! ```

use serde::{Deserialize, Serialize};

/// One side of a comparison: what a run of the workload used.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Side {
    /// CPU cycles, or CPU time in ns as a proxy (must be > 0).
    pub cpu: f64,
    /// Wall-clock time (any unit, the same on both sides; must be > 0).
    pub wall: f64,
    /// Ideal effective CPU count available to the workload (must be > 0).
    pub gamma: f64,
}

/// The three metrics for a (base, target) pair.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Overhead {
    /// Reduced resource efficiency `d_eta_r`.
    pub d_eta_r: f64,
    /// Reduced temporal efficiency `d_eta_t`.
    pub d_eta_t: f64,
    /// Overhead impact factor `omega`.
    pub omega: f64,
}

/// A side's value that makes the metrics undefined.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OverheadError {
    /// A quantity is zero, negative, NaN or infinite.
    #[error("{what} must be a finite number > 0, got {value}")]
    NotPositive { what: &'static str, value: f64 },
}

fn positive(what: &'static str, value: f64) -> Result<f64, OverheadError> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(OverheadError::NotPositive { what, value })
    }
}

/// `d_eta_r = (c_target - c_base) / c_base`.
pub fn reduced_resource_efficiency(c_base: f64, c_target: f64) -> Result<f64, OverheadError> {
    let cb = positive("base CPU", c_base)?;
    let ct = positive("target CPU", c_target)?;
    Ok((ct - cb) / cb)
}

/// `d_eta_t = (t_target * gamma_target - t_base * gamma_base) / (t_base * gamma_base)`.
pub fn reduced_temporal_efficiency(t_base: f64, gamma_base: f64, t_target: f64, gamma_target: f64) -> Result<f64, OverheadError> {
    let base = positive("base wall time", t_base)? * positive("base gamma", gamma_base)?;
    let target = positive("target wall time", t_target)? * positive("target gamma", gamma_target)?;
    Ok((target - base) / base)
}

/// `omega = (1 + d_eta_t) / (1 + d_eta_r)`.
pub fn impact_factor(d_eta_t: f64, d_eta_r: f64) -> Result<f64, OverheadError> {
    // 1 + d_eta_r is the target/base CPU ratio, > 0 for valid inputs.
    let denom = positive("1 + d_eta_r", 1.0 + d_eta_r)?;
    Ok((1.0 + d_eta_t) / denom)
}

/// All three metrics for a base and a target run.
pub fn overhead(base: Side, target: Side) -> Result<Overhead, OverheadError> {
    let d_eta_r = reduced_resource_efficiency(base.cpu, target.cpu)?;
    let d_eta_t = reduced_temporal_efficiency(base.wall, base.gamma, target.wall, target.gamma)?;
    let omega = impact_factor(d_eta_t, d_eta_r)?;
    Ok(Overhead { d_eta_r, d_eta_t, omega })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn hand_computed_uc() {
        // Native: 10 s CPU, 5 s wall on 2 CPUs. VM: 12 s CPU, 6 s wall on 2 vCPUs.
        let o = overhead(Side { cpu: 10.0, wall: 5.0, gamma: 2.0 }, Side { cpu: 12.0, wall: 6.0, gamma: 2.0 }).unwrap();
        assert!(close(o.d_eta_r, 0.2));
        assert!(close(o.d_eta_t, 0.2)); // (6*2 - 5*2) / 10
        assert!(close(o.omega, 1.0));
    }

    #[test]
    fn hand_computed_oc_halves_gamma() {
        // OC: the VM gets half the pCPUs (gamma_v = gamma_p / 2): 8 s wall counts as 4 s of
        // full-machine time. d_eta_t = (8*1 - 5*2) / (5*2) = -0.2.
        let o = overhead(Side { cpu: 10.0, wall: 5.0, gamma: 2.0 }, Side { cpu: 15.0, wall: 8.0, gamma: 1.0 }).unwrap();
        assert!(close(o.d_eta_r, 0.5));
        assert!(close(o.d_eta_t, -0.2));
        assert!(close(o.omega, 0.8 / 1.5));
    }

    #[test]
    fn critical_path_overhead_gives_omega_above_one() {
        // Wall time doubles while CPU time grows 10 %: omega = 2 / 1.1.
        let o = overhead(Side { cpu: 100.0, wall: 10.0, gamma: 4.0 }, Side { cpu: 110.0, wall: 20.0, gamma: 4.0 }).unwrap();
        assert!(close(o.d_eta_t, 1.0));
        assert!(close(o.omega, 2.0 / 1.1));
    }

    #[test]
    fn non_positive_inputs_are_rejected() {
        assert!(matches!(reduced_resource_efficiency(0.0, 1.0), Err(OverheadError::NotPositive { what: "base CPU", .. })));
        assert!(reduced_resource_efficiency(1.0, f64::NAN).is_err());
        assert!(reduced_temporal_efficiency(1.0, 0.0, 1.0, 1.0).is_err());
        assert!(reduced_temporal_efficiency(1.0, 1.0, -1.0, 1.0).is_err());
        assert!(impact_factor(0.0, -1.0).is_err());
    }
}
