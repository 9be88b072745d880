/* tanh (the BERT pooler's activation) and its backward from the saved
 * output, dx = dy (1 - y^2), so the input need not be kept (bl_ops.h). */
#include "ops_internal.h"
#include "device/dispatch.h"
#include <math.h>

static int check_same(const char *op, const bl_tensor *t, const char *name, const bl_tensor *x) {
  BL_CHECK(opx_check_float(op, t, name));
  if (!opx_same_shape(t, x))
    return BL_ERR("%s: %s %s does not match %s", op, name, OPX_SHAPE(t), OPX_SHAPE(x));
  return 0;
}

static int tanh_cpu(const char *op, bl_tensor *out, const bl_tensor *a, const bl_tensor *dy) {
  opx_buf ba = {0}, bg = {0}, bo = {0};
  int rc;
  if ((rc = opx_load(op, a, &ba)) || (dy && (rc = opx_load(op, dy, &bg))) || (rc = opx_out(op, out, &bo, 0)))
    goto done;
  int64_t n = a->numel;
  if (!dy) {
    #pragma omp parallel for schedule(static) if (n > 16384)
    for (int64_t i = 0; i < n; i++) bo.p[i] = tanhf(ba.p[i]);
  } else {
    #pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) bo.p[i] = bg.p[i] * (1.0f - ba.p[i] * ba.p[i]);
  }
  opx_store(out, &bo);
done:
  opx_free(&ba); opx_free(&bg); opx_free(&bo);
  return rc;
}

int bl_tanh_forward(bl_tensor *y, const bl_tensor *x) {
  const char *op = "tanh";
  BL_CHECK(opx_check_float(op, x, "input"));
  BL_CHECK(check_same(op, y, "output", x));
  int dev;
  const bl_tensor *ts[] = {y, x};
  BL_CHECK(opx_device(op, 2, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_tanh_forward(y, x));
  return tanh_cpu(op, y, x, NULL);
}

int bl_tanh_backward(bl_tensor *dx, const bl_tensor *dy, const bl_tensor *y) {
  const char *op = "tanh_backward";
  BL_CHECK(opx_check_float(op, y, "output"));
  BL_CHECK(check_same(op, dy, "grad_output", y));
  BL_CHECK(check_same(op, dx, "grad_input", y));
  int dev;
  const bl_tensor *ts[] = {dx, dy, y};
  BL_CHECK(opx_device(op, 3, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_tanh_backward(dx, dy, y));
  return tanh_cpu(op, dx, y, dy);
}
