// GEMMs on cuBLASLt: the linear layer (forward with a bias epilogue, backward
// dX / dW (+= with beta = 1) / db: the BGRADB epilogue of the dW GEMM, or
// column sums when cuBLASLt has no algorithm for it), linear + bias + GELU (pre-activation saved)
// and its backward, and the batched bl_matmul twin (strided-batched, batch
// stride 0 for broadcast).
//
// BERT's exact erf GELU (bl_gelu_forward) runs in activation.cu after the GEMM:
// cuBLASLt's GELU/DGELU epilogues compute the tanh approximation, which differs
// by up to ~5e-4 (relative 1e-3). The tanh GELU (gelu_new) goes into the
// epilogues: GELU_AUX_BIAS writes y and the pre-activation (AUX) in one GEMM,
// DGELU_BGRAD multiplies FC2's dX GEMM by gelu'(AUX) and writes FC1's bias
// gradient; where cuBLASLt refuses, the GEMM and the activation kernel run.
//
// Row-major <-> cuBLASLt: our matrices are row-major; cuBLASLt is
// column-major. A row-major C[m,n] is the column-major C^T[n,m], so we ask
// for C^T = B'^T A'^T: cuBLASLt's "A" is our B' and its "B" is our A'. A bias
// over our output columns is then cuBLASLt's per-row bias (length n), the
// layout it supports.
//
// Precision: f32 operands use CUBLAS_COMPUTE_32F, or _FAST_TF32 after
// bl_cuda_set_tf32(1). f16/bf16 operands (both the same type) use f32
// accumulation; D may be f32 or the operands' type. Anything else (mixed
// dtypes, f64, irregular strides) goes through a contiguous scratch.
//
// Heuristics: the first algorithm returned by cublasLtMatmulAlgoGetHeuristic is
// cached per (shape, leading dims, transposes, dtypes, epilogue, batch,
// pointer alignments) in a small hash map, so steady-state calls skip the
// heuristic query. Workspace: one 32 MiB block per device from the caching
// allocator, kept for the life of the process (all GEMMs of a device run on
// one stream, so sharing it is safe).
#include "common.cuh"
#include <cublasLt.h>
#include <mutex>
#include <string>
#include <unordered_map>

namespace {

const size_t kWorkspace = 32u << 20;
int g_tf32 = 0;

struct dev_state {
  cublasLtHandle_t lt = nullptr;
  void *ws = nullptr;
};
std::mutex g_mu;
std::unordered_map<int, dev_state> g_dev;
std::unordered_map<std::string, cublasLtMatmulAlgo_t> g_algo;

int lt_err(const char *op, int dev, const char *what, cublasStatus_t s) {
  return bl_set_error(BL_EDEVICE, "%s: cuda:%d: cuBLASLt %s failed: %s", op, dev, what, cublasLtGetStatusString(s));
}
#define LT_TRY(op, dev, what, expr)    \
  do {                                 \
    cublasStatus_t s_ = (expr);        \
    if (s_ != CUBLAS_STATUS_SUCCESS) { \
      rc = lt_err(op, dev, what, s_);  \
      goto done;                       \
    }                                  \
  } while (0)

int get_state(const char *op, int dev, dev_state **out) {
  std::lock_guard<std::mutex> g(g_mu);
  dev_state &st = g_dev[dev];
  if (!st.lt) {
    cublasStatus_t s = cublasLtCreate(&st.lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
      st.lt = nullptr;
      return lt_err(op, dev, "create", s);
    }
  }
  if (!st.ws) {
    int rc = bl_dev_malloc(dev, kWorkspace, &st.ws);
    if (rc) {
      st.ws = nullptr;
      return bl_set_error(rc, "%s: cuda:%d: cannot allocate the cuBLASLt workspace", op, dev);
    }
  }
  *out = &st;
  return 0;
}

cudaDataType_t cuda_type(int dtype) {
  return dtype == BL_F16 ? CUDA_R_16F : dtype == BL_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

int align_of(const void *p, int64_t batch_stride_bytes) {
  uintptr_t a = (uintptr_t)p | (uintptr_t)256;
  if (batch_stride_bytes) a |= (uintptr_t)batch_stride_bytes;
  return (int)(a & (~a + 1)); // lowest set bit, <= 256
}

// A row-major operand: element (r, c) of the logical rows x cols matrix is at
// p[r*ld + c] (trans = 0) or p[c*ld + r] (trans = 1); bstride = elements
// between batch items (0 = broadcast). `mem` owns a scratch copy if one was needed.
struct mat {
  void *p = nullptr;
  int64_t rows = 0, cols = 0, ld = 1, bstride = 0;
  int trans = 0, dtype = BL_F32;
  cu_mem mem;
};

// Can the last two dims of t be used in place (same test as the CPU's linear:
// unit stride on one of them, the other >= the extent)? Leading dims are
// handled by the caller (collapsed into rows for linear, into batch for matmul).
bool inner_in_place(int64_t rows, int64_t cols, int64_t rs, int64_t cs, int64_t *ld, int *trans) {
  if (rows <= 1) rs = cols > 0 ? cols : 1;
  if (cols <= 1) cs = 1;
  if (cs == 1 && rs >= cols && rs >= 1) {
    *ld = rs;
    *trans = 0;
    return true;
  }
  if (rs == 1 && cs >= rows && cs >= 1) {
    *ld = cs;
    *trans = 1;
    return true;
  }
  return false;
}

// The matrix view of a tensor for linear: leading dims collapse into rows.
int linear_mat(const char *op, const bl_tensor *t, int dtype, mat *m, bool writable) {
  int nd = t->ndim;
  m->cols = nd ? t->shape[nd - 1] : 1;
  m->rows = m->cols ? t->numel / m->cols : 0;
  m->dtype = dtype;
  if (t->dtype == dtype && t->numel > 0) {
    int64_t cst = nd ? t->stride[nd - 1] : 1, rst = 0, expect = -1;
    bool ok = true;
    for (int d = nd - 2; d >= 0 && ok; d--) {
      if (t->shape[d] == 1) continue;
      if (expect < 0) {
        rst = t->stride[d];
        expect = t->stride[d] * t->shape[d];
      } else if (t->stride[d] != expect)
        ok = false;
      else
        expect = t->stride[d] * t->shape[d];
    }
    if (ok && inner_in_place(m->rows, m->cols, rst, cst, &m->ld, &m->trans) && !(writable && m->trans) &&
        (m->trans == 0 || nd == 2 || m->rows <= 1)) {
      m->p = t->data;
      return 0;
    }
  }
  // contiguous scratch of `dtype`
  BL_CHECK(m->mem.alloc(op, t->device, (size_t)t->numel * bl_dtype_size(dtype)));
  m->p = m->mem.p;
  m->ld = m->cols > 0 ? m->cols : 1;
  m->trans = 0;
  return 0;
}

// Copy a tensor into the contiguous scratch of m (load) or back (store).
int mat_sync(const char *op, const bl_tensor *t, mat *m, bool load) {
  if (!m->mem.p) return 0;
  return load ? cu_copy_to_contig(op, m->mem.p, m->dtype, t)
              : cu_copy_from_contig(op, (bl_tensor *)t, m->mem.p, m->dtype);
}

struct gemm_args {
  // C[m,n] = alpha * A'[m,k] B'[k,n] + beta * C, A' = ta ? A^T : A, B' = tb ? B^T : B
  const mat *a, *b;
  int ta, tb;
  mat *c;
  int64_t m, n, k, batch;
  float alpha, beta;
  cublasLtEpilogue_t epi;
  const void *bias;    // dtype of c (length n)
  void *aux = nullptr; // the GELU epilogues' pre-activation matrix: dtype of c, [m, n] with row stride aux_ld
  int64_t aux_ld = 0;
};

int gemm(const char *op, int dev, const gemm_args &g) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return 0;
  dev_state *st = nullptr;
  BL_CHECK(get_state(op, dev, &st));
  int rc = 0;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t lx = nullptr, ly = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  // cuBLASLt X = our B' (n x k as col-major), Y = our A' (k x m), D = C^T (n x m).
  const mat &B = *g.b, &A = *g.a;
  bool brow = (g.tb ^ B.trans) == 0, arow = (g.ta ^ A.trans) == 0;
  cublasOperation_t opx = brow ? CUBLAS_OP_N : CUBLAS_OP_T, opy = arow ? CUBLAS_OP_N : CUBLAS_OP_T;
  uint64_t xr = brow ? g.n : g.k, xc = brow ? g.k : g.n, yr = arow ? g.k : g.m, yc = arow ? g.m : g.k;
  cudaDataType_t tab = cuda_type(A.dtype), tcd = cuda_type(g.c->dtype);
  cublasComputeType_t ct =
      A.dtype == BL_F32 ? (g_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F) : CUBLAS_COMPUTE_32F;
  int esab = bl_dtype_size(A.dtype), escd = bl_dtype_size(g.c->dtype);
  int alx = align_of(B.p, B.bstride * esab), aly = align_of(A.p, A.bstride * esab),
      alc = align_of(g.c->p, g.c->bstride * escd);
  int albias = g.bias ? align_of(g.bias, 0) : 256;
  // the heuristic reads the AUX pointer for its alignment (cublasLt.h, EPILOGUE_AUX_POINTER): part of the key
  int alaux = g.aux ? align_of(g.aux, 0) : 0;
  int64_t key[24] = { g.m,
                      g.n,
                      g.k,
                      B.ld,
                      A.ld,
                      g.c->ld,
                      opx,
                      opy,
                      (int64_t)tab,
                      (int64_t)tcd,
                      (int64_t)ct,
                      (int64_t)g.epi,
                      g.batch,
                      B.bstride != 0,
                      A.bstride != 0,
                      alx,
                      aly,
                      alc,
                      0,
                      albias,
                      g.beta != 0.0f,
                      dev,
                      alaux,
                      g.aux_ld };
  std::string skey((const char *)key, sizeof key);
  cublasLtMatmulAlgo_t algo;
  bool have = false;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_algo.find(skey);
    if (it != g_algo.end()) {
      algo = it->second;
      have = true;
    }
  }
  cudaDataType_t scale_t = CUDA_R_32F;
  LT_TRY(op, dev, "descriptor", cublasLtMatmulDescCreate(&desc, ct, scale_t));
  LT_TRY(op, dev, "descriptor", cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opx, sizeof opx));
  LT_TRY(op, dev, "descriptor", cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opy, sizeof opy));
  if (g.epi != CUBLASLT_EPILOGUE_DEFAULT) {
    LT_TRY(op, dev, "epilogue",
           cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &g.epi, sizeof g.epi));
    if (g.bias) {
      LT_TRY(op, dev, "bias",
             cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
      LT_TRY(op, dev, "bias",
             cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &tcd, sizeof tcd));
    }
    if (g.aux) { // AUX in D's dtype (the default AUX_DATA_TYPE), leading dimension in elements
      LT_TRY(op, dev, "aux",
             cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof g.aux));
      LT_TRY(op, dev, "aux",
             cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &g.aux_ld, sizeof g.aux_ld));
    }
  }
  LT_TRY(op, dev, "layout", cublasLtMatrixLayoutCreate(&lx, tab, xr, xc, B.ld));
  LT_TRY(op, dev, "layout", cublasLtMatrixLayoutCreate(&ly, tab, yr, yc, A.ld));
  LT_TRY(op, dev, "layout", cublasLtMatrixLayoutCreate(&lc, tcd, (uint64_t)g.n, (uint64_t)g.m, g.c->ld));
  if (g.batch > 1) {
    int32_t bc = (int32_t)g.batch;
    int64_t sx = B.bstride, sy = A.bstride, sc = g.c->bstride;
    LT_TRY(op, dev, "layout", cublasLtMatrixLayoutSetAttribute(lx, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
    LT_TRY(op, dev, "layout",
           cublasLtMatrixLayoutSetAttribute(lx, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sx, sizeof sx));
    LT_TRY(op, dev, "layout", cublasLtMatrixLayoutSetAttribute(ly, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
    LT_TRY(op, dev, "layout",
           cublasLtMatrixLayoutSetAttribute(ly, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sy, sizeof sy));
    LT_TRY(op, dev, "layout", cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
    LT_TRY(op, dev, "layout",
           cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sc, sizeof sc));
  }
  if (!have) {
    uint32_t ax = alx, ay = aly, ac = alc;
    size_t ws = kWorkspace;
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    LT_TRY(op, dev, "preference", cublasLtMatmulPreferenceCreate(&pref));
    LT_TRY(op, dev, "preference",
           cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    LT_TRY(op, dev, "preference",
           cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &ax, sizeof ax));
    LT_TRY(op, dev, "preference",
           cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ay, sizeof ay));
    LT_TRY(op, dev, "preference",
           cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof ac));
    LT_TRY(op, dev, "preference",
           cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof ac));
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(st->lt, desc, lx, ly, lc, lc, pref, 1, &res, &nres);
    if (hs == CUBLAS_STATUS_NOT_SUPPORTED)
      nres = 0; // BL_EUNSUPPORTED below: the caller may drop the epilogue
    else
      LT_TRY(op, dev, "heuristic", hs);
    if (nres < 1) {
      rc = bl_set_error(BL_EUNSUPPORTED, "%s: cuda:%d: cuBLASLt has no algorithm for %lldx%lldx%lld (%s, epilogue %d)",
                        op, dev, (long long)g.m, (long long)g.n, (long long)g.k, bl_dtype_name(A.dtype), (int)g.epi);
      goto done;
    }
    algo = res.algo;
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_algo.size() > 4096) g_algo.clear(); // bound the cache
    g_algo[skey] = algo;
  }
  {
    double ba = A.bstride ? g.batch : 1, bb = B.bstride ? g.batch : 1, mn = (double)g.m * g.n * g.batch;
    // a bias is read (BIAS: one per output column n) or written (BGRADB: one per output row m)
    double nbias = g.epi == CUBLASLT_EPILOGUE_BGRADB ? (double)g.m : (double)g.n;
    // the GELU epilogues write (forward) or read (backward) the pre-activation: one more [m, n] in D's dtype
    double bytes = esab * ((double)g.m * g.k * ba + (double)g.k * g.n * bb) + escd * mn * (g.beta != 0.0f ? 2 : 1) +
                   (g.bias ? escd * nbias : 0.0) + (g.aux ? escd * mn : 0.0);
    int engine = A.dtype != BL_F32 ? BL_ENGINE_TC16 : g_tf32 ? BL_ENGINE_TF32 : BL_ENGINE_FP32;
    cu_cost_call(dev, "gemm", "cublasLtMatmul", engine, 2.0 * mn * g.k, bytes);
  }
  LT_TRY(op, dev, "matmul",
         cublasLtMatmul(st->lt, desc, &g.alpha, B.p, lx, A.p, ly, &g.beta, g.c->p, lc, g.c->p, lc, &algo, st->ws,
                        kWorkspace, cu_stream(dev)));
  rc = cu_launched(op, dev);
done:
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (lx) cublasLtMatrixLayoutDestroy(lx);
  if (ly) cublasLtMatrixLayoutDestroy(ly);
  if (lc) cublasLtMatrixLayoutDestroy(lc);
  if (desc) cublasLtMatmulDescDestroy(desc);
  return rc;
}

// Operand dtype for a pair: both f16 or both bf16 stay; anything else is f32.
int compute_dtype(const bl_tensor *a, const bl_tensor *b) {
  if (a->dtype == b->dtype && (a->dtype == BL_F16 || a->dtype == BL_BF16)) return a->dtype;
  return BL_F32;
}
// Output (D) dtype: the tensor's own when supported for this compute type, else f32 scratch.
int out_dtype(const bl_tensor *y, int cdt) {
  return (y->dtype == BL_F32 || (cdt != BL_F32 && y->dtype == cdt)) ? y->dtype : BL_F32;
}

// A contiguous copy of a 1-D vector in dtype `dt` (or the vector itself).
int vec_as(const char *op, const bl_tensor *v, int dt, cu_mem *mem, const void **p) {
  if (v->dtype == dt && (v->numel <= 1 || v->stride[0] == 1)) {
    *p = v->data;
    return 0;
  }
  BL_CHECK(mem->alloc(op, v->device, (size_t)v->numel * bl_dtype_size(dt)));
  *p = mem->p;
  return cu_copy_to_contig(op, mem->p, dt, v);
}

int check_linear(const char *op, const bl_tensor *x, const bl_tensor *w, const bl_tensor *out, const char *outname) {
  char a[128], b[128], c[128];
  if (x->ndim < 1 || w->ndim != 2 || x->shape[x->ndim - 1] != w->shape[1])
    return bl_set_error(BL_EINVAL, "%s: input %s and weight %s are not compatible", op, BL_SHAPE(x, a), BL_SHAPE(w, b));
  int64_t rows = x->numel / (x->shape[x->ndim - 1] ? x->shape[x->ndim - 1] : 1);
  if (x->shape[x->ndim - 1] == 0) {
    rows = 1;
    for (int d = 0; d + 1 < x->ndim; d++) rows *= x->shape[d];
  }
  int64_t orows = 1;
  for (int d = 0; d + 1 < out->ndim; d++) orows *= out->shape[d];
  if (out->ndim < 1 || out->shape[out->ndim - 1] != w->shape[0] || orows != rows)
    return bl_set_error(BL_EINVAL, "%s: %s %s does not match input %s and weight %s", op, outname, BL_SHAPE(out, c),
                        BL_SHAPE(x, a), BL_SHAPE(w, b));
  return 0;
}

int64_t rows_of(const bl_tensor *t) {
  int64_t r = 1;
  for (int d = 0; d + 1 < t->ndim; d++) r *= t->shape[d];
  return r;
}

// db[N] += the column sums of g[M,N] (the bias gradient, accumulated).
int bias_grad(const char *op, int dev, const bl_tensor *g, int64_t M, int64_t N, bl_tensor *db) {
  cu_buf bg, bdb;
  BL_CHECK(cu_out(op, db, &bdb, 1));
  int rc = cu_colsum_acc_native(op, dev, g, M, N, bdb.p); // bf16/f16 g read directly
  if (rc == BL_EUNSUPPORTED) {
    BL_CHECK(cu_load(op, g, &bg));
    rc = cu_colsum_acc(op, dev, bg.p, M, N, bdb.p);
  }
  BL_CHECK(rc);
  return cu_store(op, db, &bdb);
}

template <class T>
__global__ void add_into_kernel(float *dst, const T *src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] += to_f(src[i]);
}

// db += src[0 .. db->numel) (src of dtype sdt: f32 or bf16; db through an f32 image when it is another dtype or
// strided).
int add_into(const char *op, int dev, bl_tensor *db, const void *src, int sdt) {
  cu_buf bdb;
  BL_CHECK(cu_out(op, db, &bdb, 1));
  int64_t n = db->numel;
  cu_cost_kernel(dev, "bias grad", "add_into", (8.0 + bl_dtype_size(sdt)) * (double)n);
  if (sdt == BL_BF16)
    add_into_kernel<__nv_bfloat16><<<cu_blocks(n, 256), 256, 0, cu_stream(dev)>>>(bdb.p, (const __nv_bfloat16 *)src, n);
  else
    add_into_kernel<float><<<cu_blocks(n, 256), 256, 0, cu_stream(dev)>>>(bdb.p, (const float *)src, n);
  BL_CHECK(cu_launched(op, dev));
  return cu_store(op, db, &bdb);
}

// The GELU epilogues' AUX operand: pre [M, N] in place, in D's dtype odt, rows untransposed with a leading dimension
// that is a multiple of 8 elements (cublasLt.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: "must be divisible by 8 and be
// no less than the number of rows"). false: no epilogue, the caller runs the separate kernels.
bool aux_in_place(const bl_tensor *pre, int odt, mat *m) {
  if (pre->dtype != odt || pre->numel == 0) return false;
  if (linear_mat("aux", pre, odt, m, true) || m->mem.p || m->trans) return false;
  return m->ld % 8 == 0;
}

} // namespace

extern "C" void bl_cuda_set_tf32(int enable) { g_tf32 = enable != 0; }
extern "C" int bl_cuda_get_tf32(void) { return g_tf32; }

// ---------------------------------------------------------------- linear
// y = x W^T (+ b): the bias epilogue, or DEFAULT without a bias. With aux (a tanh GELU's pre-activation that passed
// aux_in_place; b and K > 0 required): GELU_AUX_BIAS, y = gelu_tanh(x W^T + b) and aux = x W^T + b in one GEMM.
static int linear_fwd(const char *op, bl_tensor *y, const bl_tensor *x, const bl_tensor *w, const bl_tensor *b,
                      const mat *aux = nullptr) {
  int dev;
  const bl_tensor *ts[] = { y, x, w, b };
  BL_CHECK(cu_device(op, 4, ts, &dev));
  BL_CHECK(check_linear(op, x, w, y, "output"));
  if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
    return bl_set_error(BL_EINVAL, "%s: bias must be [%lld]", op, (long long)w->shape[0]);
  int64_t M = rows_of(y), N = w->shape[0], K = w->shape[1];
  if (M == 0 || N == 0) return 0;
  if (K == 0) // empty reduction: y = b (or 0), as the CPU's sgemm
    return b ? bl_cuda_tensor_copy(y, b) : bl_cuda_tensor_fill(y, 0.0);
  int cdt = compute_dtype(x, w), odt = out_dtype(y, cdt);
  mat mx, mw, my;
  BL_CHECK(linear_mat(op, x, cdt, &mx, false));
  BL_CHECK(mat_sync(op, x, &mx, true));
  BL_CHECK(linear_mat(op, w, cdt, &mw, false));
  BL_CHECK(mat_sync(op, w, &mw, true));
  BL_CHECK(linear_mat(op, y, odt, &my, true));
  cu_mem bmem;
  const void *bp = nullptr;
  if (b) BL_CHECK(vec_as(op, b, odt, &bmem, &bp));
  gemm_args g;
  g.a = &mx;
  g.ta = 0;
  g.b = &mw;
  g.tb = 1;
  g.c = &my;
  g.m = M;
  g.n = N;
  g.k = K;
  g.batch = 1;
  g.alpha = 1.0f;
  g.beta = 0.0f;
  g.bias = bp;
  g.epi = bp ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if (aux) {
    g.epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    g.aux = aux->p;
    g.aux_ld = aux->ld;
  }
  BL_CHECK(gemm(op, dev, g));
  return mat_sync(op, y, &my, false);
}

extern "C" int bl_cuda_linear_forward(bl_tensor *y, const bl_tensor *x, const bl_tensor *w, const bl_tensor *b) {
  return linear_fwd("linear", y, x, w, b);
}

extern "C" int bl_cuda_linear_gelu_forward(bl_tensor *y, bl_tensor *pre, const bl_tensor *x, const bl_tensor *w,
                                           const bl_tensor *b, int tanh_form) {
  const char *op = tanh_form ? "linear_gelu_tanh" : "linear_gelu";
  if (!pre) return bl_set_error(BL_EINVAL, "%s: the pre-activation output is required (saved for backward)", op);
  char a[128], c[128];
  if (pre->ndim != y->ndim || memcmp(pre->shape, y->shape, sizeof(int64_t) * y->ndim))
    return bl_set_error(BL_EINVAL, "%s: pre-activation %s must have the output's shape %s", op, BL_SHAPE(pre, a),
                        BL_SHAPE(y, c));
  mat mp;
  if (tanh_form && b && w->ndim == 2 && w->shape[1] > 0 && y->numel > 0 &&
      aux_in_place(pre, out_dtype(y, compute_dtype(x, w)), &mp)) { // else, or without an algorithm: the kernels
    int rc = linear_fwd(op, y, x, w, b, &mp);
    if (rc != BL_EUNSUPPORTED) return rc;
  }
  BL_CHECK(linear_fwd(op, pre, x, w, b)); // the GEMM with its bias epilogue, then the activation kernel
  return tanh_form ? bl_cuda_gelu_tanh_forward(y, pre, nullptr) : bl_cuda_gelu_forward(y, pre);
}

extern "C" int bl_cuda_linear_backward(bl_tensor *dx, bl_tensor *dw, bl_tensor *db, const bl_tensor *dy,
                                       const bl_tensor *x, const bl_tensor *w, int accumulate) {
  const char *op = "linear_backward";
  int dev;
  const bl_tensor *ts[] = { dx, dw, db, dy, x, w };
  BL_CHECK(cu_device(op, 6, ts, &dev));
  BL_CHECK(check_linear(op, x, w, dy, "grad_output"));
  int64_t M = rows_of(dy), N = w->shape[0], K = w->shape[1];
  if (dx && (dx->numel != x->numel || dx->ndim < 1 || dx->shape[dx->ndim - 1] != K))
    return bl_set_error(BL_EINVAL, "%s: grad_input does not match input", op);
  if (dw && (dw->ndim != 2 || dw->shape[0] != N || dw->shape[1] != K))
    return bl_set_error(BL_EINVAL, "%s: grad_weight does not match weight", op);
  if (db && (db->ndim != 1 || db->shape[0] != N))
    return bl_set_error(BL_EINVAL, "%s: grad_bias does not match weight", op);
  int cdt = compute_dtype(dy, w);
  if (dw) cdt = (cdt == compute_dtype(dy, x)) ? cdt : BL_F32;
  mat mdy;
  BL_CHECK(linear_mat(op, dy, cdt, &mdy, false));
  BL_CHECK(mat_sync(op, dy, &mdy, true));
  if (dx && dx->numel > 0) {
    if (N == 0) {
      if (!accumulate) BL_CHECK(bl_cuda_tensor_fill(dx, 0.0));
    } else {
      int odt = out_dtype(dx, cdt);
      mat mw, mdx;
      BL_CHECK(linear_mat(op, w, cdt, &mw, false));
      BL_CHECK(mat_sync(op, w, &mw, true));
      BL_CHECK(linear_mat(op, dx, odt, &mdx, true));
      if (accumulate) BL_CHECK(mat_sync(op, dx, &mdx, true));
      gemm_args g;
      g.a = &mdy;
      g.ta = 0;
      g.b = &mw;
      g.tb = 0;
      g.c = &mdx;
      g.m = M;
      g.n = K;
      g.k = N;
      g.batch = 1;
      g.alpha = 1.0f;
      g.beta = accumulate ? 1.0f : 0.0f;
      g.epi = CUBLASLT_EPILOGUE_DEFAULT;
      g.bias = nullptr;
      BL_CHECK(gemm(op, dev, g));
      BL_CHECK(mat_sync(op, dx, &mdx, false));
    }
  }
  bool db_done = false;
  if (dw && dw->numel > 0 && M > 0) {
    int odt = out_dtype(dw, cdt);
    mat mx, mdw;
    BL_CHECK(linear_mat(op, x, cdt, &mx, false));
    BL_CHECK(mat_sync(op, x, &mx, true));
    BL_CHECK(linear_mat(op, dw, odt, &mdw, true));
    BL_CHECK(mat_sync(op, dw, &mdw, true)); // accumulating: current values needed in a scratch
    gemm_args g;
    g.a = &mdy;
    g.ta = 1;
    g.b = &mx;
    g.tb = 0;
    g.c = &mdw;
    g.m = N;
    g.n = K;
    g.k = M;
    g.batch = 1;
    g.alpha = 1.0f;
    g.beta = 1.0f;
    g.epi = CUBLASLT_EPILOGUE_DEFAULT;
    g.bias = nullptr;
    // db from the same GEMM: BGRADB sums dy (cuBLASLt's B) over the tokens (its k) into an f32 scratch, which is
    // then added to db (the epilogue overwrites, db accumulates); without the epilogue, the column-sum kernels
    cu_mem part;
    if (db && odt == BL_F32) {
      BL_CHECK(part.alloc(op, dev, (size_t)N * sizeof(float)));
      g.epi = CUBLASLT_EPILOGUE_BGRADB;
      g.bias = part.p;
    }
    int rc = gemm(op, dev, g);
    if (rc == BL_EUNSUPPORTED && g.bias) { // no algorithm with the epilogue: nothing has run yet
      g.epi = CUBLASLT_EPILOGUE_DEFAULT;
      g.bias = nullptr;
      rc = gemm(op, dev, g);
    }
    BL_CHECK(rc);
    BL_CHECK(mat_sync(op, dw, &mdw, false));
    if (g.bias) {
      BL_CHECK(add_into(op, dev, db, part.p, BL_F32));
      db_done = true;
    }
  }
  if (db && !db_done && N > 0 && M > 0) { BL_CHECK(bias_grad(op, dev, dy, M, N, db)); }
  return 0;
}

extern "C" int bl_cuda_linear_dgelu_backward(bl_tensor *dpre, bl_tensor *db, const bl_tensor *dh, const bl_tensor *w2,
                                             const bl_tensor *pre, int tanh_form) {
  const char *op = tanh_form ? "linear_dgelu_tanh_backward" : "linear_dgelu_backward";
  int dev;
  const bl_tensor *ts[] = { dpre, db, dh, w2, pre };
  BL_CHECK(cu_device(op, 5, ts, &dev));
  // dpre[M,N] = (dh[M,N2] @ w2[N2,N]) .* gelu'(pre)
  if (dh->ndim < 1 || w2->ndim != 2 || dh->shape[dh->ndim - 1] != w2->shape[0])
    return bl_set_error(BL_EINVAL, "%s: grad %s and weight are not compatible", op, "dh");
  int64_t M = rows_of(dh), N2 = w2->shape[0], N = w2->shape[1];
  if (rows_of(pre) != M || pre->shape[pre->ndim - 1] != N || dpre->numel != pre->numel ||
      dpre->shape[dpre->ndim - 1] != N)
    return bl_set_error(BL_EINVAL, "%s: pre-activation/grad shapes do not match [%lld, %lld]", op, (long long)M,
                        (long long)N);
  if (db && (db->ndim != 1 || db->shape[0] != N))
    return bl_set_error(BL_EINVAL, "%s: grad_bias must be [%lld]", op, (long long)N);
  if (M == 0 || N == 0) return 0;
  if (N2 == 0) return bl_cuda_tensor_fill(dpre, 0.0);
  int cdt = compute_dtype(dh, w2), odt = out_dtype(dpre, cdt);
  mat mdh, mw, md;
  BL_CHECK(linear_mat(op, dh, cdt, &mdh, false));
  BL_CHECK(mat_sync(op, dh, &mdh, true));
  BL_CHECK(linear_mat(op, w2, cdt, &mw, false));
  BL_CHECK(mat_sync(op, w2, &mw, true));
  BL_CHECK(linear_mat(op, dpre, odt, &md, true));
  // With the tanh GELU: its derivative in the GEMM's epilogue (DGELU, AUX = pre) and, with DGELU_BGRAD, FC1's bias
  // gradient: the column sums of the epilogue's output, written in D's dtype (the bias type cuBLASLt documents for
  // non-fp8 GEMMs) into a scratch that is added to db. An f16 sum over all tokens can overflow where the values do
  // not, so f16 takes DGELU and the column-sum kernel.
  mat mp;
  bool epi = tanh_form && aux_in_place(pre, odt, &mp), bgrad = epi && db && odt != BL_F16;
  cu_mem part;
  if (bgrad) BL_CHECK(part.alloc(op, dev, (size_t)N * bl_dtype_size(odt)));
  gemm_args g;
  g.a = &mdh;
  g.ta = 0;
  g.b = &mw;
  g.tb = 0;
  g.c = &md;
  g.m = M;
  g.n = N;
  g.k = N2;
  g.batch = 1;
  g.alpha = 1.0f;
  g.beta = 0.0f;
  g.epi = bgrad ? CUBLASLT_EPILOGUE_DGELU_BGRAD : epi ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT;
  g.bias = bgrad ? part.p : nullptr;
  if (epi) {
    g.aux = mp.p;
    g.aux_ld = mp.ld;
  }
  int rc = gemm(op, dev, g);
  if (rc == BL_EUNSUPPORTED && epi) { // no algorithm with the epilogue (nothing has run): the plain GEMM
    epi = bgrad = false;
    g.epi = CUBLASLT_EPILOGUE_DEFAULT;
    g.bias = nullptr;
    g.aux = nullptr;
    g.aux_ld = 0;
    rc = gemm(op, dev, g);
  }
  BL_CHECK(rc);
  BL_CHECK(mat_sync(op, dpre, &md, false));
  if (!epi) // the activation's derivative in place
    BL_CHECK(tanh_form ? bl_cuda_gelu_tanh_backward(dpre, nullptr, dpre, pre, nullptr)
                       : bl_cuda_gelu_backward(dpre, dpre, pre));
  if (bgrad) BL_CHECK(add_into(op, dev, db, part.p, odt));
  if (db && !bgrad) BL_CHECK(bias_grad(op, dev, dpre, M, N, db));
  return 0;
}

// ---------------------------------------------------------------- batched matmul (bl_matmul twin)
// A batch operand: the tensor expanded to the output's batch dims; usable in
// place when its batch dims collapse to one stride and its last two dims pass
// inner_in_place; else a contiguous (materialised) scratch.
static int batch_mat(const char *op, const bl_tensor *t, int dt, int nb, const int64_t *bshape, mat *m, bool writable) {
  int nd = t->ndim;
  int64_t r = t->shape[nd - 2], c = t->shape[nd - 1];
  m->rows = r;
  m->cols = c;
  m->dtype = dt;
  int64_t bst[BL_MAX_DIMS];
  for (int d = 0; d < nb; d++) {
    int td = d - (nb - (nd - 2));
    bst[d] = (td < 0 || t->shape[td] == 1) ? 0 : t->stride[td];
  }
  bool ok = t->dtype == dt;
  int64_t stride = 0;
  bool first = true;
  for (int d = nb - 1; d >= 0 && ok; d--) { // collapse batch dims into one stride
    if (bshape[d] == 1) continue;
    if (first) {
      stride = bst[d];
      first = false;
      continue;
    }
    // dim d must continue the progression of the dims inside it
    int64_t inner = 1;
    for (int e = d + 1; e < nb; e++) inner *= bshape[e];
    if (bst[d] != stride * inner) ok = false;
  }
  if (ok && inner_in_place(r, c, t->stride[nd - 2], t->stride[nd - 1], &m->ld, &m->trans) && !(writable && m->trans)) {
    m->p = t->data;
    m->bstride = stride;
    return 0;
  }
  int64_t batch = 1;
  for (int d = 0; d < nb; d++) batch *= bshape[d];
  BL_CHECK(m->mem.alloc(op, t->device, (size_t)(batch * r * c) * bl_dtype_size(dt)));
  m->p = m->mem.p;
  m->ld = c > 0 ? c : 1;
  m->trans = 0;
  m->bstride = r * c;
  return 0;
}

// Expanded contiguous header over m's scratch, shape [bshape..., r, c].
static void batch_header(bl_tensor *h, const mat *m, int nb, const int64_t *bshape, int device) {
  memset(h, 0, sizeof *h);
  h->data = m->mem.p;
  h->ndim = nb + 2;
  h->dtype = m->dtype;
  h->device = device;
  for (int d = 0; d < nb; d++) h->shape[d] = bshape[d];
  h->shape[nb] = m->rows;
  h->shape[nb + 1] = m->cols;
  int64_t s = 1;
  for (int d = nb + 1; d >= 0; d--) {
    h->stride[d] = s;
    s *= h->shape[d];
  }
  h->numel = s;
}

extern "C" int bl_cuda_matmul(bl_tensor *out, const bl_tensor *a, const bl_tensor *b) {
  const char *op = "matmul";
  int dev;
  const bl_tensor *ts[] = { out, a, b };
  BL_CHECK(cu_device(op, 3, ts, &dev));
  char sa[128], sb[128], so[128], se[128];
  if (a->ndim < 2 || b->ndim < 2 || a->shape[a->ndim - 1] != b->shape[b->ndim - 2])
    return bl_set_error(BL_EINVAL, "matmul: shapes %s and %s are not compatible", BL_SHAPE(a, sa), BL_SHAPE(b, sb));
  if (!bl_dtype_is_float(a->dtype) || !bl_dtype_is_float(b->dtype) || !bl_dtype_is_float(out->dtype))
    return bl_set_error(BL_EINVAL, "matmul: floating-point tensors required, got %s and %s", bl_dtype_name(a->dtype),
                        bl_dtype_name(b->dtype));
  int64_t m = a->shape[a->ndim - 2], k = a->shape[a->ndim - 1], n = b->shape[b->ndim - 1];
  int nb;
  int64_t shape[BL_MAX_DIMS];
  if (bl_broadcast_shape(a->ndim - 2, a->shape, b->ndim - 2, b->shape, &nb, shape))
    return bl_set_error(BL_EINVAL, "matmul: batch dims of %s and %s are not compatible", BL_SHAPE(a, sa),
                        BL_SHAPE(b, sb));
  if (nb + 2 > BL_MAX_DIMS) return bl_set_error(BL_EINVAL, "matmul: too many dims");
  shape[nb] = m;
  shape[nb + 1] = n;
  bool ok = out->ndim == nb + 2;
  for (int i = 0; ok && i < nb + 2; i++) ok = out->shape[i] == shape[i];
  if (!ok)
    return bl_set_error(BL_EINVAL, "matmul: output has shape %s, expected %s", BL_SHAPE(out, so),
                        bl_shape_str(nb + 2, shape, se, sizeof se));
  int64_t batch = 1;
  for (int d = 0; d < nb; d++) batch *= shape[d];
  if (out->numel == 0) return 0;
  if (k == 0) return bl_cuda_tensor_fill(out, 0.0);
  if (batch > INT32_MAX)
    return bl_set_error(BL_EUNSUPPORTED, "matmul: cuda:%d: batch of %lld is too large", dev, (long long)batch);
  int cdt = compute_dtype(a, b), odt = out_dtype(out, cdt);
  mat ma, mb, mo;
  BL_CHECK(batch_mat(op, a, cdt, nb, shape, &ma, false));
  BL_CHECK(batch_mat(op, b, cdt, nb, shape, &mb, false));
  BL_CHECK(batch_mat(op, out, odt, nb, shape, &mo, true));
  bl_tensor h;
  if (ma.mem.p) {
    batch_header(&h, &ma, nb, shape, dev);
    BL_CHECK(cu_copy_header(op, dev, &h, a));
  }
  if (mb.mem.p) {
    batch_header(&h, &mb, nb, shape, dev);
    BL_CHECK(cu_copy_header(op, dev, &h, b));
  }
  if (mo.bstride == 0 && batch > 1) { // an output cannot be broadcast: (never true for a valid out) guard anyway
    return bl_set_error(BL_EINVAL, "matmul: output %s has a zero batch stride", BL_SHAPE(out, so));
  }
  gemm_args g;
  g.a = &ma;
  g.ta = 0;
  g.b = &mb;
  g.tb = 0;
  g.c = &mo;
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = batch;
  g.alpha = 1.0f;
  g.beta = 0.0f;
  g.epi = CUBLASLT_EPILOGUE_DEFAULT;
  g.bias = nullptr;
  BL_CHECK(gemm(op, dev, g));
  if (mo.mem.p) {
    batch_header(&h, &mo, nb, shape, dev);
    BL_CHECK(cu_copy_header(op, dev, out, &h));
  }
  return 0;
}
