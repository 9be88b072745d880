/* Row lookups (contracts in bl_ops.h; CUDA twin kernels/embedding.cu):
 * embedding, out[i,:] (+)= table[ids[i],:], and gather, out[j,:] = x[pos[j],:]
 * over x viewed as [rows, H] (used to run the MLM head only on the masked
 * positions), each with its accumulating scatter-add backward. Every index is
 * validated before the first write so a bad batch leaves the output
 * untouched. The backward walks the indices in order and splits the hidden
 * dim across threads, which keeps the summation order of repeated indices
 * fixed (deterministic) without atomics. */
#include "ops_internal.h"
#include "device/dispatch.h"
#include <stdlib.h>

/* How an index is named in errors: "id 7 at position 3 is out of range for
 * vocabulary size 5" (embedding) or "position 7 at index 3 is out of range for
 * [2,3,4] (6 rows)" (gather). */
typedef struct {
  const char *op;
  int gather;
  const bl_tensor *table;
} rows_op;

static int check_indices(const rows_op *r, const int64_t *idx, int64_t n, int64_t rows) {
  for (int64_t i = 0; i < n; i++) {
    if (idx[i] >= 0 && idx[i] < rows) continue;
    if (r->gather)
      return BL_ERR("%s: position %lld at index %lld is out of range for %s (%lld rows)", r->op,
                    (long long)idx[i], (long long)i, OPX_SHAPE(r->table), (long long)rows);
    return BL_ERR("%s: id %lld at position %lld is out of range for vocabulary size %lld", r->op,
                  (long long)idx[i], (long long)i, (long long)rows);
  }
  return 0;
}

/* out[i,:] (+)= src[idx[i],:] with src viewed as [rows, h]. */
static int lookup_cpu(const rows_op *r, bl_tensor *out, const bl_tensor *src, const bl_tensor *ids, int accumulate) {
  int64_t *id = NULL;
  opx_buf bs = {0}, bo = {0};
  int rc = opx_load_ids(r->op, ids, &id);
  if (rc) return rc;
  int64_t n = ids->numel, h = opx_cols(src);
  if ((rc = check_indices(r, id, n, opx_rows(src)))) goto done;
  if ((rc = opx_load(r->op, src, &bs)) || (rc = opx_out(r->op, out, &bo, accumulate))) goto done;
  #pragma omp parallel for schedule(static) if (n * h > 65536)
  for (int64_t i = 0; i < n; i++) {
    const float *s = bs.p + id[i] * h;
    float *d = bo.p + i * h;
    if (accumulate) for (int64_t j = 0; j < h; j++) d[j] += s[j];
    else memcpy(d, s, (size_t)h * sizeof(float));
  }
  opx_store(out, &bo);
done:
  free(id); opx_free(&bs); opx_free(&bo);
  return rc;
}

/* dst[idx[i],:] += src[i,:] in index order per column block of 128. */
static int scatter_cpu(const rows_op *r, bl_tensor *dst, const bl_tensor *src, const bl_tensor *ids) {
  int64_t *id = NULL;
  opx_buf bd = {0}, bs = {0};
  int rc = opx_load_ids(r->op, ids, &id);
  if (rc) return rc;
  int64_t n = ids->numel, h = opx_cols(dst);
  if ((rc = check_indices(r, id, n, opx_rows(dst)))) goto done;
  if ((rc = opx_load(r->op, src, &bs)) || (rc = opx_out(r->op, dst, &bd, 1))) goto done;
  int64_t nblk = (h + 127) / 128;
  #pragma omp parallel for schedule(static) if (n * h > 65536)
  for (int64_t blk = 0; blk < nblk; blk++) {
    int64_t j0 = blk * 128, j1 = j0 + 128 < h ? j0 + 128 : h;
    for (int64_t i = 0; i < n; i++) {
      float *d = bd.p + id[i] * h;
      const float *s = bs.p + i * h;
      for (int64_t j = j0; j < j1; j++) d[j] += s[j];
    }
  }
  opx_store(dst, &bd);
done:
  free(id); opx_free(&bd); opx_free(&bs);
  return rc;
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

static int check_gather_shapes(const char *op, const bl_tensor *out, const bl_tensor *x, const bl_tensor *pos,
                        const char *xname, const char *outname) {
  if (x->ndim < 1) return BL_ERR("%s: %s must have at least one dim", op, xname);
  if (out->ndim < 1 || opx_cols(out) != opx_cols(x) || opx_rows(out) != pos->numel)
    return BL_ERR("%s: %s %s does not match positions %s and %s %s", op, outname, OPX_SHAPE(out),
                  OPX_SHAPE(pos), xname, OPX_SHAPE(x));
  return 0;
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
  return lookup_cpu(&(rows_op){op, 0, table}, out, table, ids, accumulate);
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
  return scatter_cpu(&(rows_op){op, 0, dtable}, dtable, dout, ids);
}

int bl_gather_forward(bl_tensor *out, const bl_tensor *x, const bl_tensor *pos) {
  const char *op = "gather";
  BL_CHECK(opx_check_float(op, out, "output"));
  BL_CHECK(opx_check_float(op, x, "input"));
  BL_CHECK(opx_check_index(op, pos, "positions"));
  BL_CHECK(check_gather_shapes(op, out, x, pos, "input", "output"));
  int dev;
  const bl_tensor *ts[] = {out, x, pos};
  BL_CHECK(opx_device(op, 3, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_gather_forward(out, x, pos));
  return lookup_cpu(&(rows_op){op, 1, x}, out, x, pos, 0);
}

int bl_gather_backward(bl_tensor *dx, const bl_tensor *dout, const bl_tensor *pos) {
  const char *op = "gather_backward";
  BL_CHECK(opx_check_float(op, dx, "grad_input"));
  BL_CHECK(opx_check_float(op, dout, "grad_output"));
  BL_CHECK(opx_check_index(op, pos, "positions"));
  BL_CHECK(check_gather_shapes(op, dout, dx, pos, "grad_input", "grad_output"));
  int dev;
  const bl_tensor *ts[] = {dx, dout, pos};
  BL_CHECK(opx_device(op, 3, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_gather_backward(dx, dout, pos));
  return scatter_cpu(&(rows_op){op, 1, dx}, dx, dout, pos);
}
