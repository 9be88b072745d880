// Elementwise activations of the BERT op library (contracts in bl_ops.h):
// GELU (exact erf form) and the fused bias + GELU, the same for the tanh GELU
// (gelu_new), each with its backward (db: deterministic column sum of dx) and
// tanh (backward from the saved output); CPU twin src/ops/activation.c. Grid: one thread per element, grid-stride loop, 256 threads per block;
// operands are contiguous f32 images (cu_buf), bias indexed by i % H.
// bf16/f16 activations (input, grad and output of one dtype, contiguous, rows a
// multiple of 16 bytes) skip those images: act_native reads and writes them with
// 16-byte vectors, f32 only in registers, and sums the bias gradient of the f32
// values in the same kernel (partials per chunk of rows, then act_db_final in
// chunk order: deterministic), as the CPU twin does before it rounds.
#include "common.cuh"

namespace {

#define INV_SQRT2    0.70710678118654752440f
#define INV_SQRT_2PI 0.39894228040143267794f

__device__ __forceinline__ float gelu(float x) { return 0.5f * x * (1.0f + erff(x * INV_SQRT2)); }
__device__ __forceinline__ float gelu_grad(float x) {
  return 0.5f * (1.0f + erff(x * INV_SQRT2)) + x * INV_SQRT_2PI * expf(-0.5f * x * x);
}

// Tanh GELU through the logistic s = 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)), u = K0 (x + K1 x^3): y = x s,
// y' = s + 2 x s (1 - s) K0 (1 + 3 K1 x^2); the CPU twin's formula (no cancellation of 1 + tanh for x << 0).
#define GT_K0 0.7978845608028654f
#define GT_K1 0.044715f
__device__ __forceinline__ float gelu_tanh_s(float x) {
  return 1.0f / (1.0f + expf(-2.0f * GT_K0 * (x + GT_K1 * x * x * x)));
}
__device__ __forceinline__ float gelu_tanh_grad(float x) {
  const float s = gelu_tanh_s(x);
  return s + 2.0f * x * s * (1.0f - s) * GT_K0 * (1.0f + 3.0f * GT_K1 * x * x);
}

enum { K_GELU = 0, K_GELU_BWD, K_TANH, K_TANH_BWD, K_GELU_TANH, K_GELU_TANH_BWD };

// f(x, g) of `kind`; x already has the bias added.
__device__ __forceinline__ float act_apply(int kind, float x, float g) {
  switch (kind) {
    case K_GELU: return gelu(x);
    case K_GELU_BWD: return g * gelu_grad(x);
    case K_TANH: return tanhf(x);
    case K_GELU_TANH: return x * gelu_tanh_s(x);
    case K_GELU_TANH_BWD: return g * gelu_tanh_grad(x);
    default: return g * (1.0f - x * x); // K_TANH_BWD: x is the saved output y
  }
}

// out[i] = f(a[i] (+ b[i % h]), g[i]); kind selects f.
__global__ void act_kernel(int kind, float *out, const float *a, const float *b, const float *g, int64_t n, int64_t h) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float x = a[i];
    if (b) x += b[i % h];
    out[i] = act_apply(kind, x, g ? g[i] : 0.0f);
  }
}

const int kDbRows = 64; // rows per bias-gradient partial (fixed: db does not depend on the launch)

// Block (32, 8) over 32 column vectors of V = 16 / sizeof(T) elements and the kDbRows rows of chunk blockIdx.y; a
// thread takes rows ty, ty + 8, ... of the chunk. part (bias gradient wanted): [chunks, h] f32 column sums.
template <class T, class TB>
__global__ void __launch_bounds__(256)
    act_native(int kind, T *out, const T *a, const TB *b, const T *g, float *part, int64_t rows, int64_t h) {
  constexpr int V = 16 / sizeof(T);
  __shared__ float sh[8][32][V];
  const int64_t j0 = (blockIdx.x * 32LL + threadIdx.x) * V;
  const int64_t r1 = min((int64_t)(blockIdx.y + 1) * kDbRows, rows);
  float acc[V];
#pragma unroll
  for (int e = 0; e < V; e++) acc[e] = 0.0f;
  if (j0 < h) {
    float bias[V];
#pragma unroll
    for (int e = 0; e < V; e++) bias[e] = b ? to_f(b[j0 + e]) : 0.0f;
    for (int64_t r = blockIdx.y * (int64_t)kDbRows + threadIdx.y; r < r1; r += 8) {
      const int64_t i = r * h + j0;
      union {
        uint4 u;
        T t[V];
      } va, vg, vo;
      va.u = *(const uint4 *)(a + i);
      if (g) vg.u = *(const uint4 *)(g + i);
#pragma unroll
      for (int e = 0; e < V; e++) {
        float y = act_apply(kind, to_f(va.t[e]) + bias[e], g ? to_f(vg.t[e]) : 0.0f);
        acc[e] += y;
        from_f(y, &vo.t[e]);
      }
      *(uint4 *)(out + i) = vo.u;
    }
  }
  if (!part) return; // uniform: no barrier is skipped by some threads only
#pragma unroll
  for (int e = 0; e < V; e++) sh[threadIdx.y][threadIdx.x][e] = acc[e];
  __syncthreads();
  if (threadIdx.y == 0 && j0 < h) {
#pragma unroll
    for (int e = 0; e < V; e++) {
      float t = 0.0f;
      for (int k = 0; k < 8; k++) t += sh[k][threadIdx.x][e];
      part[blockIdx.y * h + j0 + e] = t;
    }
  }
}

// db[j] += sum of the chunk partials, in chunk order.
__global__ void act_db_final(const float *part, int64_t nchunk, int64_t h, float *db) {
  for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < h; j += (int64_t)gridDim.x * blockDim.x) {
    float t = 0.0f;
    for (int64_t c = 0; c < nchunk; c++) t += part[c * h + j];
    db[j] += t;
  }
}

template <class T, class TB>
int launch_native(const char *op, int dev, int kind, bl_tensor *out, bl_tensor *db, const bl_tensor *g,
                  const bl_tensor *a, const bl_tensor *b, int64_t rows, int64_t h) {
  const int64_t nchunk = (rows + kDbRows - 1) / kDbRows, vecs = h / (16 / (int64_t)sizeof(T));
  cu_mem part;
  if (db) BL_CHECK(part.alloc(op, dev, (size_t)(nchunk * h) * sizeof(float)));
  double n = (double)rows * h;
  cu_cost_kernel(dev, "activation", "act_native",
                 sizeof(T) * n * (g ? 3 : 2) + (b ? (double)h * sizeof(TB) : 0.0) + (db ? 4.0 * nchunk * h : 0.0));
  dim3 grid((unsigned)((vecs + 31) / 32), (unsigned)nchunk);
  act_native<T, TB><<<grid, dim3(32, 8), 0, cu_stream(dev)>>>(
      kind, (T *)out->data, (const T *)a->data, b ? (const TB *)b->data : nullptr, g ? (const T *)g->data : nullptr,
      part.as<float>(), rows, h);
  BL_CHECK(cu_launched(op, dev));
  if (!db) return 0;
  cu_buf bdb;
  BL_CHECK(cu_out(op, db, &bdb, 1));
  cu_cost_kernel(dev, "activation", "act_db_final", 4.0 * (nchunk + 2.0) * h);
  act_db_final<<<cu_blocks(h, 256), 256, 0, cu_stream(dev)>>>(part.as<float>(), nchunk, h, bdb.p);
  BL_CHECK(cu_launched(op, dev));
  return cu_store(op, db, &bdb);
}

// The bf16/f16 path when the operands allow it (see the header); BL_EUNSUPPORTED, with no error set, otherwise.
int run_act_native(const char *op, int dev, int kind, bl_tensor *out, bl_tensor *db, const bl_tensor *g,
                   const bl_tensor *a, const bl_tensor *b, int64_t n, int64_t h) {
  const int dt = a->dtype;
  if (dt != BL_BF16 && dt != BL_F16) return BL_EUNSUPPORTED;
  if (!b) h = a->shape[a->ndim - 1]; // any row length will do without a bias
  const int64_t v = 8, rows = n / h; // elements per 16 bytes
  if (h % v || (rows + kDbRows - 1) / kDbRows > 65535 || (h / v + 31) / 32 > 65535) return BL_EUNSUPPORTED;
  for (const bl_tensor *t : { (const bl_tensor *)out, g, a }) {
    if (!t) continue;
    if (t->dtype != dt || !cu_is_contig(t) || (uintptr_t)t->data % 16) return BL_EUNSUPPORTED;
  }
  if (b && (!cu_is_contig(b) || (b->dtype != dt && b->dtype != BL_F32))) return BL_EUNSUPPORTED;
  const bool bf = b && b->dtype == BL_F32;
  if (dt == BL_BF16)
    return bf ? launch_native<__nv_bfloat16, float>(op, dev, kind, out, db, g, a, b, rows, h)
              : launch_native<__nv_bfloat16, __nv_bfloat16>(op, dev, kind, out, db, g, a, b, rows, h);
  return bf ? launch_native<__half, float>(op, dev, kind, out, db, g, a, b, rows, h)
            : launch_native<__half, __half>(op, dev, kind, out, db, g, a, b, rows, h);
}

int run_act(const char *op, int kind, bl_tensor *out, bl_tensor *db, const bl_tensor *g, const bl_tensor *a,
            const bl_tensor *b) {
  int dev;
  const bl_tensor *ts[] = { out, db, g, a, b };
  BL_CHECK(cu_device(op, 5, ts, &dev));
  BL_CHECK(cu_same_numel(op, out, a));
  BL_CHECK(cu_same_numel(op, g, a));
  int64_t n = a->numel, h = 1;
  if (b) {
    h = a->ndim ? a->shape[a->ndim - 1] : 1;
    if (b->numel != h || h < 1)
      return bl_set_error(BL_EINVAL, "%s: bias has %lld elements, input's last dim is %lld", op, (long long)b->numel,
                          (long long)h);
    if (db && db->numel != h)
      return bl_set_error(BL_EINVAL, "%s: grad_bias has %lld elements, expected %lld", op, (long long)db->numel,
                          (long long)h);
  }
  if (n == 0) return 0;
  int rc = run_act_native(op, dev, kind, out, db, g, a, b, n, h);
  if (rc != BL_EUNSUPPORTED) return rc;
  cu_buf ba, bb, bg, bo;
  BL_CHECK(cu_load(op, a, &ba));
  if (b) BL_CHECK(cu_load(op, b, &bb));
  if (g) BL_CHECK(cu_load(op, g, &bg));
  BL_CHECK(cu_out(op, out, &bo, 0));
  cu_cost_kernel(dev, "activation", "act_kernel", 4.0 * ((g ? 3 : 2) * (double)n + (b ? h : 0)));
  act_kernel<<<cu_blocks(n, 256), 256, 0, cu_stream(dev)>>>(kind, bo.p, ba.p, b ? bb.p : nullptr, g ? bg.p : nullptr, n,
                                                            h);
  BL_CHECK(cu_launched(op, dev));
  if (db) {
    cu_buf bdb;
    BL_CHECK(cu_out(op, db, &bdb, 1));
    BL_CHECK(cu_colsum_acc(op, dev, bo.p, n / h, h, bdb.p));
    BL_CHECK(cu_store(op, db, &bdb));
  }
  return cu_store(op, out, &bo);
}

} // namespace

extern "C" int bl_cuda_gelu_forward(bl_tensor *y, const bl_tensor *x) {
  return run_act("gelu", K_GELU, y, nullptr, nullptr, x, nullptr);
}
extern "C" int bl_cuda_gelu_backward(bl_tensor *dx, const bl_tensor *dy, const bl_tensor *x) {
  return run_act("gelu_backward", K_GELU_BWD, dx, nullptr, dy, x, nullptr);
}
extern "C" int bl_cuda_bias_gelu_forward(bl_tensor *y, const bl_tensor *x, const bl_tensor *b) {
  if (!b) return bl_set_error(BL_EINVAL, "bias_gelu: bias is NULL");
  return run_act("bias_gelu", K_GELU, y, nullptr, nullptr, x, b);
}
extern "C" int bl_cuda_bias_gelu_backward(bl_tensor *dx, bl_tensor *db, const bl_tensor *dy, const bl_tensor *x,
                                          const bl_tensor *b) {
  if (!b) return bl_set_error(BL_EINVAL, "bias_gelu_backward: bias is NULL");
  return run_act("bias_gelu_backward", K_GELU_BWD, dx, db, dy, x, b);
}
extern "C" int bl_cuda_gelu_tanh_forward(bl_tensor *y, const bl_tensor *x, const bl_tensor *b) {
  return run_act("gelu_tanh", K_GELU_TANH, y, nullptr, nullptr, x, b);
}
extern "C" int bl_cuda_gelu_tanh_backward(bl_tensor *dx, bl_tensor *db, const bl_tensor *dy, const bl_tensor *x,
                                          const bl_tensor *b) {
  if (db && !b) return bl_set_error(BL_EINVAL, "gelu_tanh_backward: grad_bias given without a bias");
  return run_act("gelu_tanh_backward", K_GELU_TANH_BWD, dx, db, dy, x, b);
}
extern "C" int bl_cuda_tanh_forward(bl_tensor *y, const bl_tensor *x) {
  return run_act("tanh", K_TANH, y, nullptr, nullptr, x, nullptr);
}
extern "C" int bl_cuda_tanh_backward(bl_tensor *dx, const bl_tensor *dy, const bl_tensor *y) {
  return run_act("tanh_backward", K_TANH_BWD, dx, nullptr, dy, y, nullptr);
}
