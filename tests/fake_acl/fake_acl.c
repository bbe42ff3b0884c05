/*
 * A fake Ascend ACL runtime (libascendcl.so) for npualloc's tests.
 *
 * It exports the ACL functions npualloc's ACL backend uses, with the real signatures
 * and constant values (CANN acl_rt.h / acl_base_rt.h), backed by host memory. Streams
 * complete only when a test says so (fake_acl_complete), events complete when their
 * stream has run past them, and every misuse is counted as a violation: freeing an
 * unknown pointer, using a destroyed or unknown event, calling without a current
 * device, touching a device other than the current one.
 *
 * Compile-time variants drop symbols to test symbol probing:
 *   -DFAKE_NO_QUERY_EVENT_STATUS   no aclrtQueryEventStatus (optional symbol)
 *   -DFAKE_NO_ALIGN32              no aclrtMallocAlign32 (optional symbol)
 *   -DFAKE_NO_FREE                 no aclrtFree (required symbol)
 *
 * Environment (read at first use): FAKE_ACL_DEVICES (default 2), FAKE_ACL_CAPACITY
 * (bytes, default 1 GiB), FAKE_ACL_OOM_CODE (default 207001).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int aclError;
typedef void *aclrtStream;
typedef void *aclrtEvent;

#define ACL_SUCCESS 0
#define ACL_ERROR_UNINITIALIZE 100001
#define ACL_ERROR_REPEAT_INITIALIZE 100002
#define ACL_ERROR_RT_PARAM_INVALID 107000
#define ACL_ERROR_RT_INVALID_DEVICEID 107001
#define ACL_ERROR_RT_CONTEXT_NULL 107002
#define ACL_ERROR_RT_MEMORY_ALLOCATION 207001
#define ACL_HBM_MEM 1
#define ACL_EVENT_RECORDED_STATUS_NOT_READY 0
#define ACL_EVENT_RECORDED_STATUS_COMPLETE 1
#define ACL_EVENT_STATUS_COMPLETE 0
#define ACL_EVENT_STATUS_NOT_READY 1

#define MAX_DEVICES 8
#define EXPORT __attribute__((visibility("default")))

typedef struct fake_stream {
  int device;
  uint64_t enqueued;
  uint64_t completed;
  struct fake_stream *next_stream;
} fake_stream;

typedef struct fake_event {
  int device;
  int destroyed;
  uint32_t flags;
  fake_stream *stream; /* last record; NULL if never recorded */
  uint64_t position;
  struct fake_event *next_event;
} fake_event;

typedef struct alloc_rec {
  void *ptr;
  size_t size;
  int device;
} alloc_rec;

typedef struct fake_acl_counters {
  uint64_t mallocs, frees, live_bytes, events_created, events_destroyed, event_records,
      violations, set_device_calls, synchronize_calls, stream_waits, init_calls;
} fake_acl_counters;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int configured = 0, devices = 2, initialized = 0, require_init = 0;
static uint64_t capacity = 1ull << 30;
static int oom_code = ACL_ERROR_RT_MEMORY_ALLOCATION;
static int fail_next_malloc_code = 0;
static uint64_t live_per_device[MAX_DEVICES];
static fake_stream default_streams[MAX_DEVICES];
static fake_stream *streams = NULL;
static fake_event *events = NULL;
static alloc_rec *allocs = NULL;
static size_t n_allocs = 0, cap_allocs = 0;
static fake_acl_counters counters;
static __thread int current_device = -1;
static char last_msg[256] = "";

static void configure(void) {
  if (configured) return;
  configured = 1;
  const char *d = getenv("FAKE_ACL_DEVICES");
  if (d && atoi(d) > 0 && atoi(d) <= MAX_DEVICES) devices = atoi(d);
  const char *c = getenv("FAKE_ACL_CAPACITY");
  if (c && strtoull(c, NULL, 10) > 0) capacity = strtoull(c, NULL, 10);
  const char *o = getenv("FAKE_ACL_OOM_CODE");
  if (o && atoi(o) > 0) oom_code = atoi(o);
  const char *r = getenv("FAKE_ACL_REQUIRE_INIT");
  require_init = r && atoi(r) > 0;
  for (int i = 0; i < MAX_DEVICES; i++) default_streams[i].device = i;
}

static aclError violation(const char *what) {
  counters.violations++;
  strncpy(last_msg, what, sizeof last_msg - 1);
  return ACL_ERROR_RT_PARAM_INVALID;
}

/* Locks, configures, and checks init and the current device when `need_device`. */
static aclError enter(int need_device) {
  pthread_mutex_lock(&mu);
  configure();
  if (require_init && !initialized) return ACL_ERROR_UNINITIALIZE;
  if (need_device && current_device < 0) return violation("no current device set on this thread");
  return ACL_SUCCESS;
}
#define LEAVE(rc)              \
  do {                         \
    aclError rc_ = (rc);       \
    pthread_mutex_unlock(&mu); \
    return rc_;                \
  } while (0)

static fake_stream *stream_of(aclrtStream s) {
  if (!s) return &default_streams[current_device < 0 ? 0 : current_device];
  for (fake_stream *f = streams; f; f = f->next_stream)
    if ((void *)f == s) return f;
  return NULL;
}

static fake_event *event_of(aclrtEvent e) {
  for (fake_event *f = events; f; f = f->next_event)
    if ((void *)f == e) return f->destroyed ? NULL : f;
  return NULL;
}

/* ---- ACL API ------------------------------------------------------------------ */

EXPORT aclError aclInit(const char *config) {
  (void)config;
  pthread_mutex_lock(&mu);
  configure();
  counters.init_calls++;
  if (initialized) LEAVE(ACL_ERROR_REPEAT_INITIALIZE);
  initialized = 1;
  LEAVE(ACL_SUCCESS);
}

EXPORT const char *aclGetRecentErrMsg(void) { return last_msg; }

EXPORT aclError aclrtGetDeviceCount(uint32_t *count) {
  aclError rc = enter(0);
  if (rc) LEAVE(rc);
  *count = (uint32_t)devices;
  LEAVE(ACL_SUCCESS);
}

EXPORT aclError aclrtSetDevice(int32_t id) {
  aclError rc = enter(0);
  if (rc) LEAVE(rc);
  counters.set_device_calls++;
  if (id < 0 || id >= devices) LEAVE(ACL_ERROR_RT_INVALID_DEVICEID);
  current_device = id;
  LEAVE(ACL_SUCCESS);
}

EXPORT aclError aclrtGetDevice(int32_t *id) {
  aclError rc = enter(0);
  if (rc) LEAVE(rc);
  if (current_device < 0) LEAVE(ACL_ERROR_RT_CONTEXT_NULL);
  *id = current_device;
  LEAVE(ACL_SUCCESS);
}

static aclError do_malloc(void **p, size_t size) {
  aclError rc = enter(1);
  if (rc) LEAVE(rc);
  if (fail_next_malloc_code) {
    int code = fail_next_malloc_code;
    fail_next_malloc_code = 0;
    snprintf(last_msg, sizeof last_msg, "injected failure %d", code);
    LEAVE(code);
  }
  if (size == 0 || live_per_device[current_device] + size > capacity) {
    snprintf(last_msg, sizeof last_msg, "out of device memory");
    LEAVE(oom_code);
  }
  void *mem = NULL;
  if (posix_memalign(&mem, 512, size) != 0) LEAVE(oom_code);
  if (n_allocs == cap_allocs) {
    cap_allocs = cap_allocs ? cap_allocs * 2 : 64;
    allocs = realloc(allocs, cap_allocs * sizeof *allocs);
  }
  allocs[n_allocs++] = (alloc_rec){mem, size, current_device};
  live_per_device[current_device] += size;
  counters.mallocs++;
  counters.live_bytes += size;
  *p = mem;
  LEAVE(ACL_SUCCESS);
}

EXPORT aclError aclrtMalloc(void **p, size_t size, int policy) {
  (void)policy;
  /* The real aclrtMalloc pads by 32 bytes. */
  return do_malloc(p, size + 32);
}

#ifndef FAKE_NO_ALIGN32
EXPORT aclError aclrtMallocAlign32(void **p, size_t size, int policy) {
  (void)policy;
  return do_malloc(p, size);
}
#endif

#ifndef FAKE_NO_FREE
EXPORT aclError aclrtFree(void *p) {
  aclError rc = enter(1);
  if (rc) LEAVE(rc);
  for (size_t i = 0; i < n_allocs; i++) {
    if (allocs[i].ptr == p) {
      if (allocs[i].device != current_device) LEAVE(violation("aclrtFree on another device"));
      live_per_device[allocs[i].device] -= allocs[i].size;
      counters.live_bytes -= allocs[i].size;
      counters.frees++;
      free(p);
      allocs[i] = allocs[--n_allocs];
      LEAVE(ACL_SUCCESS);
    }
  }
  LEAVE(violation("aclrtFree of an unknown pointer"));
}
#endif

EXPORT aclError aclrtGetMemInfo(int attr, size_t *free_, size_t *total) {
  aclError rc = enter(1);
  if (rc) LEAVE(rc);
  if (attr != ACL_HBM_MEM) LEAVE(violation("aclrtGetMemInfo: expected ACL_HBM_MEM"));
  *total = capacity;
  *free_ = capacity - live_per_device[current_device];
  LEAVE(ACL_SUCCESS);
}

EXPORT aclError aclrtCreateStream(aclrtStream *s) {
  aclError rc = enter(1);
  if (rc) LEAVE(rc);
  fake_stream *f = calloc(1, sizeof *f);
  f->device = current_device;
  f->next_stream = streams;
  streams = f;
  *s = f;
  LEAVE(ACL_SUCCESS);
}

static aclError create_event(aclrtEvent *e, uint32_t flags) {
  aclError rc = enter(1);
  if (rc) LEAVE(rc);
  fake_event *f = calloc(1, sizeof *f);
  f->device = current_device;
  f->flags = flags;
  f->next_event = events;
  events = f;
  counters.events_created++;
  *e = f;
  LEAVE(ACL_SUCCESS);
}

EXPORT aclError aclrtCreateEvent(aclrtEvent *e) { return create_event(e, 0); }
EXPORT aclError aclrtCreateEventWithFlag(aclrtEvent *e, uint32_t flag) { return create_event(e, flag); }
EXPORT aclError aclrtCreateEventExWithFlag(aclrtEvent *e, uint32_t flag) { return create_event(e, flag); }

EXPORT aclError aclrtRecordEvent(aclrtEvent e, aclrtStream s) {
  aclError rc = enter(1);
  if (rc) LEAVE(rc);
  fake_event *ev = event_of(e);
  fake_stream *st = stream_of(s);
  if (!ev) LEAVE(violation("aclrtRecordEvent: unknown or destroyed event"));
  if (!st) LEAVE(violation("aclrtRecordEvent: unknown stream"));
  if (st->device != current_device || ev->device != current_device)
    LEAVE(violation("aclrtRecordEvent: stream or event of another device"));
  st->enqueued++;
  ev->stream = st;
  ev->position = st->enqueued;
  counters.event_records++;
  LEAVE(ACL_SUCCESS);
}

static int event_done(const fake_event *ev) { return !ev->stream || ev->stream->completed >= ev->position; }

#ifndef FAKE_NO_QUERY_EVENT_STATUS
EXPORT aclError aclrtQueryEventStatus(aclrtEvent e, int *status) {
  aclError rc = enter(0);
  if (rc) LEAVE(rc);
  fake_event *ev = event_of(e);
  if (!ev) LEAVE(violation("aclrtQueryEventStatus: unknown or destroyed event"));
  *status = event_done(ev) ? ACL_EVENT_RECORDED_STATUS_COMPLETE : ACL_EVENT_RECORDED_STATUS_NOT_READY;
  LEAVE(ACL_SUCCESS);
}
#endif

EXPORT aclError aclrtQueryEvent(aclrtEvent e, int *status) {
  aclError rc = enter(0);
  if (rc) LEAVE(rc);
  fake_event *ev = event_of(e);
  if (!ev) LEAVE(violation("aclrtQueryEvent: unknown or destroyed event"));
  *status = event_done(ev) ? ACL_EVENT_STATUS_COMPLETE : ACL_EVENT_STATUS_NOT_READY;
  LEAVE(ACL_SUCCESS);
}

EXPORT aclError aclrtSynchronizeEvent(aclrtEvent e) {
  aclError rc = enter(1);
  if (rc) LEAVE(rc);
  fake_event *ev = event_of(e);
  if (!ev) LEAVE(violation("aclrtSynchronizeEvent: unknown or destroyed event"));
  counters.synchronize_calls++;
  if (ev->stream && ev->stream->completed < ev->position) ev->stream->completed = ev->position;
  LEAVE(ACL_SUCCESS);
}

EXPORT aclError aclrtDestroyEvent(aclrtEvent e) {
  aclError rc = enter(0);
  if (rc) LEAVE(rc);
  fake_event *ev = event_of(e);
  if (!ev) LEAVE(violation("aclrtDestroyEvent: unknown or destroyed event"));
  ev->destroyed = 1; /* kept, so later use is detected */
  counters.events_destroyed++;
  LEAVE(ACL_SUCCESS);
}

EXPORT aclError aclrtStreamWaitEvent(aclrtStream s, aclrtEvent e) {
  aclError rc = enter(1);
  if (rc) LEAVE(rc);
  if (!event_of(e)) LEAVE(violation("aclrtStreamWaitEvent: unknown or destroyed event"));
  if (!stream_of(s)) LEAVE(violation("aclrtStreamWaitEvent: unknown stream"));
  counters.stream_waits++;
  LEAVE(ACL_SUCCESS);
}

EXPORT aclError aclrtSynchronizeDevice(void) {
  aclError rc = enter(1);
  if (rc) LEAVE(rc);
  counters.synchronize_calls++;
  default_streams[current_device].completed = default_streams[current_device].enqueued;
  for (fake_stream *f = streams; f; f = f->next_stream)
    if (f->device == current_device) f->completed = f->enqueued;
  LEAVE(ACL_SUCCESS);
}

EXPORT aclError aclrtSynchronizeStream(aclrtStream s) {
  aclError rc = enter(1);
  if (rc) LEAVE(rc);
  fake_stream *st = stream_of(s);
  if (!st) LEAVE(violation("aclrtSynchronizeStream: unknown stream"));
  st->completed = st->enqueued;
  LEAVE(ACL_SUCCESS);
}

/* ---- test controls -------------------------------------------------------------- */

EXPORT int fake_acl_create_stream(int device, aclrtStream *out) {
  pthread_mutex_lock(&mu);
  configure();
  if (device < 0 || device >= devices) LEAVE(ACL_ERROR_RT_INVALID_DEVICEID);
  fake_stream *f = calloc(1, sizeof *f);
  f->device = device;
  f->next_stream = streams;
  streams = f;
  *out = f;
  LEAVE(0);
}

EXPORT int fake_acl_launch(int device, aclrtStream s, unsigned n) {
  pthread_mutex_lock(&mu);
  configure();
  int saved = current_device;
  current_device = device;
  fake_stream *st = stream_of(s);
  current_device = saved;
  if (!st) LEAVE(ACL_ERROR_RT_PARAM_INVALID);
  st->enqueued += n;
  LEAVE(0);
}

EXPORT int fake_acl_complete(int device, aclrtStream s) {
  pthread_mutex_lock(&mu);
  configure();
  int saved = current_device;
  current_device = device;
  fake_stream *st = stream_of(s);
  current_device = saved;
  if (!st) LEAVE(ACL_ERROR_RT_PARAM_INVALID);
  st->completed = st->enqueued;
  LEAVE(0);
}

EXPORT void fake_acl_get_counters(fake_acl_counters *out) {
  pthread_mutex_lock(&mu);
  *out = counters;
  pthread_mutex_unlock(&mu);
}

EXPORT void fake_acl_fail_next_malloc(int code) {
  pthread_mutex_lock(&mu);
  fail_next_malloc_code = code;
  pthread_mutex_unlock(&mu);
}

EXPORT void fake_acl_set_capacity(uint64_t bytes) {
  pthread_mutex_lock(&mu);
  configure();
  capacity = bytes;
  pthread_mutex_unlock(&mu);
}

EXPORT void fake_acl_set_require_init(int on) {
  pthread_mutex_lock(&mu);
  configure();
  require_init = on;
  pthread_mutex_unlock(&mu);
}

/* The calling thread's current device in the fake (-1: none). */
EXPORT int fake_acl_current_device(void) { return current_device; }

/* Sets the calling thread's current device without counting a call (test setup). */
EXPORT void fake_acl_force_device(int device) { current_device = device; }

/* Bytes allocated on one device. */
EXPORT uint64_t fake_acl_live_bytes(int device) {
  pthread_mutex_lock(&mu);
  uint64_t v = (device >= 0 && device < MAX_DEVICES) ? live_per_device[device] : 0;
  pthread_mutex_unlock(&mu);
  return v;
}
