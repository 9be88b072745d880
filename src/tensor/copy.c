/* Copies (broadcast, dtype conversion, across devices), fill, element access. */
#include <stdio.h>
#include <stdlib.h>
#include "../base/internal.h"
#include "../device/dispatch.h"

static void copy_inner(int64_t n, char **p, const int64_t *s, void *ctx) {
  const int *dt = ctx; /* dt[0] = dst dtype, dt[1] = src dtype */
  char *d = p[0];
  const char *x = p[1];
  if (dt[0] == dt[1]) {
    int es = bl_dtype_size(dt[0]);
    if (s[0] == es && s[1] == es) {
      memcpy(d, x, (size_t)(n * es));
      return;
    }
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
  char *base[2] = { dst->data, src->data };
  int dt[2] = { dst->dtype, src->dtype };
  bl_foreach(2, base, st, dst->ndim, dst->shape, copy_inner, dt);
  return 0;
}

/* Same-device copy on either side of copy_across (CPU loop or CUDA twin). */
static int copy_on(bl_tensor *dst, const bl_tensor *src) {
  if (dst->device < 0) return copy_cpu(dst, src);
  return BL_ON_CUDA("copy", dst->device, bl_cuda_tensor_copy(dst, src));
}

/* src and dst on different devices, layouts or dtypes differ: make src
 * contiguous on its own device, move its bytes to dst's device, then do the
 * broadcasting/converting/strided copy there. */
static int copy_across(bl_tensor *dst, const bl_tensor *src) {
  bl_tensor *c = NULL, *m = NULL;
  int rc = 0;
  const bl_tensor *s = src;
  if (!bl_tensor_is_contiguous(src)) {
    if ((rc = bl_tensor_empty(src->ndim, src->shape, src->dtype, src->device, &c))) return rc;
    if ((rc = copy_on(c, src))) goto done;
    s = c;
  }
  if ((rc = bl_tensor_empty(s->ndim, s->shape, s->dtype, dst->device, &m))) goto done;
  if ((rc = bl_dev_memcpy(dst->device, m->data, s->device, s->data, bl_tensor_nbytes(s)))) goto done;
  rc = copy_on(dst, m);
done:
  bl_tensor_free(c);
  bl_tensor_free(m);
  return rc;
}

/* [lo, hi): the bytes t's elements occupy (strides may be negative) */
static void byte_span(const bl_tensor *t, uintptr_t *lo, uintptr_t *hi) {
  int64_t es = bl_dtype_size(t->dtype), a = 0, b = 0;
  for (int i = 0; i < t->ndim; i++) {
    int64_t e = (t->shape[i] - 1) * t->stride[i];
    if (e < 0)
      a += e;
    else
      b += e;
  }
  *lo = (uintptr_t)t->data + (uintptr_t)(a * es);
  *hi = (uintptr_t)t->data + (uintptr_t)((b + 1) * es);
}

/* Would writing dst clobber elements of src not yet read? (x:copy_(x:t()) and other views of one storage) */
static int overlaps(const bl_tensor *dst, const bl_tensor *src) {
  if (dst->device != src->device || dst->numel == 0 || src->numel == 0) return 0;
  uintptr_t dl, dh, sl, sh;
  byte_span(dst, &dl, &dh);
  byte_span(src, &sl, &sh);
  if (dl >= sh || sl >= dh) return 0;
  /* the very same elements in the same order: each is read before it is written */
  if (dst->data == src->data && dst->dtype == src->dtype && dst->ndim == src->ndim) {
    int same = 1;
    for (int i = 0; i < dst->ndim; i++)
      if (dst->shape[i] != src->shape[i] || dst->stride[i] != src->stride[i]) same = 0;
    if (same) return 0;
  }
  return 1;
}

int bl_tensor_copy(bl_tensor *dst, const bl_tensor *src) {
  BL_CHECK(bl_tensor_check(dst, "copy"));
  BL_CHECK(bl_tensor_check(src, "copy"));
  BL_CHECK(bl_check_broadcast_to("copy", src, dst));
  if (overlaps(dst, src)) { /* through a contiguous temporary */
    bl_tensor *c = NULL;
    BL_CHECK(bl_tensor_empty(src->ndim, src->shape, src->dtype, src->device, &c));
    int rc = copy_on(c, src);
    if (!rc) rc = bl_tensor_copy(dst, c);
    bl_tensor_free(c);
    return rc;
  }
  if (dst->device < 0 && src->device < 0) return copy_cpu(dst, src);
  /* Across devices or on a GPU: raw bytes move only between contiguous tensors of one
   * dtype and shape; on one GPU the CUDA twin does broadcast, conversion and strides. */
  int same_layout = dst->dtype == src->dtype && dst->numel == src->numel && bl_tensor_is_contiguous(dst) &&
                    bl_tensor_is_contiguous(src);
  for (int i = 0; same_layout && i < dst->ndim; i++)
    if (i >= src->ndim || src->ndim != dst->ndim || src->shape[i] != dst->shape[i]) same_layout = 0;
  if (same_layout) return bl_dev_memcpy(dst->device, dst->data, src->device, src->data, bl_tensor_nbytes(dst));
  if (dst->device >= 0 && dst->device == src->device)
    return BL_ON_CUDA("copy", dst->device, bl_cuda_tensor_copy(dst, src));
  return copy_across(dst, src);
}

/* A value given for an integer tensor must fit it: the conversion clamps (and NaN becomes 0), a user's value is
 * refused instead. at < 0: no element index to name. */
static int check_fits(const bl_tensor *t, double v, const char *op, int64_t at) {
  double lo, hi; /* [lo, hi) */
  const char *range;
  switch (t->dtype) {
    case BL_I32:
      lo = -2147483648.0;
      hi = 2147483648.0;
      range = "-2^31 to 2^31-1";
      break;
    case BL_I64:
      lo = -9223372036854775808.0;
      hi = 9223372036854775808.0;
      range = "-2^63 to 2^63-1";
      break;
    case BL_U8:
      lo = 0;
      hi = 256;
      range = "0 to 255";
      break;
    default: return 0;
  }
  if (v >= lo && v < hi) return 0;
  char where[48] = "";
  if (at >= 0) snprintf(where, sizeof where, " (element %lld)", (long long)at);
  return bl_set_error(BL_EINVAL, "%s: value %.17g%s does not fit dtype %s (%s)", op, v, where, bl_dtype_name(t->dtype),
                      range);
}

/* n elements of es bytes from `one`, in chunks across the OpenMP threads when large (a model's flat
 * gradient buffer is zeroed every step): memset when every byte is 0 (0.0 and integer 0, not -0.0), else
 * the element's bits stored in a loop the compiler vectorises. */
#define FILL_CHUNK (1 << 18) /* bytes per work item */
static void fill_contiguous(void *data, int64_t n, int es, const char *one) {
  int zero = 1;
  for (int k = 0; k < es; k++) zero &= one[k] == 0;
  const int64_t bytes = n * es, nch = (bytes + FILL_CHUNK - 1) / FILL_CHUNK;
#pragma omp parallel for schedule(static) if (nch > 4)
  for (int64_t c = 0; c < nch; c++) {
    int64_t b0 = c * FILL_CHUNK, b1 = b0 + FILL_CHUNK < bytes ? b0 + FILL_CHUNK : bytes; /* multiples of es */
    char *d = (char *)data + b0;
    int64_t m = (b1 - b0) / es;
    if (zero)
      memset(d, 0, (size_t)(b1 - b0));
    else if (es == 4) {
      uint32_t v;
      memcpy(&v, one, 4);
      for (int64_t i = 0; i < m; i++) ((uint32_t *)d)[i] = v;
    } else
      for (int64_t i = 0; i < m; i++) memcpy(d + i * es, one, (size_t)es);
  }
}

int bl_tensor_fill(bl_tensor *t, double value) {
  BL_CHECK(bl_tensor_check(t, "fill"));
  BL_CHECK(check_fits(t, value, "fill", -1));
  if (t->device >= 0) return BL_ON_CUDA("fill", t->device, bl_cuda_tensor_fill(t, value));
  char one[8];
  bl_store(t->dtype, one, value);
  if (bl_tensor_is_contiguous(t)) {
    fill_contiguous(t->data, t->numel, bl_dtype_size(t->dtype), one);
    return 0;
  }
  bl_tensor src = *t;
  src.ndim = 0;
  src.data = one;
  return copy_cpu(t, &src);
}

int bl_tensor_arange(bl_tensor *t, double start, double step) {
  BL_CHECK(bl_tensor_check(t, "arange"));
  if (t->device >= 0) { /* made on the host (a few values), then copied */
    bl_tensor *h = NULL;
    BL_CHECK(bl_tensor_empty(t->ndim, t->shape, t->dtype, -1, &h));
    int rc = bl_tensor_arange(h, start, step);
    if (!rc) rc = bl_tensor_copy(t, h);
    bl_tensor_free(h);
    return rc;
  }
  if (t->ndim != 1) return bl_set_error(BL_EINVAL, "arange: output must be 1-D, got %d dims", t->ndim);
  int es = bl_dtype_size(t->dtype);
  for (int64_t i = 0; i < t->shape[0]; i++)
    bl_store(t->dtype, (char *)t->data + i * t->stride[0] * es, start + (double)i * step);
  return 0;
}

static int element_ptr(const bl_tensor *t, const int64_t *index, const char *op, char **p) {
  BL_CHECK(bl_tensor_check(t, op));
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
  if (t->device >= 0) { /* one element through the host; p is a device address */
    char one[8];
    BL_CHECK(bl_dev_memcpy(-1, one, t->device, p, (size_t)bl_dtype_size(t->dtype)));
    *value = bl_load(t->dtype, one);
    return 0;
  }
  *value = bl_load(t->dtype, p);
  return 0;
}

int bl_tensor_set(bl_tensor *t, const int64_t *index, double value) {
  char *p;
  BL_CHECK(element_ptr(t, index, "set", &p));
  if (t->device >= 0) {
    char one[8];
    bl_store(t->dtype, one, value);
    return bl_dev_memcpy(t->device, p, -1, one, (size_t)bl_dtype_size(t->dtype));
  }
  bl_store(t->dtype, p, value);
  return 0;
}

int bl_tensor_to_doubles(const bl_tensor *t, double *out, int64_t n) {
  BL_CHECK(bl_tensor_check(t, "to_doubles"));
  if (n != t->numel)
    return bl_set_error(BL_EINVAL, "to_doubles: buffer has %lld slots, tensor has %lld elements", (long long)n,
                        (long long)t->numel);
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
  if (n != t->numel)
    return bl_set_error(BL_EINVAL, "from_doubles: %lld values given for a tensor of %lld elements", (long long)n,
                        (long long)t->numel);
  if (t->dtype == BL_I32 || t->dtype == BL_I64 || t->dtype == BL_U8)
    for (int64_t i = 0; i < n; i++) BL_CHECK(check_fits(t, in[i], "from", n > 1 ? i : -1));
  bl_tensor *s = NULL;
  BL_CHECK(bl_tensor_wrap((void *)in, t->ndim, t->shape, NULL, BL_F64, -1, &s));
  int rc = bl_tensor_copy(t, s);
  bl_tensor_free(s);
  return rc;
}
