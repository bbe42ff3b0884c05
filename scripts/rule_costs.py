#!/usr/bin/env python3
"""What each of npualloc's policy rules pays for: every rule turned off in turn, against
the policy it belongs to, on the trace zoo and its derived multi-stream cases.

    python3 scripts/rule_costs.py                 # the table (markdown) on stdout
    python3 scripts/rule_costs.py --json OUT.json # also every case's figures
    python3 scripts/rule_costs.py --no-abi        # without the callgrind column

Figures, per rule, as the cost of turning it off ((off - on) / on; positive: the rule
saves that much), summed over the cases ("total") and for the case it helps most
("worst"):
- min capacity: the smallest simulated device each replay completes on
  (`npualloc replay --min-capacity`, 1 MiB steps);
- uncapped reserve: peak reserved bytes on a 64 GiB device;
- device calls: device mallocs and frees plus page maps and unmaps, uncapped;
- host syncs: host synchronisations at each setting's own min capacity (where memory is
  short; uncapped replays make almost none);
- ABI instructions per malloc+free pair through the C library on the fake ACL runtime
  (callgrind, `allocator-ffi/benches/abi.rs`, n = 20,000 and 40,000 pairs, difference /
  20,000), issue mix and trace mix.

A rule whose removal costs less than 0.5 % on every figure of every case pays nothing
("remove" in the last column); a case that stops fitting anywhere counts as an infinite
cost. Rules that exist only with expandable segments (`adaptive_pages`) are priced
against `expandable_segments:True`, with the rule on and off.

Set NPUALLOC_BIN to use a built `npualloc` binary, NPUALLOC_ABI_LIB and ABI_BENCH a built
`libnpualloc.so` and `abi-<hash>` benchmark binary; otherwise cargo builds them.
"""

import argparse
import functools
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (rule, the settings it belongs to, those settings with the rule off)
RULES = [
    ("adaptive segments", "", "adaptive_segments:False"),
    ("keep whole", "", "keep_whole:False"),
    ("reclaim before growth", "", "reclaim_before_growth:False"),
    ("hot cache", "", "hot_cache:False"),
    ("lazy merge", "", "lazy_merge:False"),
    ("segment lending", "", "lend_segments:False"),
    ("block lending", "", "lend_blocks:False"),
    ("pressure wait", "", "pressure_wait:False"),
    ("clean release", "", "release_clean:False"),
    ("one sync per stream", "", "sync_per_stream:False"),
    ("second look", "", "look_again:False"),
    ("small spill", "", "small_spill:False"),
    (
        "adaptive pages",
        "expandable_segments:True,adaptive_pages:True",
        "expandable_segments:True",
    ),
]

FIGURES = ["min capacity", "uncapped reserve", "device calls", "host syncs"]
THRESHOLD = 0.5  # percent


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, cwd=ROOT, **kw)


def npualloc_bin():
    b = os.environ.get("NPUALLOC_BIN")
    if b:
        return b
    run(["cargo", "build", "--release", "--quiet", "--bin", "npualloc"])
    return os.path.join(ROOT, "target/release/npualloc")


def cases(binary, work, shipped, only):
    traces = sorted(glob.glob(os.path.join(ROOT, "traces/zoo/*.trace")))
    if shipped:
        traces = sorted(glob.glob(os.path.join(ROOT, "traces/*.trace"))) + traces
    traces = [t for t in traces if only in os.path.basename(t)]
    out = list(traces)
    for t in traces:
        name = os.path.basename(t)[: -len(".trace")]
        for c in ["comm", "branch", "rr4"]:
            dst = os.path.join(work, f"{name}-{c}.trace")
            run([binary, "derive", t, "--case", c, "-o", dst], capture_output=True)
            out.append(dst)
    return out


def figures(entry):
    mc = entry.get("min_capacity") or {}
    return {
        "min capacity": mc.get("bytes") or math.inf,
        "uncapped reserve": entry["peak_reserved"],
        "device calls": entry["device_mallocs"]
        + entry["device_frees"]
        + entry["page_maps"]
        + entry["page_unmaps"],
        "host syncs": mc.get("host_syncs", math.inf),
    }


def replay(binary, trace, confs):
    args = [binary, "replay", trace, "--json", "--quiet", "--min-capacity"]
    for c in confs:
        args += ["--conf", c]
    out = run(args, capture_output=True, text=True).stdout
    return {c: figures(e) for c, e in zip(confs, json.loads(out))}


def cost(on, off):
    """(off - on) / on in percent; a new cost from nothing is infinite."""
    if on == off:
        return 0.0
    if on == 0 or on == math.inf:
        return math.inf if off > on else -math.inf
    return (off - on) / on * 100.0


def abi_tools():
    lib = os.environ.get("NPUALLOC_ABI_LIB")
    bench = os.environ.get("ABI_BENCH")
    if shutil.which("valgrind") is None:
        return None
    if not lib:
        run(["cargo", "build", "--release", "--quiet", "-p", "npualloc-ffi"])
        lib = os.path.join(ROOT, "target/release/libnpualloc.so")
    if not bench:
        out = run(
            ["cargo", "bench", "-p", "npualloc-ffi", "--bench", "abi", "--no-run",
             "--message-format=json"],
            capture_output=True,
            text=True,
        ).stdout
        for line in out.splitlines():
            m = json.loads(line)
            if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "abi":
                bench = m.get("executable") or bench
    return (lib, bench) if lib and bench else None


def instructions(lib, bench, mix, conf, steps):
    """Instructions of the profiled loop under callgrind; None when it cannot run there
    (expandable segments on the fake ACL runtime: its address reservations fail under
    valgrind)."""
    with tempfile.NamedTemporaryFile(suffix=".cg") as f:
        env = dict(os.environ, ABI_CONF=conf, NPUALLOC_ABI_LIB=lib,
                   ABI_PROFILE=f"acl:{mix}:{steps}")
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={f.name}", bench, "--bench"],
            env=env, capture_output=True, cwd=ROOT,
        )
        if done.returncode != 0:
            return None
        for line in open(f.name):
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    return None


@functools.lru_cache(maxsize=None)
def per_pair(lib, bench, mix, conf):
    a = instructions(lib, bench, mix, conf, 20000)
    b = instructions(lib, bench, mix, conf, 40000)
    return None if a is None or b is None else (b - a) / 20000


def fmt(p):
    if p == math.inf:
        return "+inf"
    if p == -math.inf:
        return "-inf"
    return f"{p:+.2f} %"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write every case's figures here")
    ap.add_argument("--no-abi", action="store_true", help="leave out the callgrind column")
    ap.add_argument("--shipped", action="store_true",
                    help="also the shipped traces (traces/*.trace) and their cases")
    ap.add_argument("--jobs", type=int, default=1, help="replays run at once")
    ap.add_argument("--only", default="", help="only the traces whose name holds this")
    ap.add_argument("--replays-from", metavar="JSON",
                    help="the replay figures of an earlier --json (only the ABI runs again)")
    args = ap.parse_args()

    if args.replays_from:
        with open(args.replays_from) as f:
            results = json.load(f)["figures"]
        traces = list(results)
    else:
        binary = npualloc_bin()
        work = tempfile.mkdtemp()
        try:
            traces = cases(binary, work, args.shipped, args.only)
            confs = sorted({c for _, on, off in RULES for c in (on, off)})
            with ThreadPoolExecutor(max_workers=args.jobs) as pool:
                results = dict(zip(traces, pool.map(lambda t: replay(binary, t, confs), traces)))
        finally:
            shutil.rmtree(work)

    abi = None if args.no_abi else abi_tools()
    rows = []
    for rule, on, off in RULES:
        row = {"rule": rule, "on": on, "off": off, "figures": {}}
        for fig in FIGURES:
            pairs = [(r[on][fig], r[off][fig]) for r in results.values()]
            total_on = sum(a for a, _ in pairs)
            total_off = sum(b for _, b in pairs)
            worst = max(cost(a, b) for a, b in pairs)
            row["figures"][fig] = {"total": cost(total_on, total_off), "worst": worst}
        if abi:
            lib, bench = abi
            for mix in ["issue", "trace"]:
                a = per_pair(lib, bench, mix, on)
                b = per_pair(lib, bench, mix, off)
                if a is None or b is None:
                    continue
                row["figures"][f"ABI {mix} mix"] = {"total": cost(a, b), "worst": cost(a, b),
                                                    "on": a, "off": b}
        row["pays"] = any(f["worst"] >= THRESHOLD for f in row["figures"].values())
        rows.append(row)

    names = [os.path.basename(t) for t in traces]
    print(f"Cost of turning each rule off, on {len(traces)} cases "
          f"({len(traces) // 4} traces and their comm, branch and rr4 cases); "
          "total over the cases / the case it helps most.\n")
    head = ["rule", "off"] + FIGURES + (["ABI instr/pair (issue, trace)"] if abi else []) + ["verdict"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        cells = [row["rule"], f"`{row['off'] or 'defaults'}`"]
        for fig in FIGURES:
            f = row["figures"][fig]
            cells.append(f"{fmt(f['total'])} / {fmt(f['worst'])}")
        if abi:
            i, t = row["figures"].get("ABI issue mix"), row["figures"].get("ABI trace mix")
            cells.append(f"{i['on']:.1f} → {i['off']:.1f}, {t['on']:.1f} → {t['off']:.1f}"
                         if i and t else "n/a under valgrind")
        cells.append("keep" if row["pays"] else f"remove (< {THRESHOLD} %)")
        print("| " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cases": names, "rules": rows,
                       "figures": {os.path.basename(t): r for t, r in results.items()}},
                      f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
