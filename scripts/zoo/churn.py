#!/usr/bin/env python3
"""Issue #29's random churn, as traces, and npualloc's defaults beside PyTorch's policy
on them.

    python3 scripts/zoo/churn.py --out DIR [--seeds 1-64]     # write churnNN.trace files
    python3 scripts/zoo/churn.py --table [--seeds 1-64] [--npualloc target/release/npualloc]
    python3 scripts/zoo/churn.py --check                       # the figures tests compare

Each trace: 600 steps on one stream, each freeing a random live block with probability
0.45 (when one is live), else allocating one of 512 B, 4 KiB, 60,000 B, 1 MiB,
3 MiB + 100 B, 7 MiB, 20 MiB or 33 MiB, plus 0 to 4 KiB; past 40 live blocks the oldest
is freed; what is left is freed at the end. Draws come from splitmix64 seeded with the
seed, exactly as `churn_of_sizes` in tests/all/policy.rs draws them (`--check` prints
the events and peak requested bytes of seeds 1 to 3, which that test compares).
`--table` replays every seed with `--min-capacity` under the defaults and PyTorch's
policy and prints one markdown row per seed (uncapped peak reserved and smallest device,
MiB), then how many seeds need a larger device than PyTorch's policy. Standard library
only.
"""

import argparse
import json
import os
import subprocess
import tempfile

M = (1 << 64) - 1
MIB = 1 << 20
SIZES = [512, 4096, 60000, MIB, 3 * MIB + 100, 7 * MIB, 20 * MIB, 33 * MIB]


class Rng:
    """splitmix64, as tests/all/policy.rs's Rng."""

    def __init__(self, seed):
        self.x = seed & M

    def next(self):
        self.x = (self.x + 0x9E3779B97F4A7C15) & M
        z = self.x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n


def churn(seed):
    """The trace of `seed`: its lines."""
    rng, live, out, nxt = Rng(seed), [], [], 0
    for _ in range(600):
        if live and rng.below(100) < 45:
            out.append("f %d" % live.pop(rng.below(len(live))))
            continue
        size = SIZES[rng.below(len(SIZES))] + rng.below(4097)
        out.append("a %d %d 0" % (nxt, size))
        live.append(nxt)
        nxt += 1
        if len(live) > 40:
            out.append("f %d" % live.pop(0))
    out += ["f %d" % i for i in live]
    return out


def peak_requested(lines):
    live, now, peak = {}, 0, 0
    for line in lines:
        w = line.split()
        if w[0] == "a":
            live[w[1]] = int(w[2])
            now += int(w[2])
            peak = max(peak, now)
        else:
            now -= live.pop(w[1])
    return peak


def seeds(text):
    lo, _, hi = text.partition("-")
    return range(int(lo), int(hi or lo) + 1)


def write(out, which):
    os.makedirs(out, exist_ok=True)
    paths = []
    for s in which:
        path = os.path.join(out, "churn%02d.trace" % s)
        with open(path, "w") as f:
            f.write("\n".join(churn(s)) + "\n")
        paths.append(path)
    return paths


def table(binary, which):
    with tempfile.TemporaryDirectory() as d:
        paths = write(d, which)
        cmd = [binary, "replay", "-q", "--json", "--min-capacity", *paths,
               "--conf", "", "--conf", "pytorch"]
        runs = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    print("| seed | peak requested | defaults: uncapped | smallest device "
          "| PyTorch's policy: uncapped | smallest device |")
    print("|---|---:|---:|---:|---:|---:|")
    worse = []
    for s, ours, pt in zip(which, runs[0::2], runs[1::2]):
        om, pm = ours["min_capacity"]["bytes"], pt["min_capacity"]["bytes"]
        print("| %d | %d | %d | %d | %d | %d |" % (
            s, ours["peak_requested"] // MIB, ours["peak_reserved"] // MIB, om // MIB,
            pt["peak_reserved"] // MIB, pm // MIB))
        if om > pm:
            worse.append(s)
    print()
    print("Seeds whose smallest device is larger than PyTorch's policy's: %d of %d%s" % (
        len(worse), len(which), (" (%s)" % ", ".join(map(str, worse))) if worse else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the traces into this directory")
    ap.add_argument("--table", action="store_true", help="replay and print the table")
    ap.add_argument("--check", action="store_true", help="events and peak of seeds 1-3")
    ap.add_argument("--seeds", default="1-64")
    ap.add_argument("--npualloc", default="target/release/npualloc")
    args = ap.parse_args()
    which = seeds(args.seeds)
    if args.check:
        for s in (1, 2, 3):
            lines = churn(s)
            print("(%d, %d)," % (len(lines), peak_requested(lines)))
    if args.out:
        write(args.out, which)
    if args.table:
        table(args.npualloc, which)


if __name__ == "__main__":
    main()
