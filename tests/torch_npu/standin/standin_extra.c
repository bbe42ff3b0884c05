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

/* acl_base_rt.h: the SoC torch_npu selects its code paths by (an Atlas A2 part). */
EXPORT const char *aclrtGetSocName(void) { return "Ascend910B1"; }

/* acl_rt.h: torch_npu creates its streams with a priority and flags. */
EXPORT aclError aclrtCreateStreamWithConfig(aclrtStream *stream, uint32_t priority, uint32_t flag) {
  (void)priority;
  (void)flag;
  return aclrtCreateStream(stream);
}

EXPORT aclError aclrtDestroyStream(aclrtStream stream) {
  (void)stream;
  return ACL_SUCCESS;
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

/* Host memory and copies (device memory is host memory in the stand-in). */
EXPORT aclError aclrtMallocHost(void **p, size_t size) {
  *p = malloc(size ? size : 1);
  return *p ? ACL_SUCCESS : ACL_ERROR_RT_MEMORY_ALLOCATION;
}

EXPORT aclError aclrtFreeHost(void *p) {
  free(p);
  return ACL_SUCCESS;
}

EXPORT aclError aclrtMemcpy(void *dst, size_t dest_max, const void *src, size_t count, int kind) {
  (void)kind;
  if (count > dest_max) return ACL_ERROR_RT_PARAM_INVALID;
  if (count) memmove(dst, src, count);
  return ACL_SUCCESS;
}

EXPORT aclError aclrtMemcpyAsync(void *dst, size_t dest_max, const void *src, size_t count, int kind,
                                 aclrtStream stream) {
  (void)stream;
  return aclrtMemcpy(dst, dest_max, src, count, kind);
}

EXPORT aclError aclrtMemset(void *dst, size_t max_count, int32_t value, size_t count) {
  if (count > max_count) return ACL_ERROR_RT_PARAM_INVALID;
  if (count) memset(dst, value, count);
  return ACL_SUCCESS;
}

EXPORT aclError aclrtMemsetAsync(void *dst, size_t max_count, int32_t value, size_t count,
                                 aclrtStream stream) {
  (void)stream;
  return aclrtMemset(dst, max_count, value, count);
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
} standin_model;

#define MAX_CAPTURING 64
#define MAX_CAPTURE_EVENTS 1024
static struct { aclrtStream stream; standin_model *model; } capturing[MAX_CAPTURING];
static struct { aclrtEvent event; standin_model *model; } capture_events[MAX_CAPTURE_EVENTS];
static uint32_t next_model_id = 1;
static pthread_mutex_t capture_mu = PTHREAD_MUTEX_INITIALIZER;

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
      return ACL_SUCCESS;
    }
  return ACL_ERROR_RT_PARAM_INVALID;
}

EXPORT aclError aclmdlRICaptureBegin(aclrtStream stream, int mode) {
  pthread_mutex_lock(&capture_mu);
  aclError rc = ACL_ERROR_RT_PARAM_INVALID;
  if (!capture_of(stream)) {
    standin_model *m = calloc(1, sizeof *m);
    m->id = next_model_id++;
    m->mode = mode;
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

EXPORT aclError aclmdlRICaptureEnd(aclrtStream stream, void **model) {
  pthread_mutex_lock(&capture_mu);
  standin_model *m = capture_of(stream);
  if (m) {
    for (int i = 0; i < MAX_CAPTURING; i++)
      if (capturing[i].model == m) capturing[i].model = NULL;
    for (int i = 0; i < MAX_CAPTURE_EVENTS; i++)
      if (capture_events[i].model == m) capture_events[i].model = NULL;
  }
  pthread_mutex_unlock(&capture_mu);
  if (!m) return ACL_ERROR_RT_PARAM_INVALID;
  *model = m;
  return ACL_SUCCESS;
}

/* The capture modes' rule, as CUDA's (aclmdlRICaptureMode has the same three): while a
 * capture begun in global or thread-local mode is open, a thread whose own mode is not
 * relaxed may not allocate, free, query or synchronise (fake_acl.c asks here through
 * standin_capture_refuses); aclmdlRICaptureThreadExchangeMode sets the thread's mode.
 * Thread-local captures are treated like global ones (one capturing thread here). */
static __thread int thread_capture_mode = 0;
static uint64_t capture_refusals;

EXPORT aclError aclmdlRICaptureThreadExchangeMode(int *mode) {
  if (!mode || *mode < 0 || *mode > 2) return ACL_ERROR_RT_PARAM_INVALID;
  int old = thread_capture_mode;
  thread_capture_mode = *mode;
  *mode = old;
  return ACL_SUCCESS;
}

EXPORT int standin_capture_refuses(const char *call) {
  if (thread_capture_mode == 2) return 0;
  int refuse = 0;
  pthread_mutex_lock(&capture_mu);
  for (int i = 0; i < MAX_CAPTURING; i++)
    if (capturing[i].model && capturing[i].model->mode != 2) refuse = 1;
  if (refuse) capture_refusals++;
  pthread_mutex_unlock(&capture_mu);
  if (refuse) fprintf(stderr, "stand-in: %s refused during a graph capture\n", call);
  return refuse;
}

/* How many calls standin_capture_refuses refused (a scenario asserts none). */
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
