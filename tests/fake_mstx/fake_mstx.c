/*
 * A fake MindStudio mstx library (libms_tools_ext.so) for npualloc's tests: it records
 * every range start/end and mark so tests can check that each range is closed, which
 * messages were sent and how long they were.
 *
 * Variant: -DFAKE_MSTX_NO_DOMAIN leaves out the domain functions.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_RANGES 65536

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t next_id = 1;
static unsigned char open_[MAX_RANGES];
static char messages[MAX_RANGES][160];
static uint64_t started, ended, bad_ends, marks, domain_calls, max_len;
static int fail_starts = 0;
static char domain_name[64];
#ifndef FAKE_MSTX_NO_DOMAIN
static int domain_token;
#endif

static uint64_t start(const char *message, int via_domain) {
  pthread_mutex_lock(&mu);
  size_t n = message ? strlen(message) : 0;
  if (n > max_len) max_len = n;
  if (via_domain) domain_calls++;
  uint64_t id = 0;
  if (!fail_starts && next_id < MAX_RANGES) {
    id = next_id++;
    open_[id] = 1;
    strncpy(messages[id], message ? message : "", sizeof messages[id] - 1);
    started++;
  }
  pthread_mutex_unlock(&mu);
  return id;
}

static void end(uint64_t id) {
  pthread_mutex_lock(&mu);
  if (id == 0 || id >= MAX_RANGES || !open_[id]) {
    bad_ends++;
  } else {
    open_[id] = 0;
    ended++;
  }
  pthread_mutex_unlock(&mu);
}

EXPORT uint64_t mstxRangeStartA(const char *message, void *stream) { (void)stream; return start(message, 0); }
EXPORT void mstxRangeEnd(uint64_t id) { end(id); }
EXPORT void mstxMarkA(const char *message, void *stream) {
  (void)stream;
  pthread_mutex_lock(&mu);
  size_t n = message ? strlen(message) : 0;
  if (n > max_len) max_len = n;
  marks++;
  pthread_mutex_unlock(&mu);
}

#ifndef FAKE_MSTX_NO_DOMAIN
EXPORT void *mstxDomainCreateA(const char *name) {
  strncpy(domain_name, name, sizeof domain_name - 1);
  return &domain_token;
}
EXPORT uint64_t mstxDomainRangeStartA(void *domain, const char *message, void *stream) {
  (void)stream;
  if (domain != &domain_token) { bad_ends++; return 0; }
  return start(message, 1);
}
EXPORT void mstxDomainRangeEnd(void *domain, uint64_t id) {
  if (domain != &domain_token) bad_ends++;
  end(id);
}
EXPORT void mstxDomainMarkA(void *domain, const char *message, void *stream) {
  (void)domain;
  mstxMarkA(message, stream);
}
#endif

/* ---- test controls ---- */
typedef struct { uint64_t started, ended, bad_ends, marks, domain_calls, max_len; } fake_mstx_counts;

EXPORT void fake_mstx_counts_get(fake_mstx_counts *out) {
  pthread_mutex_lock(&mu);
  *out = (fake_mstx_counts){started, ended, bad_ends, marks, domain_calls, max_len};
  pthread_mutex_unlock(&mu);
}

/* Copies the message of range `id` (1-based, in start order) into buf. */
EXPORT int fake_mstx_message(uint64_t id, char *buf, size_t len) {
  if (id == 0 || id >= next_id || len == 0) return -1;
  pthread_mutex_lock(&mu);
  strncpy(buf, messages[id], len - 1);
  buf[len - 1] = 0;
  pthread_mutex_unlock(&mu);
  return 0;
}

EXPORT const char *fake_mstx_domain_name(void) { return domain_name; }
EXPORT void fake_mstx_fail_starts(int on) { fail_starts = on; }
