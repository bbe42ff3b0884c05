#!/usr/bin/env python3
"""Instructions per malloc+free pair, counted by callgrind: the table of docs/results.md.

    python3 scripts/instructions.py [--quick] [--lib target/release/libnpualloc.so]

Builds the release C library (`cargo build --release -p npualloc-ffi`), the C ABI
benchmark (`cargo bench -p npualloc-ffi --bench abi --no-run`) and the `pair_loop`
example (`cargo build --release --example pair_loop`), then runs each workload under
`valgrind --tool=callgrind` twice, with n and 2n pairs, and prints (instructions at 2n -
instructions at n) / n as a markdown table. The difference cancels start-up (loading the
libraries, compiling the fake ACL runtime) and warm-up, so the figure is the steady-state
cost of one pair. Instruction counts do not depend on the machine's load, unlike times.

Workloads: through the C ABI (`ABI_PROFILE=kind:mix:n`, allocator-ffi/benches/abi.rs:
one thread, a window of 64 live blocks, each step frees the oldest and allocates the
next size), npualloc on the ACL backend over the fake runtime (tests/fake_acl), on the
simulated device, and the PyTorch-style C++ reference (benches/reference/) over the same
fake runtime, on the issue mix (512 B, 4 KiB, 64 KiB, 1 MiB, 4 MiB, 8 MiB, 1,536 B,
200,000 B in turn), the trace mix (4,096 sizes drawn from traces/*.trace) and single
sizes; in-crate (`examples/pair_loop.rs`, sizes 2^(9+a) to 2^(9+b) bytes), one stream and
one thread alternating two streams.

--lib LIB counts that library instead of this checkout's (an A/B against another build:
run once per library); --quick counts the ABI issue and trace mixes only. Needs valgrind.
Standard library only.
"""

import argparse
import glob
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTED = re.compile(r"Collected : (\d+)")

# (label, program, environment, n)
ABI = [
    ("C ABI, issue mix, ACL backend", "abi", {"ABI_PROFILE": "acl:issue:{n}"}, 20_000),
    ("C ABI, trace mix, ACL backend", "abi", {"ABI_PROFILE": "acl:trace:{n}"}, 20_000),
    ("C ABI, 512 B pairs, ACL backend", "abi", {"ABI_PROFILE": "acl:512:{n}"}, 20_000),
    ("C ABI, 8 MiB pairs, ACL backend", "abi", {"ABI_PROFILE": "acl:8388608:{n}"}, 20_000),
    ("C ABI, issue mix, simulated device", "abi", {"ABI_PROFILE": "sim:issue:{n}"}, 20_000),
    ("C ABI, trace mix, simulated device", "abi", {"ABI_PROFILE": "sim:trace:{n}"}, 20_000),
    ("PyTorch-style reference, issue mix", "abi", {"ABI_PROFILE": "ref:issue:{n}"}, 20_000),
    ("PyTorch-style reference, trace mix", "abi", {"ABI_PROFILE": "ref:trace:{n}"}, 20_000),
]
IN_CRATE = [
    ("in-crate, 512 B pairs", "pair_loop", {"PAIR_MIN_SHIFT": "0", "PAIR_MAX_SHIFT": "1"},
     200_000),
    ("in-crate, 8 MiB pairs", "pair_loop", {"PAIR_MIN_SHIFT": "14", "PAIR_MAX_SHIFT": "15"},
     200_000),
    ("in-crate, 512 B-8 MiB mix", "pair_loop", {"PAIR_MIN_SHIFT": "0", "PAIR_MAX_SHIFT": "15"},
     200_000),
    ("in-crate, 512 B pairs, one thread alternating two streams", "pair_loop",
     {"PAIR_STREAMS": "2", "PAIR_MIN_SHIFT": "0", "PAIR_MAX_SHIFT": "1"}, 200_000),
]


def cargo(*args):
    p = subprocess.run(["cargo", *args], cwd=REPO, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit("instructions: cargo %s failed" % " ".join(args))
    return p.stdout


def abi_binary():
    """The benchmark binary `cargo bench --no-run` built (its name carries a hash)."""
    out = cargo("bench", "-q", "-p", "npualloc-ffi", "--bench", "abi", "--no-run",
                "--message-format", "json")
    for line in out.splitlines():
        m = re.search(r'"executable":"([^"]+/abi-[0-9a-f]+)"', line)
        if m:
            return m.group(1)
    found = sorted(glob.glob(os.path.join(REPO, "target", "release", "deps", "abi-*")),
                   key=os.path.getmtime)
    found = [f for f in found if os.access(f, os.X_OK) and not f.endswith(".d")]
    if not found:
        sys.exit("instructions: no abi benchmark binary")
    return found[-1]


def count(program, args, env):
    p = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", program, *args],
        cwd=REPO, env=dict(os.environ, **env), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    m = COLLECTED.search(p.stderr)
    if p.returncode != 0 or not m:
        sys.exit("instructions: %s failed under callgrind:\n%s" % (program, p.stderr[-2000:]))
    return int(m.group(1))


def per_pair(program, env, n, args):
    def run(k):
        e = {key: v.format(n=k) for key, v in env.items()}
        return count(program, [a.format(n=k) for a in args], e)

    return (run(2 * n) - run(n)) / n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", help="count this libnpualloc.so instead of this checkout's")
    ap.add_argument("--quick", action="store_true", help="the ABI issue and trace mixes only")
    args = ap.parse_args()
    cargo("build", "-q", "--release", "-p", "npualloc-ffi")
    lib = os.path.abspath(args.lib or os.path.join(REPO, "target", "release", "libnpualloc.so"))
    abi = abi_binary()
    rows = ABI[:2] if args.quick else ABI
    if not args.quick and not args.lib:
        cargo("build", "-q", "--release", "--example", "pair_loop")
        rows = rows + IN_CRATE
    pair_loop = os.path.join(REPO, "target", "release", "examples", "pair_loop")
    print("| workload | instructions per pair |")
    print("|---|---:|")
    for label, prog, env, n in rows:
        if prog == "abi":
            env = dict(env, NPUALLOC_ABI_LIB=lib)
            figure = per_pair(abi, env, n, ["--bench"])
        else:
            figure = per_pair(pair_loop, env, n, ["{n}"])
        print("| %s | %s |" % (label, format(round(figure), ",")))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
