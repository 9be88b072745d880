/* Tensor headers, refcounted storage and views. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include "../base/internal.h"

static _Atomic int64_t bytes_in_use;

int64_t bl_storage_bytes_in_use(void) { return atomic_load(&bytes_in_use); }

static int check_shape(const char *op, int ndim, const int64_t *shape, int64_t *numel) {
  if (ndim < 0 || ndim > BL_MAX_DIMS)
    return bl_set_error(BL_EINVAL, "%s: %d dimensions requested, at most %d are supported", op, ndim, BL_MAX_DIMS);
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) {
      char buf[128];
      return bl_set_error(BL_EINVAL, "%s: negative size in shape %s", op, bl_shape_str(ndim, shape, buf, sizeof buf));
    }
    if (shape[i] && n > INT64_MAX / 16 / shape[i]) return bl_set_error(BL_EINVAL, "%s: shape is too large", op);
    n *= shape[i];
  }
  *numel = n;
  return 0;
}

static void set_contiguous_strides(bl_tensor *t) {
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    t->stride[i] = s;
    s *= t->shape[i] ? t->shape[i] : 1;
  }
}

static bl_tensor *new_header(void) { return calloc(1, sizeof(bl_tensor)); }

int bl_tensor_empty(int ndim, const int64_t *shape, int dtype, int device, bl_tensor **res) {
  int64_t numel;
  *res = NULL;
  BL_CHECK(check_shape("empty", ndim, shape, &numel));
  if (bl_dtype_size(dtype) == 0) return bl_set_error(BL_EINVAL, "empty: unknown dtype %d", dtype);
  if (device >= 0) BL_CHECK(bl_dev_check(device, "empty"));
  size_t nbytes = (size_t)numel * (size_t)bl_dtype_size(dtype);
  bl_storage *s = calloc(1, sizeof *s);
  bl_tensor *t = new_header();
  if (!s || !t) {
    free(s);
    free(t);
    return bl_set_error(BL_ENOMEM, "empty: out of memory for the tensor header");
  }
  size_t alloc = nbytes ? nbytes : 1;
  if (device < 0) {
    s->data = bl_cpu_alloc(alloc);
    if (!s->data) {
      free(s);
      free(t);
      char buf[128];
      return bl_set_error(BL_ENOMEM, "empty: cannot allocate %zu bytes for a %s tensor of shape %s", nbytes,
                          bl_dtype_name(dtype), bl_shape_str(ndim, shape, buf, sizeof buf));
    }
  } else {
    int rc = bl_dev_malloc(device, alloc, &s->data);
    if (rc) {
      free(s);
      free(t);
      return rc;
    }
  }
  s->nbytes = nbytes;
  s->owned = 1;
  s->refcount = 1;
  s->device = device;
  atomic_fetch_add(&bytes_in_use, (int64_t)nbytes);
  t->storage = s;
  t->data = s->data;
  t->ndim = ndim;
  t->dtype = dtype;
  t->device = device;
  t->numel = numel;
  for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
  set_contiguous_strides(t);
  *res = t;
  return 0;
}

int bl_tensor_wrap(void *data, int ndim, const int64_t *shape, const int64_t *stride, int dtype, int device,
                   bl_tensor **res) {
  int64_t numel;
  *res = NULL;
  BL_CHECK(check_shape("wrap", ndim, shape, &numel));
  if (bl_dtype_size(dtype) == 0) return bl_set_error(BL_EINVAL, "wrap: unknown dtype %d", dtype);
  if (!data && numel) return bl_set_error(BL_EINVAL, "wrap: NULL data for a non-empty tensor");
  bl_storage *s = calloc(1, sizeof *s);
  bl_tensor *t = new_header();
  if (!s || !t) {
    free(s);
    free(t);
    return bl_set_error(BL_ENOMEM, "wrap: out of memory");
  }
  s->data = data;
  s->nbytes = (size_t)numel * (size_t)bl_dtype_size(dtype);
  s->owned = 0; /* the caller keeps the memory */
  s->refcount = 1;
  s->device = device;
  t->storage = s;
  t->data = data;
  t->ndim = ndim;
  t->dtype = dtype;
  t->device = device;
  t->numel = numel;
  for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
  if (stride)
    for (int i = 0; i < ndim; i++) t->stride[i] = stride[i];
  else
    set_contiguous_strides(t);
  *res = t;
  return 0;
}

static void storage_unref(bl_storage *s) {
  if (!s) return;
  if (--s->refcount > 0) return;
  if (s->owned) {
    if (s->device < 0)
      bl_cpu_free(s->data, s->nbytes ? s->nbytes : 1);
    else
      bl_dev_free(s->device, s->data);
    atomic_fetch_sub(&bytes_in_use, (int64_t)s->nbytes);
  }
  free(s);
}

void bl_tensor_release(bl_tensor *t) {
  if (!t || !t->storage) return;
  storage_unref(t->storage);
  t->storage = NULL;
  t->data = NULL;
}

void bl_tensor_free_header(bl_tensor *t) { free(t); }

void bl_tensor_free(bl_tensor *t) {
  if (!t) return;
  bl_tensor_release(t);
  free(t);
}

int bl_tensor_check(const bl_tensor *t, const char *op) {
  if (!t) return bl_set_error(BL_EINVAL, "%s: tensor is nil", op);
  if (!t->storage) return bl_set_error(BL_EINVAL, "%s: tensor was freed", op);
  return 0;
}

int bl_tensor_is_contiguous(const bl_tensor *t) {
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->stride[i] != s) return 0;
    s *= t->shape[i];
  }
  return 1;
}

size_t bl_tensor_nbytes(const bl_tensor *t) { return (size_t)t->numel * (size_t)bl_dtype_size(t->dtype); }

/* A new header sharing t's storage. */
static int share(const bl_tensor *t, bl_tensor **res) {
  bl_tensor *v = new_header();
  if (!v) return bl_set_error(BL_ENOMEM, "view: out of memory");
  *v = *t;
  v->storage->refcount++;
  *res = v;
  return 0;
}

static void recompute(bl_tensor *v) {
  int64_t n = 1;
  for (int i = 0; i < v->ndim; i++) n *= v->shape[i];
  v->numel = n;
  v->data = (char *)v->storage->data + v->offset * bl_dtype_size(v->dtype);
}

int bl_tensor_alias(const bl_tensor *t, bl_tensor **res) {
  BL_CHECK(bl_tensor_check(t, "alias"));
  return share(t, res);
}

/* Reshape without copying: possible when each new dim maps to a run of old dims
 * that are mutually contiguous (the usual "view" rule). */
int bl_tensor_view(const bl_tensor *t, int ndim, const int64_t *shape, bl_tensor **res) {
  BL_CHECK(bl_tensor_check(t, "view"));
  int64_t numel;
  BL_CHECK(check_shape("view", ndim, shape, &numel));
  char a[128], b[128];
  if (numel != t->numel)
    return bl_set_error(BL_EINVAL, "view: shape %s has %lld elements, the tensor %s has %lld",
                        bl_shape_str(ndim, shape, a, sizeof a), (long long)numel, BL_SHAPE(t, b), (long long)t->numel);
  int64_t nstride[BL_MAX_DIMS];
  if (numel == 0 || bl_tensor_is_contiguous(t)) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
      nstride[i] = s;
      s *= shape[i] ? shape[i] : 1;
    }
  } else {
    /* PyTorch's rule: split the old dims into chunks that are contiguous among
     * themselves; each chunk must be covered exactly by a run of new dims. */
    int view_d = ndim - 1;
    int64_t chunk_base = t->stride[t->ndim - 1], tensor_numel = 1, view_numel = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
      tensor_numel *= t->shape[d];
      if (d == 0 || (t->shape[d - 1] != 1 && t->stride[d - 1] != tensor_numel * chunk_base)) {
        while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
          nstride[view_d] = view_numel * chunk_base;
          view_numel *= shape[view_d];
          view_d--;
        }
        if (view_numel != tensor_numel) goto fail;
        if (d > 0) {
          chunk_base = t->stride[d - 1];
          tensor_numel = 1;
          view_numel = 1;
        }
      }
    }
    if (view_d != -1) goto fail;
  }
  BL_CHECK(share(t, res));
  (*res)->ndim = ndim;
  for (int i = 0; i < ndim; i++) {
    (*res)->shape[i] = shape[i];
    (*res)->stride[i] = nstride[i];
  }
  recompute(*res);
  return 0;
fail:
  return bl_set_error(
      BL_EINVAL, "view: cannot view the non-contiguous tensor %s as %s without a copy (use reshape or contiguous())",
      BL_SHAPE(t, a), bl_shape_str(ndim, shape, b, sizeof b));
}

int bl_tensor_as_strided(const bl_tensor *t, int ndim, const int64_t *shape, const int64_t *stride, int64_t offset,
                         bl_tensor **res) {
  BL_CHECK(bl_tensor_check(t, "as_strided"));
  int64_t numel;
  BL_CHECK(check_shape("as_strided", ndim, shape, &numel));
  /* bounds: the largest reachable element must lie within the storage (when it owns its bytes) */
  int64_t lo = offset, hi = offset;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] == 0) {
      lo = hi = offset;
      numel = 0;
      break;
    }
    if (stride[i] >= 0)
      hi += stride[i] * (shape[i] - 1);
    else
      lo += stride[i] * (shape[i] - 1);
  }
  size_t cap = t->storage->nbytes / (size_t)bl_dtype_size(t->dtype);
  if (numel && (lo < 0 || (size_t)hi >= cap))
    return bl_set_error(BL_EINVAL, "as_strided: view reaches elements [%lld, %lld] outside the storage of %zu elements",
                        (long long)lo, (long long)hi, cap);
  BL_CHECK(share(t, res));
  bl_tensor *v = *res;
  v->ndim = ndim;
  v->offset = offset;
  for (int i = 0; i < ndim; i++) {
    v->shape[i] = shape[i];
    v->stride[i] = stride[i];
  }
  recompute(v);
  return 0;
}

static int norm_dim(const bl_tensor *t, int *d, const char *op, int extra) {
  int n = t->ndim + extra;
  if (*d < 0) *d += n;
  if (*d < 0 || *d >= n) return bl_set_error(BL_EINVAL, "%s: dimension out of range (tensor has %d dims)", op, t->ndim);
  return 0;
}

int bl_tensor_permute(const bl_tensor *t, const int *perm, bl_tensor **res) {
  BL_CHECK(bl_tensor_check(t, "permute"));
  int seen[BL_MAX_DIMS] = { 0 };
  for (int i = 0; i < t->ndim; i++) {
    if (perm[i] < 0 || perm[i] >= t->ndim || seen[perm[i]])
      return bl_set_error(BL_EINVAL, "permute: invalid permutation for a %d-dim tensor", t->ndim);
    seen[perm[i]] = 1;
  }
  BL_CHECK(share(t, res));
  for (int i = 0; i < t->ndim; i++) {
    (*res)->shape[i] = t->shape[perm[i]];
    (*res)->stride[i] = t->stride[perm[i]];
  }
  return 0;
}

int bl_tensor_transpose(const bl_tensor *t, int d0, int d1, bl_tensor **res) {
  BL_CHECK(bl_tensor_check(t, "transpose"));
  BL_CHECK(norm_dim(t, &d0, "transpose", 0));
  BL_CHECK(norm_dim(t, &d1, "transpose", 0));
  int perm[BL_MAX_DIMS];
  for (int i = 0; i < t->ndim; i++) perm[i] = i;
  perm[d0] = d1;
  perm[d1] = d0;
  return bl_tensor_permute(t, perm, res);
}

int bl_tensor_narrow(const bl_tensor *t, int dim, int64_t start, int64_t length, bl_tensor **res) {
  BL_CHECK(bl_tensor_check(t, "narrow"));
  BL_CHECK(norm_dim(t, &dim, "narrow", 0));
  if (start < 0 || length < 0 || start + length > t->shape[dim])
    return bl_set_error(BL_EINVAL, "narrow: range [%lld, %lld) is outside dimension %d of size %lld", (long long)start,
                        (long long)(start + length), dim, (long long)t->shape[dim]);
  BL_CHECK(share(t, res));
  (*res)->shape[dim] = length;
  (*res)->offset += start * t->stride[dim];
  recompute(*res);
  return 0;
}

int bl_tensor_select(const bl_tensor *t, int dim, int64_t index, bl_tensor **res) {
  BL_CHECK(bl_tensor_check(t, "select"));
  BL_CHECK(norm_dim(t, &dim, "select", 0));
  if (index < 0 || index >= t->shape[dim])
    return bl_set_error(BL_EINVAL, "select: index %lld is out of range for dimension %d of size %lld", (long long)index,
                        dim, (long long)t->shape[dim]);
  BL_CHECK(share(t, res));
  bl_tensor *v = *res;
  v->offset += index * t->stride[dim];
  for (int i = dim; i < t->ndim - 1; i++) {
    v->shape[i] = t->shape[i + 1];
    v->stride[i] = t->stride[i + 1];
  }
  v->ndim--;
  recompute(v);
  return 0;
}

int bl_tensor_expand(const bl_tensor *t, int ndim, const int64_t *shape, bl_tensor **res) {
  BL_CHECK(bl_tensor_check(t, "expand"));
  char a[128], b[128];
  if (ndim < t->ndim || ndim > BL_MAX_DIMS)
    return bl_set_error(BL_EINVAL, "expand: cannot expand %s to %d dims", BL_SHAPE(t, a), ndim);
  int64_t nshape[BL_MAX_DIMS], nstride[BL_MAX_DIMS];
  int lead = ndim - t->ndim;
  for (int i = 0; i < ndim; i++) {
    int64_t want = shape[i];
    if (i < lead) {
      if (want < 0) goto fail;
      nshape[i] = want;
      nstride[i] = 0;
    } else {
      int64_t have = t->shape[i - lead];
      if (want == -1 || want == have) {
        nshape[i] = have;
        nstride[i] = t->stride[i - lead];
      } else if (have == 1 && want >= 0) {
        nshape[i] = want;
        nstride[i] = 0;
      } else
        goto fail;
    }
  }
  BL_CHECK(share(t, res));
  (*res)->ndim = ndim;
  for (int i = 0; i < ndim; i++) {
    (*res)->shape[i] = nshape[i];
    (*res)->stride[i] = nstride[i];
  }
  recompute(*res);
  return 0;
fail:
  return bl_set_error(BL_EINVAL, "expand: cannot expand %s to %s", BL_SHAPE(t, a),
                      bl_shape_str(ndim, shape, b, sizeof b));
}

int bl_tensor_unsqueeze(const bl_tensor *t, int dim, bl_tensor **res) {
  BL_CHECK(bl_tensor_check(t, "unsqueeze"));
  BL_CHECK(norm_dim(t, &dim, "unsqueeze", 1));
  if (t->ndim >= BL_MAX_DIMS) return bl_set_error(BL_EINVAL, "unsqueeze: tensor already has %d dims", BL_MAX_DIMS);
  BL_CHECK(share(t, res));
  bl_tensor *v = *res;
  for (int i = t->ndim; i > dim; i--) {
    v->shape[i] = t->shape[i - 1];
    v->stride[i] = t->stride[i - 1];
  }
  v->shape[dim] = 1;
  v->stride[dim] = dim + 1 < v->ndim + 1 && dim < t->ndim ? t->stride[dim] * t->shape[dim] : 1;
  v->ndim++;
  return 0;
}

int bl_tensor_squeeze(const bl_tensor *t, int dim, bl_tensor **res) {
  BL_CHECK(bl_tensor_check(t, "squeeze"));
  BL_CHECK(norm_dim(t, &dim, "squeeze", 0));
  if (t->shape[dim] != 1)
    return bl_set_error(BL_EINVAL, "squeeze: dimension %d has size %lld, not 1", dim, (long long)t->shape[dim]);
  BL_CHECK(share(t, res));
  bl_tensor *v = *res;
  for (int i = dim; i < t->ndim - 1; i++) {
    v->shape[i] = t->shape[i + 1];
    v->stride[i] = t->stride[i + 1];
  }
  v->ndim--;
  return 0;
}
