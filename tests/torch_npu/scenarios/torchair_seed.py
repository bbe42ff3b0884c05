"""torchair's reduce-overhead mode (aclgraph) with the seed example (seed_models.Seed,
the documentation's multi-stream example, N = 64), on the real torchair inside the
torch_npu 2.14 wheel, with torch_npu's own allocator or (`--npualloc`) with npualloc
installed the documented way (issue #27).

Three phases in one process, each with its own compiled model:
  static   dynamic=False: the first call compiles, captures on three streams (the
           capture stream and tagged streams '1' and '2', joined by tagged events) and
           replays; a replay; a second shape (a new compile and capture); back to the
           first shape (a replay, no capture).
  dynamic  dynamic=True: first shape, second shape, first again. Each new shape is a
           new graph key of the same FX graph: torchair restores the pool's checkpoint
           (torch_npu._C._npu_setCheckpointPoolState) before capturing it.
  empty_cache  a 16 MiB intermediate on tagged stream '1' (freed inside the capture);
           torch.npu.empty_cache() after each call: the pool segment that holds it
           belongs to a live graph and stays.
Each phase checks what torch_npu's own allocator does: graph-pool segments (from
torch.npu.memory_snapshot(), by segment_pool_id and stream) on all three streams, the
stand-in's count of captures and of streams joined, no call refused by CANN's capture
rules, no misuse seen by the stand-in.

The native run writes its record (per phase: the streams holding graph-pool segments,
the checkpoint restores, the 16 MiB segment kept) to
$SCENARIO_SHARED_DIR/torchair_seed-native.json; the npualloc run compares its own
record with it (running the native one first when it is missing): the same steps, the
same streams holding the graph pool's segments, the same segment kept.
"""
import ctypes
import json
import os
import subprocess
import sys

from common import check, passed, start
import seed_models

NPUALLOC = "--npualloc" in sys.argv[1:]
N, N2 = 64, 128
MIB = 1 << 20
if not NPUALLOC:
    # torch_npu's own allocator decides whether a tagged stream's allocation belongs to
    # the capture by asking aclmdlRICaptureGetInfo about the stream; with the task queue
    # on (TASK_QUEUE_ENABLE=1, the default) the stream's join (the aclrtStreamWaitEvent
    # of npu_tagged_event_wait) may still wait in the queue, and the allocation then
    # comes from the ordinary pool (tests/torch_npu/README.md, torchair). The reference
    # record is taken with the queue off, where torch_npu's allocator is deterministic.
    os.environ["TASK_QUEUE_ENABLE"] = "0"

ctx = start(install=NPUALLOC)
torch, si = ctx.torch, ctx.standin
import torchair as tng  # noqa: E402  (after torch_npu, and after npualloc is installed)

for name, restype in (("standin_capture_refusals", ctypes.c_uint64),
                      ("standin_captures_ended", ctypes.c_uint64),
                      ("standin_max_capture_streams", ctypes.c_int),
                      ("standin_capture_allocations", ctypes.c_uint64)):
    getattr(si.lib, name).restype = restype

# torchair looks the checkpoint functions up on torch_npu._C at each call: count them.
torch_npu = ctx.torch_npu
calls = {"get": 0, "set": 0}
_get, _set = torch_npu._C._npu_getCheckpointState, torch_npu._C._npu_setCheckpointPoolState


def counting_get(*a):
    calls["get"] += 1
    return _get(*a)


def counting_set(*a):
    calls["set"] += 1
    return _set(*a)


torch_npu._C._npu_getCheckpointState = counting_get
torch_npu._C._npu_setCheckpointPoolState = counting_set

Seed = seed_models.seed_class(torch, tng)


def roles(stream):
    """A stream's part in the captures, from the stand-in: the capture stream, or the
    k-th stream that joined a capture (the seed's tagged streams '1' and '2' join in
    that order, by waiting on the tagged events)."""
    role = si.lib.standin_capture_role(ctypes.c_void_p(stream))
    return {-1: "never captured", 0: "capture"}.get(role, "joined %d" % role)


def pool_streams(pools):
    """Role -> bytes of the graph-pool segments of `pools` per stream."""
    out = {}
    for pool, stream, size in seed_models.pool_segments(torch):
        if pool in pools:
            out[roles(stream)] = out.get(roles(stream), 0) + size
    return out


def new_pools(before):
    return {p for p, _, _ in seed_models.pool_segments(torch)} - before


def call(model, n, what, steps):
    out = model(*seed_models.inputs(torch, n))
    check(len(out) == 5 and tuple(out[1].shape) == (n, n), "%s: outputs %s" % (what, [tuple(o.shape) for o in out]))
    torch.npu.synchronize()
    steps.append(what)
    return out


def phase_static():
    steps, before = [], {p for p, _, _ in seed_models.pool_segments(torch)}
    model = seed_models.compile_reduce_overhead(torch, tng, Seed(N), dynamic=False)
    captures0, gets = si.lib.standin_captures_ended(), calls["get"]
    call(model, N, "first call: compile, capture, replay", steps)
    check(si.lib.standin_captures_ended() >= captures0 + 2,
          "the first call did not capture twice (torchair's empty capture that initialises the pool, then the graph)")
    check(calls["get"] >= gets + 2, "torchair did not take the pool's checkpoint after both captures")
    check(si.lib.standin_max_capture_streams() >= 3,
          "the capture held %d streams, not the capture stream and both tagged streams"
          % si.lib.standin_max_capture_streams())
    pools = new_pools(before)
    check(pools, "no graph pool has segments after the first call")
    first = pool_streams(pools)
    check(set(first) == {"capture", "joined 1", "joined 2"},
          "graph-pool segments after the first call on %s" % sorted(first))
    captures = si.lib.standin_captures_ended()
    current = torch.npu.current_stream()
    model(*seed_models.inputs(torch, N))
    check(si.pending(current) >= 1, "the replay queued nothing on the current stream")
    torch.npu.synchronize()
    steps.append("replay")
    check(si.lib.standin_captures_ended() == captures, "a replay captured again")
    call(model, N2, "second shape", steps)
    check(si.lib.standin_captures_ended() > captures, "the second shape was not captured")
    captures = si.lib.standin_captures_ended()
    call(model, N, "back to the first shape", steps)
    check(si.lib.standin_captures_ended() == captures, "the first shape was captured again")
    pools = new_pools(before)
    return {"steps": steps, "pool_streams": sorted(pool_streams(pools)), "pools": len(pools)}


def phase_dynamic():
    steps, before = [], {p for p, _, _ in seed_models.pool_segments(torch)}
    model = seed_models.compile_reduce_overhead(torch, tng, Seed(N), dynamic=True)
    sets = calls["set"]
    call(model, N, "first shape", steps)
    call(model, N2, "second shape", steps)
    call(model, N, "first shape again", steps)
    restores = calls["set"] - sets
    check(restores >= 1, "torchair never restored the pool's checkpoint between graph keys")
    pools = new_pools(before)
    check(len(pools) == 1, "one FX graph, one pool; got %s" % pools)
    streams = pool_streams(pools)
    check(set(streams) == {"capture", "joined 1", "joined 2"}, "graph-pool segments on %s" % sorted(streams))
    return {"steps": steps, "pool_streams": sorted(streams), "checkpoint_restores": restores}


def phase_empty_cache():
    steps, before = [], {p for p, _, _ in seed_models.pool_segments(torch)}
    model = seed_models.compile_reduce_overhead(torch, tng, Seed(N, scratch_mib=16), dynamic=False)
    kept = []
    for what in ("first call", "replay"):
        call(model, N, what, steps)
        torch.npu.empty_cache()
        pools = new_pools(before)
        big = [size for pool, stream, size in seed_models.pool_segments(torch)
               if pool in pools and roles(stream) == "joined 1" and size >= 16 * MIB]
        check(big, "after %s and empty_cache, the live graph's pool lost the segment of its 16 MiB "
                   "intermediate on tagged stream '1' (pool segments: %s)" % (what, pool_streams(pools)))
        kept.append(what)
    return {"steps": steps, "pool_streams": sorted(pool_streams(new_pools(before))), "kept_16mib_after": kept}


def stream_limits():
    """torchair reads the capture stream's core limits before each capture and sets them
    again before a replay whose limits differ: torch_npu must reach the runtime's
    aclrt*ResLimit calls (it resolves them by name from the whole process)."""
    s = torch.npu.Stream()
    limits = torch_npu.npu.get_stream_limit(s)
    check(limits["cube_core_num"] > 0 and limits["vector_core_num"] > 0, "stream limits %s" % limits)
    torch_npu.npu.set_stream_limit(s, limits["cube_core_num"] // 2, limits["vector_core_num"] // 2)
    halved = torch_npu.npu.get_stream_limit(s)
    check(halved == {"cube_core_num": limits["cube_core_num"] // 2, "vector_core_num": limits["vector_core_num"] // 2},
          "set_stream_limit not kept: %s" % halved)


stream_limits()
record = {"static": phase_static(), "dynamic": phase_dynamic(), "empty_cache": phase_empty_cache()}
check(si.lib.standin_capture_refusals() == 0,
      "calls refused by CANN's capture rules: %d" % si.lib.standin_capture_refusals())
check(si.counters().violations == 0, "the stand-in saw misuse")
record["allocations_during_captures"] = si.lib.standin_capture_allocations()
print(json.dumps(record, indent=1))

shared = os.environ.get("SCENARIO_SHARED_DIR") or os.getcwd()
native_path = os.path.join(shared, "torchair_seed-native.json")
if not NPUALLOC:
    # torch_npu's own allocator takes new segments for the graph pool inside the captures:
    # the runtime allows aclrtMalloc there (tests/torch_npu/README.md, capture rules).
    check(record["allocations_during_captures"] > 0, "torch_npu's allocator allocated nothing during captures")
    with open(native_path, "w") as f:
        json.dump(record, f)
    passed("torchair_seed")
    sys.exit(0)

check(ctx.npualloc.last_error() is None, "npualloc error: %s" % ctx.npualloc.last_error())
check(ctx.lib.npualloc_check_invariants(0) == 0, ctx.npualloc.last_error())
if not os.path.exists(native_path):
    env = dict(os.environ, SCENARIO_SHARED_DIR=shared)
    subprocess.run([sys.executable, os.path.abspath(__file__)], env=env, check=True)
native = json.load(open(native_path))
for phase in ("static", "dynamic", "empty_cache"):
    for key in native[phase]:
        if key in ("pools", "checkpoint_restores"):
            continue  # how torchair splits pools and restores is its own; both counted above
        check(record[phase][key] == native[phase][key], "%s phase, %s: npualloc %s, torch_npu's allocator %s"
              % (phase, key, record[phase][key], native[phase][key]))
passed("torchair_seed --npualloc")
