/* Many threads calling the ABI at once: alloc/free/record on several streams. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "npualloc.h"
#include "check.h"
#include "backend_ctl.h"

#define THREADS 8
#define ITERS 4000
static npualloc_stream streams[4];
static pthread_mutex_t count_lock = PTHREAD_MUTEX_INITIALIZER;
static int thread_failures = 0;

static uint64_t next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static void *worker(void *arg) {
  uint64_t seed = 0x9E3779B97F4A7C15ull ^ (uintptr_t)arg;
  npualloc_stream mine = streams[(uintptr_t)arg % 4];
  void *live[16];
  size_t sizes[16];
  int n = 0, bad = 0;
  for (int i = 0; i < ITERS; i++) {
    uint64_t r = next(&seed);
    if (n < 16 && r % 3) {
      size_t size = (r >> 8) % (r % 7 == 0 ? (8u << 20) : 65536u) + 1;
      void *p = npualloc_malloc(size, 0, mine);
      if (!p) { bad++; continue; }
      memset(&sizes[n], 0, sizeof sizes[n]);
      sizes[n] = size;
      live[n++] = p;
      if (r % 5 == 0) npualloc_record_stream(p, streams[(r >> 20) % 4]);
    } else if (n > 0) {
      int k = (int)((r >> 4) % (uint64_t)n);
      npualloc_free(live[k], sizes[k], 0, mine);
      live[k] = live[--n];
      sizes[k] = sizes[n];
    }
  }
  while (n > 0) { n--; npualloc_free(live[n], sizes[n], 0, mine); }
  pthread_mutex_lock(&count_lock);
  thread_failures += bad;
  pthread_mutex_unlock(&count_lock);
  return NULL;
}

int main(void) {
  streams[0] = NULL;
  for (int i = 1; i < 4; i++) CHECK(ctl_create_stream(0, &streams[i]) == NPUALLOC_OK);
  pthread_t t[THREADS];
  for (uintptr_t i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)i);
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  CHECK(thread_failures == 0);
  CHECK(npualloc_check_invariants(0) == NPUALLOC_OK);
  npualloc_device_stats s;
  CHECK(npualloc_get_device_stats(0, &s) == NPUALLOC_OK);
  CHECK(s.allocation[0].current == 0);
  CHECK(s.allocation[0].allocated == s.allocation[0].freed);
  CHECK(s.allocation[0].allocated > THREADS * 100);
  npualloc_empty_cache(true);
  ctl_counters c;
  CHECK(ctl_get_counters(0, &c) == NPUALLOC_OK);
  CHECK(c.live_bytes == 0);
  CHECK(c.violations == 0);
  CHECK(c.events_created == c.events_destroyed);
  return REPORT("c-threads");
}
