//! Two real Linux guests (QEMU TCG, 1 vCPU each) on this host's pCPUs: one writes to its
//! serial port in a loop (device I/O emulated by its vCPU thread), one spins. The agent must
//! type the first IOInt and the second CpuBurn (no LLC counters here) from what the host sees,
//! put them in a 1 ms and a 30 ms pool, and restore everything afterwards.
//!
//! Needs root, qemu-system-x86_64, busybox (static) and a kernel in the lab cache
//! (`gleaner lab fetch-kernel`, /var/cache/gleaner-lab/kernels/<ver>/vmlinux). The guests are
//! started with the QEMU fixture (`gleaner_qemu`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use gleaner_host::actuate::{State, PREFIX};
use gleaner_host::discover::{self, Evidence, Vm};
use gleaner_host::{HostArgs, HostCommand, MonitorArgs, RunArgs, VmFilter};
use gleaner_os::cgroup::{Cgroups, Layout};
use gleaner_os::procfs::Procfs;
use gleaner_os::sched;
use gleaner_qemu::cpio::Cpio;
use gleaner_qemu::kernel as cache;
use gleaner_qemu::{guest, wait_until, Accel, QemuCommand, RunningQemu};
use serial_test::serial;

const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t devtmpfs dev /dev
case "$(/bin/busybox cat /proc/cmdline)" in
  *gl=io*) while :; do echo 0123456789012345678901234567890123456789 > /dev/ttyS0; done ;;
  *gl=cpu*) while :; do :; done ;;
esac
"#;

/// The newest kernel in the lab cache (`gleaner lab fetch-kernel`).
fn lab_kernel() -> PathBuf {
    let dir = cache::resolve_cache_dir(None);
    cache::find_kernel(&dir, None).unwrap_or_else(|e| panic!("{e}: run `gleaner lab fetch-kernel`")).image()
}

/// An initramfs with static busybox and the init above.
fn initramfs(dir: &Path) -> PathBuf {
    let busybox = guest::find_busybox().unwrap_or_else(|e| panic!("{e}"));
    let mut c = Cpio::new();
    for d in ["bin", "proc", "dev"] {
        c.dir(d);
    }
    c.file("bin/busybox", 0o755, &std::fs::read(&busybox).unwrap());
    c.file("init", 0o755, INIT.as_bytes());
    let out = dir.join("initramfs.cpio");
    std::fs::write(&out, c.finish()).unwrap();
    out
}

/// A 1-vCPU TCG guest running the init above in `mode` (`io` or `cpu`); its ttyS0 is the
/// guest's console file.
fn start(name: &str, mode: &str, kernel: &Path, initrd: &Path) -> RunningQemu {
    QemuCommand::new(name)
        .cpus(1)
        .memory_mib(128)
        .accel(Accel::Tcg)
        .kernel(kernel)
        .initrd(initrd)
        .append(format!("console=ttyS0 quiet loglevel=0 gl={mode}"))
        .spawn()
        .unwrap_or_else(|e| panic!("{e}: qemu-system-x86_64 must be installed (qemu-system-x86)"))
}

fn wait<T>(what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
    wait_until(what, timeout, f).unwrap_or_else(|e| panic!("{e}"))
}

fn find(name: &str) -> Vm {
    wait(&format!("VM {name}"), Duration::from_secs(15), || {
        discover::discover(&Procfs::new())
            .unwrap()
            .into_iter()
            .find(|v| v.name == name && v.vcpus.len() == 1 && v.vcpus[0].evidence == Evidence::ThreadName)
    })
}

#[test]
#[serial(host)]
fn io_guest_and_cpu_guest_get_their_pools() {
    assert!(nix::unistd::geteuid().is_root(), "needs root");
    let cg = Cgroups::detect().expect("a cpuset cgroup controller");
    let online = gleaner_os::sysfs::Sysfs::new().online_cpus().unwrap();
    assert!(online.len() >= 2, "needs 2 CPUs, found {online}");
    let d = tempfile::tempdir().unwrap();
    let kernel = lab_kernel();
    let initrd = initramfs(d.path());
    let io = start("gltypes-io", "io", &kernel, &initrd);
    let _cpu = start("gltypes-cpu", "cpu", &kernel, &initrd);
    let io_serial = io.console_path();
    let io_vm = find("gltypes-io");
    let cpu_vm = find("gltypes-cpu");
    // Booted and writing (the kernel's boot takes 2-5 s under TCG).
    wait("the I/O guest writing to its serial port", Duration::from_secs(60), || {
        (std::fs::metadata(&io_serial).map(|m| m.len()).unwrap_or(0) > 50_000).then_some(())
    });
    let state = d.path().join("state.json");
    let args = HostArgs {
        command: HostCommand::Run(RunArgs {
            monitor: MonitorArgs {
                filter: VmFilter { vms: vec!["gltypes-io".into(), "gltypes-cpu".into()] },
                period_ms: 30,
                window: 4,
                config: Some(write_paper_config(d.path())),
                hysteresis_points: 10.0,
            },
            dry_run: false,
            duration_s: Some(20.0),
            exit_when_no_vms: false,
            cpus: Some(online.iter().take(2).collect()),
            reserve_cpus: None,
            state: state.clone(),
            metrics_addr: None,
            json: true,
        }),
    };
    let h = std::thread::spawn(move || gleaner_host::run(args));
    let v1 = matches!(cg.layout(), Layout::V1 { .. });
    let cgroup_of = |vm: &Vm| Procfs::new().task_cgroup(vm.pid, vm.vcpus[0].tid, if v1 { Some("cpuset") } else { None }).unwrap().unwrap();
    // Wait for the plan with both pools, then read the kernel's view.
    let seen = wait("IOInt in a 1 ms pool and CpuBurn in a 30 ms pool", Duration::from_secs(15), || {
        let st = State::load(&state).ok().flatten()?;
        let (io_cg, cpu_cg) = (cgroup_of(&io_vm), cgroup_of(&cpu_vm));
        let io_slice = sched::slice(io_vm.vcpus[0].tid).ok()?;
        let cpu_slice = sched::slice(cpu_vm.vcpus[0].tid).ok()?;
        (io_cg.ends_with(&format!("{PREFIX}-s0-1ms"))
            && cpu_cg.ends_with(&format!("{PREFIX}-s0-30ms"))
            && io_slice == Duration::from_millis(1)
            && cpu_slice == Duration::from_millis(30))
        .then_some((st.plan, io_cg, cpu_cg))
    });
    eprintln!("plan in force: {:#?}\nIOInt guest vCPU in {}, CPU guest vCPU in {}", seen.0, seen.1, seen.2);
    // SAFETY: kill(2) on our own pid; `run` installed the SIGTERM handler.
    assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGTERM) }, 0);
    assert_eq!(h.join().unwrap().unwrap(), std::process::ExitCode::SUCCESS);
    assert!(!state.exists());
    let left: Vec<PathBuf> = cg.list_gleaner_groups().unwrap().into_iter().filter(|p| p.to_string_lossy().contains(PREFIX)).collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(!cgroup_of(&io_vm).contains(PREFIX));
    assert_ne!(sched::slice(io_vm.vcpus[0].tid).unwrap(), Duration::from_millis(1));
}

/// The paper's quanta, so the test does not depend on /etc/gleaner/host.toml.
fn write_paper_config(dir: &Path) -> PathBuf {
    let p = dir.join("host.toml");
    gleaner_host::config::HostConfig::default().save(&p).unwrap();
    p
}
