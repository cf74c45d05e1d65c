#![no_main]
//! Fuzz target `lab_experiment`: see `gleaner_fuzz_checks::lab_experiment`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| gleaner_fuzz_checks::lab_experiment(data));
