//! Each kernel run briefly with its work checked, and deliberately broken kernels caught.

use gleaner_bench::workload::{run_workload, CheckFailed, Fault, Workload, WorkloadParams};

fn quick(w: Workload) -> WorkloadParams {
    let mut p = WorkloadParams::quick(w);
    p.items = p.items.min(400);
    p
}

#[test]
fn every_kernel_completes_and_checks_its_work() {
    for w in Workload::ALL {
        let p = quick(w);
        let a = run_workload(w, &p).unwrap_or_else(|e| panic!("{w}: {e:#}"));
        assert_eq!(a.items, p.items, "{w}");
        // Same parameters and rate: same checksum (the work is deterministic).
        let mut p2 = p.clone();
        p2.iters_per_us = Some(a.iters_per_us);
        let b = run_workload(w, &p2).unwrap();
        assert_eq!(a.checksum, b.checksum, "{w} checksum differs between runs");
    }
}

#[test]
fn kernels_work_with_odd_thread_counts() {
    for w in [Workload::Pipeline, Workload::Barrier, Workload::Condvar, Workload::Mutex, Workload::SpinBarrier] {
        let mut p = quick(w);
        p.threads = 3;
        p.items = 101;
        run_workload(w, &p).unwrap_or_else(|e| panic!("{w} with 3 threads: {e:#}"));
    }
}

fn assert_caught(w: Workload, fault: Fault) {
    let mut p = quick(w);
    p.fault = Some(fault);
    let err = run_workload(w, &p).expect_err(&format!("{w} with {fault:?} must fail its check"));
    let cf = err.downcast_ref::<CheckFailed>().unwrap_or_else(|| panic!("{w}: not a CheckFailed: {err:#}"));
    assert_eq!(cf.workload, w);
}

#[test]
fn corrupted_results_are_caught() {
    for w in [Workload::Pipeline, Workload::Barrier, Workload::Condvar, Workload::Mutex, Workload::SpinBarrier, Workload::Matmul] {
        assert_caught(w, Fault::CorruptOneItem);
    }
}

#[test]
fn missing_items_are_caught() {
    for w in [Workload::Pipeline, Workload::Freqsleep] {
        assert_caught(w, Fault::DropOneItem);
    }
}

#[test]
fn a_dropped_hand_off_stalls_and_is_reported_not_hung() {
    // The consumer waits for an item that never comes: its deadline must end the run.
    let mut p = quick(Workload::Condvar);
    p.fault = Some(Fault::DropOneItem);
    p.stall_timeout_ms = Some(500);
    let t = std::time::Instant::now();
    let err = run_workload(Workload::Condvar, &p).expect_err("a lost item must fail");
    assert!(format!("{err:#}").contains("no progress"), "{err:#}");
    assert!(t.elapsed() < std::time::Duration::from_secs(20));
}
