/* The packed GEMM of src/ops/gemm.c against a double-precision reference on
 * random inputs, on every ISA path the CPU has (AVX-512, AVX2): odd shapes
 * that leave partial MR x NR tiles, depths across KC blocks, widths across NC
 * blocks, every transpose pair, padded leading dimensions, beta 0 (C full of
 * NaN must not be read), 1 and 0.5, and the linear layers run through it
 * with BL_GEMM=own (forward, dX, dW on a transposed weight view).
 *
 * Tolerance: each C entry is a k-term dot product summed in f32 (FMA), plus
 * beta c; its error is at most gamma_k sum_p |a_ip b_pj| + u |beta c| with
 * gamma_k = k u / (1 - k u), u = 2^-24 (Higham, Accuracy and Stability, 3.1).
 * That worst case is what is checked, per entry. */
#include "bertlua.h"
#include "ops/gemm.h"
#include "base/vecmath.h"
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref_dot.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float urand(void) { /* uniform in [-1, 1), never all zero */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (float)((double)(rng >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

#define AT(x, t, ld, r, c) ((t) ? (x)[(int64_t)(c) * (ld) + (r)] : (x)[(int64_t)(r) * (ld) + (c)])

/* one product on one ISA; returns the worst error as a fraction of its bound */
static double check_one(int isa, int ta, int tb, int64_t m, int64_t n, int64_t k, float beta) {
  int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
  int64_t arows = ta ? k : m, brows = tb ? n : k;
  float *a = malloc(sizeof(float) * arows * lda), *b = malloc(sizeof(float) * brows * ldb),
        *c = malloc(sizeof(float) * m * ldc), *c0 = malloc(sizeof(float) * m * ldc);
  if (!a || !b || !c || !c0) {
    free(a);
    free(b);
    free(c);
    free(c0);
    CHECK(0, "out of memory");
    return 1e30;
  }
  for (int64_t i = 0; i < arows * lda; i++) a[i] = urand();
  for (int64_t i = 0; i < brows * ldb; i++) b[i] = urand();
  for (int64_t i = 0; i < m * ldc; i++) c[i] = c0[i] = beta == 0.0f ? NAN : urand();
  int done = opx_sgemm_isa(isa, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
  CHECK(done, "gemm isa %d did not run %lldx%lldx%lld", isa, (long long)m, (long long)n, (long long)k);
  const double u = ldexp(1.0, -24), gamma = k * u / (1 - k * u);
  double worst = 0;
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < ldc; j++) {
      double got = c[i * ldc + j];
      if (j >= n) { /* the padding of C's rows is not touched */
        if (!(got == c0[i * ldc + j] || (isnan(got) && isnan(c0[i * ldc + j])))) worst = 1e30;
        continue;
      }
      double ref = beta == 0.0f ? 0.0 : (double)beta * c0[i * ldc + j], mag = 0;
      for (int64_t p = 0; p < k; p++) {
        double t = (double)AT(a, ta, lda, i, p) * AT(b, tb, ldb, p, j);
        ref += t;
        mag += fabs(t);
      }
      double bound = gamma * mag + u * fabs(beta == 0.0f ? 0.0 : (double)beta * c0[i * ldc + j]) + 1e-30;
      double r = isfinite(got) ? fabs(got - ref) / bound : 1e30;
      if (r > worst) worst = r;
    }
  free(a);
  free(b);
  free(c);
  free(c0);
  return worst;
}

static void test_isa(int isa, const char *name) {
  /* m, n, k: under one tile, partial tiles, several MC blocks, k over KC (768), n over NC (3072); 40 x 300 x 1000
   * is one row block split over N on every thread, as at batch 1 */
  static const int64_t shapes[][3] = { { 1, 1, 1 },     { 5, 7, 3 },      { 13, 31, 17 },   { 14, 32, 768 },
                                       { 15, 33, 769 }, { 37, 100, 777 }, { 173, 65, 129 }, { 200, 48, 64 },
                                       { 3, 3100, 9 },  { 300, 17, 5 },   { 40, 300, 1000 } };
  static const float betas[] = { 0.0f, 1.0f, 0.5f };
  int runs = 0;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int t = 0; t < 4; t++) {
      float beta = betas[(s + (size_t)t) % 3];
      double w = check_one(isa, t & 1, t >> 1, shapes[s][0], shapes[s][1], shapes[s][2], beta);
      CHECK(w <= 1.0, "%s gemm ta=%d tb=%d %lldx%lldx%lld beta %g: error %.3g x its bound", name, t & 1, t >> 1,
            (long long)shapes[s][0], (long long)shapes[s][1], (long long)shapes[s][2], beta, w);
      runs++;
    }
  printf("%s: %d products checked\n", name, runs);
}

/* The prepacked path (inference: opx_pack_b once, opx_sgemm_packed with bias
 * and GELU in the epilogue) on shapes with several row blocks and K passes,
 * against the same product through opx_sgemm_isa plus the epilogue as a pass
 * of its own: the same kernel, blocks and K order, so the results must be
 * bitwise equal, on 1 thread and on 3 (uneven row blocks; the threads skip
 * the barrier between K passes, so a tile handed to another thread in the
 * next pass would show here). 112 x 200 x 1600 is batch 1's case: one
 * row block whose N panels the threads split, three K blocks. The unfused
 * product itself is checked against double sums above. */
static void test_packed(int isa, const char *name) {
  static const int64_t shapes[][3] = { { 700, 100, 1600 }, { 300, 70, 800 }, { 29, 3100, 40 }, { 112, 200, 1600 } };
  int runs = 0;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2], lda = k + 3, ldc = n + 1;
    float *a = malloc(sizeof(float) * m * lda), *w = malloc(sizeof(float) * n * k), *bias = malloc(sizeof(float) * n);
    float *want = malloc(sizeof(float) * m * ldc), *got = malloc(sizeof(float) * m * ldc);
    int have = a && w && bias && want && got;
    CHECK(have, "out of memory");
    for (int64_t i = 0; have && i < m * lda; i++) a[i] = urand();
    for (int64_t i = 0; have && i < n * k; i++) w[i] = urand() * 0.05f;
    for (int64_t i = 0; have && i < n; i++) bias[i] = urand();
    for (int gelu = 0; have && gelu < 2; gelu++) {
      for (int64_t i = 0; i < m * ldc; i++) want[i] = NAN;
      CHECK(opx_sgemm_isa(isa, 0, 1, m, n, k, a, lda, w, k, 0.0f, want, ldc), "%s: unfused gemm did not run", name);
      opx_bias_act_rows(isa, m, n, want, ldc, bias, gelu);
      opx_packed_b *pb = opx_pack_b(isa, 1, k, n, w, k);
      CHECK(pb != NULL, "%s: opx_pack_b failed", name);
      for (int threads = 1; pb && threads <= 3; threads += 2) {
        int saved = omp_get_max_threads();
        omp_set_num_threads(threads);
        for (int64_t i = 0; i < m * ldc; i++) got[i] = NAN;
        int done = opx_sgemm_packed(pb, 0, m, a, lda, got, ldc, bias, gelu);
        omp_set_num_threads(saved);
        int64_t bad = done ? 0 : m * n;
        for (int64_t i = 0; done && i < m; i++)
          bad += memcmp(got + i * ldc, want + i * ldc, sizeof(float) * (size_t)n) != 0;
        CHECK(bad == 0, "%s packed gemm %lldx%lldx%lld gelu %d, %d threads: %lld rows differ from the unfused product",
              name, (long long)m, (long long)n, (long long)k, gelu, threads, (long long)bad);
        runs++;
      }
      opx_packed_b_free(pb);
    }
    free(a);
    free(w);
    free(bias);
    free(want);
    free(got);
  }
  printf("%s: %d packed products checked bitwise\n", name, runs);
}

static bl_tensor *rand_tensor(int64_t r, int64_t c) {
  bl_tensor *t = NULL;
  int64_t shape[2] = { r, c };
  OK(bl_tensor_empty(2, shape, BL_F32, -1, &t));
  for (int64_t i = 0; i < r * c; i++) ((float *)t->data)[i] = urand();
  return t;
}

/* got[m x n] against sum_p A(i, p) B(p, j) (+ bias[j]) in double, A(i, p) =
 * a[i*ars + p*acs], B(p, j) = b[p*brs + j*bcs]; bound (k + 2) u sum |terms| */
static void check_product(const char *what, const float *got, int64_t m, int64_t n, const float *a, int64_t ars,
                          int64_t acs, const float *b, int64_t brs, int64_t bcs, int64_t k, const float *bias) {
  const double u = ldexp(1.0, -24);
  double worst = 0;
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double mag, ref = ref_dot(a + i * ars, acs, b + j * bcs, brs, k, bias ? bias[j] : 0.0, &mag);
      worst = fmax(worst, fabs(got[i * n + j] - ref) / ((double)(k + 2) * u * mag + 1e-30));
    }
  CHECK(worst <= 1.0, "linear %s (BL_GEMM=own): error %.3g x its bound", what, worst);
}

/* linear through BL_GEMM=own: y = x W^T + b, dX = dY W, dW = dY^T x against double sums */
static void test_linear_own(void) {
  const int64_t rows = 29, in = 45, out = 70;
  bl_tensor *x = rand_tensor(rows, in), *wt = rand_tensor(in, out), *b = rand_tensor(1, out), *w = NULL;
  bl_tensor *y = rand_tensor(rows, out), *dy = rand_tensor(rows, out), *dx = rand_tensor(rows, in);
  bl_tensor *dw = rand_tensor(out, in), *bias = NULL;
  OK(bl_tensor_transpose(wt, 0, 1, &w)); /* W [out, in] as a transposed view: the other op(B) */
  int64_t bshape[1] = { out };
  OK(bl_tensor_view(b, 1, bshape, &bias));
  memset(dw->data, 0, sizeof(float) * out * in);
  OK(bl_linear_forward(y, x, w, bias));
  OK(bl_linear_backward(dx, dw, NULL, dy, x, w, 0));
  const float *X = x->data, *WT = wt->data, *DY = dy->data;
  /* element (i, p) of each operand as (pointer, row stride, column stride) */
  check_product("forward", y->data, rows, out, X, in, 1, WT, out, 1, in, b->data);
  check_product("dX", dx->data, rows, in, DY, out, 1, WT, 1, out, out, NULL);
  check_product("dW", dw->data, out, in, DY, 1, out, X, in, 1, rows, NULL);
  bl_tensor *ts[] = { x, wt, b, w, y, dy, dx, dw, bias };
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) bl_tensor_free(ts[i]);
}

int main(void) {
  setenv("BL_GEMM", "own", 1); /* read once, at the first linear call */
  int tested = 0;
  if (bl_cpu_set_isa("avx512") == 0) {
    test_isa(OPX_ISA_AVX512, "avx512");
    test_packed(OPX_ISA_AVX512, "avx512");
    test_linear_own();
    tested++;
  }
  if (bl_cpu_set_isa("avx2") == 0) {
    test_isa(OPX_ISA_AVX2, "avx2");
    test_packed(OPX_ISA_AVX2, "avx2");
    test_linear_own();
    tested++;
  }
  CHECK(!opx_sgemm_isa(OPX_ISA_BASE, 0, 0, 2, 2, 2, NULL, 2, NULL, 2, 0.0f, NULL, 2),
        "the baseline path claims a GEMM kernel it does not have");
  if (!tested) {
    printf("SKIP: this CPU (or build) has neither AVX2 nor AVX-512, so there is no packed GEMM to test\n");
    return 77;
  }
  printf("%s\n", failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}
