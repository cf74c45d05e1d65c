#![no_main]
//! Fuzz target `procfs_status`: see `gleaner_fuzz_checks::procfs_status`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| gleaner_fuzz_checks::procfs_status(data));
