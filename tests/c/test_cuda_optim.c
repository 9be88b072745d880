/* One optimizer contract on both devices: bl_lamb_step, bl_adamw_step,
 * bl_sgd_step, bl_grad_global_norm and bl_unscale_check on cuda tensors
 * (kernels/optim.cu) against the same calls on CPU tensors, for every option
 * of the configs, three steps of fresh random gradients each.
 *
 * Tolerances: the element math is the same f32 formula on both devices; a
 * device may contract a*b+c into one FMA and sums its f64 norms in another
 * order, so each step differs by a few f32 ulps of the update. Over three
 * steps that is < 1e-6 relative on w (the update is lr ~ 1e-3 of w), and on
 * m, v a few ulps: 2e-6 relative. The f64 norms agree to 1e-12.
 * Also: the global norm against a direct f64 sum; non-finite gradients fail
 * with weights untouched; no allocation after the first step; one
 * synchronisation per step that computes its norm, none with a given norm;
 * the loss-scaled steps (bl_optim_args.amp) decide like the CPU twin and never synchronise; a step given the
 * bf16/f16 compute copy writes the same bits as the step without it followed by the refresh cast, on both devices,
 * in one launch fewer per cast launch (the emulated runtime counts them).
 * Without a CUDA device (or in a CPU-only build): "skipped: ...", exit 77. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bertlua.h"
#include "check.h"

#define N 20011
static const int64_t OFF[3] = { 0, 17000, 17013 }, LEN[3] = { 17000, 13, 2990 }; /* 8 elements in no segment */
static const uint8_t DEC[3] = { 1, 0, 1 };

typedef struct bufs {
  bl_tensor *w, *g, *m, *v;
} bufs;

static bl_tensor *make(int dev) {
  bl_tensor *t = NULL;
  if (bl_tensor_empty(1, (const int64_t[]){ N }, BL_F32, dev, &t)) {
    printf("FAIL alloc: %s\n", bl_last_error());
    exit(1);
  }
  return t;
}
static void fill(bl_tensor *c, bl_tensor *d, uint64_t seed, double lo, double hi) {
  OK(bl_rand_uniform(c, seed, 0, lo, hi));
  OK(bl_tensor_copy(d, c));
}
static void setup(bufs *c, bufs *d, uint64_t seed) {
  bl_tensor **cs = &c->w, **ds = &d->w;
  const double lo[4] = { -1, -0.1, -0.01, 0 }, hi[4] = { 1, 0.1, 0.01, 0.01 };
  for (int i = 0; i < 4; i++) {
    cs[i] = make(-1);
    ds[i] = make(0);
    fill(cs[i], ds[i], seed + (uint64_t)i, lo[i], hi[i]);
  }
}
static void release(bufs *b) {
  bl_tensor_free(b->w);
  bl_tensor_free(b->g);
  bl_tensor_free(b->m);
  bl_tensor_free(b->v);
}

/* max over i of |got - ref| / (atol + rtol |ref|) must be <= 1 */
static void close_(const char *what, const bl_tensor *ref, const bl_tensor *dev, double rtol, double atol) {
  bl_tensor *h = make(-1);
  OK(bl_tensor_copy(h, dev));
  const float *a = ref->data, *b = h->data;
  for (int64_t i = 0; i < N; i++) {
    double e = fabs((double)a[i] - b[i]);
    if (!(e <= atol + rtol * fabs(a[i]))) {
      printf("FAIL %s: element %lld cpu %.9g cuda %.9g\n", what, (long long)i, a[i], b[i]);
      failures++;
      break;
    }
  }
  bl_tensor_free(h);
}

static const bl_optim_segments SEG = { 3, 0, OFF, LEN, DEC };

typedef int (*step_fn)(const void *cfg, bufs *b, int64_t step, double grad_norm, bl_optim_stats *st);
static int lamb(const void *cfg, bufs *b, int64_t step, double gn, bl_optim_stats *st) {
  return bl_lamb_step(cfg, &(bl_optim_args){ .w = b->w,
                                             .g = b->g,
                                             .m = b->m,
                                             .v = b->v,
                                             .seg = &SEG,
                                             .step = step,
                                             .lr = 2e-3,
                                             .grad_scale = 0.25,
                                             .grad_norm = gn,
                                             .has_grad_norm = gn >= 0,
                                             .stats = st });
}
static int adamw(const void *cfg, bufs *b, int64_t step, double gn, bl_optim_stats *st) {
  return bl_adamw_step(cfg, &(bl_optim_args){ .w = b->w,
                                              .g = b->g,
                                              .m = b->m,
                                              .v = b->v,
                                              .seg = &SEG,
                                              .step = step,
                                              .lr = 2e-3,
                                              .grad_scale = 0.25,
                                              .grad_norm = gn,
                                              .has_grad_norm = gn >= 0,
                                              .stats = st });
}
static int sgd(const void *cfg, bufs *b, int64_t step, double gn, bl_optim_stats *st) {
  return bl_sgd_step(cfg, &(bl_optim_args){ .w = b->w,
                                            .g = b->g,
                                            .m = b->m,
                                            .seg = &SEG,
                                            .step = step,
                                            .lr = 2e-3,
                                            .grad_scale = 0.25,
                                            .grad_norm = gn,
                                            .has_grad_norm = gn >= 0,
                                            .stats = st });
}

/* Three steps on both devices with the same fresh gradients; given_norm
 * passes the norm from bl_grad_global_norm instead of letting the step compute it. */
static void compare(const char *name, step_fn fn, const void *cfg, int given_norm) {
  bufs c, d;
  setup(&c, &d, 100);
  for (int64_t step = 1; step <= 3; step++) {
    fill(c.g, d.g, 200 + (uint64_t)step, -0.1, 0.1);
    double gc = -1, gd = -1;
    if (given_norm) {
      OK(bl_grad_global_norm(c.g, &gc, NULL));
      OK(bl_grad_global_norm(d.g, &gd, NULL));
      gc *= 0.25;
      gd *= 0.25;
    }
    bl_optim_stats sc, sd;
    OK(fn(cfg, &c, step, gc, &sc));
    OK(fn(cfg, &d, step, gd, &sd));
    CHECK(fabs(sc.grad_norm - sd.grad_norm) <= 1e-12 * sc.grad_norm && fabs(sc.clip_coef - sd.clip_coef) <= 1e-12 &&
              sc.nonfinite == 0 && sd.nonfinite == 0,
          "%s step %lld: stats cpu (%.17g, %.17g) cuda (%.17g, %.17g)", name, (long long)step, sc.grad_norm,
          sc.clip_coef, sd.grad_norm, sd.clip_coef);
  }
  char what[96];
  snprintf(what, sizeof what, "%s params", name);
  close_(what, c.w, d.w, 1e-6, 1e-9);
  snprintf(what, sizeof what, "%s moment 1", name);
  close_(what, c.m, d.m, 2e-6, 1e-12);
  snprintf(what, sizeof what, "%s moment 2", name);
  close_(what, c.v, d.v, 2e-6, 1e-15);
  release(&c);
  release(&d);
}

static void test_configs(void) {
  bl_lamb_config l;
  const char *lname[] = { "lamb",
                          "lamb nvlamb",
                          "lamb L2 mode",
                          "lamb no averaging",
                          "lamb no bias correction",
                          "lamb max_weight_norm",
                          "lamb max_trust_ratio",
                          "lamb no weight decay",
                          "lamb no clipping" };
  for (int k = 0; k < 9; k++) {
    bl_lamb_config_default(&l);
    l.max_grad_norm = 0.05; /* below the gradients' norm: clipping is active */
    if (k == 1) l.use_nvlamb = 1;
    if (k == 2) l.adam_w_mode = 0;
    if (k == 3) l.grad_averaging = 0;
    if (k == 4) l.bias_correction = 0;
    if (k == 5) l.max_weight_norm = 10;
    if (k == 6) l.max_trust_ratio = 0.5;
    if (k == 7) l.weight_decay = 0;
    if (k == 8) l.max_grad_norm = 0;
    compare(lname[k], lamb, &l, 0);
  }
  compare("lamb given norm", lamb, &l, 1);
  bl_adamw_config a;
  const char *aname[] = { "adamw", "adamw per-segment clip (BertAdam)", "adamw no bias correction", "adam L2 mode" };
  for (int k = 0; k < 4; k++) {
    bl_adamw_config_default(&a);
    a.max_grad_norm = 0.05;
    if (k == 1) {
      a.per_segment_clip = 1;
      a.max_grad_norm = 0.01;
    }
    if (k == 2) a.bias_correction = 0;
    if (k == 3) a.adam_w_mode = 0;
    compare(aname[k], adamw, &a, 0);
  }
  compare("adamw given norm", adamw, &a, 1);
  bl_sgd_config s;
  const char *sname[] = { "sgd", "sgd momentum", "sgd nesterov" };
  for (int k = 0; k < 3; k++) {
    bl_sgd_config_default(&s);
    s.weight_decay = 0.01;
    s.max_grad_norm = 0.05;
    if (k >= 1) {
      s.momentum = 0.9;
      s.dampening = k == 1 ? 0.1 : 0;
    }
    if (k == 2) s.nesterov = 1;
    compare(sname[k], sgd, &s, 0);
  }
}

/* The device's global norm against a direct f64 sum, and unscale_check. */
static void test_norm_unscale(void) {
  bl_tensor *c = make(-1), *d = make(0);
  fill(c, d, 7, -3, 3);
  double want = 0, got = -1;
  for (int64_t i = 0; i < N; i++) want += (double)((float *)c->data)[i] * ((float *)c->data)[i];
  want = sqrt(want);
  int bad = -1;
  OK(bl_grad_global_norm(d, &got, &bad));
  CHECK(fabs(got - want) <= 1e-12 * want && bad == 0, "global norm %.17g, expected %.17g (nonfinite %d)", got, want,
        bad);
  OK(bl_unscale_check(d, 0.5, &bad));
  OK(bl_unscale_check(c, 0.5, &bad));
  close_("unscale", c, d, 0, 0);
  CHECK(bad == 0, "unscale_check: false positive");
  ((float *)c->data)[N - 1] = NAN;
  OK(bl_tensor_copy(d, c));
  OK(bl_unscale_check(d, 0.5, &bad));
  CHECK(bad == 1, "unscale_check missed a NaN");
  OK(bl_grad_global_norm(d, &got, &bad));
  CHECK(bad == 1, "global norm missed a NaN");
  bl_tensor_free(c);
  bl_tensor_free(d);
}

/* inf in a gradient (or a NaN norm from the caller): BL_EINVAL naming it, nothing written. */
static void test_nonfinite(void) {
  bufs c, d;
  setup(&c, &d, 300);
  bl_tensor *w0 = make(-1), *m0 = make(-1);
  OK(bl_tensor_copy(w0, c.w));
  OK(bl_tensor_copy(m0, c.m));
  ((float *)c.g->data)[17005] = INFINITY;
  OK(bl_tensor_copy(d.g, c.g));
  bl_lamb_config l;
  bl_lamb_config_default(&l);
  for (int given = 0; given < 2; given++) {
    bl_optim_stats st;
    int rc = lamb(&l, &d, 1, given ? NAN : -1, &st);
    CHECK(rc == BL_EINVAL && strstr(bl_last_error(), "non-finite gradient") && st.nonfinite == 1,
          "non-finite %s: rc %d nonfinite %d (%s)", given ? "given norm" : "gradient", rc, st.nonfinite,
          bl_last_error());
    close_("params after a non-finite step", w0, d.w, 0, 0);
    close_("moment 1 after a non-finite step", m0, d.m, 0, 0);
  }
  bl_tensor_free(w0);
  bl_tensor_free(m0);
  release(&c);
  release(&d);
}

/* A training loop allocates on its first step only, and synchronises once
 * per step when the step computes the norm, never when it is given. */
static void test_counters(void) {
  bufs c, d;
  setup(&c, &d, 400);
  bl_lamb_config l;
  bl_lamb_config_default(&l);
  bl_cuda_count a, b, e;
  OK(lamb(&l, &d, 1, -1, NULL));
  OK(bl_cuda_counters(0, &a));
  for (int64_t step = 2; step <= 4; step++) OK(lamb(&l, &d, step, -1, NULL));
  OK(bl_cuda_counters(0, &b));
  for (int64_t step = 5; step <= 7; step++) OK(lamb(&l, &d, step, 0.3, NULL));
  OK(bl_cuda_synchronize(0));
  OK(bl_cuda_counters(0, &e));
  CHECK(b.mallocs == a.mallocs && b.frees == a.frees && e.mallocs == a.mallocs,
        "allocations after step 1: %lld mallocs, %lld frees", (long long)(e.mallocs - a.mallocs),
        (long long)(e.frees - a.frees));
  CHECK(b.syncs - a.syncs == 3, "3 steps computing their norm synchronised %lld times (want 3)",
        (long long)(b.syncs - a.syncs));
  CHECK(e.syncs - b.syncs == 1, "3 steps with a given norm + 1 explicit sync synchronised %lld times (want 1)",
        (long long)(e.syncs - b.syncs));
  release(&c);
  release(&d);
}

/* Loss-scaled steps with the decision on the device (bl_lamb_step_amp): the same skips, scales and weights as the
 * CPU twin, state values as the rules give them by hand, the skipped step leaves the weights alone, and no
 * synchronisation or allocation after the first step. */
static bl_tensor *amp_state(int dev, double scale) {
  bl_tensor *t = NULL;
  OK(bl_tensor_empty(1, (const int64_t[]){ BL_AMP_STATE_LEN }, BL_F64, dev, &t));
  OK(bl_tensor_fill(t, 0));
  OK(bl_tensor_set(t, (const int64_t[]){ BL_AMP_SCALE }, scale));
  return t;
}
static void test_amp(void) {
  bufs c, d;
  setup(&c, &d, 600);
  bl_lamb_config l;
  bl_lamb_config_default(&l);
  const bl_amp_config amp = { 2.0, 0.5, 1.0, 16777216.0, 2, 1, NULL };
  bl_tensor *sc = amp_state(-1, 1024), *sd = amp_state(0, 1024), *w2 = make(-1), *w3 = make(-1);
  bl_cuda_count a, b;
  int64_t waits = 0, allocs = 0;
  for (int64_t call = 1; call <= 6; call++) {
    fill(c.g, d.g, 700 + (uint64_t)call, -100, 100); /* scaled gradients: the loss scale is ~1e3 */
    if (call == 3) {
      ((float *)c.g->data)[17020] = -INFINITY;
      OK(bl_tensor_copy(d.g, c.g));
    }
    OK(bl_lamb_step(&l, &(bl_optim_args){ .w = c.w,
                                          .g = c.g,
                                          .m = c.m,
                                          .v = c.v,
                                          .seg = &SEG,
                                          .lr = 2e-3,
                                          .grad_scale = 0.5,
                                          .amp = &amp,
                                          .amp_state = sc }));
    OK(bl_cuda_counters(0, &a));
    OK(bl_lamb_step(&l, &(bl_optim_args){ .w = d.w,
                                          .g = d.g,
                                          .m = d.m,
                                          .v = d.v,
                                          .seg = &SEG,
                                          .lr = 2e-3,
                                          .grad_scale = 0.5,
                                          .amp = &amp,
                                          .amp_state = sd }));
    OK(bl_cuda_counters(0, &b));
    if (call > 1) {
      waits += b.syncs - a.syncs;
      allocs += b.mallocs - a.mallocs + b.frees - a.frees;
    }
    if (call == 2) OK(bl_tensor_copy(w2, d.w));
    if (call == 3) OK(bl_tensor_copy(w3, d.w));
  }
  CHECK(waits == 0 && allocs == 0, "5 amp steps after the first: %lld syncs, %lld mallocs + frees (want none)",
        (long long)waits, (long long)allocs);
  close_("weights of the skipped amp step", w2, w3, 0, 0);
  close_("amp params", c.w, d.w, 1e-6, 1e-9);
  close_("amp moment 2", c.v, d.v, 2e-6, 1e-15);
  /* 1024: clean, clean -> 2048 (interval 2), overflow -> 1024, clean, clean -> 2048, clean */
  const double want[BL_AMP_STATE_LEN] = { 2048, 1, 0, 1, 5, -1, 0, 6 };
  double hc[BL_AMP_STATE_LEN], hd[BL_AMP_STATE_LEN];
  OK(bl_tensor_to_doubles(sc, hc, BL_AMP_STATE_LEN));
  OK(bl_tensor_to_doubles(sd, hd, BL_AMP_STATE_LEN));
  for (int i = 0; i < BL_AMP_STATE_LEN; i++) {
    if (i == BL_AMP_NORM) {
      CHECK(hc[i] > 0 && fabs(hc[i] - hd[i]) <= 1e-12 * hc[i], "amp norm cpu %.17g cuda %.17g", hc[i], hd[i]);
      continue;
    }
    CHECK(hc[i] == want[i] && hd[i] == want[i], "amp state[%d]: cpu %g cuda %g, want %g", i, hc[i], hd[i], want[i]);
  }
  bl_tensor_free(sc);
  bl_tensor_free(sd);
  bl_tensor_free(w2);
  bl_tensor_free(w3);
  release(&c);
  release(&d);
}

/* The compute copy written by the update launch (bl_optim.h `half`): on either device, master weights and copy are
 * bit for bit those of the step without it followed by the cast that used to refresh the copy, for every optimizer
 * kind, both half dtypes and the loss-scaled step; on the device the step makes no launch more, so a step drops the
 * cast's launches. Starting copies hold the cast of the initial weights, so an element the step forgot differs. */
static int half_step(int kind, bufs *b, bl_tensor *half, int64_t step, bl_tensor *amp) {
  bl_lamb_config l;
  bl_adamw_config a;
  bl_sgd_config s;
  bl_lamb_config_default(&l);
  bl_adamw_config_default(&a);
  bl_sgd_config_default(&s);
  s.momentum = 0.9;
  s.weight_decay = 0.01;
  l.use_nvlamb = kind == 1;
  static const bl_amp_config AMP = { 2.0, 0.5, 1.0, 16777216.0, 2, 1, NULL };
  switch (kind) {
    case 0:
    case 1:
      return bl_lamb_step(&l, &(bl_optim_args){ .w = b->w,
                                                .half = half,
                                                .g = b->g,
                                                .m = b->m,
                                                .v = b->v,
                                                .seg = &SEG,
                                                .step = step,
                                                .lr = 2e-3,
                                                .grad_scale = 0.25 });
    case 2:
      return bl_adamw_step(&a, &(bl_optim_args){ .w = b->w,
                                                 .half = half,
                                                 .g = b->g,
                                                 .m = b->m,
                                                 .v = b->v,
                                                 .seg = &SEG,
                                                 .step = step,
                                                 .lr = 2e-3,
                                                 .grad_scale = 0.25 });
    case 3:
      return bl_sgd_step(&s, &(bl_optim_args){ .w = b->w,
                                               .half = half,
                                               .g = b->g,
                                               .m = b->m,
                                               .seg = &SEG,
                                               .step = step,
                                               .lr = 2e-3,
                                               .grad_scale = 0.25 });
    case 4:
      return bl_lamb_step(&l, &(bl_optim_args){ .w = b->w,
                                                .half = half,
                                                .g = b->g,
                                                .m = b->m,
                                                .v = b->v,
                                                .seg = &SEG,
                                                .lr = 2e-3,
                                                .grad_scale = 0.5,
                                                .amp = &AMP,
                                                .amp_state = amp });
    default:
      return bl_adamw_step(&a, &(bl_optim_args){ .w = b->w,
                                                 .half = half,
                                                 .g = b->g,
                                                 .m = b->m,
                                                 .v = b->v,
                                                 .seg = &SEG,
                                                 .lr = 2e-3,
                                                 .grad_scale = 0.5,
                                                 .amp = &AMP,
                                                 .amp_state = amp });
  }
}
static bl_tensor *make_half(int dev, bl_dtype dt) {
  bl_tensor *t = NULL;
  OK(bl_tensor_empty(1, (const int64_t[]){ N }, dt, dev, &t));
  return t;
}
static int same_bits(const bl_tensor *a, const bl_tensor *b) {
  bl_tensor *ha = NULL, *hb = NULL;
  const int64_t n[1] = { N };
  OK(bl_tensor_empty(1, n, a->dtype, -1, &ha));
  OK(bl_tensor_empty(1, n, b->dtype, -1, &hb));
  OK(bl_tensor_copy(ha, a));
  OK(bl_tensor_copy(hb, b));
  int same = a->dtype == b->dtype && !memcmp(ha->data, hb->data, (size_t)N * bl_dtype_size(a->dtype));
  bl_tensor_free(ha);
  bl_tensor_free(hb);
  return same;
}
static int64_t launches(void) {
  bl_cuda_count c;
  OK(bl_cuda_counters(0, &c));
  return c.launches;
}
static void test_fused_half(void) {
  static const char *kinds[] = { "lamb", "nvlamb", "adamw", "sgd momentum", "lamb amp", "adamw amp" };
  for (int dev = -1; dev <= 0; dev++)
    for (int kind = 0; kind < 6; kind++)
      for (int h = 0; h < 2; h++) {
        const bl_dtype dt = h ? BL_F16 : BL_BF16;
        bufs x, y, unused;
        setup(dev < 0 ? &x : &unused, dev < 0 ? &unused : &x, 900 + (uint64_t)kind);
        release(&unused);
        setup(dev < 0 ? &y : &unused, dev < 0 ? &unused : &y, 900 + (uint64_t)kind);
        release(&unused);
        bl_tensor *hx = make_half(dev, dt), *hy = make_half(dev, dt);
        bl_tensor *ax = kind >= 4 ? amp_state(dev, 1024) : NULL, *ay = kind >= 4 ? amp_state(dev, 1024) : NULL;
        OK(bl_tensor_copy(hx, x.w));
        OK(bl_tensor_copy(hy, y.w));
        int64_t old_launches = 0, fused_launches = 0, cast_launches = 0;
        for (int64_t step = 1; step <= 2; step++) {
          OK(bl_rand_uniform(x.g, 950 + (uint64_t)step, 0, -0.1, 0.1));
          OK(bl_tensor_copy(y.g, x.g));
          int64_t l0 = dev >= 0 ? launches() : 0;
          OK(half_step(kind, &x, NULL, step, ax));
          int64_t l1 = dev >= 0 ? launches() : 0;
          OK(bl_tensor_copy(hx, x.w)); /* the refresh cast the fused write replaces */
          int64_t l2 = dev >= 0 ? launches() : 0;
          OK(half_step(kind, &y, hy, step, ay));
          int64_t l3 = dev >= 0 ? launches() : 0;
          old_launches += l2 - l0;
          cast_launches += l2 - l1;
          fused_launches += l3 - l2;
        }
        CHECK(same_bits(x.w, y.w) && same_bits(hx, hy), "%s %s on %s: master weights %s, compute copy %s", kinds[kind],
              bl_dtype_name(dt), dev < 0 ? "cpu" : "cuda:0", same_bits(x.w, y.w) ? "equal" : "differ",
              same_bits(hx, hy) ? "equal" : "differ");
        if (dev >= 0 && launches() >= 0) /* the emulator counts launches; a real GPU reports -1 */
          CHECK(cast_launches > 0 && fused_launches == old_launches - cast_launches,
                "%s %s: 2 steps + casts launched %lld kernels (%lld casts), the fused steps %lld", kinds[kind],
                bl_dtype_name(dt), (long long)old_launches, (long long)cast_launches, (long long)fused_launches);
        bl_tensor_free(hx);
        bl_tensor_free(hy);
        bl_tensor_free(ax);
        bl_tensor_free(ay);
        release(&x);
        release(&y);
      }
  /* a compute copy that is not one: an error naming it, nothing written */
  bufs c, d;
  setup(&c, &d, 990);
  bl_tensor *f32 = make(0), *wrong = NULL, *cpu = make_half(-1, BL_BF16);
  OK(bl_tensor_empty(1, (const int64_t[]){ N - 1 }, BL_BF16, 0, &wrong));
  bl_lamb_config l;
  bl_lamb_config_default(&l);
  int rc = bl_lamb_step(
      &l,
      &(bl_optim_args){
          .w = d.w, .half = f32, .g = d.g, .m = d.m, .v = d.v, .seg = &SEG, .step = 1, .lr = 1e-3, .grad_scale = 1 });
  CHECK(rc == BL_EINVAL && strstr(bl_last_error(), "must be bf16 or f16"), "f32 compute copy: rc %d (%s)", rc,
        bl_last_error());
  rc = bl_lamb_step(
      &l,
      &(bl_optim_args){
          .w = d.w, .half = wrong, .g = d.g, .m = d.m, .v = d.v, .seg = &SEG, .step = 1, .lr = 1e-3, .grad_scale = 1 });
  CHECK(rc == BL_EINVAL && strstr(bl_last_error(), "has 20010 elements"), "short compute copy: rc %d (%s)", rc,
        bl_last_error());
  rc = bl_lamb_step(
      &l,
      &(bl_optim_args){
          .w = d.w, .half = cpu, .g = d.g, .m = d.m, .v = d.v, .seg = &SEG, .step = 1, .lr = 1e-3, .grad_scale = 1 });
  CHECK(rc == BL_EINVAL && strstr(bl_last_error(), "is on cpu"), "compute copy on the cpu: rc %d (%s)", rc,
        bl_last_error());
  bl_tensor *w0 = make(-1);
  OK(bl_tensor_copy(w0, c.w));
  close_("params after refused compute copies", w0, d.w, 0, 0);
  bl_tensor_free(w0);
  bl_tensor_free(f32);
  bl_tensor_free(wrong);
  bl_tensor_free(cpu);
  release(&c);
  release(&d);
}

static void test_mixed(void) {
  bufs c, d;
  setup(&c, &d, 500);
  bl_lamb_config l;
  bl_lamb_config_default(&l);
  int rc = bl_lamb_step(
      &l,
      &(bl_optim_args){ .w = d.w, .g = c.g, .m = d.m, .v = d.v, .seg = &SEG, .step = 1, .lr = 1e-3, .grad_scale = 1 });
  CHECK(rc != 0 && strstr(bl_last_error(), "different devices"), "mixed devices accepted (rc %d: %s)", rc,
        bl_last_error());
  rc = bl_unscale_to_f32(d.w, d.g, 1.0, NULL);
  CHECK(rc == BL_EUNSUPPORTED, "unscale_to_f32 on cuda: rc %d (%s)", rc, bl_last_error());
  release(&c);
  release(&d);
}

/* bl_amp_config.lr_from: the step takes its learning rate from a device (or CPU) tensor when it runs, ignoring its
 * lr argument (a replayed CUDA graph's step reads the rate the host copied there): on both devices the weights equal,
 * bit for bit, those of the same steps given the rate as an argument; two steps with different rates in the tensor
 * show it is read at each step. Fails if lr_from is ignored (the argument, 7.0, would blow the weights up). */
static void test_amp_lr_from(void) {
  bl_lamb_config l;
  bl_lamb_config_default(&l);
  bl_adamw_config a;
  bl_adamw_config_default(&a);
  const double rates[2] = { 2e-3, 5e-4 };
  for (int kind = 0; kind < 2; kind++) {
    for (int dev = -1; dev <= 0; dev++) {
      bufs x[2], y[2];
      setup(&x[0], &y[0], 900);
      setup(&x[1], &y[1], 900);
      bufs *p = dev < 0 ? x : y;
      bl_tensor *s0 = amp_state(dev, 1), *s1 = amp_state(dev, 1), *lr = NULL;
      OK(bl_tensor_empty(1, (const int64_t[]){ 1 }, BL_F64, dev, &lr));
      bl_amp_config by_arg = { 2.0, 0.5, 1.0, 16777216.0, 2, 0, NULL }, by_tensor = by_arg;
      by_tensor.lr_from = lr;
      for (int step = 0; step < 2; step++) {
        OK(bl_tensor_fill(lr, rates[step]));
        /* p[0] given the rate as an argument, p[1] reading it from lr (its argument would blow it up) */
        const bl_optim_args by[2] = {
          { .w = p[0].w,
            .g = p[0].g,
            .m = p[0].m,
            .v = p[0].v,
            .seg = &SEG,
            .lr = rates[step],
            .grad_scale = 1.0,
            .amp = &by_arg,
            .amp_state = s0 },
          { .w = p[1].w,
            .g = p[1].g,
            .m = p[1].m,
            .v = p[1].v,
            .seg = &SEG,
            .lr = 7.0,
            .grad_scale = 1.0,
            .amp = &by_tensor,
            .amp_state = s1 },
        };
        for (int i = 0; i < 2; i++) OK(kind == 0 ? bl_lamb_step(&l, &by[i]) : bl_adamw_step(&a, &by[i]));
      }
      char what[80];
      snprintf(what, sizeof what, "%s weights with lr_from on %s", kind ? "adamw" : "lamb", dev < 0 ? "cpu" : "cuda");
      bl_tensor *w0 = make(-1);
      OK(bl_tensor_copy(w0, p[0].w));
      close_(what, w0, p[1].w, 0, 0);
      bl_tensor_free(w0);
      bl_tensor *bad = NULL;
      OK(bl_tensor_empty(1, (const int64_t[]){ 2 }, BL_F64, dev, &bad));
      by_tensor.lr_from = bad;
      CHECK(bl_lamb_step(&l, &(bl_optim_args){ .w = p[1].w,
                                               .g = p[1].g,
                                               .m = p[1].m,
                                               .v = p[1].v,
                                               .seg = &SEG,
                                               .lr = 1e-3,
                                               .grad_scale = 1.0,
                                               .amp = &by_tensor,
                                               .amp_state = s1 }) != 0 &&
                strstr(bl_last_error(), "lr_from") != NULL,
            "a 2-element lr_from is refused naming it: %s", bl_last_error());
      bl_tensor_free(bad);
      bl_tensor_free(lr);
      bl_tensor_free(s0);
      bl_tensor_free(s1);
      for (int i = 0; i < 2; i++) {
        release(&x[i]);
        release(&y[i]);
      }
    }
  }
}

int main(void) {
  if (!bl_cuda_compiled() || bl_cuda_device_count() == 0) {
    printf("skipped: no CUDA device (bl_cuda_compiled() = %d)\n", bl_cuda_compiled());
    return 77;
  }
  test_configs();
  test_norm_unscale();
  test_nonfinite();
  test_counters();
  test_amp();
  test_amp_lr_from();
  test_fused_half();
  test_mixed();
  if (failures) {
    printf("%d failures\n", failures);
    return 1;
  }
  printf("ok\n");
  return 0;
}
