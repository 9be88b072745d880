// Shared plumbing of the CUDA kernels (internal to kernels/*.cu).
//
// - Error handling: every CUDA call is checked; failures become
//   bl_set_error(BL_EDEVICE, "op: cuda:N: <cuda message>"). After each launch
//   cu_launched() checks the launch error (and, in builds without NDEBUG,
//   synchronises so asynchronous faults are attributed to the right op).
// - Streams: every kernel goes to cu_stream(dev), the per-device stream kept by
//   runtime.cu.
// - Operands: cu_buf is the device twin of opx_buf (src/ops/ops_internal.h): a
//   contiguous f32 view of a tensor, in place when the tensor is already f32 and
//   contiguous, else a converted scratch from the caching allocator (RAII: the
//   scratch goes back to the pool when the cu_buf goes out of scope; the pool is
//   stream-ordered because all ops share one stream per device).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
extern "C" {
#include "../src/base/internal.h"
#include "../src/device/cuda_ops.h"
}

// ---------------------------------------------------------------- errors
int cu_err(const char *op, int dev, cudaError_t e);
int cu_launched(const char *op, int dev); // check the last launch
// a host wait for dev made outside runtime.cu (a d2h cudaMemcpy, a stream synchronisation): counted in
// bl_cuda_counters' syncs on a real GPU as the emulator counts it
void cu_count_sync(int dev);
// n bytes of device memory at dptr into host memory by cudaMemcpy (ordered after dev's stream): the host waits,
// charged to the step-time model and counted as above
int cu_read_back(const char *op, int dev, void *host, const void *dptr, size_t n);
cudaStream_t cu_stream(int dev); // never NULL after cu_device() succeeded
bool cu_capturing(int dev);      // dev's stream is being captured into a CUDA graph (runtime.cu)
// All non-NULL tensors on the same cuda device (>= 0) and that device usable.
// Sets *dev. Also makes it current.
int cu_device(const char *op, int n, const bl_tensor *const *ts, int *dev);

// ---------------------------------------------------------------- launch costs (kernels/stepmodel.cu)
// Every launch site states, right before its launch, what the launch costs at minimum: FLOPs on `engine`
// (BL_ENGINE_*) and the bytes it must move to and from device memory (each input read once, each output written
// once, at the dtype it is stored in). Logged only while bl_cuda_record_begin is active on `dev`; `cls` must be a
// string literal (`name` is copied). cu_cost_kernel precedes a <<<>>> launch; cu_cost_call stands for work that is
// not a kernel of ours (cuBLASLt call, memset, copy).
void cu_cost_kernel(int dev, const char *cls, const char *name, double bytes, double flops = 0,
                    int engine = BL_ENGINE_MEM);
void cu_cost_call(int dev, const char *cls, const char *name, int engine, double flops, double bytes);
// A launch whose work depends on device data: `bytes` and `flops` plus bytes_per and flops_per times the int at
// `slot`, which the step's earlier work writes (read at bl_cuda_record_end). cu_cost_slot: a device int, zero, for
// such a count while dev is being recorded, else (or when the recording's slots are used up) nullptr.
void cu_cost_kernel_per(int dev, const char *cls, const char *name, double bytes, double flops, int engine,
                        const int *slot, double bytes_per, double flops_per);
int *cu_cost_slot(int dev);
static inline double cu_bytes(const bl_tensor *t) { return t ? (double)t->numel * bl_dtype_size(t->dtype) : 0.0; }

#define CU_TRY(op, dev, expr)                          \
  do {                                                 \
    cudaError_t e_ = (expr);                           \
    if (e_ != cudaSuccess) return cu_err(op, dev, e_); \
  } while (0)

// Operands of an elementwise op have the same number of elements (NULL operands are skipped).
static inline int cu_same_numel(const char *op, const bl_tensor *a, const bl_tensor *b) {
  if (a && b && a->numel != b->numel)
    return bl_set_error(BL_EINVAL, "%s: operands have %lld and %lld elements", op, (long long)a->numel,
                        (long long)b->numel);
  return 0;
}

// BL_CUDA_MAX_GRID=N (N > 0) caps every cu_blocks grid at N blocks, so each grid-stride loop makes several passes
// at test sizes, not only above 134M elements (CI runs the op tests with N=2; runtime.cu reads it once).
int64_t cu_grid_cap();
// Blocks of `threads` for n items, at most `cap`: kernels launched with it loop over their items grid-stride.
static inline unsigned cu_blocks(int64_t n, int threads, int64_t cap = 65535LL * 8) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > cap) b = cap;
  if (b > cu_grid_cap()) b = cu_grid_cap();
  return (unsigned)b;
}

// ---------------------------------------------------------------- device memory (RAII)
struct cu_mem {
  int dev = -1;
  void *p = nullptr;
  cu_mem() = default;
  cu_mem(const cu_mem &) = delete;
  cu_mem &operator=(const cu_mem &) = delete;
  ~cu_mem() {
    if (p) bl_dev_free(dev, p);
  }
  int alloc(const char *op, int device, size_t bytes); // bytes may be 0 (allocates a minimum block)
  template <class T>
  T *as() const {
    return (T *)p;
  }
};

// ---------------------------------------------------------------- f32 operand images
struct cu_buf {
  float *p = nullptr;
  int64_t n = 0;
  cu_mem mem; // owns the scratch when the tensor could not be used in place
  bool owned() const { return mem.p != nullptr; }
};
int cu_is_contig(const bl_tensor *t);
int cu_load(const char *op, const bl_tensor *t, cu_buf *b);    // read view
int cu_out(const char *op, bl_tensor *t, cu_buf *b, int keep); // writable view (keep: load current values)
int cu_store(const char *op, bl_tensor *t, cu_buf *b);         // write back a scratch (no-op in place)
// Index tensor (i32/i64, any strides) as a contiguous int64 device array.
int cu_load_ids(const char *op, const bl_tensor *t, cu_mem *ids);
// out[j] += sum_r x[r*cols + j] (f32, contiguous x), deterministic two-stage column sum.
int cu_colsum_acc(const char *op, int dev, const float *x, int64_t rows, int64_t cols, float *out);
// The same over a contiguous bf16/f16 tensor read directly; BL_EUNSUPPORTED (no error set) for anything else.
int cu_colsum_acc_native(const char *op, int dev, const bl_tensor *x, int64_t rows, int64_t cols, float *out);
// Copy raw typed data: contiguous src of `dtype_src` -> tensor dst (any strides/dtype).
// Used by ops that produce a contiguous result of another dtype (argmax: i64 -> i32).
int cu_copy_from_contig(const char *op, bl_tensor *dst, const void *src, int src_dtype);
// bl_cuda_tensor_copy for headers made by a kernel file over its own scratch (no storage: the public entry point
// rejects those as freed tensors). src broadcasts to dst.
int cu_copy_header(const char *op, int dev, const bl_tensor *dst, const bl_tensor *src);
// The reverse: tensor src (any strides/dtype) -> contiguous dst of `dst_dtype` (src->numel elements).
int cu_copy_to_contig(const char *op, void *dst, int dst_dtype, const bl_tensor *src);
// Generic conversions (dtype-changing copies through the strided copy kernel) launched on `dev` since start: the
// f32 images of the ops without a native path for their operands (bl_cuda_counters reports them).
int64_t cu_conversions(int dev);
// Read the first index (row-major) where a device int64 flag array is set; helpers for validation.
int cu_read_i64(const char *op, int dev, const int64_t *dptr, int64_t *host, int n);
// Deferred index checks (kernels/deferred.cu): whether they are on for dev, and the check itself for an op's own
// int64 index image `ids` (bad entries, those outside [0, limit) other than `ignore` when has_ignore, become
// `safe`; the first is recorded for bl_cuda_check_deferred).
bool cu_checks_deferred(int dev);
int cu_defer_ids(const char *op, int dev, int64_t *ids, int64_t n, int64_t limit, int has_ignore, int64_t ignore,
                 int64_t safe, const char *what, const char *limit_what);

// ---------------------------------------------------------------- device helpers
// Storage <-> f32 registers for kernels that read and write bf16/f16 activations directly (round to nearest even).
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ void from_f(float v, float *o) { *o = v; }
__device__ __forceinline__ void from_f(float v, __nv_bfloat16 *o) { *o = __float2bfloat16_rn(v); }
__device__ __forceinline__ void from_f(float v, __half *o) { *o = __float2half_rn(v); }

// V elements of T moved with 16-byte accesses when they fill whole ones (the caller checked the alignment), else
// element by element. A union, not a cast of t, so a host compiler (the emulated build) sees no aliasing violation.
template <class T, int V>
struct cu_vec {
  static constexpr int kWords = V * sizeof(T) % 16 == 0 ? (int)(V * sizeof(T) / 16) : 0;
  union {
    uint4 u[kWords ? kWords : 1];
    T t[V];
  };
  __device__ __forceinline__ cu_vec() {}
  __device__ __forceinline__ void load(const T *p) {
    if constexpr (kWords > 0) {
#pragma unroll
      for (int k = 0; k < kWords; k++) u[k] = ((const uint4 *)p)[k];
    } else {
#pragma unroll
      for (int e = 0; e < V; e++) t[e] = p[e];
    }
  }
  __device__ __forceinline__ void store(T *p) const {
    if constexpr (kWords > 0) {
#pragma unroll
      for (int k = 0; k < kWords; k++) ((uint4 *)p)[k] = u[k];
    } else {
#pragma unroll
      for (int e = 0; e < V; e++) p[e] = t[e];
    }
  }
};

__device__ __forceinline__ float cu_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double cu_warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float cu_warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide sum with a fixed combination order (deterministic for a fixed
// blockDim). blockDim.x must be a multiple of 32 and <= 1024; `sh` has 32
// floats. All threads get the result. Contains __syncthreads: call from
// uniform control flow only.
// The middle of a block reduction: lane 0 of each warp posts its warp's
// result `v` to sh[warp]; returns sh[lane] for the first blockDim.x/32 lanes
// and `fill` for the others, to be reduced once more across the warp.
template <typename T>
__device__ __forceinline__ T cu_block_gather(T v, T *sh, T fill) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads(); // sh may still be read by a previous call
  if (lane == 0) sh[w] = v;
  __syncthreads();
  return lane < nw ? sh[lane] : fill;
}
__device__ __forceinline__ float cu_block_sum(float v, float *sh) {
  return cu_warp_sum(cu_block_gather(cu_warp_sum(v), sh, 0.0f));
}
__device__ __forceinline__ double cu_block_sum_d(double v, double *sh) {
  return cu_warp_sum_d(cu_block_gather(cu_warp_sum_d(v), sh, 0.0));
}
__device__ __forceinline__ float cu_block_max(float v, float *sh) {
  return cu_warp_max(cu_block_gather(cu_warp_max(v), sh, -INFINITY));
}
