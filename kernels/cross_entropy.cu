// Losses (contracts in bl_ops.h; CPU twin src/ops/cross_entropy.c): fused
// cross-entropy (loss and dlogits in one pass over the logits, ignore_index)
// and MSE.
//
// Cross-entropy: (1) ce_check validates targets and counts the counted rows
// (integer atomics: exact), one synchronisation reads {first bad row, count}
// back — needed anyway because grad_scale/count scales dlogits and `count` is
// a host output (bl_cross_entropy_counted with deferred checks skips this:
// the caller knows the count, kernels/deferred.cu checks the targets late);
// (2) ce_rows, one block per row, logits and dlogits in their
// own dtype (f32, bf16, f16; 16-byte vectors when a row is whole vectors), f32
// in registers: ONE read of the row for the max and the sum of exp together
// (online: a thread rescales its running sum when its max grows, the block
// combines (max, sum) pairs in a fixed tree), row loss = mx + log(sum) - x[t]
// in double, then, only when dlogits is wanted, a second read of the row that
// writes dlogits = softmax * g - g*onehot; (3) sum_rows adds the row losses in
// double in one block with a fixed partition (deterministic) and writes the
// mean over the counted rows. Other dtype pairs go through f32 images.
#include "common.cuh"

namespace {

__global__ void ce_check(const int64_t *t, int64_t n, int64_t c, int64_t ignore, unsigned long long *res) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    if (t[i] == ignore) continue;
    if (t[i] < 0 || t[i] >= c)
      atomicMin(&res[0], (unsigned long long)i);
    else
      atomicAdd(&res[1], 1ull);
  }
}

__global__ void init2(unsigned long long *res) {
  res[0] = ~0ull;
  res[1] = 0;
}

// *cnt += the targets not equal to ignore (integer atomics: exact in any order)
__global__ void ce_count(const int64_t *t, int64_t n, int64_t ignore, unsigned long long *cnt) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    if (t[i] != ignore) atomicAdd(cnt, 1ull);
}

// (m, s) <- the pair for the union of (m, s) and (m2, s2), s a sum of exp(x - m); an empty side has m = -inf.
__device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2) {
  const float mm = fmaxf(m, m2);
  if (mm == -INFINITY) return; // both empty
  s = (m == -INFINITY ? 0.0f : s * expf(m - mm)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mm));
  m = mm;
}

// Block-wide (max, sum) in a fixed order; sm, ss have 32 floats. Uniform control flow only.
__device__ __forceinline__ void lse_block(float &m, float &s, float *sm, float *ss) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    lse_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads(); // sm/ss may still be read by the previous row
  if (lane == 0) {
    sm[w] = m;
    ss[w] = s;
  }
  __syncthreads();
  m = lane < nw ? sm[lane] : -INFINITY;
  s = lane < nw ? ss[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    lse_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
}

// The gradient's multiplier grad_scale / count: the host's, or made from a count the device keeps (cnt).
struct ce_mul {
  float g;
  const unsigned long long *cnt;
  double grad_scale;
  __device__ __forceinline__ float get() const {
    if (!cnt) return g;
    const unsigned long long k = *cnt;
    return k ? (float)(grad_scale / (double)k) : 0.0f;
  }
};

// One block per row; a thread takes vectors of V elements j = (threadIdx.x + k blockDim.x) V; c % V == 0.
template <class T, int V>
__global__ void ce_rows(const T *x, const int64_t *t, T *dlogits, double *rl, int64_t n, int64_t c, int64_t ignore,
                        ce_mul mul) {
  __shared__ float sm[32], ss[32];
  const float g = mul.get();
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const T *xr = x + i * c;
    T *dr = dlogits ? dlogits + i * c : nullptr;
    const int64_t ti = t[i];
    if (ti == ignore) { // uniform per block
      if (threadIdx.x == 0) rl[i] = 0.0;
      if (dr)
        for (int64_t j = threadIdx.x; j < c; j += blockDim.x) from_f(0.0f, &dr[j]);
      continue;
    }
    float mx = -INFINITY, sum = 0.0f;
    for (int64_t j = threadIdx.x * (int64_t)V; j < c; j += blockDim.x * (int64_t)V) {
      cu_vec<T, V> v;
      v.load(xr + j);
#pragma unroll
      for (int e = 0; e < V; e++) {
        const float xe = to_f(v.t[e]);
        if (xe > mx) {
          sum = (mx == -INFINITY ? 0.0f : sum * expf(mx - xe)) + 1.0f;
          mx = xe;
        } else
          sum += expf(xe - mx);
      }
    }
    lse_block(mx, sum, sm, ss);
    if (threadIdx.x == 0) rl[i] = (double)mx + log((double)sum) - (double)to_f(xr[ti]);
    if (!dr) continue;
    const float sc = g / sum;
    for (int64_t j = threadIdx.x * (int64_t)V; j < c; j += blockDim.x * (int64_t)V) {
      cu_vec<T, V> v;
      v.load(xr + j);
#pragma unroll
      for (int e = 0; e < V; e++) {
        const float p = expf(to_f(v.t[e]) - mx) * sc;
        from_f(j + e == ti ? p - g : p, &v.t[e]);
      }
      v.store(dr + j);
    }
  }
}

// out[0] = sum(v[0..n)) * mul, one block of 256 threads, fixed partition. With cnt (a count on the device), mul is
// 1 / *cnt, and 0 rows are summed when it is 0.
__global__ void sum_rows(const double *v, int64_t n, double mul, const unsigned long long *cnt, double *out) {
  __shared__ double sh[32];
  if (cnt) {
    const unsigned long long k = *cnt;
    n = k ? n : 0;
    mul = k ? 1.0 / (double)k : 0.0;
  }
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += v[i];
  acc = cu_block_sum_d(acc, sh);
  if (threadIdx.x == 0) out[0] = acc * mul;
}

__global__ void mse_rows(const float *p, const float *t, float *dp, double *e2, int64_t n, float g) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    double e = (double)p[i] - (double)t[i];
    e2[i] = e * e;
    if (dp) dp[i] = g * (p[i] - t[i]);
  }
}

int threads_for(int64_t n) {
  int t = 32;
  while (t < 256 && t < n) t <<= 1;
  return t;
}

// ce_rows over rows of c elements of T at x (dlogits: same dtype, may be NULL), 16-byte vectors when rows allow.
template <class T>
int launch_rows(const char *op, int dev, const void *x, const int64_t *t, void *dl, double *rl, int64_t n, int64_t c,
                int64_t ignore, ce_mul g, double bytes) {
  constexpr int V = 16 / sizeof(T);
  const bool vec = c % V == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)dl % 16 == 0;
  const unsigned grid = cu_blocks(n, 1, 1 << 20);
  cudaStream_t s = cu_stream(dev);
  cu_cost_kernel(dev, "loss", "ce_rows", bytes);
  if (vec)
    ce_rows<T, V><<<grid, threads_for(c / V), 0, s>>>((const T *)x, t, (T *)dl, rl, n, c, ignore, g);
  else
    ce_rows<T, 1><<<grid, threads_for(c), 0, s>>>((const T *)x, t, (T *)dl, rl, n, c, ignore, g);
  return cu_launched(op, dev);
}

int write_scalar(const char *op, bl_tensor *loss, const double *dv) {
  return cu_copy_from_contig(op, loss, dv, BL_F64);
}

} // namespace

namespace {

// Targets in range (else the error naming the first bad row) and *cnt = the counted ones, read back (one wait);
// given >= 0 must equal that count.
int check_targets(const char *op, int dev, cu_mem *t, int64_t n, int64_t c, int64_t ignore_index, int64_t given,
                  int64_t *cnt) {
  cu_mem res;
  BL_CHECK(res.alloc(op, dev, 2 * sizeof(unsigned long long)));
  cu_cost_kernel(dev, "index check", "init2", 16);
  init2<<<1, 1, 0, cu_stream(dev)>>>(res.as<unsigned long long>());
  BL_CHECK(cu_launched(op, dev));
  if (n > 0) {
    cu_cost_kernel(dev, "index check", "ce_check", 8.0 * n);
    ce_check<<<cu_blocks(n, 256), 256, 0, cu_stream(dev)>>>(t->as<int64_t>(), n, c, ignore_index,
                                                            res.as<unsigned long long>());
    BL_CHECK(cu_launched(op, dev));
  }
  int64_t h[2];
  BL_CHECK(cu_read_i64(op, dev, res.as<int64_t>(), h, 2));
  if (h[0] != -1) {
    int64_t v = 0;
    BL_CHECK(cu_read_i64(op, dev, t->as<int64_t>() + h[0], &v, 1));
    return bl_set_error(BL_EINVAL, "%s: target %lld at row %lld is out of range for %lld classes (ignore_index %lld)",
                        op, (long long)v, (long long)h[0], (long long)c, (long long)ignore_index);
  }
  if (given >= 0 && h[1] != given)
    return bl_set_error(BL_EINVAL, "%s: %lld targets are counted (not ignore_index %lld), the caller said %lld", op,
                        (long long)h[1], (long long)ignore_index, (long long)given);
  *cnt = h[1];
  return 0;
}

// given >= 0: the caller's count of counted targets; with deferred checks nothing is read back (bad targets become
// ignored rows and are reported by bl_cuda_check_deferred), otherwise the device's count must equal it.
int ce_run(bl_tensor *loss, bl_tensor *dlogits, const bl_tensor *logits, const bl_tensor *targets, int64_t ignore_index,
           double grad_scale, int64_t given, int64_t *count) {
  const char *op = "cross_entropy";
  int dev;
  const bl_tensor *ts[] = { loss, dlogits, logits, targets };
  BL_CHECK(cu_device(op, 4, ts, &dev));
  if (logits->ndim < 1 || logits->shape[logits->ndim - 1] < 1)
    return bl_set_error(BL_EINVAL, "%s: logits need a non-empty class dim", op);
  int64_t c = logits->shape[logits->ndim - 1], n = logits->numel / c;
  if (targets->numel != n || loss->numel != 1 || (dlogits && dlogits->numel != logits->numel))
    return bl_set_error(BL_EINVAL, "%s: logits, targets, loss and grad_logits are not compatible", op);
  cu_mem t, rl, tot, dcnt;
  BL_CHECK(cu_load_ids(op, targets, &t));
  int64_t cnt = given;
  // not given, and nothing may be read back: the device counts (a CUDA graph replays this with new targets)
  const bool count_here = given < 0 && !count && cu_checks_deferred(dev);
  if ((given >= 0 || count_here) && cu_checks_deferred(dev))
    BL_CHECK(cu_defer_ids(op, dev, t.as<int64_t>(), n, c, 1, ignore_index, ignore_index, "target", "classes"));
  else
    BL_CHECK(check_targets(op, dev, &t, n, c, ignore_index, given, &cnt));
  ce_mul g = { cnt ? (float)(grad_scale / (double)cnt) : 0.0f, nullptr, grad_scale };
  if (count_here) {
    BL_CHECK(dcnt.alloc(op, dev, 2 * sizeof(unsigned long long)));
    unsigned long long *res = dcnt.as<unsigned long long>();
    cu_cost_kernel(dev, "loss", "init2", 16);
    init2<<<1, 1, 0, cu_stream(dev)>>>(res);
    BL_CHECK(cu_launched(op, dev));
    if (n > 0) {
      cu_cost_kernel(dev, "loss", "ce_count", 8.0 * n);
      ce_count<<<cu_blocks(n, 256), 256, 0, cu_stream(dev)>>>(t.as<int64_t>(), n, ignore_index, res + 1);
      BL_CHECK(cu_launched(op, dev));
    }
    g.cnt = res + 1;
    cnt = 1; // a placeholder: the kernels read the count
  }
  BL_CHECK(rl.alloc(op, dev, (size_t)n * sizeof(double)));
  BL_CHECK(tot.alloc(op, dev, sizeof(double)));
  cu_buf bx, bd;
  if (n > 0) {
    const bool native = (logits->dtype == BL_F32 || logits->dtype == BL_BF16 || logits->dtype == BL_F16) &&
                        cu_is_contig(logits) &&
                        (!dlogits || (dlogits->dtype == logits->dtype && cu_is_contig(dlogits)));
    // the row read once for the loss and once more for dlogits, dlogits written once
    const double es = (double)bl_dtype_size(native ? logits->dtype : BL_F32);
    const double bytes = es * (double)n * c * (dlogits ? 3 : 1) + 16.0 * n;
    const int64_t *ti = t.as<int64_t>();
    double *r = rl.as<double>();
    if (native && logits->dtype == BL_BF16) {
      BL_CHECK(launch_rows<__nv_bfloat16>(op, dev, logits->data, ti, dlogits ? dlogits->data : nullptr, r, n, c,
                                          ignore_index, g, bytes));
    } else if (native && logits->dtype == BL_F16) {
      BL_CHECK(launch_rows<__half>(op, dev, logits->data, ti, dlogits ? dlogits->data : nullptr, r, n, c, ignore_index,
                                   g, bytes));
    } else if (native) {
      BL_CHECK(launch_rows<float>(op, dev, logits->data, ti, dlogits ? dlogits->data : nullptr, r, n, c, ignore_index,
                                  g, bytes));
    } else {
      BL_CHECK(cu_load(op, logits, &bx));
      if (dlogits) BL_CHECK(cu_out(op, dlogits, &bd, 0));
      BL_CHECK(launch_rows<float>(op, dev, bx.p, ti, dlogits ? bd.p : nullptr, r, n, c, ignore_index, g, bytes));
    }
  }
  cu_cost_kernel(dev, "loss", "sum_rows", 8.0 * n + 8);
  sum_rows<<<1, 256, 0, cu_stream(dev)>>>(rl.as<double>(), cnt ? n : 0, cnt ? 1.0 / (double)cnt : 0.0, g.cnt,
                                          tot.as<double>());
  BL_CHECK(cu_launched(op, dev));
  BL_CHECK(write_scalar(op, loss, tot.as<double>()));
  if (dlogits && n > 0) BL_CHECK(cu_store(op, dlogits, &bd));
  if (count) *count = cnt;
  return 0;
}

} // namespace

extern "C" int bl_cuda_cross_entropy(bl_tensor *loss, bl_tensor *dlogits, const bl_tensor *logits,
                                     const bl_tensor *targets, int64_t ignore_index, double grad_scale,
                                     int64_t *count) {
  return ce_run(loss, dlogits, logits, targets, ignore_index, grad_scale, -1, count);
}

extern "C" int bl_cuda_cross_entropy_counted(bl_tensor *loss, bl_tensor *dlogits, const bl_tensor *logits,
                                             const bl_tensor *targets, int64_t ignore_index, double grad_scale,
                                             int64_t count) {
  return ce_run(loss, dlogits, logits, targets, ignore_index, grad_scale, count, nullptr);
}

extern "C" int bl_cuda_mse_loss(bl_tensor *loss, bl_tensor *dpred, const bl_tensor *pred, const bl_tensor *target,
                                double grad_scale) {
  const char *op = "mse_loss";
  int dev;
  const bl_tensor *ts[] = { loss, dpred, pred, target };
  BL_CHECK(cu_device(op, 4, ts, &dev));
  int64_t n = pred->numel;
  if (target->numel != n || loss->numel != 1 || (dpred && dpred->numel != n))
    return bl_set_error(BL_EINVAL, "%s: prediction, target, loss and grad are not compatible", op);
  cu_mem e2, tot;
  BL_CHECK(e2.alloc(op, dev, (size_t)n * sizeof(double)));
  BL_CHECK(tot.alloc(op, dev, sizeof(double)));
  cu_buf bp, bt, bd;
  if (n > 0) {
    BL_CHECK(cu_load(op, pred, &bp));
    BL_CHECK(cu_load(op, target, &bt));
    if (dpred) BL_CHECK(cu_out(op, dpred, &bd, 0));
    cu_cost_kernel(dev, "loss", "mse_rows", 4.0 * n * (dpred ? 3 : 2) + 8.0 * n);
    mse_rows<<<cu_blocks(n, 256), 256, 0, cu_stream(dev)>>>(bp.p, bt.p, dpred ? bd.p : nullptr, e2.as<double>(), n,
                                                            (float)(2.0 * grad_scale / (double)n));
    BL_CHECK(cu_launched(op, dev));
  }
  cu_cost_kernel(dev, "loss", "sum_rows", 8.0 * n + 8);
  sum_rows<<<1, 256, 0, cu_stream(dev)>>>(e2.as<double>(), n, n ? 1.0 / (double)n : 0.0, nullptr, tot.as<double>());
  BL_CHECK(cu_launched(op, dev));
  BL_CHECK(write_scalar(op, loss, tot.as<double>()));
  if (dpred && n > 0) BL_CHECK(cu_store(op, dpred, &bd));
  return 0;
}
