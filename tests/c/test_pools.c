/* Graph pools through the C ABI: use counts, per-request pool allocations, captures,
 * checkpoints and restores, the live-allocation check, per-pool snapshots and cache
 * release, cache_info, the memory-history callback and the HCCL hooks, with bad input
 * for each. Runs on the simulated device and on the fake ACL runtime. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "npualloc.h"
#include "check.h"
#include "backend_ctl.h"

static const size_t mib = (size_t)1 << 20;

static int64_t uses(uint64_t hi, uint64_t lo) {
  int64_t n = -1;
  CHECK(npualloc_pool_use_count(0, hi, lo, &n) == NPUALLOC_OK);
  return n;
}

static bool has_error(const char *what) {
  const char *e = npualloc_last_error();
  return e && strstr(e, what) != NULL;
}

static void test_use_counts(void) {
  CHECK(uses(1, 1) == 0); /* never created */
  CHECK(npualloc_pool_use_count(0, 1, 1, NULL) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_pool_use_count(7, 1, 1, &(int64_t){0}) == NPUALLOC_ERR_INVALID_DEVICE);
  CHECK(npualloc_pool_incref(0, 0, 0) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_pool_incref(-1, 1, 1) == NPUALLOC_ERR_INVALID_DEVICE);
  CHECK(npualloc_pool_incref(0, 1, 1) == NPUALLOC_OK);
  npualloc_stream s = NULL;
  CHECK(ctl_create_stream(0, &s) == NPUALLOC_OK);
  CHECK(npualloc_pool_begin(0, 1, 1, s) == NPUALLOC_OK);
  CHECK(npualloc_pool_begin(0, 0, 0, s) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(uses(1, 1) == 2);
  CHECK(npualloc_release_pool(0, 1, 1) == NPUALLOC_OK);
  CHECK(uses(1, 1) == 1);
  CHECK(npualloc_release_pool(0, 1, 1) == NPUALLOC_OK);
  CHECK(uses(1, 1) == 0);
  CHECK(npualloc_release_pool(0, 1, 1) == NPUALLOC_ERR_UNKNOWN_POOL);
  CHECK(has_error("npualloc_release_pool: pool (1, 1) is not live"));
  CHECK(npualloc_pool_incref(0, 1, 1) == NPUALLOC_OK); /* at 0 it may be used again */
  CHECK(uses(1, 1) == 1);
  CHECK(npualloc_release_pool(0, 1, 1) == NPUALLOC_OK);
  CHECK(npualloc_check_invariants(0) == NPUALLOC_OK);
}

static void test_captures(void) {
  bool on = true;
  CHECK(npualloc_captures_underway(0, &on) == NPUALLOC_OK && !on);
  CHECK(npualloc_captures_underway(0, NULL) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_capture_end(0) == NPUALLOC_ERR_INVALID_STATE);
  CHECK(npualloc_capture_begin(0) == NPUALLOC_OK);
  CHECK(npualloc_capture_begin(0) == NPUALLOC_OK);
  CHECK(npualloc_captures_underway(0, &on) == NPUALLOC_OK && on);
  /* Nothing goes back to the device while a capture is underway. */
  ctl_counters c0, c1;
  CHECK(ctl_get_counters(0, &c0) == NPUALLOC_OK);
  CHECK(npualloc_empty_cache_device(0) == NPUALLOC_OK);
  CHECK(ctl_get_counters(0, &c1) == NPUALLOC_OK);
  CHECK(c1.live_bytes == c0.live_bytes);
  CHECK(npualloc_capture_end(0) == NPUALLOC_OK);
  CHECK(npualloc_capture_end(0) == NPUALLOC_OK);
  CHECK(npualloc_captures_underway(0, &on) == NPUALLOC_OK && !on);
  CHECK(npualloc_capture_begin(9) == NPUALLOC_ERR_INVALID_DEVICE);
}

typedef struct {
  void *freed[16];
  size_t nfreed;
  void *made[16];
  size_t made_size[16];
  size_t nmade;
} delta;

static void on_freed(void *ctx, void *ptr) {
  delta *d = ctx;
  if (d->nfreed < 16) d->freed[d->nfreed++] = ptr;
}

static void on_allocated(void *ctx, void *ptr, size_t size) {
  delta *d = ctx;
  if (d->nmade < 16) {
    d->made[d->nmade] = ptr;
    d->made_size[d->nmade++] = size;
  }
}

static bool contains(void *const *v, size_t n, void *p) {
  for (size_t i = 0; i < n; ++i)
    if (v[i] == p) return true;
  return false;
}

/* A graph on a capture stream and a side stream, checkpointed, then changed, then
 * restored: the same blocks at the same addresses, the dead allocations reported. */
static void test_checkpoint_and_restore(void) {
  npualloc_stream cap = NULL, side = NULL;
  CHECK(ctl_create_stream(0, &cap) == NPUALLOC_OK);
  CHECK(ctl_create_stream(0, &side) == NPUALLOC_OK);
  CHECK(npualloc_malloc_in_pool(4096, 0, cap, 2, 0) == NULL); /* not live */
  CHECK(has_error("npualloc_malloc_in_pool: pool (2, 0) is not live"));
  CHECK(npualloc_pool_begin(0, 2, 0, cap) == NPUALLOC_OK);
  CHECK(npualloc_malloc_in_pool(0, 0, cap, 2, 0) == NULL); /* size 0 */
  CHECK(npualloc_capture_begin(0) == NPUALLOC_OK);
  void *a = npualloc_malloc_in_pool(4096, 0, cap, 2, 0);
  void *x = npualloc_malloc_in_pool(3 * mib, 0, side, 2, 0); /* the side stream's */
  void *b = npualloc_malloc_in_pool(4096, 0, cap, 2, 0);
  CHECK(a && x && b);
  npualloc_record_stream(x, cap);
  npualloc_free(x, 0, 0, side); /* a captured use: no event, free once the capture ends */
  CHECK(npualloc_capture_end(0) == NPUALLOC_OK);

  bool same = false;
  void *live[] = {a, b};
  CHECK(npualloc_pool_check_live(0, 2, 0, live, 2, &same) == NPUALLOC_OK && same);
  CHECK(npualloc_pool_check_live(0, 2, 0, live, 1, &same) == NPUALLOC_OK && !same);
  CHECK(npualloc_pool_check_live(0, 2, 0, NULL, 1, &same) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_pool_check_live(0, 2, 0, live, 2, NULL) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_pool_check_live(0, 3, 0, NULL, 0, &same) == NPUALLOC_ERR_UNKNOWN_POOL);

  npualloc_pool_state *st = NULL;
  CHECK(npualloc_pool_checkpoint(0, 3, 0, &st) == NPUALLOC_ERR_UNKNOWN_POOL && st == NULL);
  CHECK(npualloc_pool_checkpoint(0, 2, 0, NULL) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_pool_checkpoint(0, 2, 0, &st) == NPUALLOC_OK && st != NULL);
  const npualloc_block_state *blocks = NULL;
  size_t nblocks = 0, nsegs = 0;
  CHECK(npualloc_pool_state_blocks(st, &blocks, &nblocks, &nsegs) == NPUALLOC_OK);
  CHECK(npualloc_pool_state_blocks(NULL, &blocks, &nblocks, NULL) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_pool_state_blocks(st, NULL, &nblocks, NULL) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(nsegs == 2); /* the capture stream's small segment, the side stream's large one */
  size_t allocated = 0;
  for (size_t i = 0; i < nblocks; ++i) {
    if (blocks[i].allocated) {
      allocated++;
      CHECK(blocks[i].ptr == a || blocks[i].ptr == b);
      CHECK(blocks[i].stream == cap);
    }
    if (blocks[i].ptr == x) CHECK(!blocks[i].allocated && blocks[i].stream == side);
  }
  CHECK(allocated == 2);

  /* The graph tree moves on: b dies, two more allocations. */
  npualloc_free(b, 0, 0, cap);
  void *c = npualloc_malloc_in_pool(8192, 0, cap, 2, 0);
  void *y = npualloc_malloc_in_pool(2 * mib, 0, side, 2, 0);
  CHECK(c && y);
  delta d = {0};
  CHECK(npualloc_pool_restore(1, st, on_freed, on_allocated, &d) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_pool_restore(0, NULL, on_freed, on_allocated, &d) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(d.nfreed == 0 && d.nmade == 0);
  CHECK(npualloc_pool_restore(0, st, on_freed, on_allocated, &d) == NPUALLOC_OK);
  CHECK(d.nfreed == 3);
  CHECK(contains(d.freed, d.nfreed, a) && contains(d.freed, d.nfreed, c) && contains(d.freed, d.nfreed, y));
  CHECK(d.nmade == 2);
  CHECK(contains(d.made, d.nmade, a) && contains(d.made, d.nmade, b));
  CHECK(npualloc_pool_check_live(0, 2, 0, live, 2, &same) == NPUALLOC_OK && same);
  npualloc_pool_state *again = NULL;
  CHECK(npualloc_pool_checkpoint(0, 2, 0, &again) == NPUALLOC_OK);
  const npualloc_block_state *blocks2 = NULL;
  size_t n2 = 0;
  CHECK(npualloc_pool_state_blocks(again, &blocks2, &n2, NULL) == NPUALLOC_OK);
  /* The checkpointed blocks are back block for block (new segments may follow). */
  for (size_t i = 0; i < nblocks; ++i) {
    bool found = false;
    for (size_t j = 0; j < n2; ++j)
      found |= blocks2[j].ptr == blocks[i].ptr && blocks2[j].size == blocks[i].size &&
               blocks2[j].allocated == blocks[i].allocated;
    CHECK(found);
  }
  npualloc_pool_state_destroy(again);
  CHECK(npualloc_check_invariants(0) == NPUALLOC_OK);

  /* Callbacks may be NULL; a second restore frees the two it made and makes them again. */
  CHECK(npualloc_pool_restore(0, st, NULL, NULL, NULL) == NPUALLOC_OK);
  /* A pool with no use left cannot be restored or checkpointed. */
  npualloc_free(a, 0, 0, cap);
  npualloc_free(b, 0, 0, cap);
  CHECK(npualloc_release_pool(0, 2, 0) == NPUALLOC_OK);
  CHECK(npualloc_pool_restore(0, st, NULL, NULL, NULL) == NPUALLOC_ERR_UNKNOWN_POOL);
  npualloc_pool_state_destroy(st);
  npualloc_pool_state_destroy(NULL);
  /* Not live, but still holding memory: the check works until the memory goes back. */
  CHECK(npualloc_pool_check_live(0, 2, 0, NULL, 0, &same) == NPUALLOC_OK && same);
  CHECK(npualloc_empty_cache_pool(0, 2, 0) == NPUALLOC_OK);
  CHECK(npualloc_pool_check_live(0, 2, 0, NULL, 0, &same) == NPUALLOC_ERR_UNKNOWN_POOL);
  CHECK(npualloc_check_invariants(0) == NPUALLOC_OK);
}

/* Snapshots per pool, emptying one pool's cache, cache_info. */
static void test_views(void) {
  npualloc_stream s = NULL;
  CHECK(ctl_create_stream(0, &s) == NPUALLOC_OK);
  CHECK(npualloc_pool_incref(0, 4, 4) == NPUALLOC_OK);
  void *p = npualloc_malloc_in_pool(3 * mib, 0, s, 4, 4);
  void *q = npualloc_malloc(4096, 0, s);
  CHECK(p && q);
  npualloc_snapshot *snap = NULL;
  CHECK(npualloc_snapshot_take(0, 4, 4, NULL) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_snapshot_take(0, 4, 4, &snap) == NPUALLOC_OK);
  const npualloc_segment_info *segs = NULL;
  const npualloc_block_info *blks = NULL;
  size_t nseg = 0, nblk = 0;
  CHECK(npualloc_snapshot_read(snap, &segs, &nseg, &blks, &nblk) == NPUALLOC_OK);
  CHECK(npualloc_snapshot_read(NULL, &segs, &nseg, NULL, NULL) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(nseg == 1);
  if (nseg == 1) {
    CHECK(segs[0].pool_hi == 4 && segs[0].pool_lo == 4 && segs[0].is_large);
    CHECK(segs[0].stream == s && segs[0].total_size == 20 * mib);
    CHECK(segs[0].allocated_size == ctl_block(3 * mib) || segs[0].allocated_size >= 3 * mib);
    CHECK(segs[0].first_block + segs[0].block_count <= nblk);
    CHECK(blks[segs[0].first_block].address == p);
    CHECK(blks[segs[0].first_block].state == NPUALLOC_BLOCK_ACTIVE_ALLOCATED);
    CHECK(blks[segs[0].first_block].requested_size == 3 * mib);
  }
  npualloc_snapshot_destroy(snap);
  CHECK(npualloc_snapshot_take(0, 0, 0, &snap) == NPUALLOC_OK); /* every segment */
  CHECK(npualloc_snapshot_read(snap, &segs, &nseg, NULL, NULL) == NPUALLOC_OK);
  size_t own = 0, pooled = 0;
  for (size_t i = 0; i < nseg; ++i) {
    if (segs[i].pool_hi == 4 && segs[i].pool_lo == 4) pooled++;
    if (segs[i].pool_hi == 0 && segs[i].pool_lo == 0 && segs[i].stream == s) own++;
  }
  CHECK(pooled == 1 && own == 1);
  npualloc_snapshot_destroy(snap);
  npualloc_snapshot_destroy(NULL);

  size_t cached = 0, largest = 0;
  CHECK(npualloc_cache_info(0, &cached, NULL) == NPUALLOC_ERR_INVALID_ARGUMENT);
  npualloc_free(p, 0, 0, s);
  CHECK(npualloc_cache_info(0, &cached, &largest) == NPUALLOC_OK);
  CHECK(largest >= 20 * mib && cached >= largest);

  /* A live pool keeps its memory through both cache releases. */
  ctl_counters c0, c1, c2;
  CHECK(npualloc_empty_cache_pool(0, 4, 4) == NPUALLOC_OK);
  CHECK(npualloc_empty_cache_device(0) == NPUALLOC_OK);
  CHECK(ctl_get_counters(0, &c0) == NPUALLOC_OK);
  CHECK(npualloc_snapshot_take(0, 4, 4, &snap) == NPUALLOC_OK);
  CHECK(npualloc_snapshot_read(snap, NULL, &nseg, NULL, NULL) == NPUALLOC_OK && nseg == 1);
  npualloc_snapshot_destroy(snap);
  CHECK(npualloc_release_pool(0, 4, 4) == NPUALLOC_OK);
  CHECK(npualloc_empty_cache_pool(0, 4, 4) == NPUALLOC_OK); /* only that pool's */
  CHECK(ctl_get_counters(0, &c1) == NPUALLOC_OK);
  CHECK(c1.live_bytes == c0.live_bytes - 20 * mib);
  npualloc_free(q, 0, 0, s);
  CHECK(npualloc_empty_cache_pool(0, 0, 0) == NPUALLOC_OK); /* (0, 0): the device's cache */
  CHECK(ctl_get_counters(0, &c2) == NPUALLOC_OK);
  CHECK(c2.live_bytes < c1.live_bytes);
  CHECK(npualloc_empty_cache_pool(0, 4, 4) == NPUALLOC_OK); /* unknown: nothing to do */
  CHECK(npualloc_empty_cache_pool(5, 4, 4) == NPUALLOC_ERR_INVALID_DEVICE);

  npualloc_device_stats st;
  CHECK(npualloc_get_device_stats(0, &st) == NPUALLOC_OK && st.allocation[0].allocated > 0);
  CHECK(npualloc_reset_accumulated_stats(0) == NPUALLOC_OK);
  CHECK(npualloc_get_device_stats(0, &st) == NPUALLOC_OK);
  CHECK(st.allocation[0].allocated == 0 && st.allocation[0].freed == 0);
  CHECK(st.num_device_free == 0);
  CHECK(npualloc_reset_accumulated_stats(-3) == NPUALLOC_ERR_INVALID_DEVICE);
  CHECK(npualloc_check_invariants(0) == NPUALLOC_OK);
}

static npualloc_trace_entry trace[64];
static int ntrace = 0;
static void on_trace(void *ctx, const npualloc_trace_entry *e) {
  if (ctx == (void *)&ntrace && ntrace < 64) trace[ntrace++] = *e;
}

static int count_action(int action, uint64_t address) {
  int n = 0;
  for (int i = 0; i < ntrace; ++i) n += trace[i].action == action && trace[i].address == address;
  return n;
}

static void test_history(void) {
  npualloc_stream s = NULL, other = NULL;
  CHECK(ctl_create_stream(0, &s) == NPUALLOC_OK);
  CHECK(ctl_create_stream(0, &other) == NPUALLOC_OK);
  CHECK(npualloc_set_trace_callback(on_trace, &ntrace) == NPUALLOC_OK);
  CHECK(npualloc_pool_incref(0, 6, 0) == NPUALLOC_OK);
  void *p = npualloc_malloc_in_pool(5 * mib, 0, s, 6, 0);
  CHECK(p != NULL);
  uint64_t at = (uint64_t)(uintptr_t)p;
  CHECK(count_action(NPUALLOC_TRACE_SEGMENT_ALLOC, at) == 1);
  CHECK(count_action(NPUALLOC_TRACE_ALLOC, at) == 1);
  for (int i = 0; i < ntrace; ++i)
    if (trace[i].address == at) CHECK(trace[i].pool_hi == 6 && trace[i].stream == s && trace[i].device == 0);
  /* Used on another stream with work queued: the free completes once that work ran. */
  npualloc_record_stream(p, other);
  CHECK(ctl_launch(0, other, 1) == NPUALLOC_OK);
  npualloc_free(p, 0, 0, s);
  CHECK(count_action(NPUALLOC_TRACE_FREE_REQUESTED, at) == 1);
  CHECK(count_action(NPUALLOC_TRACE_FREE_COMPLETED, at) == 0);
  CHECK(ctl_complete(0, other) == NPUALLOC_OK);
  CHECK(npualloc_release_pool(0, 6, 0) == NPUALLOC_OK);
  CHECK(npualloc_empty_cache_device(0) == NPUALLOC_OK);
  CHECK(count_action(NPUALLOC_TRACE_FREE_COMPLETED, at) == 1);
  CHECK(count_action(NPUALLOC_TRACE_SEGMENT_FREE, at) == 1);
  /* Out of memory: device free bytes in `address`, the request in `size`. */
  CHECK(npualloc_malloc((size_t)1 << 40, 0, s) == NULL);
  CHECK(ntrace > 0 && trace[ntrace - 1].action == NPUALLOC_TRACE_OOM);
  CHECK(trace[ntrace - 1].size == (size_t)1 << 40);
  int seen = ntrace;
  CHECK(npualloc_set_trace_callback(NULL, NULL) == NPUALLOC_OK);
  void *q = npualloc_malloc(4096, 0, s);
  npualloc_free(q, 0, 0, s);
  CHECK(ntrace == seen);
}

/* HCCL: a freed allocation waiting for the HCCL stream completes once its own stream
 * waited for the work that used it. */
static void test_hccl(void) {
  npualloc_stream own = NULL, hccl = NULL, third = NULL;
  CHECK(ctl_create_stream(0, &own) == NPUALLOC_OK);
  CHECK(ctl_create_stream(0, &hccl) == NPUALLOC_OK);
  CHECK(ctl_create_stream(0, &third) == NPUALLOC_OK);
  int work1 = 0, work2 = 0;
  void *p = npualloc_malloc(2 * mib, 0, own);
  CHECK(npualloc_record_hccl_work(p, NULL) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_record_hccl_work((char *)p + 512, &work1) == NPUALLOC_ERR_UNKNOWN_POINTER);
  CHECK(npualloc_erase_stream_for_work(p, hccl, NULL, own) == NPUALLOC_ERR_INVALID_ARGUMENT);
  npualloc_record_stream(p, hccl);
  CHECK(npualloc_record_hccl_work(p, &work1) == NPUALLOC_OK);
  CHECK(ctl_launch(0, hccl, 1) == NPUALLOC_OK); /* the collective, still running */
  npualloc_free(p, 0, 0, own);
  npualloc_snapshot *snap = NULL;
  const npualloc_segment_info *segs = NULL;
  const npualloc_block_info *blks = NULL;
  size_t nseg = 0, nblk = 0;
  int state = -1;
#define STATE_OF(ptr)                                                                       \
  do {                                                                                      \
    CHECK(npualloc_snapshot_take(0, 0, 0, &snap) == NPUALLOC_OK);                            \
    CHECK(npualloc_snapshot_read(snap, &segs, &nseg, &blks, &nblk) == NPUALLOC_OK);          \
    state = -1;                                                                             \
    for (size_t i = 0; i < nblk; ++i)                                                       \
      if (blks[i].address == (ptr)) state = blks[i].state;                                  \
    npualloc_snapshot_destroy(snap);                                                        \
  } while (0)
  STATE_OF(p);
  CHECK(state == NPUALLOC_BLOCK_ACTIVE_PENDING_FREE);
  /* Another work, or a current stream other than the allocation's: nothing changes. */
  CHECK(npualloc_erase_stream_for_work(p, hccl, &work2, own) == NPUALLOC_OK);
  CHECK(npualloc_erase_stream_for_work(p, hccl, &work1, third) == NPUALLOC_OK);
  STATE_OF(p);
  CHECK(state == NPUALLOC_BLOCK_ACTIVE_PENDING_FREE);
  CHECK(npualloc_erase_stream_for_work(p, hccl, &work1, own) == NPUALLOC_OK);
  STATE_OF(p);
  CHECK(state == NPUALLOC_BLOCK_INACTIVE);
  /* Stale (the free completed): accepted, nothing to erase. */
  CHECK(npualloc_erase_stream_for_work(p, hccl, &work1, own) == NPUALLOC_OK);
  CHECK(ctl_complete(0, hccl) == NPUALLOC_OK);
  CHECK(npualloc_check_invariants(0) == NPUALLOC_OK);
#undef STATE_OF
}

/* The snapshot state of the block at `ptr` on device 0, -1 if none. */
static int block_state(void *ptr) {
  npualloc_snapshot *snap = NULL;
  const npualloc_block_info *blks = NULL;
  size_t n = 0;
  int state = -1;
  CHECK(npualloc_snapshot_take(0, 0, 0, &snap) == NPUALLOC_OK);
  CHECK(npualloc_snapshot_read(snap, NULL, NULL, &blks, &n) == NPUALLOC_OK);
  for (size_t i = 0; i < n; ++i)
    if (blks[i].address == ptr) state = blks[i].state;
  npualloc_snapshot_destroy(snap);
  return state;
}

/* eraseStream's rule: only from the allocation's own (current) stream. */
static void test_erase_on_current_and_fraction(void) {
  npualloc_stream own = NULL, other = NULL;
  CHECK(ctl_create_stream(0, &own) == NPUALLOC_OK);
  CHECK(ctl_create_stream(0, &other) == NPUALLOC_OK);
  void *p = npualloc_malloc(4096, 0, own);
  npualloc_record_stream(p, other);
  CHECK(ctl_launch(0, other, 1) == NPUALLOC_OK);
  CHECK(npualloc_erase_stream_on_current((char *)p + 512, other, own) == NPUALLOC_ERR_UNKNOWN_POINTER);
  CHECK(npualloc_erase_stream_on_current(p, other, other) == NPUALLOC_OK); /* not its stream */
  CHECK(npualloc_erase_stream_on_current(p, other, own) == NPUALLOC_OK);
  npualloc_free(p, 0, 0, own); /* no use left: reusable at once */
  CHECK(block_state(p) == NPUALLOC_BLOCK_INACTIVE);
  void *q = npualloc_malloc(4096, 0, own);
  npualloc_record_stream(q, other);
  CHECK(npualloc_erase_stream_on_current(q, other, other) == NPUALLOC_OK);
  npualloc_free(q, 0, 0, own); /* the use stayed: waits for `other` */
  CHECK(block_state(q) == NPUALLOC_BLOCK_ACTIVE_PENDING_FREE);
  CHECK(ctl_complete(0, other) == NPUALLOC_OK);

  double f = 0;
  CHECK(npualloc_get_memory_fraction(1, NULL) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_get_memory_fraction(1, &f) == NPUALLOC_OK && f == 1.0);
  npualloc_set_memory_fraction(0.5, 1);
  CHECK(npualloc_get_memory_fraction(1, &f) == NPUALLOC_OK && f > 0.4999 && f < 0.5001);
  CHECK(npualloc_get_memory_fraction(4, &f) == NPUALLOC_ERR_INVALID_DEVICE);
  CHECK(npualloc_check_invariants(0) == NPUALLOC_OK);
}

int main(void) {
  test_use_counts();
  test_captures();
  test_checkpoint_and_restore();
  test_views();
  test_history();
  test_hccl();
  test_erase_on_current_and_fraction();
  CHECK(npualloc_check_invariants(0) == NPUALLOC_OK);
  return REPORT("c-pools");
}
