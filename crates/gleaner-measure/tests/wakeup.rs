//! The wakeup benchmark returns samples for each setting and never hangs.

use gleaner_measure::measure::allowed_cpu_set;
use gleaner_measure::wakeup::{self, Primitive, Setting, WakeupConfig};
use gleaner_os::procfs::Procfs;

#[test]
fn every_setting_returns_samples_without_hanging() {
    every_setting(Primitive::Condvar);
}

#[test]
fn every_setting_returns_samples_with_a_pthread_mutex() {
    every_setting(Primitive::Mutex);
}

fn every_setting(primitive: Primitive) {
    let allowed = allowed_cpu_set();
    assert!(allowed.len() >= 2, "settings B-D need 2 CPUs; this process may use only {allowed}");
    let mut cfg = WakeupConfig::for_cpus(&allowed);
    cfg.rounds = 60;
    cfg.warmup = 5;
    cfg.period_us = 300;
    cfg.primitive = primitive;
    let t = std::time::Instant::now();
    let res = wakeup::run(&cfg, &allowed, &Procfs::new()).expect("wakeup benchmark");
    assert!(t.elapsed() < std::time::Duration::from_secs(60), "took {:?}", t.elapsed());
    assert_eq!(res.iter().map(|r| r.setting).collect::<Vec<_>>(), Setting::ALL.to_vec());
    for r in &res {
        // Every round is accounted for: recorded, discarded (waiter not blocked yet) or lost.
        assert_eq!(r.samples as u64 + r.discarded + r.lost, 60, "{:?}", r.setting);
        assert!(r.samples > 0, "setting {:?} recorded no samples ({} discarded, {} lost)", r.setting, r.discarded, r.lost);
        assert_eq!(r.samples_ns.len(), r.samples);
        let p50 = r.p50_us.expect("p50");
        assert!(p50 > 0.0 && p50 < 1_000_000.0, "{:?} p50 {p50}", r.setting);
        assert!(r.p90_us >= r.p50_us && r.p99_us >= r.p90_us);
        if r.setting == Setting::A {
            assert_eq!(r.waker_cpu, r.waiter_cpu);
        } else {
            assert_ne!(r.waker_cpu, r.waiter_cpu);
        }
    }
}

#[test]
fn json_field_names_are_stable() {
    let allowed = allowed_cpu_set();
    let mut cfg = WakeupConfig::for_cpus(&allowed);
    cfg.settings = vec![Setting::A];
    cfg.rounds = 5;
    cfg.warmup = 0;
    cfg.period_us = 100;
    let r = wakeup::run(&cfg, &allowed, &Procfs::new()).unwrap();
    let v = serde_json::to_value(&r[0]).unwrap();
    for k in ["setting", "samples", "mean_us", "p50_us", "p90_us", "p99_us", "discarded", "lost", "samples_ns"] {
        assert!(v.get(k).is_some(), "missing field {k} in {v}");
    }
    assert_eq!(v["setting"], "A");
}
