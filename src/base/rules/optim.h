/* The step prologue of the flat-buffer optimizers (src/optim/{lamb,adamw,sgd}.c on the CPU, kernels/optim.cu on a
 * GPU): from the global gradient norm to the gradient multiplier, the Adam bias corrections, how a segment takes
 * weight decay, and LAMB's and BertAdam's per-segment factors. Contracts in bl_optim.h. */
#ifndef BL_RULES_OPTIM_H
#define BL_RULES_OPTIM_H
#include <math.h>
#include "hd.h"

/* The gradient norm a plain step is given (bl_optim_args.has_grad_norm, grad_norm): the caller's, or -1, which the
 * step prologue reads as "compute it". */
BL_HD double bl_opt_given_norm(int has_grad_norm, double grad_norm) { return has_grad_norm ? grad_norm : -1.0; }

/* The global clipping divisor: norm / max_norm when max_norm > 0 and the norm exceeds it, else 1 (NaN: 1, the
 * step is skipped or fails anyway). The gradients are multiplied by grad_scale / clip. */
BL_HD double bl_opt_clip(double norm, double max_norm) {
  return (max_norm > 0 && norm > max_norm) ? norm / max_norm : 1.0;
}

/* 1 / (1 - beta^step) in f32, the inverse of Adam's bias correction at the 1-based step; 1 when off. */
BL_HD float bl_opt_inv_bc(int on, double beta, double step) {
  return on ? (float)(1.0 / (1.0 - pow(beta, step))) : 1.0f;
}

/* A segment's weight decay: the config's (in f32) when the segment decays (bl_optim_segments.decay), else 0. */
BL_HD float bl_opt_seg_wd(int decays, float wd) { return decays ? wd : 0.0f; }

/* The Adam family's segment weight decay goes into the update (decoupled, AdamW: *wdw) or into the gradient (L2,
 * as SGD's: *wdl); the other one is 0, which keeps the element loops branch-free. */
BL_HD void bl_opt_decay(int decays, float wd, int adam_w, float *wdw, float *wdl) {
  const float d = bl_opt_seg_wd(decays, wd);
  *wdw = adam_w ? d : 0.0f;
  *wdl = adam_w ? 0.0f : d;
}

/* LAMB applies its trust ratio where the segment's weight decay is non-zero, or everywhere with use_nvlamb
 * (apex FusedLAMB). wd_nonzero: the config's weight_decay != 0, in double. */
BL_HD int bl_lamb_trusts(int nvlamb, int decays, int wd_nonzero) { return nvlamb || (decays && wd_nonzero); }

/* LAMB's trust ratio ||w|| / ||u|| of a segment from f64 sums of squares (||w|| capped at max_weight_norm, the
 * ratio at max_trust_ratio, when > 0; 1 when either norm is 0). The segment's step is lr times it. */
BL_HD double bl_lamb_trust_ratio(double sumsq_w, double sumsq_u, double max_weight_norm, double max_trust_ratio) {
  double wn = sqrt(sumsq_w), un = sqrt(sumsq_u);
  if (max_weight_norm > 0 && wn > max_weight_norm) wn = max_weight_norm;
  double t = (wn > 0 && un > 0) ? wn / un : 1.0;
  if (max_trust_ratio > 0 && t > max_trust_ratio) t = max_trust_ratio;
  return t;
}

/* BertAdam's per-segment clipping (torch.nn.utils.clip_grad_norm_ on each parameter): the gradient multiplier of
 * a segment whose scaled gradients have the sum of squares sumsq. */
BL_HD float bl_bertadam_mul(double sumsq, double max_norm, double grad_scale) {
  const double coef = max_norm / (sqrt(sumsq) + 1e-6);
  return (float)(grad_scale * (coef < 1 ? coef : 1.0));
}
#endif
