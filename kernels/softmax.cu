// Softmax over the last dim with an optional additive mask broadcast to the
// input (BERT's [B,1,1,S] extended mask is read through zero strides, never
// expanded), and its backward dx = y (dy - sum(dy y)) (contracts in bl_ops.h).
// One block per row (up to 256 threads over the row); block max / sums use
// the fixed-order tree of common.cuh (deterministic). The forward writes
// x + mask into y first and re-reads it (same thread, same columns).
#include "common.cuh"

namespace {

struct mask_map {
  int nd;
  int64_t shape[BL_MAX_DIMS]; // input shape
  int64_t st[BL_MAX_DIMS];    // mask strides (elements of the contiguous mask image) aligned to input dims
};

__global__ void softmax_fwd(float *y, const float *x, const float *mask, mask_map mm, int64_t rows, int64_t n) {
  __shared__ float sh[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float *xr = x + r * n;
    float *yr = y + r * n;
    const float *mr = nullptr;
    int64_t ms = 0;
    if (mask) {
      int64_t moff = 0, rem = r;
      for (int d = mm.nd - 2; d >= 0; d--) {
        moff += (rem % mm.shape[d]) * mm.st[d];
        rem /= mm.shape[d];
      }
      mr = mask + moff;
      ms = mm.st[mm.nd - 1];
    }
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      float v = mr ? xr[j] + mr[j * ms] : xr[j];
      yr[j] = v;
      mx = v > mx ? v : mx;
    }
    mx = cu_block_max(mx, sh);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      float e = expf(yr[j] - mx);
      yr[j] = e;
      sum += e;
    }
    const float inv = 1.0f / cu_block_sum(sum, sh);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) yr[j] *= inv;
  }
}

__global__ void softmax_bwd(float *dx, const float *dy, const float *y, int64_t rows, int64_t n) {
  __shared__ float sh[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float *g = dy + r * n, *yr = y + r * n;
    float dot = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) dot += g[j] * yr[j];
    dot = cu_block_sum(dot, sh);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) dx[r * n + j] = yr[j] * (g[j] - dot);
  }
}

int threads_for(int64_t n) {
  int t = 32;
  while (t < 256 && t < n) t <<= 1;
  return t;
}

} // namespace

extern "C" int bl_cuda_softmax_forward(bl_tensor *y, const bl_tensor *x, const bl_tensor *mask) {
  const char *op = "softmax";
  int dev;
  const bl_tensor *ts[] = { y, x, mask };
  BL_CHECK(cu_device(op, 3, ts, &dev));
  if (x->ndim < 1 || x->shape[x->ndim - 1] < 1)
    return bl_set_error(BL_EINVAL, "%s: input needs a non-empty last dim", op);
  if (y->numel != x->numel) return bl_set_error(BL_EINVAL, "%s: output does not match input", op);
  mask_map mm;
  memset(&mm, 0, sizeof mm);
  mm.nd = x->ndim;
  for (int d = 0; d < x->ndim; d++) mm.shape[d] = x->shape[d];
  if (mask) { // same rule as the CPU's mask_strides
    if (mask->ndim > x->ndim) return bl_set_error(BL_EINVAL, "%s: mask has more dims than input", op);
    int64_t s = 1;
    for (int d = x->ndim - 1; d >= 0; d--) {
      int md = d - (x->ndim - mask->ndim);
      if (md < 0) {
        mm.st[d] = 0;
        continue;
      }
      if (mask->shape[md] == x->shape[d])
        mm.st[d] = mask->shape[md] == 1 ? 0 : s;
      else if (mask->shape[md] == 1)
        mm.st[d] = 0;
      else
        return bl_set_error(BL_EINVAL, "%s: mask cannot be broadcast to the input", op);
      s *= mask->shape[md];
    }
  }
  int64_t n = x->shape[x->ndim - 1], rows = x->numel / n;
  if (rows == 0) return 0;
  cu_buf bx, bm, by;
  BL_CHECK(cu_load(op, x, &bx));
  if (mask) BL_CHECK(cu_load(op, mask, &bm));
  BL_CHECK(cu_out(op, y, &by, 0));
  cu_cost_kernel(dev, "softmax", "softmax_fwd", 8.0 * x->numel + (mask ? 4.0 * mask->numel : 0));
  softmax_fwd<<<cu_blocks(rows, 1, 1 << 20), threads_for(n), 0, cu_stream(dev)>>>(by.p, bx.p, mask ? bm.p : nullptr, mm,
                                                                                  rows, n);
  BL_CHECK(cu_launched(op, dev));
  return cu_store(op, y, &by);
}

extern "C" int bl_cuda_softmax_backward(bl_tensor *dx, const bl_tensor *dy, const bl_tensor *y) {
  const char *op = "softmax_backward";
  int dev;
  const bl_tensor *ts[] = { dx, dy, y };
  BL_CHECK(cu_device(op, 3, ts, &dev));
  if (y->ndim < 1 || dy->numel != y->numel || dx->numel != y->numel)
    return bl_set_error(BL_EINVAL, "%s: gradients do not match the output", op);
  int64_t n = y->shape[y->ndim - 1], rows = n ? y->numel / n : 0;
  if (rows == 0) return 0;
  cu_buf bdy, by, bdx;
  BL_CHECK(cu_load(op, dy, &bdy));
  BL_CHECK(cu_load(op, y, &by));
  BL_CHECK(cu_out(op, dx, &bdx, 0));
  cu_cost_kernel(dev, "softmax", "softmax_bwd", 12.0 * y->numel);
  softmax_bwd<<<cu_blocks(rows, 1, 1 << 20), threads_for(n), 0, cu_stream(dev)>>>(bdx.p, bdy.p, by.p, rows, n);
  BL_CHECK(cu_launched(op, dev));
  return cu_store(op, dx, &bdx);
}
