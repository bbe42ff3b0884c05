//! A C ABI call sequence on the simulated device (manual mode): the interpreter shared
//! with the property test `allocator-ffi/tests/abi_sequence.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../../allocator-ffi/tests/common/abi_sequence.rs"]
mod abi_sequence;

fuzz_target!(|data: &[u8]| abi_sequence::run(data));
