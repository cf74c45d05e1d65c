#![no_main]
//! Fuzz target `bench_json`: see `gleaner_fuzz_checks::bench_json`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| gleaner_fuzz_checks::bench_json(data));
