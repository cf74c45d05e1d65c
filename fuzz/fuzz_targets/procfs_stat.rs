#![no_main]
//! Fuzz target `procfs_stat`: see `gleaner_fuzz_checks::procfs_stat`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| gleaner_fuzz_checks::procfs_stat(data));
