//! Prints what gleaner-os sees on this machine and how long its reads and writes take.
//!
//! `cargo run -p gleaner-os --release --example probe` (root for the cgroup part; it creates
//! and removes `gleaner-probe-<pid>` in the cpuset hierarchy).

use std::path::Path;
use std::time::{Duration, Instant};

use gleaner_os::cgroup::Cgroups;
use gleaner_os::cpuset::CpuSet;
use gleaner_os::procfs::Procfs;
use gleaner_os::sysfs::Sysfs;
use gleaner_os::{sched, virt};

/// Median time of `f` over `n` runs, microseconds.
fn median_us(n: usize, mut f: impl FnMut()) -> f64 {
    let mut v: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    v.sort();
    v[n / 2].as_secs_f64() * 1e6
}

fn main() -> anyhow::Result<()> {
    let procfs = Procfs::new();
    let sysfs = Sysfs::new();
    let me = i32::try_from(std::process::id())?;
    let tid = sched::gettid();
    let online = sysfs.online_cpus()?;
    let v = virt::detect(&procfs, &sysfs)?;
    let cg = Cgroups::detect();
    let n = 200;
    let mut timings = serde_json::Map::new();
    let mut t = |name: &str, us: f64| {
        timings.insert(name.to_string(), serde_json::json!((us * 10.0).round() / 10.0));
    };
    t("proc_stat_us", median_us(n, || drop(procfs.stat())));
    t("task_schedstat_us", median_us(n, || drop(procfs.task_schedstat(me, tid))));
    t("task_status_us", median_us(n, || drop(procfs.task_status(me, tid))));
    t("descendants_of_pid1_us", median_us(20, || drop(procfs.descendants(1, true))));
    t("total_idle_entries_us", median_us(n, || drop(sysfs.total_idle_entries(&online))));
    t("sched_yield_us", median_us(n, sched::yield_now));
    t("set_slice_us", median_us(n, || drop(sched::set_slice(0, Duration::from_millis(3)))));
    sched::reset_slice(0)?;
    let mut cg_out = serde_json::Value::Null;
    if let Ok(cg) = &cg {
        let g = cg.create(Path::new(""), &format!("gleaner-probe-{me}"))?;
        let all = g.cpus()?;
        let one = CpuSet::from_iter(all.first());
        let mut flip = false;
        let set_us = median_us(n, || {
            flip = !flip;
            drop(g.set_cpus(if flip { &one } else { &all }));
        });
        let t0 = Instant::now();
        g.remove()?;
        let remove_us = t0.elapsed().as_secs_f64() * 1e6;
        cg_out =
            serde_json::json!({ "layout": format!("{:?}", cg.layout()), "set_cpus_us": set_us.round(), "remove_us": remove_us.round() });
    }
    let out = serde_json::json!({
        "kernel": gleaner_os::kernel_release(),
        "online_cpus": online,
        "virtualization": v,
        "cpuidle_driver": sysfs.cpuidle_driver()?,
        "cpuidle_governor": sysfs.cpuidle_governor()?,
        "idle_states_cpu0": sysfs.cpuidle_states(online.first().unwrap_or(0))?,
        "haltpoll": sysfs.module_params("haltpoll")?,
        "kvm_halt_poll": sysfs.module_params("kvm")?.into_iter().filter(|(k, _)| k.starts_with("halt_poll")).collect::<std::collections::BTreeMap<_, _>>(),
        "cgroup": match &cg { Ok(_) => cg_out, Err(e) => serde_json::json!(e.to_string()) },
        "processes": procfs.pids()?.len(),
        "default_slice_us": sched::slice(0)?.as_secs_f64() * 1e6,
        "timings_median_us": timings,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
