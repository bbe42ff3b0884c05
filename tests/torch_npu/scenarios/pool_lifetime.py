"""A graph pool lives as long as any of its users (issue #27's two repros), with
npualloc installed, and the same script with torch_npu's own allocator (a second
process) for comparison: the same steps complete, the same pool segments survive.

- shared pool: two graphs capture into one `graph_pool_handle()`. g1 captures a 30 MiB
  intermediate on a side stream (fork/join by events, record_stream), freed inside the
  capture, and replays; g2 captures 1 MiB into the same pool; its tensor dies; g2.reset()
  drops g2's use; torch.npu.empty_cache(): the 30 MiB segment still belongs to the pool
  (g1 is alive and replays into it). Then g1.reset() + empty_cache: the pool's segments
  go back.
- keeper: an empty capture into a pool (it holds a use, as graph trees' and torchair's
  keeper graphs do), then _npu_beginAllocateCurrentThreadToPool / allocate /
  _npu_endAllocateToPool / _npu_releasePool, then a real capture into the same pool: it
  captures, and its allocation is in the pool.

Seen to fail with the shim's releasePool dropping every use of the pool at once (the
lifetime the pluggable path had): the 30 MiB segment is gone after g2.reset() +
empty_cache."""
import json
import os
import subprocess
import sys

from common import check, passed, start

NATIVE = "--native" in sys.argv
ctx = start(install=not NATIVE)
torch, torch_npu = ctx.torch, ctx.torch_npu
MIB = 1 << 20


def pool_segments(pool):
    """(stream, total_size) of each segment the snapshot says belongs to `pool`."""
    return sorted((s["stream"], s["total_size"]) for s in torch.npu.memory_snapshot()
                  if tuple(s["segment_pool_id"]) == tuple(pool))


def segment_of(ptr):
    for s in torch.npu.memory_snapshot():
        if s["address"] <= ptr < s["address"] + s["total_size"]:
            return s
    return None


def shared_pool():
    out = {}
    pool = torch.npu.graph_pool_handle()
    capture, side = torch.npu.Stream(), torch.npu.Stream()
    static_in = torch.zeros(MIB, dtype=torch.uint8, device="npu")
    g1 = torch.npu.NPUGraph()
    with torch.npu.graph(g1, stream=capture, pool=pool):
        fork = torch.npu.Event()
        fork.record()
        side.wait_event(fork)
        with torch.npu.stream(side):
            tmp = torch.empty(30 * MIB, dtype=torch.uint8, device="npu")
            tmp[:MIB].copy_(static_in)
            joined = torch.npu.Event()
            joined.record(side)
        tmp.record_stream(side)
        torch.npu.current_stream().wait_event(joined)
        out1 = torch.empty(MIB, dtype=torch.uint8, device="npu")  # the graph's output
        out1.copy_(static_in)
        tmp_ptr = tmp.data_ptr()
        del tmp  # freed inside the capture, used on the side stream
    seg = segment_of(tmp_ptr)
    check(seg is not None and tuple(seg["segment_pool_id"]) == tuple(pool),
          "the side stream's 30 MiB intermediate is not in the graph's pool: %r" % (seg and seg["segment_pool_id"],))
    out["after_g1"] = pool_segments(pool)
    g1.replay()
    torch.npu.synchronize()
    g2 = torch.npu.NPUGraph()
    with torch.npu.graph(g2, stream=capture, pool=pool):
        t2 = torch.empty(MIB, dtype=torch.uint8, device="npu")
    check(tuple(segment_of(t2.data_ptr())["segment_pool_id"]) == tuple(pool), "g2's tensor is not in the pool")
    del t2
    g2.reset()
    torch.npu.empty_cache()
    kept = pool_segments(pool)
    out["after_g2_reset_and_empty_cache"] = kept
    check(any(size >= 30 * MIB for _, size in kept),
          "g1 is alive but its pool's 30 MiB segment went back at g2.reset() + empty_cache: %r" % kept)
    seg = segment_of(tmp_ptr)
    check(seg is not None and tuple(seg["segment_pool_id"]) == tuple(pool),
          "the address g1 replays into no longer belongs to its pool")
    g1.replay()  # still replays into its memory
    torch.npu.synchronize()
    del out1
    g1.reset()
    torch.npu.empty_cache()
    out["after_g1_reset_and_empty_cache"] = pool_segments(pool)
    check(out["after_g1_reset_and_empty_cache"] == [], "the pool's segments stayed after its last user went")
    return out


def keeper():
    out = {}
    pool = torch.npu.graph_pool_handle()
    capture = torch.npu.Stream()
    keep = torch.npu.NPUGraph()
    with torch.npu.graph(keep, stream=capture, pool=pool):
        pass  # an empty capture holds a use of the pool
    device = torch.npu.current_device()
    torch_npu._C._npu_beginAllocateCurrentThreadToPool(device, pool)
    x = torch.empty(4 * MIB, dtype=torch.uint8, device="npu")
    torch_npu._C._npu_endAllocateToPool(device, pool)
    torch_npu._C._npu_releasePool(device, pool)
    check(tuple(segment_of(x.data_ptr())["segment_pool_id"]) == tuple(pool),
          "the warm-up allocation is not in the pool")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, stream=capture, pool=pool):
        y = torch.empty(2 * MIB, dtype=torch.uint8, device="npu")
    check(tuple(segment_of(y.data_ptr())["segment_pool_id"]) == tuple(pool),
          "the capture after the keeper's warm-up is not in the pool")
    out["pool_segments"] = pool_segments(pool)
    del x, y
    g.reset()
    keep.reset()
    torch.npu.empty_cache()
    out["after_reset"] = pool_segments(pool)
    check(out["after_reset"] == [], "the keeper's pool stayed after both graphs were reset")
    return out


def sizes(result):
    """The segment sizes of each step (stream handles differ between processes)."""
    return {repro: {step: sorted(size for _, size in segs) for step, segs in steps.items()}
            for repro, steps in result.items()}


result = {"shared_pool": shared_pool(), "keeper": keeper()}
if NATIVE:
    print(json.dumps(sizes(result)))
    sys.exit(0)

check(ctx.npualloc.last_error() is None, "npualloc error: %s" % ctx.npualloc.last_error())
check(ctx.lib.npualloc_check_invariants(0) == 0, ctx.npualloc.last_error())
for repro in result:
    print(repro, json.dumps(result[repro]))
# torch_npu's own allocator on the same script: the same steps complete (its process
# exits 0, its own checks included: the 30 MiB segment kept while g1 lives, nothing
# after the last reset), and at each step the pool holds no more bytes with npualloc.
p = subprocess.run([sys.executable, os.path.abspath(__file__), "--native"], capture_output=True, text=True,
                   timeout=600)
check(p.returncode == 0, "torch_npu's own allocator failed the same script:\n" + p.stderr[-3000:])
native = json.loads(p.stdout.strip().splitlines()[-1])
ours = sizes(result)
print("native", json.dumps(native))
for repro in ours:
    for step in ours[repro]:
        check(sum(ours[repro][step]) <= sum(native[repro][step]),
              "%s, %s: the pool holds %r with npualloc, %r with torch_npu's allocator"
              % (repro, step, ours[repro][step], native[repro][step]))
passed("pool_lifetime")
