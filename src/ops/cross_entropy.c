/* Fused cross-entropy (loss and dlogits in one pass) and MSE (contract in
 * bl_ops.h). Log-sum-exp is taken around the row max for stability; the
 * per-row losses are summed in row order in double so the loss does not
 * depend on the thread count. All targets are validated before writing.
 * The row pass (max, exp, sum, scale) is vectorised: vm_exp instead of
 * libm's expf, and the exp sum in 16 lane accumulators combined in a fixed
 * order (also more accurate than one running f32 sum over 30k classes). */
#include "ops_internal.h"
#include "bl_ops.h"
#include "device/dispatch.h"
#include "base/vecmath.h"
#include <math.h>
#include <stdlib.h>

static void store_scalar(bl_tensor *t, double v) {
  switch (t->dtype) {
    case BL_F32: *(float *)t->data = (float)v; break;
    case BL_F64: *(double *)t->data = v; break;
    case BL_F16: *(uint16_t *)t->data = opx_f2h((float)v); break;
    case BL_BF16: *(uint16_t *)t->data = opx_f2bf((float)v); break;
    default: break;
  }
}

static int check_loss(const char *op, const bl_tensor *loss) {
  BL_CHECK(opx_check_float(op, loss, "loss"));
  if (loss->numel != 1) return BL_ERR("%s: loss must have one element, got %s", op, OPX_SHAPE(loss));
  return 0;
}

/* Row max and sum of exp(x - max); dr (when not NULL) receives exp(x - max). */
OPX_BODY ce_row_body(int64_t c, const float *restrict x, float *restrict dr, float *mx_out, float *sum_out) {
  float mx = vm_row_max(c, x);
  float acc[16] = { 0 }, sum = 0.0f;
  int64_t j = 0;
  if (dr) {
    for (; j + 16 <= c; j += 16) {
#pragma omp simd
      for (int l = 0; l < 16; l++) {
        float e = vm_exp(x[j + l] - mx);
        dr[j + l] = e;
        acc[l] += e;
      }
    }
    for (; j < c; j++) {
      float e = vm_exp(x[j] - mx);
      dr[j] = e;
      sum += e;
    }
  } else {
    for (; j + 16 <= c; j += 16) {
#pragma omp simd
      for (int l = 0; l < 16; l++) acc[l] += vm_exp(x[j + l] - mx);
    }
    for (; j < c; j++) sum += vm_exp(x[j] - mx);
  }
  for (int l = 0; l < 16; l++) sum += acc[l];
  *mx_out = mx;
  *sum_out = sum;
}
OPX_ISA_FN(ce_row, (int64_t c, const float *restrict x, float *restrict dr, float *mx_out, float *sum_out),
           (c, x, dr, mx_out, sum_out))

/* correct (optional): the rows whose argmax is their target, decided from the row max of the same pass */
static int ce_cpu(bl_tensor *loss, bl_tensor *dlogits, const bl_tensor *logits, const bl_tensor *targets,
                  int64_t ignore_index, double grad_scale, int64_t *count, int64_t *correct) {
  const char *op = "cross_entropy";
  int64_t n = opx_rows(logits), c = opx_cols(logits), cnt = 0;
  int64_t *t = NULL;
  double *rl = NULL;
  opx_buf bx = { 0 }, bd = { 0 };
  int rc = opx_load_ids(op, targets, &t);
  if (rc) return rc;
  for (int64_t i = 0; i < n; i++) {
    if (t[i] == ignore_index) continue;
    if (t[i] < 0 || t[i] >= c) {
      rc = BL_ERR("%s: target %lld at row %lld is out of range for %lld classes (ignore_index %lld)", op,
                  (long long)t[i], (long long)i, (long long)c, (long long)ignore_index);
      goto done;
    }
    cnt++;
  }
  rl = malloc((size_t)(n ? n : 1) * sizeof(double));
  if (!rl) {
    rc = bl_set_error(BL_ENOMEM, "%s: out of memory", op);
    goto done;
  }
  if ((rc = opx_load(op, logits, &bx)) || (dlogits && (rc = opx_out(op, dlogits, &bd, 0)))) goto done;
  const float g = cnt ? (float)(grad_scale / (double)cnt) : 0.0f;
  int64_t ok = 0;
#pragma omp parallel for schedule(static) reduction(+ : ok) if (n * c > 16384)
  for (int64_t i = 0; i < n; i++) {
    const float *x = bx.p + i * c;
    float *dr = bd.p ? bd.p + i * c : NULL;
    if (t[i] == ignore_index) {
      rl[i] = 0.0;
      if (dr) memset(dr, 0, (size_t)c * sizeof(float));
      continue;
    }
    float mx, sum;
    ce_row(c, x, dr, &mx, &sum);
    rl[i] = (double)mx + log((double)sum) - (double)x[t[i]];
    if (correct) ok += opx_is_argmax(c, x, t[i], mx, sum);
    if (dr) {
      opx_scale_row(c, dr, g / sum);
      dr[t[i]] -= g;
    }
  }
  double total = 0.0;
  for (int64_t i = 0; i < n; i++) total += rl[i];
  store_scalar(loss, cnt ? total / (double)cnt : 0.0);
  if (dlogits) opx_store(dlogits, &bd);
  if (count) *count = cnt;
  if (correct) *correct = ok;
done:
  free(t);
  free(rl);
  opx_free(&bx);
  opx_free(&bd);
  return rc;
}

/* The argument checks of both entry points; *dev = the tensors' device. */
static int ce_args(const char *op, const bl_tensor *loss, const bl_tensor *dlogits, const bl_tensor *logits,
                   const bl_tensor *targets, int *dev) {
  BL_CHECK(check_loss(op, loss));
  BL_CHECK(opx_check_float(op, logits, "logits"));
  BL_CHECK(opx_check_index(op, targets, "targets"));
  if (logits->ndim < 1 || opx_cols(logits) < 1)
    return BL_ERR("%s: logits %s need a non-empty class dim", op, OPX_SHAPE(logits));
  if (targets->numel != opx_rows(logits))
    return BL_ERR("%s: logits %s and targets %s are not compatible", op, OPX_SHAPE(logits), OPX_SHAPE(targets));
  if (dlogits) {
    BL_CHECK(opx_check_float(op, dlogits, "grad_logits"));
    if (!opx_same_shape(dlogits, logits))
      return BL_ERR("%s: grad_logits %s does not match logits %s", op, OPX_SHAPE(dlogits), OPX_SHAPE(logits));
  }
  const bl_tensor *ts[] = { loss, dlogits, logits, targets };
  return opx_device(op, 4, ts, dev);
}

int bl_cross_entropy(bl_tensor *loss, bl_tensor *dlogits, const bl_tensor *logits, const bl_tensor *targets,
                     int64_t ignore_index, double grad_scale, int64_t *count) {
  const char *op = "cross_entropy";
  int dev;
  BL_CHECK(ce_args(op, loss, dlogits, logits, targets, &dev));
  if (dev >= 0)
    return BL_ON_CUDA(op, dev, bl_cuda_cross_entropy(loss, dlogits, logits, targets, ignore_index, grad_scale, count));
  return ce_cpu(loss, dlogits, logits, targets, ignore_index, grad_scale, count, NULL);
}

/* the CPU cross-entropy with the caller's count checked; correct as ce_cpu's */
static int ce_counted_cpu(bl_tensor *loss, bl_tensor *dlogits, const bl_tensor *logits, const bl_tensor *targets,
                          int64_t ignore_index, double grad_scale, int64_t count, int64_t *counted, int64_t *correct) {
  const char *op = "cross_entropy";
  BL_CHECK(ce_cpu(loss, dlogits, logits, targets, ignore_index, grad_scale, counted, correct));
  if (count >= 0 && *counted != count)
    return BL_ERR("%s: %lld targets are counted (not ignore_index %lld), the caller said %lld", op, (long long)*counted,
                  (long long)ignore_index, (long long)count);
  return 0;
}

int bl_cross_entropy_counted(bl_tensor *loss, bl_tensor *dlogits, const bl_tensor *logits, const bl_tensor *targets,
                             int64_t ignore_index, double grad_scale, int64_t count) {
  const char *op = "cross_entropy";
  int dev;
  BL_CHECK(ce_args(op, loss, dlogits, logits, targets, &dev));
  if (dev >= 0)
    return BL_ON_CUDA(op, dev,
                      bl_cuda_cross_entropy_counted(loss, dlogits, logits, targets, ignore_index, grad_scale, count));
  int64_t n = 0;
  return ce_counted_cpu(loss, dlogits, logits, targets, ignore_index, grad_scale, count, &n, NULL);
}

int bl_cross_entropy_accuracy(bl_tensor *loss, bl_tensor *dlogits, bl_tensor *acc, const bl_tensor *logits,
                              const bl_tensor *targets, int64_t ignore_index, double grad_scale, int64_t count) {
  const char *op = "cross_entropy";
  int dev;
  BL_CHECK(ce_args(op, loss, dlogits, logits, targets, &dev));
  BL_CHECK(opx_check_counts(op, acc, logits));
  if (dev >= 0) {
    BL_CHECK(bl_cross_entropy_counted(loss, dlogits, logits, targets, ignore_index, grad_scale, count));
    return bl_accuracy_add(acc, logits, targets, ignore_index);
  }
  int64_t n = 0, ok = 0;
  BL_CHECK(ce_counted_cpu(loss, dlogits, logits, targets, ignore_index, grad_scale, count, &n, &ok));
  int64_t *a = acc->data;
  a[0] += ok;
  a[1] += n;
  return 0;
}

static int mse_cpu(bl_tensor *loss, bl_tensor *dpred, const bl_tensor *pred, const bl_tensor *target,
                   double grad_scale) {
  const char *op = "mse_loss";
  opx_buf bp = { 0 }, bt = { 0 }, bd = { 0 };
  int rc;
  if ((rc = opx_load(op, pred, &bp)) || (rc = opx_load(op, target, &bt)) ||
      (dpred && (rc = opx_out(op, dpred, &bd, 0))))
    goto done;
  int64_t n = pred->numel;
  double total = 0.0;
  float g = n ? (float)(2.0 * grad_scale / (double)n) : 0.0f;
  for (int64_t i = 0; i < n; i++) {
    double e = (double)bp.p[i] - (double)bt.p[i];
    total += e * e;
    if (bd.p) bd.p[i] = g * (bp.p[i] - bt.p[i]);
  }
  store_scalar(loss, n ? total / (double)n : 0.0);
  if (dpred) opx_store(dpred, &bd);
done:
  opx_free(&bp);
  opx_free(&bt);
  opx_free(&bd);
  return rc;
}

int bl_mse_loss(bl_tensor *loss, bl_tensor *dpred, const bl_tensor *pred, const bl_tensor *target, double grad_scale) {
  const char *op = "mse_loss";
  BL_CHECK(check_loss(op, loss));
  BL_CHECK(opx_check_float(op, pred, "prediction"));
  BL_CHECK(opx_check_float(op, target, "target"));
  if (pred->numel != target->numel)
    return BL_ERR("%s: prediction %s and target %s are not compatible", op, OPX_SHAPE(pred), OPX_SHAPE(target));
  if (dpred) {
    BL_CHECK(opx_check_float(op, dpred, "grad_prediction"));
    if (!opx_same_shape(dpred, pred))
      return BL_ERR("%s: grad_prediction %s does not match prediction %s", op, OPX_SHAPE(dpred), OPX_SHAPE(pred));
  }
  int dev;
  const bl_tensor *ts[] = { loss, dpred, pred, target };
  BL_CHECK(opx_device(op, 4, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_mse_loss(loss, dpred, pred, target, grad_scale));
  return mse_cpu(loss, dpred, pred, target, grad_scale);
}
