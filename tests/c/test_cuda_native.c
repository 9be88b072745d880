/* Native bf16/f16 paths of the CUDA lookups, casts and losses vs their CPU twins (kernels/embedding.cu,
 * elementwise.cu, loss.cu vs src/ops): random non-zero inputs made on the CPU, rounded once to the storage dtype,
 * the same rounded values given to both devices, device outputs poisoned with NaN first.
 *
 * Tolerances from the arithmetic of each pair:
 *  - lookups copy values (forward) or sum them in f32 in index order from the target's current value (backward,
 *    also on the CPU: f32 image of the target, one rounding at the end): bitwise equal, compared with 0 tolerance;
 *  - casts round once, each side to nearest even from the same value: bitwise equal;
 *  - cross-entropy: both take max, sum of exp and the loss per row in f32/f64 over the same rounded logits; the
 *    CPU sums the row in order, the device in a block tree with an online rescaling of the running sum, so the
 *    f32 sum of c terms differs by at most ~2 c u_f32 relative (c <= 30522: 4e-3 would be the worst case bound,
 *    random rounding gives ~sqrt(c) u: 1e-5 relative is used with an absolute floor). dlogits = softmax * g,
 *    rounded to bf16/f16: one rounding on each side of values that differ by 1e-5 relative, so they differ by at
 *    most one unit in the last place: 2^-8 (bf16, 8-bit significand incl. the hidden bit, rounding to nearest
 *    gives 2^-8 relative) / 2^-11 (f16) relative plus the f32 difference.
 * The conversion counter (bl_cuda_counters().conversions) must not move across the native calls.
 * Determinism: the backward lookups are rerun and compared bitwise.
 * Without a CUDA device (or in a CPU-only build): prints "skipped: ..." and exits 77. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bertlua.h"
#include "check.h"
#ifdef BL_HAVE_CUDA
#include "device/cuda_ops.h"
#endif

#ifndef BL_HAVE_CUDA
int main(void) {
  printf("skipped: no CUDA device (CPU-only build, bl_cuda_compiled() = %d)\n", bl_cuda_compiled());
  return 77;
}
#else

static int checks = 0;
static const int DEV = 0;

#define SH(...) \
  (const int64_t[]) { __VA_ARGS__ }

static bl_tensor *mk(int dev, int dtype, int nd, const int64_t *shape) {
  bl_tensor *t = NULL;
  if (bl_tensor_empty(nd, shape, dtype, dev, &t)) {
    printf("FAIL alloc: %s\n", bl_last_error());
    exit(1);
  }
  if (dev >= 0 && t->numel > 0 && bl_dtype_is_float(dtype)) bl_cuda_tensor_fill(t, NAN); /* poison */
  return t;
}
/* Random values in [lo, hi) rounded to dtype, on the CPU. */
static bl_tensor *rnd(int dtype, int nd, const int64_t *shape, uint64_t seed, double lo, double hi) {
  bl_tensor *f = mk(-1, BL_F32, nd, shape), *t = mk(-1, dtype, nd, shape);
  OK(bl_rand_uniform(f, seed, 0, lo, hi));
  OK(bl_tensor_copy(t, f));
  bl_tensor_free(f);
  return t;
}
static bl_tensor *up(const bl_tensor *c) {
  bl_tensor *d = mk(DEV, c->dtype, c->ndim, c->shape);
  OK(bl_tensor_copy(d, c));
  return d;
}
static double *host(const bl_tensor *t) {
  bl_tensor *h = mk(-1, t->dtype, t->ndim, t->shape);
  OK(bl_tensor_copy(h, t));
  double *v = malloc(sizeof(double) * (size_t)(t->numel ? t->numel : 1));
  OK(bl_tensor_to_doubles(h, v, t->numel));
  bl_tensor_free(h);
  return v;
}
static void close_(const char *name, const bl_tensor *ref, const bl_tensor *got, double rtol, double atol) {
  checks++;
  double *a = host(ref), *b = host(got), worst = 0;
  int64_t bad = -1;
  for (int64_t i = 0; i < ref->numel; i++) {
    double e = fabs(a[i] - b[i]);
    if (!(e <= atol + rtol * fabs(a[i])) && bad < 0) bad = i;
    if (e > worst || e != e) worst = e;
  }
  if (bad >= 0) {
    printf("FAIL %s: element %lld cpu %.9g gpu %.9g (max abs err %.3g)\n", name, (long long)bad, a[bad], b[bad], worst);
    failures++;
  }
  free(a);
  free(b);
}
static void F(bl_tensor *t) { bl_tensor_free(t); }
static int64_t conversions(void) {
  bl_cuda_count c;
  OK(bl_cuda_counters(DEV, &c));
  return c.conversions;
}
static void no_conversion(const char *what, int64_t before) {
  checks++;
  int64_t d = conversions() - before;
  if (d) {
    printf("FAIL %s: %lld generic conversions (expected a native path)\n", what, (long long)d);
    failures++;
  }
}

/* ids in [0, rows): every 5th the padding id 0, the others from a few values (repeats) or anywhere. */
static bl_tensor *make_ids(int dtype, int64_t n, int64_t rows, int few, uint64_t seed) {
  bl_tensor *t = mk(-1, dtype, 1, SH(n));
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int64_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    int64_t v = (int64_t)((s >> 33) % (uint64_t)(few ? (rows < 9 ? rows : 9) : rows));
    if (few && rows > 9) v = v * (rows / 9); /* few distinct ids spread over a large vocabulary */
    if (i % 5 == 0) v = 0;
    if (dtype == BL_I32)
      ((int32_t *)t->data)[i] = (int32_t)v;
    else
      ((int64_t *)t->data)[i] = v;
  }
  return t;
}

/* ---------------------------------------------------------------- embedding, gather */
static void test_lookups(void) {
  const struct {
    int dt;
    int64_t rows, h, n;
    int few, gdt_f32;
  } cases[] = {
    { BL_BF16, 30522, 64, 200, 1, 1 }, /* BERT's vocabulary, few ids, f32 gradient table (the flat buffer) */
    { BL_F16, 37, 40, 300, 0, 1 },     { BL_BF16, 37, 40, 300, 0, 0 }, /* gradient in the activations' dtype */
    { BL_F32, 30522, 33, 150, 0, 1 },                                  /* odd row: scalar path */
    { BL_BF16, 2, 24, 9000, 0, 1 },  /* token types: two long segments, three sort tiles */
    { BL_BF16, 512, 8, 4100, 1, 0 }, /* positions: one vector per row, a tile and a few more */
    { BL_F16, 7, 13, 77, 0, 0 },     /* odd row in a half type: scalar path */
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const int dt = cases[k].dt, gdt = cases[k].gdt_f32 ? BL_F32 : dt;
    const int64_t R = cases[k].rows, H = cases[k].h, N = cases[k].n;
    char name[128];
    bl_tensor *tab = rnd(dt, 2, SH(R, H), 10 + k, -1, 1);
    bl_tensor *ids = make_ids(k & 1 ? BL_I64 : BL_I32, N, R, cases[k].few, k);
    bl_tensor *out = rnd(dt, 2, SH(N, H), 20 + k, -1, 1);
    bl_tensor *d_tab = up(tab), *d_ids = up(ids), *d_out = up(out);
    int64_t c0 = conversions();
    for (int acc = 0; acc <= 1; acc++) { /* accumulate: onto the previous result */
      OK(bl_embedding_forward(out, tab, ids, acc));
      OK(bl_cuda_embedding_forward(d_out, d_tab, d_ids, acc));
      snprintf(name, sizeof name, "embedding %s [%lld x %lld] n=%lld accumulate=%d", bl_dtype_name(dt), (long long)R,
               (long long)H, (long long)N, acc);
      close_(name, out, d_out, 0, 0);
    }
    bl_tensor *gt = rnd(gdt, 2, SH(R, H), 30 + k, -1, 1), *g = rnd(dt, 2, SH(N, H), 40 + k, -1, 1);
    bl_tensor *d_gt = up(gt), *d_gt2 = up(gt), *d_g = up(g);
    OK(bl_embedding_backward(gt, g, ids));
    OK(bl_cuda_embedding_backward(d_gt, d_g, d_ids));
    OK(bl_cuda_embedding_backward(d_gt2, d_g, d_ids));
    snprintf(name, sizeof name, "embedding backward %s -> %s [%lld x %lld] n=%lld", bl_dtype_name(dt),
             bl_dtype_name(gdt), (long long)R, (long long)H, (long long)N);
    close_(name, gt, d_gt, 0, 0);
    close_("embedding backward rerun (bitwise)", d_gt, d_gt2, 0, 0);
    no_conversion(name, c0);
    F(tab);
    F(ids);
    F(out);
    F(d_tab);
    F(d_ids);
    F(d_out);
    F(gt);
    F(g);
    F(d_gt);
    F(d_gt2);
    F(d_g);
  }
  /* gather of rows of a [B*S, H] activation and its backward into a zeroed gradient of the activations' dtype */
  const int64_t B = 3, S = 45, H = 48, P = 20;
  for (int dt = 0; dt < 2; dt++) {
    const int t = dt ? BL_F16 : BL_BF16;
    bl_tensor *x = rnd(t, 2, SH(B * S, H), 50 + dt, -1, 1), *pos = make_ids(BL_I32, P, B * S, 0, 60 + dt);
    bl_tensor *y = mk(-1, t, 2, SH(P, H)), *d_x = up(x), *d_pos = up(pos), *d_y = mk(DEV, t, 2, SH(P, H));
    int64_t c0 = conversions();
    OK(bl_gather_forward(y, x, pos));
    OK(bl_cuda_gather_forward(d_y, d_x, d_pos));
    close_(dt ? "gather f16" : "gather bf16", y, d_y, 0, 0);
    bl_tensor *dy = rnd(t, 2, SH(P, H), 70 + dt, -1, 1), *dx = mk(-1, t, 2, SH(B * S, H));
    OK(bl_tensor_fill(dx, 0));
    bl_tensor *d_dy = up(dy), *d_dx = up(dx);
    OK(bl_gather_backward(dx, dy, pos));
    OK(bl_cuda_gather_backward(d_dx, d_dy, d_pos));
    close_(dt ? "gather backward f16" : "gather backward bf16", dx, d_dx, 0, 0);
    no_conversion("gather", c0);
    F(x);
    F(pos);
    F(y);
    F(d_x);
    F(d_pos);
    F(d_y);
    F(dy);
    F(dx);
    F(d_dy);
    F(d_dx);
  }
}

/* ---------------------------------------------------------------- embedding sum + LayerNorm + dropout
 * Reference: the CPU entry point (bl_embedding_forward x3 into an f32 sum, bl_layernorm_forward, bl_dropout_forward
 * and their backwards). Rounding analysis, u = 2^-8 (bf16) / 2^-11 (f16) / 0 (f32), the unit roundoff of T:
 *  - s = word + position + type: the same f32 additions in the same order on both sides: equal.
 *  - mean, rstd: f32 sums of H terms in another order (block tree vs the CPU's lanes): |err| <= H u32 of the sum of
 *    |terms|; with H <= 64 and s = O(1) that is < 1e-5 relative: rtol 1e-5.
 *  - y = (s - m) rs g + b (dropped, times 1/(1-p)): the f32 values differ by < 1e-5 relative (from m, rs), then each
 *    side rounds once to T, so they may land on neighbouring values: one spacing, <= 2u relative: rtol 2u + 1e-5.
 *  - ds (gradient of s) = rs (dy' g - a - xhat b) in f32 on both sides: the row sums a, b (and m, rs) differ by up
 *    to 1e-5 of their sums of |terms|: with e_i = 1e-5 rs sum_j |dy' g| (1 + |xhat_j|) / H, a moves by e_i, b by
 *    e_i, and |b| e_i (1 + |xhat|) bounds the xhat term, so the two f32 ds differ by at most
 *    D = 1e-5 |ds| + 2 e_i (1 + |xhat|) (+ 2 u32 |ds| for forming ds +- D in f32 here).
 *  - tables: the device rounds ds to T (one rounding per element; ds stays f32 on the CPU) and adds the rows in f32
 *    onto the target, word and position rows in index order (the CPU's chain), token types in chunked column sums.
 *    The reference does the same from the CPU's f32 ds: R = g0 + T(ds_1) + ... + T(ds_k), an f32 chain in index
 *    order (word, position) or in f64 (token types). T is monotone, so the device's T(ds') with |ds' - ds| <= D is
 *    within w_i = max(T(ds + D) - T(ds), T(ds) - T(ds - D)) of T(ds): 0 unless a rounding boundary of T lies within
 *    D (then one spacing; always > 0 for f32). With M = |g0| + sum_i (|T(ds_i)| + w_i) (a bound on the partial
 *    sums), each f32 addition rounds by <= u32 M: the chains are bit for bit equal when every w_i = 0, else each
 *    is within k u32 M of the exact sum of its terms: |err| <= sum_i w_i + 2 k u32 M; the token types' f32 sum vs
 *    the f64 reference: sum_i w_i + k (u32 + u64) M.
 *    Why not against the CPU's own f32 table gradient: there the device's one rounding T(ds) is the whole error,
 *    and it reaches u/(1+u) |ds| (0.99 of the bound (u + 1e-5) |ds|) whenever a table row takes a single ds with
 *    a significand near 1 + u: the bound is attained by the inputs, whatever the CPU, and shows nothing.
 *  - dgamma, dbeta: f32 sums over n rows in other orders of terms dy' xhat, dy' computed identically on both sides
 *    up to xhat (1e-5 relative): |err| <= (1e-5 + n u32) sum_i |dy'_i| (|xhat_i| + 1).
 * The sums of |.| above are computed here from the CPU's f32 intermediates. */
static double *f32_of(const bl_tensor *t) { return host(t); }

static void check_bound_ref(const char *name, const double *a, const bl_tensor *got, const double *bound) {
  checks++;
  double *b = host(got), worst = 0;
  int64_t bad = -1;
  for (int64_t i = 0; i < got->numel; i++) {
    double e = fabs(a[i] - b[i]);
    if (!(e <= bound[i]) && bad < 0) bad = i;
    if (e / (bound[i] > 0 ? bound[i] : 1) > worst || e != e) worst = e / (bound[i] > 0 ? bound[i] : 1);
  }
  if (bad >= 0) {
    printf("FAIL %s: element %lld cpu %.9g gpu %.9g bound %.3g\n", name, (long long)bad, a[bad], b[bad], bound[bad]);
    failures++;
  } else {
    printf("ok %s (worst error %.2f of its bound)\n", name, worst);
  }
  free(b);
}
static void check_bound(const char *name, const bl_tensor *ref, const bl_tensor *got, const double *bound) {
  double *a = host(ref);
  check_bound_ref(name, a, got, bound);
  free(a);
}

/* The values of the f32 tensor x rounded once to dtype (to nearest even, as the device stores them). */
static double *round_to(int dtype, const bl_tensor *x) {
  bl_tensor *t = mk(-1, dtype, x->ndim, x->shape);
  OK(bl_tensor_copy(t, x));
  double *v = host(t);
  F(t);
  return v;
}

/* w_i = how far the device's T(ds') may be from T(ds) for any ds' within D_i of the CPU's f32 ds (see above). */
static double *table_round_spread(int dtype, const bl_tensor *ds, const double *dv, const double *row_err,
                                  const double *sv, const double *mv, const double *rv, int64_t n, int64_t H) {
  bl_tensor *lo = mk(-1, BL_F32, ds->ndim, ds->shape), *hi = mk(-1, BL_F32, ds->ndim, ds->shape);
  float *l = lo->data, *h = hi->data;
  for (int64_t i = 0; i < n; i++)
    for (int64_t c = 0; c < H; c++) {
      const double x = dv[i * H + c], xh = fabs((sv[i * H + c] - mv[i]) * rv[i]);
      const double d = (1e-5 + 0x1p-23) * fabs(x) + 2 * row_err[i] * (1 + xh);
      l[i * H + c] = (float)(x - d);
      h[i * H + c] = (float)(x + d);
    }
  double *tl = round_to(dtype, lo), *th = round_to(dtype, hi), *tm = round_to(dtype, ds);
  for (int64_t e = 0; e < n * H; e++) tl[e] = fmax(th[e] - tm[e], tm[e] - tl[e]);
  free(th);
  free(tm);
  F(lo);
  F(hi);
  return tl;
}

static void test_embedding_layernorm(void) {
  const struct {
    int dt, gdt;
    int64_t B, S, H, vocab, npos, ntype;
    double p;
  } cases[] = {
    { BL_BF16, BL_F32, 3, 7, 40, 50, 9, 2, 0.1 },     /* 16-byte vectors, f32 LayerNorm parameters */
    { BL_F16, BL_F16, 2, 5, 37, 30, 6, 3, 0.1 },      /* odd rows: scalar path */
    { BL_F32, BL_F32, 4, 9, 64, 100, 12, 2, 0.0 },    /* f32 vectors of 4, no dropout */
    { BL_BF16, BL_BF16, 4, 150, 24, 7, 300, 4, 0.2 }, /* 600 rows: three chunks of the column sums, 4 types */
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const int dt = cases[k].dt, gdt = cases[k].gdt;
    const int64_t B = cases[k].B, S = cases[k].S, H = cases[k].H, n = B * S, ntype = cases[k].ntype;
    const double p = cases[k].p, u = dt == BL_BF16 ? 1.0 / 256 : dt == BL_F16 ? 1.0 / 2048 : 0, u32 = 0x1p-24;
    const uint64_t seed = 5 + k, off = 1000 * k;
    char name[160];
    bl_tensor *tab[3] = { rnd(dt, 2, SH(cases[k].vocab, H), 200 + k, -1, 1),
                          rnd(dt, 2, SH(cases[k].npos, H), 210 + k, -1, 1), rnd(dt, 2, SH(ntype, H), 220 + k, -1, 1) };
    bl_tensor *idx[3] = { make_ids(BL_I32, n, cases[k].vocab, 0, 230 + k),
                          make_ids(BL_I64, n, cases[k].npos, 0, 240 + k), make_ids(BL_I32, n, ntype, 0, 250 + k) };
    bl_tensor *gam = rnd(gdt, 1, SH(H), 260 + k, 0.5, 1.5), *bet = rnd(gdt, 1, SH(H), 270 + k, -0.5, 0.5);
    bl_tensor *y = mk(-1, dt, 3, SH(B, S, H)), *mean = mk(-1, BL_F32, 1, SH(n)), *rstd = mk(-1, BL_F32, 1, SH(n));
    bl_tensor *d_tab[3], *d_idx[3];
    for (int q = 0; q < 3; q++) {
      d_tab[q] = up(tab[q]);
      d_idx[q] = up(idx[q]);
    }
    bl_tensor *d_gam = up(gam), *d_bet = up(bet), *d_y = mk(DEV, dt, 3, SH(B, S, H));
    bl_tensor *d_mean = mk(DEV, BL_F32, 1, SH(n)), *d_rstd = mk(DEV, BL_F32, 1, SH(n));
    const int64_t c0 = conversions();
    OK(bl_embedding_layernorm_forward(&(bl_embedding_layernorm_args){ .word = tab[0],
                                                                      .position = tab[1],
                                                                      .token_type = tab[2],
                                                                      .ids = idx[0],
                                                                      .pos_ids = idx[1],
                                                                      .type_ids = idx[2],
                                                                      .gamma = gam,
                                                                      .beta = bet,
                                                                      .y = y,
                                                                      .mean = mean,
                                                                      .rstd = rstd,
                                                                      .eps = 1e-12,
                                                                      .p = p,
                                                                      .seed = seed,
                                                                      .offset = off }));
    OK(bl_cuda_embedding_layernorm_forward(&(bl_embedding_layernorm_args){ .word = d_tab[0],
                                                                           .position = d_tab[1],
                                                                           .token_type = d_tab[2],
                                                                           .ids = d_idx[0],
                                                                           .pos_ids = d_idx[1],
                                                                           .type_ids = d_idx[2],
                                                                           .gamma = d_gam,
                                                                           .beta = d_bet,
                                                                           .y = d_y,
                                                                           .mean = d_mean,
                                                                           .rstd = d_rstd,
                                                                           .eps = 1e-12,
                                                                           .p = p,
                                                                           .seed = seed,
                                                                           .offset = off }));
    snprintf(name, sizeof name, "embedding_layernorm %s/%s n=%lld H=%lld p=%g", bl_dtype_name(dt), bl_dtype_name(gdt),
             (long long)n, (long long)H, p);
    close_(name, y, d_y, 2 * u + 1e-5, 1e-6);
    close_("embedding_layernorm mean", mean, d_mean, 1e-5, 1e-6);
    close_("embedding_layernorm rstd", rstd, d_rstd, 1e-5, 1e-6);

    /* backward onto random non-zero gradients (they accumulate), rerun for determinism */
    bl_tensor *dy = rnd(dt, 3, SH(B, S, H), 280 + k, -1, 1), *d_dy = up(dy);
    bl_tensor *gr[5] = { rnd(BL_F32, 2, SH(cases[k].vocab, H), 290 + k, -1, 1),
                         rnd(BL_F32, 2, SH(cases[k].npos, H), 300 + k, -1, 1),
                         rnd(BL_F32, 2, SH(ntype, H), 310 + k, -1, 1), rnd(BL_F32, 1, SH(H), 320 + k, -1, 1),
                         rnd(BL_F32, 1, SH(H), 330 + k, -1, 1) };
    bl_tensor *d_gr[5], *d_gr2[5];
    for (int q = 0; q < 5; q++) {
      d_gr[q] = up(gr[q]);
      d_gr2[q] = up(gr[q]);
    }
    double *g0[3] = { host(gr[0]), host(gr[1]), host(gr[2]) }; /* the tables' gradients before the backward */
    OK(bl_embedding_layernorm_backward(gr[0], gr[1], gr[2], gr[3], gr[4], dy,
                                       &(bl_embedding_layernorm_args){ .word = tab[0],
                                                                       .position = tab[1],
                                                                       .token_type = tab[2],
                                                                       .ids = idx[0],
                                                                       .pos_ids = idx[1],
                                                                       .type_ids = idx[2],
                                                                       .gamma = gam,
                                                                       .mean = mean,
                                                                       .rstd = rstd,
                                                                       .p = p,
                                                                       .seed = seed,
                                                                       .offset = off }));
    for (int r = 0; r < 2; r++) {
      bl_tensor **g = r ? d_gr2 : d_gr;
      OK(bl_cuda_embedding_layernorm_backward(g[0], g[1], g[2], g[3], g[4], d_dy,
                                              &(bl_embedding_layernorm_args){ .word = d_tab[0],
                                                                              .position = d_tab[1],
                                                                              .token_type = d_tab[2],
                                                                              .ids = d_idx[0],
                                                                              .pos_ids = d_idx[1],
                                                                              .type_ids = d_idx[2],
                                                                              .gamma = d_gam,
                                                                              .mean = d_mean,
                                                                              .rstd = d_rstd,
                                                                              .p = p,
                                                                              .seed = seed,
                                                                              .offset = off }));
    }
    if (dt != BL_F32) no_conversion(name, c0);

    /* the CPU's f32 intermediates for the bounds: s, dy' (dropped dy), ds */
    bl_tensor *s = mk(-1, BL_F32, 3, SH(B, S, H)), *dyd = mk(-1, BL_F32, 3, SH(B, S, H));
    bl_tensor *ds = mk(-1, BL_F32, 3, SH(B, S, H));
    OK(bl_embedding_forward(s, tab[0], idx[0], 0));
    OK(bl_embedding_forward(s, tab[1], idx[1], 1));
    OK(bl_embedding_forward(s, tab[2], idx[2], 1));
    OK(bl_dropout_backward(dyd, dy, NULL, p, seed, off));
    OK(bl_layernorm_backward(ds, NULL, NULL, dyd, s, gam, mean, rstd));
    double *sv = f32_of(s), *gv = f32_of(dyd), *dv = f32_of(ds), *mv = f32_of(mean), *rv = f32_of(rstd);
    double *gmv = f32_of(gam), *row_err = calloc((size_t)n, sizeof(double));
#define xh_abs(i, c) fabs((sv[(i)*H + (c)] - mv[i]) * rv[i])
    /* the row sums a, b of ds = rs (dy' g - a - xhat b) differ by up to 1e-5 of sum |dy' g| (1 + |xhat|) / H */
    for (int64_t i = 0; i < n; i++) {
      for (int64_t c = 0; c < H; c++) row_err[i] += fabs(gv[i * H + c] * gmv[c]) * (1 + xh_abs(i, c));
      row_err[i] *= 1e-5 * rv[i] / (double)H;
    }
    double *w = table_round_spread(dt, ds, dv, row_err, sv, mv, rv, n, H), *tv = round_to(dt, ds);
    for (int q = 0; q < 3; q++) {
      const int64_t rows = tab[q]->shape[0];
      double *ref = malloc(sizeof(double) * rows * H), *mag = malloc(sizeof(double) * rows * H);
      double *bound = calloc((size_t)(rows * H), sizeof(double)), *iv = f32_of(idx[q]);
      int64_t *cnt = calloc((size_t)rows, sizeof(int64_t));
      const int chain = q < 2; /* word, position: the device's order is the CPU's */
      for (int64_t e = 0; e < rows * H; e++) {
        ref[e] = g0[q][e];
        mag[e] = fabs(g0[q][e]);
      }
      for (int64_t i = 0; i < n; i++) {
        const int64_t t = (int64_t)iv[i];
        cnt[t]++;
        for (int64_t c = 0; c < H; c++) {
          const double x = tv[i * H + c];
          ref[t * H + c] = chain ? (double)((float)ref[t * H + c] + (float)x) : ref[t * H + c] + x;
          mag[t * H + c] += fabs(x) + w[i * H + c];
          bound[t * H + c] += w[i * H + c];
        }
      }
      for (int64_t e = 0; e < rows * H; e++)
        if (!chain || bound[e] > 0) bound[e] += cnt[e / H] * (chain ? 2 * u32 : u32 + 0x1p-53) * mag[e];
      const char *tn[3] = { "word", "position", "token type" };
      snprintf(name, sizeof name, "embedding_layernorm backward %s table %s", tn[q], bl_dtype_name(dt));
      check_bound_ref(name, ref, d_gr[q], bound);
      free(ref);
      free(mag);
      free(bound);
      free(cnt);
      free(iv);
      free(g0[q]);
    }
    free(w);
    free(tv);
    double *bg = calloc((size_t)H, sizeof(double)), *bb = calloc((size_t)H, sizeof(double));
    for (int64_t i = 0; i < n; i++)
      for (int64_t c = 0; c < H; c++) {
        const double g = fabs(gv[i * H + c]);
        bg[c] += (1e-5 + n * u32) * g * (xh_abs(i, c) + 1);
        bb[c] += (1e-5 + n * u32) * g;
      }
    for (int64_t c = 0; c < H; c++) {
      bg[c] += 1e-6;
      bb[c] += 1e-6;
    }
    check_bound("embedding_layernorm backward gamma", gr[3], d_gr[3], bg);
    check_bound("embedding_layernorm backward beta", gr[4], d_gr[4], bb);
    for (int q = 0; q < 5; q++) close_("embedding_layernorm backward rerun (bitwise)", d_gr[q], d_gr2[q], 0, 0);
#undef xh_abs
    free(sv);
    free(gv);
    free(dv);
    free(mv);
    free(rv);
    free(bg);
    free(bb);
    free(gmv);
    free(row_err);
    F(s);
    F(dyd);
    F(ds);
    F(dy);
    F(d_dy);
    for (int q = 0; q < 5; q++) {
      F(gr[q]);
      F(d_gr[q]);
      F(d_gr2[q]);
    }
    for (int q = 0; q < 3; q++) {
      F(tab[q]);
      F(idx[q]);
      F(d_tab[q]);
      F(d_idx[q]);
    }
    F(gam);
    F(bet);
    F(y);
    F(mean);
    F(rstd);
    F(d_gam);
    F(d_bet);
    F(d_y);
    F(d_mean);
    F(d_rstd);
  }
  /* a bad token type id: an error naming it, nothing written */
  bl_tensor *h_tab = rnd(BL_BF16, 2, SH(5, 16), 340, -1, 1), *h_ty = rnd(BL_BF16, 2, SH(2, 16), 341, -1, 1);
  bl_tensor *h_gam = rnd(BL_BF16, 1, SH(16), 342, 0.5, 1.5), *tab = up(h_tab), *ty = up(h_ty), *gam = up(h_gam);
  bl_tensor *ids = mk(-1, BL_I32, 1, SH(3));
  for (int i = 0; i < 3; i++) ((int32_t *)ids->data)[i] = i;
  bl_tensor *tids = mk(-1, BL_I32, 1, SH(3));
  for (int i = 0; i < 3; i++) ((int32_t *)tids->data)[i] = i; /* 2 is out of range for 2 types */
  bl_tensor *d_ids = up(ids), *d_tids = up(tids), *d_y = mk(DEV, BL_BF16, 2, SH(3, 16));
  bl_tensor *d_m = mk(DEV, BL_F32, 1, SH(3)), *d_r = mk(DEV, BL_F32, 1, SH(3));
  int rc = bl_embedding_layernorm_forward(&(bl_embedding_layernorm_args){ .word = tab,
                                                                          .position = tab,
                                                                          .token_type = ty,
                                                                          .ids = d_ids,
                                                                          .pos_ids = d_ids,
                                                                          .type_ids = d_tids,
                                                                          .gamma = gam,
                                                                          .y = d_y,
                                                                          .mean = d_m,
                                                                          .rstd = d_r,
                                                                          .eps = 1e-12 });
  checks++;
  /* the table named as on the CPU (BL_EMB_TOKEN_TYPE_NAMES), not the vocabulary */
  if (rc == 0 ||
      !strstr(bl_last_error(),
              "token type id 2 at position 2 is out of range for the token type table's type_vocab_size 2")) {
    printf("FAIL embedding_layernorm bad type id: rc %d, error '%s'\n", rc, bl_last_error());
    failures++;
  }
  F(h_tab);
  F(h_ty);
  F(h_gam);
  F(tab);
  F(ty);
  F(ids);
  F(gam);
  F(tids);
  F(d_ids);
  F(d_tids);
  F(d_y);
  F(d_m);
  F(d_r);
}

/* ---------------------------------------------------------------- casts */
static void test_casts(void) {
  const int types[3] = { BL_F32, BL_BF16, BL_F16 };
  const int64_t n = 1003; /* 125 vectors of 8 and a tail of 3 */
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 3; b++) {
      if (a == b) continue;
      bl_tensor *x = rnd(types[a], 1, SH(n), 80 + a, -3, 3), *y = mk(-1, types[b], 1, SH(n));
      bl_tensor *d_x = up(x), *d_y = mk(DEV, types[b], 1, SH(n)), *d_z = mk(DEV, types[b], 1, SH(n));
      int64_t c0 = conversions();
      OK(bl_tensor_copy(y, x));
      OK(bl_cuda_tensor_copy(d_y, d_x));
      OK(bl_cuda_cast(d_z, d_x));
      char name[64];
      snprintf(name, sizeof name, "cast %s -> %s", bl_dtype_name(types[a]), bl_dtype_name(types[b]));
      close_(name, y, d_y, 0, 0);
      close_(name, y, d_z, 0, 0);
      no_conversion(name, c0);
      F(x);
      F(y);
      F(d_x);
      F(d_y);
      F(d_z);
    }
}

/* ---------------------------------------------------------------- cross-entropy, accuracy, dropout */
static void test_losses(void) {
  const struct {
    int dt;
    int64_t m, c;
  } cases[] = {
    { BL_BF16, 37, 30522 }, /* MLM rows over BERT's vocabulary: not whole 16-byte vectors, scalar path */
    { BL_BF16, 20, 1000 },  /* whole vectors */
    { BL_F16, 9, 1000 },    { BL_F16, 5, 77 },
    { BL_F32, 7, 300 },     { BL_F32, 600, 12 }, /* rows over several blocks, whose counts meet in the same atomics */
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const int dt = cases[k].dt;
    const int64_t M = cases[k].m, Cn = cases[k].c;
    const double u = dt == BL_BF16 ? 1.0 / 256 : dt == BL_F16 ? 1.0 / 2048 : 0;
    bl_tensor *lg = rnd(dt, 2, SH(M, Cn), 90 + k, -4, 4), *tg = mk(-1, BL_I32, 1, SH(M));
    for (int64_t i = 0; i < M; i++) ((int32_t *)tg->data)[i] = i % 4 == 3 ? -1 : (int32_t)((i * 7919) % Cn);
    bl_tensor *loss = mk(-1, BL_F64, 1, SH(1)), *gl = mk(-1, dt, 2, SH(M, Cn));
    bl_tensor *d_lg = up(lg), *d_tg = up(tg), *d_loss = mk(DEV, BL_F64, 1, SH(1)), *d_gl = mk(DEV, dt, 2, SH(M, Cn));
    int64_t c1 = 0, c2 = 0, c0 = conversions();
    OK(bl_cross_entropy(loss, gl, lg, tg, -1, 1.5, &c1));
    OK(bl_cuda_cross_entropy(d_loss, d_gl, d_lg, d_tg, -1, 1.5, &c2));
    char name[96];
    snprintf(name, sizeof name, "cross_entropy loss %s [%lld x %lld]", bl_dtype_name(dt), (long long)M, (long long)Cn);
    close_(name, loss, d_loss, 1e-5, 1e-6);
    /* dlogits ~ g/c: one unit in the last place of the value plus 1e-5 relative, with a floor at 1e-5 of g */
    snprintf(name, sizeof name, "cross_entropy dlogits %s [%lld x %lld]", bl_dtype_name(dt), (long long)M,
             (long long)Cn);
    close_(name, gl, d_gl, u + 1e-5, 1e-5 * 1.5 / (double)c1);
    checks++;
    if (c1 != c2) {
      printf("FAIL cross_entropy count %lld vs %lld\n", (long long)c1, (long long)c2);
      failures++;
    }
    int64_t a1 = 0, n1 = 0, a2 = 0, n2 = 0;
    OK(bl_accuracy(lg, tg, -1, &a1, &n1));
    OK(bl_accuracy(d_lg, d_tg, -1, &a2, &n2));
    checks++;
    if (a1 != a2 || n1 != n2) {
      printf("FAIL accuracy %lld/%lld vs %lld/%lld\n", (long long)a1, (long long)n1, (long long)a2, (long long)n2);
      failures++;
    }
    bl_tensor *am = mk(-1, BL_I64, 1, SH(M)), *d_am = mk(DEV, BL_I64, 1, SH(M));
    OK(bl_argmax(am, lg));
    OK(bl_cuda_argmax(d_am, d_lg));
    close_("argmax", am, d_am, 0, 0);
    if (dt != BL_F32) no_conversion(name, c0);
    F(lg);
    F(tg);
    F(loss);
    F(gl);
    F(d_lg);
    F(d_tg);
    F(d_loss);
    F(d_gl);
    F(am);
    F(d_am);
  }
  for (int k = 0; k < 2; k++) { /* dropout: the same Philox mask, one rounding of x * scale on both sides */
    const int dt = k ? BL_F16 : BL_BF16;
    bl_tensor *x = rnd(dt, 2, SH(13, 77), 95 + k, -2, 2), *y = mk(-1, dt, 2, SH(13, 77));
    bl_tensor *gx = mk(-1, dt, 2, SH(13, 77)), *d_x = up(x), *d_y = mk(DEV, dt, 2, SH(13, 77));
    bl_tensor *d_gx = mk(DEV, dt, 2, SH(13, 77));
    int64_t c0 = conversions();
    OK(bl_dropout_forward(y, NULL, x, 0.1, 7, 11));
    OK(bl_cuda_dropout_forward(d_y, NULL, d_x, 0.1, 7, 11));
    close_(k ? "dropout f16" : "dropout bf16", y, d_y, 0, 0);
    OK(bl_dropout_backward(gx, x, NULL, 0.1, 7, 11));
    OK(bl_cuda_dropout_backward(d_gx, d_x, NULL, 0.1, 7, 11));
    close_(k ? "dropout backward f16" : "dropout backward bf16", gx, d_gx, 0, 0);
    no_conversion("dropout", c0);
    F(x);
    F(y);
    F(gx);
    F(d_x);
    F(d_y);
    F(d_gx);
  }
}

int main(void) {
  if (!bl_cuda_device_count()) {
    printf("skipped: no CUDA device (bl_cuda_device_count() = 0)\n");
    return 77;
  }
  char nm[256];
  if (bl_cuda_device_name(DEV, nm, sizeof nm) == 0) printf("device: %s\n", nm);
  test_lookups();
  test_embedding_layernorm();
  test_casts();
  test_losses();
  printf("%d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}
#endif
