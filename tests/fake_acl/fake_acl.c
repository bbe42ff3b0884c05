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
 *   -DFAKE_NO_VMM                  no aclrtMallocPhysical (virtual memory off)
 *
 * Virtual memory: aclrtReserveMemAddress reserves host address space (PROT_NONE),
 * aclrtMallocPhysical counts physical memory against the capacity, aclrtMapMem makes
 * the range usable, aclrtUnmapMem / aclrtFreePhysical / aclrtReleaseMemAddress undo
 * it. Misuse is a violation: mapping outside a reservation or over a mapping, a
 * property struct other than torch_npu's, freeing a mapped handle, releasing a
 * reservation with pages still mapped, unmapping while the device has queued work
 * (aclrtUnmapMem does not synchronise).
 *
 * Environment (read at first use): FAKE_ACL_DEVICES (default 2), FAKE_ACL_CAPACITY
 * (bytes, default 1 GiB), FAKE_ACL_OOM_CODE (default 207001).
 */
#include <pthread.h>
#include <sys/mman.h>
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
      violations, set_device_calls, synchronize_calls, stream_waits, init_calls, maps, unmaps,
      live_reservations, live_physical;
} fake_acl_counters; /* keep in step: tests/c/backend_ctl.h, tests/all/fake_acl.rs, python/tests/test_abi.py */

/* acl_rt.h: aclrtPhysicalMemProp (32 bytes). */
typedef struct {
  uint32_t id;
  int type;
} aclrtMemLocation;
typedef struct {
  int handleType;
  int allocationType;
  int memAttr;
  aclrtMemLocation location;
  uint64_t reserve;
} aclrtPhysicalMemProp;
#define ACL_HBM_MEM_HUGE 4
#define ACL_HBM_MEM_HUGE1G 10
#define ACL_MEM_LOCATION_TYPE_DEVICE 1
#define GRANULARITY (2u << 20)

typedef struct vm_rec {
  int kind; /* 1 = reservation, 2 = physical handle */
  int device;
  char *va;       /* reservation start, or where the handle is mapped (NULL: unmapped) */
  size_t size;
  struct vm_rec *next_rec;
} vm_rec;
static vm_rec *vm_recs = NULL;

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

/* Graph-capture rules, when a capture runtime is linked in (the torch_npu stand-in's
 * standin_extra.c defines standin_capture_check; plain fake builds have none): a query
 * or synchronisation of a stream being captured, of an event recorded in an open
 * capture, or of the device while a capture is open fails with the runtime's error
 * code. Allocation and free are not restricted by a capture (see standin_extra.c). */
#define FAKE_CAPTURE_STREAM 1 /* handle: the stream queried or synchronised */
#define FAKE_CAPTURE_EVENT 2  /* handle: the event queried or synchronised */
#define FAKE_CAPTURE_DEVICE 3 /* the current device synchronised */
extern aclError standin_capture_check(const char *call, int what, void *handle) __attribute__((weak));
#define REFUSE_IN_CAPTURE(call, what, handle)                              \
  do {                                                                     \
    if (standin_capture_check) {                                           \
      aclError refused_ = standin_capture_check(call, what, handle);       \
      if (refused_) return refused_;                                       \
    }                                                                      \
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

/* Device memory for an allocation or a physical handle: an injected failure if one is
 * due, out of memory past the capacity, else ACL_SUCCESS (the caller then counts it). */
static aclError check_capacity(size_t size) {
  if (fail_next_malloc_code) {
    int code = fail_next_malloc_code;
    fail_next_malloc_code = 0;
    snprintf(last_msg, sizeof last_msg, "injected failure %d", code);
    return code;
  }
  if (size == 0 || live_per_device[current_device] + size > capacity) {
    snprintf(last_msg, sizeof last_msg, "out of device memory");
    return oom_code;
  }
  return ACL_SUCCESS;
}

static aclError do_malloc(void **p, size_t size) {
  aclError rc = enter(1);
  if (rc) LEAVE(rc);
  if ((rc = check_capacity(size))) LEAVE(rc);
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
  REFUSE_IN_CAPTURE("aclrtQueryEventStatus", FAKE_CAPTURE_EVENT, e);
  aclError rc = enter(0);
  if (rc) LEAVE(rc);
  fake_event *ev = event_of(e);
  if (!ev) LEAVE(violation("aclrtQueryEventStatus: unknown or destroyed event"));
  *status = event_done(ev) ? ACL_EVENT_RECORDED_STATUS_COMPLETE : ACL_EVENT_RECORDED_STATUS_NOT_READY;
  LEAVE(ACL_SUCCESS);
}
#endif

EXPORT aclError aclrtQueryEvent(aclrtEvent e, int *status) {
  REFUSE_IN_CAPTURE("aclrtQueryEvent", FAKE_CAPTURE_EVENT, e);
  aclError rc = enter(0);
  if (rc) LEAVE(rc);
  fake_event *ev = event_of(e);
  if (!ev) LEAVE(violation("aclrtQueryEvent: unknown or destroyed event"));
  *status = event_done(ev) ? ACL_EVENT_STATUS_COMPLETE : ACL_EVENT_STATUS_NOT_READY;
  LEAVE(ACL_SUCCESS);
}

EXPORT aclError aclrtSynchronizeEvent(aclrtEvent e) {
  REFUSE_IN_CAPTURE("aclrtSynchronizeEvent", FAKE_CAPTURE_EVENT, e);
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
  REFUSE_IN_CAPTURE("aclrtSynchronizeDevice", FAKE_CAPTURE_DEVICE, NULL);
  aclError rc = enter(1);
  if (rc) LEAVE(rc);
  counters.synchronize_calls++;
  default_streams[current_device].completed = default_streams[current_device].enqueued;
  for (fake_stream *f = streams; f; f = f->next_stream)
    if (f->device == current_device) f->completed = f->enqueued;
  LEAVE(ACL_SUCCESS);
}

EXPORT aclError aclrtStreamQuery(aclrtStream s, int *status) {
  REFUSE_IN_CAPTURE("aclrtStreamQuery", FAKE_CAPTURE_STREAM, s);
  aclError rc = enter(1);
  if (rc) LEAVE(rc);
  fake_stream *st = stream_of(s);
  if (!st) LEAVE(violation("aclrtStreamQuery: unknown stream"));
  *status = st->completed >= st->enqueued ? 0 /* COMPLETE */ : 1 /* NOT_READY */;
  LEAVE(ACL_SUCCESS);
}

EXPORT aclError aclrtSynchronizeStream(aclrtStream s) {
  REFUSE_IN_CAPTURE("aclrtSynchronizeStream", FAKE_CAPTURE_STREAM, s);
  aclError rc = enter(1);
  if (rc) LEAVE(rc);
  fake_stream *st = stream_of(s);
  if (!st) LEAVE(violation("aclrtSynchronizeStream: unknown stream"));
  st->completed = st->enqueued;
  LEAVE(ACL_SUCCESS);
}

/* ---- virtual memory ------------------------------------------------------------ */

static int device_has_queued_work(int device) {
  if (default_streams[device].completed < default_streams[device].enqueued) return 1;
  for (fake_stream *f = streams; f; f = f->next_stream)
    if (f->device == device && f->completed < f->enqueued) return 1;
  return 0;
}

static vm_rec *reservation_holding(const char *va, size_t size) {
  for (vm_rec *r = vm_recs; r; r = r->next_rec)
    if (r->kind == 1 && va >= r->va && va + size <= r->va + r->size) return r;
  return NULL;
}

static vm_rec *new_rec(int kind, char *va, size_t size) {
  vm_rec *r = calloc(1, sizeof *r);
  r->kind = kind;
  r->device = current_device;
  r->va = va;
  r->size = size;
  r->next_rec = vm_recs;
  vm_recs = r;
  return r;
}

/* The physical-memory record behind `handle`, if it is one. */
static vm_rec *handle_rec(void *handle) {
  for (vm_rec *r = vm_recs; r; r = r->next_rec)
    if (r == handle && r->kind == 2) return r;
  return NULL;
}

static void drop_rec(vm_rec *r) {
  for (vm_rec **p = &vm_recs; *p; p = &(*p)->next_rec)
    if (*p == r) {
      *p = r->next_rec;
      free(r);
      return;
    }
}

EXPORT aclError aclrtReserveMemAddress(void **va, size_t size, size_t alignment, void *expect,
                                       uint64_t flags) {
  (void)alignment;
  (void)flags;
  aclError rc = enter(1);
  if (rc) LEAVE(rc);
  if (expect) LEAVE(violation("aclrtReserveMemAddress: expectPtr must be NULL"));
  if (size == 0 || size % GRANULARITY) LEAVE(violation("aclrtReserveMemAddress: unaligned size"));
  void *m = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) LEAVE(ACL_ERROR_RT_PARAM_INVALID);
  new_rec(1, m, size);
  counters.live_reservations++;
  *va = m;
  LEAVE(ACL_SUCCESS);
}

EXPORT aclError aclrtReleaseMemAddress(void *va) {
  aclError rc = enter(1);
  if (rc) LEAVE(rc);
  for (vm_rec *r = vm_recs; r; r = r->next_rec) {
    if (r->kind == 1 && r->va == va) {
      for (vm_rec *h = vm_recs; h; h = h->next_rec)
        if (h->kind == 2 && h->va && h->va >= r->va && h->va < r->va + r->size)
          LEAVE(violation("aclrtReleaseMemAddress: pages still mapped"));
      munmap(r->va, r->size);
      drop_rec(r);
      counters.live_reservations--;
      LEAVE(ACL_SUCCESS);
    }
  }
  LEAVE(violation("aclrtReleaseMemAddress: not a reservation"));
}

#ifndef FAKE_NO_VMM
EXPORT aclError aclrtMallocPhysical(void **handle, size_t size, const aclrtPhysicalMemProp *prop,
                                    uint64_t flags) {
  aclError rc = enter(1);
  if (rc) LEAVE(rc);
  if (flags || !prop || prop->handleType != 0 || prop->allocationType != 0 ||
      (prop->memAttr != ACL_HBM_MEM_HUGE && prop->memAttr != ACL_HBM_MEM_HUGE1G) ||
      prop->location.type != ACL_MEM_LOCATION_TYPE_DEVICE ||
      prop->location.id != (uint32_t)current_device || prop->reserve != 0)
    LEAVE(violation("aclrtMallocPhysical: unexpected property struct"));
  if (size == 0 || size % GRANULARITY) LEAVE(violation("aclrtMallocPhysical: unaligned size"));
  if ((rc = check_capacity(size))) LEAVE(rc);
  live_per_device[current_device] += size;
  counters.live_bytes += size;
  counters.live_physical++;
  *handle = new_rec(2, NULL, size);
  LEAVE(ACL_SUCCESS);
}
#endif

EXPORT aclError aclrtFreePhysical(void *handle) {
  aclError rc = enter(1);
  if (rc) LEAVE(rc);
  vm_rec *r = handle_rec(handle);
  if (!r) LEAVE(violation("aclrtFreePhysical: unknown handle"));
  if (r->va) LEAVE(violation("aclrtFreePhysical: handle still mapped"));
  live_per_device[r->device] -= r->size;
  counters.live_bytes -= r->size;
  counters.live_physical--;
  drop_rec(r);
  LEAVE(ACL_SUCCESS);
}

EXPORT aclError aclrtMapMem(void *va, size_t size, size_t offset, void *handle, uint64_t flags) {
  aclError rc = enter(1);
  if (rc) LEAVE(rc);
  vm_rec *h = handle_rec(handle);
  if (!h || h->va) LEAVE(violation("aclrtMapMem: unknown or already mapped handle"));
  if (offset || flags || size != h->size) LEAVE(violation("aclrtMapMem: bad size, offset or flags"));
  char *p = va;
  if (!reservation_holding(p, size)) LEAVE(violation("aclrtMapMem: outside a reservation"));
  for (vm_rec *r = vm_recs; r; r = r->next_rec)
    if (r->kind == 2 && r->va && p < r->va + r->size && r->va < p + size)
      LEAVE(violation("aclrtMapMem: overlaps a mapping"));
  if (mprotect(p, size, PROT_READ | PROT_WRITE)) LEAVE(ACL_ERROR_RT_PARAM_INVALID);
  h->va = p;
  counters.maps++;
  LEAVE(ACL_SUCCESS);
}

EXPORT aclError aclrtUnmapMem(void *va) {
  aclError rc = enter(1);
  if (rc) LEAVE(rc);
  for (vm_rec *r = vm_recs; r; r = r->next_rec) {
    if (r->kind == 2 && r->va == va) {
      if (device_has_queued_work(current_device))
        LEAVE(violation("aclrtUnmapMem while the device has queued work"));
      madvise(r->va, r->size, MADV_DONTNEED);
      mprotect(r->va, r->size, PROT_NONE);
      r->va = NULL;
      counters.unmaps++;
      LEAVE(ACL_SUCCESS);
    }
  }
  LEAVE(violation("aclrtUnmapMem: nothing mapped there"));
}

EXPORT aclError aclrtMemGetAllocationGranularity(aclrtPhysicalMemProp *prop, int option,
                                                 size_t *granularity) {
  (void)prop;
  (void)option;
  aclError rc = enter(0);
  if (rc) LEAVE(rc);
  *granularity = GRANULARITY;
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

/* Operations queued on a stream that have not run. */
EXPORT uint64_t fake_acl_pending(int device, aclrtStream s) {
  pthread_mutex_lock(&mu);
  configure();
  int saved = current_device;
  current_device = device;
  fake_stream *st = stream_of(s);
  current_device = saved;
  uint64_t v = st ? st->enqueued - st->completed : 0;
  pthread_mutex_unlock(&mu);
  return v;
}
