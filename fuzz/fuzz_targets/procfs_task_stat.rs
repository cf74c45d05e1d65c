#![no_main]
//! Fuzz target `procfs_task_stat`: see `gleaner_fuzz_checks::procfs_task_stat`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| gleaner_fuzz_checks::procfs_task_stat(data));
