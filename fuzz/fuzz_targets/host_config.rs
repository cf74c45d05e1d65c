#![no_main]
//! Fuzz target `host_config`: see `gleaner_fuzz_checks::host_config`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| gleaner_fuzz_checks::host_config(data));
