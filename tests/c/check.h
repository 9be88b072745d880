/* What the C tests share: CHECK(cond, fmt, ...) counts and reports a failed
 * condition with its file:line, OK(call) a failed bertlua call, `failures` is what main()
 * returns on. */
#ifndef BL_TEST_CHECK_H
#define BL_TEST_CHECK_H
#include <stdio.h>

static int failures __attribute__((unused)) = 0; /* unused in a test that skips (no CUDA) */
#define CHECK(cond, ...)                          \
  do {                                            \
    if (!(cond)) {                                \
      failures++;                                 \
      printf("FAIL %s:%d: ", __FILE__, __LINE__); \
      printf(__VA_ARGS__);                        \
      printf("\n");                               \
    }                                             \
  } while (0)
/* OK(expr): a bertlua call that must succeed; a failure is counted with bl_last_error(). */
#define OK(expr)                                                                             \
  do {                                                                                       \
    int rc_ = (expr);                                                                        \
    if (rc_ != 0) {                                                                          \
      failures++;                                                                            \
      printf("FAIL %s:%d: %s -> %d: %s\n", __FILE__, __LINE__, #expr, rc_, bl_last_error()); \
    }                                                                                        \
  } while (0)
#endif
