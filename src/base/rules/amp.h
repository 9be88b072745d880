/* The loss-scale decision of one step (the rules in bl_optim.h above bl_amp_config, those of
 * torch.cuda.amp.GradScaler): made in the state array a (BL_AMP_*) by src/optim/amp.c on the CPU, by
 * kernels/optim.cu's step_final on a GPU, and for bertlua.train.amp's DynamicLossScaler through bl_amp_decide.
 * norm: of the unscaled gradients. Returns 1 when the step is skipped. */
#ifndef BL_RULES_AMP_H
#define BL_RULES_AMP_H
#include <math.h>
#include "bl_optim.h"
#include "hd.h"

/* the multiplier of the raw gradients in an amp step: grad_scale over the loss scale */
BL_HD double bl_amp_grad_mul(const double *a, double grad_scale) { return grad_scale / a[BL_AMP_SCALE]; }

BL_HD int bl_amp_decide_rule(double *a, const bl_amp_config *c, double norm) {
  const double scale = a[BL_AMP_SCALE];
  a[BL_AMP_CALLS] += 1;
  if (!isfinite(norm)) {
    a[BL_AMP_SKIPPED] += 1;
    a[BL_AMP_LAST_SKIPPED] = 1;
    a[BL_AMP_GROWTH] = 0;
    if (c->dynamic) {
      if (scale <= c->min_scale) a[BL_AMP_FLOOR_SKIPS] += 1;
      a[BL_AMP_SCALE] = fmax(scale * c->backoff_factor, c->min_scale);
    }
    return 1;
  }
  a[BL_AMP_LAST_SKIPPED] = 0;
  a[BL_AMP_FLOOR_SKIPS] = 0;
  a[BL_AMP_STEP] += 1;
  a[BL_AMP_NORM] = norm;
  if (c->dynamic) {
    double g = a[BL_AMP_GROWTH] + 1;
    if (g >= (double)c->growth_interval) {
      a[BL_AMP_SCALE] = fmin(scale * c->growth_factor, c->max_scale);
      g = 0;
    }
    a[BL_AMP_GROWTH] = g;
  }
  return 0;
}
#endif
