/* Optimizer plumbing (see optim_internal.h) plus the two public helpers that
 * do not update weights: bl_grad_global_norm and the fused unscale + inf/NaN
 * check used by dynamic loss scaling (contracts in bl_optim.h). */
#include "optim_internal.h"
#include "ops/ops_internal.h"
#include "device/dispatch.h"
#include "base/half.h"
#include "base/rules/optim.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void bl_lamb_config_default(bl_lamb_config *c) {
  if (!c) return;
  c->beta1 = 0.9;
  c->beta2 = 0.999;
  c->eps = 1e-6;
  c->weight_decay = 0.01;
  c->max_grad_norm = 1.0;
  c->max_weight_norm = 0;
  c->max_trust_ratio = 0;
  c->bias_correction = 1;
  c->use_nvlamb = 0;
  c->adam_w_mode = 1;
  c->grad_averaging = 1;
}

void bl_adamw_config_default(bl_adamw_config *c) {
  if (!c) return;
  c->beta1 = 0.9;
  c->beta2 = 0.999;
  c->eps = 1e-6;
  c->weight_decay = 0.01;
  c->max_grad_norm = 0;
  c->bias_correction = 1;
  c->adam_w_mode = 1;
  c->per_segment_clip = 0;
  c->pad_ = 0;
}

void bl_sgd_config_default(bl_sgd_config *c) {
  if (!c) return;
  c->momentum = 0;
  c->dampening = 0;
  c->weight_decay = 0;
  c->max_grad_norm = 0;
  c->nesterov = 0;
  c->pad_ = 0;
}

static int live(const char *op, const bl_tensor *t, const char *name) {
  if (!t) return BL_ERR("%s: %s is NULL", op, name);
  if (!t->storage) return BL_ERR("%s: %s was released", op, name);
  if (t->ndim < 0 || t->ndim > BL_MAX_DIMS) return BL_ERR("%s: %s has invalid ndim %d", op, name, t->ndim);
  if (t->numel > 0 && !t->data) return BL_ERR("%s: %s has no data", op, name);
  return 0;
}

int opt_check_flat(const char *op, const bl_tensor *t, const char *name) {
  BL_CHECK(live(op, t, name));
  if (t->dtype != BL_F32) return BL_ERR("%s: %s must be a flat f32 buffer, got %s", op, name, bl_dtype_name(t->dtype));
  if (!bl_tensor_is_contiguous(t)) return BL_ERR("%s: %s must be contiguous (a flat buffer)", op, name);
  return 0;
}

int opt_check_same(const char *op, const bl_tensor *w, const bl_tensor *t, const char *name) {
  BL_CHECK(opt_check_flat(op, t, name));
  if (t->numel != w->numel)
    return BL_ERR("%s: %s has %lld elements but params has %lld", op, name, (long long)t->numel, (long long)w->numel);
  return 0;
}

/* An aliased moment or gradient would silently corrupt the update: the
 * buffers must not share bytes (they are contiguous f32). */
int opt_check_disjoint(const char *op, int n, const bl_tensor *const *t, const char *const *names) {
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++) {
      if (!t[i] || !t[j] || t[i]->numel == 0 || t[j]->numel == 0) continue;
      const char *a = t[i]->data, *b = t[j]->data;
      size_t na = (size_t)t[i]->numel * 4, nb = (size_t)t[j]->numel * 4;
      if (a < b + nb && b < a + na)
        return BL_ERR("%s: %s and %s share memory; they must be separate buffers", op, names[i], names[j]);
    }
  return 0;
}

static const char *dev_name(int dev, char buf[24]) {
  if (dev < 0) return "cpu";
  snprintf(buf, 24, "cuda:%d", dev);
  return buf;
}

int opt_check_half(const char *op, const bl_tensor *w, const bl_tensor *half, int n, const bl_tensor *const *ts) {
  if (!half) return 0;
  BL_CHECK(live(op, half, "half (the compute copy)"));
  if (half->dtype != BL_BF16 && half->dtype != BL_F16)
    return BL_ERR("%s: half (the compute copy) must be bf16 or f16, got %s", op, bl_dtype_name(half->dtype));
  if (!bl_tensor_is_contiguous(half)) return BL_ERR("%s: half (the compute copy) must be contiguous", op);
  if (half->numel != w->numel)
    return BL_ERR("%s: half (the compute copy) has %lld elements but params has %lld", op, (long long)half->numel,
                  (long long)w->numel);
  if (half->device != w->device) {
    char a[24], b[24];
    return BL_ERR("%s: half (the compute copy) is on %s but params on %s", op, dev_name(half->device, a),
                  dev_name(w->device, b));
  }
  const char *h = half->data;
  const size_t nh = (size_t)half->numel * 2;
  for (int i = 0; i < n; i++) {
    if (!ts[i] || ts[i]->numel == 0 || nh == 0) continue;
    const char *b = ts[i]->data;
    if (h < b + (size_t)ts[i]->numel * 4 && b < h + nh)
      return BL_ERR("%s: half (the compute copy) shares memory with an f32 buffer of the step", op);
  }
  return 0;
}

void opt_store_half(bl_tensor *half, const float *w, int64_t off, int64_t n) {
  if (!half) return;
  uint16_t *h = (uint16_t *)half->data + off;
  w += off;
  if (half->dtype == BL_BF16)
    for (int64_t i = 0; i < n; i++) h[i] = bl_half_f32_to_bf16(w[i]);
  else
    for (int64_t i = 0; i < n; i++) h[i] = bl_half_f32_to_f16(w[i]);
}

typedef struct seg_key {
  int64_t off;
  int32_t k;
} seg_key;
static int cmp_key(const void *a, const void *b) {
  const seg_key *x = a, *y = b;
  return x->off < y->off ? -1 : x->off > y->off ? 1 : (x->k > y->k) - (x->k < y->k);
}

int opt_check_segments(const char *op, const bl_optim_segments *seg, int64_t numel) {
  if (!seg) return BL_ERR("%s: segments is NULL", op);
  if (seg->count < 0) return BL_ERR("%s: segment count %d is negative", op, seg->count);
  if (seg->count == 0) return 0;
  if (!seg->offset || !seg->length) return BL_ERR("%s: segments have NULL offset/length arrays", op);
  for (int32_t k = 0; k < seg->count; k++) {
    int64_t o = seg->offset[k], n = seg->length[k];
    if (o < 0 || n < 0 || o > numel || n > numel - o)
      return BL_ERR("%s: segment %d [%lld, %lld) is outside the flat buffer of %lld elements", op, k, (long long)o,
                    (long long)o + (long long)n, (long long)numel);
  }
  seg_key *key = malloc(sizeof(seg_key) * (size_t)seg->count);
  if (!key) return bl_set_error(BL_ENOMEM, "%s: out of memory checking %d segments", op, seg->count);
  for (int32_t k = 0; k < seg->count; k++) {
    key[k].off = seg->offset[k];
    key[k].k = k;
  }
  qsort(key, (size_t)seg->count, sizeof(seg_key), cmp_key);
  int rc = 0;
  for (int32_t i = 1; i < seg->count; i++) {
    int32_t a = key[i - 1].k, b = key[i].k;
    if (seg->length[a] > 0 && seg->length[b] > 0 && seg->offset[a] + seg->length[a] > seg->offset[b]) {
      rc = BL_ERR("%s: segments %d [%lld, %lld) and %d [%lld, %lld) overlap", op, a, (long long)seg->offset[a],
                  (long long)(seg->offset[a] + seg->length[a]), b, (long long)seg->offset[b],
                  (long long)(seg->offset[b] + seg->length[b]));
      break;
    }
  }
  free(key);
  return rc;
}

void opt_plan_free(opt_plan *p) {
  free(p->chunk_seg);
  free(p->chunk_start);
  free(p->chunk_len);
  free(p->seg_first);
  p->chunk_seg = NULL;
  p->chunk_start = p->chunk_len = p->seg_first = NULL;
  p->nchunks = 0;
}

int opt_plan_make(const char *op, const bl_optim_segments *seg, opt_plan *p) {
  p->nchunks = 0;
  p->chunk_seg = NULL;
  p->chunk_start = p->chunk_len = NULL;
  p->seg_first = malloc(sizeof(int64_t) * ((size_t)seg->count + 1));
  if (!p->seg_first) return bl_set_error(BL_ENOMEM, "%s: out of memory planning %d segments", op, seg->count);
  int64_t nc = 0;
  for (int32_t k = 0; k < seg->count; k++) {
    p->seg_first[k] = nc;
    nc += (seg->length[k] + OPT_CHUNK - 1) / OPT_CHUNK;
  }
  p->seg_first[seg->count] = nc;
  size_t n = nc > 0 ? (size_t)nc : 1;
  p->chunk_seg = malloc(sizeof(int32_t) * n);
  p->chunk_start = malloc(sizeof(int64_t) * n);
  p->chunk_len = malloc(sizeof(int64_t) * n);
  if (!p->chunk_seg || !p->chunk_start || !p->chunk_len) {
    opt_plan_free(p);
    return bl_set_error(BL_ENOMEM, "%s: out of memory planning %lld chunks", op, (long long)nc);
  }
  int64_t c = 0;
  for (int32_t k = 0; k < seg->count; k++)
    for (int64_t s = 0; s < seg->length[k]; s += OPT_CHUNK, c++) {
      p->chunk_seg[c] = k;
      p->chunk_start[c] = seg->offset[k] + s;
      p->chunk_len[c] = seg->length[k] - s < OPT_CHUNK ? seg->length[k] - s : OPT_CHUNK;
    }
  p->nchunks = nc;
  return 0;
}

double opt_sumsq(const float *x, int64_t len, double scale) {
  double s = 0;
/* simd reduction: the lane split is fixed at compile time, so the result
   * depends only on len and the data. */
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < len; i++) {
    double d = (double)x[i];
    s += d * d;
  }
  return s * scale * scale;
}

void opt_chunk_sumsq(const opt_plan *p, const float *g, double grad_scale, double *part) {
#pragma omp parallel for schedule(static) if (p->nchunks > 4)
  for (int64_t c = 0; c < p->nchunks; c++) part[c] = opt_sumsq(g + p->chunk_start[c], p->chunk_len[c], grad_scale);
}

static int check_beta(const char *op, const char *name, double b) {
  if (!(b >= 0 && b < 1)) return BL_ERR("%s: %s must be in [0, 1), got %g", op, name, b);
  return 0;
}

int opt_check_adam_hyper(const char *op, double beta1, double beta2, double eps, double weight_decay) {
  BL_CHECK(check_beta(op, "beta1", beta1));
  BL_CHECK(check_beta(op, "beta2", beta2));
  if (!isfinite(eps) || eps < 0) return BL_ERR("%s: eps must be finite and >= 0, got %g", op, eps);
  if (!isfinite(weight_decay) || weight_decay < 0)
    return BL_ERR("%s: weight_decay must be finite and >= 0, got %g", op, weight_decay);
  return 0;
}

int opt_device(const char *op, int n, const bl_tensor *const *ts, int *dev) { return opx_device(op, n, ts, dev); }

int opt_check_step(const char *op, int64_t step, double lr, double grad_scale, double max_grad_norm) {
  if (step < 1) return BL_ERR("%s: step must be >= 1 (1-based count of this update), got %lld", op, (long long)step);
  if (!isfinite(lr) || lr < 0) return BL_ERR("%s: learning rate must be finite and >= 0, got %g", op, lr);
  if (!isfinite(grad_scale) || grad_scale <= 0)
    return BL_ERR("%s: grad_scale must be finite and > 0, got %g", op, grad_scale);
  if (!(max_grad_norm >= 0) || isinf(max_grad_norm))
    return BL_ERR("%s: max_grad_norm must be finite and >= 0 (0 = no clipping), got %g", op, max_grad_norm);
  return 0;
}

int opt_prologue(const char *op, const opt_plan *p, const float *g, int64_t step, double lr, double grad_scale,
                 double grad_norm, double max_grad_norm, double *part, int *have_part, double *gmul,
                 bl_optim_stats *stats) {
  BL_CHECK(opt_check_step(op, step, lr, grad_scale, max_grad_norm));
  *have_part = 0;
  if (grad_norm < 0) { /* NaN is not < 0: a NaN norm from the caller fails below */
    opt_chunk_sumsq(p, g, grad_scale, part);
    double s = 0;
    for (int64_t c = 0; c < p->nchunks; c++) s += part[c];
    grad_norm = sqrt(s);
    *have_part = 1;
  }
  const double clip = bl_opt_clip(grad_norm, max_grad_norm);
  if (stats) {
    stats->grad_norm = grad_norm;
    stats->clip_coef = 1.0 / clip;
    stats->nonfinite = !isfinite(grad_norm);
  }
  if (!isfinite(grad_norm))
    return BL_ERR(
        "%s: non-finite gradient (global norm %g): step not applied, weights unchanged "
        "(with fp16 use the dynamic loss scaler, which skips such steps)",
        op, grad_norm);
  *gmul = grad_scale / clip;
  return 0;
}

int opt_step(const opt_kind *k, const void *cfg, const bl_optim_args *a) {
  const char *op = k->op;
  if (!a) return BL_ERR("%s: args is NULL", op);
  BL_CHECK(k->check(op, cfg, a));
  if (a->amp) {
    BL_CHECK(opt_amp_check(op, a->w, a->amp, a->amp_state, a->lr, a->grad_scale));
    if (a->w->device >= 0) return k->cuda(op, a->w->device, cfg, a);
    return opt_amp_cpu(k, cfg, a);
  }
  if (a->has_grad_norm && a->grad_norm < 0)
    return BL_ERR("%s: grad_norm %g is negative (the norm of grad_scale * grads)", op, a->grad_norm);
  if (a->stats) memset(a->stats, 0, sizeof *a->stats);
  int global = 1;
  const double max_grad_norm = k->max_grad_norm(cfg, &global);
  BL_CHECK(opt_check_step(op, a->step, a->lr, a->grad_scale, max_grad_norm));
  if (a->w->device >= 0) return k->cuda(op, a->w->device, cfg, a);

  opt_plan p;
  BL_CHECK(opt_plan_make(op, a->seg, &p));
  opt_grad gr = { &p, 1.0, malloc(sizeof(double) * (size_t)(p.nchunks + 1)), 0 };
  int rc = gr.gsq ? 0 : bl_set_error(BL_ENOMEM, "%s: out of memory for %lld chunk partials", op, (long long)p.nchunks);
  if (!rc)
    rc = opt_prologue(op, &p, a->g->data, a->step, a->lr, a->grad_scale,
                      bl_opt_given_norm(a->has_grad_norm, a->grad_norm), global ? max_grad_norm : 0.0, gr.gsq,
                      &gr.have_part, &gr.gmul, a->stats);
  if (!rc) rc = k->cpu(cfg, a, &gr);
  free(gr.gsq);
  opt_plan_free(&p);
  return rc;
}

int bl_grad_global_norm(const bl_tensor *grads, double *norm, int *nonfinite) {
  const char *op = "grad_global_norm";
  BL_CHECK(opt_check_flat(op, grads, "grads"));
  if (!norm) return BL_ERR("%s: norm output pointer is NULL", op);
  if (grads->device >= 0) return BL_ON_CUDA(op, grads->device, bl_cuda_grad_global_norm(grads, norm, nonfinite));
  const float *g = grads->data;
  int64_t n = grads->numel, nch = (n + OPT_CHUNK - 1) / OPT_CHUNK;
  double *part = malloc(sizeof(double) * (size_t)(nch > 0 ? nch : 1));
  if (!part) return bl_set_error(BL_ENOMEM, "%s: out of memory", op);
#pragma omp parallel for schedule(static) if (nch > 4)
  for (int64_t c = 0; c < nch; c++) {
    int64_t s = c * OPT_CHUNK, len = n - s < OPT_CHUNK ? n - s : OPT_CHUNK;
    part[c] = opt_sumsq(g + s, len, 1.0);
  }
  double s = 0;
  for (int64_t c = 0; c < nch; c++) s += part[c];
  free(part);
  *norm = sqrt(s);
  /* A sum of squares is inf/NaN iff some element is inf/NaN or the squares
   * overflow f64 (impossible from f32 data: 3.4e38^2 * 2^63 < 1.8e308). */
  if (nonfinite) *nonfinite = !isfinite(*norm);
  return 0;
}

/* acc accumulates x*0: 0 for finite x, NaN for inf/NaN, so one branch-free,
 * vectorisable pass tells whether anything was non-finite. */
int bl_unscale_check(bl_tensor *grads, double inv_scale, int *found_inf) {
  const char *op = "unscale_check";
  BL_CHECK(opt_check_flat(op, grads, "grads"));
  if (!isfinite(inv_scale) || inv_scale <= 0)
    return BL_ERR("%s: inv_scale must be finite and > 0, got %g", op, inv_scale);
  if (grads->device >= 0) return BL_ON_CUDA(op, grads->device, bl_cuda_unscale_check(grads, inv_scale, found_inf));
  float *g = grads->data;
  const float s = (float)inv_scale;
  int64_t n = grads->numel, nch = (n + OPT_CHUNK - 1) / OPT_CHUNK;
  int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (nch > 4)
  for (int64_t c = 0; c < nch; c++) {
    int64_t st = c * OPT_CHUNK, len = n - st < OPT_CHUNK ? n - st : OPT_CHUNK;
    float *x = g + st;
    float acc = 0;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < len; i++) {
      float y = x[i] * s;
      x[i] = y;
      acc += y * 0.0f;
    }
    if (acc != 0.0f) bad = 1; /* NaN != 0 */
  }
  if (found_inf) *found_inf = bad;
  return 0;
}

static inline float h2f(uint16_t h) { return bl_f16_to_f32(h); }
static inline float b2f(uint16_t h) { return bl_bf16_to_f32(h); }

int bl_unscale_to_f32(bl_tensor *out, const bl_tensor *grads, double inv_scale, int *found_inf) {
  const char *op = "unscale_to_f32";
  BL_CHECK(opt_check_flat(op, out, "out"));
  BL_CHECK(live(op, grads, "grads"));
  if (grads->dtype != BL_F32 && grads->dtype != BL_F16 && grads->dtype != BL_BF16)
    return BL_ERR("%s: grads must be f16, bf16 or f32, got %s", op, bl_dtype_name(grads->dtype));
  if (out->device >= 0 || grads->device >= 0)
    return BL_NO_CUDA_TWIN(op, out->device >= 0 ? out->device : grads->device);
  if (!bl_tensor_is_contiguous(grads)) return BL_ERR("%s: grads must be contiguous", op);
  if (grads->numel != out->numel)
    return BL_ERR("%s: grads has %lld elements but out has %lld", op, (long long)grads->numel, (long long)out->numel);
  if (!isfinite(inv_scale) || inv_scale <= 0)
    return BL_ERR("%s: inv_scale must be finite and > 0, got %g", op, inv_scale);
  float *o = out->data;
  const float s = (float)inv_scale;
  int64_t n = out->numel, nch = (n + OPT_CHUNK - 1) / OPT_CHUNK;
  int dt = grads->dtype, bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (nch > 4)
  for (int64_t c = 0; c < nch; c++) {
    int64_t st = c * OPT_CHUNK, len = n - st < OPT_CHUNK ? n - st : OPT_CHUNK;
    float acc = 0;
    if (dt == BL_F32) {
      const float *x = (const float *)grads->data + st;
      for (int64_t i = 0; i < len; i++) {
        float y = x[i] * s;
        o[st + i] = y;
        acc += y * 0.0f;
      }
    } else {
      const uint16_t *x = (const uint16_t *)grads->data + st;
      if (dt == BL_F16)
        for (int64_t i = 0; i < len; i++) {
          float y = h2f(x[i]) * s;
          o[st + i] = y;
          acc += y * 0.0f;
        }
      else
        for (int64_t i = 0; i < len; i++) {
          float y = b2f(x[i]) * s;
          o[st + i] = y;
          acc += y * 0.0f;
        }
    }
    if (acc != 0.0f) bad = 1;
  }
  if (found_inf) *found_inf = bad;
  return 0;
}

int opt_check_adam_buffers(const char *op, const bl_tensor *w, const bl_tensor *half, const bl_tensor *g,
                           const bl_tensor *m, const bl_tensor *v, const bl_optim_segments *seg) {
  BL_CHECK(opt_check_flat(op, w, "params"));
  BL_CHECK(opt_check_same(op, w, g, "grads"));
  BL_CHECK(opt_check_same(op, w, m, "exp_avg"));
  BL_CHECK(opt_check_same(op, w, v, "exp_avg_sq"));
  const bl_tensor *ts[4] = { w, g, m, v };
  const char *names[4] = { "params", "grads", "exp_avg", "exp_avg_sq" };
  int dev;
  BL_CHECK(opt_device(op, 4, ts, &dev));
  BL_CHECK(opt_check_disjoint(op, 4, ts, names));
  BL_CHECK(opt_check_half(op, w, half, 4, ts));
  return opt_check_segments(op, seg, w->numel);
}
