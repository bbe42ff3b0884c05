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
//   same logic as the torch_npu shim's, without torch_npu's task queue.)
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

#include "npualloc.h"

struct CUstream_st;
using cudaStream_t = CUstream_st*;  // as cuda_runtime_api.h declares it

namespace {

using Filter = std::function<bool(cudaStream_t)>;

struct Capture {
  int device;
  c10::MempoolId_t pool;
  Filter filter;
  std::vector<cudaStream_t> routed;  // streams npualloc routes to the pool
};

std::mutex g_capture_mu;
std::vector<Capture> g_captures;
std::atomic<int> g_open_captures{0};
std::vector<std::pair<int, c10::MempoolId_t>> g_pools;  // pools npualloc has (released once)

void route_if_captured(int device, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(g_capture_mu);
  for (auto& c : g_captures) {
    if (c.device != device) continue;
    for (auto s : c.routed)
      if (s == stream) return;
    if (!c.filter || !c.filter(stream)) continue;
    int rc = npualloc_begin_allocate_to_pool(device, c.pool.first, c.pool.second, stream);
    TORCH_CHECK(rc == NPUALLOC_OK, "npualloc could not route a captured stream to the graph's pool: ",
                npualloc_last_error());
    c.routed.push_back(stream);
    auto key = std::make_pair(device, c.pool);
    if (std::find(g_pools.begin(), g_pools.end(), key) == g_pools.end()) g_pools.push_back(key);
    return;
  }
}

void begin_allocate_to_pool(int device, c10::MempoolId_t pool, Filter filter) {
  std::lock_guard<std::mutex> lock(g_capture_mu);
  g_captures.push_back(Capture{device, pool, std::move(filter), {}});
  g_open_captures.fetch_add(1);
}

void end_allocate_to_pool(int device, c10::MempoolId_t pool) {
  std::lock_guard<std::mutex> lock(g_capture_mu);
  for (auto it = g_captures.begin(); it != g_captures.end(); ++it) {
    if (it->device != device || it->pool != pool) continue;
    for (size_t i = 0; i < it->routed.size(); ++i)
      npualloc_end_allocate_to_pool(device, pool.first, pool.second);
    g_captures.erase(it);
    g_open_captures.fetch_sub(1);
    return;
  }
}

void release_pool(int device, c10::MempoolId_t pool) {
  // A capture that allocated nothing created no pool in npualloc: nothing to release.
  std::lock_guard<std::mutex> lock(g_capture_mu);
  auto it = std::find(g_pools.begin(), g_pools.end(), std::make_pair(device, pool));
  if (it == g_pools.end()) return;
  g_pools.erase(it);
  npualloc_release_pool(device, pool.first, pool.second);
}

template <typename F>
uint64_t addr(F* f) {
  return reinterpret_cast<uint64_t>(f);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) void* npualloc_cuda_shim_malloc(size_t size, int device,
                                                                                cudaStream_t stream) {
  if (g_open_captures.load(std::memory_order_relaxed) > 0) route_if_captured(device, stream);
  void* p = npualloc_malloc(size, device, static_cast<npualloc_stream>(stream));
  if (p == nullptr && size != 0) {
    const char* err = npualloc_last_error();
    std::string msg = err ? err : "unknown error";
    TORCH_CHECK_WITH(OutOfMemoryError, msg.find("out of memory") == std::string::npos,
                     "npualloc: ", msg);
    // One string argument: formatting a size_t through c10::str crashed in a shim built
    // with the GPU machine's g++ against torch 2.11 (seen in cuda-gdb), strings did not.
    TORCH_CHECK(false, "npualloc could not allocate " + std::to_string(size) + " bytes: " + msg);
  }
  return p;
}

extern "C" __attribute__((visibility("default"))) void npualloc_cuda_shim_free(void* ptr, size_t size,
                                                                             int device, cudaStream_t stream) {
  npualloc_free(ptr, size, device, static_cast<npualloc_stream>(stream));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("begin_allocate_to_pool_fn", [] { return addr(&begin_allocate_to_pool); });
  m.def("end_allocate_to_pool_fn", [] { return addr(&end_allocate_to_pool); });
  m.def("release_pool_fn", [] { return addr(&release_pool); });
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
