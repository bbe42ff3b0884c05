// npualloc as a complete PyTorch device allocator: the machinery the torch_npu shim
// (torch_npu_shim.cpp, a c10_npu::NPUCachingAllocator::NPUAllocator) and the torch.cuda
// shim (cuda_shim.cpp, a c10::cuda::CUDACachingAllocator::CUDAAllocator) share.
//
// Both interfaces have the same shape (they are copies of one another), so each piece
// here is a template over the flavour's types (`Traits`, defined by each shim):
//
// - Errors. A method npualloc cannot honour raises ONE c10::Error (RuntimeError in
//   Python) naming npualloc and the method (`unsupported`); a failed C ABI call raises
//   one naming the method and carrying npualloc's last error (`check`). Paths torch
//   reaches from destructors (a DataPtr's deleter, NPUGraph::reset's releasePool)
//   warn instead: an exception there would terminate the process.
//
// - Graph-pool routing (`PoolRouter`). beginAllocateToPool(device, pool, filter) adds
//   one use of the pool in npualloc (npualloc_pool_incref) and keeps the filter; at each
//   allocation while any is open on the device, the filters are asked in the order they
//   were opened and the first that accepts the allocating stream routes the request to
//   its pool (npualloc_malloc_in_pool), as PyTorch's caching allocator does. A filter may
//   look at the stream (a capture: torch_npu's NPUGraph asks the runtime which capture
//   the stream belongs to) or at the thread (_npu_beginAllocateCurrentThreadToPool,
//   use_mem_pool): only a per-request decision serves both. endAllocateToPool drops the
//   filter; releasePool drops the use (npualloc_release_pool); the pool's memory stays
//   while any use is left.
//
// - History (`History`). torch's _record_memory_history hands the allocator a
//   CreateContextFn (a Python/C++ stack gatherer). npualloc reports what happens
//   (alloc, free_requested, free_completed, segment_alloc/free/map/unmap, oom) through a
//   trace callback it calls with its locks held; the callback must not take the GIL or
//   call npualloc. So the shim gathers the context BEFORE calling npualloc, outside
//   every lock, into a thread-local slot, and the callback (on the same thread for the
//   events a call causes) attaches it: to the trace entry (RecordContext ALLOC and
//   above), to the block (STATE and above: snapshot's frames of live blocks) and to the
//   segment. The trace is a ring of `max_entries` per device, as PyTorch keeps it; trace
//   trackers (attachAllocatorTraceTracker) see every entry.
//
// - OOM observers (`OomObservers`): npualloc calls one C function after an allocation
//   failed with out of memory, outside its locks, on the allocating thread; it calls
//   every observer torch attached, with (device, bytes requested, capacity, free).
//
// - Checkpoints (`PoolState`): the AllocatorState subclass that owns npualloc's opaque
//   npualloc_pool_state; setCheckpointPoolState hands npualloc's freed and re-created
//   blocks back as a CheckpointDelta whose DataPtrs carry the allocator's one
//   raw_deleter (graph trees compare deleters: _has_Standard_Deleter).
//
// - Statistics (`device_stats`): npualloc_device_stats as torch's DeviceStats, every
//   field, reserved_bytes_by_private_pools included.
//
// - Snapshot (`fill_segments`): npualloc's segments (with their owner pool, stream and
//   blocks tiling them in address order) as torch's SegmentInfo/BlockInfo, the frames
//   from History; device_traces has one list per device (torch_npu's binding indexes it
//   by device without a check).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/Exception.h>

#include "npualloc.h"

namespace npualloc_shim {

// ---- errors ----------------------------------------------------------------------

inline std::string last_error() {
  const char* e = npualloc_last_error();
  return e ? std::string(e) : std::string("unknown error");
}

// The one error of a method npualloc does not implement.
[[noreturn]] inline void unsupported(const char* method, const std::string& why) {
  TORCH_CHECK(false, std::string("npualloc does not support ") + method + ": " + why);
}

// A failed C ABI call as torch's error: "npualloc: <method>: <npualloc's message>".
inline void check(int rc, const char* method) {
  if (rc != NPUALLOC_OK) TORCH_CHECK(false, std::string("npualloc: ") + method + ": " + last_error());
}

// A failed C ABI call as a warning, on paths torch reaches from destructors.
inline void warn_if_failed(int rc, const char* method) {
  if (rc != NPUALLOC_OK) TORCH_WARN(std::string("npualloc: ") + method + ": " + last_error());
}

inline std::string pool_name(c10::MempoolId_t pool) {
  return "(" + std::to_string(pool.first) + ", " + std::to_string(pool.second) + ")";
}

// ---- statistics --------------------------------------------------------------------

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

// Fills reserved_bytes_by_private_pools: one entry per graph pool that reserved memory,
// kept with current 0 after the pool's memory went back, as PyTorch keeps it.
inline void copy_private_pools(int device, c10::CachingDeviceAllocator::DeviceStats& out) {
  std::vector<npualloc_private_pool_stats> pools(4);
  size_t n = 0;
  for (;;) {
    check(npualloc_get_private_pool_stats(device, pools.data(), pools.size(), &n), "getDeviceStats");
    if (n <= pools.size()) break;
    pools.resize(n);  // more pools than room: read again, all of them
  }
  for (size_t i = 0; i < n; ++i) {
    c10::MempoolId_t id{pools[i].id_hi, pools[i].id_lo};
    copy_array(out.reserved_bytes_by_private_pools[id], pools[i].reserved_bytes);
  }
}

// npualloc_device_stats -> torch's DeviceStats, every field (num_oom_rejections 0:
// npualloc rejects no allocation preemptively).
inline c10::CachingDeviceAllocator::DeviceStats device_stats(int device) {
  npualloc_device_stats s{};
  check(npualloc_get_device_stats(device, &s), "getDeviceStats");
  c10::CachingDeviceAllocator::DeviceStats out;
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
  copy_private_pools(device, out);
  return out;
}

// ---- graph-pool routing ------------------------------------------------------------

template <typename Stream>
class PoolRouter {
 public:
  using Filter = std::function<bool(Stream)>;

  // Whether any allocation scope is open (read on every allocation, without the lock).
  bool any_open() const { return open_.load(std::memory_order_acquire) > 0; }

  // `current` is the device's current stream (the capture stream, before the capture
  // begins): npualloc settles its lending fences there.
  void begin(int device, c10::MempoolId_t pool, Filter filter, npualloc_stream current) {
    check(npualloc_pool_begin(device, pool.first, pool.second, current), "beginAllocateToPool");
    std::lock_guard<std::mutex> lock(mu_);
    scopes_.push_back(Scope{device, pool, std::move(filter)});
    open_.fetch_add(1, std::memory_order_release);
  }

  // Ends the oldest open scope of the pool on the device.
  void end(int device, c10::MempoolId_t pool) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = scopes_.begin(); it != scopes_.end(); ++it) {
      if (it->device != device || it->pool != pool) continue;
      scopes_.erase(it);
      open_.fetch_sub(1, std::memory_order_release);
      return;
    }
    TORCH_CHECK(false, "npualloc: endAllocateToPool: nothing allocates to pool " + pool_name(pool) +
                           " on device " + std::to_string(device));
  }

  // The pool of the first open scope on `device` whose filter accepts `stream`.
  // `before_filters(device, stream)` runs first, outside the lock (torch_npu drains the
  // stream's task queue there, so that a join still queued is not missed).
  template <typename BeforeFilters>
  std::optional<c10::MempoolId_t> route(int device, Stream stream, BeforeFilters&& before_filters) {
    if (!any_open_on(device)) return std::nullopt;
    before_filters(device, stream);
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : scopes_)
      if (s.device == device && s.filter && s.filter(stream)) return s.pool;
    return std::nullopt;
  }

 private:
  struct Scope {
    int device;
    c10::MempoolId_t pool;
    Filter filter;
  };

  bool any_open_on(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : scopes_)
      if (s.device == device) return true;
    return false;
  }

  std::mutex mu_;
  std::vector<Scope> scopes_;
  std::atomic<int> open_{0};
};

// ---- allocation through the router -------------------------------------------------

// npualloc_malloc (or npualloc_malloc_in_pool when routed), with a failure thrown as
// torch's error carrying npualloc's message: c10::OutOfMemoryError for out of memory
// (Python sees torch.OutOfMemoryError), else c10::Error. Size 0 is NULL, no error.
inline void* malloc_routed(size_t size, int device, npualloc_stream stream,
                           std::optional<c10::MempoolId_t> pool) {
  if (size == 0) return nullptr;
  void* p = pool ? npualloc_malloc_in_pool(size, device, stream, pool->first, pool->second)
                 : npualloc_malloc(size, device, stream);
  if (p != nullptr) return p;
  std::string msg = last_error();
  // The C function's name the library puts first is no news to a Python user.
  for (const std::string function : {"npualloc_malloc: ", "npualloc_malloc_in_pool: "})
    if (msg.compare(0, function.size(), function) == 0) msg.erase(0, function.size());
  TORCH_CHECK_WITH(OutOfMemoryError, msg.find("out of memory") == std::string::npos, "npualloc: " + msg);
  // One string argument: formatting a size_t through c10::str crashed in a shim built
  // with a GPU machine's g++ against torch 2.11 (seen in cuda-gdb), strings did not.
  TORCH_CHECK(false, "npualloc could not allocate " + std::to_string(size) + " bytes: " + msg);
}

// Whether a call of one of the C ABI's void functions failed: a failure replaces this
// thread's last-error string (a new one is made before the old one goes, so its address
// changes), a success leaves it.
class FailureWatch {
 public:
  FailureWatch() : before_(npualloc_last_error()) {}
  bool failed() const { return npualloc_last_error() != before_; }

 private:
  const char* before_;
};

// Frees `ptr` (npualloc_free; the allocation's device and stream are npualloc's to
// find); NPUALLOC_ERR_UNKNOWN_POINTER for an unknown or already freed pointer.
inline int free_reporting(void* ptr) {
  FailureWatch watch;
  npualloc_free(ptr, 0, -1, nullptr);
  return watch.failed() ? NPUALLOC_ERR_UNKNOWN_POINTER : NPUALLOC_OK;
}

// ---- history -----------------------------------------------------------------------

// The context gathered by the current call, for the trace callback on this thread.
struct PendingContext {
  std::shared_ptr<c10::GatheredContext> ctx;
  bool is_free = false;  // gathered by a free (RecordContext ALL)
};

inline PendingContext& pending_context() {
  thread_local PendingContext p;
  return p;
}

// Sets this thread's pending context for the duration of one call into npualloc.
class ContextScope {
 public:
  ContextScope(std::shared_ptr<c10::GatheredContext> ctx, bool is_free) {
    if (!ctx) return;
    auto& p = pending_context();
    p.ctx = std::move(ctx);
    p.is_free = is_free;
    set_ = true;
  }
  ~ContextScope() {
    if (!set_) return;
    auto& p = pending_context();
    p.ctx.reset();
    p.is_free = false;
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  bool set_ = false;
};

// Traits: TraceEntry, RecordContext, CreateContextFn, AllocatorTraceTracker, and
//   static TraceEntry make_entry(typename TraceEntry::Action, int device, uint64_t addr,
//                                size_t size, void* stream, c10::MempoolId_t pool,
//                                std::shared_ptr<c10::GatheredContext> ctx);
template <typename Traits>
class History {
 public:
  using TraceEntry = typename Traits::TraceEntry;
  using RecordContext = typename Traits::RecordContext;
  using CreateContextFn = typename Traits::CreateContextFn;
  using Tracker = typename Traits::AllocatorTraceTracker;
  using Ctx = std::shared_ptr<c10::GatheredContext>;

  // A context at `level` if recording asks for it; gathers (Python stacks) outside every
  // lock of npualloc's or ours.
  Ctx gather(RecordContext level) const {
    CreateContextFn fn = recorder_.load(std::memory_order_acquire);
    if (fn == nullptr || static_cast<int>(when_.load(std::memory_order_acquire)) < static_cast<int>(level))
      return nullptr;
    return fn();
  }

  bool enabled() const { return enabled_.load(std::memory_order_acquire); }

  void record_history(bool enabled, CreateContextFn recorder, size_t max_entries, RecordContext when,
                      bool clear, std::vector<int> skip_actions) {
    TORCH_CHECK(!enabled || when == RecordContext::NEVER || recorder != nullptr,
                "npualloc: recordHistory: a context recorder is needed to record contexts");
    {
      std::lock_guard<std::mutex> lock(mu_);
      enabled_.store(enabled, std::memory_order_release);
      recorder_.store(enabled ? recorder : nullptr, std::memory_order_release);
      when_.store(enabled ? when : RecordContext::NEVER, std::memory_order_release);
      max_entries_ = std::max<size_t>(1, max_entries);
      skip_ = std::move(skip_actions);
      if (clear) {
        rings_.clear();
      } else {
        for (auto& r : rings_) r.resize_to(max_entries_);
      }
      if (!enabled) {
        block_ctx_.clear();
        segment_ctx_.clear();
      }
    }
    update_callback();
  }

  void attach_tracker(Tracker tracker) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      trackers_.push_back(std::move(tracker));
    }
    update_callback();
  }

  // Every entry of each device, oldest first, `devices` lists (at least).
  std::vector<std::vector<TraceEntry>> traces(size_t devices) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::vector<TraceEntry>> out(std::max(devices, rings_.size()));
    for (size_t d = 0; d < rings_.size(); ++d) rings_[d].copy_to(out[d]);
    return out;
  }

  Ctx block_context(uint64_t addr) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = block_ctx_.find(addr);
    return it == block_ctx_.end() ? nullptr : it->second;
  }

  Ctx segment_context(uint64_t addr) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = segment_ctx_.find(addr);
    return it == segment_ctx_.end() ? nullptr : it->second;
  }

  // A SNAPSHOT entry (addr 0, size the bytes active), as PyTorch records one per device.
  void record_snapshot(int device, size_t total_active, c10::MempoolId_t pool) {
    if (!enabled()) return;
    npualloc_trace_entry e{};
    e.device = device;
    e.size = total_active;
    e.pool_hi = pool.first;
    e.pool_lo = pool.second;
    add(TraceEntry::SNAPSHOT, e);
  }

  // npualloc's trace callback: noexcept, no exception may unwind into npualloc (Rust).
  static void on_trace(void* self, const npualloc_trace_entry* e) noexcept {
    if (self == nullptr || e == nullptr) return;
    try {
      static_cast<History*>(self)->add(action_of(e->action), *e);
    } catch (...) {
      // Dropping one trace entry is better than unwinding through npualloc.
    }
  }

 private:
  // A ring of at most `max` entries, as PyTorch's alloc_trace.
  struct Ring {
    std::vector<TraceEntry> entries;
    size_t next = 0;

    void push(TraceEntry te, size_t max) {
      if (entries.size() < max) {
        entries.push_back(std::move(te));
        return;
      }
      entries[next] = std::move(te);
      next = (next + 1) % max;
    }
    void copy_to(std::vector<TraceEntry>& out) const {
      out.insert(out.end(), entries.begin() + next, entries.end());
      out.insert(out.end(), entries.begin(), entries.begin() + next);
    }
    void resize_to(size_t max) {
      if (entries.size() <= max) return;
      std::vector<TraceEntry> kept;
      copy_to(kept);
      entries.assign(kept.end() - max, kept.end());
      next = 0;
    }
  };

  void update_callback() {
    bool want;
    {
      std::lock_guard<std::mutex> lock(mu_);
      want = enabled_.load() || !trackers_.empty();
    }
    // Outside our lock: npualloc takes its own locks to swap the callback, and the
    // callback takes ours under them.
    check(npualloc_set_trace_callback(want ? &History::on_trace : nullptr, want ? this : nullptr),
          "recordHistory");
  }

  // npualloc's NPUALLOC_TRACE_* as torch's TraceEntry::Action.
  static typename TraceEntry::Action action_of(int a) {
    switch (a) {
      case NPUALLOC_TRACE_ALLOC: return TraceEntry::ALLOC;
      case NPUALLOC_TRACE_FREE_REQUESTED: return TraceEntry::FREE_REQUESTED;
      case NPUALLOC_TRACE_FREE_COMPLETED: return TraceEntry::FREE_COMPLETED;
      case NPUALLOC_TRACE_SEGMENT_ALLOC: return TraceEntry::SEGMENT_ALLOC;
      case NPUALLOC_TRACE_SEGMENT_FREE: return TraceEntry::SEGMENT_FREE;
      case NPUALLOC_TRACE_SEGMENT_MAP: return TraceEntry::SEGMENT_MAP;
      case NPUALLOC_TRACE_SEGMENT_UNMAP: return TraceEntry::SEGMENT_UNMAP;
      default: return TraceEntry::OOM;
    }
  }

  void add(typename TraceEntry::Action action, const npualloc_trace_entry& e) {
    auto& pending = pending_context();
    std::lock_guard<std::mutex> lock(mu_);
    const bool keep_state = static_cast<int>(when_.load()) >= static_cast<int>(RecordContext::STATE);
    Ctx ctx;
    switch (action) {
      case TraceEntry::ALLOC:
        ctx = pending.is_free ? nullptr : pending.ctx;
        if (keep_state && ctx) block_ctx_[e.address] = ctx;
        break;
      case TraceEntry::FREE_REQUESTED:
      case TraceEntry::FREE_COMPLETED: {
        auto it = block_ctx_.find(e.address);
        ctx = pending.is_free && pending.ctx ? pending.ctx : (it == block_ctx_.end() ? nullptr : it->second);
        if (action == TraceEntry::FREE_COMPLETED && it != block_ctx_.end()) block_ctx_.erase(it);
        break;
      }
      case TraceEntry::SEGMENT_ALLOC:
      case TraceEntry::SEGMENT_MAP:
        ctx = pending.ctx;
        if (keep_state && ctx && action == TraceEntry::SEGMENT_ALLOC) segment_ctx_[e.address] = ctx;
        break;
      case TraceEntry::SEGMENT_FREE:
        segment_ctx_.erase(e.address);
        break;
      case TraceEntry::OOM:
        ctx = pending.ctx;
        break;
      default:
        break;
    }
    if (static_cast<int>(when_.load()) < static_cast<int>(RecordContext::ALLOC)) ctx = nullptr;
    TraceEntry te = Traits::make_entry(action, e.device, e.address, e.size, e.stream,
                                       c10::MempoolId_t{e.pool_hi, e.pool_lo}, std::move(ctx));
    for (auto& t : trackers_) t(te);
    if (!enabled_.load()) return;
    if (std::find(skip_.begin(), skip_.end(), static_cast<int>(action)) != skip_.end()) return;
    if (e.device < 0) return;
    if (rings_.size() <= static_cast<size_t>(e.device)) rings_.resize(e.device + 1);
    rings_[e.device].push(std::move(te), max_entries_);
  }

  std::mutex mu_;
  std::atomic<bool> enabled_{false};
  std::atomic<CreateContextFn> recorder_{nullptr};
  std::atomic<RecordContext> when_{RecordContext::NEVER};
  size_t max_entries_ = 1;
  std::vector<int> skip_;
  std::vector<Ring> rings_;
  std::vector<Tracker> trackers_;
  std::unordered_map<uint64_t, Ctx> block_ctx_;    // live blocks' allocation contexts
  std::unordered_map<uint64_t, Ctx> segment_ctx_;  // segments' allocation contexts
};

// ---- OOM observers -----------------------------------------------------------------

template <typename Observer>
class OomObservers {
 public:
  void attach(Observer observer) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      observers_.push_back(std::move(observer));
    }
    instance() = this;
    check(npualloc_set_oom_observer(&OomObservers::on_oom), "attachOutOfMemoryObserver");
  }

  // npualloc's OOM observer: outside npualloc's locks, on the allocating thread.
  static void on_oom(int device, size_t requested, size_t capacity, size_t free) noexcept {
    OomObservers* self = instance();
    if (self == nullptr) return;
    std::vector<Observer> observers;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      observers = self->observers_;
    }
    for (auto& o : observers) {
      try {
        o(device, requested, capacity, free);
      } catch (const std::exception& e) {
        TORCH_WARN(std::string("npualloc: an out-of-memory observer raised: ") + e.what());
      } catch (...) {
      }
    }
  }

 private:
  static OomObservers*& instance() {
    static OomObservers* self = nullptr;
    return self;
  }
  std::mutex mu_;
  std::vector<Observer> observers_;
};

// ---- checkpoints -------------------------------------------------------------------

// npualloc's checkpoint of one pool, as torch's AllocatorState.
template <typename AllocatorState>
struct PoolState final : AllocatorState {
  PoolState(int device, c10::MempoolId_t pool, npualloc_pool_state* state)
      : device(device), pool(pool), state(state) {}
  ~PoolState() override { npualloc_pool_state_destroy(state); }
  PoolState(const PoolState&) = delete;
  PoolState& operator=(const PoolState&) = delete;

  int device;
  c10::MempoolId_t pool;
  npualloc_pool_state* state;
};

template <typename AllocatorState>
std::shared_ptr<AllocatorState> checkpoint(int device, c10::MempoolId_t pool) {
  npualloc_pool_state* state = nullptr;
  check(npualloc_pool_checkpoint(device, pool.first, pool.second, &state), "getCheckpointState");
  return std::make_shared<PoolState<AllocatorState>>(device, pool, state);
}

// What npualloc_pool_restore reports, collected by noexcept C callbacks.
struct RestoreResult {
  std::vector<void*> freed;
  std::vector<void*> allocated;
  bool failed = false;

  static void on_freed(void* self, void* ptr) noexcept {
    auto* r = static_cast<RestoreResult*>(self);
    try {
      r->freed.push_back(ptr);
    } catch (...) {
      r->failed = true;
    }
  }
  static void on_allocated(void* self, void* ptr, size_t) noexcept {
    auto* r = static_cast<RestoreResult*>(self);
    try {
      r->allocated.push_back(ptr);
    } catch (...) {
      r->failed = true;
    }
  }
};

// Restores the pool's checkpoint; the blocks allocated in it come back as DataPtrs
// carrying `deleter` on `device_type`.
template <typename AllocatorState, typename CheckpointDelta>
CheckpointDelta restore(int device, const std::shared_ptr<AllocatorState>& as, c10::DeleterFnPtr deleter,
                        c10::DeviceType device_type) {
  auto pps = std::dynamic_pointer_cast<PoolState<AllocatorState>>(as);
  TORCH_CHECK(pps != nullptr,
              "npualloc: setCheckpointPoolState: the state is not one npualloc's getCheckpointState made");
  TORCH_CHECK(pps->device == device, "npualloc: setCheckpointPoolState: the state is of device " +
                                         std::to_string(pps->device) + ", not " + std::to_string(device));
  RestoreResult r;
  check(npualloc_pool_restore(device, pps->state, &RestoreResult::on_freed, &RestoreResult::on_allocated, &r),
        "setCheckpointPoolState");
  TORCH_CHECK(!r.failed, "npualloc: setCheckpointPoolState: out of host memory while collecting the blocks");
  CheckpointDelta delta;
  delta.ptrs_freed = std::move(r.freed);
  delta.dataptrs_allocd.reserve(r.allocated.size());
  for (void* p : r.allocated)
    delta.dataptrs_allocd.emplace_back(p, p, deleter, c10::Device(device_type, static_cast<c10::DeviceIndex>(device)));
  return delta;
}

inline bool check_live(int device, c10::MempoolId_t pool, const std::unordered_set<void*>& expected) {
  std::vector<void*> ptrs(expected.begin(), expected.end());
  bool equal = false;
  check(npualloc_pool_check_live(device, pool.first, pool.second, ptrs.data(), ptrs.size(), &equal),
        "checkPoolLiveAllocations");
  return equal;
}

inline int pool_use_count(int device, c10::MempoolId_t pool) {
  int64_t n = 0;
  check(npualloc_pool_use_count(device, pool.first, pool.second, &n), "getPoolUseCount");
  return static_cast<int>(n);
}

// ---- snapshot ----------------------------------------------------------------------

struct SnapshotHandle {
  npualloc_snapshot* s = nullptr;
  ~SnapshotHandle() { npualloc_snapshot_destroy(s); }
};

// Appends to `segments` (a vector of torch's SegmentInfo) npualloc's segments of `pool`
// ((0, 0): all) on every device, in address order, with the frames from `history`;
// returns the bytes active per device (for the SNAPSHOT trace entries).
template <typename SegmentInfo, typename HistoryT>
std::vector<size_t> fill_segments(std::vector<SegmentInfo>& segments, c10::MempoolId_t pool, HistoryT& history) {
  int devices = std::max(npualloc_device_count(), 0);
  std::vector<size_t> active(devices, 0);
  for (int device = 0; device < devices; ++device) {
    SnapshotHandle h;
    check(npualloc_snapshot_take(device, pool.first, pool.second, &h.s), "snapshot");
    const npualloc_segment_info* segs = nullptr;
    const npualloc_block_info* blocks = nullptr;
    size_t n_segs = 0, n_blocks = 0;
    check(npualloc_snapshot_read(h.s, &segs, &n_segs, &blocks, &n_blocks), "snapshot");
    for (size_t i = 0; i < n_segs; ++i) {
      const auto& s = segs[i];
      SegmentInfo out;
      out.device = static_cast<decltype(out.device)>(s.device);
      out.address = static_cast<decltype(out.address)>(reinterpret_cast<uintptr_t>(s.address));
      out.stream = static_cast<decltype(out.stream)>(s.stream);
      out.total_size = static_cast<decltype(out.total_size)>(s.total_size);
      out.requested_size = static_cast<decltype(out.requested_size)>(s.requested_size);
      out.allocated_size = static_cast<decltype(out.allocated_size)>(s.allocated_size);
      out.active_size = static_cast<decltype(out.active_size)>(s.active_size);
      out.is_large = s.is_large;
      out.is_expandable = s.is_expandable;
      out.owner_private_pool_id = c10::MempoolId_t{s.pool_hi, s.pool_lo};
      out.context_when_allocated = history.segment_context(reinterpret_cast<uintptr_t>(s.address));
      for (size_t b = s.first_block; b < s.first_block + s.block_count && b < n_blocks; ++b) {
        const auto& bi = blocks[b];
        out.blocks.emplace_back();
        auto& ob = out.blocks.back();
        ob.size = static_cast<decltype(ob.size)>(bi.size);
        ob.requested_size = static_cast<decltype(ob.requested_size)>(bi.requested_size);
        ob.allocated = bi.state == NPUALLOC_BLOCK_ACTIVE_ALLOCATED;
        ob.active = bi.state != NPUALLOC_BLOCK_INACTIVE;
        if (ob.allocated) ob.context_when_allocated = history.block_context(reinterpret_cast<uintptr_t>(bi.address));
      }
      active[device] += s.active_size;
      segments.push_back(std::move(out));
    }
  }
  std::sort(segments.begin(), segments.end(),
            [](const SegmentInfo& a, const SegmentInfo& b) { return a.address < b.address; });
  return active;
}

}  // namespace npualloc_shim
