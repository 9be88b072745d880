// Self-test of the emulated cuBLASLt (tests/emu/emu_cublaslt.cpp) against an
// independent reference: OpenBLAS sgemm on the same storage read row-major
// (a column-major X is the row-major X^T, so D = op(A) op(B) is computed as
// D^T = op(B)^T op(A)^T), epilogues in double. Random non-zero inputs, odd
// sizes, padded leading dimensions, every emulated epilogue, strided batches,
// f32/bf16/f16 storage, TF32, and the documented error statuses.
//
// Runs against the emulated-device test double (emu_double.cpp): no fibers
// are needed, the library's own logic is what is tested here.
#include <cblas.h>
#include <cublasLt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>
#include "emu_double.h"
#include "emu_numeric.h"

static int g_fail = 0, g_checks = 0;
#define CHECK(cond, ...)                                   \
  do {                                                     \
    g_checks++;                                            \
    if (!(cond)) {                                         \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fputc('\n', stderr);                                 \
      g_fail++;                                            \
    }                                                      \
  } while (0)

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double urand() { // uniform in [-1, 1), never exactly 0 after the nudge
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  double u = (double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
  return u == 0.0 ? 0.5 : u;
}

// "Device" memory of the test double: 256-byte aligned, registered, NaN-filled
// (bytes 0xff) so unread padding that is read shows up.
struct dmem {
  void *p = nullptr;
  size_t n = 0;
  explicit dmem(size_t bytes) : n(bytes ? bytes : 1) {
    p = aligned_alloc(256, (n + 255) / 256 * 256);
    memset(p, 0xff, n);
    emu_double_register(p, n);
  }
  ~dmem() {
    emu_double_unregister(p);
    free(p);
  }
  dmem(const dmem &) = delete;
  dmem &operator=(const dmem &) = delete;
};

// ---------------------------------------------------------------- conversions
static double bf16_ref(double x) { // round to 8 significant bits, ties to even
  if (x == 0 || !isfinite(x)) return x;
  int e;
  frexp(x, &e);
  return ldexp(nearbyint(ldexp(x, 8 - e)), e - 8);
}
static float tf32_ref(float x) { // 11 significant bits, ties away from zero
  if (x == 0 || !isfinite(x)) return x;
  int e;
  frexpf(x, &e);
  return (float)ldexp(round(ldexp((double)x, 11 - e)), e - 11);
}

static void test_conversions() {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) { // every f16 pattern, both directions
    _Float16 v;
    uint16_t hb = (uint16_t)h;
    memcpy(&v, &hb, 2);
    float f = emu_f16_to_f32(hb), ref = (float)v;
    if (!(f == ref || (isnan(f) && isnan(ref)))) bad++;
    if (!isnan(ref) && emu_f32_to_f16(ref) != hb) bad++;
  }
  for (int i = 0; i < 200000; i++) { // random f32 over f16's range, incl. subnormals and overflow
    float x = (float)(urand() * ldexp(1.0, (int)(urand() * 20)));
    _Float16 r = (_Float16)x;
    uint16_t rb;
    memcpy(&rb, &r, 2);
    if (emu_f32_to_f16(x) != rb) bad++;
    if (emu_bf16_to_f32(emu_f32_to_bf16(x)) != (float)bf16_ref(x)) bad++;
    if (emu_round_tf32(x) != tf32_ref(x)) bad++;
  }
  CHECK(bad == 0, "%d f16/bf16/tf32 conversion mismatches", bad);
}

// ---------------------------------------------------------------- matmul cases
static double gelu_t(double x) { return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
static double dgelu_t(double x) {
  double t = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}

struct gcase {
  int m, n, k, ta, tb;
  cudaDataType_t tab, tcd;
  cublasLtEpilogue_t epi;
  int batch = 1;
  bool bcast_b = false; // B batch stride 0
  float alpha = 1, beta = 0;
  bool tf32 = false;
  int pad = 0; // extra leading-dimension rows
};

// Column-major storage of a rows x cols matrix (+ batch), values quantized to its type.
struct mat {
  int rows, cols, ld, batch;
  int64_t bstride;
  cudaDataType_t t;
  std::vector<float> h; // host image, padding 0
  dmem *d;
  mat(int r, int c, int pad, int b, bool bcast, cudaDataType_t type, bool fill)
      : rows(r), cols(c), ld(r + pad), batch(b), t(type) {
    bstride = bcast ? 0 : (int64_t)ld * c + 8; // gap between items: never read
    size_t n = (size_t)(bstride * (b - 1) + (int64_t)ld * c);
    h.assign(n, 0.0f);
    d = new dmem(n * emu_type_size(t));
    if (!fill) return;
    for (int bi = 0; bi < (bcast ? 1 : b); bi++)
      for (int j = 0; j < c; j++)
        for (int i = 0; i < r; i++) {
          int64_t idx = bi * bstride + i + (int64_t)j * ld;
          emu_store_f(d->p, t, idx, (float)urand());
          h[idx] = emu_load_f(d->p, t, idx);
        }
  }
  ~mat() { delete d; }
  float at(int bi, int i, int j) const { return emu_load_f(d->p, t, bi * bstride + i + (int64_t)j * ld); }
};

static double out_ulp(cudaDataType_t t) { // half an ulp, relative
  return t == CUDA_R_32F ? ldexp(1, -24) : t == CUDA_R_16BF ? ldexp(1, -8) : ldexp(1, -11);
}

static cublasLtMatrixLayout_t layout(const mat &x) {
  cublasLtMatrixLayout_t l;
  cublasLtMatrixLayoutCreate(&l, x.t, x.rows, x.cols, x.ld);
  if (x.batch > 1) {
    int32_t bc = x.batch;
    cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
    cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &x.bstride, sizeof x.bstride);
  }
  return l;
}

static void run_case(cublasLtHandle_t h, const gcase &c, const char *name) {
  int ar = c.ta ? c.k : c.m, ac = c.ta ? c.m : c.k, br = c.tb ? c.n : c.k, bc = c.tb ? c.k : c.n;
  mat A(ar, ac, c.pad, c.batch, false, c.tab, true), B(br, bc, c.pad + 1, c.batch, c.bcast_b, c.tab, true);
  mat C(c.m, c.n, c.pad, c.batch, false, c.tcd, true), D(c.m, c.n, c.pad, c.batch, false, c.tcd, false);
  bool aux = c.epi & 128, dgelu = c.epi & 64, gelu = (c.epi & 32) != 0, bias_in = (c.epi & 4) && !dgelu;
  bool bgrad = c.epi == CUBLASLT_EPILOGUE_DGELU_BGRAD;
  int auxld = (c.m + 7) / 8 * 8 + 8;
  mat X(auxld, c.n, 0, c.batch, false, c.tcd, dgelu); // aux: input of DGELU, output of GELU_AUX
  X.rows = c.m;
  mat bias(c.m, 1, 0, c.batch, false, c.tcd, bias_in);
  // the reference product: D^T = op(B)^T op(A)^T, row-major, on the same storage
  std::vector<float> ref(D.h.size(), 0.0f), Ah = A.h, Bh = B.h;
  if (c.tf32)
    for (float *v : { Ah.data(), Bh.data() })
      for (size_t i = 0; i < (v == Ah.data() ? Ah.size() : Bh.size()); i++) v[i] = tf32_ref(v[i]);
  for (int bi = 0; bi < c.batch; bi++)
    cblas_sgemm(CblasRowMajor, c.tb ? CblasTrans : CblasNoTrans, c.ta ? CblasTrans : CblasNoTrans, c.n, c.m, c.k, 1.0f,
                Bh.data() + bi * B.bstride, B.ld, Ah.data() + bi * A.bstride, A.ld, 0.0f, ref.data() + bi * D.bstride,
                D.ld);

  cublasLtMatmulDesc_t desc;
  cublasLtMatmulDescCreate(&desc, c.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasOperation_t oa = c.ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = c.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa);
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob);
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &c.epi, sizeof c.epi);
  if (bias_in || bgrad) {
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias.d->p, sizeof(void *));
    int64_t bs = bias.bstride;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &bs, sizeof bs);
  }
  if (aux) {
    int64_t ld = auxld, bs = X.bstride;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &X.d->p, sizeof(void *));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &bs, sizeof bs);
  }
  cublasLtMatrixLayout_t la = layout(A), lb = layout(B), lc = layout(C), ld = layout(D);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulHeuristicResult_t res;
  int nres = 0;
  cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, ld, pref, 1, &res, &nres);
  CHECK(s == CUBLAS_STATUS_SUCCESS && nres == 1, "%s: heuristic %s, %d results", name, cublasLtGetStatusString(s),
        nres);
  s = cublasLtMatmul(h, desc, &c.alpha, A.d->p, la, B.d->p, lb, &c.beta, C.d->p, lc, D.d->p, ld, &res.algo, nullptr, 0,
                     nullptr);
  CHECK(s == CUBLAS_STATUS_SUCCESS, "%s: matmul %s", name, cublasLtGetStatusString(s));

  // Error bound: both sides accumulate k products in f32 (|err| <= k u sum|ab| each), the epilogue adds a
  // few f32 roundings and tanhf's error (GELU and its derivative have slopes below 1.2), and the output
  // is rounded to its type.
  const double u = ldexp(1, -24);
  int bad = 0, big = 0;
  double worst = 0;
  for (int bi = 0; bi < c.batch; bi++) {
    std::vector<double> rowsum(c.m, 0.0), rowtol(c.m, 0.0);
    for (int j = 0; j < c.n; j++)
      for (int i = 0; i < c.m; i++) {
        double mag = 0;
        for (int l = 0; l < c.k; l++) {
          double av = c.ta ? Ah[bi * A.bstride + l + (int64_t)i * A.ld] : Ah[bi * A.bstride + i + (int64_t)l * A.ld];
          double bv = c.tb ? Bh[bi * B.bstride + j + (int64_t)l * B.ld] : Bh[bi * B.bstride + l + (int64_t)j * B.ld];
          mag += fabs(av * bv);
        }
        int64_t di = bi * D.bstride + i + (int64_t)j * D.ld;
        double cv = C.at(bi, i, j), t = (double)c.alpha * ref[di] + (c.beta != 0 ? c.beta * cv : 0.0);
        double tol = 2 * c.k * u * mag * fabs(c.alpha) + 4 * u * (fabs(t) + fabs(c.beta * cv));
        if (bias_in) {
          t += bias.at(bi, i, 0);
          tol += 2 * u * fabs(t);
        }
        double want = t;
        if (dgelu) {
          double g = dgelu_t(X.at(bi, i, j));
          want = t * g;
          tol = tol * 1.2 + 16 * u * fabs(t);
        } else if (gelu) {
          if (aux) {
            double got = X.at(bi, i, j), atol = tol + out_ulp(c.tcd) * fabs(t);
            if (!(fabs(got - t) <= atol)) bad++;
          }
          want = gelu_t(t);
          tol = tol * 1.2 + 16 * u * (fabs(t) + 1);
        }
        double got = D.at(bi, i, j);
        tol += out_ulp(c.tcd) * fabs(want) + (c.tcd == CUDA_R_16F ? ldexp(1, -25) : 0);
        if (!(fabs(got - want) <= tol)) bad++;
        if (fabs(want) > 10 * tol) big++;
        worst = fmax(worst, fabs(got - want) / tol);
        rowsum[i] += want;
        rowtol[i] += tol + fabs(want) * 2 * c.n * u;
      }
    if (bgrad)
      for (int i = 0; i < c.m; i++) {
        double got = bias.at(bi, i, 0);
        if (!(fabs(got - rowsum[i]) <= rowtol[i] + out_ulp(c.tcd) * fabs(rowsum[i]))) bad++;
      }
  }
  CHECK(bad == 0, "%s: %d elements outside the error bound (worst %.2f x bound)", name, bad, worst);
  CHECK(big > c.m * c.n * c.batch / 2, "%s: only %d results clearly above their tolerance", name, big);
  if (c.tf32) { // the rounding must matter: the exact-f32 product differs somewhere
    std::vector<float> exact(D.h.size(), 0.0f);
    cblas_sgemm(CblasRowMajor, c.tb ? CblasTrans : CblasNoTrans, c.ta ? CblasTrans : CblasNoTrans, c.n, c.m, c.k, 1.0f,
                B.h.data(), B.ld, A.h.data(), A.ld, 0.0f, exact.data(), D.ld);
    int differ = 0;
    for (int j = 0; j < c.n; j++)
      for (int i = 0; i < c.m; i++)
        if (fabs(exact[i + (size_t)j * D.ld] - D.at(0, i, j)) > 1e-4) differ++;
    CHECK(differ > 0, "%s: TF32 result equals the f32 product everywhere", name);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
}

static void test_matmul(cublasLtHandle_t h) {
  const cudaDataType_t F = CUDA_R_32F, H = CUDA_R_16F, BF = CUDA_R_16BF;
  struct named {
    const char *name;
    gcase c;
  };
  std::vector<named> cases;
  auto add = [&](const char *name, gcase c) { cases.push_back({ name, c }); };
  add("f32 NN default", { 7, 5, 3, 0, 0, F, F, CUBLASLT_EPILOGUE_DEFAULT });
  add("f32 TN bias padded", { 17, 13, 29, 1, 0, F, F, CUBLASLT_EPILOGUE_BIAS, 1, false, 1, 0, false, 3 });
  add("f32 NT gelu_aux_bias", { 33, 9, 64, 0, 1, F, F, CUBLASLT_EPILOGUE_GELU_AUX_BIAS });
  add("f32 TT dgelu", { 5, 31, 17, 1, 1, F, F, CUBLASLT_EPILOGUE_DGELU, 1, false, 1, 0, false, 2 });
  add("f32 alpha beta C!=D", { 19, 23, 41, 0, 1, F, F, CUBLASLT_EPILOGUE_DEFAULT, 1, false, 0.5f, 0.75f });
  add("f32 gelu", { 9, 12, 10, 0, 0, F, F, CUBLASLT_EPILOGUE_GELU });
  add("f32 gelu_bias", { 10, 3, 70, 1, 0, F, F, CUBLASLT_EPILOGUE_GELU_BIAS });
  add("f32 gelu_aux", { 11, 6, 5, 0, 0, F, F, CUBLASLT_EPILOGUE_GELU_AUX });
  add("f32 dgelu_bgrad", { 13, 21, 8, 0, 1, F, F, CUBLASLT_EPILOGUE_DGELU_BGRAD });
  add("bf16->bf16 gelu_aux_bias", { 24, 19, 45, 0, 1, BF, BF, CUBLASLT_EPILOGUE_GELU_AUX_BIAS });
  add("bf16->f32 bias", { 15, 7, 33, 1, 0, BF, F, CUBLASLT_EPILOGUE_BIAS, 1, false, 1, 0, false, 1 });
  add("bf16 dgelu beta", { 8, 16, 24, 0, 0, BF, BF, CUBLASLT_EPILOGUE_DGELU, 1, false, 1, 1 });
  add("f16->f16 dgelu_bgrad", { 12, 10, 19, 1, 1, H, H, CUBLASLT_EPILOGUE_DGELU_BGRAD });
  add("f16->f32 gelu_bias", { 21, 5, 37, 0, 0, H, F, CUBLASLT_EPILOGUE_GELU_BIAS });
  add("f32 batched bcast B", { 6, 11, 13, 0, 0, F, F, CUBLASLT_EPILOGUE_DEFAULT, 3, true });
  add("bf16 batched gelu_aux_bias", { 9, 7, 20, 1, 0, BF, BF, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 4, false });
  add("f16 batched TT beta", { 5, 6, 7, 1, 1, H, H, CUBLASLT_EPILOGUE_DEFAULT, 2, true, 2, -1 });
  add("f32 tf32", { 16, 12, 96, 0, 1, F, F, CUBLASLT_EPILOGUE_DEFAULT, 1, false, 1, 0, true });
  add("f32 tf32 batched bias", { 7, 9, 50, 1, 0, F, F, CUBLASLT_EPILOGUE_BIAS, 2, false, 1, 0, true });
  for (auto &c : cases) run_case(h, c.c, c.name);
}

// ---------------------------------------------------------------- documented errors
struct setup {
  dmem a{ 4096 }, b{ 4096 }, c{ 4096 }, aux{ 8192 };
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulPreference_t pref;
  setup(int m, int n, int k, cudaDataType_t ta, cudaDataType_t tb, cublasComputeType_t ct) {
    cublasLtMatmulDescCreate(&desc, ct, CUDA_R_32F);
    cublasLtMatrixLayoutCreate(&la, ta, m, k, m);
    cublasLtMatrixLayoutCreate(&lb, tb, k, n, k);
    cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, m, n, m);
    cublasLtMatmulPreferenceCreate(&pref);
  }
  ~setup() {
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
  }
  cublasStatus_t heuristic(cublasLtHandle_t h, cublasLtMatmulHeuristicResult_t *r) {
    int n = 0;
    return cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, 1, r, &n);
  }
  cublasStatus_t matmul(cublasLtHandle_t h, const void *A, const void *B, const void *C, void *D,
                        const cublasLtMatmulAlgo_t *algo, float beta = 0) {
    float alpha = 1;
    return cublasLtMatmul(h, desc, &alpha, A, la, B, lb, &beta, C, lc, D, lc, algo, nullptr, 0, nullptr);
  }
};

static void test_errors(cublasLtHandle_t h) {
  cublasLtMatmulHeuristicResult_t r;
  { // GELU aux leading dimension: a multiple of 8, >= rows
    setup s(20, 4, 6, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F);
    cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_GELU_AUX;
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &s.aux.p, sizeof(void *));
    for (int64_t ld : { 20, 12, 0 }) {
      cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
      CHECK(s.heuristic(h, &r) == CUBLAS_STATUS_INVALID_VALUE, "aux ld %lld accepted by the heuristic", (long long)ld);
      CHECK(s.matmul(h, s.a.p, s.b.p, nullptr, s.c.p, nullptr) == CUBLAS_STATUS_INVALID_VALUE,
            "aux ld %lld accepted by matmul", (long long)ld);
    }
    int64_t ld = 24;
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
    CHECK(s.heuristic(h, &r) == CUBLAS_STATUS_SUCCESS, "aux ld 24 refused");
    int32_t bc = 2;
    int64_t bs = 20 * 24 + 4; // aux batch stride must be a multiple of 8 too
    for (cublasLtMatrixLayout_t l : { s.la, s.lb, s.lc })
      cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &bs, sizeof bs);
    CHECK(s.heuristic(h, &r) == CUBLAS_STATUS_INVALID_VALUE, "aux batch stride %lld accepted", (long long)bs);
  }
  { // the heuristic reads the aux pointer's alignment (cublasLt.h, EPILOGUE_AUX_POINTER): a matmul with that
    // algorithm and a less aligned aux fails; the bias vector has D's type (BIAS_DATA_TYPE: non-fp8 GEMMs)
    setup s(8, 4, 6, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F);
    cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_GELU_AUX;
    int64_t ld = 8;
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &s.aux.p, sizeof(void *));
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
    CHECK(s.heuristic(h, &r) == CUBLAS_STATUS_SUCCESS, "gelu_aux refused");
    cublasLtMatmulAlgo_t algo = r.algo;
    CHECK(s.matmul(h, s.a.p, s.b.p, nullptr, s.c.p, &algo) == CUBLAS_STATUS_SUCCESS, "aligned aux refused");
    void *off = (char *)s.aux.p + 4;
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &off, sizeof off);
    CHECK(s.matmul(h, s.a.p, s.b.p, nullptr, s.c.p, &algo) == CUBLAS_STATUS_INVALID_VALUE,
          "an aux less aligned than the heuristic saw was accepted");
    CHECK(s.heuristic(h, &r) == CUBLAS_STATUS_SUCCESS, "4-byte aligned aux refused by the heuristic");
    algo = r.algo;
    CHECK(s.matmul(h, s.a.p, s.b.p, nullptr, s.c.p, &algo) == CUBLAS_STATUS_SUCCESS, "aux as the heuristic saw it");
    e = CUBLASLT_EPILOGUE_BIAS;
    int32_t bt = CUDA_R_16BF;
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &s.aux.p, sizeof(void *));
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
    CHECK(s.heuristic(h, &r) == CUBLAS_STATUS_INVALID_VALUE, "a bf16 bias with an f32 D accepted");
  }
  { // alignment the algorithm was chosen for; out-of-range operands; shape mismatch; unread C
    setup s(4, 4, 4, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F);
    uint32_t al = 16;
    cublasLtMatmulPreferenceSetAttribute(s.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al);
    CHECK(s.heuristic(h, &r) == CUBLAS_STATUS_SUCCESS, "16-byte alignment refused");
    CHECK(s.matmul(h, (char *)s.a.p + 4, s.b.p, nullptr, s.c.p, &r.algo) == CUBLAS_STATUS_INVALID_VALUE,
          "A misaligned for its algorithm accepted");
    CHECK(s.matmul(h, (char *)s.a.p + 4, s.b.p, nullptr, s.c.p, nullptr) == CUBLAS_STATUS_SUCCESS,
          "4-byte aligned A refused without an algo");
    al = 2;
    cublasLtMatmulPreferenceSetAttribute(s.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al);
    CHECK(s.heuristic(h, &r) == CUBLAS_STATUS_NOT_SUPPORTED, "2-byte alignment of f32 A accepted");
    float host[16] = { 0 };
    CHECK(s.matmul(h, host, s.b.p, nullptr, s.c.p, nullptr) == CUBLAS_STATUS_EXECUTION_FAILED, "host A accepted");
    CHECK(s.matmul(h, (char *)s.a.p + 4096 - 32, s.b.p, nullptr, s.c.p, nullptr) == CUBLAS_STATUS_EXECUTION_FAILED,
          "A past its allocation accepted");
    CHECK(s.matmul(h, s.a.p, s.b.p, host, s.c.p, nullptr, 1.0f) == CUBLAS_STATUS_EXECUTION_FAILED,
          "host C with beta accepted");
    memset(s.a.p, 0, 64);
    memset(s.b.p, 0, 64); // C full of NaN is not read when beta == 0
    CHECK(s.matmul(h, s.a.p, s.b.p, s.aux.p, s.c.p, nullptr) == CUBLAS_STATUS_SUCCESS, "beta = 0 matmul failed");
    CHECK(((float *)s.c.p)[5] == 0.0f, "C read although beta == 0");
    cublasLtMatrixLayout_t bad;
    cublasLtMatrixLayoutCreate(&bad, CUDA_R_32F, 5, 4, 5);
    float alpha = 1, beta = 0;
    CHECK(cublasLtMatmul(h, s.desc, &alpha, s.a.p, bad, s.b.p, s.lb, &beta, s.c.p, s.lc, s.c.p, s.lc, nullptr, nullptr,
                         0, nullptr) == CUBLAS_STATUS_INVALID_VALUE,
          "5x4 A with 4x4 D accepted");
    cublasLtMatrixLayoutDestroy(bad);
    cublasLtMatrixLayoutCreate(&bad, CUDA_R_32F, 4, 4, 3);
    CHECK(cublasLtMatmul(h, s.desc, &alpha, s.a.p, bad, s.b.p, s.lb, &beta, s.c.p, s.lc, s.c.p, s.lc, nullptr, nullptr,
                         0, nullptr) == CUBLAS_STATUS_INVALID_VALUE,
          "ld 3 < rows 4 accepted");
    cublasLtMatrixLayoutDestroy(bad);
    cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS; // bias epilogue without a bias pointer
    cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
    CHECK(s.matmul(h, s.a.p, s.b.p, nullptr, s.c.p, nullptr) == CUBLAS_STATUS_INVALID_VALUE, "BIAS without bias");
    int32_t wrong_size = 1;
    CHECK(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &wrong_size, 4) ==
              CUBLAS_STATUS_INVALID_VALUE,
          "4-byte bias pointer attribute accepted");
  }
  { // types
    setup s(4, 4, 4, CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F);
    CHECK(s.heuristic(h, &r) == CUBLAS_STATUS_NOT_SUPPORTED, "bf16 x f32 accepted");
    setup t(4, 4, 4, CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F_FAST_TF32);
    CHECK(t.heuristic(h, &r) == CUBLAS_STATUS_NOT_SUPPORTED, "TF32 compute with bf16 accepted");
    setup u(4, 4, 4, CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F);
    cublasLtMatrixLayoutDestroy(u.lc);
    cublasLtMatrixLayoutCreate(&u.lc, CUDA_R_16BF, 4, 4, 4);
    CHECK(u.heuristic(h, &r) == CUBLAS_STATUS_NOT_SUPPORTED, "f16 x f16 -> bf16 accepted");
  }
}

int main() {
  cublasLtHandle_t h;
  if (cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "FAIL: cublasLtCreate\n");
    return 1;
  }
  test_conversions();
  test_matmul(h);
  fprintf(stderr, "(the errors printed below are expected)\n");
  test_errors(h);
  cublasLtDestroy(h);
  printf("%s: %d checks, %d failed\n", g_fail ? "FAIL" : "ok", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
