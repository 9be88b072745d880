/* Fused scaled dot-product self-attention on [B, S, H] tensors (contract in
 * bl_ops.h): scores, key-padding mask, softmax, dropout and context in one
 * pass per (batch, head), parallel over batch*heads with OpenMP.
 *
 * Why no OpenBLAS here: the per-head products are small (S x S x d) and are
 * called from inside the OpenMP loop; the pthread build of OpenBLAS would
 * run each one on its own thread pool (oversubscription, serialised calls
 * into its thread server), and its splitting could depend on the thread
 * count. Instead each product goes through gemm_nn below, a register-tiled
 * kernel (attention_gemm.h: 4 rows x 2 vectors of accumulators, GCC vector
 * extensions, one copy per vector width: AVX-512, AVX2 or SSE code picked at
 * run time by OPX_ISA_DISPATCH). Each (b, h) item is computed by one thread
 * with a fixed order of operations: results are bitwise identical for any
 * thread count.
 * Forward per item: Q K^T (K^T packed once), one pass per row for scale +
 * mask + softmax (vectorised exp) + dropout, then P V. Backward per item:
 * dP = dctx V^T, dS = P (dP - rowsum(dP P)) row by row in cache, then
 * dV = Pdrop^T dctx, dQ = dS K, dK = dS^T Q (gemm_tn reads the transposed
 * left operands in place). */
#include "ops_internal.h"
#include "bl_ops.h"
#include "device/dispatch.h"
#include "transpose.h"
#include "base/vecmath.h"
#include "amx.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* [B, S, H] operand with unit stride in H: element (b, s, c) at p[b*sb + s*ss + c]. */
typedef struct bsh {
  float *p;
  int64_t sb, ss;
  opx_buf buf;
} bsh;

static int bsh_in_place(const bl_tensor *t) { return t->dtype == BL_F32 && (t->shape[2] == 1 || t->stride[2] == 1); }

static int bsh_load(const char *op, const bl_tensor *t, bsh *m) {
  m->buf.owned = 0;
  m->buf.p = NULL;
  if (bsh_in_place(t)) {
    m->p = (float *)t->data;
    m->sb = t->stride[0];
    m->ss = t->stride[1];
    return 0;
  }
  BL_CHECK(opx_load(op, t, &m->buf));
  m->p = m->buf.p;
  m->ss = t->shape[2];
  m->sb = t->shape[1] * t->shape[2];
  return 0;
}

static int bsh_out(const char *op, bl_tensor *t, bsh *m) {
  m->buf.owned = 0;
  m->buf.p = NULL;
  if (bsh_in_place(t)) {
    m->p = (float *)t->data;
    m->sb = t->stride[0];
    m->ss = t->stride[1];
    return 0;
  }
  BL_CHECK(opx_out(op, t, &m->buf, 0));
  m->p = m->buf.p;
  m->ss = t->shape[2];
  m->sb = t->shape[1] * t->shape[2];
  return 0;
}

static int check_bsh(const char *op, const bl_tensor *t, const char *name, const bl_tensor *q) {
  BL_CHECK(opx_check_float(op, t, name));
  if (t->ndim != 3) return BL_ERR("%s: %s must be [batch, seq, hidden], got %s", op, name, OPX_SHAPE(t));
  if (q && !opx_same_shape(t, q))
    return BL_ERR("%s: %s %s does not match query %s", op, name, OPX_SHAPE(t), OPX_SHAPE(q));
  return 0;
}

static int check_common(const char *op, const bl_tensor *q, const bl_tensor *k, const bl_tensor *v,
                        const bl_tensor *probs, int heads, double p) {
  BL_CHECK(check_bsh(op, q, "query", NULL));
  BL_CHECK(check_bsh(op, k, "key", q));
  BL_CHECK(check_bsh(op, v, "value", q));
  if (heads < 1 || q->shape[2] % heads != 0)
    return BL_ERR("%s: hidden size %lld of query %s is not divisible by %d heads", op, (long long)q->shape[2],
                  OPX_SHAPE(q), heads);
  BL_CHECK(opx_check(op, probs, "probs"));
  int64_t b = q->shape[0], s = q->shape[1];
  if (probs->dtype != BL_F32 || probs->ndim != 4 || probs->shape[0] != b || probs->shape[1] != heads ||
      probs->shape[2] != s || probs->shape[3] != s || !bl_tensor_is_contiguous(probs))
    return BL_ERR("%s: probs must be a contiguous f32 [%lld,%d,%lld,%lld] tensor, got %s %s", op, (long long)b, heads,
                  (long long)s, (long long)s, bl_dtype_name(probs->dtype), OPX_SHAPE(probs));
  BL_CHECK(opx_check_p(op, p));
  return 0;
}

/* Additive mask values (1 - m) * -10000 for mask [B, S] of any dtype. */
static int load_key_mask(const char *op, const bl_tensor *m, int64_t b, int64_t s, float **out) {
  BL_CHECK(opx_check(op, m, "key_mask"));
  if (m->ndim != 2 || m->shape[0] != b || m->shape[1] != s)
    return BL_ERR("%s: key_mask %s must be [%lld,%lld] (batch, seq)", op, OPX_SHAPE(m), (long long)b, (long long)s);
  float *a = malloc((size_t)(b * s > 0 ? b * s : 1) * sizeof(float));
  if (!a) return bl_set_error(BL_ENOMEM, "%s: out of memory for the key mask", op);
  for (int64_t i = 0; i < b; i++)
    for (int64_t j = 0; j < s; j++) {
      int64_t off = i * m->stride[0] + j * m->stride[1];
      double v;
      switch (m->dtype) {
        case BL_F32: v = ((const float *)m->data)[off]; break;
        case BL_F64: v = ((const double *)m->data)[off]; break;
        case BL_F16: v = opx_h2f(((const uint16_t *)m->data)[off]); break;
        case BL_BF16: v = opx_bf2f(((const uint16_t *)m->data)[off]); break;
        case BL_I32: v = ((const int32_t *)m->data)[off]; break;
        case BL_I64: v = (double)((const int64_t *)m->data)[off]; break;
        default: v = ((const uint8_t *)m->data)[off] != 0; break;
      }
      a[i * s + j] = (float)((1.0 - v) * -10000.0);
    }
  *out = a;
  return 0;
}

#define AG_NAME  gemm_v16
#define AG_LANES 16
#define AG_MR    4
#include "attention_gemm.h"
#undef AG_NAME
#undef AG_LANES
#undef AG_MR
#define AG_NAME  gemm_w16 /* inference's copy: tiles 4 vectors wide where they fit */
#define AG_LANES 16
#define AG_MR    4
#define AG_WIDE  1
#include "attention_gemm.h"
#undef AG_NAME
#undef AG_LANES
#undef AG_MR
#undef AG_WIDE
#define AG_NAME  gemm_v8
#define AG_LANES 8
#define AG_MR    6
#include "attention_gemm.h"
#undef AG_NAME
#undef AG_LANES
#undef AG_MR
#define AG_NAME  gemm_v4
#define AG_LANES 4
#define AG_MR    4
#include "attention_gemm.h"
#undef AG_NAME
#undef AG_LANES
#undef AG_MR

/* gemm_nn: A as stored; gemm_tn: A transposed in place. Each ISA gets the
 * width it has: 16 lanes on AVX-512, 8 on AVX2, 4 on SSE. */
#define GEMM_PARAMS                                                                                             \
  (int64_t M, int64_t N, int64_t K, const float *restrict A, int64_t lda, const float *restrict B, int64_t ldb, \
   float *restrict C, int64_t ldc, int acc)
#define GEMM_ARGS (M, N, K, A, lda, B, ldb, C, ldc, acc)
#define GEMM_WIDTH(w)                                                                       \
  OPX_BODY gemm_nn_v##w GEMM_PARAMS { gemm_v##w(0, M, N, K, A, lda, B, ldb, C, ldc, acc); } \
  OPX_BODY gemm_tn_v##w GEMM_PARAMS { gemm_v##w(1, M, N, K, A, lda, B, ldb, C, ldc, acc); }
GEMM_WIDTH(16)
GEMM_WIDTH(8)
GEMM_WIDTH(4)
OPX_ISA_DISPATCH(gemm_nn, GEMM_PARAMS, GEMM_ARGS, gemm_nn_v16, gemm_nn_v8, gemm_nn_v4)
OPX_ISA_DISPATCH(gemm_tn, GEMM_PARAMS, GEMM_ARGS, gemm_tn_v16, gemm_tn_v8, gemm_tn_v4)
OPX_BODY gemm_nn_w16 GEMM_PARAMS { gemm_w16(0, M, N, K, A, lda, B, ldb, C, ldc, acc); }
OPX_ISA_DISPATCH(gemm_nn_infer, GEMM_PARAMS, GEMM_ARGS, gemm_nn_w16, gemm_nn_v8, gemm_nn_v4)
#undef GEMM_PARAMS
#undef GEMM_ARGS
#undef GEMM_WIDTH

/* out = keep ? p * dscale : 0 over n elements */
OPX_BODY drop_rows_body(int64_t n, const float *restrict p, const uint8_t *restrict keep, float dscale,
                        float *restrict out) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) out[i] = keep[i] ? p[i] * dscale : 0.0f;
}
OPX_ISA_FN(drop_rows,
           (int64_t n, const float *restrict p, const uint8_t *restrict keep, float dscale, float *restrict out),
           (n, p, keep, dscale, out))

/* One score row -> probabilities in place: softmax(row * scale + madd); pd
 * (when keep) receives the dropped and rescaled copy. */
OPX_BODY softmax_row_body(int64_t S, float *restrict row, const float *restrict madd, float scale,
                          const uint8_t *restrict keep, float dscale, float *restrict pd) {
  if (madd) {
#pragma omp simd
    for (int64_t j = 0; j < S; j++) row[j] = row[j] * scale + madd[j];
  } else {
#pragma omp simd
    for (int64_t j = 0; j < S; j++) row[j] *= scale;
  }
  float mx = vm_row_max(S, row);
  float acc[16] = { 0 }, sum = 0.0f;
  int64_t j = 0;
  for (; j + 16 <= S; j += 16) {
#pragma omp simd
    for (int l = 0; l < 16; l++) {
      float e = vm_exp(row[j + l] - mx);
      row[j + l] = e;
      acc[l] += e;
    }
  }
  for (; j < S; j++) {
    float e = vm_exp(row[j] - mx);
    row[j] = e;
    sum += e;
  }
  for (int l = 0; l < 16; l++) sum += acc[l];
  float inv = 1.0f / sum;
#pragma omp simd
  for (int64_t k = 0; k < S; k++) row[k] *= inv;
  if (keep) {
#pragma omp simd
    for (int64_t k = 0; k < S; k++) pd[k] = keep[k] ? row[k] * dscale : 0.0f;
  }
}
OPX_ISA_FN(softmax_row,
           (int64_t S, float *restrict row, const float *restrict madd, float scale, const uint8_t *restrict keep,
            float dscale, float *restrict pd),
           (S, row, madd, scale, keep, dscale, pd))

/* Inference's row (no mask, no dropout), in place: row = exp(row * scale - max), unnormalised, and *inv =
 * 1 / sum, which the caller applies to the row's context instead (d values, not S). Two passes over the
 * row where softmax_row makes four; max(row) * scale is max(row * scale) exactly (scale > 0, rounding is
 * monotonic), so only the exp argument's rounding (possibly one FMA) and where 1/sum is applied differ. */
OPX_BODY softmax_exp_row_body(int64_t S, float *restrict row, float scale, float *inv) {
  float mx = vm_row_max(S, row) * scale;
  float acc[16] = { 0 }, sum = 0.0f;
  int64_t j = 0;
  for (; j + 16 <= S; j += 16) {
#pragma omp simd
    for (int l = 0; l < 16; l++) {
      float e = vm_exp(row[j + l] * scale - mx);
      row[j + l] = e;
      acc[l] += e;
    }
  }
  for (; j < S; j++) {
    float e = vm_exp(row[j] * scale - mx);
    row[j] = e;
    sum += e;
  }
  for (int l = 0; l < 16; l++) sum += acc[l];
  *inv = 1.0f / sum;
}
OPX_ISA_FN(softmax_exp_row, (int64_t S, float *restrict row, float scale, float *inv), (S, row, scale, inv))

/* Backward of one row, in place: ds holds dPdrop = dctx V^T on entry; the
 * dropout mask is applied (dP), then ds = P (dP - sum(dP P)) * scale. */
OPX_BODY softmax_bwd_row_body(int64_t S, float *restrict ds, const float *restrict pr, const uint8_t *restrict keep,
                              float dscale, float scale) {
  if (keep) {
#pragma omp simd
    for (int64_t j = 0; j < S; j++) ds[j] = keep[j] ? ds[j] * dscale : 0.0f;
  }
  float acc[16] = { 0 }, dot = 0.0f;
  int64_t j = 0;
  for (; j + 16 <= S; j += 16) {
#pragma omp simd
    for (int l = 0; l < 16; l++) acc[l] += ds[j + l] * pr[j + l];
  }
  for (; j < S; j++) dot += ds[j] * pr[j];
  for (int l = 0; l < 16; l++) dot += acc[l];
#pragma omp simd
  for (int64_t k = 0; k < S; k++) ds[k] = pr[k] * (ds[k] - dot) * scale;
}
OPX_ISA_FN(softmax_bwd_row,
           (int64_t S, float *restrict ds, const float *restrict pr, const uint8_t *restrict keep, float dscale,
            float scale),
           (S, ds, pr, keep, dscale, scale))

/* The dropout mask of head bh over a batch of padded length S: row q starts Philox call (bh*S + q)*ceil(S/4), so
 * that one call's four outputs are four adjacent keys of one row (what the CUDA tensor-core kernel draws per lane
 * pair). keep gets the first n x n corner (n = S for the padded op; a packed sequence's length for the packed one,
 * whose tokens are the row's first n). */
static void head_keep(uint64_t seed, uint64_t offset, int64_t bh, int64_t S, int64_t n, double p, uint8_t *keep) {
  const int64_t row = (S + 3) / 4 * 4;
  for (int64_t q = 0; q < n; q++) opx_dropout_keep(seed, offset, (bh * S + q) * row, n, (float)p, keep + q * n);
}

/* Packed inference runs an item in blocks of this many query rows: scores, softmax and context of a block while
 * its scores are in L1/L2. A multiple of every gemm_nn row tile (4 and 6), so each block is tiled as the whole
 * product would be: the same bits as one product over all n rows. */
#define INFER_ROWS 24

/* One (sequence, head) item of the forward over n tokens: probabilities into pb [n, n] (before dropout), context
 * into cb. kt, pd, keep: per-thread scratch of d*n, n*n, n*n (pd and keep NULL without dropout; keep filled by the
 * caller). madd: additive key mask [n] or NULL. inv: scratch of INFER_ROWS for packed inference (no mask, no
 * dropout, the probabilities not kept; pb then holds INFER_ROWS rows), which normalises the context rows instead
 * of the probability rows; else NULL. */
static void head_forward(int64_t n, int64_t d, const float *qb, int64_t ldq, const float *kb, int64_t ldk,
                         const float *vb, int64_t ldv, float *cb, int64_t ldc, float *pb, const float *madd, float sc,
                         const uint8_t *keep, float dscale, float *kt, float *pd, float *inv) {
  opx_transpose(n, d, kb, ldk, kt, n);
  if (inv) {
    for (int64_t i = 0; i < n; i += INFER_ROWS) {
      int64_t r = n - i < INFER_ROWS ? n - i : INFER_ROWS;
      gemm_nn_infer(r, n, d, qb + i * ldq, ldq, kt, n, pb, n, 0);
      for (int64_t q = 0; q < r; q++) softmax_exp_row(n, pb + q * n, sc, inv + q);
      gemm_nn_infer(r, d, n, pb, n, vb, ldv, cb + i * ldc, ldc, 0);
      for (int64_t q = 0; q < r; q++) opx_scale_row(d, cb + (i + q) * ldc, inv[q]);
    }
    return;
  }
  gemm_nn(n, n, d, qb, ldq, kt, n, pb, n, 0);
  for (int64_t i = 0; i < n; i++)
    softmax_row(n, pb + i * n, madd, sc, keep ? keep + i * n : NULL, dscale, pd ? pd + i * n : NULL);
  gemm_nn(n, d, n, pd ? pd : pb, n, vb, ldv, cb, ldc, 0);
}

/* One item of the backward: dq, dk, dv of the n tokens from the saved probabilities pb [n, n]. vt, ds, pdrop:
 * scratch of d*n, n*n, n*n (pdrop NULL without dropout). */
static void head_backward(int64_t n, int64_t d, const float *qb, int64_t ldq, const float *kb, int64_t ldk,
                          const float *vb, int64_t ldv, const float *ob, int64_t ldo, const float *pb, float *dqb,
                          int64_t lddq, float *dkb, int64_t lddk, float *dvb, int64_t lddv, float sc,
                          const uint8_t *keep, float dscale, float *vt, float *ds, float *pdrop) {
  /* dV = Pdrop^T dctx (the dropped probabilities, read transposed) */
  if (keep) {
    drop_rows(n * n, pb, keep, dscale, pdrop);
    gemm_tn(n, d, n, pdrop, n, ob, ldo, dvb, lddv, 0);
  } else {
    gemm_tn(n, d, n, pb, n, ob, ldo, dvb, lddv, 0);
  }
  /* dP = dctx V^T, then the softmax backward row by row */
  opx_transpose(n, d, vb, ldv, vt, n);
  gemm_nn(n, n, d, ob, ldo, vt, n, ds, n, 0);
  for (int64_t i = 0; i < n; i++) softmax_bwd_row(n, ds + i * n, pb + i * n, keep ? keep + i * n : NULL, dscale, sc);
  gemm_nn(n, d, n, ds, n, kb, ldk, dqb, lddq, 0);
  gemm_tn(n, d, n, ds, n, qb, ldq, dkb, lddk, 0);
}

/* The sequences of a call: packed, nb sequences delimited by off [nb+1] in T tokens, the longest maxlen, and poff
 * [nb+1] where each one's saved probabilities start (heads * the sum of the earlier lengths squared); or padded
 * (off NULL): nb rows of maxlen tokens each, the [B, S, H] layout's batch stride. */
typedef struct packed_seqs {
  int64_t nb, T, d, maxlen, *off, *poff;
} packed_seqs;

static inline int64_t seq_len(const packed_seqs *ps, int64_t b) {
  return ps->off ? ps->off[b + 1] - ps->off[b] : ps->maxlen;
}
static inline int64_t seq_probs(const packed_seqs *ps, int64_t b, int heads) {
  return ps->off ? ps->poff[b] : b * heads * ps->maxlen * ps->maxlen;
}
static inline float *seq_at(const bsh *m, const packed_seqs *ps, int64_t b) {
  return m->p + (ps->off ? ps->off[b] * m->ss : b * m->sb);
}

/* n rows of d f32 (row stride d) into bf16 rows (row stride ld), rounded to nearest even (as the bf16 GEMM rounds
 * an f32 A: the bits it reads are the same, bf16 subnormals counting as zero there) */
OPX_BODY rows_to_bf16_body(int64_t n, int64_t d, const float *restrict f, uint16_t *restrict o, int64_t ld) {
  for (int64_t r = 0; r < n; r++) {
#pragma omp simd
    for (int64_t j = 0; j < d; j++) o[r * ld + j] = opx_f2bf(f[r * d + j]);
  }
}
OPX_ISA_FN(rows_to_bf16, (int64_t n, int64_t d, const float *restrict f, uint16_t *restrict o, int64_t ld),
           (n, d, f, o, ld))

#if OPX_MULTI_ISA
/* Packed inference on AMX tiles for bf16 q, k, v (bl_ops.h; d 32 or 64: one or two A tiles of q per 16 rows):
 * scores = q k^T by tdpbf16ps (f32 sums), each row through softmax_exp_row (f32), the unnormalised probabilities
 * rounded to bf16 (nearest even), ctx = P v by tdpbf16ps, then scaled by 1 / sum (the f32 sum of the unrounded
 * probabilities). Keys are padded with zeros to n32 (whole 32-key tiles: their scores and probabilities are 0
 * and add nothing), query rows to 16. A thread's scratch for sequences of up to S tokens: */
typedef struct amx_ws {
  uint32_t *kt; /* k^T tiles [n32 / 16][d / 32][16 pairs of dims][16 keys] */
  uint32_t *vp; /* v as pairs of keys [n32 / 2][d] */
  float *sc;    /* scores, then probabilities, [16][n32] */
  uint16_t *p;  /* the probabilities in bf16 [16][n32] */
  float *cb;    /* the context block [16][d] */
  uint16_t *q;  /* a last block of fewer than 16 query rows, zero-padded [16][d] */
} amx_ws;

static void amx_ws_free(amx_ws *w) {
  free(w->kt), free(w->vp), free(w->sc), free(w->p), free(w->cb), free(w->q);
  memset(w, 0, sizeof *w);
}

static int amx_ws_alloc(amx_ws *w, int64_t S, int64_t d) {
  size_t n32 = (size_t)((S + 31) / 32 * 32), dd = (size_t)d;
  w->kt = aligned_alloc(64, n32 * dd * 2), w->vp = aligned_alloc(64, n32 * dd * 2);
  w->sc = aligned_alloc(64, 16 * n32 * 4), w->p = aligned_alloc(64, 16 * n32 * 2);
  w->cb = aligned_alloc(64, 16 * dd * 4), w->q = aligned_alloc(64, 16 * dd * 2);
  if (w->kt && w->vp && w->sc && w->p && w->cb && w->q) return 1;
  amx_ws_free(w);
  return 0;
}

/* One (sequence, head) item over n tokens: q, k, v bf16 rows (row strides in elements); the context rows into cb
 * (f32, or bf16 when cbf), row stride ldc */
AMX_TARGET static void amx_head_forward(int64_t n, int64_t d, const uint16_t *qb, int64_t ldq, const uint16_t *kb,
                                        int64_t ldk, const uint16_t *vb, int64_t ldv, void *cb, int cbf, int64_t ldc,
                                        float sc, amx_ws *w) {
  const int64_t n32 = (n + 31) / 32 * 32, kt = d / 32;
  /* k^T: row p of tile (jb, t) gathers dim pair 32 t + 2 p, + 1 of the 16 keys of jb (keys past n: 0) */
  const __m512i kidx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32((int)(ldk / 2)));
  for (int64_t jb = 0; jb < n32 / 16; jb++) {
    int64_t left = n - jb * 16;
    __mmask16 m = left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
    const uint16_t *k0 = kb + (m ? jb * 16 * ldk : 0);
    for (int64_t t = 0; t < kt; t++)
      for (int64_t p = 0; p < 16; p++)
        _mm512_store_si512(w->kt + ((jb * kt + t) * 16 + p) * 16,
                           _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, kidx, k0 + 32 * t + 2 * p, 4));
  }
  /* v: row pp of pairs interleaves keys 2 pp and 2 pp + 1 (past n: 0), 16 columns per vpermt2w */
  static const uint16_t il[32] = { 0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                   8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47 };
  const __m512i lo = _mm512_loadu_si512(il);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int64_t pp = 0; pp < n32 / 2; pp++)
    for (int64_t c = 0; c < d; c += 32) {
      __m512i a = 2 * pp < n ? _mm512_loadu_si512(vb + 2 * pp * ldv + c) : _mm512_setzero_si512();
      __m512i b = 2 * pp + 1 < n ? _mm512_loadu_si512(vb + (2 * pp + 1) * ldv + c) : _mm512_setzero_si512();
      _mm512_store_si512(w->vp + pp * d + c, _mm512_permutex2var_epi16(a, lo, b));
      _mm512_store_si512(w->vp + pp * d + c + 16, _mm512_permutex2var_epi16(a, hi, b));
    }
  for (int64_t i0 = 0; i0 < n; i0 += 16) {
    const int64_t rows = n - i0 < 16 ? n - i0 : 16;
    const uint16_t *qa = qb + i0 * ldq;
    int64_t qs = ldq * 2;
    if (rows < 16) {
      memset(w->q, 0, (size_t)(16 * d) * 2);
      for (int64_t r = 0; r < rows; r++) memcpy(w->q + r * d, qa + r * ldq, (size_t)d * 2);
      qa = w->q, qs = d * 2;
    }
    _tile_loadd(4, qa, qs);
    if (kt == 2) _tile_loadd(5, qa + 32, qs);
    for (int64_t jb = 0; jb < n32 / 16; jb += 2) {
      const uint32_t *k0 = w->kt + jb * kt * 256, *k1 = k0 + kt * 256;
      _tile_zero(0);
      _tile_zero(1);
      _tile_loadd(6, k0, 64);
      _tile_loadd(7, k1, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      if (kt == 2) {
        _tile_loadd(6, k0 + 256, 64);
        _tile_loadd(7, k1 + 256, 64);
        _tile_dpbf16ps(0, 5, 6);
        _tile_dpbf16ps(1, 5, 7);
      }
      _tile_stored(0, w->sc + jb * 16, n32 * 4);
      _tile_stored(1, w->sc + jb * 16 + 16, n32 * 4);
    }
    float inv[16];
    for (int64_t r = 0; r < rows; r++) softmax_exp_row(n, w->sc + r * n32, sc, inv + r);
    for (int64_t r = 0; r < 16; r++) /* keys past n: scores of zero keys, 0; rows past `rows`: 0 */
      for (int64_t j = 0; j < n32; j += 32) {
        const float *f = w->sc + r * n32 + j;
        _mm512_store_si512(w->p + r * n32 + j,
                           (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(f + 16), _mm512_loadu_ps(f)));
      }
    _tile_zero(0);
    _tile_zero(1);
    if (d == 64) {
      _tile_zero(2);
      _tile_zero(3);
    }
    for (int64_t s = 0; s < n32 / 32; s++) {
      const uint32_t *vs = w->vp + s * 16 * d;
      _tile_loadd(4, w->p + s * 32, n32 * 2);
      _tile_loadd(6, vs, d * 4);
      _tile_loadd(7, vs + 16, d * 4);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      if (d == 64) {
        _tile_loadd(6, vs + 32, d * 4);
        _tile_loadd(7, vs + 48, d * 4);
        _tile_dpbf16ps(2, 4, 6);
        _tile_dpbf16ps(3, 4, 7);
      }
    }
    _tile_stored(0, w->cb, d * 4);
    _tile_stored(1, w->cb + 16, d * 4);
    if (d == 64) {
      _tile_stored(2, w->cb + 32, d * 4);
      _tile_stored(3, w->cb + 48, d * 4);
    }
    for (int64_t r = 0; r < rows; r++) {
      float *f = w->cb + r * d;
      opx_scale_row(d, f, inv[r]);
      if (cbf)
        rows_to_bf16(1, d, f, (uint16_t *)cb + (i0 + r) * ldc, ldc);
      else
        memcpy((float *)cb + (i0 + r) * ldc, f, (size_t)d * 4);
    }
  }
}
#endif

/* t is bf16 with unit stride in H */
static int bf16_rows(const bl_tensor *t) { return t->dtype == BL_BF16 && (t->shape[2] == 1 || t->stride[2] == 1); }

static void packed_free(packed_seqs *ps) {
  free(ps->off);
  free(ps->poff);
  ps->off = ps->poff = NULL;
}

/* Checks q, k, v and the offsets of a packed call (q [1, T, H], CPU) and, when seq > 0 (training: the padded
 * length that lays out the dropout stream), that no sequence is longer than seq. */
static int packed_load(const char *op, const bl_tensor *q, const bl_tensor *k, const bl_tensor *v,
                       const bl_tensor *offsets, int heads, int64_t seq, packed_seqs *ps) {
  ps->off = ps->poff = NULL;
  BL_CHECK(check_bsh(op, q, "query", NULL));
  BL_CHECK(check_bsh(op, k, "key", q));
  BL_CHECK(check_bsh(op, v, "value", q));
  if (q->shape[0] != 1) return BL_ERR("%s: query %s must be [1, tokens, hidden] (packed)", op, OPX_SHAPE(q));
  if (heads < 1 || q->shape[2] % heads != 0)
    return BL_ERR("%s: hidden size %lld of query %s is not divisible by %d heads", op, (long long)q->shape[2],
                  OPX_SHAPE(q), heads);
  ps->T = q->shape[1];
  ps->d = q->shape[2] / heads;
  BL_CHECK(opx_load_offsets(op, offsets, ps->T, &ps->off, &ps->maxlen));
  ps->nb = offsets->shape[0] - 1;
  if (seq > 0 && ps->maxlen > seq) {
    packed_free(ps);
    return BL_ERR("%s: a sequence has %lld tokens, more than the padded length %lld", op, (long long)ps->maxlen,
                  (long long)seq);
  }
  ps->poff = malloc((size_t)(ps->nb + 1) * sizeof(int64_t));
  if (!ps->poff) {
    packed_free(ps);
    return bl_set_error(BL_ENOMEM, "%s: out of memory for the offsets", op);
  }
  ps->poff[0] = 0;
  for (int64_t b = 0; b < ps->nb; b++) {
    int64_t n = ps->off[b + 1] - ps->off[b];
    ps->poff[b + 1] = ps->poff[b] + heads * n * n;
  }
  return 0;
}

/* probs: a contiguous f32 tensor of heads * sum(n_b^2) elements (the saved probabilities of a packed call) */
static int check_packed_probs(const char *op, const bl_tensor *probs, const packed_seqs *ps) {
  BL_CHECK(opx_check(op, probs, "probs"));
  if (probs->dtype != BL_F32 || !bl_tensor_is_contiguous(probs) || probs->numel != ps->poff[ps->nb])
    return BL_ERR(
        "%s: probs must be a contiguous f32 tensor of %lld elements (heads x the sum of the squared "
        "sequence lengths), got %s %s",
        op, (long long)ps->poff[ps->nb], bl_dtype_name(probs->dtype), OPX_SHAPE(probs));
  return 0;
}

/* The forward over sequences, one (sequence, head) per item: the padded op (madd: its additive key mask [B, S]),
 * or packed (inference: probs NULL, p 0; training: probs saved and dropout drawn as the padded op of length seq
 * draws it). */
static int seqs_fwd_cpu(const char *op, bl_tensor *ctx, bl_tensor *probs, const bl_tensor *q, const bl_tensor *k,
                        const bl_tensor *v, const packed_seqs *ps, const float *madd, int heads, double scale,
                        int64_t seq, double p, uint64_t seed, uint64_t offset) {
  BL_CHECK(opx_seed_check(op, p, seed));
  const int64_t nb = ps->nb, d = ps->d, S = ps->maxlen;
  bsh mq, mk, mv, mc;
  int rc = 0, oom = 0;
  mq.buf.owned = mk.buf.owned = mv.buf.owned = mc.buf.owned = 0;
  mc.buf.p = NULL;
  /* a bf16 ctx with unit stride in H: each item's context rounded into it from a per-thread f32 scratch */
  const int cbf = bf16_rows(ctx);
  /* packed inference with bf16 q, k, v on AMX: amx_head_forward reads them in place */
  const int amx = OPX_MULTI_ISA && ps->off && !probs && p <= 0 && (d == 32 || d == 64) && opx_amx_ok() &&
                  bf16_rows(q) && bf16_rows(k) && bf16_rows(v) && k->stride[1] % 2 == 0; /* k gathered in pairs */
  if (amx) {
    mq = (bsh){ NULL, q->stride[0], q->stride[1], { 0 } };
    mk = (bsh){ NULL, k->stride[0], k->stride[1], { 0 } };
    mv = (bsh){ NULL, v->stride[0], v->stride[1], { 0 } };
  }
  if ((!amx && ((rc = bsh_load(op, q, &mq)) || (rc = bsh_load(op, k, &mk)) || (rc = bsh_load(op, v, &mv)))) ||
      (!cbf && (rc = bsh_out(op, ctx, &mc))))
    goto done;
  if (cbf) mc = (bsh){ NULL, ctx->stride[0], ctx->stride[1], { 0 } };
  const float sc = (float)scale, dscale = p > 0 ? (float)(1.0 / (1.0 - p)) : 1.0f;
#pragma omp parallel if (nb * heads > 1 && nb * heads * S * S * d > 32768)
  {
    size_t ss = (size_t)(S * S > 0 ? S * S : 1);
    const int infer = ps->off && !probs && p <= 0; /* packed inference: head_forward's inv, INFER_ROWS score rows */
    float *kt = malloc((size_t)(d * S > 0 ? d * S : 1) * sizeof(float));
    size_t np = infer ? (size_t)INFER_ROWS * (size_t)(S > 0 ? S : 1) : ss;
    float *pr = probs ? NULL : malloc(np * sizeof(float));
    float *pd = p > 0 ? malloc(ss * sizeof(float)) : NULL;
    float *inv = infer ? malloc(INFER_ROWS * sizeof(float)) : NULL;
    uint8_t *keep = p > 0 ? malloc(ss) : NULL;
    float *cs = cbf && !amx ? malloc((size_t)(d * S > 0 ? d * S : 1) * sizeof(float)) : NULL;
    int ok = kt && (probs || pr) && (p <= 0 || (pd && keep)) && (!infer || inv) && (!cbf || amx || cs);
#if OPX_MULTI_ISA
    amx_ws ws = { 0 };
    if (amx && ok) ok = amx_ws_alloc(&ws, S, d);
    if (amx && ok) amx_tiles_on();
#endif
    if (!ok) {
#pragma omp atomic write
      oom = 1;
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < nb * heads; bh++) {
      int64_t b = bh / heads, h = bh % heads, n = seq_len(ps, b), c = h * d;
      if (!ok || n == 0) continue;
#if OPX_MULTI_ISA
      if (amx) {
        const int64_t o = ps->off[b];
        amx_head_forward(n, d, (const uint16_t *)q->data + o * mq.ss + c, mq.ss,
                         (const uint16_t *)k->data + o * mk.ss + c, mk.ss, (const uint16_t *)v->data + o * mv.ss + c,
                         mv.ss,
                         cbf ? (void *)((uint16_t *)ctx->data + o * mc.ss + c) : (void *)(seq_at(&mc, ps, b) + c), cbf,
                         mc.ss, sc, &ws);
        continue;
      }
#endif
      float *pb = probs ? (float *)probs->data + seq_probs(ps, b, heads) + h * n * n : pr;
      if (keep) head_keep(seed, offset, bh, seq, n, p, keep);
      head_forward(n, d, seq_at(&mq, ps, b) + c, mq.ss, seq_at(&mk, ps, b) + c, mk.ss, seq_at(&mv, ps, b) + c, mv.ss,
                   cbf ? cs : seq_at(&mc, ps, b) + c, cbf ? d : mc.ss, pb, madd ? madd + b * S : NULL, sc, keep, dscale,
                   kt, pd, inv);
      if (cbf) rows_to_bf16(n, d, cs, (uint16_t *)ctx->data + (ps->off ? ps->off[b] * mc.ss : b * mc.sb) + c, mc.ss);
    }
#if OPX_MULTI_ISA
    if (amx && ws.kt) amx_tiles_off();
    amx_ws_free(&ws);
#endif
    free(cs);
    free(kt);
    free(pr);
    free(pd);
    free(inv);
    free(keep);
  }
  if (oom) {
    rc = bl_set_error(BL_ENOMEM, "%s: out of memory for per-head scratch", op);
    goto done;
  }
  opx_store(ctx, &mc.buf);
done:
  opx_free(&mq.buf);
  opx_free(&mk.buf);
  opx_free(&mv.buf);
  opx_free(&mc.buf);
  return rc;
}

/* The packed forward (bl_ops.h): inference when a->saved is NULL, else training. Inference is the padded op with its
 * masked keys left out: there their probabilities underflow to 0, so only the summation order differs, and that
 * 1/sum scales the context rows (head_forward's inv) instead of the probabilities. */
static int packed_forward(const bl_attention_args *a) {
  bl_tensor *ctx = a->ctx, *probs = a->saved;
  const char *op = probs ? "attention_packed_train" : "attention_packed";
  const double p = a->p;
  const int64_t seq = probs ? a->seq : 0;
  int dev;
  const bl_tensor *ts[] = { ctx, probs, a->q, a->k, a->v, a->offsets, a->key_mask };
  BL_CHECK(opx_device(op, 7, ts, &dev));
  if (dev >= 0) return BL_ERR("%s: CPU only, got tensors on cuda:%d", op, dev);
  if (a->key_mask) return BL_ERR("%s: key_mask must be NULL with offsets (they delimit the sequences)", op);
  BL_CHECK(opx_check_p(op, p));
  if (p > 0 && !probs) return BL_ERR("%s: dropout needs saved (the training op)", op);
  if (probs && seq < 1) return BL_ERR("%s: the padded length %lld must be positive", op, (long long)seq);
  BL_CHECK(check_bsh(op, ctx, "context", a->q));
  packed_seqs ps;
  BL_CHECK(packed_load(op, a->q, a->k, a->v, a->offsets, a->heads, seq, &ps));
  int rc = probs ? check_packed_probs(op, probs, &ps) : 0;
  double scale = a->scale > 0 ? a->scale : 1.0 / sqrt((double)ps.d);
  if (!rc) rc = seqs_fwd_cpu(op, ctx, probs, a->q, a->k, a->v, &ps, NULL, a->heads, scale, seq, p, a->seed, a->offset);
  packed_free(&ps);
  return rc;
}

/* The backward over sequences (padded or packed, as seqs_fwd_cpu) */
static int seqs_bwd_cpu(const char *op, bl_tensor *dq, bl_tensor *dk, bl_tensor *dv, const bl_tensor *dctx,
                        const bl_tensor *q, const bl_tensor *k, const bl_tensor *v, const bl_tensor *probs,
                        const packed_seqs *ps, int heads, double scale, int64_t seq, double p, uint64_t seed,
                        uint64_t offset) {
  BL_CHECK(opx_seed_check(op, p, seed));
  const int64_t nb = ps->nb, d = ps->d, S = ps->maxlen;
  bsh mq, mk, mv, mo, mdq, mdk, mdv;
  int rc = 0, oom = 0;
  mq.buf.owned = mk.buf.owned = mv.buf.owned = mo.buf.owned = mdq.buf.owned = mdk.buf.owned = mdv.buf.owned = 0;
  if ((rc = bsh_load(op, q, &mq)) || (rc = bsh_load(op, k, &mk)) || (rc = bsh_load(op, v, &mv)) ||
      (rc = bsh_load(op, dctx, &mo)) || (rc = bsh_out(op, dq, &mdq)) || (rc = bsh_out(op, dk, &mdk)) ||
      (rc = bsh_out(op, dv, &mdv)))
    goto done;
  const float sc = (float)scale, dscale = p > 0 ? (float)(1.0 / (1.0 - p)) : 1.0f;
#pragma omp parallel if (nb * heads > 1 && nb * heads * S * S * d > 32768)
  {
    size_t ss = (size_t)(S * S > 0 ? S * S : 1);
    float *vt = malloc((size_t)(d * S > 0 ? d * S : 1) * sizeof(float));
    float *ds = malloc(ss * sizeof(float)), *pdrop = p > 0 ? malloc(ss * sizeof(float)) : NULL;
    uint8_t *keep = p > 0 ? malloc(ss) : NULL;
    int ok = vt && ds && (p <= 0 || (keep && pdrop));
    if (!ok) {
#pragma omp atomic write
      oom = 1;
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < nb * heads; bh++) {
      int64_t b = bh / heads, h = bh % heads, n = seq_len(ps, b), c = h * d;
      if (!ok || n == 0) continue;
      if (keep) head_keep(seed, offset, bh, seq, n, p, keep);
      head_backward(n, d, seq_at(&mq, ps, b) + c, mq.ss, seq_at(&mk, ps, b) + c, mk.ss, seq_at(&mv, ps, b) + c, mv.ss,
                    seq_at(&mo, ps, b) + c, mo.ss, (const float *)probs->data + seq_probs(ps, b, heads) + h * n * n,
                    seq_at(&mdq, ps, b) + c, mdq.ss, seq_at(&mdk, ps, b) + c, mdk.ss, seq_at(&mdv, ps, b) + c, mdv.ss,
                    sc, keep, dscale, vt, ds, pdrop);
    }
    free(vt);
    free(ds);
    free(pdrop);
    free(keep);
  }
  if (oom) {
    rc = bl_set_error(BL_ENOMEM, "%s: out of memory for per-head scratch", op);
    goto done;
  }
  opx_store(dq, &mdq.buf);
  opx_store(dk, &mdk.buf);
  opx_store(dv, &mdv.buf);
done:
  opx_free(&mq.buf);
  opx_free(&mk.buf);
  opx_free(&mv.buf);
  opx_free(&mo.buf);
  opx_free(&mdq.buf);
  opx_free(&mdk.buf);
  opx_free(&mdv.buf);
  return rc;
}

static int packed_backward(bl_tensor *dq, bl_tensor *dk, bl_tensor *dv, const bl_tensor *dctx,
                           const bl_attention_args *a) {
  const char *op = "attention_packed_backward";
  const bl_tensor *q = a->q, *probs = a->saved;
  int dev;
  const bl_tensor *ts[] = { dq, dk, dv, dctx, q, a->k, a->v, probs, a->offsets, a->key_mask };
  BL_CHECK(opx_device(op, 10, ts, &dev));
  if (dev >= 0) return BL_ERR("%s: CPU only, got tensors on cuda:%d", op, dev);
  if (a->key_mask) return BL_ERR("%s: key_mask must be NULL with offsets (they delimit the sequences)", op);
  if (!probs) return BL_ERR("%s: saved (the probabilities of the training forward) is NULL", op);
  BL_CHECK(opx_check_p(op, a->p));
  if (a->seq < 1) return BL_ERR("%s: the padded length %lld must be positive", op, (long long)a->seq);
  BL_CHECK(check_bsh(op, dctx, "grad_context", q));
  BL_CHECK(check_bsh(op, dq, "grad_query", q));
  BL_CHECK(check_bsh(op, dk, "grad_key", q));
  BL_CHECK(check_bsh(op, dv, "grad_value", q));
  packed_seqs ps;
  BL_CHECK(packed_load(op, q, a->k, a->v, a->offsets, a->heads, a->seq, &ps));
  int rc = check_packed_probs(op, probs, &ps);
  double scale = a->scale > 0 ? a->scale : 1.0 / sqrt((double)ps.d);
  if (!rc)
    rc = seqs_bwd_cpu(op, dq, dk, dv, dctx, q, a->k, a->v, probs, &ps, a->heads, scale, a->seq, a->p, a->seed,
                      a->offset);
  packed_free(&ps);
  return rc;
}

/* The padded op: the key mask's additive values, then every (b, h) over S tokens */
static int attention_fwd_cpu(bl_tensor *ctx, bl_tensor *probs, const bl_tensor *q, const bl_tensor *k,
                             const bl_tensor *v, const bl_tensor *key_mask, int heads, double scale, double p,
                             uint64_t seed, uint64_t offset) {
  const char *op = "attention";
  const int64_t B = q->shape[0], S = q->shape[1];
  const packed_seqs ps = { B, B * S, q->shape[2] / heads, S, NULL, NULL };
  float *madd = NULL;
  if (key_mask) BL_CHECK(load_key_mask(op, key_mask, B, S, &madd));
  int rc = seqs_fwd_cpu(op, ctx, probs, q, k, v, &ps, madd, heads, scale, S, p, seed, offset);
  free(madd);
  return rc;
}

static int padded_forward(const bl_attention_args *a) {
  const char *op = "attention";
  bl_tensor *ctx = a->ctx, *probs = a->saved;
  const bl_tensor *q = a->q, *k = a->k, *v = a->v, *key_mask = a->key_mask;
  const int heads = a->heads;
  int dev;
  const bl_tensor *ts[] = { ctx, probs, q, k, v, key_mask };
  BL_CHECK(opx_device(op, 6, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_attention_forward(a));
  BL_CHECK(check_common(op, q, k, v, probs, heads, a->p));
  BL_CHECK(check_bsh(op, ctx, "context", q));
  if (key_mask) {
    BL_CHECK(opx_check(op, key_mask, "key_mask"));
    if (key_mask->ndim != 2 || key_mask->shape[0] != q->shape[0] || key_mask->shape[1] != q->shape[1])
      return BL_ERR("%s: key_mask %s must be [batch, seq] of query %s", op, OPX_SHAPE(key_mask), OPX_SHAPE(q));
  }
  double scale = a->scale > 0 ? a->scale : 1.0 / sqrt((double)(q->shape[2] / heads));
  return attention_fwd_cpu(ctx, probs, q, k, v, key_mask, heads, scale, a->p, a->seed, a->offset);
}

int bl_attention_forward(const bl_attention_args *a) {
  if (!a) return BL_ERR("attention: args is NULL");
  return a->offsets ? packed_forward(a) : padded_forward(a);
}

/* The padded op: B rows of S tokens, each item over all S keys (the masked ones have probability 0 in probs) */
static int attention_bwd_cpu(bl_tensor *dq, bl_tensor *dk, bl_tensor *dv, const bl_tensor *dctx, const bl_tensor *q,
                             const bl_tensor *k, const bl_tensor *v, const bl_tensor *probs, int heads, double scale,
                             double p, uint64_t seed, uint64_t offset) {
  const int64_t S = q->shape[1];
  const packed_seqs ps = { q->shape[0], q->shape[0] * S, q->shape[2] / heads, S, NULL, NULL };
  return seqs_bwd_cpu("attention_backward", dq, dk, dv, dctx, q, k, v, probs, &ps, heads, scale, S, p, seed, offset);
}

/* ctx and key_mask are read on cuda only (the CPU has the mask baked into the probabilities) */
static int padded_backward(bl_tensor *dq, bl_tensor *dk, bl_tensor *dv, const bl_tensor *dctx,
                           const bl_attention_args *a) {
  const char *op = "attention_backward";
  const bl_tensor *q = a->q, *k = a->k, *v = a->v, *probs = a->saved;
  const int heads = a->heads;
  int dev;
  const bl_tensor *ts[] = { dq, dk, dv, dctx, q, k, v, a->ctx, probs, a->key_mask };
  BL_CHECK(opx_device(op, 10, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_attention_backward(dq, dk, dv, dctx, a));
  BL_CHECK(check_common(op, q, k, v, probs, heads, a->p));
  BL_CHECK(check_bsh(op, dctx, "grad_context", q));
  BL_CHECK(check_bsh(op, dq, "grad_query", q));
  BL_CHECK(check_bsh(op, dk, "grad_key", q));
  BL_CHECK(check_bsh(op, dv, "grad_value", q));
  double scale = a->scale > 0 ? a->scale : 1.0 / sqrt((double)(q->shape[2] / heads));
  return attention_bwd_cpu(dq, dk, dv, dctx, q, k, v, probs, heads, scale, a->p, a->seed, a->offset);
}

int bl_attention_backward(bl_tensor *dq, bl_tensor *dk, bl_tensor *dv, const bl_tensor *dctx,
                          const bl_attention_args *a) {
  if (!a) return BL_ERR("attention_backward: args is NULL");
  return a->offsets ? packed_backward(dq, dk, dv, dctx, a) : padded_backward(dq, dk, dv, dctx, a);
}

/* What forward saves: the CPU op's probabilities, or the flash-style CUDA kernel's row logsumexp. */
int bl_attention_saved_shape(int device, int64_t batch, int64_t seq, int heads, int64_t *shape) {
  if (!shape) return BL_ERR("attention_saved_shape: shape is NULL");
  shape[0] = batch;
  shape[1] = heads;
  shape[2] = seq;
  shape[3] = seq;
  return device >= 0 ? 3 : 4;
}
