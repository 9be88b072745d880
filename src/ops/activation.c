/* Activations (contracts in bl_ops.h; CUDA twin kernels/activation.cu):
 * GELU, exact erf form (BERT's "gelu"), and the fused bias + GELU that
 * follows the intermediate linear, whose backward recomputes the
 * pre-activation x + b from its inputs instead of saving it (one add per
 * element is cheaper than a second activation-sized buffer); tanh (the BERT
 * pooler's activation) with its backward from the saved output,
 * dx = dy (1 - y^2), so the input need not be kept. */
#include "ops_internal.h"
#include "device/dispatch.h"
#include "vecmath.h"
#include <math.h>
#include <stdlib.h>

/* GELU rows: vm_phi (vecmath.h) is the vectorised Phi(x) = 0.5 (1 + erf(x /
 * sqrt 2)), relative error <= 5e-7 down to Phi ~ 1e-37 (the textbook
 * 0.5 (1 + erff) form loses all digits where Phi is tiny), and returns
 * phi(x) for the derivative d/dx [x Phi(x)] = Phi(x) + x phi(x) from the
 * same exp. */
OPX_BODY gelu_fwd_row_body(int64_t n, const float *restrict x, const float *restrict b,
                           float *restrict y) {
  if (b) {
    #pragma omp simd
    for (int64_t j = 0; j < n; j++) { float v = x[j] + b[j], pdf; y[j] = v * vm_phi(v, &pdf); }
  } else {
    #pragma omp simd
    for (int64_t j = 0; j < n; j++) { float v = x[j], pdf; y[j] = v * vm_phi(v, &pdf); }
  }
}
OPX_ISA_FN(gelu_fwd_row, (int64_t n, const float *restrict x, const float *restrict b, float *restrict y), (n, x, b, y))

/* dx = dy * gelu'(x + b); when acc != NULL also acc[j] += dx[j] (bias gradient partials) */
OPX_BODY gelu_bwd_row_body(int64_t n, const float *restrict x, const float *restrict b,
                           const float *restrict dy, float *restrict dx, float *restrict acc) {
  if (b && acc) {
    #pragma omp simd
    for (int64_t j = 0; j < n; j++) {
      float v = x[j] + b[j], pdf, cdf = vm_phi(v, &pdf), g = dy[j] * (cdf + v * pdf);
      dx[j] = g;
      acc[j] += g;
    }
  } else if (b) {
    #pragma omp simd
    for (int64_t j = 0; j < n; j++) {
      float v = x[j] + b[j], pdf, cdf = vm_phi(v, &pdf);
      dx[j] = dy[j] * (cdf + v * pdf);
    }
  } else {
    #pragma omp simd
    for (int64_t j = 0; j < n; j++) {
      float v = x[j], pdf, cdf = vm_phi(v, &pdf);
      dx[j] = dy[j] * (cdf + v * pdf);
    }
    if (acc) {
      #pragma omp simd
      for (int64_t j = 0; j < n; j++) acc[j] += dx[j];
    }
  }
}
OPX_ISA_FN(gelu_bwd_row, (int64_t n, const float *restrict x, const float *restrict b, const float *restrict dy,
                          float *restrict dx, float *restrict acc),
           (n, x, b, dy, dx, acc))

static int check_same_as(const char *op, const bl_tensor *t, const char *name, const bl_tensor *ref,
                         const char *ref_name) {
  BL_CHECK(opx_check_float(op, t, name));
  if (!opx_same_shape(t, ref))
    return BL_ERR("%s: %s %s does not match %s %s", op, name, OPX_SHAPE(t), ref_name, OPX_SHAPE(ref));
  return 0;
}

static int check_same(const char *op, const bl_tensor *t, const char *name, const bl_tensor *x) {
  return check_same_as(op, t, name, x, "input");
}

static int check_bias(const char *op, const bl_tensor *b, const char *name, const bl_tensor *x) {
  BL_CHECK(opx_check_float(op, b, name));
  if (x->ndim < 1 || b->ndim != 1 || b->shape[0] != opx_cols(x))
    return BL_ERR("%s: %s %s does not match the last dim of input %s", op, name, OPX_SHAPE(b), OPX_SHAPE(x));
  return 0;
}

#define GELU_CHUNK 4096    /* elements per work item of the plain (bias-free) GELU */
#define GELU_ROWS 16       /* rows per bias-gradient partial sum: fixed, so db is thread-count independent */

/* db == NULL when the caller does not want the bias gradient. */
static int gelu_cpu(const char *op, bl_tensor *out, bl_tensor *db, const bl_tensor *dy, const bl_tensor *x,
                    const bl_tensor *b, int backward) {
  opx_buf bx = {0}, bb = {0}, bdy = {0}, bo = {0}, bdb = {0};
  float *part = NULL;
  int rc;
  int64_t n = x->numel;
  if ((rc = opx_load(op, x, &bx)) || (b && (rc = opx_load(op, b, &bb))) ||
      (backward && (rc = opx_load(op, dy, &bdy))) || (rc = opx_out(op, out, &bo, 0)) ||
      (db && (rc = opx_out(op, db, &bdb, 1))))
    goto done;
  if (!b) {  /* one flat run of n elements, cut in fixed chunks */
    int64_t nch = (n + GELU_CHUNK - 1) / GELU_CHUNK;
    #pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t c = 0; c < nch; c++) {
      int64_t s = c * GELU_CHUNK, len = s + GELU_CHUNK < n ? GELU_CHUNK : n - s;
      if (backward) gelu_bwd_row(len, bx.p + s, NULL, bdy.p + s, bo.p + s, NULL);
      else gelu_fwd_row(len, bx.p + s, NULL, bo.p + s);
    }
  } else {
    int64_t h = opx_cols(x), rows = h ? opx_rows(x) : 0;
    int64_t nch = (rows + GELU_ROWS - 1) / GELU_ROWS;
    if (db && nch > 0) {
      part = calloc((size_t)(nch * h), sizeof(float));
      if (!part) { rc = bl_set_error(BL_ENOMEM, "%s: out of memory for bias-gradient partial sums", op); goto done; }
    }
    #pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t c = 0; c < nch; c++) {
      int64_t r1 = (c + 1) * GELU_ROWS < rows ? (c + 1) * GELU_ROWS : rows;
      for (int64_t r = c * GELU_ROWS; r < r1; r++) {
        if (backward) gelu_bwd_row(h, bx.p + r * h, bb.p, bdy.p + r * h, bo.p + r * h, part ? part + c * h : NULL);
        else gelu_fwd_row(h, bx.p + r * h, bb.p, bo.p + r * h);
      }
    }
    if (part) {  /* chunk partials summed in chunk order: deterministic */
      #pragma omp parallel for schedule(static) if (nch * h > 65536)
      for (int64_t j = 0; j < h; j++) {
        float s = 0.0f;
        for (int64_t c = 0; c < nch; c++) s += part[c * h + j];
        bdb.p[j] += s;
      }
    }
  }
  opx_store(out, &bo);
  if (db) opx_store(db, &bdb);
done:
  opx_free(&bx); opx_free(&bb); opx_free(&bdy); opx_free(&bo); opx_free(&bdb);
  free(part);
  return rc;
}

static int dispatch(const char *op, bl_tensor *out, bl_tensor *db, const bl_tensor *dy, const bl_tensor *x,
                    const bl_tensor *b, int backward) {
  int dev;
  const bl_tensor *ts[] = {out, db, dy, x, b};
  BL_CHECK(opx_device(op, 5, ts, &dev));
  if (dev >= 0)
    return BL_ON_CUDA(op, dev, !backward ? (b ? bl_cuda_bias_gelu_forward(out, x, b) : bl_cuda_gelu_forward(out, x))
                                         : (b ? bl_cuda_bias_gelu_backward(out, db, dy, x, b)
                                              : bl_cuda_gelu_backward(out, dy, x)));
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

static int tanh_cpu(const char *op, bl_tensor *out, const bl_tensor *a, const bl_tensor *dy) {
  opx_buf ba = {0}, bg = {0}, bo = {0};
  int rc;
  if ((rc = opx_load(op, a, &ba)) || (dy && (rc = opx_load(op, dy, &bg))) || (rc = opx_out(op, out, &bo, 0)))
    goto done;
  int64_t n = a->numel;
  if (!dy) {
    #pragma omp parallel for schedule(static) if (n > 16384)
    for (int64_t i = 0; i < n; i++) bo.p[i] = tanhf(ba.p[i]);
  } else {
    #pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) bo.p[i] = bg.p[i] * (1.0f - ba.p[i] * ba.p[i]);
  }
  opx_store(out, &bo);
done:
  opx_free(&ba); opx_free(&bg); opx_free(&bo);
  return rc;
}

int bl_tanh_forward(bl_tensor *y, const bl_tensor *x) {
  const char *op = "tanh";
  BL_CHECK(opx_check_float(op, x, "input"));
  BL_CHECK(check_same_as(op, y, "output", x, "input"));
  int dev;
  const bl_tensor *ts[] = {y, x};
  BL_CHECK(opx_device(op, 2, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_tanh_forward(y, x));
  return tanh_cpu(op, y, x, NULL);
}

int bl_tanh_backward(bl_tensor *dx, const bl_tensor *dy, const bl_tensor *y) {
  const char *op = "tanh_backward";
  BL_CHECK(opx_check_float(op, y, "output"));
  BL_CHECK(check_same_as(op, dy, "grad_output", y, "output"));
  BL_CHECK(check_same_as(op, dx, "grad_input", y, "output"));
  int dev;
  const bl_tensor *ts[] = {dx, dy, y};
  BL_CHECK(opx_device(op, 3, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_tanh_backward(dx, dy, y));
  return tanh_cpu(op, dx, y, dy);
}
