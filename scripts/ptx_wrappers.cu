// Compiled by scripts/ptxas_check.sh only: instantiates every wrapper of kernels/ptx.cuh so the real build's
// inline PTX is assembled for sm_80 and sm_90 (and checked for local memory) before a kernel uses it.
#include "ptx.cuh"

__global__ void ptx_wrappers(const uint16_t *g, float *out) {
  __shared__ __align__(16) uint16_t s[16][16];
  int lane = threadIdx.x;
  ptx::cp_async_16(&s[lane % 16][(lane / 16) * 8], g + 8 * lane);
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
  __syncwarp();
  ptx::frag_a a;
  ptx::frag_b b;
  ptx::frag_c c = {}, d;
  uint32_t r1[1], r2[2], r4[4];
  ptx::ldmatrix_x4<false>(a.x, &s[lane % 16][(lane / 16) * 8]);
  ptx::ldmatrix_x2<true>(b.x, &s[lane % 16][0]);
  ptx::ldmatrix_x1<false>(r1, &s[lane % 16][0]);
  ptx::ldmatrix_x2<false>(r2, &s[lane % 16][0]);
  ptx::ldmatrix_x4<true>(r4, &s[lane % 16][(lane / 16) * 8]);
  ptx::ldmatrix_x1<true>(r1, &s[lane % 16][0]);
  ptx::mma_m16n8k16_bf16(d, a, b, c);
  ptx::mma_m16n8k16_f16(c, a, b, d);
  out[lane] = c.x[0] + c.x[1] + c.x[2] + c.x[3] + (float)(r1[0] ^ r2[1] ^ r4[3]);
}

// SASS probes for ptxas_check.sh's operand check: fragments of distinct constants and results stored in register
// order, so the SASS shows which register feeds each HMMA operand and which LDSM result lands where. A wrapper whose
// asm lists two operands in the wrong order (a swapped a.x[1], a.x[2]) assembles fine and fails that check.
#define BL_MMA_PROBE(name, fn)                                               \
  extern "C" __global__ void name(float *out) {                              \
    ptx::frag_a a{ { 0x11111111u, 0x22222222u, 0x33333333u, 0x44444444u } }; \
    ptx::frag_b b{ { 0x55555555u, 0x66666666u } };                           \
    ptx::frag_c c{ { 1.0f, 2.0f, 3.0f, 4.0f } }, d;                          \
    ptx::fn(d, a, b, c);                                                     \
    for (int i = 0; i < 4; i++) out[4 * threadIdx.x + i] = d.x[i];           \
  }
BL_MMA_PROBE(mma_probe_bf16, mma_m16n8k16_bf16)
BL_MMA_PROBE(mma_probe_f16, mma_m16n8k16_f16)
#undef BL_MMA_PROBE

extern "C" __global__ void ldmatrix_probe(uint32_t *out) {
  __shared__ __align__(16) uint16_t s[32][8];
  for (int i = threadIdx.x; i < 256; i += 32) s[i / 8][i % 8] = (uint16_t)i;
  __syncwarp();
  uint32_t r[4];
  ptx::ldmatrix_x4<false>(r, &s[threadIdx.x][0]);
  for (int i = 0; i < 4; i++) out[4 * threadIdx.x + i] = r[i];
}
