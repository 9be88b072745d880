/* Copies (broadcast, dtype conversion, across devices), fill, element access. */
#include <stdlib.h>
#include "../base/internal.h"

static void copy_inner(int64_t n, char **p, const int64_t *s, void *ctx) {
  const int *dt = ctx;  /* dt[0] = dst dtype, dt[1] = src dtype */
  char *d = p[0];
  const char *x = p[1];
  if (dt[0] == dt[1]) {
    int es = bl_dtype_size(dt[0]);
    if (s[0] == es && s[1] == es) { memcpy(d, x, (size_t)(n * es)); return; }
    if (dt[0] == BL_F32 || dt[0] == BL_I32) {
      for (int64_t i = 0; i < n; i++) *(uint32_t *)(d + i * s[0]) = *(const uint32_t *)(x + i * s[1]);
      return;
    }
  }
  if (dt[0] == BL_F32 && dt[1] == BL_BF16) {
    for (int64_t i = 0; i < n; i++) *(float *)(d + i * s[0]) = bl_bf16_to_f32(*(const uint16_t *)(x + i * s[1]));
    return;
  }
  if (dt[0] == BL_BF16 && dt[1] == BL_F32) {
    for (int64_t i = 0; i < n; i++) *(uint16_t *)(d + i * s[0]) = bl_f32_to_bf16(*(const float *)(x + i * s[1]));
    return;
  }
  if (dt[0] == BL_F32 && dt[1] == BL_F16) {
    for (int64_t i = 0; i < n; i++) *(float *)(d + i * s[0]) = bl_f16_to_f32(*(const uint16_t *)(x + i * s[1]));
    return;
  }
  if (dt[0] == BL_F16 && dt[1] == BL_F32) {
    for (int64_t i = 0; i < n; i++) *(uint16_t *)(d + i * s[0]) = bl_f32_to_f16(*(const float *)(x + i * s[1]));
    return;
  }
  if (dt[0] == BL_I64 && dt[1] == BL_I64) {
    for (int64_t i = 0; i < n; i++) *(int64_t *)(d + i * s[0]) = *(const int64_t *)(x + i * s[1]);
    return;
  }
  for (int64_t i = 0; i < n; i++) bl_store(dt[0], d + i * s[0], bl_load(dt[1], x + i * s[1]));
}

/* CPU-side strided, broadcasting, converting copy. */
static int copy_cpu(bl_tensor *dst, const bl_tensor *src) {
  int64_t st[2][BL_MAX_DIMS];
  for (int i = 0; i < dst->ndim; i++) st[0][i] = dst->stride[i] * bl_dtype_size(dst->dtype);
  bl_broadcast_strides_bytes(src, dst->ndim, dst->shape, st[1]);
  char *base[2] = {dst->data, src->data};
  int dt[2] = {dst->dtype, src->dtype};
  bl_foreach(2, base, st, dst->ndim, dst->shape, copy_inner, dt);
  return 0;
}

static int check_broadcastable(const bl_tensor *dst, const bl_tensor *src, const char *op) {
  char a[128], b[128];
  if (src->ndim > dst->ndim) goto fail;
  for (int i = 0; i < src->ndim; i++) {
    int64_t s = src->shape[src->ndim - 1 - i], d = dst->shape[dst->ndim - 1 - i];
    if (s != d && s != 1) goto fail;
  }
  return 0;
fail:
  return bl_set_error(BL_EINVAL, "%s: source of shape %s cannot be broadcast to %s", op, BL_SHAPE(src, a), BL_SHAPE(dst, b));
}

int bl_tensor_copy(bl_tensor *dst, const bl_tensor *src) {
  BL_CHECK(bl_tensor_check(dst, "copy"));
  BL_CHECK(bl_tensor_check(src, "copy"));
  BL_CHECK(check_broadcastable(dst, src, "copy"));
  if (dst->device < 0 && src->device < 0) return copy_cpu(dst, src);
  /* Across devices or on a GPU: raw bytes move only between contiguous tensors of one
   * dtype and shape; otherwise stage through a contiguous host tensor. */
  int same_layout = dst->dtype == src->dtype && dst->numel == src->numel && bl_tensor_is_contiguous(dst) &&
                    bl_tensor_is_contiguous(src);
  for (int i = 0; same_layout && i < dst->ndim; i++)
    if (i >= src->ndim || src->ndim != dst->ndim || src->shape[i] != dst->shape[i]) same_layout = 0;
  if (same_layout)
    return bl_dev_memcpy(dst->device, dst->data, src->device, src->data, bl_tensor_nbytes(dst));
  bl_tensor *hs = NULL, *hd = NULL;
  int rc = 0;
  const bl_tensor *s = src;
  if (src->device >= 0) {
    if (!bl_tensor_is_contiguous(src))
      return bl_set_error(BL_EUNSUPPORTED, "copy: non-contiguous source on cuda:%d is not supported yet", src->device);
    if ((rc = bl_tensor_empty(src->ndim, src->shape, src->dtype, -1, &hs))) return rc;
    if ((rc = bl_dev_memcpy(-1, hs->data, src->device, src->data, bl_tensor_nbytes(src)))) goto done;
    s = hs;
  }
  if (dst->device < 0) { rc = copy_cpu(dst, s); goto done; }
  if (!bl_tensor_is_contiguous(dst)) {
    rc = bl_set_error(BL_EUNSUPPORTED, "copy: non-contiguous destination on cuda:%d is not supported yet", dst->device);
    goto done;
  }
  if ((rc = bl_tensor_empty(dst->ndim, dst->shape, dst->dtype, -1, &hd))) goto done;
  if ((rc = copy_cpu(hd, s))) goto done;
  rc = bl_dev_memcpy(dst->device, dst->data, -1, hd->data, bl_tensor_nbytes(dst));
done:
  bl_tensor_free(hs);
  bl_tensor_free(hd);
  return rc;
}

int bl_tensor_fill(bl_tensor *t, double value) {
  BL_CHECK(bl_tensor_check(t, "fill"));
  if (t->device >= 0) {
    bl_tensor *h = NULL;
    BL_CHECK(bl_tensor_empty(0, NULL, t->dtype, -1, &h));
    bl_store(h->dtype, h->data, value);
    int rc = bl_tensor_copy(t, h);
    bl_tensor_free(h);
    return rc;
  }
  char one[8];
  bl_store(t->dtype, one, value);
  bl_tensor src = *t;
  src.ndim = 0;
  src.data = one;
  return copy_cpu(t, &src);
}

int bl_tensor_arange(bl_tensor *t, double start, double step) {
  BL_CHECK(bl_tensor_check(t, "arange"));
  BL_CHECK(bl_check_cpu(t, "arange", "output"));
  if (t->ndim != 1) return bl_set_error(BL_EINVAL, "arange: output must be 1-D, got %d dims", t->ndim);
  int es = bl_dtype_size(t->dtype);
  for (int64_t i = 0; i < t->shape[0]; i++)
    bl_store(t->dtype, (char *)t->data + i * t->stride[0] * es, start + (double)i * step);
  return 0;
}

static int element_ptr(const bl_tensor *t, const int64_t *index, const char *op, char **p) {
  BL_CHECK(bl_tensor_check(t, op));
  BL_CHECK(bl_check_cpu(t, op, "tensor"));
  int64_t off = 0;
  for (int i = 0; i < t->ndim; i++) {
    if (index[i] < 0 || index[i] >= t->shape[i]) {
      char a[128];
      return bl_set_error(BL_EINVAL, "%s: index %lld is out of range for dimension %d of a tensor of shape %s", op,
                          (long long)index[i], i, BL_SHAPE(t, a));
    }
    off += index[i] * t->stride[i];
  }
  *p = (char *)t->data + off * bl_dtype_size(t->dtype);
  return 0;
}

int bl_tensor_get(const bl_tensor *t, const int64_t *index, double *value) {
  char *p;
  BL_CHECK(element_ptr(t, index, "get", &p));
  *value = bl_load(t->dtype, p);
  return 0;
}

int bl_tensor_set(bl_tensor *t, const int64_t *index, double value) {
  char *p;
  BL_CHECK(element_ptr(t, index, "set", &p));
  bl_store(t->dtype, p, value);
  return 0;
}

int bl_tensor_to_doubles(const bl_tensor *t, double *out, int64_t n) {
  BL_CHECK(bl_tensor_check(t, "to_doubles"));
  if (n != t->numel) return bl_set_error(BL_EINVAL, "to_doubles: buffer has %lld slots, tensor has %lld elements", (long long)n, (long long)t->numel);
  bl_tensor *d = NULL;
  int64_t shape1 = n;
  BL_CHECK(bl_tensor_wrap(out, t->ndim, t->shape, NULL, BL_F64, -1, &d));
  (void)shape1;
  int rc = bl_tensor_copy(d, t);
  bl_tensor_free(d);
  return rc;
}

int bl_tensor_from_doubles(bl_tensor *t, const double *in, int64_t n) {
  BL_CHECK(bl_tensor_check(t, "from_doubles"));
  if (n != t->numel) return bl_set_error(BL_EINVAL, "from_doubles: %lld values given for a tensor of %lld elements", (long long)n, (long long)t->numel);
  bl_tensor *s = NULL;
  BL_CHECK(bl_tensor_wrap((void *)in, t->ndim, t->shape, NULL, BL_F64, -1, &s));
  int rc = bl_tensor_copy(t, s);
  bl_tensor_free(s);
  return rc;
}
