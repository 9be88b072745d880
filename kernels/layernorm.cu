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
//
// bf16/f16 rows that are whole 16-byte vectors: every kernel reads and writes
// them 8 elements at a time (V = 8: a thread's columns are consecutive, the
// block sums change order but stay fixed) and draws the dropout mask of 4
// elements from one Philox block, where the scalar kernels (V = 1: f32, odd
// rows) run a whole Philox block per element and use one of its four outputs.
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

template <class T, int V>
__device__ __forceinline__ void load_f(const T *p, float (&v)[V]) {
  cu_vec<T, V> a;
  a.load(p);
#pragma unroll
  for (int e = 0; e < V; e++) v[e] = to_f(a.t[e]);
}
template <class T, int V>
__device__ __forceinline__ void store_f(T *p, const float (&v)[V]) {
  cu_vec<T, V> a;
#pragma unroll
  for (int e = 0; e < V; e++) from_f(v[e], &a.t[e]);
  a.store(p);
}

// Dropout keep flags of elements i .. i+V-1 (V % 4 == 0, i % 4 == 0): one Philox block per 4 elements (the
// stream's layout), where the scalar path runs a whole block per element.
template <int V>
__device__ __forceinline__ void keep_v(uint64_t seed, uint64_t offset, int64_t i, float p, bool (&k)[V]) {
#pragma unroll
  for (int q = 0; q < V; q += 4) {
    const uint4 r = bl_philox4x32_dev(seed, offset + ((uint64_t)(i + q) >> 2));
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int l = 0; l < 4; l++) k[q + l] = (float)(w[l] >> 8) * (1.0f / 16777216.0f) >= p;
  }
}

// s[e] = ln_s(.., i + e) and its dropout keep flag k[e] for e < V: one element (V == 1) or a vector of V at i
// (i % V == 0, V % 4 == 0). Same arithmetic as ln_s (a kept element times scale, exact when p == 0).
template <class T, int V>
__device__ __forceinline__ void ln_s_k(const T *x, const T *res, int64_t i, float p, float scale, uint64_t seed,
                                       uint64_t offset, float (&s)[V], bool (&k)[V]) {
  load_f<T, V>(x + i, s);
#pragma unroll
  for (int e = 0; e < V; e++) k[e] = true;
  if (!res) return;
  if (p > 0.0f) {
    if constexpr (V == 1) k[0] = bl_dropout_keep(seed, offset, (uint64_t)i, p);
    else keep_v<V>(seed, offset, i, p, k);
  }
  float r[V];
  load_f<T, V>(res + i, r);
#pragma unroll
  for (int e = 0; e < V; e++) s[e] = (p > 0.0f ? (k[e] ? s[e] * scale : 0.0f) : s[e]) + r[e];
}
template <class T, int V>
__device__ __forceinline__ void ln_s_v(const T *x, const T *res, int64_t i, float p, float scale, uint64_t seed,
                                       uint64_t offset, float (&s)[V]) {
  bool k[V];
  ln_s_k<T, V>(x, res, i, p, scale, seed, offset, s, k);
}

// T: storage of x, res, y (f32, bf16, f16); G: of gamma, beta. f32 keeps s = dropout(x) + res in y between the
// passes; bf16/f16 recompute it (rounding it to T would change the result).
template <class T, class G, int V>
__global__ void ln_fwd(const T *x, const T *res, const G *gamma, const G *beta, T *y, float *mean, float *rstd,
                       int64_t rows, int64_t h, float eps, float p, float scale, uint64_t seed, uint64_t offset) {
  constexpr bool keep = std::is_same<T, float>::value;
  __shared__ float sh[32];
  const int64_t step = blockDim.x * (int64_t)V;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * h;
    float sum = 0.0f;
    for (int64_t j = threadIdx.x * (int64_t)V; j < h; j += step) {
      float s[V];
      ln_s_v<T, V>(x, res, base + j, p, scale, seed, offset, s);
      if (keep && res) store_f<T, V>(&y[base + j], s);   // kept for the passes below (same thread, same columns)
#pragma unroll
      for (int e = 0; e < V; e++) sum += s[e];
    }
    const float m = cu_block_sum(sum, sh) / (float)h;
    auto s_at = [&](int64_t i, float(&s)[V]) {
      if (keep && res) load_f<T, V>(&y[i], s);
      else ln_s_v<T, V>(x, res, i, p, scale, seed, offset, s);
    };
    float var = 0.0f;
    for (int64_t j = threadIdx.x * (int64_t)V; j < h; j += step) {
      float s[V];
      s_at(base + j, s);
#pragma unroll
      for (int e = 0; e < V; e++) { float d = s[e] - m; var += d * d; }
    }
    const float rs = 1.0f / sqrtf(cu_block_sum(var, sh) / (float)h + eps);
    for (int64_t j = threadIdx.x * (int64_t)V; j < h; j += step) {
      float s[V], g[V], b[V];
      s_at(base + j, s);
      load_f<G, V>(gamma + j, g);
      if (beta) load_f<G, V>(beta + j, b);
#pragma unroll
      for (int e = 0; e < V; e++) {
        float o = (s[e] - m) * rs * g[e];
        s[e] = beta ? o + b[e] : o;
      }
      store_f<T, V>(&y[base + j], s);
    }
    if (threadIdx.x == 0) { mean[r] = m; rstd[r] = rs; }
  }
}

template <class T, class G, int V>
__global__ void ln_bwd(const T *dy, const T *x, const T *res, const G *gamma, const float *mean, const float *rstd,
                       T *dx, T *dres, int64_t rows, int64_t h, float p, float scale, uint64_t seed, uint64_t offset) {
  __shared__ float sh[32];
  const int64_t step = blockDim.x * (int64_t)V;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * h;
    const float m = mean[r], rs = rstd[r];
    float a = 0.0f, b = 0.0f;
    for (int64_t j = threadIdx.x * (int64_t)V; j < h; j += step) {
      float s[V], g[V], d[V];
      ln_s_v<T, V>(x, res, base + j, p, scale, seed, offset, s);
      load_f<G, V>(gamma + j, g);
      load_f<T, V>(dy + base + j, d);
#pragma unroll
      for (int e = 0; e < V; e++) {
        float gj = d[e] * g[e];
        a += gj;
        b += gj * ((s[e] - m) * rs);
      }
    }
    a = cu_block_sum(a, sh) / (float)h;
    b = cu_block_sum(b, sh) / (float)h;
    for (int64_t j = threadIdx.x * (int64_t)V; j < h; j += step) {
      const int64_t i = base + j;
      float s[V], g[V], d[V];
      bool k[V];
      ln_s_k<T, V>(x, res, i, p, scale, seed, offset, s, k);
      load_f<G, V>(gamma + j, g);
      load_f<T, V>(dy + i, d);
#pragma unroll
      for (int e = 0; e < V; e++) d[e] = rs * (d[e] * g[e] - a - ((s[e] - m) * rs) * b);
      if (dres) store_f<T, V>(dres + i, d);
      if (res && p > 0.0f) {
#pragma unroll
        for (int e = 0; e < V; e++) d[e] = k[e] ? d[e] * scale : 0.0f;
      }
      store_f<T, V>(dx + i, d);
    }
  }
}

// Block (32, 8) over 32 column groups of V and the kChunk rows of chunk blockIdx.y; a thread takes rows ty, ty + 8...
template <class T, int V>
__global__ void ln_param_partial(const T *dy, const T *x, const T *res, const float *mean, const float *rstd,
                                 float *pg, float *pb, int64_t rows, int64_t h, float p, float scale, uint64_t seed,
                                 uint64_t offset) {
  __shared__ float sg[8][32][V + (V == 1)], sb[8][32][V + (V == 1)];   // V == 1: padded against bank conflicts
  const int64_t j = (blockIdx.x * 32LL + threadIdx.x) * V;
  const int64_t r0 = blockIdx.y * (int64_t)kChunk, r1 = min(r0 + kChunk, rows);
  float ag[V], ab[V];
#pragma unroll
  for (int e = 0; e < V; e++) ag[e] = ab[e] = 0.0f;
  if (j < h)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      const int64_t i = r * h + j;
      float s[V], d[V];
      ln_s_v<T, V>(x, res, i, p, scale, seed, offset, s);
      load_f<T, V>(dy + i, d);
#pragma unroll
      for (int e = 0; e < V; e++) {
        ag[e] += d[e] * ((s[e] - mean[r]) * rstd[r]);
        ab[e] += d[e];
      }
    }
#pragma unroll
  for (int e = 0; e < V; e++) { sg[threadIdx.y][threadIdx.x][e] = ag[e]; sb[threadIdx.y][threadIdx.x][e] = ab[e]; }
  __syncthreads();
  if (threadIdx.y == 0 && j < h) {
#pragma unroll
    for (int e = 0; e < V; e++) {
      float g = 0.0f, b = 0.0f;
      for (int k = 0; k < 8; k++) { g += sg[k][threadIdx.x][e]; b += sb[k][threadIdx.x][e]; }
      pg[blockIdx.y * h + j + e] = g;
      pb[blockIdx.y * h + j + e] = b;
    }
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

// Vector width of the native half-type kernels: 8 elements (16 bytes of bf16/f16, two Philox blocks).
const int kVec = 8;

// Rows of h elements are whole kVec vectors at 16-byte aligned bases (f32 rows keep the scalar kernels).
template <class T>
bool vec_rows(int64_t h, std::initializer_list<const void *> ps) {
  bool ok = sizeof(T) == 2 && h % kVec == 0;   // no early return: nvcc warns of an unreachable loop for f32
  for (const void *q : ps) ok = ok && (uintptr_t)q % 16 == 0;
  return ok;
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
  const unsigned grid = cu_blocks(rows, 1, 1 << 20);
  if constexpr (sizeof(T) == 2) {
    if (vec_rows<T>(h, {x, res, y, gamma, beta})) {
      ln_fwd<T, G, kVec><<<grid, threads_for(h / kVec), 0, cu_stream(dev)>>>(
          x, res, gamma, beta, y, mean, rstd, rows, h, (float)eps, (float)p, scale, seed, offset);
      return cu_launched(op, dev);
    }
  }
  ln_fwd<T, G, 1><<<grid, threads_for(h), 0, cu_stream(dev)>>>(x, res, gamma, beta, y, mean, rstd, rows, h,
                                                                (float)eps, (float)p, scale, seed, offset);
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
  const unsigned grid = cu_blocks(rows, 1, 1 << 20);
  const bool vec = vec_rows<T>(h, {dy, x, res, gamma, dx, dres});
  if constexpr (sizeof(T) == 2) {
    if (vec)
      ln_bwd<T, G, kVec><<<grid, threads_for(h / kVec), 0, cu_stream(dev)>>>(dy, x, res, gamma, mean, rstd, dx, dres,
                                                                           rows, h, (float)p, scale, seed, offset);
  }
  if (!vec)
    ln_bwd<T, G, 1><<<grid, threads_for(h), 0, cu_stream(dev)>>>(dy, x, res, gamma, mean, rstd, dx, dres, rows, h,
                                                                (float)p, scale, seed, offset);
  BL_CHECK(cu_launched(op, dev));
  if (!dgamma && !dbeta) return 0;
  int64_t nchunk = (rows + kChunk - 1) / kChunk;
  if (nchunk > 65535)
    return bl_set_error(BL_EUNSUPPORTED, "%s: cuda:%d: %lld rows is too many", op, dev, (long long)rows);
  cu_mem part;
  BL_CHECK(part.alloc(op, dev, (size_t)(2 * nchunk * h) * sizeof(float)));
  float *pg = part.as<float>(), *pb = pg + nchunk * h;
  cu_cost_kernel(dev, "layernorm", "ln_param_partial", sizeof(T) * n * (res ? 3 : 2) + 8.0 * rows + 8.0 * nchunk * h);
  if constexpr (sizeof(T) == 2) {
    if (vec)
      ln_param_partial<T, kVec><<<dim3((unsigned)((h / kVec + 31) / 32), (unsigned)nchunk), dim3(32, 8), 0,
                                  cu_stream(dev)>>>(dy, x, res, mean, rstd, pg, pb, rows, h, (float)p, scale, seed,
                                                    offset);
  }
  if (!vec)
    ln_param_partial<T, 1><<<dim3((unsigned)((h + 31) / 32), (unsigned)nchunk), dim3(32, 8), 0, cu_stream(dev)>>>(
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
