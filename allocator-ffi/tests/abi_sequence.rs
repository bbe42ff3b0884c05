//! Property test of the C ABI: random call sequences (malloc, free, record_stream,
//! stream work, empty_cache, memory fraction, misuse) on the simulated device keep the
//! invariants and end with nothing allocated or reserved. The same interpreter is the
//! `c_abi` fuzz target (fuzz/README.md); this bounded run is what CI does on stable.

#[path = "common/abi_sequence.rs"]
mod abi_sequence;

use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn c_abi_call_sequences_keep_invariants(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        abi_sequence::run(&data);
    }
}

/// Fixed sequences that run every time, whatever proptest draws: nothing; an
/// out-of-memory request, then misuse, then a free; a block used on another stream with
/// work queued there, freed, then empty_cache.
#[test]
fn fixed_sequences() {
    abi_sequence::run(&[]);
    abi_sequence::run(&[0, 255, 255, 19, 9, 0, 0, 0, 3, 0, 0, 0]);
    abi_sequence::run(&[
        0, 1, 0, 33, 4, 0, 0, 1, 5, 0, 0, 1, 3, 0, 0, 0, 0, 1, 0, 0, 7, 0, 0, 0,
    ]);
}
