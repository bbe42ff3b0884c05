//! Snapshots the replay tool writes read back in: JSON as well as pickle, with the same
//! events and frames; and inputs that are not traces get a short error.

use crate::replay::{cli, tempdir, traces_dir};

/// The event lines of a text trace (comments and frames left out).
fn events(text: &str) -> Vec<&str> {
    text.lines().filter(|l| !l.starts_with('#')).collect()
}

/// The replay table without its title line and speed row.
fn figures(out: &str) -> Vec<&str> {
    out.lines()
        .skip(1)
        .filter(|l| !l.contains("replay speed"))
        .collect()
}

#[test]
fn json_and_pickle_snapshots_replay_and_convert_like_their_trace() {
    let dir = tempdir("cli-snap-json");
    let gpt2 = traces_dir().join("gpt2_infer.trace");
    let gpt2 = gpt2.to_str().unwrap();
    let (code, original, err) = cli(&["replay", gpt2, "-q"]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(gpt2).unwrap();
    for name in ["s.json", "s.pickle", "s.pkl"] {
        let snap = dir.join(name);
        let snap = snap.to_str().unwrap();
        let (code, _, err) = cli(&["replay", gpt2, "--snapshot", snap, "-q"]);
        assert_eq!(code, 0, "{err}");
        // Replayed: the same figures as the trace it came from.
        let (code, out, err) = cli(&["replay", snap, "-q"]);
        assert_eq!(code, 0, "{name}: {err}");
        assert!(out.starts_with(&format!("{snap} (788 events)")), "{out}");
        assert_eq!(figures(&out), figures(&original), "{name}");
        // Converted: the same events.
        let (code, out, err) = cli(&["convert", snap, "-o", "-"]);
        assert_eq!(code, 0, "{name}: {err}");
        assert_eq!(events(&out), events(&text), "{name}");
    }
    // Read by content too: a JSON snapshot under another name.
    std::fs::copy(dir.join("s.json"), dir.join("s.data")).unwrap();
    let (code, out, err) = cli(&["replay", dir.join("s.data").to_str().unwrap(), "-q"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(figures(&out), figures(&original));
}

#[test]
fn a_json_snapshot_keeps_the_frames_of_its_pickle() {
    let dir = tempdir("cli-snap-frames");
    let pickle = traces_dir().join("zoo/vit_infer.snapshot.pickle");
    let pickle = pickle.to_str().unwrap();
    let json = dir.join("vit.json");
    let json = json.to_str().unwrap();
    let (code, _, err) = cli(&["replay", pickle, "--snapshot", json, "-q"]);
    assert_eq!(code, 0, "{err}");
    let (_, from_pickle, _) = cli(&["convert", pickle, "-o", "-"]);
    let (code, from_json, err) = cli(&["convert", json, "-o", "-"]);
    assert_eq!(code, 0, "{err}");
    let frames = |t: &str| t.lines().filter(|l| l.starts_with("#@")).count();
    assert!(frames(&from_pickle) > 10, "{from_pickle}");
    assert_eq!(frames(&from_json), frames(&from_pickle));
    assert_eq!(events(&from_json), events(&from_pickle));
    // --blame names the same call sites from either.
    let (_, a, _) = cli(&["replay", pickle, "--blame", "-q"]);
    let (_, b, _) = cli(&["replay", json, "--blame", "-q"]);
    let blame = |o: &str| {
        o.lines()
            .skip_while(|l| !l.contains("blame at peak"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert!(blame(&a).len() > 3, "{a}");
    assert_eq!(blame(&a), blame(&b));
}

#[test]
fn what_is_not_a_trace_gets_a_short_error() {
    let dir = tempdir("cli-snap-bad");
    let gpt2 = traces_dir().join("gpt2_infer.trace");
    let snap = dir.join("s.json");
    let (code, _, _) = cli(&[
        "replay",
        gpt2.to_str().unwrap(),
        "--snapshot",
        snap.to_str().unwrap(),
        "-q",
    ]);
    assert_eq!(code, 0);
    let json = std::fs::read_to_string(&snap).unwrap();
    assert!(json.len() > 50_000 && !json.contains('\n'));
    let (_, report, _) = cli(&["replay", gpt2.to_str().unwrap(), "--json", "-q"]);
    let cases = [
        // A snapshot cut short.
        (
            "cut.json",
            json[..300].to_string(),
            "not readable as JSON: EOF",
        ),
        // The replay's --json report is not a snapshot.
        (
            "report.json",
            report,
            "expected a dict at the top (a memory snapshot",
        ),
        // The state without history, as npualloc.dump_snapshot() writes it.
        (
            "state.json",
            r#"{"segments": [{"device": 0, "blocks": []}], "device_traces": [[]]}"#.into(),
            "no allocation history, which a replay needs",
        ),
        // One long line of text that is not a trace.
        (
            "long.trace",
            json.replace(['{', '['], " "),
            "unknown operation '\"device_traces\":",
        ),
        (
            "long-number.trace",
            format!("a 0 {} 0\n", "9".repeat(5000)),
            "(5000 bytes)' is too large",
        ),
    ];
    for (name, content, why) in cases {
        let p = dir.join(name);
        std::fs::write(&p, content).unwrap();
        for cmd in [
            &["replay", p.to_str().unwrap(), "-q"][..],
            &["convert", p.to_str().unwrap(), "-o", "-"],
        ] {
            let (code, out, err) = cli(cmd);
            assert_eq!(code, 2, "{cmd:?}: {err}");
            assert!(out.is_empty(), "{out}");
            assert!(err.contains(why), "{name}: {err}");
            // One line, which repeats at most a few dozen characters of the input.
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(err.len() < 500, "{} bytes: {err}", err.len());
        }
    }
}

#[test]
fn help_says_what_each_snapshot_name_gets() {
    let (code, out, _) = cli(&["replay", "--help"]);
    assert_eq!(code, 0);
    let flat = out.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains("a pickle for a .pickle or .pkl name") && flat.contains("JSON for any other"),
        "{out}"
    );
}
