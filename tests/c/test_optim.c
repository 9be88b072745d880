/* Flat-buffer optimizers (src/optim/) against straightforward f64 reference
 * implementations written here from the formulas in bl_optim.h: LAMB (apex
 * semantics and variants), AdamW/BertAdam, SGD; global norm; fused unscale;
 * determinism across thread counts; the bf16/f16 compute copy written by the
 * update pass; bad-input errors. Several steps on random
 * data with several segments, a no-decay segment, a zero-weight segment, a
 * zero-gradient segment and padding gaps that must stay untouched. */
#include "bertlua.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static uint64_t rng_state = 88172645463325252ull;
static double urand(void) { /* xorshift64*, uniform in [-1, 1) */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (double)((rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static bl_tensor *flat(int64_t n) {
  bl_tensor *t = NULL;
  if (bl_tensor_empty(1, &n, BL_F32, -1, &t)) {
    printf("alloc failed: %s\n", bl_last_error());
    exit(1);
  }
  return t;
}
static float *F(bl_tensor *t) { return (float *)t->data; }

/* ---------------------------------------------------------------- layout */
#define N    70000
#define NSEG 5
static const int64_t seg_off[NSEG] = { 0, 40016, 40400, 60500, 66000 };
static const int64_t seg_len[NSEG] = { 40000, 300, 20000, 5000, 3000 };
/* 0: big decayed (3 chunks), 1: bias (no decay), 2: decayed, weights zero,
 * 3: decayed, gradient zero, 4: no decay, gradient zero */
static const uint8_t seg_decay[NSEG] = { 1, 0, 1, 1, 0 };
static int in_seg(int64_t i) {
  for (int k = 0; k < NSEG; k++)
    if (i >= seg_off[k] && i < seg_off[k] + seg_len[k]) return k;
  return -1;
}
static bl_optim_segments SEGS = { NSEG, 0, seg_off, seg_len, seg_decay };

static void fill_state(double *w, double *m, double *v, double wscale) {
  for (int64_t i = 0; i < N; i++) {
    int k = in_seg(i);
    w[i] = (k == 2) ? 0.0 : wscale * urand();
    m[i] = 0.01 * urand();
    v[i] = 1e-4 * fabs(urand());
  }
}
static void fill_grad(double *g, double gscale) {
  for (int64_t i = 0; i < N; i++) {
    int k = in_seg(i);
    g[i] = (k == 3 || k == 4) ? 0.0 : gscale * urand();
  }
}
static void to_f32(bl_tensor *t, const double *x) {
  for (int64_t i = 0; i < N; i++) F(t)[i] = (float)x[i];
}
/* the reference starts from the f32-rounded values the C code sees */
static void round_f32(double *x) {
  for (int64_t i = 0; i < N; i++) x[i] = (double)(float)x[i];
}

static double max_err(const float *a, const double *b, double rtol, double atol, int64_t *where) {
  double worst = 0;
  for (int64_t i = 0; i < N; i++) {
    double e = fabs((double)a[i] - b[i]) / (atol + rtol * fabs(b[i]));
    if (!(e <= worst)) {
      worst = e;
      *where = i;
    }
  }
  return worst; /* <= 1 means within tolerance */
}

static void expect_close(const char *what, bl_tensor *t, const double *ref, double rtol, double atol) {
  int64_t at = -1;
  double e = max_err(F(t), ref, rtol, atol, &at);
  CHECK(e <= 1.0, "%s: element %lld got %.9g expected %.9g (err %.3g x tolerance)", what, (long long)at,
        at >= 0 ? F(t)[at] : 0.0, at >= 0 ? ref[at] : 0.0, e);
}

/* ---------------------------------------------------------------- references */
static double ref_global_norm(const double *g, double gs) {
  double s = 0;
  for (int k = 0; k < NSEG; k++)
    for (int64_t i = seg_off[k]; i < seg_off[k] + seg_len[k]; i++) s += (gs * g[i]) * (gs * g[i]);
  return sqrt(s);
}

static void ref_lamb(const bl_lamb_config *c, double *w, const double *g, double *m, double *v, int64_t step, double lr,
                     double gs) {
  double norm = ref_global_norm(g, gs);
  double clip = (c->max_grad_norm > 0 && norm > c->max_grad_norm) ? norm / c->max_grad_norm : 1.0;
  double bc1 = c->bias_correction ? 1 - pow(c->beta1, step) : 1, bc2 = c->bias_correction ? 1 - pow(c->beta2, step) : 1;
  static double u[N];
  for (int k = 0; k < NSEG; k++) {
    double wd = seg_decay[k] ? c->weight_decay : 0;
    double wn = 0, un = 0;
    for (int64_t i = seg_off[k]; i < seg_off[k] + seg_len[k]; i++) {
      double gi = gs * g[i] / clip;
      if (!c->adam_w_mode) gi += wd * w[i];
      m[i] = c->beta1 * m[i] + (c->grad_averaging ? 1 - c->beta1 : 1.0) * gi;
      v[i] = c->beta2 * v[i] + (1 - c->beta2) * gi * gi;
      u[i] = (m[i] / bc1) / (sqrt(v[i] / bc2) + c->eps) + (c->adam_w_mode ? wd * w[i] : 0);
      wn += w[i] * w[i];
      un += u[i] * u[i];
    }
    wn = sqrt(wn);
    un = sqrt(un);
    if (c->max_weight_norm > 0) wn = fmin(wn, c->max_weight_norm);
    double trust = 1;
    if (c->use_nvlamb || (seg_decay[k] && c->weight_decay != 0)) {
      trust = (wn > 0 && un > 0) ? wn / un : 1;
      if (c->max_trust_ratio > 0) trust = fmin(trust, c->max_trust_ratio);
    }
    for (int64_t i = seg_off[k]; i < seg_off[k] + seg_len[k]; i++) w[i] -= lr * trust * u[i];
  }
}

static void ref_adamw(const bl_adamw_config *c, double *w, const double *g, double *m, double *v, int64_t step,
                      double lr, double gs) {
  double norm = ref_global_norm(g, gs);
  double bc1 = c->bias_correction ? 1 - pow(c->beta1, step) : 1, bc2 = c->bias_correction ? 1 - pow(c->beta2, step) : 1;
  for (int k = 0; k < NSEG; k++) {
    double mul = gs;
    if (c->max_grad_norm > 0) {
      if (c->per_segment_clip) {
        double q = 0;
        for (int64_t i = seg_off[k]; i < seg_off[k] + seg_len[k]; i++) q += gs * g[i] * gs * g[i];
        double coef = c->max_grad_norm / (sqrt(q) + 1e-6);
        if (coef < 1) mul *= coef;
      } else if (norm > c->max_grad_norm)
        mul /= norm / c->max_grad_norm;
    }
    double wd = seg_decay[k] ? c->weight_decay : 0;
    for (int64_t i = seg_off[k]; i < seg_off[k] + seg_len[k]; i++) {
      double gi = mul * g[i] + (c->adam_w_mode ? 0 : wd * w[i]);
      m[i] = c->beta1 * m[i] + (1 - c->beta1) * gi;
      v[i] = c->beta2 * v[i] + (1 - c->beta2) * gi * gi;
      w[i] -= lr * ((m[i] / bc1) / (sqrt(v[i] / bc2) + c->eps) + (c->adam_w_mode ? wd * w[i] : 0));
    }
  }
}

static void ref_sgd(const bl_sgd_config *c, double *w, const double *g, double *b, int64_t step, double lr, double gs) {
  double norm = ref_global_norm(g, gs);
  double mul = gs;
  if (c->max_grad_norm > 0 && norm > c->max_grad_norm) mul /= norm / c->max_grad_norm;
  for (int k = 0; k < NSEG; k++) {
    double wd = seg_decay[k] ? c->weight_decay : 0;
    for (int64_t i = seg_off[k]; i < seg_off[k] + seg_len[k]; i++) {
      double d = mul * g[i] + wd * w[i];
      if (c->momentum > 0) {
        b[i] = step == 1 ? d : c->momentum * b[i] + (1 - c->dampening) * d;
        d = c->nesterov ? d + c->momentum * b[i] : b[i];
      }
      w[i] -= lr * d;
    }
  }
}

/* ---------------------------------------------------------------- runs */
static double W[N], G[N], M[N], V[N], W0[N];

static void run_lamb(const char *name, const bl_lamb_config *cfg, double gscale, double grad_scale, double wscale,
                     int expect_clip) {
  bl_tensor *w = flat(N), *g = flat(N), *m = flat(N), *v = flat(N);
  fill_state(W, M, V, wscale);
  round_f32(W);
  round_f32(M);
  round_f32(V);
  memcpy(W0, W, sizeof W);
  to_f32(w, W);
  to_f32(m, M);
  to_f32(v, V);
  double lr = 0.02;
  int clipped = 0;
  for (int64_t step = 1; step <= 5; step++) {
    fill_grad(G, gscale);
    round_f32(G);
    to_f32(g, G);
    bl_optim_stats st;
    int rc = bl_lamb_step(cfg, &(bl_optim_args){ .w = w,
                                                 .g = g,
                                                 .m = m,
                                                 .v = v,
                                                 .seg = &SEGS,
                                                 .step = step,
                                                 .lr = lr,
                                                 .grad_scale = grad_scale,
                                                 .stats = &st });
    CHECK(rc == 0, "%s: lamb_step failed: %s", name, bl_last_error());
    double norm = ref_global_norm(G, grad_scale);
    CHECK(fabs(st.grad_norm - norm) <= 1e-9 * norm, "%s: grad_norm %.12g vs %.12g", name, st.grad_norm, norm);
    if (st.clip_coef < 1) clipped = 1;
    ref_lamb(cfg, W, G, M, V, step, lr, grad_scale);
    lr *= 0.9;
  }
  CHECK(clipped == expect_clip, "%s: clipping active=%d, expected %d", name, clipped, expect_clip);
  char what[128];
  snprintf(what, sizeof what, "%s weights", name);
  expect_close(what, w, W, 1e-5, 1e-6);
  snprintf(what, sizeof what, "%s exp_avg", name);
  expect_close(what, m, M, 1e-5, 1e-7);
  snprintf(what, sizeof what, "%s exp_avg_sq", name);
  expect_close(what, v, V, 1e-5, 1e-12);
  /* the padding between segments is neither read nor written */
  for (int64_t i = 0; i < N; i++)
    if (in_seg(i) < 0 && F(w)[i] != (float)W0[i]) {
      CHECK(0, "%s: gap element %lld modified", name, (long long)i);
      break;
    }
  CHECK(F(w)[10] != (float)W0[10], "%s: weights did not change", name);
  bl_tensor_free(w);
  bl_tensor_free(g);
  bl_tensor_free(m);
  bl_tensor_free(v);
}

static void test_lamb(void) {
  bl_lamb_config c;
  bl_lamb_config_default(&c);
  CHECK(c.beta1 == 0.9 && c.beta2 == 0.999 && c.eps == 1e-6 && c.weight_decay == 0.01 && c.max_grad_norm == 1.0 &&
            c.bias_correction == 1 && c.use_nvlamb == 0 && c.adam_w_mode == 1 && c.grad_averaging == 1,
        "lamb defaults");
  run_lamb("lamb default (clipping active)", &c, 1.0, 1.0, 0.1, 1);
  /* gradients scaled by 1024 and grad_scale 1/1024: unscale fused; norm small: no clipping */
  run_lamb("lamb no clipping, grad_scale", &c, 1024.0 * 1e-3, 1.0 / 1024, 0.1, 0);
  c.max_grad_norm = 0;
  run_lamb("lamb max_grad_norm 0", &c, 1.0, 1.0, 0.1, 0);
  bl_lamb_config_default(&c);
  c.use_nvlamb = 1;
  run_lamb("lamb use_nvlamb", &c, 1.0, 1.0, 0.1, 1);
  bl_lamb_config_default(&c);
  c.bias_correction = 0;
  c.grad_averaging = 0;
  c.adam_w_mode = 0;
  run_lamb("lamb no bias correction, L2 mode, no grad averaging", &c, 1.0, 1.0, 0.1, 1);
  bl_lamb_config_default(&c);
  c.use_nvlamb = 1;
  c.max_weight_norm = 10;
  c.max_grad_norm = 0; /* paper variant: phi = min(||w||, 10) */
  run_lamb("lamb paper phi clamp (binds: ||w|| ~ 115)", &c, 1.0, 1.0, 1.0, 0);
  bl_lamb_config_default(&c);
  c.max_trust_ratio = 0.5;
  run_lamb("lamb trust ratio clamp", &c, 1.0, 1.0, 0.1, 1);
  bl_lamb_config_default(&c);
  c.weight_decay = 0; /* apex: no decay anywhere -> no trust ratio anywhere (plain Adam) */
  run_lamb("lamb weight_decay 0", &c, 1.0, 1.0, 0.1, 1);
}

/* Trust ratio special cases, checked by value on one-segment problems. */
static void test_lamb_trust_cases(void) {
  int64_t n = 1000;
  bl_tensor *w = flat(n), *g = flat(n), *m = flat(n), *v = flat(n);
  int64_t off = 0;
  uint8_t dec = 1;
  bl_optim_segments s = { 1, 0, &off, &n, &dec };
  bl_lamb_config c;
  bl_lamb_config_default(&c);
  c.max_grad_norm = 0;
  /* w = 0, decayed: ||w|| = 0 -> trust 1 -> w = -lr * m^/(sqrt(v^)+eps) ~ -lr*sign(g) at step 1 */
  for (int64_t i = 0; i < n; i++) {
    F(w)[i] = 0;
    F(g)[i] = (i % 2 ? 1.0f : -1.0f) * (0.5f + (float)i / n);
    F(m)[i] = 0;
    F(v)[i] = 0;
  }
  CHECK(bl_lamb_step(&c,
                     &(bl_optim_args){
                         .w = w, .g = g, .m = m, .v = v, .seg = &s, .step = 1, .lr = 0.1, .grad_scale = 1.0 }) == 0,
        "w=0: %s", bl_last_error());
  /* i = 0: g = -0.5, m^ = g, sqrt(v^) = |g| -> u = -0.5/(0.5+eps), w = -lr*u */
  CHECK(fabs(F(w)[0] - 0.1 * 0.5 / (0.5 + 1e-6)) < 1e-7, "w=0 trust 1: got %.9g", F(w)[0]);
  /* g = 0, w != 0, decay 0.01: u = wd*w -> trust = ||w||/||wd w|| = 100 -> w *= (1 - lr*100*0.01) */
  for (int64_t i = 0; i < n; i++) {
    F(w)[i] = 0.5f + (float)i / n;
    F(g)[i] = 0;
    F(m)[i] = 0;
    F(v)[i] = 0;
  }
  CHECK(bl_lamb_step(&c,
                     &(bl_optim_args){
                         .w = w, .g = g, .m = m, .v = v, .seg = &s, .step = 1, .lr = 0.1, .grad_scale = 1.0 }) == 0,
        "g=0: %s", bl_last_error());
  CHECK(fabs(F(w)[7] - (0.5f + 7.0f / n) * (1 - 0.1)) < 1e-6, "g=0 decayed: got %.9g", F(w)[7]);
  /* g = 0, no decay, nvlamb: u = 0 -> trust 1 and w unchanged */
  dec = 0;
  c.use_nvlamb = 1;
  for (int64_t i = 0; i < n; i++) {
    F(w)[i] = 0.5f;
    F(g)[i] = 0;
    F(m)[i] = 0;
    F(v)[i] = 0;
  }
  CHECK(bl_lamb_step(&c,
                     &(bl_optim_args){
                         .w = w, .g = g, .m = m, .v = v, .seg = &s, .step = 1, .lr = 0.1, .grad_scale = 1.0 }) == 0,
        "u=0: %s", bl_last_error());
  CHECK(F(w)[3] == 0.5f, "u=0: w changed to %.9g", F(w)[3]);
  bl_tensor_free(w);
  bl_tensor_free(g);
  bl_tensor_free(m);
  bl_tensor_free(v);
}

static void run_adamw(const char *name, const bl_adamw_config *cfg, double gscale) {
  bl_tensor *w = flat(N), *g = flat(N), *m = flat(N), *v = flat(N);
  fill_state(W, M, V, 0.1);
  round_f32(W);
  round_f32(M);
  round_f32(V);
  to_f32(w, W);
  to_f32(m, M);
  to_f32(v, V);
  double lr = 1e-3;
  for (int64_t step = 1; step <= 5; step++) {
    fill_grad(G, gscale);
    round_f32(G);
    to_f32(g, G);
    int rc = bl_adamw_step(
        cfg,
        &(bl_optim_args){ .w = w, .g = g, .m = m, .v = v, .seg = &SEGS, .step = step, .lr = lr, .grad_scale = 0.5 });
    CHECK(rc == 0, "%s: adamw_step failed: %s", name, bl_last_error());
    ref_adamw(cfg, W, G, M, V, step, lr, 0.5);
  }
  char what[128];
  snprintf(what, sizeof what, "%s weights", name);
  expect_close(what, w, W, 1e-5, 1e-6);
  snprintf(what, sizeof what, "%s exp_avg", name);
  expect_close(what, m, M, 1e-5, 1e-7);
  snprintf(what, sizeof what, "%s exp_avg_sq", name);
  expect_close(what, v, V, 1e-5, 1e-12);
  bl_tensor_free(w);
  bl_tensor_free(g);
  bl_tensor_free(m);
  bl_tensor_free(v);
}

static void test_adamw(void) {
  bl_adamw_config c;
  bl_adamw_config_default(&c);
  run_adamw("adamw", &c, 1.0);
  c.max_grad_norm = 1.0;
  run_adamw("adamw global clip", &c, 1.0);
  c.bias_correction = 0;
  c.per_segment_clip = 1;
  run_adamw("bertadam (no bias correction, per-segment clip)", &c, 1.0);
  bl_adamw_config_default(&c);
  c.adam_w_mode = 0;
  c.weight_decay = 0.1;
  run_adamw("adam L2 mode", &c, 1.0);
}

static void run_sgd(const char *name, const bl_sgd_config *cfg) {
  bl_tensor *w = flat(N), *g = flat(N), *b = flat(N);
  fill_state(W, M, V, 0.1);
  round_f32(W);
  to_f32(w, W);
  for (int64_t i = 0; i < N; i++) F(b)[i] = 123.0f; /* must be ignored at step 1 */
  double lr = 0.05;
  for (int64_t step = 1; step <= 4; step++) {
    fill_grad(G, 1.0);
    round_f32(G);
    to_f32(g, G);
    int rc = bl_sgd_step(cfg, &(bl_optim_args){ .w = w,
                                                .g = g,
                                                .m = cfg->momentum > 0 ? b : NULL,
                                                .seg = &SEGS,
                                                .step = step,
                                                .lr = lr,
                                                .grad_scale = 1.0 });
    CHECK(rc == 0, "%s: sgd_step failed: %s", name, bl_last_error());
    ref_sgd(cfg, W, G, M, step, lr, 1.0);
  }
  expect_close(name, w, W, 1e-5, 1e-6);
  bl_tensor_free(w);
  bl_tensor_free(g);
  bl_tensor_free(b);
}

static void test_sgd(void) {
  bl_sgd_config c;
  bl_sgd_config_default(&c);
  run_sgd("sgd plain", &c);
  c.momentum = 0.9;
  c.weight_decay = 1e-2;
  run_sgd("sgd momentum + decay", &c);
  c.dampening = 0.1;
  run_sgd("sgd dampening", &c);
  c.dampening = 0;
  c.nesterov = 1;
  c.max_grad_norm = 5;
  run_sgd("sgd nesterov + clip", &c);
}

static void test_norm_and_unscale(void) {
  int64_t n = 100003;
  bl_tensor *g = flat(n), *h = NULL, *o = flat(n);
  double ref = 0;
  for (int64_t i = 0; i < n; i++) {
    F(g)[i] = (float)(3.0 * urand());
    ref += (double)F(g)[i] * F(g)[i];
  }
  ref = sqrt(ref);
  double nrm = 0, nrm1 = 0;
  int bad = -1;
  CHECK(bl_grad_global_norm(g, &nrm, &bad) == 0 && bad == 0, "norm: %s", bl_last_error());
  CHECK(fabs(nrm - ref) <= 1e-12 * ref, "norm %.15g vs %.15g", nrm, ref);
  int nt = bl_num_threads();
  bl_set_num_threads(1);
  bl_grad_global_norm(g, &nrm1, NULL);
  bl_set_num_threads(nt);
  CHECK(nrm1 == nrm, "norm not bitwise reproducible across thread counts: %.17g vs %.17g", nrm1, nrm);
  F(g)[77777] = INFINITY;
  bl_grad_global_norm(g, &nrm, &bad);
  CHECK(bad == 1 && isinf(nrm), "norm with inf: bad=%d norm=%g", bad, nrm);
  F(g)[77777] = NAN;
  bl_grad_global_norm(g, &nrm, &bad);
  CHECK(bad == 1, "norm with NaN not flagged");
  F(g)[77777] = 1.5f;

  /* unscale: values and clean flag */
  float keep = F(g)[12345];
  CHECK(bl_unscale_check(g, 1.0 / 65536, &bad) == 0 && bad == 0, "unscale clean: %s bad=%d", bl_last_error(), bad);
  CHECK(F(g)[12345] == keep * (float)(1.0 / 65536), "unscale value %.9g vs %.9g", F(g)[12345], keep / 65536);
  F(g)[n - 1] = INFINITY;
  CHECK(bl_unscale_check(g, 0.5, &bad) == 0 && bad == 1, "unscale did not flag inf in the last element");
  F(g)[n - 1] = 0;
  F(g)[0] = NAN;
  CHECK(bl_unscale_check(g, 0.5, &bad) == 0 && bad == 1, "unscale did not flag NaN in the first element");
  F(g)[0] = 3e38f; /* finite before, overflows after x4 */
  CHECK(bl_unscale_check(g, 4.0, &bad) == 0 && bad == 1, "unscale did not flag overflow after the multiply");
  F(g)[0] = 1;
  CHECK(bl_unscale_check(g, 0.0, &bad) == BL_EINVAL, "unscale accepted inv_scale 0");
  CHECK(bl_unscale_check(g, NAN, &bad) == BL_EINVAL, "unscale accepted inv_scale NaN");

  /* half-precision gradients -> f32 master gradients */
  int dts[2] = { BL_F16, BL_BF16 };
  for (int d = 0; d < 2; d++) {
    CHECK(bl_tensor_empty(1, &n, dts[d], -1, &h) == 0, "alloc half");
    uint16_t *hp = h->data;
    for (int64_t i = 0; i < n; i++) {
      float x = (float)(1000.0 * urand());
      hp[i] = dts[d] == BL_F16 ? bl_f32_to_f16(x) : bl_f32_to_bf16(x);
    }
    CHECK(bl_unscale_to_f32(o, h, 1.0 / 1024, &bad) == 0 && bad == 0, "unscale_to_f32: %s", bl_last_error());
    float back = dts[d] == BL_F16 ? bl_f16_to_f32(hp[999]) : bl_bf16_to_f32(hp[999]);
    CHECK(F(o)[999] == back * (float)(1.0 / 1024), "unscale_to_f32 value %.9g vs %.9g", F(o)[999], back / 1024);
    hp[5] = dts[d] == BL_F16 ? 0x7c00 : 0x7f80; /* +inf */
    CHECK(bl_unscale_to_f32(o, h, 1.0 / 1024, &bad) == 0 && bad == 1, "unscale_to_f32 missed inf");
    bl_tensor_free(h);
  }
  bl_tensor_free(g);
  bl_tensor_free(o);
}

/* LAMB results do not depend on the thread count (fixed chunk reductions). */
static void test_determinism(void) {
  bl_tensor *w[2], *g = flat(N), *m[2], *v[2];
  fill_state(W, M, V, 0.1);
  fill_grad(G, 1.0);
  to_f32(g, G);
  int nt = bl_num_threads();
  for (int r = 0; r < 2; r++) {
    w[r] = flat(N);
    m[r] = flat(N);
    v[r] = flat(N);
    to_f32(w[r], W);
    to_f32(m[r], M);
    to_f32(v[r], V);
    bl_set_num_threads(r == 0 ? 1 : (nt > 1 ? nt : 3));
    bl_lamb_config c;
    bl_lamb_config_default(&c);
    for (int s = 1; s <= 3; s++)
      bl_lamb_step(
          &c, &(bl_optim_args){
                  .w = w[r], .g = g, .m = m[r], .v = v[r], .seg = &SEGS, .step = s, .lr = 0.01, .grad_scale = 1.0 });
  }
  bl_set_num_threads(nt);
  CHECK(memcmp(w[0]->data, w[1]->data, N * 4) == 0, "lamb weights differ between 1 and %d threads", nt);
  for (int r = 0; r < 2; r++) {
    bl_tensor_free(w[r]);
    bl_tensor_free(m[r]);
    bl_tensor_free(v[r]);
  }
  bl_tensor_free(g);
}

/* The compute copy (bl_optim.h `half`) written by the update pass: master weights and copy bit for bit those of the
 * step without it followed by a cast of the whole buffer (what refreshed the copy before), for LAMB (trust and
 * plain segments), AdamW and SGD with momentum, bf16 and f16, over three steps. The copies start as the cast of the
 * initial weights, so an element the step forgot (or wrote outside the segments) differs. */
static void test_compute_copy(void) {
  double *w = malloc(sizeof(double) * N), *g = malloc(sizeof(double) * N), *m = malloc(sizeof(double) * N),
         *v = malloc(sizeof(double) * N);
  static const char *names[] = { "lamb", "adamw", "sgd momentum" };
  for (int kind = 0; kind < 3; kind++)
    for (int h = 0; h < 2; h++) {
      const int dt = h ? BL_F16 : BL_BF16;
      const int64_t n = N;
      bl_tensor *x[4], *y[4], *hx = NULL, *hy = NULL;
      fill_state(w, m, v, 0.5);
      for (int i = 0; i < 4; i++) {
        x[i] = flat(N);
        y[i] = flat(N);
      }
      to_f32(x[0], w);
      to_f32(x[2], m);
      to_f32(x[3], v);
      for (int i = 0; i < 4; i += i == 0 ? 2 : 1) memcpy(F(y[i]), F(x[i]), sizeof(float) * N);
      bl_tensor_empty(1, &n, dt, -1, &hx);
      bl_tensor_empty(1, &n, dt, -1, &hy);
      bl_tensor_copy(hx, x[0]);
      bl_tensor_copy(hy, y[0]);
      bl_lamb_config lc;
      bl_adamw_config ac;
      bl_sgd_config sc;
      bl_lamb_config_default(&lc);
      bl_adamw_config_default(&ac);
      bl_sgd_config_default(&sc);
      sc.momentum = 0.9;
      sc.weight_decay = 0.01;
      int rc = 0;
      for (int64_t step = 1; step <= 3; step++) {
        fill_grad(g, 0.1);
        to_f32(x[1], g);
        to_f32(y[1], g);
        for (int k = 0; k < 2; k++) {
          bl_tensor **b = k ? y : x, *half = k ? hy : NULL;
          if (kind == 0)
            rc |= bl_lamb_step(&lc, &(bl_optim_args){ .w = b[0],
                                                      .half = half,
                                                      .g = b[1],
                                                      .m = b[2],
                                                      .v = b[3],
                                                      .seg = &SEGS,
                                                      .step = step,
                                                      .lr = 0.01,
                                                      .grad_scale = 0.5 });
          if (kind == 1)
            rc |= bl_adamw_step(&ac, &(bl_optim_args){ .w = b[0],
                                                       .half = half,
                                                       .g = b[1],
                                                       .m = b[2],
                                                       .v = b[3],
                                                       .seg = &SEGS,
                                                       .step = step,
                                                       .lr = 0.01,
                                                       .grad_scale = 0.5 });
          if (kind == 2)
            rc |= bl_sgd_step(&sc, &(bl_optim_args){ .w = b[0],
                                                     .half = half,
                                                     .g = b[1],
                                                     .m = b[2],
                                                     .seg = &SEGS,
                                                     .step = step,
                                                     .lr = 0.01,
                                                     .grad_scale = 0.5 });
        }
        rc |= bl_tensor_copy(hx, x[0]); /* the refresh cast */
      }
      CHECK(rc == 0, "%s %s: %s", names[kind], bl_dtype_name(dt), bl_last_error());
      CHECK(!memcmp(F(x[0]), F(y[0]), sizeof(float) * N) && !memcmp(hx->data, hy->data, 2 * (size_t)N),
            "%s %s: the step writing the compute copy differs from step + cast", names[kind], bl_dtype_name(dt));
      for (int i = 0; i < 4; i++) {
        bl_tensor_free(x[i]);
        bl_tensor_free(y[i]);
      }
      bl_tensor_free(hx);
      bl_tensor_free(hy);
    }
  free(w);
  free(g);
  free(m);
  free(v);
}

static void expect_err(int rc, int status, const char *needle, const char *what) {
  CHECK(rc == status, "%s: expected status %d, got %d (%s)", what, status, rc, bl_last_error());
  CHECK(strstr(bl_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", what, bl_last_error(), needle);
}

static void test_bad_input(void) {
  bl_tensor *w = flat(N), *g = flat(N), *m = flat(N), *v = flat(N), *small = flat(N - 1), *d64 = NULL;
  int64_t n = N;
  bl_tensor_empty(1, &n, BL_F64, -1, &d64);
  fill_state(W, M, V, 0.1);
  fill_grad(G, 1.0);
  to_f32(w, W);
  to_f32(g, G);
  to_f32(m, M);
  to_f32(v, V);
  bl_lamb_config c;
  bl_lamb_config_default(&c);
  expect_err(
      bl_lamb_step(
          &c,
          &(bl_optim_args){ .w = w, .g = small, .m = m, .v = v, .seg = &SEGS, .step = 1, .lr = 0.1, .grad_scale = 1 }),
      BL_EINVAL, "grads has 69999 elements", "mismatched numel");
  expect_err(bl_lamb_step(&c,
                          &(bl_optim_args){
                              .w = w, .g = g, .m = d64, .v = v, .seg = &SEGS, .step = 1, .lr = 0.1, .grad_scale = 1 }),
             BL_EINVAL, "exp_avg must be a flat f32", "f64 moment");
  bl_tensor fake = *v;
  fake.device = 0;
  expect_err(
      bl_lamb_step(
          &c,
          &(bl_optim_args){ .w = w, .g = g, .m = m, .v = &fake, .seg = &SEGS, .step = 1, .lr = 0.1, .grad_scale = 1 }),
      BL_EINVAL, "different devices (cpu and cuda:0)", "mixed devices");
  expect_err(
      bl_lamb_step(
          &c, &(bl_optim_args){ .w = w, .g = g, .m = m, .v = m, .seg = &SEGS, .step = 1, .lr = 0.1, .grad_scale = 1 }),
      BL_EINVAL, "share memory", "aliased moments");
  int64_t ov_off[2] = { 0, 100 }, ov_len[2] = { 200, 50 };
  bl_optim_segments ov = { 2, 0, ov_off, ov_len, NULL };
  expect_err(
      bl_lamb_step(
          &c, &(bl_optim_args){ .w = w, .g = g, .m = m, .v = v, .seg = &ov, .step = 1, .lr = 0.1, .grad_scale = 1 }),
      BL_EINVAL, "overlap", "overlapping segments");
  int64_t oob_off[1] = { N - 10 }, oob_len[1] = { 11 };
  bl_optim_segments oob = { 1, 0, oob_off, oob_len, NULL };
  expect_err(
      bl_adamw_step(
          NULL, &(bl_optim_args){ .w = w, .g = g, .m = m, .v = v, .seg = &oob, .step = 1, .lr = 0.1, .grad_scale = 1 }),
      BL_EINVAL, "config is NULL", "null cfg");
  bl_adamw_config ac;
  bl_adamw_config_default(&ac);
  expect_err(
      bl_adamw_step(
          &ac, &(bl_optim_args){ .w = w, .g = g, .m = m, .v = v, .seg = &oob, .step = 1, .lr = 0.1, .grad_scale = 1 }),
      BL_EINVAL, "outside the flat buffer", "segment out of bounds");
  int64_t neg_off[1] = { -1 }, one[1] = { 1 };
  bl_optim_segments neg = { 1, 0, neg_off, one, NULL };
  expect_err(
      bl_adamw_step(
          &ac, &(bl_optim_args){ .w = w, .g = g, .m = m, .v = v, .seg = &neg, .step = 1, .lr = 0.1, .grad_scale = 1 }),
      BL_EINVAL, "outside", "negative offset");
  expect_err(
      bl_lamb_step(&c, &(bl_optim_args){ .w = w, .g = g, .m = m, .v = v, .seg = &SEGS, .lr = 0.1, .grad_scale = 1 }),
      BL_EINVAL, "step must be >= 1", "step 0");
  expect_err(
      bl_lamb_step(
          &c, &(bl_optim_args){ .w = w, .g = g, .m = m, .v = v, .seg = &SEGS, .step = 1, .lr = NAN, .grad_scale = 1 }),
      BL_EINVAL, "learning rate", "lr NaN");
  c.beta2 = 1.0;
  expect_err(
      bl_lamb_step(
          &c, &(bl_optim_args){ .w = w, .g = g, .m = m, .v = v, .seg = &SEGS, .step = 1, .lr = 0.1, .grad_scale = 1 }),
      BL_EINVAL, "beta2 must be in [0, 1)", "beta2");
  bl_lamb_config_default(&c);
  /* non-finite gradient: error, and nothing written */
  F(g)[500] = NAN;
  float w0 = F(w)[3], m0 = F(m)[3];
  bl_optim_stats st;
  expect_err(
      bl_lamb_step(
          &c,
          &(bl_optim_args){
              .w = w, .g = g, .m = m, .v = v, .seg = &SEGS, .step = 1, .lr = 0.1, .grad_scale = 1, .stats = &st }),
      BL_EINVAL, "non-finite gradient", "NaN grad");
  CHECK(st.nonfinite == 1, "stats.nonfinite not set");
  CHECK(F(w)[3] == w0 && F(m)[3] == m0, "NaN gradient modified the state");
  expect_err(
      bl_adamw_step(
          &ac, &(bl_optim_args){ .w = w, .g = g, .m = m, .v = v, .seg = &SEGS, .step = 1, .lr = 0.1, .grad_scale = 1 }),
      BL_EINVAL, "non-finite", "adamw NaN");
  F(g)[500] = 0.25f;
  expect_err(bl_lamb_step(&c, &(bl_optim_args){ .w = w,
                                                .g = g,
                                                .m = m,
                                                .v = v,
                                                .seg = &SEGS,
                                                .step = 1,
                                                .lr = 0.1,
                                                .grad_scale = 1,
                                                .grad_norm = INFINITY,
                                                .has_grad_norm = 1 }),
             BL_EINVAL, "non-finite", "caller-given inf norm");
  bl_sgd_config sc;
  bl_sgd_config_default(&sc);
  sc.momentum = 0.9;
  expect_err(bl_sgd_step(&sc, &(bl_optim_args){ .w = w, .g = g, .seg = &SEGS, .step = 1, .lr = 0.1, .grad_scale = 1 }),
             BL_EINVAL, "momentum buffer", "sgd no buffer");
  sc.momentum = 0;
  sc.nesterov = 1;
  expect_err(bl_sgd_step(&sc, &(bl_optim_args){ .w = w, .g = g, .seg = &SEGS, .step = 1, .lr = 0.1, .grad_scale = 1 }),
             BL_EINVAL, "nesterov", "nesterov no momentum");
  int bad;
  expect_err(bl_unscale_check(d64, 0.5, &bad), BL_EINVAL, "must be a flat f32", "unscale f64");
  double nrm;
  if (!bl_cuda_compiled()) /* with CUDA the twin runs (test_cuda_optim) */
    expect_err(bl_grad_global_norm(&fake, &nrm, NULL), BL_EDEVICE, "built without CUDA", "norm on cuda");
  /* a caller-given norm is used as is: with norm 2 and max 1 the gradients are halved */
  bl_lamb_config_default(&c);
  CHECK(bl_lamb_step(&c, &(bl_optim_args){ .w = w,
                                           .g = g,
                                           .m = m,
                                           .v = v,
                                           .seg = &SEGS,
                                           .step = 1,
                                           .lr = 0.1,
                                           .grad_scale = 1,
                                           .grad_norm = 2.0,
                                           .has_grad_norm = 1,
                                           .stats = &st }) == 0 &&
            st.clip_coef == 0.5 && st.grad_norm == 2.0,
        "given norm: rc/clip %g", st.clip_coef);
  bl_tensor_free(w);
  bl_tensor_free(g);
  bl_tensor_free(m);
  bl_tensor_free(v);
  bl_tensor_free(small);
  bl_tensor_free(d64);
}

/* BL_OPTIM_BENCH=<numel> test_optim: throughput instead of tests, on a
 * BERT-like layout (100 large decayed segments, 100 1024-element no-decay). */
#include <time.h>
static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
static int bench(int64_t n) {
  bl_tensor *w = flat(n), *g = flat(n), *m = flat(n), *v = flat(n);
  bl_rand_uniform(w, 1, 0, -0.1, 0.1);
  bl_rand_uniform(g, 2, 0, -1, 1);
  bl_tensor_fill(m, 0);
  bl_tensor_fill(v, 0);
  enum { NS = 200 };
  int64_t off[NS], len[NS], big = (n - 100 * 1024) / 100, o = 0;
  uint8_t dec[NS];
  if (big < 1) {
    printf("bench: numel too small\n");
    return 1;
  }
  for (int k = 0; k < NS; k++) {
    off[k] = o;
    len[k] = k % 2 ? 1024 : big;
    dec[k] = !(k % 2);
    o += len[k];
  }
  bl_optim_segments s = { NS, 0, off, len, dec };
  bl_lamb_config lc;
  bl_lamb_config_default(&lc);
  bl_adamw_config ac;
  bl_adamw_config_default(&ac);
  const int reps = 5;
  double t0, t, nrm;
  int bad;
  printf("%lld params, %d threads\n", (long long)n, bl_num_threads());
  bl_lamb_step(&lc,
               &(bl_optim_args){ .w = w, .g = g, .m = m, .v = v, .seg = &s, .step = 1, .lr = 1e-3, .grad_scale = 1 });
  t0 = now_s();
  for (int r = 0; r < reps; r++)
    bl_lamb_step(
        &lc, &(bl_optim_args){ .w = w, .g = g, .m = m, .v = v, .seg = &s, .step = 2 + r, .lr = 1e-3, .grad_scale = 1 });
  t = (now_s() - t0) / reps;
  printf("lamb_step    %8.1f ms  %.3f Gparam/s\n", 1e3 * t, n / t / 1e9);
  t0 = now_s();
  for (int r = 0; r < reps; r++)
    bl_adamw_step(
        &ac, &(bl_optim_args){ .w = w, .g = g, .m = m, .v = v, .seg = &s, .step = 2 + r, .lr = 1e-3, .grad_scale = 1 });
  t = (now_s() - t0) / reps;
  printf("adamw_step   %8.1f ms  %.3f Gparam/s\n", 1e3 * t, n / t / 1e9);
  t0 = now_s();
  for (int r = 0; r < reps; r++) bl_grad_global_norm(g, &nrm, NULL);
  t = (now_s() - t0) / reps;
  printf("global_norm  %8.1f ms  %.1f GB/s read\n", 1e3 * t, 4.0 * n / t / 1e9);
  t0 = now_s();
  for (int r = 0; r < reps; r++) bl_unscale_check(g, 1.0, &bad);
  t = (now_s() - t0) / reps;
  printf("unscale      %8.1f ms  %.1f GB/s read+write\n", 1e3 * t, 8.0 * n / t / 1e9);
  bl_tensor_free(w);
  bl_tensor_free(g);
  bl_tensor_free(m);
  bl_tensor_free(v);
  return 0;
}

int main(void) {
  const char *b = getenv("BL_OPTIM_BENCH");
  if (b) return bench(atoll(b));
  test_lamb();
  test_lamb_trust_cases();
  test_adamw();
  test_sgd();
  test_norm_and_unscale();
  test_determinism();
  test_compute_copy();
  test_bad_input();
  if (failures) {
    printf("%d failure(s)\n", failures);
    return 1;
  }
  printf("test_optim: all passed\n");
  return 0;
}
