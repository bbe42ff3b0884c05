#!/usr/bin/env python3
"""The late-reader scenario of scripts/gpu_check.py (its `pressure-*` modes) as traces,
replayed on the simulated device: npualloc's defaults, without device-side waits, and
PyTorch's policy, each at its own smallest device (issue #16).

    cargo build --release
    python3 scripts/zoo/late_reader.py [--npualloc target/release/npualloc]
        [--seeds 1-20] [--python-random] [--write DIR] [--json OUT.json]

Each trace: the default stream fills a tensor of 1-48 MiB; half of them are read by a
communication stream (stream 1) after a chain of 4-16 matmuls (16 MiB outputs there,
a 4 MiB cuBLAS workspace the first time, three 4-byte results), recorded there, freed at
once, and the same size is taken again on the default stream; at most 20 live. The trace
has no completion events: nothing the reader queued completes unless the allocator waits
for it, as when the host runs ahead of the GPU. Seeds draw with splitmix64, the
generator of tests/all/pressure.rs (`late_reader`), so both make the same traces;
--python-random draws with Python's `random.Random(seed)` instead, exactly as
gpu_check.py does on the GPU (its seed is 7). Standard library only.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

MIB = 1 << 20
SIZES_MIB = [1, 2, 4, 6, 8, 12, 16, 24, 32, 48]
CONFS = ["", "wait_before_growth:False", "pytorch"]


class SplitMix:
    """splitmix64, as tests/all/policy.rs's `Rng`."""

    def __init__(self, seed):
        self.state = seed

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & (2**64 - 1)
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n


class PyRandom:
    """Python's generator, drawn as gpu_check.py's pressure_scenario draws."""

    def __init__(self, seed):
        import random
        self.rng = random.Random(seed)

    def size(self):
        return self.rng.choice(SIZES_MIB)

    def reads(self):
        return self.rng.random() < 0.5

    def chain(self):
        return self.rng.choice([4, 8, 16])

    def pick(self, n):
        return self.rng.randrange(n)


class SplitMixDraws:
    def __init__(self, seed):
        self.rng = SplitMix(seed)

    def size(self):
        return SIZES_MIB[self.rng.below(len(SIZES_MIB))]

    def reads(self):
        return self.rng.below(2) == 0

    def chain(self):
        return [4, 8, 16][self.rng.below(3)]

    def pick(self, n):
        return self.rng.below(n)


def trace(draws, steps=300, live_max=20):
    """The scenario's allocations as npualloc trace text."""
    out = ["# npualloc-trace v1: late reader (scripts/zoo/late_reader.py)"]
    ids = [0]

    def alloc(size, stream):
        ids[0] += 1
        out.append("a %d %d %d" % (ids[0], size, stream))
        return ids[0]

    alloc(16 * MIB, 0)  # the matmul operand
    workspace, live = False, []
    for _ in range(steps):
        size = draws.size() * MIB
        t = alloc(size, 0)
        if draws.reads():
            y = None
            for _ in range(draws.chain()):
                nxt = alloc(16 * MIB, 1)
                if not workspace:
                    alloc(4 * MIB, 1)
                    workspace = True
                if y is not None:
                    out.append("f %d" % y)
                y = nxt
            partial, zero, got = alloc(4, 1), alloc(4, 1), alloc(4, 1)
            out += ["f %d" % partial, "f %d" % zero, "r %d 1" % t, "f %d" % t, "f %d" % y]
            live.append(alloc(size, 0))
            del got  # kept for the rest of the run, as the check keeps its result
        else:
            live.append(t)
        while len(live) > live_max:
            out.append("f %d" % live.pop(draws.pick(len(live))))
    return "\n".join(out) + "\n"


def seeds(text):
    lo, _, hi = text.partition("-")
    return range(int(lo), int(hi or lo) + 1)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--npualloc", default="target/release/npualloc")
    p.add_argument("--seeds", default="1-20")
    p.add_argument("--python-random", action="store_true")
    p.add_argument("--write", help="keep the traces in this folder")
    p.add_argument("--json", help="also write the raw reports here")
    args = p.parse_args()
    folder = args.write or tempfile.mkdtemp(prefix="late_reader")
    os.makedirs(folder, exist_ok=True)
    rows, raw = [], {}
    for seed in seeds(args.seeds):
        draws = PyRandom(seed) if args.python_random else SplitMixDraws(seed)
        path = os.path.join(folder, "late_reader_%d.trace" % seed)
        with open(path, "w") as f:
            f.write(trace(draws))
        cmd = [args.npualloc, "replay", "-q", "--json", "--min-capacity", path]
        for c in CONFS:
            cmd += ["--conf", c]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit("late_reader: %s failed:\n%s" % (" ".join(cmd), p.stderr))
        reports = json.loads(p.stdout)
        raw[seed] = reports
        rows.append((seed, [r["min_capacity"] for r in reports]))
    print("| seed | min capacity × (host syncs): defaults | no device wait | PyTorch's policy |")
    print("|---:|---:|---:|---:|")
    above = 0
    for seed, mins in rows:
        print("| %d | %s |" % (seed, " | ".join(
            "%.3f (%d)" % (m["over_requested"], m["host_syncs"]) for m in mins)))
        above += mins[0]["bytes"] > mins[2]["bytes"]
    print("\nthe defaults need more than PyTorch's policy on %d of %d seeds" % (above, len(rows)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
