// The C++ shim between torch.cuda's CUDAPluggableAllocator and npualloc's C ABI.
//
// - malloc: torch.cuda's pluggable allocator uses the pointer its malloc function
//   returns as it is: a NULL (out of memory, a memory fraction passed) becomes a tensor
//   at address 0 and, at the first kernel, an illegal memory access that poisons the
//   CUDA context (seen on an H200 with torch 2.11). npualloc_cuda_shim_malloc calls
//   npualloc_malloc and throws torch's error instead, with npualloc's message:
//   c10::OutOfMemoryError for out of memory, which Python sees as
//   torch.OutOfMemoryError, as with PyTorch's own allocator.
// - graph pools: torch.cuda.graph calls begin_allocate_to_pool(device, pool, filter)
//   before a capture, where filter(stream) says whether a stream is being captured into
//   that graph. npualloc routes one stream per call, so the shim keeps the filter and,
//   at each allocation while a capture is open, routes a stream the filter accepts
//   (npualloc_begin_allocate_to_pool) before allocating on it. end_allocate_to_pool
//   ends the routing of every stream routed; release_pool drops the pool's use. (The
//   routing is graph_pools.h, shared with the torch_npu shim.)
// Everything else torch.cuda passes plain C types, so it goes straight to the C ABI
// (npualloc.install_cuda sets those hooks).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>
#include <torch/extension.h>

struct CUstream_st;
using cudaStream_t = CUstream_st*;  // as cuda_runtime_api.h declares it

#include "graph_pools.h"
#include "shim_common.h"
#include "npualloc.h"

namespace {

using Filter = std::function<bool(cudaStream_t)>;

npualloc_shim::GraphPools<cudaStream_t> g_graphs;

void begin_allocate_to_pool(int device, c10::MempoolId_t pool, Filter filter) {
  g_graphs.begin(device, pool, std::move(filter));
}

void end_allocate_to_pool(int device, c10::MempoolId_t pool) { g_graphs.end(device, pool); }

void release_pool(int device, c10::MempoolId_t pool) { g_graphs.release(device, pool); }

void nothing_before_filter(int, cudaStream_t) {}

}  // namespace

extern "C" __attribute__((visibility("default"))) void* npualloc_cuda_shim_malloc(size_t size, int device,
                                                                                cudaStream_t stream) {
  if (g_graphs.any_open()) g_graphs.route_if_captured(device, stream, nothing_before_filter);
  return npualloc_shim::malloc_or_throw(size, device, static_cast<npualloc_stream>(stream));
}

extern "C" __attribute__((visibility("default"))) void npualloc_cuda_shim_free(void* ptr, size_t size,
                                                                             int device, cudaStream_t stream) {
  npualloc_free(ptr, size, device, static_cast<npualloc_stream>(stream));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("begin_allocate_to_pool_fn", [] { return npualloc_shim::addr(&begin_allocate_to_pool); });
  m.def("end_allocate_to_pool_fn", [] { return npualloc_shim::addr(&end_allocate_to_pool); });
  m.def("release_pool_fn", [] { return npualloc_shim::addr(&release_pool); });
  // For tests without a GPU (simulated device): allocates `size` bytes on the default
  // stream through the shim and frees them; errors surface as the shim throws them.
  m.def("malloc_then_free", [](size_t size, int device) {
    void* p = npualloc_cuda_shim_malloc(size, device, nullptr);
    npualloc_cuda_shim_free(p, size, device, nullptr);
    return p != nullptr;
  });
  // The same, inside a capture into pool (1, 0) whose filter accepts the default
  // stream, then released: exercises the routing as torch.cuda.graph drives it.
  m.def("captured_malloc_then_release", [](size_t size, int device) {
    c10::MempoolId_t pool{1, 0};
    begin_allocate_to_pool(device, pool, [](cudaStream_t s) { return s == nullptr; });
    void* p = npualloc_cuda_shim_malloc(size, device, nullptr);
    npualloc_cuda_shim_free(p, size, device, nullptr);
    end_allocate_to_pool(device, pool);
    size_t n = 0;
    npualloc_private_pool_stats stats[4];
    npualloc_get_private_pool_stats(device, stats, 4, &n);
    int64_t reserved = n > 0 ? stats[0].reserved_bytes[0].current : -1;
    release_pool(device, pool);
    return reserved;
  });
}
