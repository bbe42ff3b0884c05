#!/usr/bin/env python3
"""Print how much PyTorch's and torch_npu's policies' figures move with the simulated
device's address order (the error bar of a "PyTorch's policy needs" figure).

    cargo build --release
    python3 scripts/zoo/orders_table.py [--npualloc target/release/npualloc]

Runs `npualloc replay --json --min-capacity --conf pytorch --conf torch_npu` over
traces/*.trace and traces/zoo/*.trace: settings with address ties carry
`address_orders`, their peak reserved and smallest device under the increasing,
decreasing, shuffled:1 and lowest-free orders. Prints one markdown row per trace:
each preset's peak reserved and smallest device (MiB) as lowest-highest over the orders,
and the spread in percent of the lowest. npualloc's defaults are not listed: they give the
same figures under every order (tests/all/placement.rs). Standard library only.
"""

import argparse
import glob
import json
import os
import subprocess

MIB = 1 << 20


def cell(pair):
    lo, hi = pair
    spread = (hi - lo) / lo * 100 if lo else 0.0
    return f"{lo // MIB}–{hi // MIB} ({spread:.1f} %)" if hi != lo else f"{lo // MIB} (0 %)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--npualloc", default="target/release/npualloc")
    args = ap.parse_args()
    traces = sorted(glob.glob("traces/*.trace")) + sorted(glob.glob("traces/zoo/*.trace"))
    cmd = [args.npualloc, "replay", "-q", "--json", "--min-capacity", *traces,
           "--conf", "pytorch", "--conf", "torch_npu"]
    runs = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    print("| trace | PyTorch's policy: peak reserved | smallest device "
          "| torch_npu preset: peak reserved | smallest device |")
    print("|---|---:|---:|---:|---:|")
    worst = {}
    for i in range(0, len(runs), 2):
        cells = []
        for r in runs[i : i + 2]:
            o = r["address_orders"]
            cells += [cell(o["peak_reserved"]), cell(o["min_capacity"])]
            for key in ("peak_reserved", "min_capacity"):
                lo, hi = o[key]
                worst[(r["label"], key)] = max(worst.get((r["label"], key), 0), (hi - lo) / lo)
        name = os.path.basename(runs[i]["trace"]).removesuffix(".trace")
        print(f"| {name} | {' | '.join(cells)} |")
    print()
    for (label, key), w in sorted(worst.items()):
        print(f"- {label}, {key}: at most {w * 100:.1f} % apart")


if __name__ == "__main__":
    main()
