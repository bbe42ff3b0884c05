#!/usr/bin/env python3
"""Graph-mode memory: torchair's reduce-overhead mode with npualloc and with torch_npu's
own allocator, on the same script (issue #27). A benchmark, not a test.

Run it through the torch_npu suite's environment (the real torch 2.14.0 / torch_npu
2.14.0 wheels on the stand-in CANN libraries):

    bash scripts/test-torch-npu.sh --script scripts/graph_memory.py [--json OUT]

Two workloads (tests/torch_npu/seed_models.py), each run in a fresh process per
allocator (an allocator is chosen before the first allocation):
  seed  the documentation's aclgraph multi-stream example (N = 64), dynamic=False:
        shapes 64, 128, 64 (two captures, three streams each)
  wide  the multi-shape variant, dynamic=True: intermediates of n x 4n float32 on both
        tagged streams (48 MiB at n = 1024), shapes 256, 512, 768, 1024, then the four
        again (one FX graph: torchair restores the pool's checkpoint between graph keys)
Figures, per run:
  graph pool  bytes of the graph pools' segments (torch.npu.memory_snapshot(),
              segment_pool_id other than (0, 0)) after the last call and
              torch.npu.empty_cache(): what the live graphs keep
  peak        torch.npu.max_memory_reserved() over the run
torch_npu's task queue is off in every run (TASK_QUEUE_ENABLE=0): with it on, torch_npu's
own allocator sometimes takes a tagged stream's allocation from the ordinary pool (see
tests/torch_npu/README.md), so its figures would vary from run to run.

The stand-in has no kernels: the figures are the allocators' bookkeeping for this
sequence of allocations, frees and captures, not measurements on an NPU.
"""
import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = {
    "seed": {"model": "seed", "dynamic": False, "shapes": [64, 128, 64]},
    "wide": {"model": "wide", "dynamic": True, "shapes": [256, 512, 768, 1024] * 2},
}
ALLOCATORS = ("torch_npu", "npualloc")
MIB = float(1 << 20)


def child(workload, allocator):
    """One run: prints one JSON line with the figures."""
    sys.path.insert(0, os.path.join(REPO, "tests", "torch_npu"))
    import torch
    import torch_npu  # noqa: F401

    if allocator == "npualloc":
        import npualloc

        npualloc.install()
    import torchair as tng
    import seed_models

    spec = WORKLOADS[workload]
    if spec["model"] == "seed":
        model = seed_models.seed_class(torch, tng)(64)
    else:
        model = seed_models.wide_class(torch, tng)()
    compiled = seed_models.compile_reduce_overhead(torch, tng, model, spec["dynamic"])
    for n in spec["shapes"]:
        compiled(*seed_models.inputs(torch, n))
        torch.npu.synchronize()
    torch.npu.empty_cache()
    pool = sum(size for _, _, size in seed_models.pool_segments(torch))
    streams = len({stream for _, stream, _ in seed_models.pool_segments(torch)})
    print(json.dumps({"graph_pool": pool, "pool_streams": streams,
                      "peak_reserved": torch.npu.max_memory_reserved()}))


def run(workload, allocator):
    env = dict(os.environ, TASK_QUEUE_ENABLE="0")
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", workload, allocator],
                       env=env, capture_output=True, text=True, timeout=1200)
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not lines:
        tail = (p.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": "exit %d: %s" % (p.returncode, tail[:160])}
    return json.loads(lines[-1])


def cell(result, key):
    return "failed" if "error" in result else "%.1f MiB" % (result[key] / MIB)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", nargs=2, metavar=("WORKLOAD", "ALLOCATOR"), help=argparse.SUPPRESS)
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--workload", choices=sorted(WORKLOADS), action="append",
                    help="run only these workloads (default: all)")
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    results = {}
    for workload in args.workload or list(WORKLOADS):
        for allocator in ALLOCATORS:
            results["%s/%s" % (workload, allocator)] = r = run(workload, allocator)
            print("%s with %s: %s" % (workload, allocator, r), file=sys.stderr, flush=True)
    print("| workload | graph pool, torch_npu | graph pool, npualloc | peak reserved, torch_npu "
          "| peak reserved, npualloc |")
    print("|---|---|---|---|---|")
    for workload in args.workload or list(WORKLOADS):
        t, n = results[workload + "/torch_npu"], results[workload + "/npualloc"]
        print("| %s | %s | %s | %s | %s |" % (workload, cell(t, "graph_pool"), cell(n, "graph_pool"),
                                              cell(t, "peak_reserved"), cell(n, "peak_reserved")))
    for key, r in results.items():
        if "error" in r:
            print("%s failed: %s" % (key, r["error"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if any("error" in r for r in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
