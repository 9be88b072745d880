/* The CPU ops at BERT-like shapes, where the fast paths run: attention's
 * register-tiled GEMMs (4 x 32 tiles need S >= 32 and head size >= 32; S = 67
 * and d = 40 also leave ragged edges), the 16-lane row reductions of
 * LayerNorm / softmax / cross-entropy (H = 771, S = 131: not multiples of 16), the
 * vectorised GELU and dropout. Each is compared with a double-precision
 * reference computed here by straightforward loops (dropout masks taken from
 * bl_dropout_forward, whose stream test_ops_vecmath checks), and each must
 * give bitwise the same result with 1, 2 and 3 OpenMP threads. */
#include "bertlua.h"
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static uint64_t rs = 0x2545F4914F6CDD1DULL;
static float urand(void) { /* non-zero values in +-[0.1, 1.1) */
  rs ^= rs >> 12;
  rs ^= rs << 25;
  rs ^= rs >> 27;
  double u = (double)((rs * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
  return (float)(u < 0.5 ? -(0.1 + 2 * u) : (0.1 + 2 * (u - 0.5)));
}
static bl_tensor *T(int nd, int64_t a, int64_t b, int64_t c, int64_t d, int dt) {
  int64_t s[] = { a, b, c, d };
  bl_tensor *t = NULL;
  if (bl_tensor_empty(nd, s, dt, -1, &t)) {
    printf("alloc: %s\n", bl_last_error());
    exit(1);
  }
  if (dt == BL_F32) memset(t->data, 0, (size_t)t->numel * 4);
  return t;
}
static bl_tensor *R(int nd, int64_t a, int64_t b, int64_t c, int64_t d) {
  bl_tensor *t = T(nd, a, b, c, d, BL_F32);
  for (int64_t i = 0; i < t->numel; i++) ((float *)t->data)[i] = urand();
  return t;
}
static float *F(const bl_tensor *t) { return (float *)t->data; }
/* max |got - ref| / max |ref| */
static double err(const bl_tensor *got, const double *ref) {
  double e = 0, m = 1e-30;
  for (int64_t i = 0; i < got->numel; i++) {
    e = fmax(e, fabs(F(got)[i] - ref[i]));
    m = fmax(m, fabs(ref[i]));
  }
  return e / m;
}
static int same(const bl_tensor *a, const bl_tensor *b) { return memcmp(a->data, b->data, (size_t)a->numel * 4) == 0; }
static bl_tensor *clone(const bl_tensor *t) {
  bl_tensor *c = T(t->ndim, t->shape[0], t->ndim > 1 ? t->shape[1] : 0, t->ndim > 2 ? t->shape[2] : 0,
                   t->ndim > 3 ? t->shape[3] : 0, BL_F32);
  memcpy(c->data, t->data, (size_t)t->numel * 4);
  return c;
}

/* ------------------------------------------------------------------ attention */
static void test_attention(int64_t B, int64_t S, int64_t NH, int64_t d, double p) {
  int64_t H = NH * d;
  bl_tensor *q = R(3, B, S, H, 0), *k = R(3, B, S, H, 0), *v = R(3, B, S, H, 0), *dctx = R(3, B, S, H, 0);
  bl_tensor *km = T(2, B, S, 0, 0, BL_F32), *ctx = T(3, B, S, H, 0, BL_F32), *probs = T(4, B, NH, S, S, BL_F32);
  bl_tensor *dq = T(3, B, S, H, 0, BL_F32), *dk = T(3, B, S, H, 0, BL_F32), *dv = T(3, B, S, H, 0, BL_F32);
  for (int64_t b = 0; b < B; b++)
    for (int64_t s = 0; s < S; s++) F(km)[b * S + s] = s < S - 3 * b ? 1.0f : 0.0f;
  const uint64_t seed = 77, off = 5;
  OK(bl_attention_forward(&(bl_attention_args){ .q = q,
                                                .k = k,
                                                .v = v,
                                                .key_mask = km,
                                                .ctx = ctx,
                                                .saved = probs,
                                                .heads = (int)NH,
                                                .p = p,
                                                .seed = seed,
                                                .offset = off }));
  OK(bl_attention_backward(
      dq, dk, dv, dctx,
      &(bl_attention_args){
          .q = q, .k = k, .v = v, .saved = probs, .heads = (int)NH, .p = p, .seed = seed, .offset = off }));
  /* the dropout keep mask: dropout of ones with the same stream, rows padded to S4 = 4*ceil(S/4) draws (bl_ops.h) */
  const int64_t S4 = (S + 3) / 4 * 4;
  bl_tensor *ones = T(4, B, NH, S, S4, BL_F32), *keep = T(4, B, NH, S, S4, BL_F32);
  for (int64_t i = 0; i < ones->numel; i++) F(ones)[i] = 1.0f;
  if (p > 0)
    OK(bl_dropout_forward(keep, NULL, ones, p, seed, off));
  else
    memcpy(keep->data, ones->data, (size_t)ones->numel * 4);
  double *rctx = calloc((size_t)ctx->numel, 8), *rp = calloc((size_t)probs->numel, 8);
  double *rdq = calloc((size_t)q->numel, 8), *rdk = calloc((size_t)q->numel, 8), *rdv = calloc((size_t)q->numel, 8);
  double *P = malloc((size_t)(S * S) * 8), *dP = malloc((size_t)(S * S) * 8);
  const double scale = 1.0 / sqrt((double)d);
#define AT(t, b, s, c) ((double)F(t)[((b)*S + (s)) * H + h * d + (c)])
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < NH; h++) {
      const float *kp = F(keep) + (b * NH + h) * S * S4;
      for (int64_t i = 0; i < S; i++) {
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j < S; j++) {
          double s = 0;
          for (int64_t c = 0; c < d; c++) s += AT(q, b, i, c) * AT(k, b, j, c);
          P[i * S + j] = s * scale + (1.0 - F(km)[b * S + j]) * -10000.0;
          mx = fmax(mx, P[i * S + j]);
        }
        for (int64_t j = 0; j < S; j++) {
          P[i * S + j] = exp(P[i * S + j] - mx);
          sum += P[i * S + j];
        }
        for (int64_t j = 0; j < S; j++) {
          P[i * S + j] /= sum;
          rp[((b * NH + h) * S + i) * S + j] = P[i * S + j];
        }
        for (int64_t c = 0; c < d; c++) {
          double o = 0;
          for (int64_t j = 0; j < S; j++) o += P[i * S + j] * kp[i * S4 + j] * AT(v, b, j, c);
          rctx[(b * S + i) * H + h * d + c] = o;
        }
      }
      for (int64_t i = 0; i < S; i++) {
        double dot = 0;
        for (int64_t j = 0; j < S; j++) {
          double g = 0;
          for (int64_t c = 0; c < d; c++) g += AT(dctx, b, i, c) * AT(v, b, j, c);
          dP[i * S + j] = g * kp[i * S4 + j];
          dot += dP[i * S + j] * P[i * S + j];
        }
        for (int64_t j = 0; j < S; j++) dP[i * S + j] = P[i * S + j] * (dP[i * S + j] - dot) * scale;
      }
      for (int64_t i = 0; i < S; i++)
        for (int64_t c = 0; c < d; c++) {
          double gq = 0, gk = 0, gv = 0;
          for (int64_t j = 0; j < S; j++) {
            gq += dP[i * S + j] * AT(k, b, j, c);
            gk += dP[j * S + i] * AT(q, b, j, c);
            gv += P[j * S + i] * kp[j * S4 + i] * AT(dctx, b, j, c);
          }
          rdq[(b * S + i) * H + h * d + c] = gq;
          rdk[(b * S + i) * H + h * d + c] = gk;
          rdv[(b * S + i) * H + h * d + c] = gv;
        }
    }
#undef AT
  double ec = err(ctx, rctx), ep = err(probs, rp), eq = err(dq, rdq), ek = err(dk, rdk), ev = err(dv, rdv);
  printf("attention B=%lld S=%lld heads=%lld d=%lld p=%.2f: ctx %.2g probs %.2g dq %.2g dk %.2g dv %.2g\n",
         (long long)B, (long long)S, (long long)NH, (long long)d, p, ec, ep, eq, ek, ev);
  CHECK(ec < 2e-5 && ep < 2e-5 && eq < 2e-5 && ek < 2e-5 && ev < 2e-5, "attention differs from the double reference");
  /* bitwise the same for 1 and 3 threads */
  for (int th = 1; th <= 3; th += 2) {
    bl_tensor *c2 = clone(ctx), *p2 = clone(probs), *q2 = clone(dq), *k2 = clone(dk), *v2 = clone(dv);
    omp_set_num_threads(th);
    OK(bl_attention_forward(&(bl_attention_args){ .q = q,
                                                  .k = k,
                                                  .v = v,
                                                  .key_mask = km,
                                                  .ctx = c2,
                                                  .saved = p2,
                                                  .heads = (int)NH,
                                                  .p = p,
                                                  .seed = seed,
                                                  .offset = off }));
    OK(bl_attention_backward(
        q2, k2, v2, dctx,
        &(bl_attention_args){
            .q = q, .k = k, .v = v, .saved = p2, .heads = (int)NH, .p = p, .seed = seed, .offset = off }));
    omp_set_num_threads(2);
    CHECK(same(c2, ctx) && same(p2, probs) && same(q2, dq) && same(k2, dk) && same(v2, dv),
          "attention with %d threads differs from 2 threads", th);
    bl_tensor_free(c2);
    bl_tensor_free(p2);
    bl_tensor_free(q2);
    bl_tensor_free(k2);
    bl_tensor_free(v2);
  }
  free(rctx);
  free(rp);
  free(rdq);
  free(rdk);
  free(rdv);
  free(P);
  free(dP);
  bl_tensor *all[] = { q, k, v, dctx, km, ctx, probs, dq, dk, dv, ones, keep };
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) bl_tensor_free(all[i]);
}

/* ------------------------------------------------------- residual layernorm */
static void test_residual_layernorm(int64_t rows, int64_t h, double p) {
  bl_tensor *x = R(2, rows, h, 0, 0), *r = R(2, rows, h, 0, 0), *g = R(1, h, 0, 0, 0), *be = R(1, h, 0, 0, 0);
  bl_tensor *dy = R(2, rows, h, 0, 0), *y = T(2, rows, h, 0, 0, BL_F32), *mean = T(1, rows, 0, 0, 0, BL_F32);
  bl_tensor *rstd = T(1, rows, 0, 0, 0, BL_F32), *dx = T(2, rows, h, 0, 0, BL_F32), *dr = T(2, rows, h, 0, 0, BL_F32);
  bl_tensor *dg = T(1, h, 0, 0, 0, BL_F32), *db = T(1, h, 0, 0, 0, BL_F32), *keep = T(2, rows, h, 0, 0, BL_F32);
  bl_tensor *ones = T(2, rows, h, 0, 0, BL_F32);
  for (int64_t i = 0; i < ones->numel; i++) F(ones)[i] = 1.0f;
  const uint64_t seed = 3, off = 11;
  OK(bl_residual_layernorm_forward(&(bl_residual_layernorm_args){ .x = x,
                                                                  .residual = r,
                                                                  .gamma = g,
                                                                  .beta = be,
                                                                  .y = y,
                                                                  .mean = mean,
                                                                  .rstd = rstd,
                                                                  .eps = 1e-12,
                                                                  .p = p,
                                                                  .seed = seed,
                                                                  .offset = off }));
  OK(bl_residual_layernorm_backward(
      dx, dr, dg, db, NULL, dy,
      &(bl_residual_layernorm_args){
          .x = x, .residual = r, .gamma = g, .mean = mean, .rstd = rstd, .p = p, .seed = seed, .offset = off }));
  OK(bl_dropout_forward(keep, NULL, ones, p, seed, off));
  double *ry = malloc((size_t)x->numel * 8), *rdx = malloc((size_t)x->numel * 8), *rdr = malloc((size_t)x->numel * 8);
  double *rdg = calloc((size_t)h, 8), *rdb = calloc((size_t)h, 8), *s = malloc((size_t)h * 8);
  for (int64_t i = 0; i < rows; i++) {
    double m = 0, var = 0, a = 0, bb = 0;
    for (int64_t j = 0; j < h; j++) {
      s[j] = (double)F(x)[i * h + j] * F(keep)[i * h + j] + F(r)[i * h + j];
      m += s[j];
    }
    m /= (double)h;
    for (int64_t j = 0; j < h; j++) var += (s[j] - m) * (s[j] - m);
    double rsd = 1.0 / sqrt(var / (double)h + 1e-12);
    for (int64_t j = 0; j < h; j++) {
      double xh = (s[j] - m) * rsd, gy = (double)F(dy)[i * h + j] * F(g)[j];
      ry[i * h + j] = xh * F(g)[j] + F(be)[j];
      a += gy;
      bb += gy * xh;
      rdg[j] += (double)F(dy)[i * h + j] * xh;
      rdb[j] += F(dy)[i * h + j];
    }
    for (int64_t j = 0; j < h; j++) {
      double xh = (s[j] - m) * rsd;
      rdr[i * h + j] = rsd * ((double)F(dy)[i * h + j] * F(g)[j] - a / (double)h - xh * bb / (double)h);
      rdx[i * h + j] = rdr[i * h + j] * F(keep)[i * h + j];
    }
  }
  double e1 = err(y, ry), e2 = err(dx, rdx), e3 = err(dr, rdr), e4 = err(dg, rdg), e5 = err(db, rdb);
  printf("residual_layernorm %lldx%lld p=%.2f: y %.2g dx %.2g dres %.2g dgamma %.2g dbeta %.2g\n", (long long)rows,
         (long long)h, p, e1, e2, e3, e4, e5);
  CHECK(e1 < 1e-5 && e2 < 1e-5 && e3 < 1e-5 && e4 < 1e-5 && e5 < 1e-5,
        "residual layernorm differs from the double reference");
  for (int th = 1; th <= 3; th += 2) {
    bl_tensor *y2 = clone(y), *dx2 = clone(dx), *dg2 = T(1, h, 0, 0, 0, BL_F32), *db2 = T(1, h, 0, 0, 0, BL_F32);
    omp_set_num_threads(th);
    OK(bl_residual_layernorm_forward(&(bl_residual_layernorm_args){ .x = x,
                                                                    .residual = r,
                                                                    .gamma = g,
                                                                    .beta = be,
                                                                    .y = y2,
                                                                    .mean = mean,
                                                                    .rstd = rstd,
                                                                    .eps = 1e-12,
                                                                    .p = p,
                                                                    .seed = seed,
                                                                    .offset = off }));
    OK(bl_residual_layernorm_backward(
        dx2, NULL, dg2, db2, NULL, dy,
        &(bl_residual_layernorm_args){
            .x = x, .residual = r, .gamma = g, .mean = mean, .rstd = rstd, .p = p, .seed = seed, .offset = off }));
    omp_set_num_threads(2);
    CHECK(same(y2, y) && same(dx2, dx) && same(dg2, dg) && same(db2, db), "residual layernorm with %d threads differs",
          th);
    bl_tensor_free(y2);
    bl_tensor_free(dx2);
    bl_tensor_free(dg2);
    bl_tensor_free(db2);
  }
  free(ry);
  free(rdx);
  free(rdr);
  free(rdg);
  free(rdb);
  free(s);
  bl_tensor *all[] = { x, r, g, be, dy, y, mean, rstd, dx, dr, dg, db, keep, ones };
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) bl_tensor_free(all[i]);
}

/* ------------------------------------------------------- bias + GELU, cross-entropy */
static void test_bias_gelu_ce(int64_t rows, int64_t h) {
  bl_tensor *x = R(2, rows, h, 0, 0), *b = R(1, h, 0, 0, 0), *dy = R(2, rows, h, 0, 0);
  bl_tensor *y = T(2, rows, h, 0, 0, BL_F32), *dx = T(2, rows, h, 0, 0, BL_F32), *db = T(1, h, 0, 0, 0, BL_F32);
  for (int64_t i = 0; i < x->numel; i++) F(x)[i] *= 3.0f; /* reach the tails */
  OK(bl_bias_gelu_forward(y, x, b));
  OK(bl_bias_gelu_backward(dx, db, dy, x, b));
  double *ry = malloc((size_t)x->numel * 8), *rdx = malloc((size_t)x->numel * 8), *rdb = calloc((size_t)h, 8);
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < h; j++) {
      double v = (double)F(x)[i * h + j] + F(b)[j], cdf = 0.5 * erfc(-v / sqrt(2.0));
      ry[i * h + j] = v * cdf;
      rdx[i * h + j] = F(dy)[i * h + j] * (cdf + v * exp(-0.5 * v * v) / sqrt(2.0 * M_PI));
      rdb[j] += rdx[i * h + j];
    }
  double e1 = err(y, ry), e2 = err(dx, rdx), e3 = err(db, rdb);
  printf("bias_gelu %lldx%lld: y %.2g dx %.2g db %.2g\n", (long long)rows, (long long)h, e1, e2, e3);
  CHECK(e1 < 1e-6 && e2 < 1e-6 && e3 < 1e-5, "bias_gelu differs from the double reference");
  /* cross-entropy over h classes, every 5th row ignored */
  int64_t ts[] = { rows };
  bl_tensor *tg = NULL, *loss = T(1, 1, 0, 0, 0, BL_F64), *dl = T(2, rows, h, 0, 0, BL_F32);
  if (bl_tensor_empty(1, ts, BL_I64, -1, &tg)) exit(1);
  for (int64_t i = 0; i < rows; i++) ((int64_t *)tg->data)[i] = i % 5 == 4 ? -100 : (i * 7919) % h;
  int64_t cnt = 0;
  OK(bl_cross_entropy(loss, dl, x, tg, -100, 1.0, &cnt));
  double rl = 0, *rdl = calloc((size_t)x->numel, 8);
  int64_t rc = 0;
  for (int64_t i = 0; i < rows; i++) {
    int64_t t = ((int64_t *)tg->data)[i];
    if (t == -100) continue;
    rc++;
  }
  for (int64_t i = 0; i < rows; i++) {
    int64_t t = ((int64_t *)tg->data)[i];
    if (t == -100) continue;
    double mx = -1e300, sum = 0;
    for (int64_t j = 0; j < h; j++) mx = fmax(mx, F(x)[i * h + j]);
    for (int64_t j = 0; j < h; j++) sum += exp(F(x)[i * h + j] - mx);
    rl += mx + log(sum) - F(x)[i * h + t];
    for (int64_t j = 0; j < h; j++) rdl[i * h + j] = (exp(F(x)[i * h + j] - mx) / sum - (j == t)) / (double)rc;
  }
  rl /= (double)rc;
  double el = fabs(*(double *)loss->data - rl) / rl, edl = err(dl, rdl);
  printf("cross_entropy %lldx%lld: loss %.2g dlogits %.2g\n", (long long)rows, (long long)h, el, edl);
  CHECK(cnt == rc && el < 1e-6 && edl < 1e-5, "cross_entropy differs from the double reference");
  for (int th = 1; th <= 3; th += 2) {
    bl_tensor *y2 = clone(y), *dx2 = clone(dx), *db2 = T(1, h, 0, 0, 0, BL_F32), *dl2 = clone(dl);
    bl_tensor *l2 = T(1, 1, 0, 0, 0, BL_F64);
    omp_set_num_threads(th);
    OK(bl_bias_gelu_forward(y2, x, b));
    OK(bl_bias_gelu_backward(dx2, db2, dy, x, b));
    OK(bl_cross_entropy(l2, dl2, x, tg, -100, 1.0, NULL));
    omp_set_num_threads(2);
    CHECK(same(y2, y) && same(dx2, dx) && same(db2, db), "bias_gelu with %d threads differs", th);
    CHECK(same(dl2, dl) && *(double *)l2->data == *(double *)loss->data, "cross_entropy with %d threads differs", th);
    bl_tensor_free(y2);
    bl_tensor_free(dx2);
    bl_tensor_free(db2);
    bl_tensor_free(dl2);
    bl_tensor_free(l2);
  }
  free(ry);
  free(rdx);
  free(rdb);
  free(rdl);
  bl_tensor *all[] = { x, b, dy, y, dx, db, tg, loss, dl };
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) bl_tensor_free(all[i]);
}

/* ------------------------------------------------------- softmax with a broadcast mask */
static void test_softmax(int64_t B, int64_t NH, int64_t S) {
  bl_tensor *x = R(4, B, NH, S, S), *m = T(4, B, 1, 1, S, BL_F32), *y = T(4, B, NH, S, S, BL_F32);
  bl_tensor *dy = R(4, B, NH, S, S), *dx = T(4, B, NH, S, S, BL_F32);
  for (int64_t b = 0; b < B; b++)
    for (int64_t j = 0; j < S; j++) F(m)[b * S + j] = j < S - 5 * b ? 0.0f : -10000.0f;
  OK(bl_softmax_forward(y, x, m));
  OK(bl_softmax_backward(dx, dy, y));
  double *ry = malloc((size_t)x->numel * 8), *rdx = malloc((size_t)x->numel * 8);
  for (int64_t r = 0; r < B * NH * S; r++) {
    int64_t b = r / (NH * S);
    double mx = -1e300, sum = 0, dot = 0;
    for (int64_t j = 0; j < S; j++) mx = fmax(mx, (double)F(x)[r * S + j] + F(m)[b * S + j]);
    for (int64_t j = 0; j < S; j++) {
      ry[r * S + j] = exp((double)F(x)[r * S + j] + F(m)[b * S + j] - mx);
      sum += ry[r * S + j];
    }
    for (int64_t j = 0; j < S; j++) {
      ry[r * S + j] /= sum;
      dot += (double)F(dy)[r * S + j] * F(y)[r * S + j];
    }
    for (int64_t j = 0; j < S; j++) rdx[r * S + j] = (double)F(y)[r * S + j] * (F(dy)[r * S + j] - dot);
  }
  double e1 = err(y, ry), e2 = err(dx, rdx);
  printf("softmax [%lld,%lld,%lld,%lld]: y %.2g dx %.2g\n", (long long)B, (long long)NH, (long long)S, (long long)S, e1,
         e2);
  CHECK(e1 < 1e-6 && e2 < 1e-6, "softmax differs from the double reference");
  bl_tensor *y2 = clone(y), *dx2 = clone(dx);
  omp_set_num_threads(1);
  OK(bl_softmax_forward(y2, x, m));
  OK(bl_softmax_backward(dx2, dy, y2));
  omp_set_num_threads(2);
  CHECK(same(y2, y) && same(dx2, dx), "softmax with 1 thread differs");
  free(ry);
  free(rdx);
  bl_tensor *all[] = { x, m, y, dy, dx, y2, dx2 };
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) bl_tensor_free(all[i]);
}

int main(void) {
  omp_set_num_threads(2);
  test_attention(2, 128, 2, 64, 0.1); /* BERT's head size, whole tiles */
  test_attention(2, 67, 3, 40, 0.0);  /* ragged rows and columns, no dropout */
  test_attention(1, 33, 2, 32, 0.3);
  test_residual_layernorm(300, 771, 0.1);
  test_residual_layernorm(64, 768, 0.0);
  test_bias_gelu_ce(200, 1031);
  test_softmax(2, 3, 131);
  if (failures) {
    printf("%d failure(s)\n", failures);
    return 1;
  }
  printf("all shape checks passed\n");
  return 0;
}
