/* Expandable segments through the C ABI, on the simulated device and on the fake ACL
 * runtime: pages mapped as a stream's memory grows, runs that extend in place, free
 * pages unmapped on empty_cache after the stream's queued work ran, cross-stream frees,
 * the snapshot's is_expandable. */
#include <string.h>

#include "backend_ctl.h"
#include "check.h"

#define MIB ((size_t)1 << 20)

static int64_t device_allocs(void) {
  npualloc_device_stats s;
  memset(&s, 0, sizeof s);
  CHECK(npualloc_get_device_stats(0, &s) == NPUALLOC_OK);
  return s.num_device_alloc;
}

/* A host framework's device-synchronise hook (torch_npu drains its task queue there). */
static int drains = 0;
static int drain_hook(void *ctx, int device) {
  (void)ctx;
  (void)device;
  drains++;
  return 0;
}

int main(int argc, char **argv) {
  /* With runtime hooks installed, virtual memory still reaches the backend. */
  npualloc_runtime_hooks h;
  memset(&h, 0, sizeof h);
  h.device_synchronize = drain_hook;
  CHECK(npualloc_set_runtime_hooks(&h) == NPUALLOC_OK);
  /* Fixed 20 MiB pages, as PyTorch's (the checks below count them). */
  CHECK(npualloc_configure("expandable_segments:True,adaptive_pages:False") == NPUALLOC_OK);
  ctl_counters c;

  /* 30 MiB: two 20 MiB pages; 15 MiB more: one page, right after the first block. */
  void *a = npualloc_malloc(30 * MIB, 0, NULL);
  CHECK(a != NULL);
  void *b = npualloc_malloc(15 * MIB, 0, NULL);
  CHECK(b == (char *)a + ctl_block(30 * MIB));
  CHECK(device_allocs() == 3);
  CHECK(ctl_get_counters(0, &c) == NPUALLOC_OK);
  CHECK(c.live_bytes == 60 * MIB);
  CHECK(c.mallocs == 0); /* no ordinary segments */
  CHECK(npualloc_check_invariants(0) == NPUALLOC_OK);

  /* The snapshot reports the run as expandable. */
  const char *path = argc > 1 ? argv[1] : "/tmp/npualloc-c-expandable.json";
  CHECK(npualloc_dump_snapshot(path) == NPUALLOC_OK);
  FILE *f = fopen(path, "r");
  CHECK(f != NULL);
  if (f) {
    char buf[8192] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    CHECK(n > 0 && strstr(buf, "\"is_expandable\":true") != NULL);
  }

  /* A block used on another stream waits for it, even across an empty_cache. */
  npualloc_stream side = NULL;
  CHECK(ctl_create_stream(0, &side) == NPUALLOC_OK);
  npualloc_record_stream(b, side);
  CHECK(ctl_launch(0, side, 1) == NPUALLOC_OK);
  npualloc_free(b, 15 * MIB, 0, NULL);
  void *b2 = npualloc_malloc(15 * MIB, 0, NULL);
  CHECK(b2 != NULL && b2 != b);
  npualloc_free(b2, 15 * MIB, 0, NULL);
  CHECK(ctl_complete(0, side) == NPUALLOC_OK);

  /* Work still queued on the stream: unmapping waits for it. */
  CHECK(ctl_launch(0, NULL, 2) == NPUALLOC_OK);
  npualloc_free(a, 30 * MIB, 0, NULL);
  int drains_before = drains;
  npualloc_empty_cache(true);
  CHECK(drains > drains_before); /* the host queue was drained before unmapping */
  CHECK(ctl_get_counters(0, &c) == NPUALLOC_OK);
  CHECK(c.live_bytes == 0);
  CHECK(c.violations == 0);
  CHECK(npualloc_check_invariants(0) == NPUALLOC_OK);

  /* Growing again after everything went back. */
  void *d = npualloc_malloc(100 * MIB, 0, NULL);
  CHECK(d != NULL);
  npualloc_free(d, 100 * MIB, 0, NULL);
  npualloc_empty_cache(true);
  CHECK(ctl_get_counters(0, &c) == NPUALLOC_OK);
  CHECK(c.live_bytes == 0 && c.violations == 0);
  return REPORT("c-expandable");
}
