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
