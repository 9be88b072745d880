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
#endif
