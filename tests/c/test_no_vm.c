/* Expandable segments on a runtime without the virtual-memory functions (the fake ACL
 * built with -DFAKE_NO_VMM): every call that needs the allocator fails cleanly, naming
 * the missing function, and nothing crashes or leaks. */
#include <string.h>

#include "backend_ctl.h"
#include "check.h"

int main(void) {
  CHECK(npualloc_configure("expandable_segments:True") == NPUALLOC_OK);
  for (int i = 0; i < 2; i++) { /* not cached: the second call reports it again */
    void *p = npualloc_malloc(4096, 0, NULL);
    CHECK(p == NULL);
    const char *e = npualloc_last_error();
    CHECK(e != NULL && strstr(e, "aclrtMallocPhysical") != NULL &&
          strstr(e, "expandable_segments") != NULL);
  }
  npualloc_device_stats s;
  CHECK(npualloc_get_device_stats(0, &s) == NPUALLOC_ERR_INVALID_ARGUMENT);
  CHECK(npualloc_empty_cache_device(0) == NPUALLOC_ERR_INVALID_ARGUMENT);
  ctl_counters c;
  CHECK(ctl_get_counters(0, &c) == NPUALLOC_OK);
  CHECK(c.live_bytes == 0 && c.violations == 0);
  return REPORT("c-no-vm");
}
