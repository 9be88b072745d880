/* Activations (contracts in bl_ops.h; CUDA twin kernels/activation.cu):
 * GELU, exact erf form (BERT's "gelu"), and the fused bias + GELU that
 * follows the intermediate linear, whose backward recomputes the
 * pre-activation x + b from its inputs instead of saving it (one add per
 * element is cheaper than a second activation-sized buffer); the same for the
 * tanh-approximated GELU (gelu_new); tanh (the BERT pooler's activation) with
 * its backward from the saved output, dx = dy (1 - y^2), so the input need not
 * be kept. */
#include "ops_internal.h"
#include "device/dispatch.h"
#include "base/vecmath.h"
#include <math.h>
#include <stdlib.h>

/* GELU rows: vm_phi (vecmath.h) is the vectorised Phi(x) = 0.5 (1 + erf(x /
 * sqrt 2)), relative error <= 5e-7 down to Phi ~ 1e-37 (the textbook
 * 0.5 (1 + erff) form loses all digits where Phi is tiny), and returns
 * phi(x) for the derivative d/dx [x Phi(x)] = Phi(x) + x phi(x) from the
 * same exp. */
OPX_BODY gelu_fwd_row_body(int64_t n, const float *restrict x, const float *restrict b, float *restrict y) {
  if (b) {
#pragma omp simd
    for (int64_t j = 0; j < n; j++) {
      float v = x[j] + b[j], pdf;
      y[j] = v * vm_phi(v, &pdf);
    }
  } else {
#pragma omp simd
    for (int64_t j = 0; j < n; j++) {
      float v = x[j], pdf;
      y[j] = v * vm_phi(v, &pdf);
    }
  }
}
OPX_ISA_FN(gelu_fwd_row, (int64_t n, const float *restrict x, const float *restrict b, float *restrict y), (n, x, b, y))

/* acc[j] += dx[j]: a row's share of the bias gradient partials */
OPX_BODY acc_add_row(int64_t n, const float *restrict dx, float *restrict acc) {
#pragma omp simd
  for (int64_t j = 0; j < n; j++) acc[j] += dx[j];
}

/* dx = dy * gelu'(x + b); when acc != NULL also acc[j] += dx[j] (bias gradient partials) */
OPX_BODY gelu_bwd_row_body(int64_t n, const float *restrict x, const float *restrict b, const float *restrict dy,
                           float *restrict dx, float *restrict acc) {
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
    if (acc) acc_add_row(n, dx, acc);
  }
}
#define ACT_BWD_ROW_PARAMS                                                                                    \
  (int64_t n, const float *restrict x, const float *restrict b, const float *restrict dy, float *restrict dx, \
   float *restrict acc)
OPX_ISA_FN(gelu_bwd_row, ACT_BWD_ROW_PARAMS, (n, x, b, dy, dx, acc))

/* Tanh GELU as a logistic: 0.5 (1 + tanh(u)) = s = 1 / (1 + exp(-2u)), u = K0 (v + K1 v^3), so y = v s, and
 * 1 - tanh(u)^2 = 4 s (1 - s) gives y' = s + 2 v s (1 - s) K0 (1 + 3 K1 v^2). The logistic keeps its relative
 * accuracy where 1 + tanh(u) would cancel (v << 0); kernels/activation.cu uses the same formula (with expf). */
#define GT_K0 0.7978845608028654f /* sqrt(2 / pi) */
#define GT_K1 0.044715f
VM_INLINE float gelu_tanh_s(float v) { return 1.0f / (1.0f + vm_exp(-2.0f * GT_K0 * (v + GT_K1 * v * v * v))); }
VM_INLINE float gelu_tanh_grad(float v) {
  float s = gelu_tanh_s(v);
  return s + 2.0f * v * s * (1.0f - s) * GT_K0 * (1.0f + 3.0f * GT_K1 * v * v);
}

/* y = gelu_tanh(x + b) (b may be NULL) */
OPX_BODY gelu_tanh_fwd_row_body(int64_t n, const float *restrict x, const float *restrict b, float *restrict y) {
#pragma omp simd
  for (int64_t j = 0; j < n; j++) {
    float v = b ? x[j] + b[j] : x[j];
    y[j] = v * gelu_tanh_s(v);
  }
}
OPX_ISA_FN(gelu_tanh_fwd_row, (int64_t n, const float *restrict x, const float *restrict b, float *restrict y),
           (n, x, b, y))

/* dx = dy * gelu_tanh'(x + b); when acc != NULL also acc[j] += dx[j] */
OPX_BODY gelu_tanh_bwd_row_body(int64_t n, const float *restrict x, const float *restrict b, const float *restrict dy,
                                float *restrict dx, float *restrict acc) {
#pragma omp simd
  for (int64_t j = 0; j < n; j++) dx[j] = dy[j] * gelu_tanh_grad(b ? x[j] + b[j] : x[j]);
  if (acc) acc_add_row(n, dx, acc);
}
OPX_ISA_FN(gelu_tanh_bwd_row, ACT_BWD_ROW_PARAMS, (n, x, b, dy, dx, acc))

typedef void (*act_fwd_row_fn)(int64_t, const float *, const float *, float *);
typedef void (*act_bwd_row_fn)(int64_t, const float *, const float *, const float *, float *, float *);

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

#define GELU_CHUNK 4096 /* elements per work item of the plain (bias-free) GELU */
#define GELU_ROWS  16   /* rows per bias-gradient partial sum: fixed, so db is thread-count independent */

/* db == NULL when the caller does not want the bias gradient; tanh_form: gelu_new instead of the erf GELU. */
static int gelu_cpu(const char *op, bl_tensor *out, bl_tensor *db, const bl_tensor *dy, const bl_tensor *x,
                    const bl_tensor *b, int backward, int tanh_form) {
  act_fwd_row_fn fwd = tanh_form ? gelu_tanh_fwd_row : gelu_fwd_row;
  act_bwd_row_fn bwd = tanh_form ? gelu_tanh_bwd_row : gelu_bwd_row;
  opx_buf bx = { 0 }, bb = { 0 }, bdy = { 0 }, bo = { 0 }, bdb = { 0 };
  float *part = NULL;
  int rc;
  int64_t n = x->numel;
  if ((rc = opx_load(op, x, &bx)) || (b && (rc = opx_load(op, b, &bb))) ||
      (backward && (rc = opx_load(op, dy, &bdy))) || (rc = opx_out(op, out, &bo, 0)) ||
      (db && (rc = opx_out(op, db, &bdb, 1))))
    goto done;
  if (!b) { /* one flat run of n elements, cut in fixed chunks */
    int64_t nch = (n + GELU_CHUNK - 1) / GELU_CHUNK;
#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t c = 0; c < nch; c++) {
      int64_t s = c * GELU_CHUNK, len = s + GELU_CHUNK < n ? GELU_CHUNK : n - s;
      if (backward)
        bwd(len, bx.p + s, NULL, bdy.p + s, bo.p + s, NULL);
      else
        fwd(len, bx.p + s, NULL, bo.p + s);
    }
  } else {
    int64_t h = opx_cols(x), rows = h ? opx_rows(x) : 0;
    int64_t nch = (rows + GELU_ROWS - 1) / GELU_ROWS;
    if (db && nch > 0) {
      part = calloc((size_t)(nch * h), sizeof(float));
      if (!part) {
        rc = bl_set_error(BL_ENOMEM, "%s: out of memory for bias-gradient partial sums", op);
        goto done;
      }
    }
#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t c = 0; c < nch; c++) {
      int64_t r1 = (c + 1) * GELU_ROWS < rows ? (c + 1) * GELU_ROWS : rows;
      for (int64_t r = c * GELU_ROWS; r < r1; r++) {
        if (backward)
          bwd(h, bx.p + r * h, bb.p, bdy.p + r * h, bo.p + r * h, part ? part + c * h : NULL);
        else
          fwd(h, bx.p + r * h, bb.p, bo.p + r * h);
      }
    }
    if (part) { /* chunk partials summed in chunk order: deterministic */
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
  opx_free(&bx);
  opx_free(&bb);
  opx_free(&bdy);
  opx_free(&bo);
  opx_free(&bdb);
  free(part);
  return rc;
}

/* tanh_form: the tanh GELU (gelu_new), whose CUDA twin takes an optional bias; else the erf GELU */
static int dispatch(const char *op, bl_tensor *out, bl_tensor *db, const bl_tensor *dy, const bl_tensor *x,
                    const bl_tensor *b, int backward, int tanh_form) {
  int dev;
  const bl_tensor *ts[] = { out, db, dy, x, b };
  BL_CHECK(opx_device(op, 5, ts, &dev));
  if (dev >= 0 && tanh_form)
    return BL_ON_CUDA(op, dev,
                      backward ? bl_cuda_gelu_tanh_backward(out, db, dy, x, b) : bl_cuda_gelu_tanh_forward(out, x, b));
  if (dev >= 0)
    return BL_ON_CUDA(op, dev,
                      !backward
                          ? (b ? bl_cuda_bias_gelu_forward(out, x, b) : bl_cuda_gelu_forward(out, x))
                          : (b ? bl_cuda_bias_gelu_backward(out, db, dy, x, b) : bl_cuda_gelu_backward(out, dy, x)));
  return gelu_cpu(op, out, db, dy, x, b, backward, tanh_form);
}

int bl_gelu_forward(bl_tensor *y, const bl_tensor *x) {
  const char *op = "gelu";
  BL_CHECK(opx_check_float(op, x, "input"));
  BL_CHECK(check_same(op, y, "output", x));
  return dispatch(op, y, NULL, NULL, x, NULL, 0, 0);
}

int bl_gelu_backward(bl_tensor *dx, const bl_tensor *dy, const bl_tensor *x) {
  const char *op = "gelu_backward";
  BL_CHECK(opx_check_float(op, x, "input"));
  BL_CHECK(check_same(op, dy, "grad_output", x));
  BL_CHECK(check_same(op, dx, "grad_input", x));
  return dispatch(op, dx, NULL, dy, x, NULL, 1, 0);
}

/* The operands of a (bias) activation op: out (named out_name) and dy (may be NULL) shaped as x, b (required when
 * need_b, else may be NULL) and db (may be NULL, needs b) over x's last dim. */
static int check_act(const char *op, const bl_tensor *out, const char *out_name, const bl_tensor *db,
                     const bl_tensor *dy, const bl_tensor *x, const bl_tensor *b, int need_b) {
  BL_CHECK(opx_check_float(op, x, "input"));
  if (db && !b) return BL_ERR("%s: grad_bias given without a bias", op);
  if (need_b || b) BL_CHECK(check_bias(op, b, "bias", x));
  if (db) BL_CHECK(check_bias(op, db, "grad_bias", x));
  if (dy) BL_CHECK(check_same(op, dy, "grad_output", x));
  return check_same(op, out, out_name, x);
}

int bl_bias_gelu_forward(bl_tensor *y, const bl_tensor *x, const bl_tensor *b) {
  const char *op = "bias_gelu";
  BL_CHECK(check_act(op, y, "output", NULL, NULL, x, b, 1));
  return dispatch(op, y, NULL, NULL, x, b, 0, 0);
}

int bl_bias_gelu_backward(bl_tensor *dx, bl_tensor *db, const bl_tensor *dy, const bl_tensor *x, const bl_tensor *b) {
  const char *op = "bias_gelu_backward";
  BL_CHECK(opx_check_float(op, dy, "grad_output")); /* dy is required here */
  BL_CHECK(check_act(op, dx, "grad_input", db, dy, x, b, 1));
  return dispatch(op, dx, db, dy, x, b, 1, 0);
}

int bl_gelu_tanh_forward(bl_tensor *y, const bl_tensor *x, const bl_tensor *b) {
  const char *op = "gelu_tanh";
  BL_CHECK(check_act(op, y, "output", NULL, NULL, x, b, 0));
  return dispatch(op, y, NULL, NULL, x, b, 0, 1);
}

int bl_gelu_tanh_backward(bl_tensor *dx, bl_tensor *db, const bl_tensor *dy, const bl_tensor *x, const bl_tensor *b) {
  const char *op = "gelu_tanh_backward";
  BL_CHECK(opx_check_float(op, dy, "grad_output"));
  BL_CHECK(check_act(op, dx, "grad_input", db, dy, x, b, 0));
  return dispatch(op, dx, db, dy, x, b, 1, 1);
}

static int tanh_cpu(const char *op, bl_tensor *out, const bl_tensor *a, const bl_tensor *dy) {
  opx_buf ba = { 0 }, bg = { 0 }, bo = { 0 };
  int rc;
  if ((rc = opx_load(op, a, &ba)) || (dy && (rc = opx_load(op, dy, &bg))) || (rc = opx_out(op, out, &bo, 0))) goto done;
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
  opx_free(&ba);
  opx_free(&bg);
  opx_free(&bo);
  return rc;
}

int bl_tanh_forward(bl_tensor *y, const bl_tensor *x) {
  const char *op = "tanh";
  BL_CHECK(opx_check_float(op, x, "input"));
  BL_CHECK(check_same_as(op, y, "output", x, "input"));
  int dev;
  const bl_tensor *ts[] = { y, x };
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
  const bl_tensor *ts[] = { dx, dy, y };
  BL_CHECK(opx_device(op, 3, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_tanh_backward(dx, dy, y));
  return tanh_cpu(op, dx, y, dy);
}
