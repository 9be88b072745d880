/* Our own packed f32 GEMM (issue 17): C = op(A) op(B) + beta C, row-major.
 *
 * The classic blocked scheme: B is copied in KC x NC blocks into panels of NR
 * columns, A in MC x KC blocks into panels of MR rows, so the register-blocked
 * micro-kernel reads both with unit stride from cache; an MR x NR tile of C
 * stays in registers for a whole KC slice. One micro-kernel per ISA:
 * AVX-512 14 x 32 (28 accumulators + 2 B vectors + 1 broadcast = 31 of 32
 * zmm), AVX2+FMA 6 x 16 (12 + 2 + 1 of 16 ymm). The baseline path has no
 * kernel of its own (callers fall back to OpenBLAS). Threads share the packed
 * B block and split A into even row blocks of at most MC rows (and the NR
 * panels when A has too few rows; at batch 1, a prepacked B's panels go out
 * in chunks by a dynamic schedule, see drive_small). Pack buffers are kept
 * per thread and grow only, so a steady workload allocates nothing per call.
 *
 * For inference a weight can be packed once (opx_pack_b: every KC x NC block
 * of B laid out as the driver reads it) and reused by every call
 * (opx_sgemm_packed), which then also applies bias and GELU to each C tile
 * as soon as its last K block is done, with no barrier between K blocks. */
#include "gemm.h"
#include "transpose.h"
#include "base/vecmath.h"
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#if OPX_MULTI_ISA
#include <immintrin.h>
#endif

typedef void (*ukernel_fn)(int64_t kc, const float *restrict ap, const float *restrict bp, float *restrict c,
                           int64_t ldc, float beta, const float *restrict bias, const float *pf, int64_t pfn);

/* rows [0, nrows) of a matrix whose rows are ld apart and hold width floats
 * side by side, cut into panels of w columns: panel q's row p goes to
 * dst + q * w * pstride + p * w, zero-padded to w (pack_rows_*) */
typedef void (*pack_rows_fn)(int64_t nrows, const float *restrict src, int64_t ld, int64_t width, int w,
                             float *restrict dst, int64_t pstride);

typedef struct gemm_cfg {
  int mr, nr, kc, mc, nc;
  ukernel_fn kernel;
  int pack14;  /* A's full row-major panels through pack_panel14_avx512 */
  int pf_next; /* A^T stored: the next A block's source prefetched into L2 while this block's tiles run */
  pack_rows_fn pack_rows;
} gemm_cfg;

#if OPX_MULTI_ISA
/* An MR x 2W tile kernel (W floats per vector, intrinsics prefix P). The
 * unroll pragmas on every loop over the tile's rows keep the accumulator
 * arrays in registers: with the store loop left rolled GCC kept them in
 * memory and wrote them back each k step, which halved the AVX2 kernel's
 * speed. beta == 0 never reads C (it may hold garbage or NaN). A bias (NULL:
 * none) is added to the finished sums before the store, in the order a
 * separate pass over the stored tile would add it (same bits, one L1 round
 * trip and a row loop less per tile).
 *
 * PF = 1 adds software prefetches (the large-L2 blocking, cfg_for): the C
 * tile into L2 at the start and into L1 PF_C_LATE k steps before the stores
 * (its lines are usually new: the stores waited on memory), the B panel
 * PF_B_AHEAD floats ahead into L1, and pfn lines from pf (the caller's share
 * of the next B panel for this tile, see run_task) into L2, spread evenly
 * over the k steps. The first tile of each panel otherwise waits on L3 or
 * memory: at batch 1 every weight comes from memory once per forward, and
 * fetching the whole next panel during one tile (2 lines a k step) queued
 * more misses than a core keeps in flight, so the GEMMs there ran at half
 * the rate they reach on a weight in cache. */
enum { PF_B_AHEAD = 512, PF_C_LATE = 32 };
#define PREFETCH_ROW(x, W, hint) \
  _Pragma("GCC unroll 4") for (int q_ = 0; q_ < 2 * (W); q_ += 16) _mm_prefetch((const char *)((x) + q_), hint)
#define UKERNEL(name, TARGET, VT, P, MR, W, PF)                                                                \
  TARGET static void name(int64_t kc, const float *restrict ap, const float *restrict bp, float *restrict c,   \
                          int64_t ldc, float beta, const float *restrict bias, const float *pf, int64_t pfn) { \
    VT acc0[MR], acc1[MR];                                                                                     \
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) acc0[i] = acc1[i] = P##_setzero_ps();                \
    if (PF) _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) PREFETCH_ROW(c + i * ldc, W, _MM_HINT_T1);   \
    const int64_t pfevery = pf && pfn > 0 ? (kc + pfn - 1) / pfn : kc + 1;                                     \
    int64_t pfcount = pfevery;                                                                                 \
    for (int64_t p = 0; p < kc; p++) {                                                                         \
      if (PF) {                                                                                                \
        PREFETCH_ROW(bp + PF_B_AHEAD, W, _MM_HINT_T0);                                                         \
        if (--pfcount == 0) {                                                                                  \
          _mm_prefetch((const char *)pf, _MM_HINT_T1);                                                         \
          pf += 16;                                                                                            \
          pfcount = pfevery;                                                                                   \
        }                                                                                                      \
        if (p == kc - PF_C_LATE)                                                                               \
          _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) PREFETCH_ROW(c + i * ldc, W, _MM_HINT_T0);     \
      }                                                                                                        \
      VT b0 = P##_load_ps(bp), b1 = P##_load_ps(bp + W);                                                       \
      _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                                  \
        VT a = P##_set1_ps(ap[i]);                                                                             \
        acc0[i] = P##_fmadd_ps(a, b0, acc0[i]);                                                                \
        acc1[i] = P##_fmadd_ps(a, b1, acc1[i]);                                                                \
      }                                                                                                        \
      ap += MR;                                                                                                \
      bp += 2 * W;                                                                                             \
    }                                                                                                          \
    (void)pfcount;                                                                                             \
    VT vb = P##_set1_ps(beta), bias0 = P##_setzero_ps(), bias1 = bias0;                                        \
    if (bias) {                                                                                                \
      bias0 = P##_loadu_ps(bias);                                                                              \
      bias1 = P##_loadu_ps(bias + W);                                                                          \
    }                                                                                                          \
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                                    \
      float *r = c + i * ldc;                                                                                  \
      if (beta != 0.0f) {                                                                                      \
        acc0[i] = P##_fmadd_ps(vb, P##_loadu_ps(r), acc0[i]);                                                  \
        acc1[i] = P##_fmadd_ps(vb, P##_loadu_ps(r + W), acc1[i]);                                              \
      }                                                                                                        \
      if (bias) {                                                                                              \
        acc0[i] = P##_add_ps(acc0[i], bias0);                                                                  \
        acc1[i] = P##_add_ps(acc1[i], bias1);                                                                  \
      }                                                                                                        \
      P##_storeu_ps(r, acc0[i]);                                                                               \
      P##_storeu_ps(r + W, acc1[i]);                                                                           \
    }                                                                                                          \
  }
UKERNEL(ukernel_avx512, OPX_TARGET_AVX512, __m512, _mm512, 14, 16, 0)
UKERNEL(ukernel_avx512_pf, OPX_TARGET_AVX512, __m512, _mm512, 14, 16, 1)
UKERNEL(ukernel_avx2, OPX_TARGET_AVX2, __m256, _mm256, 6, 8, 0)

/* The panels of a matrix whose panel rows lie side by side in memory: op(A)
 * = A^T stored (the weight gradient dY^T X) and op(B) = B stored (dX = dY W,
 * dY^T X). A whole panel at a time, each short piece of its rows a whole row
 * (3-12 KB) from the last, the reads waited on memory one after the other;
 * here groups of PACK_GROUP rows go panel by panel (each panel's piece of the
 * group written in one run), the next group's rows prefetched into L2 as the
 * pieces are read. W-float vectors (prefix P), under a mask (VMASK(n): the
 * first n lanes) at a panel's or the matrix's right edge, zeros past width. */
enum { PACK_GROUP = 16 };
#define PACK_ROWS(name, TARGET, P, W, VMASK, LOAD, STORE)                                                        \
  TARGET static void name(int64_t nrows, const float *restrict src, int64_t ld, int64_t width, int w,            \
                          float *restrict dst, int64_t pstride) {                                                \
    int64_t npanels = (width + w - 1) / w;                                                                       \
    for (int64_t g0 = 0; g0 < nrows; g0 += PACK_GROUP) {                                                         \
      int64_t g1 = nrows - g0 < PACK_GROUP ? nrows : g0 + PACK_GROUP;                                            \
      for (int64_t q = 0; q < npanels; q++)                                                                      \
        for (int64_t p = g0; p < g1; p++) {                                                                      \
          const float *s = src + p * ld + q * w;                                                                 \
          float *d = dst + q * w * pstride + p * w;                                                              \
          for (int c = 0; c < w; c += W) {                                                                       \
            int64_t valid = width - q * w - c;                                                                   \
            int keep = w - c < W ? w - c : W;                                                                    \
            _mm_prefetch((const char *)(s + c + PACK_GROUP * ld), _MM_HINT_T1);                                  \
            if (keep == W && valid >= W)                                                                         \
              P##_storeu_ps(d + c, P##_loadu_ps(s + c));                                                         \
            else                                                                                                 \
              STORE(d + c, VMASK(keep), LOAD(VMASK(valid < keep ? (valid > 0 ? (int)valid : 0) : keep), s + c)); \
          }                                                                                                      \
        }                                                                                                        \
    }                                                                                                            \
  }
#define MASK16(n)         ((__mmask16)((1u << (n)) - 1))
#define LOAD512(m, x)     _mm512_maskz_loadu_ps(m, x)
#define MASK8(n)          _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
#define LOAD256(m, x)     _mm256_maskload_ps(x, m)
#define STORE256(x, m, v) _mm256_maskstore_ps(x, m, v)
PACK_ROWS(pack_rows_avx512, OPX_TARGET_AVX512, _mm512, 16, MASK16, LOAD512, _mm512_mask_storeu_ps)
PACK_ROWS(pack_rows_avx2, OPX_TARGET_AVX2, _mm256, 8, MASK8, LOAD256, STORE256)
#undef MASK16
#undef LOAD512
#undef MASK8
#undef LOAD256
#undef STORE256
#endif

/* Block sizes: the A block (MC x KC, 440-520 KB) stays in Zen 4's 1 MB L2,
 * the B block (KC x NC) in L3. KC = 768 beat 384 by 2-10 % per core on
 * every BERT shape, both ISAs (fewer passes over C; the whole K of most
 * layers in one block), 1024 was no better (BENCHMARKS.md). A CPU with at
 * least 2 MB of L2 per core (Intel Xeon since Sapphire Rapids; Zen 4 and 5
 * have 1 MB) runs the AVX-512 kernel with its prefetches and packs A in zmm
 * registers, both measured there, and prefetches the next A^T block (the
 * weight gradient's, about 0.5 MB) into L2 beside the current one; Zen 4
 * keeps what it was tuned with. */
static int cfg_for(int isa, gemm_cfg *g) {
#if OPX_MULTI_ISA
  if (isa == OPX_ISA_AVX512) {
    int big_l2 = opx_l2_bytes() >= (2 << 20);
    *g = (gemm_cfg){ .mr = 14,
                     .nr = 32,
                     .kc = 768,
                     .mc = 14 * 12,
                     .nc = 3072,
                     .kernel = big_l2 ? ukernel_avx512_pf : ukernel_avx512,
                     .pack14 = big_l2,
                     .pf_next = big_l2,
                     .pack_rows = pack_rows_avx512 };
    return 1;
  }
  if (isa == OPX_ISA_AVX2) {
    *g = (gemm_cfg){
      .mr = 6, .nr = 16, .kc = 768, .mc = 6 * 24, .nc = 3072, .kernel = ukernel_avx2, .pack_rows = pack_rows_avx2
    };
    return 1;
  }
#endif
  (void)isa;
  (void)g;
  return 0;
}

/* A growable, 64-byte aligned per-thread buffer */
typedef struct {
  float *p;
  size_t n;
} pack_buf;
static _Thread_local pack_buf tl_apack, tl_bpack, tl_ashared;

static float *pack_reserve(pack_buf *b, size_t n) {
  if (n <= b->n) return b->p;
  free(b->p);
  b->n = 0;
  size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
  b->p = aligned_alloc(64, bytes);
  if (b->p) b->n = n;
  return b->p;
}

#if OPX_MULTI_ISA
/* The 14 x kb panel of a row-major A (rows lda apart) transposed into dst
 * (dst[p * 14 + i] = src[i * lda + p]) for the AVX-512 kernel: 16 columns at
 * a time as a 16 x 16 transpose in registers (rows 14 and 15 zero), each
 * column stored as 14 floats under a mask. On the 2 MB-L2 Xeon, where the
 * A pack took 4-5 % of a GEMM with N = 768, 1.5x as fast as opx_transpose's
 * SSE 4 x 4 blocks on a panel in L2 and 1.1-1.2x on one in memory. */
OPX_TARGET_AVX512 static void pack_panel14_avx512(int64_t kb, const float *restrict src, int64_t lda,
                                                  float *restrict dst) {
  int64_t p = 0;
  for (; p + 16 <= kb; p += 16) {
    __m512 r[16], t[16];
    _Pragma("GCC unroll 16") for (int i = 0; i < 14; i++) r[i] = _mm512_loadu_ps(src + i * lda + p);
    r[14] = r[15] = _mm512_setzero_ps();
    _Pragma("GCC unroll 8") for (int i = 0; i < 16; i += 2) { /* pairs of rows interleaved */
      t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 16; i += 4) { /* then pairs of pairs: 4 rows per 128-bit lane */
      r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
      r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
      r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
      r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) { /* lanes: rows 0-3 with 4-7, 8-11 with 12-15 */
      t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
      t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
      t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
      t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) { /* r[j]: column p + j, 16 rows */
      r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
      r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
    _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) _mm512_mask_storeu_ps(dst + (p + j) * 14, 0x3fff, r[j]);
  }
  for (; p < kb; p++)
    for (int i = 0; i < 14; i++) dst[p * 14 + i] = src[i * lda + p];
}
#endif

/* rows [i0, i0+mb) x cols [p0, p0+kb) of op(A) into MR-row panels, zero-padded */
static void pack_a(const gemm_cfg *g, const float *a, int64_t lda, int ta, int64_t i0, int64_t mb, int64_t p0,
                   int64_t kb, float *dst) {
  int mr = g->mr;
  if (ta) { /* A^T stored: op(A)'s rows side by side */
    g->pack_rows(kb, a + p0 * lda + i0, lda, mb, mr, dst, kb);
    return;
  }
  for (int64_t ir = 0; ir < mb; ir += mr, dst += mr * kb) {
    int64_t rows = mb - ir < mr ? mb - ir : mr;
    if (rows == mr) { /* a full panel of a row-major A: its transpose */
#if OPX_MULTI_ISA
      if (g->pack14) {
        pack_panel14_avx512(kb, a + (i0 + ir) * lda + p0, lda, dst);
        continue;
      }
#endif
      opx_transpose(mr, kb, a + (i0 + ir) * lda + p0, lda, dst, mr);
      continue;
    }
    for (int64_t p = 0; p < kb; p++) {
      float *d = dst + p * mr;
      int64_t i = 0;
      for (; i < rows; i++) d[i] = a[(i0 + ir + i) * lda + p0 + p];
      for (; i < mr; i++) d[i] = 0.0f;
    }
  }
}

/* one NR-column panel (panel index jp of the block at j0) of op(B) = B^T stored, rows [p0, p0+kb): the
 * panel's rows of B read side by side, each k's NR values written in turn */
static void pack_bt_panel(const gemm_cfg *g, const float *b, int64_t ldb, int64_t p0, int64_t kb, int64_t j0,
                          int64_t nb, int64_t jp, float *dst) {
  int nr = g->nr;
  int64_t jj = jp * nr, cols = nb - jj < nr ? nb - jj : nr;
  float *d = dst + jp * nr * kb;
  for (int64_t p = 0; p < kb; p++) {
    int64_t j = 0;
    for (; j < cols; j++) d[p * nr + j] = b[(j0 + jj + j) * ldb + p0 + p];
    for (; j < nr; j++) d[p * nr + j] = 0.0f;
  }
}

enum { PACK_RUN = 16 };

/* The KC x NC block (p0, j0) of op(B) (kb x nb, npanels NR panels) into dst, shared among the threads of the
 * enclosing parallel region (a work-sharing loop: every thread calls it) */
static void pack_b_block(const gemm_cfg *g, const float *b, int64_t ldb, int tb, int64_t p0, int64_t kb, int64_t j0,
                         int64_t nb, int64_t npanels, float *dst) {
  if (tb) {
#pragma omp for schedule(static)
    for (int64_t jp = 0; jp < npanels; jp++) pack_bt_panel(g, b, ldb, p0, kb, j0, nb, jp, dst);
  } else { /* B stored: the panels' rows side by side, in runs of PACK_RUN rows */
#pragma omp for schedule(static)
    for (int64_t r = 0; r < kb; r += PACK_RUN)
      g->pack_rows(kb - r < PACK_RUN ? kb - r : PACK_RUN, b + (p0 + r) * ldb + j0, ldb, nb, g->nr, dst + r * g->nr, kb);
  }
}

/* The fused epilogue on a finished C tile (rows x cols, still in L1): c +=
 * bias, then GELU when gelu is set: the erf form through vm_gelu_fast, whose
 * error is bounded relative to |x| (vecmath.h), not relative to the result
 * as training's bias_gelu (src/ops/activation.c) keeps it for the backward;
 * inference only feeds it to the next GEMM. */
OPX_BODY bias_act_body(int64_t rows, int64_t cols, float *restrict c, int64_t ldc, const float *restrict bias,
                       int gelu) {
  for (int64_t i = 0; i < rows; i++) {
    float *restrict r = c + i * ldc;
    if (bias && gelu) {
#pragma omp simd
      for (int64_t j = 0; j < cols; j++) r[j] = vm_gelu_fast(r[j] + bias[j]);
    } else if (gelu) {
#pragma omp simd
      for (int64_t j = 0; j < cols; j++) r[j] = vm_gelu_fast(r[j]);
    } else if (bias) {
#pragma omp simd
      for (int64_t j = 0; j < cols; j++) r[j] += bias[j];
    }
  }
}
#define BIAS_ACT_PARAMS \
  (int64_t rows, int64_t cols, float *restrict c, int64_t ldc, const float *restrict bias, int gelu)
OPX_TARGET_AVX512 static void bias_act_avx512 BIAS_ACT_PARAMS { bias_act_body(rows, cols, c, ldc, bias, gelu); }
OPX_TARGET_AVX2 static void bias_act_avx2 BIAS_ACT_PARAMS { bias_act_body(rows, cols, c, ldc, bias, gelu); }
static void bias_act_base BIAS_ACT_PARAMS { bias_act_body(rows, cols, c, ldc, bias, gelu); }
typedef void(*bias_act_fn) BIAS_ACT_PARAMS;
#undef BIAS_ACT_PARAMS

/* GELU on a full tile (the kernel has added the bias): trip counts known at
 * compile time, so no loop prologue or remainder per row */
#define GELU_TILE(name, TARGET, MR, NR)                                                                   \
  TARGET static void name(float *restrict c, int64_t ldc) {                                               \
    _Pragma("GCC unroll 2") for (int i = 0; i < MR; i++) bias_act_body(1, NR, c + i * ldc, ldc, NULL, 1); \
  }
GELU_TILE(gelu_tile_avx512, OPX_TARGET_AVX512, 14, 32)
GELU_TILE(gelu_tile_avx2, OPX_TARGET_AVX2, 6, 16)
#undef GELU_TILE
typedef void (*gelu_tile_fn)(float *restrict c, int64_t ldc);

/* the epilogue compiled for isa (this file never asks which ISA is in use:
 * the caller says, as with the kernels) */
static bias_act_fn bias_act_for(int isa) {
  return isa == OPX_ISA_AVX512 ? bias_act_avx512 : isa == OPX_ISA_AVX2 ? bias_act_avx2 : bias_act_base;
}

void opx_bias_act_rows(int isa, int64_t rows, int64_t cols, float *c, int64_t ldc, const float *bias, int gelu) {
  if (rows > 0 && cols > 0 && (bias || gelu)) bias_act_for(isa)(rows, cols, c, ldc, bias, gelu);
}

/* What the driver adds after the last K block (bias NULL and gelu 0: nothing) */
typedef struct epilogue {
  const float *bias;
  int gelu;
  bias_act_fn fn;
  gelu_tile_fn gelu_tile; /* for full tiles */
} epilogue;

/* The micro-kernel on a full tile, or through a scratch tile at the edges;
 * ep (non-NULL on the last K block) is applied to the tile at once, while it
 * is in L1, so the output is never read again by a separate pass. bias
 * points at the tile's first column. */
static void tile(const gemm_cfg *g, int64_t kb, const float *ap, const float *bp, float *c, int64_t ldc, int64_t rows,
                 int64_t cols, float beta, const epilogue *ep, const float *bias, const float *pf, int64_t pfn) {
  if (rows == g->mr && cols == g->nr) { /* the kernel adds the bias */
    g->kernel(kb, ap, bp, c, ldc, beta, ep ? bias : NULL, pf, pfn);
    if (ep && ep->gelu) ep->gelu_tile(c, ldc);
    return;
  }
  float t[14 * 32];
  g->kernel(kb, ap, bp, t, g->nr, 0.0f, NULL, pf, pfn);
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++)
      c[i * ldc + j] = beta == 0.0f ? t[i * g->nr + j] : beta * c[i * ldc + j] + t[i * g->nr + j];
  if (ep && (bias || ep->gelu)) ep->fn(rows, cols, c, ldc, bias, ep->gelu);
}

/* Where op(B) comes from: packed here block by block (b, ldb, tb), or already
 * packed once (pre: every KC x NC block in the order the driver visits them). */
typedef struct bsource {
  const float *b, *pre;
  int64_t ldb;
  int tb;
} bsource;

/* The prepacked block (j0, p0): the NC blocks before j0 are full (NC is a
 * multiple of NR), so they hold j0 * k floats; inside block j0 the KC blocks
 * before p0 hold p0 * npanels * NR. */
static int64_t pre_offset(const gemm_cfg *g, int64_t k, int64_t j0, int64_t p0, int64_t npanels) {
  return j0 * k + p0 * npanels * g->nr;
}

/* The row blocks of A: whole MR panels, at most MC rows each, as even as
 * possible and, when there are at least as many as threads, a multiple of
 * the thread count, so that the static schedule gives the threads equal
 * rows to within one panel per block. (MC-row blocks and a short last one
 * left one of 2 threads idle for 3-7 % of every GEMM at T = 3584 or 2688
 * tokens.) */
typedef struct row_blocks {
  int64_t n, panels;
  int mr;
} row_blocks;

static row_blocks split_rows(const gemm_cfg *g, int64_t m, int nthreads) {
  int64_t panels = (m + g->mr - 1) / g->mr, per = g->mc / g->mr, n = (panels + per - 1) / per;
  if (n >= nthreads) n = (n + nthreads - 1) / nthreads * nthreads;
  return (row_blocks){ n, panels, g->mr };
}

/* rows [*i0, *i0 + *mb) of block b (m rows in all) */
static void row_block(const row_blocks *rb, int64_t m, int64_t b, int64_t *i0, int64_t *mb) {
  int64_t r0 = b * rb->panels / rb->n * rb->mr, r1 = (b + 1) * rb->panels / rb->n * rb->mr;
  *i0 = r0;
  *mb = (r1 < m ? r1 : m) - r0;
}

/* One pass's task t: a row block x a chunk of `per` NR panels of the B block bblk (k rows [p0, p0 + kb),
 * columns [j0, j0 + nb)); A's block is packed unless *packed_blk says this thread already holds it. bnext:
 * the next K block of a prepacked B (kbn rows), where the thread goes on with the same panels; else NULL. */
typedef struct pass {
  const gemm_cfg *g;
  const float *a, *bblk, *bnext;
  int64_t lda, p0, kb, kbn, j0, nb, npanels, nsplit, per, ldc;
  int ta;
  float beta;
  float *c;
  const epilogue *ep;
} pass;

/* Prefetches into L2 of rows [0, rows) x `lines` cache lines from p (rows ld floats apart), a few at a time */
typedef struct src_prefetch {
  const float *p;
  int64_t ld, rows, lines, r, l;
} src_prefetch;

static void prefetch_some(src_prefetch *s, int64_t n) {
#if OPX_MULTI_ISA
  for (; n > 0 && s->r < s->rows; n--) {
    _mm_prefetch((const char *)(s->p + s->r * s->ld + s->l * 16), _MM_HINT_T1);
    if (++s->l == s->lines) {
      s->l = 0;
      s->r++;
    }
  }
#else
  (void)s;
  (void)n;
#endif
}

/* next: the task this thread runs after t, in the pass at K offset next_p0 (-1: none). With A^T stored
 * (g->pf_next), when that task packs another A block, the block's source is prefetched over t's tiles:
 * the pack then reads it from L2 instead of waiting on memory row after row. The B panel the thread runs
 * next (this pass's, or the next K block's of a prepacked B) is prefetched over each panel's tiles. */
static void run_task(const pass *ps, const row_blocks *rb, int64_t m, int64_t k, int64_t t, int64_t next,
                     int64_t next_p0, float *apack, int64_t *packed_blk) {
  const gemm_cfg *g = ps->g;
  int64_t blk = t / ps->nsplit, i0, mb;
  row_block(rb, m, blk, &i0, &mb);
  if (mb <= 0) return;
  if (blk != *packed_blk) {
    pack_a(g, ps->a, ps->lda, ps->ta, i0, mb, ps->p0, ps->kb, apack);
    *packed_blk = blk;
  }
  int64_t jp0 = t % ps->nsplit * ps->per, jp1 = jp0 + ps->per < ps->npanels ? jp0 + ps->per : ps->npanels;
  src_prefetch pf = { 0 };
  int64_t pf_per_tile = 0;
  if (g->pf_next && ps->ta && next >= 0 && (next / ps->nsplit != blk || next_p0 != ps->p0)) {
    int64_t ni0, nmb, nkb = k - next_p0 < g->kc ? k - next_p0 : g->kc;
    row_block(rb, m, next / ps->nsplit, &ni0, &nmb);
    pf = (src_prefetch){ ps->a + next_p0 * ps->lda + ni0, ps->lda, nkb, (nmb * 4 + 63) / 64 + 1, 0, 0 };
    int64_t tiles = (jp1 - jp0) * ((mb + g->mr - 1) / g->mr);
    pf_per_tile = (pf.rows * pf.lines + tiles - 1) / (tiles > 0 ? tiles : 1);
  }
  /* the panel this thread runs after the chunk's last (the block's panels lie back to back), its lines shared
   * out among a panel's tiles */
  const int64_t panel = g->nr * ps->kb, lines = panel / 16, ntiles = (mb + g->mr - 1) / g->mr;
  const int64_t share = (lines + ntiles - 1) / ntiles, jpn = next >= 0 ? next % ps->nsplit * ps->per : -1;
  const float *after = jpn < 0             ? NULL
                       : next_p0 == ps->p0 ? (jpn < ps->npanels ? ps->bblk + jpn * panel : NULL)
                       : ps->bnext         ? ps->bnext + jpn * g->nr * ps->kbn
                                           : NULL;
  for (int64_t jp = jp0; jp < jp1; jp++) {
    int64_t jj = jp * g->nr, cols = ps->nb - jj < g->nr ? ps->nb - jj : g->nr;
    const float *bias = ps->ep && ps->ep->bias ? ps->ep->bias + ps->j0 + jj : NULL;
    const float *bp = ps->bblk + jp * panel, *nextp = jp + 1 < jp1 ? bp + panel : after;
    for (int64_t ir = 0, ti = 0; ir < mb; ir += g->mr, ti++) {
      int64_t rows = mb - ir < g->mr ? mb - ir : g->mr, pfn = lines - ti * share;
      tile(g, ps->kb, apack + ir * ps->kb, bp, ps->c + (i0 + ir) * ps->ldc + ps->j0 + jj, ps->ldc, rows, cols, ps->beta,
           ps->ep, bias, nextp ? nextp + ti * share * 16 : NULL, pfn < share ? pfn : share);
      prefetch_some(&pf, pf_per_tile);
    }
  }
}

/* drive for an A of one row block (at most MC rows: batch-1 inference) on a prepacked B with several threads:
 * the threads pack A once into one shared buffer (all its K blocks, a panel each at a time), then take chunks of
 * NR panels from a dynamic schedule, each chunk through all K blocks. drive's static split has every thread pack
 * the whole of A and keep a fixed half of the panels, so a thread held up (a shared machine) kept the other
 * waiting at the end of each GEMM. Each tile's sums are drive's: K blocks in order, C carried between them. */
static int drive_small(const gemm_cfg *g, int ta, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                       const float *pre, float *c, int64_t ldc, const epilogue *ep, int nthreads) {
  const int64_t mpan = (m + g->mr - 1) / g->mr, rows = mpan * g->mr, nkb = (k + g->kc - 1) / g->kc;
  float *ap = pack_reserve(&tl_ashared, (size_t)rows * (size_t)k); /* K block p0 at ap + p0 * rows */
  if (!ap) return 0;
#pragma omp parallel num_threads(nthreads)
  {
#pragma omp for schedule(static)
    for (int64_t q = 0; q < nkb * mpan; q++) {
      int64_t p0 = q / mpan * g->kc, kb = k - p0 < g->kc ? k - p0 : g->kc, i0 = q % mpan * g->mr;
      pack_a(g, a, lda, ta, i0, m - i0 < g->mr ? m - i0 : g->mr, p0, kb, ap + p0 * rows + i0 * kb);
    }
    for (int64_t j0 = 0; j0 < n; j0 += g->nc) {
      const int64_t nb = n - j0 < g->nc ? n - j0 : g->nc, npanels = (nb + g->nr - 1) / g->nr;
      const int64_t per = (npanels + 4 * nthreads - 1) / (4 * nthreads), nchunks = (npanels + per - 1) / per;
      const int64_t kb0 = k < g->kc ? k : g->kc;
#pragma omp for schedule(dynamic, 1) nowait
      for (int64_t t = 0; t < nchunks; t++) {
        const int64_t jp0 = t * per, jp1 = jp0 + per < npanels ? jp0 + per : npanels;
        for (int64_t p0 = 0; p0 < k; p0 += g->kc) {
          const int64_t kb = k - p0 < g->kc ? k - p0 : g->kc, kbn = k - p0 - kb < g->kc ? k - p0 - kb : g->kc;
          const int64_t panel = g->nr * kb, lines = panel / 16, share = (lines + mpan - 1) / mpan;
          const float *blk = pre + pre_offset(g, k, j0, p0, npanels);
          /* after the chunk's last panel: its first in the next K block, or after the last K block the first of
           * chunk t + nthreads, which this thread takes next when the threads keep pace */
          const int64_t tn = t + nthreads;
          const float *after = p0 + kb < k    ? pre + pre_offset(g, k, j0, p0 + kb, npanels) + jp0 * g->nr * kbn
                               : tn < nchunks ? pre + pre_offset(g, k, j0, 0, npanels) + tn * per * g->nr * kb0
                                              : NULL;
          const epilogue *e = p0 + kb == k ? ep : NULL;
          for (int64_t jp = jp0; jp < jp1; jp++) {
            const int64_t jj = jp * g->nr, cols = nb - jj < g->nr ? nb - jj : g->nr;
            const float *bias = ep && ep->bias ? ep->bias + j0 + jj : NULL;
            const float *bp = blk + jp * panel, *next = jp + 1 < jp1 ? bp + panel : after;
            for (int64_t i0 = 0, ti = 0; i0 < m; i0 += g->mr, ti++) {
              int64_t r = m - i0 < g->mr ? m - i0 : g->mr, pfn = lines - ti * share;
              tile(g, kb, ap + p0 * rows + i0 * kb, bp, c + i0 * ldc + j0 + jj, ldc, r, cols, p0 == 0 ? 0.0f : 1.0f, e,
                   bias, next ? next + ti * share * 16 : NULL, pfn < share ? pfn : share);
            }
          }
        }
      }
    }
  }
  return 1;
}

static int drive(const gemm_cfg *g, int ta, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                 const bsource *bs, float beta, float *c, int64_t ldc, const epilogue *ep) {
  int64_t ncb = n < g->nc ? n : g->nc, kcb = k < g->kc ? k : g->kc;
  float *bpack = NULL;
  if (!bs->pre) {
    bpack = pack_reserve(&tl_bpack, (size_t)((ncb + g->nr - 1) / g->nr * g->nr) * (size_t)kcb);
    if (!bpack) return 0;
  }
  int nthreads = omp_get_max_threads();
  if ((double)m * (double)n * (double)k < 4e6) nthreads = 1; /* too small to pay a fork */
  row_blocks rb = split_rows(g, m, nthreads);
  if (bs->pre && rb.n == 1 && nthreads > 1 && beta == 0.0f)
    return drive_small(g, ta, m, n, k, a, lda, bs->pre, c, ldc, ep, nthreads);
  int failed = 0;
#pragma omp parallel num_threads(nthreads)
  {
    float *apack = pack_reserve(&tl_apack, (size_t)((g->mc + g->mr - 1) / g->mr * g->mr) * (size_t)kcb);
    if (!apack) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp barrier
    for (int64_t j0 = 0; j0 < n && !failed; j0 += g->nc) {
      int64_t nb = n - j0 < g->nc ? n - j0 : g->nc, npanels = (nb + g->nr - 1) / g->nr;
      /* tasks: a row block x a chunk of NR panels, enough for every thread */
      int64_t nsplit = 1;
      while (rb.n * nsplit < 2 * nthreads && nsplit < npanels) nsplit++;
      int64_t ntasks = rb.n * nsplit;
      for (int64_t p0 = 0; p0 < k; p0 += g->kc) {
        int64_t kb = k - p0 < g->kc ? k - p0 : g->kc, packed_blk = -1;
        pass ps = { .g = g,
                    .a = a,
                    .lda = lda,
                    .ta = ta,
                    .p0 = p0,
                    .kb = kb,
                    .j0 = j0,
                    .nb = nb,
                    .npanels = npanels,
                    .nsplit = nsplit,
                    .per = (npanels + nsplit - 1) / nsplit,
                    .beta = p0 == 0 ? beta : 1.0f,
                    .c = c,
                    .ldc = ldc,
                    .ep = p0 + kb == k ? ep : NULL,
                    .bblk = bs->pre ? bs->pre + pre_offset(g, k, j0, p0, npanels) : bpack,
                    .bnext = bs->pre && p0 + kb < k ? bs->pre + pre_offset(g, k, j0, p0 + kb, npanels) : NULL,
                    .kbn = k - p0 - kb < g->kc ? k - p0 - kb : g->kc };
        /* this thread's tasks: the same ones in every pass of this j0 block */
        int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        int64_t t_lo = ntasks * tid / nth, t_hi = ntasks * (tid + 1) / nth;
        /* B is read-only when prepacked, and a thread's next K pass only adds to its own tiles: no barrier */
        if (!bs->pre) pack_b_block(g, bs->b, bs->ldb, bs->tb, p0, kb, j0, nb, npanels, bpack);
        for (int64_t t = t_lo; t < t_hi; t++) {
          int last = t + 1 == t_hi; /* then the next is this thread's first task of the next pass */
          int64_t next_p0 = last ? p0 + g->kc : p0;
          run_task(&ps, &rb, m, k, t, next_p0 < k ? (last ? t_lo : t + 1) : -1, next_p0, apack, &packed_blk);
        }
        if (!bs->pre) {
#pragma omp barrier /* the next pass repacks B */
        }
      }
    }
  }
  return !failed;
}

int opx_sgemm_isa(int isa, int ta, int tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                  int64_t ldb, float beta, float *c, int64_t ldc) {
  gemm_cfg g;
  if (!cfg_for(isa, &g) || m <= 0 || n <= 0 || k <= 0) return 0;
  bsource bs = { b, NULL, ldb, tb };
  return drive(&g, ta, m, n, k, a, lda, &bs, beta, c, ldc, NULL);
}

struct opx_packed_b {
  int isa;
  int64_t k, n;
  float *p;
};

opx_packed_b *opx_pack_b(int isa, int tb, int64_t k, int64_t n, const float *b, int64_t ldb) {
  gemm_cfg g;
  if (!cfg_for(isa, &g) || k <= 0 || n <= 0) return NULL;
  opx_packed_b *pb = malloc(sizeof *pb);
  int64_t panels = 0;
  for (int64_t j0 = 0; j0 < n; j0 += g.nc) panels += ((n - j0 < g.nc ? n - j0 : g.nc) + g.nr - 1) / g.nr;
  size_t bytes = ((size_t)panels * (size_t)g.nr * (size_t)k * sizeof(float) + 63) / 64 * 64;
  float *p = pb ? aligned_alloc(64, bytes) : NULL;
  if (!p) {
    free(pb);
    return NULL;
  }
  *pb = (opx_packed_b){ isa, k, n, p };
  for (int64_t j0 = 0; j0 < n; j0 += g.nc) {
    int64_t nb = n - j0 < g.nc ? n - j0 : g.nc, npanels = (nb + g.nr - 1) / g.nr;
    for (int64_t p0 = 0; p0 < k; p0 += g.kc) {
      int64_t kb = k - p0 < g.kc ? k - p0 : g.kc;
      float *dst = p + pre_offset(&g, k, j0, p0, npanels);
#pragma omp parallel
      pack_b_block(&g, b, ldb, tb, p0, kb, j0, nb, npanels, dst);
    }
  }
  return pb;
}

void opx_packed_b_free(opx_packed_b *pb) {
  if (!pb) return;
  free(pb->p);
  free(pb);
}

int opx_packed_b_isa(const opx_packed_b *pb) { return pb->isa; }

int opx_sgemm_packed(const opx_packed_b *pb, int ta, int64_t m, const float *a, int64_t lda, float *c, int64_t ldc,
                     const float *bias, int gelu) {
  gemm_cfg g;
  if (!pb || !cfg_for(pb->isa, &g)) return 0;
  if (m <= 0) return 1;
  bsource bs = { NULL, pb->p, 0, 0 };
  epilogue ep = { bias, gelu, bias_act_for(pb->isa), pb->isa == OPX_ISA_AVX512 ? gelu_tile_avx512 : gelu_tile_avx2 };
  return drive(&g, ta, m, pb->n, pb->k, a, lda, &bs, 0.0f, c, ldc, &ep);
}
