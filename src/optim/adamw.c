/* AdamW / BertAdam over flat buffers (contract in bl_optim.h): one pass over
 * the chunks after the gradient-norm pass. With bias_correction = 1 this is
 * torch.optim.AdamW (w*(1-lr*wd) - lr/bc1 * m/(sqrt(v)/sqrt(bc2)+eps), the
 * same value as w - lr*(m^/(sqrt(v^)+eps) + wd*w)); with bias_correction = 0
 * it is BERT's original BertAdam. Element math in f32. */
#include "optim_internal.h"
#include "device/dispatch.h"
#include "base/rules/optim.h"
#include <math.h>
#include <stdlib.h>

typedef struct adam_k {
  float b1, b1c, b2, b2c, ibc1, ibc2, eps, lr;
} adam_k;

static void adamw_chunk(const adam_k *k, float *wp, const float *gp, float *mp, float *vp, int64_t n, float gm,
                        float wdw, float wdl) {
  const float b1 = k->b1, b1c = k->b1c, b2 = k->b2, b2c = k->b2c, ibc1 = k->ibc1, ibc2 = k->ibc2, eps = k->eps,
              lr = k->lr;
  float den[OPT_BLK];
  for (int64_t b0 = 0; b0 < n; b0 += OPT_BLK) {
    int nb = (int)(n - b0 < OPT_BLK ? n - b0 : OPT_BLK);
    float *w = wp + b0, *m = mp + b0, *v = vp + b0;
    const float *g = gp + b0;
    for (int i = 0; i < nb; i++) {
      float gi = g[i] * gm + wdl * w[i];
      float mi = b1 * m[i] + b1c * gi;
      float vi = b2 * v[i] + b2c * gi * gi;
      m[i] = mi;
      v[i] = vi;
      den[i] = vi * ibc2;
    }
    opt_sqrt_inplace(den, nb);
    for (int i = 0; i < nb; i++) w[i] -= lr * ((m[i] * ibc1) / (den[i] + eps) + wdw * w[i]);
  }
}

static int adamw_check(const char *op, const void *cfg, const bl_optim_args *a) {
  const bl_adamw_config *c = cfg;
  if (!c) return BL_ERR("%s: config is NULL (use bl_adamw_config_default)", op);
  BL_CHECK(opt_check_adam_hyper(op, c->beta1, c->beta2, c->eps, c->weight_decay));
  return opt_check_adam_buffers(op, a->w, a->half, a->g, a->m, a->v, a->seg);
}

/* BertAdam clips each segment itself (per_segment_clip), not globally */
static double adamw_max_grad_norm(const void *cfg, int *global) {
  const bl_adamw_config *c = cfg;
  *global = !(c->per_segment_clip && c->max_grad_norm > 0);
  return c->max_grad_norm;
}

static int adamw_cpu(const void *cfg_, const bl_optim_args *a, const opt_grad *gr) {
  const char *op = "adamw_step";
  const bl_adamw_config *cfg = cfg_;
  const bl_optim_segments *seg = a->seg;
  const opt_plan *p = gr->p;
  const int64_t nc = p->nchunks;
  float *segmul = malloc(sizeof(float) * (size_t)(seg->count + 1));
  if (!segmul) return bl_set_error(BL_ENOMEM, "%s: out of memory for %d segments", op, seg->count);
  float *W = a->w->data, *M = a->m->data, *V = a->v->data;
  const float *G = a->g->data;
  for (int32_t s = 0; s < seg->count; s++) segmul[s] = (float)gr->gmul;
  if (cfg->per_segment_clip && cfg->max_grad_norm > 0) {
    /* BertAdam: torch.nn.utils.clip_grad_norm_(p, max) on each parameter. */
    if (!gr->have_part) opt_chunk_sumsq(p, G, a->grad_scale, gr->gsq);
    for (int32_t s = 0; s < seg->count; s++) {
      double q = 0;
      for (int64_t c = p->seg_first[s]; c < p->seg_first[s + 1]; c++) q += gr->gsq[c];
      segmul[s] = bl_bertadam_mul(q, cfg->max_grad_norm, a->grad_scale);
    }
  }

  adam_k K;
  K.b1 = (float)cfg->beta1;
  K.b1c = (float)(1.0 - cfg->beta1);
  K.b2 = (float)cfg->beta2;
  K.b2c = (float)(1.0 - cfg->beta2);
  K.ibc1 = bl_opt_inv_bc(cfg->bias_correction, cfg->beta1, (double)a->step);
  K.ibc2 = bl_opt_inv_bc(cfg->bias_correction, cfg->beta2, (double)a->step);
  K.eps = (float)cfg->eps;
  K.lr = (float)a->lr;
  const int adam_w = cfg->adam_w_mode != 0;

#pragma omp parallel for schedule(static) if (nc > 1)
  for (int64_t c = 0; c < nc; c++) {
    int32_t s = p->chunk_seg[c];
    int64_t o = p->chunk_start[c];
    float wdw, wdl;
    bl_opt_decay(!seg->decay || seg->decay[s], (float)cfg->weight_decay, adam_w, &wdw, &wdl);
    adamw_chunk(&K, W + o, G + o, M + o, V + o, p->chunk_len[c], segmul[s], wdw, wdl);
    opt_store_half(a->half, W, o, p->chunk_len[c]);
  }
  free(segmul);
  return 0;
}

static int adamw_cuda(const char *op, int dev, const void *cfg, const bl_optim_args *a) {
  (void)cfg;
  (void)a;
  return BL_ON_CUDA(op, dev, bl_cuda_adamw_step(cfg, a));
}

static const opt_kind ADAMW = { "adamw_step", adamw_check, adamw_max_grad_norm, adamw_cpu, adamw_cuda };

int bl_adamw_step(const bl_adamw_config *cfg, const bl_optim_args *a) { return opt_step(&ADAMW, cfg, a); }
