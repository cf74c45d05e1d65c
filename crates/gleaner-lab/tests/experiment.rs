//! Whole experiments with real guests (accel auto: the KVM probe runs, TCG here), driven by a
//! stand-in `gleaner` script that prints the bench's own JSON documents, so the lab's plumbing
//! is tested independently of the bench and agent code: sizing (native and guest rate and
//! synchronization cost), the native baseline, the co-runner VM started first, modes
//! interleaved and rotated, one boot per kernel command line, rows, intervals, survey metrics,
//! report files, and no leftovers. The stand-in lives under /tmp, where the guests mount their
//! own tmpfs: the lab must share its directory into them (a checkout may live anywhere).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use gleaner_bench::measure::RunMetrics;
use gleaner_bench::report::{BenchDoc, HostInfo, RunSummary};
use gleaner_lab::experiment::{Experiment, Mode};
use gleaner_lab::results::{Env, Instance, RowMode};
use gleaner_lab::runner::{run_experiment, RunOptions};
use gleaner_policy::IdlePolicy;
use gleaner_qemu::kernel as cache;

/// A bench document with placeholders the script fills in.
fn doc_template() -> String {
    let run = RunMetrics {
        wall_ns: 111_111,
        user_ns: 222_222,
        sys_ns: 1000,
        vcsw: 3,
        items: Some(10),
        idle_source: "proc-stat".into(),
        ..Default::default()
    };
    let doc = BenchDoc {
        kind: "workload".into(),
        name: "NAME".into(),
        params: serde_json::json!({ "iters_per_us": 123.5 }),
        summary: RunSummary::of(std::slice::from_ref(&run)).unwrap(),
        runs: vec![run],
        host: HostInfo {
            kernel: "k".into(),
            cpus: 2,
            allowed_cpus: "0-1".into(),
            virtualized: true,
            hypervisor: None,
            cpuidle_driver: Some("DRIVER".into()),
            cpuidle_governor: None,
            git_revision: None,
            date: String::new(),
        },
    };
    serde_json::to_string(&doc)
        .unwrap()
        .replace("111111", "$w")
        .replace("222222", "$w")
        .replace("\"NAME\"", "\"$name\"")
        .replace("\"DRIVER\"", "\"$driver\"")
}

fn fake_gleaner(dir: &Path) -> PathBuf {
    let script = format!(
        r#"#!/bin/sh
# Stand-in for gleaner in the lab tests.
case "$1" in
  run) shift; while [ "$1" != "--" ]; do shift; done; shift; echo "agent: wrapped" >&2; exec "$@" ;;
  calibrate) echo '{{}}'; exit 0 ;;
esac
if [ "$2" = yielders ]; then shift 3; exec "$@"; fi
if [ "$2" = rate ]; then echo 123.5; exit 0; fi
if [ "$2" = wakeup ]; then echo '{{}}'; exit 0; fi
name=$3
driver=$(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo none)
grep -q idle=poll /proc/cmdline 2>/dev/null && driver=idle-poll-booted
s=$(date +%s%N)
i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done
e=$(date +%s%N)
w=$((e-s))
cat <<DOC
{}
DOC
"#,
        doc_template()
    );
    let fake = dir.join("gleaner");
    std::fs::write(&fake, script).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    fake
}

fn qemu_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            String::from_utf8_lossy(&cmd).contains("lab-oc").then_some(pid)
        })
        .collect()
}

fn kernel_dir() -> PathBuf {
    let dir = cache::resolve_cache_dir(None);
    if cache::find_kernel(&dir, None).is_err() {
        cache::fetch_kernel(&dir, None, &mut |s| eprintln!("fetch: {s}"))
            .unwrap_or_else(|e| panic!("the lab tests need a guest kernel in {} and could not fetch one: {e:#}", dir.display()));
    }
    dir
}

fn options(fake: PathBuf, out: PathBuf) -> RunOptions {
    RunOptions {
        out,
        quick: true,
        gleaner: fake,
        accel: gleaner_qemu::accel::AccelChoice::Auto,
        kernel: None,
        cache_dir: kernel_dir(),
        pcpus: None,
        runs: Some(2),
        progress: false,
    }
}

#[test]
#[serial_test::serial(host)]
fn oc_experiment_end_to_end_with_real_guests_from_a_binary_under_tmp() {
    let work = tempfile::Builder::new().prefix("gleaner-lab-e2e-").tempdir_in("/tmp").unwrap();
    let fake = fake_gleaner(work.path());
    let exp = Experiment::load("oc").unwrap();
    let out = work.path().join("out");
    let r = run_experiment(&exp, &options(fake, out.clone())).expect("experiment");
    assert!(qemu_pids().is_empty(), "QEMU left behind: {:?}", qemu_pids());
    eprintln!("accel {} boot {:?} duration {:.1}s notes {:?}", r.accel, r.boot_s, r.duration_s, r.notes);
    assert_eq!(r.rows.iter().filter(|x| x.env == Env::Native).count(), 2);
    for mode in ["off", "gleaner"] {
        let rows: Vec<_> = r.rows.iter().filter(|x| x.instance == Instance::A && x.mode == RowMode::mode(mode)).collect();
        assert_eq!(rows.len(), 2, "{mode}: {rows:?}");
        for x in rows {
            assert!(x.ok(), "{x:?}");
            assert!(x.host_cpu_ns.unwrap() > 0 && x.host_vcpu_ns.len() == 2, "{x:?}");
            assert!(x.vcpu_sleeps.is_some() && x.host_vcpu_wait_ns.is_some(), "{x:?}");
            assert!(x.co_runner_rate.is_some_and(|c| c > 0.0), "co-runner ran during the step: {x:?}");
            assert_eq!(x.agent.is_some(), mode == "gleaner", "{x:?}");
        }
    }
    assert!(r.rows.iter().any(|x| x.mode == RowMode::CoRunner && x.ok()));
    // Balanced sizing: both rates measured, the guest's work scaled by the measured ratio.
    let sz = r.sizing.as_ref().expect("sizing");
    assert_eq!((sz.native_iters_per_us, sz.guest_iters_per_us), (123.5, Some(123.5)));
    assert!(r.guest_args.windows(2).any(|w| w[0] == "--iters-per-us" && w[1] == "123.500"), "{:?}", r.guest_args);
    assert!(r.notes.iter().any(|n| n.contains("balanced compute")), "{:?}", r.notes);
    // The agent's calibration ran as a setup step of VM A, outside the measured steps.
    assert!(r.setup.iter().any(|s| s.step == "setup.calibrate" && s.rc == 0), "{:?}", r.setup);
    let g = r.summary.iter().find(|s| s.mode == RowMode::mode("gleaner")).unwrap();
    assert!(g.speedup.is_some() && g.speedup_ci.is_some() && g.weighted_speedup_ci.is_some() && g.omega.is_some(), "{g:?}");
    assert_eq!(r.boot_s.len(), 2);
    let report = gleaner_lab::report::write(&out, &r).unwrap();
    let md = std::fs::read_to_string(report).unwrap();
    assert!(md.contains("| VM A gleaner | gleaner |") && md.contains(&format!("acceleration: **{}**", r.accel)), "{md}");
    for f in ["results.json", "runs.csv", "summary.csv", "wall.png", "vcpu_cpu.png", "latency_cpu.png"] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
}

#[test]
#[serial_test::serial(host)]
fn policies_that_need_another_kernel_command_line_get_their_own_boots() {
    let work = tempfile::Builder::new().prefix("gleaner-lab-boots-").tempdir_in("/tmp").unwrap();
    let fake = fake_gleaner(work.path());
    let mut exp = Experiment::load("oc").unwrap();
    exp.compute = Default::default();
    exp.modes = vec![Mode::stock("off"), Mode::of(IdlePolicy::Yielders), Mode::of(IdlePolicy::Poll), Mode::of(IdlePolicy::HALTPOLL)];
    let r = run_experiment(&exp, &options(fake, work.path().join("out"))).expect("experiment");
    assert!(qemu_pids().is_empty(), "QEMU left behind: {:?}", qemu_pids());
    // Three command lines (none, idle=poll, cpuidle_haltpoll.force=1), two rounds: six boots of
    // VM A and one of VM B.
    assert_eq!(r.boot_s.len(), 7, "{:?}", r.boot_s);
    let rows = |m: &str| r.rows.iter().filter(|x| x.instance == Instance::A && x.mode == RowMode::mode(m)).collect::<Vec<_>>();
    assert!(rows("poll").iter().all(|x| x.ok() && x.cpuidle_driver.as_deref() == Some("idle-poll-booted")), "{:?}", rows("poll"));
    assert!(rows("off").iter().chain(rows("yielders").iter()).all(|x| x.ok() && x.cpuidle_driver.as_deref() != Some("idle-poll-booted")));
    // The guest's haltpoll driver cannot load under TCG: those runs are not run, saying why.
    assert_eq!(rows("haltpoll").len(), 2);
    if r.accel == gleaner_qemu::Accel::Tcg {
        for x in rows("haltpoll") {
            assert!(
                x.error.as_ref().map(ToString::to_string).is_some_and(|e| e.contains("not haltpoll") && e.contains("kvm_para_available")),
                "{x:?}"
            );
        }
    } else {
        // Under KVM the forced driver loads: the runs ran with it.
        for x in rows("haltpoll") {
            assert!(x.ok() && x.cpuidle_driver.as_deref() == Some("haltpoll"), "under KVM the haltpoll runs boot with it: {x:?}");
        }
    }
    assert_eq!(rows("yielders").len(), 2);
}
