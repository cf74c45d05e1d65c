#![no_main]
//! Fuzz target `procfs_tasks`: see `gleaner_fuzz_checks::procfs_tasks`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| gleaner_fuzz_checks::procfs_tasks(data));
