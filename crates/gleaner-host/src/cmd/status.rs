//! `gleaner host status`: the state file of a running (or crashed) agent, and what it changed.

use std::process::ExitCode;

use gleaner_os::procfs::Procfs;
use gleaner_policy::aql::PlanDiff;
use serde::Serialize;

use super::{print_json, print_plan};
use crate::actuate::State;
use crate::cli::StateArgs;

/// What `status` shows of a thread.
#[derive(Debug, Serialize)]
struct ThreadStatus {
    tid: i32,
    pid: i32,
    comm: String,
    alive: bool,
    slice_ns_now: Option<u64>,
    slice_ns_before: u64,
}

pub fn cmd_status(a: &StateArgs) -> anyhow::Result<ExitCode> {
    let Some(st) = State::load(&a.state)? else {
        if a.json {
            print_json(&serde_json::json!({ "running": false, "state": null }))?;
        } else {
            println!("no state file at {}: no host agent has changes in force", a.state.display());
        }
        return Ok(ExitCode::SUCCESS);
    };
    let running = gleaner_os::procfs::alive(st.agent_pid);
    let threads: Vec<ThreadStatus> = st
        .threads
        .values()
        .map(|r| {
            let alive = Procfs::new().task_comm(r.pid, r.tid).is_ok_and(|c| c == r.comm);
            ThreadStatus {
                tid: r.tid,
                pid: r.pid,
                comm: r.comm.clone(),
                alive,
                slice_ns_now: gleaner_os::sched::slice(r.tid).ok().map(|d| u64::try_from(d.as_nanos()).unwrap_or(0)),
                slice_ns_before: r.slice_ns,
            }
        })
        .collect();
    if a.json {
        print_json(&serde_json::json!({ "running": running, "state": st, "threads": threads }))?;
    } else {
        println!(
            "agent pid {} ({}), cgroup v{} at {}",
            st.agent_pid,
            if running { "running" } else { "NOT running: run `gleaner host restore`" },
            st.cgroup_version,
            st.cgroup_root.display()
        );
        print_plan(&st.plan, &PlanDiff::default());
        for g in &st.groups {
            println!("group {}", g.display());
        }
        for t in &threads {
            println!("tid {} ({}) slice now {:?} ns, before {} ns", t.tid, t.comm, t.slice_ns_now, t.slice_ns_before);
        }
    }
    Ok(ExitCode::SUCCESS)
}
