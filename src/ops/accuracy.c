/* argmax over the last dim and classification accuracy with an ignored
 * target value (contract in bl_ops.h). Ties go to the first maximum, as in
 * PyTorch's CPU argmax; NaN counts as the maximum so it is not hidden. */
#include "ops_internal.h"
#include "device/dispatch.h"
#include "base/vecmath.h"
#include <math.h>
#include <stdlib.h>

/* The first j < c with x[j] == v (or x[j] NaN when nan), c when none: vector blocks of 16 until one holds
 * it, then the elements of that block. */
OPX_BODY first_hit_body(int64_t c, const float *restrict x, float v, int nan, int64_t *out) {
  int64_t j = 0;
  for (; j + 16 <= c; j += 16) {
    int hit = 0;
#pragma omp simd reduction(| : hit)
    for (int l = 0; l < 16; l++) hit |= nan ? x[j + l] != x[j + l] : x[j + l] == v;
    if (hit) break;
  }
  while (j < c && !(nan ? x[j] != x[j] : x[j] == v)) j++;
  *out = j;
}

/* The first index of the row maximum, or of the first NaN when the row has one: the NaN test and the max are
 * one vectorised pass, the search for the first index holding that value a second one (the row is in cache
 * by then). Max is exact, so the result is the scalar rule "first x[j] above every earlier one, NaN wins". */
OPX_BODY argmax_row_body(int64_t c, const float *restrict x, int64_t *out) {
  int nan = 0;
#pragma omp simd reduction(| : nan)
  for (int64_t j = 0; j < c; j++) nan |= x[j] != x[j];
  first_hit_body(c, x, vm_row_max(c, x), nan, out);
}
OPX_ISA_FN(argmax_row, (int64_t c, const float *restrict x, int64_t *out), (c, x, out))
OPX_ISA_FN(first_hit, (int64_t c, const float *restrict x, float v, int nan, int64_t *out), (c, x, v, nan, out))

static void argmax_rows(const float *x, int64_t rows, int64_t c, int64_t *out) {
#pragma omp parallel for schedule(static) if (rows * c > 65536)
  for (int64_t r = 0; r < rows; r++) argmax_row(c, x + r * c, out + r);
}

int opx_is_argmax(int64_t c, const float *x, int64_t t, float mx, float sum) {
  int64_t a;
  if (!isfinite(sum))
    argmax_row(c, x, &a);
  else if (x[t] != mx)
    return 0;
  else
    first_hit(t, x, mx, 0, &a); /* t when no earlier element holds the max */
  return a == t;
}

int opx_check_counts(const char *op, const bl_tensor *acc, const bl_tensor *logits) {
  BL_CHECK(bl_tensor_check(acc, op));
  if (acc->dtype != BL_I64 || acc->numel != 2 || !bl_tensor_is_contiguous(acc))
    return BL_ERR("%s: the accumulator must be a contiguous i64 tensor of 2 elements {correct, count}", op);
  if (acc->device != logits->device) return BL_ERR("%s: the accumulator is not on the logits' device", op);
  return 0;
}

int bl_argmax(bl_tensor *out, const bl_tensor *x) {
  const char *op = "argmax";
  BL_CHECK(opx_check_float(op, x, "input"));
  BL_CHECK(opx_check_index(op, out, "output"));
  if (x->ndim < 1 || opx_cols(x) < 1) return BL_ERR("%s: input %s needs a non-empty last dim", op, OPX_SHAPE(x));
  if (out->numel != opx_rows(x))
    return BL_ERR("%s: output %s does not match input %s without its last dim", op, OPX_SHAPE(out), OPX_SHAPE(x));
  int dev;
  const bl_tensor *ts[] = { out, x };
  BL_CHECK(opx_device(op, 2, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_argmax(out, x));
  int64_t rows = opx_rows(x), c = opx_cols(x);
  opx_buf bx = { 0 };
  int64_t *res = malloc((size_t)(rows ? rows : 1) * sizeof(int64_t));
  if (!res) return bl_set_error(BL_ENOMEM, "%s: out of memory", op);
  int rc = opx_load(op, x, &bx);
  if (!rc) {
    argmax_rows(bx.p, rows, c, res);
    int nd = out->ndim;
    int64_t idx[BL_MAX_DIMS] = { 0 };
    for (int64_t i = 0; i < rows; i++) {
      int64_t off = 0;
      for (int k = 0; k < nd; k++) off += idx[k] * out->stride[k];
      if (out->dtype == BL_I64)
        ((int64_t *)out->data)[off] = res[i];
      else
        ((int32_t *)out->data)[off] = (int32_t)res[i];
      for (int k = nd - 1; k >= 0; k--) {
        if (++idx[k] < out->shape[k]) break;
        idx[k] = 0;
      }
    }
  }
  free(res);
  opx_free(&bx);
  return rc;
}

int bl_accuracy(const bl_tensor *logits, const bl_tensor *targets, int64_t ignore_index, int64_t *correct,
                int64_t *count) {
  const char *op = "accuracy";
  BL_CHECK(opx_check_float(op, logits, "logits"));
  BL_CHECK(opx_check_index(op, targets, "targets"));
  if (!correct || !count) return BL_ERR("%s: correct and count must not be NULL", op);
  if (logits->ndim < 1 || opx_cols(logits) < 1)
    return BL_ERR("%s: logits %s need a non-empty class dim", op, OPX_SHAPE(logits));
  if (targets->numel != opx_rows(logits))
    return BL_ERR("%s: logits %s and targets %s are not compatible", op, OPX_SHAPE(logits), OPX_SHAPE(targets));
  int dev;
  const bl_tensor *ts[] = { logits, targets };
  BL_CHECK(opx_device(op, 2, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_accuracy(logits, targets, ignore_index, correct, count));
  int64_t rows = opx_rows(logits), c = opx_cols(logits), *t = NULL, ok = 0, cnt = 0;
  int64_t *res = malloc((size_t)(rows ? rows : 1) * sizeof(int64_t));
  opx_buf bx = { 0 };
  if (!res) return bl_set_error(BL_ENOMEM, "%s: out of memory", op);
  int rc = opx_load_ids(op, targets, &t);
  if (!rc) rc = opx_load(op, logits, &bx);
  if (!rc) {
    argmax_rows(bx.p, rows, c, res);
    for (int64_t i = 0; i < rows; i++) {
      if (t[i] == ignore_index) continue;
      cnt++;
      ok += res[i] == t[i];
    }
    *correct = ok;
    *count = cnt;
  }
  free(res);
  free(t);
  opx_free(&bx);
  return rc;
}

int bl_accuracy_add(bl_tensor *acc, const bl_tensor *logits, const bl_tensor *targets, int64_t ignore_index) {
  const char *op = "accuracy";
  BL_CHECK(opx_check_float(op, logits, "logits"));
  BL_CHECK(opx_check_counts(op, acc, logits));
  if (acc->device >= 0) {
    BL_CHECK(opx_check_index(op, targets, "targets"));
    return BL_ON_CUDA(op, acc->device, bl_cuda_accuracy_add(acc, logits, targets, ignore_index));
  }
  int64_t ok, cnt;
  BL_CHECK(bl_accuracy(logits, targets, ignore_index, &ok, &cnt));
  int64_t *a = acc->data;
  a[0] += ok;
  a[1] += cnt;
  return 0;
}
