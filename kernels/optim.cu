// Multi-tensor optimizers over flat f32 buffers (contracts in
// src/device/cuda_ops.h): NVLAMB and AdamW with a segment table, fused
// unscale + inf/NaN check, and flat casts.
//
// Work decomposition: every segment is cut into fixed chunks of kChunk
// elements; one block (256 threads) processes one chunk and never crosses a
// segment, so per-segment quantities need no search. Norms are two-stage and
// deterministic: each chunk writes its partial sum (block tree, double) to a
// slot, and a second kernel adds the slots of a segment (or of the whole
// buffer) in chunk order.
//
// The contract is the CPU optimizers' (src/bl_optim.h): grad_scale
// multiplies the gradients, and a non-finite global norm fails the step with
// BL_EINVAL before anything is written. The step state ({norm, gradient
// multiplier, non-finite}) lives on the device: on a non-finite norm every
// kernel after the norm returns without writing, and the one synchronisation
// at the end reads the flag to return the error.
#include "common.cuh"
#include <algorithm>
#include <vector>

namespace {

const int64_t kChunk = 8192;
const int kThreads = 256;

struct chunk {
  int64_t start, len;
  int32_t seg, decay;
};

struct step_state {
  double norm;   // ||grad_scale * g||
  float gmul;    // grad_scale / clip: the multiplier of every gradient element
  int skip;      // non-finite gradients: nothing is written
};

// partial[c] = grad_scale^2 * sum over chunk c of g^2 (in f64, as the CPU's opt_sumsq)
__global__ void sq_partial(const float *g, const chunk *ch, double grad_scale, double *partial) {
  __shared__ double sh[32];
  const chunk c = ch[blockIdx.x];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < c.len; i += blockDim.x) {
    double x = (double)g[c.start + i];
    acc += x * x;
  }
  acc = cu_block_sum_d(acc, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc * grad_scale * grad_scale;
}

__global__ void norm_final(const double *partial, int64_t n, double max_norm, double grad_scale, step_state *st) {
  __shared__ double sh[32];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];   // fixed partition
  acc = cu_block_sum_d(acc, sh);
  if (threadIdx.x == 0) {
    double nrm = sqrt(acc), clip = (max_norm > 0.0 && nrm > max_norm) ? nrm / max_norm : 1.0;
    st->norm = nrm;
    st->skip = !isfinite(nrm);
    st->gmul = (float)(grad_scale / clip);
  }
}

struct adam_hyper {
  float lr, b1, b2, eps, wd, bc1, bc2;
};

__device__ __forceinline__ float lamb_update(float m, float v, float p, int decay, const adam_hyper &hp) {
  float u = (m / hp.bc1) / (sqrtf(v / hp.bc2) + hp.eps);
  if (decay) u += hp.wd * p;
  return u;
}

// The Adam moments of element i from its scaled gradient gi, stored and returned.
__device__ __forceinline__ void adam_moments(float *m, float *v, int64_t i, float gi, const adam_hyper &hp, float *mi,
                                             float *vi) {
  *mi = hp.b1 * m[i] + (1.0f - hp.b1) * gi;
  *vi = hp.b2 * v[i] + (1.0f - hp.b2) * gi * gi;
  m[i] = *mi;
  v[i] = *vi;
}

// Moments update and per-chunk ||p||^2, ||u||^2.
__global__ void lamb_moments(const float *p, const float *g, float *m, float *v, const chunk *ch, adam_hyper hp,
                             const step_state *st, double *pn, double *un) {
  __shared__ double sh[32];
  if (st->skip) return;   // uniform
  const chunk c = ch[blockIdx.x];
  const float gs = st->gmul;
  double ap = 0.0, au = 0.0;
  for (int64_t k = threadIdx.x; k < c.len; k += blockDim.x) {
    const int64_t i = c.start + k;
    float mi, vi;
    adam_moments(m, v, i, g[i] * gs, hp, &mi, &vi);
    const float u = lamb_update(mi, vi, p[i], c.decay, hp);
    ap += (double)p[i] * (double)p[i];
    au += (double)u * (double)u;
  }
  ap = cu_block_sum_d(ap, sh);
  au = cu_block_sum_d(au, sh);
  if (threadIdx.x == 0) { pn[blockIdx.x] = ap; un[blockIdx.x] = au; }
}

// One block per segment: trust ratio from its chunks' partials (in order).
__global__ void lamb_ratio(const double *pn, const double *un, const int64_t *seg_first, const int64_t *seg_count,
                           const int32_t *seg_decay, int trust_all, const step_state *st, float *ratio) {
  __shared__ double sh[32];
  if (st->skip) return;
  const int s = blockIdx.x;
  double ap = 0.0, au = 0.0;
  for (int64_t k = threadIdx.x; k < seg_count[s]; k += blockDim.x) { ap += pn[seg_first[s] + k]; au += un[seg_first[s] + k]; }
  ap = cu_block_sum_d(ap, sh);
  au = cu_block_sum_d(au, sh);
  if (threadIdx.x == 0) {
    double wn = sqrt(ap), unn = sqrt(au);
    float r = 1.0f;
    if ((trust_all || seg_decay[s]) && wn > 0.0 && unn > 0.0) r = (float)(wn / unn);
    ratio[s] = r;
  }
}

__global__ void lamb_apply(float *p, const float *m, const float *v, const chunk *ch, adam_hyper hp, const step_state *st,
                           const float *ratio) {
  if (st->skip) return;
  const chunk c = ch[blockIdx.x];
  const float step = hp.lr * ratio[c.seg];
  for (int64_t k = threadIdx.x; k < c.len; k += blockDim.x) {
    const int64_t i = c.start + k;
    p[i] -= step * lamb_update(m[i], v[i], p[i], c.decay, hp);
  }
}

__global__ void adamw_apply(float *p, const float *g, float *m, float *v, const chunk *ch, adam_hyper hp,
                            const step_state *st) {
  if (st->skip) return;
  const chunk c = ch[blockIdx.x];
  const float gs = st->gmul;
  const float step = hp.lr / hp.bc1, sbc2 = sqrtf(hp.bc2), shrink = 1.0f - hp.lr * hp.wd;
  for (int64_t k = threadIdx.x; k < c.len; k += blockDim.x) {
    const int64_t i = c.start + k;
    float mi, vi;
    adam_moments(m, v, i, g[i] * gs, hp, &mi, &vi);
    float pi = p[i];
    if (c.decay) pi *= shrink;
    p[i] = pi - step * mi / (sqrtf(vi) / sbc2 + hp.eps);
  }
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

int check_flat(const char *op, const bl_tensor *t, const char *name, int64_t n) {
  if (!t) return bl_set_error(BL_EINVAL, "%s: %s is NULL", op, name);
  BL_CHECK(bl_tensor_check(t, op));
  if (t->dtype != BL_F32 || !cu_is_contig(t) || t->numel != n) {
    char s[128];
    return bl_set_error(BL_EINVAL, "%s: %s must be a contiguous f32 buffer of %lld elements, got %s %s", op, name, (long long)n,
                        bl_dtype_name(t->dtype), BL_SHAPE(t, s));
  }
  return 0;
}

// Everything both optimizers share: the device, checks, the chunk table on the device, the global norm.
struct plan {
  cu_mem chunks, seg_first, seg_count, seg_dec, state, partial;
  int64_t nchunk = 0;
  adam_hyper hp;
};

// *dev_out gets the device of the four tensors (found first, as the ops do).
int prepare(const char *op, int *dev_out, const bl_tensor *param, const bl_tensor *grad, const bl_tensor *m,
            const bl_tensor *v, const int64_t *seg_offset, const int64_t *seg_length, const uint8_t *seg_decay, int nseg,
            double lr, double beta1, double beta2, double eps, double wd, int64_t step, double grad_scale,
            double max_grad_norm, plan *pl) {
  const bl_tensor *ts[] = {param, grad, m, v};
  BL_CHECK(cu_device(op, 4, ts, dev_out));
  const int dev = *dev_out;
  int64_t n = param->numel;
  BL_CHECK(check_flat(op, param, "param", n));
  BL_CHECK(check_flat(op, grad, "grad", n));
  BL_CHECK(check_flat(op, m, "exp_avg", n));
  BL_CHECK(check_flat(op, v, "exp_avg_sq", n));
  if (nseg < 0 || (nseg > 0 && (!seg_offset || !seg_length || !seg_decay)))
    return bl_set_error(BL_EINVAL, "%s: segment table is missing (%d segments)", op, nseg);
  if (step < 1) return bl_set_error(BL_EINVAL, "%s: step must be >= 1, got %lld", op, (long long)step);
  if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1))
    return bl_set_error(BL_EINVAL, "%s: betas (%g, %g) must be in [0, 1)", op, beta1, beta2);
  if (!(eps > 0) || !isfinite(lr) || !isfinite(wd) || !(grad_scale > 0) || !isfinite(grad_scale))
    return bl_set_error(BL_EINVAL, "%s: need eps > 0, finite lr/weight_decay and grad_scale > 0 (eps %g, lr %g, wd %g, scale %g)",
                        op, eps, lr, wd, grad_scale);
  std::vector<int> order(nseg);
  for (int s = 0; s < nseg; s++) {
    order[s] = s;
    if (seg_offset[s] < 0 || seg_length[s] < 0 || seg_offset[s] > n - seg_length[s])
      return bl_set_error(BL_EINVAL, "%s: segment %d [%lld, +%lld) is outside the %lld-element buffer", op, s,
                          (long long)seg_offset[s], (long long)seg_length[s], (long long)n);
  }
  std::sort(order.begin(), order.end(), [&](int a, int b) { return seg_offset[a] < seg_offset[b]; });
  for (int k = 1; k < nseg; k++) {
    int a = order[k - 1], b = order[k];
    if (seg_length[a] > 0 && seg_length[b] > 0 && seg_offset[a] + seg_length[a] > seg_offset[b])
      return bl_set_error(BL_EINVAL, "%s: segments %d and %d overlap", op, a, b);
  }
  std::vector<chunk> ch;
  std::vector<int64_t> first(nseg > 0 ? nseg : 1), count(nseg > 0 ? nseg : 1);
  std::vector<int32_t> dec(nseg > 0 ? nseg : 1);
  for (int s = 0; s < nseg; s++) {
    first[s] = (int64_t)ch.size();
    for (int64_t o = 0; o < seg_length[s]; o += kChunk)
      ch.push_back(chunk{seg_offset[s] + o, std::min(kChunk, seg_length[s] - o), s, seg_decay[s] != 0});
    count[s] = (int64_t)ch.size() - first[s];
    dec[s] = seg_decay[s] != 0;
  }
  pl->nchunk = (int64_t)ch.size();
  if (pl->nchunk > INT32_MAX) return bl_set_error(BL_EUNSUPPORTED, "%s: buffer too large", op);
  BL_CHECK(pl->chunks.alloc(op, dev, ch.size() * sizeof(chunk)));
  BL_CHECK(pl->seg_first.alloc(op, dev, first.size() * sizeof(int64_t)));
  BL_CHECK(pl->seg_count.alloc(op, dev, count.size() * sizeof(int64_t)));
  BL_CHECK(pl->seg_dec.alloc(op, dev, dec.size() * sizeof(int32_t)));
  BL_CHECK(pl->state.alloc(op, dev, sizeof(step_state)));
  BL_CHECK(pl->partial.alloc(op, dev, (size_t)(pl->nchunk ? pl->nchunk : 1) * sizeof(double)));
  cudaStream_t s = cu_stream(dev);
  // Pageable sources: cudaMemcpyAsync stages them before returning, so the vectors may die after.
  cu_cost_call(dev, "host copy", "cudaMemcpyAsync h2d", BL_ENGINE_PCIE, 0,
               (double)(ch.size() * sizeof(chunk) + nseg * (2 * sizeof(int64_t) + sizeof(int32_t))));
  if (!ch.empty()) CU_TRY(op, dev, cudaMemcpyAsync(pl->chunks.p, ch.data(), ch.size() * sizeof(chunk), cudaMemcpyHostToDevice, s));
  CU_TRY(op, dev, cudaMemcpyAsync(pl->seg_first.p, first.data(), first.size() * sizeof(int64_t), cudaMemcpyHostToDevice, s));
  CU_TRY(op, dev, cudaMemcpyAsync(pl->seg_count.p, count.data(), count.size() * sizeof(int64_t), cudaMemcpyHostToDevice, s));
  CU_TRY(op, dev, cudaMemcpyAsync(pl->seg_dec.p, dec.data(), dec.size() * sizeof(int32_t), cudaMemcpyHostToDevice, s));
  CU_TRY(op, dev, cudaStreamSynchronize(s));   // the table copies must complete before the host vectors go away
  if (pl->nchunk > 0) {
    cu_cost_kernel(dev, "optimizer", "sq_partial", 4.0 * n + 8.0 * pl->nchunk);
    sq_partial<<<(unsigned)pl->nchunk, kThreads, 0, s>>>(grad->data ? (const float *)grad->data : nullptr,
                                                         pl->chunks.as<chunk>(), grad_scale, pl->partial.as<double>());
    BL_CHECK(cu_launched(op, dev));
  }
  cu_cost_kernel(dev, "optimizer", "norm_final", 8.0 * pl->nchunk + sizeof(step_state));
  norm_final<<<1, kThreads, 0, s>>>(pl->partial.as<double>(), pl->nchunk, max_grad_norm, grad_scale,
                                    pl->state.as<step_state>());
  BL_CHECK(cu_launched(op, dev));
  adam_hyper &hp = pl->hp;
  hp.lr = (float)lr; hp.b1 = (float)beta1; hp.b2 = (float)beta2; hp.eps = (float)eps; hp.wd = (float)wd;
  hp.bc1 = (float)(1.0 - pow(beta1, (double)step));
  hp.bc2 = (float)(1.0 - pow(beta2, (double)step));
  return 0;
}

// Reads the step state back (one synchronisation): the norm, and the
// non-finite failure of the CPU contract.
int report(const char *op, int dev, const plan &pl, double *grad_norm, int *skipped) {
  step_state st;
  cu_cost_call(dev, "host copy", "cudaMemcpyAsync d2h", BL_ENGINE_PCIE, 0, sizeof st);
  CU_TRY(op, dev, cudaMemcpyAsync(&st, pl.state.p, sizeof st, cudaMemcpyDeviceToHost, cu_stream(dev)));
  CU_TRY(op, dev, cudaStreamSynchronize(cu_stream(dev)));
  if (grad_norm) *grad_norm = st.norm;
  if (skipped) *skipped = st.skip;
  if (st.skip)
    return bl_set_error(BL_EINVAL, "%s: non-finite gradient (global norm %g): step not applied, weights unchanged "
                        "(with fp16 use the dynamic loss scaler, which skips such steps)", op, st.norm);
  return 0;
}

}  // namespace

extern "C" int bl_cuda_lamb_step(bl_tensor *param, const bl_tensor *grad, bl_tensor *m, bl_tensor *v, const int64_t *seg_offset,
                                 const int64_t *seg_length, const uint8_t *seg_decay, int nseg, double lr, double beta1,
                                 double beta2, double eps, double weight_decay, int64_t step, double grad_scale,
                                 double max_grad_norm, int trust_all, double *grad_norm, int *skipped) {
  const char *op = "lamb";
  int dev;
  plan pl;
  BL_CHECK(prepare(op, &dev, param, grad, m, v, seg_offset, seg_length, seg_decay, nseg, lr, beta1, beta2, eps, weight_decay,
                   step, grad_scale, max_grad_norm, &pl));
  if (pl.nchunk > 0) {
    cudaStream_t s = cu_stream(dev);
    cu_mem pn, un, ratio;
    BL_CHECK(pn.alloc(op, dev, (size_t)pl.nchunk * sizeof(double)));
    BL_CHECK(un.alloc(op, dev, (size_t)pl.nchunk * sizeof(double)));
    BL_CHECK(ratio.alloc(op, dev, (size_t)nseg * sizeof(float)));
    const chunk *ch = pl.chunks.as<chunk>();
    const step_state *st = pl.state.as<step_state>();
    double n = (double)param->numel;
    cu_cost_kernel(dev, "optimizer", "lamb_moments", 24.0 * n + 16.0 * pl.nchunk);   // p, g, m, v in; m, v out
    lamb_moments<<<(unsigned)pl.nchunk, kThreads, 0, s>>>((const float *)param->data, (const float *)grad->data, (float *)m->data,
                                                          (float *)v->data, ch, pl.hp, st, pn.as<double>(), un.as<double>());
    BL_CHECK(cu_launched(op, dev));
    cu_cost_kernel(dev, "optimizer", "lamb_ratio", 16.0 * pl.nchunk + 4.0 * nseg);
    lamb_ratio<<<(unsigned)nseg, kThreads, 0, s>>>(pn.as<double>(), un.as<double>(), pl.seg_first.as<int64_t>(),
                                                   pl.seg_count.as<int64_t>(), pl.seg_dec.as<int32_t>(), trust_all, st,
                                                   ratio.as<float>());
    BL_CHECK(cu_launched(op, dev));
    cu_cost_kernel(dev, "optimizer", "lamb_apply", 16.0 * n + 4.0 * nseg);   // p, m, v in; p out
    lamb_apply<<<(unsigned)pl.nchunk, kThreads, 0, s>>>((float *)param->data, (const float *)m->data, (const float *)v->data, ch,
                                                        pl.hp, st, ratio.as<float>());
    BL_CHECK(cu_launched(op, dev));
  }
  return report(op, dev, pl, grad_norm, skipped);
}

extern "C" int bl_cuda_adamw_step(bl_tensor *param, const bl_tensor *grad, bl_tensor *m, bl_tensor *v, const int64_t *seg_offset,
                                  const int64_t *seg_length, const uint8_t *seg_decay, int nseg, double lr, double beta1,
                                  double beta2, double eps, double weight_decay, int64_t step, double grad_scale,
                                  double max_grad_norm, double *grad_norm, int *skipped) {
  const char *op = "adamw";
  int dev;
  plan pl;
  BL_CHECK(prepare(op, &dev, param, grad, m, v, seg_offset, seg_length, seg_decay, nseg, lr, beta1, beta2, eps, weight_decay,
                   step, grad_scale, max_grad_norm, &pl));
  if (pl.nchunk > 0) {
    cu_cost_kernel(dev, "optimizer", "adamw_apply", 28.0 * param->numel);   // p, g, m, v in; p, m, v out
    adamw_apply<<<(unsigned)pl.nchunk, kThreads, 0, cu_stream(dev)>>>((float *)param->data, (const float *)grad->data,
                                                                       (float *)m->data, (float *)v->data,
                                                                       pl.chunks.as<chunk>(), pl.hp, pl.state.as<step_state>());
    BL_CHECK(cu_launched(op, dev));
  }
  return report(op, dev, pl, grad_norm, skipped);
}

extern "C" int bl_cuda_unscale_check(bl_tensor *grad, double inv_scale, int *found_inf) {
  const char *op = "unscale";
  if (!found_inf) return bl_set_error(BL_EINVAL, "%s: found_inf must not be NULL", op);
  int dev;
  const bl_tensor *ts[] = {grad};
  BL_CHECK(cu_device(op, 1, ts, &dev));
  if (!bl_dtype_is_float(grad->dtype)) return bl_set_error(BL_EINVAL, "%s: gradients must be a float tensor", op);
  cu_mem flag;
  BL_CHECK(flag.alloc(op, dev, sizeof(int)));
  cu_cost_call(dev, "memset", "cudaMemsetAsync", BL_ENGINE_MEM, 0, sizeof(int));
  CU_TRY(op, dev, cudaMemsetAsync(flag.p, 0, sizeof(int), cu_stream(dev)));
  if (grad->numel > 0) {
    cu_buf b;
    BL_CHECK(cu_out(op, grad, &b, 1));
    cu_cost_kernel(dev, "optimizer", "unscale_kernel", 8.0 * grad->numel);
    unscale_kernel<<<cu_blocks(grad->numel, 256, 4096), 256, 0, cu_stream(dev)>>>(b.p, grad->numel, (float)inv_scale, flag.as<int>());
    BL_CHECK(cu_launched(op, dev));
    BL_CHECK(cu_store(op, grad, &b));
  }
  int h = 0;
  cu_cost_call(dev, "host copy", "cudaMemcpyAsync d2h", BL_ENGINE_PCIE, 0, sizeof h);
  CU_TRY(op, dev, cudaMemcpyAsync(&h, flag.p, sizeof h, cudaMemcpyDeviceToHost, cu_stream(dev)));
  CU_TRY(op, dev, cudaStreamSynchronize(cu_stream(dev)));
  *found_inf = h;
  return 0;
}
