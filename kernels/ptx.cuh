// The one home of inline PTX, for the tensor-core kernels: typed wrappers for
// mma.sync m16n8k16 (bf16 or f16 in, f32 accumulate), ldmatrix .m8n8 .x1/.x2/
// .x4 (optionally .trans) and cp.async of 16 bytes with commit/wait groups.
// Under nvcc they are the PTX instructions; in the emulated build the same
// functions come from tests/emu/emu_ptx.h, which implements the PTX ISA's
// fragment layouts (mma is a warp collective; a cp.async destination reads as
// NaN until its wait_group).
//
// Fragments of mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"),
// g = lane / 4, t = lane % 4; the low half of a 32-bit register holds the
// lower-numbered element:
//   A 16x16, row-major, a0..a7 in x[0..3]: a0,a1 (row g, cols 2t, 2t+1),
//     a2,a3 (g+8, 2t..), a4,a5 (g, 2t+8..), a6,a7 (g+8, 2t+8..)
//   B 16x8 (k x n), b0..b3 in x[0..1]: b0,b1 (k 2t, 2t+1; n g), b2,b3 (k 2t+8..; n g)
//   C, D 16x8 f32: c0,c1 (row g, cols 2t, 2t+1), c2,c3 (row g+8, ...)
// ldmatrix .m8n8.b16: lanes 8i..8i+7 give the addresses of the 8 rows (16 B
// each, 16-byte aligned, shared memory) of matrix i, i < 1, 2 or 4; register
// i of every lane receives row g, columns 2t, 2t+1 of matrix i, or with
// .trans row 2t and 2t+1, column g. So x4 over a row-major 16x16 tile (lane l
// gives row l % 16, column 8 (l / 16)) is an A fragment, and x2.trans over a
// row-major 16x8 (k x n) tile (lane l < 16 gives row l) a B fragment.
#pragma once
#include <stdint.h>

namespace ptx {
struct frag_a {
  uint32_t x[4];
};
struct frag_b {
  uint32_t x[2];
};
struct frag_c {
  float x[4];
};
} // namespace ptx

#if defined(__CUDACC__)
namespace ptx {

// mma.sync.aligned.m16n8k16.row.col.f32.<ty>.<ty>.f32 (ty: "bf16" or "f16")
#define BL_PTX_MMA_M16N8K16(ty, d, a, b, c)                                                                 \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." ty "." ty                                           \
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "                                               \
               "{%10,%11,%12,%13};\n"                                                                       \
               : "=f"(d.x[0]), "=f"(d.x[1]), "=f"(d.x[2]), "=f"(d.x[3])                                     \
               : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]), "f"(c.x[0]), \
                 "f"(c.x[1]), "f"(c.x[2]), "f"(c.x[3]))
__device__ __forceinline__ void mma_m16n8k16_bf16(frag_c &d, const frag_a &a, const frag_b &b, const frag_c &c) {
  BL_PTX_MMA_M16N8K16("bf16", d, a, b, c);
}
__device__ __forceinline__ void mma_m16n8k16_f16(frag_c &d, const frag_a &a, const frag_b &b, const frag_c &c) {
  BL_PTX_MMA_M16N8K16("f16", d, a, b, c);
}
#undef BL_PTX_MMA_M16N8K16

__device__ __forceinline__ unsigned smem_addr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

template <bool Trans>
__device__ __forceinline__ void ldmatrix_x1(uint32_t (&r)[1], const void *row) {
  if (Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(smem_addr(row)));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(smem_addr(row)));
}
template <bool Trans>
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void *row) {
  if (Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr(row)));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr(row)));
}
template <bool Trans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *row) {
  if (Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row)));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row)));
}

// 16 bytes global -> shared, asynchronous (both 16-byte aligned); visible after a wait_group covering its group.
__device__ __forceinline__ void cp_async_16(void *smem, const void *gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

} // namespace ptx
#else
#include "emu_ptx.h"
#endif
