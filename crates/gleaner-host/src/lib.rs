//! `gleaner host`: AQL_Sched (aql-sched.txt) for stock Linux/KVM hosts. vCPUs are typed
//! every period from what the host can see (I/O, spin, LLC counters where they exist), then
//! grouped into pCPU pools, each a cpuset cgroup whose vCPU threads run with the pool's EEVDF
//! slice. The policy is `gleaner_policy::aql`; this crate is the mechanism.
//!
//! ```text
//!  discover (/proc: QEMU "CPU n/KVM|TCG", Firecracker "fc_vcpu N", Cloud Hypervisor "vcpuN")
//!     -> monitor every period (/proc task io + schedstat, QMP query-stats, perf counters)
//!     -> AqlController (TypeRecognizer n = 4, plan: algorithms 1, 2, diff, confirmation) -> Actuator
//!                                                      cpusets gleaner-aql-*, sched_setattr slices,
//!                                                      state file /run/gleaner/host-state.json
//! ```

pub mod actuate;
pub mod calibrate;
pub mod cli;
pub mod cmd;
pub mod config;
pub mod discover;
pub mod host_loop;
pub mod metrics;
pub mod monitor;
pub mod perf;
pub mod qmp;

use std::process::ExitCode;

pub use crate::cli::{
    CalibrateArgs, ClassifyArgs, DiscoverArgs, HostArgs, HostCommand, MonitorArgs, RunArgs, StateArgs, VmFilter, STATE_PATH,
};
pub use crate::cmd::topology;
pub use crate::host_loop::{controller_readings, find_vms, VcpuReport};

/// Entry point of `gleaner host`: resolves the flags, then runs the command's handler.
pub fn run(args: HostArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        HostCommand::Discover(a) => cmd::discover::cmd_discover(&a),
        HostCommand::Classify(a) => cmd::classify::cmd_classify(&a.monitor.resolve()?, a.json),
        HostCommand::Run(a) => cmd::run::cmd_run(&a.resolve()?),
        HostCommand::Calibrate(a) => cmd::calibrate::cmd_calibrate(&a.resolve()?),
        HostCommand::Status(a) => cmd::status::cmd_status(&a),
        HostCommand::Restore(a) => cmd::restore::cmd_restore(&a),
    }
}
