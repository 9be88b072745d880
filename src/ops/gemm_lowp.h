/* Low-precision inference GEMMs on a weight packed once (issue 17), with the
 * f32 packed path's epilogue (C += bias, then exact-erf GELU when gelu):
 *   bf16 (src/ops/gemm_bf16.c): A and W rounded to bf16 (nearest even),
 *        products accumulated in f32 by AVX512-BF16's vdpbf16ps;
 *   int8 (src/ops/gemm_int8.c): W symmetric int8 per output channel, A
 *        asymmetric uint8 per row at run time, exact int32 sums (VNNI
 *        vpdpbusd, or AVX2 vpmaddwd on the values widened to int16),
 *        dequantized in the epilogue.
 * C[m x n] = A[m x k] op(B), B given as an inference weight (W [n, k]
 * stored: tb = 1). Every function returns 0 / NULL when the CPU lacks the
 * instructions or memory ran out; the caller reports which. */
#ifndef BL_OPS_GEMM_LOWP_H
#define BL_OPS_GEMM_LOWP_H
#include <stdint.h>

typedef struct opx_bf16_b opx_bf16_b;
opx_bf16_b *opx_bf16_pack(int tb, int64_t k, int64_t n, const float *b, int64_t ldb);
void opx_bf16_free(opx_bf16_b *pb);
int opx_bf16_gemm(const opx_bf16_b *pb, int ta, int64_t m, const float *a, int64_t lda, float *c, int64_t ldc,
                  const float *bias, int gelu);
/* opx_bf16_gemm with A and C each f32 or, when a_bf16 / c_bf16, bf16 (uint16_t bits, lda / ldc in elements; a
 * bf16 A is not transposed: ta = 0, else 0 is returned). A bf16 A goes to the products as it is (on AMX, K a
 * multiple of 32 and lda even: loaded into the tiles in place, no pack). A bf16 C is the f32 result, bias and
 * GELU applied, rounded to nearest even by the instruction that rounds an f32 A, so a bf16 C fed to the next
 * GEMM as its A gives the same bits as the f32 C would. */
int opx_bf16_gemm_io(const opx_bf16_b *pb, int ta, int64_t m, const void *a, int a_bf16, int64_t lda, void *c,
                     int c_bf16, int64_t ldc, const float *bias, int gelu);

/* isa: OPX_ISA_AVX512 (VNNI kernel, needs opx_vnni_ok) or OPX_ISA_AVX2 */
typedef struct opx_q8_b opx_q8_b;
opx_q8_b *opx_q8_pack(int isa, int tb, int64_t k, int64_t n, const float *b, int64_t ldb);
void opx_q8_free(opx_q8_b *pb);
int opx_q8_isa(const opx_q8_b *pb);
int opx_q8_gemm(const opx_q8_b *pb, int ta, int64_t m, const float *a, int64_t lda, float *c, int64_t ldc,
                const float *bias, int gelu);
/* the integer core alone, for tests: C32 = A8 Wq^T, A8 uint8 [m, k] row-major */
int opx_q8_gemm_s32(const opx_q8_b *pb, int64_t m, const uint8_t *a, int64_t lda, int32_t *c, int64_t ldc);
/* the per-channel weight scale of output j (W ~ scale_j * Wq[j, :]) */
float opx_q8_scale(const opx_q8_b *pb, int64_t j);

/* For the two GEMMs' drivers: how the npanels weight panels are split among tasks of nblk row blocks each.
 * Chunks of at most `chunk` panels (an AMX task's L2-sized share; npanels: no limit), split further until there
 * are at least 2 tasks per thread where the shape allows. Returns the splits; *per = panels per split. */
static inline int64_t opx_lowp_split(int64_t npanels, int64_t chunk, int64_t nblk, int nthreads, int64_t *per) {
  if (chunk < 1) chunk = 1;
  int64_t nsplit = (npanels + chunk - 1) / chunk;
  while (nblk * nsplit < 2 * nthreads && nsplit < npanels) nsplit++;
  *per = (npanels + nsplit - 1) / nsplit;
  return nsplit;
}

/* bytes of weight panels an AMX task runs its row blocks against (held in L2 while each 32-row block passes) */
enum { OPX_AMX_B_BYTES = 1 << 20 };
#endif
