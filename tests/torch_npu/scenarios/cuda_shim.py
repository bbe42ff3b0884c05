"""npualloc.install_cuda()'s shim (the torch.cuda path), on the simulated device: a
failed allocation is torch's error with npualloc's message, never a NULL handed to
torch, and a captured stream's allocation goes to the graph's pool (torch.cuda's pluggable allocator uses a NULL as an address: on an H200 with
torch 2.11 that was an illegal memory access, see scripts/gpu-check.sh). Needs no GPU:
the real torch here is a CUDA build, which is what the shim compiles against."""
import os

os.environ["NPUALLOC_BACKEND"] = "sim"
os.environ["NPUALLOC_SIM_CAPACITY"] = "1G"
from common import check, passed  # noqa: E402

import torch  # noqa: E402
import npualloc  # noqa: E402

lib = npualloc.load()
npualloc._start(lib)
shim = npualloc._build_cuda_shim(npualloc.library_path())
check(shim.malloc_then_free(4 << 20, 0), "a 4 MiB allocation through the shim")
lib.npualloc_set_memory_fraction(0.25, 0)
for size, what in ((512 << 20, "past the memory fraction"), (2 << 30, "past the device")):
    try:
        shim.malloc_then_free(size, 0)
        raise AssertionError("%s: no error" % what)
    except torch.OutOfMemoryError as e:
        check("npualloc" in str(e) and "out of memory" in str(e), "%s: %s" % (what, e))
        check("256.00 MiB allowed by the memory fraction" in str(e), "%s: %s" % (what, e))
try:
    shim.malloc_then_free(1 << 63, 0)
    raise AssertionError("2^63 bytes: no error")
except torch.OutOfMemoryError:
    raise AssertionError("2^63 bytes is too large to round, not out of memory")
except RuntimeError as e:
    check("too large" in str(e), "2^63 bytes: %s" % e)
check(npualloc.memory_stats(0, lib)["num_ooms"] == 2, "num_ooms")
# Inside a capture the allocation goes to the graph's pool (it reserved memory there),
# which release_pool then gives up.
reserved = shim.captured_malloc_then_release(4 << 20, 0)
check(reserved >= 4 << 20, "the graph pool reserved %d bytes during the capture" % reserved)
npualloc.empty_cache()
pools = npualloc.memory_stats(0, lib)
key = "reserved_bytes_by_private_pools.1_0.all.current"
check(pools.get(key) == 0, "after release_pool and empty_cache: %s = %r" % (key, pools.get(key)))
check(shim.malloc_then_free(4 << 20, 0), "allocation after the errors")
passed("cuda_shim")
