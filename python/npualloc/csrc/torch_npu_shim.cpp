// npualloc as torch_npu's complete allocator: a subclass of torch_npu's public abstract
// c10_npu::NPUCachingAllocator::NPUAllocator over npualloc's C ABI.
//
// Compiled on the user's machine by npualloc.install() with
// torch.utils.cpp_extension.load (C++20), against the installed torch_npu's headers
// (<torch_npu>/include, which also holds the real CANN headers: acl/acl_rt.h) and
// linked against libtorch_npu.so; it uses only API that libtorch_npu exports
// (C10_NPU_API). The interface is torch_npu 2.14's (npualloc.install() refuses other
// versions). Checked against torch_npu 2.14.0 (tests/torch_npu/: the real wheel on
// stand-in CANN libraries).
//
// Installing (npualloc.install()): torch_npu's own swap,
// torch_npu._C._npu_changeCurrentAllocator(shared_ptr<NPUAllocator>) (refused once the
// current allocator is initialized; it stores the pointer in the exported
// c10_npu::NPUCachingAllocator::allocator, through which every torch.npu memory entry
// goes, and keeps it alive), then c10::SetAllocator(PrivateUse1) so that
// c10::GetAllocator / torch.accelerator reach it too.
//
// Every virtual method of NPUAllocator, c10::DeviceAllocator and c10::Allocator is
// either implemented with torch_npu's meaning or raises one error naming npualloc and
// the method (complete_allocator.h: unsupported). The shared machinery (graph-pool
// routing, history, OOM observers, checkpoints, snapshot) is complete_allocator.h.
//
// - Deleter identity: every DataPtr npualloc hands out, also those
//   setCheckpointPoolState re-creates, carries raw_deleter() (graph trees compare it).
//   The deleter never throws (it runs in destructors): a failed free warns.
// - Streams: torch_npu allocates on the current stream; a stream seen through
//   recordStream or an allocation is remembered, so the event hook can drain its task
//   queue (below).
// - HCCL hooks: getBlockPtr's "block" is the allocation's address; npualloc keeps the
//   HCCL work that last used it (recordHcclWorkForBlock) and erases the HCCL stream's
//   use only if that work is still the block's and the block was allocated on the
//   current stream (eraseStreamWithBlockPtr), as torch_npu's allocator does.
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
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <acl/acl_rt.h>

// NPUAllocator's inline methods use NPU_CHECK_ERROR and PTA_ERROR, whose helpers
// libtorch_npu.so does not export: a subclass (which emits them) would not load. The
// header's meaning is kept with exported pieces: a plain check, no error-code suffix.
#include "torch_npu/csrc/core/npu/NPUException.h"
#undef PTA_ERROR
#define PTA_ERROR(error) std::string()
#undef NPU_CHECK_ERROR
#define NPU_CHECK_ERROR(err_code, ...)                                                            \
  do {                                                                                            \
    int npualloc_acl_rc = (err_code);                                                             \
    TORCH_CHECK(npualloc_acl_rc == ACL_ERROR_NONE, std::string(#err_code) + " failed with " +     \
                                                       std::to_string(npualloc_acl_rc));          \
  } while (0)

#include "torch_npu/csrc/core/npu/NPUCachingAllocator.h"
#include "torch_npu/csrc/core/npu/NPUFunctions.h"
#include "torch_npu/csrc/core/npu/NPUGuard.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"

#include "complete_allocator.h"
#include "npualloc.h"

namespace {

namespace NPU = c10_npu::NPUCachingAllocator;
using npualloc_shim::check;
using npualloc_shim::unsupported;

constexpr c10::DeviceType kDevice = c10::DeviceType::PrivateUse1;

// ---- streams seen through recordStream and allocations; events' devices ------------

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

// A filter asks the runtime whether the stream joined a capture; a join (a wait on an
// event of the capture) still in torch_npu's task queue would be missed, so the
// allocating stream's queue is drained first.
void drain_if_current(int device, aclrtStream stream) {
  auto cur = c10_npu::getCurrentNPUStream(static_cast<c10::DeviceIndex>(device));
  if (cur.stream(false) == stream) (void)cur.stream();
}

void check_device(int device, const char* method) {
  int n = npualloc_device_count();
  TORCH_CHECK(device >= 0 && device < n, std::string("npualloc: ") + method + ": invalid device " +
                                             std::to_string(device) + " (" + std::to_string(n) + " device(s))");
}

int current_device() {
  int device = 0;
  NPU_CHECK_ERROR(c10_npu::GetDevice(&device));
  return device;
}

aclrtStream current_stream(int device) {
  return c10_npu::getCurrentNPUStream(static_cast<c10::DeviceIndex>(device)).stream(false);
}

// ---- the allocator -----------------------------------------------------------------

struct NpuTraits {
  using TraceEntry = NPU::TraceEntry;
  using RecordContext = NPU::RecordContext;
  using CreateContextFn = NPU::CreateContextFn;
  using AllocatorTraceTracker = NPU::AllocatorTraceTracker;

  static TraceEntry make_entry(TraceEntry::Action action, int device, uint64_t addr, size_t size, void* stream,
                               c10::MempoolId_t pool, std::shared_ptr<c10::GatheredContext> ctx) {
    return TraceEntry(action, device, static_cast<int64_t>(addr), size, static_cast<aclrtStream>(stream), pool,
                      std::move(ctx));
  }
};

// The process-wide state behind the allocator object. Never destroyed: tensors may
// still be freed (through the deleter) while static objects are torn down at exit.
struct Engine {
  npualloc_shim::PoolRouter<aclrtStream> router;
  npualloc_shim::History<NpuTraits> history;
  npualloc_shim::OomObservers<NPU::OutOfMemoryObserver> oom;
  std::atomic<bool> initialized{false};
};

Engine& engine() {
  static Engine* e = new Engine();
  return *e;
}

// Allocates on `device` for `stream`, routed to a graph pool if an open
// beginAllocateToPool filter accepts it; errors are torch's.
void* malloc_block(size_t size, int device, aclrtStream stream) {
  if (size == 0) return nullptr;
  Engine& e = engine();
  remember_allocation_stream(device, stream);
  npualloc_shim::ContextScope scope(e.history.gather(NPU::RecordContext::STATE), false);
  std::optional<c10::MempoolId_t> pool;
  if (e.router.any_open()) pool = e.router.route(device, stream, drain_if_current);
  return npualloc_shim::malloc_routed(size, device, stream, pool);
}

// Frees `ptr`; `raise`: a failure is torch's error, else a warning (the deleter).
void free_block(void* ptr, bool raise) {
  if (ptr == nullptr) return;
  Engine& e = engine();
  npualloc_shim::ContextScope scope(e.history.gather(NPU::RecordContext::ALL), true);
  int rc = npualloc_shim::free_reporting(ptr);
  if (raise) {
    check(rc, "raw_delete");
  } else {
    npualloc_shim::warn_if_failed(rc, "free");
  }
}

// The one deleter of every DataPtr npualloc hands out (raw_deleter()).
void raw_deleter_fn(void* ptr) {
  try {
    free_block(ptr, false);
  } catch (const std::exception& ex) {
    TORCH_WARN(std::string("npualloc: free: ") + ex.what());
  } catch (...) {
  }
}

bool is_ours(const c10::DataPtr& ptr) { return ptr.get() != nullptr && ptr.get_deleter() == &raw_deleter_fn; }

// How often torch reached the graph-mode methods (tests read it: the graph-tree and
// torchair paths must have gone through them).
enum Counted { kGetCheckpoint, kSetCheckpoint, kCheckLive, kSnapshot, kBeginPool, kEndPool, kReleasePool,
               kCaptureBegin, kCaptureEnd, kRecordHistory, kCounted };
constexpr const char* kCountedNames[kCounted] = {
    "getCheckpointState", "setCheckpointPoolState", "checkPoolLiveAllocations", "snapshot",
    "beginAllocateToPool", "endAllocateToPool", "releasePool", "markCaptureBegin", "markCaptureEnd",
    "recordHistory"};
std::atomic<uint64_t> g_calls[kCounted];

void count(Counted c) { g_calls[c].fetch_add(1, std::memory_order_relaxed); }

class NpuallocAllocator final : public NPU::NPUAllocator {
 public:
  using NPU::NPUAllocator::emptyCache;
  using NPU::NPUAllocator::recordStream;

  // -- c10::Allocator --
  c10::DataPtr allocate(size_t size) override {
    int device = current_device();
    void* p = malloc_block(size, device, current_stream(device));
    return {p, p, &raw_deleter_fn, c10::Device(kDevice, static_cast<c10::DeviceIndex>(device))};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &raw_deleter_fn; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    NPU_CHECK_ERROR(aclrtMemcpy(dest, count, src, count, ACL_MEMCPY_DEVICE_TO_DEVICE));
  }

  // -- c10::DeviceAllocator --
  bool initialized() override { return engine().initialized.load(); }

  void emptyCache(c10::MempoolId_t pool) override {
    if (pool == c10::MempoolId_t{0, 0}) {
      npualloc_empty_cache(true);
      return;
    }
    // One pool's cached memory: reached from MemPool's destructor, so a failure warns.
    int n = npualloc_device_count();
    for (int d = 0; d < n; ++d) {
      int rc = npualloc_empty_cache_pool(d, pool.first, pool.second);
      if (rc != NPUALLOC_ERR_UNKNOWN_POOL) npualloc_shim::warn_if_failed(rc, "emptyCache");  // not on d: nothing
    }
  }

  NPU::DeviceStats getDeviceStats(c10::DeviceIndex device) override { return npualloc_shim::device_stats(device); }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check(npualloc_reset_accumulated_stats(device), "resetAccumulatedStats");
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    check_device(device, "resetPeakStats");
    npualloc_reset_peak_stats(device);
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    c10_npu::NPUGuard guard(device);
    size_t free = 0, total = 0;
    NPU_CHECK_ERROR(aclrtGetMemInfo(ACL_HBM_MEM, &free, &total));
    return {free, total};
  }

  // -- NPUAllocator --
  c10::DataPtr allocate_with_aligned(size_t size, size_t aligned_kb) const override {
    TORCH_CHECK(size <= SIZE_MAX - aligned_kb * 1024, "npualloc: allocate_with_aligned: size overflows");
    int device = current_device();
    size_t aligned = aligned_kb * 1024;
    void* real = malloc_block(size == 0 ? 0 : size + aligned, device, current_stream(device));
    void* p = real;
    if (real != nullptr && aligned != 0) {
      auto a = reinterpret_cast<uintptr_t>(real);
      p = reinterpret_cast<void*>(aligned * ((a + aligned - 1) / aligned));
    }
    return {p, real, &raw_deleter_fn, c10::Device(kDevice, static_cast<c10::DeviceIndex>(device))};
  }

  void* raw_alloc(size_t nbytes) override {
    int device = current_device();
    return malloc_block(nbytes, device, current_stream(device));
  }

  void* raw_alloc_with_stream(size_t nbytes, aclrtStream stream) override {
    return malloc_block(nbytes, current_device(), stream);
  }

  void raw_delete(void* ptr) override { free_block(ptr, true); }

  void init(int device_count) override {
    npualloc_init(device_count);
    TORCH_CHECK(npualloc_device_count() >= 0, "npualloc: init: " + npualloc_shim::last_error());
    engine().initialized.store(true);
  }

  double getMemoryFraction(int device) override {
    double f = 1.0;
    check(npualloc_get_memory_fraction(device, &f), "getMemoryFraction");
    return f;
  }

  void setMemoryFraction(double fraction, int device) override {
    check_device(device, "setMemoryFraction");
    TORCH_CHECK(fraction >= 0.0 && fraction <= 1.0,
                "npualloc: setMemoryFraction: invalid fraction " + std::to_string(fraction) + ", not within [0, 1]");
    npualloc_shim::FailureWatch watch;
    npualloc_set_memory_fraction(fraction, device);
    if (watch.failed()) check(NPUALLOC_ERR_INVALID_ARGUMENT, "setMemoryFraction");
  }

  void emptyCacheImpl(bool check_error, bool free_physical) override {
    if (!free_physical)
      unsupported("emptyVirtAddrCache",
                  "npualloc keeps no physical memory apart from its addresses; torch.npu.empty_cache() "
                  "releases both");
    npualloc_empty_cache(check_error);
  }

  void emptyCache(bool check_error) override { npualloc_empty_cache(check_error); }

  void emptyVirtAddrCache(bool) override {
    unsupported("emptyVirtAddrCache",
                "npualloc keeps no physical memory apart from its addresses; torch.npu.empty_cache() "
                "releases both");
  }

  void cacheInfo(int device, size_t* cached_and_free, size_t* largest_block) override {
    check(npualloc_cache_info(device, cached_and_free, largest_block), "cacheInfo");
  }

  void* getBaseAllocation(void* ptr, size_t* size) override {
    void* base = npualloc_base_alloc(ptr, size);
    TORCH_CHECK(base != nullptr, "npualloc: getBaseAllocation: " + npualloc_shim::last_error());
    return base;
  }

  void recordStream(const c10::DataPtr& ptr, c10_npu::NPUStream stream) override {
    // An empty tensor's storage has no block, and a DataPtr of another allocator
    // (shared across processes, from_blob) is not npualloc's to track: torch_npu's
    // allocator skips both.
    if (!is_ours(ptr)) return;
    remember(stream);
    npualloc_record_stream(ptr.get_context(), stream.stream(false));
  }

  void eraseStream(const c10::DataPtr& ptr, c10_npu::NPUStream stream) override {
    if (!is_ours(ptr)) {
      TORCH_WARN_ONCE("npualloc: eraseStream: the tensor's memory is not npualloc's; nothing erased");
      return;
    }
    // torch_npu's rule: only when the block was allocated on the current stream (the one
    // HCCL's wait was queued on); otherwise a new tensor there could reuse the block
    // before the collective completed.
    int device = stream.device_index();
    check(npualloc_erase_stream_on_current(ptr.get_context(), stream.stream(false), current_stream(device)),
          "eraseStream");
  }

  void eraseStreamWithBlockPtr(void* block_ptr, c10_npu::NPUStream stream, void* work_ptr) override {
    TORCH_CHECK(block_ptr != nullptr, "npualloc: eraseStreamWithBlockPtr: invalid block pointer");
    TORCH_CHECK(work_ptr != nullptr, "npualloc: eraseStreamWithBlockPtr: invalid HCCL work pointer");
    // npualloc erases the HCCL stream's use only if `work` is still the block's last and
    // the block was allocated on the current stream; otherwise nothing (torch_npu's rule).
    check(npualloc_erase_stream_for_work(block_ptr, stream.stream(false), work_ptr,
                                         current_stream(stream.device_index())),
          "eraseStreamWithBlockPtr");
  }

  void* getBlockPtr(const c10::DataPtr& ptr) override { return is_ours(ptr) ? ptr.get_context() : nullptr; }

  void recordHcclWorkForBlock(void* block_ptr, void* work_ptr) override {
    // getBlockPtr gives no block for memory that is not npualloc's: nothing to remember.
    if (block_ptr == nullptr) return;
    check(npualloc_record_hccl_work(block_ptr, work_ptr), "recordHcclWorkForBlock");
  }

  NPU::SnapshotInfo snapshot(c10::MempoolId_t pool) override {
    count(kSnapshot);
    Engine& e = engine();
    NPU::SnapshotInfo out;
    std::vector<size_t> active = npualloc_shim::fill_segments(out.segments, pool, e.history);
    int n = std::max(npualloc_device_count(), 0);
    for (int d = 0; d < n; ++d)
      e.history.record_snapshot(d, d < static_cast<int>(active.size()) ? active[d] : 0, pool);
    out.device_traces = e.history.traces(static_cast<size_t>(n));
    return out;
  }

  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t pool,
                           std::function<bool(aclrtStream)> filter) override {
    count(kBeginPool);
    engine().router.begin(device, pool, std::move(filter), current_stream(device));
  }

  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t pool) override {
    count(kEndPool);
    engine().router.end(device, pool);
  }

  // Reached from NPUGraph's destructor: warns rather than throws.
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t pool) override {
    count(kReleasePool);
    npualloc_shim::warn_if_failed(npualloc_release_pool(device, pool.first, pool.second), "releasePool");
  }

  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t pool) override {
    return npualloc_shim::pool_use_count(device, pool);
  }

  // npualloc never serves an allocation outside a pool from the pool's memory: false
  // (what MemPool's destructor sets) is its behaviour; true is refused.
  void setUseOnOOM(c10::DeviceIndex, c10::MempoolId_t, bool use_on_oom) override {
    if (use_on_oom)
      unsupported("setUseOnOOM (MemPool(use_on_oom=True))",
                  "npualloc never serves an allocation outside a pool from the pool's memory");
  }

  void setNoSplit(c10::DeviceIndex, c10::MempoolId_t) override {
    unsupported("setNoSplit (MemPool(no_split=True))", "npualloc splits the segments of every pool");
  }

  bool hasCapturesUnderway(c10::DeviceIndex device) override {
    bool underway = false;
    check(npualloc_captures_underway(device, &underway), "hasCapturesUnderway");
    return underway;
  }

  void markCaptureBegin(c10::DeviceIndex device) override {
    count(kCaptureBegin);
    check(npualloc_capture_begin(device), "markCaptureBegin");
  }

  void markCaptureEnd(c10::DeviceIndex device) override {
    count(kCaptureEnd);
    check(npualloc_capture_end(device), "markCaptureEnd");
  }

  void FreeDeviceCachedMemory(int device) override {
    check(npualloc_empty_cache_device(device), "FreeDeviceCachedMemory");
  }

  std::string name() override { return "npualloc"; }

  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t pool,
                                const std::unordered_set<void*>& expected) override {
    count(kCheckLive);
    return npualloc_shim::check_live(device, pool, expected);
  }

  NPU::ShareableHandle shareIpcHandle(void*) override {
    unsupported("shareIpcHandle", "npualloc does not share device memory between processes");
  }

  std::shared_ptr<void> getIpcDevPtr(std::string) override {
    unsupported("getIpcDevPtr", "npualloc does not share device memory between processes");
  }

  bool isHistoryEnabled() override { return engine().history.enabled(); }

  void recordHistory(bool enabled, NPU::CreateContextFn recorder, size_t max_entries,
                     NPU::RecordContext when) override {
    count(kRecordHistory);
    engine().history.record_history(enabled, recorder, max_entries, when, true, {});
  }

  void attachOutOfMemoryObserver(NPU::OutOfMemoryObserver observer) override {
    engine().oom.attach(std::move(observer));
  }

  // torch_npu calls these observers when its throw_on_npumalloc_oom policy rejects an
  // allocation before trying it; npualloc has no such policy (num_oom_rejections is
  // always 0), so the observer is kept and never called.
  void attachOomRejectionObserver(NPU::OomRejectionObserver observer) override {
    std::lock_guard<std::mutex> lock(rejection_mu_);
    rejection_observers_.push_back(std::move(observer));
  }

  bool checkUceInMemPool(int) override { unsupported("checkUceInMemPool", kNoUce); }
  bool checkBlockIsSafe(const c10::DataPtr&) override { unsupported("checkBlockIsSafe", kNoUce); }
  void markAllBlockUnsafe(int) override { unsupported("markAllBlockUnsafe", kNoUce); }
  void updateBlockToSafe(const c10::DataPtr&) override { unsupported("updateBlockToSafe", kNoUce); }
  void cleanEvent() override { unsupported("cleanEvent", kNoUce); }

  void buildServerMemMapForHccl(int, std::shared_ptr<c10d_npu::HCCLComm>) override {
    unsupported("buildServerMemMapForHccl (HCCL zero copy)",
                "npualloc does not map its memory for HCCL peers; unset the HCCL zero-copy settings");
  }

  std::shared_ptr<NPU::AllocatorState> getCheckpointState(c10::DeviceIndex device, c10::MempoolId_t id) override {
    count(kGetCheckpoint);
    return npualloc_shim::checkpoint<NPU::AllocatorState>(device, id);
  }

  NPU::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<NPU::AllocatorState> state) override {
    count(kSetCheckpoint);
    return npualloc_shim::restore<NPU::AllocatorState, NPU::CheckpointDelta>(device, state, &raw_deleter_fn, kDevice);
  }

  void attachAllocatorTraceTracker(NPU::AllocatorTraceTracker tracker) override {
    engine().history.attach_tracker(std::move(tracker));
  }

  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t pool,
                          std::shared_ptr<NPU::NPUAllocator> allocator) override {
    if (allocator && allocator.get() != this)
      unsupported("createOrIncrefPool with another allocator (MemPool(allocator=...))",
                  "npualloc's pools take their memory from npualloc");
    check(npualloc_pool_incref(device, pool.first, pool.second), "createOrIncrefPool");
  }

 private:
  static constexpr const char* kNoUce =
      "npualloc does not track uncorrectable memory errors (UCE); torch_npu's UCE recovery needs "
      "torch_npu's own allocator";

  std::mutex rejection_mu_;
  std::vector<NPU::OomRejectionObserver> rejection_observers_;
};

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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // The allocator, as torch_npu._C._npu_NPUAllocator (the type torch_npu registered for
  // std::shared_ptr<NPUAllocator>), for torch_npu._C._npu_changeCurrentAllocator.
  m.def("allocator", [] {
    // Never destroyed: torch_npu keeps its own reference until exit.
    static auto* a = new std::shared_ptr<NPU::NPUAllocator>(std::make_shared<NpuallocAllocator>());
    return *a;
  });
  // After the swap: c10::GetAllocator(PrivateUse1) is torch_npu's native object until
  // set; returns whether it is npualloc's now.
  m.def("set_device_allocator", [] {
    NPU::NPUAllocator* a = NPU::get();
    c10::SetAllocator(kDevice, a, std::numeric_limits<uint8_t>::max());
    return c10::GetAllocator(kDevice) == a;
  });
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
  m.def("method_calls", [] {
    py::dict d;
    for (int i = 0; i < kCounted; ++i) d[kCountedNames[i]] = g_calls[i].load();
    return d;
  });
  // For tests: HCCL's multi-stream memory reuse (ProcessGroupHCCL, erase-record-stream
  // mode with its optimisation) as torch_npu calls it, through the current allocator:
  // the tensor is recorded on the HCCL stream and the block remembered for `work`
  // (returns the block handle); then, after the tensor died, the HCCL stream's use is
  // erased for `work`.
  m.def("test_hccl_record", [](const at::Tensor& t, int64_t stream_id, int64_t device_index, int64_t device_type,
                               uint64_t work) {
    c10_npu::NPUStream stream(c10::Stream::unpack3(stream_id, static_cast<c10::DeviceIndex>(device_index),
                                                   static_cast<c10::DeviceType>(device_type)));
    const c10::DataPtr& dp = t.storage().data_ptr();
    NPU::recordStream(dp, stream);
    void* block = NPU::getBlockPtr(dp);
    NPU::recordHcclWorkForBlock(block, reinterpret_cast<void*>(work));
    return reinterpret_cast<uint64_t>(block);
  });
  m.def("test_hccl_erase", [](uint64_t block, int64_t stream_id, int64_t device_index, int64_t device_type,
                              uint64_t work) {
    c10_npu::NPUStream stream(c10::Stream::unpack3(stream_id, static_cast<c10::DeviceIndex>(device_index),
                                                   static_cast<c10::DeviceType>(device_type)));
    NPU::eraseStreamWithBlockPtr(reinterpret_cast<void*>(block), stream, reinterpret_cast<void*>(work));
  });
  // For tests: torch_npu's raw_deleter of the current allocator is npualloc's.
  m.def("deleter_is_npualloc", [] { return NPU::get()->raw_deleter() == &raw_deleter_fn; });
}
