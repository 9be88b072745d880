/* Shared plumbing for the CPU ops: argument checks with messages that name
 * the op and the shapes, f32 scratch images of non-f32 or strided tensors,
 * index loading, and the Philox dropout keep-mask used by every op that
 * drops (dropout.c, attention.c, layernorm.c). See ops_internal.h. */
#include "ops_internal.h"
#include "bl_ops.h"
#include "base/vecmath.h"
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#if OPX_MULTI_ISA
#include <immintrin.h>
#endif

const char *opx_shape(const bl_tensor *t, char *buf, size_t n) {
  if (!t) {
    snprintf(buf, n, "(null)");
    return buf;
  }
  size_t k = 0;
  k += (size_t)snprintf(buf + k, n - k, "[");
  for (int d = 0; d < t->ndim && d < BL_MAX_DIMS && k < n; d++)
    k += (size_t)snprintf(buf + k, n - k, d ? ",%lld" : "%lld", (long long)t->shape[d]);
  if (k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

int opx_check(const char *op, const bl_tensor *t, const char *name) {
  if (!t) return BL_ERR("%s: %s is NULL", op, name);
  if (t->ndim < 0 || t->ndim > BL_MAX_DIMS) return BL_ERR("%s: %s has invalid ndim %d", op, name, t->ndim);
  if (!t->storage) return BL_ERR("%s: %s was released", op, name);
  if (t->numel > 0 && !t->data) return BL_ERR("%s: %s has no data", op, name);
  if (t->dtype < 0 || t->dtype >= BL_NUM_DTYPES) return BL_ERR("%s: %s has invalid dtype %d", op, name, t->dtype);
  return 0;
}

int opx_check_float(const char *op, const bl_tensor *t, const char *name) {
  BL_CHECK(opx_check(op, t, name));
  if (t->dtype != BL_F32 && t->dtype != BL_F64 && t->dtype != BL_F16 && t->dtype != BL_BF16)
    return BL_ERR("%s: %s must be f32/f64/f16/bf16, got %s", op, name, bl_dtype_name(t->dtype));
  return 0;
}

int opx_check_index(const char *op, const bl_tensor *t, const char *name) {
  BL_CHECK(opx_check(op, t, name));
  if (t->dtype != BL_I32 && t->dtype != BL_I64)
    return BL_ERR("%s: %s must be i32 or i64, got %s", op, name, bl_dtype_name(t->dtype));
  return 0;
}

static const char *dev_name(int d, char *buf, size_t n) {
  if (d < 0)
    snprintf(buf, n, "cpu");
  else
    snprintf(buf, n, "cuda:%d", d);
  return buf;
}

int opx_device(const char *op, int n, const bl_tensor *const *ts, int *dev) {
  int d = -2;
  for (int i = 0; i < n; i++) {
    if (!ts[i]) continue;
    if (d == -2)
      d = ts[i]->device;
    else if (ts[i]->device != d) {
      char a[16], b[16];
      return BL_ERR("%s: tensors are on different devices (%s and %s)", op, dev_name(d, a, sizeof a),
                    dev_name(ts[i]->device, b, sizeof b));
    }
  }
  *dev = d == -2 ? -1 : d;
  return 0;
}

int64_t opx_cols(const bl_tensor *t) { return t->ndim ? t->shape[t->ndim - 1] : 1; }
int64_t opx_rows(const bl_tensor *t) {
  int64_t r = 1;
  for (int d = 0; d + 1 < t->ndim; d++) r *= t->shape[d];
  return r;
}
int opx_same_shape(const bl_tensor *a, const bl_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return 0;
  return 1;
}

static int is_contig(const bl_tensor *t) {
  int64_t s = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != 1 && t->stride[d] != s) return 0;
    s *= t->shape[d];
  }
  return 1;
}

/* Walk t in row-major order, one innermost row at a time: calls back with
 * the element offset of the row start, its stride and length. Kept out of the
 * per-element path: the dtype switch happens once per row. */
static void to_f32_row(const bl_tensor *t, int64_t off, int64_t st, int64_t len, float *dst) {
  switch (t->dtype) {
    case BL_F32: {
      const float *s = (const float *)t->data + off;
      for (int64_t i = 0; i < len; i++) dst[i] = s[i * st];
      break;
    }
    case BL_F64: {
      const double *s = (const double *)t->data + off;
      for (int64_t i = 0; i < len; i++) dst[i] = (float)s[i * st];
      break;
    }
    case BL_F16: {
      const uint16_t *s = (const uint16_t *)t->data + off;
      for (int64_t i = 0; i < len; i++) dst[i] = opx_h2f(s[i * st]);
      break;
    }
    case BL_BF16: {
      const uint16_t *s = (const uint16_t *)t->data + off;
      for (int64_t i = 0; i < len; i++) dst[i] = opx_bf2f(s[i * st]);
      break;
    }
    default: break;
  }
}
static void from_f32_row(bl_tensor *t, int64_t off, int64_t st, int64_t len, const float *src) {
  switch (t->dtype) {
    case BL_F32: {
      float *s = (float *)t->data + off;
      for (int64_t i = 0; i < len; i++) s[i * st] = src[i];
      break;
    }
    case BL_F64: {
      double *s = (double *)t->data + off;
      for (int64_t i = 0; i < len; i++) s[i * st] = src[i];
      break;
    }
    case BL_F16: {
      uint16_t *s = (uint16_t *)t->data + off;
      for (int64_t i = 0; i < len; i++) s[i * st] = opx_f2h(src[i]);
      break;
    }
    case BL_BF16: {
      uint16_t *s = (uint16_t *)t->data + off;
      for (int64_t i = 0; i < len; i++) s[i * st] = opx_f2bf(src[i]);
      break;
    }
    default: break;
  }
}

static void convert(bl_tensor *t, float *buf, int load) {
  if (t->numel == 0) return;
  int nd = t->ndim;
  int64_t len = nd ? t->shape[nd - 1] : 1, st = nd ? t->stride[nd - 1] : 1;
  int64_t rows = t->numel / len, idx[BL_MAX_DIMS] = { 0 };
  for (int64_t r = 0; r < rows; r++) {
    int64_t off = 0;
    for (int d = 0; d + 1 < nd; d++) off += idx[d] * t->stride[d];
    if (load)
      to_f32_row(t, off, st, len, buf + r * len);
    else
      from_f32_row(t, off, st, len, buf + r * len);
    for (int d = nd - 2; d >= 0; d--) {
      if (++idx[d] < t->shape[d]) break;
      idx[d] = 0;
    }
  }
}

int opx_load(const char *op, const bl_tensor *t, opx_buf *b) {
  b->n = t->numel;
  b->owned = 0;
  b->p = NULL;
  if (t->dtype == BL_F32 && is_contig(t)) {
    b->p = (float *)t->data;
    return 0;
  }
  b->p = malloc((size_t)(t->numel ? t->numel : 1) * sizeof(float));
  if (!b->p) return bl_set_error(BL_ENOMEM, "%s: out of memory for a %lld-element scratch", op, (long long)t->numel);
  b->owned = 1;
  convert((bl_tensor *)t, b->p, 1);
  return 0;
}

int opx_out(const char *op, bl_tensor *t, opx_buf *b, int keep) {
  b->n = t->numel;
  b->owned = 0;
  b->p = NULL;
  if (t->dtype == BL_F32 && is_contig(t)) {
    b->p = (float *)t->data;
    return 0;
  }
  b->p = malloc((size_t)(t->numel ? t->numel : 1) * sizeof(float));
  if (!b->p) return bl_set_error(BL_ENOMEM, "%s: out of memory for a %lld-element scratch", op, (long long)t->numel);
  b->owned = 1;
  if (keep) convert(t, b->p, 1);
  return 0;
}

void opx_store(bl_tensor *t, opx_buf *b) {
  if (b->owned && b->p) convert(t, b->p, 0);
  opx_free(b);
}

void opx_free(opx_buf *b) {
  if (b->owned) free(b->p);
  b->p = NULL;
  b->owned = 0;
}

int opx_load_ids(const char *op, const bl_tensor *t, int64_t **ids) {
  int64_t n = t->numel;
  int64_t *o = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
  if (!o) return bl_set_error(BL_ENOMEM, "%s: out of memory for %lld indices", op, (long long)n);
  int nd = t->ndim, idx[BL_MAX_DIMS] = { 0 };
  for (int64_t i = 0; i < n; i++) {
    int64_t off = 0;
    for (int d = 0; d < nd; d++) off += idx[d] * t->stride[d];
    o[i] = t->dtype == BL_I32 ? ((const int32_t *)t->data)[off] : ((const int64_t *)t->data)[off];
    for (int d = nd - 1; d >= 0; d--) {
      if (++idx[d] < t->shape[d]) break;
      idx[d] = 0;
    }
  }
  *ids = o;
  return 0;
}

/* Whole counter blocks in one vectorisable loop (vm_philox is bl_philox_block
 * vectorised; test_ops_vecmath checks they agree), the ragged ends one block at
 * a time. Each block gives 4 consecutive keep bytes. */
OPX_BODY keep_blocks_body(uint32_t k0, uint32_t k1, uint64_t ctr, int64_t nblk, uint32_t thr, uint8_t *restrict keep) {
#pragma omp simd
  for (int64_t l = 0; l < nblk; l++) {
    uint32_t o0, o1, o2, o3;
    vm_philox(k0, k1, ctr + (uint64_t)l, &o0, &o1, &o2, &o3);
    /* 4 bytes as one 32-bit store, in element order */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    uint32_t w = (uint32_t)((o3 >> 8) >= thr) | (uint32_t)((o2 >> 8) >= thr) << 8 | (uint32_t)((o1 >> 8) >= thr) << 16 |
                 (uint32_t)((o0 >> 8) >= thr) << 24;
#else
    uint32_t w = (uint32_t)((o0 >> 8) >= thr) | (uint32_t)((o1 >> 8) >= thr) << 8 | (uint32_t)((o2 >> 8) >= thr) << 16 |
                 (uint32_t)((o3 >> 8) >= thr) << 24;
#endif
    memcpy(keep + 4 * l, &w, 4);
  }
}

#if OPX_MULTI_ISA
/* each lane's keep bit (o >> 8) > t at bit sh of the lane's word */
OPX_TARGET_AVX2 static inline __m256i keep_bits_avx2(__m256i o, __m256i t, int sh) {
  return _mm256_and_si256(_mm256_cmpgt_epi32(_mm256_srli_epi32(o, 8), t), _mm256_set1_epi32(1 << sh));
}

/* Philox-4x32-10 on 8 counters at once on AVX2, one per 32-bit lane. The loop above vectorises in 64-bit
 * lanes (for the 32x32->64 products), 4 counters per vector, and on AVX2 ran 3x slower per mask byte than
 * on AVX-512 (the masks were 2.4 % of a capped base training step). Here the even and odd lanes take one
 * widening multiply each and blends put the high and low halves back into 32-bit lanes; the key schedule is
 * the same in every lane. Each lane's 4 outputs become its 4 keep bytes (one little-endian word), stored in
 * counter order. A vector whose counters' low words would wrap, and the last nblk % 8 blocks, go to the
 * scalar loop. (o >> 8) >= thr is tested as the signed (o >> 8) > thr - 1: both sides are below 2^24, and
 * thr = 0 keeps everything. */
OPX_TARGET_AVX2 static inline void philox8_keep(uint32_t k0, uint32_t k1, uint64_t ctr, int64_t nblk, uint32_t thr,
                                                uint8_t *restrict keep) {
  const __m256i m0 = _mm256_set1_epi32((int)BL_PHILOX_M0), m1 = _mm256_set1_epi32((int)BL_PHILOX_M1);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), t = _mm256_set1_epi32((int)thr - 1);
  int64_t l = 0;
  for (; l + 8 <= nblk; l += 8) {
    uint64_t c = ctr + (uint64_t)l;
    if ((uint32_t)c > 0xFFFFFFFFu - 7) break;
    __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)c), lane);
    __m256i c1 = _mm256_set1_epi32((int)(uint32_t)(c >> 32)), c2 = _mm256_setzero_si256(), c3 = c2;
    uint32_t a = k0, b = k1;
    for (int r = 0; r < 10; r++) {
      __m256i e0 = _mm256_mul_epu32(c0, m0), d0 = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), m0);
      __m256i e1 = _mm256_mul_epu32(c2, m1), d1 = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), m1);
      __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(e0, 32), d0, 0xAA);
      __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(e1, 32), d1, 0xAA);
      c1 = _mm256_xor_si256(c1, _mm256_set1_epi32((int)a));
      c3 = _mm256_xor_si256(c3, _mm256_set1_epi32((int)b));
      __m256i n0 = _mm256_xor_si256(hi1, c1), n2 = _mm256_xor_si256(hi0, c3);
      c1 = _mm256_blend_epi32(e1, _mm256_slli_epi64(d1, 32), 0xAA);
      c3 = _mm256_blend_epi32(e0, _mm256_slli_epi64(d0, 32), 0xAA);
      c0 = n0;
      c2 = n2;
      a += BL_PHILOX_W0;
      b += BL_PHILOX_W1;
    }
    __m256i w = _mm256_or_si256(keep_bits_avx2(c0, t, 0), keep_bits_avx2(c1, t, 8));
    w = _mm256_or_si256(w, _mm256_or_si256(keep_bits_avx2(c2, t, 16), keep_bits_avx2(c3, t, 24)));
    _mm256_storeu_si256((__m256i *)(keep + 4 * l), w);
  }
  if (l < nblk) keep_blocks_body(k0, k1, ctr + (uint64_t)l, nblk - l, thr, keep + 4 * l);
}

/* The same on AVX-512, 16 counters per vector: twice the loop above's counters per instruction (it runs the
 * 64-bit-lane form, 8 per vector), the blends as mask moves, the three-way XORs as one ternary-logic op and
 * the threshold as an unsigned compare into a mask (the masks were 4 % of a BERT-mini training step). The
 * last nblk % 16 blocks are one more vector with a masked store (attention rows of 112 keys are 28 blocks);
 * only a vector whose counters' low words would wrap goes to the loop above. */
OPX_TARGET_AVX512 static inline void philox16_keep(uint32_t k0, uint32_t k1, uint64_t ctr, int64_t nblk, uint32_t thr,
                                                   uint8_t *restrict keep) {
  const __m512i m0 = _mm512_set1_epi32((int)BL_PHILOX_M0), m1 = _mm512_set1_epi32((int)BL_PHILOX_M1);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i t = _mm512_set1_epi32((int)thr);
  const __mmask16 odd = 0xAAAA;
  int64_t l = 0;
  for (; l < nblk; l += 16) {
    const int64_t left = nblk - l < 16 ? nblk - l : 16; /* the last vector's lanes past nblk are not stored */
    uint64_t c = ctr + (uint64_t)l;
    if ((uint32_t)c > 0xFFFFFFFFu - (uint32_t)(left - 1)) break;
    __m512i c0 = _mm512_add_epi32(_mm512_set1_epi32((int)(uint32_t)c), lane);
    __m512i c1 = _mm512_set1_epi32((int)(uint32_t)(c >> 32)), c2 = _mm512_setzero_si512(), c3 = c2;
    uint32_t a = k0, b = k1;
    for (int r = 0; r < 10; r++) {
      __m512i e0 = _mm512_mul_epu32(c0, m0), d0 = _mm512_mul_epu32(_mm512_srli_epi64(c0, 32), m0);
      __m512i e1 = _mm512_mul_epu32(c2, m1), d1 = _mm512_mul_epu32(_mm512_srli_epi64(c2, 32), m1);
      __m512i hi0 = _mm512_mask_mov_epi32(_mm512_srli_epi64(e0, 32), odd, d0);
      __m512i hi1 = _mm512_mask_mov_epi32(_mm512_srli_epi64(e1, 32), odd, d1);
      c0 = _mm512_ternarylogic_epi32(hi1, c1, _mm512_set1_epi32((int)a), 0x96);
      c2 = _mm512_ternarylogic_epi32(hi0, c3, _mm512_set1_epi32((int)b), 0x96);
      c1 = _mm512_mask_mov_epi32(e1, odd, _mm512_slli_epi64(d1, 32));
      c3 = _mm512_mask_mov_epi32(e0, odd, _mm512_slli_epi64(d0, 32));
      a += BL_PHILOX_W0;
      b += BL_PHILOX_W1;
    }
    const __m512i one = _mm512_set1_epi32(1);
    __m512i w = _mm512_maskz_mov_epi32(_mm512_cmpge_epu32_mask(_mm512_srli_epi32(c0, 8), t), one);
    w = _mm512_mask_or_epi32(w, _mm512_cmpge_epu32_mask(_mm512_srli_epi32(c1, 8), t), w, _mm512_slli_epi32(one, 8));
    w = _mm512_mask_or_epi32(w, _mm512_cmpge_epu32_mask(_mm512_srli_epi32(c2, 8), t), w, _mm512_slli_epi32(one, 16));
    w = _mm512_mask_or_epi32(w, _mm512_cmpge_epu32_mask(_mm512_srli_epi32(c3, 8), t), w, _mm512_slli_epi32(one, 24));
    if (left == 16)
      _mm512_storeu_si512((void *)(keep + 4 * l), w);
    else
      _mm512_mask_storeu_epi32((void *)(keep + 4 * l), (__mmask16)((1u << left) - 1), w);
  }
  if (l < nblk) keep_blocks_body(k0, k1, ctr + (uint64_t)l, nblk - l, thr, keep + 4 * l);
}

#else
#define philox8_keep  keep_blocks_body
#define philox16_keep keep_blocks_body
#endif
OPX_ISA_DISPATCH(keep_blocks,
                 (uint32_t k0, uint32_t k1, uint64_t ctr, int64_t nblk, uint32_t thr, uint8_t *restrict keep),
                 (k0, k1, ctr, nblk, thr, keep), philox16_keep, philox8_keep, keep_blocks_body)

int opx_seed_check(const char *op, double p, uint64_t seed) {
  if (p <= 0 || !(seed & BL_SEED_SLOT)) return 0;
  return bl_set_error(BL_EINVAL,
                      "%s: seed 0x%llx is a device seed slot (bit 63 set): only CUDA tensors read one; "
                      "a CPU dropout seed must be below 2^63",
                      op, (unsigned long long)seed);
}

/* x *= s over n elements, on the ISA in use */
OPX_BODY scale_row_body(int64_t n, float *restrict x, float s) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}
OPX_ISA_FN(scale_row, (int64_t n, float *restrict x, float s), (n, x, s))
void opx_scale_row(int64_t n, float *x, float s) { scale_row(n, x, s); }

void opx_dropout_keep(uint64_t seed, uint64_t offset, int64_t start, int64_t n, float p, uint8_t *keep) {
  /* keep = (x >> 8) * 2^-24 >= p  <=>  (x >> 8) >= ceil(p * 2^24): both sides
   * are exact in float (24-bit integers times a power of two), so the integer
   * threshold gives the same mask without a float per element. */
  double tp = ceil((double)p * 16777216.0);
  uint32_t thr = tp <= 0 ? 0 : (uint32_t)tp;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32), r[4];
  int64_t i = 0;
  /* head: up to the next block boundary */
  while (i < n && ((start + i) & 3)) {
    int64_t e = start + i;
    bl_philox4x32(seed, offset + (uint64_t)(e >> 2), r);
    for (int lane = (int)(e & 3); lane < 4 && i < n; lane++, i++) keep[i] = (r[lane] >> 8) >= thr;
  }
  int64_t nblk = (n - i) / 4;
  if (nblk > 0) {
    keep_blocks(k0, k1, offset + (uint64_t)((start + i) >> 2), nblk, thr, keep + i);
    i += 4 * nblk;
  }
  if (i < n) { /* tail: a partial block */
    bl_philox4x32(seed, offset + (uint64_t)((start + i) >> 2), r);
    for (int lane = 0; i < n; lane++, i++) keep[i] = (r[lane] >> 8) >= thr;
  }
}

int opx_check_p(const char *op, double p) {
  if (!(p >= 0.0 && p < 1.0)) return BL_ERR("%s: dropout probability %g must be in [0, 1)", op, p);
  return 0;
}

/* Token offsets [B+1] of packed sequences (i32/i64 on the CPU) into a new array; checks they start at 0, never
 * decrease and end at T. *maxlen gets the longest sequence. */
int opx_load_offsets(const char *op, const bl_tensor *o, int64_t T, int64_t **out, int64_t *maxlen) {
  BL_CHECK(opx_check_index(op, o, "offsets"));
  if (o->ndim != 1 || o->shape[0] < 1)
    return BL_ERR("%s: offsets must be [batch + 1] (token offsets of each sequence), got %s", op, OPX_SHAPE(o));
  int64_t n = o->shape[0], *a = malloc((size_t)n * sizeof(int64_t));
  if (!a) return bl_set_error(BL_ENOMEM, "%s: out of memory for the offsets", op);
  *maxlen = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t off = i * o->stride[0];
    a[i] = o->dtype == BL_I32 ? ((const int32_t *)o->data)[off] : ((const int64_t *)o->data)[off];
    int64_t len = i > 0 ? a[i] - a[i - 1] : 0;
    if ((i == 0 && a[0] != 0) || len < 0 || (i == n - 1 && a[i] != T)) {
      const long long bad = (long long)a[i];
      free(a);
      return BL_ERR("%s: offsets must rise from 0 to the %lld packed tokens; entry %lld is %lld", op, (long long)T,
                    (long long)i, bad);
    }
    if (len > *maxlen) *maxlen = len;
  }
  *out = a;
  return 0;
}

int opx_packed_rows(const char *op, const bl_tensor *offsets, int64_t T, int64_t seq, int64_t **rows) {
  int64_t *off, maxlen;
  BL_CHECK(opx_load_offsets(op, offsets, T, &off, &maxlen));
  if (seq < 1 || maxlen > seq) {
    free(off);
    return BL_ERR("%s: a sequence has %lld tokens, more than the padded length %lld", op, (long long)maxlen,
                  (long long)seq);
  }
  int64_t *r = malloc((size_t)(T > 0 ? T : 1) * sizeof(int64_t));
  if (!r) {
    free(off);
    return bl_set_error(BL_ENOMEM, "%s: out of memory for the packed rows", op);
  }
  for (int64_t b = 0; b + 1 < offsets->shape[0]; b++)
    for (int64_t t = off[b]; t < off[b + 1]; t++) r[t] = b * seq + (t - off[b]);
  free(off);
  *rows = r;
  return 0;
}
