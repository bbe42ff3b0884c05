//! Fuzz target: `fuzz_checks::trace_input` (shared with the stable property tests).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/all/fuzz_checks.rs"]
mod fuzz_checks;

fuzz_target!(|data: &[u8]| fuzz_checks::trace_input(data));
