/* GELU, exact erf form (BERT's "gelu"), and the fused bias + GELU that
 * follows the intermediate linear (contract in bl_ops.h). The backward
 * recomputes the pre-activation x + b from its inputs instead of saving it:
 * one add per element is cheaper than a second activation-sized buffer. */
#include "ops_internal.h"
#include <math.h>
#include <stdlib.h>

#define INV_SQRT2 0.70710678118654752440f
#define INV_SQRT_2PI 0.39894228040143267794f

static inline float gelu(float x) { return 0.5f * x * (1.0f + erff(x * INV_SQRT2)); }
/* d/dx [x Phi(x)] = Phi(x) + x phi(x) */
static inline float gelu_grad(float x) {
  return 0.5f * (1.0f + erff(x * INV_SQRT2)) + x * INV_SQRT_2PI * expf(-0.5f * x * x);
}

static int check_same(const char *op, const bl_tensor *t, const char *name, const bl_tensor *x) {
  BL_CHECK(opx_check_float(op, t, name));
  if (!opx_same_shape(t, x))
    return BL_ERR("%s: %s %s does not match input %s", op, name, OPX_SHAPE(t), OPX_SHAPE(x));
  return 0;
}

static int check_bias(const char *op, const bl_tensor *b, const char *name, const bl_tensor *x) {
  BL_CHECK(opx_check_float(op, b, name));
  if (x->ndim < 1 || b->ndim != 1 || b->shape[0] != opx_cols(x))
    return BL_ERR("%s: %s %s does not match the last dim of input %s", op, name, OPX_SHAPE(b), OPX_SHAPE(x));
  return 0;
}

/* db == NULL when the caller does not want the bias gradient. */
static int gelu_cpu(const char *op, bl_tensor *out, bl_tensor *db, const bl_tensor *dy, const bl_tensor *x,
                    const bl_tensor *b, int backward) {
  opx_buf bx = {0}, bb = {0}, bdy = {0}, bo = {0}, bdb = {0};
  int rc;
  int64_t n = x->numel, h = b ? opx_cols(x) : 1, rows = b ? opx_rows(x) : 1;
  if (!b) h = n;
  if ((rc = opx_load(op, x, &bx)) || (b && (rc = opx_load(op, b, &bb))) ||
      (backward && (rc = opx_load(op, dy, &bdy))) || (rc = opx_out(op, out, &bo, 0)) ||
      (db && (rc = opx_out(op, db, &bdb, 1))))
    goto done;
  if (h == 0) { rows = 0; }
  #pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = bx.p + r * h;
    float *o = bo.p + r * h;
    if (!backward) {
      if (b) for (int64_t j = 0; j < h; j++) o[j] = gelu(xr[j] + bb.p[j]);
      else for (int64_t j = 0; j < h; j++) o[j] = gelu(xr[j]);
    } else {
      const float *g = bdy.p + r * h;
      if (b) for (int64_t j = 0; j < h; j++) o[j] = g[j] * gelu_grad(xr[j] + bb.p[j]);
      else for (int64_t j = 0; j < h; j++) o[j] = g[j] * gelu_grad(xr[j]);
    }
  }
  if (db) {  /* column sums of dx in fixed column blocks: deterministic */
    int64_t nblk = (h + 63) / 64;
    #pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t blk = 0; blk < nblk; blk++) {
      int64_t j0 = blk * 64, j1 = j0 + 64 < h ? j0 + 64 : h;
      float acc[64] = {0};
      for (int64_t r = 0; r < rows; r++)
        for (int64_t j = j0; j < j1; j++) acc[j - j0] += bo.p[r * h + j];
      for (int64_t j = j0; j < j1; j++) bdb.p[j] += acc[j - j0];
    }
  }
  opx_store(out, &bo);
  if (db) opx_store(db, &bdb);
done:
  opx_free(&bx); opx_free(&bb); opx_free(&bdy); opx_free(&bo); opx_free(&bdb);
  return rc;
}

static int dispatch(const char *op, bl_tensor *out, bl_tensor *db, const bl_tensor *dy, const bl_tensor *x,
                    const bl_tensor *b, int backward) {
  int dev;
  const bl_tensor *ts[] = {out, db, dy, x, b};
  BL_CHECK(opx_device(op, 5, ts, &dev));
  if (dev >= 0) return opx_no_cuda(op, dev);
  return gelu_cpu(op, out, db, dy, x, b, backward);
}

int bl_gelu_forward(bl_tensor *y, const bl_tensor *x) {
  const char *op = "gelu";
  BL_CHECK(opx_check_float(op, x, "input"));
  BL_CHECK(check_same(op, y, "output", x));
  return dispatch(op, y, NULL, NULL, x, NULL, 0);
}

int bl_gelu_backward(bl_tensor *dx, const bl_tensor *dy, const bl_tensor *x) {
  const char *op = "gelu_backward";
  BL_CHECK(opx_check_float(op, x, "input"));
  BL_CHECK(check_same(op, dy, "grad_output", x));
  BL_CHECK(check_same(op, dx, "grad_input", x));
  return dispatch(op, dx, NULL, dy, x, NULL, 1);
}

int bl_bias_gelu_forward(bl_tensor *y, const bl_tensor *x, const bl_tensor *b) {
  const char *op = "bias_gelu";
  BL_CHECK(opx_check_float(op, x, "input"));
  BL_CHECK(check_bias(op, b, "bias", x));
  BL_CHECK(check_same(op, y, "output", x));
  return dispatch(op, y, NULL, NULL, x, b, 0);
}

int bl_bias_gelu_backward(bl_tensor *dx, bl_tensor *db, const bl_tensor *dy, const bl_tensor *x,
                          const bl_tensor *b) {
  const char *op = "bias_gelu_backward";
  BL_CHECK(opx_check_float(op, x, "input"));
  BL_CHECK(check_bias(op, b, "bias", x));
  if (db) BL_CHECK(check_bias(op, db, "grad_bias", x));
  BL_CHECK(check_same(op, dy, "grad_output", x));
  BL_CHECK(check_same(op, dx, "grad_input", x));
  return dispatch(op, dx, db, dy, x, b, 1);
}
