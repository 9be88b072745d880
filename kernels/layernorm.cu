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
// Backward: ln_bwd_rows, blocks of G row groups (blockDim.y, fixed by h and
// the storage type) of kRows rows each, a group taking rows g, g + G, ... of
// its block one at a time: recomputes xhat from x (+ dropout + residual),
// mean, rstd, or (when the caller gives y and every column passes ln_col_safe, a
// test each block makes on gamma/beta before its rows) from the saved output:
// xhat = (y - beta) / gamma, one [rows, H] read fewer than x and residual:
// dx = rstd (dy g - mean(dy g) - xhat mean(dy g xhat)),
// dresidual = that, dx = mask-scaled. In the same pass each thread adds its
// own columns of dy*xhat, dy and the final dx into its group's partials (the
// dgamma, dbeta and the preceding linear's bias gradient); the block adds its
// groups in order and writes one partial per block (G times fewer partials to
// write and to read back than a block of one group), and ln_bwd_final adds the
// blocks in order (+=): deterministic, no atomics, no second read of the
// activations.
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

// Rows per backward row group: fixes the order of the parameter-gradient sums, whatever the device. Few, so that a
// [B*S, 1024] backward has enough threads to fill a GPU (8,192 rows: 1,024 groups of 128 threads).
const int kRows = 8;
// Row groups per backward block: up to kGroups and kGroupThreads threads, while their column partials (3 x h
// floats each) fit in kSmemAcc. The block partials (12 bytes per column per block) add 1.5 / G bytes per
// activation element, written once and read once by ln_bwd_final: 0.5 at BERT-large's h = 1024 (G = 3).
const int kGroups = 4, kGroupThreads = 512;
// Column partials of a backward block in shared memory up to this many bytes, else (G = 1) in global memory.
const size_t kSmemAcc = 40u << 10; // under the 48 KiB a launch gets without opting in

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

// s[e] = ln_s(.., i + e) and its dropout keep flag k[e] for e < V: one element (V == 1) or a vector of V at i
// (i % V == 0, V % 4 == 0). Same arithmetic as ln_s (a kept element times scale, exact when p == 0).
template <class T, int V>
__device__ __forceinline__ void ln_s_k(const T *x, const T *res, int64_t i, float p, float scale, uint64_t seed,
                                       uint64_t offset, float (&s)[V], bool (&k)[V]) {
  load_f<T, V>(x + i, s);
#pragma unroll
  for (int e = 0; e < V; e++) k[e] = true;
  if (!res) return;
  if (p > 0.0f) bl_dropout_keep_v<V>(seed, offset, (uint64_t)i, p, k);
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
  seed = bl_seed_resolve(seed); // a device seed slot (bl_ops.h) read once
  constexpr bool keep = std::is_same<T, float>::value;
  __shared__ float sh[32];
  const int64_t step = blockDim.x * (int64_t)V;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * h;
    float sum = 0.0f;
    for (int64_t j = threadIdx.x * (int64_t)V; j < h; j += step) {
      float s[V];
      ln_s_v<T, V>(x, res, base + j, p, scale, seed, offset, s);
      if (keep && res) store_f<T, V>(&y[base + j], s); // kept for the passes below (same thread, same columns)
#pragma unroll
      for (int e = 0; e < V; e++) sum += s[e];
    }
    const float m = cu_block_sum(sum, sh) / (float)h;
    auto s_at = [&](int64_t i, float(&s)[V]) {
      if (keep && res)
        load_f<T, V>(&y[i], s);
      else
        ln_s_v<T, V>(x, res, i, p, scale, seed, offset, s);
    };
    float var = 0.0f;
    for (int64_t j = threadIdx.x * (int64_t)V; j < h; j += step) {
      float s[V];
      s_at(base + j, s);
#pragma unroll
      for (int e = 0; e < V; e++) {
        float d = s[e] - m;
        var += d * d;
      }
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
    if (threadIdx.x == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
  }
}

// The sums of (a, b) over the threads of row group threadIdx.y (its warps in order: deterministic); sh holds 64
// floats. Contains __syncthreads: every group calls it the same number of times.
__device__ __forceinline__ float2 group_sum2(float a, float b, float *sh) {
  const int nw = blockDim.x >> 5, w0 = threadIdx.y * nw;
  a = cu_warp_sum(a);
  b = cu_warp_sum(b);
  __syncthreads(); // sh may still be read by a previous call
  if ((threadIdx.x & 31) == 0) {
    sh[2 * (w0 + (threadIdx.x >> 5))] = a;
    sh[2 * (w0 + (threadIdx.x >> 5)) + 1] = b;
  }
  __syncthreads();
  float2 t = make_float2(0.0f, 0.0f);
  for (int w = 0; w < nw; w++) {
    t.x += sh[2 * (w0 + w)];
    t.y += sh[2 * (w0 + w) + 1];
  }
  return t;
}

// Backward of G = blockDim.y row groups of kRows rows per block (row g + G k of the block for group g, the row sums
// as in ln_fwd but per group). acc: the group's column partials [3][h] (dgamma: dy xhat, dbeta: dy, dbias: dx, the
// gradient of x after the dropout mask), in shared memory when they fit (then summed over the groups in order into
// the block's slice of part), else (G = 1) the block's own slice of part; every thread touches only its own columns
// of its own group's partials, so they need no barrier. part == nullptr: no parameter gradient is wanted.
// Whether column j's xhat can be recovered from y = xhat gamma + beta (bl_residual_layernorm_backward with y in
// bl_ops.h; the CPU twin's ln_col_safe): |gamma| >= 2^-60 and |beta| <= 4 |gamma|, so the rounding of a stored y
// moves xhat by at most u (|xhat| + 4), u the unit roundoff of y's dtype. NaN fails both tests.
__device__ __forceinline__ bool ln_col_safe(float g, float b) {
  return fabsf(g) >= 0x1p-60f && fabsf(b) <= 4.0f * fabsf(g);
}

// xhat[e] of the V elements at i (column j) and their dropout keep flags: from y when y is given, else from x (+
// dropout + residual), mean m and rstd rs. g, b: gamma and beta at j (b unused without y). From y the keep flags
// are drawn only when `flags` is set.
template <class T, int V>
__device__ __forceinline__ void ln_xh_k(const T *y, const T *x, const T *res, int64_t i, const float (&g)[V],
                                        const float (&b)[V], float m, float rs, float p, float scale, uint64_t seed,
                                        uint64_t offset, bool flags, float (&xh)[V], bool (&k)[V]) {
  if (y) {
    load_f<T, V>(y + i, xh);
#pragma unroll
    for (int e = 0; e < V; e++) {
      xh[e] = (xh[e] - b[e]) / g[e];
      k[e] = true;
    }
    if (flags && res && p > 0.0f) bl_dropout_keep_v<V>(seed, offset, (uint64_t)i, p, k);
    return;
  }
  ln_s_k<T, V>(x, res, i, p, scale, seed, offset, xh, k);
#pragma unroll
  for (int e = 0; e < V; e++) xh[e] = (xh[e] - m) * rs;
}

template <class T, class G, int V>
__global__ void ln_bwd_rows(const T *dy, const T *x, const T *res, const T *y, const G *gamma, const G *beta,
                            const float *mean, const float *rstd, T *dx, T *dres, float *part, bool smem, int64_t rows,
                            int64_t h, float p, float scale, uint64_t seed, uint64_t offset, int *fell_back) {
  seed = bl_seed_resolve(seed); // a device seed slot (bl_ops.h) read once
  extern __shared__ float sacc[];
  __shared__ float sh[64];
  const int64_t step = blockDim.x * (int64_t)V, ng = blockDim.y;
  float *acc = part ? (smem ? sacc + threadIdx.y * 3 * h : part + blockIdx.x * 3 * h) : nullptr;
  if (acc)
    for (int64_t j = threadIdx.x * (int64_t)V; j < h; j += step)
#pragma unroll
      for (int e = 0; e < V; e++) acc[j + e] = acc[h + j + e] = acc[2 * h + j + e] = 0.0f;
  if (y) { // y is usable when every column is: the same answer in every block (y is a kernel argument)
    bool ok = true;
    for (int64_t j = (threadIdx.y * blockDim.x + threadIdx.x) * (int64_t)V; j < h; j += step * ng) {
      float g[V], b[V] = {};
      load_f<G, V>(gamma + j, g);
      if (beta) load_f<G, V>(beta + j, b);
#pragma unroll
      for (int e = 0; e < V; e++) ok = ok && ln_col_safe(g[e], b[e]);
    }
    if (!__syncthreads_and(ok)) {
      y = nullptr;
      // every block decides alike: block 0 tells the step-time model (a cost slot while it records)
      if (fell_back && blockIdx.x == 0 && threadIdx.x == 0 && threadIdx.y == 0) *fell_back = 1;
    }
  }
  const int64_t r0 = blockIdx.x * ng * kRows + threadIdx.y;
  for (int k = 0; k < kRows; k++) { // the same trip count in every group: group_sum2 holds barriers
    const int64_t r = r0 + k * ng, base = r * h;
    const bool live = r < rows;
    const float m = live ? mean[r] : 0.0f, rs = live ? rstd[r] : 0.0f;
    float a = 0.0f, b = 0.0f;
    for (int64_t j = threadIdx.x * (int64_t)V; live && j < h; j += step) {
      float xh[V], g[V], bt[V] = {}, d[V];
      bool kp[V];
      load_f<G, V>(gamma + j, g);
      if (y && beta) load_f<G, V>(beta + j, bt);
      ln_xh_k<T, V>(y, x, res, base + j, g, bt, m, rs, p, scale, seed, offset, false, xh, kp);
      load_f<T, V>(dy + base + j, d);
#pragma unroll
      for (int e = 0; e < V; e++) {
        float gj = d[e] * g[e];
        a += gj;
        b += gj * xh[e];
      }
    }
    const float2 ab = group_sum2(a, b, sh);
    a = ab.x / (float)h;
    b = ab.y / (float)h;
    for (int64_t j = threadIdx.x * (int64_t)V; live && j < h; j += step) {
      const int64_t i = base + j;
      float xh[V], g[V], bt[V] = {}, d[V], o[V];
      bool kp[V];
      load_f<G, V>(gamma + j, g);
      if (y && beta) load_f<G, V>(beta + j, bt);
      ln_xh_k<T, V>(y, x, res, i, g, bt, m, rs, p, scale, seed, offset, true, xh, kp);
      load_f<T, V>(dy + i, d);
#pragma unroll
      for (int e = 0; e < V; e++) {
        o[e] = rs * (d[e] * g[e] - a - xh[e] * b);
        if (acc) {
          acc[j + e] += d[e] * xh[e];
          acc[h + j + e] += d[e];
        }
      }
      if (dres) store_f<T, V>(dres + i, o);
      if (res && p > 0.0f) {
#pragma unroll
        for (int e = 0; e < V; e++) o[e] = kp[e] ? o[e] * scale : 0.0f;
      }
      if (acc) {
#pragma unroll
        for (int e = 0; e < V; e++) acc[2 * h + j + e] += o[e];
      }
      store_f<T, V>(dx + i, o);
    }
  }
  if (!acc || !smem) return;
  __syncthreads(); // every group's partials are complete
  // the block's partial: the groups added in order, each thread of the block taking whole columns of 3h
  const int64_t nt = blockDim.x * ng;
  for (int64_t c = threadIdx.y * blockDim.x + threadIdx.x; c < 3 * h; c += nt) {
    float t = 0.0f;
    for (int64_t q = 0; q < ng; q++) t += sacc[q * 3 * h + c];
    part[blockIdx.x * 3 * h + c] = t;
  }
}

// out[q][j] += the sum of the block partials part[c][q][j] over c in order (q: dgamma, dbeta, dbias; NULL: skipped).
__global__ void ln_bwd_final(const float *part, int64_t nblk, int64_t h, float *dgamma, float *dbeta, float *dbias) {
  for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < h; j += (int64_t)gridDim.x * blockDim.x) {
    float g = 0.0f, b = 0.0f, c = 0.0f;
    for (int64_t k = 0; k < nblk; k++) {
      g += part[(k * 3) * h + j];
      b += part[(k * 3 + 1) * h + j];
      c += part[(k * 3 + 2) * h + j];
    }
    if (dgamma) dgamma[j] += g;
    if (dbeta) dbeta[j] += b;
    if (dbias) dbias[j] += c;
  }
}

// Vector width of the native half-type kernels: 8 elements (16 bytes of bf16/f16, two Philox blocks).
const int kVec = 8;

// Rows of h elements are whole kVec vectors at 16-byte aligned bases (f32 rows keep the scalar kernels).
template <class T>
bool vec_rows(int64_t h, std::initializer_list<const void *> ps) {
  bool ok = sizeof(T) == 2 && h % kVec == 0; // no early return: nvcc warns of an unreachable loop for f32
  for (const void *q : ps) ok = ok && (uintptr_t)q % 16 == 0;
  return ok;
}

int threads_for(int64_t h) {
  int t = 32;
  while (t < 256 && t < h) t <<= 1;
  return t;
}

// Row groups per backward block for tpr threads per row and rows of h (see kGroups): a function of the shape and
// the storage type only, so the order of the parameter-gradient sums does not depend on the device.
int ln_bwd_groups(int tpr, int64_t h) {
  int g = kGroups;
  while (g > 1 && (g * tpr > kGroupThreads || g * 3 * h * sizeof(float) > kSmemAcc)) g--;
  return g;
}

int check_numel(const char *op, const bl_tensor *t, int64_t n, const char *name) {
  if (t && t->numel != n)
    return bl_set_error(BL_EINVAL, "%s: %s has %lld elements, expected %lld", op, name, (long long)t->numel,
                        (long long)n);
  return 0;
}

// h = the (non-empty) last dim of x, rows = the rows of h values it holds.
int ln_dims(const char *op, const bl_tensor *x, int64_t *h, int64_t *rows) {
  if (x->ndim < 1 || x->shape[x->ndim - 1] < 1)
    return bl_set_error(BL_EINVAL, "%s: input needs a non-empty last dim", op);
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
  for (const bl_tensor *t : acts)
    if (t && (t->dtype != dt || !cu_is_contig(t))) return -1;
  *gdt = (*params.begin())->dtype;
  if (*gdt != dt && *gdt != BL_F32) return -1;
  for (const bl_tensor *t : params)
    if (t && (t->dtype != *gdt || !cu_is_contig(t))) return -1;
  for (const bl_tensor *t : stats)
    if (t && (t->dtype != BL_F32 || !cu_is_contig(t))) return -1;
  return dt;
}

// Calls f(T(), G()) with the storage types of a native run (see native_dtype).
template <class F>
void with_types(int dt, int gdt, F f) {
  if (dt == BL_BF16 && gdt == BL_F32)
    f(__nv_bfloat16(), 0.0f);
  else if (dt == BL_BF16)
    f(__nv_bfloat16(), __nv_bfloat16());
  else if (gdt == BL_F32)
    f(__half(), 0.0f);
  else
    f(__half(), __half());
}

template <class T, class G>
int ln_fwd_run(const char *op, int dev, const T *x, const T *res, const G *gamma, const G *beta, T *y, float *mean,
               float *rstd, int64_t rows, int64_t h, double eps, double p, uint64_t seed, uint64_t offset) {
  float scale = p > 0 ? (float)(1.0 / (1.0 - p)) : 1.0f;
  double n = (double)rows * h;
  cu_cost_kernel(dev, "layernorm", "ln_fwd", sizeof(T) * n * (res ? 3 : 2) + 2.0 * sizeof(G) * h + 8.0 * rows);
  const unsigned grid = cu_blocks(rows, 1, 1 << 20);
  if constexpr (sizeof(T) == 2) {
    if (vec_rows<T>(h, { x, res, y, gamma, beta })) {
      ln_fwd<T, G, kVec><<<grid, threads_for(h / kVec), 0, cu_stream(dev)>>>(
          x, res, gamma, beta, y, mean, rstd, rows, h, (float)eps, (float)p, scale, seed, offset);
      return cu_launched(op, dev);
    }
  }
  ln_fwd<T, G, 1><<<grid, threads_for(h), 0, cu_stream(dev)>>>(x, res, gamma, beta, y, mean, rstd, rows, h, (float)eps,
                                                               (float)p, scale, seed, offset);
  return cu_launched(op, dev);
}

int ln_forward(const char *op, bl_tensor *y, bl_tensor *mean, bl_tensor *rstd, const bl_tensor *x, const bl_tensor *res,
               const bl_tensor *gamma, const bl_tensor *beta, double eps, double p, uint64_t seed, uint64_t offset) {
  int dev;
  const bl_tensor *ts[] = { y, mean, rstd, x, res, gamma, beta };
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
  int gdt, dt = native_dtype({ x, res, y }, { gamma, beta }, { mean, rstd }, &gdt);
  if (dt >= 0) {
    int rc = 0;
    with_types(dt, gdt, [&](auto t, auto g) {
      using T = decltype(t);
      using G = decltype(g);
      rc = ln_fwd_run<T, G>(op, dev, (const T *)x->data, res ? (const T *)res->data : nullptr, (const G *)gamma->data,
                            beta ? (const G *)beta->data : nullptr, (T *)y->data, (float *)mean->data,
                            (float *)rstd->data, rows, h, eps, p, seed, offset);
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
  BL_CHECK((ln_fwd_run<float, float>(op, dev, bx.p, res ? br.p : nullptr, bg.p, beta ? bb.p : nullptr, by.p, bm.p, bs.p,
                                     rows, h, eps, p, seed, offset)));
  BL_CHECK(cu_store(op, y, &by));
  BL_CHECK(cu_store(op, mean, &bm));
  return cu_store(op, rstd, &bs);
}

// dx (and dres) of the rows and, when any of dgamma/dbeta/dbias is wanted, the block partials of all three in the
// same pass, then their ordered sum (+=) in ln_bwd_final. y (with beta, may be NULL): xhat from the output.
template <class T, class G>
int ln_bwd_run(const char *op, int dev, const T *dy, const T *x, const T *res, const T *y, const G *gamma,
               const G *beta, const float *mean, const float *rstd, T *dx, T *dres, bl_tensor *dgamma, bl_tensor *dbeta,
               bl_tensor *dbias, int64_t rows, int64_t h, double p, uint64_t seed, uint64_t offset) {
  const float scale = p > 0 ? (float)(1.0 / (1.0 - p)) : 1.0f;
  const double n = (double)rows * h;
  const bool vec = vec_rows<T>(h, { dy, x, res, y, gamma, beta, dx, dres });
  const int tpr = threads_for(vec ? h / kVec : h), groups = ln_bwd_groups(tpr, h);
  const int64_t nblk = (rows + groups * kRows - 1) / (groups * kRows);
  const bool want = dgamma || dbeta || dbias, smem = 3 * h * sizeof(float) <= kSmemAcc;
  if (nblk > INT32_MAX)
    return bl_set_error(BL_EUNSUPPORTED, "%s: cuda:%d: %lld rows is too many", op, dev, (long long)rows);
  cu_mem part;
  if (want) BL_CHECK(part.alloc(op, dev, (size_t)(3 * nblk * h) * sizeof(float)));
  // dy, dx and the sum's inputs x (+ res), or y with beta, whose every column ln_col_safe accepts. A degenerate
  // gamma makes the kernel fall back to x and res, a pass more: it writes 1 to the cost slot, read at the end of
  // the step-time model's recording (without res both ways read one pass).
  const double ins = y ? 1.0 : res ? 2.0 : 1.0;
  const double bytes = sizeof(T) * n * (2 + ins + (dres ? 1 : 0)) + sizeof(G) * (double)h * (y && beta ? 2 : 1) +
                       8.0 * rows + (want ? 12.0 * nblk * h : 0.0);
  int *fell_back = y && res ? cu_cost_slot(dev) : nullptr;
  cu_cost_kernel_per(dev, "layernorm", "ln_bwd_rows", bytes, 0.0, BL_ENGINE_MEM, fell_back, sizeof(T) * n, 0.0);
  const size_t shm = want && smem ? 3 * h * sizeof(float) * groups : 0;
  const dim3 block(tpr, groups);
  if constexpr (sizeof(T) == 2) {
    if (vec)
      ln_bwd_rows<T, G, kVec><<<(unsigned)nblk, block, shm, cu_stream(dev)>>>(dy, x, res, y, gamma, beta, mean, rstd,
                                                                              dx, dres, part.as<float>(), smem, rows, h,
                                                                              (float)p, scale, seed, offset, fell_back);
  }
  if (!vec)
    ln_bwd_rows<T, G, 1><<<(unsigned)nblk, block, shm, cu_stream(dev)>>>(dy, x, res, y, gamma, beta, mean, rstd, dx,
                                                                         dres, part.as<float>(), smem, rows, h,
                                                                         (float)p, scale, seed, offset, fell_back);
  BL_CHECK(cu_launched(op, dev));
  if (!want) return 0;
  cu_buf bdg, bdb, bdc;
  if (dgamma) BL_CHECK(cu_out(op, dgamma, &bdg, 1));
  if (dbeta) BL_CHECK(cu_out(op, dbeta, &bdb, 1));
  if (dbias) BL_CHECK(cu_out(op, dbias, &bdc, 1));
  cu_cost_kernel(dev, "layernorm", "ln_bwd_final", 4.0 * (3.0 * nblk * h + 6.0 * h));
  ln_bwd_final<<<cu_blocks(h, 256), 256, 0, cu_stream(dev)>>>(part.as<float>(), nblk, h, dgamma ? bdg.p : nullptr,
                                                              dbeta ? bdb.p : nullptr, dbias ? bdc.p : nullptr);
  BL_CHECK(cu_launched(op, dev));
  if (dgamma) BL_CHECK(cu_store(op, dgamma, &bdg));
  if (dbeta) BL_CHECK(cu_store(op, dbeta, &bdb));
  if (dbias) BL_CHECK(cu_store(op, dbias, &bdc));
  return 0;
}

// y, beta: the forward's output and beta (y NULL: xhat from x and res only).
int ln_backward(const char *op, bl_tensor *dx, bl_tensor *dres, bl_tensor *dgamma, bl_tensor *dbeta, bl_tensor *dbias,
                const bl_tensor *dy, const bl_tensor *y, const bl_tensor *x, const bl_tensor *res,
                const bl_tensor *gamma, const bl_tensor *beta, const bl_tensor *mean, const bl_tensor *rstd, double p,
                uint64_t seed, uint64_t offset) {
  int dev;
  const bl_tensor *ts[] = { dx, dres, dgamma, dbeta, dbias, dy, y, x, res, gamma, beta, mean, rstd };
  BL_CHECK(cu_device(op, 13, ts, &dev));
  int64_t h = 0, rows = 0;
  BL_CHECK(ln_dims(op, x, &h, &rows));
  BL_CHECK(check_numel(op, dx, x->numel, "grad_input"));
  BL_CHECK(check_numel(op, dres, x->numel, "grad_residual"));
  BL_CHECK(check_numel(op, dy, x->numel, "grad_output"));
  BL_CHECK(check_numel(op, res, x->numel, "residual"));
  BL_CHECK(check_numel(op, y, x->numel, "output"));
  BL_CHECK(check_numel(op, gamma, h, "gamma"));
  BL_CHECK(check_numel(op, beta, h, "beta"));
  BL_CHECK(check_numel(op, dgamma, h, "grad_gamma"));
  BL_CHECK(check_numel(op, dbeta, h, "grad_beta"));
  BL_CHECK(check_numel(op, dbias, h, "grad_bias"));
  BL_CHECK(check_numel(op, mean, rows, "mean"));
  BL_CHECK(check_numel(op, rstd, rows, "rstd"));
  BL_CHECK(check_dropout(op, p));
  if (rows == 0) return 0;
  int gdt, dt = native_dtype({ x, dy, dx, res, dres, y }, { gamma, beta }, { mean, rstd }, &gdt);
  if (dt >= 0) {
    int rc = 0;
    with_types(dt, gdt, [&](auto t, auto g) {
      using T = decltype(t);
      using G = decltype(g);
      rc = ln_bwd_run<T, G>(op, dev, (const T *)dy->data, (const T *)x->data, res ? (const T *)res->data : nullptr,
                            y ? (const T *)y->data : nullptr, (const G *)gamma->data,
                            beta ? (const G *)beta->data : nullptr, (const float *)mean->data,
                            (const float *)rstd->data, (T *)dx->data, dres ? (T *)dres->data : nullptr, dgamma, dbeta,
                            dbias, rows, h, p, seed, offset);
    });
    return rc;
  }
  cu_buf bdy, bx, br, by, bg, bb, bm, bs, bdx, bdr;
  BL_CHECK(cu_load(op, dy, &bdy));
  BL_CHECK(cu_load(op, x, &bx));
  if (res) BL_CHECK(cu_load(op, res, &br));
  if (y) BL_CHECK(cu_load(op, y, &by));
  BL_CHECK(cu_load(op, gamma, &bg));
  if (beta) BL_CHECK(cu_load(op, beta, &bb));
  BL_CHECK(cu_load(op, mean, &bm));
  BL_CHECK(cu_load(op, rstd, &bs));
  BL_CHECK(cu_out(op, dx, &bdx, 0));
  if (dres) BL_CHECK(cu_out(op, dres, &bdr, 0));
  BL_CHECK((ln_bwd_run<float, float>(op, dev, bdy.p, bx.p, res ? br.p : nullptr, y ? by.p : nullptr, bg.p,
                                     beta ? bb.p : nullptr, bm.p, bs.p, bdx.p, dres ? bdr.p : nullptr, dgamma, dbeta,
                                     dbias, rows, h, p, seed, offset)));
  BL_CHECK(cu_store(op, dx, &bdx));
  if (dres) BL_CHECK(cu_store(op, dres, &bdr));
  return 0;
}

} // namespace

extern "C" int bl_cuda_layernorm_forward(bl_tensor *y, bl_tensor *mean, bl_tensor *rstd, const bl_tensor *x,
                                         const bl_tensor *gamma, const bl_tensor *beta, double eps) {
  return ln_forward("layernorm", y, mean, rstd, x, nullptr, gamma, beta, eps, 0.0, 0, 0);
}

extern "C" int bl_cuda_layernorm_backward(bl_tensor *dx, bl_tensor *dgamma, bl_tensor *dbeta, const bl_tensor *dy,
                                          const bl_tensor *x, const bl_tensor *gamma, const bl_tensor *mean,
                                          const bl_tensor *rstd) {
  return ln_backward("layernorm_backward", dx, nullptr, dgamma, dbeta, nullptr, dy, nullptr, x, nullptr, gamma, nullptr,
                     mean, rstd, 0.0, 0, 0);
}

extern "C" int bl_cuda_residual_layernorm_forward(const bl_residual_layernorm_args *a) {
  if (!a->residual) return bl_set_error(BL_EINVAL, "residual_layernorm: residual is NULL");
  return ln_forward("residual_layernorm", a->y, a->mean, a->rstd, a->x, a->residual, a->gamma, a->beta, a->eps, a->p,
                    a->seed, a->offset);
}

/* xhat from a->y (with beta) when the caller gives y, else from x and residual */
extern "C" int bl_cuda_residual_layernorm_backward(bl_tensor *dx, bl_tensor *dresidual, bl_tensor *dgamma,
                                                   bl_tensor *dbeta, bl_tensor *dbias, const bl_tensor *dy,
                                                   const bl_residual_layernorm_args *a) {
  const char *op = "residual_layernorm_backward";
  if (!a->residual) return bl_set_error(BL_EINVAL, "%s: residual is NULL", op);
  return ln_backward(op, dx, dresidual, dgamma, dbeta, dbias, dy, a->y, a->x, a->residual, a->gamma,
                     a->y ? a->beta : nullptr, a->mean, a->rstd, a->p, a->seed, a->offset);
}
