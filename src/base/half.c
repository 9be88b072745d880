/* f16 (IEEE binary16) and bf16 conversions, round to nearest even, with
 * NaN, infinities and subnormals handled exactly. */
#include <string.h>
#include "bl_tensor.h"

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

uint16_t bl_f32_to_bf16(float x) {
  uint32_t u = f2u(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  /* quiet NaN */
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)((u + rounding) >> 16);
}

float bl_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t bl_f32_to_f16(float x) {
  uint32_t u = f2u(x);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);          /* NaN */
  if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);          /* overflow (after rounding) → inf */
  if (absu < 0x38800000u) {                                            /* f16 subnormal or zero */
    if (absu < 0x33000000u) return (uint16_t)sign;                     /* below half the smallest subnormal */
    uint32_t exp = absu >> 23;
    uint32_t mant = (absu & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;                                        /* 14 + (113 - exp) - 1 ... */
    uint32_t v = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (v & 1u))) v++;
    return (uint16_t)(sign | v);
  }
  /* normal: rebias exponent 127 → 15, round mantissa 23 → 10 bits */
  uint32_t v = absu - 0x38000000u;
  uint32_t rem = v & 0x1fffu;
  v >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (v & 1u))) v++;
  return (uint16_t)(sign | v);
}

float bl_f16_to_f32(uint16_t h) {
  uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return u2f(sign);
    float f = (float)mant * (1.0f / 16777216.0f);  /* mant * 2^-24 */
    return sign ? -f : f;
  }
  if (exp == 31) return u2f(sign | 0x7f800000u | (mant << 13));
  return u2f(sign | ((exp + 112) << 23) | (mant << 13));
}
