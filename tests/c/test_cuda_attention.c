/* The tensor-core flash attention (kernels/attention_tc.cu, picked by bl_cuda_attention_forward/backward for
 * bf16/f16 operands with d in {32, 64, 128}; called here through the public bl_attention_forward/backward) vs the
 * CPU twin (src/ops/attention.c) on random inputs.
 *
 * Inputs: Q, K, V as column slices of one [B, S, 3H] tensor (the fused-QKV layout, strided), dctx, all random in
 * [-1, 1] and rounded to the activation dtype first, so both sides see the same values; the CPU op runs in f32 on
 * those. Key masks (mask kinds below) pad every sequence but the first, or give rows random lengths (1 and S
 * among them), or zero random keys anywhere (not padding-shaped: no tile may be skipped unless all keys after it are
 * masked) with one row masked entirely (its softmax is uniform over all S keys: nothing may be skipped); dropout with
 * the same (seed, offset) on both sides. The kernels skip the key tiles past a row's last unmasked key: those
 * cases check that skipping changes nothing beyond the bounds below, and check_skip that the skipped tiles are not
 * read at all.
 *
 * Tolerances, per element, from a rounding analysis (u = 2^-8 bf16, 2^-11 f16; ua = half the smallest f16
 * subnormal, 2^-25, for f16, whose small P and dS values are subnormal). The kernel rounds, beyond f32:
 *  - P (unnormalised, <= 1) to 16 bits before P V:  |d ctx| <= u sum_k P z |V| + ua sum_k z |V|
 *  - ctx to 16 bits on output:                       + u |ctx|
 *  - D = dctx . ctx from the rounded ctx:            |d D| <= sum_c |dctx| (ctx's bound)
 *  - P z to 16 bits before dV = (P z)^T dctx:        |d dV| <= u sum_q P z |dctx| + ua sum_q z |dctx| + u |dV|
 *  - dS = P (z dP - D) scale to 16 bits:             e_S <= P scale |d D| + u |dS| + ua
 *  - dK = dS^T Q, dQ = dS K:                         |d dK| <= sum_q e_S |Q| + u |dK|,  dQ likewise with |K|
 * plus the f32 part of both sides (accumulation over S keys and d columns, exp2 vs exp of the scores): a relative
 * 2^-23 (S + d^2 scale) of the magnitudes summed. The bound is a worst case; each check prints how much of it the
 * largest error used. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bertlua.h"
#include "check.h"

static const int DEV = 0;
#define SH(...) \
  (const int64_t[]) { __VA_ARGS__ }

static bl_tensor *mk(int dev, int dtype, int nd, const int64_t *shape) {
  bl_tensor *t = NULL;
  if (bl_tensor_empty(nd, shape, dtype, dev, &t)) {
    printf("FAIL alloc: %s\n", bl_last_error());
    exit(1);
  }
  if (dev >= 0 && t->numel > 0) OK(bl_tensor_fill(t, NAN)); /* an element never written fails */
  return t;
}
static bl_tensor *slice(const bl_tensor *t, int64_t start, int64_t len) {
  bl_tensor *s = NULL;
  OK(bl_tensor_narrow(t, 2, start, len, &s));
  return s;
}
/* Doubles of a tensor on any device, any strides. */
static double *host(const bl_tensor *t) {
  bl_tensor *c = mk(t->device, t->dtype, t->ndim, t->shape), *h = mk(-1, t->dtype, t->ndim, t->shape);
  OK(bl_tensor_copy(c, t));
  OK(bl_tensor_copy(h, c));
  double *v = malloc(sizeof(double) * (size_t)t->numel);
  OK(bl_tensor_to_doubles(h, v, t->numel));
  bl_tensor_free(c);
  bl_tensor_free(h);
  return v;
}
/* Random values in [-1, 1] rounded to dtype: *cpu gets them as f32, the result is the device copy in dtype. */
static bl_tensor *random_pair(int nd, const int64_t *shape, int dtype, uint64_t seed, bl_tensor **cpu) {
  bl_tensor *r = mk(-1, BL_F32, nd, shape), *h = mk(-1, dtype, nd, shape), *d = mk(DEV, dtype, nd, shape);
  OK(bl_rand_uniform(r, seed, 0, -1, 1));
  OK(bl_tensor_copy(h, r));
  OK(bl_tensor_copy(r, h));
  OK(bl_tensor_copy(d, h));
  bl_tensor_free(h);
  *cpu = r;
  return d;
}

typedef struct {
  const char *what;
  double worst; /* largest |err| / bound seen */
  int64_t bad;  /* first element over its bound, -1 if none */
  double got, ref, lim;
} tally;
static void see(tally *t, int64_t i, double got, double ref, double lim) {
  double e = fabs(got - ref);
  if (!(e <= lim)) {
    if (t->bad < 0) {
      t->bad = i;
      t->got = got;
      t->ref = ref;
      t->lim = lim;
    }
    if (e != e) e = INFINITY;
  }
  if (e / lim > t->worst) t->worst = e / lim;
}
static void report(const tally *t, const char *name) {
  if (t->bad >= 0) {
    failures++;
    printf("FAIL %s %s: element %lld gpu %.9g cpu %.9g bound %.3g (worst err/bound %.3g)\n", name, t->what,
           (long long)t->bad, t->got, t->ref, t->lim, t->worst);
  } else {
    printf("ok   %s %s: worst err/bound %.3f\n", name, t->what, t->worst);
  }
}

enum { MASK_THIRDS, MASK_LENGTHS, MASK_SCATTER };

/* Key mask kind `kind` of B rows of S (1 keep, 0 masked) into m; lcg: the test's own random stream. */
static void make_mask(float *m, int kind, int64_t B, int64_t S, uint64_t seed) {
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
#define NEXT() (x = x * 6364136223846793005ull + 1442695040888963407ull, (x >> 33) % 1000003)
  for (int64_t b = 0; b < B; b++) {
    int64_t len = S; /* MASK_LENGTHS: row 0 all S, row 1 a single key, others random in [1, S] */
    if (kind == MASK_LENGTHS) len = b == 0 ? S : b == 1 ? 1 : 1 + (int64_t)(NEXT() % (uint64_t)S);
    for (int64_t s = 0; s < S; s++) {
      float v = 1.0f;
      if (kind == MASK_THIRDS) v = s == 0 || s < S - b * (S / 3) ? 1.0f : 0.0f; /* the first S - b*S/3 keys */
      if (kind == MASK_LENGTHS) v = s < len ? 1.0f : 0.0f;
      if (kind == MASK_SCATTER) v = b == B - 1 && B > 1 ? 0.0f : NEXT() % 3 == 0 ? 0.0f : 1.0f;
      m[b * S + s] = v;
    }
  }
#undef NEXT
}

static void run_case_mask(int dtype, int64_t B, int64_t S, int heads, int64_t d, double p, int kind) {
  const int64_t H = heads * d, S4 = (S + 3) / 4 * 4;
  const double u = dtype == BL_BF16 ? 1.0 / 256 : 1.0 / 2048, ua = dtype == BL_BF16 ? 0 : ldexp(1, -25);
  const double scale = 1.0 / sqrt((double)d), frel = ldexp(S + d * d * scale, -23);
  const uint64_t seed = 17, offset = 5;
  char name[96];
  snprintf(name, sizeof name, "%s B=%lld S=%lld heads=%d d=%lld p=%.2f mask %d", dtype == BL_BF16 ? "bf16" : "f16",
           (long long)B, (long long)S, heads, (long long)d, p, kind);

  bl_tensor *qkv_c, *qkv = random_pair(3, SH(B, S, 3 * H), dtype, 100 + S + d, &qkv_c);
  bl_tensor *go_c, *go = random_pair(3, SH(B, S, H), dtype, 200 + S + d, &go_c);
  bl_tensor *q_c = slice(qkv_c, 0, H), *k_c = slice(qkv_c, H, H), *v_c = slice(qkv_c, 2 * H, H);
  bl_tensor *q = slice(qkv, 0, H), *k = slice(qkv, H, H), *v = slice(qkv, 2 * H, H);
  bl_tensor *km_c = mk(-1, BL_F32, 2, SH(B, S));
  make_mask((float *)km_c->data, kind, B, S, 300 + S + d);
  bl_tensor *km = mk(DEV, BL_F32, 2, SH(B, S));
  OK(bl_tensor_copy(km, km_c));

  /* CPU twin */
  bl_tensor *ctx_c = mk(-1, BL_F32, 3, SH(B, S, H)), *probs = mk(-1, BL_F32, 4, SH(B, heads, S, S));
  bl_tensor *gq_c = mk(-1, BL_F32, 3, SH(B, S, H)), *gk_c = mk(-1, BL_F32, 3, SH(B, S, H));
  bl_tensor *gv_c = mk(-1, BL_F32, 3, SH(B, S, H));
  OK(bl_attention_forward(&(bl_attention_args){ .q = q_c,
                                                .k = k_c,
                                                .v = v_c,
                                                .key_mask = km_c,
                                                .ctx = ctx_c,
                                                .saved = probs,
                                                .heads = heads,
                                                .p = p,
                                                .seed = seed,
                                                .offset = offset }));
  OK(bl_attention_backward(
      gq_c, gk_c, gv_c, go_c,
      &(bl_attention_args){
          .q = q_c, .k = k_c, .v = v_c, .saved = probs, .heads = heads, .p = p, .seed = seed, .offset = offset }));
  /* the kernel: gradients into slices of one [B, S, 3H] tensor, as the model's fused QKV backward does */
  bl_tensor *ctx = mk(DEV, dtype, 3, SH(B, S, H)), *lse = mk(DEV, BL_F32, 3, SH(B, heads, S));
  bl_tensor *gqkv = mk(DEV, dtype, 3, SH(B, S, 3 * H));
  bl_tensor *gq = slice(gqkv, 0, H), *gk = slice(gqkv, H, H), *gv = slice(gqkv, 2 * H, H);
  OK(bl_attention_forward(&(bl_attention_args){ .q = q,
                                                .k = k,
                                                .v = v,
                                                .key_mask = km,
                                                .ctx = ctx,
                                                .saved = lse,
                                                .heads = heads,
                                                .p = p,
                                                .seed = seed,
                                                .offset = offset }));
  OK(bl_attention_backward(gq, gk, gv, go,
                           &(bl_attention_args){ .q = q,
                                                 .k = k,
                                                 .v = v,
                                                 .key_mask = km,
                                                 .ctx = ctx,
                                                 .saved = lse,
                                                 .heads = heads,
                                                 .p = p,
                                                 .seed = seed,
                                                 .offset = offset }));

  /* the dropout factors z (0 or 1/(1-p)) by the documented element order, from the generic dropout op */
  double *z = NULL;
  if (p > 0) {
    bl_tensor *one = mk(-1, BL_F32, 2, SH(B * heads * S, S4)), *zt = mk(-1, BL_F32, 2, SH(B * heads * S, S4));
    OK(bl_tensor_fill(one, 1.0));
    OK(bl_dropout_forward(zt, NULL, one, p, seed, offset));
    z = host(zt);
    bl_tensor_free(one);
    bl_tensor_free(zt);
  }
  double *Q = host(q_c), *K = host(k_c), *V = host(v_c), *G = host(go_c), *P = host(probs);
  double *Cr = host(ctx_c), *Cg = host(ctx), *GQr = host(gq_c), *GKr = host(gk_c), *GVr = host(gv_c);
  double *GQ = host(gq), *GK = host(gk), *GV = host(gv);
  double *ctx_bound = malloc(sizeof(double) * (size_t)(B * S * H)), *eS = malloc(sizeof(double) * (size_t)(S * S));
  double *dS = malloc(sizeof(double) * (size_t)(S * S));
  tally tc = { "ctx", 0, -1, 0, 0, 0 }, tq = { "dq", 0, -1, 0, 0, 0 }, tk = { "dk", 0, -1, 0, 0, 0 };
  tally tv = { "dv", 0, -1, 0, 0, 0 };
#define AT(X, b, s, c) X[((b)*S + (s)) * H + (c)]
  for (int64_t b = 0; b < B; b++)
    for (int h = 0; h < heads; h++) {
      const int64_t bh = b * heads + h, o = h * d;
      const double *Pb = P + bh * S * S;
#define ZZ(i, j) (z ? z[(bh * S + (i)) * S4 + (j)] : 1.0)
      for (int64_t i = 0; i < S; i++)
        for (int64_t c = 0; c < d; c++) {
          double A = 0, Aa = 0, ref = AT(Cr, b, i, o + c);
          for (int64_t j = 0; j < S; j++) {
            A += Pb[i * S + j] * ZZ(i, j) * fabs(AT(V, b, j, o + c));
            Aa += ZZ(i, j) * fabs(AT(V, b, j, o + c));
          }
          double lim = u * (A + fabs(ref)) + ua * (Aa + 1);
          AT(ctx_bound, b, i, o + c) = lim;
          see(&tc, (b * S + i) * H + o + c, AT(Cg, b, i, o + c), ref, lim + frel * (A + fabs(ref)) + 1e-7);
        }
      for (int64_t i = 0; i < S; i++) { /* dS and its error bound e_S */
        double D = 0, eD = 0, fD = 0;
        for (int64_t c = 0; c < d; c++) {
          D += AT(G, b, i, o + c) * AT(Cr, b, i, o + c);
          eD += fabs(AT(G, b, i, o + c)) * AT(ctx_bound, b, i, o + c);
          fD += fabs(AT(G, b, i, o + c) * AT(Cr, b, i, o + c));
        }
        for (int64_t j = 0; j < S; j++) {
          double dp = 0, fp = 0;
          for (int64_t c = 0; c < d; c++) {
            dp += AT(G, b, i, o + c) * AT(V, b, j, o + c);
            fp += fabs(AT(G, b, i, o + c) * AT(V, b, j, o + c));
          }
          const double pij = Pb[i * S + j], zz = ZZ(i, j);
          dS[i * S + j] = pij * (zz * dp - D) * scale;
          eS[i * S + j] = pij * scale * (eD + frel * (zz * fp + fD)) + u * fabs(dS[i * S + j]) + ua;
        }
      }
      for (int64_t c = 0; c < d; c++) {
        for (int64_t j = 0; j < S; j++) { /* dK, dV of key j */
          double Ak = 0, Fk = 0, Av = 0, Aav = 0, rk = AT(GKr, b, j, o + c), rv = AT(GVr, b, j, o + c);
          for (int64_t i = 0; i < S; i++) {
            Ak += eS[i * S + j] * fabs(AT(Q, b, i, o + c));
            Fk += fabs(dS[i * S + j] * AT(Q, b, i, o + c));
            Av += Pb[i * S + j] * ZZ(i, j) * fabs(AT(G, b, i, o + c));
            Aav += ZZ(i, j) * fabs(AT(G, b, i, o + c));
          }
          see(&tk, (b * S + j) * H + o + c, AT(GK, b, j, o + c), rk,
              Ak + u * fabs(rk) + ua + frel * (Fk + fabs(rk)) + 1e-7);
          see(&tv, (b * S + j) * H + o + c, AT(GV, b, j, o + c), rv,
              u * (Av + fabs(rv)) + ua * (Aav + 1) + frel * (Av + fabs(rv)) + 1e-7);
        }
        for (int64_t i = 0; i < S; i++) { /* dQ of query i */
          double Aq = 0, Fq = 0, rq = AT(GQr, b, i, o + c);
          for (int64_t j = 0; j < S; j++) {
            Aq += eS[i * S + j] * fabs(AT(K, b, j, o + c));
            Fq += fabs(dS[i * S + j] * AT(K, b, j, o + c));
          }
          see(&tq, (b * S + i) * H + o + c, AT(GQ, b, i, o + c), rq,
              Aq + u * fabs(rq) + ua + frel * (Fq + fabs(rq)) + 1e-7);
        }
      }
#undef ZZ
    }
#undef AT
  report(&tc, name);
  report(&tv, name);
  report(&tk, name);
  report(&tq, name);

  /* determinism: a second backward gives the same bits */
  bl_tensor *gqkv2 = mk(DEV, dtype, 3, SH(B, S, 3 * H));
  bl_tensor *gq2 = slice(gqkv2, 0, H), *gk2 = slice(gqkv2, H, H), *gv2 = slice(gqkv2, 2 * H, H);
  OK(bl_attention_backward(gq2, gk2, gv2, go,
                           &(bl_attention_args){ .q = q,
                                                 .k = k,
                                                 .v = v,
                                                 .key_mask = km,
                                                 .ctx = ctx,
                                                 .saved = lse,
                                                 .heads = heads,
                                                 .p = p,
                                                 .seed = seed,
                                                 .offset = offset }));
  double *a1 = host(gqkv), *a2 = host(gqkv2);
  CHECK(!memcmp(a1, a2, sizeof(double) * (size_t)gqkv->numel), "%s: a second backward differs", name);

  free(z);
  free(Q);
  free(K);
  free(V);
  free(G);
  free(P);
  free(Cr);
  free(Cg);
  free(GQr);
  free(GKr);
  free(GVr);
  free(GQ);
  free(GK);
  free(GV);
  free(ctx_bound);
  free(eS);
  free(dS);
  free(a1);
  free(a2);
  bl_tensor *ts[] = { qkv_c, qkv,  go_c, go,  q_c, k_c,  v_c, q,  k,  v,     km_c, km,  ctx_c, probs,
                      gq_c,  gk_c, gv_c, ctx, lse, gqkv, gq,  gk, gv, gqkv2, gq2,  gk2, gv2 };
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) bl_tensor_free(ts[i]);
}

static void run_case(int dtype, int64_t B, int64_t S, int heads, int64_t d, double p) {
  run_case_mask(dtype, B, S, heads, d, p, MASK_THIRDS);
}

/* The key tiles past a row's last unmasked key are not read: with NaN in K and V of those tiles' keys, ctx and the
 * gradients are bit for bit those of a run with finite values there, and dK, dV of those keys are zeros. (A NaN in
 * a visited masked key would still poison its row: 0 * NaN. The CPU twin reads every key and gives NaN here.) */
static void check_skip(int dtype, int64_t S, int64_t len, int64_t d) {
  const int heads = 2;
  const int64_t B = 2, H = heads * d, tile = 64, live = (len + tile - 1) / tile * tile;
  char name[96];
  snprintf(name, sizeof name, "skip %s S=%lld len=%lld d=%lld", dtype == BL_BF16 ? "bf16" : "f16", (long long)S,
           (long long)len, (long long)d);
  bl_tensor *qkv_c, *qkv = random_pair(3, SH(B, S, 3 * H), dtype, 700 + S, &qkv_c);
  bl_tensor *go_c, *go = random_pair(3, SH(B, S, H), dtype, 800 + S, &go_c);
  bl_tensor *km_c = mk(-1, BL_F32, 2, SH(B, S)), *km = mk(DEV, BL_F32, 2, SH(B, S));
  for (int64_t b = 0; b < B; b++)
    for (int64_t s = 0; s < S; s++) ((float *)km_c->data)[b * S + s] = s < len ? 1.0f : 0.0f;
  OK(bl_tensor_copy(km, km_c));
  bl_tensor *out[2][2]; /* [finite, poisoned][ctx, gqkv] */
  for (int poison = 0; poison < 2; poison++) {
    if (poison) { /* NaN into K and V of the keys in the skipped tiles */
      bl_tensor *h = mk(-1, dtype, 3, SH(B, S, 3 * H));
      OK(bl_tensor_copy(h, qkv));
      bl_tensor *kv = slice(h, H, 2 * H), *pad = NULL;
      OK(bl_tensor_narrow(kv, 1, live, S - live, &pad));
      OK(bl_tensor_fill(pad, NAN));
      OK(bl_tensor_copy(qkv, h));
      bl_tensor_free(pad);
      bl_tensor_free(kv);
      bl_tensor_free(h);
    }
    bl_tensor *q = slice(qkv, 0, H), *k = slice(qkv, H, H), *v = slice(qkv, 2 * H, H);
    bl_tensor *ctx = mk(DEV, dtype, 3, SH(B, S, H)), *lse = mk(DEV, BL_F32, 3, SH(B, heads, S));
    bl_tensor *g = mk(DEV, dtype, 3, SH(B, S, 3 * H));
    bl_tensor *gq = slice(g, 0, H), *gk = slice(g, H, H), *gv = slice(g, 2 * H, H);
    OK(bl_attention_forward(&(bl_attention_args){ .q = q,
                                                  .k = k,
                                                  .v = v,
                                                  .key_mask = km,
                                                  .ctx = ctx,
                                                  .saved = lse,
                                                  .heads = heads,
                                                  .p = 0.1,
                                                  .seed = 3,
                                                  .offset = 9 }));
    OK(bl_attention_backward(gq, gk, gv, go,
                             &(bl_attention_args){ .q = q,
                                                   .k = k,
                                                   .v = v,
                                                   .key_mask = km,
                                                   .ctx = ctx,
                                                   .saved = lse,
                                                   .heads = heads,
                                                   .p = 0.1,
                                                   .seed = 3,
                                                   .offset = 9 }));
    out[poison][0] = ctx;
    out[poison][1] = g;
    bl_tensor *ts[] = { q, k, v, lse, gq, gk, gv };
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) bl_tensor_free(ts[i]);
  }
  for (int w = 0; w < 2; w++) {
    double *a = host(out[0][w]), *b = host(out[1][w]);
    CHECK(!memcmp(a, b, sizeof(double) * (size_t)out[0][w]->numel), "%s: %s changes with NaN in skipped keys", name,
          w ? "the gradient" : "ctx");
    if (w == 1)
      for (int64_t i = 0; i < out[0][1]->numel; i++) {
        const int64_t s = (i / (3 * H)) % S, c = i % (3 * H);
        if (s >= live && c >= H && a[i] != 0) {
          CHECK(0, "%s: dK/dV of skipped key %lld not 0", name, (long long)s);
          break;
        }
      }
    free(a);
    free(b);
  }
  bl_tensor *ts[] = { qkv_c, qkv, go_c, go, km_c, km, out[0][0], out[0][1], out[1][0], out[1][1] };
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) bl_tensor_free(ts[i]);
}

int main(void) {
  if (!bl_cuda_compiled() || bl_cuda_device_count() == 0) {
    printf("skipped: no CUDA device (bl_cuda_compiled() = %d)\n", bl_cuda_compiled());
    return 77;
  }
  /* S: a single key, tails of the 64-key tiles (17, 130), exact tiles (64), several tiles with a tail (384) */
  run_case(BL_BF16, 2, 1, 2, 32, 0.0);
  run_case(BL_BF16, 2, 17, 2, 32, 0.1);
  run_case(BL_BF16, 2, 64, 2, 64, 0.0);
  run_case(BL_BF16, 2, 130, 2, 32, 0.1);
  run_case(BL_BF16, 1, 130, 2, 128, 0.0);
  run_case(BL_BF16, 2, 384, 1, 64, 0.1);
  run_case(BL_BF16, 1, 384, 1, 128, 0.1);
  run_case(BL_F16, 2, 17, 2, 128, 0.1);
  run_case(BL_F16, 2, 130, 2, 64, 0.0);
  run_case(BL_F16, 1, 384, 2, 32, 0.1);
  /* The cases above have few heads: the backward splits its key tiles one per CTA (attn_tc_kv_split). Forced: no
   * split (one CTA walks every key tile, as at B=64), and 2 splits of 3 tiles each. */
  setenv("BL_ATTENTION_KV_SPLIT", "1", 1);
  run_case(BL_BF16, 2, 130, 2, 32, 0.1);
  run_case(BL_F16, 1, 384, 2, 128, 0.1);
  setenv("BL_ATTENTION_KV_SPLIT", "2", 1);
  run_case(BL_BF16, 2, 384, 1, 64, 0.1);
  run_case(BL_F16, 1, 320, 2, 32, 0.0);
  /* random lengths (1 and S among them) and masks that are not padding-shaped, odd S, with and without splits */
  run_case_mask(BL_BF16, 4, 200, 2, 64, 0.1, MASK_LENGTHS);
  run_case_mask(BL_F16, 3, 131, 1, 128, 0.0, MASK_LENGTHS);
  run_case_mask(BL_BF16, 3, 97, 2, 32, 0.1, MASK_SCATTER);
  run_case_mask(BL_F16, 2, 200, 1, 64, 0.1, MASK_SCATTER);
  setenv("BL_ATTENTION_KV_SPLIT", "2", 1);
  run_case_mask(BL_BF16, 4, 257, 1, 32, 0.1, MASK_LENGTHS);
  run_case_mask(BL_F16, 3, 200, 1, 64, 0.0, MASK_SCATTER);
  unsetenv("BL_ATTENTION_KV_SPLIT");
  check_skip(BL_BF16, 200, 70, 64);
  check_skip(BL_F16, 384, 300, 32);
  setenv("BL_ATTENTION_KV_SPLIT", "3", 1);
  check_skip(BL_BF16, 384, 100, 128);
  unsetenv("BL_ATTENTION_KV_SPLIT");
  printf("%s\n", failures ? "FAILED" : "all passed");
  return failures ? 1 : 0;
}
