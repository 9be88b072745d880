// Row lookups and their deterministic scatter-add backwards (contracts in
// bl_ops.h): embedding (out[i,:] (+)= table[ids[i],:]) and gather
// (out[j,:] = x[pos[j],:]); and BERT's embedding block fused (word + position
// + token type rows, LayerNorm, dropout: bl_embedding_layernorm_*, kernels
// emb_* below).
//
// Validation: indices are loaded to a contiguous int64 image, and a check
// kernel finds the first out-of-range index (atomicMin on the position: an
// integer result, deterministic); one synchronisation reads it back before
// any output is written, so a bad batch leaves the outputs untouched. With
// deferred checks on (kernels/deferred.cu) nothing is read back: the error
// is recorded on the device and reported at the next bl_cuda_check_deferred.
//
// Native dtypes: out and table of one dtype (f32, bf16, f16), contiguous, are
// read and written directly, 16-byte vectors when a row is a whole number of
// them; in the backward the gradient rows are read in their own dtype and the
// target rows (f32 gradients, or the rows' dtype) are summed in f32 registers.
// Anything else goes through f32 images (cu_buf).
//
// Forward: grid-stride over rows, 256 threads over a row's vectors.
// Backward (scatter): the positions are sorted by index with a stable LSD
// radix sort (4-bit digits, as many passes as the largest index needs; per
// pass a tile count, one scan, a stable scatter), so each target row's
// positions form one segment in index order. Then block (k, column chunk)
// exits unless sorted element k starts a segment, else each thread starts from
// the target row's current value and adds the segment's gradient rows in order:
// exactly the CPU's summation order, so the result is bitwise the CPU's and the
// same on every run. Cost: O(n) for the sort, one read of every gradient row.
#include <algorithm>
#include <initializer_list>
#include "common.cuh"
#include "philox.cuh"

namespace {

__global__ void check_range(const int64_t *ids, int64_t n, int64_t limit, unsigned long long *first_bad) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    if (ids[i] < 0 || ids[i] >= limit) atomicMin(first_bad, (unsigned long long)i);
}

__global__ void fill_u64(unsigned long long *p, int64_t n, unsigned long long v) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    p[i] = v;
}

// out[i, :] (+)= src[ids[i], :]; a thread moves V columns, h % V == 0.
template <class T, int V>
__global__ void gather_rows(T *out, const T *src, const int64_t *ids, int64_t n, int64_t h, int accumulate) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const T *s = src + ids[i] * h;
    T *o = out + i * h;
    for (int64_t c = threadIdx.x * (int64_t)V; c < h; c += blockDim.x * (int64_t)V) {
      cu_vec<T, V> a, b;
      a.load(s + c);
      if (accumulate) { // f32 sum, one rounding: as the CPU's f32 image of the output
        b.load(o + c);
#pragma unroll
        for (int e = 0; e < V; e++) from_f(to_f(b.t[e]) + to_f(a.t[e]), &a.t[e]);
      }
      a.store(o + c);
    }
  }
}

// ---------------------------------------------------------------- stable radix sort of (index, position)
const int kSortThreads = 256, kSortItems = 16, kTile = kSortThreads * kSortItems, kDigits = 16;

__global__ void sort_init(const int64_t *ids, int64_t n, int32_t *keys, int32_t *vals) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    keys[i] = (int32_t)ids[i];
    vals[i] = (int32_t)i;
  }
}

// counts[d * ntiles + tile] = items of the tile whose digit is d (integer atomics: exact).
__global__ void __launch_bounds__(kSortThreads) sort_count(const int32_t *keys, int64_t n, int shift, int32_t *counts) {
  __shared__ int hist[kDigits];
  if (threadIdx.x < kDigits) hist[threadIdx.x] = 0;
  __syncthreads();
  const int64_t base = blockIdx.x * (int64_t)kTile;
  for (int k = threadIdx.x; k < kTile; k += kSortThreads)
    if (base + k < n) atomicAdd(&hist[(keys[base + k] >> shift) & (kDigits - 1)], 1);
  __syncthreads();
  if (threadIdx.x < kDigits) counts[threadIdx.x * gridDim.x + blockIdx.x] = hist[threadIdx.x];
}

// Exclusive prefix sum of the per-thread values `v` of a 256-thread block (fixed order); `sh` has 256 ints.
__device__ __forceinline__ int block_excl_scan(int v, int *sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int o = 1; o < kSortThreads; o <<= 1) {
    int u = threadIdx.x >= (unsigned)o ? sh[threadIdx.x - o] : 0;
    __syncthreads();
    sh[threadIdx.x] += u;
    __syncthreads();
  }
  return sh[threadIdx.x] - v;
}

// In place exclusive scan of counts[0..m) in digit-major order, one block: each thread a contiguous run.
__global__ void __launch_bounds__(kSortThreads) sort_scan(int32_t *counts, int64_t m) {
  __shared__ int sh[kSortThreads];
  const int64_t per = (m + kSortThreads - 1) / kSortThreads, b = threadIdx.x * per, e = min(b + per, m);
  int sum = 0;
  for (int64_t i = b; i < e; i++) sum += counts[i];
  int run = block_excl_scan(sum, sh);
  for (int64_t i = b; i < e; i++) {
    int c = counts[i];
    counts[i] = run;
    run += c;
  }
}

// Stable scatter of one tile: thread t owns items t*kSortItems.. of the tile, in order. Its slot for digit d is the
// digit's global start for this tile (offs) plus the tile's items of digit d held by lower threads plus its own.
__global__ void __launch_bounds__(kSortThreads)
    sort_scatter(const int32_t *keys, const int32_t *vals, int32_t *keys_out, int32_t *vals_out, int64_t n, int shift,
                 const int32_t *offs) {
  __shared__ int cnt[kDigits * kSortThreads]; // digit-major: [d][thread]
  __shared__ int sh[kSortThreads];
  const int64_t first = blockIdx.x * (int64_t)kTile + threadIdx.x * kSortItems;
  int mine[kDigits];
#pragma unroll
  for (int d = 0; d < kDigits; d++) mine[d] = 0;
  for (int k = 0; k < kSortItems; k++)
    if (first + k < n) {
      const int d = (keys[first + k] >> shift) & (kDigits - 1);
#pragma unroll
      for (int q = 0; q < kDigits; q++) mine[q] += q == d; // constant indices keep mine in registers
    }
#pragma unroll
  for (int d = 0; d < kDigits; d++) cnt[d * kSortThreads + threadIdx.x] = mine[d];
  __syncthreads();
  // exclusive scan of cnt in digit-major order: thread t scans entries t*16 .. t*16+15 (all in digit t/16)
  int *run = cnt + threadIdx.x * kDigits;
  int sum = 0;
  for (int k = 0; k < kDigits; k++) sum += run[k];
  int acc = block_excl_scan(sum, sh);
  for (int k = 0; k < kDigits; k++) {
    int c = run[k];
    run[k] = acc;
    acc += c;
  }
  __syncthreads();
  int slot[kDigits];
#pragma unroll
  for (int d = 0; d < kDigits; d++)
    slot[d] = offs[d * gridDim.x + blockIdx.x] + cnt[d * kSortThreads + threadIdx.x] - cnt[d * kSortThreads];
  for (int k = 0; k < kSortItems; k++) {
    if (first + k >= n) break;
    const int32_t key = keys[first + k];
    const int d = (key >> shift) & (kDigits - 1);
    int at = 0;
#pragma unroll
    for (int q = 0; q < kDigits; q++)
      if (q == d) at = slot[q]++; // constant indices keep slot in registers
    keys_out[at] = key;
    vals_out[at] = vals[first + k];
  }
}

// dst[key, c..c+V) += src[pos, c..c+V) over the segment of sorted element blockIdx.x, in sorted (= index) order.
// grid = (n, column chunks of kSegThreads V); dst f32 or src's dtype. The additions form one chain per column (the
// CPU's order); the loads do not: the segment's end comes from a binary search, and kSegBatch rows are loaded
// before they are added, so a long segment (token types: ~n/2 rows each) waits on memory once per batch.
const int kSegBatch = 8, kSegThreads = 64; // small blocks: more of them share a long segment's columns
template <class TD, class TS, int V>
__global__ void segment_sum(TD *dst, const TS *src, const int32_t *keys, const int32_t *pos, int64_t n, int64_t h) {
  const int64_t k = blockIdx.x;
  const int32_t key = keys[k];
  if (k > 0 && keys[k - 1] == key) return; // uniform per block: not a segment start
  const int64_t c = (blockIdx.y * (int64_t)blockDim.x + threadIdx.x) * V;
  if (c >= h) return;
  int64_t lo = k + 1, hi = n; // end: the first sorted element after k with another key
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (keys[mid] == key)
      lo = mid + 1;
    else
      hi = mid;
  }
  const int64_t end = lo;
  cu_vec<TD, V> d;
  d.load(dst + key * h + c);
  float acc[V];
#pragma unroll
  for (int e = 0; e < V; e++) acc[e] = to_f(d.t[e]);
  int64_t j = k;
  for (; j + kSegBatch <= end; j += kSegBatch) {
    cu_vec<TS, V> s[kSegBatch];
#pragma unroll
    for (int u = 0; u < kSegBatch; u++) s[u].load(src + pos[j + u] * h + c);
#pragma unroll
    for (int u = 0; u < kSegBatch; u++)
#pragma unroll
      for (int e = 0; e < V; e++) acc[e] += to_f(s[u].t[e]);
  }
  for (; j < end; j++) {
    cu_vec<TS, V> s;
    s.load(src + pos[j] * h + c);
#pragma unroll
    for (int e = 0; e < V; e++) acc[e] += to_f(s.t[e]);
  }
#pragma unroll
  for (int e = 0; e < V; e++) from_f(acc[e], &d.t[e]);
  d.store(dst + key * h + c);
}

// ---------------------------------------------------------------- embedding sum + LayerNorm + dropout
// One block per row r (grid-stride), threads striding over the row's vectors of V columns. The sum
// s = word + position + token type (f32, in that order, as the CPU's composition) is gathered again in each pass
// (mean, variance, output; backward: two) rather than stored: the three rows stay in L1/L2, nothing of [rows, H]
// is written besides y, and rounding s to T would change the result.
template <class T>
struct emb_src {
  const T *word, *pos, *type;
  const int64_t *ids, *pids, *tids;
};

template <class T, int V>
__device__ __forceinline__ void emb_load(const T *p, float (&v)[V]) {
  cu_vec<T, V> a;
  a.load(p);
#pragma unroll
  for (int k = 0; k < V; k++) v[k] = to_f(a.t[k]);
}

template <class T, int V>
__device__ __forceinline__ void emb_s(const emb_src<T> &e, int64_t r, int64_t h, int64_t j, float (&s)[V]) {
  float a[V], b[V];
  emb_load<T, V>(e.word + e.ids[r] * h + j, s);
  emb_load<T, V>(e.pos + e.pids[r] * h + j, a);
  emb_load<T, V>(e.type + e.tids[r] * h + j, b);
#pragma unroll
  for (int k = 0; k < V; k++) s[k] = s[k] + a[k] + b[k];
}

// The gradient reaching the LayerNorm output: dy through the dropout mask of elements i .. i+V-1.
template <class T, int V>
__device__ __forceinline__ void emb_dy(const T *dy, int64_t i, float p, float scale, uint64_t seed, uint64_t offset,
                                       float (&d)[V]) {
  emb_load<T, V>(dy + i, d);
  if (p <= 0.0f) return;
  bool k[V];
  bl_dropout_keep_v<V>(seed, offset, (uint64_t)i, p, k);
#pragma unroll
  for (int q = 0; q < V; q++) d[q] = k[q] ? d[q] * scale : 0.0f;
}

template <class T, class G, int V>
__global__ void emb_ln_fwd(emb_src<T> e, const G *gamma, const G *beta, T *y, float *mean, float *rstd, int64_t rows,
                           int64_t h, float eps, float p, float scale, uint64_t seed, uint64_t offset) {
  seed = bl_seed_resolve(seed); // a device seed slot (bl_ops.h) read once
  __shared__ float sh[32];
  const int64_t step = blockDim.x * (int64_t)V;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float sum = 0.0f;
    for (int64_t j = threadIdx.x * (int64_t)V; j < h; j += step) {
      float s[V];
      emb_s<T, V>(e, r, h, j, s);
#pragma unroll
      for (int k = 0; k < V; k++) sum += s[k];
    }
    const float m = cu_block_sum(sum, sh) / (float)h;
    float var = 0.0f;
    for (int64_t j = threadIdx.x * (int64_t)V; j < h; j += step) {
      float s[V];
      emb_s<T, V>(e, r, h, j, s);
#pragma unroll
      for (int k = 0; k < V; k++) var += (s[k] - m) * (s[k] - m);
    }
    const float rs = 1.0f / sqrtf(cu_block_sum(var, sh) / (float)h + eps);
    for (int64_t j = threadIdx.x * (int64_t)V; j < h; j += step) {
      float s[V], g[V], b[V] = {};
      bool keep[V] = {};
      emb_s<T, V>(e, r, h, j, s);
      emb_load<G, V>(gamma + j, g);
      if (beta) emb_load<G, V>(beta + j, b);
      if (p > 0.0f) bl_dropout_keep_v<V>(seed, offset, (uint64_t)(r * h + j), p, keep);
      cu_vec<T, V> o;
#pragma unroll
      for (int k = 0; k < V; k++) {
        float v = (s[k] - m) * rs * g[k];
        if (beta) v += b[k];
        if (p > 0.0f) v = keep[k] ? v * scale : 0.0f;
        from_f(v, &o.t[k]);
      }
      o.store(y + r * h + j);
    }
    if (threadIdx.x == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
  }
}

// ds = the gradient of s (LayerNorm backward of the dropped dy), in T.
template <class T, class G, int V>
__global__ void emb_ln_bwd(emb_src<T> e, const T *dy, const G *gamma, const float *mean, const float *rstd, T *ds,
                           int64_t rows, int64_t h, float p, float scale, uint64_t seed, uint64_t offset) {
  seed = bl_seed_resolve(seed); // a device seed slot (bl_ops.h) read once
  __shared__ float sh[32];
  const int64_t step = blockDim.x * (int64_t)V;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float m = mean[r], rs = rstd[r];
    float a = 0.0f, b = 0.0f;
    for (int64_t j = threadIdx.x * (int64_t)V; j < h; j += step) {
      float s[V], g[V], d[V];
      emb_s<T, V>(e, r, h, j, s);
      emb_load<G, V>(gamma + j, g);
      emb_dy<T, V>(dy, r * h + j, p, scale, seed, offset, d);
#pragma unroll
      for (int k = 0; k < V; k++) {
        const float gj = d[k] * g[k];
        a += gj;
        b += gj * ((s[k] - m) * rs);
      }
    }
    a = cu_block_sum(a, sh) / (float)h;
    b = cu_block_sum(b, sh) / (float)h;
    for (int64_t j = threadIdx.x * (int64_t)V; j < h; j += step) {
      float s[V], g[V], d[V];
      emb_s<T, V>(e, r, h, j, s);
      emb_load<G, V>(gamma + j, g);
      emb_dy<T, V>(dy, r * h + j, p, scale, seed, offset, d);
      cu_vec<T, V> o;
#pragma unroll
      for (int k = 0; k < V; k++) from_f(rs * (d[k] * g[k] - a - ((s[k] - m) * rs) * b), &o.t[k]);
      o.store(ds + r * h + j);
    }
  }
}

// Column partial sums over fixed chunks of kChunk rows (deterministic): per chunk c, pg[c] = sum dy' xhat,
// pb[c] = sum dy' (dgamma, dbeta) and, when pt, pt[t][c] = sum of the ds rows of token type t (its table's
// gradient: no sort, no long segments). Block (32, 8): 32 column groups of V, rows ty, ty + 8, ... of the chunk.
const int kChunk = 256, kTypes = 4;
template <class T, int V>
__global__ void emb_param_partial(emb_src<T> e, const T *dy, const T *ds, const float *mean, const float *rstd,
                                  float *pg, float *pb, float *pt, int ntype, int64_t rows, int64_t h, float p,
                                  float scale, uint64_t seed, uint64_t offset) {
  seed = bl_seed_resolve(seed);              // a device seed slot (bl_ops.h) read once
  __shared__ float red[8][32][V + (V == 1)]; // V == 1: padded against bank conflicts
  const int64_t j = (blockIdx.x * 32LL + threadIdx.x) * V, nchunk = gridDim.y;
  const int64_t r0 = blockIdx.y * (int64_t)kChunk, r1 = min(r0 + kChunk, rows);
  float ag[V], ab[V], at[kTypes][V];
#pragma unroll
  for (int k = 0; k < V; k++) {
    ag[k] = ab[k] = 0.0f;
#pragma unroll
    for (int t = 0; t < kTypes; t++) at[t][k] = 0.0f;
  }
  if (j < h)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      float s[V], d[V];
      emb_s<T, V>(e, r, h, j, s);
      emb_dy<T, V>(dy, r * h + j, p, scale, seed, offset, d);
#pragma unroll
      for (int k = 0; k < V; k++) {
        ag[k] += d[k] * ((s[k] - mean[r]) * rstd[r]);
        ab[k] += d[k];
      }
      if (!pt) continue;
      float q[V];
      emb_load<T, V>(ds + r * h + j, q);
      const int64_t ty = e.tids[r];
#pragma unroll
      for (int t = 0; t < kTypes; t++) // constant indices keep `at` in registers
#pragma unroll
        for (int k = 0; k < V; k++) at[t][k] += t == ty ? q[k] : 0.0f;
    }
  // the 8 row groups' sums added in a fixed order, one quantity at a time (uniform: every thread takes part)
  auto flush = [&](const float(&acc)[V], float *out) {
#pragma unroll
    for (int k = 0; k < V; k++) red[threadIdx.y][threadIdx.x][k] = acc[k];
    __syncthreads();
    if (threadIdx.y == 0 && j < h)
#pragma unroll
      for (int k = 0; k < V; k++) {
        float v = 0.0f;
        for (int q = 0; q < 8; q++) v += red[q][threadIdx.x][k];
        out[blockIdx.y * h + j + k] = v;
      }
    __syncthreads();
  };
  flush(ag, pg);
  flush(ab, pb);
  if (!pt) return;
#pragma unroll
  for (int t = 0; t < kTypes; t++)
    if (t < ntype) flush(at[t], pt + t * nchunk * h);
}

// The chunks added in order into the parameter gradients (+=); any of the three may be NULL.
__global__ void emb_param_final(const float *pg, const float *pb, const float *pt, int ntype, int64_t nchunk, int64_t h,
                                float *dgamma, float *dbeta, float *dtype) {
  for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < h; j += (int64_t)gridDim.x * blockDim.x) {
    float g = 0.0f, b = 0.0f;
    for (int64_t c = 0; c < nchunk; c++) {
      g += pg[c * h + j];
      b += pb[c * h + j];
    }
    if (dgamma) dgamma[j] += g;
    if (dbeta) dbeta[j] += b;
    if (!dtype) continue;
    for (int t = 0; t < ntype; t++) {
      float v = 0.0f;
      for (int64_t c = 0; c < nchunk; c++) v += pt[(t * nchunk + c) * h + j];
      dtype[t * h + j] += v;
    }
  }
}

// Loads ids and checks 0 <= id < limit. On failure sets the error (naming the position and value).
int load_checked(const char *op, int dev, const bl_tensor *t, int64_t limit, cu_mem *ids, const char *what,
                 const char *limit_what) {
  BL_CHECK(cu_load_ids(op, t, ids));
  int64_t n = t->numel;
  if (n == 0) return 0;
  if (limit > 0 && cu_checks_deferred(dev)) // bad ids become row 0; the error comes with the next check
    return cu_defer_ids(op, dev, ids->as<int64_t>(), n, limit, 0, 0, 0, what, limit_what);
  cu_mem flag;
  BL_CHECK(flag.alloc(op, dev, sizeof(unsigned long long)));
  cu_cost_kernel(dev, "index check", "fill_u64", 8);
  fill_u64<<<1, 32, 0, cu_stream(dev)>>>(flag.as<unsigned long long>(), 1, ~0ull);
  BL_CHECK(cu_launched(op, dev));
  cu_cost_kernel(dev, "index check", "check_range", 8.0 * n);
  check_range<<<cu_blocks(n, 256), 256, 0, cu_stream(dev)>>>(ids->as<int64_t>(), n, limit,
                                                             flag.as<unsigned long long>());
  BL_CHECK(cu_launched(op, dev));
  int64_t bad;
  BL_CHECK(cu_read_i64(op, dev, flag.as<int64_t>(), &bad, 1));
  if (bad != -1) { // ~0ull read as int64
    int64_t v = 0;
    BL_CHECK(cu_read_i64(op, dev, ids->as<int64_t>() + bad, &v, 1));
    return bl_set_error(BL_EINVAL, "%s: %s %lld at position %lld is out of range for %s %lld", op, what, (long long)v,
                        (long long)bad, limit_what, (long long)limit);
  }
  return 0;
}

// Elements per 16-byte vector of `dtype` when rows of h elements at p, q are whole vectors, else 1.
int vec_width(int dtype, int64_t h, const void *p, const void *q) {
  const int v = 16 / (int)bl_dtype_size(dtype);
  bool ok = h % v == 0 && (uintptr_t)p % 16 == 0 && (!q || (uintptr_t)q % 16 == 0);
  return ok ? v : 1;
}
bool is_float(int dtype) { return dtype == BL_F32 || dtype == BL_BF16 || dtype == BL_F16; }

template <class T>
int launch_gather(const char *op, int dev, void *out, const void *src, const int64_t *ids, int64_t n, int64_t h,
                  int accumulate, int v, double bytes) {
  cu_cost_kernel(dev, "embedding", "gather_rows", bytes);
  unsigned grid = cu_blocks(n, 1, 1 << 20);
  cudaStream_t s = cu_stream(dev);
  if (v > 1)
    gather_rows<T, 16 / sizeof(T)><<<grid, 256, 0, s>>>((T *)out, (const T *)src, ids, n, h, accumulate);
  else
    gather_rows<T, 1><<<grid, 256, 0, s>>>((T *)out, (const T *)src, ids, n, h, accumulate);
  return cu_launched(op, dev);
}

int lookup(const char *op, bl_tensor *out, const bl_tensor *src, const bl_tensor *ids, int accumulate, const char *what,
           const char *limit_what) {
  int dev;
  const bl_tensor *ts[] = { out, src, ids };
  BL_CHECK(cu_device(op, 3, ts, &dev));
  if (src->ndim < 1 || out->ndim < 1) return bl_set_error(BL_EINVAL, "%s: tensors need at least one dim", op);
  int64_t h = src->shape[src->ndim - 1], rows = 1, n = ids->numel;
  for (int d = 0; d + 1 < src->ndim; d++) rows *= src->shape[d];
  if (out->shape[out->ndim - 1] != h || out->numel != n * h)
    return bl_set_error(BL_EINVAL, "%s: output has %lld elements, expected %lld x %lld", op, (long long)out->numel,
                        (long long)n, (long long)h);
  cu_mem id;
  BL_CHECK(load_checked(op, dev, ids, rows, &id, what, limit_what));
  if (n == 0 || h == 0) return 0;
  // rows read (once each at best) and written; accumulate reads the output too
  const double bytes = (double)bl_dtype_size(out->dtype) * n * h * (accumulate ? 3 : 2) + 8.0 * n;
  if (out->dtype == src->dtype && is_float(out->dtype) && cu_is_contig(out) && cu_is_contig(src)) {
    const int v = vec_width(out->dtype, h, out->data, src->data);
    const int64_t *ix = id.as<int64_t>();
    void *o = out->data;
    const void *t = src->data;
    if (out->dtype == BL_BF16) return launch_gather<__nv_bfloat16>(op, dev, o, t, ix, n, h, accumulate, v, bytes);
    if (out->dtype == BL_F16) return launch_gather<__half>(op, dev, o, t, ix, n, h, accumulate, v, bytes);
    return launch_gather<float>(op, dev, o, t, ix, n, h, accumulate, v, bytes);
  }
  cu_buf bs, bo;
  BL_CHECK(cu_load(op, src, &bs));
  BL_CHECK(cu_out(op, out, &bo, accumulate));
  BL_CHECK(launch_gather<float>(op, dev, bo.p, bs.p, id.as<int64_t>(), n, h, accumulate, 1, bytes));
  return cu_store(op, out, &bo);
}

// Sorts the n positions by index (0 <= index < rows) into keys/vals (stable). Leaves the result in *keys, *vals.
int sort_positions(const char *op, int dev, const int64_t *ids, int64_t n, int64_t rows, cu_mem *ka, cu_mem *va,
                   cu_mem *kb, cu_mem *vb, int32_t **keys, int32_t **vals) {
  const size_t b4 = (size_t)n * sizeof(int32_t);
  const int64_t ntiles = (n + kTile - 1) / kTile;
  cu_mem counts;
  BL_CHECK(ka->alloc(op, dev, b4));
  BL_CHECK(va->alloc(op, dev, b4));
  BL_CHECK(kb->alloc(op, dev, b4));
  BL_CHECK(vb->alloc(op, dev, b4));
  BL_CHECK(counts.alloc(op, dev, (size_t)(kDigits * ntiles) * sizeof(int32_t)));
  cudaStream_t s = cu_stream(dev);
  int32_t *k0 = ka->as<int32_t>(), *v0 = va->as<int32_t>(), *k1 = kb->as<int32_t>(), *v1 = vb->as<int32_t>();
  cu_cost_kernel(dev, "embedding", "sort_init", 16.0 * n);
  sort_init<<<cu_blocks(n, 256), 256, 0, s>>>(ids, n, k0, v0);
  BL_CHECK(cu_launched(op, dev));
  int bits = 1;
  while (bits < 31 && (rows - 1) >> bits) bits++;
  for (int shift = 0; shift < bits; shift += 4) {
    cu_cost_kernel(dev, "embedding", "sort_count", 4.0 * n + 4.0 * kDigits * ntiles);
    sort_count<<<(unsigned)ntiles, kSortThreads, 0, s>>>(k0, n, shift, counts.as<int32_t>());
    BL_CHECK(cu_launched(op, dev));
    cu_cost_kernel(dev, "embedding", "sort_scan", 8.0 * kDigits * ntiles);
    sort_scan<<<1, kSortThreads, 0, s>>>(counts.as<int32_t>(), kDigits * ntiles);
    BL_CHECK(cu_launched(op, dev));
    cu_cost_kernel(dev, "embedding", "sort_scatter", 16.0 * n + 4.0 * kDigits * ntiles);
    sort_scatter<<<(unsigned)ntiles, kSortThreads, 0, s>>>(k0, v0, k1, v1, n, shift, counts.as<int32_t>());
    BL_CHECK(cu_launched(op, dev));
    std::swap(k0, k1);
    std::swap(v0, v1);
  }
  *keys = k0;
  *vals = v0;
  return 0;
}

template <class TD, class TS>
int launch_segments(const char *op, int dev, void *dst, const void *src, const int32_t *keys, const int32_t *pos,
                    int64_t n, int64_t h, int v, double bytes) {
  cu_cost_kernel(dev, "embedding", "segment_sum", bytes);
  cudaStream_t s = cu_stream(dev);
  if (v > 1) {
    constexpr int V = 16 / sizeof(TS) < 16 / sizeof(TD) ? 16 / sizeof(TS) : 16 / sizeof(TD);
    dim3 grid((unsigned)n, (unsigned)((h / V + kSegThreads - 1) / kSegThreads));
    segment_sum<TD, TS, V><<<grid, kSegThreads, 0, s>>>((TD *)dst, (const TS *)src, keys, pos, n, h);
  } else {
    dim3 grid((unsigned)n, (unsigned)((h + kSegThreads - 1) / kSegThreads));
    segment_sum<TD, TS, 1><<<grid, kSegThreads, 0, s>>>((TD *)dst, (const TS *)src, keys, pos, n, h);
  }
  return cu_launched(op, dev);
}

// dst (f32 or src's dtype) += rows of src by sorted segments, natively; BL_EUNSUPPORTED (no error set) otherwise.
int segments_native(const char *op, int dev, bl_tensor *dst, const bl_tensor *src, const int32_t *keys,
                    const int32_t *pos, int64_t n, int64_t h, double bytes) {
  if (!is_float(src->dtype) || !cu_is_contig(src) || !cu_is_contig(dst)) return BL_EUNSUPPORTED;
  if (dst->dtype != BL_F32 && dst->dtype != src->dtype) return BL_EUNSUPPORTED;
  // vectors of the narrower type's 16 bytes: both rows must be whole vectors of that many elements
  const int v = vec_width(src->dtype, h, src->data, nullptr) > 1 && vec_width(dst->dtype, h, dst->data, nullptr) > 1;
  const int ws = src->dtype == BL_F32 ? 0 : src->dtype == BL_BF16 ? 1 : 2, wd = dst->dtype == BL_F32 ? 0 : ws;
  void *d = dst->data;
  const void *s = src->data;
  switch (ws * 3 + wd) {
    case 0: return launch_segments<float, float>(op, dev, d, s, keys, pos, n, h, v, bytes);
    case 3: return launch_segments<float, __nv_bfloat16>(op, dev, d, s, keys, pos, n, h, v, bytes);
    case 4: return launch_segments<__nv_bfloat16, __nv_bfloat16>(op, dev, d, s, keys, pos, n, h, v, bytes);
    case 6: return launch_segments<float, __half>(op, dev, d, s, keys, pos, n, h, v, bytes);
    default: return launch_segments<__half, __half>(op, dev, d, s, keys, pos, n, h, v, bytes);
  }
}

int scatter_loaded(const char *op, int dev, bl_tensor *dst, const bl_tensor *src, const int64_t *ids, int64_t n,
                   int64_t rows);

int scatter(const char *op, bl_tensor *dst, const bl_tensor *src, const bl_tensor *ids, const char *what,
            const char *limit_what) {
  int dev;
  const bl_tensor *ts[] = { dst, src, ids };
  BL_CHECK(cu_device(op, 3, ts, &dev));
  if (dst->ndim < 1 || src->ndim < 1) return bl_set_error(BL_EINVAL, "%s: tensors need at least one dim", op);
  int64_t h = dst->shape[dst->ndim - 1], n = ids->numel;
  int64_t rows = 1;
  for (int d = 0; d + 1 < dst->ndim; d++) rows *= dst->shape[d];
  if (src->shape[src->ndim - 1] != h || src->numel != n * h)
    return bl_set_error(BL_EINVAL, "%s: grad_output has %lld elements, expected %lld x %lld", op, (long long)src->numel,
                        (long long)n, (long long)h);
  cu_mem id;
  BL_CHECK(load_checked(op, dev, ids, rows, &id, what, limit_what));
  return scatter_loaded(op, dev, dst, src, id.as<int64_t>(), n, rows);
}

// scatter() with the indices already loaded and checked (ids: n int64 in [0, rows) on dev).
int scatter_loaded(const char *op, int dev, bl_tensor *dst, const bl_tensor *src, const int64_t *ids, int64_t n,
                   int64_t rows) {
  const int64_t h = dst->shape[dst->ndim - 1];
  if (n == 0 || h == 0) return 0;
  if ((h + kSegThreads - 1) / kSegThreads > 65535)
    return bl_set_error(BL_EUNSUPPORTED, "%s: cuda:%d: rows of %lld are too wide", op, dev, (long long)h);
  if (n > INT32_MAX || rows > INT32_MAX)
    return bl_set_error(BL_EUNSUPPORTED, "%s: cuda:%d: %lld indices into %lld rows are too many", op, dev, (long long)n,
                        (long long)rows);
  cu_mem ka, va, kb, vb;
  int32_t *keys, *pos;
  BL_CHECK(sort_positions(op, dev, ids, n, rows, &ka, &va, &kb, &vb, &keys, &pos));
  // at best: the gradient rows read once, each touched target row read and written once (<= n of them)
  const double touched = (double)(n < rows ? n : rows) * h;
  const double bytes = cu_bytes(src) + 2.0 * touched * bl_dtype_size(dst->dtype) + 8.0 * n;
  int rc = segments_native(op, dev, dst, src, keys, pos, n, h, bytes);
  if (rc != BL_EUNSUPPORTED) return rc;
  cu_buf bs, bd;
  BL_CHECK(cu_load(op, src, &bs));
  BL_CHECK(cu_out(op, dst, &bd, 1));
  rc = launch_segments<float, float>(op, dev, bd.p, bs.p, keys, pos, n, h, 0, bytes);
  if (rc) return rc;
  return cu_store(op, dst, &bd);
}

// ---------------------------------------------------------------- embedding_layernorm, host side
struct emb_ids {
  cu_mem ids, pids, tids;
};

int emb_load_ids(const char *op, int dev, const bl_tensor *const *tables, const bl_tensor *const *idx, emb_ids *m) {
  BL_CHECK(load_checked(op, dev, idx[0], tables[0]->shape[0], &m->ids, "id", "vocabulary size"));
  BL_CHECK(load_checked(op, dev, idx[1], tables[1]->shape[0], &m->pids, BL_EMB_POSITION_NAMES));
  return load_checked(op, dev, idx[2], tables[2]->shape[0], &m->tids, BL_EMB_TOKEN_TYPE_NAMES);
}

// Whether the native kernels take these operands (acts: tables and y or dy; params: gamma, beta).
bool emb_native(std::initializer_list<const bl_tensor *> acts, std::initializer_list<const bl_tensor *> params) {
  const int dt = (*acts.begin())->dtype;
  if (!is_float(dt)) return false;
  for (const bl_tensor *t : acts)
    if (t->dtype != dt || !cu_is_contig(t)) return false;
  for (const bl_tensor *t : params)
    if (t && ((t->dtype != dt && t->dtype != BL_F32) || !cu_is_contig(t))) return false;
  return true;
}

// 16-byte vectors of T when rows of h are whole vectors at 16-byte aligned bases, else 1.
template <class T>
int emb_vec(int64_t h, std::initializer_list<const void *> ps) {
  bool ok = h % (16 / sizeof(T)) == 0;
  for (const void *q : ps) ok = ok && (uintptr_t)q % 16 == 0;
  return ok ? 16 / sizeof(T) : 1;
}

int emb_threads(int64_t vectors) {
  int t = 32;
  while (t < 256 && t < vectors) t <<= 1;
  return t;
}

// f(T(), G()) for the activation dtype dt and the LayerNorm parameters' gdt.
template <class F>
int emb_types(int dt, int gdt, F f) {
  if (dt == BL_F32) return f(float(), float());
  if (dt == BL_BF16) return gdt == BL_F32 ? f(__nv_bfloat16(), float()) : f(__nv_bfloat16(), __nv_bfloat16());
  return gdt == BL_F32 ? f(__half(), float()) : f(__half(), __half());
}

template <class T>
emb_src<T> emb_source(const bl_tensor *const *tables, const emb_ids &m) {
  return { (const T *)tables[0]->data, (const T *)tables[1]->data, (const T *)tables[2]->data,
           m.ids.as<int64_t>(),        m.pids.as<int64_t>(),       m.tids.as<int64_t>() };
}

// Minimum traffic of reading the rows once: every word row, the small position/type tables at most once.
double emb_rows_bytes(const bl_tensor *const *tables, int64_t rows, int64_t h) {
  const double es = bl_dtype_size(tables[0]->dtype);
  return es * h * ((double)rows + (double)std::min(rows, tables[1]->shape[0]) + std::min(rows, tables[2]->shape[0]));
}

int emb_ln_forward(bl_tensor *y, bl_tensor *mean, bl_tensor *rstd, const bl_tensor *const *tables,
                   const bl_tensor *const *idx, const bl_tensor *gamma, const bl_tensor *beta, double eps, double p,
                   uint64_t seed, uint64_t offset) {
  const char *op = "embedding_layernorm";
  int dev;
  const bl_tensor *ts[] = { y, mean, rstd, tables[0], tables[1], tables[2], idx[0], idx[1], idx[2], gamma, beta };
  BL_CHECK(cu_device(op, 11, ts, &dev));
  if (!emb_native({ tables[0], tables[1], tables[2], y }, { gamma, beta }) || (beta && beta->dtype != gamma->dtype) ||
      mean->dtype != BL_F32 || rstd->dtype != BL_F32 || !cu_is_contig(mean) || !cu_is_contig(rstd))
    return BL_EUNSUPPORTED;
  emb_ids m;
  BL_CHECK(emb_load_ids(op, dev, tables, idx, &m));
  const int64_t h = tables[0]->shape[1], rows = idx[0]->numel;
  if (rows == 0 || h == 0) return 0;
  const float scale = p > 0 ? (float)(1.0 / (1.0 - p)) : 1.0f;
  return emb_types(y->dtype, gamma->dtype, [&](auto t, auto g) {
    using T = decltype(t);
    using G = decltype(g);
    const emb_src<T> e = emb_source<T>(tables, m);
    const G *gp = (const G *)gamma->data, *bp = beta ? (const G *)beta->data : nullptr;
    const int v = emb_vec<T>(h, { tables[0]->data, tables[1]->data, tables[2]->data, y->data, gp, bp });
    cu_cost_kernel(dev, "embedding", "emb_ln_fwd",
                   emb_rows_bytes(tables, rows, h) + sizeof(T) * (double)rows * h + 2.0 * sizeof(G) * h + 32.0 * rows);
    const unsigned grid = cu_blocks(rows, 1, 1 << 20);
    float *mp = (float *)mean->data, *rp = (float *)rstd->data;
    if (v > 1)
      emb_ln_fwd<T, G, 16 / sizeof(T)><<<grid, emb_threads(h / v), 0, cu_stream(dev)>>>(
          e, gp, bp, (T *)y->data, mp, rp, rows, h, (float)eps, (float)p, scale, seed, offset);
    else
      emb_ln_fwd<T, G, 1><<<grid, emb_threads(h), 0, cu_stream(dev)>>>(e, gp, bp, (T *)y->data, mp, rp, rows, h,
                                                                       (float)eps, (float)p, scale, seed, offset);
    return cu_launched(op, dev);
  });
}

// dgamma, dbeta and the token-type table's gradient (+=, any may be NULL) from the column partials.
template <class T, int V>
int emb_params(const char *op, int dev, const emb_src<T> &e, const T *dy, const T *ds, const float *mean,
               const float *rstd, bl_tensor *dgamma, bl_tensor *dbeta, bl_tensor *dtype, int ntype, int64_t rows,
               int64_t h, float p, float scale, uint64_t seed, uint64_t offset) {
  const int64_t nchunk = (rows + kChunk - 1) / kChunk, nt = dtype ? ntype : 0;
  cu_mem part;
  BL_CHECK(part.alloc(op, dev, (size_t)((2 + nt) * nchunk * h) * sizeof(float)));
  float *pg = part.as<float>(), *pb = pg + nchunk * h, *pt = nt ? pb + nchunk * h : nullptr;
  const double n = (double)rows * h;
  cu_cost_kernel(dev, "embedding", "emb_param_partial",
                 sizeof(T) * n * (nt ? 3 : 2) + 32.0 * rows + 4.0 * (2 + nt) * nchunk * h);
  emb_param_partial<T, V><<<dim3((unsigned)((h / V + 31) / 32), (unsigned)nchunk), dim3(32, 8), 0, cu_stream(dev)>>>(
      e, dy, ds, mean, rstd, pg, pb, pt, ntype, rows, h, p, scale, seed, offset);
  BL_CHECK(cu_launched(op, dev));
  cu_buf bg, bb, bt;
  if (dgamma) BL_CHECK(cu_out(op, dgamma, &bg, 1));
  if (dbeta) BL_CHECK(cu_out(op, dbeta, &bb, 1));
  if (dtype) BL_CHECK(cu_out(op, dtype, &bt, 1));
  cu_cost_kernel(dev, "embedding", "emb_param_final", 4.0 * (2 + nt) * (nchunk + 2) * h);
  emb_param_final<<<cu_blocks(h, 256), 256, 0, cu_stream(dev)>>>(pg, pb, pt, ntype, nchunk, h, dgamma ? bg.p : nullptr,
                                                                 dbeta ? bb.p : nullptr, dtype ? bt.p : nullptr);
  BL_CHECK(cu_launched(op, dev));
  if (dgamma) BL_CHECK(cu_store(op, dgamma, &bg));
  if (dbeta) BL_CHECK(cu_store(op, dbeta, &bb));
  if (dtype) BL_CHECK(cu_store(op, dtype, &bt));
  return 0;
}

int emb_ln_backward(bl_tensor *const *grads, bl_tensor *dgamma, bl_tensor *dbeta, const bl_tensor *dy,
                    const bl_tensor *const *tables, const bl_tensor *const *idx, const bl_tensor *gamma,
                    const bl_tensor *mean, const bl_tensor *rstd, double p, uint64_t seed, uint64_t offset) {
  const char *op = "embedding_layernorm_backward";
  int dev;
  const bl_tensor *ts[] = { grads[0],  grads[1], grads[2], dgamma, dbeta, dy,   tables[0], tables[1],
                            tables[2], idx[0],   idx[1],   idx[2], gamma, mean, rstd };
  BL_CHECK(cu_device(op, 15, ts, &dev));
  const int64_t h = tables[0]->shape[1], rows = idx[0]->numel, ntype = tables[2]->shape[0];
  if (!emb_native({ tables[0], tables[1], tables[2], dy }, { gamma }) || ntype > kTypes || mean->dtype != BL_F32 ||
      rstd->dtype != BL_F32 || !cu_is_contig(mean) || !cu_is_contig(rstd) || (rows + kChunk - 1) / kChunk > 65535)
    return BL_EUNSUPPORTED;
  emb_ids m;
  BL_CHECK(emb_load_ids(op, dev, tables, idx, &m));
  if (rows == 0 || h == 0) return 0;
  const float scale = p > 0 ? (float)(1.0 / (1.0 - p)) : 1.0f;
  cu_mem dsm;
  BL_CHECK(dsm.alloc(op, dev, (size_t)(rows * h) * bl_dtype_size(dy->dtype)));
  BL_CHECK(emb_types(dy->dtype, gamma->dtype, [&](auto t, auto g) {
    using T = decltype(t);
    using G = decltype(g);
    const emb_src<T> e = emb_source<T>(tables, m);
    const G *gp = (const G *)gamma->data;
    const T *dyp = (const T *)dy->data;
    T *ds = dsm.as<T>();
    const int v = emb_vec<T>(h, { tables[0]->data, tables[1]->data, tables[2]->data, dyp, gp });
    const float *mp = (const float *)mean->data, *rp = (const float *)rstd->data;
    cu_cost_kernel(dev, "embedding", "emb_ln_bwd",
                   emb_rows_bytes(tables, rows, h) + 2.0 * sizeof(T) * rows * h + sizeof(G) * (double)h + 32.0 * rows);
    const unsigned grid = cu_blocks(rows, 1, 1 << 20);
    const float fp = (float)p;
    if (v > 1) {
      constexpr int V = 16 / sizeof(T);
      emb_ln_bwd<T, G, V>
          <<<grid, emb_threads(h / V), 0, cu_stream(dev)>>>(e, dyp, gp, mp, rp, ds, rows, h, fp, scale, seed, offset);
      BL_CHECK(cu_launched(op, dev));
      return emb_params<T, V>(op, dev, e, dyp, ds, mp, rp, dgamma, dbeta, grads[2], (int)ntype, rows, h, fp, scale,
                              seed, offset);
    }
    emb_ln_bwd<T, G, 1>
        <<<grid, emb_threads(h), 0, cu_stream(dev)>>>(e, dyp, gp, mp, rp, ds, rows, h, fp, scale, seed, offset);
    BL_CHECK(cu_launched(op, dev));
    return emb_params<T, 1>(op, dev, e, dyp, ds, mp, rp, dgamma, dbeta, grads[2], (int)ntype, rows, h, fp, scale, seed,
                            offset);
  }));
  if (!grads[0] && !grads[1]) return 0;
  // the word and position tables by the sorted, deterministic scatter over ds
  const int64_t shape[2] = { rows, h };
  bl_tensor *dst = nullptr;
  BL_CHECK(bl_tensor_wrap(dsm.p, 2, shape, nullptr, dy->dtype, dev, &dst));
  int rc = 0;
  if (grads[0]) rc = scatter_loaded(op, dev, grads[0], dst, m.ids.as<int64_t>(), rows, tables[0]->shape[0]);
  if (!rc && grads[1]) rc = scatter_loaded(op, dev, grads[1], dst, m.pids.as<int64_t>(), rows, tables[1]->shape[0]);
  bl_tensor_free(dst);
  return rc;
}

} // namespace

extern "C" int bl_cuda_embedding_forward(bl_tensor *out, const bl_tensor *table, const bl_tensor *ids, int accumulate) {
  if (table->ndim != 2) return bl_set_error(BL_EINVAL, "embedding: table must be [vocab, hidden]");
  return lookup("embedding", out, table, ids, accumulate, "id", "vocabulary size");
}

extern "C" int bl_cuda_embedding_backward(bl_tensor *dtable, const bl_tensor *dout, const bl_tensor *ids) {
  if (dtable->ndim != 2) return bl_set_error(BL_EINVAL, "embedding_backward: grad_table must be [vocab, hidden]");
  return scatter("embedding_backward", dtable, dout, ids, "id", "vocabulary size");
}

extern "C" int bl_cuda_gather_forward(bl_tensor *out, const bl_tensor *x, const bl_tensor *pos) {
  return lookup("gather", out, x, pos, 0, "position", "rows");
}

extern "C" int bl_cuda_gather_backward(bl_tensor *dx, const bl_tensor *dout, const bl_tensor *pos) {
  return scatter("gather_backward", dx, dout, pos, "position", "rows");
}

extern "C" int bl_cuda_embedding_layernorm_forward(const bl_embedding_layernorm_args *a) {
  const bl_tensor *tables[] = { a->word, a->position, a->token_type }, *idx[] = { a->ids, a->pos_ids, a->type_ids };
  return emb_ln_forward(a->y, a->mean, a->rstd, tables, idx, a->gamma, a->beta, a->eps, a->p, a->seed, a->offset);
}

extern "C" int bl_cuda_embedding_layernorm_backward(bl_tensor *dword, bl_tensor *dposition, bl_tensor *dtoken_type,
                                                    bl_tensor *dgamma, bl_tensor *dbeta, const bl_tensor *dy,
                                                    const bl_embedding_layernorm_args *a) {
  bl_tensor *grads[] = { dword, dposition, dtoken_type };
  const bl_tensor *tables[] = { a->word, a->position, a->token_type }, *idx[] = { a->ids, a->pos_ids, a->type_ids };
  return emb_ln_backward(grads, dgamma, dbeta, dy, tables, idx, a->gamma, a->mean, a->rstd, a->p, a->seed, a->offset);
}
