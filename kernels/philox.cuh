// Philox4x32-10 on the device: the block function and stream convention of src/base/rules/philox.h, which
// src/tensor/random.c's bl_philox4x32 also runs (so a dropout mask or a random init is the same on the CPU and
// the GPU for one (seed, offset)): element i of a call uses block (offset + i/4) and lane i%4, u = (x >> 8) *
// 2^-24, and dropout keeps an element when u >= p.
#pragma once
#include <stdint.h>
#include "../src/bl_ops.h"
#include "../src/base/rules/philox.h"

// The seed a kernel uses: a device seed slot (BL_SEED_SLOT | address, bl_ops.h) is read from device memory, so a
// replayed CUDA graph takes the seed the host last copied there; any other value is the seed itself. Kernels call
// it once at entry (one load per thread, from a line every thread of the grid reads).
__device__ __forceinline__ uint64_t bl_seed_resolve(uint64_t seed) {
  if (!(seed & BL_SEED_SLOT)) return seed;
  return *(const uint64_t *)(uintptr_t)(seed & ~BL_SEED_SLOT);
}

__device__ __forceinline__ uint4 bl_philox4x32_dev(uint64_t seed, uint64_t counter) {
  uint32_t r[4];
  bl_philox_block(seed, counter, r);
  return make_uint4(r[0], r[1], r[2], r[3]);
}

__device__ __forceinline__ uint32_t bl_philox_lane(uint4 r, int lane) {
  return lane == 0 ? r.x : lane == 1 ? r.y : lane == 2 ? r.z : r.w;
}

// u in [0, 1) for element i of the stream (seed, offset).
__device__ __forceinline__ float bl_philox_uniform(uint64_t seed, uint64_t offset, uint64_t i) {
  uint4 r = bl_philox4x32_dev(seed, offset + (i >> 2));
  return bl_philox_u01(bl_philox_lane(r, (int)(i & 3)));
}

// Dropout keep decision for element i (p is the f32 drop probability, as on the CPU).
__device__ __forceinline__ bool bl_dropout_keep(uint64_t seed, uint64_t offset, uint64_t i, float p) {
  return bl_philox_uniform(seed, offset, i) >= p;
}

// Keep flags of elements i .. i+V-1 (i % 4 == 0, V % 4 == 0, or V == 1): one Philox block per 4 elements.
template <int V>
__device__ __forceinline__ void bl_dropout_keep_v(uint64_t seed, uint64_t offset, uint64_t i, float p, bool (&k)[V]) {
  if (V == 1) {
    k[0] = bl_dropout_keep(seed, offset, i, p);
    return;
  }
#pragma unroll
  for (int q = 0; q < V; q += 4) {
    const uint4 r = bl_philox4x32_dev(seed, offset + ((i + q) >> 2));
    const uint32_t w[4] = { r.x, r.y, r.z, r.w };
#pragma unroll
    for (int l = 0; l < 4 && q + l < V; l++) k[q + l] = bl_philox_u01(w[l]) >= p;
  }
}
