#![no_main]
//! Fuzz target `cpu_list`: see `gleaner_fuzz_checks::cpu_list`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| gleaner_fuzz_checks::cpu_list(data));
