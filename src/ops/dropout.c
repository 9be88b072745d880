/* dropout from the Philox stream (contract in bl_ops.h). The mask is a pure
 * function of (seed, offset, element index), so the backward can regenerate
 * it instead of storing it; the optional u8 mask output is for callers that
 * prefer memory over recomputation, or want to inspect it. */
#include "ops_internal.h"
#include "device/dispatch.h"
#include "base/vecmath.h"
#include <stdlib.h>

#define DROP_BLOCK 4096 /* elements per parallel work item; multiple of 4 */

static int check_same(const char *op, const bl_tensor *t, const char *name, const bl_tensor *x) {
  BL_CHECK(opx_check_float(op, t, name));
  if (!opx_same_shape(t, x)) return BL_ERR("%s: %s %s does not match %s", op, name, OPX_SHAPE(t), OPX_SHAPE(x));
  return 0;
}

static int check_mask(const char *op, const bl_tensor *m, const bl_tensor *x) {
  BL_CHECK(opx_check(op, m, "mask"));
  if (m->dtype != BL_U8 && m->dtype != BL_BOOL)
    return BL_ERR("%s: mask must be u8 or bool, got %s", op, bl_dtype_name(m->dtype));
  if (!opx_same_shape(m, x)) return BL_ERR("%s: mask %s does not match %s", op, OPX_SHAPE(m), OPX_SHAPE(x));
  return 0;
}

/* Walk a u8 tensor in row-major order, reading (store = 0) or writing it. */
static void mask_io(bl_tensor *m, uint8_t *buf, int store) {
  int nd = m->ndim;
  int64_t idx[BL_MAX_DIMS] = { 0 };
  uint8_t *d = (uint8_t *)m->data;
  for (int64_t i = 0; i < m->numel; i++) {
    int64_t off = 0;
    for (int k = 0; k < nd; k++) off += idx[k] * m->stride[k];
    if (store)
      d[off] = buf[i];
    else
      buf[i] = d[off] != 0;
    for (int k = nd - 1; k >= 0; k--) {
      if (++idx[k] < m->shape[k]) break;
      idx[k] = 0;
    }
  }
}

OPX_BODY apply_keep_body(int64_t n, const float *restrict x, const uint8_t *restrict keep, float scale,
                         float *restrict y) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) y[i] = keep[i] ? x[i] * scale : 0.0f;
}
OPX_ISA_FN(apply_keep,
           (int64_t n, const float *restrict x, const uint8_t *restrict keep, float scale, float *restrict y),
           (n, x, keep, scale, y))

/* Blocks of DROP_BLOCK elements are independent work items: the keep bytes
 * of a block are made (or read) into a stack buffer, applied, and copied to
 * a contiguous mask output, so the mask never makes a round trip through a
 * tensor-sized buffer. Strided / bool masks take the generic walk. */
static int dropout_cpu(const char *op, bl_tensor *out, bl_tensor *mask_out, const bl_tensor *mask_in,
                       const bl_tensor *in, double p, uint64_t seed, uint64_t offset) {
  opx_buf bi = { 0 }, bo = { 0 };
  uint8_t *keep = NULL;
  int64_t n = in->numel;
  int rc = opx_seed_check(op, p, seed);
  if (rc || (rc = opx_load(op, in, &bi)) || (rc = opx_out(op, out, &bo, 0))) goto done;
  const float scale = (float)(1.0 / (1.0 - p));
  const bl_tensor *mio = mask_in ? mask_in : mask_out;
  /* u8 and bool are both one byte, read as nonzero = keep and written as 0/1 */
  int flat_mask = !mio || (bl_tensor_is_contiguous(mio) && bl_dtype_size(mio->dtype) == 1);
  if (flat_mask) {
    const uint8_t *min = mask_in ? (const uint8_t *)mask_in->data : NULL;
    uint8_t *mout = mask_out ? (uint8_t *)mask_out->data : NULL;
    int64_t nblk = (n + DROP_BLOCK - 1) / DROP_BLOCK;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t blk = 0; blk < nblk; blk++) {
      uint8_t kb[DROP_BLOCK];
      int64_t s = blk * DROP_BLOCK, len = s + DROP_BLOCK < n ? DROP_BLOCK : n - s;
      const uint8_t *k = kb;
      if (min)
        k = min + s;
      else
        opx_dropout_keep(seed, offset, s, len, (float)p, kb);
      apply_keep(len, bi.p + s, k, scale, bo.p + s);
      if (mout) memcpy(mout + s, kb, (size_t)len);
    }
  } else {
    keep = malloc((size_t)(n ? n : 1));
    if (!keep) {
      rc = bl_set_error(BL_ENOMEM, "%s: out of memory for the mask", op);
      goto done;
    }
    if (mask_in)
      mask_io((bl_tensor *)mask_in, keep, 0);
    else {
      int64_t nblk = (n + DROP_BLOCK - 1) / DROP_BLOCK;
#pragma omp parallel for schedule(static) if (n > 65536)
      for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t s = blk * DROP_BLOCK, len = s + DROP_BLOCK < n ? DROP_BLOCK : n - s;
        opx_dropout_keep(seed, offset, s, len, (float)p, keep + s);
      }
    }
    apply_keep(n, bi.p, keep, scale, bo.p);
    if (mask_out) mask_io(mask_out, keep, 1);
  }
  opx_store(out, &bo);
done:
  opx_free(&bi);
  opx_free(&bo);
  free(keep);
  return rc;
}

int bl_dropout_forward(bl_tensor *y, bl_tensor *mask, const bl_tensor *x, double p, uint64_t seed, uint64_t offset) {
  const char *op = "dropout";
  BL_CHECK(opx_check_float(op, x, "input"));
  BL_CHECK(check_same(op, y, "output", x));
  if (mask) BL_CHECK(check_mask(op, mask, x));
  BL_CHECK(opx_check_p(op, p));
  int dev;
  const bl_tensor *ts[] = { y, mask, x };
  BL_CHECK(opx_device(op, 3, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_dropout_forward(y, mask, x, p, seed, offset));
  return dropout_cpu(op, y, mask, NULL, x, p, seed, offset);
}

int bl_dropout_backward(bl_tensor *dx, const bl_tensor *dy, const bl_tensor *mask, double p, uint64_t seed,
                        uint64_t offset) {
  const char *op = "dropout_backward";
  BL_CHECK(opx_check_float(op, dy, "grad_output"));
  BL_CHECK(check_same(op, dx, "grad_input", dy));
  if (mask) BL_CHECK(check_mask(op, mask, dy));
  BL_CHECK(opx_check_p(op, p));
  int dev;
  const bl_tensor *ts[] = { dx, dy, mask };
  BL_CHECK(opx_device(op, 3, ts, &dev));
  if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_dropout_backward(dx, dy, mask, p, seed, offset));
  return dropout_cpu(op, dx, NULL, mask, dy, p, seed, offset);
}
