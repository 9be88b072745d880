/* SGD with optional momentum / Nesterov over flat buffers, torch.optim.SGD
 * semantics (contract in bl_optim.h). The momentum buffer is initialised
 * from the first step's direction (step == 1), as torch does, so a resumed
 * run must pass the true step count. */
#include "optim_internal.h"
#include "device/dispatch.h"
#include "base/rules/optim.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

int bl_sgd_step(const bl_sgd_config *cfg, bl_tensor *w, bl_tensor *half, const bl_tensor *g, bl_tensor *buf,
                const bl_optim_segments *seg, int64_t step, double lr, double grad_scale, double grad_norm,
                bl_optim_stats *stats) {
  const char *op = "sgd_step";
  if (!cfg) return BL_ERR("%s: config is NULL (use bl_sgd_config_default)", op);
  if (!isfinite(cfg->momentum) || cfg->momentum < 0)
    return BL_ERR("%s: momentum must be finite and >= 0, got %g", op, cfg->momentum);
  if (!isfinite(cfg->dampening) || cfg->dampening < 0 || cfg->dampening > 1)
    return BL_ERR("%s: dampening must be in [0, 1], got %g", op, cfg->dampening);
  if (!isfinite(cfg->weight_decay) || cfg->weight_decay < 0)
    return BL_ERR("%s: weight_decay must be finite and >= 0, got %g", op, cfg->weight_decay);
  if (cfg->nesterov && (cfg->momentum <= 0 || cfg->dampening != 0))
    return BL_ERR("%s: nesterov needs momentum > 0 and dampening 0 (as torch.optim.SGD)", op);
  BL_CHECK(opt_check_flat(op, w, "params"));
  BL_CHECK(opt_check_same(op, w, g, "grads"));
  const int mom = cfg->momentum > 0;
  if (mom) {
    if (!buf) return BL_ERR("%s: momentum %g needs a momentum buffer (got NULL)", op, cfg->momentum);
    BL_CHECK(opt_check_same(op, w, buf, "momentum_buffer"));
  }
  {
    const bl_tensor *ts[3] = { w, g, mom ? buf : NULL };
    const char *names[3] = { "params", "grads", "momentum_buffer" };
    int dev;
    BL_CHECK(opt_device(op, 3, ts, &dev));
    BL_CHECK(opt_check_disjoint(op, 3, ts, names));
    BL_CHECK(opt_check_half(op, w, half, 3, ts));
  }
  BL_CHECK(opt_check_segments(op, seg, w->numel));
  if (stats) memset(stats, 0, sizeof *stats);
  if (w->device >= 0) {
    BL_CHECK(opt_check_step(op, step, lr, grad_scale, cfg->max_grad_norm));
    return BL_ON_CUDA(op, w->device,
                      bl_cuda_sgd_step(cfg, w, half, g, buf, seg, step, lr, grad_scale, grad_norm, stats));
  }

  opt_plan p;
  BL_CHECK(opt_plan_make(op, seg, &p));
  int64_t nc = p.nchunks;
  double *gsq = malloc(sizeof(double) * (size_t)(nc + 1));
  if (!gsq) {
    opt_plan_free(&p);
    return bl_set_error(BL_ENOMEM, "%s: out of memory", op);
  }
  float *W = w->data, *B = mom ? buf->data : NULL;
  const float *G = g->data;
  int have_part = 0;
  double gmul = 1;
  int rc = opt_prologue(op, &p, G, step, lr, grad_scale, grad_norm, cfg->max_grad_norm, gsq, &have_part, &gmul, stats);
  if (rc) goto done;

  const float gm = (float)gmul, flr = (float)lr, mu = (float)cfg->momentum;
  const float damp = (float)(1.0 - cfg->dampening);
  const int first = step == 1, nest = cfg->nesterov != 0;
#pragma omp parallel for schedule(static) if (nc > 1)
  for (int64_t c = 0; c < nc; c++) {
    int32_t s = p.chunk_seg[c];
    int64_t o = p.chunk_start[c], n = p.chunk_len[c];
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

done:
  free(gsq);
  opt_plan_free(&p);
  return rc;
}
