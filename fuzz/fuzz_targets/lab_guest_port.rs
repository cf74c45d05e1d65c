#![no_main]
//! Fuzz target `lab_guest_port`: see `gleaner_fuzz_checks::lab_guest_port`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| gleaner_fuzz_checks::lab_guest_port(data));
