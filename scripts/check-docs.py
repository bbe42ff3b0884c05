#!/usr/bin/env python3
"""Runs the commands the documentation shows and checks that they print what it shows,
so the docs and the program cannot drift apart.

A checked example is an HTML comment (invisible on GitHub) right before a fenced block:

    <!-- check: npualloc replay traces/zoo/vit_infer.snapshot.pickle --blame -q -->
    ```text
    ...expected output...
    ```

The command runs with bash in a scratch folder (default: target/doc-check, inside the
repository, so `cargo run` finds the workspace) that links the repository's `traces`,
`examples`, `python`, `scripts` and `docs` folders, with the --bin-dir folder first on PATH (where
`cargo install --root` put `npualloc`). `<!-- check exit=3: CMD -->` expects that exit
status (default 0). Its stdout and stderr, together and stripped of trailing blanks,
must contain the block's lines consecutively, where a line of only `...` stands for any
number of lines and `...` inside a line for any text.

Usage: check-docs.py [--bin-dir DIR] [--scratch DIR] [FILE...]
       (default files: README.md and docs/guides/*.md; prints each command checked)
       check-docs.py --first-command
       (prints the README's first command: the first line of its first sh block that
       is not a comment; scripts/test-docs.sh runs it as written)
"""

import argparse
import glob
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = re.compile(r"^<!-- check(?: exit=(\d+))?: (.*) -->\s*$")
LINKED = ["traces", "examples", "python", "scripts", "docs"]


def examples(path):
    """Yields (line number, command, expected exit status, expected lines) of a file."""
    lines = open(path, encoding="utf-8").read().split("\n")
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if not m:
            continue
        fence = i + 1
        if fence >= len(lines) or not lines[fence].startswith("```"):
            sys.exit("%s:%d: a check marker must be followed by a fenced block" % (path, i + 1))
        end = next((j for j in range(fence + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            sys.exit("%s:%d: the fenced block is not closed" % (path, fence + 1))
        yield i + 1, m.group(2), int(m.group(1) or 0), lines[fence + 1:end]


def first_command():
    """The first command line of README.md's first ```sh block."""
    in_sh = False
    for line in open(os.path.join(REPO, "README.md"), encoding="utf-8"):
        line = line.strip()
        if not in_sh:
            in_sh = line == "```sh"
        elif line.startswith("```"):
            break
        elif line and not line.startswith("#"):
            return line
    sys.exit("check-docs: README.md has no ```sh block with a command")


def pattern(expected):
    """The regular expression a block's lines stand for (see the module doc)."""
    parts = []
    for line in expected:
        line = line.rstrip()
        if line == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(".*?".join(re.escape(p) for p in line.split("...")) + r"\n")
    return re.compile("".join(parts))


def scratch_dir(path):
    os.makedirs(path, exist_ok=True)
    for name in LINKED:
        link = os.path.join(path, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join(REPO, name), link)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", help="put this folder first on PATH (the installed npualloc)")
    ap.add_argument("--scratch", default=os.path.join(REPO, "target", "doc-check"))
    ap.add_argument("--first-command", action="store_true")
    ap.add_argument("files", nargs="*")
    args = ap.parse_args()
    if args.first_command:
        print(first_command())
        return
    files = args.files or [os.path.join(REPO, "README.md")] + sorted(
        glob.glob(os.path.join(REPO, "docs", "guides", "*.md")))
    env = dict(os.environ)
    if args.bin_dir:
        env["PATH"] = os.path.abspath(args.bin_dir) + os.pathsep + env["PATH"]
    cwd = scratch_dir(args.scratch)
    checked, failed = 0, []
    for path in files:
        rel = os.path.relpath(path, REPO)
        for lineno, cmd, want_rc, expected in examples(path):
            checked += 1
            p = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=600)
            out = "\n".join(l.rstrip() for l in p.stdout.split("\n")).rstrip("\n") + "\n"
            ok = p.returncode == want_rc and pattern(expected).search(out) is not None
            print("%s %s:%d: %s" % ("ok  " if ok else "FAIL", rel, lineno, cmd))
            if not ok:
                failed.append("%s:%d" % (rel, lineno))
                print("  exit status %d (expected %d); output:" % (p.returncode, want_rc))
                sys.stdout.write("".join("  | " + l + "\n" for l in out.split("\n")[-60:]))
    if not checked:
        sys.exit("check-docs: no checked example in %s" % ", ".join(files))
    if failed:
        sys.exit("check-docs: %d of %d example(s) differ from the docs: %s"
                 % (len(failed), checked, ", ".join(failed)))
    print("check-docs: %d example(s) print what the docs show" % checked)


if __name__ == "__main__":
    main()
