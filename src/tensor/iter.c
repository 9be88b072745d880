/* Strided n-d iteration shared by copies and elementwise ops. Dimensions
 * that are contiguous for every operand are merged, so contiguous tensors
 * become a single run and the inner callback sees long vectors. */
#include "../base/internal.h"

void bl_broadcast_strides(const bl_tensor *t, int ndim, const int64_t *shape, int64_t *out) {
  int lead = ndim - t->ndim;
  for (int i = 0; i < ndim; i++) {
    if (i < lead)
      out[i] = 0;
    else
      out[i] = (t->shape[i - lead] == 1 && shape[i] != 1) ? 0 : t->stride[i - lead];
  }
}

void bl_broadcast_strides_bytes(const bl_tensor *t, int ndim, const int64_t *shape, int64_t *out) {
  int64_t es = bl_dtype_size(t->dtype);
  bl_broadcast_strides(t, ndim, shape, out);
  for (int i = 0; i < ndim; i++) out[i] *= es;
}

int bl_check_out_shape(const char *op, const bl_tensor *out, int n, const int64_t *shape) {
  int same = out->ndim == n;
  for (int i = 0; same && i < n; i++) same = out->shape[i] == shape[i];
  if (!same) {
    char a[128], b[128];
    return bl_set_error(BL_EINVAL, "%s: output has shape %s, expected %s", op, BL_SHAPE(out, a),
                        bl_shape_str(n, shape, b, sizeof b));
  }
  return 0;
}

int bl_check_broadcast_to(const char *op, const bl_tensor *src, const bl_tensor *dst) {
  char a[128], b[128];
  if (src->ndim > dst->ndim) goto fail;
  for (int i = 0; i < src->ndim; i++) {
    int64_t s = src->shape[src->ndim - 1 - i], d = dst->shape[dst->ndim - 1 - i];
    if (s != d && s != 1) goto fail;
  }
  return 0;
fail:
  return bl_set_error(BL_EINVAL, "%s: source of shape %s cannot be broadcast to %s", op, BL_SHAPE(src, a),
                      BL_SHAPE(dst, b));
}

void bl_foreach(int nops, char **base, int64_t strides[][BL_MAX_DIMS], int ndim, const int64_t *shape, bl_inner_fn fn,
                void *ctx) {
  int64_t sh[BL_MAX_DIMS], st[4][BL_MAX_DIMS];
  int nd = 0;
  for (int i = 0; i < ndim; i++)
    if (shape[i] == 0) return;
  /* drop size-1 dims, then merge mergeable neighbours */
  for (int i = 0; i < ndim; i++) {
    if (shape[i] == 1) continue;
    if (nd > 0) {
      int ok = 1;
      for (int k = 0; k < nops; k++)
        if (st[k][nd - 1] != strides[k][i] * shape[i]) {
          ok = 0;
          break;
        }
      if (ok) {
        sh[nd - 1] *= shape[i];
        for (int k = 0; k < nops; k++) st[k][nd - 1] = strides[k][i];
        continue;
      }
    }
    sh[nd] = shape[i];
    for (int k = 0; k < nops; k++) st[k][nd] = strides[k][i];
    nd++;
  }
  char *ptrs[4];
  int64_t inner[4];
  if (nd == 0) { /* a single element */
    for (int k = 0; k < nops; k++) {
      ptrs[k] = base[k];
      inner[k] = 0;
    }
    fn(1, ptrs, inner, ctx);
    return;
  }
  for (int k = 0; k < nops; k++) inner[k] = st[k][nd - 1];
  int64_t idx[BL_MAX_DIMS] = { 0 };
  int64_t outer = 1;
  for (int i = 0; i < nd - 1; i++) outer *= sh[i];
  for (int64_t o = 0; o < outer; o++) {
    for (int k = 0; k < nops; k++) {
      char *p = base[k];
      for (int i = 0; i < nd - 1; i++) p += idx[i] * st[k][i];
      ptrs[k] = p;
    }
    fn(sh[nd - 1], ptrs, inner, ctx);
    for (int i = nd - 2; i >= 0; i--) {
      if (++idx[i] < sh[i]) break;
      idx[i] = 0;
    }
  }
}
