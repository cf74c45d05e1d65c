//! Pure policy code shared by the real agents and the simulator: decisions are functions of
//! metric snapshots, with no OS access. The simulator runs exactly this code.
//!
//! - [`gleaner`]: the consolidation controller of the Gleaner paper (section 5).
//! - [`retention`]: the yielding thread's idle detector and its adaptive timeout (section 6),
//!   the start-up verdict and the governor that re-decides online whether retention pays.
//! - [`guest`]: the guest loop once (consolidation, idle plan, governor), driven by the agent
//!   and the simulator alike.
//! - [`idle`]: the idle policy: wake-cost curve, idle-period and wakeup-latency histograms,
//!   and the per-vCPU choice of mechanism (kernel polling, yielding threads) and window.
//! - [`stats`]: order statistics (median, percentiles, spread) used by every benchmark.
//! - [`overhead`]: the survey's reduced resource/temporal efficiency and omega.
//! - [`aql`]: AQL_Sched's vCPU type recognition and pCPU pool clustering.
//! - [`num`]: float-to-integer conversions that say they saturate.
//! - [`peer`]: the idle policies a tenant could pick, and the agent's forms ([`IdlePolicy`]).

pub mod aql;
pub mod gleaner;
pub mod guest;
pub mod idle;
pub mod input;
pub mod num;
pub mod overhead;
pub mod peer;
pub mod retention;
pub mod stats;

pub use peer::IdlePolicy;
