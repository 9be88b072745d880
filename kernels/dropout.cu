// Philox dropout (contract in bl_ops.h; CPU twin src/ops/dropout.c): optional
// u8 mask out; backward from the mask or by regenerating it. Element i
// (row-major) uses the Philox stream at (seed, offset) exactly as the CPU
// (kernels/philox.cuh). Grid: one thread per element, grid-stride loop, 256
// threads per block; x and y of one dtype (f32, bf16, f16), contiguous, are
// used directly (f32 in registers, one rounding as on the CPU), other operands
// through contiguous f32 images (cu_buf).
#include "common.cuh"
#include "philox.cuh"

namespace {

// y = keep ? x * scale : 0, keep from the mask (mask_in) or Philox; optional u8 mask out.
template <class T>
__global__ void dropout_kernel(T *y, const T *x, const uint8_t *mask_in, uint8_t *mask_out, int64_t n, float p,
                               float scale, uint64_t seed, uint64_t offset) {
  seed = bl_seed_resolve(seed); // a device seed slot (bl_ops.h) read once
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    bool keep = mask_in ? mask_in[i] != 0 : bl_dropout_keep(seed, offset, (uint64_t)i, p);
    from_f(keep ? to_f(x[i]) * scale : 0.0f, &y[i]);
    if (mask_out) mask_out[i] = keep ? 1 : 0;
  }
}

int run_dropout(const char *op, bl_tensor *y, bl_tensor *mask_out, const bl_tensor *mask_in, const bl_tensor *x,
                double p, uint64_t seed, uint64_t offset) {
  int dev;
  const bl_tensor *ts[] = { y, mask_out, mask_in, x };
  BL_CHECK(cu_device(op, 4, ts, &dev));
  BL_CHECK(cu_same_numel(op, y, x));
  BL_CHECK(cu_same_numel(op, mask_out, x));
  BL_CHECK(cu_same_numel(op, mask_in, x));
  if (!(p >= 0.0 && p < 1.0)) return bl_set_error(BL_EINVAL, "%s: dropout probability %g must be in [0, 1)", op, p);
  int64_t n = x->numel;
  if (n == 0) return 0;
  cu_buf bx, by;
  cu_mem min, mout;
  const bool native =
      x->dtype == y->dtype && (x->dtype == BL_BF16 || x->dtype == BL_F16) && cu_is_contig(x) && cu_is_contig(y);
  if (!native) {
    BL_CHECK(cu_load(op, x, &bx));
    BL_CHECK(cu_out(op, y, &by, 0));
  }
  if (mask_in) { // any dtype/strides -> contiguous u8 (nonzero = keep)
    BL_CHECK(min.alloc(op, dev, (size_t)n));
    BL_CHECK(cu_copy_to_contig(op, min.p, BL_BOOL, mask_in));
  }
  if (mask_out) BL_CHECK(mout.alloc(op, dev, (size_t)n));
  const double es = native ? (double)bl_dtype_size(x->dtype) : 4.0;
  cu_cost_kernel(dev, "dropout", "dropout_kernel", 2.0 * es * n + (mask_in ? n : 0) + (mask_out ? n : 0));
  const unsigned grid = cu_blocks(n, 256);
  const float sc = (float)(1.0 / (1.0 - p));
  uint8_t *mi = min.as<uint8_t>(), *mo = mout.as<uint8_t>();
  cudaStream_t s = cu_stream(dev);
  if (!native)
    dropout_kernel<float><<<grid, 256, 0, s>>>(by.p, bx.p, mi, mo, n, (float)p, sc, seed, offset);
  else if (x->dtype == BL_BF16)
    dropout_kernel<__nv_bfloat16><<<grid, 256, 0, s>>>((__nv_bfloat16 *)y->data, (const __nv_bfloat16 *)x->data, mi, mo,
                                                       n, (float)p, sc, seed, offset);
  else
    dropout_kernel<__half>
        <<<grid, 256, 0, s>>>((__half *)y->data, (const __half *)x->data, mi, mo, n, (float)p, sc, seed, offset);
  BL_CHECK(cu_launched(op, dev));
  if (mask_out) BL_CHECK(cu_copy_from_contig(op, mask_out, mout.p, BL_U8));
  return native ? 0 : cu_store(op, y, &by);
}

} // namespace

extern "C" int bl_cuda_dropout_forward(bl_tensor *y, bl_tensor *mask, const bl_tensor *x, double p, uint64_t seed,
                                       uint64_t offset) {
  return run_dropout("dropout", y, mask, nullptr, x, p, seed, offset);
}
extern "C" int bl_cuda_dropout_backward(bl_tensor *dx, const bl_tensor *dy, const bl_tensor *mask, double p,
                                        uint64_t seed, uint64_t offset) {
  return run_dropout("dropout_backward", dx, nullptr, mask, dy, p, seed, offset);
}
