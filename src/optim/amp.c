/* Loss-scaled optimizer steps with the decision in a state tensor (contract in bl_optim.h, BL_AMP_*): the
 * checks both devices share, the CPU twin of kernels/optim.cu's step_final, and bl_amp_decide. The decision
 * itself is src/base/rules/amp.h's, on both devices. */
#include "optim_internal.h"
#include "device/dispatch.h"
#include "base/rules/amp.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

int bl_optim_prepare(int device, const bl_optim_segments *seg, int64_t numel) {
  const char *op = "optim_prepare";
  BL_CHECK(opt_check_segments(op, seg, numel));
  if (device < 0) return 0;
  return BL_ON_CUDA(op, device, bl_cuda_optim_prepare(device, seg));
}

static int check_config(const char *op, const bl_amp_config *a) {
  if (!a) return BL_ERR("%s: amp config is NULL", op);
  if (!(a->min_scale > 0) || !(a->max_scale >= a->min_scale) || isinf(a->max_scale))
    return BL_ERR("%s: amp scales must satisfy 0 < min_scale <= max_scale < inf, got %g and %g", op, a->min_scale,
                  a->max_scale);
  if (!(a->growth_factor >= 1) || isinf(a->growth_factor))
    return BL_ERR("%s: amp growth_factor must be finite and >= 1, got %g", op, a->growth_factor);
  if (!(a->backoff_factor > 0 && a->backoff_factor < 1))
    return BL_ERR("%s: amp backoff_factor must be in (0, 1), got %g", op, a->backoff_factor);
  if (a->growth_interval < 1) return BL_ERR("%s: amp growth_interval must be >= 1", op);
  return 0;
}

static int check_state(const char *op, const double *a) {
  if (!(a[BL_AMP_SCALE] > 0) || isinf(a[BL_AMP_SCALE]) || !(a[BL_AMP_STEP] >= 0))
    return BL_ERR("%s: amp state holds scale %g and step %g (scale must be finite and > 0)", op, a[BL_AMP_SCALE],
                  a[BL_AMP_STEP]);
  return 0;
}

int opt_amp_check(const char *op, const bl_tensor *w, const bl_amp_config *a, const bl_tensor *state, double lr,
                  double grad_scale) {
  BL_CHECK(check_config(op, a));
  BL_CHECK(bl_tensor_check(state, op));
  if (state->dtype != BL_F64 || !bl_tensor_is_contiguous(state) || state->numel != BL_AMP_STATE_LEN ||
      state->device != w->device)
    return BL_ERR("%s: amp state must be a contiguous f64 tensor of %d elements on the parameters' device", op,
                  BL_AMP_STATE_LEN);
  const bl_tensor *lt = a->lr_from;
  if (lt) {
    BL_CHECK(bl_tensor_check(lt, op));
    if (lt->dtype != BL_F64 || lt->numel != 1 || lt->device != w->device)
      return BL_ERR("%s: amp lr_from must be a 1-element f64 tensor on the parameters' device", op);
    if (lt->device < 0) lr = *(const double *)lt->data;
  }
  if (!isfinite(lr) || lr < 0) return BL_ERR("%s: learning rate must be finite and >= 0, got %g", op, lr);
  if (!isfinite(grad_scale) || grad_scale <= 0)
    return BL_ERR("%s: grad_scale must be finite and > 0, got %g", op, grad_scale);
  return 0;
}

int opt_amp_cpu(const opt_kind *k, const void *cfg, const bl_optim_args *args) {
  const char *op = k->op;
  const bl_amp_config *amp = args->amp;
  const bl_optim_segments *seg = args->seg;
  const bl_tensor *g = args->g;
  double *a = args->amp_state->data, saved[BL_AMP_STATE_LEN], lr = args->lr;
  if (amp->lr_from) lr = *(const double *)amp->lr_from->data;
  BL_CHECK(check_state(op, a));
  /* the norm over the segments' chunks in chunk order, as the optimizers (and the device's step_final) take it */
  opt_plan p;
  BL_CHECK(opt_plan_make(op, seg, &p));
  double *part = malloc(sizeof(double) * (size_t)(p.nchunks + 1)), sum = 0;
  if (!part) {
    opt_plan_free(&p);
    return bl_set_error(BL_ENOMEM, "%s: out of memory for %lld chunk partials", op, (long long)p.nchunks);
  }
  opt_chunk_sumsq(&p, g->data, 1.0, part);
  for (int64_t c = 0; c < p.nchunks; c++) sum += part[c];
  free(part);
  opt_plan_free(&p);
  const double s = bl_amp_grad_mul(a, args->grad_scale), norm = sqrt(sum) * s;
  memcpy(saved, a, sizeof saved);
  if (bl_amp_decide_rule(a, amp, norm)) return 0;
  bl_optim_args plain = *args;
  plain.amp = NULL;
  plain.amp_state = NULL;
  plain.stats = NULL;
  plain.step = (int64_t)a[BL_AMP_STEP];
  plain.lr = lr;
  plain.grad_scale = s;
  plain.grad_norm = norm;
  plain.has_grad_norm = 1;
  int rc = opt_step(k, cfg, &plain);
  if (rc) memcpy(a, saved, sizeof saved); /* nothing was applied */
  return rc;
}

int bl_amp_decide(const bl_amp_config *amp, double *state, double norm, int *skipped) {
  const char *op = "amp_decide";
  BL_CHECK(check_config(op, amp));
  if (!state) return BL_ERR("%s: state is NULL", op);
  BL_CHECK(check_state(op, state));
  const int skip = bl_amp_decide_rule(state, amp, norm);
  if (skipped) *skipped = skip;
  return 0;
}
