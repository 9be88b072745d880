// Row lookups and their deterministic scatter-add backwards (contracts in
// bl_ops.h): embedding (out[i,:] (+)= table[ids[i],:]) and gather
// (out[j,:] = x[pos[j],:]).
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
#include "common.cuh"

namespace {

__global__ void check_range(const int64_t *ids, int64_t n, int64_t limit, unsigned long long *first_bad) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    if (ids[i] < 0 || ids[i] >= limit) atomicMin(first_bad, (unsigned long long)i);
}

__global__ void fill_u64(unsigned long long *p, int64_t n, unsigned long long v) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) p[i] = v;
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
      if (accumulate) {   // f32 sum, one rounding: as the CPU's f32 image of the output
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
  for (int64_t i = b; i < e; i++) { int c = counts[i]; counts[i] = run; run += c; }
}

// Stable scatter of one tile: thread t owns items t*kSortItems.. of the tile, in order. Its slot for digit d is the
// digit's global start for this tile (offs) plus the tile's items of digit d held by lower threads plus its own.
__global__ void __launch_bounds__(kSortThreads)
    sort_scatter(const int32_t *keys, const int32_t *vals, int32_t *keys_out, int32_t *vals_out, int64_t n, int shift,
                 const int32_t *offs) {
  __shared__ int cnt[kDigits * kSortThreads];   // digit-major: [d][thread]
  __shared__ int sh[kSortThreads];
  const int64_t first = blockIdx.x * (int64_t)kTile + threadIdx.x * kSortItems;
  int mine[kDigits];
#pragma unroll
  for (int d = 0; d < kDigits; d++) mine[d] = 0;
  for (int k = 0; k < kSortItems; k++)
    if (first + k < n) {
      const int d = (keys[first + k] >> shift) & (kDigits - 1);
#pragma unroll
      for (int q = 0; q < kDigits; q++) mine[q] += q == d;   // constant indices keep mine in registers
    }
#pragma unroll
  for (int d = 0; d < kDigits; d++) cnt[d * kSortThreads + threadIdx.x] = mine[d];
  __syncthreads();
  // exclusive scan of cnt in digit-major order: thread t scans entries t*16 .. t*16+15 (all in digit t/16)
  int *run = cnt + threadIdx.x * kDigits;
  int sum = 0;
  for (int k = 0; k < kDigits; k++) sum += run[k];
  int acc = block_excl_scan(sum, sh);
  for (int k = 0; k < kDigits; k++) { int c = run[k]; run[k] = acc; acc += c; }
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
    for (int q = 0; q < kDigits; q++) if (q == d) at = slot[q]++;   // constant indices keep slot in registers
    keys_out[at] = key;
    vals_out[at] = vals[first + k];
  }
}

// dst[key, c..c+V) += src[pos, c..c+V) over the segment of sorted element blockIdx.x, in sorted (= index) order.
// grid = (n, column chunks of kSegThreads V); dst f32 or src's dtype. The additions form one chain per column (the
// CPU's order); the loads do not: the segment's end comes from a binary search, and kSegBatch rows are loaded
// before they are added, so a long segment (token types: ~n/2 rows each) waits on memory once per batch.
const int kSegBatch = 8, kSegThreads = 64;   // small blocks: more of them share a long segment's columns
template <class TD, class TS, int V>
__global__ void segment_sum(TD *dst, const TS *src, const int32_t *keys, const int32_t *pos, int64_t n, int64_t h) {
  const int64_t k = blockIdx.x;
  const int32_t key = keys[k];
  if (k > 0 && keys[k - 1] == key) return;   // uniform per block: not a segment start
  const int64_t c = (blockIdx.y * (int64_t)blockDim.x + threadIdx.x) * V;
  if (c >= h) return;
  int64_t lo = k + 1, hi = n;   // end: the first sorted element after k with another key
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (keys[mid] == key) lo = mid + 1;
    else hi = mid;
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

// Loads ids and checks 0 <= id < limit. On failure sets the error (naming the position and value).
int load_checked(const char *op, int dev, const bl_tensor *t, int64_t limit, cu_mem *ids, const char *what,
                 const char *limit_what) {
  BL_CHECK(cu_load_ids(op, t, ids));
  int64_t n = t->numel;
  if (n == 0) return 0;
  if (limit > 0 && cu_checks_deferred(dev))   // bad ids become row 0; the error comes with the next check
    return cu_defer_ids(op, dev, ids->as<int64_t>(), n, limit, 0, 0, 0, what, limit_what);
  cu_mem flag;
  BL_CHECK(flag.alloc(op, dev, sizeof(unsigned long long)));
  cu_cost_kernel(dev, "index check", "fill_u64", 8);
  fill_u64<<<1, 32, 0, cu_stream(dev)>>>(flag.as<unsigned long long>(), 1, ~0ull);
  BL_CHECK(cu_launched(op, dev));
  cu_cost_kernel(dev, "index check", "check_range", 8.0 * n);
  check_range<<<cu_blocks(n, 256), 256, 0, cu_stream(dev)>>>(ids->as<int64_t>(), n, limit, flag.as<unsigned long long>());
  BL_CHECK(cu_launched(op, dev));
  int64_t bad;
  BL_CHECK(cu_read_i64(op, dev, flag.as<int64_t>(), &bad, 1));
  if (bad != -1) {   // ~0ull read as int64
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
  const bl_tensor *ts[] = {out, src, ids};
  BL_CHECK(cu_device(op, 3, ts, &dev));
  if (src->ndim < 1 || out->ndim < 1) return bl_set_error(BL_EINVAL, "%s: tensors need at least one dim", op);
  int64_t h = src->shape[src->ndim - 1], rows = 1, n = ids->numel;
  for (int d = 0; d + 1 < src->ndim; d++) rows *= src->shape[d];
  if (out->shape[out->ndim - 1] != h || out->numel != n * h)
    return bl_set_error(BL_EINVAL, "%s: output has %lld elements, expected %lld x %lld", op, (long long)out->numel, (long long)n, (long long)h);
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
  BL_CHECK(ka->alloc(op, dev, b4)); BL_CHECK(va->alloc(op, dev, b4));
  BL_CHECK(kb->alloc(op, dev, b4)); BL_CHECK(vb->alloc(op, dev, b4));
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

int scatter(const char *op, bl_tensor *dst, const bl_tensor *src, const bl_tensor *ids, const char *what,
            const char *limit_what) {
  int dev;
  const bl_tensor *ts[] = {dst, src, ids};
  BL_CHECK(cu_device(op, 3, ts, &dev));
  if (dst->ndim < 1 || src->ndim < 1) return bl_set_error(BL_EINVAL, "%s: tensors need at least one dim", op);
  int64_t h = dst->shape[dst->ndim - 1], n = ids->numel;
  int64_t rows = 1;
  for (int d = 0; d + 1 < dst->ndim; d++) rows *= dst->shape[d];
  if (src->shape[src->ndim - 1] != h || src->numel != n * h)
    return bl_set_error(BL_EINVAL, "%s: grad_output has %lld elements, expected %lld x %lld", op, (long long)src->numel, (long long)n, (long long)h);
  cu_mem id;
  BL_CHECK(load_checked(op, dev, ids, rows, &id, what, limit_what));
  if (n == 0 || h == 0) return 0;
  if ((h + kSegThreads - 1) / kSegThreads > 65535)
    return bl_set_error(BL_EUNSUPPORTED, "%s: cuda:%d: rows of %lld are too wide", op, dev, (long long)h);
  if (n > INT32_MAX || rows > INT32_MAX)
    return bl_set_error(BL_EUNSUPPORTED, "%s: cuda:%d: %lld indices into %lld rows are too many", op, dev, (long long)n,
                        (long long)rows);
  cu_mem ka, va, kb, vb;
  int32_t *keys, *pos;
  BL_CHECK(sort_positions(op, dev, id.as<int64_t>(), n, rows, &ka, &va, &kb, &vb, &keys, &pos));
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

}  // namespace

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
