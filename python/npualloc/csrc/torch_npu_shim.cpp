// Adapts torch_npu's C++-typed NPUPluggableAllocator hooks to npualloc's C ABI.
//
// Compiled on the user's machine by npualloc.install() with
// torch.utils.cpp_extension.load (C++20), against the installed torch_npu's headers
// (<torch_npu>/include, which also holds the real CANN headers: acl/acl_rt.h) and
// linked against libtorch_npu.so. It uses only API that libtorch_npu exports
// (C10_NPU_API). Checked against torch_npu 2.14.0 (tests/torch_npu/: the real wheel on
// stand-in CANN libraries).
//
// - malloc/free: npualloc_shim_malloc routes allocations to a graph-private pool while
//   a torch_npu graph capture runs (see below), then calls npualloc_malloc; a failure
//   is thrown as torch's error with npualloc's message (c10::OutOfMemoryError for out
//   of memory, which Python sees as torch.OutOfMemoryError).
// - record/erase_stream: torch_npu passes a c10_npu::NPUStream; npualloc takes its
//   aclrtStream. The stream is remembered (as is each allocation's stream, the current
//   one) so the event hook can drain that stream's task queue.
// - get_device_stats: npualloc_device_stats -> c10::CachingDeviceAllocator::DeviceStats,
//   every field: torch 2.14's reserved_bytes_by_private_pools from
//   npualloc_get_private_pool_stats (one entry per graph pool that reserved memory,
//   kept with current 0 after the pool's memory went back, as PyTorch keeps it), and
//   num_oom_rejections 0 (npualloc has no OOM preemption policy). torch_npu 2.14's
//   torch.npu.memory_stats() does not show the map (its binding reads the other
//   fields); C++ callers of c10_npu::NPUCachingAllocator::getDeviceStats see it.
// - graph pools: torch_npu's NPUGraph calls begin_allocate_to_pool(device, pool,
//   filter) before a capture, where filter(stream) says whether a stream takes part in
//   that capture (the capture stream, and side streams that joined it by waiting on an
//   event recorded in it). npualloc routes one stream per call, so the shim keeps the
//   filter and, at each allocation while a capture is open on the device, routes a
//   stream the filter accepts (npualloc_begin_allocate_to_pool) before allocating on
//   it. end_allocate_to_pool ends the routing of every stream routed; release_pool
//   drops the pool's use.
// - runtime hooks (docs/design.md, "The host framework's task queue"): torch_npu launches kernels
//   through a host task queue, so an event recorded straight with aclrtRecordEvent
//   could land before kernels still waiting there. Before recording, the event hook
//   drains the queue holding the stream's work: NPUStream::stream() (exported) empties
//   the queue of that stream, which is the device's shared queue unless torch_npu runs
//   one queue per stream; a stream the shim never saw gets the device's default queue
//   drained. Device synchronisation is npuSynchronizeDevice(true), which drains every
//   queue first.

#include <torch/extension.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <string>
#include <utility>
#include <vector>

#include <acl/acl_rt.h>

#include "torch_npu/csrc/core/npu/NPUCachingAllocator.h"
#include "torch_npu/csrc/core/npu/NPUFunctions.h"
#include "torch_npu/csrc/core/npu/NPUGuard.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"
#include "torch_npu/csrc/npu/NPUPluggableAllocator.h"

#include "graph_pools.h"
#include "shim_common.h"
#include "npualloc.h"

namespace {

using NpuStats = c10_npu::NPUCachingAllocator::DeviceStats;
using Filter = std::function<bool(aclrtStream)>;

// ---- streams seen through record_stream, and the device of every event ----------

std::mutex g_mu;
std::unordered_map<aclrtStream, c10::Stream> g_streams;  // raw handle -> torch_npu stream
std::unordered_map<aclrtEvent, int> g_event_device;

void remember(const c10_npu::NPUStream& stream) {
  aclrtStream raw = stream.stream(false);
  std::lock_guard<std::mutex> lock(g_mu);
  g_streams.emplace(raw, stream.unwrap());
}

// Allocation streams too (npualloc records events on them when it lends memory across
// streams): torch_npu allocates on the current stream, remembered once per stream.
void remember_allocation_stream(int device, aclrtStream raw) {
  thread_local aclrtStream last = nullptr;
  if (raw == last) return;
  last = raw;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_streams.count(raw)) return;
  }
  auto cur = c10_npu::getCurrentNPUStream(static_cast<c10::DeviceIndex>(device));
  if (cur.stream(false) == raw) remember(cur);
}

void record_stream(void* ptr, c10_npu::NPUStream stream) {
  remember(stream);
  npualloc_record_stream(ptr, stream.stream(false));
}

void erase_stream(void* ptr, c10_npu::NPUStream stream) {
  npualloc_erase_stream(ptr, stream.stream(false));
}

// ---- statistics ------------------------------------------------------------------

template <typename StatT>
void copy_stat(StatT& dst, const npualloc_stat& src) {
  dst.current = src.current;
  dst.peak = src.peak;
  dst.allocated = src.allocated;
  dst.freed = src.freed;
}

template <typename ArrT>
void copy_array(ArrT& dst, const npualloc_stat_array src) {
  for (size_t i = 0; i < 3; ++i) copy_stat(dst[i], src[i]);
}

// Fills reserved_bytes_by_private_pools; left empty if npualloc cannot say.
void copy_private_pools(int device, NpuStats& out) {
  std::vector<npualloc_private_pool_stats> pools(4);
  size_t n = 0;
  for (;;) {
    if (npualloc_get_private_pool_stats(device, pools.data(), pools.size(), &n) != NPUALLOC_OK) return;
    if (n <= pools.size()) break;
    pools.resize(n);  // more pools than room: read again, all of them
  }
  for (size_t i = 0; i < n; ++i) {
    c10::MempoolId_t id{pools[i].id_hi, pools[i].id_lo};
    copy_array(out.reserved_bytes_by_private_pools[id], pools[i].reserved_bytes);
  }
}

NpuStats get_device_stats(c10::DeviceIndex device) {
  npualloc_device_stats s{};
  NpuStats out;
  if (npualloc_get_device_stats(static_cast<int>(device), &s) != NPUALLOC_OK) return out;
  copy_array(out.allocation, s.allocation);
  copy_array(out.segment, s.segment);
  copy_array(out.active, s.active);
  copy_array(out.inactive_split, s.inactive_split);
  copy_array(out.allocated_bytes, s.allocated_bytes);
  copy_array(out.reserved_bytes, s.reserved_bytes);
  copy_array(out.active_bytes, s.active_bytes);
  copy_array(out.inactive_split_bytes, s.inactive_split_bytes);
  copy_array(out.requested_bytes, s.requested_bytes);
  out.num_alloc_retries = s.num_alloc_retries;
  out.num_ooms = s.num_ooms;
  copy_stat(out.oversize_allocations, s.oversize_allocations);
  copy_stat(out.oversize_segments, s.oversize_segments);
  out.num_sync_all_streams = s.num_sync_all_streams;
  out.num_device_alloc = s.num_device_alloc;
  out.num_device_free = s.num_device_free;
  out.num_oom_rejections = 0;
  out.max_split_size = s.max_split_size;
  copy_private_pools(static_cast<int>(device), out);
  return out;
}

void reset_peak_status(c10::DeviceIndex device) {
  npualloc_reset_peak_stats(static_cast<int>(device));
}

// ---- graph-private pools (graph_pools.h) -------------------------------------------

npualloc_shim::GraphPools<aclrtStream> g_graphs;

// The filter asks the runtime whether the stream joined a capture; a join (a wait on an
// event of the capture) still in torch_npu's task queue would be missed, so the
// allocating stream's queue is drained first.
void drain_if_current(int device, aclrtStream stream) {
  auto cur = c10_npu::getCurrentNPUStream(static_cast<c10::DeviceIndex>(device));
  if (cur.stream(false) == stream) (void)cur.stream();
}

void begin_allocate_to_pool(int device, c10::MempoolId_t pool, Filter filter) {
  g_graphs.begin(device, pool, std::move(filter));
}

void end_allocate_to_pool(int device, c10::MempoolId_t pool) { g_graphs.end(device, pool); }

void release_pool(int device, c10::MempoolId_t pool) { g_graphs.release(device, pool); }

// ---- runtime hooks -----------------------------------------------------------------
// npualloc (Rust) calls these: no C++ exception may unwind through it, so each hook
// turns one into a failure code (npualloc then reports the operation as failed).

constexpr int kHookFailed = -1;

template <typename F>
int guarded(F&& f) noexcept {
  try {
    return f();
  } catch (const std::exception& e) {
    TORCH_WARN("npualloc runtime hook failed: ", e.what());
  } catch (...) {
  }
  return kHookFailed;
}

int device_synchronize(void*, int) {
  return guarded([] { return c10_npu::npuSynchronizeDevice(true) ? 0 : kHookFailed; });
}

int event_create(void*, int device, void** ev) {
  return guarded([&] {
    c10_npu::NPUGuard guard(static_cast<c10::DeviceIndex>(device));
    int rc = aclrtCreateEventWithFlag(ev, ACL_EVENT_CAPTURE_STREAM_PROGRESS);
    if (rc == ACL_SUCCESS) {
      std::lock_guard<std::mutex> lock(g_mu);
      g_event_device[*ev] = device;
    }
    return rc;
  });
}

int event_destroy(void*, void* ev) {
  return guarded([&] {
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_event_device.erase(ev);
    }
    return aclrtDestroyEvent(ev);
  });
}

int record_after_drain(void* ev, npualloc_stream stream) {
  // Kernels queued on the host before this point must reach the stream first.
  c10::optional<c10::Stream> known;
  int device = -1;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto s = g_streams.find(stream);
    if (s != g_streams.end()) known = s->second;
    auto d = g_event_device.find(ev);
    if (d != g_event_device.end()) device = d->second;
  }
  if (known) {
    (void)c10_npu::NPUStream(*known).stream();
  } else if (device >= 0) {
    (void)c10_npu::getDefaultNPUStream(static_cast<c10::DeviceIndex>(device)).stream();
  }
  return aclrtRecordEvent(ev, stream);
}

int event_record(void*, void* ev, npualloc_stream stream) {
  return guarded([&] { return record_after_drain(ev, stream); });
}

int event_query(void*, void* ev, int* done) {
  aclrtEventRecordedStatus status = ACL_EVENT_RECORDED_STATUS_NOT_READY;
  int rc = aclrtQueryEventStatus(ev, &status);
  *done = (rc == ACL_SUCCESS && status == ACL_EVENT_RECORDED_STATUS_COMPLETE) ? 1 : 0;
  return rc;
}

int event_synchronize(void*, void* ev) { return aclrtSynchronizeEvent(ev); }

}  // namespace

// The allocation entry points given to NPUPluggableAllocator (by name, from this
// extension's file).
extern "C" __attribute__((visibility("default"))) void* npualloc_shim_malloc(size_t size, int device,
                                                                           aclrtStream stream) {
  remember_allocation_stream(device, stream);
  if (g_graphs.any_open()) g_graphs.route_if_captured(device, stream, drain_if_current);
  return npualloc_shim::malloc_or_throw(size, device, stream);
}

extern "C" __attribute__((visibility("default"))) void npualloc_shim_free(void* ptr, size_t size, int device,
                                                                        aclrtStream stream) {
  npualloc_free(ptr, size, device, stream);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("record_stream_fn", [] { return npualloc_shim::addr(&record_stream); });
  m.def("erase_stream_fn", [] { return npualloc_shim::addr(&erase_stream); });
  m.def("get_device_stats_fn", [] { return npualloc_shim::addr(&get_device_stats); });
  m.def("reset_peak_status_fn", [] { return npualloc_shim::addr(&reset_peak_status); });
  m.def("begin_allocate_to_pool_fn", [] { return npualloc_shim::addr(&begin_allocate_to_pool); });
  m.def("end_allocate_to_pool_fn", [] { return npualloc_shim::addr(&end_allocate_to_pool); });
  m.def("release_pool_fn", [] { return npualloc_shim::addr(&release_pool); });
  m.def("install_runtime_hooks", [] {
    npualloc_runtime_hooks h{};
    h.event_create = &event_create;
    h.event_destroy = &event_destroy;
    h.event_record = &event_record;
    h.event_query = &event_query;
    h.event_synchronize = &event_synchronize;
    h.device_synchronize = &device_synchronize;
    return npualloc_set_runtime_hooks(&h);
  });
}
