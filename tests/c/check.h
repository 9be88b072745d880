/* What the C tests share: CHECK(cond, fmt, ...) counts and reports a failed
 * condition with its file:line, `failures` is what main() returns on. */
#ifndef BL_TEST_CHECK_H
#define BL_TEST_CHECK_H
#include <stdio.h>

static int failures = 0;
#define CHECK(cond, ...)                          \
  do {                                            \
    if (!(cond)) {                                \
      failures++;                                 \
      printf("FAIL %s:%d: ", __FILE__, __LINE__); \
      printf(__VA_ARGS__);                        \
      printf("\n");                               \
    }                                             \
  } while (0)
#endif
