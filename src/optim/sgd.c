/* SGD with optional momentum / Nesterov over flat buffers, torch.optim.SGD
 * semantics (contract in bl_optim.h). The momentum buffer is initialised
 * from the first step's direction (step == 1), as torch does, so a resumed
 * run must pass the true step count. */
#include "optim_internal.h"
#include "device/dispatch.h"
#include "base/rules/optim.h"
#include <math.h>
#include <stdlib.h>

static int sgd_check(const char *op, const void *cfg_, const bl_optim_args *a) {
  const bl_sgd_config *cfg = cfg_;
  if (!cfg) return BL_ERR("%s: config is NULL (use bl_sgd_config_default)", op);
  if (a->amp) return BL_ERR("%s: SGD has no loss-scaled step (amp must be NULL)", op);
  if (!isfinite(cfg->momentum) || cfg->momentum < 0)
    return BL_ERR("%s: momentum must be finite and >= 0, got %g", op, cfg->momentum);
  if (!isfinite(cfg->dampening) || cfg->dampening < 0 || cfg->dampening > 1)
    return BL_ERR("%s: dampening must be in [0, 1], got %g", op, cfg->dampening);
  if (!isfinite(cfg->weight_decay) || cfg->weight_decay < 0)
    return BL_ERR("%s: weight_decay must be finite and >= 0, got %g", op, cfg->weight_decay);
  if (cfg->nesterov && (cfg->momentum <= 0 || cfg->dampening != 0))
    return BL_ERR("%s: nesterov needs momentum > 0 and dampening 0 (as torch.optim.SGD)", op);
  const bl_tensor *w = a->w, *buf = a->m;
  BL_CHECK(opt_check_flat(op, w, "params"));
  BL_CHECK(opt_check_same(op, w, a->g, "grads"));
  const int mom = cfg->momentum > 0;
  if (mom) {
    if (!buf) return BL_ERR("%s: momentum %g needs a momentum buffer (got NULL)", op, cfg->momentum);
    BL_CHECK(opt_check_same(op, w, buf, "momentum_buffer"));
  }
  const bl_tensor *ts[3] = { w, a->g, mom ? buf : NULL };
  const char *names[3] = { "params", "grads", "momentum_buffer" };
  int dev;
  BL_CHECK(opt_device(op, 3, ts, &dev));
  BL_CHECK(opt_check_disjoint(op, 3, ts, names));
  BL_CHECK(opt_check_half(op, w, a->half, 3, ts));
  return opt_check_segments(op, a->seg, w->numel);
}

static double sgd_max_grad_norm(const void *cfg, int *global) {
  (void)global;
  return ((const bl_sgd_config *)cfg)->max_grad_norm;
}

static int sgd_cpu(const void *cfg_, const bl_optim_args *a, const opt_grad *gr) {
  const bl_sgd_config *cfg = cfg_;
  const bl_optim_segments *seg = a->seg;
  const opt_plan *p = gr->p;
  const int64_t nc = p->nchunks;
  const int mom = cfg->momentum > 0;
  float *W = a->w->data, *B = mom ? a->m->data : NULL;
  const float *G = a->g->data;
  bl_tensor *half = a->half;
  const float gm = (float)gr->gmul, flr = (float)a->lr, mu = (float)cfg->momentum;
  const float damp = (float)(1.0 - cfg->dampening);
  const int first = a->step == 1, nest = cfg->nesterov != 0;
#pragma omp parallel for schedule(static) if (nc > 1)
  for (int64_t c = 0; c < nc; c++) {
    int32_t s = p->chunk_seg[c];
    int64_t o = p->chunk_start[c], n = p->chunk_len[c];
    const float wd = bl_opt_seg_wd(!seg->decay || seg->decay[s], (float)cfg->weight_decay);
    float *wp = W + o;
    const float *gp = G + o;
    if (!mom) {
#pragma omp simd
      for (int64_t i = 0; i < n; i++) wp[i] -= flr * (gp[i] * gm + wd * wp[i]);
    } else {
      float *bp = B + o;
#pragma omp simd
      for (int64_t i = 0; i < n; i++) {
        float d = gp[i] * gm + wd * wp[i];
        float b = first ? d : mu * bp[i] + damp * d;
        bp[i] = b;
        wp[i] -= flr * (nest ? d + mu * b : b);
      }
    }
    opt_store_half(half, W, o, n);
  }
  return 0;
}

static int sgd_cuda(const char *op, int dev, const void *cfg, const bl_optim_args *a) {
  (void)cfg;
  (void)a;
  return BL_ON_CUDA(op, dev, bl_cuda_sgd_step(cfg, a));
}

static const opt_kind SGD = { "sgd_step", sgd_check, sgd_max_grad_norm, sgd_cpu, sgd_cuda };

int bl_sgd_step(const bl_sgd_config *cfg, const bl_optim_args *a) { return opt_step(&SGD, cfg, a); }
