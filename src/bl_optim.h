/* bertlua — optimizers over flat parameter buffers: LAMB (NVIDIA's BERT
 * pre-training optimizer), AdamW / BertAdam, SGD, global gradient norm,
 * fused unscale + inf/NaN check for dynamic loss scaling. The contract of
 * each piece is stated beside its declaration below. */
#ifndef BL_OPTIM_H
#define BL_OPTIM_H
#include "bl_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* BL_CDEF_BEGIN */
/* Layout. Parameters, gradients and each optimizer moment are ONE flat,
 * contiguous f32 tensor each (any shape; only numel matters), all with the
 * same numel. Parameter tensor k is the segment [offset[k], offset[k] +
 * length[k]) of every flat buffer. Segments must lie inside the buffers and
 * must not overlap; they need not cover the buffer (alignment padding between
 * them is never read for norms nor written). One call updates all segments. */
typedef struct bl_optim_segments {
  int32_t count;
  int32_t pad_;
  const int64_t *offset; /* element offsets into the flat buffers */
  const int64_t *length; /* element counts */
  const uint8_t *decay;  /* 1 = weight decay (and LAMB trust ratio) applies; NULL = all */
} bl_optim_segments;

typedef struct bl_optim_stats {
  double grad_norm;  /* ||grad_scale * g|| over all segments, before clipping */
  double clip_coef;  /* factor applied for global clipping (1 = none) */
  int32_t nonfinite; /* 1 when the gradients held inf/NaN (nothing was written) */
  int32_t pad_;
} bl_optim_stats;

/* LAMB, per segment (apex FusedLAMB / multi_tensor_lamb.cu semantics, used by
 * NVIDIA DeepLearningExamples BERT):
 *   m = b1*m + (1-b1)*g_eff          (grad_averaging = 0: m = b1*m + g_eff)
 *   v = b2*v + (1-b2)*g_eff^2
 *   u = (m/bc1) / (sqrt(v/bc2) + eps) + wd*w      bc = 1-b^step, or 1 when
 *                                                 bias_correction = 0
 *   trust = ||w|| / ||u||, 1 if either norm is 0  (norms of this segment)
 *   w -= lr * trust * u
 * The trust ratio applies where decay applies (decay[k] != 0 and
 * weight_decay != 0), as in apex with NVIDIA's two parameter groups
 * (weight_decay 0.01 / 0.0 for bias, LayerNorm): no-decay segments take a
 * plain Adam step w -= lr*u. use_nvlamb = 1 applies the trust ratio to every
 * segment (apex use_nvlamb=True). Options for the paper / other variants:
 * max_weight_norm > 0 uses phi(||w||) = min(||w||, max_weight_norm) in the
 * numerator (the paper's phi; cybertronai/pytorch-lamb clamps at 10);
 * max_trust_ratio > 0 clamps the ratio (timm's trust_clip); 0 = off. */
typedef struct bl_lamb_config {
  double beta1;            /* 0.9 */
  double beta2;            /* 0.999 */
  double eps;              /* 1e-6 */
  double weight_decay;     /* 0.01 */
  double max_grad_norm;    /* 1.0; 0 = no global pre-normalisation */
  double max_weight_norm;  /* 0 = off; > 0: phi(||w||) = min(||w||, this) */
  double max_trust_ratio;  /* 0 = off; > 0: trust = min(trust, this) */
  int32_t bias_correction; /* 1 */
  int32_t use_nvlamb;      /* 0: trust ratio only on decayed segments */
  int32_t adam_w_mode;     /* 1: decoupled decay; 0: L2 on the gradient */
  int32_t grad_averaging;  /* 1: (1-beta1) on g in m */
} bl_lamb_config;

/* AdamW (torch.optim.AdamW / apex FusedAdam adam_w_mode when
 * bias_correction = 1; the original BERT "BertAdam" when bias_correction = 0):
 *   m, v as above;  u = (m/bc1)/(sqrt(v/bc2)+eps) + wd*w;  w -= lr*u
 * per_segment_clip = 1 clips each segment's gradient to max_grad_norm
 * separately with torch.nn.utils.clip_grad_norm_'s rule (coef =
 * max/(norm+1e-6) when < 1), as BertAdam did, instead of globally. */
typedef struct bl_adamw_config {
  double beta1;             /* 0.9 */
  double beta2;             /* 0.999 */
  double eps;               /* 1e-6 (BERT); torch's default is 1e-8 */
  double weight_decay;      /* 0.01 */
  double max_grad_norm;     /* 0 = off */
  int32_t bias_correction;  /* 1 = AdamW; 0 = BertAdam */
  int32_t adam_w_mode;      /* 1: decoupled decay; 0: L2 on the gradient (Adam) */
  int32_t per_segment_clip; /* 1: clip each segment to max_grad_norm (BertAdam) */
  int32_t pad_;
} bl_adamw_config;

/* SGD (torch.optim.SGD semantics):
 *   d = g_eff + wd*w;  momentum: buf = d at step 1, else
 *   buf = momentum*buf + (1-dampening)*d;  d = nesterov ? d + momentum*buf : buf
 *   w -= lr*d          (buf may be NULL when momentum == 0) */
typedef struct bl_sgd_config {
  double momentum;      /* 0 = plain SGD */
  double dampening;     /* 0 */
  double weight_decay;  /* 0 */
  double max_grad_norm; /* 0 = off */
  int32_t nesterov;     /* 0 */
  int32_t pad_;
} bl_sgd_config;

void bl_lamb_config_default(bl_lamb_config *cfg);
void bl_adamw_config_default(bl_adamw_config *cfg);
void bl_sgd_config_default(bl_sgd_config *cfg);

/* L2 norm of all elements of grads (f32, contiguous), f64 accumulation in a
 * fixed order; *nonfinite (may be NULL) = 1 when any element is inf/NaN. */
int bl_grad_global_norm(const bl_tensor *grads, double *norm, int *nonfinite);

/* grads *= inv_scale in place, *found_inf = 1 when any element is inf/NaN
 * (before or after the multiply; inv_scale must be finite and > 0). All
 * elements are multiplied even when one is non-finite. */
int bl_unscale_check(bl_tensor *grads, double inv_scale, int *found_inf);

/* out (f32, contiguous) = grads (f16/bf16/f32, contiguous, same numel) *
 * inv_scale, with the same found_inf check: turns half-precision model
 * gradients into f32 master gradients in one pass. */
int bl_unscale_to_f32(bl_tensor *out, const bl_tensor *grads, double inv_scale, int *found_inf);

/* The loss-scaling rules of a loss-scaled step (bl_optim_args.amp, below). */
typedef struct bl_amp_config {
  double growth_factor, backoff_factor, min_scale, max_scale;
  int64_t growth_interval;
  int32_t dynamic;
  /* NULL, or a 1-element f64 tensor on the buffers' device holding the learning rate: the step reads it when it
   * runs and ignores bl_optim_args.lr (a replayed CUDA graph takes the rate the host last copied there) */
  const bl_tensor *lr_from;
} bl_amp_config;

/* The buffers and values of one step, shared by the three optimizers (fields left 0 / NULL take the default named
 * beside them):
 *
 * Gradients: every step reads g_eff = grad_scale * g / clip, where grad_scale is the caller's multiplier (e.g.
 * 1/loss_scale, 1/accumulation_steps; 1.0 if the gradients are ready) and clip = max(1, ||grad_scale*g|| /
 * max_grad_norm) when max_grad_norm > 0 (NVIDIA/apex "global gradient norm pre-normalisation"; exactly apex's
 * rule: divide by norm/max_grad_norm, no epsilon). The global norm is over all segments, accumulated in f64 over
 * fixed 16K-element chunks summed in order, so it is bitwise reproducible whatever the thread count. Set
 * has_grad_norm to supply the norm of grad_scale*g yourself (e.g. from bl_grad_global_norm); else it is computed.
 * The gradient buffer is never modified.
 *
 * Non-finite gradients. If the norm is inf/NaN the step returns BL_EINVAL ("...: non-finite gradient ...") BEFORE
 * writing anything: weights and moments are untouched. With fp16 use the loss-scaled step (amp below, or
 * bertlua.train.amp), which detects the overflow first and skips the step.
 *
 * Weight decay is applied only to segments with decay[k] != 0 (decay NULL = all). Decoupled (AdamW) decay is
 * added to the update, u += wd*w; with adam_w_mode = 0 it is classic L2 (g += wd*w before the moments).
 *
 * Devices: all buffers on the CPU, or all on one cuda:N (mixed is an error); on cuda the same step runs as kernels
 * (kernels/optim.cu), with the same results up to f32 rounding of the element math and the order of f64 sums.
 *
 * half: NULL, or the model's compute copy of w (bf16 or f16, contiguous, same numel and device, not sharing
 * memory with the other buffers): every element the step writes in w is written rounded to nearest even in half
 * by the same pass (on a GPU, the same launch), so no separate cast refreshes it after the step; the elements
 * outside every segment, and all of them on a failed or skipped step, are left as they are in both.
 *
 * amp: NULL for a plain step; else the loss-scaled step of LAMB and AdamW described below, which takes its step
 * count and norm from amp_state (step, has_grad_norm, grad_norm and stats are not used). */
typedef struct bl_optim_args {
  bl_tensor *w;                 /* params */
  bl_tensor *half;              /* NULL, or w's bf16/f16 compute copy (above) */
  const bl_tensor *g;           /* grads */
  bl_tensor *m, *v;             /* LAMB, AdamW: exp_avg, exp_avg_sq; SGD: m the momentum buffer (NULL when
                                   momentum == 0), v unused */
  const bl_optim_segments *seg; /* the parameter tensors */
  int64_t step;                 /* 1-based count of this update (bias corrections 1-beta^step) */
  double lr;
  double grad_scale; /* > 0 */
  double grad_norm;  /* the norm of grad_scale*g, read when has_grad_norm != 0 */
  int32_t has_grad_norm;
  int32_t pad_;
  bl_optim_stats *stats;    /* NULL, or filled by a plain step */
  const bl_amp_config *amp; /* NULL = a plain step */
  bl_tensor *amp_state;     /* with amp: the state tensor below */
} bl_optim_args;

int bl_lamb_step(const bl_lamb_config *cfg, const bl_optim_args *a);
int bl_adamw_step(const bl_adamw_config *cfg, const bl_optim_args *a);
int bl_sgd_step(const bl_sgd_config *cfg, const bl_optim_args *a);

/* The loss-scaled step (bl_optim_args.amp; LAMB and AdamW): its loss-scale decision, skip and step count live in
 * a state tensor on the buffers' device, so a training step on a GPU never waits for the host: the host reads the
 * state when it logs. amp_state: contiguous f64 [BL_AMP_STATE_LEN], indexed by BL_AMP_*, initialised by the
 * caller (scale = the initial loss scale, the rest 0). One call:
 *   norm = ||g|| * grad_scale / scale      (the norm of the unscaled gradients, f64, fixed order)
 *   non-finite norm: nothing is written; skipped += 1, last_skipped = 1, growth = 0; when dynamic, floor_skips
 *     += 1 if scale <= min_scale, then scale = max(scale * backoff_factor, min_scale)
 *   else: step += 1 and the optimizer step runs with that step count, grad_scale / scale and that norm
 *     (clipping, bias correction as bl_lamb_step / bl_adamw_step); norm, last_skipped = 0, floor_skips = 0;
 *     when dynamic, growth += 1 and at growth_interval scale = min(scale * growth_factor, max_scale), growth = 0
 *   calls += 1 either way.
 * These are the rules of torch.cuda.amp.GradScaler and bertlua.train.amp's DynamicLossScaler; with dynamic = 0
 * (bf16, fp32) the scale stays and a non-finite step is only counted (the caller raises its error). */
enum {
  BL_AMP_SCALE = 0,
  BL_AMP_GROWTH,
  BL_AMP_FLOOR_SKIPS,
  BL_AMP_SKIPPED,
  BL_AMP_STEP,
  BL_AMP_NORM,
  BL_AMP_LAST_SKIPPED,
  BL_AMP_CALLS,
  BL_AMP_STATE_LEN
};
/* The decision alone, on a host array of BL_AMP_STATE_LEN doubles (a loss scaler that steps the optimizer itself,
 * bertlua.train.amp's DynamicLossScaler:update): the rules above for one call given the norm of the unscaled
 * gradients (NaN or inf: an overflow). *skipped (may be NULL) = 1 when the step is to be skipped. */
int bl_amp_decide(const bl_amp_config *amp, double *state, double norm, int *skipped);

/* Before the first step of a training loop on a GPU: uploads the segment table and sizes the step's scratch for
 * buffers of numel elements on cuda:device, so that the first step allocates nothing (its scratch would otherwise
 * take device blocks cached for the next step's activations). Checks the segments; nothing to do on the CPU. */
int bl_optim_prepare(int device, const bl_optim_segments *seg, int64_t numel);
/* BL_CDEF_END */

#ifdef __cplusplus
}
#endif
#endif
