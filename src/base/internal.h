/* Internal helpers shared by the C core (not part of the public API). */
#ifndef BL_INTERNAL_H
#define BL_INTERNAL_H
#include <math.h>
#include <string.h>
#include "bl_tensor.h"
#include "rules/convert.h"

/* "[2,3]" into buf; returns buf. */
char *bl_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);
#define BL_SHAPE(t, buf) bl_shape_str((t)->ndim, (t)->shape, buf, sizeof buf)
const char *bl_device_str(int device, char *buf, size_t n);

/* Element load/store through double (generic, slow path). */
static inline double bl_load(int dtype, const void *p) {
  switch (dtype) {
    case BL_F32: return *(const float *)p;
    case BL_F64: return *(const double *)p;
    case BL_F16: return bl_f16_to_f32(*(const uint16_t *)p);
    case BL_BF16: return bl_bf16_to_f32(*(const uint16_t *)p);
    case BL_I32: return *(const int32_t *)p;
    case BL_I64: return (double)*(const int64_t *)p;
    case BL_U8: return *(const uint8_t *)p;
    case BL_BOOL: return *(const uint8_t *)p ? 1.0 : 0.0;
  }
  return 0;
}
static inline void bl_store(int dtype, void *p, double v) {
  switch (dtype) {
    case BL_F32: *(float *)p = (float)v; break;
    case BL_F64: *(double *)p = v; break;
    case BL_F16: *(uint16_t *)p = bl_f32_to_f16((float)v); break;
    case BL_BF16: *(uint16_t *)p = bl_f32_to_bf16((float)v); break;
    case BL_I32: *(int32_t *)p = bl_d2i32(v); break; /* saturating (src/base/rules/convert.h) */
    case BL_I64: *(int64_t *)p = bl_d2i64(v); break;
    case BL_U8: *(uint8_t *)p = bl_d2u8(v); break;
    case BL_BOOL: *(uint8_t *)p = v != 0; break;
  }
}

/* Strided n-d loop: calls fn(n, ptrs, inner_strides_bytes, ctx) for each run of the
 * innermost (coalesced) dimension. strides are in BYTES, one row of BL_MAX_DIMS per operand. */
typedef void (*bl_inner_fn)(int64_t n, char **ptrs, const int64_t *inner_strides, void *ctx);
void bl_foreach(int nops, char **base, int64_t strides[][BL_MAX_DIMS], int ndim, const int64_t *shape, bl_inner_fn fn,
                void *ctx);
/* Strides of t broadcast to (ndim, shape), in elements or in bytes (0 on broadcast dims): the CPU loops and the
 * CUDA kernels' iteration (kernels/elementwise.cu). */
void bl_broadcast_strides(const bl_tensor *t, int ndim, const int64_t *shape, int64_t *out);
void bl_broadcast_strides_bytes(const bl_tensor *t, int ndim, const int64_t *shape, int64_t *out);
/* 0 when out has shape (n, shape), else an error naming op. */
int bl_check_out_shape(const char *op, const bl_tensor *out, int n, const int64_t *shape);
/* 0 when src's shape broadcasts to dst's (trailing dims equal or 1 in src), else an error naming op. */
int bl_check_broadcast_to(const char *op, const bl_tensor *src, const bl_tensor *dst);

int bl_check_cpu(const bl_tensor *t, const char *op, const char *name);
/* After bl_stop_watch: OpenMP workers block SIGINT/SIGTERM (src/base/stop.c says why); call when the team may
 * have grown. */
void bl_stop_guard_threads(void);
int bl_check_same_device(const bl_tensor *a, const bl_tensor *b, const char *op);

/* CPU tensor memory (src/tensor/alloc.c): 64-byte aligned; large blocks come from the block cache.
 * bl_cpu_free takes the byte count the block was allocated with. */
void *bl_cpu_alloc(size_t nbytes);
void bl_cpu_free(void *p, size_t nbytes);

/* Device memory (kernels/runtime.cu, or src/device/cuda_absent.c in CPU-only builds). */
int bl_dev_malloc(int device, size_t n, void **p);
void bl_dev_free(int device, void *p);
/* Downloads (dst_device < 0) return with the bytes in dst (the host waits); uploads and copies on one device are
 * queued on the device's stream and return at once (a pageable source may be reused on return). */
int bl_dev_memcpy(int dst_device, void *dst, int src_device, const void *src, size_t n);
int bl_dev_memset(int device, void *p, int value, size_t n);
int bl_dev_check(int device, const char *op);
#endif
