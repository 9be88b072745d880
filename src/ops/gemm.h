/* Our own packed f32 GEMM (src/ops/gemm.c), row-major:
 * C[m x n] = op(A) op(B) + beta C, op(X) = X^T when the t flag is set, X
 * stored with leading dimension ld. beta == 0 never reads C. */
#ifndef BL_OPS_GEMM_H
#define BL_OPS_GEMM_H
#include <stdint.h>

/* on the given ISA (OPX_ISA_*); 0 when that ISA has no kernel here (baseline)
 * or a pack buffer could not be had, so the caller must use another GEMM */
int opx_sgemm_isa(int isa, int ta, int tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                  int64_t ldb, float beta, float *c, int64_t ldc);

/* op(B) [k x n] packed once for the kernel of one ISA (an inference weight:
 * W [n, k] stored, tb = 1). NULL when that ISA has no kernel here or memory
 * ran out. The packed copy does not refer to b afterwards. */
typedef struct opx_packed_b opx_packed_b;
opx_packed_b *opx_pack_b(int isa, int tb, int64_t k, int64_t n, const float *b, int64_t ldb);
void opx_packed_b_free(opx_packed_b *pb);
int opx_packed_b_isa(const opx_packed_b *pb);

/* C[m x n] = op(A) B (overwritten) with the fused epilogue C += bias (bias
 * [n] or NULL), then C = GELU(C) (erf form, vm_gelu_fast) when gelu != 0, applied to
 * each C tile while it is in cache. Same ISA kernel as the pack; 0 on failure
 * (a pack buffer), C then unspecified. */
int opx_sgemm_packed(const opx_packed_b *pb, int ta, int64_t m, const float *a, int64_t lda, float *c, int64_t ldc,
                     const float *bias, int gelu);

/* The same epilogue, compiled for isa, as a pass of its own over rows x cols
 * of c (for the paths without a packed kernel) */
void opx_bias_act_rows(int isa, int64_t rows, int64_t cols, float *c, int64_t ldc, const float *bias, int gelu);
#endif
