"""torch 2.14's DeviceStats::reserved_bytes_by_private_pools as torch_npu hands it to
C++ (issue #13 item 5): c10_npu::NPUCachingAllocator::getDeviceStats, torch_npu's own
entry point, which calls npualloc's getDeviceStats (the shim's NPUAllocator). During and
after a graph capture in which the capture stream and a side stream that joined it
allocate from the graph's private pool, the map has the graph's pool id with the pool's
reserved bytes (a 20 MiB large and a 2 MiB small segment); after the graph's reset and
empty_cache its current is 0 and its peak stays, until reset_peak_memory_stats.

torch_npu 2.14's torch.npu.memory_stats() does not show the map (its binding builds the
dict from the other fields; checked below, so a torch_npu that starts to show it is
noticed), so a small C++ extension compiled as the shim is (torch_npu's headers and
libtorch_npu; not npualloc's header) reads the c10 struct.

Before the change (the shim left the map at its default) the map is empty: the first
check after the capture fails."""
import os

from common import check, passed, start

ctx = start()
torch, npualloc = ctx.torch, ctx.npualloc
MIB = 1 << 20

SOURCE = r"""
#include <torch/extension.h>
#include "torch_npu/csrc/core/npu/NPUCachingAllocator.h"

// Every entry of reserved_bytes_by_private_pools: ((id0, id1), [(current, peak,
// allocated, freed) for all, small pool, large pool]).
py::list private_pools(int device) {
  auto stats = c10_npu::NPUCachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  py::list out;
  for (const auto& [id, arr] : stats.reserved_bytes_by_private_pools) {
    py::list per_kind;
    for (const auto& s : arr) per_kind.append(py::make_tuple(s.current, s.peak, s.allocated, s.freed));
    out.append(py::make_tuple(py::make_tuple(id.first, id.second), per_kind));
  }
  return out;
}

int64_t oom_rejections(int device) {
  return c10_npu::NPUCachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device))
      .num_oom_rejections;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("private_pools", &private_pools);
  m.def("oom_rejections", &oom_rejections);
}
"""


def build_reader():
    from torch.utils import cpp_extension

    tnpu = os.path.dirname(os.path.abspath(ctx.torch_npu.__file__))
    lib = os.path.join(tnpu, "lib")
    return cpp_extension.load_inline(
        name="npualloc_test_private_pool_reader", cpp_sources=[SOURCE],
        extra_include_paths=[os.path.join(tnpu, "include"),
                             os.path.join(tnpu, "include", "third_party", "hccl", "inc")],
        extra_cflags=["-std=c++20"],
        extra_ldflags=["-L" + lib, "-ltorch_npu", "-Wl,-rpath," + lib])


reader = build_reader()


def pools():
    return {pool: per_kind for pool, per_kind in reader.private_pools(0)}


check(pools() == {}, "a pool before any capture: %s" % pools())
N = 2 * MIB  # a large request: a 20 MiB segment
g = torch.npu.NPUGraph()
capture, side = torch.npu.Stream(), torch.npu.Stream()
with torch.npu.graph(g, stream=capture):
    a = torch.empty(N, dtype=torch.uint8, device="npu")
    fork = torch.npu.Event()
    fork.record()
    side.wait_event(fork)  # the side stream joins the capture
    with torch.npu.stream(side):
        b = torch.empty(1000, dtype=torch.uint8, device="npu")  # small: a 2 MiB segment
        joined = torch.npu.Event()
        joined.record(side)
    torch.npu.current_stream().wait_event(joined)
    during = pools()
pool = tuple(g.pool())
check(pool != (0, 0), "graph has no pool id")
want = [(22 * MIB, 22 * MIB, 22 * MIB, 0), (2 * MIB, 2 * MIB, 2 * MIB, 0),
        (20 * MIB, 20 * MIB, 20 * MIB, 0)]
check(list(during) == [pool], "during the capture: pools %s, the graph's is %s" % (list(during), pool))
check(during[pool] == want, "during the capture: %s, want %s" % (during[pool], want))
check(pools() == during, "after the capture: %s" % pools())
theirs = torch.npu.memory_stats(0)
check(theirs["reserved_bytes.all.current"] >= 22 * MIB, "the pool's bytes are reserved bytes")
check(not any(k.startswith("reserved_bytes_by_private_pools") for k in theirs),
      "torch_npu now shows reserved_bytes_by_private_pools: assert on torch.npu.memory_stats()")
check(reader.oom_rejections(0) == 0 and theirs["num_oom_rejections"] == 0, "num_oom_rejections")
# npualloc's own Python statistics name the pool as torch.cuda.memory_stats() does.
key = "reserved_bytes_by_private_pools.%d_%d.all.current" % pool
check(npualloc.memory_stats(0)[key] == 22 * MIB, "npualloc.memory_stats()[%r]" % key)
g.replay()
torch.npu.synchronize()
del a, b
check(pools()[pool] == want, "freed blocks stay cached in the pool: %s" % pools()[pool])
g.reset()  # releases the pool
torch.npu.empty_cache()
after = pools()
check(list(after) == [pool], "the entry outlives the pool: %s" % after)
check(after[pool] == [(0, 22 * MIB, 22 * MIB, 22 * MIB), (0, 2 * MIB, 2 * MIB, 2 * MIB),
                      (0, 20 * MIB, 20 * MIB, 20 * MIB)], "after release: %s" % after[pool])
torch.npu.reset_peak_memory_stats(0)
check(pools()[pool][0] == (0, 0, 22 * MIB, 22 * MIB), "after the peak reset: %s" % pools()[pool])
check(npualloc.last_error() is None, npualloc.last_error())
check(ctx.lib.npualloc_check_invariants(0) == 0, npualloc.last_error())
passed("private_pool_stats")
