/* The per-head product of attention.c for one vector width, included once per
 * width with AG_NAME (the function to define) and AG_LANES (floats per
 * vector: 16 for AVX-512, 8 for AVX2, 4 for SSE) defined. Each width has its
 * own copy because a GCC vector wider than the target's registers becomes
 * slow emulated code (64-byte vectors on AVX2 ran ~20x slower).
 *
 * C[M x N] (+)= op(A)[M x K] B[K x N]: element (i, k) of op(A) is
 * A[i*lda + k] (ta = 0) or A[k*lda + i] (ta = 1, A^T without a copy);
 * B[k*ldb + j], C[i*ldc + j] row-major; acc = 0 overwrites C. Tiles of
 * AG_MR rows x 2 vectors (AG_MR also defined by the includer) keep 2 AG_MR
 * accumulators over the whole K, then tiles of 4 rows, a last column strip
 * of one vector, then scalar accumulators for the ragged edges, all in the
 * same k order, so every element is the same sum for any width and tile
 * up to FMA contraction. AVX2 takes 6 rows (12 of its 16 registers): each
 * B row it loads serves 6 rows of A instead of 4, and attention_fwd at
 * S=384 ran 8-10 % faster; AVX-512 keeps 4 (6 and 8 ran 5-25 % slower).
 * AG_WIDE (defined to 1) first runs 4-row tiles 4 vectors wide, 16 sums in
 * registers (AVX-512 only: AVX2 has 16 registers); the inference copy of the
 * AVX-512 product takes it (attention.c: the scores and context of packed
 * inference 3-5 % faster at 336 tokens, the same bits). */
#define AG_V          AG_CAT(ag_vec, AG_LANES)
#define AG_CAT(a, b)  AG_CAT_(a, b)
#define AG_CAT_(a, b) a##b
typedef float AG_V __attribute__((vector_size(AG_LANES * 4)));

/* rows [i, i + R) of C (R <= 8, a constant after inlining: the accumulator arrays stay in registers) */
static inline __attribute__((always_inline)) void AG_CAT(AG_NAME, _rows)(int R, int ta, int64_t i, int64_t N, int64_t K,
                                                                         const float *restrict A, int64_t lda,
                                                                         const float *restrict B, int64_t ldb,
                                                                         float *restrict C, int64_t ldc, int acc) {
  /* unaligned loads and stores (memcpy: the vectors need no alignment) */
#define AG_LD(v, p) memcpy(&(v), (p), sizeof(AG_V))
#define AG_ST(p, v) memcpy((p), &(v), sizeof(AG_V))
/* C tile row out: stored, or added to C's current values when acc */
#define AG_OUT(p, v) \
  do {               \
    AG_V o_ = (v);   \
    if (acc) {       \
      AG_V t_;       \
      AG_LD(t_, p);  \
      o_ += t_;      \
    }                \
    AG_ST(p, o_);    \
  } while (0)
/* s in every lane (s - 0 is s for every s, -0 included, so no add is emitted) */
#define AG_SPLAT(s) ((s) - (AG_V){ 0 })
  const int64_t L = AG_LANES, si = ta ? 1 : lda, sk = ta ? lda : 1; /* A(i, k) = A[i*si + k*sk] */
  const float *ar[8];
  _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) ar[r] = A + (i + r) * si;
  int64_t j = 0;
#if defined(AG_WIDE) && AG_WIDE
  /* 4 vectors a tile where the registers allow it (AG_WIDE: 4 rows on AVX-512, 16 sums): each A element
   * broadcast serves 4 vectors instead of 2, and 16 independent chains cover the FMA latency */
  if (R == 4)
    for (; j + 4 * L <= N; j += 4 * L) {
      AG_V c0[4], c1[4], c2[4], c3[4];
      _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) c0[r] = c1[r] = c2[r] = c3[r] = (AG_V){ 0 };
      const float *bp = B + j;
      for (int64_t k = 0; k < K; k++, bp += ldb) {
        AG_V b0, b1, b2, b3;
        AG_LD(b0, bp);
        AG_LD(b1, bp + L);
        AG_LD(b2, bp + 2 * L);
        AG_LD(b3, bp + 3 * L);
        int64_t ko = k * sk;
        _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {
          AG_V x = AG_SPLAT(ar[r][ko]);
          c0[r] += x * b0;
          c1[r] += x * b1;
          c2[r] += x * b2;
          c3[r] += x * b3;
        }
      }
      float *cp = C + i * ldc + j;
      _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {
        AG_OUT(cp + r * ldc, c0[r]);
        AG_OUT(cp + r * ldc + L, c1[r]);
        AG_OUT(cp + r * ldc + 2 * L, c2[r]);
        AG_OUT(cp + r * ldc + 3 * L, c3[r]);
      }
    }
#endif
  for (; j + 2 * L <= N; j += 2 * L) {
    AG_V c0[8], c1[8];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) c0[r] = c1[r] = (AG_V){ 0 };
    const float *bp = B + j;
    for (int64_t k = 0; k < K; k++, bp += ldb) {
      AG_V b0, b1;
      AG_LD(b0, bp);
      AG_LD(b1, bp + L);
      int64_t ko = k * sk;
      _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
        AG_V x = AG_SPLAT(ar[r][ko]);
        c0[r] += x * b0;
        c1[r] += x * b1;
      }
    }
    float *cp = C + i * ldc + j;
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
      AG_OUT(cp + r * ldc, c0[r]);
      AG_OUT(cp + r * ldc + L, c1[r]);
    }
  }
  for (; j + L <= N; j += L) {
    AG_V c0[8];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) c0[r] = (AG_V){ 0 };
    const float *bp = B + j;
    for (int64_t k = 0; k < K; k++, bp += ldb) {
      AG_V b0;
      AG_LD(b0, bp);
      int64_t ko = k * sk;
      _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) c0[r] += AG_SPLAT(ar[r][ko]) * b0;
    }
    float *cp = C + i * ldc + j;
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) AG_OUT(cp + r * ldc, c0[r]);
  }
  for (; j < N; j++)
    for (int r = 0; r < R; r++) {
      float sum = 0.0f;
      for (int64_t k = 0; k < K; k++) sum += ar[r][k * sk] * B[k * ldb + j];
      C[(i + r) * ldc + j] = acc ? C[(i + r) * ldc + j] + sum : sum;
    }
#undef AG_LD
#undef AG_ST
#undef AG_OUT
#undef AG_SPLAT
}

static inline __attribute__((always_inline)) void AG_NAME(int ta, int64_t M, int64_t N, int64_t K,
                                                          const float *restrict A, int64_t lda, const float *restrict B,
                                                          int64_t ldb, float *restrict C, int64_t ldc, int acc) {
  const int64_t si = ta ? 1 : lda, sk = ta ? lda : 1; /* A(i, k) = A[i*si + k*sk] */
  int64_t i = 0;
  for (; i + AG_MR <= M; i += AG_MR) AG_CAT(AG_NAME, _rows)(AG_MR, ta, i, N, K, A, lda, B, ldb, C, ldc, acc);
  for (; i + 4 <= M; i += 4) AG_CAT(AG_NAME, _rows)(4, ta, i, N, K, A, lda, B, ldb, C, ldc, acc);
  for (; i < M; i++) {
    const float *ar = A + i * si;
    for (int64_t j = 0; j < N; j++) {
      float sum = 0.0f;
      for (int64_t k = 0; k < K; k++) sum += ar[k * sk] * B[k * ldb + j];
      C[i * ldc + j] = acc ? C[i * ldc + j] + sum : sum;
    }
  }
}

#undef AG_V
#undef AG_CAT
#undef AG_CAT_
