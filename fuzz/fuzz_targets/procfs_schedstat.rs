#![no_main]
//! Fuzz target `procfs_schedstat`: see `gleaner_fuzz_checks::procfs_schedstat`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| gleaner_fuzz_checks::procfs_schedstat(data));
