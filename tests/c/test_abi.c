/* Exercises the C ABI on the simulated backend (NPUALLOC_BACKEND=sim,
 * NPUALLOC_SIM_MODE=manual, NPUALLOC_SIM_DEVICES=2, NPUALLOC_SIM_CAPACITY=1G), or on the
 * fake ACL runtime (NPUALLOC_BACKEND=acl NPUALLOC_ACL_LIB=<fake>, 2 devices of 1 GiB). */
#include <stdint.h>
#include <string.h>

#include "npualloc.h"
#include "check.h"
#include "backend_ctl.h"

static int invariants_ok(int device) { return npualloc_check_invariants(device) == NPUALLOC_OK; }

static void test_malloc_free_reuse(void) {
  npualloc_init(0);
  void *p = npualloc_malloc(1000, 0, NULL);
  CHECK(p != NULL);
  CHECK(((uintptr_t)p % 512) == 0);
  npualloc_free(p, 1000, 0, NULL);
  void *q = npualloc_malloc(1000, 0, NULL);
  CHECK(q == p); /* same stream: reused at once */
  size_t seg = 0;
  CHECK(npualloc_base_alloc(q, &seg) == q);
  CHECK(seg == 2u << 20);
  npualloc_free(q, 1000, 0, NULL);
  CHECK(invariants_ok(0));
}

static void test_zero_and_bad_sizes(void) {
  CHECK(npualloc_malloc(0, 0, NULL) == NULL);
  CHECK(npualloc_malloc(SIZE_MAX, 0, NULL) == NULL);
  CHECK(npualloc_last_error() != NULL);
  CHECK(strstr(npualloc_last_error(), "npualloc_malloc") != NULL);
  CHECK(npualloc_malloc((size_t)1 << 40, 0, NULL) == NULL); /* larger than the device */
  CHECK(strstr(npualloc_last_error(), "out of memory") != NULL);
  CHECK(strstr(npualloc_last_error(), "Tried to allocate 1.00 TiB") != NULL);
  CHECK(invariants_ok(0));
}

static void test_unknown_pointers(void) {
  int dummy;
  npualloc_free(&dummy, 4, 0, NULL);
  CHECK(strstr(npualloc_last_error(), "unknown pointer") != NULL);
  void *p = npualloc_malloc(4096, 0, NULL);
  npualloc_free(p, 4096, 0, NULL);
  npualloc_free(p, 4096, 0, NULL); /* double free */
  CHECK(strstr(npualloc_last_error(), "npualloc_free: unknown pointer") != NULL);
  npualloc_record_stream(p, NULL);
  CHECK(strstr(npualloc_last_error(), "npualloc_record_stream") != NULL);
  CHECK(npualloc_base_alloc(p, NULL) == NULL);
  CHECK(invariants_ok(0));
}

static void test_invalid_devices(void) {
  CHECK(npualloc_malloc(16, -1, NULL) == NULL);
  CHECK(strstr(npualloc_last_error(), "invalid device -1") != NULL);
  CHECK(npualloc_malloc(16, 2, NULL) == NULL);
  npualloc_device_stats st;
  CHECK(npualloc_get_device_stats(7, &st) == NPUALLOC_ERR_INVALID_DEVICE);
  CHECK(npualloc_get_device_stats(0, NULL) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_empty_cache_device(-3) == NPUALLOC_ERR_INVALID_DEVICE);
  /* device 1 works and is separate */
  void *p = npualloc_malloc(64, 1, NULL);
  CHECK(p != NULL);
  ctl_counters c1;
  CHECK(ctl_get_counters(1, &c1) == NPUALLOC_OK);
  CHECK(c1.live_bytes == 2u << 20);
  npualloc_free(p, 64, 1, NULL);
  CHECK(npualloc_empty_cache_device(1) == NPUALLOC_OK);
  CHECK(ctl_get_counters(1, &c1) == NPUALLOC_OK);
  CHECK(c1.live_bytes == 0);
}

/* The device passed to npualloc_free is a hint: a wrong or invalid one still frees. */
static void test_free_with_wrong_device_hint(void) {
  npualloc_device_stats st;
  CHECK(npualloc_get_device_stats(1, &st) == NPUALLOC_OK);
  int64_t live = st.allocation[0].current;
  void *p = npualloc_malloc(4096, 1, NULL);
  void *q = npualloc_malloc(4096, 1, NULL);
  CHECK(p != NULL && q != NULL);
  npualloc_free(p, 4096, 0, NULL);
  npualloc_free(q, 4096, -1, NULL);
  CHECK(npualloc_get_device_stats(1, &st) == NPUALLOC_OK);
  CHECK(st.allocation[0].current == live);
  CHECK(invariants_ok(0) && invariants_ok(1));
}

static void test_cross_stream(void) {
  npualloc_stream side = NULL;
  CHECK(ctl_create_stream(0, &side) == NPUALLOC_OK);
  CHECK(side != NULL);
  void *p = npualloc_malloc(8192, 0, NULL);
  npualloc_record_stream(p, side);
  CHECK(ctl_launch(0, side, 3) == NPUALLOC_OK); /* side stream busy */
  npualloc_free(p, 8192, 0, NULL);
  void *q = npualloc_malloc(8192, 0, NULL);
  CHECK(q != p); /* not reused while side may still use it */
  CHECK(ctl_complete(0, side) == NPUALLOC_OK);
  void *r = npualloc_malloc(8192, 0, NULL);
  CHECK(r == p); /* reused after completion */
  npualloc_free(q, 0, 0, NULL);
  npualloc_free(r, 0, 0, NULL);
  /* erase_stream forgets the use */
  void *e = npualloc_malloc(512, 0, NULL);
  npualloc_record_stream(e, side);
  npualloc_erase_stream(e, side);
  ctl_counters before, after;
  ctl_get_counters(0, &before);
  npualloc_free(e, 0, 0, NULL);
  ctl_get_counters(0, &after);
  CHECK(after.event_records == before.event_records);
  /* unknown stream (ACL cannot tell a stream handle is bogus; the sim can) */
  if (!ctl_is_acl()) {
    void *u = npualloc_malloc(512, 0, (npualloc_stream)0x12345);
    CHECK(u == NULL);
    CHECK(strstr(npualloc_last_error(), "unknown stream") != NULL);
  }
  CHECK(invariants_ok(0));
}

static void test_stats(void) {
  npualloc_empty_cache(true);
  npualloc_device_stats s;
  CHECK(npualloc_get_device_stats(0, &s) == NPUALLOC_OK);
  int64_t retries = s.num_alloc_retries;
  void *p = npualloc_malloc(3u << 20, 0, NULL);
  CHECK(npualloc_get_device_stats(0, &s) == NPUALLOC_OK);
  CHECK(s.allocation[0].current == 1);
  CHECK(s.allocated_bytes[2].current == (int64_t)ctl_block(3u << 20));
  CHECK(s.requested_bytes[0].current == 3 << 20);
  CHECK(s.reserved_bytes[0].current == 20 << 20);
  CHECK(s.segment[2].current == 1);
  CHECK(s.max_split_size == INT64_MAX);
  CHECK(s.num_alloc_retries == retries);
  npualloc_free(p, 0, 0, NULL);
  npualloc_reset_peak_stats(0);
  CHECK(npualloc_get_device_stats(0, &s) == NPUALLOC_OK);
  CHECK(s.allocated_bytes[0].peak == 0);
  npualloc_empty_cache_all();
  CHECK(npualloc_get_device_stats(0, &s) == NPUALLOC_OK);
  CHECK(s.reserved_bytes[0].current == 0);
  /* One thread on two streams (#17 item 9): the aggregate peak is the peak of the
     sum. Main 4 MiB, side 6 MiB (10 live), main frees, main 8 MiB (14 live: the
     peak), all freed; each stream's own peak says 8 or 6. */
  npualloc_stream side = NULL;
  CHECK(ctl_create_stream(0, &side) == NPUALLOC_OK);
  CHECK(npualloc_get_device_stats(0, &s) == NPUALLOC_OK);
  int64_t base = s.requested_bytes[0].current, live = s.allocation[0].current;
  npualloc_reset_peak_stats(0);
  void *m1 = npualloc_malloc(4u << 20, 0, NULL);
  void *s1 = npualloc_malloc(6u << 20, 0, side);
  npualloc_free(m1, 4u << 20, 0, NULL);
  void *m2 = npualloc_malloc(8u << 20, 0, NULL);
  npualloc_free(m2, 8u << 20, 0, NULL);
  npualloc_free(s1, 6u << 20, 0, side);
  CHECK(npualloc_get_device_stats(0, &s) == NPUALLOC_OK);
  CHECK(s.requested_bytes[0].peak == base + (14 << 20));
  CHECK(s.requested_bytes[2].peak >= 14 << 20);
  CHECK(s.allocation[0].peak == live + 2);
  CHECK(s.allocation[0].current == live);
  CHECK(invariants_ok(0));
}

static void test_fraction_and_configure(void) {
  /* configure after the first allocation is refused */
  CHECK(npualloc_configure("max_split_size_mb:128") == NPUALLOC_ERR_INVALID_STATE);
  CHECK(npualloc_configure("bogus:1") == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(strstr(npualloc_last_error(), "bogus") != NULL);
  CHECK(npualloc_configure(NULL) == NPUALLOC_ERR_INVALID_ARGUMENT);
  npualloc_set_memory_fraction(0.01, 0); /* ~10 MiB of 1 GiB */
  CHECK(npualloc_malloc(30u << 20, 0, NULL) == NULL);
  CHECK(strstr(npualloc_last_error(), "allowed") != NULL);
  npualloc_set_memory_fraction(2.0, 0);
  CHECK(strstr(npualloc_last_error(), "not within [0, 1]") != NULL);
  npualloc_set_memory_fraction(1.0, 0);
  void *p = npualloc_malloc(30u << 20, 0, NULL);
  CHECK(p != NULL);
  npualloc_free(p, 0, 0, NULL);
}

static void test_tags(void) {
  npualloc_stream s1 = NULL, s2 = NULL;
  ctl_create_stream(0, &s1);
  ctl_create_stream(0, &s2);
  CHECK(npualloc_tag_stream("66", s1) == NPUALLOC_OK);
  CHECK(npualloc_tag_stream("66", s1) == NPUALLOC_OK);
  CHECK(npualloc_tag_stream("66", s2) == NPUALLOC_ERR_INVALID_STATE);
  CHECK(npualloc_tag_stream("default", s1) == NPUALLOC_ERR_INVALID_STATE);
  CHECK(npualloc_tag_stream("", s1) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_tag_stream(NULL, s1) == NPUALLOC_ERR_INVALID_ARGUMENT);
  void *p = npualloc_malloc(4096, 0, NULL);
  CHECK(npualloc_record_tagged_stream(p, "77") == NPUALLOC_ERR_UNKNOWN_TAG);
  CHECK(npualloc_record_tagged_stream(p, "66") == NPUALLOC_OK);
  ctl_launch(0, s1, 1);
  npualloc_free(p, 0, 0, NULL);
  void *q = npualloc_malloc(4096, 0, NULL);
  CHECK(q != p);
  ctl_complete(0, s1);
  npualloc_free(q, 0, 0, NULL);
  /* An unknown stream (0xdead) is accepted by tag_stream and erase_stream on both
     backends: a binding is only a name, and erasing a use never recorded forgets
     nothing, with no device call. The handle is refused where it reaches the device:
     the sim refuses it at record_tagged_stream; ACL cannot check a handle, so there
     the error would come from the event record at free (not exercised here). */
  npualloc_stream bogus = (npualloc_stream)0xdead;
  CHECK(npualloc_tag_stream("bogus", bogus) == NPUALLOC_OK);
  void *b = npualloc_malloc(4096, 0, NULL);
  ctl_counters c0, c1;
  ctl_get_counters(0, &c0);
  npualloc_erase_stream(b, bogus);
  if (!ctl_is_acl()) CHECK(npualloc_record_tagged_stream(b, "bogus") != NPUALLOC_OK);
  npualloc_free(b, 0, 0, NULL);
  ctl_get_counters(0, &c1);
  CHECK(c1.event_records == c0.event_records);
  CHECK(invariants_ok(0));
  CHECK(npualloc_tagged_event_record("ev", NULL) == NPUALLOC_ERR_UNKNOWN_TAG);
  CHECK(npualloc_tagged_event_create("ev") == NPUALLOC_OK);
  CHECK(npualloc_tagged_event_create("ev") == NPUALLOC_ERR_INVALID_STATE);
  CHECK(npualloc_tagged_event_wait("ev", s2) == NPUALLOC_OK); /* never recorded: no-op */
  CHECK(npualloc_tagged_event_record("ev", NULL) == NPUALLOC_OK);
  CHECK(npualloc_tagged_event_wait("ev", s2) == NPUALLOC_OK);
  CHECK(invariants_ok(0));
}

static int oom_calls = 0;
static size_t oom_requested = 0, oom_capacity = 0;
static void on_oom(int device, size_t requested, size_t capacity, size_t free_bytes) {
  (void)device;
  (void)free_bytes;
  oom_calls++;
  oom_requested = requested;
  oom_capacity = capacity;
}

static void test_oom_observer(void) {
  CHECK(npualloc_set_oom_observer(on_oom) == NPUALLOC_OK);
  CHECK(npualloc_malloc((size_t)1 << 40, 0, NULL) == NULL);
  CHECK(oom_calls == 1);
  CHECK(oom_requested == (size_t)1 << 40);
  CHECK(oom_capacity == (size_t)1 << 30); /* the 1 GiB test device */
  CHECK(npualloc_set_oom_observer(NULL) == NPUALLOC_OK);
  CHECK(npualloc_malloc((size_t)1 << 40, 0, NULL) == NULL);
  CHECK(oom_calls == 1);
}

static void test_graph_pools(void) {
  npualloc_stream cap = NULL;
  CHECK(ctl_create_stream(0, &cap) == NPUALLOC_OK);
  void *normal = npualloc_malloc(4096, 0, cap);
  size_t seg = 0;
  void *normal_base = npualloc_base_alloc(normal, &seg);
  npualloc_free(normal, 0, 0, cap);
  CHECK(npualloc_begin_allocate_to_pool(0, 0, 0, cap) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_begin_allocate_to_pool(0, 1, 2, cap) == NPUALLOC_OK);
  CHECK(npualloc_begin_allocate_to_pool(0, 3, 4, cap) == NPUALLOC_ERR_INVALID_STATE);
  void *g = npualloc_malloc(4096, 0, cap);
  CHECK(g != NULL);
  CHECK(npualloc_base_alloc(g, &seg) != normal_base); /* private memory */
  CHECK(npualloc_end_allocate_to_pool(0, 1, 2) == NPUALLOC_OK);
  CHECK(npualloc_end_allocate_to_pool(0, 1, 2) == NPUALLOC_ERR_INVALID_STATE);
  npualloc_free(g, 0, 0, cap);
  CHECK(npualloc_release_pool(0, 1, 2) == NPUALLOC_OK);
  CHECK(npualloc_release_pool(0, 1, 2) == NPUALLOC_ERR_UNKNOWN_POOL); /* no use left */
  CHECK(npualloc_release_pool(0, 9, 9) == NPUALLOC_ERR_UNKNOWN_POOL);
  CHECK(npualloc_release_pool(0, 0, 0) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_check_invariants(0) == NPUALLOC_OK);
}

static const npualloc_private_pool_stats *find_pool(const npualloc_private_pool_stats *p, size_t n,
                                                   uint64_t hi, uint64_t lo) {
  for (size_t i = 0; i < n; ++i)
    if (p[i].id_hi == hi && p[i].id_lo == lo) return &p[i];
  return NULL;
}

/* torch 2.14's reserved_bytes_by_private_pools: one entry for a pool two streams allocate
 * to (their segments together), kept after the pool's memory went back (current 0) with
 * its peak until the peak reset. Entries of earlier tests' pools stay too. */
static void test_private_pool_stats(void) {
  enum { CAP = 8 };
  npualloc_private_pool_stats pools[CAP];
  size_t n = 99;
  CHECK(npualloc_get_private_pool_stats(0, NULL, 0, &n) == NPUALLOC_OK); /* count only */
  size_t before = n;
  CHECK(before < CAP - 1);
  CHECK(npualloc_get_private_pool_stats(0, pools, CAP, NULL) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(strstr(npualloc_last_error(), "npualloc_get_private_pool_stats: count is NULL") != NULL);
  CHECK(npualloc_get_private_pool_stats(0, NULL, 1, &n) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_get_private_pool_stats(5, pools, CAP, &n) == NPUALLOC_ERR_INVALID_DEVICE);
  npualloc_stream a = NULL, b = NULL;
  CHECK(ctl_create_stream(0, &a) == NPUALLOC_OK);
  CHECK(ctl_create_stream(0, &b) == NPUALLOC_OK);
  CHECK(npualloc_begin_allocate_to_pool(0, 5, 6, a) == NPUALLOC_OK);
  CHECK(npualloc_begin_allocate_to_pool(0, 5, 6, b) == NPUALLOC_OK);
  void *x = npualloc_malloc(3u << 20, 0, a); /* a 20 MiB large segment */
  void *y = npualloc_malloc(4096, 0, b);      /* a 2 MiB small segment */
  CHECK(x != NULL && y != NULL);
  CHECK(npualloc_get_private_pool_stats(0, pools, CAP, &n) == NPUALLOC_OK);
  CHECK(n == before + 1);
  const npualloc_private_pool_stats *p = find_pool(pools, n, 5, 6);
  CHECK(p != NULL);
  if (p) {
    CHECK(p->reserved_bytes[0].current == 22 << 20);
    CHECK(p->reserved_bytes[1].current == 2 << 20);
    CHECK(p->reserved_bytes[2].current == 20 << 20);
  }
  /* A buffer too small: the count still says how many there are; nothing past it. */
  pools[n - 1].id_hi = 777;
  size_t m = 0;
  CHECK(npualloc_get_private_pool_stats(0, pools, n - 1, &m) == NPUALLOC_OK);
  CHECK(m == n && pools[n - 1].id_hi == 777);
  CHECK(npualloc_end_allocate_to_pool(0, 5, 6) == NPUALLOC_OK);
  CHECK(npualloc_end_allocate_to_pool(0, 5, 6) == NPUALLOC_OK);
  npualloc_free(x, 0, 0, a);
  npualloc_free(y, 0, 0, b);
  /* One use per begin: the pool keeps its memory until both are released. */
  CHECK(npualloc_release_pool(0, 5, 6) == NPUALLOC_OK);
  CHECK(npualloc_empty_cache_device(0) == NPUALLOC_OK);
  CHECK(npualloc_get_private_pool_stats(0, pools, CAP, &n) == NPUALLOC_OK);
  p = find_pool(pools, n, 5, 6);
  CHECK(p != NULL && p->reserved_bytes[0].current == 22 << 20);
  CHECK(npualloc_release_pool(0, 5, 6) == NPUALLOC_OK);
  CHECK(npualloc_empty_cache_device(0) == NPUALLOC_OK);
  CHECK(npualloc_get_private_pool_stats(0, pools, CAP, &n) == NPUALLOC_OK);
  CHECK(n == before + 1);
  p = find_pool(pools, n, 5, 6);
  CHECK(p != NULL);
  if (p) {
    CHECK(p->reserved_bytes[0].current == 0);
    CHECK(p->reserved_bytes[0].peak == 22 << 20);
    CHECK(p->reserved_bytes[0].freed == 22 << 20);
  }
  npualloc_reset_peak_stats(0);
  CHECK(npualloc_get_private_pool_stats(0, pools, CAP, &n) == NPUALLOC_OK);
  p = find_pool(pools, n, 5, 6);
  CHECK(p != NULL && p->reserved_bytes[0].peak == 0 && p->reserved_bytes[0].allocated == 22 << 20);
  CHECK(npualloc_check_invariants(0) == NPUALLOC_OK);
}

/* A stream with no fitting cached block borrows another stream's idle segment: no
 * device allocation, one event recorded on the lender's stream for the borrower to
 * wait on. */
static void test_lending(void) {
  npualloc_stream lender = NULL, borrower = NULL;
  CHECK(ctl_create_stream(0, &lender) == NPUALLOC_OK);
  CHECK(ctl_create_stream(0, &borrower) == NPUALLOC_OK);
  npualloc_empty_cache(true);
  size_t big = (size_t)30 << 20;
  void *p = npualloc_malloc(big, 0, lender);
  CHECK(p != NULL);
  CHECK(ctl_launch(0, lender, 2) == NPUALLOC_OK); /* work on p still queued */
  npualloc_free(p, big, 0, lender);
  ctl_counters before, after;
  CHECK(ctl_get_counters(0, &before) == NPUALLOC_OK);
  void *q = npualloc_malloc(big, 0, borrower);
  CHECK(ctl_get_counters(0, &after) == NPUALLOC_OK);
  CHECK(q == p);
  CHECK(after.mallocs == before.mallocs);
  CHECK(after.event_records == before.event_records + 1);
  CHECK(after.violations == 0);
  CHECK(npualloc_check_invariants(0) == NPUALLOC_OK);
  CHECK(ctl_complete(0, lender) == NPUALLOC_OK);
  npualloc_free(q, big, 0, borrower);
  CHECK(npualloc_check_invariants(0) == NPUALLOC_OK);
}

/* Block lending: a stream with no fit takes a free block of another stream's segment
 * (no device allocation; one ordering event); freed, the block goes straight back to
 * the lender (one fence event) and the lender takes it again ordered after the
 * borrower's work (one more event), with no host wait and no misuse. */
static void test_block_lending(void) {
  npualloc_stream lender = NULL, borrower = NULL;
  CHECK(ctl_create_stream(0, &lender) == NPUALLOC_OK);
  CHECK(ctl_create_stream(0, &borrower) == NPUALLOC_OK);
  npualloc_empty_cache(true);
  size_t mib = (size_t)1 << 20;
  void *anchor = npualloc_malloc(4 * mib, 0, lender);
  CHECK(anchor != NULL);
  ctl_counters c0, c1, c2, c3;
  CHECK(ctl_get_counters(0, &c0) == NPUALLOC_OK);
  void *q = npualloc_malloc(8 * mib, 0, borrower);
  CHECK(q != NULL);
  CHECK(ctl_get_counters(0, &c1) == NPUALLOC_OK);
  CHECK(c1.mallocs == c0.mallocs);
  CHECK(c1.event_records == c0.event_records + 1);
  CHECK(ctl_launch(0, borrower, 2) == NPUALLOC_OK); /* work on q still queued */
  npualloc_free(q, 8 * mib, 0, borrower);
  CHECK(ctl_get_counters(0, &c2) == NPUALLOC_OK);
  CHECK(c2.event_records == c1.event_records + 1);
  void *r = npualloc_malloc(8 * mib, 0, lender);
  CHECK(r == q);
  CHECK(ctl_get_counters(0, &c3) == NPUALLOC_OK);
  CHECK(c3.mallocs == c0.mallocs);
  CHECK(c3.event_records == c2.event_records + 1);
  CHECK(c3.violations == 0);
  CHECK(npualloc_check_invariants(0) == NPUALLOC_OK);
  CHECK(ctl_complete(0, borrower) == NPUALLOC_OK);
  CHECK(ctl_complete(0, lender) == NPUALLOC_OK);
  npualloc_free(r, 8 * mib, 0, lender);

  /* A borrower that starts a graph capture gets no event recorded on it: its lent
   * block, freed during the capture, is kept until the next full synchronisation. */
  void *t = npualloc_malloc(8 * mib, 0, borrower);
  CHECK(t == q);
  CHECK(npualloc_begin_allocate_to_pool(0, 9, 9, borrower) == NPUALLOC_OK);
  ctl_counters c4, c5;
  CHECK(ctl_get_counters(0, &c4) == NPUALLOC_OK);
  npualloc_free(t, 8 * mib, 0, borrower);
  CHECK(ctl_get_counters(0, &c5) == NPUALLOC_OK);
  CHECK(c5.event_records == c4.event_records);
  void *u = npualloc_malloc(8 * mib, 0, lender);
  CHECK(u != NULL && u != t);
  CHECK(npualloc_end_allocate_to_pool(0, 9, 9) == NPUALLOC_OK);
  CHECK(npualloc_release_pool(0, 9, 9) == NPUALLOC_OK);
  CHECK(npualloc_check_invariants(0) == NPUALLOC_OK);
  npualloc_free(u, 8 * mib, 0, lender);
  npualloc_free(anchor, 4 * mib, 0, lender);
  CHECK(npualloc_check_invariants(0) == NPUALLOC_OK);
}

static void test_snapshot(const char *path) {
  void *p = npualloc_malloc(1000, 0, NULL);
  CHECK(npualloc_dump_snapshot(path) == NPUALLOC_OK);
  FILE *f = fopen(path, "r");
  CHECK(f != NULL);
  if (f) {
    char buf[4096] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    CHECK(n > 0);
    CHECK(strstr(buf, "\"segments\"") != NULL);
    CHECK(strstr(buf, "active_allocated") != NULL);
  }
  CHECK(npualloc_dump_snapshot("/nonexistent-dir/x.json") == NPUALLOC_ERR_IO);
  CHECK(npualloc_dump_snapshot(NULL) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_dump_snapshot("") == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_last_error() && strstr(npualloc_last_error(), "empty") != NULL);
  npualloc_free(p, 0, 0, NULL);
}

/* Before any allocation: a roundup_power2_divisions value that overflowed the rounding
 * (2^55) is refused, and allocation works afterwards. */
static void test_configure_bounds(void) {
  CHECK(npualloc_configure("roundup_power2_divisions:36028797018963968") == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_last_error() && strstr(npualloc_last_error(), "at most") != NULL);
  CHECK(npualloc_configure("roundup_power2_divisions:[256:1,>:268435456]") == NPUALLOC_ERR_INVALID_ARGUMENT);
}

/* Without the profiler library (none is set here) mstx messages are checked exactly as
 * with it (test_mstx.c). */
static void test_mstx_without_library(void) {
  char longmsg[300];
  memset(longmsg, 'x', sizeof longmsg - 1);
  longmsg[sizeof longmsg - 1] = 0;
  uint64_t id = 7;
  CHECK(npualloc_mstx_mark("", NULL) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_mstx_mark(longmsg, NULL) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_mstx_range_start("", NULL, &id) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_mstx_range_start(longmsg, NULL, &id) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_mstx_mark("ok", NULL) == NPUALLOC_OK);
  CHECK(npualloc_mstx_range_start("ok", NULL, &id) == NPUALLOC_OK);
  CHECK(id == 0); /* nothing to end */
}

static void test_hooks_too_late(void) {
  npualloc_runtime_hooks h;
  memset(&h, 0, sizeof h);
  CHECK(npualloc_set_runtime_hooks(&h) == NPUALLOC_ERR_INVALID_STATE);
}

static void test_drained(void) {
  npualloc_empty_cache(false);
  ctl_counters c;
  CHECK(ctl_get_counters(0, &c) == NPUALLOC_OK);
  CHECK(c.live_bytes == 0);
  CHECK(c.violations == 0);
  CHECK(c.events_created == c.events_destroyed + 1); /* the tagged event "ev" stays */
  CHECK(ctl_get_counters(0, NULL) == NPUALLOC_ERR_INVALID_ARGUMENT);
  npualloc_sim_counters sc;
  CHECK(npualloc_sim_get_counters(0, &sc) == (ctl_is_acl() ? NPUALLOC_ERR_INVALID_STATE : NPUALLOC_OK));
  CHECK(invariants_ok(0));
}

int main(int argc, char **argv) {
  CHECK(npualloc_last_error() == NULL); /* a thread that never failed sees NULL */
  CHECK(npualloc_device_count() == 2);
  test_configure_bounds();
  test_mstx_without_library();
  test_malloc_free_reuse();
  test_zero_and_bad_sizes();
  test_unknown_pointers();
  test_invalid_devices();
  test_free_with_wrong_device_hint();
  test_cross_stream();
  test_stats();
  test_fraction_and_configure();
  test_tags();
  test_oom_observer();
  test_graph_pools();
  test_private_pool_stats();
  test_lending();
  test_block_lending();
  test_snapshot(argc > 1 ? argv[1] : "/tmp/npualloc-c-snapshot.json");
  test_hooks_too_late();
  test_drained();
  return REPORT("c-abi");
}
