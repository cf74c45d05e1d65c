//! Tests on the real kernel: they load programs (root, CAP_BPF + CAP_PERFMON) and fail naming
//! what is missing.

use std::os::fd::AsFd;

use gleaner_policy::idle::hist::bucket_of;

use super::*;

fn require_root(what: &str) {
    assert!(nix::unistd::geteuid().is_root(), "{what} needs root (CAP_BPF and CAP_PERFMON): run the tests as root");
}

#[test]
fn bucket_in_bpf_equals_bucket_of() {
    require_root("loading the bucket test program");
    let insns = progs::bucket_probe().unwrap();
    let mut log = vec![0u8; 1 << 16];
    let fd = sys::prog_load(sys::PROG_TYPE_RAW_TRACEPOINT, &insns, "gl_bucket_test", Some(&mut log))
        .unwrap_or_else(|e| panic!("BPF_PROG_LOAD: {e}: {}", String::from_utf8_lossy(&log)));
    let mut values = vec![0u64, 1, 2, 3, 4, 5, 7, 8, 1023, 1024, 1025, 999_999_999, 1_000_000_000, u64::MAX];
    for k in 1..64 {
        values.extend([(1u64 << k) - 1, 1u64 << k, (1u64 << k) + 1]);
    }
    let mut x = 0x9e37_79b9_7f4a_7c15u64; // a fixed pseudo-random spread
    for _ in 0..200 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        values.push(x >> (x % 64));
    }
    for v in values {
        let got = sys::prog_test_run_raw_tp(fd.as_fd(), &[v]).expect("BPF_PROG_TEST_RUN");
        assert_eq!(usize::try_from(got).unwrap(), bucket_of(v), "bucket of {v}");
    }
}
