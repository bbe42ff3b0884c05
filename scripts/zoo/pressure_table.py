#!/usr/bin/env python3
"""Print the table of docs/results.md "Several streams under memory pressure": every
derived multi-stream case under memory pressure, npualloc's defaults beside PyTorch's policy.

    cargo build --release
    python3 scripts/zoo/pressure_table.py [--npualloc target/release/npualloc] [--zoo]
        [--json OUT.json] [--from OUT.json]

For each shipped trace (traces/*.trace; with --zoo also traces/zoo/*.trace) and each
case of `npualloc derive` (comm16, comm64, comm256, branch, rr4), runs

    npualloc replay CASE --conf "" --conf wait_before_growth:False --conf pytorch \
        --min-capacity --json
    npualloc replay CASE --conf "" --capacity <PyTorch's min capacity> --json

(--ours SETTINGS replaces "" by SETTINGS, and the middle column's by
SETTINGS,wait_before_growth:False.)

and prints one markdown row per case: the defaults' uncapped ratio, min capacity,
device waits, stalled waits and host syncs at their own min capacity; min capacity and
host syncs without the device-side wait (`wait_before_growth:False`); PyTorch's policy's
uncapped ratio, min capacity and host syncs at it; and the defaults at PyTorch's min
capacity (OOMs, host syncs). Then the cases that miss issue 16's targets. --json keeps
the raw reports; --from prints the table from such a file without replaying.
Standard library only.
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

CASES = ["comm16", "comm64", "comm256", "branch", "rr4"]
TARGET = 1.15


def run(binary, args):
    """stdout of `npualloc ARGS`; exit status 3 (some allocation did not fit) is a result."""
    out = subprocess.run([binary, *args], capture_output=True, text=True)
    if out.returncode not in (0, 3):
        raise subprocess.CalledProcessError(out.returncode, out.args, out.stdout, out.stderr)
    return out.stdout


def measure(binary, traces, conf=""):
    rows = []
    nowait_conf = ",".join(x for x in [conf, "wait_before_growth:False"] if x)
    with tempfile.TemporaryDirectory() as work:
        for t in traces:
            name = os.path.basename(t).removesuffix(".trace")
            for c in CASES:
                path = os.path.join(work, f"{name}-{c}.trace")
                run(binary, ["derive", t, "--case", c, "-o", path])
                args = ["replay", "-q", "--json", "--min-capacity", path]
                for x in [conf, nowait_conf, "pytorch"]:
                    args += ["--conf", x]
                ours, nowait, pt = json.loads(run(binary, args))
                cap = pt["min_capacity"]["bytes"]
                at_pt = json.loads(
                    run(
                        binary,
                        ["replay", "-q", "--json", path, "--conf", conf, "--capacity", str(cap)],
                    )
                )[0]
                rows.append(
                    {"trace": name, "case": c, "ours": ours, "nowait": nowait, "pt": pt, "at_pt": at_pt}
                )
                print(f"{name} {c}", file=sys.stderr)
    return rows


def short(name):
    return name.removesuffix("_train").removesuffix("_infer") if name in (
        "bert_train", "resnet50_train", "t5_train", "gpt2_infer") else name


def table(rows):
    out = [
        "| case | uncapped | min cap | device waits | stalled | host syncs "
        "| min cap, no device wait | host syncs | PyTorch uncapped | PyTorch min cap "
        "| PyTorch host syncs | at PyTorch's min cap: OOMs, host syncs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    misses = []
    for r in rows:
        o, n, p, a = r["ours"], r["nowait"], r["pt"], r["at_pt"]
        om, nm, pm = o["min_capacity"], n["min_capacity"], p["min_capacity"]
        label = f"{short(r['trace'])} {r['case']}"
        out.append(
            f"| {label} | {o['reserved_over_requested']:.3f} | {om['over_requested']:.3f} "
            f"| {om['device_waits']} | {om['stalled_waits']} | {om['host_syncs']} "
            f"| {nm['over_requested']:.3f} | {nm['host_syncs']} "
            f"| {p['reserved_over_requested']:.3f} | {pm['over_requested']:.3f} "
            f"| {pm['host_syncs']} | {a['ooms']}, {a['host_syncs']} |"
        )
        why = []
        if om["over_requested"] > TARGET and om["over_requested"] > pm["over_requested"] + 1e-9:
            why.append(f"min cap {om['over_requested']:.3f} > {TARGET}")
        if om["bytes"] > pm["bytes"]:
            why.append(f"min cap above PyTorch's ({om['over_requested']:.3f} vs {pm['over_requested']:.3f})")
        if a["ooms"] > 0:
            why.append(f"OOM at PyTorch's min cap ({a['ooms']})")
        elif a["host_syncs"] > pm["host_syncs"]:
            why.append(f"host syncs at PyTorch's min cap {a['host_syncs']} > {pm['host_syncs']}")
        if why:
            misses.append(f"- {label}: " + "; ".join(why))
    return out, misses


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--npualloc", default="target/release/npualloc")
    ap.add_argument("--zoo", action="store_true", help="also the zoo traces")
    ap.add_argument("--json", help="write the raw reports here")
    ap.add_argument("--ours", default="", help="npualloc's settings (default: the defaults)")
    ap.add_argument("--from", dest="source", help="print the table from a --json file")
    ap.add_argument("traces", nargs="*", help="instead of the shipped traces")
    args = ap.parse_args()
    if args.source:
        with open(args.source) as f:
            rows = json.load(f)
    else:
        traces = args.traces or sorted(glob.glob("traces/*.trace"))
        if args.zoo:
            traces += sorted(glob.glob("traces/zoo/*.trace"))
        rows = measure(args.npualloc, traces, args.ours)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f)
    out, misses = table(rows)
    print("\n".join(out))
    print(f"\nMisses ({len(misses)} of {len(rows)}):")
    print("\n".join(misses) if misses else "- none")


if __name__ == "__main__":
    main()
