/* layernorm and the fused dropout + residual + layernorm (contract in
 * bl_ops.h). One CPU implementation serves both: the residual variant first
 * forms s = dropout(x) + residual into the output row (no extra buffer) and
 * normalises it in place; its backward recomputes s from x and residual
 * rather than storing it, since that is one cheap pass over memory already
 * being read. dgamma/dbeta are summed per fixed 32-row chunk and the chunks
 * reduced in order, so results do not depend on the number of threads. */
#include "ops_internal.h"
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
  if (x->ndim < 1 || opx_cols(x) < 1)
    return BL_ERR("%s: input %s must have a non-empty last dim", op, OPX_SHAPE(x));
  int64_t h = opx_cols(x), rows = opx_rows(x);
  if (gamma->ndim != 1 || gamma->shape[0] != h)
    return BL_ERR("%s: gamma %s does not match input %s", op, OPX_SHAPE(gamma), OPX_SHAPE(x));
  if (beta && (beta->ndim != 1 || beta->shape[0] != h))
    return BL_ERR("%s: beta %s does not match input %s", op, OPX_SHAPE(beta), OPX_SHAPE(x));
  if (mean->dtype != BL_F32 || rstd->dtype != BL_F32)
    return BL_ERR("%s: mean and rstd must be f32, got %s and %s", op, bl_dtype_name(mean->dtype),
                  bl_dtype_name(rstd->dtype));
  if (mean->numel != rows || rstd->numel != rows)
    return BL_ERR("%s: mean %s and rstd %s must have %lld elements (rows of input %s)", op,
                  OPX_SHAPE(mean), OPX_SHAPE(rstd), (long long)rows, OPX_SHAPE(x));
  return 0;
}

static int check_same(const char *op, const bl_tensor *t, const char *name, const bl_tensor *x) {
  BL_CHECK(opx_check_float(op, t, name));
  if (!opx_same_shape(t, x))
    return BL_ERR("%s: %s %s does not match input %s", op, name, OPX_SHAPE(t), OPX_SHAPE(x));
  return 0;
}

static int make_keep(const char *op, int64_t rows, int64_t h, double p, uint64_t seed, uint64_t offset,
                     uint8_t **keep) {
  *keep = NULL;
  if (p <= 0) return 0;
  *keep = malloc(rows * h > 0 ? (size_t)(rows * h) : 1);
  if (!*keep) return bl_set_error(BL_ENOMEM, "%s: out of memory for a dropout mask", op);
  uint8_t *k = *keep;
  #pragma omp parallel for schedule(static) if (rows * h > 65536)
  for (int64_t r = 0; r < rows; r++) opx_dropout_keep(seed, offset, r * h, h, (float)p, k + r * h);
  return 0;
}

static int ln_forward_cpu(const char *op, bl_tensor *y, bl_tensor *mean, bl_tensor *rstd, const bl_tensor *x,
                          const bl_tensor *res, const bl_tensor *gamma, const bl_tensor *beta, double eps,
                          double p, uint64_t seed, uint64_t offset) {
  opx_buf bx = {0}, br = {0}, bg = {0}, bb = {0}, by = {0}, bm = {0}, bs = {0};
  uint8_t *keep = NULL;
  int64_t h = opx_cols(x), rows = opx_rows(x);
  int rc;
  if ((rc = opx_load(op, x, &bx)) || (res && (rc = opx_load(op, res, &br))) || (rc = opx_load(op, gamma, &bg)) ||
      (beta && (rc = opx_load(op, beta, &bb))) || (rc = opx_out(op, y, &by, 0)) ||
      (rc = opx_out(op, mean, &bm, 0)) || (rc = opx_out(op, rstd, &bs, 0)) ||
      (rc = make_keep(op, rows, h, p, seed, offset, &keep)))
    goto done;
  const float scale = p > 0 ? (float)(1.0 / (1.0 - p)) : 1.0f, feps = (float)eps;
  #pragma omp parallel for schedule(static) if (rows * h > 32768)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = bx.p + r * h, *g = bg.p, *b = bb.p;
    float *yr = by.p + r * h;
    const float *s = xr;
    if (res) {
      const float *rr = br.p + r * h;
      if (keep) { const uint8_t *kr = keep + r * h;
        for (int64_t j = 0; j < h; j++) yr[j] = (kr[j] ? xr[j] * scale : 0.0f) + rr[j]; }
      else for (int64_t j = 0; j < h; j++) yr[j] = xr[j] + rr[j];
      s = yr;
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < h; j++) sum += s[j];
    float m = sum / (float)h, var = 0.0f;
    for (int64_t j = 0; j < h; j++) { float d = s[j] - m; var += d * d; }
    float rs = 1.0f / sqrtf(var / (float)h + feps);
    if (b) for (int64_t j = 0; j < h; j++) yr[j] = (s[j] - m) * rs * g[j] + b[j];
    else for (int64_t j = 0; j < h; j++) yr[j] = (s[j] - m) * rs * g[j];
    bm.p[r] = m; bs.p[r] = rs;
  }
  opx_store(y, &by); opx_store(mean, &bm); opx_store(rstd, &bs);
done:
  opx_free(&bx); opx_free(&br); opx_free(&bg); opx_free(&bb); opx_free(&by); opx_free(&bm); opx_free(&bs);
  free(keep);
  return rc;
}

static int ln_backward_cpu(const char *op, bl_tensor *dx, bl_tensor *dres, bl_tensor *dgamma, bl_tensor *dbeta,
                           const bl_tensor *dy, const bl_tensor *x, const bl_tensor *res, const bl_tensor *gamma,
                           const bl_tensor *mean, const bl_tensor *rstd, double p, uint64_t seed,
                           uint64_t offset) {
  opx_buf bdy = {0}, bx = {0}, br = {0}, bg = {0}, bm = {0}, bs = {0}, bdx = {0}, bdr = {0}, bdg = {0}, bdb = {0};
  uint8_t *keep = NULL;
  float *part = NULL;
  int64_t h = opx_cols(x), rows = opx_rows(x), nchunk = (rows + LN_CHUNK - 1) / LN_CHUNK;
  int want_param = dgamma || dbeta;
  int rc;
  if ((rc = opx_load(op, dy, &bdy)) || (rc = opx_load(op, x, &bx)) || (res && (rc = opx_load(op, res, &br))) ||
      (rc = opx_load(op, gamma, &bg)) || (rc = opx_load(op, mean, &bm)) || (rc = opx_load(op, rstd, &bs)) ||
      (rc = opx_out(op, dx, &bdx, 0)) || (dres && (rc = opx_out(op, dres, &bdr, 0))) ||
      (dgamma && (rc = opx_out(op, dgamma, &bdg, 1))) || (dbeta && (rc = opx_out(op, dbeta, &bdb, 1))) ||
      (rc = make_keep(op, rows, h, p, seed, offset, &keep)))
    goto done;
  if (want_param && nchunk > 0) {
    part = calloc((size_t)(nchunk * 2 * h), sizeof(float));
    if (!part) { rc = bl_set_error(BL_ENOMEM, "%s: out of memory for gamma/beta partial sums", op); goto done; }
  }
  const float scale = p > 0 ? (float)(1.0 / (1.0 - p)) : 1.0f;
  #pragma omp parallel for schedule(static) if (rows * h > 32768)
  for (int64_t c = 0; c < nchunk; c++) {
    float *pg = part ? part + c * 2 * h : NULL, *pb = pg ? pg + h : NULL;
    int64_t r1 = (c + 1) * LN_CHUNK < rows ? (c + 1) * LN_CHUNK : rows;
    for (int64_t r = c * LN_CHUNK; r < r1; r++) {
      const float *xr = bx.p + r * h, *dyr = bdy.p + r * h, *g = bg.p;
      const uint8_t *kr = keep ? keep + r * h : NULL;
      float *xh = bdx.p + r * h;  /* normalised input, then overwritten by dx */
      float m = bm.p[r], rs = bs.p[r];
      if (res) {
        const float *rr = br.p + r * h;
        if (kr) for (int64_t j = 0; j < h; j++) xh[j] = ((kr[j] ? xr[j] * scale : 0.0f) + rr[j] - m) * rs;
        else for (int64_t j = 0; j < h; j++) xh[j] = (xr[j] + rr[j] - m) * rs;
      } else {
        for (int64_t j = 0; j < h; j++) xh[j] = (xr[j] - m) * rs;
      }
      float a = 0.0f, b = 0.0f;
      for (int64_t j = 0; j < h; j++) { float gj = dyr[j] * g[j]; a += gj; b += gj * xh[j]; }
      if (pg) for (int64_t j = 0; j < h; j++) { pg[j] += dyr[j] * xh[j]; pb[j] += dyr[j]; }
      a /= (float)h; b /= (float)h;
      for (int64_t j = 0; j < h; j++) xh[j] = rs * (dyr[j] * g[j] - a - xh[j] * b);
      if (dres) memcpy(bdr.p + r * h, xh, (size_t)h * sizeof(float));
      if (kr) for (int64_t j = 0; j < h; j++) xh[j] = kr[j] ? xh[j] * scale : 0.0f;
    }
  }
  if (part) {
    #pragma omp parallel for schedule(static) if (nchunk * h > 65536)
    for (int64_t j = 0; j < h; j++) {
      float sg = 0.0f, sb = 0.0f;
      for (int64_t c = 0; c < nchunk; c++) { sg += part[c * 2 * h + j]; sb += part[c * 2 * h + h + j]; }
      if (bdg.p) bdg.p[j] += sg;
      if (bdb.p) bdb.p[j] += sb;
    }
  }
  opx_store(dx, &bdx);
  if (dres) opx_store(dres, &bdr);
  if (dgamma) opx_store(dgamma, &bdg);
  if (dbeta) opx_store(dbeta, &bdb);
done:
  opx_free(&bdy); opx_free(&bx); opx_free(&br); opx_free(&bg); opx_free(&bm); opx_free(&bs);
  opx_free(&bdx); opx_free(&bdr); opx_free(&bdg); opx_free(&bdb);
  free(keep); free(part);
  return rc;
}

static int check_eps(const char *op, double eps) {
  if (!(eps > 0.0) || !isfinite(eps)) return BL_ERR("%s: eps %g must be positive", op, eps);
  return 0;
}

int bl_layernorm_forward(bl_tensor *y, bl_tensor *mean, bl_tensor *rstd, const bl_tensor *x,
                         const bl_tensor *gamma, const bl_tensor *beta, double eps) {
  const char *op = "layernorm";
  BL_CHECK(check_ln(op, x, gamma, beta, mean, rstd));
  BL_CHECK(check_same(op, y, "output", x));
  BL_CHECK(check_eps(op, eps));
  int dev;
  const bl_tensor *ts[] = {y, mean, rstd, x, gamma, beta};
  BL_CHECK(opx_device(op, 6, ts, &dev));
  if (dev >= 0) return opx_no_cuda(op, dev);
  return ln_forward_cpu(op, y, mean, rstd, x, NULL, gamma, beta, eps, 0.0, 0, 0);
}

int bl_layernorm_backward(bl_tensor *dx, bl_tensor *dgamma, bl_tensor *dbeta, const bl_tensor *dy,
                          const bl_tensor *x, const bl_tensor *gamma, const bl_tensor *mean,
                          const bl_tensor *rstd) {
  const char *op = "layernorm_backward";
  BL_CHECK(check_ln(op, x, gamma, NULL, mean, rstd));
  BL_CHECK(check_same(op, dy, "grad_output", x));
  BL_CHECK(check_same(op, dx, "grad_input", x));
  if (dgamma) BL_CHECK(check_same(op, dgamma, "grad_gamma", gamma));
  if (dbeta) BL_CHECK(check_same(op, dbeta, "grad_beta", gamma));
  int dev;
  const bl_tensor *ts[] = {dx, dgamma, dbeta, dy, x, gamma, mean, rstd};
  BL_CHECK(opx_device(op, 8, ts, &dev));
  if (dev >= 0) return opx_no_cuda(op, dev);
  return ln_backward_cpu(op, dx, NULL, dgamma, dbeta, dy, x, NULL, gamma, mean, rstd, 0.0, 0, 0);
}

int bl_residual_layernorm_forward(bl_tensor *y, bl_tensor *mean, bl_tensor *rstd,
                                  const bl_tensor *x, const bl_tensor *residual,
                                  const bl_tensor *gamma, const bl_tensor *beta, double eps,
                                  double p, uint64_t seed, uint64_t offset) {
  const char *op = "residual_layernorm";
  BL_CHECK(check_ln(op, x, gamma, beta, mean, rstd));
  BL_CHECK(check_same(op, residual, "residual", x));
  BL_CHECK(check_same(op, y, "output", x));
  BL_CHECK(check_eps(op, eps));
  BL_CHECK(opx_check_p(op, p));
  int dev;
  const bl_tensor *ts[] = {y, mean, rstd, x, residual, gamma, beta};
  BL_CHECK(opx_device(op, 7, ts, &dev));
  if (dev >= 0) return opx_no_cuda(op, dev);
  return ln_forward_cpu(op, y, mean, rstd, x, residual, gamma, beta, eps, p, seed, offset);
}

int bl_residual_layernorm_backward(bl_tensor *dx, bl_tensor *dresidual, bl_tensor *dgamma,
                                   bl_tensor *dbeta, const bl_tensor *dy, const bl_tensor *x,
                                   const bl_tensor *residual, const bl_tensor *gamma,
                                   const bl_tensor *mean, const bl_tensor *rstd,
                                   double p, uint64_t seed, uint64_t offset) {
  const char *op = "residual_layernorm_backward";
  BL_CHECK(check_ln(op, x, gamma, NULL, mean, rstd));
  BL_CHECK(check_same(op, residual, "residual", x));
  BL_CHECK(check_same(op, dy, "grad_output", x));
  BL_CHECK(check_same(op, dx, "grad_input", x));
  if (dresidual) BL_CHECK(check_same(op, dresidual, "grad_residual", x));
  if (dgamma) BL_CHECK(check_same(op, dgamma, "grad_gamma", gamma));
  if (dbeta) BL_CHECK(check_same(op, dbeta, "grad_beta", gamma));
  BL_CHECK(opx_check_p(op, p));
  int dev;
  const bl_tensor *ts[] = {dx, dresidual, dgamma, dbeta, dy, x, residual, gamma, mean, rstd};
  BL_CHECK(opx_device(op, 10, ts, &dev));
  if (dev >= 0) return opx_no_cuda(op, dev);
  return ln_backward_cpu(op, dx, dresidual, dgamma, dbeta, dy, x, residual, gamma, mean, rstd, p, seed, offset);
}
