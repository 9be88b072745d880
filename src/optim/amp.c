/* Loss-scaled optimizer steps with the decision in a state tensor (contract in bl_optim.h, BL_AMP_*): the
 * checks both devices share and the CPU twin of kernels/optim.cu's step_final + amp_decide. */
#include "optim_internal.h"
#include "device/dispatch.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

int bl_optim_prepare(int device, const bl_optim_segments *seg, int64_t numel) {
  const char *op = "optim_prepare";
  BL_CHECK(opt_check_segments(op, seg, numel));
  if (device < 0) return 0;
  return BL_ON_CUDA(op, device, bl_cuda_optim_prepare(device, seg));
}

int opt_amp_check(const char *op, const bl_tensor *w, const bl_amp_config *a, const bl_tensor *state, double lr,
                  double grad_scale) {
  if (!a) return BL_ERR("%s: amp config is NULL", op);
  if (!(a->min_scale > 0) || !(a->max_scale >= a->min_scale) || isinf(a->max_scale))
    return BL_ERR("%s: amp scales must satisfy 0 < min_scale <= max_scale < inf, got %g and %g", op, a->min_scale,
                  a->max_scale);
  if (!(a->growth_factor >= 1) || isinf(a->growth_factor))
    return BL_ERR("%s: amp growth_factor must be finite and >= 1, got %g", op, a->growth_factor);
  if (!(a->backoff_factor > 0 && a->backoff_factor < 1))
    return BL_ERR("%s: amp backoff_factor must be in (0, 1), got %g", op, a->backoff_factor);
  if (a->growth_interval < 1) return BL_ERR("%s: amp growth_interval must be >= 1", op);
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

/* The decision of kernels/optim.cu's amp_decide, same order of operations; returns 1 when the step is skipped. */
static int amp_decide(double *a, const bl_amp_config *c, double norm) {
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

int opt_amp_cpu(const char *op, opt_step_fn fn, const void *cfg, bl_tensor *w, bl_tensor *half, const bl_tensor *g,
                bl_tensor *m, bl_tensor *v, const bl_optim_segments *seg, double lr, double grad_scale,
                const bl_amp_config *amp, bl_tensor *state) {
  double *a = state->data, saved[BL_AMP_STATE_LEN];
  if (amp->lr_from) lr = *(const double *)amp->lr_from->data;
  if (!(a[BL_AMP_SCALE] > 0) || isinf(a[BL_AMP_SCALE]) || !(a[BL_AMP_STEP] >= 0))
    return BL_ERR("%s: amp state holds scale %g and step %g (scale must be finite and > 0)", op, a[BL_AMP_SCALE],
                  a[BL_AMP_STEP]);
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
  const double s = grad_scale / a[BL_AMP_SCALE], norm = sqrt(sum) * s;
  memcpy(saved, a, sizeof saved);
  if (amp_decide(a, amp, norm)) return 0;
  int rc = fn(cfg, w, half, g, m, v, seg, (int64_t)a[BL_AMP_STEP], lr, s, norm);
  if (rc) memcpy(a, saved, sizeof saved);  /* nothing was applied */
  return rc;
}
