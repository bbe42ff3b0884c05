// npualloc as torch.cuda's complete allocator: a subclass of torch's abstract
// c10::cuda::CUDACachingAllocator::CUDAAllocator over npualloc's C ABI (npualloc's CUDA
// backend), so that graph trees (torch.compile(mode="reduce-overhead")), checkpoints,
// snapshots and memory history work with npualloc installed.
//
// Compiled by npualloc.install_cuda() with torch.utils.cpp_extension.load (C++20)
// against the installed torch's headers and the CUDA runtime headers (a CUDA toolkit, or
// the nvidia-cuda-runtime wheel torch depends on), linked against libc10_cuda (and
// through it the CUDA runtime). The interface is torch 2.14's (install_cuda() refuses
// other versions). Checked with torch 2.14.0's CUDA build on npualloc's simulated
// device (tests/torch_npu/scenarios/cuda_shim.py); no GPU ran it here.
//
// Installing (npualloc.install_cuda()): torch._C._cuda_changeCurrentAllocator
// (refused once torch's allocator is initialized; stores the pointer in the exported
// c10::cuda::CUDACachingAllocator::allocator), then c10::SetAllocator(CUDA).
//
// Every virtual method of CUDAAllocator, c10::DeviceAllocator and c10::Allocator is
// implemented with PyTorch's meaning or raises one error naming npualloc and the method,
// except the memory-metadata hooks (setUserMetadata, annotateMemory), which keep torch's
// own answer for a backend without them: a warning naming npualloc, and
// supportsUserMetadata() false. The machinery shared with the torch_npu shim is
// complete_allocator.h.
#include <torch/extension.h>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/combined_traceback.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "complete_allocator.h"
#include "npualloc.h"

namespace {

namespace CCA = c10::cuda::CUDACachingAllocator;
using npualloc_shim::check;
using npualloc_shim::unsupported;

constexpr c10::DeviceType kDevice = c10::DeviceType::CUDA;

// The compile context inductor pushes (pushCompileContext), per thread, for trace entries.
std::vector<std::string>& compile_contexts() {
  thread_local std::vector<std::string> stack;
  return stack;
}

struct CudaTraits {
  using TraceEntry = CCA::TraceEntry;
  using RecordContext = CCA::RecordContext;
  using CreateContextFn = CCA::CreateContextFn;
  using AllocatorTraceTracker = CCA::AllocatorTraceTracker;

  static TraceEntry make_entry(TraceEntry::Action action, int device, uint64_t addr, size_t size, void* stream,
                               c10::MempoolId_t pool, std::shared_ptr<c10::GatheredContext> ctx) {
    auto& cc = compile_contexts();
    return TraceEntry(action, static_cast<c10::DeviceIndex>(device), static_cast<size_t>(addr), size, stream, pool,
                      c10::getApproximateTime(), std::move(ctx), cc.empty() ? std::string() : cc.back());
  }
};

// The process-wide state behind the allocator object, never destroyed (tensors may be
// freed through the deleter while static objects are torn down at exit).
struct Engine {
  npualloc_shim::PoolRouter<cudaStream_t> router;
  npualloc_shim::History<CudaTraits> history;
  npualloc_shim::OomObservers<CCA::OutOfMemoryObserver> oom;
  c10::ApproximateClockToUnixTimeConverter clock;
  std::mutex annotations_mu;
  std::vector<c10::CachingDeviceAllocator::AnnotationEntry> annotations;
  std::atomic<bool> initialized{false};
};

Engine& engine() {
  static Engine* e = new Engine();
  return *e;
}

void nothing_before_filters(int, cudaStream_t) {}

void check_device(int device, const char* method) {
  int n = npualloc_device_count();
  TORCH_CHECK(device >= 0 && device < n, std::string("npualloc: ") + method + ": invalid device " +
                                             std::to_string(device) + " (" + std::to_string(n) + " device(s))");
}

int current_device() {
  c10::DeviceIndex device = -1;
  C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
  return device;
}

cudaStream_t current_stream(int device) {
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
}

// Allocates on `device` for `stream`, routed to a graph pool if an open
// beginAllocateToPool filter accepts it; errors are torch's.
void* malloc_block(size_t size, int device, cudaStream_t stream) {
  if (size == 0) return nullptr;
  Engine& e = engine();
  npualloc_shim::ContextScope scope(e.history.gather(CCA::RecordContext::STATE), false);
  std::optional<c10::MempoolId_t> pool;
  if (e.router.any_open()) pool = e.router.route(device, stream, nothing_before_filters);
  return npualloc_shim::malloc_routed(size, device, static_cast<npualloc_stream>(stream), pool);
}

void free_block(void* ptr, bool raise) {
  if (ptr == nullptr) return;
  npualloc_shim::ContextScope scope(engine().history.gather(CCA::RecordContext::ALL), true);
  int rc = npualloc_shim::free_reporting(ptr);
  if (raise) {
    check(rc, "raw_delete");
  } else {
    npualloc_shim::warn_if_failed(rc, "free");
  }
}

// The one deleter of every DataPtr npualloc hands out (raw_deleter()); never throws.
void raw_deleter_fn(void* ptr) {
  try {
    free_block(ptr, false);
  } catch (const std::exception& ex) {
    TORCH_WARN(std::string("npualloc: free: ") + ex.what());
  } catch (...) {
  }
}

bool is_ours(const c10::DataPtr& ptr) { return ptr.get() != nullptr && ptr.get_deleter() == &raw_deleter_fn; }

// The GPU check's negative control (scripts/gpu_check.py, npualloc-norecord): with
// this set, recordStream does nothing, so its stream checks must see wrong data.
std::atomic<bool> g_ignore_record_stream{false};

class NpuallocCudaAllocator final : public CCA::CUDAAllocator {
 public:
  using CCA::CUDAAllocator::recordStream;

  // -- c10::Allocator --
  c10::DataPtr allocate(size_t size) override {
    int device = current_device();
    void* p = malloc_block(size, device, current_stream(device));
    return {p, p, &raw_deleter_fn, c10::Device(kDevice, static_cast<c10::DeviceIndex>(device))};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &raw_deleter_fn; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  // -- c10::DeviceAllocator --
  bool initialized() override { return engine().initialized.load(); }

  void emptyCache(c10::MempoolId_t pool) override {
    if (pool == c10::MempoolId_t{0, 0}) {
      npualloc_empty_cache_all();
      return;
    }
    // One pool's cached memory: reached from MemPool's destructor, so a failure warns.
    int n = npualloc_device_count();
    for (int d = 0; d < n; ++d) {
      int rc = npualloc_empty_cache_pool(d, pool.first, pool.second);
      if (rc != NPUALLOC_ERR_UNKNOWN_POOL) npualloc_shim::warn_if_failed(rc, "emptyCache");  // not on d: nothing
    }
  }

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    return npualloc_shim::device_stats(device);
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check(npualloc_reset_accumulated_stats(device), "resetAccumulatedStats");
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    check_device(device, "resetPeakStats");
    npualloc_reset_peak_stats(device);
  }

  // -- CUDAAllocator --
  void* raw_alloc(size_t nbytes) override {
    int device = current_device();
    return malloc_block(nbytes, device, current_stream(device));
  }

  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    return malloc_block(nbytes, current_device(), stream);
  }

  void raw_delete(void* ptr) override { free_block(ptr, true); }

  void init(int device_count) override {
    npualloc_init(device_count);
    TORCH_CHECK(npualloc_device_count() >= 0, "npualloc: init: " + npualloc_shim::last_error());
    engine().initialized.store(true);
  }

  double getMemoryFraction(c10::DeviceIndex device) override {
    double f = 1.0;
    check(npualloc_get_memory_fraction(device, &f), "getMemoryFraction");
    return f;
  }

  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    check_device(device, "setMemoryFraction");
    TORCH_CHECK(fraction >= 0.0 && fraction <= 1.0,
                "npualloc: setMemoryFraction: invalid fraction " + std::to_string(fraction) + ", not within [0, 1]");
    npualloc_shim::FailureWatch watch;
    npualloc_set_memory_fraction(fraction, device);
    if (watch.failed()) check(NPUALLOC_ERR_INVALID_ARGUMENT, "setMemoryFraction");
  }

  // The mapped size of each expandable segment of the device, with its stream.
  std::vector<CCA::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) override {
    std::vector<c10::CachingDeviceAllocator::SegmentInfo> segments;
    npualloc_shim::fill_segments(segments, c10::MempoolId_t{0, 0}, engine().history);
    std::vector<CCA::StreamSegmentSize> out;
    for (const auto& s : segments)
      if (s.device == device && s.is_expandable)
        out.emplace_back(static_cast<cudaStream_t>(s.stream), !s.is_large, s.total_size);
    return out;
  }

  void enable(bool value) override {
    if (!value)
      unsupported("enable(False) (an allocator that does not cache)",
                  "npualloc always caches; set NPUALLOC_CONF or use torch's allocator instead");
  }

  bool isEnabled() const override { return true; }

  void cacheInfo(c10::DeviceIndex device, size_t* largest_block) override {
    size_t cached_and_free = 0;
    check(npualloc_cache_info(device, &cached_and_free, largest_block), "cacheInfo");
  }

  void* getBaseAllocation(void* ptr, size_t* size) override {
    void* base = npualloc_base_alloc(ptr, size);
    TORCH_CHECK(base != nullptr, "npualloc: getBaseAllocation: " + npualloc_shim::last_error());
    return base;
  }

  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    // An empty tensor's storage has no block, and memory of another allocator is not
    // npualloc's to track: PyTorch's allocator skips both.
    if (!is_ours(ptr) || g_ignore_record_stream.load(std::memory_order_relaxed)) return;
    npualloc_record_stream(ptr.get_context(), static_cast<npualloc_stream>(stream.stream()));
  }

  CCA::SnapshotInfo snapshot(c10::MempoolId_t pool, bool include_traces) override {
    Engine& e = engine();
    CCA::SnapshotInfo out;
    std::vector<size_t> active = npualloc_shim::fill_segments(out.segments, pool, e.history);
    int n = std::max(npualloc_device_count(), 0);
    for (int d = 0; d < n; ++d)
      e.history.record_snapshot(d, d < static_cast<int>(active.size()) ? active[d] : 0, pool);
    if (include_traces) {
      out.device_traces = e.history.traces(static_cast<size_t>(n));
      auto to_us = e.clock.makeConverter();
      for (auto& list : out.device_traces)
        for (auto& te : list) te.time_.t_ = to_us(te.time_.approx_t_);
      std::lock_guard<std::mutex> lock(e.annotations_mu);
      out.external_annotations = e.annotations;
      for (auto& ae : out.external_annotations) ae.time_.t_ = to_us(ae.time_.approx_t_);
    }
    return out;
  }

  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t pool,
                           std::function<bool(cudaStream_t)> filter) override {
    engine().router.begin(device, pool, std::move(filter), current_stream(device));
  }

  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t pool) override { engine().router.end(device, pool); }

  void markCaptureBegin(c10::DeviceIndex device) override { check(npualloc_capture_begin(device), "markCaptureBegin"); }

  void markCaptureEnd(c10::DeviceIndex device) override { check(npualloc_capture_end(device), "markCaptureEnd"); }

  // Reached from CUDAGraph's destructor: warns rather than throws.
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t pool) override {
    npualloc_shim::warn_if_failed(npualloc_release_pool(device, pool.first, pool.second), "releasePool");
  }

  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t pool) override {
    return npualloc_shim::pool_use_count(device, pool);
  }

  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t pool,
                          std::shared_ptr<CCA::CUDAAllocator> allocator) override {
    if (allocator && allocator.get() != this)
      unsupported("createOrIncrefPool with another allocator (MemPool(allocator=...))",
                  "npualloc's pools take their memory from npualloc");
    check(npualloc_pool_incref(device, pool.first, pool.second), "createOrIncrefPool");
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

  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t pool,
                                const std::unordered_set<void*>& expected) override {
    return npualloc_shim::check_live(device, pool, expected);
  }

  CCA::ShareableHandle shareIpcHandle(void*) override {
    unsupported("shareIpcHandle", "npualloc does not share device memory between processes");
  }

  std::shared_ptr<void> getIpcDevPtr(std::string) override {
    unsupported("getIpcDevPtr", "npualloc does not share device memory between processes");
  }

  bool isHistoryEnabled() override { return engine().history.enabled(); }

  std::shared_ptr<c10::GatheredContext> getContextForPointer(const void* ptr) override {
    return engine().history.block_context(reinterpret_cast<uint64_t>(ptr));
  }

  void recordHistory(bool enabled, CCA::CreateContextFn recorder, size_t max_entries, CCA::RecordContext when,
                     bool clear_history, const std::vector<std::string>& skip_actions) override {
    std::vector<int> skip;
    for (const auto& a : skip_actions) skip.push_back(static_cast<int>(c10::CachingDeviceAllocator::parseTraceEntryAction(a)));
    engine().history.record_history(enabled, recorder, max_entries, when, clear_history, std::move(skip));
    if (clear_history) {
      std::lock_guard<std::mutex> lock(engine().annotations_mu);
      engine().annotations.clear();
    }
  }

  // Kept for snapshots while history is recorded, as PyTorch's allocator keeps them.
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override {
    Engine& e = engine();
    if (!e.history.enabled()) return;
    c10::DeviceIndex device = -1;
    if (c10::cuda::GetDevice(&device) != cudaSuccess) device = 0;
    c10::CachingDeviceAllocator::AnnotationEntry ae(device, c10::getApproximateTime());
    for (const auto& [k, v] : md) ae.recordUserMetadata(k, v);
    std::lock_guard<std::mutex> lock(e.annotations_mu);
    e.annotations.push_back(std::move(ae));
  }

  void pushCompileContext(std::string& md) override { compile_contexts().push_back(md); }

  void popCompileContext() override {
    auto& cc = compile_contexts();
    if (!cc.empty()) cc.pop_back();
  }

  void attachOutOfMemoryObserver(CCA::OutOfMemoryObserver observer) override {
    engine().oom.attach(std::move(observer));
  }

  // Called by PyTorch's allocator when a policy rejects an allocation before trying it;
  // npualloc has no such policy (num_oom_rejections is always 0): kept, never called.
  void attachOomRejectionObserver(CCA::OomRejectionObserver observer) override {
    std::lock_guard<std::mutex> lock(rejection_mu_);
    rejection_observers_.push_back(std::move(observer));
  }

  void attachAllocatorTraceTracker(CCA::AllocatorTraceTracker tracker) override {
    engine().history.attach_tracker(std::move(tracker));
  }

  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    c10::cuda::CUDAGuard guard(dev);
    cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();  // already enabled: clear the error, as PyTorch does
    } else {
      C10_CUDA_CHECK(err);
    }
  }

  // cudaMemcpyAsync unless the copy crosses devices without peer access, where memory
  // mapped by npualloc's expandable segments needs the peer copy.
  cudaError_t memcpyAsync(void* dst, int dst_device, const void* src, int src_device, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override {
    if (p2p_enabled || dst_device == src_device)
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, count, stream);
  }

  std::shared_ptr<CCA::AllocatorState> getCheckpointState(c10::DeviceIndex device, c10::MempoolId_t id) override {
    return npualloc_shim::checkpoint<CCA::AllocatorState>(device, id);
  }

  CCA::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<CCA::AllocatorState> state) override {
    return npualloc_shim::restore<CCA::AllocatorState, CCA::CheckpointDelta>(device, state, &raw_deleter_fn, kDevice);
  }

  c10::DataPtr allocateWithAddress(size_t, void*) override {
    unsupported("allocateWithAddress", "npualloc chooses the addresses of its allocations");
  }

  std::string name() override { return "npualloc"; }

 private:
  std::mutex rejection_mu_;
  std::vector<CCA::OomRejectionObserver> rejection_observers_;
};

std::shared_ptr<CCA::CUDAAllocator>& the_allocator() {
  static auto* a = new std::shared_ptr<CCA::CUDAAllocator>(std::make_shared<NpuallocCudaAllocator>());
  return *a;
}

// ---- test entry points (the simulated device, no GPU) -------------------------------
// torch.empty on CUDA needs a GPU; these call the allocator the way torch does, with
// the device and stream given (streams are npualloc_sim_create_stream handles).

cudaStream_t as_stream(uint64_t s) { return reinterpret_cast<cudaStream_t>(s); }

// Python stacks, as torch.cuda.memory._record_memory_history(stacks="python") gathers them.
std::shared_ptr<c10::GatheredContext> gather_python() { return torch::CapturedTraceback::gather(true, true, false); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // The allocator, as torch._C._cuda_CUDAAllocator (the type torch registered for
  // std::shared_ptr<CUDAAllocator>), for torch.cuda.memory.change_current_allocator.
  m.def("allocator", [] { return the_allocator(); });
  // After the swap: c10::GetAllocator(CUDA) becomes npualloc's too; returns whether it is.
  m.def("set_device_allocator", [] {
    CCA::CUDAAllocator* a = CCA::get();
    c10::SetAllocator(kDevice, a, std::numeric_limits<uint8_t>::max());
    return c10::GetAllocator(kDevice) == a;
  });
  m.def("ignore_record_stream", [](bool on) { g_ignore_record_stream.store(on); });
  m.def("test_malloc", [](size_t size, int device, uint64_t stream) {
    return reinterpret_cast<uint64_t>(malloc_block(size, device, as_stream(stream)));
  });
  m.def("test_free", [](uint64_t ptr) { the_allocator()->raw_delete(reinterpret_cast<void*>(ptr)); });
  // A DataPtr as allocate() makes it, wrapped in a CUDA storage of `size` bytes.
  m.def("test_storage", [](size_t size, int device, uint64_t stream) {
    void* p = malloc_block(size, device, as_stream(stream));
    c10::DataPtr dp(p, p, &raw_deleter_fn, c10::Device(kDevice, static_cast<c10::DeviceIndex>(device)));
    auto impl = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), size, std::move(dp),
                                                      nullptr, false);
    return c10::Storage(std::move(impl));
  });
  m.def("test_begin_pool", [](int device, c10::MempoolId_t pool, uint64_t stream) {
    // beginAllocateToPool with `stream` as the current stream (asking torch for it
    // needs a GPU).
    cudaStream_t s = as_stream(stream);
    engine().router.begin(device, pool, [s](cudaStream_t t) { return t == s; }, s);
  });
  // torch._C._cuda_record_memory_history needs a driver: the allocator's recordHistory
  // as it calls it (contexts of allocations and frees, `max_entries` per device).
  m.def("test_record_history", [](bool enabled, size_t max_entries) {
    the_allocator()->recordHistory(enabled, enabled ? &gather_python : nullptr, max_entries,
                                   enabled ? CCA::RecordContext::ALL : CCA::RecordContext::NEVER, true, {});
  });
}
