/* gather: out[j,:] = x[pos[j],:] over x viewed as [rows, H], and the
 * accumulating scatter-add backward (contract in bl_ops.h). Used to run the
 * MLM head only on the masked positions. Positions are checked before any
 * write; the backward keeps index order per column block (deterministic). */
#include "ops_internal.h"
#include "device/dispatch.h"
#include <stdlib.h>

static int check_pos(const char *op, const int64_t *pos, int64_t m, int64_t rows, const bl_tensor *x) {
  for (int64_t j = 0; j < m; j++)
    if (pos[j] < 0 || pos[j] >= rows)
      return BL_ERR("%s: position %lld at index %lld is out of range for %s (%lld rows)", op,
                    (long long)pos[j], (long long)j, OPX_SHAPE(x), (long long)rows);
  return 0;
}

static int check_shapes(const char *op, const bl_tensor *out, const bl_tensor *x, const bl_tensor *pos,
                        const char *xname, const char *outname) {
  if (x->ndim < 1) return BL_ERR("%s: %s must have at least one dim", op, xname);
  if (out->ndim < 1 || opx_cols(out) != opx_cols(x) || opx_rows(out) != pos->numel)
    return BL_ERR("%s: %s %s does not match positions %s and %s %s", op, outname, OPX_SHAPE(out),
                  OPX_SHAPE(pos), xname, OPX_SHAPE(x));
  return 0;
}

static int gather_forward_cpu(bl_tensor *out, const bl_tensor *x, const bl_tensor *pos) {
  const char *op = "gather";
  int64_t *p = NULL;
  opx_buf bx = {0}, bo = {0};
  int rc = opx_load_ids(op, pos, &p);
  if (rc) return rc;
  int64_t m = pos->numel, h = opx_cols(x);
  if ((rc = check_pos(op, p, m, opx_rows(x), x))) goto done;
  if ((rc = opx_load(op, x, &bx)) || (rc = opx_out(op, out, &bo, 0))) goto done;
  #pragma omp parallel for schedule(static) if (m * h > 65536)
  for (int64_t j = 0; j < m; j++) memcpy(bo.p + j * h, bx.p + p[j] * h, (size_t)h * sizeof(float));
  opx_store(out, &bo);
done:
  free(p); opx_free(&bx); opx_free(&bo);
  return rc;
}

int bl_gather_forward(bl_tensor *out, const bl_tensor *x, const bl_tensor *pos) {
  const char *op = "gather";
  BL_CHECK(opx_check_float(op, out, "output"));
  BL_CHECK(opx_check_float(op, x, "input"));
  BL_CHECK(opx_check_index(op, pos, "positions"));
  BL_CHECK(check_shapes(op, out, x, pos, "input", "output"));
  int dev;
  const bl_tensor *ts[] = {out, x, pos};
  BL_CHECK(opx_device(op, 3, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_gather_forward(out, x, pos));
  return gather_forward_cpu(out, x, pos);
}

static int gather_backward_cpu(bl_tensor *dx, const bl_tensor *dout, const bl_tensor *pos) {
  const char *op = "gather_backward";
  int64_t *p = NULL;
  opx_buf bx = {0}, bo = {0};
  int rc = opx_load_ids(op, pos, &p);
  if (rc) return rc;
  int64_t m = pos->numel, h = opx_cols(dx);
  if ((rc = check_pos(op, p, m, opx_rows(dx), dx))) goto done;
  if ((rc = opx_load(op, dout, &bo)) || (rc = opx_out(op, dx, &bx, 1))) goto done;
  int64_t nblk = (h + 127) / 128;
  #pragma omp parallel for schedule(static) if (m * h > 65536)
  for (int64_t blk = 0; blk < nblk; blk++) {
    int64_t c0 = blk * 128, c1 = c0 + 128 < h ? c0 + 128 : h;
    for (int64_t j = 0; j < m; j++) {
      float *dst = bx.p + p[j] * h;
      const float *src = bo.p + j * h;
      for (int64_t c = c0; c < c1; c++) dst[c] += src[c];
    }
  }
  opx_store(dx, &bx);
done:
  free(p); opx_free(&bx); opx_free(&bo);
  return rc;
}

int bl_gather_backward(bl_tensor *dx, const bl_tensor *dout, const bl_tensor *pos) {
  const char *op = "gather_backward";
  BL_CHECK(opx_check_float(op, dx, "grad_input"));
  BL_CHECK(opx_check_float(op, dout, "grad_output"));
  BL_CHECK(opx_check_index(op, pos, "positions"));
  BL_CHECK(check_shapes(op, dout, dx, pos, "grad_input", "grad_output"));
  int dev;
  const bl_tensor *ts[] = {dx, dout, pos};
  BL_CHECK(opx_device(op, 3, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_gather_backward(dx, dout, pos));
  return gather_backward_cpu(dx, dout, pos);
}
