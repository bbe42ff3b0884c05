/* Runtime hooks (npualloc_set_runtime_hooks): a host framework's own events and device
 * drain replace the backend's. Runs in a fresh process: hooks must come first. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "npualloc.h"
#include "check.h"
#include "backend_ctl.h"

typedef struct {
  int recorded, done;
} host_event;

static int creates, destroys, records, queries, syncs, drains;
static int ctx_ok = 1;
static int release_events = 0; /* when set, every event reports done */

static int ev_create(void *ctx, int device, void **ev) {
  ctx_ok &= ctx == (void *)&creates && device == 0;
  *ev = calloc(1, sizeof(host_event));
  creates++;
  return 0;
}
static int ev_destroy(void *ctx, void *ev) { (void)ctx; free(ev); destroys++; return 0; }
static int ev_record(void *ctx, void *ev, npualloc_stream s) {
  (void)ctx; (void)s;
  ((host_event *)ev)->recorded = 1;
  ((host_event *)ev)->done = 0;
  records++;
  return 0;
}
static int ev_query(void *ctx, void *ev, int *done) {
  (void)ctx;
  queries++;
  *done = release_events || ((host_event *)ev)->done;
  return 0;
}
static int ev_sync(void *ctx, void *ev) { (void)ctx; ((host_event *)ev)->done = 1; syncs++; return 0; }
static int dev_sync(void *ctx, int device) { (void)ctx; (void)device; drains++; return 0; }

int main(void) {
  npualloc_runtime_hooks partial;
  memset(&partial, 0, sizeof partial);
  partial.event_create = ev_create; /* the event hooks come as a set */
  CHECK(npualloc_set_runtime_hooks(&partial) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(strstr(npualloc_last_error(), "as a set") != NULL);

  npualloc_runtime_hooks h = {(void *)&creates, ev_create, ev_destroy, ev_record,
                              ev_query, ev_sync, dev_sync};
  CHECK(npualloc_set_runtime_hooks(&h) == NPUALLOC_OK);

  npualloc_stream side = NULL;
  CHECK(ctl_create_stream(0, &side) == 0);
  void *p = npualloc_malloc(4096, 0, NULL);
  npualloc_record_stream(p, side);
  npualloc_free(p, 0, 0, NULL);
  CHECK(creates == 1 && records == 1);
  void *q = npualloc_malloc(4096, 0, NULL);
  CHECK(q != p);     /* the host event says "not done" */
  CHECK(queries >= 1);
  release_events = 1;
  void *r = npualloc_malloc(4096, 0, NULL);
  CHECK(r == p);     /* reused once the host's event completed */
  npualloc_free(q, 0, 0, NULL);
  npualloc_free(r, 0, 0, NULL);
  /* A pending free is synchronised through the hook; segments are freed after a drain. */
  release_events = 0;
  void *s = npualloc_malloc(30u << 20, 0, NULL);
  npualloc_record_stream(s, side);
  npualloc_free(s, 0, 0, NULL);
  npualloc_empty_cache(true);
  CHECK(syncs == 1);
  CHECK(drains >= 1);
  CHECK(destroys == creates); /* empty_cache destroys idle events through the hook */
  CHECK(ctx_ok);
  CHECK(npualloc_check_invariants(0) == NPUALLOC_OK);
  ctl_counters c;
  CHECK(ctl_get_counters(0, &c) == 0);
  CHECK(c.live_bytes == 0);
  CHECK(c.event_records == 0); /* the backend's own events were never used */
  CHECK(c.violations == 0);
  return REPORT("c-hooks");
}
