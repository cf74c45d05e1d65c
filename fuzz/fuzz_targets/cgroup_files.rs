#![no_main]
//! Fuzz target `cgroup_files`: see `gleaner_fuzz_checks::cgroup_files`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| gleaner_fuzz_checks::cgroup_files(data));
