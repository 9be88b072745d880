/* Dynamic int8 inference GEMM (contract in gemm_lowp.h).
 *
 * Quantization, as ONNX Runtime's quantize_dynamic with per_channel=True,
 * except that A gets a scale per row instead of one per tensor (a token's
 * range no longer depends on the other tokens of the batch; same cost):
 *   W[j, :] ~ sw_j Wq[j, :], Wq in [-127, 127], sw_j = max|W[j, :]| / 127;
 *   A[i, :] ~ sa_i (Aq[i, :] - za_i), Aq in [0, 255], the range [min, max]
 *   of the row widened to hold 0, so that 0 is exact (padding stays 0);
 *   C[i, j] = sa_i sw_j (sum_k Aq Wq - za_i sum_k Wq[j, k]) + bias_j.
 * The integer sums are exact on both kernels (|sum| < 2^31 for k < 66,000):
 *   VNNI: vpdpbusd adds four u8 x s8 products to an int32 lane with no
 *         intermediate saturation; W in panels of NR = 32 columns of
 *         [k/4][32] quads, A in MR = 14 row panels of [k/4][14] quads;
 *   AVX2: vpmaddubsw would saturate its int16 pair sums (255 * 127 * 2 >
 *         32767; ORT's reduce_range and oneDNN avoid that by giving up a bit
 *         of the weight), so both operands are held as int16 instead and
 *         vpmaddwd sums the pairs into int32 exactly; NR = 16, MR = 6.
 *   AMX: tdpbusd does what vpdpbusd does (u8 A x s8 W quads into int32, no
 *         saturation) on tiles: its B tile (16 k quads x 16 columns) is half
 *         of 16 rows of the VNNI panel (row stride 128 bytes), so one pack
 *         serves both (k quads zero-padded to whole tiles of 16); A is packed
 *         per call as 32-row blocks of two [k/64][16 rows][64 bytes] panels
 *         and each C block is 32 x 32 (amx.h), driven as the bf16 GEMM's
 *         (gemm_bf16.c: blocks packed right before their first use, large A
 *         prefetched, large C streamed).
 * All kernels therefore give the same int32 sums and the same outputs. */
#include "gemm.h"
#include "gemm_lowp.h"
#include "amx.h"
#include "base/vecmath.h"
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#if OPX_MULTI_ISA
#include <immintrin.h>
#define VNNI_TARGET __attribute__((target("arch=x86-64-v4,avx512vnni")))
#endif

/* group: k values per 32-bit slot (4 u8/s8 on VNNI and AMX, 2 int16 on AVX2); amx: the tile kernel (amx.h,
 * kernel NULL), which runs over the padded slots kpad (the vector kernels over kq) */
typedef void (*q8_kernel)(int64_t kq, const uint32_t *restrict ap, const uint32_t *restrict bp, int32_t *restrict c);
typedef struct q8_cfg {
  int mr, nr, group, amx;
  q8_kernel kernel;
} q8_cfg;

struct opx_q8_b {
  int isa;
  int64_t k, n, kq; /* kq = k / group, rounded up (zero-padded) */
  int64_t kpad;     /* VNNI: kq rounded up to whole AMX tiles (16 slots), zero-padded; AVX2: kq */
  uint32_t *p;      /* ceil(n / nr) panels of kpad x nr slots, A panels likewise (mr rows) */
  float *scale;     /* [n] sw_j */
  int32_t *colsum;  /* [n] sum_k Wq[j, k] */
};

#if OPX_MULTI_ISA
/* c (MR x NR int32, row stride NR) = A panel x B panel */
#define Q8_KERNEL(name, TARGET, VT, MR, NR, W, ZERO, LOAD, BCAST, STEP, STORE)                                         \
  TARGET static void name(int64_t kq, const uint32_t *restrict ap, const uint32_t *restrict bp, int32_t *restrict c) { \
    VT acc0[MR], acc1[MR];                                                                                             \
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) acc0[i] = acc1[i] = ZERO();                                  \
    for (int64_t q = 0; q < kq; q++) {                                                                                 \
      VT b0 = LOAD((const void *)bp), b1 = LOAD((const void *)(bp + W));                                               \
      _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                                          \
        VT av = BCAST((int)ap[i]);                                                                                     \
        acc0[i] = STEP(acc0[i], av, b0);                                                                               \
        acc1[i] = STEP(acc1[i], av, b1);                                                                               \
      }                                                                                                                \
      ap += MR;                                                                                                        \
      bp += NR;                                                                                                        \
    }                                                                                                                  \
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                                            \
      STORE((void *)(c + i * NR), acc0[i]);                                                                            \
      STORE((void *)(c + i * NR + W), acc1[i]);                                                                        \
    }                                                                                                                  \
  }
#define VNNI_STEP(acc, a, b) _mm512_dpbusd_epi32(acc, a, b)
#define AVX2_STEP(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
Q8_KERNEL(kernel_vnni, VNNI_TARGET, __m512i, 14, 32, 16, _mm512_setzero_si512, _mm512_load_si512, _mm512_set1_epi32,
          VNNI_STEP, _mm512_storeu_si512)
Q8_KERNEL(kernel_avx2, OPX_TARGET_AVX2, __m256i, 6, 16, 8, _mm256_setzero_si256, _mm256_load_si256, _mm256_set1_epi32,
          AVX2_STEP, _mm256_storeu_si256)

/* c (32 x 32 int32, row stride 32) = one 32-row A block (two 16-row panels of kpad slots) x one B panel */
AMX_BLOCK(amx_block_s32, _tile_dpbusd, int32_t)
#endif

/* the kernel for a weight packed for isa, on the path in use (AMX where it is on: same pack as VNNI) */
static int cfg_for(int isa, q8_cfg *g) {
#if OPX_MULTI_ISA
  if (isa == OPX_ISA_AVX512 && opx_vnni_ok()) {
    *g = opx_amx_ok() ? (q8_cfg){ 32, 32, 4, 1, NULL } : (q8_cfg){ 14, 32, 4, 0, kernel_vnni };
    return 1;
  }
  if (isa == OPX_ISA_AVX2 && opx_isa() >= OPX_ISA_AVX2) {
    *g = (q8_cfg){ 6, 16, 2, 0, kernel_avx2 };
    return 1;
  }
#endif
  (void)isa, (void)g;
  return 0;
}

/* one slot of `group` consecutive k values v[0..group) (already clipped to the range of their type) */
static uint32_t slot(int group, const int32_t *v) {
  if (group == 4) return (v[0] & 0xffu) | (v[1] & 0xffu) << 8 | (v[2] & 0xffu) << 16 | (uint32_t)(v[3] & 0xff) << 24;
  return (v[0] & 0xffffu) | (uint32_t)(v[1] & 0xffff) << 16;
}

/* slot q of a uint8 row: four bytes as they are (VNNI), or two widened to int16 (AVX2) */
static uint32_t slot_u8(int group, const uint8_t *v) {
  uint32_t s;
  if (group == 4)
    memcpy(&s, v, 4);
  else
    s = (uint32_t)v[0] | (uint32_t)v[1] << 16;
  return s;
}

#define AT(x, t, ld, r, c) ((t) ? (x)[(int64_t)(c) * (ld) + (r)] : (x)[(int64_t)(r) * (ld) + (c)])

opx_q8_b *opx_q8_pack(int isa, int tb, int64_t k, int64_t n, const float *b, int64_t ldb) {
  q8_cfg g;
  if (!cfg_for(isa, &g) || k <= 0 || n <= 0) return NULL;
  opx_q8_b *pb = calloc(1, sizeof *pb);
  if (!pb) return NULL;
  int64_t kq = (k + g.group - 1) / g.group, kpad = g.group == 4 ? (kq + 15) / 16 * 16 : kq;
  int64_t panels = (n + g.nr - 1) / g.nr;
  *pb = (opx_q8_b){ isa,
                    k,
                    n,
                    kq,
                    kpad,
                    aligned_alloc(64, ((size_t)(panels * kpad * g.nr) * 4 + 63) / 64 * 64),
                    malloc((size_t)n * sizeof(float)),
                    malloc((size_t)n * sizeof(int32_t)) };
  int8_t *wq = malloc((size_t)(n * k));
  if (!pb->p || !pb->scale || !pb->colsum || !wq) {
    free(wq);
    opx_q8_free(pb);
    return NULL;
  }
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < n; j++) { /* per output channel: symmetric, max|w| -> 127 */
    float amax = 0.0f, nonfinite = 0.0f;
    for (int64_t p = 0; p < k; p++) {
      float w = AT(b, !tb, ldb, j, p);
      amax = fmaxf(amax, fabsf(w));
      nonfinite += w * 0.0f; /* NaN when w is Inf or NaN */
    }
    float s = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int64_t p = 0; p < k; p++) {
      float v = nearbyintf(AT(b, !tb, ldb, j, p) * inv);
      int32_t qv = v > 127.0f ? 127 : v < -127.0f ? -127 : (int32_t)v;
      wq[j * k + p] = (int8_t)qv;
      sum += qv;
    }
    pb->scale[j] = s + nonfinite; /* a non-finite weight makes its column NaN, never silently finite */
    pb->colsum[j] = sum;
  }
#pragma omp parallel for schedule(static)
  for (int64_t jp = 0; jp < panels; jp++)
    for (int64_t q = 0; q < kpad; q++)
      for (int64_t jj = 0; jj < g.nr; jj++) {
        int64_t j = jp * g.nr + jj;
        int32_t v[4] = { 0, 0, 0, 0 };
        for (int t = 0; t < g.group; t++)
          if (j < n && q * g.group + t < k) v[t] = wq[j * k + q * g.group + t];
        pb->p[(jp * kpad + q) * g.nr + jj] = slot(g.group, v);
      }
  free(wq);
  return pb;
}

void opx_q8_free(opx_q8_b *pb) {
  if (!pb) return;
  free(pb->p);
  free(pb->scale);
  free(pb->colsum);
  free(pb);
}

int opx_q8_isa(const opx_q8_b *pb) { return pb->isa; }
float opx_q8_scale(const opx_q8_b *pb, int64_t j) { return pb->scale[j]; }

/* A row's scale and zero point: A[i, :] ~ sa (Aq[i, :] - za) */
typedef struct arow {
  float sa;
  int32_t za;
} arow;

/* x (k values) as uint8 into qa; compiled for AVX2 and AVX-512 (the VNNI and AMX kernels' path), the same
 * operations on each element, so the same results */
static inline __attribute__((always_inline)) arow quantize_row_body(const float *restrict x, int64_t k,
                                                                    uint8_t *restrict qa) {
  float lo = 0.0f, hi = 0.0f, nonfinite = 0.0f;
#pragma omp simd reduction(min : lo) reduction(max : hi) reduction(+ : nonfinite)
  for (int64_t p = 0; p < k; p++) {
    lo = x[p] < lo ? x[p] : lo; /* not fminf/fmaxf: their NaN rules keep them scalar calls */
    hi = x[p] > hi ? x[p] : hi;
    nonfinite += x[p] * 0.0f; /* NaN when x holds Inf or NaN: the row's outputs become NaN */
  }
  float s = (hi - lo) / 255.0f;
  if (!(s > 0.0f)) s = 1.0f; /* an all-zero row */
  float inv = 1.0f / s, z = nearbyintf(-lo * inv);
#pragma omp simd
  for (int64_t p = 0; p < k; p++) {
    float v = nearbyintf(x[p] * inv) + z;
    qa[p] = (uint8_t)(int32_t)(v < 0.0f ? 0.0f : v > 255.0f ? 255.0f : v);
  }
  return (arow){ s + nonfinite, (int32_t)z };
}
OPX_TARGET_AVX2 static arow quantize_row_avx2(const float *restrict x, int64_t k, uint8_t *restrict qa) {
  return quantize_row_body(x, k, qa);
}
OPX_TARGET_AVX512 static arow quantize_row_avx512(const float *restrict x, int64_t k, uint8_t *restrict qa) {
  return quantize_row_body(x, k, qa);
}
/* the variant for the kernel of g: AVX-512 for 4-byte groups (VNNI, AMX) */
static arow quantize_row(const q8_cfg *g, const float *restrict x, int64_t k, uint8_t *restrict qa) {
  return g->group == 4 ? quantize_row_avx512(x, k, qa) : quantize_row_avx2(x, k, qa);
}

/* rows [i0, i0 + rows) of A into one mr-row panel of kpad slots (rows and k past the end zero): from f32 a
 * (quantized here, scales into par) or from uint8 a8 (the test entry); qa: a row's scratch (kpad * 20 bytes).
 * Vector kernels: [kpad][mr] slots; AMX: two 16-row panels of [kpad / 16][16 rows][16 slots] */
static void pack_a_panel(const q8_cfg *g, int ta, const float *a, const uint8_t *a8, int64_t lda, int64_t k,
                         int64_t kpad, int64_t i0, int64_t rows, uint32_t *dst, arow *par, uint8_t *qa) {
  int64_t bytes = kpad * g->group;
  for (int64_t i = 0; i < g->mr; i++) {
    if (i >= rows) {
      memset(qa, 0, (size_t)bytes);
    } else if (a8) {
      memcpy(qa, a8 + (i0 + i) * lda, (size_t)k);
    } else if (ta) { /* a transposed view: gather the row first */
      float *row = (float *)(qa + kpad * 4);
      for (int64_t p = 0; p < k; p++) row[p] = AT(a, 1, lda, i0 + i, p);
      par[i] = quantize_row(g, row, k, qa);
    } else {
      par[i] = quantize_row(g, a + (i0 + i) * lda, k, qa);
    }
    if (i < rows) memset(qa + k, 0, (size_t)(bytes - k));
    if (g->amx) {
      uint32_t *d = dst + i / 16 * kpad * 16 + i % 16 * 16;
      for (int64_t t = 0; t < kpad / 16; t++) memcpy(d + t * 256, qa + t * 64, 64);
    } else {
      for (int64_t q = 0; q < kpad; q++) dst[q * g->mr + i] = slot_u8(g->group, qa + q * g->group);
    }
  }
}

/* per-thread buffers, grown only (no allocation per call at steady shapes): each worker's A panels, their
 * row scales and a row's scratch */
typedef struct grow_buf {
  void *p;
  size_t n;
} grow_buf;
static _Thread_local grow_buf tl_a, tl_rows, tl_row;

static void *reserve(grow_buf *b, size_t bytes) {
  if (bytes <= b->n) return b->p;
  free(b->p);
  b->n = 0;
  b->p = aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (b->p) b->n = bytes;
  return b->p;
}

/* c[j] = sa sw_j (acc[j] - za colsum_j) for one row of a tile (AVX2 and AVX-512 as quantize_row) */
#define DEQUANTIZE(name, TARGET)                                                                              \
  TARGET static void name(int64_t cols, const int32_t *restrict acc, arow rp, const int32_t *restrict colsum, \
                          const float *restrict sw, float *restrict c) {                                      \
    _Pragma("omp simd") for (int64_t j = 0; j < cols; j++) c[j] =                                             \
        (float)(acc[j] - rp.za * colsum[j]) * (rp.sa * sw[j]);                                                \
  }
DEQUANTIZE(dequantize_avx2, OPX_TARGET_AVX2)
DEQUANTIZE(dequantize_avx512, OPX_TARGET_AVX512)
#undef DEQUANTIZE

/* rows of A per task: vector kernels: their panels pass a B panel held in L2; AMX: each 32-row block passes
 * a chunk of B panels (OPX_AMX_B_BYTES) held in L2, so a chunk is read from memory once per 512 rows */
enum { ROWBLK_ROWS = 96, AMX_ROWBLK_ROWS = 512 };

/* c = A x W^T: dequantized with bias/GELU into c (f32), or the raw int32 sums into c32. Each task
 * quantizes and packs its rows of A into its thread's buffers (in cache when the kernel reads them) and
 * runs them against its chunk of weight panels. */
static int drive(const opx_q8_b *pb, int ta, int64_t m, const float *a, const uint8_t *a8, int64_t lda, float *c,
                 int32_t *c32, int64_t ldc, const float *bias, int gelu) {
  q8_cfg g;
  if (!pb || !cfg_for(pb->isa, &g)) return 0;
  if (m <= 0) return 1;
  int64_t kpad = pb->kpad, n = pb->n, mpanels = (m + g.mr - 1) / g.mr, npanels = (n + g.nr - 1) / g.nr;
  int nthreads = omp_get_max_threads();
  if ((double)m * (double)n * (double)pb->k < 4e6) nthreads = 1; /* too small to pay a fork */
  int64_t rowblk = ((g.amx ? AMX_ROWBLK_ROWS : ROWBLK_ROWS) + g.mr - 1) / g.mr, nblk = (mpanels + rowblk - 1) / rowblk;
  int64_t per,
      nsplit = opx_lowp_split(npanels, g.amx ? OPX_AMX_B_BYTES / (kpad * g.nr * 4) : npanels, nblk, nthreads, &per);
  int failed = 0;
#pragma omp parallel num_threads(nthreads)
  {
#if OPX_MULTI_ISA
    amx_pf pf, *pfp = NULL;
    int stream = (double)m * (double)n * 4 > AMX_BIG_BYTES, big_a = (double)m * (double)pb->k * 4 > AMX_BIG_BYTES;
#endif
    /* one row as uint8 (padded to whole slots), then (transposed A only) as floats; the task's A panels
     * and their rows' scales */
    uint8_t *qa = reserve(&tl_row, (size_t)(kpad * 4) * 5);
    uint32_t *apack = reserve(&tl_a, (size_t)(rowblk * kpad * g.mr) * 4);
    arow *par = reserve(&tl_rows, (size_t)(rowblk * g.mr) * sizeof(arow));
    int ok = qa && apack && par;
    if (!ok) {
#pragma omp atomic write
      failed = 1;
    }
    int64_t packed = -1; /* the first panel of the rows in apack */
#if OPX_MULTI_ISA
    if (g.amx) amx_tiles_on();
#endif
#pragma omp for schedule(static)
    for (int64_t t = 0; t < nblk * nsplit; t++) {
      if (!ok) continue;
      int64_t ip0 = t / nsplit * rowblk, ip1 = ip0 + rowblk < mpanels ? ip0 + rowblk : mpanels;
      int64_t jp0 = t % nsplit * per, jp1 = jp0 + per < npanels ? jp0 + per : npanels;
      int pack = packed != ip0;
      packed = ip0;
      /* vector kernels: all the task's panels now; AMX: each one right before its first use (below) */
      for (int64_t ip = ip0; pack && !g.amx && ip < ip1; ip++)
        pack_a_panel(&g, ta, a, a8, lda, pb->k, kpad, ip * g.mr, m - ip * g.mr < g.mr ? m - ip * g.mr : g.mr,
                     apack + (ip - ip0) * kpad * g.mr, par + (ip - ip0) * g.mr, qa);
      int32_t acc[32 * 32];
      int64_t nj = jp1 - jp0, ni = ip1 - ip0;
      for (int64_t x = 0; x < ni * nj; x++) { /* AMX: the row panels outer; vector kernels: the B panels */
        int64_t jp = g.amx ? jp0 + x % nj : jp0 + x / ni, ip = g.amx ? ip0 + x / nj : ip0 + x % ni;
        int64_t j = jp * g.nr, cols = n - j < g.nr ? n - j : g.nr, i = ip * g.mr, rows = m - i < g.mr ? m - i : g.mr;
        uint32_t *ap = apack + (ip - ip0) * kpad * g.mr;
        const uint32_t *bp = pb->p + jp * kpad * g.nr;
        arow *pr = par + (ip - ip0) * g.mr;
        if (!g.amx) {
          g.kernel(pb->kq, ap, bp, acc);
          for (int64_t r = 0; r < rows; r++) {
            if (c32)
              memcpy(c32 + (i + r) * ldc + j, acc + r * g.nr, (size_t)cols * sizeof(int32_t));
            else
              (g.group == 4 ? dequantize_avx512 : dequantize_avx2)(cols, acc + r * g.nr, pr[r], pb->colsum + j,
                                                                   pb->scale + j, c + (i + r) * ldc + j);
          }
          if (!c32) opx_bias_act_rows(pb->isa, rows, cols, c + i * ldc + j, ldc, bias ? bias + j : NULL, gelu);
          continue;
        }
#if OPX_MULTI_ISA
        /* AMX: as the bf16 GEMM (gemm_bf16.c's amx_gemm) */
        if (x % nj == 0) {
          if (pack) pack_a_panel(&g, ta, a, a8, lda, pb->k, kpad, i, rows, ap, pr, qa);
          pfp = NULL;
          if (pack && big_a && a && !ta && ip + 1 < ip1) { /* the next block's rows */
            pf = amx_pf_of(a + (i + 32) * lda, lda * 4, pb->k * 4, m - i < 64 ? m - i - 32 : 32, nj * (kpad / 16 - 1));
            pfp = &pf;
          }
        }
        amx_block_s32(kpad / 16, ap, ap + kpad * 16, 256, 64, bp, acc, 32, pfp);
        if (c32) {
          for (int64_t r = 0; r < rows; r++)
            memcpy(c32 + (i + r) * ldc + j, acc + r * 32, (size_t)cols * sizeof(int32_t));
          continue;
        }
        float *ct = c + i * ldc + j, tile[32 * 32] __attribute__((aligned(64)));
        int st = amx_streams(stream, ct, ldc, rows, cols);
        for (int64_t r = 0; r < rows; r++)
          dequantize_avx512(cols, acc + r * 32, pr[r], pb->colsum + j, pb->scale + j,
                            st ? tile + r * 32 : ct + r * ldc);
        opx_bias_act_rows(pb->isa, rows, cols, st ? tile : ct, st ? 32 : ldc, bias ? bias + j : NULL, gelu);
        if (st) amx_stream(ct, ldc, tile);
#endif
      }
    }
#if OPX_MULTI_ISA
    if (g.amx) {
      _mm_sfence(); /* the streamed stores, before the caller reads C */
      amx_tiles_off();
    }
#endif
  }
  return !failed;
}

int opx_q8_gemm(const opx_q8_b *pb, int ta, int64_t m, const float *a, int64_t lda, float *c, int64_t ldc,
                const float *bias, int gelu) {
  return drive(pb, ta, m, a, NULL, lda, c, NULL, ldc, bias, gelu);
}

int opx_q8_gemm_s32(const opx_q8_b *pb, int64_t m, const uint8_t *a, int64_t lda, int32_t *c, int64_t ldc) {
  return drive(pb, 0, m, NULL, a, lda, NULL, c, ldc, NULL, 0);
}
