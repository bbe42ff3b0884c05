/* mstx markers through the C ABI and around the allocator's slow paths, against the
 * fake libms_tools_ext.so (NPUALLOC_MSTX_LIB). */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "npualloc.h"
#include "check.h"

typedef struct { uint64_t started, ended, bad_ends, marks, domain_calls, max_len; } counts;

int main(void) {
  void *fake = dlopen(getenv("NPUALLOC_MSTX_LIB"), RTLD_NOW);
  if (!fake) { fprintf(stderr, "%s\n", dlerror()); return 2; }
  void (*get)(counts *) = (void (*)(counts *))dlsym(fake, "fake_mstx_counts_get");
  counts c;

  uint64_t id = 0;
  CHECK(npualloc_mstx_range_start("user.phase", NULL, &id) == NPUALLOC_OK);
  CHECK(id != 0);
  CHECK(npualloc_mstx_range_end(id) == NPUALLOC_OK);
  CHECK(npualloc_mstx_range_end(0) == NPUALLOC_OK); /* no range: ignored */
  CHECK(npualloc_mstx_mark("user.mark", NULL) == NPUALLOC_OK);
  char longmsg[300];
  memset(longmsg, 'x', sizeof longmsg - 1);
  longmsg[sizeof longmsg - 1] = 0;
  CHECK(npualloc_mstx_range_start(longmsg, NULL, &id) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_mstx_range_start("", NULL, &id) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_mstx_mark("", NULL) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_mstx_mark(longmsg, NULL) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_mstx_range_start("x", NULL, NULL) == NPUALLOC_ERR_INVALID_ARGUMENT);
  longmsg[200] = 0; /* 200 bytes: accepted, cut to 156 */
  CHECK(npualloc_mstx_range_start(longmsg, NULL, &id) == NPUALLOC_OK);
  npualloc_mstx_range_end(id);

  get(&c);
  uint64_t before = c.started;
  void *p = npualloc_malloc(30u << 20, 0, NULL); /* slow path: device malloc */
  npualloc_free(p, 0, 0, NULL);
  npualloc_empty_cache(true); /* cache release + device free */
  get(&c);
  CHECK(c.started >= before + 3);
  CHECK(c.started == c.ended);
  CHECK(c.bad_ends == 0);
  CHECK(c.max_len == 156);
  CHECK(c.marks == 1);
  return REPORT("c-mstx");
}
