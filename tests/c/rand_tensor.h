/* Random test inputs the packed-linear tests share: a xorshift64 stream
 * (each test seeds its own rng_state) and f32 [r, c] CPU tensors uniform in
 * [-scale, scale). Include after check.h (OK). */
#ifndef BL_TEST_RAND_TENSOR_H
#define BL_TEST_RAND_TENSOR_H
#include "bertlua.h"
#include <stdint.h>

static uint64_t rng_state;
static uint64_t rng_next(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}
/* uniform in [-1, 1) */
static float urand(void) { return (float)((double)(rng_next() >> 40) / (double)(1ull << 24) * 2.0 - 1.0); }

static bl_tensor *rand_tensor(int64_t r, int64_t c, float scale) {
  bl_tensor *t = NULL;
  int64_t shape[2] = { r, c };
  OK(bl_tensor_empty(2, shape, BL_F32, -1, &t));
  for (int64_t i = 0; t && i < r * c; i++) ((float *)t->data)[i] = scale * urand();
  return t;
}
#endif
