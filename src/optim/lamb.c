/* LAMB over flat buffers, apex FusedLAMB semantics (contract in bl_optim.h).
 *
 * Two passes over the chunks of all segments:
 *   1. moments m, v and the update u; for segments that take a trust ratio,
 *      per-chunk f64 partial sums of ||w||^2 and ||u||^2 (u is not stored);
 *      segments without a trust ratio are finished here (w -= lr*u).
 *   2. per segment ratio = lr * ||w||/||u|| from the partials summed in chunk
 *      order, then u is recomputed from the stored m, v (w is still the old
 *      value) and applied. Recomputing costs the same memory traffic as
 *      storing u in a scratch buffer or in the gradients (apex overwrites
 *      the gradients), and keeps the gradients intact for the caller.
 * Element math is f32 like apex (MATH_T float); norms accumulate in f64. */
#include "optim_internal.h"
#include "device/dispatch.h"
#include "base/rules/optim.h"
#include <math.h>
#include <stdlib.h>

typedef struct lamb_k {
  float b1, b3, b2, b2c, ibc1, ibc2, eps;
} lamb_k;

/* Block kernels (see OPT_BLK in optim_internal.h). The decay enters either
 * the gradient (wdl, L2 mode) or the update (wdw, decoupled mode); the other
 * one is 0, which keeps the loops branch-free. */

/* moments of one block; den[i] = sqrt(v^) */
static inline void lamb_moments(const lamb_k *k, float *w, const float *g, float *m, float *v, int nb, float gm,
                                float wdl, float *den) {
  const float b1 = k->b1, b3 = k->b3, b2 = k->b2, b2c = k->b2c, ibc2 = k->ibc2;
  for (int i = 0; i < nb; i++) {
    float gi = g[i] * gm + wdl * w[i];
    float mi = b1 * m[i] + b3 * gi;
    float vi = b2 * v[i] + b2c * gi * gi;
    m[i] = mi;
    v[i] = vi;
    den[i] = vi * ibc2;
  }
  opt_sqrt_inplace(den, nb);
}

/* pass 1 for a segment with a trust ratio: moments and f64 ||w||^2, ||u||^2 */
static void lamb_chunk_norms(const lamb_k *k, float *wp, const float *gp, float *mp, float *vp, int64_t n, float gm,
                             float wdw, float wdl, double *sw_out, double *su_out) {
  float den[OPT_BLK];
  const float ibc1 = k->ibc1, eps = k->eps;
  double sw = 0, su = 0;
  for (int64_t b0 = 0; b0 < n; b0 += OPT_BLK) {
    int nb = (int)(n - b0 < OPT_BLK ? n - b0 : OPT_BLK);
    float *w = wp + b0, *m = mp + b0;
    lamb_moments(k, w, gp + b0, m, vp + b0, nb, gm, wdl, den);
    double bw = 0, bu = 0;
#pragma omp simd reduction(+ : bw, bu)
    for (int i = 0; i < nb; i++) {
      float u = (m[i] * ibc1) / (den[i] + eps) + wdw * w[i];
      bw += (double)w[i] * w[i];
      bu += (double)u * u;
    }
    sw += bw;
    su += bu;
  }
  *sw_out = sw;
  *su_out = su;
}

/* pass 1 for a segment without a trust ratio: the whole Adam step */
static void lamb_chunk_plain(const lamb_k *k, float *wp, const float *gp, float *mp, float *vp, int64_t n, float gm,
                             float wdw, float wdl, float lr) {
  float den[OPT_BLK];
  const float ibc1 = k->ibc1, eps = k->eps;
  for (int64_t b0 = 0; b0 < n; b0 += OPT_BLK) {
    int nb = (int)(n - b0 < OPT_BLK ? n - b0 : OPT_BLK);
    float *w = wp + b0, *m = mp + b0;
    lamb_moments(k, w, gp + b0, m, vp + b0, nb, gm, wdl, den);
    for (int i = 0; i < nb; i++) w[i] -= lr * ((m[i] * ibc1) / (den[i] + eps) + wdw * w[i]);
  }
}

/* pass 2: recompute u from the stored moments and the old w, apply ratio */
static void lamb_chunk_apply(const lamb_k *k, float *wp, const float *mp, const float *vp, int64_t n, float wdw,
                             float r) {
  float den[OPT_BLK];
  const float ibc1 = k->ibc1, ibc2 = k->ibc2, eps = k->eps;
  for (int64_t b0 = 0; b0 < n; b0 += OPT_BLK) {
    int nb = (int)(n - b0 < OPT_BLK ? n - b0 : OPT_BLK);
    float *w = wp + b0;
    const float *m = mp + b0, *v = vp + b0;
    for (int i = 0; i < nb; i++) den[i] = v[i] * ibc2;
    opt_sqrt_inplace(den, nb);
    for (int i = 0; i < nb; i++) w[i] -= r * ((m[i] * ibc1) / (den[i] + eps) + wdw * w[i]);
  }
}

static int lamb_check(const char *op, const void *cfg, const bl_optim_args *a) {
  const bl_lamb_config *c = cfg;
  if (!c) return BL_ERR("%s: config is NULL (use bl_lamb_config_default)", op);
  BL_CHECK(opt_check_adam_hyper(op, c->beta1, c->beta2, c->eps, c->weight_decay));
  if (!(c->max_weight_norm >= 0) || isinf(c->max_weight_norm))
    return BL_ERR("%s: max_weight_norm must be finite and >= 0 (0 = off), got %g", op, c->max_weight_norm);
  if (!(c->max_trust_ratio >= 0) || isinf(c->max_trust_ratio))
    return BL_ERR("%s: max_trust_ratio must be finite and >= 0 (0 = off), got %g", op, c->max_trust_ratio);
  return opt_check_adam_buffers(op, a->w, a->half, a->g, a->m, a->v, a->seg);
}

static double lamb_max_grad_norm(const void *cfg, int *global) {
  (void)global;
  return ((const bl_lamb_config *)cfg)->max_grad_norm;
}

static int lamb_cpu(const void *cfg_, const bl_optim_args *a, const opt_grad *gr) {
  const char *op = "lamb_step";
  const bl_lamb_config *cfg = cfg_;
  const bl_optim_segments *seg = a->seg;
  const opt_plan *p = gr->p;
  bl_tensor *half = a->half;
  const int64_t nc = p->nchunks;
  double *part = malloc(sizeof(double) * (size_t)(2 * nc + 1));
  double *ratio = malloc(sizeof(double) * (size_t)(seg->count + 1));
  uint8_t *trust = malloc((size_t)seg->count + 1);
  if (!part || !ratio || !trust) {
    free(part);
    free(ratio);
    free(trust);
    return bl_set_error(BL_ENOMEM, "%s: out of memory for %lld chunk partials", op, (long long)nc);
  }
  double *wsq = part, *usq = part + nc;
  float *W = a->w->data, *M = a->m->data, *V = a->v->data;
  const float *G = a->g->data;
  const double lr = a->lr;
  const int64_t step = a->step;

  lamb_k K;
  K.b1 = (float)cfg->beta1;
  K.b3 = cfg->grad_averaging ? (float)(1.0 - cfg->beta1) : 1.0f;
  K.b2 = (float)cfg->beta2;
  K.b2c = (float)(1.0 - cfg->beta2);
  K.ibc1 = bl_opt_inv_bc(cfg->bias_correction, cfg->beta1, (double)step);
  K.ibc2 = bl_opt_inv_bc(cfg->bias_correction, cfg->beta2, (double)step);
  K.eps = (float)cfg->eps;
  const int adam_w = cfg->adam_w_mode != 0;
  for (int32_t s = 0; s < seg->count; s++)
    trust[s] = (uint8_t)bl_lamb_trusts(cfg->use_nvlamb, !seg->decay || seg->decay[s], cfg->weight_decay != 0);
  const float flr = (float)lr, gm = (float)gr->gmul;

#pragma omp parallel for schedule(static) if (nc > 1)
  for (int64_t c = 0; c < nc; c++) {
    int32_t s = p->chunk_seg[c];
    int64_t o = p->chunk_start[c], n = p->chunk_len[c];
    float wdw, wdl;
    bl_opt_decay(!seg->decay || seg->decay[s], (float)cfg->weight_decay, adam_w, &wdw, &wdl);
    if (trust[s]) {
      lamb_chunk_norms(&K, W + o, G + o, M + o, V + o, n, gm, wdw, wdl, &wsq[c], &usq[c]);
    } else {
      lamb_chunk_plain(&K, W + o, G + o, M + o, V + o, n, gm, wdw, wdl, flr);
      opt_store_half(half, W, o, n); /* final here: its compute copy while the chunk is in cache */
    }
  }

  int any_trust = 0;
  for (int32_t s = 0; s < seg->count; s++) {
    ratio[s] = lr;
    if (!trust[s]) continue;
    any_trust = 1;
    double sw = 0, su = 0;
    for (int64_t c = p->seg_first[s]; c < p->seg_first[s + 1]; c++) {
      sw += wsq[c];
      su += usq[c];
    }
    ratio[s] = lr * bl_lamb_trust_ratio(sw, su, cfg->max_weight_norm, cfg->max_trust_ratio);
  }

  if (any_trust) {
#pragma omp parallel for schedule(static) if (nc > 1)
    for (int64_t c = 0; c < nc; c++) {
      int32_t s = p->chunk_seg[c];
      if (!trust[s]) continue;
      int64_t o = p->chunk_start[c];
      float wdw, wdl;
      bl_opt_decay(!seg->decay || seg->decay[s], (float)cfg->weight_decay, adam_w, &wdw, &wdl);
      lamb_chunk_apply(&K, W + o, M + o, V + o, p->chunk_len[c], wdw, (float)ratio[s]);
      opt_store_half(half, W, o, p->chunk_len[c]);
    }
  }
  free(part);
  free(ratio);
  free(trust);
  return 0;
}

static int lamb_cuda(const char *op, int dev, const void *cfg, const bl_optim_args *a) {
  (void)cfg;
  (void)a;
  return BL_ON_CUDA(op, dev, bl_cuda_lamb_step(cfg, a));
}

static const opt_kind LAMB = { "lamb_step", lamb_check, lamb_max_grad_norm, lamb_cpu, lamb_cuda };

int bl_lamb_step(const bl_lamb_config *cfg, const bl_optim_args *a) { return opt_step(&LAMB, cfg, a); }
