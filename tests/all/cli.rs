//! The `npualloc` command line: what it tells a user when things go wrong, and the
//! files it writes.

use std::process::Command;

use crate::replay::{cli, tempdir, traces_dir};

fn gpt2() -> String {
    traces_dir().join("gpt2_infer.trace").display().to_string()
}

#[test]
fn a_replay_that_runs_out_of_memory_says_so_and_fails() {
    // 80 MiB: at 100 MiB only the 196 MiB logits no longer fit since a short device
    // takes PyTorch's segment size when the larger adaptive one does not fit.
    let (code, out, err) = cli(&["replay", &gpt2(), "--capacity", "80M", "--quiet"]);
    assert_eq!(code, 3, "exit status 3 = did not fit\n{err}");
    // The first OOM in full: event, allocation, size, the library's message with the
    // state; then how many followed.
    for needle in [
        "[default]: 11 allocation(s) did not fit in a 80.00 MiB device",
        "The first, event 62 (allocation 37 of 12.00 MiB (12582912) on stream 0",
        "out of memory. Tried to allocate 12.00 MiB",
        "total capacity of 80.00 MiB",
        "(10 more allocation(s) failed after it",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in\n{err}");
    }
    // Peak requested stays the trace's own, not what was served.
    assert!(out.contains("199.32 MiB (209006592)"), "{out}");
    let (code, out, _) = cli(&["replay", &gpt2(), "--capacity", "80M", "--json"]);
    assert_eq!(code, 3);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["peak_requested"], 209_006_592u64);
    assert_eq!(v[0]["ooms"], 11);
    // --oom-segments: what held the device just after the first OOM. On 212 MiB the
    // 196 MiB logits fail because a 20 MiB segment holds a live 3 MiB block (issue #16).
    let (code, _, err) = cli(&[
        "replay",
        &gpt2(),
        "--capacity",
        "212M",
        "--quiet",
        "--oom-segments",
    ]);
    assert_eq!(code, 3);
    assert!(
        err.contains("segments then (size, stream, pool, allocated"),
        "{err}"
    );
    assert!(err.contains("20.00 MiB s0 large   3.00 MiB"), "{err}");
    let (_, _, err) = cli(&["replay", &gpt2(), "--capacity", "212M", "--quiet"]);
    assert!(!err.contains("segments then"), "{err}");
    // Enough memory: no OOM text, exit 0.
    let (code, _, err) = cli(&["replay", &gpt2(), "--quiet"]);
    assert_eq!(code, 0);
    assert!(!err.contains("did not fit"), "{err}");
}

#[test]
fn empty_traces_and_bad_settings_are_errors_naming_what_is_wrong() {
    let dir = tempdir("cli-empty");
    for (name, text) in [
        ("empty.trace", ""),
        ("header.trace", "# npualloc-trace v1\n"),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        let (code, out, err) = cli(&["replay", p.to_str().unwrap()]);
        assert_eq!(code, 2, "{name}");
        assert!(err.contains("no events (the trace is empty"), "{err}");
        assert!(out.is_empty(), "no table of zeros: {out}");
    }
    let (code, _, err) = cli(&[
        "replay",
        &gpt2(),
        "--conf",
        "",
        "--conf",
        "max_split_size_mb:x",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.starts_with("error: --conf 'max_split_size_mb:x': "),
        "reported as a setting, not under the trace: {err}"
    );
}

#[test]
fn named_settings_label_columns_and_long_ones_get_a_legend() {
    let long = "pytorch,expandable_segments:True";
    let (code, out, err) = cli(&[
        "replay",
        &gpt2(),
        "--conf",
        "",
        "--conf",
        "torch=pytorch",
        "--conf",
        long,
        "--quiet",
    ]);
    assert_eq!(code, 0, "{err}");
    let header = out.lines().nth(1).unwrap();
    let columns: Vec<_> = header
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(columns, ["default", "torch", "conf 3"]);
    assert!(out.contains(&format!("  conf 3 = {long}")), "{out}");
    assert!(out.contains("  torch = pytorch"), "{out}");
    // The PyTorch preset is PyTorch's policy: 1.445 on gpt2 (README).
    let ratio = out
        .lines()
        .find(|l| l.contains("reserved / requested"))
        .unwrap();
    assert!(ratio.contains("1.445"), "{ratio}");
}

#[test]
fn a_pickle_snapshot_loads_in_python_as_the_json_one() {
    let dir = tempdir("cli-pickle");
    let pickle = dir.join("s.pickle");
    let json = dir.join("s.json");
    for out in [&pickle, &json] {
        let (code, _, err) = cli(&["replay", &gpt2(), "--snapshot", out.to_str().unwrap(), "-q"]);
        assert_eq!(code, 0, "{err}");
        assert!(err.contains("wrote the snapshot"), "{err}");
    }
    assert!(std::fs::read(&pickle).unwrap().starts_with(&[0x80, 2]));
    // CPython's own unpickler reads it back to exactly the JSON snapshot.
    let script = "import json, pickle, sys\n\
                  p = pickle.load(open(sys.argv[1], 'rb'))\n\
                  j = json.load(open(sys.argv[2]))\n\
                  assert p == j, 'different'\n\
                  assert len(p['segments']) > 1 and p['device_traces'][0][0]['action'] == 'alloc'\n\
                  print('same', len(p['device_traces'][0]))";
    let out = Command::new("python3")
        .args([
            "-c",
            script,
            pickle.to_str().unwrap(),
            json.to_str().unwrap(),
        ])
        .output()
        .expect("python3 runs (CI installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim() == "same 788",
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn sizes_take_decimals_and_binary_units_and_zero_says_why() {
    // The same device written four ways: the same OOM.
    let first_oom = |capacity: &str| {
        let (code, _, err) = cli(&["replay", &gpt2(), "--capacity", capacity, "-q"]);
        assert_eq!(code, 3, "{capacity}: {err}");
        err.lines().next().unwrap().to_string()
    };
    let want = first_oom("212M");
    assert!(
        want.contains("did not fit in a 212.00 MiB device"),
        "{want}"
    );
    for capacity in ["212MiB", "212 MB", "0.20703125G", "222298112"] {
        assert_eq!(first_oom(capacity), want, "{capacity}");
    }
    for capacity in ["1.5G", "64GiB", "1T"] {
        let (code, _, err) = cli(&["replay", &gpt2(), "--capacity", capacity, "-q"]);
        assert_eq!(code, 0, "{capacity}: {err}");
    }
    for (capacity, why) in [
        ("0", "a device of 0 bytes cannot hold any allocation"),
        ("0G", "a device of 0 bytes"),
        ("64X", "unknown unit 'X'"),
        ("1.5", "must be whole"),
        ("-1G", "cannot be negative"),
    ] {
        for cmd in ["replay", "tune"] {
            let arg = format!("--capacity={capacity}");
            let (code, out, err) = cli(&[cmd, &gpt2(), &arg]);
            assert_eq!(code, 2, "{cmd} {capacity}");
            assert!(
                err.starts_with(&format!("error: --capacity '{capacity}': ")) && err.contains(why),
                "{cmd} {capacity}: {err}"
            );
            assert!(out.is_empty(), "{out}");
        }
    }
}

#[test]
fn mistyped_settings_get_a_did_you_mean() {
    for (conf, want) in [
        (
            "max_split_size_mb=128",
            "NAME=SETTINGS names a column: 'max_split_size_mb' became a column name and '128' \
             its settings); did you mean --conf max_split_size_mb:128?",
        ),
        (
            "max_split_size_md:128",
            "unrecognized key 'max_split_size_md' in allocator config; did you mean 'max_split_size_mb'?",
        ),
        ("pytorh", "did you mean the preset 'pytorch'?"),
        ("torch-npu,hot_cache:False", "did you mean the preset 'torch_npu'?"),
    ] {
        let (code, out, err) = cli(&["replay", &gpt2(), "--conf", conf, "-q"]);
        assert_eq!(code, 2, "{conf}");
        assert!(
            err.starts_with(&format!("error: --conf '{conf}': ")) && err.trim_end().ends_with(want),
            "{conf}: {err}"
        );
        assert!(out.is_empty());
    }
}

#[test]
fn oom_advice_names_conf_and_a_small_block_holding_a_segment() {
    // On 212 MiB the 196 MiB logits fail while a 20 MiB segment is kept by a 3 MiB block.
    for listed in [false, true] {
        let mut args = vec![
            "replay".to_string(),
            gpt2(),
            "--capacity".into(),
            "212M".into(),
            "-q".into(),
        ];
        if listed {
            args.push("--oom-segments".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, _, err) = cli(&args);
        assert_eq!(code, 3, "{err}");
        assert!(!err.contains("NPUALLOC_CONF"), "{err}");
        let cause = err
            .lines()
            .find(|l| l.starts_with("  cause: "))
            .expect(&err);
        assert!(
            cause.contains("small live blocks keep 2 segment(s), 22.00 MiB in all (the largest: 20.00 MiB for 3.00 MiB live)")
                && cause.contains("would have left 212.00 MiB free for the 196.32 MiB request, where the device had 190.00 MiB"),
            "{cause}"
        );
        assert_eq!(cause.contains("--oom-segments lists"), !listed, "{cause}");
        let to_try = err
            .lines()
            .find(|l| l.starts_with("  to try: "))
            .expect(&err);
        assert!(to_try.contains("--conf max_split_size_mb:N"), "{to_try}");
        assert!(
            to_try.contains(&format!("`npualloc tune {} --capacity 212M`", gpt2())),
            "{to_try}"
        );
    }
    // On 80 MiB the segments are well used: no cause named, the settings to try still.
    let (code, _, err) = cli(&["replay", &gpt2(), "--capacity", "80M", "-q"]);
    assert_eq!(code, 3);
    assert!(
        !err.contains("cause:") && !err.contains("NPUALLOC_CONF"),
        "{err}"
    );
    assert!(
        err.contains("  to try: --conf max_split_size_mb:N"),
        "{err}"
    );
}
