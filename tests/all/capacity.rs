//! The minimum-capacity search (`npualloc replay --min-capacity`).

use npualloc::config::PYTORCH_POLICY;
use npualloc::replay::{min_capacity, replay, MinCapacity, ReplayOptions};
use npualloc::trace;

use crate::replay::{cli, load, tempdir, traces_dir};

const MIB: u64 = 1 << 20;

fn ooms_at(t: &trace::Trace, conf: &str, capacity: u64) -> u64 {
    let opts = ReplayOptions {
        conf: conf.into(),
        capacity: capacity as usize,
        ..ReplayOptions::default()
    };
    replay(t, &opts, |_| {}).unwrap().ooms
}

#[test]
fn min_capacity_fits_and_one_mib_less_does_not() {
    let t = load("gpt2_infer.trace");
    for conf in ["", PYTORCH_POLICY, "expandable_segments:True"] {
        let opts = ReplayOptions {
            conf: conf.into(),
            ..ReplayOptions::default()
        };
        let m = min_capacity(&t, &opts).unwrap();
        let MinCapacity::Fits {
            capacity,
            peak_requested,
            ref at_min,
            replays,
        } = m
        else {
            panic!("{conf}: gpt2_infer fits in 64 GiB");
        };
        assert_eq!(capacity % MIB, 0, "{conf}: whole MiB");
        assert_eq!(peak_requested, t.peak_requested());
        assert!(capacity >= peak_requested, "{conf}");
        assert_eq!(ooms_at(&t, conf, capacity), 0, "{conf}: fits at {capacity}");
        assert!(
            ooms_at(&t, conf, capacity - MIB) > 0,
            "{conf}: one MiB under {capacity} must fail"
        );
        // The replay it reports is the one at that capacity.
        assert_eq!(at_min.ooms, 0);
        assert!(at_min.peak_reserved <= capacity);
        assert_eq!(at_min.invariants, Ok(()));
        assert!(replays > 2 && replays < 40, "{conf}: {replays} replays");
        let ratio = m.ratio().unwrap();
        assert!((1.0..1.5).contains(&ratio), "{conf}: {ratio}");
    }
}

#[test]
fn min_capacity_is_at_most_the_uncapped_peak_reserved() {
    // The uncapped replay's peak reserved, rounded up to a MiB, is a capacity it fits in
    // (nothing in the replay depends on the capacity until memory runs out).
    let t = load("resnet50_train.trace");
    for conf in ["", PYTORCH_POLICY] {
        let opts = ReplayOptions {
            conf: conf.into(),
            ..ReplayOptions::default()
        };
        let uncapped = replay(&t, &opts, |_| {}).unwrap();
        let m = min_capacity(&t, &opts).unwrap();
        assert!(
            m.capacity().unwrap() <= uncapped.peak_reserved.div_ceil(MIB) * MIB,
            "{conf}"
        );
    }
}

#[test]
fn a_trace_that_never_fits_says_so() {
    let t = trace::parse("a 0 3000000000 0\nf 0\n", "huge.trace").unwrap();
    let opts = ReplayOptions {
        capacity: (1 << 30) + 12345,
        ..ReplayOptions::default()
    };
    match min_capacity(&t, &opts).unwrap() {
        MinCapacity::NoFit { limit, ooms } => {
            assert_eq!(limit, 1 << 30, "the limit, rounded down to a whole MiB");
            assert_eq!(ooms, 1);
        }
        other => panic!("a 3 GB request cannot fit in 1 GiB: {other:?}"),
    }
    let tiny = ReplayOptions {
        capacity: 4096,
        ..ReplayOptions::default()
    };
    let err = min_capacity(&t, &tiny).unwrap_err();
    assert!(err.to_string().contains("under 1 MiB"), "{err}");

    // The command line reports it in the table and in JSON, and exits with 3: the
    // replay at --capacity itself did not fit.
    let dir = tempdir("min-cap-nofit");
    let path = dir.join("huge.trace");
    std::fs::write(&path, "a 0 3000000000 0\nf 0\n").unwrap();
    let p = path.to_str().unwrap();
    let (code, out, err) = cli(&["replay", p, "--capacity", "1G", "--min-capacity"]);
    assert_eq!(code, 3, "{err}");
    assert!(out.contains("none: 1 OOMs at 1.00 GiB"), "{out}");
    let (code, out, _) = cli(&["replay", p, "--capacity", "1G", "--min-capacity", "--json"]);
    assert_eq!(code, 3);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["min_capacity"]["bytes"], serde_json::Value::Null);
    assert_eq!(v[0]["min_capacity"]["does_not_fit_in"], 1u64 << 30);
}

#[test]
fn cli_min_capacity_compares_settings_side_by_side() {
    let trace = traces_dir().join("gpt2_infer.trace");
    let t = trace.to_str().unwrap();
    let args = [
        "replay",
        t,
        "--min-capacity",
        "--conf",
        "",
        "--conf",
        "pytorch",
        "--conf",
        "pytorch,expandable_segments:True",
    ];
    let (code, out, err) = cli(&args);
    assert_eq!(code, 0, "{err}");
    for needle in [
        "min capacity",
        "min cap / requested",
        "stalled waits",
        "pytorch,expandable_segments:True",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in\n{out}");
    }
    let (code, out, _) = cli(&[&args[..], &["--json"]].concat());
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let runs = v.as_array().unwrap();
    assert_eq!(runs.len(), 3);
    assert_eq!(runs[1]["conf"], PYTORCH_POLICY);
    for r in runs {
        let m = &r["min_capacity"];
        let bytes = m["bytes"].as_u64().unwrap();
        assert_eq!(bytes % MIB, 0);
        assert!(bytes >= r["peak_requested"].as_u64().unwrap());
        let ratio = m["over_requested"].as_f64().unwrap();
        assert!(ratio >= 1.0, "{r}");
        for key in ["device_mallocs", "host_syncs", "stalled_waits", "retries"] {
            assert!(m[key].is_u64(), "{key} in {m}");
        }
    }
}
