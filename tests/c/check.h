/* A tiny assertion helper for the C tests: counts checks, prints failures. */
#ifndef NPUALLOC_TEST_CHECK_H
#define NPUALLOC_TEST_CHECK_H
#include <stdio.h>
static int checks_passed = 0, checks_failed = 0;
#define CHECK(cond)                                                              \
  do {                                                                           \
    if (cond) {                                                                  \
      checks_passed++;                                                           \
    } else {                                                                     \
      checks_failed++;                                                           \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__,    \
              __LINE__, #cond,                                                   \
              npualloc_last_error() ? npualloc_last_error() : "(none)");         \
    }                                                                            \
  } while (0)
#define REPORT(name)                                                             \
  (printf("%s: %d passed, %d failed\n", name, checks_passed, checks_failed),     \
   checks_failed ? 1 : 0)
#endif
