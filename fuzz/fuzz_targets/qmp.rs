#![no_main]
//! Fuzz target `qmp`: see `gleaner_fuzz_checks::qmp`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| gleaner_fuzz_checks::qmp(data));
