/* Fused scaled dot-product self-attention on [B, S, H] tensors (contract in
 * bl_ops.h): scores, key-padding mask, softmax, dropout and context in one
 * pass per (batch, head), parallel over batch*heads with OpenMP.
 *
 * Why no sgemm here: the per-head products are small (S x S x d) and would
 * be called from inside the OpenMP loop; the pthread build of OpenBLAS then
 * spawns its own threads per call (oversubscription, and concurrent calls
 * into its thread server are a known hazard). Instead every product is
 * written as rows of axpy's over contiguous memory (K and V are transposed
 * into a per-item scratch where needed), which the compiler vectorises, and
 * each (b, h) item is computed by one thread: results are bitwise identical
 * for any thread count. Attention is ~3% of BERT's FLOPs at S=128 and ~11%
 * at S=512, the linears (OpenBLAS) dominate. */
#include "ops_internal.h"
#include <math.h>
#include <stdlib.h>

/* [B, S, H] operand with unit stride in H: element (b, s, c) at p[b*sb + s*ss + c]. */
typedef struct bsh {
  float *p;
  int64_t sb, ss;
  opx_buf buf;
} bsh;

static int bsh_in_place(const bl_tensor *t) { return t->dtype == BL_F32 && (t->shape[2] == 1 || t->stride[2] == 1); }

static int bsh_load(const char *op, const bl_tensor *t, bsh *m) {
  m->buf.owned = 0; m->buf.p = NULL;
  if (bsh_in_place(t)) { m->p = (float *)t->data; m->sb = t->stride[0]; m->ss = t->stride[1]; return 0; }
  BL_CHECK(opx_load(op, t, &m->buf));
  m->p = m->buf.p; m->ss = t->shape[2]; m->sb = t->shape[1] * t->shape[2];
  return 0;
}

static int bsh_out(const char *op, bl_tensor *t, bsh *m) {
  m->buf.owned = 0; m->buf.p = NULL;
  if (bsh_in_place(t)) { m->p = (float *)t->data; m->sb = t->stride[0]; m->ss = t->stride[1]; return 0; }
  BL_CHECK(opx_out(op, t, &m->buf, 0));
  m->p = m->buf.p; m->ss = t->shape[2]; m->sb = t->shape[1] * t->shape[2];
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
    return BL_ERR("%s: hidden size %lld of query %s is not divisible by %d heads", op,
                  (long long)q->shape[2], OPX_SHAPE(q), heads);
  BL_CHECK(opx_check(op, probs, "probs"));
  int64_t b = q->shape[0], s = q->shape[1];
  if (probs->dtype != BL_F32 || probs->ndim != 4 || probs->shape[0] != b || probs->shape[1] != heads ||
      probs->shape[2] != s || probs->shape[3] != s || !bl_tensor_is_contiguous(probs))
    return BL_ERR("%s: probs must be a contiguous f32 [%lld,%d,%lld,%lld] tensor, got %s %s", op, (long long)b,
                  heads, (long long)s, (long long)s, bl_dtype_name(probs->dtype), OPX_SHAPE(probs));
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

/* y[0..n) += a * x[0..n) */
static inline void axpy(int64_t n, float a, const float *restrict x, float *restrict y) {
  for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static int attention_fwd_cpu(bl_tensor *ctx, bl_tensor *probs, const bl_tensor *q, const bl_tensor *k,
                             const bl_tensor *v, const bl_tensor *key_mask, int heads, double scale, double p,
                             uint64_t seed, uint64_t offset) {
  const char *op = "attention";
  int64_t B = q->shape[0], S = q->shape[1], H = q->shape[2], d = H / heads;
  bsh mq, mk, mv, mc;
  float *madd = NULL;
  int rc = 0, oom = 0;
  mq.buf.owned = mk.buf.owned = mv.buf.owned = mc.buf.owned = 0;
  if ((rc = bsh_load(op, q, &mq)) || (rc = bsh_load(op, k, &mk)) || (rc = bsh_load(op, v, &mv)) ||
      (rc = bsh_out(op, ctx, &mc)) || (key_mask && (rc = load_key_mask(op, key_mask, B, S, &madd))))
    goto done;
  const float sc = (float)scale, dscale = p > 0 ? (float)(1.0 / (1.0 - p)) : 1.0f;
  float *P = (float *)probs->data;
  #pragma omp parallel for schedule(dynamic, 1) if (B * heads > 1 && B * heads * S * S * d > 32768)
  for (int64_t bh = 0; bh < B * heads; bh++) {
    int64_t b = bh / heads, h = bh % heads;
    float *kt = malloc((size_t)(d * S) * sizeof(float));
    float *pd = p > 0 ? malloc((size_t)(S * S) * sizeof(float)) : NULL;
    uint8_t *keep = p > 0 ? malloc((size_t)(S * S)) : NULL;
    if (!kt || (p > 0 && (!pd || !keep))) {
      #pragma omp atomic write
      oom = 1;
      free(kt); free(pd); free(keep);
      continue;
    }
    const float *qb = mq.p + b * mq.sb + h * d, *kb = mk.p + b * mk.sb + h * d, *vb = mv.p + b * mv.sb + h * d;
    float *cb = mc.p + b * mc.sb + h * d, *pb = P + bh * S * S;
    for (int64_t j = 0; j < S; j++)
      for (int64_t c = 0; c < d; c++) kt[c * S + j] = kb[j * mk.ss + c];
    if (keep) opx_dropout_keep(seed, offset, bh * S * S, S * S, (float)p, keep);
    for (int64_t i = 0; i < S; i++) {
      float *row = pb + i * S;
      const float *qi = qb + i * mq.ss;
      if (madd) memcpy(row, madd + b * S, (size_t)S * sizeof(float));
      else memset(row, 0, (size_t)S * sizeof(float));
      for (int64_t c = 0; c < d; c++) axpy(S, qi[c] * sc, kt + c * S, row);
      float mx = -INFINITY, sum = 0.0f;
      for (int64_t j = 0; j < S; j++) mx = row[j] > mx ? row[j] : mx;
      for (int64_t j = 0; j < S; j++) { float e = expf(row[j] - mx); row[j] = e; sum += e; }
      float inv = 1.0f / sum;
      for (int64_t j = 0; j < S; j++) row[j] *= inv;
      const float *use = row;
      if (keep) {
        float *dr = pd + i * S;
        const uint8_t *kr = keep + i * S;
        for (int64_t j = 0; j < S; j++) dr[j] = kr[j] ? row[j] * dscale : 0.0f;
        use = dr;
      }
      float *ci = cb + i * mc.ss;
      memset(ci, 0, (size_t)d * sizeof(float));
      for (int64_t j = 0; j < S; j++) if (use[j] != 0.0f) axpy(d, use[j], vb + j * mv.ss, ci);
    }
    free(kt); free(pd); free(keep);
  }
  if (oom) { rc = bl_set_error(BL_ENOMEM, "%s: out of memory for per-head scratch", op); goto done; }
  opx_store(ctx, &mc.buf);
done:
  opx_free(&mq.buf); opx_free(&mk.buf); opx_free(&mv.buf); opx_free(&mc.buf); free(madd);
  return rc;
}

int bl_attention_forward(bl_tensor *ctx, bl_tensor *probs, const bl_tensor *q, const bl_tensor *k,
                         const bl_tensor *v, const bl_tensor *key_mask, int heads, double scale,
                         double p, uint64_t seed, uint64_t offset) {
  const char *op = "attention";
  BL_CHECK(check_common(op, q, k, v, probs, heads, p));
  BL_CHECK(check_bsh(op, ctx, "context", q));
  if (key_mask) {
    BL_CHECK(opx_check(op, key_mask, "key_mask"));
    if (key_mask->ndim != 2 || key_mask->shape[0] != q->shape[0] || key_mask->shape[1] != q->shape[1])
      return BL_ERR("%s: key_mask %s must be [batch, seq] of query %s", op, OPX_SHAPE(key_mask), OPX_SHAPE(q));
  }
  if (scale <= 0) scale = 1.0 / sqrt((double)(q->shape[2] / heads));
  int dev;
  const bl_tensor *ts[] = {ctx, probs, q, k, v, key_mask};
  BL_CHECK(opx_device(op, 6, ts, &dev));
  if (dev >= 0) return opx_no_cuda(op, dev);
  return attention_fwd_cpu(ctx, probs, q, k, v, key_mask, heads, scale, p, seed, offset);
}

static int attention_bwd_cpu(bl_tensor *dq, bl_tensor *dk, bl_tensor *dv, const bl_tensor *dctx,
                             const bl_tensor *q, const bl_tensor *k, const bl_tensor *v, const bl_tensor *probs,
                             int heads, double scale, double p, uint64_t seed, uint64_t offset) {
  const char *op = "attention_backward";
  int64_t B = q->shape[0], S = q->shape[1], H = q->shape[2], d = H / heads;
  bsh mq, mk, mv, mo, mdq, mdk, mdv;
  int rc = 0, oom = 0;
  mq.buf.owned = mk.buf.owned = mv.buf.owned = mo.buf.owned = mdq.buf.owned = mdk.buf.owned = mdv.buf.owned = 0;
  if ((rc = bsh_load(op, q, &mq)) || (rc = bsh_load(op, k, &mk)) || (rc = bsh_load(op, v, &mv)) ||
      (rc = bsh_load(op, dctx, &mo)) || (rc = bsh_out(op, dq, &mdq)) || (rc = bsh_out(op, dk, &mdk)) ||
      (rc = bsh_out(op, dv, &mdv)))
    goto done;
  const float sc = (float)scale, dscale = p > 0 ? (float)(1.0 / (1.0 - p)) : 1.0f;
  const float *P = (const float *)probs->data;
  #pragma omp parallel for schedule(dynamic, 1) if (B * heads > 1 && B * heads * S * S * d > 32768)
  for (int64_t bh = 0; bh < B * heads; bh++) {
    int64_t b = bh / heads, h = bh % heads;
    float *vt = malloc((size_t)(d * S) * sizeof(float));
    float *ds = malloc((size_t)(S * S) * sizeof(float));
    uint8_t *keep = p > 0 ? malloc((size_t)(S * S)) : NULL;
    if (!vt || !ds || (p > 0 && !keep)) {
      #pragma omp atomic write
      oom = 1;
      free(vt); free(ds); free(keep);
      continue;
    }
    const float *qb = mq.p + b * mq.sb + h * d, *kb = mk.p + b * mk.sb + h * d, *vb = mv.p + b * mv.sb + h * d;
    const float *ob = mo.p + b * mo.sb + h * d, *pb = P + bh * S * S;
    float *dqb = mdq.p + b * mdq.sb + h * d, *dkb = mdk.p + b * mdk.sb + h * d, *dvb = mdv.p + b * mdv.sb + h * d;
    for (int64_t j = 0; j < S; j++)
      for (int64_t c = 0; c < d; c++) vt[c * S + j] = vb[j * mv.ss + c];
    if (keep) opx_dropout_keep(seed, offset, bh * S * S, S * S, (float)p, keep);
    for (int64_t j = 0; j < S; j++) {
      memset(dvb + j * mdv.ss, 0, (size_t)d * sizeof(float));
      memset(dkb + j * mdk.ss, 0, (size_t)d * sizeof(float));
    }
    for (int64_t i = 0; i < S; i++) {
      const float *pr = pb + i * S, *oi = ob + i * mo.ss;
      const uint8_t *kr = keep ? keep + i * S : NULL;
      float *dr = ds + i * S;
      /* dV[j] += Pdrop[i,j] dctx[i];  dPdrop[i,:] = dctx[i] . V^T */
      for (int64_t j = 0; j < S; j++) {
        float pdj = kr ? (kr[j] ? pr[j] * dscale : 0.0f) : pr[j];
        if (pdj != 0.0f) axpy(d, pdj, oi, dvb + j * mdv.ss);
      }
      memset(dr, 0, (size_t)S * sizeof(float));
      for (int64_t c = 0; c < d; c++) axpy(S, oi[c], vt + c * S, dr);
      if (kr) for (int64_t j = 0; j < S; j++) dr[j] = kr[j] ? dr[j] * dscale : 0.0f;
      /* softmax backward, then fold in the score scale */
      float dot = 0.0f;
      for (int64_t j = 0; j < S; j++) dot += dr[j] * pr[j];
      for (int64_t j = 0; j < S; j++) dr[j] = pr[j] * (dr[j] - dot) * sc;
      float *dqi = dqb + i * mdq.ss;
      const float *qi = qb + i * mq.ss;
      memset(dqi, 0, (size_t)d * sizeof(float));
      for (int64_t j = 0; j < S; j++) {
        if (dr[j] == 0.0f) continue;
        axpy(d, dr[j], kb + j * mk.ss, dqi);
        axpy(d, dr[j], qi, dkb + j * mdk.ss);
      }
    }
    free(vt); free(ds); free(keep);
  }
  if (oom) { rc = bl_set_error(BL_ENOMEM, "%s: out of memory for per-head scratch", op); goto done; }
  opx_store(dq, &mdq.buf); opx_store(dk, &mdk.buf); opx_store(dv, &mdv.buf);
done:
  opx_free(&mq.buf); opx_free(&mk.buf); opx_free(&mv.buf); opx_free(&mo.buf);
  opx_free(&mdq.buf); opx_free(&mdk.buf); opx_free(&mdv.buf);
  return rc;
}

int bl_attention_backward(bl_tensor *dq, bl_tensor *dk, bl_tensor *dv, const bl_tensor *dctx,
                          const bl_tensor *q, const bl_tensor *k, const bl_tensor *v,
                          const bl_tensor *probs, int heads, double scale, double p,
                          uint64_t seed, uint64_t offset) {
  const char *op = "attention_backward";
  BL_CHECK(check_common(op, q, k, v, probs, heads, p));
  BL_CHECK(check_bsh(op, dctx, "grad_context", q));
  BL_CHECK(check_bsh(op, dq, "grad_query", q));
  BL_CHECK(check_bsh(op, dk, "grad_key", q));
  BL_CHECK(check_bsh(op, dv, "grad_value", q));
  if (scale <= 0) scale = 1.0 / sqrt((double)(q->shape[2] / heads));
  int dev;
  const bl_tensor *ts[] = {dq, dk, dv, dctx, q, k, v, probs};
  BL_CHECK(opx_device(op, 8, ts, &dev));
  if (dev >= 0) return opx_no_cuda(op, dev);
  return attention_bwd_cpu(dq, dk, dv, dctx, q, k, v, probs, heads, scale, p, seed, offset);
}
