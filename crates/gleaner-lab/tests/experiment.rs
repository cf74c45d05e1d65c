//! A whole `oc` experiment with real guests (accel auto: the KVM probe runs, TCG here), driven
//! by a stand-in `gleaner` script that prints bench JSON, so the lab's plumbing is tested
//! independently of the bench and agent crates: native calibration and baseline, co-runner VM
//! started first, interleaved modes in VM A, rows, survey metrics, report files, no leftovers.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use gleaner_lab::cache;
use gleaner_lab::experiment::Experiment;
use gleaner_lab::runner::{run_experiment, RunOptions};

const FAKE_GLEANER: &str = r#"#!/bin/sh
# Stand-in for gleaner in the lab tests.
if [ "$1" = run ]; then
  shift; while [ "$1" != "--" ]; do shift; done; shift
  echo "agent: wrapped" >&2
  exec "$@"
fi
name=$3
s=$(date +%s%N)
i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done
e=$(date +%s%N)
echo "{\"kind\":\"workload\",\"name\":\"$name\",\"params\":{\"iters_per_us\":123.5},\"runs\":[{\"wall_ns\":$((e-s)),\"user_ns\":$((e-s)),\"sys_ns\":1000,\"vcsw\":3,\"items\":10}],\"summary\":{}}"
"#;

fn qemu_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            String::from_utf8_lossy(&cmd).contains("lab-oc-").then_some(pid)
        })
        .collect()
}

#[test]
#[serial_test::serial(host)]
fn oc_experiment_end_to_end_with_real_guests() {
    let dir = cache::resolve_cache_dir(None);
    if cache::find_kernel(&dir, None).is_err() {
        cache::fetch_kernel(&dir, None, &mut |s| eprintln!("fetch: {s}"))
            .unwrap_or_else(|e| panic!("the lab tests need a guest kernel in {} and could not fetch one: {e:#}", dir.display()));
    }
    // The guest sees the host's filesystem except /tmp, /run, ...: use cargo's target tmpdir.
    let work = tempfile::Builder::new().prefix("lab-e2e-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let fake: PathBuf = work.path().join("gleaner");
    std::fs::write(&fake, FAKE_GLEANER).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exp = Experiment::load("oc").unwrap();
    let out = work.path().join("out");
    let opts = RunOptions {
        out: out.clone(),
        quick: true,
        gleaner: fake,
        accel: "auto".into(),
        kernel: None,
        cache_dir: dir,
        pcpus: None,
        runs: Some(2),
        progress: false,
    };
    let r = run_experiment(&exp, &opts).expect("experiment");
    assert!(qemu_pids().is_empty(), "QEMU left behind: {:?}", qemu_pids());
    eprintln!("accel {} boot {:?} duration {:.1}s", r.accel, r.boot_s, r.duration_s);
    let native = r.rows.iter().filter(|x| x.env == "native").count();
    assert_eq!(native, 2);
    for mode in ["off", "on"] {
        let rows: Vec<_> = r.rows.iter().filter(|x| x.instance == "A" && x.mode == mode).collect();
        assert_eq!(rows.len(), 2, "{mode}: {rows:?}");
        for x in rows {
            assert!(x.ok(), "{x:?}");
            assert!(x.host_cpu_ns.unwrap() > 0 && x.host_vcpu_ns.len() == 2, "{x:?}");
            assert!(x.co_runner_rate.is_some_and(|c| c > 0.0), "co-runner ran during the step: {x:?}");
        }
    }
    assert!(r.rows.iter().any(|x| x.mode == "co-runner" && x.ok()));
    assert!(r.notes.iter().any(|n| n.contains("--iters-per-us 123.500")), "{:?}", r.notes);
    let on = r.summary.iter().find(|s| s.mode == "on").unwrap();
    assert!(on.speedup.is_some() && on.weighted_speedup.is_some() && on.omega.is_some(), "{on:?}");
    assert_eq!(r.boot_s.len(), 2);
    let report = gleaner_lab::report::write(&out, &r).unwrap();
    let md = std::fs::read_to_string(report).unwrap();
    assert!(md.contains("| VM A | on |") && md.contains(&format!("acceleration: **{}**", r.accel)), "{md}");
    for f in ["results.json", "runs.csv", "summary.csv", "wall.png", "vcpu_cpu.png"] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
}
