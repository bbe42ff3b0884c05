//! Snapshot pickles as torch writes them (shared memo references) and as an attacker or
//! a broken file gives them (deep nesting, truncation, garbage): read, or refused with a
//! clear error, never a crash.

use std::process::Command;
use std::sync::Arc;

use npualloc::trace::{self, Op};

use crate::replay::{cli, tempdir};

/// A snapshot in torch's shape whose events share frame lists and frame dicts, pickled
/// by CPython itself (so the memo references are the ones real snapshots carry).
const SHARED_FRAMES: &str = r#"
import pickle, sys
inner = {'filename': 'model.py', 'line': 12, 'name': 'forward'}
outer = {'filename': 'train.py', 'line': 40, 'name': 'step'}
stack = [inner, outer]
other = [outer]
ev = lambda a, addr, s, st, fr: {'action': a, 'addr': addr, 'size': s, 'stream': st, 'frames': fr}
trace = [ev('alloc', 4096, 512, 0, stack), ev('alloc', 8192, 1024, 77, other),
         ev('free_requested', 4096, 512, 0, stack), ev('free_completed', 4096, 512, 0, stack),
         ev('alloc', 4096, 512, 0, stack), ev('free_requested', 8192, 1024, 77, other)]
pickle.dump({'segments': [], 'device_traces': [trace]}, open(sys.argv[1], 'wb'), protocol=int(sys.argv[2]))
"#;

fn cpython_snapshot(path: &std::path::Path, protocol: u8) {
    let status = Command::new("python3")
        .args([
            "-c",
            SHARED_FRAMES,
            path.to_str().unwrap(),
            &protocol.to_string(),
        ])
        .status()
        .expect("python3 is needed to write a snapshot pickle with CPython");
    assert!(status.success());
}

#[test]
fn shared_frame_lists_from_cpython_convert_with_their_frames() {
    let dir = tempdir("pickle-shared");
    for protocol in [2u8, 4, 5] {
        let path = dir.join(format!("shared{protocol}.pickle"));
        cpython_snapshot(&path, protocol);
        let bytes = std::fs::read(&path).unwrap();
        let s = trace::pickle::read_snapshot(&bytes, "shared.pickle", None).unwrap();
        assert_eq!(
            s.trace.ops,
            [
                Op::Alloc {
                    id: 0,
                    size: 512,
                    stream: 0
                },
                Op::Alloc {
                    id: 1,
                    size: 1024,
                    stream: 1
                },
                Op::Free { id: 0 },
                Op::Alloc {
                    id: 2,
                    size: 512,
                    stream: 0
                },
                Op::Free { id: 1 },
            ],
            "protocol {protocol}"
        );
        assert_eq!(s.frames.len(), 3);
        assert_eq!(s.frames[0].len(), 2);
        assert_eq!(s.frames[0][0].filename, "model.py");
        assert_eq!(s.frames[0][0].line, 12);
        assert_eq!(s.frames[0][1].name, "step");
        assert_eq!(s.frames[1][0], s.frames[0][1]);
        // The list the pickle shares is shared here too, not copied per event.
        assert!(Arc::ptr_eq(&s.frames[0], &s.frames[2]));

        let out = dir.join(format!("shared{protocol}.trace"));
        let (code, _, err) = cli(&[
            "convert",
            path.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{err}");
        let (code, _, err) = cli(&["replay", path.to_str().unwrap(), "--quiet"]);
        assert_eq!(code, 0, "{err}");
    }
}

/// `[[[...]]]` nested `depth` deep, byte for byte as CPython's `pickle.dumps(x, 4)`
/// writes it apart from the frame opcode (each list memoized).
fn nested_lists(depth: usize) -> Vec<u8> {
    let mut p = vec![0x80, 4];
    for _ in 0..depth {
        p.extend(b"]\x94");
    }
    p.extend(std::iter::repeat_n(b'a', depth - 1));
    p.push(b'.');
    p
}

#[test]
fn deeply_nested_pickles_are_refused_not_a_stack_overflow() {
    let dir = tempdir("pickle-deep");
    for depth in [2_000, 7_000, 200_000] {
        let path = dir.join(format!("deep{depth}.pickle"));
        std::fs::write(&path, nested_lists(depth)).unwrap();
        let (code, _, err) = cli(&["replay", path.to_str().unwrap(), "--quiet"]);
        assert_eq!(code, 2, "depth {depth}: {err}");
        assert!(err.contains("nested deeper than"), "{err}");
    }
    // Shallow nesting is fine (and is not a snapshot).
    let e = trace::pickle::from_snapshot(&nested_lists(100), "n.pickle", None).unwrap_err();
    assert!(e.message.contains("expected a dict"), "{e}");
}

#[test]
fn truncated_and_garbage_pickles_are_clear_errors() {
    let dir = tempdir("pickle-trunc");
    let path = dir.join("whole.pickle");
    cpython_snapshot(&path, 4);
    let bytes = std::fs::read(&path).unwrap();
    for cut in 0..bytes.len() {
        let e = trace::pickle::from_snapshot(&bytes[..cut], "cut.pickle", None).unwrap_err();
        assert!(
            e.message.contains("not a readable pickle"),
            "cut {cut}: {e}"
        );
    }
    // Every single-byte corruption is read or refused, never a panic.
    for i in 0..bytes.len() {
        for b in [0u8, 0x7f, 0xff, b'(', b'a', b'h'] {
            let mut c = bytes.clone();
            c[i] = b;
            let _ = trace::pickle::from_snapshot(&c, "flip.pickle", None);
        }
    }
    for garbage in [
        &b"\x80\x05\x95"[..],
        b"\xff\xff\xff",
        b"\x80\x02X\xff\xff\xff\xffab.",
    ] {
        let e = trace::pickle::from_snapshot(garbage, "g.pickle", None).unwrap_err();
        assert!(e.message.contains("not a readable pickle"), "{e}");
    }
}
