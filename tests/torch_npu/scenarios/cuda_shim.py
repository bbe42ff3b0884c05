"""npualloc.install_cuda()'s complete allocator (a subclass of torch 2.14's CUDAAllocator)
on npualloc's simulated device: the wheel here is torch's CUDA build, so the shim
compiles and installs into torch.cuda without a GPU; allocations are made the way
torch's allocate() makes them (the shim's test entry, with the device and stream given:
torch.empty on CUDA needs a GPU), everything else through torch._C's own bindings.

- failures: past the memory fraction and past the device raise torch.OutOfMemoryError
  with npualloc's message (never a NULL handed to torch, which on an H200 became an
  illegal memory access); a size too large to round raises torch's RuntimeError;
- graph pools as CUDA graphs drive them: a capture's allocations on the filtered stream
  land in the pool, _cuda_getCheckpointState / _cuda_checkPoolLiveAllocations /
  _cuda_setCheckpointPoolState (the restored block in a storage carrying the allocator's
  raw_deleter: _has_Standard_Deleter), _cuda_releasePool then _cuda_emptyCache gives
  the pool's memory back;
- torch's memory tools: _cuda_memoryStats (npualloc's statistics, the pool's
  reserved_bytes_by_private_pools), _cuda_resetAccumulatedMemoryStats,
  _cuda_memorySnapshot with segment_pool_id and the history's alloc entries and frames,
  _cuda_getAllocatorBackend.

Seen to fail with setCheckpointPoolState's DataPtrs carrying another deleter than
raw_deleter() (_has_Standard_Deleter is false)."""
import ctypes
import os

os.environ["NPUALLOC_BACKEND"] = "sim"
os.environ["NPUALLOC_SIM_CAPACITY"] = "1G"
from common import check, passed  # noqa: E402

import torch  # noqa: E402
import npualloc  # noqa: E402

C = torch._C
MIB = 1 << 20
HERE = os.path.basename(__file__)
lib = npualloc.load()
npualloc._start(lib)
installed = npualloc.install_cuda()
shim = npualloc._shim
check(C._cuda_getAllocatorBackend() == "npualloc", "backend: %r" % C._cuda_getAllocatorBackend())

# Failures are torch's errors.
p = shim.test_malloc(4 * MIB, 0, 0)
check(p != 0, "a 4 MiB allocation")
shim.test_free(p)
lib.npualloc_set_memory_fraction(0.25, 0)
for size, what in ((512 * MIB, "past the memory fraction"), (2 << 30, "past the device")):
    try:
        shim.test_malloc(size, 0, 0)
        raise AssertionError("%s: no error" % what)
    except torch.OutOfMemoryError as e:
        check("npualloc" in str(e) and "out of memory" in str(e), "%s: %s" % (what, e))
        check("256.00 MiB allowed by the memory fraction" in str(e), "%s: %s" % (what, e))
lib.npualloc_set_memory_fraction(1.0, 0)
try:
    shim.test_malloc(1 << 63, 0, 0)
    raise AssertionError("2^63 bytes: no error")
except torch.OutOfMemoryError:
    raise AssertionError("2^63 bytes is too large to round, not out of memory")
except RuntimeError as e:
    check("too large" in str(e), "2^63 bytes: %s" % e)
stats = C._cuda_memoryStats(0)
check(stats["num_ooms"] == 2, "num_ooms: %r" % stats["num_ooms"])
C._cuda_resetAccumulatedMemoryStats(0)
check(C._cuda_memoryStats(0)["num_ooms"] == 0, "resetAccumulatedStats kept num_ooms")

# A capture into pool (0, 7) on a stream of its own, as torch.cuda.graph drives it.
shim.test_record_history(True, 1000)  # torch._C's own binding needs a driver
stream = ctypes.c_void_p()
check(lib.npualloc_sim_create_stream(0, ctypes.byref(stream)) == 0, "sim stream")
s = stream.value
pool = (0, 7)
shim.test_begin_pool(0, pool, s)
a = shim.test_malloc(4 * MIB, 0, s)
b = shim.test_malloc(2 * MIB, 0, s)
outside = shim.test_malloc(MIB, 0, 0)  # another stream: not the capture's
C._cuda_endAllocateToPool(0, pool)
segs = C._cuda_memorySnapshot(None)["segments"]


def owner(ptr):
    for seg in segs:
        if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
            return tuple(seg["segment_pool_id"])
    raise AssertionError("%#x is in no segment" % ptr)


check(owner(a) == pool and owner(b) == pool, "the capture's allocations are not in its pool")
check(owner(outside) == (0, 0), "an allocation on another stream went to the pool")
traces = C._cuda_memorySnapshot(None)["device_traces"]
allocs = [e for e in traces[0] if e["action"] == "alloc"]
check(len(allocs) == 3, "%d alloc entries for 3 allocations" % len(allocs))
check(all(e["time_us"] > 0 for e in allocs), "trace entries without a time")
check(all(any(f["filename"].endswith(HERE) for f in e.get("frames", [])) for e in allocs),
      "an alloc entry without this script's frame")
shim.test_record_history(False, 1)
check(not C._cuda_isHistoryEnabled(), "history still enabled")

state = C._cuda_getCheckpointState(0, pool)
check(C._cuda_checkPoolLiveAllocations(0, pool, {a, b}), "the pool's allocated blocks are a and b")
check(not C._cuda_checkPoolLiveAllocations(0, pool, {a}), "{a} is not the pool's allocated set")
shim.test_free(b)
check(C._cuda_checkPoolLiveAllocations(0, pool, {a}), "after b's free the set is {a}")
storage = C._construct_storage_from_data_pointer(b, torch.device("cuda", 0), 2 * MIB)
C._cuda_setCheckpointPoolState(0, state, [], [storage._cdata])
check(C._has_Standard_Deleter(storage._cdata), "the restored DataPtr does not carry npualloc's raw_deleter")
check(C._cuda_checkPoolLiveAllocations(0, pool, {a, b}), "after the restore the set is the checkpoint's {a, b}")
try:
    C._cuda_getCheckpointState(0, (0, 999))
    raise AssertionError("checkpoint of an unknown pool: no error")
except RuntimeError as e:
    check("npualloc" in str(e), "unknown pool: %s" % e)

del storage  # npualloc's deleter frees b
shim.test_free(a)
check(C._cuda_checkPoolLiveAllocations(0, pool, set()), "the pool still has allocated blocks")
shim.test_free(outside)
C._cuda_releasePool(0, pool)
C._cuda_emptyCache()
segs = C._cuda_memorySnapshot(None)["segments"]
check(not any(tuple(seg["segment_pool_id"]) == pool for seg in segs), "the released pool's segments stayed")
check(lib.npualloc_check_invariants(0) == 0, npualloc.last_error())
check(shim.test_malloc(4 * MIB, 0, 0) != 0, "allocation after the errors")
passed("cuda_shim")
