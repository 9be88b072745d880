/* bf16 inference GEMM on AVX512-BF16 (contract in gemm_lowp.h).
 *
 * vdpbf16ps multiplies two bf16 pairs per f32 lane and adds both exact
 * products to the lane, one after the other, in f32 (round to nearest even;
 * bf16 subnormal inputs count as zero). So the weight is packed once as bf16
 * pairs of consecutive k for each output column: panels of NR = 32 columns,
 * [k/2][32] 32-bit pairs, two zmm per k pair. A is rounded to bf16 (nearest
 * even, vcvtne2ps2bf16) when it is packed, per call, into MR = 14 row panels
 * of [k/2][14] pairs, so the micro-kernel broadcasts one 32-bit pair per row
 * (28 accumulators + 2 B vectors + 1 broadcast = 31 of 32 zmm). K is not
 * blocked: a B panel (32 x K bf16, 192 KB at K = 3072) stays in L2 while a
 * block of A panels passes it. Bias and GELU are applied to each finished
 * tile by the f32 path's epilogue (opx_bias_act_rows).
 *
 * AMX (opx_amx_ok): tdpbf16ps takes a B tile of 16 k pairs x 16 columns,
 * which is a half of 16 rows of the same panel (row stride 128 bytes), so the
 * weight's pack serves both kernels; its k pairs are zero-padded to a multiple
 * of 16 (whole tiles). Each task packs its rows of A as 32-row blocks of two
 * 16-row panels of [k/32][16 rows][16 pairs] (each A tile 1 KB contiguous), a
 * block right before its first use (a bf16 A whose k is whole tiles is not
 * packed: a tile is 16 of its rows of 32 bf16, loaded with its row stride), and runs 32 x 32 C blocks (amx.h) over
 * the whole K: each 32-row block against a chunk of B panels that stays in L2
 * (up to 512 rows per task, so a chunk is read from memory once per 512
 * rows). Past AMX_BIG_BYTES (amx.h) the rows of A packed next are prefetched
 * into L2 while the tiles run, and the C blocks, bias and GELU applied, are
 * streamed past the caches: at 4096 x 768 x 768 the 12 MB of f32 A read and
 * the 12 MB of C written, not the tiles, take most of the time unless they
 * overlap the tiles and keep the B panels in L2. tdpbf16ps keeps two f32
 * sums per lane in a 16-pair step (even and odd k), adds them, then adds them
 * to C, each step rounded to nearest even; bf16 subnormal inputs and f32
 * subnormal results count as zero. */
#include "gemm.h"
#include "gemm_lowp.h"
#include "amx.h"
#include "base/vecmath.h"
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#if OPX_MULTI_ISA
#include <immintrin.h>
#define BF16_TARGET __attribute__((target("arch=x86-64-v4,avx512bf16")))
#endif

enum { MR = 14, NR = 32, ROWBLK = 8 /* A panels per task: 8 x 14 rows */ };

struct opx_bf16_b {
  int64_t k, n, kp; /* kp = k pairs (k rounded up to even, zero-padded) */
  int64_t kpad;     /* kp rounded up to whole AMX tiles (16 pairs), zero-padded */
  uint32_t *p;      /* ceil(n / NR) panels of kpad x NR pairs */
};

/* round to nearest even, as vcvtne2ps2bf16 does for normal numbers (NaN stays NaN) */
static uint32_t bf16_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

/* element (r, c) of op(X), X row-major with leading dim ld, transposed when t */
#define AT(x, t, ld, r, c) ((t) ? (x)[(int64_t)(c) * (ld) + (r)] : (x)[(int64_t)(r) * (ld) + (c)])

opx_bf16_b *opx_bf16_pack(int tb, int64_t k, int64_t n, const float *b, int64_t ldb) {
  if (!opx_bf16_ok() || k <= 0 || n <= 0) return NULL;
  opx_bf16_b *pb = malloc(sizeof *pb);
  int64_t kp = (k + 1) / 2, kpad = (kp + 15) / 16 * 16, panels = (n + NR - 1) / NR;
  size_t bytes = (size_t)(panels * kpad * NR) * 4;
  uint32_t *p = pb ? aligned_alloc(64, (bytes + 63) / 64 * 64) : NULL;
  if (!p) {
    free(pb);
    return NULL;
  }
  *pb = (opx_bf16_b){ k, n, kp, kpad, p };
#pragma omp parallel for schedule(static)
  for (int64_t jp = 0; jp < panels; jp++)
    for (int64_t q = 0; q < kpad; q++)
      for (int64_t jj = 0; jj < NR; jj++) {
        int64_t j = jp * NR + jj, k0 = 2 * q;
        uint32_t lo = j < n && k0 < k ? bf16_bits(AT(b, !tb, ldb, j, k0)) : 0;
        uint32_t hi = j < n && k0 + 1 < k ? bf16_bits(AT(b, !tb, ldb, j, k0 + 1)) : 0;
        p[(jp * kpad + q) * NR + jj] = lo | hi << 16;
      }
  return pb;
}

void opx_bf16_free(opx_bf16_b *pb) {
  if (!pb) return;
  free(pb->p);
  free(pb);
}

#if OPX_MULTI_ISA
/* the 16 bf16 pairs of row r at k0 .. k0 + 31, rounded by vcvtne2ps2bf16 (past k: zero) */
BF16_TARGET static inline __m512i pairs16(const float *r, int64_t k0, int64_t k) {
  int64_t left = k - k0;
  __mmask16 m0 = left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
  __mmask16 m1 = left >= 32 ? 0xffff : left <= 16 ? 0 : (__mmask16)((1u << (left - 16)) - 1);
  __m512 lo = _mm512_maskz_loadu_ps(m0, r + k0), hi = _mm512_maskz_loadu_ps(m1, r + k0 + 16);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

/* the 16 bf16 pairs of row r of A (not transposed) at k0 .. k0 + 31 (past k: zero): f32 rounded by pairs16, or
 * bf16 (a_bf16) as it is */
BF16_TARGET static inline __m512i row_pairs16(const void *a, int a_bf16, int64_t lda, int64_t r, int64_t k0,
                                              int64_t k) {
  if (!a_bf16) return pairs16((const float *)a + r * lda, k0, k);
  int64_t left = k - k0;
  __mmask32 m = left >= 32 ? ~(__mmask32)0 : left <= 0 ? 0 : (__mmask32)((1u << left) - 1);
  return _mm512_maskz_loadu_epi16(m, (const uint16_t *)a + r * lda + k0);
}

/* rows x cols (cols <= 32) of the f32 block t (row stride ldt) into the bf16 C c (row stride ldc), rounded as
 * pairs16 rounds A (so a GEMM reading this C gets the bits it would pack from the f32 C); whole 64-byte-aligned
 * rows past the caches when stream */
BF16_TARGET static void store_bf16(uint16_t *c, int64_t ldc, const float *t, int64_t ldt, int64_t rows, int64_t cols,
                                   int stream) {
  __mmask16 m0 = cols >= 16 ? 0xffff : (__mmask16)((1u << cols) - 1);
  __mmask16 m1 = cols >= 32 ? 0xffff : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
  __mmask32 m = cols >= 32 ? ~(__mmask32)0 : (__mmask32)((1u << cols) - 1);
  for (int64_t r = 0; r < rows; r++) {
    __m512 lo = _mm512_maskz_loadu_ps(m0, t + r * ldt), hi = _mm512_maskz_loadu_ps(m1, t + r * ldt + 16);
    __m512i v = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    uint16_t *d = c + r * ldc;
    if (stream && cols == 32 && (uintptr_t)d % 64 == 0)
      _mm512_stream_si512((void *)d, v);
    else
      _mm512_mask_storeu_epi16(d, m, v);
  }
}

/* rows [i0, i0 + rows) of op(A) as one MR-row panel of bf16 pairs (rows past
 * the end zero): 16 pairs of a row at a time rounded by vcvtne2ps2bf16 */
BF16_TARGET static void pack_a_panel(int ta, const void *a, int a_bf16, int64_t lda, int64_t k, int64_t kp, int64_t i0,
                                     int64_t rows, uint32_t *dst) {
  for (int64_t i = 0; i < MR; i++) {
    if (i >= rows) {
      for (int64_t q = 0; q < kp; q++) dst[q * MR + i] = 0;
      continue;
    }
    if (ta) {
      for (int64_t q = 0; q < kp; q++) {
        uint32_t lo = bf16_bits(AT((const float *)a, 1, lda, i0 + i, 2 * q));
        uint32_t hi = 2 * q + 1 < k ? bf16_bits(AT((const float *)a, 1, lda, i0 + i, 2 * q + 1)) : 0;
        dst[q * MR + i] = lo | hi << 16;
      }
      continue;
    }
    for (int64_t q0 = 0; q0 < kp; q0 += 16) {
      uint32_t t[16];
      _mm512_storeu_si512(t, row_pairs16(a, a_bf16, lda, i0 + i, 2 * q0, k));
      int64_t nq = kp - q0 < 16 ? kp - q0 : 16;
      for (int64_t q = 0; q < nq; q++) dst[(q0 + q) * MR + i] = t[q];
    }
  }
}

/* C tile (MR x NR, row stride ldc) = A panel x B panel over kp pairs */
BF16_TARGET static void ukernel(int64_t kp, const uint32_t *restrict ap, const uint32_t *restrict bp, float *restrict c,
                                int64_t ldc) {
  __m512 acc0[MR], acc1[MR];
  _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) acc0[i] = acc1[i] = _mm512_setzero_ps();
  for (int64_t q = 0; q < kp; q++) {
    __m512bh b0 = (__m512bh)_mm512_load_si512(bp), b1 = (__m512bh)_mm512_load_si512(bp + 16);
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {
      __m512bh av = (__m512bh)_mm512_set1_epi32((int)ap[i]);
      acc0[i] = _mm512_dpbf16_ps(acc0[i], av, b0);
      acc1[i] = _mm512_dpbf16_ps(acc1[i], av, b1);
    }
    ap += MR;
    bp += NR;
  }
  _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {
    _mm512_storeu_ps(c + i * ldc, acc0[i]);
    _mm512_storeu_ps(c + i * ldc + 16, acc1[i]);
  }
}

/* rows [i0, i0 + rows) of op(A) as one 16-row AMX panel [kpad / 16][16 rows][16 pairs] (rows past the end zero) */
BF16_TARGET static void pack_a_amx(int ta, const void *a, int a_bf16, int64_t lda, int64_t k, int64_t kpad, int64_t i0,
                                   int64_t rows, uint32_t *dst) {
  int64_t kt = kpad / 16;
  for (int64_t i = 0; i < 16; i++)
    for (int64_t t = 0; t < kt; t++) {
      uint32_t *d = dst + (t * 16 + i) * 16;
      if (i >= rows) {
        _mm512_store_si512(d, _mm512_setzero_si512());
      } else if (!ta) {
        _mm512_store_si512(d, row_pairs16(a, a_bf16, lda, i0 + i, 32 * t, k));
      } else {
        for (int64_t q = 0; q < 16; q++) {
          int64_t k0 = 32 * t + 2 * q;
          uint32_t lo = k0 < k ? bf16_bits(AT((const float *)a, 1, lda, i0 + i, k0)) : 0;
          uint32_t hi = k0 + 1 < k ? bf16_bits(AT((const float *)a, 1, lda, i0 + i, k0 + 1)) : 0;
          d[q] = lo | hi << 16;
        }
      }
    }
}

/* C block (32 x 32 f32) = two A panels x one B panel (amx.h) */
AMX_BLOCK(amx_block, _tile_dpbf16ps, float)

/* the calling thread's A pack, grown only (no allocation per call at steady shapes) */
static _Thread_local struct {
  uint32_t *p;
  size_t n;
} tl_a;

static uint32_t *reserve_a(size_t words) {
  if (words > tl_a.n) {
    free(tl_a.p);
    tl_a.n = 0;
    tl_a.p = aligned_alloc(64, (words * 4 + 63) / 64 * 64);
    if (!tl_a.p) return NULL;
    tl_a.n = words;
  }
  return tl_a.p;
}

/* 32-row blocks per task (each passes the task's OPX_AMX_B_BYTES of B panels, from L1 or L2) */
enum { AMX_ROWBLK = 16 };

/* Each task packs its rows of A into its thread's buffer, a 32-row block right before its first use (its rows
 * prefetched into L2 while the tiles run the block before: amx_pf), and runs them, one block after the other,
 * against its chunk of B panels. A bf16 A whose K is whole tiles is not packed: its whole 32-row blocks feed
 * the tiles in place (an AMX bf16 A tile is 16 rows of 16 pairs, row-major). Bias and GELU are applied to each
 * C block while it is in L1 (past AMX_BIG_BYTES of output, or for a bf16 C, in a tile of its own, then stored:
 * streamed, or rounded to bf16). */
AMX_TARGET static int amx_gemm(const opx_bf16_b *pb, int ta, int64_t m, const void *a, int a_bf16, int64_t lda, void *c,
                               int c_bf16, int64_t ldc, const float *bias, int gelu) {
  int64_t kpad = pb->kpad, kt = kpad / 16, k = pb->k, n = pb->n, mblk = (m + 31) / 32, npanels = (n + NR - 1) / NR;
  int nthreads = omp_get_max_threads();
  if ((double)m * (double)n * (double)k < 4e6) nthreads = 1; /* too small to pay a fork */
  int64_t nblk = (mblk + AMX_ROWBLK - 1) / AMX_ROWBLK, per;
  int64_t nsplit = opx_lowp_split(npanels, OPX_AMX_B_BYTES / (kpad * NR * 4), nblk, nthreads, &per);
  int64_t asz = a_bf16 ? 2 : 4, csz = c_bf16 ? 2 : 4;
  int stream = (double)m * (double)n * csz > AMX_BIG_BYTES, big_a = (double)m * (double)k * asz > AMX_BIG_BYTES;
  int direct = a_bf16 && !ta && k % 32 == 0 && lda % 2 == 0; /* whole tiles of k: 2 * kpad == k */
  int failed = 0;
#pragma omp parallel num_threads(nthreads)
  {
    uint32_t *apack = reserve_a((size_t)(AMX_ROWBLK * 32 * kpad));
    if (!apack) {
#pragma omp atomic write
      failed = 1;
    }
    int64_t packed = -1; /* the row blocks in apack */
    amx_tiles_on();
#pragma omp for schedule(static)
    for (int64_t t = 0; t < nblk * nsplit; t++) {
      if (!apack) continue;
      int64_t ib0 = t / nsplit * AMX_ROWBLK, ib1 = ib0 + AMX_ROWBLK < mblk ? ib0 + AMX_ROWBLK : mblk;
      int64_t jp0 = t % nsplit * per, jp1 = jp0 + per < npanels ? jp0 + per : npanels;
      int pack = packed != ib0;
      packed = ib0;
      for (int64_t ib = ib0; ib < ib1; ib++) {
        int64_t i = ib * 32, rows = m - i < 32 ? m - i : 32;
        const uint32_t *a0 = apack + 2 * (ib - ib0) * kpad * 16, *a1 = a0 + kpad * 16;
        int64_t as = 256, ars = 64; /* a packed panel's tile step (words) and row stride (bytes) */
        if (direct && rows == 32) {
          a0 = (const uint32_t *)((const uint16_t *)a + i * lda);
          a1 = (const uint32_t *)((const uint16_t *)a + (i + 16) * lda);
          as = 16, ars = lda * 2;
        } else if (pack) {
          pack_a_amx(ta, a, a_bf16, lda, k, kpad, i, rows < 16 ? rows : 16, apack + 2 * (ib - ib0) * kpad * 16);
          pack_a_amx(ta, a, a_bf16, lda, k, kpad, i + 16, rows - 16, apack + (2 * (ib - ib0) + 1) * kpad * 16);
        }
        amx_pf pf, *pfp = NULL;
        if (pack && big_a && !ta && ib + 1 < ib1) { /* the next block's rows */
          pf = amx_pf_of((const char *)a + (i + 32) * lda * asz, lda * asz, k * asz, m - i < 64 ? m - i - 32 : 32,
                         (jp1 - jp0) * (kt - 1));
          pfp = &pf;
        }
        for (int64_t jp = jp0; jp < jp1; jp++) {
          int64_t j = jp * NR, cols = n - j < NR ? n - j : NR;
          float tmp[32 * NR] __attribute__((aligned(64)));
          const uint32_t *bp = pb->p + jp * kpad * NR;
          if (c_bf16) {
            amx_block(kt, a0, a1, as, ars, bp, tmp, NR, pfp);
            opx_bias_act_rows(OPX_ISA_AVX512, rows, cols, tmp, NR, bias ? bias + j : NULL, gelu);
            store_bf16((uint16_t *)c + i * ldc + j, ldc, tmp, NR, rows, cols, stream);
            continue;
          }
          float *ct = (float *)c + i * ldc + j;
          if (amx_streams(stream, ct, ldc, rows, cols)) { /* bias and GELU on the block in L1 */
            amx_block(kt, a0, a1, as, ars, bp, tmp, NR, pfp);
            opx_bias_act_rows(OPX_ISA_AVX512, 32, 32, tmp, NR, bias ? bias + j : NULL, gelu);
            amx_stream(ct, ldc, tmp);
            continue;
          }
          int edge = rows < 32 || cols < NR;
          amx_block(kt, a0, a1, as, ars, bp, edge ? tmp : ct, edge ? NR : ldc, pfp);
          for (int64_t r = 0; edge && r < rows; r++) memcpy(ct + r * ldc, tmp + r * NR, (size_t)cols * sizeof(float));
          opx_bias_act_rows(OPX_ISA_AVX512, rows, cols, ct, ldc, bias ? bias + j : NULL, gelu);
        }
      }
    }
    _mm_sfence(); /* the streamed stores, before the caller reads C */
    amx_tiles_off();
  }
  return !failed;
}
#endif

int opx_bf16_gemm(const opx_bf16_b *pb, int ta, int64_t m, const float *a, int64_t lda, float *c, int64_t ldc,
                  const float *bias, int gelu) {
  return opx_bf16_gemm_io(pb, ta, m, a, 0, lda, c, 0, ldc, bias, gelu);
}

int opx_bf16_gemm_io(const opx_bf16_b *pb, int ta, int64_t m, const void *a, int a_bf16, int64_t lda, void *c,
                     int c_bf16, int64_t ldc, const float *bias, int gelu) {
#if OPX_MULTI_ISA
  if (!pb || !opx_bf16_ok() || (a_bf16 && ta)) return 0;
  if (m <= 0) return 1;
  if (opx_amx_ok()) return amx_gemm(pb, ta, m, a, a_bf16, lda, c, c_bf16, ldc, bias, gelu);
  int64_t kp = pb->kp, n = pb->n, mpanels = (m + MR - 1) / MR, npanels = (n + NR - 1) / NR;
  uint32_t *apack = reserve_a((size_t)(mpanels * kp * MR));
  if (!apack) return 0;
  int nthreads = omp_get_max_threads();
  if ((double)m * (double)n * (double)pb->k < 4e6) nthreads = 1; /* too small to pay a fork */
  /* tasks: a block of ROWBLK A panels x a chunk of B panels, at least 2 per thread where the shape allows */
  int64_t nblk = (mpanels + ROWBLK - 1) / ROWBLK, per;
  int64_t nsplit = opx_lowp_split(npanels, npanels, nblk, nthreads, &per);
#pragma omp parallel num_threads(nthreads)
  {
#pragma omp for schedule(static)
    for (int64_t ip = 0; ip < mpanels; ip++)
      pack_a_panel(ta, a, a_bf16, lda, pb->k, kp, ip * MR, m - ip * MR < MR ? m - ip * MR : MR, apack + ip * kp * MR);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < nblk * nsplit; t++) {
      int64_t ip0 = t / nsplit * ROWBLK, ip1 = ip0 + ROWBLK < mpanels ? ip0 + ROWBLK : mpanels;
      int64_t jp0 = t % nsplit * per, jp1 = jp0 + per < npanels ? jp0 + per : npanels;
      for (int64_t jp = jp0; jp < jp1; jp++) {
        int64_t j = jp * NR, cols = n - j < NR ? n - j : NR;
        for (int64_t ip = ip0; ip < ip1; ip++) {
          int64_t i = ip * MR, rows = m - i < MR ? m - i : MR;
          float tmp[MR * NR];
          const uint32_t *ap = apack + ip * kp * MR, *bp = pb->p + jp * pb->kpad * NR;
          if (c_bf16) {
            ukernel(kp, ap, bp, tmp, NR);
            opx_bias_act_rows(OPX_ISA_AVX512, rows, cols, tmp, NR, bias ? bias + j : NULL, gelu);
            store_bf16((uint16_t *)c + i * ldc + j, ldc, tmp, NR, rows, cols, 0);
            continue;
          }
          float *ct = (float *)c + i * ldc + j;
          int edge = rows < MR || cols < NR;
          ukernel(kp, ap, bp, edge ? tmp : ct, edge ? NR : ldc);
          for (int64_t r = 0; edge && r < rows; r++) memcpy(ct + r * ldc, tmp + r * NR, (size_t)cols * sizeof(float));
          opx_bias_act_rows(OPX_ISA_AVX512, rows, cols, ct, ldc, bias ? bias + j : NULL, gelu);
        }
      }
    }
  }
  return 1;
#else
  (void)pb, (void)ta, (void)m, (void)a, (void)a_bf16, (void)lda, (void)c, (void)c_bf16, (void)ldc, (void)bias,
      (void)gelu;
  return 0;
#endif
}
