/* Row lookups (contracts in bl_ops.h; CUDA twin kernels/embedding.cu):
 * embedding, out[i,:] (+)= table[ids[i],:], and gather, out[j,:] = x[pos[j],:]
 * over x viewed as [rows, H] (used to run the MLM head only on the masked
 * positions), each with its accumulating scatter-add backward. Every index is
 * validated before the first write so a bad batch leaves the output
 * untouched. The backward walks the indices in order and splits the hidden
 * dim across threads, which keeps the summation order of repeated indices
 * fixed (deterministic) without atomics.
 * bl_embedding_layernorm_* (BERT's embedding block) is composed here from
 * the public ops (three lookups into an f32 sum, LayerNorm, dropout): the
 * CPU's implementation, the reference of the fused device kernels, and the
 * device's fallback for operands those do not take. */
#include "bl_ops.h"
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
  const char *what, *limit_what; /* embedding: "id", "vocabulary size" unless a caller names its table */
} rows_op;

static int check_indices(const rows_op *r, const int64_t *idx, int64_t n, int64_t rows) {
  for (int64_t i = 0; i < n; i++) {
    if (idx[i] >= 0 && idx[i] < rows) continue;
    if (r->gather)
      return BL_ERR("%s: position %lld at index %lld is out of range for %s (%lld rows)", r->op, (long long)idx[i],
                    (long long)i, OPX_SHAPE(r->table), (long long)rows);
    return BL_ERR("%s: %s %lld at position %lld is out of range for %s %lld", r->op, r->what, (long long)idx[i],
                  (long long)i, r->limit_what, (long long)rows);
  }
  return 0;
}

/* out[i,:] (+)= src[idx[i],:] with src viewed as [rows, h]. */
static int lookup_cpu(const rows_op *r, bl_tensor *out, const bl_tensor *src, const bl_tensor *ids, int accumulate) {
  int64_t *id = NULL;
  opx_buf bs = { 0 }, bo = { 0 };
  int rc = opx_load_ids(r->op, ids, &id);
  if (rc) return rc;
  int64_t n = ids->numel, h = opx_cols(src);
  if ((rc = check_indices(r, id, n, opx_rows(src)))) goto done;
  if ((rc = opx_load(r->op, src, &bs)) || (rc = opx_out(r->op, out, &bo, accumulate))) goto done;
#pragma omp parallel for schedule(static) if (n * h > 65536)
  for (int64_t i = 0; i < n; i++) {
    const float *s = bs.p + id[i] * h;
    float *d = bo.p + i * h;
    if (accumulate)
      for (int64_t j = 0; j < h; j++) d[j] += s[j];
    else
      memcpy(d, s, (size_t)h * sizeof(float));
  }
  opx_store(out, &bo);
done:
  free(id);
  opx_free(&bs);
  opx_free(&bo);
  return rc;
}

/* dst[idx[i],:] += src[i,:] in index order per column block of 128. */
static int scatter_cpu(const rows_op *r, bl_tensor *dst, const bl_tensor *src, const bl_tensor *ids) {
  int64_t *id = NULL;
  opx_buf bd = { 0 }, bs = { 0 };
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
  free(id);
  opx_free(&bd);
  opx_free(&bs);
  return rc;
}

static int check_shapes(const char *op, const bl_tensor *out, const bl_tensor *table, const bl_tensor *ids,
                        const char *outname) {
  if (table->ndim != 2) return BL_ERR("%s: table must be [vocab, hidden], got %s", op, OPX_SHAPE(table));
  if (out->ndim < 1 || opx_cols(out) != table->shape[1] || opx_rows(out) != ids->numel)
    return BL_ERR("%s: %s %s does not match ids %s and table %s", op, outname, OPX_SHAPE(out), OPX_SHAPE(ids),
                  OPX_SHAPE(table));
  return 0;
}

static int check_gather_shapes(const char *op, const bl_tensor *out, const bl_tensor *x, const bl_tensor *pos,
                               const char *xname, const char *outname) {
  if (x->ndim < 1) return BL_ERR("%s: %s must have at least one dim", op, xname);
  if (out->ndim < 1 || opx_cols(out) != opx_cols(x) || opx_rows(out) != pos->numel)
    return BL_ERR("%s: %s %s does not match positions %s and %s %s", op, outname, OPX_SHAPE(out), OPX_SHAPE(pos), xname,
                  OPX_SHAPE(x));
  return 0;
}

/* what, limit_what: how an out-of-range index and the table are named (the CPU's message) */
static int embedding_forward(bl_tensor *out, const bl_tensor *table, const bl_tensor *ids, int accumulate,
                             const char *what, const char *limit_what) {
  const char *op = "embedding";
  BL_CHECK(opx_check_float(op, out, "output"));
  BL_CHECK(opx_check_float(op, table, "table"));
  BL_CHECK(opx_check_index(op, ids, "ids"));
  BL_CHECK(check_shapes(op, out, table, ids, "output"));
  int dev;
  const bl_tensor *ts[] = { out, table, ids };
  BL_CHECK(opx_device(op, 3, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_embedding_forward(out, table, ids, accumulate));
  return lookup_cpu(&(rows_op){ op, 0, table, what, limit_what }, out, table, ids, accumulate);
}

int bl_embedding_forward(bl_tensor *out, const bl_tensor *table, const bl_tensor *ids, int accumulate) {
  return embedding_forward(out, table, ids, accumulate, "id", "vocabulary size");
}

int bl_embedding_backward(bl_tensor *dtable, const bl_tensor *dout, const bl_tensor *ids) {
  const char *op = "embedding_backward";
  BL_CHECK(opx_check_float(op, dtable, "grad_table"));
  BL_CHECK(opx_check_float(op, dout, "grad_output"));
  BL_CHECK(opx_check_index(op, ids, "ids"));
  BL_CHECK(check_shapes(op, dout, dtable, ids, "grad_output"));
  int dev;
  const bl_tensor *ts[] = { dtable, dout, ids };
  BL_CHECK(opx_device(op, 3, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_embedding_backward(dtable, dout, ids));
  return scatter_cpu(&(rows_op){ op, 0, dtable, "id", "vocabulary size" }, dtable, dout, ids);
}

int bl_gather_forward(bl_tensor *out, const bl_tensor *x, const bl_tensor *pos) {
  const char *op = "gather";
  BL_CHECK(opx_check_float(op, out, "output"));
  BL_CHECK(opx_check_float(op, x, "input"));
  BL_CHECK(opx_check_index(op, pos, "positions"));
  BL_CHECK(check_gather_shapes(op, out, x, pos, "input", "output"));
  int dev;
  const bl_tensor *ts[] = { out, x, pos };
  BL_CHECK(opx_device(op, 3, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_gather_forward(out, x, pos));
  return lookup_cpu(&(rows_op){ op, 1, x, NULL, NULL }, out, x, pos, 0);
}

int bl_gather_backward(bl_tensor *dx, const bl_tensor *dout, const bl_tensor *pos) {
  const char *op = "gather_backward";
  BL_CHECK(opx_check_float(op, dx, "grad_input"));
  BL_CHECK(opx_check_float(op, dout, "grad_output"));
  BL_CHECK(opx_check_index(op, pos, "positions"));
  BL_CHECK(check_gather_shapes(op, dout, dx, pos, "grad_input", "grad_output"));
  int dev;
  const bl_tensor *ts[] = { dx, dout, pos };
  BL_CHECK(opx_device(op, 3, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_gather_backward(dx, dout, pos));
  return scatter_cpu(&(rows_op){ op, 1, dx, NULL, NULL }, dx, dout, pos);
}

/* ---- embedding sum + LayerNorm + dropout (BERT's embedding block) */

typedef struct {
  const bl_tensor *word, *position, *token_type, *ids, *pos_ids, *type_ids;
} emb_rows;

static int check_emb_rows(const char *op, const emb_rows *e, const bl_tensor *y, const char *yname) {
  const bl_tensor *tables[] = { e->word, e->position, e->token_type }, *idx[] = { e->ids, e->pos_ids, e->type_ids };
  const char *tn[] = { "word table", "position table", "token type table" }, *in[] = { "ids", "pos_ids", "type_ids" };
  for (int k = 0; k < 3; k++) {
    BL_CHECK(opx_check_float(op, tables[k], tn[k]));
    BL_CHECK(opx_check_index(op, idx[k], in[k]));
    if (tables[k]->ndim != 2 || tables[k]->shape[1] != e->word->shape[1] || tables[k]->dtype != e->word->dtype)
      return BL_ERR("%s: %s %s must be [*, %lld] of the word table's dtype", op, tn[k], OPX_SHAPE(tables[k]),
                    (long long)e->word->shape[1]);
    if (idx[k]->numel != e->ids->numel)
      return BL_ERR("%s: %s %s and ids %s differ in size", op, in[k], OPX_SHAPE(idx[k]), OPX_SHAPE(e->ids));
  }
  if (y->ndim < 1 || opx_cols(y) != e->word->shape[1] || opx_rows(y) != e->ids->numel)
    return BL_ERR("%s: %s %s does not match ids %s and tables [*, %lld]", op, yname, OPX_SHAPE(y), OPX_SHAPE(e->ids),
                  (long long)e->word->shape[1]);
  return 0;
}

static int check_row_stats(const char *op, const bl_tensor *t, int64_t n, const char *name) {
  BL_CHECK(opx_check_float(op, t, name));
  if (t->numel != n) return BL_ERR("%s: %s %s must have %lld elements", op, name, OPX_SHAPE(t), (long long)n);
  return 0;
}

/* s = the f32 sum of the three rows, a new tensor of like's shape ([..., H], n rows) on the tables' device. */
static int emb_sum(const emb_rows *e, const bl_tensor *like, int dev, bl_tensor **s) {
  BL_CHECK(bl_tensor_empty(like->ndim, like->shape, BL_F32, dev, s));
  int rc = bl_embedding_forward(*s, e->word, e->ids, 0);
  if (!rc) rc = embedding_forward(*s, e->position, e->pos_ids, 1, BL_EMB_POSITION_NAMES);
  if (!rc) rc = embedding_forward(*s, e->token_type, e->type_ids, 1, BL_EMB_TOKEN_TYPE_NAMES);
  if (rc) {
    bl_tensor_free(*s);
    *s = NULL;
  }
  return rc;
}

/* The op composed from the public ones (the CPU's implementation and the device's fallback). */
static int emb_ln_forward_composed(bl_tensor *y, bl_tensor *mean, bl_tensor *rstd, const emb_rows *e, int dev,
                                   const bl_tensor *gamma, const bl_tensor *beta, double eps, double p, uint64_t seed,
                                   uint64_t offset) {
  bl_tensor *s = NULL, *l = NULL;
  int rc = emb_sum(e, y, dev, &s);
  if (!rc && p > 0) rc = bl_tensor_empty(s->ndim, s->shape, BL_F32, dev, &l);
  if (!rc) rc = bl_layernorm_forward(l ? l : y, mean, rstd, s, gamma, beta, eps);
  if (!rc && l) rc = bl_dropout_forward(y, NULL, l, p, seed, offset);
  if (s) bl_tensor_free(s);
  if (l) bl_tensor_free(l);
  return rc;
}

static int emb_ln_backward_composed(bl_tensor *dword, bl_tensor *dposition, bl_tensor *dtoken_type, bl_tensor *dgamma,
                                    bl_tensor *dbeta, const bl_tensor *dy, const emb_rows *e, int dev,
                                    const bl_tensor *gamma, const bl_tensor *mean, const bl_tensor *rstd, double p,
                                    uint64_t seed, uint64_t offset) {
  bl_tensor *s = NULL, *g = NULL, *ds = NULL;
  int rc = emb_sum(e, dy, dev, &s);
  if (!rc) rc = bl_tensor_empty(s->ndim, s->shape, BL_F32, dev, &ds);
  if (!rc && p > 0) rc = bl_tensor_empty(s->ndim, s->shape, BL_F32, dev, &g);
  if (!rc && g) rc = bl_dropout_backward(g, dy, NULL, p, seed, offset);
  if (!rc) rc = bl_layernorm_backward(ds, dgamma, dbeta, g ? g : dy, s, gamma, mean, rstd);
  if (!rc && dword) rc = bl_embedding_backward(dword, ds, e->ids);
  if (!rc && dposition) rc = bl_embedding_backward(dposition, ds, e->pos_ids);
  if (!rc && dtoken_type) rc = bl_embedding_backward(dtoken_type, ds, e->type_ids);
  if (s) bl_tensor_free(s);
  if (g) bl_tensor_free(g);
  if (ds) bl_tensor_free(ds);
  return rc;
}

int bl_embedding_layernorm_forward(const bl_embedding_layernorm_args *a) {
  const char *op = "embedding_layernorm";
  if (!a) return BL_ERR("%s: args is NULL", op);
  bl_tensor *y = a->y, *mean = a->mean, *rstd = a->rstd;
  const bl_tensor *word = a->word, *position = a->position, *token_type = a->token_type, *ids = a->ids,
                  *pos_ids = a->pos_ids, *type_ids = a->type_ids, *gamma = a->gamma, *beta = a->beta;
  const double eps = a->eps, p = a->p;
  const uint64_t seed = a->seed, offset = a->offset;
  const emb_rows e = { word, position, token_type, ids, pos_ids, type_ids };
  BL_CHECK(opx_check_float(op, y, "y"));
  BL_CHECK(check_emb_rows(op, &e, y, "y"));
  BL_CHECK(check_row_stats(op, gamma, word->shape[1], "gamma"));
  if (beta) BL_CHECK(check_row_stats(op, beta, word->shape[1], "beta"));
  BL_CHECK(check_row_stats(op, mean, ids->numel, "mean"));
  BL_CHECK(check_row_stats(op, rstd, ids->numel, "rstd"));
  BL_CHECK(opx_check_p(op, p));
  int dev;
  const bl_tensor *ts[] = { y, mean, rstd, word, position, token_type, ids, pos_ids, type_ids, gamma, beta };
  BL_CHECK(opx_device(op, 11, ts, &dev));
  if (dev >= 0) {
    int rc = BL_ON_CUDA(op, dev, bl_cuda_embedding_layernorm_forward(a));
    if (rc != BL_EUNSUPPORTED) return rc;
  }
  return emb_ln_forward_composed(y, mean, rstd, &e, dev, gamma, beta, eps, p, seed, offset);
}

int bl_embedding_layernorm_backward(bl_tensor *dword, bl_tensor *dposition, bl_tensor *dtoken_type, bl_tensor *dgamma,
                                    bl_tensor *dbeta, const bl_tensor *dy, const bl_embedding_layernorm_args *a) {
  const char *op = "embedding_layernorm_backward";
  if (!a) return BL_ERR("%s: args is NULL", op);
  const bl_tensor *word = a->word, *position = a->position, *token_type = a->token_type, *ids = a->ids,
                  *pos_ids = a->pos_ids, *type_ids = a->type_ids, *gamma = a->gamma, *mean = a->mean, *rstd = a->rstd;
  const double p = a->p;
  const uint64_t seed = a->seed, offset = a->offset;
  const emb_rows e = { word, position, token_type, ids, pos_ids, type_ids };
  BL_CHECK(opx_check_float(op, dy, "grad_output"));
  BL_CHECK(check_emb_rows(op, &e, dy, "grad_output"));
  const bl_tensor *grads[] = { dword, dposition, dtoken_type }, *tables[] = { word, position, token_type };
  const char *gn[] = { "grad_word", "grad_position", "grad_token_type" };
  for (int k = 0; k < 3; k++) {
    if (!grads[k]) continue;
    BL_CHECK(opx_check_float(op, grads[k], gn[k]));
    if (!opx_same_shape(grads[k], tables[k]))
      return BL_ERR("%s: %s %s must match its table %s", op, gn[k], OPX_SHAPE(grads[k]), OPX_SHAPE(tables[k]));
  }
  BL_CHECK(check_row_stats(op, gamma, word->shape[1], "gamma"));
  if (dgamma) BL_CHECK(check_row_stats(op, dgamma, word->shape[1], "grad_gamma"));
  if (dbeta) BL_CHECK(check_row_stats(op, dbeta, word->shape[1], "grad_beta"));
  BL_CHECK(check_row_stats(op, mean, ids->numel, "mean"));
  BL_CHECK(check_row_stats(op, rstd, ids->numel, "rstd"));
  BL_CHECK(opx_check_p(op, p));
  int dev;
  const bl_tensor *ts[] = { dword,      dposition, dtoken_type, dgamma,   dbeta, dy,   word, position,
                            token_type, ids,       pos_ids,     type_ids, gamma, mean, rstd };
  BL_CHECK(opx_device(op, 15, ts, &dev));
  if (dev >= 0) {
    int rc =
        BL_ON_CUDA(op, dev, bl_cuda_embedding_layernorm_backward(dword, dposition, dtoken_type, dgamma, dbeta, dy, a));
    if (rc != BL_EUNSUPPORTED) return rc;
  }
  return emb_ln_backward_composed(dword, dposition, dtoken_type, dgamma, dbeta, dy, &e, dev, gamma, mean, rstd, p, seed,
                                  offset);
}
