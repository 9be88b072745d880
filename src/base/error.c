/* Thread-local error messages, dtype tables, version and build info. */
#include <stdarg.h>
#include <stdio.h>
#include <cblas.h>
#include "internal.h"
#ifdef _OPENMP
#include <omp.h>
#endif

static _Thread_local char bl_err_buf[1024];

const char *bl_last_error(void) { return bl_err_buf[0] ? bl_err_buf : "unknown error"; }
void bl_clear_error(void) { bl_err_buf[0] = 0; }

int bl_set_error(int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(bl_err_buf, sizeof bl_err_buf, fmt, ap);
  va_end(ap);
  return status ? status : BL_EINVAL;
}

static const char *const dtype_names[BL_NUM_DTYPES] = { "f32", "f64", "f16", "bf16", "i32", "i64", "u8", "bool" };
static const int dtype_sizes[BL_NUM_DTYPES] = { 4, 8, 2, 2, 4, 8, 1, 1 };

const char *bl_dtype_name(int d) { return d >= 0 && d < BL_NUM_DTYPES ? dtype_names[d] : "invalid"; }
int bl_dtype_size(int d) { return d >= 0 && d < BL_NUM_DTYPES ? dtype_sizes[d] : 0; }
int bl_dtype_is_float(int d) { return d == BL_F32 || d == BL_F64 || d == BL_F16 || d == BL_BF16; }

char *bl_shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
  size_t k = 0;
  k += (size_t)snprintf(buf + k, n - k, "[");
  for (int i = 0; i < ndim && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, i ? ",%lld" : "%lld", (long long)shape[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

const char *bl_device_str(int device, char *buf, size_t n) {
  if (device < 0)
    snprintf(buf, n, "cpu");
  else
    snprintf(buf, n, "cuda:%d", device);
  return buf;
}

const char *bl_version(void) { return BL_VERSION_STRING; }

const char *bl_blas_info(void) {
  static _Thread_local char buf[256];
  snprintf(buf, sizeof buf, "%s", openblas_get_config());
  return buf;
}

int bl_num_threads(void) {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

void bl_set_num_threads(int n) {
  if (n < 1) n = 1;
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
  openblas_set_num_threads(n);
  bl_stop_guard_threads(); /* a larger team's new workers */
}

int bl_check_cpu(const bl_tensor *t, const char *op, const char *name) {
  if (t->device >= 0)
    return bl_set_error(BL_EUNSUPPORTED, "%s: %s is on cuda:%d, this operation is only available on the cpu so far", op,
                        name, t->device);
  return 0;
}

int bl_check_same_device(const bl_tensor *a, const bl_tensor *b, const char *op) {
  if (a->device != b->device) {
    char da[16], db[16];
    return bl_set_error(BL_EINVAL, "%s: tensors are on different devices (%s and %s)", op,
                        bl_device_str(a->device, da, sizeof da), bl_device_str(b->device, db, sizeof db));
  }
  return 0;
}
