// LayerNorm over the last dim, and the fused dropout + residual + LayerNorm
// (contracts in bl_ops.h: bl_layernorm_*, bl_residual_layernorm_*).
//
// Forward (ln_fwd): one block per row (x viewed as [rows, H]), up to 256
// threads striding over H. For the residual variant the block first forms
// s = dropout(x) + residual into y (each thread writes and later re-reads
// only its own columns, so no barrier is needed for that), then mean and the
// biased variance are taken in two passes (block sums with a fixed tree:
// deterministic), rstd = 1/sqrt(var + eps). Saved: mean, rstd [rows] f32.
// Dropout: element r*H + j of the Philox stream (seed, offset), as the CPU.
//
// Backward: ln_bwd, one block per row, recomputes xhat from x (+ dropout +
// residual), mean, rstd: dx = rstd (dy g - mean(dy g) - xhat mean(dy g xhat)),
// dresidual = that, dx = mask-scaled. dgamma/dbeta are a two-stage
// deterministic reduction: ln_param_partial sums dy*xhat and dy over fixed
// 256-row chunks per column (grid: 32 columns x chunk, 32x8 threads, xhat
// recomputed), ln_param_final adds the chunks in order and accumulates (+=).
#include <initializer_list>
#include <type_traits>
#include "common.cuh"
#include "philox.cuh"

namespace {

const int kChunk = 256;

template <class T>
__device__ __forceinline__ float ln_s(const T *x, const T *res, int64_t i, float p, float scale, uint64_t seed,
                                      uint64_t offset) {
  float v = to_f(x[i]);
  if (res) {
    if (p > 0.0f) v = bl_dropout_keep(seed, offset, (uint64_t)i, p) ? v * scale : 0.0f;
    v += to_f(res[i]);
  }
  return v;
}

// T: storage of x, res, y (f32, bf16, f16); G: of gamma, beta. f32 keeps s = dropout(x) + res in y between the
// passes; bf16/f16 recompute it (rounding it to T would change the result).
template <class T, class G>
__global__ void ln_fwd(const T *x, const T *res, const G *gamma, const G *beta, T *y, float *mean, float *rstd,
                       int64_t rows, int64_t h, float eps, float p, float scale, uint64_t seed, uint64_t offset) {
  constexpr bool keep = std::is_same<T, float>::value;
  __shared__ float sh[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * h;
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
      float s = ln_s(x, res, base + j, p, scale, seed, offset);
      if (keep && res) from_f(s, &y[base + j]);   // kept for the passes below (same thread, same column)
      sum += s;
    }
    const float m = cu_block_sum(sum, sh) / (float)h;
    auto s_at = [&](int64_t i) { return keep && res ? to_f(y[i]) : ln_s(x, res, i, p, scale, seed, offset); };
    float var = 0.0f;
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) { float d = s_at(base + j) - m; var += d * d; }
    const float rs = 1.0f / sqrtf(cu_block_sum(var, sh) / (float)h + eps);
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
      float o = (s_at(base + j) - m) * rs * to_f(gamma[j]);
      from_f(beta ? o + to_f(beta[j]) : o, &y[base + j]);
    }
    if (threadIdx.x == 0) { mean[r] = m; rstd[r] = rs; }
  }
}

template <class T, class G>
__global__ void ln_bwd(const T *dy, const T *x, const T *res, const G *gamma, const float *mean, const float *rstd,
                       T *dx, T *dres, int64_t rows, int64_t h, float p, float scale, uint64_t seed, uint64_t offset) {
  __shared__ float sh[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * h;
    const float m = mean[r], rs = rstd[r];
    float a = 0.0f, b = 0.0f;
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
      float xh = (ln_s(x, res, base + j, p, scale, seed, offset) - m) * rs;
      float gj = to_f(dy[base + j]) * to_f(gamma[j]);
      a += gj;
      b += gj * xh;
    }
    a = cu_block_sum(a, sh) / (float)h;
    b = cu_block_sum(b, sh) / (float)h;
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
      const int64_t i = base + j;
      float xh = (ln_s(x, res, i, p, scale, seed, offset) - m) * rs;
      float d = rs * (to_f(dy[i]) * to_f(gamma[j]) - a - xh * b);
      if (dres) from_f(d, &dres[i]);
      if (res && p > 0.0f) d = bl_dropout_keep(seed, offset, (uint64_t)i, p) ? d * scale : 0.0f;
      from_f(d, &dx[i]);
    }
  }
}

template <class T>
__global__ void ln_param_partial(const T *dy, const T *x, const T *res, const float *mean, const float *rstd,
                                 float *pg, float *pb, int64_t rows, int64_t h, float p, float scale, uint64_t seed,
                                 uint64_t offset) {
  __shared__ float sg[8][33], sb[8][33];
  const int64_t j = blockIdx.x * 32LL + threadIdx.x;
  const int64_t r0 = blockIdx.y * (int64_t)kChunk, r1 = min(r0 + kChunk, rows);
  float ag = 0.0f, ab = 0.0f;
  if (j < h)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      const int64_t i = r * h + j;
      float xh = (ln_s(x, res, i, p, scale, seed, offset) - mean[r]) * rstd[r];
      ag += to_f(dy[i]) * xh;
      ab += to_f(dy[i]);
    }
  sg[threadIdx.y][threadIdx.x] = ag;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && j < h) {
    float g = 0.0f, b = 0.0f;
    for (int k = 0; k < 8; k++) { g += sg[k][threadIdx.x]; b += sb[k][threadIdx.x]; }
    pg[blockIdx.y * h + j] = g;
    pb[blockIdx.y * h + j] = b;
  }
}

__global__ void ln_param_final(const float *pg, const float *pb, int64_t nchunk, int64_t h, float *dgamma, float *dbeta) {
  for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < h; j += (int64_t)gridDim.x * blockDim.x) {
    float g = 0.0f, b = 0.0f;
    for (int64_t c = 0; c < nchunk; c++) { g += pg[c * h + j]; b += pb[c * h + j]; }
    if (dgamma) dgamma[j] += g;
    if (dbeta) dbeta[j] += b;
  }
}

int threads_for(int64_t h) {
  int t = 32;
  while (t < 256 && t < h) t <<= 1;
  return t;
}

int check_numel(const char *op, const bl_tensor *t, int64_t n, const char *name) {
  if (t && t->numel != n)
    return bl_set_error(BL_EINVAL, "%s: %s has %lld elements, expected %lld", op, name, (long long)t->numel, (long long)n);
  return 0;
}

// h = the (non-empty) last dim of x, rows = the rows of h values it holds.
int ln_dims(const char *op, const bl_tensor *x, int64_t *h, int64_t *rows) {
  if (x->ndim < 1 || x->shape[x->ndim - 1] < 1) return bl_set_error(BL_EINVAL, "%s: input needs a non-empty last dim", op);
  *h = x->shape[x->ndim - 1];
  *rows = x->numel / *h;
  return 0;
}

int check_dropout(const char *op, double p) {
  if (!(p >= 0.0 && p < 1.0)) return bl_set_error(BL_EINVAL, "%s: dropout probability %g must be in [0, 1)", op, p);
  return 0;
}

// The storage dtype of a native bf16/f16 run: every activation operand of that dtype, the parameters of it or f32
// (*gdt), the statistics f32, all contiguous; -1 when the operands need f32 images.
int native_dtype(std::initializer_list<const bl_tensor *> acts, std::initializer_list<const bl_tensor *> params,
                 std::initializer_list<const bl_tensor *> stats, int *gdt) {
  int dt = (*acts.begin())->dtype;
  if (dt != BL_BF16 && dt != BL_F16) return -1;
  for (const bl_tensor *t : acts) if (t && (t->dtype != dt || !cu_is_contig(t))) return -1;
  *gdt = (*params.begin())->dtype;
  if (*gdt != dt && *gdt != BL_F32) return -1;
  for (const bl_tensor *t : params) if (t && (t->dtype != *gdt || !cu_is_contig(t))) return -1;
  for (const bl_tensor *t : stats) if (t && (t->dtype != BL_F32 || !cu_is_contig(t))) return -1;
  return dt;
}

// Calls f(T(), G()) with the storage types of a native run (see native_dtype).
template <class F>
void with_types(int dt, int gdt, F f) {
  if (dt == BL_BF16 && gdt == BL_F32) f(__nv_bfloat16(), 0.0f);
  else if (dt == BL_BF16) f(__nv_bfloat16(), __nv_bfloat16());
  else if (gdt == BL_F32) f(__half(), 0.0f);
  else f(__half(), __half());
}

template <class T, class G>
int ln_fwd_run(const char *op, int dev, const T *x, const T *res, const G *gamma, const G *beta, T *y, float *mean,
               float *rstd, int64_t rows, int64_t h, double eps, double p, uint64_t seed, uint64_t offset) {
  float scale = p > 0 ? (float)(1.0 / (1.0 - p)) : 1.0f;
  double n = (double)rows * h;
  cu_cost_kernel(dev, "layernorm", "ln_fwd", sizeof(T) * n * (res ? 3 : 2) + 2.0 * sizeof(G) * h + 8.0 * rows);
  ln_fwd<T, G><<<cu_blocks(rows, 1, 1 << 20), threads_for(h), 0, cu_stream(dev)>>>(
      x, res, gamma, beta, y, mean, rstd, rows, h, (float)eps, (float)p, scale, seed, offset);
  return cu_launched(op, dev);
}

int ln_forward(const char *op, bl_tensor *y, bl_tensor *mean, bl_tensor *rstd, const bl_tensor *x, const bl_tensor *res,
               const bl_tensor *gamma, const bl_tensor *beta, double eps, double p, uint64_t seed, uint64_t offset) {
  int dev;
  const bl_tensor *ts[] = {y, mean, rstd, x, res, gamma, beta};
  BL_CHECK(cu_device(op, 7, ts, &dev));
  int64_t h = 0, rows = 0;
  BL_CHECK(ln_dims(op, x, &h, &rows));
  BL_CHECK(check_numel(op, y, x->numel, "output"));
  BL_CHECK(check_numel(op, res, x->numel, "residual"));
  BL_CHECK(check_numel(op, gamma, h, "gamma"));
  BL_CHECK(check_numel(op, beta, h, "beta"));
  BL_CHECK(check_numel(op, mean, rows, "mean"));
  BL_CHECK(check_numel(op, rstd, rows, "rstd"));
  BL_CHECK(check_dropout(op, p));
  if (rows == 0) return 0;
  int gdt, dt = native_dtype({x, res, y}, {gamma, beta}, {mean, rstd}, &gdt);
  if (dt >= 0) {
    int rc = 0;
    with_types(dt, gdt, [&](auto t, auto g) {
      using T = decltype(t);
      using G = decltype(g);
      rc = ln_fwd_run<T, G>(op, dev, (const T *)x->data, res ? (const T *)res->data : nullptr,
                            (const G *)gamma->data, beta ? (const G *)beta->data : nullptr, (T *)y->data,
                            (float *)mean->data, (float *)rstd->data, rows, h, eps, p, seed, offset);
    });
    return rc;
  }
  cu_buf bx, br, bg, bb, by, bm, bs;
  BL_CHECK(cu_load(op, x, &bx));
  if (res) BL_CHECK(cu_load(op, res, &br));
  BL_CHECK(cu_load(op, gamma, &bg));
  if (beta) BL_CHECK(cu_load(op, beta, &bb));
  BL_CHECK(cu_out(op, y, &by, 0));
  BL_CHECK(cu_out(op, mean, &bm, 0));
  BL_CHECK(cu_out(op, rstd, &bs, 0));
  BL_CHECK((ln_fwd_run<float, float>(op, dev, bx.p, res ? br.p : nullptr, bg.p, beta ? bb.p : nullptr, by.p, bm.p,
                                     bs.p, rows, h, eps, p, seed, offset)));
  BL_CHECK(cu_store(op, y, &by));
  BL_CHECK(cu_store(op, mean, &bm));
  return cu_store(op, rstd, &bs);
}

// dx (and dres) of the rows, then dgamma/dbeta (+=, when wanted) from the two-stage column sums.
template <class T, class G>
int ln_bwd_run(const char *op, int dev, const T *dy, const T *x, const T *res, const G *gamma, const float *mean,
               const float *rstd, T *dx, T *dres, bl_tensor *dgamma, bl_tensor *dbeta, int64_t rows, int64_t h,
               double p, uint64_t seed, uint64_t offset) {
  float scale = p > 0 ? (float)(1.0 / (1.0 - p)) : 1.0f;
  double n = (double)rows * h;
  cu_cost_kernel(dev, "layernorm", "ln_bwd", sizeof(T) * n * (3 + (res ? 1 : 0) + (dres ? 1 : 0)) +
                 sizeof(G) * (double)h + 8.0 * rows);
  ln_bwd<T, G><<<cu_blocks(rows, 1, 1 << 20), threads_for(h), 0, cu_stream(dev)>>>(
      dy, x, res, gamma, mean, rstd, dx, dres, rows, h, (float)p, scale, seed, offset);
  BL_CHECK(cu_launched(op, dev));
  if (!dgamma && !dbeta) return 0;
  int64_t nchunk = (rows + kChunk - 1) / kChunk;
  if (nchunk > 65535)
    return bl_set_error(BL_EUNSUPPORTED, "%s: cuda:%d: %lld rows is too many", op, dev, (long long)rows);
  cu_mem part;
  BL_CHECK(part.alloc(op, dev, (size_t)(2 * nchunk * h) * sizeof(float)));
  float *pg = part.as<float>(), *pb = pg + nchunk * h;
  cu_cost_kernel(dev, "layernorm", "ln_param_partial", sizeof(T) * n * (res ? 3 : 2) + 8.0 * rows + 8.0 * nchunk * h);
  ln_param_partial<T><<<dim3((unsigned)((h + 31) / 32), (unsigned)nchunk), dim3(32, 8), 0, cu_stream(dev)>>>(
      dy, x, res, mean, rstd, pg, pb, rows, h, (float)p, scale, seed, offset);
  BL_CHECK(cu_launched(op, dev));
  cu_buf bdg, bdb;
  if (dgamma) BL_CHECK(cu_out(op, dgamma, &bdg, 1));
  if (dbeta) BL_CHECK(cu_out(op, dbeta, &bdb, 1));
  cu_cost_kernel(dev, "layernorm", "ln_param_final", 4.0 * (2.0 * nchunk * h + 4.0 * h));
  ln_param_final<<<cu_blocks(h, 256), 256, 0, cu_stream(dev)>>>(pg, pb, nchunk, h, dgamma ? bdg.p : nullptr,
                                                                 dbeta ? bdb.p : nullptr);
  BL_CHECK(cu_launched(op, dev));
  if (dgamma) BL_CHECK(cu_store(op, dgamma, &bdg));
  if (dbeta) BL_CHECK(cu_store(op, dbeta, &bdb));
  return 0;
}

int ln_backward(const char *op, bl_tensor *dx, bl_tensor *dres, bl_tensor *dgamma, bl_tensor *dbeta, const bl_tensor *dy,
                const bl_tensor *x, const bl_tensor *res, const bl_tensor *gamma, const bl_tensor *mean,
                const bl_tensor *rstd, double p, uint64_t seed, uint64_t offset) {
  int dev;
  const bl_tensor *ts[] = {dx, dres, dgamma, dbeta, dy, x, res, gamma, mean, rstd};
  BL_CHECK(cu_device(op, 10, ts, &dev));
  int64_t h = 0, rows = 0;
  BL_CHECK(ln_dims(op, x, &h, &rows));
  BL_CHECK(check_numel(op, dx, x->numel, "grad_input"));
  BL_CHECK(check_numel(op, dres, x->numel, "grad_residual"));
  BL_CHECK(check_numel(op, dy, x->numel, "grad_output"));
  BL_CHECK(check_numel(op, res, x->numel, "residual"));
  BL_CHECK(check_numel(op, gamma, h, "gamma"));
  BL_CHECK(check_numel(op, dgamma, h, "grad_gamma"));
  BL_CHECK(check_numel(op, dbeta, h, "grad_beta"));
  BL_CHECK(check_numel(op, mean, rows, "mean"));
  BL_CHECK(check_numel(op, rstd, rows, "rstd"));
  BL_CHECK(check_dropout(op, p));
  if (rows == 0) return 0;
  int gdt, dt = native_dtype({x, dy, dx, res, dres}, {gamma}, {mean, rstd}, &gdt);
  if (dt >= 0) {
    int rc = 0;
    with_types(dt, gdt, [&](auto t, auto g) {
      using T = decltype(t);
      using G = decltype(g);
      rc = ln_bwd_run<T, G>(op, dev, (const T *)dy->data, (const T *)x->data, res ? (const T *)res->data : nullptr,
                            (const G *)gamma->data, (const float *)mean->data, (const float *)rstd->data,
                            (T *)dx->data, dres ? (T *)dres->data : nullptr, dgamma, dbeta, rows, h, p, seed, offset);
    });
    return rc;
  }
  cu_buf bdy, bx, br, bg, bm, bs, bdx, bdr;
  BL_CHECK(cu_load(op, dy, &bdy));
  BL_CHECK(cu_load(op, x, &bx));
  if (res) BL_CHECK(cu_load(op, res, &br));
  BL_CHECK(cu_load(op, gamma, &bg));
  BL_CHECK(cu_load(op, mean, &bm));
  BL_CHECK(cu_load(op, rstd, &bs));
  BL_CHECK(cu_out(op, dx, &bdx, 0));
  if (dres) BL_CHECK(cu_out(op, dres, &bdr, 0));
  BL_CHECK((ln_bwd_run<float, float>(op, dev, bdy.p, bx.p, res ? br.p : nullptr, bg.p, bm.p, bs.p, bdx.p,
                                     dres ? bdr.p : nullptr, dgamma, dbeta, rows, h, p, seed, offset)));
  BL_CHECK(cu_store(op, dx, &bdx));
  if (dres) BL_CHECK(cu_store(op, dres, &bdr));
  return 0;
}

}  // namespace

extern "C" int bl_cuda_layernorm_forward(bl_tensor *y, bl_tensor *mean, bl_tensor *rstd, const bl_tensor *x,
                                         const bl_tensor *gamma, const bl_tensor *beta, double eps) {
  return ln_forward("layernorm", y, mean, rstd, x, nullptr, gamma, beta, eps, 0.0, 0, 0);
}

extern "C" int bl_cuda_layernorm_backward(bl_tensor *dx, bl_tensor *dgamma, bl_tensor *dbeta, const bl_tensor *dy,
                                          const bl_tensor *x, const bl_tensor *gamma, const bl_tensor *mean,
                                          const bl_tensor *rstd) {
  return ln_backward("layernorm_backward", dx, nullptr, dgamma, dbeta, dy, x, nullptr, gamma, mean, rstd, 0.0, 0, 0);
}

extern "C" int bl_cuda_residual_layernorm_forward(bl_tensor *y, bl_tensor *mean, bl_tensor *rstd, const bl_tensor *x,
                                                  const bl_tensor *residual, const bl_tensor *gamma,
                                                  const bl_tensor *beta, double eps, double p, uint64_t seed,
                                                  uint64_t offset) {
  if (!residual) return bl_set_error(BL_EINVAL, "residual_layernorm: residual is NULL");
  return ln_forward("residual_layernorm", y, mean, rstd, x, residual, gamma, beta, eps, p, seed, offset);
}

extern "C" int bl_cuda_residual_layernorm_backward(bl_tensor *dx, bl_tensor *dresidual, bl_tensor *dgamma,
                                                   bl_tensor *dbeta, const bl_tensor *dy, const bl_tensor *x,
                                                   const bl_tensor *residual, const bl_tensor *gamma,
                                                   const bl_tensor *mean, const bl_tensor *rstd, double p,
                                                   uint64_t seed, uint64_t offset) {
  if (!residual) return bl_set_error(BL_EINVAL, "residual_layernorm_backward: residual is NULL");
  return ln_backward("residual_layernorm_backward", dx, dresidual, dgamma, dbeta, dy, x, residual, gamma, mean, rstd,
                     p, seed, offset);
}
