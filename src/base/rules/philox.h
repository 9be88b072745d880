/* Philox4x32-10 (Salmon et al., SC'11), the counter-based generator of cuRAND and PyTorch, and the stream
 * convention of bertlua's random numbers and dropout masks on both devices: element i of a call with (seed,
 * offset) takes lane i % 4 of block offset + i / 4; its uniform is u = (x >> 8) * 2^-24 (24 random bits, exact
 * in f32), and dropout keeps it when u >= p. bl_philox4x32 (src/tensor/random.c) exports the block function;
 * vm_philox (src/base/vecmath.h) and the AVX2 mask loop of src/ops/common.c are vectorised twins with these
 * constants, checked against it by tests/c/test_ops_vecmath.c. */
#ifndef BL_RULES_PHILOX_H
#define BL_RULES_PHILOX_H
#include <stdint.h>
#include "hd.h"

#define BL_PHILOX_M0 0xD2511F53u
#define BL_PHILOX_M1 0xCD9E8D57u
#define BL_PHILOX_W0 0x9E3779B9u
#define BL_PHILOX_W1 0xBB67AE85u

/* out = the 4 words of block `counter` of the stream keyed by seed */
BL_HD void bl_philox_block(uint64_t seed, uint64_t counter, uint32_t out[4]) {
  uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  BL_UNROLL
  for (int r = 0; r < 10; r++) {
#ifdef __CUDA_ARCH__ /* separate low and high products: the 64-bit product costs attn_tc_bwd a spill */
    const uint32_t lo0 = BL_PHILOX_M0 * c0, hi0 = __umulhi(BL_PHILOX_M0, c0);
    const uint32_t lo1 = BL_PHILOX_M1 * c2, hi1 = __umulhi(BL_PHILOX_M1, c2);
#else
    const uint64_t p0 = (uint64_t)BL_PHILOX_M0 * c0, p1 = (uint64_t)BL_PHILOX_M1 * c2;
    const uint32_t lo0 = (uint32_t)p0, hi0 = (uint32_t)(p0 >> 32), lo1 = (uint32_t)p1, hi1 = (uint32_t)(p1 >> 32);
#endif
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += BL_PHILOX_W0;
    k1 += BL_PHILOX_W1;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/* the uniform in [0, 1) of one word */
BL_HD float bl_philox_u01(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }
/* the uniform in (0, 1] of one word: Box-Muller's u1 (its log stays finite) */
BL_HD double bl_philox_u01_pos(uint32_t x) { return (double)bl_philox_u01(x) + 1.0 / 16777216.0; }
/* a value of the uniform fill on [a, b): a + (b - a) u in f64, rounded to f32 */
BL_HD float bl_philox_uniform_ab(uint32_t x, double a, double b) {
  return (float)(a + (b - a) * (double)bl_philox_u01(x));
}
#endif
