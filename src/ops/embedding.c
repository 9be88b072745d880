/* embedding: out[i,:] (+)= table[ids[i],:] and the scatter-add backward
 * (contract in bl_ops.h). Every id is validated before the first write so a
 * bad batch leaves `out` untouched. The backward walks ids in order and
 * splits the hidden dim across threads, which keeps the summation order of
 * repeated ids fixed (deterministic) without atomics. */
#include "ops_internal.h"
#include "device/dispatch.h"
#include <stdlib.h>

static int check_ids(const char *op, const int64_t *ids, int64_t n, int64_t v) {
  for (int64_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= v)
      return BL_ERR("%s: id %lld at position %lld is out of range for vocabulary size %lld", op,
                    (long long)ids[i], (long long)i, (long long)v);
  return 0;
}

static int check_shapes(const char *op, const bl_tensor *out, const bl_tensor *table, const bl_tensor *ids,
                        const char *outname) {
  if (table->ndim != 2)
    return BL_ERR("%s: table must be [vocab, hidden], got %s", op, OPX_SHAPE(table));
  if (out->ndim < 1 || opx_cols(out) != table->shape[1] || opx_rows(out) != ids->numel)
    return BL_ERR("%s: %s %s does not match ids %s and table %s", op, outname, OPX_SHAPE(out),
                  OPX_SHAPE(ids), OPX_SHAPE(table));
  return 0;
}

static int embedding_forward_cpu(bl_tensor *out, const bl_tensor *table, const bl_tensor *ids, int accumulate) {
  const char *op = "embedding";
  int64_t *id = NULL;
  opx_buf bt = {0}, bo = {0};
  int rc = opx_load_ids(op, ids, &id);
  if (rc) return rc;
  int64_t n = ids->numel, h = table->shape[1];
  if ((rc = check_ids(op, id, n, table->shape[0]))) goto done;
  if ((rc = opx_load(op, table, &bt)) || (rc = opx_out(op, out, &bo, accumulate))) goto done;
  #pragma omp parallel for schedule(static) if (n * h > 65536)
  for (int64_t i = 0; i < n; i++) {
    const float *src = bt.p + id[i] * h;
    float *dst = bo.p + i * h;
    if (accumulate) for (int64_t j = 0; j < h; j++) dst[j] += src[j];
    else memcpy(dst, src, (size_t)h * sizeof(float));
  }
  opx_store(out, &bo);
done:
  free(id); opx_free(&bt); opx_free(&bo);
  return rc;
}

int bl_embedding_forward(bl_tensor *out, const bl_tensor *table, const bl_tensor *ids, int accumulate) {
  const char *op = "embedding";
  BL_CHECK(opx_check_float(op, out, "output"));
  BL_CHECK(opx_check_float(op, table, "table"));
  BL_CHECK(opx_check_index(op, ids, "ids"));
  BL_CHECK(check_shapes(op, out, table, ids, "output"));
  int dev;
  const bl_tensor *ts[] = {out, table, ids};
  BL_CHECK(opx_device(op, 3, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_embedding_forward(out, table, ids, accumulate));
  return embedding_forward_cpu(out, table, ids, accumulate);
}

static int embedding_backward_cpu(bl_tensor *dtable, const bl_tensor *dout, const bl_tensor *ids) {
  const char *op = "embedding_backward";
  int64_t *id = NULL;
  opx_buf bt = {0}, bo = {0};
  int rc = opx_load_ids(op, ids, &id);
  if (rc) return rc;
  int64_t n = ids->numel, h = dtable->shape[1];
  if ((rc = check_ids(op, id, n, dtable->shape[0]))) goto done;
  if ((rc = opx_load(op, dout, &bo)) || (rc = opx_out(op, dtable, &bt, 1))) goto done;
  int64_t nblk = (h + 127) / 128;
  #pragma omp parallel for schedule(static) if (n * h > 65536)
  for (int64_t blk = 0; blk < nblk; blk++) {
    int64_t j0 = blk * 128, j1 = j0 + 128 < h ? j0 + 128 : h;
    for (int64_t i = 0; i < n; i++) {
      float *dst = bt.p + id[i] * h;
      const float *src = bo.p + i * h;
      for (int64_t j = j0; j < j1; j++) dst[j] += src[j];
    }
  }
  opx_store(dtable, &bt);
done:
  free(id); opx_free(&bt); opx_free(&bo);
  return rc;
}

int bl_embedding_backward(bl_tensor *dtable, const bl_tensor *dout, const bl_tensor *ids) {
  const char *op = "embedding_backward";
  BL_CHECK(opx_check_float(op, dtable, "grad_table"));
  BL_CHECK(opx_check_float(op, dout, "grad_output"));
  BL_CHECK(opx_check_index(op, ids, "ids"));
  BL_CHECK(check_shapes(op, dout, dtable, ids, "grad_output"));
  int dev;
  const bl_tensor *ts[] = {dtable, dout, ids};
  BL_CHECK(opx_device(op, 3, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_embedding_backward(dtable, dout, ids));
  return embedding_backward_cpu(dtable, dout, ids);
}
