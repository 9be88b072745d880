/* layernorm and the fused dropout + residual + layernorm (contract in
 * bl_ops.h). One CPU implementation serves both: the residual variant first
 * forms s = dropout(x) + residual into the output row (no extra buffer) and
 * normalises it in place; its backward recomputes s from x and residual
 * rather than storing it, since that is one cheap pass over memory already
 * being read, or takes xhat back from the output y when the caller gives it.
 * dgamma/dbeta (and the residual variant's dbias, the column
 * sums of dx) are summed per fixed 32-row chunk and the chunks
 * reduced in order, so results do not depend on the number of threads.
 * Row sums use 16 independent lane accumulators combined in a fixed order
 * (vectorisable without -ffast-math, and the same for every thread count);
 * the row kernels are compiled for AVX-512/AVX2 with runtime dispatch. */
#include "ops_internal.h"
#include "bl_ops.h"
#include "device/dispatch.h"
#include "base/vecmath.h"
#include <math.h>
#include <stdlib.h>

#define LN_CHUNK 32

static int check_ln(const char *op, const bl_tensor *x, const bl_tensor *gamma, const bl_tensor *beta,
                    const bl_tensor *mean, const bl_tensor *rstd) {
  BL_CHECK(opx_check_float(op, x, "input"));
  BL_CHECK(opx_check_float(op, gamma, "gamma"));
  if (beta) BL_CHECK(opx_check_float(op, beta, "beta"));
  BL_CHECK(opx_check(op, mean, "mean"));
  BL_CHECK(opx_check(op, rstd, "rstd"));
  if (x->ndim < 1 || opx_cols(x) < 1) return BL_ERR("%s: input %s must have a non-empty last dim", op, OPX_SHAPE(x));
  int64_t h = opx_cols(x), rows = opx_rows(x);
  if (gamma->ndim != 1 || gamma->shape[0] != h)
    return BL_ERR("%s: gamma %s does not match input %s", op, OPX_SHAPE(gamma), OPX_SHAPE(x));
  if (beta && (beta->ndim != 1 || beta->shape[0] != h))
    return BL_ERR("%s: beta %s does not match input %s", op, OPX_SHAPE(beta), OPX_SHAPE(x));
  if (mean->dtype != BL_F32 || rstd->dtype != BL_F32)
    return BL_ERR("%s: mean and rstd must be f32, got %s and %s", op, bl_dtype_name(mean->dtype),
                  bl_dtype_name(rstd->dtype));
  if (mean->numel != rows || rstd->numel != rows)
    return BL_ERR("%s: mean %s and rstd %s must have %lld elements (rows of input %s)", op, OPX_SHAPE(mean),
                  OPX_SHAPE(rstd), (long long)rows, OPX_SHAPE(x));
  return 0;
}

static int check_same(const char *op, const bl_tensor *t, const char *name, const bl_tensor *x) {
  BL_CHECK(opx_check_float(op, t, name));
  if (!opx_same_shape(t, x)) return BL_ERR("%s: %s %s does not match input %s", op, name, OPX_SHAPE(t), OPX_SHAPE(x));
  return 0;
}

#define LANES 16

/* sum of v[0..n) in LANES interleaved partial sums, combined in a fixed order */
static inline float lane_sum(int64_t n, const float *restrict v) {
  float acc[LANES] = { 0 };
  int64_t j = 0;
  for (; j + LANES <= n; j += LANES) {
#pragma omp simd
    for (int l = 0; l < LANES; l++) acc[l] += v[j + l];
  }
  float t = 0.0f;
  for (; j < n; j++) t += v[j];
  for (int l = 0; l < LANES; l++) t += acc[l];
  return t;
}

/* out = dropout(x) + res over a row of h (keep == NULL: no dropout).
 * always_inline: each OPX_ISA_FN variant gets its own copy compiled for its
 * instruction set, as the loops written out in place were. */
static inline __attribute__((always_inline)) void ln_sum_row(int64_t h, const float *restrict x,
                                                             const float *restrict res, const uint8_t *restrict keep,
                                                             float scale, float *restrict out) {
  if (keep) {
#pragma omp simd
    for (int64_t j = 0; j < h; j++) out[j] = (keep[j] ? x[j] * scale : 0.0f) + res[j];
  } else {
#pragma omp simd
    for (int64_t j = 0; j < h; j++) out[j] = x[j] + res[j];
  }
}

/* One forward row: s = dropout(x) + res (or x) into y, then y = LN(s).
 * keep == NULL: no dropout; res == NULL: plain LayerNorm. */
OPX_BODY ln_fwd_row_body(int64_t h, const float *restrict x, const float *restrict res, const uint8_t *restrict keep,
                         float scale, const float *restrict g, const float *restrict b, float eps, float *restrict y,
                         float *m_out, float *rs_out) {
  const float *s = x;
  if (res) {
    ln_sum_row(h, x, res, keep, scale, y);
    s = y;
  }
  float m = lane_sum(h, s) / (float)h;
  float acc[LANES] = { 0 }, var = 0.0f;
  int64_t j = 0;
  for (; j + LANES <= h; j += LANES) {
#pragma omp simd
    for (int l = 0; l < LANES; l++) {
      float d = s[j + l] - m;
      acc[l] += d * d;
    }
  }
  for (; j < h; j++) {
    float d = s[j] - m;
    var += d * d;
  }
  for (int l = 0; l < LANES; l++) var += acc[l];
  float rs = 1.0f / sqrtf(var / (float)h + eps);
  if (b) {
#pragma omp simd
    for (int64_t k = 0; k < h; k++) y[k] = (s[k] - m) * rs * g[k] + b[k];
  } else {
#pragma omp simd
    for (int64_t k = 0; k < h; k++) y[k] = (s[k] - m) * rs * g[k];
  }
  *m_out = m;
  *rs_out = rs;
}
OPX_ISA_FN(ln_fwd_row,
           (int64_t h, const float *restrict x, const float *restrict res, const uint8_t *restrict keep, float scale,
            const float *restrict g, const float *restrict b, float eps, float *restrict y, float *m_out,
            float *rs_out),
           (h, x, res, keep, scale, g, b, eps, y, m_out, rs_out))

/* One backward row: xh = normalised input (recomputed, or (y - b) / g when y is given),
 * dx = rs (dy g - mean(dy g) - xh mean(dy g xh)),
 * dres = dx before the dropout mask, pg/pb/pc += dy xh / dy / dx (chunk partials of dgamma, dbeta and the
 * preceding linear's bias gradient; all NULL to skip). */
OPX_BODY ln_bwd_row_body(int64_t h, const float *restrict x, const float *restrict res, const float *restrict y,
                         const float *restrict b, const uint8_t *restrict keep, float scale, const float *restrict g,
                         const float *restrict dy, float m, float rs, float *restrict dx, float *restrict dres,
                         float *restrict pg, float *restrict pb, float *restrict pc) {
  /* one pass: xh into dx and the two row sums (the loop body is spelled out
   * per case so that every variant vectorises) */
  float aa[LANES] = { 0 }, ab[LANES] = { 0 }, a = 0.0f, bsum = 0.0f;
  int64_t j0 = h - h % LANES;
#define LN_PASS(XH)                                       \
  for (int64_t j = 0; j < j0; j += LANES) {               \
    _Pragma("omp simd") for (int l = 0; l < LANES; l++) { \
      int64_t k = j + l;                                  \
      float xh = (XH), gj = dy[k] * g[k];                 \
      dx[k] = xh;                                         \
      aa[l] += gj;                                        \
      ab[l] += gj * xh;                                   \
    }                                                     \
  }                                                       \
  for (int64_t k = j0; k < h; k++) {                      \
    float xh = (XH), gj = dy[k] * g[k];                   \
    dx[k] = xh;                                           \
    a += gj;                                              \
    bsum += gj * xh;                                      \
  }
  if (y && b) {
    LN_PASS((y[k] - b[k]) / g[k])
  } else if (y) {
    LN_PASS(y[k] / g[k])
  } else if (res) { /* the sum s = dropout(x) + res first, into dx (a plain loop that vectorises) */
    ln_sum_row(h, x, res, keep, scale, dx);
    LN_PASS((dx[k] - m) * rs)
  } else {
    LN_PASS((x[k] - m) * rs)
  }
#undef LN_PASS
  for (int l = 0; l < LANES; l++) {
    a += aa[l];
    bsum += ab[l];
  }
  if (pg) {
#pragma omp simd
    for (int64_t k = 0; k < h; k++) {
      pg[k] += dy[k] * dx[k];
      pb[k] += dy[k];
    }
  }
  a /= (float)h;
  bsum /= (float)h;
  /* dres = the gradient of the sum; dx = it through the dropout mask (one
   * loop per case: a conditional read of keep inside the loop would not vectorise) */
#define LN_DX (rs * (dy[k] * g[k] - a - dx[k] * bsum))
  if (dres && keep) {
#pragma omp simd
    for (int64_t k = 0; k < h; k++) {
      float v = LN_DX;
      dres[k] = v;
      dx[k] = keep[k] ? v * scale : 0.0f;
    }
  } else if (dres) {
#pragma omp simd
    for (int64_t k = 0; k < h; k++) {
      float v = LN_DX;
      dres[k] = v;
      dx[k] = v;
    }
  } else if (keep) {
#pragma omp simd
    for (int64_t k = 0; k < h; k++) {
      float v = LN_DX;
      dx[k] = keep[k] ? v * scale : 0.0f;
    }
  } else {
#pragma omp simd
    for (int64_t k = 0; k < h; k++) dx[k] = LN_DX;
  }
#undef LN_DX
  if (pc) {
#pragma omp simd
    for (int64_t k = 0; k < h; k++) pc[k] += dx[k];
  }
}
OPX_ISA_FN(ln_bwd_row,
           (int64_t h, const float *restrict x, const float *restrict res, const float *restrict y,
            const float *restrict b, const uint8_t *restrict keep, float scale, const float *restrict g,
            const float *restrict dy, float m, float rs, float *restrict dx, float *restrict dres, float *restrict pg,
            float *restrict pb, float *restrict pc),
           (h, x, res, y, b, keep, scale, g, dy, m, rs, dx, dres, pg, pb, pc))

/* Whether xhat can be taken back from y = xhat g + b in every column (bl_residual_layernorm_backward with y; the
 * CUDA twin tests the same per column): |g| >= 2^-60 and |b| <= 4 |g|; NaN fails. */
static int ln_y_usable(int64_t h, const float *g, const float *b) {
  for (int64_t j = 0; j < h; j++) {
    float bj = b ? b[j] : 0.0f;
    if (!(fabsf(g[j]) >= 0x1p-60f && fabsf(bj) <= 4.0f * fabsf(g[j]))) return 0;
  }
  return 1;
}

/* A thread's dropout mask row of h flags (NULL when p == 0); when p > 0 and
 * the row cannot be had, sets *oom (shared by the threads) and returns NULL. */
static uint8_t *ln_keep_row(double p, int64_t h, int *oom) {
  uint8_t *keep = p > 0 ? malloc((size_t)h) : NULL;
  if (p > 0 && !keep) {
#pragma omp atomic write
    *oom = 1;
  }
  return keep;
}

static int ln_oom_row(const char *op) {
  return bl_set_error(BL_ENOMEM, "%s: out of memory for a dropout mask row", op);
}

static int ln_forward_cpu(const char *op, bl_tensor *y, bl_tensor *mean, bl_tensor *rstd, const bl_tensor *x,
                          const bl_tensor *res, const bl_tensor *gamma, const bl_tensor *beta, double eps, double p,
                          uint64_t seed, uint64_t offset, const int64_t *rmap) {
  opx_buf bx = { 0 }, br = { 0 }, bg = { 0 }, bb = { 0 }, by = { 0 }, bm = { 0 }, bs = { 0 };
  int64_t h = opx_cols(x), rows = opx_rows(x);
  int rc = opx_seed_check(op, p, seed), oom = 0;
  if (rc || (rc = opx_load(op, x, &bx)) || (res && (rc = opx_load(op, res, &br))) || (rc = opx_load(op, gamma, &bg)) ||
      (beta && (rc = opx_load(op, beta, &bb))) || (rc = opx_out(op, y, &by, 0)) || (rc = opx_out(op, mean, &bm, 0)) ||
      (rc = opx_out(op, rstd, &bs, 0)))
    goto done;
  const float scale = p > 0 ? (float)(1.0 / (1.0 - p)) : 1.0f, feps = (float)eps;
/* the dropout mask is made one row at a time into a per-thread buffer
   * (still the documented stream: row r is elements r*h .. r*h+h-1; rmap: packed row r is stream row rmap[r]) */
#pragma omp parallel if (rows * h > 32768)
  {
    uint8_t *keep = ln_keep_row(p, h, &oom);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
      if (p > 0 && !keep) continue;
      if (keep) opx_dropout_keep(seed, offset, (rmap ? rmap[r] : r) * h, h, (float)p, keep);
      ln_fwd_row(h, bx.p + r * h, res ? br.p + r * h : NULL, keep, scale, bg.p, bb.p, feps, by.p + r * h, &bm.p[r],
                 &bs.p[r]);
    }
    free(keep);
  }
  if (oom) {
    rc = ln_oom_row(op);
    goto done;
  }
  opx_store(y, &by);
  opx_store(mean, &bm);
  opx_store(rstd, &bs);
done:
  opx_free(&bx);
  opx_free(&br);
  opx_free(&bg);
  opx_free(&bb);
  opx_free(&by);
  opx_free(&bm);
  opx_free(&bs);
  return rc;
}

/* y, beta: the forward's output and beta for xhat (y NULL: from x and res; also when ln_y_usable says no) */
static int ln_backward_cpu(const char *op, bl_tensor *dx, bl_tensor *dres, bl_tensor *dgamma, bl_tensor *dbeta,
                           bl_tensor *dbias, const bl_tensor *dy, const bl_tensor *y, const bl_tensor *x,
                           const bl_tensor *res, const bl_tensor *gamma, const bl_tensor *beta, const bl_tensor *mean,
                           const bl_tensor *rstd, double p, uint64_t seed, uint64_t offset, const int64_t *rmap) {
  opx_buf bdy = { 0 }, bx = { 0 }, br = { 0 }, by = { 0 }, bg = { 0 }, bb = { 0 }, bm = { 0 }, bs = { 0 }, bdx = { 0 },
          bdr = { 0 }, bdg = { 0 }, bdb = { 0 }, bdc = { 0 };
  float *part = NULL;
  int64_t h = opx_cols(x), rows = opx_rows(x), nchunk = (rows + LN_CHUNK - 1) / LN_CHUNK;
  int want_param = dgamma || dbeta || dbias;
  int rc = opx_seed_check(op, p, seed), oom = 0;
  if (rc || (rc = opx_load(op, gamma, &bg)) || (y && beta && (rc = opx_load(op, beta, &bb)))) goto done;
  if (y && !ln_y_usable(h, bg.p, beta ? bb.p : NULL)) y = NULL;
  if ((rc = opx_load(op, dy, &bdy)) || (y && (rc = opx_load(op, y, &by))) || (!y && (rc = opx_load(op, x, &bx))) ||
      (!y && res && (rc = opx_load(op, res, &br))) || (rc = opx_load(op, mean, &bm)) ||
      (rc = opx_load(op, rstd, &bs)) || (rc = opx_out(op, dx, &bdx, 0)) ||
      (dres && (rc = opx_out(op, dres, &bdr, 0))) || (dgamma && (rc = opx_out(op, dgamma, &bdg, 1))) ||
      (dbeta && (rc = opx_out(op, dbeta, &bdb, 1))) || (dbias && (rc = opx_out(op, dbias, &bdc, 1))))
    goto done;
  if (want_param && nchunk > 0) {
    part = calloc((size_t)(nchunk * 3 * h), sizeof(float));
    if (!part) {
      rc = bl_set_error(BL_ENOMEM, "%s: out of memory for gamma/beta/bias partial sums", op);
      goto done;
    }
  }
  const float scale = p > 0 ? (float)(1.0 / (1.0 - p)) : 1.0f;
#pragma omp parallel if (rows * h > 32768)
  {
    uint8_t *keep = ln_keep_row(p, h, &oom);
#pragma omp for schedule(static)
    for (int64_t c = 0; c < nchunk; c++) {
      if (p > 0 && !keep) continue;
      float *pg = part ? part + c * 3 * h : NULL, *pb = pg ? pg + h : NULL, *pc = pg ? pg + 2 * h : NULL;
      int64_t r1 = (c + 1) * LN_CHUNK < rows ? (c + 1) * LN_CHUNK : rows;
      for (int64_t r = c * LN_CHUNK; r < r1; r++) {
        if (keep) opx_dropout_keep(seed, offset, (rmap ? rmap[r] : r) * h, h, (float)p, keep);
        ln_bwd_row(h, y ? NULL : bx.p + r * h, y || !res ? NULL : br.p + r * h, y ? by.p + r * h : NULL,
                   y && beta ? bb.p : NULL, keep, scale, bg.p, bdy.p + r * h, bm.p[r], bs.p[r], bdx.p + r * h,
                   dres ? bdr.p + r * h : NULL, pg, pb, pc);
      }
    }
    free(keep);
  }
  if (oom) {
    rc = ln_oom_row(op);
    goto done;
  }
  if (part) {
#pragma omp parallel for schedule(static) if (nchunk * h > 65536)
    for (int64_t j = 0; j < h; j++) {
      float sg = 0.0f, sb = 0.0f, sc = 0.0f;
      for (int64_t c = 0; c < nchunk; c++) {
        sg += part[c * 3 * h + j];
        sb += part[c * 3 * h + h + j];
        sc += part[c * 3 * h + 2 * h + j];
      }
      if (bdg.p) bdg.p[j] += sg;
      if (bdb.p) bdb.p[j] += sb;
      if (bdc.p) bdc.p[j] += sc;
    }
  }
  opx_store(dx, &bdx);
  if (dres) opx_store(dres, &bdr);
  if (dgamma) opx_store(dgamma, &bdg);
  if (dbeta) opx_store(dbeta, &bdb);
  if (dbias) opx_store(dbias, &bdc);
done:
  opx_free(&bdy);
  opx_free(&bx);
  opx_free(&br);
  opx_free(&by);
  opx_free(&bg);
  opx_free(&bb);
  opx_free(&bm);
  opx_free(&bs);
  opx_free(&bdx);
  opx_free(&bdr);
  opx_free(&bdg);
  opx_free(&bdb);
  opx_free(&bdc);
  free(part);
  return rc;
}

static int check_eps(const char *op, double eps) {
  if (!(eps > 0.0) || !isfinite(eps)) return BL_ERR("%s: eps %g must be positive", op, eps);
  return 0;
}

int bl_layernorm_forward(bl_tensor *y, bl_tensor *mean, bl_tensor *rstd, const bl_tensor *x, const bl_tensor *gamma,
                         const bl_tensor *beta, double eps) {
  const char *op = "layernorm";
  BL_CHECK(check_ln(op, x, gamma, beta, mean, rstd));
  BL_CHECK(check_same(op, y, "output", x));
  BL_CHECK(check_eps(op, eps));
  int dev;
  const bl_tensor *ts[] = { y, mean, rstd, x, gamma, beta };
  BL_CHECK(opx_device(op, 6, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_layernorm_forward(y, mean, rstd, x, gamma, beta, eps));
  return ln_forward_cpu(op, y, mean, rstd, x, NULL, gamma, beta, eps, 0.0, 0, 0, NULL);
}

int bl_layernorm_backward(bl_tensor *dx, bl_tensor *dgamma, bl_tensor *dbeta, const bl_tensor *dy, const bl_tensor *x,
                          const bl_tensor *gamma, const bl_tensor *mean, const bl_tensor *rstd) {
  const char *op = "layernorm_backward";
  BL_CHECK(check_ln(op, x, gamma, NULL, mean, rstd));
  BL_CHECK(check_same(op, dy, "grad_output", x));
  BL_CHECK(check_same(op, dx, "grad_input", x));
  if (dgamma) BL_CHECK(check_same(op, dgamma, "grad_gamma", gamma));
  if (dbeta) BL_CHECK(check_same(op, dbeta, "grad_beta", gamma));
  int dev;
  const bl_tensor *ts[] = { dx, dgamma, dbeta, dy, x, gamma, mean, rstd };
  BL_CHECK(opx_device(op, 8, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_layernorm_backward(dx, dgamma, dbeta, dy, x, gamma, mean, rstd));
  return ln_backward_cpu(op, dx, NULL, dgamma, dbeta, NULL, dy, NULL, x, NULL, gamma, NULL, mean, rstd, 0.0, 0, 0,
                         NULL);
}

/* The argument checks of the residual op's forward and backward (padded and packed alike). */
static int check_res_fwd(const char *op, const bl_tensor *y, const bl_tensor *mean, const bl_tensor *rstd,
                         const bl_tensor *x, const bl_tensor *residual, const bl_tensor *gamma, const bl_tensor *beta,
                         double eps, double p) {
  BL_CHECK(check_ln(op, x, gamma, beta, mean, rstd));
  BL_CHECK(check_same(op, residual, "residual", x));
  BL_CHECK(check_same(op, y, "output", x));
  BL_CHECK(check_eps(op, eps));
  BL_CHECK(opx_check_p(op, p));
  return 0;
}

/* The checks of the residual backward entries (y, beta: the forward's output and beta, or NULL) */
static int check_res_bwd(const char *op, const bl_tensor *dx, const bl_tensor *dresidual, const bl_tensor *dgamma,
                         const bl_tensor *dbeta, const bl_tensor *dbias, const bl_tensor *dy, const bl_tensor *y,
                         const bl_tensor *x, const bl_tensor *residual, const bl_tensor *gamma, const bl_tensor *beta,
                         const bl_tensor *mean, const bl_tensor *rstd, double p) {
  BL_CHECK(check_ln(op, x, gamma, beta, mean, rstd));
  BL_CHECK(check_same(op, residual, "residual", x));
  if (y) BL_CHECK(check_same(op, y, "output", x));
  BL_CHECK(check_same(op, dy, "grad_output", x));
  BL_CHECK(check_same(op, dx, "grad_input", x));
  if (dresidual) BL_CHECK(check_same(op, dresidual, "grad_residual", x));
  if (dgamma) BL_CHECK(check_same(op, dgamma, "grad_gamma", gamma));
  if (dbeta) BL_CHECK(check_same(op, dbeta, "grad_beta", gamma));
  if (dbias) BL_CHECK(check_same(op, dbias, "grad_bias", gamma));
  BL_CHECK(opx_check_p(op, p));
  return 0;
}

/* Packed tokens: each row's dropout drawn from its row of the padded batch (opx_packed_rows); NULL when padded. */
static int ln_rows(const char *op, const bl_residual_layernorm_args *a, int64_t **rmap) {
  *rmap = NULL;
  if (!a->offsets) return 0;
  int dev;
  const bl_tensor *ts[] = { a->x, a->offsets };
  BL_CHECK(opx_device(op, 2, ts, &dev));
  if (dev >= 0) return BL_ERR("%s: CPU only, got tensors on cuda:%d", op, dev);
  return opx_packed_rows(op, a->offsets, opx_rows(a->x), a->seq, rmap);
}

int bl_residual_layernorm_forward(const bl_residual_layernorm_args *a) {
  if (!a) return BL_ERR("residual_layernorm: args is NULL");
  const char *op = a->offsets ? "residual_layernorm_packed" : "residual_layernorm";
  BL_CHECK(check_res_fwd(op, a->y, a->mean, a->rstd, a->x, a->residual, a->gamma, a->beta, a->eps, a->p));
  int64_t *rmap;
  BL_CHECK(ln_rows(op, a, &rmap));
  if (!rmap) {
    int dev;
    const bl_tensor *ts[] = { a->y, a->mean, a->rstd, a->x, a->residual, a->gamma, a->beta };
    BL_CHECK(opx_device(op, 7, ts, &dev));
    if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_residual_layernorm_forward(a));
  }
  int rc = ln_forward_cpu(op, a->y, a->mean, a->rstd, a->x, a->residual, a->gamma, a->beta, a->eps, a->p, a->seed,
                          a->offset, rmap);
  free(rmap);
  return rc;
}

int bl_residual_layernorm_backward(bl_tensor *dx, bl_tensor *dresidual, bl_tensor *dgamma, bl_tensor *dbeta,
                                   bl_tensor *dbias, const bl_tensor *dy, const bl_residual_layernorm_args *a) {
  if (!a) return BL_ERR("residual_layernorm_backward: args is NULL");
  const char *op = a->offsets ? "residual_layernorm_packed_backward" : "residual_layernorm_backward";
  const bl_tensor *y = a->y, *beta = y ? a->beta : NULL;
  BL_CHECK(check_res_bwd(op, dx, dresidual, dgamma, dbeta, dbias, dy, y, a->x, a->residual, a->gamma, beta, a->mean,
                         a->rstd, a->p));
  int64_t *rmap;
  BL_CHECK(ln_rows(op, a, &rmap));
  if (!rmap) {
    int dev;
    const bl_tensor *ts[] = { dx,   dresidual,   dgamma,   dbeta, dbias,   dy,     y,
                              a->x, a->residual, a->gamma, beta,  a->mean, a->rstd };
    BL_CHECK(opx_device(op, 13, ts, &dev));
    if (dev >= 0)
      return BL_ON_CUDA(op, dev, bl_cuda_residual_layernorm_backward(dx, dresidual, dgamma, dbeta, dbias, dy, a));
  }
  int rc = ln_backward_cpu(op, dx, dresidual, dgamma, dbeta, dbias, dy, y, a->x, a->residual, a->gamma, beta, a->mean,
                           a->rstd, a->p, a->seed, a->offset, rmap);
  free(rmap);
  return rc;
}
