/* npualloc_memory_summary through the C ABI, on the simulated backend or the fake ACL
 * runtime (2 devices of 1 GiB; see test_abi.c). The layout itself is checked against
 * torch_npu's own memory_summary() in the Rust unit tests and the torch_npu suite. */
#include <stdlib.h>
#include <string.h>

#include "npualloc.h"
#include "check.h"

/* The number in the row `name`'s first column ("| name | <n> <unit> |"). */
static long first_column(const char *text, const char *name) {
  const char *row = strstr(text, name);
  if (!row) return -1;
  const char *bar = strchr(row + 1, '|');
  return bar ? strtol(bar + 1, NULL, 10) : -1;
}

int main(void) {
  void *p[3];
  p[0] = npualloc_malloc(3 << 20, 0, NULL);
  p[1] = npualloc_malloc(512, 0, NULL);
  p[2] = npualloc_malloc(100 << 10, 0, NULL);
  CHECK(p[0] && p[1] && p[2]);

  const char *s = npualloc_memory_summary(0, false);
  CHECK(s != NULL);
  if (s) {
    CHECK(strstr(s, "PyTorch NPU memory summary, device ID 0 ") != NULL);
    CHECK(strstr(s, "from large pool") != NULL);
    CHECK(first_column(s, "| Allocations ") == 3);
    /* About 3.1 MiB allocated: the row is in KB (under 768 MB), floor-divided. */
    npualloc_device_stats st;
    CHECK(npualloc_get_device_stats(0, &st) == NPUALLOC_OK);
    CHECK(st.allocated_bytes[0].current >= (3 << 20) + 512 + (100 << 10));
    CHECK(first_column(s, "| Allocated memory ") == st.allocated_bytes[0].current / 1024);
    CHECK(strstr(s, "reserved ") != NULL && strstr(s, "whole empty segments") != NULL);
  }
  const char *a = npualloc_memory_summary(0, true);
  CHECK(a != NULL && strstr(a, "from large pool") == NULL);

  for (int i = 0; i < 3; i++) npualloc_free(p[i], 0, 0, NULL);
  npualloc_empty_cache(true);
  s = npualloc_memory_summary(0, false);
  CHECK(s != NULL && first_column(s, "| Allocations ") == 0);
  CHECK(s != NULL && strstr(s, "reserved 0 bytes in 0 segments") != NULL);

  /* An invalid device: NULL and a reason. */
  CHECK(npualloc_memory_summary(99, false) == NULL);
  CHECK(npualloc_last_error() && strstr(npualloc_last_error(), "npualloc_memory_summary"));
  CHECK(npualloc_memory_summary(-1, false) == NULL);
  return REPORT("c-summary");
}
