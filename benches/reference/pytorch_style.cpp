// A caching allocator written the PyTorch way, as the reference for the C ABI
// benchmark (allocator-ffi/benches/abi.rs): the shape of c10's CUDACachingAllocator and
// torch_npu's NPUCachingAllocator, cut down to what a malloc/free pair touches.
//
// - One recursive mutex per device around every pool operation.
// - Two pools (small: <= 1 MiB, large), each an ordered set keyed (stream, size, address):
//   best fit is lower_bound.
// - Split (small: remainder >= 512 B; large: remainder > 1 MiB) and coalesce with both
//   neighbours on free.
// - PyTorch's rounding (512-byte multiples after torch_npu's 32-byte padding) and segment
//   sizes (2 MiB small, 20 MiB below 10 MiB, else rounded to 2 MiB).
// - PyTorch's statistics: allocation, active, allocated/active/requested bytes,
//   inactive-split, segment and reserved, for "all" and the block's pool, on every call.
// - Live pointers in a map sharded over 67 mutexes (NativeCachingAllocator's
//   allocated_blocks), looked up on free before the device lock.
// - Device memory from the ACL runtime (aclrtMalloc / aclrtFree, loaded with dlopen from
//   the path given to ref_init): the same fake runtime npualloc uses in the benchmark.
// - On a failed device malloc: free every cached whole segment, retry once.
//
// Not here (not on the measured path): stream events and record_stream, graph pools,
// max_split_size, expandable segments, garbage collection, memory fraction, tracing.
//
// Exports the ABI torch_npu's NPUPluggableAllocator loads, under a ref_ prefix.
#include <dlfcn.h>

#include <array>
#include <bitset>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <unordered_map>

namespace {

constexpr size_t kMinBlockSize = 512;
constexpr size_t kSmallSize = 1 << 20;
constexpr size_t kSmallBuffer = 2 << 20;
constexpr size_t kLargeBuffer = 20 << 20;
constexpr size_t kMinLargeAlloc = 10 << 20;
constexpr size_t kRoundLarge = 2 << 20;
constexpr size_t kNpuPadding = 32;  // torch_npu pads every request by 32 bytes

using aclError = int;
aclError (*acl_set_device)(int32_t);
aclError (*acl_malloc)(void **, size_t, int);
aclError (*acl_free)(void *);
constexpr int kHugeFirst = 0;  // ACL_MEM_MALLOC_HUGE_FIRST

struct Stat {
  int64_t current = 0, peak = 0, allocated = 0, freed = 0;
};
enum StatType { AGGREGATE = 0, SMALL_POOL = 1, LARGE_POOL = 2, NUM_TYPES = 3 };
using StatArray = std::array<Stat, NUM_TYPES>;
using StatTypes = std::bitset<NUM_TYPES>;

void update_stat(Stat &s, int64_t amount) {
  s.current += amount;
  s.peak = std::max(s.current, s.peak);
  if (amount > 0) s.allocated += amount;
  if (amount < 0) s.freed += -amount;
}

template <typename F>
void for_each_selected_stat_type(const StatTypes &types, F f) {
  for (size_t i = 0; i < NUM_TYPES; ++i)
    if (types[i]) f(i);
}

void update_stat_array(StatArray &a, int64_t amount, const StatTypes &types) {
  for_each_selected_stat_type(types, [&](size_t i) { update_stat(a[i], amount); });
}

struct DeviceStats {
  StatArray allocation, segment, active, inactive_split, allocated_bytes, reserved_bytes,
      active_bytes, inactive_split_bytes, requested_bytes;
  int64_t num_alloc_retries = 0, num_ooms = 0, num_device_alloc = 0, num_device_free = 0;
};

struct BlockPool;
struct Block {
  int device;
  void *stream;
  size_t size;
  size_t requested_size = 0;
  BlockPool *pool;
  char *ptr;
  bool allocated = false;
  Block *prev = nullptr, *next = nullptr;
  Block(int d, void *s, size_t sz, BlockPool *p, char *ptr_)
      : device(d), stream(s), size(sz), pool(p), ptr(ptr_) {}
  bool is_split() const { return prev || next; }
};

bool block_less(const Block *a, const Block *b) {
  if (a->stream != b->stream) return (uintptr_t)a->stream < (uintptr_t)b->stream;
  if (a->size != b->size) return a->size < b->size;
  return (uintptr_t)a->ptr < (uintptr_t)b->ptr;
}

struct BlockPool {
  std::set<Block *, bool (*)(const Block *, const Block *)> blocks{block_less};
  bool is_small;
  explicit BlockPool(bool small) : is_small(small) {}
};

size_t round_size(size_t size) {
  size += kNpuPadding;
  return size < kMinBlockSize ? kMinBlockSize : kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
}

size_t allocation_size(size_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((size + kRoundLarge - 1) / kRoundLarge);
}

class DeviceAllocator {
 public:
  explicit DeviceAllocator(int device) : device_(device) {}

  Block *malloc(size_t orig_size, void *stream) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    size_t size = round_size(orig_size);
    BlockPool &pool = size <= kSmallSize ? small_ : large_;
    StatTypes types;
    types[AGGREGATE] = true;
    types[pool.is_small ? SMALL_POOL : LARGE_POOL] = true;

    Block *block = get_free_block(pool, stream, size);
    if (!block) block = alloc_block(pool, stream, allocation_size(size), types);
    if (!block) {
      release_cached_blocks();
      stats_.num_alloc_retries++;
      block = alloc_block(pool, stream, allocation_size(size), types);
    }
    if (!block) {
      stats_.num_ooms++;
      return nullptr;
    }
    return alloc_found_block(block, orig_size, size, types);
  }

  void free(Block *block) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    block->allocated = false;
    StatTypes types;
    types[AGGREGATE] = true;
    types[block->pool->is_small ? SMALL_POOL : LARGE_POOL] = true;
    for_each_selected_stat_type(types, [&](size_t i) {
      update_stat(stats_.allocation[i], -1);
      update_stat(stats_.allocated_bytes[i], -(int64_t)block->size);
    });
    free_block(block, types);
  }

 private:
  Block *get_free_block(BlockPool &pool, void *stream, size_t size) {
    Block key(device_, stream, size, &pool, nullptr);
    auto it = pool.blocks.lower_bound(&key);
    if (it == pool.blocks.end() || (*it)->stream != stream) return nullptr;
    Block *b = *it;
    pool.blocks.erase(it);
    return b;
  }

  Block *alloc_block(BlockPool &pool, void *stream, size_t size, const StatTypes &types) {
    void *p = nullptr;
    if (acl_set_device(device_) != 0 || acl_malloc(&p, size, kHugeFirst) != 0) return nullptr;
    stats_.num_device_alloc++;
    for_each_selected_stat_type(types, [&](size_t i) {
      update_stat(stats_.segment[i], 1);
      update_stat(stats_.reserved_bytes[i], (int64_t)size);
    });
    return new Block(device_, stream, size, &pool, static_cast<char *>(p));
  }

  Block *alloc_found_block(Block *block, size_t orig_size, size_t size, const StatTypes &types) {
    BlockPool *pool = block->pool;
    size_t remaining_size = block->size - size;
    bool already_split = block->is_split();
    bool split = pool->is_small ? remaining_size >= kMinBlockSize : remaining_size > kSmallSize;
    if (split) {
      Block *remaining = block;
      block = new Block(device_, block->stream, size, pool, block->ptr);
      block->prev = remaining->prev;
      if (block->prev) block->prev->next = block;
      block->next = remaining;
      remaining->prev = block;
      remaining->ptr += size;
      remaining->size -= size;
      pool->blocks.insert(remaining);
      if (already_split) {
        update_stat_array(stats_.inactive_split_bytes, -(int64_t)block->size, types);
      } else {
        for_each_selected_stat_type(types, [&](size_t i) {
          update_stat(stats_.inactive_split_bytes[i], (int64_t)remaining->size);
          update_stat(stats_.inactive_split[i], 1);
        });
      }
    } else if (already_split) {
      for_each_selected_stat_type(types, [&](size_t i) {
        update_stat(stats_.inactive_split_bytes[i], -(int64_t)block->size);
        update_stat(stats_.inactive_split[i], -1);
      });
    }
    block->allocated = true;
    block->requested_size = orig_size;
    for_each_selected_stat_type(types, [&](size_t i) {
      update_stat(stats_.allocation[i], 1);
      update_stat(stats_.allocated_bytes[i], (int64_t)block->size);
      update_stat(stats_.active[i], 1);
      update_stat(stats_.active_bytes[i], (int64_t)block->size);
      update_stat(stats_.requested_bytes[i], (int64_t)block->requested_size);
    });
    return block;
  }

  // Merges src into dst if src is free; returns the bytes merged.
  size_t try_merge_blocks(Block *dst, Block *src, BlockPool &pool) {
    if (!src || src->allocated) return 0;
    if (dst->prev == src) {
      dst->ptr = src->ptr;
      dst->prev = src->prev;
      if (dst->prev) dst->prev->next = dst;
    } else {
      dst->next = src->next;
      if (dst->next) dst->next->prev = dst;
    }
    size_t subsumed = src->size;
    dst->size += subsumed;
    pool.blocks.erase(src);
    delete src;
    return subsumed;
  }

  void free_block(Block *block, const StatTypes &types) {
    size_t original_size = block->size;
    size_t requested_size = block->requested_size;
    BlockPool &pool = *block->pool;
    int64_t net_inactive_split_blocks = 0, net_inactive_split_size = 0;
    for (Block *merge : {block->prev, block->next}) {
      size_t subsumed = try_merge_blocks(block, merge, pool);
      if (subsumed > 0) {
        net_inactive_split_blocks -= 1;
        net_inactive_split_size -= (int64_t)subsumed;
      }
    }
    pool.blocks.insert(block);
    if (block->is_split()) {
      net_inactive_split_blocks += 1;
      net_inactive_split_size += (int64_t)block->size;
    }
    for_each_selected_stat_type(types, [&](size_t i) {
      update_stat(stats_.inactive_split[i], net_inactive_split_blocks);
      update_stat(stats_.inactive_split_bytes[i], net_inactive_split_size);
      update_stat(stats_.active[i], -1);
      update_stat(stats_.active_bytes[i], -(int64_t)original_size);
      update_stat(stats_.requested_bytes[i], -(int64_t)requested_size);
    });
  }

  // Frees every cached whole segment (PyTorch's release_cached_blocks, no events).
  void release_cached_blocks() {
    for (BlockPool *pool : {&small_, &large_}) {
      for (auto it = pool->blocks.begin(); it != pool->blocks.end();) {
        Block *b = *it;
        if (b->is_split()) {
          ++it;
          continue;
        }
        it = pool->blocks.erase(it);
        acl_set_device(device_);
        acl_free(b->ptr);
        stats_.num_device_free++;
        StatTypes types;
        types[AGGREGATE] = true;
        types[pool->is_small ? SMALL_POOL : LARGE_POOL] = true;
        for_each_selected_stat_type(types, [&](size_t i) {
          update_stat(stats_.segment[i], -1);
          update_stat(stats_.reserved_bytes[i], -(int64_t)b->size);
        });
        delete b;
      }
    }
  }

  int device_;
  std::recursive_mutex mutex_;
  BlockPool small_{true}, large_{false};
  DeviceStats stats_;
};

constexpr size_t kNumMutexShard = 67;
struct alignas(64) Shard {
  std::mutex mutex;
  std::unordered_map<void *, Block *> blocks;
};
std::array<Shard, kNumMutexShard> allocated_blocks;
constexpr int kMaxDevices = 8;
DeviceAllocator *devices[kMaxDevices];

Shard &shard_of(void *p) { return allocated_blocks[std::hash<void *>{}(p) % kNumMutexShard]; }

}  // namespace

extern "C" {

// Loads the ACL runtime at `acl_lib` and creates the allocators; 0 on success.
__attribute__((visibility("default"))) int ref_init(const char *acl_lib) {
  void *h = dlopen(acl_lib, RTLD_NOW);
  if (!h) return 1;
  acl_set_device = reinterpret_cast<aclError (*)(int32_t)>(dlsym(h, "aclrtSetDevice"));
  acl_malloc = reinterpret_cast<aclError (*)(void **, size_t, int)>(dlsym(h, "aclrtMalloc"));
  acl_free = reinterpret_cast<aclError (*)(void *)>(dlsym(h, "aclrtFree"));
  if (!acl_set_device || !acl_malloc || !acl_free) return 2;
  for (int d = 0; d < kMaxDevices; ++d)
    if (!devices[d]) devices[d] = new DeviceAllocator(d);
  return 0;
}

__attribute__((visibility("default"))) void *ref_malloc(size_t size, int device, void *stream) {
  if (size == 0 || device < 0 || device >= kMaxDevices) return nullptr;
  Block *b = devices[device]->malloc(size, stream);
  if (!b) return nullptr;
  Shard &s = shard_of(b->ptr);
  std::lock_guard<std::mutex> lock(s.mutex);
  s.blocks[b->ptr] = b;
  return b->ptr;
}

__attribute__((visibility("default"))) void ref_free(void *ptr, size_t size, int device, void *stream) {
  (void)size;
  (void)device;
  (void)stream;
  if (!ptr) return;
  Block *b;
  {
    Shard &s = shard_of(ptr);
    std::lock_guard<std::mutex> lock(s.mutex);
    auto it = s.blocks.find(ptr);
    if (it == s.blocks.end()) return;
    b = it->second;
    s.blocks.erase(it);
  }
  devices[b->device]->free(b);
}

}  // extern "C"
