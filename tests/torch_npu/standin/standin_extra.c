/*
 * Behaviour the stand-in CANN runtime needs beyond tests/fake_acl/fake_acl.c, for the
 * real torch_npu to initialise a device and run its allocator paths on it.
 *
 * gen_standin.py compiles this file together with fake_acl.c (memory, streams, events,
 * virtual memory, test controls) and with a generated stub (returns 0, ACL_SUCCESS) for
 * every other CANN symbol the torch_npu wheel leaves undefined. Functions torch_npu
 * only looks up with dlsym are absent unless defined here: torch_npu then takes its own
 * fallback, as on an older CANN.
 *
 * Device memory is host memory (fake_acl.c), so copies and memsets are memcpy/memset.
 * Nothing here computes: kernels launched by operators are accepted and do nothing.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* rt_error_codes.h: what the runtime answers a call a graph capture does not allow. */
#define ACL_ERROR_RT_STREAM_CAPTURED 107027
#define ACL_ERROR_RT_EVENT_CAPTURED 107028
#define ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT 107030
#define ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC 107041

/* acl_base_rt.h: the SoC torch_npu selects its code paths by (an Atlas A2 part). */
EXPORT const char *aclrtGetSocName(void) { return "Ascend910B1"; }

/* acl_rt.h: torch_npu creates its streams with a priority and flags. */
EXPORT aclError aclrtCreateStreamWithConfig(aclrtStream *stream, uint32_t priority, uint32_t flag) {
  (void)priority;
  (void)flag;
  return aclrtCreateStream(stream);
}

EXPORT aclError standin_capture_check(const char *call, int what, void *handle);

EXPORT aclError aclrtDestroyStream(aclrtStream stream) {
  return standin_capture_check("aclrtDestroyStream", FAKE_CAPTURE_STREAM, stream);
}

EXPORT aclError aclrtDestroyStreamForce(aclrtStream stream) { return aclrtDestroyStream(stream); }

/* acl_op_compiler.h: the size of an option buffer torch_npu then fills. */
EXPORT size_t aclGetCompileoptSize(int opt) {
  (void)opt;
  return 256;
}

EXPORT aclError aclGetCompileopt(int opt, char *value, size_t length) {
  (void)opt;
  if (value && length) value[0] = '\0';
  return ACL_SUCCESS;
}

/* Host memory and copies (device memory is host memory in the stand-in). Page-locked
 * host memory (aclrtMallocHost) is remembered: an asynchronous copy from or to any
 * other host memory is one of the unsafe functions of a capture (see the capture
 * rules below). */
static aclError check_unsafe(const char *call, aclError code);
#define ACL_MEMCPY_HOST_TO_HOST 0
#define ACL_MEMCPY_HOST_TO_DEVICE 1
#define ACL_MEMCPY_DEVICE_TO_HOST 2

typedef struct pinned_rec {
  char *ptr;
  size_t size;
  struct pinned_rec *next_pinned;
} pinned_rec;
static pinned_rec *pinned = NULL;
static pthread_mutex_t pinned_mu = PTHREAD_MUTEX_INITIALIZER;

EXPORT aclError aclrtMallocHost(void **p, size_t size) {
  *p = malloc(size ? size : 1);
  if (!*p) return ACL_ERROR_RT_MEMORY_ALLOCATION;
  pinned_rec *r = malloc(sizeof *r);
  r->ptr = *p;
  r->size = size ? size : 1;
  pthread_mutex_lock(&pinned_mu);
  r->next_pinned = pinned;
  pinned = r;
  pthread_mutex_unlock(&pinned_mu);
  return ACL_SUCCESS;
}

EXPORT aclError aclrtFreeHost(void *p) {
  pthread_mutex_lock(&pinned_mu);
  for (pinned_rec **r = &pinned; *r; r = &(*r)->next_pinned)
    if ((*r)->ptr == p) {
      pinned_rec *dead = *r;
      *r = dead->next_pinned;
      free(dead);
      break;
    }
  pthread_mutex_unlock(&pinned_mu);
  free(p);
  return ACL_SUCCESS;
}

static int is_pinned(const void *p, size_t count) {
  const char *c = p;
  int found = 0;
  pthread_mutex_lock(&pinned_mu);
  for (pinned_rec *r = pinned; r && !found; r = r->next_pinned)
    found = c >= r->ptr && c + count <= r->ptr + r->size;
  pthread_mutex_unlock(&pinned_mu);
  return found;
}

static aclError copy(void *dst, size_t dest_max, const void *src, size_t count) {
  if (count > dest_max) return ACL_ERROR_RT_PARAM_INVALID;
  if (count) memmove(dst, src, count);
  return ACL_SUCCESS;
}

EXPORT aclError aclrtMemcpy(void *dst, size_t dest_max, const void *src, size_t count, int kind) {
  (void)kind;
  aclError rc = check_unsafe("aclrtMemcpy", ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT);
  return rc ? rc : copy(dst, dest_max, src, count);
}

EXPORT aclError aclrtMemcpyAsync(void *dst, size_t dest_max, const void *src, size_t count, int kind,
                                 aclrtStream stream) {
  (void)stream;
  int pageable = ((kind == ACL_MEMCPY_HOST_TO_DEVICE || kind == ACL_MEMCPY_HOST_TO_HOST) &&
                  !is_pinned(src, count)) ||
                 ((kind == ACL_MEMCPY_DEVICE_TO_HOST || kind == ACL_MEMCPY_HOST_TO_HOST) &&
                  !is_pinned(dst, count));
  if (pageable && count) {
    aclError rc = check_unsafe("aclrtMemcpyAsync (pageable host memory)", ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC);
    if (rc) return rc;
  }
  return copy(dst, dest_max, src, count);
}

static aclError fill(void *dst, size_t max_count, int32_t value, size_t count) {
  if (count > max_count) return ACL_ERROR_RT_PARAM_INVALID;
  if (count) memset(dst, value, count);
  return ACL_SUCCESS;
}

EXPORT aclError aclrtMemset(void *dst, size_t max_count, int32_t value, size_t count) {
  aclError rc = check_unsafe("aclrtMemset", ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT);
  return rc ? rc : fill(dst, max_count, value, count);
}

EXPORT aclError aclrtMemsetAsync(void *dst, size_t max_count, int32_t value, size_t count,
                                 aclrtStream stream) {
  (void)stream;
  return fill(dst, max_count, value, count);
}

/* Contexts: one per thread is enough; torch_npu saves and restores it. */
static int standin_context;
EXPORT aclError aclrtGetCurrentContext(void **ctx) {
  *ctx = &standin_context;
  return ACL_SUCCESS;
}

EXPORT aclError aclrtSetCurrentContext(void *ctx) {
  (void)ctx;
  return ACL_SUCCESS;
}

EXPORT aclError aclrtDeviceCanAccessPeer(int32_t *can, int32_t device, int32_t peer) {
  (void)device;
  (void)peer;
  *can = 0;
  return ACL_SUCCESS;
}

EXPORT aclError aclrtEventElapsedTime(float *ms, aclrtEvent start, aclrtEvent end) {
  (void)start;
  (void)end;
  *ms = 0.0f;
  return ACL_SUCCESS;
}

/* Device initialisation settings torch_npu applies once per device. */
EXPORT aclError aclrtSetDeviceSatMode(int mode) {
  (void)mode;
  return ACL_SUCCESS;
}

EXPORT aclError aclSetCompileopt(int opt, const char *value) {
  (void)opt;
  (void)value;
  return ACL_SUCCESS;
}

/* System parameters (deterministic mode, ...): kept, read back as set. */
static int64_t sys_params[16];
EXPORT aclError aclrtSetSysParamOpt(int opt, int64_t value) {
  if (opt < 0 || opt >= 16) return ACL_ERROR_RT_PARAM_INVALID;
  sys_params[opt] = value;
  return ACL_SUCCESS;
}
EXPORT aclError aclrtGetSysParamOpt(int opt, int64_t *value) {
  if (opt < 0 || opt >= 16) return ACL_ERROR_RT_PARAM_INVALID;
  *value = sys_params[opt];
  return ACL_SUCCESS;
}
EXPORT aclError aclrtCtxSetSysParamOpt(int opt, int64_t value) { return aclrtSetSysParamOpt(opt, value); }
EXPORT aclError aclrtCtxGetSysParamOpt(int opt, int64_t *value) { return aclrtGetSysParamOpt(opt, value); }

EXPORT aclError aclrtSetOpExecuteTimeOut(uint32_t timeout) {
  (void)timeout;
  return ACL_SUCCESS;
}
EXPORT aclError aclrtSetOpWaitTimeout(uint32_t timeout) {
  (void)timeout;
  return ACL_SUCCESS;
}

/* ---- graph capture (aclmdlRI*), as torch_npu's NPUGraph uses it -------------------
 *
 * A capture starts on one stream; a stream that waits on an event recorded in the
 * capture joins it (as in CUDA). Event records and waits on capturing streams become
 * nodes of the graph: nothing is queued. Replaying a graph queues one operation on the
 * replay stream. gen_standin.py renames fake_acl.c's aclrtRecordEvent and
 * aclrtStreamWaitEvent to fake_base_* so these wrappers can take their names. */

typedef struct standin_model {
  uint32_t id;
  int destroyed;
  int mode; /* aclmdlRICaptureMode it was begun with: 0 global, 1 thread-local, 2 relaxed */
  pthread_t thread; /* the thread that began the capture */
  aclrtStream origin; /* the stream it was begun on */
  int streams;        /* streams captured into it: the origin and every stream that joined */
} standin_model;

#define MAX_CAPTURING 64
#define MAX_CAPTURE_EVENTS 1024
static struct { aclrtStream stream; standin_model *model; } capturing[MAX_CAPTURING];
static struct { aclrtEvent event; standin_model *model; } capture_events[MAX_CAPTURE_EVENTS];
static uint32_t next_model_id = 1;
static pthread_mutex_t capture_mu = PTHREAD_MUTEX_INITIALIZER;
/* Test counters: captures ended, the most streams one capture held, device allocations
 * made while a capture was open. */
static uint64_t captures_ended, capture_allocations;
static int max_capture_streams;
/* Each stream's place in the first capture it was part of: 0 began it, k joined k-th. */
#define MAX_ROLES 256
static struct { aclrtStream stream; int role; } roles[MAX_ROLES];

static void note_role(aclrtStream stream, int role) { /* capture_mu held */
  for (int i = 0; i < MAX_ROLES; i++) {
    if (roles[i].stream == stream) return;
    if (!roles[i].stream) {
      roles[i].stream = stream;
      roles[i].role = role;
      return;
    }
  }
}

/* The model `stream` captures into, or NULL; capture_mu held. */
static standin_model *capture_of(aclrtStream stream) {
  for (int i = 0; i < MAX_CAPTURING; i++)
    if (capturing[i].model && capturing[i].stream == stream) return capturing[i].model;
  return NULL;
}

static aclError join_capture(aclrtStream stream, standin_model *m) {
  for (int i = 0; i < MAX_CAPTURING; i++)
    if (!capturing[i].model) {
      capturing[i].stream = stream;
      capturing[i].model = m;
      note_role(stream, m->streams++);
      return ACL_SUCCESS;
    }
  return ACL_ERROR_RT_PARAM_INVALID;
}

EXPORT aclError aclmdlRICaptureBegin(aclrtStream stream, int mode) {
  if (mode < 0 || mode > 2) return ACL_ERROR_RT_PARAM_INVALID;
  pthread_mutex_lock(&capture_mu);
  aclError rc = ACL_ERROR_RT_STREAM_CAPTURED;
  if (!capture_of(stream)) {
    standin_model *m = calloc(1, sizeof *m);
    m->id = next_model_id++;
    m->mode = mode;
    m->thread = pthread_self();
    m->origin = stream;
    rc = join_capture(stream, m);
  }
  pthread_mutex_unlock(&capture_mu);
  return rc;
}

EXPORT aclError aclmdlRICaptureGetInfo(aclrtStream stream, int *status, void **model) {
  pthread_mutex_lock(&capture_mu);
  standin_model *m = capture_of(stream);
  pthread_mutex_unlock(&capture_mu);
  if (status) *status = m ? 1 /* ACTIVE */ : 0 /* NONE */;
  if (model) *model = m;
  return ACL_SUCCESS;
}

EXPORT aclError aclmdlRIGetId(void *model, uint32_t *id) {
  if (!model) return ACL_ERROR_RT_PARAM_INVALID;
  *id = ((standin_model *)model)->id;
  return ACL_SUCCESS;
}

/* aclmdlRICaptureEnd: on the stream the capture began on (ACL_ERROR_RT_STREAM_NOT_CAPTURED
 * for a stream not captured, ..._CAPTURE_UNMATCHED for a stream that only joined) and,
 * unless the capture is relaxed, from the thread that began it (..._WRONG_THREAD). */
#define ACL_ERROR_RT_STREAM_NOT_CAPTURED 107029
#define ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED 107036
#define ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD 107038
EXPORT aclError aclmdlRICaptureEnd(aclrtStream stream, void **model) {
  pthread_mutex_lock(&capture_mu);
  standin_model *m = capture_of(stream);
  aclError rc = ACL_SUCCESS;
  if (!m)
    rc = ACL_ERROR_RT_STREAM_NOT_CAPTURED;
  else if (m->origin != stream)
    rc = ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED;
  else if (m->mode != 2 && !pthread_equal(m->thread, pthread_self()))
    rc = ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD;
  if (!rc) {
    for (int i = 0; i < MAX_CAPTURING; i++)
      if (capturing[i].model == m) capturing[i].model = NULL;
    for (int i = 0; i < MAX_CAPTURE_EVENTS; i++)
      if (capture_events[i].model == m) capture_events[i].model = NULL;
    captures_ended++;
    if (m->streams > max_capture_streams) max_capture_streams = m->streams;
    *model = m;
  }
  pthread_mutex_unlock(&capture_mu);
  return rc;
}

/* Captures ended, the most streams one of them held (the origin and those that joined
 * by waiting on an event of the capture), device allocations made while a capture was
 * open: what a scenario checks torchair's captures did. */
EXPORT uint64_t standin_captures_ended(void) { return captures_ended; }
EXPORT int standin_max_capture_streams(void) { return max_capture_streams; }
EXPORT uint64_t standin_capture_allocations(void) { return capture_allocations; }

/* `stream`'s place in the first capture it was part of (0: the capture began on it;
 * k: it was the k-th to join), -1 if it never was. */
EXPORT int standin_capture_role(aclrtStream stream) {
  int role = -1;
  pthread_mutex_lock(&capture_mu);
  for (int i = 0; i < MAX_ROLES && roles[i].stream; i++)
    if (roles[i].stream == stream) role = roles[i].role;
  pthread_mutex_unlock(&capture_mu);
  return role;
}

/* aclrtMalloc and aclrtMallocAlign32 (fake_acl.c's, renamed fake_base_* by
 * gen_standin.py) counting the allocations made while a capture is open. */
static void note_allocation(void) {
  pthread_mutex_lock(&capture_mu);
  for (int i = 0; i < MAX_CAPTURING; i++)
    if (capturing[i].model) {
      capture_allocations++;
      break;
    }
  pthread_mutex_unlock(&capture_mu);
}

EXPORT aclError aclrtMalloc(void **p, size_t size, int policy) {
  aclError rc = fake_base_aclrtMalloc(p, size, policy);
  if (rc == ACL_SUCCESS) note_allocation();
  return rc;
}

EXPORT aclError aclrtMallocAlign32(void **p, size_t size, int policy) {
  aclError rc = fake_base_aclrtMallocAlign32(p, size, policy);
  if (rc == ACL_SUCCESS) note_allocation();
  return rc;
}

/* ---- what CANN refuses during a capture ---------------------------------------------
 *
 * From CANN's documentation (Runtime guide, "单流捕获" / single-stream capture, CANN 9.0:
 * hiascend.com/document/detail/zh/canncommercial/900/programug/acldevg/runtime_doc_dev_0030.html;
 * aclmdlRICaptureBegin and aclmdlRICaptureThreadExchangeMode, acl API reference) and the
 * open-source CANN runtime that implements it (gitcode.com/cann/runtime, mirrored as
 * github.com/hicann/runtime: src/runtime/api/impl/api_error.cc, api_impl.cc,
 * src/runtime/feature/aclgraph/context_aclgraph.cc):
 *
 * 1. Querying or synchronising a stream that is being captured, an event recorded in an
 *    open capture, or the device while one of its streams is captured is illegal in every
 *    capture mode (ACL_ERROR_RT_STREAM_CAPTURED, ACL_ERROR_RT_EVENT_CAPTURED); so is
 *    destroying a stream being captured.
 * 2. The capture mode limits only the "unsafe" functions: the synchronous memory calls
 *    aclrtMemset, aclrtMemcpy, aclrtMemcpy2d, and asynchronous copies that involve
 *    pageable (not aclrtMallocHost) host memory, which the runtime turns into synchronous
 *    ones. Context::IsCaptureModeSupport: a thread whose own mode
 *    (aclmdlRICaptureThreadExchangeMode; GLOBAL by default) is RELAXED may call them; in
 *    GLOBAL it may not while any GLOBAL capture is open, nor while it has begun a
 *    THREAD_LOCAL one; in THREAD_LOCAL it may not while it has begun a GLOBAL or
 *    THREAD_LOCAL capture (ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT).
 * 3. aclrtMalloc and aclrtFree are not unsafe functions and are not checked: they do no
 *    implicit device or stream synchronisation (their API reference), and the runtime's
 *    DevMalloc/DevFree consult no capture state. An allocation during a capture is
 *    allowed in every mode; keeping memory a captured task uses alive until the model is
 *    destroyed is the caller's duty (rule 7 of the guide), not something the runtime
 *    refuses. torch_npu's own caching allocator relies on this: it calls aclrtMalloc
 *    inside torchair's global-mode captures. Virtual-memory mapping is not checked either.
 *
 * Every refusal is printed and counted (standin_capture_refusals). */
#define CAPTURE_GLOBAL 0
#define CAPTURE_THREAD_LOCAL 1
#define CAPTURE_RELAXED 2

static __thread int thread_exchange_mode = CAPTURE_GLOBAL;
static uint64_t capture_refusals;

EXPORT aclError aclmdlRICaptureThreadExchangeMode(int *mode) {
  if (!mode || *mode < CAPTURE_GLOBAL || *mode > CAPTURE_RELAXED) return ACL_ERROR_RT_PARAM_INVALID;
  int old = thread_exchange_mode;
  thread_exchange_mode = *mode;
  *mode = old;
  return ACL_SUCCESS;
}

static aclError refused(const char *call, aclError code) {
  capture_refusals++;
  fprintf(stderr, "stand-in: %s refused during a graph capture (error %d)\n", call, code);
  return code;
}

/* Rule 1, asked by fake_acl.c's queries and synchronisations (FAKE_CAPTURE_*). */
EXPORT aclError standin_capture_check(const char *call, int what, void *handle) {
  aclError rc = ACL_SUCCESS;
  pthread_mutex_lock(&capture_mu);
  if (what == FAKE_CAPTURE_STREAM && handle && capture_of(handle)) rc = ACL_ERROR_RT_STREAM_CAPTURED;
  if (what == FAKE_CAPTURE_EVENT)
    for (int i = 0; i < MAX_CAPTURE_EVENTS; i++)
      if (capture_events[i].model && capture_events[i].event == handle) rc = ACL_ERROR_RT_EVENT_CAPTURED;
  if (what == FAKE_CAPTURE_DEVICE)
    for (int i = 0; i < MAX_CAPTURING; i++)
      if (capturing[i].model) rc = ACL_ERROR_RT_STREAM_CAPTURED;
  if (rc) refused(call, rc);
  pthread_mutex_unlock(&capture_mu);
  return rc;
}

/* Rule 2: whether the calling thread may call an unsafe function now. */
static int unsafe_allowed(void) {
  if (thread_exchange_mode == CAPTURE_RELAXED) return 1;
  int context_mode = 3, thread_mode = 3; /* strictest open capture: anywhere, begun here */
  pthread_t self = pthread_self();
  for (int i = 0; i < MAX_CAPTURING; i++) {
    standin_model *m = capturing[i].model;
    if (!m) continue;
    if (m->mode < context_mode) context_mode = m->mode;
    if (pthread_equal(m->thread, self) && m->mode < thread_mode) thread_mode = m->mode;
  }
  if (thread_exchange_mode == CAPTURE_GLOBAL)
    return !(context_mode == CAPTURE_GLOBAL || thread_mode == CAPTURE_THREAD_LOCAL);
  return !(thread_mode == CAPTURE_GLOBAL || thread_mode == CAPTURE_THREAD_LOCAL);
}

static aclError check_unsafe(const char *call, aclError code) {
  pthread_mutex_lock(&capture_mu);
  aclError rc = unsafe_allowed() ? ACL_SUCCESS : refused(call, code);
  pthread_mutex_unlock(&capture_mu);
  return rc;
}

/* How many calls the capture rules refused (a scenario asserts none). */
EXPORT uint64_t standin_capture_refusals(void) { return capture_refusals; }

EXPORT aclError aclmdlRIExecuteAsync(void *model, aclrtStream stream) {
  if (!model || ((standin_model *)model)->destroyed) return ACL_ERROR_RT_PARAM_INVALID;
  int device = current_device < 0 ? 0 : current_device;
  return fake_acl_launch(device, stream, 1) ? ACL_ERROR_RT_PARAM_INVALID : ACL_SUCCESS;
}

EXPORT aclError aclmdlRIDestroy(void *model) {
  if (!model) return ACL_ERROR_RT_PARAM_INVALID;
  ((standin_model *)model)->destroyed = 1; /* kept, so later use is detected */
  return ACL_SUCCESS;
}

EXPORT aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream) {
  pthread_mutex_lock(&capture_mu);
  standin_model *m = capture_of(stream);
  aclError rc = ACL_SUCCESS;
  if (m) {
    rc = ACL_ERROR_RT_PARAM_INVALID;
    for (int i = 0; i < MAX_CAPTURE_EVENTS; i++)
      if (!capture_events[i].model || capture_events[i].event == event) {
        capture_events[i].event = event;
        capture_events[i].model = m;
        rc = ACL_SUCCESS;
        break;
      }
  }
  pthread_mutex_unlock(&capture_mu);
  return m ? rc : fake_base_aclrtRecordEvent(event, stream);
}

EXPORT aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event) {
  pthread_mutex_lock(&capture_mu);
  standin_model *m = NULL;
  for (int i = 0; i < MAX_CAPTURE_EVENTS; i++)
    if (capture_events[i].model && capture_events[i].event == event) m = capture_events[i].model;
  aclError rc = ACL_SUCCESS;
  if (m && capture_of(stream) != m) rc = join_capture(stream, m);
  pthread_mutex_unlock(&capture_mu);
  return m ? rc : fake_base_aclrtStreamWaitEvent(stream, event);
}

/* torch_npu probes virtual memory (aclrtReserveMemAddress of 512 bytes, then
 * aclrtReleaseMemAddress) while parsing PYTORCH_NPU_ALLOC_CONF, before it sets a device
 * on the thread: the stand-in uses device 0 and rounds the size to its granularity. */
EXPORT aclError aclrtReserveMemAddress(void **va, size_t size, size_t alignment, void *expect,
                                       uint64_t flags) {
  if (current_device < 0) current_device = 0;
  size = (size + GRANULARITY - 1) / GRANULARITY * GRANULARITY; /* it probes with 512 bytes */
  return fake_base_aclrtReserveMemAddress(va, size, alignment, expect, flags);
}

EXPORT aclError aclrtReleaseMemAddress(void *va) {
  if (current_device < 0) current_device = 0;
  return fake_base_aclrtReleaseMemAddress(va);
}

/* Per-module memory usage (torch_npu's _dump_snapshot writes it to a CSV): none. */
EXPORT aclError aclrtGetMemUsageInfo(int32_t device, void *info, size_t input_num, size_t *output_num) {
  (void)device;
  (void)info;
  (void)input_num;
  *output_num = 0;
  return ACL_SUCCESS;
}

/* Synchronisation with a timeout (acl_rt.h; -1 waits without limit): as the plain calls,
 * whose capture rules they share. */
EXPORT aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout) {
  if (timeout < -1 || timeout == 0) return ACL_ERROR_RT_PARAM_INVALID;
  return aclrtSynchronizeStream(stream);
}

EXPORT aclError aclrtSynchronizeDeviceWithTimeout(int32_t timeout) {
  if (timeout < -1 || timeout == 0) return ACL_ERROR_RT_PARAM_INVALID;
  return aclrtSynchronizeDevice();
}

/* ---- core limits of devices, streams and threads (acl_rt.h aclrt*ResLimit) -----------
 *
 * aclrtDevResLimitType: 0 cube cores, 1 vector cores. A device starts with all its cores
 * (an Ascend910B1: 24 AI cores, each one cube and two vector units); a stream's limit is
 * its device's until set, and reset returns to it; a thread that uses a stream's
 * resources (aclrtUseStreamResInCurrentThread) sees that stream's limits, otherwise its
 * device's. torchair reads a stream's limits when it captures and sets them again
 * before a replay whose limits differ; torch_npu resolves these functions by name from
 * the whole process, so they live here, in the runtime library. */
#define RES_TYPES 2
#define MAX_LIMITED_STREAMS 256
static const uint32_t device_cores[RES_TYPES] = {24, 48};
static uint32_t device_limit[MAX_DEVICES][RES_TYPES];
static int device_limit_set[MAX_DEVICES][RES_TYPES];
static struct { aclrtStream stream; uint32_t limit[RES_TYPES]; int set[RES_TYPES]; } stream_limits[MAX_LIMITED_STREAMS];
static __thread aclrtStream thread_res_stream;
static __thread int thread_res_used;
static pthread_mutex_t res_mu = PTHREAD_MUTEX_INITIALIZER;

static int res_device(void) { return current_device < 0 ? 0 : current_device; }

static uint32_t device_res(int device, int type) {
  return device_limit_set[device][type] ? device_limit[device][type] : device_cores[type];
}

/* The limits of `stream`, added when `add`; res_mu held. */
static int stream_slot(aclrtStream stream, int add) {
  for (int i = 0; i < MAX_LIMITED_STREAMS; i++)
    if (stream_limits[i].stream == stream) return i;
  if (!add) return -1;
  for (int i = 0; i < MAX_LIMITED_STREAMS; i++)
    if (!stream_limits[i].stream) {
      memset(&stream_limits[i], 0, sizeof stream_limits[i]);
      stream_limits[i].stream = stream;
      return i;
    }
  return -1;
}

static uint32_t stream_res(aclrtStream stream, int type) {
  int i = stream_slot(stream, 0);
  return i >= 0 && stream_limits[i].set[type] ? stream_limits[i].limit[type] : device_res(res_device(), type);
}

EXPORT aclError aclrtGetDeviceResLimit(int32_t device, int type, uint32_t *value) {
  if (device < 0 || device >= MAX_DEVICES || type < 0 || type >= RES_TYPES || !value)
    return ACL_ERROR_RT_PARAM_INVALID;
  pthread_mutex_lock(&res_mu);
  *value = device_res(device, type);
  pthread_mutex_unlock(&res_mu);
  return ACL_SUCCESS;
}

EXPORT aclError aclrtSetDeviceResLimit(int32_t device, int type, uint32_t value) {
  if (device < 0 || device >= MAX_DEVICES || type < 0 || type >= RES_TYPES || value == 0 ||
      value > device_cores[type])
    return ACL_ERROR_RT_PARAM_INVALID;
  pthread_mutex_lock(&res_mu);
  device_limit[device][type] = value;
  device_limit_set[device][type] = 1;
  pthread_mutex_unlock(&res_mu);
  return ACL_SUCCESS;
}

EXPORT aclError aclrtResetDeviceResLimit(int32_t device) {
  if (device < 0 || device >= MAX_DEVICES) return ACL_ERROR_RT_PARAM_INVALID;
  pthread_mutex_lock(&res_mu);
  memset(device_limit_set[device], 0, sizeof device_limit_set[device]);
  pthread_mutex_unlock(&res_mu);
  return ACL_SUCCESS;
}

EXPORT aclError aclrtGetStreamResLimit(aclrtStream stream, int type, uint32_t *value) {
  if (type < 0 || type >= RES_TYPES || !value) return ACL_ERROR_RT_PARAM_INVALID;
  pthread_mutex_lock(&res_mu);
  *value = stream_res(stream, type);
  pthread_mutex_unlock(&res_mu);
  return ACL_SUCCESS;
}

EXPORT aclError aclrtSetStreamResLimit(aclrtStream stream, int type, uint32_t value) {
  if (type < 0 || type >= RES_TYPES || value == 0 || value > device_cores[type])
    return ACL_ERROR_RT_PARAM_INVALID;
  pthread_mutex_lock(&res_mu);
  int i = stream_slot(stream, 1);
  if (i >= 0) {
    stream_limits[i].limit[type] = value;
    stream_limits[i].set[type] = 1;
  }
  pthread_mutex_unlock(&res_mu);
  return i >= 0 ? ACL_SUCCESS : ACL_ERROR_RT_PARAM_INVALID;
}

EXPORT aclError aclrtResetStreamResLimit(aclrtStream stream) {
  pthread_mutex_lock(&res_mu);
  int i = stream_slot(stream, 0);
  if (i >= 0) stream_limits[i].stream = NULL;
  pthread_mutex_unlock(&res_mu);
  return ACL_SUCCESS;
}

EXPORT aclError aclrtUseStreamResInCurrentThread(aclrtStream stream) {
  thread_res_stream = stream;
  thread_res_used = 1;
  return ACL_SUCCESS;
}

EXPORT aclError aclrtUnuseStreamResInCurrentThread(aclrtStream stream) {
  (void)stream;
  thread_res_used = 0;
  return ACL_SUCCESS;
}

EXPORT aclError aclrtGetResInCurrentThread(int type, uint32_t *value) {
  if (type < 0 || type >= RES_TYPES || !value) return ACL_ERROR_RT_PARAM_INVALID;
  pthread_mutex_lock(&res_mu);
  *value = thread_res_used ? stream_res(thread_res_stream, type) : device_res(res_device(), type);
  pthread_mutex_unlock(&res_mu);
  return ACL_SUCCESS;
}

/* ---- securec (CANN's libc_sec): the bounded string functions torchair calls -----------
 *
 * snprintf_s / vsnprintf_s write at most min(count, destMax - 1) characters and always
 * terminate; they return the number written, or -1 when the output was cut or an
 * argument is invalid. strcpy_s copies a terminated string that fits, else empties the
 * destination and returns an error (EINVAL 22, ERANGE 34); 0 is EOK. */
#include <stdarg.h>
EXPORT int vsnprintf_s(char *dest, size_t dest_max, size_t count, const char *format, va_list args) {
  if (!dest || dest_max == 0 || !format) return -1;
  size_t room = count < dest_max - 1 ? count + 1 : dest_max;
  int n = vsnprintf(dest, room, format, args);
  if (n < 0) {
    dest[0] = '\0';
    return -1;
  }
  return (size_t)n < room ? n : -1;
}

EXPORT int snprintf_s(char *dest, size_t dest_max, size_t count, const char *format, ...) {
  va_list args;
  va_start(args, format);
  int n = vsnprintf_s(dest, dest_max, count, format, args);
  va_end(args);
  return n;
}

EXPORT int strcpy_s(char *dest, size_t dest_max, const char *src) {
  if (!dest || dest_max == 0) return 22;
  if (!src) {
    dest[0] = '\0';
    return 22;
  }
  size_t n = strlen(src);
  if (n >= dest_max) {
    dest[0] = '\0';
    return 34;
  }
  memcpy(dest, src, n + 1);
  return 0;
}
