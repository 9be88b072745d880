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
// Forward: grid-stride over rows, 256 threads over H.
// Backward (scatter_rows): sort-free and atomics-free on floats.
// mark_first stores, for each target row, the first position that refers to
// it (integer atomicMin). Then block (i, column chunk) exits unless i is that
// first position; otherwise each thread owns one column c of the target row,
// starts from its current value and adds dout[j, c] for j = i, i+1, ... in
// index order whenever ids[j] equals the row: exactly the CPU's summation
// order, so the result is deterministic and bitwise equal to the CPU's.
// Cost: each distinct row scans the ids after its first occurrence
// (O(unique * n) integer reads, L1/L2-resident; n = B*S is a few thousand).
#include "common.cuh"

namespace {

__global__ void check_range(const int64_t *ids, int64_t n, int64_t limit, unsigned long long *first_bad) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    if (ids[i] < 0 || ids[i] >= limit) atomicMin(first_bad, (unsigned long long)i);
}

__global__ void fill_u64(unsigned long long *p, int64_t n, unsigned long long v) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) p[i] = v;
}

__global__ void mark_first(const int64_t *ids, int64_t n, unsigned long long *first) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    atomicMin(&first[ids[i]], (unsigned long long)i);
}

// out[i, :] (+)= src[ids[i], :]
__global__ void gather_rows(float *out, const float *src, const int64_t *ids, int64_t n, int64_t h, int accumulate) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const float *s = src + ids[i] * h;
    float *o = out + i * h;
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) o[c] = accumulate ? o[c] + s[c] : s[c];
  }
}

// dst[ids[j], :] += src[j, :] in j order (see header). grid = (n, ceil(h/256)).
__global__ void scatter_rows(float *dst, const float *src, const int64_t *ids, const unsigned long long *first, int64_t n,
                             int64_t h) {
  const int64_t i = blockIdx.x;
  const int64_t key = ids[i];
  if (first[key] != (unsigned long long)i) return;   // uniform per block
  const int64_t c = blockIdx.y * 256LL + threadIdx.x;
  if (c >= h) return;
  float acc = dst[key * h + c];
  for (int64_t j = i; j < n; j++)
    if (ids[j] == key) acc += src[j * h + c];
  dst[key * h + c] = acc;
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
  cu_buf bs, bo;
  BL_CHECK(cu_load(op, src, &bs));
  BL_CHECK(cu_out(op, out, &bo, accumulate));
  // rows read (once each at best) and written; accumulate reads the output too
  cu_cost_kernel(dev, "embedding", "gather_rows", 4.0 * (double)n * h * (accumulate ? 3 : 2) + 8.0 * n);
  gather_rows<<<cu_blocks(n, 1, 1 << 20), 256, 0, cu_stream(dev)>>>(bo.p, bs.p, id.as<int64_t>(), n, h, accumulate);
  BL_CHECK(cu_launched(op, dev));
  return cu_store(op, out, &bo);
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
  if ((h + 255) / 256 > 65535) return bl_set_error(BL_EUNSUPPORTED, "%s: cuda:%d: rows of %lld are too wide", op, dev, (long long)h);
  if (n > INT32_MAX) return bl_set_error(BL_EUNSUPPORTED, "%s: cuda:%d: %lld indices are too many", op, dev, (long long)n);
  cu_mem first;
  BL_CHECK(first.alloc(op, dev, (size_t)rows * sizeof(unsigned long long)));
  cu_cost_kernel(dev, "embedding", "fill_u64", 8.0 * rows);
  fill_u64<<<cu_blocks(rows, 256), 256, 0, cu_stream(dev)>>>(first.as<unsigned long long>(), rows, ~0ull);
  BL_CHECK(cu_launched(op, dev));
  cu_cost_kernel(dev, "embedding", "mark_first", 8.0 * n);
  mark_first<<<cu_blocks(n, 256), 256, 0, cu_stream(dev)>>>(id.as<int64_t>(), n, first.as<unsigned long long>());
  BL_CHECK(cu_launched(op, dev));
  cu_buf bs, bd;
  BL_CHECK(cu_load(op, src, &bs));
  BL_CHECK(cu_out(op, dst, &bd, 1));
  // at best: the gradient rows read once, each touched table row read and written once (<= n of them)
  cu_cost_kernel(dev, "embedding", "scatter_rows", 12.0 * (double)n * h + 16.0 * n);
  scatter_rows<<<dim3((unsigned)n, (unsigned)((h + 255) / 256)), 256, 0, cu_stream(dev)>>>(
      bd.p, bs.p, id.as<int64_t>(), first.as<unsigned long long>(), n, h);
  BL_CHECK(cu_launched(op, dev));
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
