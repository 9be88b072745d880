/* The per-head product of attention.c for one vector width, included once per
 * width with AG_NAME (the function to define) and AG_LANES (floats per
 * vector: 16 for AVX-512, 8 for AVX2, 4 for SSE) defined. Each width has its
 * own copy because a GCC vector wider than the target's registers becomes
 * slow emulated code (64-byte vectors on AVX2 ran ~20x slower).
 *
 * C[M x N] (+)= op(A)[M x K] B[K x N]: element (i, k) of op(A) is
 * A[i*lda + k] (ta = 0) or A[k*lda + i] (ta = 1, A^T without a copy);
 * B[k*ldb + j], C[i*ldc + j] row-major; acc = 0 overwrites C. Tiles of
 * 4 rows x 2 vectors keep 8 accumulators over the whole K (2 FMA pipes x 4
 * cycles of latency); a last column strip of one vector, then scalar
 * accumulators for the ragged edges, all in the same k order, so every
 * element is the same sum for any width up to FMA contraction. */
#define AG_V AG_CAT(ag_vec, AG_LANES)
#define AG_CAT(a, b) AG_CAT_(a, b)
#define AG_CAT_(a, b) a##b
typedef float AG_V __attribute__((vector_size(AG_LANES * 4)));

static inline __attribute__((always_inline)) void AG_NAME(int ta, int64_t M, int64_t N, int64_t K,
                                                          const float *restrict A, int64_t lda,
                                                          const float *restrict B, int64_t ldb,
                                                          float *restrict C, int64_t ldc, int acc) {
  /* unaligned loads and stores (memcpy: the vectors need no alignment) */
#define AG_LD(v, p) memcpy(&(v), (p), sizeof(AG_V))
#define AG_ST(p, v) memcpy((p), &(v), sizeof(AG_V))
/* C tile row out: stored, or added to C's current values when acc */
#define AG_OUT(p, v) do { AG_V o_ = (v); if (acc) { AG_V t_; AG_LD(t_, p); o_ += t_; } AG_ST(p, o_); } while (0)
/* s in every lane (s - 0 is s for every s, -0 included, so no add is emitted) */
#define AG_SPLAT(s) ((s) - (AG_V){0})
  const int64_t L = AG_LANES, si = ta ? 1 : lda, sk = ta ? lda : 1;  /* A(i, k) = A[i*si + k*sk] */
  int64_t i = 0;
  for (; i + 4 <= M; i += 4) {
    const float *a0 = A + i * si, *a1 = a0 + si, *a2 = a1 + si, *a3 = a2 + si;
    int64_t j = 0;
    for (; j + 2 * L <= N; j += 2 * L) {
      AG_V c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0}, c30 = {0}, c31 = {0};
      const float *bp = B + j;
      for (int64_t k = 0; k < K; k++, bp += ldb) {
        AG_V b0, b1;
        AG_LD(b0, bp); AG_LD(b1, bp + L);
        int64_t ko = k * sk;
        AG_V x0 = AG_SPLAT(a0[ko]), x1 = AG_SPLAT(a1[ko]), x2 = AG_SPLAT(a2[ko]), x3 = AG_SPLAT(a3[ko]);
        c00 += x0 * b0; c01 += x0 * b1;
        c10 += x1 * b0; c11 += x1 * b1;
        c20 += x2 * b0; c21 += x2 * b1;
        c30 += x3 * b0; c31 += x3 * b1;
      }
      float *cp = C + i * ldc + j;
      AG_OUT(cp, c00); AG_OUT(cp + L, c01); AG_OUT(cp + ldc, c10); AG_OUT(cp + ldc + L, c11);
      AG_OUT(cp + 2 * ldc, c20); AG_OUT(cp + 2 * ldc + L, c21);
      AG_OUT(cp + 3 * ldc, c30); AG_OUT(cp + 3 * ldc + L, c31);
    }
    for (; j + L <= N; j += L) {
      AG_V c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0};
      const float *bp = B + j;
      for (int64_t k = 0; k < K; k++, bp += ldb) {
        AG_V b0;
        AG_LD(b0, bp);
        int64_t ko = k * sk;
        c0 += AG_SPLAT(a0[ko]) * b0; c1 += AG_SPLAT(a1[ko]) * b0;
        c2 += AG_SPLAT(a2[ko]) * b0; c3 += AG_SPLAT(a3[ko]) * b0;
      }
      float *cp = C + i * ldc + j;
      AG_OUT(cp, c0); AG_OUT(cp + ldc, c1); AG_OUT(cp + 2 * ldc, c2); AG_OUT(cp + 3 * ldc, c3);
    }
    for (; j < N; j++)
      for (int64_t r = 0; r < 4; r++) {
        const float *ar = A + (i + r) * si;
        float sum = 0.0f;
        for (int64_t k = 0; k < K; k++) sum += ar[k * sk] * B[k * ldb + j];
        C[(i + r) * ldc + j] = acc ? C[(i + r) * ldc + j] + sum : sum;
      }
  }
  for (; i < M; i++) {
    const float *ar = A + i * si;
    for (int64_t j = 0; j < N; j++) {
      float sum = 0.0f;
      for (int64_t k = 0; k < K; k++) sum += ar[k * sk] * B[k * ldb + j];
      C[i * ldc + j] = acc ? C[i * ldc + j] + sum : sum;
    }
  }
#undef AG_LD
#undef AG_ST
#undef AG_OUT
#undef AG_SPLAT
}

#undef AG_V
#undef AG_CAT
#undef AG_CAT_
