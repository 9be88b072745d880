/* softmax over the last dim with an optional additive, broadcast mask
 * (contract in bl_ops.h). The mask is read through broadcast strides (0 on
 * size-1 dims), so BERT's [B,1,1,S] extended mask is never expanded. */
#include "ops_internal.h"
#include "device/dispatch.h"
#include "base/vecmath.h"
#include <math.h>

/* Row kernels: vectorised exp (vm_exp), sums in 16 lanes combined in a fixed
 * order (thread-count independent, vectorisable without -ffast-math). */
OPX_BODY softmax_row_body(int64_t n, const float *x, float *y) { /* x == y allowed */
  float mx = vm_row_max(n, x);
  float acc[16] = { 0 }, sum = 0.0f;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
#pragma omp simd
    for (int l = 0; l < 16; l++) {
      float e = vm_exp(x[j + l] - mx);
      y[j + l] = e;
      acc[l] += e;
    }
  }
  for (; j < n; j++) {
    float e = vm_exp(x[j] - mx);
    y[j] = e;
    sum += e;
  }
  for (int l = 0; l < 16; l++) sum += acc[l];
  float inv = 1.0f / sum;
#pragma omp simd
  for (int64_t k = 0; k < n; k++) y[k] *= inv;
}
OPX_ISA_FN(softmax_row, (int64_t n, const float *x, float *y), (n, x, y))

OPX_BODY softmax_bwd_row_body(int64_t n, const float *restrict g, const float *restrict y, float *restrict o) {
  float acc[16] = { 0 }, dot = 0.0f;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
#pragma omp simd
    for (int l = 0; l < 16; l++) acc[l] += g[j + l] * y[j + l];
  }
  for (; j < n; j++) dot += g[j] * y[j];
  for (int l = 0; l < 16; l++) dot += acc[l];
#pragma omp simd
  for (int64_t k = 0; k < n; k++) o[k] = y[k] * (g[k] - dot);
}
OPX_ISA_FN(softmax_bwd_row, (int64_t n, const float *restrict g, const float *restrict y, float *restrict o),
           (n, g, y, o))

static int check_same(const char *op, const bl_tensor *t, const char *name, const bl_tensor *x) {
  BL_CHECK(opx_check_float(op, t, name));
  if (!opx_same_shape(t, x)) return BL_ERR("%s: %s %s does not match input %s", op, name, OPX_SHAPE(t), OPX_SHAPE(x));
  return 0;
}

/* Strides (in elements of the contiguous mask image) aligned to x's dims. */
static int mask_strides(const char *op, const bl_tensor *m, const bl_tensor *x, int64_t *st) {
  if (m->ndim > x->ndim) return BL_ERR("%s: mask %s has more dims than input %s", op, OPX_SHAPE(m), OPX_SHAPE(x));
  int64_t s = 1;
  for (int d = x->ndim - 1; d >= 0; d--) {
    int md = d - (x->ndim - m->ndim);
    if (md < 0) {
      st[d] = 0;
      continue;
    }
    if (m->shape[md] == x->shape[d])
      st[d] = m->shape[md] == 1 ? 0 : s;
    else if (m->shape[md] == 1)
      st[d] = 0;
    else
      return BL_ERR("%s: mask %s cannot be broadcast to input %s", op, OPX_SHAPE(m), OPX_SHAPE(x));
    s *= m->shape[md];
  }
  return 0;
}

static int softmax_fwd_cpu(const char *op, bl_tensor *y, const bl_tensor *x, const bl_tensor *mask) {
  opx_buf bx = { 0 }, bm = { 0 }, by = { 0 };
  int64_t st[BL_MAX_DIMS] = { 0 };
  int rc;
  if ((mask && (rc = mask_strides(op, mask, x, st))) || (rc = opx_load(op, x, &bx)) ||
      (mask && (rc = opx_load(op, mask, &bm))) || (rc = opx_out(op, y, &by, 0)))
    goto done;
  int64_t n = opx_cols(x), rows = opx_rows(x);
  int nd = x->ndim;
#pragma omp parallel for schedule(static) if (rows * n > 16384)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = bx.p + r * n;
    float *yr = by.p + r * n;
    if (mask) {
      int64_t moff = 0, rem = r;
      for (int d = nd - 2; d >= 0; d--) {
        moff += (rem % x->shape[d]) * st[d];
        rem /= x->shape[d];
      }
      const float *mr = bm.p + moff;
      int64_t ms = st[nd - 1];
      for (int64_t j = 0; j < n; j++) yr[j] = xr[j] + mr[j * ms];
      xr = yr;
    }
    softmax_row(n, xr, yr);
  }
  opx_store(y, &by);
done:
  opx_free(&bx);
  opx_free(&bm);
  opx_free(&by);
  return rc;
}

int bl_softmax_forward(bl_tensor *y, const bl_tensor *x, const bl_tensor *mask) {
  const char *op = "softmax";
  BL_CHECK(opx_check_float(op, x, "input"));
  if (x->ndim < 1 || opx_cols(x) < 1) return BL_ERR("%s: input %s needs a non-empty last dim", op, OPX_SHAPE(x));
  BL_CHECK(check_same(op, y, "output", x));
  if (mask) {
    int64_t st[BL_MAX_DIMS];
    BL_CHECK(opx_check_float(op, mask, "mask"));
    BL_CHECK(mask_strides(op, mask, x, st));
  }
  int dev;
  const bl_tensor *ts[] = { y, x, mask };
  BL_CHECK(opx_device(op, 3, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_softmax_forward(y, x, mask));
  return softmax_fwd_cpu(op, y, x, mask);
}

static int softmax_bwd_cpu(const char *op, bl_tensor *dx, const bl_tensor *dy, const bl_tensor *y) {
  opx_buf bdy = { 0 }, by = { 0 }, bdx = { 0 };
  int rc;
  if ((rc = opx_load(op, dy, &bdy)) || (rc = opx_load(op, y, &by)) || (rc = opx_out(op, dx, &bdx, 0))) goto done;
  int64_t n = opx_cols(y), rows = opx_rows(y);
#pragma omp parallel for schedule(static) if (rows * n > 16384)
  for (int64_t r = 0; r < rows; r++) {
    const float *g = bdy.p + r * n, *yr = by.p + r * n;
    softmax_bwd_row(n, g, yr, bdx.p + r * n);
  }
  opx_store(dx, &bdx);
done:
  opx_free(&bdy);
  opx_free(&by);
  opx_free(&bdx);
  return rc;
}

int bl_softmax_backward(bl_tensor *dx, const bl_tensor *dy, const bl_tensor *y) {
  const char *op = "softmax_backward";
  BL_CHECK(opx_check_float(op, y, "output"));
  if (y->ndim < 1) return BL_ERR("%s: output must have at least one dim", op);
  BL_CHECK(check_same(op, dy, "grad_output", y));
  BL_CHECK(check_same(op, dx, "grad_input", y));
  int dev;
  const bl_tensor *ts[] = { dx, dy, y };
  BL_CHECK(opx_device(op, 3, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_softmax_backward(dx, dy, y));
  return softmax_bwd_cpu(op, dx, dy, y);
}
