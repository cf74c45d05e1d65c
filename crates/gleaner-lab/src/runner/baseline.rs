//! The native baseline: the workload on the host's pCPUs, once or as a pair (oc2), per run.

use indicatif::ProgressBar;

use super::prepare::{left, Prepared};
use crate::experiment::Experiment;
use crate::keys::{Env, HaltPoll, Instance, RowMode};
use crate::native::NativeProc;
use crate::results::{Row, RunError};

pub(super) fn native_baseline(exp: &Experiment, p: &Prepared, wargs: &[String], pb: &ProgressBar) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for rep in 1..=p.runs {
        pb.set_message(format!("{}: native x{} run {rep}/{} ({})", exp.name, p.native_instances, p.runs, left(p.deadline)));
        let procs: Vec<NativeProc> =
            (0..p.native_instances).map(|_| NativeProc::spawn(&p.gleaner, wargs, &p.pcpus)).collect::<Result<_, _>>()?;
        for (i, proc) in procs.into_iter().enumerate() {
            let (rc, out, wall) = proc.wait(p.deadline, "native baseline")?;
            let mut row = Row {
                env: Env::Native,
                instance: Instance::Native(u32::try_from(i + 1).unwrap_or(u32::MAX)),
                mode: RowMode::Native,
                halt_poll: HaltPoll::NotApplicable,
                rep,
                rc,
                gamma: p.gamma_native,
                end_s: wall.as_secs_f64(),
                ..Default::default()
            };
            row.fill_from_bench(&out);
            if rc != 0 && row.error.is_none() {
                row.error = Some(RunError::Failed(format!("exit {rc}: {}", out.chars().take(300).collect::<String>())));
            }
            rows.push(row);
        }
        pb.inc(1);
    }
    Ok(rows)
}
