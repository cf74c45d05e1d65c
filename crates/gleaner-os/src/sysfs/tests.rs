use super::*;
use std::fs;

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, text).unwrap();
}

fn state(root: &Path, cpu: u32, k: u32, name: &str, usage: u64, time: u64, disable: u8) {
    let base = format!("devices/system/cpu/cpu{cpu}/cpuidle/state{k}");
    write(root, &format!("{base}/name"), &format!("{name}\n"));
    write(root, &format!("{base}/usage"), &format!("{usage}\n"));
    write(root, &format!("{base}/time"), &format!("{time}\n"));
    write(root, &format!("{base}/disable"), &format!("{disable}\n"));
}

#[test]
fn cpus_valid_malformed_empty() {
    let d = tempfile::tempdir().unwrap();
    let s = Sysfs::with_root(d.path());
    write(d.path(), "devices/system/cpu/online", "0-1\n");
    write(d.path(), "devices/system/cpu/possible", "0-3\n");
    assert_eq!(s.online_cpus().unwrap().to_string(), "0-1");
    assert_eq!(s.possible_cpus().unwrap().len(), 4);
    write(d.path(), "devices/system/cpu/online", "0-x\n");
    let e = s.online_cpus().unwrap_err();
    assert!(matches!(e, OsError::Parse { .. }) && e.to_string().contains("online"), "{e}");
    write(d.path(), "devices/system/cpu/online", "");
    assert!(s.online_cpus().unwrap().is_empty());
    fs::remove_file(d.path().join("devices/system/cpu/online")).unwrap();
    assert!(matches!(s.online_cpus().unwrap_err(), OsError::Read { .. }));
}

#[test]
fn cpuidle_valid() {
    let d = tempfile::tempdir().unwrap();
    let s = Sysfs::with_root(d.path());
    write(d.path(), "devices/system/cpu/cpuidle/current_driver", "haltpoll\n");
    write(d.path(), "devices/system/cpu/cpuidle/current_governor_ro", "haltpoll\n");
    state(d.path(), 0, 0, "POLL", 10, 100, 0);
    state(d.path(), 0, 1, "haltpoll", 500, 90000, 0);
    state(d.path(), 0, 10, "deep", 1, 1, 1);
    state(d.path(), 1, 0, "POLL", 5, 50, 0);
    state(d.path(), 1, 1, "haltpoll", 200, 1000, 0);
    assert_eq!(s.cpuidle_driver().unwrap().as_deref(), Some("haltpoll"));
    assert_eq!(s.cpuidle_governor().unwrap().as_deref(), Some("haltpoll"));
    let st = s.cpuidle_states(0).unwrap();
    assert_eq!(st.iter().map(|x| x.index).collect::<Vec<_>>(), vec![0, 1, 10], "numeric order");
    assert_eq!(st[1], IdleState { index: 1, name: "haltpoll".into(), usage: 500, time_us: 90000, disabled: false });
    assert!(st[2].disabled);
    assert_eq!(s.total_idle_entries(&CpuSet::parse("0-1").unwrap()).unwrap(), Some(10 + 500 + 1 + 5 + 200));
    assert_eq!(s.total_idle_entries(&CpuSet::parse("1").unwrap()).unwrap(), Some(205));
    assert_eq!(s.total_idle_entries(&CpuSet::parse("7").unwrap()).unwrap(), None);
    // The kept-open counters: the same sums, re-read at each call, POLL's time apart.
    let c = s.idle_counters(&CpuSet::parse("0-1,7").unwrap()).unwrap();
    let want0 = IdleCount { cpu: 0, entries: 511, idle_ns: 90_101_000, poll_ns: 100_000 };
    assert_eq!(
        c.read().unwrap(),
        vec![want0, IdleCount { cpu: 1, entries: 205, idle_ns: 1_050_000, poll_ns: 50_000 }],
        "CPU 7 has no states"
    );
    state(d.path(), 1, 0, "POLL", 6, 80, 0);
    assert_eq!(c.read().unwrap()[1], IdleCount { cpu: 1, entries: 206, idle_ns: 1_080_000, poll_ns: 80_000 });
    write(d.path(), "devices/system/cpu/cpu1/cpuidle/state1/time", "12x\n");
    let e = c.read().unwrap_err().to_string();
    assert!(e.contains("state1/time"), "names the file: {e}");
    // current_governor wins over current_governor_ro
    write(d.path(), "devices/system/cpu/cpuidle/current_governor", "menu\n");
    assert_eq!(s.cpuidle_governor().unwrap().as_deref(), Some("menu"));
}

#[test]
fn cpuidle_malformed_and_absent() {
    let d = tempfile::tempdir().unwrap();
    let s = Sysfs::with_root(d.path());
    assert_eq!(s.cpuidle_driver().unwrap(), None);
    assert_eq!(s.cpuidle_governor().unwrap(), None);
    assert!(s.cpuidle_states(0).unwrap().is_empty());
    assert_eq!(s.total_idle_entries(&CpuSet::first_n(2)).unwrap(), None);
    write(d.path(), "devices/system/cpu/cpuidle/current_driver", "none\n");
    assert_eq!(s.cpuidle_driver().unwrap(), None);
    state(d.path(), 0, 0, "POLL", 1, 1, 0);
    write(d.path(), "devices/system/cpu/cpu0/cpuidle/state0/usage", "lots\n");
    let e = s.cpuidle_states(0).unwrap_err();
    assert!(e.to_string().contains("state0/usage"), "{e}");
    write(d.path(), "devices/system/cpu/cpu0/cpuidle/state0/usage", "");
    assert!(matches!(s.cpuidle_states(0).unwrap_err(), OsError::Parse { .. }));
}

#[test]
fn module_params_read_write_restore() {
    let d = tempfile::tempdir().unwrap();
    let s = Sysfs::with_root(d.path());
    write(d.path(), "module/haltpoll/parameters/guest_halt_poll_ns", "200000\n");
    write(d.path(), "module/haltpoll/parameters/guest_halt_poll_grow", "2\n");
    let p = s.module_params("haltpoll").unwrap();
    assert_eq!(p.len(), 2);
    assert_eq!(p["guest_halt_poll_ns"], "200000");
    assert!(s.module_params("kvm").unwrap().is_empty(), "module not loaded");
    let old = s.write_module_param("haltpoll", "guest_halt_poll_ns", "0").unwrap();
    assert_eq!(old, "200000");
    assert_eq!(s.module_params("haltpoll").unwrap()["guest_halt_poll_ns"], "0");
    // One parameter alone: the same value; absent parameter or module, none.
    assert_eq!(s.module_param("haltpoll", "guest_halt_poll_ns").unwrap().as_deref(), Some("0"));
    assert_eq!(s.module_param("haltpoll", "guest_halt_poll_grow").unwrap().as_deref(), Some("2"));
    assert_eq!(s.module_param("haltpoll", "nope").unwrap(), None);
    assert_eq!(s.module_param("kvm", "halt_poll_ns").unwrap(), None);
    assert!(matches!(s.module_param("haltpoll", "../x").unwrap_err(), OsError::BadInput(_)));
    assert!(matches!(s.write_module_param("haltpoll", "nope", "1").unwrap_err(), OsError::Read { .. }));
    assert!(matches!(s.write_module_param("haltpoll", "../x", "1").unwrap_err(), OsError::BadInput(_)));
    assert!(matches!(s.module_params("..").unwrap_err(), OsError::BadInput(_)));
}

#[test]
fn hypervisor_and_dmi() {
    let d = tempfile::tempdir().unwrap();
    let s = Sysfs::with_root(d.path());
    assert_eq!(s.hypervisor_type().unwrap(), None);
    assert_eq!(s.dmi().unwrap(), Dmi::default());
    write(d.path(), "hypervisor/type", "xen\n");
    write(d.path(), "class/dmi/id/sys_vendor", "QEMU\n");
    write(d.path(), "class/dmi/id/product_name", "\n");
    assert_eq!(s.hypervisor_type().unwrap().as_deref(), Some("xen"));
    let dmi = s.dmi().unwrap();
    assert_eq!(dmi.sys_vendor.as_deref(), Some("QEMU"));
    assert_eq!(dmi.product_name, None);
    assert_eq!(dmi.bios_vendor, None);
}

// ---- the real /sys of this machine ----

/// Writes a module parameter for real (root): printk's `time` is present on every kernel;
/// we write the current value back, so nothing changes.
#[test]
#[serial_test::serial(host)]
fn real_module_param_write_returns_old_value() {
    assert!(nix::unistd::geteuid().is_root(), "needs root to write /sys/module/printk/parameters/time");
    let s = Sysfs::new();
    let cur = s.module_params("printk").unwrap().get("time").cloned().expect("/sys/module/printk/parameters/time missing");
    let old = s.write_module_param("printk", "time", &cur).unwrap();
    assert_eq!(old, cur);
    assert_eq!(s.module_params("printk").unwrap()["time"], cur);
}

#[test]
fn real_sysfs() {
    let s = Sysfs::new();
    let online = s.online_cpus().unwrap();
    assert!(!online.is_empty());
    assert!(online.is_subset(&s.possible_cpus().unwrap()));
    let n = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    assert!(online.len() >= n, "online {online} vs available_parallelism {n}");
    // When the kernel has cpuidle, every online CPU has states and the counters only grow.
    // (No assertion that they move: on a loaded 2-vCPU machine a CPU may not idle for seconds.)
    if let Some(driver) = s.cpuidle_driver().unwrap() {
        assert!(!driver.is_empty());
        for cpu in &online {
            assert!(!s.cpuidle_states(cpu).unwrap().is_empty(), "driver {driver} but cpu{cpu} has no idle states");
        }
        let a = s.total_idle_entries(&online).unwrap().expect("cpuidle driver present but no states");
        std::thread::sleep(std::time::Duration::from_millis(5));
        let b = s.total_idle_entries(&online).unwrap().unwrap();
        assert!(b >= a, "idle entries went back: {a} -> {b}");
        // The kept-open counters re-read the kernel's (pread at 0 regenerates the text) and
        // agree with a fresh read.
        let c = s.idle_counters(&online).unwrap();
        let first = c.read().unwrap();
        assert_eq!(first.len(), online.len());
        std::thread::sleep(std::time::Duration::from_millis(50));
        let fresh = s.total_idle_entries(&online).unwrap().unwrap();
        let second = c.read().unwrap();
        let (e1, e2): (u64, u64) = (first.iter().map(|x| x.entries).sum(), second.iter().map(|x| x.entries).sum());
        assert!(e1 <= fresh && fresh <= e2, "kept-open entries {e1} then {e2} around a fresh read's {fresh}");
    } else {
        assert_eq!(s.total_idle_entries(&online).unwrap(), None);
    }
}

#[test]
fn packages_and_caches_on_fixture() {
    let d = tempfile::tempdir().unwrap();
    let c = d.path().join("devices/system/cpu/cpu1");
    write(d.path(), "devices/system/cpu/cpu1/topology/physical_package_id", "3\n");
    for (i, level, ty, size) in [(0, 1, "Data", "32K"), (2, 2, "Unified", "1024K"), (3, 3, "Unified", "32768K")] {
        let x = format!("devices/system/cpu/cpu1/cache/index{i}");
        write(d.path(), &format!("{x}/level"), &format!("{level}\n"));
        write(d.path(), &format!("{x}/type"), &format!("{ty}\n"));
        write(d.path(), &format!("{x}/size"), &format!("{size}\n"));
    }
    let s = Sysfs::with_root(d.path());
    assert_eq!(s.package_id(1).unwrap(), Some(3));
    assert_eq!(s.package_id(0).unwrap(), None);
    let by = s.cpus_by_package(&CpuSet::parse("0-1").unwrap()).unwrap();
    assert_eq!(by.into_iter().map(|(k, v)| (k, v.to_vec())).collect::<Vec<_>>(), vec![(0, vec![0]), (3, vec![1])]);
    assert_eq!(s.llc_bytes(1).unwrap(), Some(32 * 1024 * 1024));
    assert_eq!(s.llc_bytes(0).unwrap(), None);
    assert_eq!(s.l2_bytes(1), Some(1024 * 1024));
    fs::write(c.join("topology/physical_package_id"), "x\n").unwrap();
    let e = s.package_id(1).unwrap_err().to_string();
    assert!(e.contains("physical_package_id"), "{e}");
    assert_eq!(parse_size("8M"), Some(8 << 20));
    assert_eq!(parse_size(""), None);
}

/// Found by fuzzing (`host_procfs`): `77777777777777G` overflowed the multiplication (a
/// panic with overflow checks, a wrapped size without).
#[test]
fn cache_size_beyond_u64_is_refused_not_wrapped() {
    assert_eq!(parse_size("77777777777777G"), None);
    assert_eq!(parse_size("18014398509481984K"), None);
    assert_eq!(parse_size("18014398509481983K"), Some(18_014_398_509_481_983 * 1024));
    assert_eq!(parse_size("18446744073709551615"), Some(u64::MAX));
}

#[test]
fn debugfs_base_slice_when_readable() {
    let d = tempfile::tempdir().unwrap();
    let s = Sysfs::with_root(d.path());
    assert_eq!(s.debug_sched_base_slice_ns().unwrap(), None);
    write(d.path(), "kernel/debug/sched/base_slice_ns", "700000\n");
    assert_eq!(s.debug_sched_base_slice_ns().unwrap(), Some(700_000));
    write(d.path(), "kernel/debug/sched/base_slice_ns", "fast\n");
    assert!(s.debug_sched_base_slice_ns().unwrap_err().to_string().contains("base_slice_ns"));
}

/// What the agent's sampler relies on: a switch of the cpuidle governor (how the haltpoll
/// windows are reset) recreates the states' sysfs files, so the kept-open counters fail to
/// read (ENODEV) and must be reopened; the reopened ones read on from where the kernel's
/// counters are. It needs the haltpoll cpuidle governor and another one to switch through (a
/// cpuidle driver such as haltpoll); without them it fails saying so.
#[test]
#[serial_test::serial(host)]
fn kept_open_idle_counters_fail_after_a_governor_switch_and_reopen() {
    let s = Sysfs::new();
    let knobs = crate::idle::IdleKnobs::new();
    let online = s.online_cpus().unwrap();
    let before = s.idle_counters(&online).unwrap();
    let first = before.read().unwrap();
    let governor = s.cpuidle_governor().unwrap();
    let available = std::fs::read_to_string("/sys/devices/system/cpu/cpuidle/available_governors").unwrap_or_default();
    assert!(
        knobs.reset_poll_windows().unwrap(),
        "this test needs the haltpoll cpuidle governor running and menu, ladder or teo to switch through \
         (current governor {governor:?}, available '{}'; a VM with the haltpoll cpuidle driver has them)",
        available.trim()
    );
    assert!(!first.is_empty(), "the haltpoll governor runs but no CPU has cpuidle states");
    let e = before.read().expect_err("the old files read on after the governor switch");
    assert!(e.to_string().contains("cpuidle/state"), "{e}");
    let again = s.idle_counters(&online).unwrap().read().unwrap();
    assert_eq!(again.len(), first.len());
    for (a, b) in first.iter().zip(&again) {
        assert!(b.entries >= a.entries && b.idle_ns >= a.idle_ns, "counters went back: {a:?} -> {b:?}");
    }
}
