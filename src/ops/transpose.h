/* dst[c * ld_dst + r] = src[r * ld_src + c] for an R x C block of f32
 * (internal to src/ops; src and dst must not overlap). Shared by the GEMM's
 * A packing (an MR-row panel is a transpose with ld_dst = MR) and
 * attention's K^T.
 *
 * 4 x 4 blocks are transposed in SSE registers (baseline x86-64): row groups
 * 0, 4, ... and, when R % 4 != 0, a last group ending at row R that overlaps
 * the one before (it rewrites the same values). An element-at-a-time copy
 * down the columns read R rows a stride apart per column; rows 12 KB apart
 * (the FFN's 3072 floats) all fall in one L1 set, so nearly every read
 * missed. Here each row is read line by line, 64 columns at a time, so the
 * part of dst being written stays in L1. Exact: every value is copied. */
#ifndef BL_OPS_TRANSPOSE_H
#define BL_OPS_TRANSPOSE_H
#include <stdint.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

static inline void opx_transpose(int64_t R, int64_t C, const float *restrict src, int64_t ld_src, float *restrict dst,
                                 int64_t ld_dst) {
  for (int64_t c0 = 0; c0 < C; c0 += 64) {
    int64_t c1 = c0 + 64 < C ? c0 + 64 : C, c4 = c0;
#if defined(__SSE__)
    if (R >= 4) {
      c4 = c0 + (c1 - c0) / 4 * 4;
      for (int64_t g = 0; g < R; g += 4) {
        int64_t r = g + 4 <= R ? g : R - 4;
        const float *s = src + r * ld_src;
        for (int64_t c = c0; c < c4; c += 4) {
          __m128 x0 = _mm_loadu_ps(s + c), x1 = _mm_loadu_ps(s + ld_src + c);
          __m128 x2 = _mm_loadu_ps(s + 2 * ld_src + c), x3 = _mm_loadu_ps(s + 3 * ld_src + c);
          _MM_TRANSPOSE4_PS(x0, x1, x2, x3);
          _mm_storeu_ps(dst + c * ld_dst + r, x0);
          _mm_storeu_ps(dst + (c + 1) * ld_dst + r, x1);
          _mm_storeu_ps(dst + (c + 2) * ld_dst + r, x2);
          _mm_storeu_ps(dst + (c + 3) * ld_dst + r, x3);
        }
      }
    }
#endif
    for (int64_t c = c4; c < c1; c++)
      for (int64_t r = 0; r < R; r++) dst[c * ld_dst + r] = src[r * ld_src + c];
  }
}
#endif
