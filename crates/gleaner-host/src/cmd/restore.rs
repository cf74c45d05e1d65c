//! `gleaner host restore`: undo what an agent that crashed left behind.

use std::process::ExitCode;

use anyhow::Context;
use gleaner_os::cgroup::Cgroups;
use gleaner_os::procfs::Procfs;

use super::print_json;
use crate::actuate;
use crate::actuate::State;
use crate::cli::StateArgs;

pub fn cmd_restore(a: &StateArgs) -> anyhow::Result<ExitCode> {
    let st = State::load(&a.state)?;
    if let Some(s) = &st {
        if s.agent_pid != 0 && gleaner_os::procfs::alive(s.agent_pid) && s.agent_pid != std::process::id().cast_signed() {
            let comm = Procfs::new().comm(s.agent_pid).unwrap_or_default();
            if comm.starts_with("gleaner") {
                anyhow::bail!("host agent pid {} is still running: stop it (SIGTERM) and it restores by itself", s.agent_pid);
            }
        }
    }
    let cg = Cgroups::detect()?;
    let removed = match &st {
        Some(s) => actuate::restore(&cg, &Procfs::new(), s)?,
        None => actuate::sweep(&cg)?,
    };
    if st.is_some() {
        std::fs::remove_file(&a.state).with_context(|| format!("cannot remove {}", a.state.display()))?;
    }
    let threads = st.as_ref().map_or(0, |s| s.threads.len());
    if a.json {
        print_json(&serde_json::json!({ "state_file": st.is_some(), "threads_restored": threads, "groups_removed": removed }))?;
    } else {
        println!("restored {threads} threads, removed {} groups{}", removed.len(), if st.is_none() { " (no state file)" } else { "" });
    }
    Ok(ExitCode::SUCCESS)
}
