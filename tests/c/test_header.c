/* The header compiles cleanly as C11 and as C++ (-Wall -Wextra -Werror), and twice. */
#include "npualloc.h"
#include "npualloc.h"

typedef char stats_layout_check[(sizeof(npualloc_device_stats) == (9 * 3 * 4 + 2 + 2 * 4 + 4) * 8) ? 1 : -1];

int main(void) {
  void *(*alloc_fn)(size_t, int, npualloc_stream) = npualloc_malloc;
  void (*free_fn)(void *, size_t, int, npualloc_stream) = npualloc_free;
  (void)alloc_fn;
  (void)free_fn;
  return 0;
}
