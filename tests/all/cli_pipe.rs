//! Every `npualloc` subcommand ends quietly, with status 0, when the reader of its
//! stdout closes the pipe early (`npualloc replay ... | head`).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::replay::{tempdir, traces_dir};

/// Runs `npualloc args` in `dir` with stdout on a pipe that is closed after `lines`
/// lines were read (0: before the command writes anything); returns the exit status
/// and stderr.
fn closed_after(dir: &std::path::Path, args: &[&str], lines: usize) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_npualloc"))
        .args(args)
        .current_dir(dir)
        .env("RUST_BACKTRACE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut reader = BufReader::new(stdout);
    for _ in 0..lines {
        let mut line = String::new();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "{args:?} printed fewer than {lines} lines"
        );
    }
    drop(reader);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_subcommand_ends_quietly_when_stdout_closes_early() {
    let dir = tempdir("cli-pipe");
    let traces = traces_dir();
    let t = |name: &str| traces.join(name).display().to_string();
    // A small trace keeps tune short.
    let small = dir.join("small.trace");
    std::fs::write(
        &small,
        "a 0 3000000 0\na 1 5000000 0\nf 0\na 2 1000 0\nf 1\nf 2\n",
    )
    .unwrap();
    let small = small.display().to_string();
    let (gpt2, bert, pickle) = (
        t("gpt2_infer.trace"),
        t("bert_train.trace"),
        t("gpt2_infer.snapshot.pickle"),
    );
    let commands: Vec<Vec<&str>> = vec![
        vec!["replay", &gpt2, &bert, "-q"],
        vec!["replay", &gpt2, "--json", "-q"],
        vec![
            "replay",
            &gpt2,
            "--blame",
            "--conf",
            "",
            "--conf",
            "x=pytorch",
            "-q",
        ],
        vec!["tune", &small, "-q"],
        vec!["tune", &small, "--json"],
        vec!["convert", &pickle, "-o", "-"],
        vec!["derive", &gpt2, "--case", "comm", "-o", "-"],
        vec!["--help"],
        vec!["replay", "--help"],
    ];
    for args in &commands {
        for lines in [0, 1] {
            let (code, err) = closed_after(&dir, args, lines);
            assert_eq!(code, Some(0), "{args:?} after {lines} line(s): {err}");
            for bad in ["panicked", "Broken pipe", "error"] {
                assert!(
                    !err.contains(bad),
                    "{args:?} after {lines} line(s) said {bad:?}: {err}"
                );
            }
        }
    }
    // `-o -` wrote to stdout, not to a file named `-`.
    assert!(!dir.join("-").exists());
}
