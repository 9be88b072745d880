// Emulated CUDA device: __nv_bfloat16 and the conversions bertlua uses,
// bit-exact with the hardware (round to nearest even, NaN -> 0x7fff).
#pragma once
#include <stdint.h>
#include <string.h>

static inline unsigned short emu_float_to_bf16_bits(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16); // overflow rounds to inf, as it should
}
static inline float emu_bf16_bits_to_float(unsigned short b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(emu_float_to_bf16_bits(f)) {}
  operator float() const { return emu_bf16_bits_to_float(__x); }
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
typedef __nv_bfloat16 nv_bfloat16;

static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
  __nv_bfloat16 b;
  b.__x = u;
  return b;
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __ushort_as_bfloat16(emu_float_to_bf16_bits(f)); }
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline float __bfloat162float(__nv_bfloat16 b) { return emu_bf16_bits_to_float(b.__x); }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return { __float2bfloat16_rn(a), __float2bfloat16_rn(b) };
}
