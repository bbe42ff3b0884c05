//! Snapshot conversion that keeps what the snapshot holds (memory live when recording
//! began, stacks), stacks in text traces, and blame at the peak.

use std::process::Command;
use std::sync::Arc;

use npualloc::config::PYTORCH_POLICY;
use npualloc::replay::blame::{self, Blame};
use npualloc::replay::{replay, ReplayOptions};
use npualloc::trace::frames::{self, Frame};
use npualloc::trace::{self, Op};

use crate::replay::{cli, tempdir};

/// A snapshot recorded mid-run, pickled by CPython: a block allocated before recording
/// is freed in it (only its free is there), another is still allocated when the snapshot
/// is dumped (only the segments know it), a third was freed before recording and is
/// still pending; events share frame lists; there are actions that are not allocations
/// and a second device.
const MID_RUN: &str = r#"
import pickle, sys
fa = {'filename': '/home/u/model.py', 'line': 12, 'name': 'forward'}
fb = {'filename': '/venv/site-packages/torch/nn/functional.py', 'line': 2000, 'name': 'linear'}
fc = {'filename': '/home/u/train.py', 'line': 40, 'name': 'step'}
s1 = [fb, fa, fc]
s2 = [fc]
ev = lambda a, addr, s, st, fr: {'action': a, 'addr': addr, 'size': s, 'stream': st, 'frames': fr}
M = 1 << 20
trace = [ev('segment_alloc', M, 2 * M, 0, []),
         ev('free_requested', M, 1000, 0, s2), ev('free_completed', M, 1000, 0, s2),
         ev('alloc', M, 512, 0, s1), ev('alloc', 9 * M, 4 * M, 99, s1),
         ev('oom', 0, 0, 0, []), ev('free_requested', 9 * M, 4 * M, 99, s1)]
blk = lambda addr, size, req, state, fr: {'address': addr, 'size': size, 'requested_size': req, 'state': state, 'frames': fr}
segments = [{'device': 0, 'address': M, 'total_size': 2 * M, 'stream': 0, 'blocks': [
               blk(M, 512, 512, 'active_allocated', s1),
               blk(M + 512, 2048, 2000, 'active_allocated', s2),
               blk(M + 4096, 512, 500, 'active_pending_free', s2)]},
            {'device': 1, 'address': 5 * M, 'total_size': 2 * M, 'stream': 0, 'blocks': [
               blk(5 * M, 512, 512, 'active_allocated', s1)]}]
other = [ev('alloc', 1, 2, 0, [])]
pickle.dump({'segments': segments, 'device_traces': [trace, other]}, open(sys.argv[1], 'wb'), protocol=4)
"#;

fn mid_run_pickle(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("midrun.pickle");
    let status = Command::new("python3")
        .args(["-c", MID_RUN, path.to_str().unwrap()])
        .status()
        .expect("python3 is needed to write a snapshot pickle with CPython");
    assert!(status.success());
    path
}

fn frame(name: &str, file: &str, line: u64) -> Frame {
    Frame {
        filename: file.into(),
        line,
        name: name.into(),
    }
}

#[test]
fn conversion_keeps_memory_live_at_the_start_and_frames() {
    let dir = tempdir("convert-keeps");
    let path = mid_run_pickle(&dir);
    let s = trace::pickle::read_snapshot(&std::fs::read(&path).unwrap(), "m.pickle", None).unwrap();
    // The two blocks live when recording began come first, then the trace's events.
    assert_eq!(
        s.trace.ops,
        [
            Op::Alloc {
                id: 0,
                size: 1000,
                stream: 0
            },
            Op::Alloc {
                id: 1,
                size: 2000,
                stream: 0
            },
            Op::Free { id: 0 },
            Op::Alloc {
                id: 2,
                size: 512,
                stream: 0
            },
            Op::Alloc {
                id: 3,
                size: 4 << 20,
                stream: 1
            },
            Op::Free { id: 3 },
        ]
    );
    let step = frame("step", "/home/u/train.py", 40);
    assert_eq!(&s.frames[0][..], std::slice::from_ref(&step));
    assert_eq!(&s.frames[1][..], [step]);
    assert_eq!(s.frames[2].len(), 3);
    assert!(
        Arc::ptr_eq(&s.frames[2], &s.frames[3]),
        "shared in the pickle"
    );
    let n = &s.notes;
    assert_eq!((n.live_from_frees, n.live_from_segments), (1, 1));
    assert_eq!(n.live_bytes_at_start, 3000);
    assert_eq!(n.ignored_actions.get("oom"), Some(&1));
    assert_eq!(n.ignored_actions.get("segment_alloc"), Some(&1));
    assert_eq!(n.pending_at_dump, 1);
    assert_eq!(n.other_devices, [(1, 1)]);

    // The command line says so, and the text trace carries the frames back.
    let out = dir.join("m.trace");
    let (code, _, err) = cli(&[
        "convert",
        path.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    for needle in [
        "2 block(s) live when recording began (3000 bytes: 1 freed in the trace, 1 still allocated",
        "2 event(s) not converted (oom 1, segment_alloc 1)",
        "1 block(s) pending free",
        "device 1: 1 event(s) not converted (choose it with --device 1)",
        "wrote 6 events (4 allocations with frames)",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in\n{err}");
    }
    let text = std::fs::read_to_string(&out).unwrap();
    // Older readers see the events; the new one the same frames, still shared.
    assert_eq!(trace::parse(&text, "m.trace").unwrap().ops, s.trace.ops);
    let (t, stacks) = frames::parse_with_stacks(&text, "m.trace").unwrap();
    assert_eq!(t.ops, s.trace.ops);
    assert_eq!(stacks, s.stacks());
    assert!(Arc::ptr_eq(&stacks[&2], &stacks[&3]));
    assert_eq!(text.matches("#@stack").count(), 2, "{text}");
    // A replay starts with the live bytes: peak requested counts them.
    assert_eq!(t.peak_requested(), 2000 + 512 + (4 << 20));
}

/// Stacks: A is `forward` in model.py called through torch; B is `step` in train.py.
const SMALL: &str = "# npualloc-trace v1
#@frame\t0\t2000\tlinear\t/venv/site-packages/torch/nn/functional.py
#@frame\t1\t12\tforward\t/home/u/model.py
#@frame\t2\t40\tstep\t/home/u/train.py
#@stack\t0\t0 1 2
#@stack\t1\t2
a 0 524288 0 #@0
a 1 524288 0 #@1
a 2 12582912 0 #@1
f 2
a 3 4194304 1 #@0
";

const MIB: u64 = 1 << 20;

fn small_blame() -> Blame {
    let (t, stacks) = frames::parse_with_stacks(SMALL, "small.trace").unwrap();
    let opts = ReplayOptions {
        conf: PYTORCH_POLICY.into(),
        detail: true,
        ..ReplayOptions::default()
    };
    let r = replay(&t, &opts, |_| {}).unwrap();
    blame::blame(&t, &stacks, &r)
}

#[test]
fn blame_splits_the_peak_by_call_site_and_stream() {
    // PyTorch's policy: the two 512 KiB blocks share a 2 MiB segment, the 12 MiB block
    // had its own segment (empty at the peak, last used by B), the 4 MiB block on stream
    // 1 sits in a 20 MiB segment.
    let b = small_blame();
    assert_eq!(b.peak_event, 4);
    assert_eq!(b.reserved, 34 * MIB);
    assert_eq!(
        (b.live, b.pending, b.free_in_used, b.empty, b.unattributed),
        (5 * MIB, 0, 17 * MIB, 12 * MIB, 0)
    );
    assert_eq!(b.streams.len(), 2);
    let s0 = &b.streams[0];
    assert_eq!(s0.stream, 0);
    let site = |name: &str| s0.sites.iter().find(|s| s.site.starts_with(name)).unwrap();
    // A's site is its own code, not torch's frame under it.
    let a = site("forward (/home/u/model.py:12)");
    assert_eq!(
        (a.live, a.blocks, a.free_in_used, a.empty),
        (MIB / 2, 1, MIB / 2, 0)
    );
    let bb = site("step (/home/u/train.py:40)");
    assert_eq!(
        (bb.live, bb.free_in_used, bb.empty),
        (MIB / 2, MIB / 2, 12 * MIB)
    );
    assert_eq!(bb.wasted(), 12 * MIB + MIB / 2);
    let s1 = &b.streams[1];
    assert_eq!(s1.stream, 1);
    assert_eq!(s1.sites.len(), 1);
    assert_eq!(
        (s1.sites[0].live, s1.sites[0].free_in_used),
        (4 * MIB, 16 * MIB)
    );
    assert_eq!(s1.sites[0].stack.len(), 3);
    // Every reserved byte is blamed somewhere.
    let blamed: u64 = b
        .streams
        .iter()
        .flat_map(|s| &s.sites)
        .map(|s| s.live + s.wasted())
        .sum();
    assert_eq!(blamed, b.reserved);
    // The text lists the biggest waster of stream 0 first.
    let text = b.text();
    let waste = text
        .find("stream 0: top call sites by bytes wasted")
        .unwrap();
    assert!(
        text[waste..]
            .lines()
            .nth(1)
            .unwrap()
            .contains("step (/home/u/train.py:40)"),
        "{text}"
    );
}

#[test]
fn cli_blame_prints_and_writes_json() {
    let dir = tempdir("cli-blame");
    let path = dir.join("small.trace");
    std::fs::write(&path, SMALL).unwrap();
    let p = path.to_str().unwrap();
    let (code, out, err) = cli(&["replay", p, "--conf", "pytorch", "--blame", "--quiet"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("[pytorch] blame at peak reserved (event 4): 34.00 MiB reserved"),
        "{out}"
    );
    assert!(
        out.contains("stream 1: top call sites by live bytes"),
        "{out}"
    );
    let (code, out, _) = cli(&["replay", p, "--conf", "pytorch", "--blame", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let b = &v[0]["blame"];
    assert_eq!(b["reserved"], 34 * MIB);
    assert_eq!(b["empty_segments"], 12 * MIB);
    assert_eq!(
        b["streams"][0]["by_waste"][0]["site"],
        "step (/home/u/train.py:40)"
    );
    assert_eq!(b["streams"][0]["by_waste"][0]["empty_segments"], 12 * MIB);
    assert_eq!(b["streams"][1]["by_live"][0]["live"], 4 * MIB);
    // Without frames every byte still has a place, under one site.
    let plain = dir.join("plain.trace");
    std::fs::write(
        &plain,
        trace::parse(SMALL, "x")
            .map(|t| {
                let mut o = Vec::new();
                t.write_to(&mut o).unwrap();
                o
            })
            .unwrap(),
    )
    .unwrap();
    let (code, out, _) = cli(&[
        "replay",
        plain.to_str().unwrap(),
        "--conf",
        "pytorch",
        "--blame",
        "-q",
    ]);
    assert_eq!(code, 0);
    assert!(out.contains("the trace has no frames"), "{out}");
    assert!(out.contains("(no frames)"), "{out}");
}

#[test]
fn repeated_traces_keep_their_stacks() {
    let (t, stacks) = frames::parse_with_stacks(SMALL, "small.trace").unwrap();
    let r = blame::repeat_stacks(&t, &stacks, 3);
    let rt = t.repeated(3);
    assert_eq!(r.len(), 3 * stacks.len());
    // Repetition 2's fourth allocation is allocation 3 again.
    assert!(Arc::ptr_eq(&r[&(2 * 4 + 3)], &stacks[&3]));
    assert!(rt
        .ops
        .iter()
        .any(|op| matches!(op, Op::Alloc { id: 11, .. })));
}

#[test]
fn the_shipped_snapshot_with_frames_blames_model_code() {
    let path = crate::replay::traces_dir().join("zoo/vit_infer.snapshot.pickle");
    let s =
        trace::pickle::read_snapshot(&std::fs::read(path).unwrap(), "vit.pickle", None).unwrap();
    // The same events as the shipped trace, every allocation with its stack.
    assert_eq!(s.trace.ops, crate::replay::load("zoo/vit_infer.trace").ops);
    let stacks = s.stacks();
    assert_eq!(stacks.len(), 606);
    // Through the text format and back, stacks unchanged.
    let mut text = Vec::new();
    frames::write_with_stacks(&s.trace, &stacks, &mut text).unwrap();
    let (_, back) = frames::parse_with_stacks(std::str::from_utf8(&text).unwrap(), "v").unwrap();
    assert_eq!(back, stacks);
    let opts = ReplayOptions {
        detail: true,
        ..ReplayOptions::default()
    };
    let r = replay(&s.trace, &opts, |_| {}).unwrap();
    let b = blame::blame(&s.trace, &stacks, &r);
    assert!(b.has_frames);
    assert_eq!(b.reserved, r.peak_reserved);
    assert_eq!(b.unattributed, 0);
    let sites = &b.streams[0].sites;
    let blamed: u64 = sites.iter().map(|x| x.live + x.wasted()).sum();
    assert_eq!(blamed, b.reserved);
    // Call sites are the model's code, not PyTorch's modules under it.
    assert!(
        sites[0]
            .site
            .contains("torchvision/models/vision_transformer.py"),
        "{sites:?}"
    );
    assert!(
        sites.iter().all(|x| !x.site.starts_with("torch/")),
        "{sites:?}"
    );
}

#[test]
fn snapshots_written_by_a_replay_carry_the_frames() {
    let dir = tempdir("snap-frames");
    let path = dir.join("small.trace");
    std::fs::write(&path, SMALL).unwrap();
    let snap = dir.join("s.json");
    let (code, _, err) = cli(&[
        "replay",
        path.to_str().unwrap(),
        "--conf",
        "pytorch",
        "--snapshot",
        snap.to_str().unwrap(),
        "-q",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&snap).unwrap()).unwrap();
    let actions = v["device_traces"][0].as_array().unwrap();
    // Allocation 0 (stack A: 3 frames, innermost torch's) and its action.
    assert_eq!(actions[0]["action"], "alloc");
    assert_eq!(actions[0]["frames"].as_array().unwrap().len(), 3);
    assert_eq!(actions[0]["frames"][1]["name"], "forward");
    assert_eq!(actions[0]["frames"][1]["line"], 12);
    assert_eq!(actions[1]["frames"][0]["filename"], "/home/u/train.py");
    // The free of allocation 2 carries its frames too, as torch's do.
    assert_eq!(actions[3]["action"], "free_requested");
    assert_eq!(actions[3]["frames"][0]["name"], "step");
    // Every block allocated at the peak has its allocation's frames.
    let blocks: Vec<&serde_json::Value> = v["segments"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["blocks"].as_array().unwrap())
        .filter(|b| b["state"] == "active_allocated")
        .collect();
    assert_eq!(blocks.len(), 3);
    assert!(blocks
        .iter()
        .all(|b| !b["frames"].as_array().unwrap().is_empty()));
}

#[test]
fn malformed_frame_lines_are_clear_errors() {
    let dir = tempdir("bad-frames");
    for (text, needle) in [
        (
            "a 0 10 0 #@3\n",
            "bad.trace:1: stack 3 is not declared before its first use",
        ),
        (
            "#@frame\t0\tx\tf\tg\n",
            "bad.trace:1: line 'x' is not a non-negative integer",
        ),
        (
            "#@stack\t0\t7\n",
            "bad.trace:1: stack 0 uses frame 7, not declared before it",
        ),
    ] {
        let path = dir.join("bad.trace");
        std::fs::write(&path, text).unwrap();
        let (code, _, err) = cli(&["replay", path.to_str().unwrap(), "-q"]);
        assert_eq!(code, 2, "{text:?}: {err}");
        assert!(err.contains(needle), "{text:?}: {err}");
    }
}
