#![no_main]
//! Fuzz target `agent_config`: see `gleaner_fuzz_checks::agent_config`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| gleaner_fuzz_checks::agent_config(data));
