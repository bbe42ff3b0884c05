/* Test controls of whichever backend the ABI runs on: the simulated device
 * (npualloc_sim_*) or the fake ACL runtime (fake_acl_*, found with dlopen on
 * NPUALLOC_ACL_LIB, the same library instance npualloc loaded). */
#ifndef NPUALLOC_TEST_BACKEND_CTL_H
#define NPUALLOC_TEST_BACKEND_CTL_H
#include <dlfcn.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "npualloc.h"

typedef struct {
  uint64_t mallocs, frees, live_bytes, events_created, events_destroyed, event_records,
      violations, set_device_calls, synchronize_calls, stream_waits, init_calls, maps, unmaps,
      live_reservations, live_physical;
} fake_acl_counters;

typedef struct {
  uint64_t live_bytes, events_created, events_destroyed, event_records, violations, mallocs;
} ctl_counters;

static void *ctl_fake = NULL;

static inline int ctl_is_acl(void) {
  const char *b = getenv("NPUALLOC_BACKEND");
  return b && strcmp(b, "acl") == 0;
}

/* Bytes added to each request before rounding (torch_npu's 32 on Ascend). */
static inline size_t ctl_pad(void) { return ctl_is_acl() ? 32 : 0; }

/* The block size a request of n bytes gets (512-byte rounding, no divisions). */
static inline size_t ctl_block(size_t n) { return (n + ctl_pad() + 511) / 512 * 512; }

static inline void *ctl_sym(const char *name) {
  if (!ctl_fake) {
    npualloc_init(0); /* make npualloc load the library first */
    ctl_fake = dlopen(getenv("NPUALLOC_ACL_LIB"), RTLD_NOW);
    if (!ctl_fake) { fprintf(stderr, "dlopen fake ACL: %s\n", dlerror()); exit(2); }
  }
  void *s = dlsym(ctl_fake, name);
  if (!s) { fprintf(stderr, "fake ACL lacks %s\n", name); exit(2); }
  return s;
}

static inline int ctl_create_stream(int device, npualloc_stream *out) {
  if (!ctl_is_acl()) return npualloc_sim_create_stream(device, out);
  return ((int (*)(int, void **))ctl_sym("fake_acl_create_stream"))(device, out);
}

static inline int ctl_launch(int device, npualloc_stream s, unsigned n) {
  if (!ctl_is_acl()) return npualloc_sim_launch(device, s, n);
  return ((int (*)(int, void *, unsigned))ctl_sym("fake_acl_launch"))(device, s, n);
}

static inline int ctl_complete(int device, npualloc_stream s) {
  if (!ctl_is_acl()) return npualloc_sim_complete_stream(device, s);
  return ((int (*)(int, void *))ctl_sym("fake_acl_complete"))(device, s);
}

static inline int ctl_get_counters(int device, ctl_counters *out) {
  if (!out) return NPUALLOC_ERR_INVALID_ARGUMENT;
  if (!ctl_is_acl()) {
    npualloc_sim_counters c;
    int rc = npualloc_sim_get_counters(device, &c);
    *out = (ctl_counters){c.live_bytes, c.events_created, c.events_destroyed, c.event_records, c.violations, c.mallocs};
    return rc;
  }
  fake_acl_counters c;
  ((void (*)(fake_acl_counters *))ctl_sym("fake_acl_get_counters"))(&c);
  uint64_t live = ((uint64_t (*)(int))ctl_sym("fake_acl_live_bytes"))(device);
  *out = (ctl_counters){live, c.events_created, c.events_destroyed, c.event_records, c.violations, c.mallocs};
  return 0;
}
#endif
