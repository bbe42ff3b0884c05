//! What the fuzz targets (`fuzz/fuzz_targets/`) check for one input, shared with the
//! stable property tests (`fuzz_props.rs`) so both hold the entry points to the same
//! promises: any input is accepted or refused with an error, never a panic, an
//! overflow, a stack overflow or unbounded memory.

use npualloc::trace::{self, pickle, unpickle};
use npualloc::Config;

/// The text trace parser: a parsed trace's figures and repetition never panic, and
/// its written form parses back to the same events; an error names a line.
pub fn trace_input(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match trace::parse(text, "fuzz.trace") {
        Ok(t) => {
            let _ = (t.peak_requested(), t.pending_floor());
            let r = t.repeated(3);
            let mut out = Vec::new();
            r.write_to(&mut out).unwrap();
            let again = trace::parse(std::str::from_utf8(&out).unwrap(), "again").unwrap();
            assert_eq!(again.ops, r.ops);
        }
        Err(e) => assert!(e.line >= 1, "{e}"),
    }
}

/// The snapshot-pickle reader.
pub fn pickle_input(data: &[u8]) {
    if let Ok(p) = unpickle::read(data) {
        assert!(!p.is_empty());
    }
    if let Ok(s) = pickle::read_snapshot(data, "fuzz.pickle", None) {
        assert_eq!(
            s.frames.len(),
            s.trace
                .ops
                .iter()
                .filter(|o| matches!(o, trace::Op::Alloc { .. }))
                .count()
        );
    }
}

/// The settings parser (the first byte varies the sizes tried): accepted settings
/// round every request size without panicking.
pub fn config_input(data: &[u8]) {
    let Some((&k, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    if let Ok(c) = Config::parse(text) {
        for shift in [0u32, 9, 20, 30, 36, 40, 47] {
            let size = (1usize << shift) + usize::from(k);
            if let Some(r) = c.block_size(size) {
                assert!(r >= size);
            }
        }
    }
}
