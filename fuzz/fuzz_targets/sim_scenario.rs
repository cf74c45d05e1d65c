#![no_main]
//! Fuzz target `sim_scenario`: see `gleaner_fuzz_checks::sim_scenario`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| gleaner_fuzz_checks::sim_scenario(data));
