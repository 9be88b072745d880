// Emulated CUDA device: __half and the conversions bertlua uses, bit-exact
// with the hardware (round to nearest even, NaN -> 0x7fff as cvt.rn.f16.f32).
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline unsigned short emu_float_to_half_bits(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return 0x7fffu;                           // NaN
  if (ax >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u); // >= 65520 (half way above 65504) -> inf
  if (ax < 0x38800000u) {                                         // below 2^-14: a multiple of 2^-24, scaling is exact
    float a = fabsf(f) * 16777216.0f;
    return (unsigned short)(sign | (uint32_t)nearbyintf(a)); // 1024 is the smallest normal's encoding
  }
  uint32_t h = ((((ax >> 23) - 112u) << 10) | ((ax & 0x7fffffu) >> 13));
  uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; // a carry into the exponent is the right result
  return (unsigned short)(sign | h);
}

static inline float emu_half_bits_to_float(unsigned short h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
  if (e == 0) {
    float v = (float)m * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (e == 31)
    x = sign | 0x7f800000u | (m << 13);
  else
    x = sign | ((e + 112u) << 23) | (m << 13);
  float f;
  memcpy(&f, &x, 4);
  return f;
}

struct __half {
  unsigned short __x;
  __half() = default;
  __half(float f) : __x(emu_float_to_half_bits(f)) {}
  operator float() const { return emu_half_bits_to_float(__x); }
};
struct __half2 {
  __half x, y;
};
typedef __half half;

static inline __half __ushort_as_half(unsigned short u) {
  __half h;
  h.__x = u;
  return h;
}
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline __half __float2half_rn(float f) { return __ushort_as_half(emu_float_to_half_bits(f)); }
static inline __half __float2half(float f) { return __float2half_rn(f); }
static inline float __half2float(__half h) { return emu_half_bits_to_float(h.__x); }
static inline __half2 __floats2half2_rn(float a, float b) { return { __float2half_rn(a), __float2half_rn(b) }; }
static inline float __low2float(__half2 v) { return __half2float(v.x); }
static inline float __high2float(__half2 v) { return __half2float(v.y); }
