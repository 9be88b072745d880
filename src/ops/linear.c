/* linear: y = x W^T + b and its backward (contract in bl_ops.h).
 * All three GEMMs go straight to sgemm on the callers' buffers (OpenBLAS, or
 * oneDNN's dnnl_sgemm or our own packed GEMM as BL_GEMM picks, see below),
 * choosing transpose flags and leading dimensions from the strides, so a
 * row-strided slice (the [CLS] rows x[:,0,:]) or a transposed weight view
 * costs no copy. Only non-f32 or irregularly strided operands get a scratch.
 * For inference a weight can be packed once (bl_linear_pack) for our own
 * GEMM, which then fuses the bias and GELU into its epilogue. */
#include "ops_internal.h"
#include "bl_ops.h"
#include "device/dispatch.h"
#include "gemm.h"
#include "gemm_lowp.h"
#include "base/vecmath.h"
#include <cblas.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if BL_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#else
#define BL_HAVE_DNNL 0
#endif

/* Which GEMM the linear layers run, from BL_GEMM (read once): onednn
 * (dnnl_sgemm; the default in a build that found libdnnl-dev), openblas (the
 * default otherwise) or own (src/ops/gemm.c, on the AVX2 and AVX-512 paths;
 * OpenBLAS on baseline). oneDNN is the default because whole training
 * steps took 5-18 % less time on it than on OpenBLAS at 2 threads on both ISA
 * paths (a profile of OpenBLAS's base step: 12 % in its pool's sched_yield
 * waits; oneDNN threads on our OpenMP pool). tools/bench_gemm compares them
 * on BERT's shapes; BENCHMARKS.md has both measurements. */
enum { GEMM_OPENBLAS, GEMM_ONEDNN, GEMM_OWN };
#if BL_HAVE_DNNL
#define DNNL_NAME " or onednn"
#else
#define DNNL_NAME " (onednn: not in this build)"
#endif

static int gemm_choice(void) {
  static _Atomic int v = -1;
  int r = atomic_load_explicit(&v, memory_order_relaxed);
  if (r >= 0) return r;
  const char *e = getenv("BL_GEMM");
  r = BL_HAVE_DNNL ? GEMM_ONEDNN : GEMM_OPENBLAS;
  if (e && strcmp(e, "own") == 0)
    r = GEMM_OWN;
  else if (e && strcmp(e, "openblas") == 0)
    r = GEMM_OPENBLAS;
#if BL_HAVE_DNNL
  else if (e && strcmp(e, "onednn") == 0)
    r = GEMM_ONEDNN;
#endif
  else if (e && *e)
    fprintf(stderr, "bertlua: BL_GEMM=%s ignored (use openblas, own%s)\n", e, DNNL_NAME);
#if BL_HAVE_DNNL
  /* oneDNN's own kernels follow our ISA cap (BL_CPU_ISA); it only takes this before its first call */
  int isa = opx_isa();
  if (r == GEMM_ONEDNN && isa < OPX_ISA_AVX512)
    dnnl_set_max_cpu_isa(isa == OPX_ISA_AVX2 ? dnnl_cpu_isa_avx2 : dnnl_cpu_isa_sse41);
#endif
  atomic_store(&v, r);
  return r;
}

const char *bl_gemm_backend(void) {
  int r = gemm_choice();
#if BL_HAVE_DNNL
  if (r == GEMM_ONEDNN) {
    static _Thread_local char buf[64];
    const dnnl_version_t *v = dnnl_version();
    snprintf(buf, sizeof buf, "oneDNN %d.%d.%d", v->major, v->minor, v->patch);
    return buf;
  }
#endif
  if (r == GEMM_OWN && opx_isa() > OPX_ISA_BASE) return "bertlua packed";
  return "OpenBLAS";
}

/* A GEMM operand: p[r*ld + c] (trans = 0) or p[c*ld + r] (trans = 1) holds
 * element (r, c) of the logical rows x cols matrix. */
typedef struct mat {
  float *p;
  int64_t rows, cols, ld;
  int trans;
  opx_buf buf; /* scratch when the tensor could not be used in place */
} mat;

/* Can t (of dtype) be read as a rows x cols matrix without copying? Leading
 * dims must collapse into one strided row index. */
static int in_place_as(const bl_tensor *t, int dtype, int64_t *ld, int *trans) {
  if (t->dtype != dtype) return 0;
  int nd = t->ndim;
  int64_t cols = nd ? t->shape[nd - 1] : 1, cst = nd ? t->stride[nd - 1] : 1;
  int64_t rows = t->numel / (cols ? cols : 1);
  if (t->numel == 0) {
    *ld = cols > 0 ? cols : 1;
    *trans = 0;
    return 1;
  }
  /* collapse dims 0..nd-2 into one stride (size-1 dims are free) */
  int64_t rst = 0, expect = -1;
  for (int d = nd - 2; d >= 0; d--) {
    if (t->shape[d] == 1) continue;
    if (expect < 0) {
      rst = t->stride[d];
      expect = t->stride[d] * t->shape[d];
    } else if (t->stride[d] != expect)
      return 0;
    else
      expect = t->stride[d] * t->shape[d];
  }
  if (rows == 1) rst = cols;
  if (cols == 1) cst = 1;
  if (cst == 1 && rst >= cols) {
    *ld = rst;
    *trans = 0;
    return 1;
  }
  if (rst == 1 && cst >= rows && nd == 2) {
    *ld = cst;
    *trans = 1;
    return 1;
  }
  if (rows == 1 && cst >= 1) {
    *ld = cst;
    *trans = 1;
    return 1;
  } /* a strided vector */
  return 0;
}

static int in_place(const bl_tensor *t, int64_t *ld, int *trans) { return in_place_as(t, BL_F32, ld, trans); }

/* t, a bf16 tensor, as a row-major matrix in place (p then holds bf16 bits), for the bf16 GEMM; 0 when it is not
 * one (then it is loaded as f32) */
static int mat_bf16(const bl_tensor *t, mat *m) {
  m->buf.owned = 0;
  m->buf.p = NULL;
  if (!in_place_as(t, BL_BF16, &m->ld, &m->trans) || m->trans) return 0;
  m->cols = t->ndim ? t->shape[t->ndim - 1] : 1;
  m->rows = m->cols ? t->numel / m->cols : opx_rows(t);
  m->p = (float *)t->data;
  return 1;
}

static int mat_load(const char *op, const bl_tensor *t, mat *m) {
  m->cols = t->ndim ? t->shape[t->ndim - 1] : 1;
  m->rows = m->cols ? t->numel / m->cols : opx_rows(t);
  m->buf.owned = 0;
  m->buf.p = NULL;
  if (in_place(t, &m->ld, &m->trans)) {
    m->p = (float *)t->data;
    return 0;
  }
  BL_CHECK(opx_load(op, t, &m->buf));
  m->p = m->buf.p;
  m->ld = m->cols > 0 ? m->cols : 1;
  m->trans = 0;
  return 0;
}

/* Output matrices must be untransposed for sgemm's C operand. */
static int mat_out(const char *op, bl_tensor *t, mat *m, int keep) {
  m->cols = t->ndim ? t->shape[t->ndim - 1] : 1;
  m->rows = m->cols ? t->numel / m->cols : opx_rows(t);
  m->buf.owned = 0;
  m->buf.p = NULL;
  if (in_place(t, &m->ld, &m->trans) && !m->trans) {
    m->p = (float *)t->data;
    return 0;
  }
  BL_CHECK(opx_out(op, t, &m->buf, keep));
  m->p = m->buf.p;
  m->ld = m->cols > 0 ? m->cols : 1;
  m->trans = 0;
  return 0;
}

/* C = alpha op(A) op(B) + beta C with op chosen so that the product is
 * (ta ? A^T : A)(tb ? B^T : B) in logical terms. */
static void gemm(const mat *a, int ta, const mat *b, int tb, mat *c, float beta) {
  int64_t m = ta ? a->cols : a->rows, k = ta ? a->rows : a->cols, n = tb ? b->rows : b->cols;
  if (m == 0 || n == 0) return;
  if (k == 0) { /* sgemm with k = 0 is fine in OpenBLAS, but be explicit */
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) c->p[i * c->ld + j] *= beta;
    return;
  }
  CBLAS_TRANSPOSE fa = (ta ^ a->trans) ? CblasTrans : CblasNoTrans;
  CBLAS_TRANSPOSE fb = (tb ^ b->trans) ? CblasTrans : CblasNoTrans;
  if (gemm_choice() == GEMM_OWN &&
      opx_sgemm_isa(opx_isa(), ta ^ a->trans, tb ^ b->trans, m, n, k, a->p, a->ld, b->p, b->ld, beta, c->p, c->ld))
    return;
#if BL_HAVE_DNNL
  /* row-major like ours; a call it rejects (malformed arguments only) goes to OpenBLAS instead */
  if (gemm_choice() == GEMM_ONEDNN && dnnl_sgemm(fa == CblasTrans ? 'T' : 'N', fb == CblasTrans ? 'T' : 'N', m, n, k,
                                                 1.0f, a->p, a->ld, b->p, b->ld, beta, c->p, c->ld) == dnnl_success)
    return;
#endif
  cblas_sgemm(CblasRowMajor, fa, fb, (int)m, (int)n, (int)k, 1.0f, a->p, (int)a->ld, b->p, (int)b->ld, beta, c->p,
              (int)c->ld);
}

static int check_args(const char *op, const bl_tensor *x, const bl_tensor *w, const bl_tensor *b) {
  BL_CHECK(opx_check_float(op, x, "input"));
  BL_CHECK(opx_check_float(op, w, "weight"));
  if (b) BL_CHECK(opx_check_float(op, b, "bias"));
  if (x->ndim < 1 || w->ndim != 2 || x->shape[x->ndim - 1] != w->shape[1])
    return BL_ERR("%s: input %s and weight %s are not compatible", op, OPX_SHAPE(x), OPX_SHAPE(w));
  if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
    return BL_ERR("%s: bias %s does not match weight %s", op, OPX_SHAPE(b), OPX_SHAPE(w));
  return 0;
}

/* y must be x's rows by out (same leading dims, or already flattened). */
static int check_rows_out(const char *op, const char *name, const bl_tensor *y, const bl_tensor *x, int64_t out) {
  if (y->ndim < 1 || opx_cols(y) != out || opx_rows(y) != opx_rows(x))
    return BL_ERR("%s: %s %s does not match input %s and %lld output features", op, name, OPX_SHAPE(y), OPX_SHAPE(x),
                  (long long)out);
  return 0;
}

/* db (optional) must be a float vector of n, the output features of the weight w named wname. */
static int check_grad_bias(const char *op, const bl_tensor *db, int64_t n, const char *wname, const bl_tensor *w) {
  if (!db) return 0;
  BL_CHECK(opx_check_float(op, db, "grad_bias"));
  if (db->ndim != 1 || db->shape[0] != n)
    return BL_ERR("%s: grad_bias %s does not match %s %s", op, OPX_SHAPE(db), wname, OPX_SHAPE(w));
  return 0;
}

/* One packed weight (bl_ops.h): the packed copy for the ISA in use when it
 * was made, or none on the baseline path (the unpacked GEMM then runs), and
 * what it was packed from, to catch a pack used with another weight. A
 * bf16 or int8 pack (gemm_lowp.h) holds bf or q8 instead of pb. */
struct bl_packed_weight {
  opx_packed_b *pb;
  opx_bf16_b *bf;
  opx_q8_b *q8;
  const void *src;
  int64_t out, in;
  int isa; /* the CPU path it was packed on (baseline: nothing packed) */
};

/* y = x W^T (+ b) (then GELU when gelu): through the packed weight when there
 * is one, the bias and GELU in its epilogue; else the GEMM and a row pass. A
 * bf16 pack reads a row-major bf16 x and writes a row-major bf16 y as they
 * are; any other x or y is converted from / to f32. */
static int linear_forward_cpu(bl_tensor *y, const bl_tensor *x, const bl_tensor *w, const bl_packed_weight *pw,
                              const bl_tensor *b, int gelu) {
  const char *op = pw ? "linear_packed" : "linear";
  mat mx, mw, my;
  opx_buf bb = { 0 };
  int rc = 0;
  mx.buf.owned = mw.buf.owned = my.buf.owned = 0;
  mw.buf.p = NULL;
  int xbf = pw && pw->bf && mat_bf16(x, &mx), ybf = pw && pw->bf && mat_bf16(y, &my);
  if ((!xbf && (rc = mat_load(op, x, &mx))) || (!ybf && (rc = mat_out(op, y, &my, 0)))) goto done;
  if (b && (rc = opx_load(op, b, &bb))) goto done;
  if (pw && (pw->pb || pw->bf || pw->q8)) {
    int ok = pw->bf   ? opx_bf16_gemm_io(pw->bf, mx.trans, my.rows, mx.p, xbf, mx.ld, my.p, ybf, my.ld, bb.p, gelu)
             : pw->q8 ? opx_q8_gemm(pw->q8, mx.trans, my.rows, mx.p, mx.ld, my.p, my.ld, bb.p, gelu)
                      : opx_sgemm_packed(pw->pb, mx.trans, my.rows, mx.p, mx.ld, my.p, my.ld, bb.p, gelu);
    if (!ok) {
      rc = bl_set_error(BL_ENOMEM, "%s: out of memory for the GEMM's pack buffer", op);
      goto done;
    }
  } else {
    if ((rc = mat_load(op, w, &mw))) goto done;
    /* GEMM first, bias after: an OpenMP region right before the GEMM would
     * leave libgomp's worker spin-waiting (several ms with the default
     * OMP_WAIT_POLICY) on a core that OpenBLAS's own threads need. */
    gemm(&mx, 0, &mw, 1, &my, 0.0f);
    if (b || gelu) {
      int64_t n = my.cols;
      int isa = opx_isa();
#pragma omp parallel for schedule(static) if (my.rows * n > 65536)
      for (int64_t r = 0; r < my.rows; r++) opx_bias_act_rows(isa, 1, n, my.p + r * my.ld, my.ld, bb.p, gelu);
    }
  }
  opx_store(y, &my.buf);
done:
  opx_free(&mx.buf);
  opx_free(&mw.buf);
  opx_free(&my.buf);
  opx_free(&bb);
  return rc;
}

int bl_linear_forward(bl_tensor *y, const bl_tensor *x, const bl_tensor *w, const bl_tensor *b) {
  const char *op = "linear";
  BL_CHECK(check_args(op, x, w, b));
  BL_CHECK(opx_check_float(op, y, "output"));
  BL_CHECK(check_rows_out(op, "output", y, x, w->shape[0]));
  int dev;
  const bl_tensor *ts[] = { y, x, w, b };
  BL_CHECK(opx_device(op, 4, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_linear_forward(y, x, w, b));
  return linear_forward_cpu(y, x, w, NULL, b, 0);
}

static const char *const isa_names[] = { "baseline", "avx2", "avx512" };

/* The bf16 / int8 pack of W (mw: W loaded as a matrix), or an error naming
 * what the CPU lacks */
static int pack_lowp(const char *op, bl_packed_weight *pw, const mat *mw, int precision) {
  int isa = opx_isa();
  if (precision == BL_PACK_BF16) {
    if (!opx_bf16_ok())
      return bl_set_error(BL_EUNSUPPORTED, "%s: bf16 needs AVX512-BF16 on the avx512 path (CPU path %s; %s)", op,
                          isa_names[isa], bl_cpu_info());
    pw->bf = opx_bf16_pack(!mw->trans, pw->in, pw->out, mw->p, mw->ld);
    return pw->bf ? 0
                  : bl_set_error(BL_ENOMEM, "%s: out of memory packing a [%lld,%lld] weight as bf16", op,
                                 (long long)pw->out, (long long)pw->in);
  }
  if (isa < OPX_ISA_AVX2)
    return bl_set_error(BL_EUNSUPPORTED, "%s: int8 needs at least the avx2 path (CPU path %s)", op, isa_names[isa]);
  if (pw->in > 65536) /* int32 sums of 255 * 127 products */
    return BL_ERR("%s: int8 weight [%lld,%lld]: more than 65536 input features", op, (long long)pw->out,
                  (long long)pw->in);
  pw->q8 = opx_q8_pack(opx_vnni_ok() ? OPX_ISA_AVX512 : OPX_ISA_AVX2, !mw->trans, pw->in, pw->out, mw->p, mw->ld);
  return pw->q8 ? 0
                : bl_set_error(BL_ENOMEM, "%s: out of memory packing a [%lld,%lld] weight as int8", op,
                               (long long)pw->out, (long long)pw->in);
}

int bl_linear_pack(bl_packed_weight **out, const bl_tensor *w) { return bl_linear_pack_as(out, w, BL_PACK_F32); }

int bl_linear_pack_as(bl_packed_weight **out, const bl_tensor *w, int precision) {
  const char *op = "linear_pack";
  if (!out) return BL_ERR("%s: out is NULL", op);
  if (precision != BL_PACK_F32 && precision != BL_PACK_BF16 && precision != BL_PACK_INT8)
    return BL_ERR("%s: unknown precision %d (BL_PACK_F32, BL_PACK_BF16 or BL_PACK_INT8)", op, precision);
  *out = NULL;
  BL_CHECK(opx_check_float(op, w, "weight"));
  if (w->ndim != 2) return BL_ERR("%s: weight must be [out, in], got %s", op, OPX_SHAPE(w));
  if (w->device >= 0) return BL_ERR("%s: packed weights are for the CPU, weight is on cuda:%d", op, w->device);
  bl_packed_weight *pw = calloc(1, sizeof *pw);
  if (!pw) return bl_set_error(BL_ENOMEM, "%s: out of memory", op);
  *pw = (bl_packed_weight){ NULL, NULL, NULL, w->data, w->shape[0], w->shape[1], OPX_ISA_BASE };
  int isa = opx_isa();
  if ((isa > OPX_ISA_BASE || precision != BL_PACK_F32) && pw->out > 0 && pw->in > 0) {
    mat mw;
    int rc = mat_load(op, w, &mw);
    if (rc) {
      free(pw);
      return rc;
    }
    /* op(B) = W^T: stored [out, in] (tb = 1), or already transposed in memory */
    if (precision != BL_PACK_F32)
      rc = pack_lowp(op, pw, &mw, precision);
    else if (!(pw->pb = opx_pack_b(isa, !mw.trans, pw->in, pw->out, mw.p, mw.ld)))
      rc = bl_set_error(BL_ENOMEM, "%s: out of memory packing weight %s", op, OPX_SHAPE(w));
    opx_free(&mw.buf);
    if (rc) {
      free(pw);
      return rc;
    }
    pw->isa = isa;
  }
  *out = pw;
  return 0;
}

void bl_linear_pack_free(bl_packed_weight *pw) {
  if (!pw) return;
  opx_packed_b_free(pw->pb);
  opx_bf16_free(pw->bf);
  opx_q8_free(pw->q8);
  free(pw);
}

int bl_linear_forward_packed(bl_tensor *y, const bl_tensor *x, const bl_tensor *w, const bl_packed_weight *pw,
                             const bl_tensor *b, int act) {
  const char *op = "linear_packed";
  BL_CHECK(check_args(op, x, w, b));
  BL_CHECK(opx_check_float(op, y, "output"));
  BL_CHECK(check_rows_out(op, "output", y, x, w->shape[0]));
  if (!pw) return BL_ERR("%s: packed weight is NULL", op);
  if (pw->src != w->data || pw->out != w->shape[0] || pw->in != w->shape[1])
    return BL_ERR("%s: the packed weight [%lld,%lld] was not packed from weight %s", op, (long long)pw->out,
                  (long long)pw->in, OPX_SHAPE(w));
  if (act != BL_LINEAR_NONE && act != BL_LINEAR_GELU) return BL_ERR("%s: unknown activation %d", op, act);
  int packed_isa = pw->isa;
  if (packed_isa != OPX_ISA_BASE && packed_isa != opx_isa())
    return BL_ERR("%s: weight %s was packed for the %s path but the CPU path is now %s: pack it again", op,
                  OPX_SHAPE(w), isa_names[packed_isa], isa_names[opx_isa()]);
  int dev;
  const bl_tensor *ts[] = { y, x, w, b };
  BL_CHECK(opx_device(op, 4, ts, &dev));
  if (dev >= 0) return BL_ERR("%s: packed weights are for the CPU, tensors are on cuda:%d", op, dev);
  return linear_forward_cpu(y, x, w, pw, b, act == BL_LINEAR_GELU);
}

/* db[j] += sum_r dy[r, j] over w <= 64 columns: each column summed over the rows in order (the lanes are
 * columns, so every ISA adds the same numbers in the same order). */
OPX_BODY bias_cols_body(int64_t rows, int64_t w, const float *restrict p, int64_t ld, int trans, float *restrict db) {
  float acc[64] = { 0 };
  if (!trans && w == 64) {
    for (int64_t r = 0; r < rows; r++) {
#pragma omp simd
      for (int64_t j = 0; j < 64; j++) acc[j] += p[r * ld + j];
    }
  } else if (!trans) {
    for (int64_t r = 0; r < rows; r++) {
#pragma omp simd
      for (int64_t j = 0; j < w; j++) acc[j] += p[r * ld + j];
    }
  } else {
    for (int64_t r = 0; r < rows; r++)
      for (int64_t j = 0; j < w; j++) acc[j] += p[j * ld + r];
  }
#pragma omp simd
  for (int64_t j = 0; j < w; j++) db[j] += acc[j];
}
OPX_ISA_FN(bias_cols, (int64_t rows, int64_t w, const float *restrict p, int64_t ld, int trans, float *restrict db),
           (rows, w, p, ld, trans, db))

/* db[j] += sum_r dy[r, j]: columns split in fixed blocks of 64, rows summed in order inside each block, so the
 * result does not depend on the thread count. */
static void bias_grad(float *db, const mat *dy) {
  int64_t n = dy->cols, rows = dy->rows;
  int64_t nblk = (n + 63) / 64;
#pragma omp parallel for schedule(static) if (rows * n > 65536)
  for (int64_t blk = 0; blk < nblk; blk++) {
    int64_t j0 = blk * 64, w = j0 + 64 < n ? 64 : n - j0;
    bias_cols(rows, w, dy->p + (dy->trans ? j0 * dy->ld : j0), dy->ld, dy->trans, db + j0);
  }
}

static int linear_backward_cpu(bl_tensor *dx, bl_tensor *dw, bl_tensor *db, const bl_tensor *dy, const bl_tensor *x,
                               const bl_tensor *w, int accumulate) {
  const char *op = "linear_backward";
  mat mdy, mx, mw, mdx, mdw;
  opx_buf bdb = { 0 };
  int rc = 0;
  mdy.buf.owned = mx.buf.owned = mw.buf.owned = mdx.buf.owned = mdw.buf.owned = 0;
  mdx.buf.p = mdw.buf.p = NULL;
  if ((rc = mat_load(op, dy, &mdy))) goto done;
  if (dx) {
    if ((rc = mat_load(op, w, &mw)) || (rc = mat_out(op, dx, &mdx, accumulate))) goto done;
    gemm(&mdy, 0, &mw, 0, &mdx, accumulate ? 1.0f : 0.0f);
    opx_store(dx, &mdx.buf);
  }
  if (dw) {
    if ((rc = mat_load(op, x, &mx)) || (rc = mat_out(op, dw, &mdw, 1))) goto done;
    gemm(&mdy, 1, &mx, 0, &mdw, 1.0f);
    opx_store(dw, &mdw.buf);
  }
  if (db) {
    if ((rc = opx_out(op, db, &bdb, 1))) goto done;
    bias_grad(bdb.p, &mdy);
    opx_store(db, &bdb);
  }
done:
  opx_free(&mdy.buf);
  opx_free(&mx.buf);
  opx_free(&mw.buf);
  opx_free(&mdx.buf);
  opx_free(&mdw.buf);
  opx_free(&bdb);
  return rc;
}

int bl_linear_backward(bl_tensor *dx, bl_tensor *dw, bl_tensor *db, const bl_tensor *dy, const bl_tensor *x,
                       const bl_tensor *w, int accumulate) {
  const char *op = "linear_backward";
  BL_CHECK(check_args(op, x, w, NULL));
  BL_CHECK(opx_check_float(op, dy, "grad_output"));
  BL_CHECK(check_rows_out(op, "grad_output", dy, x, w->shape[0]));
  if (dx) {
    BL_CHECK(opx_check_float(op, dx, "grad_input"));
    if (!opx_same_shape(dx, x) && (opx_rows(dx) != opx_rows(x) || opx_cols(dx) != opx_cols(x)))
      return BL_ERR("%s: grad_input %s does not match input %s", op, OPX_SHAPE(dx), OPX_SHAPE(x));
  }
  if (dw) {
    BL_CHECK(opx_check_float(op, dw, "grad_weight"));
    if (!opx_same_shape(dw, w))
      return BL_ERR("%s: grad_weight %s does not match weight %s", op, OPX_SHAPE(dw), OPX_SHAPE(w));
  }
  BL_CHECK(check_grad_bias(op, db, w->shape[0], "weight", w));
  int dev;
  const bl_tensor *ts[] = { dx, dw, db, dy, x, w };
  BL_CHECK(opx_device(op, 6, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_linear_backward(dx, dw, db, dy, x, w, accumulate));
  return linear_backward_cpu(dx, dw, db, dy, x, w, accumulate);
}

/* ---- linear + tanh GELU and the backward of the chain through it (bl_ops.h). The CPU twin is the unfused
 * sequence (GEMM with the bias, then the activation; the dX GEMM, then the activation's derivative, then the
 * column sums), which is what the CUDA epilogues are checked against. */
int bl_linear_gelu_tanh_forward(bl_tensor *y, bl_tensor *pre, const bl_tensor *x, const bl_tensor *w,
                                const bl_tensor *b) {
  const char *op = "linear_gelu_tanh";
  if (!b || !pre) return BL_ERR("%s: %s is required", op, b ? "the pre-activation output" : "the bias");
  BL_CHECK(check_args(op, x, w, b));
  BL_CHECK(opx_check_float(op, y, "output"));
  BL_CHECK(check_rows_out(op, "output", y, x, w->shape[0]));
  BL_CHECK(opx_check_float(op, pre, "pre-activation"));
  if (!opx_same_shape(pre, y) || pre->dtype != y->dtype)
    return BL_ERR("%s: pre-activation %s %s must match output %s %s", op, OPX_SHAPE(pre), bl_dtype_name(pre->dtype),
                  OPX_SHAPE(y), bl_dtype_name(y->dtype));
  int dev;
  const bl_tensor *ts[] = { y, pre, x, w, b };
  BL_CHECK(opx_device(op, 5, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_linear_gelu_forward(y, pre, x, w, b, 1));
  BL_CHECK(linear_forward_cpu(pre, x, w, NULL, b, 0));
  return bl_gelu_tanh_forward(y, pre, NULL);
}

int bl_linear_dgelu_tanh_backward(bl_tensor *dpre, bl_tensor *db, const bl_tensor *dy2, const bl_tensor *w2,
                                  const bl_tensor *pre) {
  const char *op = "linear_dgelu_tanh_backward";
  BL_CHECK(opx_check_float(op, dy2, "grad_output"));
  BL_CHECK(opx_check_float(op, w2, "weight"));
  BL_CHECK(opx_check_float(op, pre, "pre-activation"));
  BL_CHECK(opx_check_float(op, dpre, "grad_pre"));
  if (dy2->ndim < 1 || w2->ndim != 2 || opx_cols(dy2) != w2->shape[0])
    return BL_ERR("%s: grad_output %s and FC2 weight %s are not compatible", op, OPX_SHAPE(dy2), OPX_SHAPE(w2));
  if (pre->ndim < 1 || opx_cols(pre) != w2->shape[1] || opx_rows(pre) != opx_rows(dy2))
    return BL_ERR("%s: pre-activation %s does not match grad_output %s and FC2 weight %s", op, OPX_SHAPE(pre),
                  OPX_SHAPE(dy2), OPX_SHAPE(w2));
  if (!opx_same_shape(dpre, pre))
    return BL_ERR("%s: grad_pre %s does not match pre-activation %s", op, OPX_SHAPE(dpre), OPX_SHAPE(pre));
  BL_CHECK(check_grad_bias(op, db, w2->shape[1], "FC2 weight", w2));
  int dev;
  const bl_tensor *ts[] = { dpre, db, dy2, w2, pre };
  BL_CHECK(opx_device(op, 5, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_linear_dgelu_backward(dpre, db, dy2, w2, pre, 1));
  bl_tensor *dh = NULL; /* dy2 W2 in f32, then through the activation's derivative (not in place: restrict) */
  BL_CHECK(bl_tensor_empty(pre->ndim, pre->shape, BL_F32, -1, &dh));
  int rc = linear_backward_cpu(dh, NULL, NULL, dy2, pre, w2, 0); /* pre only stands for x: not read */
  if (!rc) rc = bl_gelu_tanh_backward(dpre, NULL, dh, pre, NULL);
  bl_tensor_free(dh);
  if (rc || !db) return rc;
  mat md;
  opx_buf bdb = { 0 };
  if (!(rc = mat_load(op, dpre, &md)) && !(rc = opx_out(op, db, &bdb, 1))) {
    bias_grad(bdb.p, &md);
    opx_store(db, &bdb);
  }
  opx_free(&md.buf);
  opx_free(&bdb);
  return rc;
}
