//! Real QEMU (TCG) guests on this host: discovery, classification, a plan applied (cpusets
//! and slices read back from the kernel) and fully restored, by the agent's own exit, by a
//! signal, on VM exit, and by `restore` after a simulated crash. Needs root, a cpuset cgroup
//! controller and qemu-system-x86_64: fails (never skips) naming what is missing. The guests
//! are started with the QEMU fixture (`gleaner_qemu`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gleaner_host::actuate::{self, Actuator, Placement, State, PREFIX};
use gleaner_host::discover::{self, Evidence, Vm};
use gleaner_host::monitor::Monitor;
use gleaner_host::{HostArgs, HostCommand, MonitorArgs, RunArgs, StateArgs, VmFilter};
use gleaner_os::cgroup::Cgroups;
use gleaner_os::procfs::Procfs;
use gleaner_os::sched;
use gleaner_policy::aql::{self, Quanta, Source, Topology, TypeRecognizer, VcpuClass, VcpuId, VcpuInfo};
use gleaner_qemu::{wait_until, Accel, QemuCommand, RunningQemu};
use serial_test::serial;

/// A TCG guest with no kernel (the firmware finds nothing to boot, the vCPUs idle): 2 vCPUs,
/// 64 MiB, QMP on, vCPU threads named when `debug_threads`.
fn start(name: &str, debug_threads: bool) -> RunningQemu {
    QemuCommand::new(name)
        .cpus(2)
        .memory_mib(64)
        .accel(Accel::Tcg)
        .debug_threads(debug_threads)
        .spawn()
        .unwrap_or_else(|e| panic!("{e}: qemu-system-x86_64 must be installed (Debian package qemu-system-x86)"))
}

fn pid(g: &RunningQemu) -> i32 {
    i32::try_from(g.pid).unwrap()
}

fn wait<T>(what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
    wait_until(what, timeout, f).unwrap_or_else(|e| panic!("{e}"))
}

fn preflight() -> Cgroups {
    assert!(nix::unistd::geteuid().is_root(), "these tests need root (cgroups, sched_setattr on other processes)");
    assert!(
        Command::new("qemu-system-x86_64").arg("--version").stdout(Stdio::null()).status().is_ok_and(|s| s.success()),
        "qemu-system-x86_64 is missing: apt-get install qemu-system-x86"
    );
    let cg = Cgroups::detect().expect("a cpuset cgroup controller (v1 or v2) is needed");
    assert!(leftover_groups(&cg).is_empty(), "gleaner-aql groups left by an earlier run: {:?}", leftover_groups(&cg));
    cg
}

fn leftover_groups(cg: &Cgroups) -> Vec<PathBuf> {
    cg.list_gleaner_groups()
        .unwrap()
        .into_iter()
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(PREFIX)))
        .collect()
}

/// Waits for a debug-threads guest whose vCPU threads are named (QEMU names them just after
/// creating them).
fn find(name: &str, vcpus: usize) -> Vm {
    wait(&format!("VM {name} with {vcpus} named vCPU threads"), Duration::from_secs(15), || {
        discover::discover(&Procfs::new())
            .unwrap()
            .into_iter()
            .find(|v| v.name == name && v.vcpus.len() == vcpus && v.vcpus.iter().all(|t| t.evidence == Evidence::ThreadName))
    })
}

/// The thread's cpuset cgroup path as the kernel reports it.
fn cgroup_of(pid: i32, tid: i32) -> String {
    let v1 = matches!(Cgroups::detect().unwrap().layout(), gleaner_os::cgroup::Layout::V1 { .. });
    Procfs::new().task_cgroup(pid, tid, if v1 { Some("cpuset") } else { None }).unwrap().unwrap()
}

fn slice_ns(tid: i32) -> u64 {
    u64::try_from(sched::slice(tid).unwrap().as_nanos()).unwrap()
}

struct Snapshot {
    tid: i32,
    cgroup: String,
    affinity: gleaner_os::cpuset::CpuSet,
    slice: u64,
}

fn snapshot(vm: &Vm) -> Vec<Snapshot> {
    vm.vcpus
        .iter()
        .map(|v| Snapshot {
            tid: v.tid,
            cgroup: cgroup_of(vm.pid, v.tid),
            affinity: sched::affinity(v.tid).unwrap(),
            slice: slice_ns(v.tid),
        })
        .collect()
}

fn assert_restored(cg: &Cgroups, vm: &Vm, before: &[Snapshot]) {
    assert!(leftover_groups(cg).is_empty(), "groups left: {:?}", leftover_groups(cg));
    for s in before {
        assert_eq!(cgroup_of(vm.pid, s.tid), s.cgroup, "tid {} cgroup", s.tid);
        assert_eq!(sched::affinity(s.tid).unwrap(), s.affinity, "tid {} affinity", s.tid);
        assert_eq!(slice_ns(s.tid), s.slice, "tid {} slice", s.tid);
    }
}

fn two_cpu_topology() -> Topology {
    let online = gleaner_os::sysfs::Sysfs::new().online_cpus().unwrap();
    assert!(online.len() >= 2, "these tests need 2 online CPUs, found {online}");
    Topology { sockets: vec![online.iter().take(2).collect()] }
}

#[test]
#[serial(host)]
fn discover_classify_apply_restore() {
    let cg = preflight();
    let a = start("gleanertest-a", true);
    let b = start("gleanertest-b", false);
    let vm_a = find(&a.name, 2);
    assert_eq!(vm_a.pid, pid(&a));
    assert_eq!(vm_a.accel.as_deref(), Some("TCG"));
    assert!(vm_a.vcpus.iter().all(|v| v.evidence == Evidence::ThreadName && v.name.ends_with("/TCG")), "{vm_a:?}");
    assert_eq!(vm_a.qmp_socket.as_deref(), Some(a.qmp_socket().as_path()));
    // Without debug-threads: CPU-time evidence and a note telling how to fix it.
    let vm_b = wait("VM b", Duration::from_secs(15), || discover::discover(&Procfs::new()).unwrap().into_iter().find(|v| v.pid == pid(&b)));
    assert!(vm_b.vcpus.iter().all(|v| v.evidence == Evidence::CpuTime), "{vm_b:?}");
    assert!(vm_b.notes.iter().any(|n| n.contains("debug-threads=on")), "{vm_b:?}");

    // Classification: 1 baseline + 4 periods of 30 ms.
    wait("QMP socket", Duration::from_secs(10), || a.qmp_socket().exists().then_some(()));
    let mut mon = Monitor::with_procfs(Procfs::new());
    let mut rec = TypeRecognizer::new(4, aql::Limits::default());
    let vms = vec![vm_a.clone()];
    for _ in 0..5 {
        for r in mon.sample(&vms).0 {
            rec.observe(r.id, &r.counters);
            assert_eq!(r.io_source, Some("proc:task-io-syscalls"), "TCG: no KVM statistics");
            assert!(r.counters.spin_events.is_none(), "no spin source must stay missing");
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    let src = mon.sources();
    assert!(src.spin.starts_with("missing"), "{src:?}");
    let pmu = gleaner_host::perf::probe().is_ok();
    let mut infos = Vec::new();
    for v in &vm_a.vcpus {
        let id = VcpuId { vm: u64::try_from(vm_a.pid).unwrap(), vcpu: v.index };
        let c = rec.classify(id).expect("observed");
        assert_eq!(c.periods, 4);
        assert!(c.missing.contains(&Source::SpinEvents), "{c:?}");
        assert_eq!(c.missing.contains(&Source::LlcRefs), !pmu, "{c:?}");
        assert!(c.averages.io_int.is_some());
        if pmu {
            // With LLC counters the cache cursors are measured, so a cache class is possible.
            assert!(c.averages.cache.is_some(), "a PMU but no cache cursors: {c:?}");
        } else {
            assert!(matches!(c.class, VcpuClass::IoInt | VcpuClass::CpuBurn), "{c:?}");
            assert!(c.averages.cache.is_none(), "cache cursors without a PMU: {c:?}");
        }
        eprintln!("vCPU {}: {:?}", v.index, c);
        infos.push(VcpuInfo::from_classification(id, &c));
    }

    // Apply a plan that splits the two vCPUs: vCPU 0 IOInt (1 ms), vCPU 1 LLCF (90 ms).
    let before = snapshot(&vm_a);
    let d = tempfile::tempdir().unwrap();
    let state = d.path().join("host-state.json");
    let topo = two_cpu_topology();
    let forced: Vec<VcpuInfo> =
        infos.iter().map(|i| VcpuInfo::new(i.id, if i.id.vcpu == 0 { VcpuClass::IoInt } else { VcpuClass::Llcf }, false)).collect();
    let plan = aql::plan(&forced, &topo, &Quanta::paper());
    assert_eq!(plan.pools.len(), 2, "{plan:#?}");
    let place = |plan: &aql::Plan| -> Vec<Placement> {
        plan.assignment
            .iter()
            .map(|x| Placement { pid: vm_a.pid, tid: vm_a.vcpus.iter().find(|t| t.index == x.vcpu.vcpu).unwrap().tid, pool: x.pool })
            .collect()
    };
    let mut act = Actuator::open(cg.clone(), Procfs::new(), state.clone()).unwrap();
    act.apply(&plan, &place(&plan)).unwrap();
    for v in &vm_a.vcpus {
        let pool = plan.pool_of(&VcpuId { vm: u64::try_from(vm_a.pid).unwrap(), vcpu: v.index }).unwrap();
        let cgp = cgroup_of(vm_a.pid, v.tid);
        assert!(cgp.ends_with(&format!("{PREFIX}-{}", pool.name)), "tid {} in {cgp}, want pool {}", v.tid, pool.name);
        let dir = cg.root().join(cgp.trim_start_matches('/'));
        let cpus = std::fs::read_to_string(dir.join("cpuset.cpus")).unwrap();
        let want: gleaner_os::cpuset::CpuSet = pool.pcpus.iter().copied().collect();
        assert_eq!(cpus.trim(), want.to_string());
        assert_eq!(sched::affinity(v.tid).unwrap(), want, "the kernel confines the thread to the pool");
        assert_eq!(slice_ns(v.tid), pool.quantum_ns, "slice read back from sched_getattr");
        eprintln!("tid {} -> {} cpus {} slice {} ns", v.tid, cgp, cpus.trim(), slice_ns(v.tid));
    }
    // The classified plan (from real readings) replaces it: only the differences are applied.
    let real = aql::plan(&infos, &topo, &Quanta::paper());
    eprintln!("diff to the classified plan: {:?}", real.diff(&plan));
    act.apply(&real, &place(&real)).unwrap();
    for v in &vm_a.vcpus {
        let pool = real.pool_of(&VcpuId { vm: u64::try_from(vm_a.pid).unwrap(), vcpu: v.index }).unwrap();
        assert_eq!(slice_ns(v.tid), pool.quantum_ns);
    }
    act.restore_all().unwrap();
    assert!(!state.exists());
    assert_restored(&cg, &vm_a, &before);

    // Crash: apply, then lose the agent (no restore); `gleaner host restore` cleans up.
    let mut act = Actuator::open(cg.clone(), Procfs::new(), state.clone()).unwrap();
    act.apply(&plan, &place(&plan)).unwrap();
    drop(act);
    assert!(!leftover_groups(&cg).is_empty());
    let st = State::load(&state).unwrap().unwrap();
    assert_eq!(st.threads.len(), 2);
    let code = gleaner_host::run(HostArgs { command: HostCommand::Restore(StateArgs { state: state.clone(), json: true }) }).unwrap();
    assert_eq!(code, std::process::ExitCode::SUCCESS);
    assert!(!state.exists());
    assert_restored(&cg, &vm_a, &before);
    drop(b);
    let _ = actuate::sweep(&cg);
}

fn run_args(vm: &str, state: &Path, duration_s: Option<f64>, dry_run: bool, exit_when_no_vms: bool) -> HostArgs {
    HostArgs {
        command: HostCommand::Run(RunArgs {
            monitor: MonitorArgs {
                filter: VmFilter { vms: vec![vm.to_string()] },
                period_ms: 30,
                window: 4,
                config: None,
                hysteresis_points: 10.0,
            },
            dry_run,
            duration_s,
            exit_when_no_vms,
            cpus: None,
            reserve_cpus: None,
            state: state.to_path_buf(),
            metrics_addr: None,
            json: true,
        }),
    }
}

#[test]
#[serial(host)]
fn run_command_dry_run_signal_and_vm_exit() {
    let cg = preflight();
    let mut g = start("gleanertest-run", true);
    let vm = find(&g.name, 2);
    let before = snapshot(&vm);
    let d = tempfile::tempdir().unwrap();
    let state = d.path().join("host-state.json");

    // --dry-run changes nothing.
    gleaner_host::run(run_args(&g.name, &state, None, true, false)).unwrap();
    assert!(!state.exists());
    assert_restored(&cg, &vm, &before);

    // A timed run applies a plan (its state file lists both vCPU threads, which sit in its
    // pools' cgroups while it runs) and restores at the end.
    let st2 = state.clone();
    let name = g.name.clone();
    let h = std::thread::spawn(move || gleaner_host::run(run_args(&name, &st2, Some(3.0), false, false)));
    // The state file is written before the threads move (a crash between leaves them listed
    // for restore): wait for the move itself.
    wait("a plan in force", Duration::from_secs(10), || State::load(&state).ok().flatten().filter(|s| s.threads.len() == 2).map(|_| ()));
    wait("both vCPU threads in a pool", Duration::from_secs(10), || {
        vm.vcpus.iter().all(|v| cgroup_of(vm.pid, v.tid).contains(PREFIX)).then_some(())
    });
    assert_eq!(h.join().unwrap().unwrap(), std::process::ExitCode::SUCCESS);
    assert!(!state.exists());
    assert_restored(&cg, &vm, &before);

    // SIGTERM: the agent stops and restores.
    let st2 = state.clone();
    let name = g.name.clone();
    let h = std::thread::spawn(move || gleaner_host::run(run_args(&name, &st2, Some(30.0), false, false)));
    wait("a plan in force", Duration::from_secs(10), || State::load(&state).ok().flatten().filter(|s| s.threads.len() == 2).map(|_| ()));
    wait("both vCPU threads in a pool", Duration::from_secs(10), || {
        vm.vcpus.iter().all(|v| cgroup_of(vm.pid, v.tid).contains(PREFIX)).then_some(())
    });
    // SAFETY: kill(2) on our own pid with a signal whose handler `run` installed.
    assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGTERM) }, 0);
    let t0 = Instant::now();
    assert_eq!(h.join().unwrap().unwrap(), std::process::ExitCode::SUCCESS);
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(!state.exists());
    assert_restored(&cg, &vm, &before);

    // VM exit: the agent drops the VM, removes its pools and (--exit-when-no-vms) stops.
    let st2 = state.clone();
    let name = g.name.clone();
    let h = std::thread::spawn(move || gleaner_host::run(run_args(&name, &st2, Some(60.0), false, true)));
    wait("a plan in force", Duration::from_secs(10), || State::load(&state).ok().flatten().filter(|s| s.threads.len() == 2).map(|_| ()));
    g.kill();
    assert_eq!(h.join().unwrap().unwrap(), std::process::ExitCode::SUCCESS);
    assert!(!state.exists());
    assert!(leftover_groups(&cg).is_empty());
}
