// Adapts torch_npu's C++-typed NPUPluggableAllocator setters to npualloc's C ABI.
//
// Compiled on the user's machine by npualloc.install() with
// torch.utils.cpp_extension.load, against the installed torch_npu headers.
//
// NOT YET VERIFIED: no torch_npu installation was available while writing this file;
// it follows torch_npu's public headers (NPUPluggableAllocator.h, NPUStream.h,
// NPUCachingAllocator.h) as read, and must be checked on a machine with torch_npu.
//
// - record/erase_stream: newer torch_npu passes c10_npu::NPUStream by value, older
//   versions a plain aclrtStream; record_stream_fn() returns whichever fits the
//   setter this torch_npu declares.
// - get_device_stats: npualloc_device_stats -> c10_npu::NPUCachingAllocator::DeviceStats.
// - runtime hooks (DESIGN section 2, the task-queue hazard): torch_npu launches kernels
//   through a host task queue, so an event recorded straight with aclrtRecordEvent could
//   land before kernels still waiting there. The event hooks drain every stream's queue
//   (c10_npu::emptyAllNPUStream, as torch_npu's own NPUEvent::query and allocator do)
//   before recording; device synchronisation is npuSynchronizeDevice(true), which drains
//   the queue too, before npualloc frees or unmaps memory.

#include <torch/extension.h>

#include <cstdint>
#include <type_traits>

#include "torch_npu/csrc/core/npu/NPUCachingAllocator.h"
#include "torch_npu/csrc/core/npu/NPUFunctions.h"
#include "torch_npu/csrc/core/npu/NPUGuard.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"
#include "torch_npu/csrc/npu/NPUPluggableAllocator.h"

#include "npualloc.h"

// The ACL functions the event hooks use (CANN acl_rt.h; libascendcl is linked).
extern "C" {
int aclrtCreateEventWithFlag(void** event, uint32_t flag);
int aclrtDestroyEvent(void* event);
int aclrtRecordEvent(void* event, void* stream);
int aclrtQueryEventStatus(void* event, int* status);
int aclrtSynchronizeEvent(void* event);
}

namespace {

constexpr uint32_t kAclEventCaptureStreamProgress = 0x2;
constexpr int kAclEventRecordedStatusComplete = 1;

using Pluggable = torch::npu::NPUPluggableAllocator::NPUPluggableAllocator;
using NpuStats = c10_npu::NPUCachingAllocator::DeviceStats;

template <typename T>
struct setter_arg;
template <typename C, typename F>
struct setter_arg<void (C::*)(std::function<F>)> {
  using type = F;
};
using RecordSig = typename setter_arg<decltype(&Pluggable::set_record_stream_fn)>::type;
constexpr bool kRecordTakesNPUStream =
    std::is_same<RecordSig, void(void*, c10_npu::NPUStream)>::value;

void record_stream(void* ptr, c10_npu::NPUStream stream) {
  npualloc_record_stream(ptr, stream.stream(false));
}

void erase_stream(void* ptr, c10_npu::NPUStream stream) {
  npualloc_erase_stream(ptr, stream.stream(false));
}

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
  out.max_split_size = s.max_split_size;
  return out;
}

void reset_peak_status(c10::DeviceIndex device) {
  npualloc_reset_peak_stats(static_cast<int>(device));
}

int device_synchronize(void*, int) {
  c10_npu::npuSynchronizeDevice(true);
  return 0;
}

int event_create(void*, int device, void** ev) {
  c10_npu::NPUGuard guard(static_cast<c10::DeviceIndex>(device));
  return aclrtCreateEventWithFlag(ev, kAclEventCaptureStreamProgress);
}

int event_destroy(void*, void* ev) { return aclrtDestroyEvent(ev); }

int event_record(void*, void* ev, npualloc_stream stream) {
  // Kernels queued on the host before this point must reach their streams first.
  c10_npu::emptyAllNPUStream();
  return aclrtRecordEvent(ev, stream);
}

int event_query(void*, void* ev, int* done) {
  int status = 0;
  int rc = aclrtQueryEventStatus(ev, &status);
  *done = (rc == 0 && status == kAclEventRecordedStatusComplete) ? 1 : 0;
  return rc;
}

int event_synchronize(void*, void* ev) { return aclrtSynchronizeEvent(ev); }

template <typename F>
uint64_t addr(F* f) {
  return reinterpret_cast<uint64_t>(f);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("record_stream_fn", [] {
    return kRecordTakesNPUStream ? addr(&record_stream) : addr(&npualloc_record_stream);
  });
  m.def("erase_stream_fn", [] {
    return kRecordTakesNPUStream ? addr(&erase_stream) : addr(&npualloc_erase_stream);
  });
  m.def("get_device_stats_fn", [] { return addr(&get_device_stats); });
  m.def("reset_peak_status_fn", [] { return addr(&reset_peak_status); });
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
