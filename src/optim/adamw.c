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
#include <string.h>

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

static int check_cfg(const char *op, const bl_adamw_config *c) {
  if (!c) return BL_ERR("%s: config is NULL (use bl_adamw_config_default)", op);
  BL_CHECK(opt_check_adam_hyper(op, c->beta1, c->beta2, c->eps, c->weight_decay));
  return 0;
}

int bl_adamw_step(const bl_adamw_config *cfg, bl_tensor *w, bl_tensor *half, const bl_tensor *g, bl_tensor *m,
                  bl_tensor *v, const bl_optim_segments *seg, int64_t step, double lr, double grad_scale,
                  double grad_norm, bl_optim_stats *stats) {
  const char *op = "adamw_step";
  BL_CHECK(check_cfg(op, cfg));
  BL_CHECK(opt_check_adam_buffers(op, w, half, g, m, v, seg));
  if (stats) memset(stats, 0, sizeof *stats);
  if (w->device >= 0) {
    BL_CHECK(opt_check_step(op, step, lr, grad_scale, cfg->max_grad_norm));
    return BL_ON_CUDA(op, w->device,
                      bl_cuda_adamw_step(cfg, w, half, g, m, v, seg, step, lr, grad_scale, grad_norm, stats));
  }

  opt_plan p;
  BL_CHECK(opt_plan_make(op, seg, &p));
  int64_t nc = p.nchunks;
  double *gsq = malloc(sizeof(double) * (size_t)(nc + 1));
  float *segmul = malloc(sizeof(float) * (size_t)(seg->count + 1));
  if (!gsq || !segmul) {
    free(gsq);
    free(segmul);
    opt_plan_free(&p);
    return bl_set_error(BL_ENOMEM, "%s: out of memory for %lld chunk partials", op, (long long)nc);
  }
  float *W = w->data, *M = m->data, *V = v->data;
  const float *G = g->data;
  int per_seg = cfg->per_segment_clip && cfg->max_grad_norm > 0;
  int have_part = 0;
  double gmul = 1;
  int rc = opt_prologue(op, &p, G, step, lr, grad_scale, grad_norm, per_seg ? 0.0 : cfg->max_grad_norm, gsq, &have_part,
                        &gmul, stats);
  if (rc) goto done;
  if (!(cfg->max_grad_norm >= 0) || isinf(cfg->max_grad_norm)) {
    rc = BL_ERR("%s: max_grad_norm must be finite and >= 0, got %g", op, cfg->max_grad_norm);
    goto done;
  }
  for (int32_t s = 0; s < seg->count; s++) segmul[s] = (float)gmul;
  if (per_seg) {
    /* BertAdam: torch.nn.utils.clip_grad_norm_(p, max) on each parameter. */
    if (!have_part) opt_chunk_sumsq(&p, G, grad_scale, gsq);
    for (int32_t s = 0; s < seg->count; s++) {
      double q = 0;
      for (int64_t c = p.seg_first[s]; c < p.seg_first[s + 1]; c++) q += gsq[c];
      segmul[s] = bl_bertadam_mul(q, cfg->max_grad_norm, grad_scale);
    }
  }

  adam_k K;
  K.b1 = (float)cfg->beta1;
  K.b1c = (float)(1.0 - cfg->beta1);
  K.b2 = (float)cfg->beta2;
  K.b2c = (float)(1.0 - cfg->beta2);
  K.ibc1 = bl_opt_inv_bc(cfg->bias_correction, cfg->beta1, (double)step);
  K.ibc2 = bl_opt_inv_bc(cfg->bias_correction, cfg->beta2, (double)step);
  K.eps = (float)cfg->eps;
  K.lr = (float)lr;
  const int adam_w = cfg->adam_w_mode != 0;

#pragma omp parallel for schedule(static) if (nc > 1)
  for (int64_t c = 0; c < nc; c++) {
    int32_t s = p.chunk_seg[c];
    int64_t o = p.chunk_start[c];
    float wdw, wdl;
    bl_opt_decay(!seg->decay || seg->decay[s], (float)cfg->weight_decay, adam_w, &wdw, &wdl);
    adamw_chunk(&K, W + o, G + o, M + o, V + o, p.chunk_len[c], segmul[s], wdw, wdl);
    opt_store_half(half, W, o, p.chunk_len[c]);
  }

done:
  free(gsq);
  free(segmul);
  opt_plan_free(&p);
  return rc;
}

static int adamw_fn(const void *cfg, bl_tensor *w, bl_tensor *half, const bl_tensor *g, bl_tensor *m, bl_tensor *v,
                    const bl_optim_segments *seg, int64_t step, double lr, double grad_scale, double grad_norm) {
  return bl_adamw_step(cfg, w, half, g, m, v, seg, step, lr, grad_scale, grad_norm, NULL);
}

int bl_adamw_step_amp(const bl_adamw_config *cfg, bl_tensor *w, bl_tensor *half, const bl_tensor *g, bl_tensor *m,
                      bl_tensor *v, const bl_optim_segments *seg, double lr, double grad_scale,
                      const bl_amp_config *amp, bl_tensor *state) {
  const char *op = "adamw_step";
  BL_CHECK(check_cfg(op, cfg));
  BL_CHECK(opt_check_adam_buffers(op, w, half, g, m, v, seg));
  BL_CHECK(opt_amp_check(op, w, amp, state, lr, grad_scale));
  if (w->device >= 0)
    return BL_ON_CUDA(op, w->device, bl_cuda_adamw_step_amp(cfg, w, half, g, m, v, seg, lr, grad_scale, amp, state));
  return opt_amp_cpu(op, adamw_fn, cfg, w, half, g, m, v, seg, lr, grad_scale, amp, state);
}
