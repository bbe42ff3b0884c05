#!/usr/bin/env python3
"""Issue #29's first target, measured: does npualloc need a bigger device than PyTorch's
policy anywhere on the zoo, the derived cases and random churn seeds 1-64?

    python3 scripts/zoo/fit_table.py [--conf SETTINGS] [--npualloc target/release/npualloc]
    python3 scripts/zoo/fit_table.py --consts      # the lists of tests/all/pytorch_fit.rs

Every zoo trace (traces/*.trace, traces/zoo/*.trace), each of its five derived cases
(`npualloc derive --case comm16|comm64|comm256|branch|rr4`) and churn seeds 1-64
(scripts/zoo/churn.py, the same traces as tests' `churn_of_sizes`) is replayed with
`--min-capacity` under SETTINGS (default: npualloc's defaults) and PyTorch's policy
(`--conf pytorch`). Prints, per group, how many cases need a bigger device than
PyTorch's policy, the largest and smallest ratio of the two smallest devices and the
largest uncapped ratio change, then every case that needs a bigger device with its
figures (MiB). Standard library only; the release build of npualloc must exist.
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import churn  # noqa: E402

MIB = 1 << 20
CASES = ["comm16", "comm64", "comm256", "branch", "rr4"]
FIRST = ["bert_train", "gpt2_infer", "resnet50_train", "t5_train"]


def zoo():
    """The zoo's names, in the order of tests/all/pytorch_fit.rs, and their paths."""
    paths = {os.path.basename(p)[:-6]: p for p in
             glob.glob(os.path.join(REPO, "traces", "*.trace"))
             + glob.glob(os.path.join(REPO, "traces", "zoo", "*.trace"))}
    names = [n for n in FIRST if n in paths] + sorted(n for n in paths if n not in FIRST)
    return names, paths


def cases(binary, d):
    """(group, label, path) of every case, written under `d`."""
    names, paths = zoo()
    out = [("zoo", n, paths[n]) for n in names]
    for n in names:
        for c in CASES:
            p = os.path.join(d, "%s-%s.trace" % (n, c))
            subprocess.run([binary, "derive", "--case", c, "-o", p, paths[n]], check=True,
                           capture_output=True)
            out.append(("derived", "%s %s" % (n, c), p))
    for s, p in zip(range(1, 65), churn.write(os.path.join(d, "churn"), range(1, 65))):
        out.append(("churn", "churn seed %d" % s, p))
    return out


def replay(binary, paths, conf):
    cmd = [binary, "replay", "-q", "--json", "--min-capacity", *paths, "--conf", conf]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def min_cap(run):
    return run["min_capacity"]["bytes"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conf", default="", help="npualloc's settings (default: the defaults)")
    ap.add_argument("--npualloc", default=os.path.join(REPO, "target/release/npualloc"))
    ap.add_argument("--consts", action="store_true", help="print the test's lists")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        all_cases = cases(args.npualloc, d)
        paths = [c[2] for c in all_cases]
        pt = replay(args.npualloc, paths, "pytorch")
        ours = replay(args.npualloc, paths, args.conf)
    rows = list(zip(all_cases, ours, pt))
    if args.consts:
        return consts(rows)
    print("| cases | need a bigger device than PyTorch's policy | smallest device / "
          "PyTorch's: largest | smallest | uncapped peak reserved / PyTorch's: largest |")
    print("|---|---:|---:|---:|---:|")
    for group in ["zoo", "derived", "churn"]:
        g = [r for r in rows if r[0][0] == group]
        bigger = sum(min_cap(o) > min_cap(p) for _, o, p in g)
        ratios = [min_cap(o) / min_cap(p) for _, o, p in g]
        unc = [o["peak_reserved"] / p["peak_reserved"] for _, o, p in g]
        print("| %s (%d) | %d | %.3f | %.3f | %.3f |" % (
            group, len(g), bigger, max(ratios), min(ratios), max(unc)))
    print()
    print("Each case that needs a bigger device (MiB):")
    print()
    print("| case | peak requested | uncapped | smallest device "
          "| PyTorch's policy: uncapped | smallest device |")
    print("|---|---:|---:|---:|---:|---:|")
    for (group, label, _), o, p in rows:
        if min_cap(o) > min_cap(p):
            print("| %s | %d | %d | %d | %d | %d |" % (
                label, o["peak_requested"] // MIB, o["peak_reserved"] // MIB,
                min_cap(o) // MIB, p["peak_reserved"] // MIB, min_cap(p) // MIB))


def consts(rows):
    """The lists of tests/all/pytorch_fit.rs (PyTorch's smallest devices, the marks) and
    the derived cases' smallest devices it shares with tests/all/pressure_zoo.rs."""
    def mark(o, p):
        return "true" if min_cap(o) > min_cap(p) else "false"
    z = [r for r in rows if r[0][0] == "zoo"]
    print("const ZOO: [(&str, u64, bool); %d] = [" % len(z))
    for (_, label, _), o, p in z:
        print('    ("%s", %d, %s),' % (label, min_cap(p) // MIB, mark(o, p)))
    print("];")
    d = [r for r in rows if r[0][0] == "derived"]
    print("// tests/all/pressure_zoo.rs")
    print("pub(crate) const PYTORCH_DERIVED_MIB: [(&str, &str, u64); %d] = [" % len(d))
    for (_, label, _), o, p in d:
        name, case = label.split()
        print('    ("%s", "%s", %d),' % (name, case, min_cap(p) // MIB))
    print("];")
    bigger = [label.split() for (_, label, _), o, p in d if min_cap(o) > min_cap(p)]
    print("const DERIVED_BIGGER: [(&str, &str); %d] = [" % len(bigger))
    for name, case in bigger:
        print('    ("%s", "%s"),' % (name, case))
    print("];")
    seeds = [label.split()[2] for (g, label, _), o, p in rows
             if g == "churn" and min_cap(o) > min_cap(p)]
    print("const CHURN_BIGGER: [u64; %d] = [%s];" % (len(seeds), ", ".join(seeds)))


if __name__ == "__main__":
    main()
