/* bertlua — tensors: storage, views, creation, copies, elementwise math,
 * reductions, matmul, Philox random numbers.
 *
 * A bl_tensor is a strided view (up to 8 dims, outermost first, strides in
 * elements) over a refcounted bl_storage. `data` already includes the view's
 * offset. Ops write into caller-provided outputs (`out`), check shapes,
 * dtypes and devices, and never allocate behind the caller's back except for
 * scratch space. Functions returning bl_tensor* through `**res` allocate a
 * new header that the caller releases with bl_tensor_free (Lua: ffi.gc).
 */
#ifndef BL_TENSOR_H
#define BL_TENSOR_H
#include "bl_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* BL_CDEF_BEGIN */
typedef struct bl_storage {
  void *data;
  size_t nbytes;
  int32_t refcount;
  int32_t device;
  int32_t owned; /* 1: freed with the storage; 0: memory wrapped from the caller */
  int32_t pad_;
} bl_storage;

typedef struct bl_tensor {
  bl_storage *storage; /* NULL once released with bl_tensor_release */
  void *data;          /* first element of this view */
  int64_t shape[8];
  int64_t stride[8];
  int64_t numel;
  int64_t offset; /* in elements from storage->data */
  int32_t ndim;
  int32_t dtype;
  int32_t device;
  int32_t pad_;
} bl_tensor;

/* --- lifetime --- */
int bl_tensor_empty(int ndim, const int64_t *shape, int dtype, int device, bl_tensor **res);
/* Wrap memory the caller owns (not freed by bertlua; caller keeps it alive). */
int bl_tensor_wrap(void *data, int ndim, const int64_t *shape, const int64_t *stride, int dtype, int device,
                   bl_tensor **res);
void bl_tensor_free(bl_tensor *t);    /* drops the header and its storage reference */
void bl_tensor_release(bl_tensor *t); /* drops the storage now, keeps the header (storage=NULL) */
/* Frees only the header memory, keeping the storage reference with whoever copied the
 * header (the Lua side copies headers into GC-managed structs, then calls this). */
void bl_tensor_free_header(bl_tensor *t);
int bl_tensor_check(const bl_tensor *t, const char *op); /* error if released */
int bl_tensor_is_contiguous(const bl_tensor *t);
size_t bl_tensor_nbytes(const bl_tensor *t);
int64_t bl_storage_bytes_in_use(void); /* bytes of live CPU+GPU storages */
/* The CPU block cache (src/tensor/alloc.c): tensors of 256 KiB and more are mapped in size classes, and a
 * freed one is kept for the next tensor of its class, up to limit_bytes of free blocks (BL_CPU_CACHE_MB,
 * default a quarter of the memory up to 4 GiB). */
typedef struct bl_cpu_cache_stats {
  int64_t maps;         /* blocks mapped from the system so far */
  int64_t unmaps;       /* blocks given back so far */
  int64_t hits;         /* allocations served by a cached block */
  int64_t cached_bytes; /* free blocks held now */
  int64_t mapped_bytes; /* all blocks mapped now, in use or free */
  int64_t limit_bytes;  /* bound on cached_bytes (0: nothing is cached) */
} bl_cpu_cache_stats;
void bl_cpu_cache_get_stats(bl_cpu_cache_stats *out);
int64_t bl_cpu_cache_release(void);        /* unmaps every free block; returns the bytes given back */
int bl_cpu_cache_set_limit(int64_t bytes); /* also trims the cache to the new bound */

/* --- views (share storage; new header in *res) --- */
int bl_tensor_view(const bl_tensor *t, int ndim, const int64_t *shape,
                   bl_tensor **res); /* reshape without copy; error if strides forbid */
int bl_tensor_as_strided(const bl_tensor *t, int ndim, const int64_t *shape, const int64_t *stride, int64_t offset,
                         bl_tensor **res);
int bl_tensor_permute(const bl_tensor *t, const int *perm, bl_tensor **res);
int bl_tensor_transpose(const bl_tensor *t, int d0, int d1, bl_tensor **res);
int bl_tensor_narrow(const bl_tensor *t, int dim, int64_t start, int64_t length, bl_tensor **res);
int bl_tensor_select(const bl_tensor *t, int dim, int64_t index, bl_tensor **res);         /* drops dim */
int bl_tensor_expand(const bl_tensor *t, int ndim, const int64_t *shape, bl_tensor **res); /* -1 keeps a dim */
int bl_tensor_unsqueeze(const bl_tensor *t, int dim, bl_tensor **res);
int bl_tensor_squeeze(const bl_tensor *t, int dim, bl_tensor **res); /* dim < 0 ... see docs: dim must have size 1 */
int bl_tensor_alias(const bl_tensor *t, bl_tensor **res);            /* same view, new header */

/* --- data movement --- */
/* dst <- src, broadcasting src to dst's shape, converting dtype, across devices. */
int bl_tensor_copy(bl_tensor *dst, const bl_tensor *src);
int bl_tensor_fill(bl_tensor *t, double value);
int bl_tensor_arange(bl_tensor *t, double start, double step); /* t must be 1-D */
int bl_tensor_get(const bl_tensor *t, const int64_t *index, double *value);
int bl_tensor_set(bl_tensor *t, const int64_t *index, double value);
/* Bulk conversion between a tensor and a host double array (numel values, row-major order). */
int bl_tensor_to_doubles(const bl_tensor *t, double *out, int64_t n);
int bl_tensor_from_doubles(bl_tensor *t, const double *in, int64_t n);
uint16_t bl_f32_to_f16(float x);
float bl_f16_to_f32(uint16_t h);
uint16_t bl_f32_to_bf16(float x);
float bl_bf16_to_f32(uint16_t h);

/* --- elementwise (broadcasting; out has the broadcast shape) --- */
typedef enum bl_binop {
  BL_ADD = 0,
  BL_SUB,
  BL_MUL,
  BL_DIV,
  BL_POW,
  BL_MAXIMUM,
  BL_MINIMUM,
  BL_EQ,
  BL_NE,
  BL_LT,
  BL_LE,
  BL_GT,
  BL_GE,
  BL_NUM_BINOPS
} bl_binop;
typedef enum bl_unop {
  BL_NEG = 0,
  BL_ABS,
  BL_EXP,
  BL_LOG,
  BL_SQRT,
  BL_RSQRT,
  BL_TANH,
  BL_SIGMOID,
  BL_RELU,
  BL_SQUARE,
  BL_RECIPROCAL,
  BL_SIGN,
  BL_FLOOR,
  BL_CEIL,
  BL_ERF,
  BL_NUM_UNOPS
} bl_unop;
int bl_binary(int op, bl_tensor *out, const bl_tensor *a, const bl_tensor *b);
int bl_binary_scalar(int op, bl_tensor *out, const bl_tensor *a, double s, int scalar_first);
int bl_unary(int op, bl_tensor *out, const bl_tensor *a);
/* out = alpha*a + beta (also used for scale/shift). */
int bl_affine(bl_tensor *out, const bl_tensor *a, double alpha, double beta);
/* out = cond ? a : b (cond bool/u8, broadcasting) */
int bl_where(bl_tensor *out, const bl_tensor *cond, const bl_tensor *a, const bl_tensor *b);
int bl_broadcast_shape(int na, const int64_t *sa, int nb, const int64_t *sb, int *nout, int64_t *sout);

/* --- reductions over a set of dims (mask bit d set = reduce dim d) --- */
typedef enum bl_redop { BL_SUM = 0, BL_MEAN, BL_MAX, BL_MIN, BL_ARGMAX, BL_ARGMIN, BL_PROD, BL_NUM_REDOPS } bl_redop;
/* out shape = a's shape with reduced dims set to 1 (keepdim) or removed. */
int bl_reduce(int op, bl_tensor *out, const bl_tensor *a, uint32_t dim_mask, int keepdim);
int bl_reduce_all(int op, const bl_tensor *a, double *result);

/* --- matmul: out[..., m, n] = a[..., m, k] @ b[..., k, n]; batch dims broadcast --- */
int bl_matmul(bl_tensor *out, const bl_tensor *a, const bl_tensor *b);

/* --- random numbers: Philox4x32-10, counter = offset + i/4, lane i%4 --- */
/* Element i of a call uses block (offset + i/4) and lane i%4; blocks used = ceil(numel/4). */
void bl_philox4x32(uint64_t seed, uint64_t counter, uint32_t out[4]);
int bl_rand_uniform(bl_tensor *t, uint64_t seed, uint64_t offset, double low, double high);
int bl_rand_normal(bl_tensor *t, uint64_t seed, uint64_t offset, double mean, double std);
/* flag (one f64 element on cuda:N) = 1 when a deferred index check (bl_cuda_defer_checks, bl_base.h) has
 * recorded an error, else 0; queued, no wait: a loop copies it beside the numbers it reads when logging and calls
 * bl_cuda_check_deferred only when it is set. */
int bl_cuda_deferred_pending(int device, bl_tensor *flag);
/* BL_CDEF_END */

#ifdef __cplusplus
}
#endif
#endif
