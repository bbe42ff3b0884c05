//! The fuzz targets' checks (`fuzz_checks.rs`) on stable, bounded, in every test run:
//! the recorded regression inputs (`fuzz/regressions/<target>/`), then random inputs
//! shaped like each entry point's (trace lines, settings strings, mutated snapshots).
//! Long runs: cargo-fuzz (docs/testing.md, "Fuzzing, Miri, sanitizers and the soak").

use std::path::Path;

use proptest::prelude::*;

use crate::fuzz_checks::{config_input, pickle_input, trace_input};

fn regressions(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files.iter().map(|f| std::fs::read(f).unwrap()).collect()
}

#[test]
fn recorded_regression_inputs_pass_the_fuzz_checks() {
    let (t, p, c) = (
        regressions("trace_parse"),
        regressions("snapshot_pickle"),
        regressions("config_parse"),
    );
    assert!(t.len() >= 2 && p.len() >= 2 && c.len() >= 2);
    t.iter().for_each(|d| trace_input(d));
    p.iter().for_each(|d| pickle_input(d));
    c.iter().for_each(|d| config_input(d));
}

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u64..16).prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        Just(u64::MAX.to_string()),
        Just((1u64 << 60).to_string()),
        Just("18446744073709551616".to_string()),
        Just("-1".to_string()),
        "[0-9a-z]{0,3}",
    ]
}

fn trace_line() -> impl Strategy<Value = String> {
    (
        prop_oneof![
            Just("a"),
            Just("f"),
            Just("r"),
            Just("s"),
            Just("#"),
            Just("x")
        ],
        prop::collection::vec(number(), 0..5),
    )
        .prop_map(|(op, args)| format!("{op} {}", args.join(" ")))
}

fn setting() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("max_split_size_mb"),
        Just("roundup_power2_divisions"),
        Just("garbage_collection_threshold"),
        Just("expandable_segments"),
        Just("large_segment_size_mb"),
        Just("small_segment_size_mb"),
        Just("max_non_split_rounding_mb"),
        Just("page_size"),
        Just("lend_blocks"),
        Just("bogus"),
    ];
    let value = prop_oneof![
        number(),
        Just("True".to_string()),
        Just("False".to_string()),
        Just("0.5".to_string()),
        Just("1g".to_string()),
        (number(), number()).prop_map(|(a, b)| format!("[{a}:{b},>:{b}]")),
        "[\\[\\]:,>0-9]{0,12}",
    ];
    (key, value).prop_map(|(k, v)| format!("{k}:{v}"))
}

fn snapshot() -> &'static [u8] {
    static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTES.get_or_init(|| {
        std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/gpt2_infer.snapshot.pickle"),
        )
        .unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn trace_parser_on_random_traces(lines in prop::collection::vec(trace_line(), 0..40)) {
        trace_input(lines.join("\n").as_bytes());
    }

    #[test]
    fn trace_parser_on_random_bytes(data in prop::collection::vec(any::<u8>(), 0..200)) {
        trace_input(&data);
    }

    #[test]
    fn settings_parser_on_random_settings(k in any::<u8>(), items in prop::collection::vec(setting(), 0..5)) {
        let mut data = vec![k];
        data.extend(items.join(",").bytes());
        config_input(&data);
    }

    #[test]
    fn pickle_reader_on_random_bytes(data in prop::collection::vec(any::<u8>(), 0..300)) {
        pickle_input(&data);
    }

    #[test]
    fn pickle_reader_on_mutated_snapshots(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut data = snapshot().to_vec();
        for (at, byte) in edits {
            let i = at.index(data.len());
            data[i] = byte;
        }
        data.truncate(data.len() - cut.index(64.min(data.len())));
        pickle_input(&data);
    }
}
