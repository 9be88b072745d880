// Metrics (contracts in bl_ops.h; CPU twin src/ops/accuracy.c): argmax over
// the last dim and accuracy. argmax: one block per row (bf16/f16 rows read in
// their own dtype), (value, index) pairs combined with the CPU's rule (first
// NaN wins, else the first maximum).
#include "common.cuh"

namespace {

__device__ __forceinline__ bool am_better(float v, int64_t i, float w, int64_t j) {
  bool vn = v != v, wn = w != w;
  if (vn || wn) return vn && (!wn || i < j);
  if (v != w) return v > w;
  return i < j;
}

template <class T>
__global__ void argmax_rows(const T *x, int64_t rows, int64_t c, int64_t *out) {
  __shared__ float sv[256];
  __shared__ int64_t si[256];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *xr = x + r * c;
    float bv = 0.0f;
    int64_t bi = -1;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const float v = to_f(xr[j]);
      if (bi < 0 || am_better(v, j, bv, bi)) {
        bv = v;
        bi = j;
      }
    }
    sv[threadIdx.x] = bv;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
      if ((int)threadIdx.x < w) {
        int64_t j = si[threadIdx.x + w];
        if (j >= 0 && (si[threadIdx.x] < 0 || am_better(sv[threadIdx.x + w], j, sv[threadIdx.x], si[threadIdx.x]))) {
          sv[threadIdx.x] = sv[threadIdx.x + w];
          si[threadIdx.x] = j;
        }
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) out[r] = si[0];
    __syncthreads();
  }
}

__global__ void acc_count(const int64_t *pred, const int64_t *t, int64_t n, int64_t ignore, unsigned long long *res) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    if (t[i] == ignore) continue;
    atomicAdd(&res[1], 1ull);
    if (pred[i] == t[i]) atomicAdd(&res[0], 1ull);
  }
}
int argmax_into(const char *op, int dev, const bl_tensor *x, cu_mem *res, int64_t *rows_out) {
  if (x->ndim < 1 || x->shape[x->ndim - 1] < 1)
    return bl_set_error(BL_EINVAL, "%s: input needs a non-empty last dim", op);
  int64_t c = x->shape[x->ndim - 1], rows = x->numel / c;
  *rows_out = rows;
  BL_CHECK(res->alloc(op, dev, (size_t)rows * sizeof(int64_t)));
  if (rows == 0) return 0;
  const unsigned grid = cu_blocks(rows, 1, 1 << 20);
  cudaStream_t s = cu_stream(dev);
  int64_t *o = res->as<int64_t>();
  if (cu_is_contig(x) && (x->dtype == BL_BF16 || x->dtype == BL_F16)) { // read in their own dtype
    cu_cost_kernel(dev, "loss", "argmax_rows", (double)bl_dtype_size(x->dtype) * rows * c + 8.0 * rows);
    if (x->dtype == BL_BF16)
      argmax_rows<__nv_bfloat16><<<grid, 256, 0, s>>>((const __nv_bfloat16 *)x->data, rows, c, o);
    else
      argmax_rows<__half><<<grid, 256, 0, s>>>((const __half *)x->data, rows, c, o);
    return cu_launched(op, dev);
  }
  cu_buf bx;
  BL_CHECK(cu_load(op, x, &bx));
  cu_cost_kernel(dev, "loss", "argmax_rows", 4.0 * (double)rows * c + 8.0 * rows);
  argmax_rows<float><<<grid, 256, 0, s>>>(bx.p, rows, c, o);
  return cu_launched(op, dev);
}

} // namespace

extern "C" int bl_cuda_argmax(bl_tensor *out, const bl_tensor *x) {
  const char *op = "argmax";
  int dev;
  const bl_tensor *ts[] = { out, x };
  BL_CHECK(cu_device(op, 2, ts, &dev));
  if (out->dtype != BL_I32 && out->dtype != BL_I64) return bl_set_error(BL_EINVAL, "%s: output must be i32 or i64", op);
  cu_mem res;
  int64_t rows;
  BL_CHECK(argmax_into(op, dev, x, &res, &rows));
  if (out->numel != rows) return bl_set_error(BL_EINVAL, "%s: output does not match input without its last dim", op);
  if (rows == 0) return 0;
  return cu_copy_from_contig(op, out, res.p, BL_I64);
}

extern "C" int bl_cuda_accuracy(const bl_tensor *logits, const bl_tensor *targets, int64_t ignore_index,
                                int64_t *correct, int64_t *count) {
  const char *op = "accuracy";
  if (!correct || !count) return bl_set_error(BL_EINVAL, "%s: correct and count must not be NULL", op);
  int dev;
  const bl_tensor *ts[] = { logits, targets };
  BL_CHECK(cu_device(op, 2, ts, &dev));
  cu_mem pred, t, res;
  int64_t rows;
  BL_CHECK(argmax_into(op, dev, logits, &pred, &rows));
  if (targets->numel != rows) return bl_set_error(BL_EINVAL, "%s: logits and targets are not compatible", op);
  BL_CHECK(cu_load_ids(op, targets, &t));
  BL_CHECK(res.alloc(op, dev, 2 * sizeof(unsigned long long)));
  cu_cost_call(dev, "memset", "cudaMemsetAsync", BL_ENGINE_MEM, 0, 16);
  CU_TRY(op, dev, cudaMemsetAsync(res.p, 0, 2 * sizeof(unsigned long long), cu_stream(dev)));
  if (rows > 0) {
    cu_cost_kernel(dev, "loss", "acc_count", 16.0 * rows);
    acc_count<<<cu_blocks(rows, 256), 256, 0, cu_stream(dev)>>>(pred.as<int64_t>(), t.as<int64_t>(), rows, ignore_index,
                                                                res.as<unsigned long long>());
    BL_CHECK(cu_launched(op, dev));
  }
  int64_t h[2];
  BL_CHECK(cu_read_i64(op, dev, res.as<int64_t>(), h, 2));
  *correct = h[0];
  *count = h[1];
  return 0;
}

extern "C" int bl_cuda_accuracy_add(bl_tensor *acc, const bl_tensor *logits, const bl_tensor *targets,
                                    int64_t ignore_index) {
  const char *op = "accuracy";
  int dev;
  const bl_tensor *ts[] = { acc, logits, targets };
  BL_CHECK(cu_device(op, 3, ts, &dev));
  if (acc->dtype != BL_I64 || acc->numel != 2 || !cu_is_contig(acc))
    return bl_set_error(BL_EINVAL, "%s: the accumulator must be a contiguous i64 tensor of 2 elements", op);
  cu_mem pred, t;
  int64_t rows;
  BL_CHECK(argmax_into(op, dev, logits, &pred, &rows));
  if (targets->numel != rows) return bl_set_error(BL_EINVAL, "%s: logits and targets are not compatible", op);
  if (rows == 0) return 0;
  BL_CHECK(cu_load_ids(op, targets, &t));
  cu_cost_kernel(dev, "loss", "acc_count", 16.0 * rows);
  // acc_count adds with integer atomics: straight into the caller's {correct, count}
  acc_count<<<cu_blocks(rows, 256), 256, 0, cu_stream(dev)>>>(pred.as<int64_t>(), t.as<int64_t>(), rows, ignore_index,
                                                              (unsigned long long *)acc->data);
  return cu_launched(op, dev);
}
