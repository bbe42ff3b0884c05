"""Graph capture with a private pool through beginAllocateToPool (torch_npu's NPUGraph, the
base of torchair's reduce-overhead mode), in the seed pattern: inside the capture a side
stream waits on an event recorded in the capture, allocates, a tensor used on it is
record_stream-ed and freed; then replay, and release of the pool (issue #13 item 6).

Seen to fail with the shim's malloc ignoring the open beginAllocateToPool filters: the
capture's allocations come from the ordinary pool (0, 0)."""
import ctypes
import json
import os
import tempfile

from common import check, passed, start

ctx = start()
torch, npualloc, si = ctx.torch, ctx.npualloc, ctx.standin
N = 2 << 20


def segments():
    path = os.path.join(tempfile.mkdtemp(), "snap.json")
    npualloc.dump_snapshot(path)
    return json.load(open(path))["segments"]


def pool_of(ptr):
    for seg in segments():
        if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
            return tuple(seg["segment_pool_id"])
    raise AssertionError("%#x is in no npualloc segment" % ptr)


static_in = torch.empty(N, dtype=torch.uint8, device="npu")
outside = static_in.data_ptr()
check(pool_of(outside) == (0, 0), "an ordinary allocation is in a private pool")
g = torch.npu.NPUGraph()
capture, side = torch.npu.Stream(), torch.npu.Stream()
with torch.npu.graph(g, stream=capture):
    a = torch.empty(N, dtype=torch.uint8, device="npu")
    fork = torch.npu.Event()
    fork.record()
    side.wait_event(fork)  # the side stream joins the capture
    with torch.npu.stream(side):
        b = torch.empty(N, dtype=torch.uint8, device="npu")  # allocated on the side stream
        a.record_stream(side)
        joined = torch.npu.Event()
        joined.record(side)
    torch.npu.current_stream().wait_event(joined)
    ptrs = {"a": a.data_ptr(), "b": b.data_ptr()}
    del a  # freed in the capture while used on the side stream
    static_out = torch.empty(N, dtype=torch.uint8, device="npu")
    ptrs["out"] = static_out.data_ptr()
pool = tuple(g.pool())
check(pool != (0, 0), "graph has no pool id")
for name, p in ptrs.items():
    check(pool_of(p) == pool, "%s (on %s) is not in the graph's pool %s but in %s"
          % (name, "the side stream" if name == "b" else "the capture stream", pool, pool_of(p)))
check(npualloc.last_error() is None, npualloc.last_error())
# A block of the pool is not handed to ordinary allocations.
c = torch.empty(N, dtype=torch.uint8, device="npu")
check(pool_of(c.data_ptr()) == (0, 0), "an ordinary allocation came from the graph's pool")
g.replay()
check(si.pending(torch.npu.current_stream()) >= 1, "replay queued nothing")
torch.npu.synchronize()
del b, static_out
reserved = torch.npu.memory_reserved()
g.reset()  # releases the pool (release_pool)
torch.npu.empty_cache()
check(not any(tuple(s["segment_pool_id"]) == pool for s in segments()),
      "the released pool's segments were not returned by empty_cache")
check(torch.npu.memory_reserved() < reserved, "nothing returned")
check(npualloc.last_error() is None, "release left an error: %s" % npualloc.last_error())
check(ctx.lib.npualloc_check_invariants(0) == 0, npualloc.last_error())
check(si.counters().violations == 0, "stand-in saw misuse")
# Nothing npualloc did during the capture was a call the runtime refuses then (an
# allocation outside relaxed mode, a free, an event query, a synchronisation).
si.lib.standin_capture_refusals.restype = ctypes.c_uint64
check(si.lib.standin_capture_refusals() == 0, "calls refused during the capture: %d"
      % si.lib.standin_capture_refusals())
# A capture that allocates nothing still holds a use of its pool; its release is silent.
empty = torch.npu.NPUGraph()
with torch.npu.graph(empty, stream=capture):
    pass
empty.reset()
check(npualloc.last_error() is None, "empty capture: %s" % npualloc.last_error())
del c, static_in
passed("graph_capture")
