// Losses (contracts in bl_ops.h; CPU twin src/ops/cross_entropy.c): fused
// cross-entropy (loss and dlogits in one pass over the logits, ignore_index)
// and MSE.
//
// Cross-entropy: (1) ce_check validates targets and counts the counted rows
// (integer atomics: exact), one synchronisation reads {first bad row, count}
// back — needed anyway because grad_scale/count scales dlogits and `count` is
// a host output (bl_cross_entropy_counted with deferred checks skips this:
// the caller knows the count, kernels/deferred.cu checks the targets late);
// (2) ce_rows, one block per row: max, sum of exp (block tree),
// row loss = mx + log(sum) - x[t] in double, dlogits = softmax * g - g*onehot;
// (3) sum_rows adds the row losses in double in one block with a fixed
// partition (deterministic) and writes mean over the counted rows.
#include "common.cuh"

namespace {

__global__ void ce_check(const int64_t *t, int64_t n, int64_t c, int64_t ignore, unsigned long long *res) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    if (t[i] == ignore) continue;
    if (t[i] < 0 || t[i] >= c) atomicMin(&res[0], (unsigned long long)i);
    else atomicAdd(&res[1], 1ull);
  }
}

__global__ void init2(unsigned long long *res) { res[0] = ~0ull; res[1] = 0; }

__global__ void ce_rows(const float *x, const int64_t *t, float *dlogits, double *rl, int64_t n, int64_t c, int64_t ignore,
                        float g) {
  __shared__ float sh[32];
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const float *xr = x + i * c;
    float *dr = dlogits ? dlogits + i * c : nullptr;
    const int64_t ti = t[i];
    if (ti == ignore) {   // uniform per block
      if (threadIdx.x == 0) rl[i] = 0.0;
      if (dr) for (int64_t j = threadIdx.x; j < c; j += blockDim.x) dr[j] = 0.0f;
      continue;
    }
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) mx = xr[j] > mx ? xr[j] : mx;
    mx = cu_block_max(mx, sh);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) sum += expf(xr[j] - mx);
    sum = cu_block_sum(sum, sh);
    if (threadIdx.x == 0) rl[i] = (double)mx + log((double)sum) - (double)xr[ti];
    if (dr) {
      const float s = g / sum;
      for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
        float v = expf(xr[j] - mx) * s;
        dr[j] = j == ti ? v - g : v;
      }
    }
  }
}

// out[0] = sum(v[0..n)) * mul, one block of 256 threads, fixed partition.
__global__ void sum_rows(const double *v, int64_t n, double mul, double *out) {
  __shared__ double sh[32];
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

int write_scalar(const char *op, bl_tensor *loss, const double *dv) {
  return cu_copy_from_contig(op, loss, dv, BL_F64);
}

}  // namespace

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
    return bl_set_error(BL_EINVAL, "%s: target %lld at row %lld is out of range for %lld classes (ignore_index %lld)", op,
                        (long long)v, (long long)h[0], (long long)c, (long long)ignore_index);
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
  const bl_tensor *ts[] = {loss, dlogits, logits, targets};
  BL_CHECK(cu_device(op, 4, ts, &dev));
  if (logits->ndim < 1 || logits->shape[logits->ndim - 1] < 1)
    return bl_set_error(BL_EINVAL, "%s: logits need a non-empty class dim", op);
  int64_t c = logits->shape[logits->ndim - 1], n = logits->numel / c;
  if (targets->numel != n || loss->numel != 1 || (dlogits && dlogits->numel != logits->numel))
    return bl_set_error(BL_EINVAL, "%s: logits, targets, loss and grad_logits are not compatible", op);
  cu_mem t, rl, tot;
  BL_CHECK(cu_load_ids(op, targets, &t));
  int64_t cnt = given;
  if (given >= 0 && cu_checks_deferred(dev))
    BL_CHECK(cu_defer_ids(op, dev, t.as<int64_t>(), n, c, 1, ignore_index, ignore_index, "target", "classes"));
  else
    BL_CHECK(check_targets(op, dev, &t, n, c, ignore_index, given, &cnt));
  const float g = cnt ? (float)(grad_scale / (double)cnt) : 0.0f;
  BL_CHECK(rl.alloc(op, dev, (size_t)n * sizeof(double)));
  BL_CHECK(tot.alloc(op, dev, sizeof(double)));
  cu_buf bx, bd;
  if (n > 0) {
    BL_CHECK(cu_load(op, logits, &bx));
    if (dlogits) BL_CHECK(cu_out(op, dlogits, &bd, 0));
    cu_cost_kernel(dev, "loss", "ce_rows", 4.0 * (double)n * c * (dlogits ? 2 : 1) + 16.0 * n);
    ce_rows<<<cu_blocks(n, 1, 1 << 20), threads_for(c), 0, cu_stream(dev)>>>(bx.p, t.as<int64_t>(), dlogits ? bd.p : nullptr,
                                                                             rl.as<double>(), n, c, ignore_index, g);
    BL_CHECK(cu_launched(op, dev));
  }
  cu_cost_kernel(dev, "loss", "sum_rows", 8.0 * n + 8);
  sum_rows<<<1, 256, 0, cu_stream(dev)>>>(rl.as<double>(), cnt ? n : 0, cnt ? 1.0 / (double)cnt : 0.0, tot.as<double>());
  BL_CHECK(cu_launched(op, dev));
  BL_CHECK(write_scalar(op, loss, tot.as<double>()));
  if (dlogits && n > 0) BL_CHECK(cu_store(op, dlogits, &bd));
  if (count) *count = cnt;
  return 0;
}

}  // namespace

extern "C" int bl_cuda_cross_entropy(bl_tensor *loss, bl_tensor *dlogits, const bl_tensor *logits,
                                     const bl_tensor *targets, int64_t ignore_index, double grad_scale, int64_t *count) {
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
  const bl_tensor *ts[] = {loss, dpred, pred, target};
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
  sum_rows<<<1, 256, 0, cu_stream(dev)>>>(e2.as<double>(), n, n ? 1.0 / (double)n : 0.0, tot.as<double>());
  BL_CHECK(cu_launched(op, dev));
  BL_CHECK(write_scalar(op, loss, tot.as<double>()));
  if (dpred && n > 0) BL_CHECK(cu_store(op, dpred, &bd));
  return 0;
}
