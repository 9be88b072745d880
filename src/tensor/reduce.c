/* Reductions (sum, mean, max, min, argmax, argmin, prod) over a set of dims,
 * accumulating in double. The reduced dims are walked innermost; the kept dims
 * are spread over OpenMP threads. */
#include <float.h>
#include <stdlib.h>
#include "../base/internal.h"
#include "../device/dispatch.h"

static const char *const redop_names[BL_NUM_REDOPS] = { "sum", "mean", "max", "min", "argmax", "argmin", "prod" };

typedef struct {
  int op, dtype;
  int nin;                                           /* reduced dims */
  int64_t ishape[BL_MAX_DIMS], istride[BL_MAX_DIMS]; /* bytes */
  int64_t count;
} red_ctx;

/* Reduce the inner (reduced) space starting at p. */
static double reduce_at(const red_ctx *c, const char *p) {
  int64_t idx[BL_MAX_DIMS] = { 0 };
  double acc = c->op == BL_PROD ? 1.0 : (c->op == BL_SUM || c->op == BL_MEAN) ? 0.0 : NAN;
  int64_t best_i = 0;
  int64_t inner = c->nin ? c->ishape[c->nin - 1] : 1;
  int64_t is = c->nin ? c->istride[c->nin - 1] : 0;
  int64_t outer = c->count / (inner ? inner : 1);
  int64_t flat = 0;
  for (int64_t o = 0; o < outer; o++) {
    const char *q = p;
    for (int i = 0; i < c->nin - 1; i++) q += idx[i] * c->istride[i];
    if ((c->op == BL_SUM || c->op == BL_MEAN) && c->dtype == BL_F32) {
      double s = 0;
      for (int64_t j = 0; j < inner; j++) s += *(const float *)(q + j * is);
      acc += s;
    } else {
      for (int64_t j = 0; j < inner; j++, flat++) {
        double v = bl_load(c->dtype, q + j * is);
        switch (c->op) {
          case BL_SUM:
          case BL_MEAN: acc += v; break;
          case BL_PROD: acc *= v; break;
          case BL_MAX:
          case BL_ARGMAX:
            if (flat == 0 || v > acc || (v != v && acc == acc)) {
              acc = v;
              best_i = flat;
            }
            break;
          case BL_MIN:
          case BL_ARGMIN:
            if (flat == 0 || v < acc || (v != v && acc == acc)) {
              acc = v;
              best_i = flat;
            }
            break;
        }
      }
    }
    for (int i = c->nin - 2; i >= 0; i--) {
      if (++idx[i] < c->ishape[i]) break;
      idx[i] = 0;
    }
  }
  if (c->op == BL_MEAN) return acc / (double)c->count;
  if (c->op == BL_ARGMAX || c->op == BL_ARGMIN) return (double)best_i;
  return acc;
}

int bl_reduce(int op, bl_tensor *out, const bl_tensor *a, uint32_t dim_mask, int keepdim) {
  if (op < 0 || op >= BL_NUM_REDOPS) return bl_set_error(BL_EINVAL, "reduce: unknown operation %d", op);
  const char *name = redop_names[op];
  BL_CHECK(bl_tensor_check(out, name));
  BL_CHECK(bl_tensor_check(a, name));
  BL_CHECK(bl_check_same_device(out, a, name));
  if (a->ndim < 32 && (dim_mask >> a->ndim))
    return bl_set_error(BL_EINVAL, "%s: dimension out of range for a tensor with %d dims", name, a->ndim);
  red_ctx c = { .op = op, .dtype = a->dtype, .count = 1 };
  int64_t oshape[BL_MAX_DIMS], ostride[BL_MAX_DIMS];
  int no = 0, es = bl_dtype_size(a->dtype);
  int64_t kshape[BL_MAX_DIMS];
  int nk = 0;
  for (int i = 0; i < a->ndim; i++) {
    if (dim_mask & (1u << i)) {
      c.ishape[c.nin] = a->shape[i];
      c.istride[c.nin++] = a->stride[i] * es;
      c.count *= a->shape[i];
      if (keepdim) kshape[nk++] = 1;
    } else {
      oshape[no] = a->shape[i];
      ostride[no++] = a->stride[i] * es;
      kshape[nk++] = a->shape[i];
    }
  }
  int ok = out->ndim == nk;
  for (int i = 0; ok && i < nk; i++) ok = out->shape[i] == kshape[i];
  if (!ok) {
    char x[128], y[128];
    return bl_set_error(BL_EINVAL, "%s: output has shape %s, expected %s", name, BL_SHAPE(out, x),
                        bl_shape_str(nk, kshape, y, sizeof y));
  }
  if (c.count == 0 && (op == BL_MAX || op == BL_MIN || op == BL_ARGMAX || op == BL_ARGMIN))
    return bl_set_error(BL_EINVAL, "%s: cannot reduce over an empty dimension", name);
  if (a->device >= 0) return BL_ON_CUDA(name, a->device, bl_cuda_reduce(op, out, a, dim_mask, keepdim));
  /* output strides aligned with the kept dims */
  int64_t outstr[BL_MAX_DIMS];
  int oe = bl_dtype_size(out->dtype);
  for (int i = 0, k = 0; i < out->ndim; i++) {
    if (keepdim && (dim_mask & (1u << i))) continue;
    outstr[k++] = out->stride[i] * oe;
  }
  int64_t total = 1;
  for (int i = 0; i < no; i++) total *= oshape[i];
#pragma omp parallel for schedule(static) if (total > 64 && c.count * total > 32768)
  for (int64_t t = 0; t < total; t++) {
    int64_t rem = t;
    const char *p = a->data;
    char *q = out->data;
    for (int i = no - 1; i >= 0; i--) {
      int64_t ix = rem % oshape[i];
      rem /= oshape[i];
      p += ix * ostride[i];
      q += ix * outstr[i];
    }
    bl_store(out->dtype, q, reduce_at(&c, p));
  }
  return 0;
}

int bl_reduce_all(int op, const bl_tensor *a, double *result) {
  BL_CHECK(bl_tensor_check(a, "reduce"));
  bl_tensor *o = NULL;
  BL_CHECK(bl_tensor_empty(0, NULL, BL_F64, a->device, &o));
  uint32_t mask = a->ndim ? ((a->ndim >= 32 ? 0xffffffffu : (1u << a->ndim) - 1)) : 0;
  int rc = bl_reduce(op, o, a, mask, 0);
  if (!rc && a->device >= 0)
    rc = bl_dev_memcpy(-1, result, a->device, o->data, sizeof(double));
  else if (!rc)
    *result = *(double *)o->data;
  bl_tensor_free(o);
  return rc;
}
