// Emulated cuBLASLt (see cublasLt.h): D = epilogue(alpha * op(A) op(B) + beta * C)
// on column-major matrices of the emulated device, computed on the host in
// stream order.
//
// Semantics follow NVIDIA's cuBLASLt documentation:
// - op(X) is X or X^T (CUBLASLT_MATMUL_DESC_TRANSA/B); A is m x k after op, B
//   k x n, C and D m x n; every layout has ld >= rows; strided batches
//   (BATCH_COUNT equal on all four layouts, STRIDED_BATCH_OFFSET may be 0).
// - Types: A and B the same (f32, f16 or bf16); C and D the same, f32 or A's
//   type; the product accumulates in f32 (an fma chain over k). Compute
//   CUBLAS_COMPUTE_32F_FAST_TF32 (f32 only) rounds A and B to TF32 first.
//   Scale type f32, alpha/beta on the host; C is not read when beta == 0.
// - Epilogues: BIAS adds bias[row] (after alpha/beta); GELU applies the tanh
//   approximation 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))) (cuBLASLt's GELU,
//   not the exact erf GELU); GELU_AUX(_BIAS) stores the GELU input (after the
//   bias: "output of GELU input matrix in forward pass", EPILOGUE_AUX_POINTER)
//   in the aux matrix; DGELU multiplies by the derivative of that GELU at aux
//   ("input of GELU input matrix for backward pass"); DGELU_BGRAD also writes
//   the row sums of the resulting D (the gradient after the GELU derivative,
//   one per row of D, like the input bias) to the bias pointer; BGRADB writes
//   the sums of op(B) over the k dimension (one per column of D, "the bias
//   gradient of input B") to the bias pointer and leaves D the plain product.
// - The aux matrix has D's shape, its own leading dimension (AUX_LD, in
//   elements) and batch stride, and D's type: AUX_DATA_TYPE may differ only
//   for fp8 outputs (cuBLAS docs, cublasLtMatmulDescAttributes_t). The bias
//   (or bias gradient) vector has D's type: BIAS_DATA_TYPE "the same type as
//   the elements of the output matrix" except IMMA and fp8 kernels, which are
//   not emulated, so another type is INVALID_VALUE here.
// - Documented constraints return the real status: the GELU aux leading
//   dimension must be a multiple of 8 and >= rows, its batch stride a multiple
//   of 8 (INVALID_VALUE); unsupported types/compute/epilogue: NOT_SUPPORTED.
// - The heuristic reads the aux pointer's value for the alignment it must
//   have ("routines that don't dereference this pointer, like
//   cublasLtMatmulAlgoGetHeuristic(), depend on its value to determine
//   expected pointer alignment"): the algorithm records it, and a matmul with
//   a less aligned aux pointer is INVALID_VALUE, as for A-D.
// - Pointers must be aligned to the alignment the algorithm was chosen for
//   (the heuristic's MIN_ALIGNMENT preferences) and to the element size, and
//   every operand must lie inside one allocation of the current emulated
//   device: a stray pointer is reported at the call (a real GPU would fault).
//
// Test seam: BL_EMU_LT_NO_ALGO="164,208" (epilogue numbers, comma-separated) makes the heuristic find no
// algorithm for those epilogues (NOT_SUPPORTED, 0 results), as a cuBLASLt or GPU without them would, so that the
// callers' fallbacks run in tests.
//
// Not emulated: performance, algorithm choice (one algo, no workspace), the
// exact summation order of the hardware, fp8/int8, other epilogues, row-major
// orders, device-pointer alpha/beta. Each error is also printed on stderr
// with its reason (the real library only logs with CUBLASLT_LOG_LEVEL).
#include <cublasLt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>
#include "emu_internal.h"
#include "emu_numeric.h"

struct emu_lt_context {
  int dev;
};
struct emu_lt_desc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t pointer_mode = 0;
  int32_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  uint32_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  const void *bias = nullptr;
  int64_t bias_bstride = 0;
  int32_t bias_type = -1; // -1: D's type
  void *aux = nullptr;
  int64_t aux_ld = 0, aux_bstride = 0;
  int32_t aux_type = -1;
};
struct emu_lt_layout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t order = 0; // CUBLASLT_ORDER_COL
  int32_t batch = 1;
  int64_t bstride = 0;
};
struct emu_lt_pref {
  uint64_t workspace = 0;
  uint32_t align[4] = { 256, 256, 256, 256 }; // A, B, C, D
};

namespace {

const uint64_t kAlgoMagic = 0x656d75636c74616cull;

cublasStatus_t fail(cublasStatus_t s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "emulated cuBLASLt: %s: ", cublasLtGetStatusString(s));
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return s;
}

// Copies an attribute of exactly the documented size.
template <typename T>
cublasStatus_t set_attr(T *field, const void *buf, size_t size, const char *name) {
  if (!buf || size != sizeof(T))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %zu bytes given, %zu expected", name, size, sizeof(T));
  memcpy(field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

bool has(uint32_t epi, uint32_t bits) { return (epi & bits) == bits; }
// Is epilogue e listed in BL_EMU_LT_NO_ALGO (read at each heuristic call, so a test may change it)?
bool no_algo_for(uint32_t e) {
  const char *s = getenv("BL_EMU_LT_NO_ALGO");
  for (char *end = nullptr; s && *s; s = end) {
    unsigned long v = strtoul(s, &end, 10);
    if (end == s) return false;
    if (v == e) return true;
    while (*end == ',' || *end == ' ') end++;
  }
  return false;
}
bool epi_known(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_DEFAULT || e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU ||
         e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
         e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD || e == CUBLASLT_EPILOGUE_BGRADB;
}
bool epi_bias_in(uint32_t e) { return e != CUBLASLT_EPILOGUE_DEFAULT && has(e, CUBLASLT_EPILOGUE_BIAS) && !has(e, 64); }
bool epi_bgrad(uint32_t e) { return e == CUBLASLT_EPILOGUE_DGELU_BGRAD; }
bool epi_bgradb(uint32_t e) { return e == CUBLASLT_EPILOGUE_BGRADB; }
bool epi_aux(uint32_t e) { return has(e, 128); }
bool epi_dgelu(uint32_t e) { return has(e, 64); }
bool epi_gelu(uint32_t e) { return has(e, 32); }

// The problem a descriptor and four layouts describe, validated.
struct problem {
  emu_lt_desc d;
  emu_lt_layout la, lb, lc, ld;
  int64_t m, n, k, batch;
  cudaDataType_t bias_t, aux_t;
};

cublasStatus_t check_layout(const emu_lt_layout *l, const char *name) {
  if (!l) return fail(CUBLAS_STATUS_INVALID_VALUE, "matrix layout %s is NULL", name);
  if (l->order != 0) return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: only column-major order is emulated", name);
  if (l->ld < (int64_t)(l->rows > 1 ? l->rows : 1))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: leading dimension %lld < rows %llu", name, (long long)l->ld,
                (unsigned long long)l->rows);
  if (l->batch < 1) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: batch count %d", name, l->batch);
  if (l->bstride < 0) return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: negative batch stride", name);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t make_problem(const emu_lt_desc *d, const emu_lt_layout *a, const emu_lt_layout *b,
                            const emu_lt_layout *c, const emu_lt_layout *dd, problem *p) {
  if (!d) return fail(CUBLAS_STATUS_INVALID_VALUE, "matmul descriptor is NULL");
  cublasStatus_t s;
  if ((s = check_layout(a, "A")) || (s = check_layout(b, "B")) || (s = check_layout(c, "C")) ||
      (s = check_layout(dd, "D")))
    return s;
  p->d = *d;
  p->la = *a;
  p->lb = *b;
  p->lc = *c;
  p->ld = *dd;
  if (d->scale != CUDA_R_32F) return fail(CUBLAS_STATUS_NOT_SUPPORTED, "scale type %d (only f32 emulated)", d->scale);
  if (d->pointer_mode != 0) return fail(CUBLAS_STATUS_NOT_SUPPORTED, "only host alpha/beta are emulated");
  if (d->compute != CUBLAS_COMPUTE_32F && d->compute != CUBLAS_COMPUTE_32F_FAST_TF32)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, "compute type %d", d->compute);
  for (int32_t t : { d->ta, d->tb })
    if (t != CUBLAS_OP_N && t != CUBLAS_OP_T && t != CUBLAS_OP_C)
      return fail(CUBLAS_STATUS_INVALID_VALUE, "transpose operation %d", t);
  p->m = (int64_t)dd->rows;
  p->n = (int64_t)dd->cols;
  p->k = (int64_t)(d->ta == CUBLAS_OP_N ? a->cols : a->rows);
  uint64_t am = d->ta == CUBLAS_OP_N ? a->rows : a->cols;
  uint64_t bk = d->tb == CUBLAS_OP_N ? b->rows : b->cols, bn = d->tb == CUBLAS_OP_N ? b->cols : b->rows;
  if (am != dd->rows || bn != dd->cols || bk != (uint64_t)p->k || c->rows != dd->rows || c->cols != dd->cols)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "shapes: op(A) %llux%lld, op(B) %llux%llu, C %llux%llu, D %llux%llu",
                (unsigned long long)am, (long long)p->k, (unsigned long long)bk, (unsigned long long)bn,
                (unsigned long long)c->rows, (unsigned long long)c->cols, (unsigned long long)dd->rows,
                (unsigned long long)dd->cols);
  p->batch = dd->batch;
  if (a->batch != dd->batch || b->batch != dd->batch || c->batch != dd->batch)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "batch counts A %d, B %d, C %d, D %d differ", a->batch, b->batch, c->batch,
                dd->batch);
  bool float_ab = a->type == CUDA_R_32F || a->type == CUDA_R_16F || a->type == CUDA_R_16BF;
  if (a->type != b->type || !float_ab) return fail(CUBLAS_STATUS_NOT_SUPPORTED, "A/B types %d/%d", a->type, b->type);
  if (c->type != dd->type || (dd->type != CUDA_R_32F && dd->type != a->type))
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, "C/D types %d/%d with A/B type %d", c->type, dd->type, a->type);
  if (d->compute == CUBLAS_COMPUTE_32F_FAST_TF32 && a->type != CUDA_R_32F)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, "TF32 compute needs f32 A/B");
  if (!epi_known(d->epi)) return fail(CUBLAS_STATUS_NOT_SUPPORTED, "epilogue %u is not emulated", d->epi);
  p->bias_t = d->bias_type < 0 ? dd->type : (cudaDataType_t)d->bias_type;
  p->aux_t = d->aux_type < 0 ? dd->type : (cudaDataType_t)d->aux_type;
  if (epi_bias_in(d->epi) || epi_bgrad(d->epi) || epi_bgradb(d->epi)) {
    if (!d->bias) return fail(CUBLAS_STATUS_INVALID_VALUE, "epilogue %u needs a BIAS_POINTER", d->epi);
    if (p->bias_t != dd->type)
      return fail(CUBLAS_STATUS_INVALID_VALUE, "bias type %d with D type %d (must be D's type)", p->bias_t, dd->type);
  }
  if (epi_aux(d->epi)) {
    if (!d->aux) return fail(CUBLAS_STATUS_INVALID_VALUE, "epilogue %u needs EPILOGUE_AUX_POINTER", d->epi);
    if (d->aux_ld % 8 != 0 || d->aux_ld < p->m)
      return fail(CUBLAS_STATUS_INVALID_VALUE, "GELU aux leading dimension %lld must be a multiple of 8 and >= %lld",
                  (long long)d->aux_ld, (long long)p->m);
    if (p->batch > 1 && (d->aux_bstride % 8 != 0 || d->aux_bstride < 0))
      return fail(CUBLAS_STATUS_INVALID_VALUE, "GELU aux batch stride %lld must be a multiple of 8",
                  (long long)d->aux_bstride);
    if (p->aux_t != dd->type)
      return fail(CUBLAS_STATUS_INVALID_VALUE, "aux type %d with D type %d", p->aux_t, dd->type);
  }
  return CUBLAS_STATUS_SUCCESS;
}

uint64_t fingerprint(const problem &p) {
  return (uint64_t)p.d.compute | (uint64_t)p.la.type << 8 | (uint64_t)p.lc.type << 16 | (uint64_t)p.d.epi << 24 |
         (uint64_t)p.d.ta << 40 | (uint64_t)p.d.tb << 44;
}

bool aligned(const void *p, uint64_t a) { return ((uintptr_t)p % a) == 0; }
// The alignment a pointer's value shows: its lowest set bit, at most 256 bytes.
uint64_t pointer_align(const void *p) {
  uintptr_t a = (uintptr_t)p | 256;
  return (uint64_t)(a & (~a + 1));
}

// Bytes spanned by a strided-batched column-major matrix (0 if empty).
size_t extent(int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t bstride, int esize) {
  if (rows == 0 || cols == 0 || batch == 0) return 0;
  return (size_t)((batch - 1) * bstride + (cols - 1) * ld + rows) * (size_t)esize;
}

cublasStatus_t check_range(int dev, const void *p, size_t bytes, const char *name) {
  if (bytes == 0) return CUBLAS_STATUS_SUCCESS;
  if (!p || !emu_is_device_range(dev, p, bytes))
    return fail(CUBLAS_STATUS_EXECUTION_FAILED,
                "%s (%p, %zu bytes) is not inside one allocation of cuda:%d "
                "(a GPU would fault)",
                name, p, bytes, dev);
  return CUBLAS_STATUS_SUCCESS;
}

const float kGeluK0 = 0.7978845608028654f, kGeluK1 = 0.044715f;
float gelu_tanh(float x) { return 0.5f * x * (1.0f + tanhf(kGeluK0 * (x + kGeluK1 * x * x * x))); }
float dgelu_tanh(float x) {
  float t = tanhf(kGeluK0 * (x + kGeluK1 * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluK0 * (1.0f + 3.0f * kGeluK1 * x * x);
}

// op(X) of one batch item as a dense rows x depth float matrix: out[r*depth + l]
// = op(X)(r, l) when `rows_of_op` (A: r < m, l < k), or op(X)(l, r) (B: r < n).
void unpack(const void *x, const emu_lt_layout &l, int64_t base, int trans, bool a_side, int64_t rows, int64_t depth,
            bool tf32, std::vector<float> &out) {
  out.resize((size_t)(rows * depth));
  for (int64_t r = 0; r < rows; r++)
    for (int64_t q = 0; q < depth; q++) {
      // A: op(A)(r, q); B: op(B)(q, r). Stored element (i, j) is at i + j*ld.
      int64_t i = a_side ? r : q, j = a_side ? q : r;
      int64_t idx = trans == CUBLAS_OP_N ? i + j * l.ld : j + i * l.ld;
      float v = emu_load_f(x, l.type, base + idx);
      out[(size_t)(r * depth + q)] = tf32 ? emu_round_tf32(v) : v;
    }
}

void run(const problem &p, float alpha, float beta, const void *A, const void *B, const void *C, void *D) {
  bool tf32 = p.d.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  std::vector<float> a, b, rowsum;
  for (int64_t bi = 0; bi < p.batch; bi++) {
    unpack(A, p.la, bi * p.la.bstride, p.d.ta, true, p.m, p.k, tf32, a);
    unpack(B, p.lb, bi * p.lb.bstride, p.d.tb, false, p.n, p.k, tf32, b);
    rowsum.assign((size_t)p.m, 0.0f);
    for (int64_t j = 0; j < p.n; j++)
      for (int64_t i = 0; i < p.m; i++) {
        const float *ar = &a[(size_t)(i * p.k)], *bc = &b[(size_t)(j * p.k)];
        float acc = 0.0f;
        for (int64_t l = 0; l < p.k; l++) acc = fmaf(ar[l], bc[l], acc);
        float t = alpha * acc;
        if (beta != 0.0f) t += beta * emu_load_f(C, p.lc.type, bi * p.lc.bstride + i + j * p.lc.ld);
        if (epi_bias_in(p.d.epi)) t += emu_load_f(p.d.bias, p.bias_t, bi * p.d.bias_bstride + i);
        int64_t ai = bi * p.d.aux_bstride + i + j * p.d.aux_ld;
        if (epi_dgelu(p.d.epi)) {
          t *= dgelu_tanh(emu_load_f(p.d.aux, p.aux_t, ai));
        } else if (epi_gelu(p.d.epi)) {
          if (epi_aux(p.d.epi)) emu_store_f(p.d.aux, p.aux_t, ai, t);
          t = gelu_tanh(t);
        }
        emu_store_f(D, p.ld.type, bi * p.ld.bstride + i + j * p.ld.ld, t);
        rowsum[(size_t)i] += t;
      }
    if (epi_bgrad(p.d.epi))
      for (int64_t i = 0; i < p.m; i++)
        emu_store_f((void *)p.d.bias, p.bias_t, bi * p.d.bias_bstride + i, rowsum[(size_t)i]);
    if (epi_bgradb(p.d.epi))
      for (int64_t j = 0; j < p.n; j++) {
        float t = 0.0f;
        for (int64_t l = 0; l < p.k; l++) t += b[(size_t)(j * p.k + l)];
        emu_store_f((void *)p.d.bias, p.bias_t, bi * p.d.bias_bstride + j, t);
      }
  }
}

} // namespace

extern "C" {

const char *cublasLtGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
  if (!h) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate: handle pointer is NULL");
  *h = new emu_lt_context{ emu_current_device() };
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  if (!h) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy: NULL handle");
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale) {
  if (!d) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate: NULL descriptor pointer");
  *d = new emu_lt_desc;
  (*d)->compute = compute;
  (*d)->scale = scale;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size) {
  if (!d) return fail(CUBLAS_STATUS_INVALID_VALUE, "matmul descriptor is NULL");
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return set_attr((int32_t *)&d->compute, buf, size, "COMPUTE_TYPE");
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return set_attr((int32_t *)&d->scale, buf, size, "SCALE_TYPE");
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return set_attr(&d->pointer_mode, buf, size, "POINTER_MODE");
    case CUBLASLT_MATMUL_DESC_TRANSA: return set_attr(&d->ta, buf, size, "TRANSA");
    case CUBLASLT_MATMUL_DESC_TRANSB: return set_attr(&d->tb, buf, size, "TRANSB");
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set_attr(&d->epi, buf, size, "EPILOGUE");
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set_attr(&d->bias, buf, size, "BIAS_POINTER");
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: return set_attr(&d->bias_bstride, buf, size, "BIAS_BATCH_STRIDE");
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set_attr(&d->bias_type, buf, size, "BIAS_DATA_TYPE");
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return set_attr(&d->aux, buf, size, "EPILOGUE_AUX_POINTER");
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return set_attr(&d->aux_ld, buf, size, "EPILOGUE_AUX_LD");
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE:
      return set_attr(&d->aux_bstride, buf, size, "EPILOGUE_AUX_BATCH_STRIDE");
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return set_attr(&d->aux_type, buf, size, "AUX_DATA_TYPE");
    default: break;
  }
  return fail(CUBLAS_STATUS_INVALID_VALUE, "matmul descriptor attribute %d is not emulated", (int)attr);
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  if (!l) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate: NULL layout pointer");
  if (emu_type_size(type) == 0) return fail(CUBLAS_STATUS_INVALID_VALUE, "layout type %d", type);
  *l = new emu_lt_layout{ type, rows, cols, ld };
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t size) {
  if (!l) return fail(CUBLAS_STATUS_INVALID_VALUE, "matrix layout is NULL");
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return set_attr((uint32_t *)&l->type, buf, size, "LAYOUT_TYPE");
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return set_attr(&l->order, buf, size, "LAYOUT_ORDER");
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return set_attr(&l->rows, buf, size, "LAYOUT_ROWS");
    case CUBLASLT_MATRIX_LAYOUT_COLS: return set_attr(&l->cols, buf, size, "LAYOUT_COLS");
    case CUBLASLT_MATRIX_LAYOUT_LD: return set_attr(&l->ld, buf, size, "LAYOUT_LD");
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return set_attr(&l->batch, buf, size, "BATCH_COUNT");
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return set_attr(&l->bstride, buf, size, "STRIDED_BATCH_OFFSET");
  }
  return fail(CUBLAS_STATUS_INVALID_VALUE, "matrix layout attribute %d is not emulated", (int)attr);
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
  if (!p) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate: NULL pointer");
  *p = new emu_lt_pref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t size) {
  if (!p) return fail(CUBLAS_STATUS_INVALID_VALUE, "matmul preference is NULL");
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: {
      uint32_t mode;
      return set_attr(&mode, buf, size, "SEARCH_MODE");
    }
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return set_attr(&p->workspace, buf, size, "MAX_WORKSPACE_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return set_attr(&p->align[0], buf, size, "MIN_ALIGNMENT_A");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return set_attr(&p->align[1], buf, size, "MIN_ALIGNMENT_B");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return set_attr(&p->align[2], buf, size, "MIN_ALIGNMENT_C");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return set_attr(&p->align[3], buf, size, "MIN_ALIGNMENT_D");
  }
  return fail(CUBLAS_STATUS_INVALID_VALUE, "matmul preference attribute %d is not emulated", (int)attr);
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t *results, int *returned) {
  if (!h) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "heuristic: NULL handle");
  if (!pref || !results || !returned || requested < 1)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "heuristic: NULL preference/results or %d results requested", requested);
  *returned = 0;
  problem p;
  cublasStatus_t s = make_problem(desc, a, b, c, d, &p);
  if (s) return s;
  if (no_algo_for(p.d.epi))
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, "no algorithm for epilogue %u (BL_EMU_LT_NO_ALGO)", p.d.epi);
  int ab = emu_type_size(p.la.type), cd = emu_type_size(p.lc.type);
  const int esize[4] = { ab, ab, cd, cd };
  for (int i = 0; i < 4; i++) {
    uint32_t al = pref->align[i];
    // No kernel works on operands less aligned than their elements.
    if (al == 0 || (al & (al - 1)) || al < (uint32_t)esize[i])
      return fail(CUBLAS_STATUS_NOT_SUPPORTED, "no algorithm for a %u-byte minimum alignment of %c", al, "ABCD"[i]);
  }
  memset(results, 0, sizeof *results);
  cublasLtMatmulAlgo_t &algo = results->algo;
  algo.data[0] = kAlgoMagic;
  algo.data[1] = fingerprint(p);
  for (int i = 0; i < 4; i++) algo.data[2 + i] = pref->align[i];
  algo.data[6] = epi_aux(p.d.epi) ? pointer_align(p.d.aux) : 0;
  results->workspaceSize = 0;
  results->state = CUBLAS_STATUS_SUCCESS;
  results->wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t adesc, const void *B, cublasLtMatrixLayout_t bdesc,
                              const void *beta, const void *C, cublasLtMatrixLayout_t cdesc, void *D,
                              cublasLtMatrixLayout_t ddesc, const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  if (!h) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "matmul: NULL handle");
  if (!alpha || !beta) return fail(CUBLAS_STATUS_INVALID_VALUE, "matmul: alpha or beta is NULL");
  problem p;
  cublasStatus_t s = make_problem(desc, adesc, bdesc, cdesc, ddesc, &p);
  if (s) return s;
  float fa, fb;
  memcpy(&fa, alpha, 4);
  memcpy(&fb, beta, 4);
  uint64_t al[4] = { 256, 256, 256, 256 }; // a NULL algo: cuBLASLt picks one itself
  if (algo) {
    if (algo->data[0] != kAlgoMagic || algo->data[1] != fingerprint(p))
      return fail(CUBLAS_STATUS_INVALID_VALUE, "matmul: the algo comes from a heuristic for other types/epilogue");
    for (int i = 0; i < 4; i++) al[i] = algo->data[2 + i];
  }
  int ab = emu_type_size(p.la.type), cd = emu_type_size(p.lc.type);
  const void *ptr[4] = { A, B, C, D };
  const int esize[4] = { ab, ab, cd, cd };
  for (int i = 0; i < 4; i++) {
    if (i == 2 && fb == 0.0f) continue; // C is not read
    uint64_t need = algo ? al[i] : (uint64_t)esize[i];
    if (!aligned(ptr[i], need))
      return fail(CUBLAS_STATUS_INVALID_VALUE, "matmul: %c=%p is not %llu-byte aligned as the algorithm requires",
                  "ABCD"[i], ptr[i], (unsigned long long)need);
  }
  int dev = emu_current_device();
  const emu_lt_layout *ls[4] = { &p.la, &p.lb, &p.lc, &p.ld };
  const char *names[4] = { "A", "B", "C", "D" };
  for (int i = 0; i < 4; i++) {
    if (i == 2 && fb == 0.0f) continue;
    size_t bytes = extent((int64_t)ls[i]->rows, (int64_t)ls[i]->cols, ls[i]->ld, p.batch, ls[i]->bstride, esize[i]);
    if ((s = check_range(dev, ptr[i], bytes, names[i]))) return s;
  }
  if (epi_bias_in(p.d.epi) || epi_bgrad(p.d.epi) || epi_bgradb(p.d.epi)) {
    int64_t len = epi_bgradb(p.d.epi) ? p.n : p.m; // BGRADB: one per column of D
    size_t bytes = extent(len, 1, len, p.batch, p.d.bias_bstride, emu_type_size(p.bias_t));
    if ((s = check_range(dev, p.d.bias, bytes, "bias"))) return s;
  }
  if (epi_aux(p.d.epi)) {
    uint64_t need = algo ? algo->data[6] : (uint64_t)emu_type_size(p.aux_t);
    if (need < (uint64_t)emu_type_size(p.aux_t)) need = (uint64_t)emu_type_size(p.aux_t);
    if (!aligned(p.d.aux, need))
      return fail(CUBLAS_STATUS_INVALID_VALUE, "matmul: aux=%p is not %llu-byte aligned as the algorithm requires",
                  p.d.aux, (unsigned long long)need);
    size_t bytes = extent(p.m, p.n, p.d.aux_ld, p.batch, p.d.aux_bstride, emu_type_size(p.aux_t));
    if ((s = check_range(dev, p.d.aux, bytes, "aux"))) return s;
  }
  if (workspace_bytes && (s = check_range(dev, workspace, workspace_bytes, "workspace"))) return s;
  emu_stream_enqueue(stream, "cublasLtMatmul", [p, fa, fb, A, B, C, D] { run(p, fa, fb, A, B, C, D); });
  return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
