/* Shared plumbing of the flat-buffer optimizers in src/optim/ (not part of
 * the public API, not seen by the FFI): argument checks, the segment ->
 * fixed-size chunk work list, and the deterministic gradient-norm pass.
 *
 * Work is split into chunks of at most OPT_CHUNK elements that never cross a
 * segment boundary. Chunk boundaries depend only on the segment layout, and
 * every reduction (norms) is a per-chunk f64 partial summed in chunk order
 * afterwards, so results are bitwise identical for any thread count. */
#ifndef BL_OPTIM_INTERNAL_H
#define BL_OPTIM_INTERNAL_H
#include <stdint.h>
#include "bl_base.h"
#include "bl_tensor.h"
#include "bl_optim.h"

#define OPT_CHUNK 16384

/* sqrtf may set errno, and GCC will not vectorise a loop that calls it
 * unless the whole build uses -fno-math-errno (a per-function optimize
 * attribute does not help). The update kernels therefore work in blocks of
 * OPT_BLK elements: a vectorisable loop writes the sqrt arguments to a small
 * stack buffer, opt_sqrt_inplace takes the square roots with SIMD
 * instructions, and a second vectorisable loop finishes the update while the
 * block is still in L1. */
#define OPT_BLK 256
#include <math.h>
#if defined(__AVX__)
#include <immintrin.h>
static inline void opt_sqrt_inplace(float *x, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
  for (; i < n; i++) x[i] = sqrtf(x[i]);
}
#elif defined(__SSE2__)
#include <emmintrin.h>
static inline void opt_sqrt_inplace(float *x, int n) {
  int i = 0;
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
  for (; i < n; i++) x[i] = sqrtf(x[i]);
}
#elif defined(__aarch64__)
#include <arm_neon.h>
static inline void opt_sqrt_inplace(float *x, int n) {
  int i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(x + i, vsqrtq_f32(vld1q_f32(x + i)));
  for (; i < n; i++) x[i] = sqrtf(x[i]);
}
#else
static inline void opt_sqrt_inplace(float *x, int n) {
  for (int i = 0; i < n; i++) x[i] = sqrtf(x[i]);
}
#endif

typedef struct opt_plan {
  int64_t nchunks;
  int32_t *chunk_seg;   /* segment of each chunk */
  int64_t *chunk_start; /* first element of each chunk (absolute offset) */
  int64_t *chunk_len;
  int64_t *seg_first; /* first chunk of each segment; seg_first[count] = nchunks */
} opt_plan;

/* f32, contiguous, live (any device). */
int opt_check_flat(const char *op, const bl_tensor *t, const char *name);
/* Same numel as the reference buffer `w` (named "params"). */
int opt_check_same(const char *op, const bl_tensor *w, const bl_tensor *t, const char *name);
/* The n buffers (NULL entries skipped) share no memory. */
int opt_check_disjoint(const char *op, int n, const bl_tensor *const *t, const char *const *names);
/* half: NULL, or a contiguous bf16/f16 buffer of w's numel on w's device sharing no bytes with the n f32 buffers
 * ts (the compute copy of bl_optim.h). */
int opt_check_half(const char *op, const bl_tensor *w, const bl_tensor *half, int n, const bl_tensor *const *ts);
/* half[off..off+n) = w[off..off+n) rounded to half's dtype (nearest even); nothing when half is NULL. */
void opt_store_half(bl_tensor *half, const float *w, int64_t off, int64_t n);
/* In bounds of numel, non-negative, non-overlapping. */
int opt_check_segments(const char *op, const bl_optim_segments *seg, int64_t numel);
int opt_plan_make(const char *op, const bl_optim_segments *seg, opt_plan *p);
void opt_plan_free(opt_plan *p);
/* Sum of squares of x[start..start+len) in f64, fixed order for fixed len. */
double opt_sumsq(const float *x, int64_t len, double scale);
/* Per-chunk sum of squares of grad_scale*g into part[nchunks]. */
void opt_chunk_sumsq(const opt_plan *p, const float *g, double grad_scale, double *part);

/* Validates lr / step / grad_scale and computes the effective gradient
 * multiplier: resolves the global norm (computing it when grad_norm < 0),
 * fails without side effects on a non-finite norm, applies max_grad_norm.
 * On success *gmul = grad_scale / clip. `part` (nchunks doubles) receives the
 * per-chunk sums of squares when the norm was computed here (else untouched;
 * *have_part tells which). */
int opt_prologue(const char *op, const opt_plan *p, const float *g, int64_t step, double lr, double grad_scale,
                 double grad_norm, double max_grad_norm, double *part, int *have_part, double *gmul,
                 bl_optim_stats *stats);
/* step >= 1, lr finite >= 0, grad_scale finite > 0, max_grad_norm finite >= 0. */
int opt_check_step(const char *op, int64_t step, double lr, double grad_scale, double max_grad_norm);
/* The one device of the non-NULL buffers (-1 = CPU); mixed devices are an error. */
int opt_device(const char *op, int n, const bl_tensor *const *ts, int *dev);

/* The gradient side of a CPU step after the prologue: the chunk plan, g_eff = g * gmul, and the per-chunk sums of
 * squares of grad_scale*g in gsq[nchunks] when the prologue computed them (have_part). */
typedef struct opt_grad {
  const opt_plan *p;
  double gmul;
  double *gsq;
  int have_part;
} opt_grad;

/* One optimizer for opt_step: its checks, its clipping and its two devices' update. */
typedef struct opt_kind {
  const char *op; /* "lamb_step" */
  /* the config and the buffers (the amp and step values are opt_step's) */
  int (*check)(const char *op, const void *cfg, const bl_optim_args *a);
  /* the config's max_grad_norm; *global = 0 when the optimizer clips per segment itself (no global clipping) */
  double (*max_grad_norm)(const void *cfg, int *global);
  int (*cpu)(const void *cfg, const bl_optim_args *a, const opt_grad *gr);
  int (*cuda)(const char *op, int dev, const void *cfg, const bl_optim_args *a); /* plain and amp steps */
} opt_kind;
/* The public step of every optimizer: checks, then the loss-scaled step (a->amp) or the plain one on a's device;
 * on the CPU the prologue (norm, non-finite check, clipping) is done here before k->cpu runs. */
int opt_step(const opt_kind *k, const void *cfg, const bl_optim_args *a);

/* Loss-scaled steps (amp.c): the arguments both devices check, and the CPU step (a plain opt_step). */
int opt_amp_check(const char *op, const bl_tensor *w, const bl_amp_config *a, const bl_tensor *state, double lr,
                  double grad_scale);
int opt_amp_cpu(const opt_kind *k, const void *cfg, const bl_optim_args *a);
/* The Adam-family hyper-parameters: betas in [0, 1), eps and weight_decay finite and >= 0. */
int opt_check_adam_hyper(const char *op, double beta1, double beta2, double eps, double weight_decay);
/* The four flat Adam-family buffers (params, grads, exp_avg, exp_avg_sq):
 * same size, f32, contiguous, one device, not overlapping; segments inside them. */
int opt_check_adam_buffers(const char *op, const bl_tensor *w, const bl_tensor *half, const bl_tensor *g,
                           const bl_tensor *m, const bl_tensor *v, const bl_optim_segments *seg);

#endif
