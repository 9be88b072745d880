/* Accuracy of the vectorised f32 math used by the CPU ops (src/base/vecmath.h)
 * against double-precision libm over dense grids, the inline Philox against
 * bl_philox4x32 and the dropout masks of the ops against the documented
 * stream, GELU / its derivative through the public ops against a
 * double-precision formula, and argmax and the accuracy counts against their
 * scalar rule. The bounds checked here are the ones documented in vecmath.h;
 * the loops are compiled with the same OPX_ISA_FN dispatch as the library,
 * and every check runs on each ISA path the CPU has (AVX-512,
 * AVX2, baseline), selected with bl_cpu_set_isa. */
#include "bertlua.h"
#include "base/vecmath.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* distance in units of the f32 spacing at the reference value */
static double ulps(float got, double ref) {
  if (isnan(ref)) return isnan(got) ? 0 : 1e30;
  double sp = ref == 0 ? ldexp(1.0, -149) : ldexp(1.0, ilogb(ref) - 23);
  if (fabs(ref) < ldexp(1.0, -126)) sp = ldexp(1.0, -149);
  return fabs((double)got - ref) / sp;
}

OPX_BODY run_exp_body(int n, const float *restrict x, float *restrict y) {
#pragma omp simd
  for (int i = 0; i < n; i++) y[i] = vm_exp(x[i]);
}
OPX_ISA_FN(run_exp, (int n, const float *restrict x, float *restrict y), (n, x, y))
OPX_BODY run_erf_body(int n, const float *restrict x, float *restrict y) {
#pragma omp simd
  for (int i = 0; i < n; i++) y[i] = vm_erf(x[i]);
}
OPX_ISA_FN(run_erf, (int n, const float *restrict x, float *restrict y), (n, x, y))
OPX_BODY run_phi_body(int n, const float *restrict x, float *restrict y, float *restrict d) {
#pragma omp simd
  for (int i = 0; i < n; i++) y[i] = vm_phi(x[i], &d[i]);
}
OPX_ISA_FN(run_phi, (int n, const float *restrict x, float *restrict y, float *restrict d), (n, x, y, d))
OPX_BODY run_gelu_fast_body(int n, const float *restrict x, float *restrict y) {
#pragma omp simd
  for (int i = 0; i < n; i++) y[i] = vm_gelu_fast(x[i]);
}
OPX_ISA_FN(run_gelu_fast, (int n, const float *restrict x, float *restrict y), (n, x, y))
OPX_BODY run_philox_body(int n, uint64_t seed, uint64_t off, uint32_t *restrict o) {
#pragma omp simd
  for (int i = 0; i < n; i++)
    vm_philox((uint32_t)seed, (uint32_t)(seed >> 32), off + (uint64_t)i, &o[4 * i], &o[4 * i + 1], &o[4 * i + 2],
              &o[4 * i + 3]);
}
OPX_ISA_FN(run_philox, (int n, uint64_t seed, uint64_t off, uint32_t *restrict o), (n, seed, off, o))

/* largest relative error of y[i] against erf(x[i]) (absolute where erf is 0);
 * *at is moved to the x of each new worst */
static double erf_worst(int n, const float *x, const float *y, double *at) {
  double worst = 0;
  for (int i = 0; i < n; i++) {
    double r = erf((double)x[i]);
    double e = r == 0 ? fabs(y[i]) : fabs(y[i] - r) / fabs(r);
    if (e > worst) {
      worst = e;
      *at = x[i];
    }
  }
  return worst;
}

#define N 2000001

/* every check, on the ISA path in use */
static int check_path(float *x, float *y, float *d) {
  /* exp over [-103.9, 88.6], normal results within 2 ulp, subnormals within 2 ulp of 2^-149 steps */
  double worst = 0, at = 0;
  for (int i = 0; i < N; i++) x[i] = -103.9f + (88.6f + 103.9f) * (float)i / (N - 1);
  run_exp(N, x, y);
  for (int i = 0; i < N; i++) {
    double e = ulps(y[i], exp((double)x[i]));
    if (e > worst) {
      worst = e;
      at = x[i];
    }
  }
  printf("vm_exp: max %.2f ulp (at %.6g)\n", worst, at);
  CHECK(worst <= 2.0, "vm_exp error %.2f ulp at %g", worst, at);
  x[0] = -200.0f;
  x[1] = NAN;
  x[2] = 0.0f;
  x[3] = -0.0f;
  run_exp(4, x, y);
  CHECK(y[0] == 0.0f && isnan(y[1]) && y[2] == 1.0f && y[3] == 1.0f, "vm_exp specials: %g %g %g %g", y[0], y[1], y[2],
        y[3]);

  /* erf over [-12, 12]: relative error <= 2e-7 */
  at = 0;
  for (int i = 0; i < N; i++) x[i] = -12.0f + 24.0f * (float)i / (N - 1);
  run_erf(N, x, y);
  double wrel = erf_worst(N, x, y, &at);
  printf("vm_erf: max rel error %.3g (at %.6g)\n", wrel, at);
  CHECK(wrel <= 2e-7, "vm_erf rel error %g at %g", wrel, at);
  /* dense near 0 and near the region seam |t| = 1 */
  for (int i = 0; i < N; i++)
    x[i] = (i % 2 ? 1.0f : 1e-6f) * ((float)i / (N - 1) * 2.0f - 1.0f) + (i % 2 ? (i % 4 == 1 ? 1.0f : -1.0f) : 0.0f);
  run_erf(N, x, y);
  wrel = erf_worst(N, x, y, &at);
  printf("vm_erf near 0 and |t| = 1: max rel error %.3g (at %.9g)\n", wrel, at);
  CHECK(wrel <= 2e-7, "vm_erf rel error %g at %g", wrel, at);

  /* Phi and phi over [-16, 16]: relative error <= 5e-7 where Phi >= 1e-37 */
  wrel = 0;
  at = 0;
  double wpdf = 0, atp = 0;
  for (int i = 0; i < N; i++) x[i] = -16.0f + 32.0f * (float)i / (N - 1);
  run_phi(N, x, y, d);
  for (int i = 0; i < N; i++) {
    double xd = x[i], r = 0.5 * erfc(-xd / sqrt(2.0)), pr = exp(-0.5 * xd * xd) / sqrt(2.0 * M_PI);
    if (r >= 1e-37) {
      double e = fabs(y[i] - r) / r;
      if (e > wrel) {
        wrel = e;
        at = xd;
      }
    }
    if (pr >= 1e-37) {
      double e = fabs(d[i] - pr) / pr;
      if (e > wpdf) {
        wpdf = e;
        atp = xd;
      }
    }
  }
  printf("vm_phi: max rel error %.3g (at %.6g), pdf %.3g (at %.6g)\n", wrel, at, wpdf, atp);
  CHECK(wrel <= 5e-7, "vm_phi rel error %g at %g", wrel, at);
  CHECK(wpdf <= 5e-7, "vm_phi pdf rel error %g at %g", wpdf, atp);

  /* inference's GELU: |error| <= 3.5 ulp(|x|) (3.3 is the exhaustive maximum over all f32 x, vecmath.h) on a grid
   * over [-16, 16], a dense one around the clamp at |x| = 5.6, and the worst inputs of the exhaustive scan */
  worst = 0;
  at = 0;
  for (int i = 0; i < N; i++) {
    float t = (float)i / (N - 1);
    x[i] = i % 2 ? -16.0f + 32.0f * t : (i % 4 ? -1.0f : 1.0f) * (5.5f + 0.2f * t);
  }
  float hard[] = { 3.68264318f, -3.61216807f, 3.67527437f, -3.63478184f, 1e30f, -1e30f, 1e-30f, -1e-30f };
  memcpy(x, hard, sizeof hard);
  run_gelu_fast(N, x, y);
  for (int i = 0; i < N; i++) {
    double xd = x[i], e = fabs(y[i] - xd * 0.5 * erfc(-xd / sqrt(2.0))) / ldexp(1.0, ilogb(xd) - 23);
    if (e > worst) {
      worst = e;
      at = xd;
    }
  }
  printf("vm_gelu_fast: max %.2f ulp(|x|) (at %.9g)\n", worst, at);
  CHECK(worst <= 3.5, "vm_gelu_fast error %.2f ulp(|x|) at %.9g", worst, at);
  x[0] = NAN;
  x[1] = 0.0f;
  run_gelu_fast(2, x, y);
  CHECK(isnan(y[0]) && y[1] == 0.0f, "vm_gelu_fast specials: %g %g", y[0], y[1]);

  /* Philox: identical to the library's generator */
  uint32_t *o = (uint32_t *)y;
  uint64_t seeds[] = { 0, 42, 0xFFFFFFFFFFFFFFFFull }, offs[] = { 0, 123456789, 0xFFFFFFF0ull + 3 };
  for (int s = 0; s < 3; s++) {
    run_philox(1000, seeds[s], offs[s], o);
    int bad = 0;
    for (int i = 0; i < 1000; i++) {
      uint32_t r[4];
      bl_philox4x32(seeds[s], offs[s] + (uint64_t)i, r);
      if (memcmp(r, o + 4 * i, 16)) bad++;
    }
    CHECK(bad == 0, "vm_philox differs from bl_philox4x32 in %d blocks (seed %llu)", bad, (unsigned long long)seeds[s]);
  }

  /* GELU and its derivative through the public ops, against double precision */
  {
    int64_t n = 400001, shape[] = { n };
    bl_tensor *tx = NULL, *ty = NULL, *tdy = NULL, *tdx = NULL;
    if (bl_tensor_empty(1, shape, BL_F32, -1, &tx) || bl_tensor_empty(1, shape, BL_F32, -1, &ty) ||
        bl_tensor_empty(1, shape, BL_F32, -1, &tdy) || bl_tensor_empty(1, shape, BL_F32, -1, &tdx))
      return 1;
    float *px = tx->data, *pdy = tdy->data;
    for (int64_t i = 0; i < n; i++) {
      px[i] = -12.0f + 24.0f * (float)i / (float)(n - 1);
      pdy[i] = 1.0f;
    }
    CHECK(bl_gelu_forward(ty, tx) == 0, "gelu: %s", bl_last_error());
    CHECK(bl_gelu_backward(tdx, tdy, tx) == 0, "gelu_backward: %s", bl_last_error());
    double wy = 0, wd = 0, aty = 0, atd = 0;
    for (int64_t i = 0; i < n; i++) {
      double xd = px[i], cdf = 0.5 * erfc(-xd / sqrt(2.0));
      double g = xd * cdf, gd = cdf + xd * exp(-0.5 * xd * xd) / sqrt(2.0 * M_PI);
      /* relative where the value is representable, absolute 1e-30 below */
      double ey = fabs(((float *)ty->data)[i] - g) / fmax(fabs(g), 1e-30);
      double ed = fabs(((float *)tdx->data)[i] - gd) / fmax(fabs(gd), 1e-30);
      if (ey > wy) {
        wy = ey;
        aty = xd;
      }
      if (ed > wd) {
        wd = ed;
        atd = xd;
      }
    }
    printf("gelu: max rel error %.3g (at %.6g); gelu': %.3g (at %.6g)\n", wy, aty, wd, atd);
    CHECK(wy <= 1e-6, "gelu rel error %g at %g", wy, aty);
    /* the derivative cancels near its zero at x ~ -0.75: compare relative to |Phi| + |x phi| there */
    double wd2 = 0;
    for (int64_t i = 0; i < n; i++) {
      double xd = px[i], cdf = 0.5 * erfc(-xd / sqrt(2.0)), pdf = exp(-0.5 * xd * xd) / sqrt(2.0 * M_PI);
      double gd = cdf + xd * pdf, mag = fmax(cdf + fabs(xd) * pdf, 1e-30);
      double e = fabs(((float *)tdx->data)[i] - gd) / mag;
      if (e > wd2) wd2 = e;
    }
    printf("gelu': max error relative to |Phi| + |x phi|: %.3g\n", wd2);
    CHECK(wd2 <= 1e-6, "gelu' error %g", wd2);
    bl_tensor_free(tx);
    bl_tensor_free(ty);
    bl_tensor_free(tdy);
    bl_tensor_free(tdx);
  }
  /* Dropout masks: every element of bl_dropout_forward's mask follows the
   * documented stream (block offset + i/4, lane i%4, keep = (x>>8) 2^-24 >= p),
   * and the fused residual LayerNorm (rows starting mid-block, h = 13) drops
   * exactly the same elements. */
  {
    const int64_t rows = 77, h = 13, n = rows * h;
    int64_t s2[] = { rows, h };
    bl_tensor *tx = NULL, *ty = NULL, *tm = NULL, *tr = NULL, *tg = NULL, *tb = NULL, *mean = NULL, *rstd = NULL;
    bl_tensor *tdy = NULL, *tdx = NULL, *tdr = NULL;
    int64_t sh[] = { h }, sr[] = { rows };
    if (bl_tensor_empty(2, s2, BL_F32, -1, &tx) || bl_tensor_empty(2, s2, BL_F32, -1, &ty) ||
        bl_tensor_empty(2, s2, BL_U8, -1, &tm) || bl_tensor_empty(2, s2, BL_F32, -1, &tr) ||
        bl_tensor_empty(1, sh, BL_F32, -1, &tg) || bl_tensor_empty(1, sh, BL_F32, -1, &tb) ||
        bl_tensor_empty(1, sr, BL_F32, -1, &mean) || bl_tensor_empty(1, sr, BL_F32, -1, &rstd) ||
        bl_tensor_empty(2, s2, BL_F32, -1, &tdy) || bl_tensor_empty(2, s2, BL_F32, -1, &tdx) ||
        bl_tensor_empty(2, s2, BL_F32, -1, &tdr))
      return 1;
    for (int64_t i = 0; i < n; i++) {
      ((float *)tx->data)[i] = 0.5f + (float)(i % 7);
      ((float *)tr->data)[i] = (float)(i % 5) - 2.0f;
      ((float *)tdy->data)[i] = 1.0f + (float)(i % 3);
    }
    for (int64_t j = 0; j < h; j++) {
      ((float *)tg->data)[j] = 1.0f + 0.1f * j;
      ((float *)tb->data)[j] = 0.0f;
    }
    double ps[] = { 0.1, 0.5, 0.9, 1.0 / 3.0, 0.25, 0.75 };
    /* the fifth stream starts 21 blocks before the counter's low word wraps (the vector paths hand
     * that stretch to the scalar loop), the sixth above 2^32 blocks (a nonzero high word in every lane) */
    uint64_t offs[] = { 99, 102, 105, 108, 0xFFFFFFFFull - 20, 0x100000005ull };
    for (int k = 0; k < 6; k++) {
      uint64_t seed = 1234567u + k, off = offs[k];
      CHECK(bl_dropout_forward(ty, tm, tx, ps[k], seed, off) == 0, "dropout: %s", bl_last_error());
      int bad = 0, bad_ln = 0;
      for (int64_t i = 0; i < n; i++) {
        uint32_t r[4];
        bl_philox4x32(seed, off + (uint64_t)(i / 4), r);
        float u = (float)(r[i % 4] >> 8) * (1.0f / 16777216.0f);
        if ((u >= (float)ps[k]) != ((uint8_t *)tm->data)[i]) bad++;
      }
      CHECK(bad == 0, "dropout p=%g: %d mask elements off the documented stream", ps[k], bad);
      CHECK(bl_residual_layernorm_forward(&(bl_residual_layernorm_args){ .x = tx,
                                                                         .residual = tr,
                                                                         .gamma = tg,
                                                                         .beta = tb,
                                                                         .y = ty,
                                                                         .mean = mean,
                                                                         .rstd = rstd,
                                                                         .eps = 1e-5,
                                                                         .p = ps[k],
                                                                         .seed = seed,
                                                                         .offset = off }) == 0,
            "%s", bl_last_error());
      CHECK(bl_residual_layernorm_backward(tdx, tdr, NULL, NULL, NULL, tdy,
                                           &(bl_residual_layernorm_args){ .x = tx,
                                                                          .residual = tr,
                                                                          .gamma = tg,
                                                                          .mean = mean,
                                                                          .rstd = rstd,
                                                                          .p = ps[k],
                                                                          .seed = seed,
                                                                          .offset = off }) == 0,
            "%s", bl_last_error());
      for (int64_t i = 0; i < n; i++)
        if ((((float *)tdx->data)[i] != 0.0f) != ((uint8_t *)tm->data)[i] && ((float *)tdr->data)[i] != 0.0f) bad_ln++;
      CHECK(bad_ln == 0, "residual_layernorm p=%g: %d elements masked differently from dropout", ps[k], bad_ln);
    }
    bl_tensor_free(tx);
    bl_tensor_free(ty);
    bl_tensor_free(tm);
    bl_tensor_free(tr);
    bl_tensor_free(tg);
    bl_tensor_free(tb);
    bl_tensor_free(mean);
    bl_tensor_free(rstd);
    bl_tensor_free(tdy);
    bl_tensor_free(tdx);
    bl_tensor_free(tdr);
  }
  /* argmax, accuracy and the accuracy counted in the cross-entropy pass against the scalar rule "first x[j]
   * above every earlier one, the first NaN wins", on rows of 77 classes (4 vector blocks and a tail) with ties,
   * +-0, -inf and NaN placed at random; every third target is the row's argmax (the fused count then searches the
   * elements before it), and the fused op's loss and gradient are the plain cross-entropy's bits. */
  {
    const int64_t rows = 400, c = 77;
    int64_t s2[] = { rows, c }, s1[] = { rows }, s0[] = { 1 }, sa[] = { 2 };
    bl_tensor *tl = NULL, *ta = NULL, *tt = NULL, *l1 = NULL, *l2 = NULL, *d1 = NULL, *d2 = NULL, *acc = NULL;
    if (bl_tensor_empty(2, s2, BL_F32, -1, &tl) || bl_tensor_empty(1, s1, BL_I64, -1, &ta) ||
        bl_tensor_empty(1, s1, BL_I64, -1, &tt) || bl_tensor_empty(1, s0, BL_F64, -1, &l1) ||
        bl_tensor_empty(1, s0, BL_F64, -1, &l2) || bl_tensor_empty(2, s2, BL_F32, -1, &d1) ||
        bl_tensor_empty(2, s2, BL_F32, -1, &d2) || bl_tensor_empty(1, sa, BL_I64, -1, &acc))
      return 1;
    float *lg = tl->data;
    const float special[] = { 3.0f, 3.0f, 0.0f, -0.0f, -INFINITY, INFINITY, NAN };
    uint32_t r[4];
    int64_t *best = malloc((size_t)rows * sizeof(int64_t));
    if (!best) return 1;
    for (int64_t i = 0; i < rows; i++) {
      float *row = lg + i * c;
      bl_philox4x32(7, (uint64_t)i, r);
      int kind = (int)(r[0] % 5); /* 0: random, 1: ties at the max, 2: +-0 only, 3: all -inf, 4: specials */
      for (int64_t j = 0; j < c; j++) {
        bl_philox4x32(8, (uint64_t)(i * c + j), r);
        float u = (float)(r[0] >> 8) * (1.0f / 16777216.0f);
        row[j] = kind == 2 ? (r[1] & 1 ? 0.0f : -0.0f) : kind == 3 ? -INFINITY : u * 2.0f - 1.0f;
        if (kind == 1 && r[1] % 9 == 0) row[j] = 3.0f;
        if (kind == 4 && r[1] % 23 == 0) row[j] = special[r[2] % 7];
      }
      best[i] = 0;
      for (int64_t j = 1; j < c; j++) {
        if (isnan(row[best[i]])) break;
        if (row[j] > row[best[i]] || isnan(row[j])) best[i] = j;
      }
      ((int64_t *)tt->data)[i] = i % 11 == 0  ? -100
                                 : i % 3 == 0 ? best[i]
                                              : (int64_t)(r[3] % 3 == 0 ? 0 : r[3] % (uint32_t)c);
    }
    CHECK(bl_argmax(ta, tl) == 0, "argmax: %s", bl_last_error());
    int bad = 0;
    int64_t ok = 0, cnt = 0, got_ok = -1, got_cnt = -1;
    for (int64_t i = 0; i < rows; i++) {
      bad += ((int64_t *)ta->data)[i] != best[i];
      int64_t t = ((int64_t *)tt->data)[i];
      if (t != -100) {
        cnt++;
        ok += t == best[i];
      }
    }
    CHECK(bad == 0, "argmax: %d of %lld rows differ from the scalar rule", bad, (long long)rows);
    CHECK(bl_accuracy(tl, tt, -100, &got_ok, &got_cnt) == 0, "accuracy: %s", bl_last_error());
    CHECK(got_ok == ok && got_cnt == cnt && ok > 0, "accuracy %lld/%lld, the scalar rule %lld/%lld", (long long)got_ok,
          (long long)got_cnt, (long long)ok, (long long)cnt);
    int64_t *a = acc->data;
    a[0] = 5;
    a[1] = 7;
    CHECK(bl_cross_entropy_counted(l1, d1, tl, tt, -100, 0.5, cnt) == 0, "cross_entropy: %s", bl_last_error());
    CHECK(bl_cross_entropy_accuracy(l2, d2, acc, tl, tt, -100, 0.5, cnt) == 0, "cross_entropy_accuracy: %s",
          bl_last_error());
    CHECK(a[0] == 5 + ok && a[1] == 7 + cnt, "cross_entropy_accuracy counted %lld/%lld, the scalar rule %lld/%lld",
          (long long)(a[0] - 5), (long long)(a[1] - 7), (long long)ok, (long long)cnt);
    CHECK(!memcmp(l1->data, l2->data, 8) && !memcmp(d1->data, d2->data, (size_t)(rows * c) * 4),
          "cross_entropy_accuracy: the loss or gradient differs from cross_entropy's");
    CHECK(bl_cross_entropy_accuracy(l2, d2, acc, tl, tt, -100, 0.5, cnt + 1) != 0 &&
              strstr(bl_last_error(), "the caller said"),
          "a wrong count: %s", bl_last_error());
    free(best);
    bl_tensor *ts[] = { tl, ta, tt, l1, l2, d1, d2, acc };
    for (int k = 0; k < 8; k++) bl_tensor_free(ts[k]);
  }
  /* rows of a clean softmax (no NaN or inf) whose argmax is often the target: the fused count's short path */
  {
    const int64_t rows = 64, c = 100;
    int64_t s2[] = { rows, c }, s1[] = { rows }, s0[] = { 1 }, sa[] = { 2 };
    bl_tensor *tl = NULL, *tt = NULL, *l = NULL, *acc = NULL;
    if (bl_tensor_empty(2, s2, BL_F32, -1, &tl) || bl_tensor_empty(1, s1, BL_I32, -1, &tt) ||
        bl_tensor_empty(1, s0, BL_F64, -1, &l) || bl_tensor_empty(1, sa, BL_I64, -1, &acc))
      return 1;
    int64_t ok = 0;
    for (int64_t i = 0; i < rows; i++) {
      float *row = (float *)tl->data + i * c;
      for (int64_t j = 0; j < c; j++) row[j] = (float)((i * 7 + j * 13) % 17); /* max 16, ties */
      int64_t first = 0;
      while (row[first] != 16.0f) first++;
      int64_t t = i % 4 == 0 ? first : i % 4 == 1 ? first + 17 : (i * 5) % c; /* the first max, a later tie, other */
      ((int32_t *)tt->data)[i] = (int32_t)t;
      ok += t == first;
    }
    int64_t *a = acc->data;
    a[0] = a[1] = 0;
    CHECK(bl_cross_entropy_accuracy(l, NULL, acc, tl, tt, -100, 1.0, -1) == 0, "%s", bl_last_error());
    CHECK(a[0] == ok && a[1] == rows && ok >= rows / 4, "cross_entropy_accuracy %lld/%lld, want %lld/%lld",
          (long long)a[0], (long long)a[1], (long long)ok, (long long)rows);
    bl_tensor *ts[] = { tl, tt, l, acc };
    for (int k = 0; k < 4; k++) bl_tensor_free(ts[k]);
  }
  return 0;
}

/* each ISA path this CPU has (BL_CPU_ISA caps them the same way) */
int main(void) {
  float *x = malloc(N * 4), *y = malloc(N * 4), *d = malloc(N * 4);
  if (!x || !y || !d) return 1;
  const char *isas[] = { "avx512", "avx2", "baseline" };
  for (int i = 0; i < 3; i++) {
    if (bl_cpu_set_isa(isas[i]) != 0) {
      printf("-- %s: not on this CPU (%s)\n", isas[i], bl_last_error());
      continue;
    }
    printf("-- %s\n", bl_cpu_isa());
    if (check_path(x, y, d)) return 1;
  }
  free(x);
  free(y);
  free(d);
  if (failures) {
    printf("%d failure(s)\n", failures);
    return 1;
  }
  printf("all vecmath checks passed\n");
  return 0;
}
