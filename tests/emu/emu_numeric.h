// Emulated CUDA libraries: the storage formats they read and write (f16,
// bf16 as raw 16-bit patterns; f32), converted with IEEE round-to-nearest-even
// as the hardware's cvt.rn does, and TF32 input rounding.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "library_types.h"

static inline uint32_t emu_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float emu_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline float emu_bf16_to_f32(uint16_t h) { return emu_bits_f32((uint32_t)h << 16); }
static inline uint16_t emu_f32_to_bf16(float f) {
  uint32_t u = emu_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); // quiet NaN, sign kept
  u += 0x7fffu + ((u >> 16) & 1);                                           // ties to even
  return (uint16_t)(u >> 16);
}

static inline float emu_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0x1f) return emu_bits_f32(sign | 0x7f800000u | (m << 13));
  if (e == 0) return (sign ? -1.0f : 1.0f) * ldexpf((float)m, -24); // zero and subnormals, exact
  return emu_bits_f32(sign | ((e + 112) << 23) | (m << 13));
}
static inline uint16_t emu_f32_to_f16(float f) {
  uint32_t u = emu_f32_bits(f), sign = (u >> 16) & 0x8000;
  float a = fabsf(f);
  if (a != a) return (uint16_t)(sign | 0x7e00);
  if (a >= 65520.0f) return (uint16_t)(sign | 0x7c00); // rounds to infinity
  if (a < 6.103515625e-05f) {                          // f16 subnormal: multiples of 2^-24
    float q = nearbyintf(a * 16777216.0f);             // default rounding mode: ties to even
    return (uint16_t)(sign | (uint32_t)q);
  }
  uint32_t b = emu_f32_bits(a);
  b += 0xfffu + ((b >> 13) & 1); // round the 13 dropped bits to even
  return (uint16_t)(sign | (((b >> 23) - 112) << 10) | ((b >> 13) & 0x3ff));
}

// cvt.rna.tf32.f32: keep 10 mantissa bits, ties away from zero.
static inline float emu_round_tf32(float f) {
  uint32_t u = emu_f32_bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u) return f;
  return emu_bits_f32((u + 0x1000u) & 0xffffe000u);
}

static inline int emu_type_size(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F:
    case CUDA_R_32I: return 4;
    case CUDA_R_64F: return 8;
    case CUDA_R_16F:
    case CUDA_R_16BF: return 2;
    case CUDA_R_8I: return 1;
  }
  return 0;
}

// Element i of a float-valued array of type t (f32, f16, bf16).
static inline float emu_load_f(const void *p, cudaDataType_t t, int64_t i) {
  if (t == CUDA_R_32F) return ((const float *)p)[i];
  uint16_t h = ((const uint16_t *)p)[i];
  return t == CUDA_R_16F ? emu_f16_to_f32(h) : emu_bf16_to_f32(h);
}
static inline void emu_store_f(void *p, cudaDataType_t t, int64_t i, float v) {
  if (t == CUDA_R_32F)
    ((float *)p)[i] = v;
  else
    ((uint16_t *)p)[i] = t == CUDA_R_16F ? emu_f32_to_f16(v) : emu_f32_to_bf16(v);
}

// v rounded to the precision of t (f32, f16, bf16), as a store and a load would.
static inline float emu_round_to(cudaDataType_t t, float v) {
  if (t == CUDA_R_16F) return emu_f16_to_f32(emu_f32_to_f16(v));
  if (t == CUDA_R_16BF) return emu_bf16_to_f32(emu_f32_to_bf16(v));
  return v;
}
