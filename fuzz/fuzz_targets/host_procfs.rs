#![no_main]
//! Fuzz target `host_procfs`: see `gleaner_fuzz_checks::host_procfs`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| gleaner_fuzz_checks::host_procfs(data));
