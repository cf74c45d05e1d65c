use super::*;

/// Runs `f` on a fresh thread (so scheduler changes die with it) and returns its result.
fn on_thread<T: Send + 'static>(f: impl FnOnce(i32) -> T + Send + 'static) -> T {
    std::thread::spawn(move || f(gettid())).join().unwrap()
}

#[test]
fn gettid_is_per_thread() {
    let main = gettid();
    assert!(main > 0);
    let other = on_thread(|t| t);
    assert_ne!(main, other);
    assert_eq!(gettid(), main);
}

#[test]
fn sched_idle_and_back() {
    let (before, idle, after, stat_policy) = on_thread(|tid| {
        let before = policy(tid).unwrap();
        set_idle(tid).unwrap();
        let idle = policy(0).unwrap();
        let pid = i32::try_from(std::process::id()).unwrap();
        let stat_policy = crate::procfs::Procfs::new().task_stat(pid, tid).unwrap().policy;
        set_other(tid).unwrap();
        (before, idle, policy(tid).unwrap(), stat_policy)
    });
    assert_eq!(before, Policy::Other);
    assert_eq!(idle, Policy::Idle);
    assert_eq!(stat_policy, 5, "/proc stat agrees with sched_getscheduler");
    assert_eq!(after, Policy::Other);
}

#[test]
fn eevdf_slice_round_trip() {
    let r = on_thread(|tid| {
        let attr0 = get_attr(tid).unwrap();
        set_slice(tid, Duration::from_millis(1)).unwrap();
        let s1 = slice(tid).unwrap();
        set_slice(0, Duration::from_millis(90)).unwrap();
        let s90 = slice(tid).unwrap();
        let attr = get_attr(tid).unwrap();
        reset_slice(tid).unwrap();
        (attr0, s1, s90, attr, slice(tid).unwrap())
    });
    let (attr0, s1, s90, attr, reset) = r;
    assert_eq!(s1, Duration::from_millis(1), "kernel {} must keep a 1 ms slice (needs Linux >= 6.12)", crate::kernel_release());
    assert_eq!(s90, Duration::from_millis(90));
    assert_eq!(attr.sched_policy, attr0.sched_policy, "policy kept");
    assert_eq!(attr.sched_nice, attr0.sched_nice, "nice kept");
    assert!(reset >= MIN_SLICE && reset <= MAX_SLICE, "default slice {reset:?}");
}

#[test]
fn slice_keeps_nice_and_refuses_sched_idle() {
    let (pol, nice, s) = on_thread(|tid| {
        // SAFETY: setpriority on our own thread id with plain integers.
        let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, u32::try_from(tid).unwrap(), 5) };
        assert_eq!(r, 0);
        set_slice(tid, Duration::from_millis(3)).unwrap();
        let a = get_attr(tid).unwrap();
        set_slice(tid, Duration::from_micros(100)).unwrap();
        let s = slice(tid).unwrap();
        set_idle(tid).unwrap();
        // The kernel ignores sched_runtime for SCHED_IDLE; we refuse rather than pretend.
        let e = set_slice(tid, Duration::from_millis(1)).unwrap_err();
        assert!(matches!(e, OsError::BadInput(_)), "{e}");
        (policy(tid).unwrap(), a.sched_nice, s)
    });
    assert_eq!(nice, 5);
    assert_eq!(pol, Policy::Idle);
    assert_eq!(s, Duration::from_micros(100));
}

#[test]
fn slice_out_of_range_is_bad_input() {
    for d in [Duration::ZERO, Duration::from_micros(99), Duration::from_millis(101), Duration::from_secs(5)] {
        let e = set_slice(0, d).unwrap_err();
        assert!(matches!(e, OsError::BadInput(_)), "{d:?}: {e}");
    }
}

#[test]
fn affinity_round_trip_and_current_cpu() {
    let (orig, pinned, cpu_seen, restored) = on_thread(|tid| {
        let orig = affinity(tid).unwrap();
        let target = orig.last().unwrap();
        set_affinity(tid, &CpuSet::from_iter([target])).unwrap();
        yield_now();
        let seen = current_cpu().unwrap();
        let pinned = affinity(0).unwrap();
        set_affinity(tid, &orig).unwrap();
        (orig, pinned, (target, seen), affinity(tid).unwrap())
    });
    assert!(!orig.is_empty());
    assert_eq!(pinned.len(), 1);
    assert_eq!(cpu_seen.0, cpu_seen.1, "thread pinned to CPU {} ran on {}", cpu_seen.0, cpu_seen.1);
    assert_eq!(restored, orig);
    assert!(matches!(set_affinity(0, &CpuSet::new()).unwrap_err(), OsError::BadInput(_)));
    assert!(matches!(set_affinity(0, &CpuSet::from_iter([5000])).unwrap_err(), OsError::BadInput(_)));
}

#[test]
fn vanished_thread() {
    // A thread id that has exited: take one from a joined thread and make sure it is not reused.
    let tid = on_thread(|t| t);
    let pid = i32::try_from(std::process::id()).unwrap();
    if crate::procfs::Procfs::new().tasks(pid).unwrap().contains(&tid) {
        panic!("tid {tid} still listed after join");
    }
    let e = policy(tid).unwrap_err();
    assert!(e.is_vanished(), "{e}");
    assert!(affinity(tid).unwrap_err().is_vanished());
    assert!(set_slice(tid, Duration::from_millis(1)).unwrap_err().is_vanished());
}

#[test]
fn policy_numbers() {
    assert_eq!(Policy::from_raw(5), Policy::Idle);
    assert_eq!(Policy::from_raw(42), Policy::Unknown(42));
    assert!(Policy::Batch.is_fair() && !Policy::Fifo.is_fair());
    assert!(Policy::Idle.is_fair() && !Policy::Idle.accepts_slice() && Policy::Other.accepts_slice());
}

#[test]
fn timer_slack_is_set_on_the_calling_thread_only() {
    let read = || nix::sys::prctl::get_timerslack().unwrap();
    let before = read();
    std::thread::spawn(move || {
        set_own_timer_slack(1).unwrap();
        assert_eq!(read(), 1);
        assert!(matches!(set_own_timer_slack(0), Err(OsError::BadInput(b)) if b.to_string().contains("timer slack")));
    })
    .join()
    .unwrap();
    assert_eq!(read(), before);
}
