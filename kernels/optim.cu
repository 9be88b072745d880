// CUDA twins of the flat-buffer optimizers of src/optim/ (contract in
// src/bl_optim.h; the CPU entry points check the arguments and dispatch here):
// LAMB, AdamW / BertAdam, SGD, the global gradient norm and the fused
// unscale + inf/NaN check. A step given the bf16/f16 compute copy of the weights writes it in the launch that
// writes the f32 master weight (no refresh cast after the step).
//
// Work decomposition: as on the CPU, every segment is cut into chunks of
// kChunk (= OPT_CHUNK) elements that never cross a segment; one block of
// kThreads threads processes one chunk. Norms are two-stage and deterministic:
// every chunk writes its f64 partial to a slot, a second kernel adds the slots
// in chunk order.
//
// Per-device state lives in opt_cache: the chunk table of the last segment
// layout (uploaded again only when the layout changes) and scratch that only
// grows, so a training loop allocates on its first step and never after.
// The step state {norm, multiplier, skip, bias corrections} stays on the
// device: on a non-finite norm every later kernel returns without writing.
// The host reads it back (one synchronisation) only when it computed the norm
// itself, to return the CPU contract's error; with a caller-supplied norm a
// step queues its kernels and returns without synchronising. The *_amp steps
// never read back: the loss-scale decision, the skip and the count of applied
// steps (bias correction) are made by step_final in the caller's state tensor
// (bl_optim.h, BL_AMP_*), which the host reads when it logs.
#include "common.cuh"
#include "../src/base/rules/amp.h"
#include "../src/base/rules/optim.h"
#include <math.h>
#include <string.h>
#include <vector>

namespace {

const int64_t kChunk = 16384;
const int kThreads = 256;
const int kMaxDevices = 64;

struct chunk {
  int64_t start, len;
  int32_t seg, decay;
};

struct step_state {
  double lr;        // the caller's, or read from bl_amp_config.lr_from when the step runs
  double norm;      // ||grad_scale * g||
  double clip;      // global clipping divisor (1 = none)
  float gmul;       // grad_scale / clip
  float ibc1, ibc2; // Adam bias corrections 1/(1 - beta^step) of this step (1 = off)
  int skip;         // non-finite gradients: nothing is written
};

// What step_final needs besides the partials. amp: see bl_amp_config; ibc1/ibc2 are the host's bias corrections,
// used when there is no amp state (with one, the step count is the state's and they are computed here).
struct final_args {
  double given, max_norm, grad_scale, lr;
  const double *lr_from; // device copy of the learning rate, or null: lr
  float ibc1, ibc2;
  double beta1, beta2;
  int bias_correction;
  bl_amp_config amp;
};

// A device buffer that is reallocated only when a larger one is needed.
struct grow_mem {
  cu_mem mem;
  size_t cap = 0;
  int need(const char *op, int dev, size_t bytes) {
    if (bytes <= cap && mem.p) return 0;
    cap = bytes > 2 * cap ? bytes : 2 * cap;
    return mem.alloc(op, dev, cap);
  }
};

struct opt_cache {
  std::vector<int64_t> off, len;
  std::vector<uint8_t> dec;
  bool valid = false;
  int64_t nchunk = 0;
  std::vector<int64_t> seg_first; // host copy: first chunk of each segment, [count] = nchunk
  grow_mem chunks, seg_first_d, state, part, ratio, flag;
};

opt_cache *g_cache[kMaxDevices];

int cache_for(const char *op, int dev, opt_cache **out) {
  if (dev >= kMaxDevices) return bl_set_error(BL_EUNSUPPORTED, "%s: cuda:%d: at most %d devices", op, dev, kMaxDevices);
  if (!g_cache[dev]) g_cache[dev] = new (std::nothrow) opt_cache;
  if (!g_cache[dev]) return bl_set_error(BL_ENOMEM, "%s: out of host memory", op);
  *out = g_cache[dev];
  return 0;
}

// The chunk table of seg on the device; uploaded only when the layout differs from the last call's.
int plan_segments(const char *op, int dev, const bl_optim_segments *seg, opt_cache *c) {
  const int32_t n = seg->count;
  std::vector<uint8_t> dec(n);
  for (int32_t s = 0; s < n; s++) dec[s] = !seg->decay || seg->decay[s];
  const size_t bytes = (size_t)n * sizeof(int64_t);
  if (c->valid && (int32_t)c->off.size() == n && c->dec == dec &&
      (n == 0 || (!memcmp(c->off.data(), seg->offset, bytes) && !memcmp(c->len.data(), seg->length, bytes))))
    return 0;
  c->valid = false;
  std::vector<chunk> ch;
  c->seg_first.assign(n + 1, 0);
  for (int32_t s = 0; s < n; s++) {
    c->seg_first[s] = (int64_t)ch.size();
    for (int64_t o = 0; o < seg->length[s]; o += kChunk)
      ch.push_back(chunk{ seg->offset[s] + o, seg->length[s] - o < kChunk ? seg->length[s] - o : kChunk, s, dec[s] });
  }
  c->seg_first[n] = (int64_t)ch.size();
  if ((int64_t)ch.size() > INT32_MAX) return bl_set_error(BL_EUNSUPPORTED, "%s: cuda:%d: buffer too large", op, dev);
  c->nchunk = (int64_t)ch.size();
  BL_CHECK(c->chunks.need(op, dev, (ch.size() + 1) * sizeof(chunk)));
  BL_CHECK(c->seg_first_d.need(op, dev, c->seg_first.size() * sizeof(int64_t)));
  cudaStream_t s = cu_stream(dev);
  cu_cost_call(dev, "host copy", "cudaMemcpyAsync h2d", BL_ENGINE_PCIE, 0,
               (double)(ch.size() * sizeof(chunk) + c->seg_first.size() * sizeof(int64_t)));
  if (!ch.empty())
    CU_TRY(op, dev, cudaMemcpyAsync(c->chunks.mem.p, ch.data(), ch.size() * sizeof(chunk), cudaMemcpyHostToDevice, s));
  CU_TRY(op, dev,
         cudaMemcpyAsync(c->seg_first_d.mem.p, c->seg_first.data(), c->seg_first.size() * sizeof(int64_t),
                         cudaMemcpyHostToDevice, s));
  cu_count_sync(dev);
  CU_TRY(op, dev, cudaStreamSynchronize(s)); // pageable sources: complete before the vectors change
  c->off.assign(seg->offset, seg->offset + n);
  c->len.assign(seg->length, seg->length + n);
  c->dec = dec;
  c->valid = true;
  return 0;
}

// part[c] = grad_scale^2 * sum over chunk c of g^2, in f64 as the CPU's opt_sumsq.
__global__ void sq_partial(const float *g, const chunk *ch, double grad_scale, double *part) {
  __shared__ double sh[32];
  const chunk c = ch[blockIdx.x];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < c.len; i += blockDim.x) {
    double x = (double)g[c.start + i];
    acc += x * x;
  }
  acc = cu_block_sum_d(acc, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = acc * grad_scale * grad_scale;
}

// The step state from the partials (given < 0) or from the caller's norm. With amp (the partials are of the
// raw gradients then) the norm is that of grad_scale / loss scale * g, and the state tensor decides the skip.
__global__ void step_final(const double *part, int64_t n, final_args a, double *amp, step_state *st) {
  __shared__ double sh[32];
  double acc = 0.0;
  if (a.given < 0)
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += part[i]; // fixed partition
  acc = cu_block_sum_d(acc, sh);
  if (threadIdx.x != 0) return;
  double nrm = a.given < 0 ? sqrt(acc) : a.given, gs = a.grad_scale;
  float ibc1 = a.ibc1, ibc2 = a.ibc2;
  bool skip = !isfinite(nrm);
  if (amp) { // the decision of src/base/rules/amp.h, as the CPU's opt_amp_cpu makes it
    gs = bl_amp_grad_mul(amp, gs);
    nrm *= gs;
    skip = bl_amp_decide_rule(amp, &a.amp, nrm);
    const double step = amp[BL_AMP_STEP];
    ibc1 = bl_opt_inv_bc(a.bias_correction, a.beta1, step);
    ibc2 = bl_opt_inv_bc(a.bias_correction, a.beta2, step);
  }
  double clip = bl_opt_clip(nrm, a.max_norm);
  st->lr = a.lr_from ? *a.lr_from : a.lr;
  st->norm = nrm;
  st->clip = clip;
  st->skip = skip;
  st->gmul = (float)(gs / clip);
  st->ibc1 = ibc1;
  st->ibc2 = ibc2;
}

// Per-segment sums of chunk partials (one block per segment, chunk order):
// LAMB's trust ratio from ||w||^2, ||u||^2, or BertAdam's per-segment clip.
struct ratio_args {
  double max_weight_norm, max_trust_ratio, max_grad_norm, grad_scale;
  int lamb;
};

__global__ void seg_ratio(const double *pw, const double *pu, const int64_t *seg_first, ratio_args a,
                          const step_state *st, float *ratio) {
  __shared__ double sh[32];
  if (st->skip) return; // uniform
  const int s = blockIdx.x;
  double sw = 0.0, su = 0.0;
  for (int64_t c = seg_first[s] + threadIdx.x; c < seg_first[s + 1]; c += blockDim.x) {
    sw += pw[c];
    if (a.lamb) su += pu[c];
  }
  sw = cu_block_sum_d(sw, sh);
  su = cu_block_sum_d(su, sh);
  if (threadIdx.x != 0) return;
  if (a.lamb)
    ratio[s] = (float)(st->lr * bl_lamb_trust_ratio(sw, su, a.max_weight_norm, a.max_trust_ratio));
  else
    ratio[s] = bl_bertadam_mul(sw, a.max_grad_norm, a.grad_scale);
}

// The compute copy of bl_optim.h's `half` (none when p is null): written by the launch that writes the master
// weight, rounded to nearest even as the cast kernel rounds, so the step needs no refresh cast after it.
struct half_out {
  void *p;
  int bf16;
  __device__ __forceinline__ void store(int64_t i, float w) const {
    if (!p) return;
    if (bf16)
      from_f(w, (__nv_bfloat16 *)p + i);
    else
      from_f(w, (__half *)p + i);
  }
};

half_out half_of(bl_tensor *half) { return half_out{ half ? half->data : nullptr, half && half->dtype == BL_BF16 }; }
double half_bytes(const bl_tensor *half, int64_t n) { return half ? 2.0 * (double)n : 0.0; }

// Constants of the Adam family, as the CPU's lamb_k / adam_k (f32 element math).
struct adam_k {
  float b1, b3, b2, b2c, eps, wd;
  int adam_w, trust_all, wd_nonzero;
};

// Moments of element i from its multiplied gradient; returns sqrt(v^). The roundings are spelled out (no FMA
// contraction, which nvcc applies by default): m and v are sums of two terms that nearly cancel when the gradient
// changes sign, and a fused product there moves the result by ulps of the terms, far more than an ulp of m, so
// the CPU twin's moments would no longer agree within test_cuda_optim's tolerance (seen with -ffp-contract=fast).
__device__ __forceinline__ float adam_moments(const adam_k &k, float w, float g, float gm, float wdl, float ibc2,
                                              float *m, float *v) {
  float gi = __fadd_rn(__fmul_rn(g, gm), __fmul_rn(wdl, w));
  float mi = __fadd_rn(__fmul_rn(k.b1, *m), __fmul_rn(k.b3, gi));
  float vi = __fadd_rn(__fmul_rn(k.b2, *v), __fmul_rn(__fmul_rn(k.b2c, gi), gi));
  *m = mi;
  *v = vi;
  return sqrtf(vi * ibc2);
}

__device__ __forceinline__ bool lamb_trust(const adam_k &k, int decay) {
  return bl_lamb_trusts(k.trust_all, decay, k.wd_nonzero);
}

// LAMB pass 1: moments; f64 ||w||^2, ||u||^2 per chunk for segments with a
// trust ratio, the whole step for the others.
__global__ void lamb_moments(float *w, const float *g, float *m, float *v, const chunk *ch, adam_k k,
                             const step_state *st, double *pw, double *pu, half_out h) {
  __shared__ double sh[32];
  if (st->skip) return;
  const chunk c = ch[blockIdx.x];
  const float gm = st->gmul, ibc1 = st->ibc1, ibc2 = st->ibc2;
  float wdw, wdl;
  bl_opt_decay(c.decay, k.wd, k.adam_w, &wdw, &wdl);
  const bool trust = lamb_trust(k, c.decay);
  double aw = 0.0, au = 0.0;
  for (int64_t j = threadIdx.x; j < c.len; j += blockDim.x) {
    const int64_t i = c.start + j;
    float mi = m[i], vi = v[i];
    const float den = adam_moments(k, w[i], g[i], gm, wdl, ibc2, &mi, &vi);
    m[i] = mi;
    v[i] = vi;
    const float u = (mi * ibc1) / (den + k.eps) + wdw * w[i];
    if (trust) {
      aw += (double)w[i] * w[i];
      au += (double)u * u;
    } else {
      const float wi = w[i] - (float)st->lr * u;
      w[i] = wi;
      h.store(i, wi);
    }
  }
  if (!trust) return; // uniform over the block
  aw = cu_block_sum_d(aw, sh);
  au = cu_block_sum_d(au, sh);
  if (threadIdx.x == 0) {
    pw[blockIdx.x] = aw;
    pu[blockIdx.x] = au;
  }
}

// LAMB pass 2: u again from the stored moments and the old w, times lr * trust.
__global__ void lamb_apply(float *w, const float *m, const float *v, const chunk *ch, adam_k k, const step_state *st,
                           const float *ratio, half_out h) {
  if (st->skip) return;
  const chunk c = ch[blockIdx.x];
  if (!lamb_trust(k, c.decay)) return;
  const float r = ratio[c.seg], ibc1 = st->ibc1, ibc2 = st->ibc2;
  float wdw, wdl;
  bl_opt_decay(c.decay, k.wd, k.adam_w, &wdw, &wdl);
  for (int64_t j = threadIdx.x; j < c.len; j += blockDim.x) {
    const int64_t i = c.start + j;
    const float den = sqrtf(v[i] * ibc2);
    const float wi = w[i] - r * ((m[i] * ibc1) / (den + k.eps) + wdw * w[i]);
    w[i] = wi;
    h.store(i, wi);
  }
}

// AdamW / BertAdam: segmul (per-segment clip) replaces the global multiplier when given.
__global__ void adamw_apply(float *w, const float *g, float *m, float *v, const chunk *ch, adam_k k,
                            const step_state *st, const float *segmul, half_out h) {
  if (st->skip) return;
  const chunk c = ch[blockIdx.x];
  const float gm = segmul ? segmul[c.seg] : st->gmul, ibc1 = st->ibc1;
  float wdw, wdl;
  bl_opt_decay(c.decay, k.wd, k.adam_w, &wdw, &wdl);
  for (int64_t j = threadIdx.x; j < c.len; j += blockDim.x) {
    const int64_t i = c.start + j;
    float mi = m[i], vi = v[i];
    const float den = adam_moments(k, w[i], g[i], gm, wdl, st->ibc2, &mi, &vi);
    m[i] = mi;
    v[i] = vi;
    const float wi = w[i] - (float)st->lr * ((mi * ibc1) / (den + k.eps) + wdw * w[i]);
    w[i] = wi;
    h.store(i, wi);
  }
}

struct sgd_k {
  float mu, damp, wd;
  int mom, first, nesterov;
};

__global__ void sgd_apply(float *w, const float *g, float *buf, const chunk *ch, sgd_k k, const step_state *st,
                          half_out h) {
  if (st->skip) return;
  const chunk c = ch[blockIdx.x];
  const float gm = st->gmul, wd = bl_opt_seg_wd(c.decay, k.wd);
  for (int64_t j = threadIdx.x; j < c.len; j += blockDim.x) {
    const int64_t i = c.start + j;
    float d = __fadd_rn(__fmul_rn(g[i], gm), __fmul_rn(wd, w[i])); // uncontracted, as adam_moments
    if (k.mom) {
      float b = k.first ? d : __fadd_rn(__fmul_rn(k.mu, buf[i]), __fmul_rn(k.damp, d));
      buf[i] = b;
      d = k.nesterov ? __fadd_rn(d, __fmul_rn(k.mu, b)) : b;
    }
    const float wi = w[i] - (float)st->lr * d;
    w[i] = wi;
    h.store(i, wi);
  }
}

// f64 sum of squares of fixed kChunk slices of a whole buffer (bl_grad_global_norm).
__global__ void sq_partial_flat(const float *g, int64_t n, double *part) {
  __shared__ double sh[32];
  const int64_t s = blockIdx.x * kChunk, e = s + kChunk < n ? s + kChunk : n;
  double acc = 0.0;
  for (int64_t i = s + threadIdx.x; i < e; i += blockDim.x) acc += (double)g[i] * g[i];
  acc = cu_block_sum_d(acc, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

__global__ void unscale_kernel(float *g, int64_t n, float s, int *flag) {
  bool bad = false;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float x = g[i] * s;
    g[i] = x;
    bad |= !isfinite(x);
  }
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) atomicOr(flag, 1);
}

// Everything one optimizer step needs before its update kernels.
struct step_ctx {
  const char *op;
  int dev;
  cudaStream_t s;
  opt_cache *c;
  bool computed; // the norm is computed here and no amp state decides: the host reads the state back
  double grad_norm;
};

int flat_ptr(const char *op, const bl_tensor *t, const char *name, int64_t n) {
  if (!t || t->dtype != BL_F32 || !cu_is_contig(t) || t->numel != n)
    return bl_set_error(BL_EINVAL, "%s: %s must be a contiguous f32 buffer of %lld elements", op, name, (long long)n);
  return 0;
}

// How a step gets its norm, skip and bias corrections: from the host (step > 0, amp_state null) or from the
// amp state tensor on the device (then grad_norm is ignored and computed here).
struct step_src {
  int64_t step;
  double beta1, beta2;
  int bias_correction;
  const bl_amp_config *amp;
  bl_tensor *amp_state;
  double lr;
};

// Device, chunk table, scratch for nparts partial slots per chunk, and the
// step state with the global norm (computed on the device when grad_norm < 0).
int begin_step(step_ctx *x, const char *op, const bl_tensor *const *ts, int nts, const bl_optim_segments *seg,
               double grad_scale, double grad_norm, double max_grad_norm, int nparts, bool need_part,
               const step_src &src) {
  x->op = op;
  BL_CHECK(cu_device(op, nts, ts, &x->dev));
  for (int i = 0; i < nts; i++)
    if (ts[i]) BL_CHECK(flat_ptr(op, ts[i], "buffer", ts[0]->numel));
  double *amp = nullptr;
  if (src.amp_state) {
    const bl_tensor *t = src.amp_state;
    if (t->device != x->dev || t->dtype != BL_F64 || !cu_is_contig(t) || t->numel != BL_AMP_STATE_LEN)
      return bl_set_error(BL_EINVAL, "%s: amp state must be a contiguous f64 tensor of %d elements on cuda:%d", op,
                          BL_AMP_STATE_LEN, x->dev);
    amp = (double *)t->data;
    grad_norm = -1.0;
  }
  x->s = cu_stream(x->dev);
  BL_CHECK(cache_for(op, x->dev, &x->c));
  BL_CHECK(plan_segments(op, x->dev, seg, x->c));
  opt_cache *c = x->c;
  const int64_t nc = c->nchunk;
  BL_CHECK(c->state.need(op, x->dev, sizeof(step_state)));
  BL_CHECK(c->part.need(op, x->dev, (size_t)(nparts * nc + 1) * sizeof(double)));
  BL_CHECK(c->ratio.need(op, x->dev, (size_t)(seg->count + 1) * sizeof(float)));
  // A NaN or inf norm from the caller is not computed: the device state marks the step skipped, end_step fails it.
  x->computed = grad_norm < 0 && !amp;
  x->grad_norm = grad_norm;
  if (grad_norm < 0) need_part = true;
  double *part = c->part.mem.as<double>();
  if (need_part && nc > 0) {
    cu_cost_kernel(x->dev, "optimizer", "sq_partial", 4.0 * ts[1]->numel + 8.0 * nc);
    // with amp the loss scale is known on the device only: step_final applies grad_scale / scale to the norm
    sq_partial<<<(unsigned)nc, kThreads, 0, x->s>>>((const float *)ts[1]->data, c->chunks.mem.as<chunk>(),
                                                    amp ? 1.0 : grad_scale, part);
    BL_CHECK(cu_launched(op, x->dev));
  }
  final_args a = {};
  a.given = grad_norm;
  a.max_norm = max_grad_norm;
  a.grad_scale = grad_scale;
  a.lr = src.lr;
  a.ibc1 = amp ? 1.0f : bl_opt_inv_bc(src.bias_correction, src.beta1, (double)src.step);
  a.ibc2 = amp ? 1.0f : bl_opt_inv_bc(src.bias_correction, src.beta2, (double)src.step);
  a.beta1 = src.beta1;
  a.beta2 = src.beta2;
  a.bias_correction = src.bias_correction;
  if (amp) a.amp = *src.amp;
  if (amp && src.amp->lr_from) {
    const bl_tensor *lt = src.amp->lr_from;
    if (lt->device != x->dev || lt->dtype != BL_F64 || lt->numel != 1)
      return bl_set_error(BL_EINVAL, "%s: amp lr_from must be a 1-element f64 tensor on cuda:%d", op, x->dev);
    a.lr_from = (const double *)lt->data;
  }
  cu_cost_kernel(x->dev, "optimizer", "step_final",
                 8.0 * nc + sizeof(step_state) + (amp ? 16.0 * BL_AMP_STATE_LEN : 0)); // amp: state read, written
  step_final<<<1, kThreads, 0, x->s>>>(part, nc, a, amp, c->state.mem.as<step_state>());
  return cu_launched(op, x->dev);
}

// The CPU contract's ending: stats, and the error on a non-finite norm. A
// caller-supplied finite norm needs no read-back (the device state agrees);
// an amp step leaves both to its state tensor.
int end_step(step_ctx *x, double grad_scale, double max_grad_norm, bl_optim_stats *stats, bool amp) {
  if (amp) return 0;
  step_state st;
  if (x->computed) {
    // cudaMemcpy on the legacy stream is ordered after our blocking stream: the one synchronisation.
    BL_CHECK(cu_read_back(x->op, x->dev, &st, x->c->state.mem.p, sizeof st));
  } else {
    st.norm = x->grad_norm;
    st.clip = bl_opt_clip(st.norm, max_grad_norm);
    st.skip = !isfinite(st.norm);
    st.gmul = (float)(grad_scale / st.clip);
  }
  if (stats) {
    stats->grad_norm = st.norm;
    stats->clip_coef = 1.0 / st.clip;
    stats->nonfinite = st.skip;
  }
  if (st.skip)
    return bl_set_error(BL_EINVAL,
                        "%s: non-finite gradient (global norm %g): step not applied, weights unchanged "
                        "(with fp16 use the dynamic loss scaler, which skips such steps)",
                        x->op, st.norm);
  return 0;
}

// The constants both Adam-family steps share (grad averaging on, trust ratio off); the bias corrections come
// from the step state.
adam_k adam_consts(double b1, double b2, double eps, double wd, int adam_w) {
  adam_k k;
  k.b1 = (float)b1;
  k.b3 = (float)(1.0 - b1);
  k.b2 = (float)b2;
  k.b2c = (float)(1.0 - b2);
  k.eps = (float)eps;
  k.wd = (float)wd;
  k.adam_w = adam_w != 0;
  k.trust_all = 0;
  k.wd_nonzero = wd != 0;
  return k;
}

int lamb_step(const bl_lamb_config *cfg, bl_tensor *w, bl_tensor *half, const bl_tensor *g, bl_tensor *m, bl_tensor *v,
              const bl_optim_segments *seg, double grad_scale, double grad_norm, bl_optim_stats *stats,
              const step_src &src) {
  step_ctx x;
  const bl_tensor *ts[] = { w, g, m, v };
  BL_CHECK(begin_step(&x, "lamb_step", ts, 4, seg, grad_scale, grad_norm, cfg->max_grad_norm, 2, false, src));
  const int64_t nc = x.c->nchunk;
  if (nc > 0) {
    adam_k k = adam_consts(cfg->beta1, cfg->beta2, cfg->eps, cfg->weight_decay, cfg->adam_w_mode);
    if (!cfg->grad_averaging) k.b3 = 1.0f;
    k.trust_all = cfg->use_nvlamb != 0;
    const chunk *ch = x.c->chunks.mem.as<chunk>();
    const step_state *st = x.c->state.mem.as<step_state>();
    double *pw = x.c->part.mem.as<double>(), *pu = pw + nc;
    float *ratio = x.c->ratio.mem.as<float>();
    // w, g, m, v in; m, v out (and w with its half copy where no trust ratio applies: at most)
    cu_cost_kernel(x.dev, "optimizer", "lamb_moments", 24.0 * w->numel + 16.0 * nc);
    lamb_moments<<<(unsigned)nc, kThreads, 0, x.s>>>((float *)w->data, (const float *)g->data, (float *)m->data,
                                                     (float *)v->data, ch, k, st, pw, pu, half_of(half));
    BL_CHECK(cu_launched(x.op, x.dev));
    ratio_args ra = { cfg->max_weight_norm, cfg->max_trust_ratio, 0, 0, 1 };
    cu_cost_kernel(x.dev, "optimizer", "seg_ratio", 16.0 * nc + 4.0 * seg->count);
    seg_ratio<<<(unsigned)seg->count, kThreads, 0, x.s>>>(pw, pu, x.c->seg_first_d.mem.as<int64_t>(), ra, st, ratio);
    BL_CHECK(cu_launched(x.op, x.dev));
    // w, m, v in; w (and its half copy) out
    cu_cost_kernel(x.dev, "optimizer", "lamb_apply", 16.0 * w->numel + half_bytes(half, w->numel) + 4.0 * seg->count);
    lamb_apply<<<(unsigned)nc, kThreads, 0, x.s>>>((float *)w->data, (const float *)m->data, (const float *)v->data, ch,
                                                   k, st, ratio, half_of(half));
    BL_CHECK(cu_launched(x.op, x.dev));
  }
  return end_step(&x, grad_scale, cfg->max_grad_norm, stats, src.amp_state != nullptr);
}

int adamw_step(const bl_adamw_config *cfg, bl_tensor *w, bl_tensor *half, const bl_tensor *g, bl_tensor *m,
               bl_tensor *v, const bl_optim_segments *seg, double grad_scale, double grad_norm, bl_optim_stats *stats,
               const step_src &src) {
  step_ctx x;
  const bl_tensor *ts[] = { w, g, m, v };
  const bool per_seg = cfg->per_segment_clip && cfg->max_grad_norm > 0;
  const double global_max = per_seg ? 0.0 : cfg->max_grad_norm;
  BL_CHECK(begin_step(&x, "adamw_step", ts, 4, seg, grad_scale, grad_norm, global_max, 1, per_seg, src));
  const int64_t nc = x.c->nchunk;
  if (nc > 0) {
    const adam_k k = adam_consts(cfg->beta1, cfg->beta2, cfg->eps, cfg->weight_decay, cfg->adam_w_mode);
    const step_state *st = x.c->state.mem.as<step_state>();
    float *segmul = nullptr;
    if (per_seg) {
      if (src.amp_state)
        return bl_set_error(BL_EUNSUPPORTED, "%s: per-segment clipping (BertAdam) with an amp state", x.op);
      segmul = x.c->ratio.mem.as<float>();
      ratio_args ra = { 0, 0, cfg->max_grad_norm, grad_scale, 0 };
      cu_cost_kernel(x.dev, "optimizer", "seg_ratio", 8.0 * nc + 4.0 * seg->count);
      seg_ratio<<<(unsigned)seg->count, kThreads, 0, x.s>>>(x.c->part.mem.as<double>(), nullptr,
                                                            x.c->seg_first_d.mem.as<int64_t>(), ra, st, segmul);
      BL_CHECK(cu_launched(x.op, x.dev));
    }
    // w, g, m, v in; w, m, v (and w's half copy) out
    cu_cost_kernel(x.dev, "optimizer", "adamw_apply", 28.0 * w->numel + half_bytes(half, w->numel));
    adamw_apply<<<(unsigned)nc, kThreads, 0, x.s>>>((float *)w->data, (const float *)g->data, (float *)m->data,
                                                    (float *)v->data, x.c->chunks.mem.as<chunk>(), k, st, segmul,
                                                    half_of(half));
    BL_CHECK(cu_launched(x.op, x.dev));
  }
  return end_step(&x, grad_scale, global_max, stats, src.amp_state != nullptr);
}

} // namespace

extern "C" int bl_cuda_optim_prepare(int device, const bl_optim_segments *seg) {
  const char *op = "optim_prepare";
  BL_CHECK(bl_dev_check(device, op));
  opt_cache *c = nullptr;
  BL_CHECK(cache_for(op, device, &c));
  BL_CHECK(plan_segments(op, device, seg, c));
  BL_CHECK(c->state.need(op, device, sizeof(step_state)));
  BL_CHECK(c->part.need(op, device, (size_t)(2 * c->nchunk + 1) * sizeof(double))); // LAMB's two partials
  return c->ratio.need(op, device, (size_t)(seg->count + 1) * sizeof(float));
}

// amp: the loss-scaled step, its count, norm and decision in a->amp_state (src/optim's opt_step checked both forms)
extern "C" int bl_cuda_lamb_step(const bl_lamb_config *cfg, const bl_optim_args *a) {
  step_src src = { a->amp ? 0 : a->step, cfg->beta1, cfg->beta2, cfg->bias_correction, a->amp, a->amp_state, a->lr };
  return lamb_step(cfg, a->w, a->half, a->g, a->m, a->v, a->seg, a->grad_scale,
                   a->amp ? -1.0 : bl_opt_given_norm(a->has_grad_norm, a->grad_norm), a->amp ? nullptr : a->stats, src);
}

extern "C" int bl_cuda_adamw_step(const bl_adamw_config *cfg, const bl_optim_args *a) {
  step_src src = { a->amp ? 0 : a->step, cfg->beta1, cfg->beta2, cfg->bias_correction, a->amp, a->amp_state, a->lr };
  return adamw_step(cfg, a->w, a->half, a->g, a->m, a->v, a->seg, a->grad_scale,
                    a->amp ? -1.0 : bl_opt_given_norm(a->has_grad_norm, a->grad_norm), a->amp ? nullptr : a->stats,
                    src);
}

extern "C" int bl_cuda_sgd_step(const bl_sgd_config *cfg, const bl_optim_args *a) {
  bl_tensor *w = a->w, *half = a->half, *buf = a->m;
  const bl_tensor *g = a->g;
  const int64_t step = a->step;
  const double grad_scale = a->grad_scale;
  step_ctx x;
  const bool mom = cfg->momentum > 0;
  const bl_tensor *ts[] = { w, g, mom ? buf : nullptr };
  step_src src = { step, 0, 0, 0, nullptr, nullptr, a->lr };
  BL_CHECK(begin_step(&x, "sgd_step", ts, 3, a->seg, grad_scale, bl_opt_given_norm(a->has_grad_norm, a->grad_norm),
                      cfg->max_grad_norm, 1, false, src));
  const int64_t nc = x.c->nchunk;
  if (nc > 0) {
    sgd_k k = { (float)cfg->momentum, (float)(1.0 - cfg->dampening), (float)cfg->weight_decay, mom, step == 1,
                cfg->nesterov != 0 };
    // w, g (, buf) in; w (, buf, w's half copy) out
    cu_cost_kernel(x.dev, "optimizer", "sgd_apply", (mom ? 20.0 : 12.0) * w->numel + half_bytes(half, w->numel));
    sgd_apply<<<(unsigned)nc, kThreads, 0, x.s>>>((float *)w->data, (const float *)g->data,
                                                  mom ? (float *)buf->data : nullptr, x.c->chunks.mem.as<chunk>(), k,
                                                  x.c->state.mem.as<step_state>(), half_of(half));
    BL_CHECK(cu_launched(x.op, x.dev));
  }
  return end_step(&x, grad_scale, cfg->max_grad_norm, a->stats, false);
}

extern "C" int bl_cuda_grad_global_norm(const bl_tensor *grads, double *norm, int *nonfinite) {
  const char *op = "grad_global_norm";
  int dev;
  opt_cache *c;
  const bl_tensor *ts[] = { grads };
  BL_CHECK(cu_device(op, 1, ts, &dev));
  BL_CHECK(flat_ptr(op, grads, "grads", grads->numel));
  BL_CHECK(cache_for(op, dev, &c));
  const int64_t nb = (grads->numel + kChunk - 1) / kChunk;
  if (nb > INT32_MAX) return bl_set_error(BL_EUNSUPPORTED, "%s: cuda:%d: buffer too large", op, dev);
  BL_CHECK(c->flag.need(op, dev, (size_t)(nb + 1) * sizeof(double)));
  BL_CHECK(c->state.need(op, dev, sizeof(step_state)));
  cudaStream_t s = cu_stream(dev);
  double *part = c->flag.mem.as<double>();
  if (nb > 0) {
    cu_cost_kernel(dev, "optimizer", "sq_partial_flat", 4.0 * grads->numel + 8.0 * nb);
    sq_partial_flat<<<(unsigned)nb, kThreads, 0, s>>>((const float *)grads->data, grads->numel, part);
    BL_CHECK(cu_launched(op, dev));
  }
  step_state *st = c->state.mem.as<step_state>();
  final_args a = {};
  a.given = -1.0;
  a.grad_scale = 1.0;
  cu_cost_kernel(dev, "optimizer", "step_final", 8.0 * nb + sizeof(step_state));
  step_final<<<1, kThreads, 0, s>>>(part, nb, a, nullptr, st);
  BL_CHECK(cu_launched(op, dev));
  step_state h;
  BL_CHECK(cu_read_back(op, dev, &h, st, sizeof h));
  *norm = h.norm;
  if (nonfinite) *nonfinite = h.skip;
  return 0;
}

extern "C" int bl_cuda_unscale_check(bl_tensor *grad, double inv_scale, int *found_inf) {
  const char *op = "unscale_check";
  int dev;
  opt_cache *c;
  const bl_tensor *ts[] = { grad };
  BL_CHECK(cu_device(op, 1, ts, &dev));
  BL_CHECK(flat_ptr(op, grad, "grads", grad->numel));
  BL_CHECK(cache_for(op, dev, &c));
  BL_CHECK(c->flag.need(op, dev, sizeof(double)));
  cudaStream_t s = cu_stream(dev);
  cu_cost_call(dev, "memset", "cudaMemsetAsync", BL_ENGINE_MEM, 0, sizeof(int));
  CU_TRY(op, dev, cudaMemsetAsync(c->flag.mem.p, 0, sizeof(int), s));
  if (grad->numel > 0) {
    cu_cost_kernel(dev, "optimizer", "unscale_kernel", 8.0 * grad->numel);
    unscale_kernel<<<cu_blocks(grad->numel, 256, 4096), 256, 0, s>>>((float *)grad->data, grad->numel, (float)inv_scale,
                                                                     c->flag.mem.as<int>());
    BL_CHECK(cu_launched(op, dev));
  }
  int h = 0;
  BL_CHECK(cu_read_back(op, dev, &h, c->flag.mem.p, sizeof h));
  if (found_inf) *found_inf = h;
  return 0;
}
