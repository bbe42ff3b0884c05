// Graph-private pool routing, shared by the torch_npu and torch.cuda shims.
//
// torch_npu's NPUGraph and torch.cuda.graph call begin_allocate_to_pool(device, pool,
// filter) before a capture, where filter(stream) says whether a stream takes part in
// that capture (the capture stream, and side streams that joined it by waiting on an
// event recorded in it). npualloc routes one stream per call, so the shim keeps the
// filter and, at each allocation while a capture is open on the device, routes a stream
// the filter accepts (npualloc_begin_allocate_to_pool) before allocating on it.
// end_allocate_to_pool ends the routing of every stream routed; release_pool drops the
// pool's use (a capture that allocated nothing created no pool in npualloc).
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>

#include "npualloc.h"

namespace npualloc_shim {

template <typename Stream>
class GraphPools {
 public:
  using Filter = std::function<bool(Stream)>;

  // Whether a capture is open (read without the lock on every allocation).
  bool any_open() const { return open_.load(std::memory_order_relaxed) > 0; }

  // Routes `stream` to the pool of the open capture whose filter accepts it, once.
  // `before_filter(device, stream)` runs before a filter is asked (torch_npu drains the
  // allocating stream's task queue there, so a join still queued is not missed).
  template <typename BeforeFilter>
  void route_if_captured(int device, Stream stream, BeforeFilter&& before_filter) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : captures_) {
      if (c.device != device) continue;
      for (auto s : c.routed)
        if (s == stream) return;
      before_filter(device, stream);
      if (!c.filter || !c.filter(stream)) continue;
      int rc = npualloc_begin_allocate_to_pool(device, c.pool.first, c.pool.second,
                                               static_cast<npualloc_stream>(stream));
      TORCH_CHECK(rc == NPUALLOC_OK, "npualloc could not route a captured stream to the graph's pool: ",
                  npualloc_last_error());
      c.routed.push_back(stream);
      auto key = std::make_pair(device, c.pool);
      if (std::find(pools_.begin(), pools_.end(), key) == pools_.end()) pools_.push_back(key);
      return;
    }
  }

  void begin(int device, c10::MempoolId_t pool, Filter filter) {
    std::lock_guard<std::mutex> lock(mu_);
    captures_.push_back(Capture{device, pool, std::move(filter), {}});
    open_.fetch_add(1);
  }

  void end(int device, c10::MempoolId_t pool) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = captures_.begin(); it != captures_.end(); ++it) {
      if (it->device != device || it->pool != pool) continue;
      for (size_t i = 0; i < it->routed.size(); ++i)
        npualloc_end_allocate_to_pool(device, pool.first, pool.second);
      captures_.erase(it);
      open_.fetch_sub(1);
      return;
    }
  }

  void release(int device, c10::MempoolId_t pool) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(pools_.begin(), pools_.end(), std::make_pair(device, pool));
    if (it == pools_.end()) return;
    pools_.erase(it);
    npualloc_release_pool(device, pool.first, pool.second);
  }

 private:
  struct Capture {
    int device;
    c10::MempoolId_t pool;
    Filter filter;
    std::vector<Stream> routed;  // streams npualloc routes to the pool
  };
  std::mutex mu_;
  std::vector<Capture> captures_;
  std::atomic<int> open_{0};
  std::vector<std::pair<int, c10::MempoolId_t>> pools_;  // pools npualloc has (released once)
};

}  // namespace npualloc_shim
