/* Batched matrix multiply through OpenBLAS. Each matrix operand is passed to
 * gemm directly when one of its last two strides is 1 (a transpose flag covers
 * the other layout); otherwise it is first copied contiguous. f16/bf16 go
 * through f32 copies; f64 uses dgemm. */
#include <cblas.h>
#include <stdlib.h>
#include "../base/internal.h"
#include "../device/dispatch.h"

/* Layout of the last two dims as a BLAS operand: returns 1 when usable, sets trans and ld. */
static int blas_layout(const bl_tensor *t, CBLAS_TRANSPOSE *trans, int64_t *ld) {
  int64_t r = t->shape[t->ndim - 2], c = t->shape[t->ndim - 1];
  int64_t sr = t->stride[t->ndim - 2], sc = t->stride[t->ndim - 1];
  if ((sc == 1 || c == 1) && (sr >= (c > 1 ? c : 1) || r == 1)) {
    *trans = CblasNoTrans;
    *ld = r == 1 ? (c > 1 ? c : 1) : sr;
    return 1;
  }
  if ((sr == 1 || r == 1) && (sc >= (r > 1 ? r : 1) || c == 1)) {
    *trans = CblasTrans;
    *ld = c == 1 ? (r > 1 ? r : 1) : sc;
    return 1;
  }
  return 0;
}

static int make_operand(const bl_tensor *t, int dtype, bl_tensor **tmp, const bl_tensor **use) {
  CBLAS_TRANSPOSE tr;
  int64_t ld;
  *tmp = NULL;
  if (t->dtype == dtype && blas_layout(t, &tr, &ld)) {
    *use = t;
    return 0;
  }
  BL_CHECK(bl_tensor_empty(t->ndim, t->shape, dtype, -1, tmp));
  int rc = bl_tensor_copy(*tmp, t);
  if (rc) {
    bl_tensor_free(*tmp);
    *tmp = NULL;
    return rc;
  }
  *use = *tmp;
  return 0;
}

int bl_matmul(bl_tensor *out, const bl_tensor *a, const bl_tensor *b) {
  BL_CHECK(bl_tensor_check(out, "matmul"));
  BL_CHECK(bl_tensor_check(a, "matmul"));
  BL_CHECK(bl_tensor_check(b, "matmul"));
  char sa[128], sb[128], so[128], se[128];
  if (a->ndim < 2 || b->ndim < 2 || a->shape[a->ndim - 1] != b->shape[b->ndim - 2])
    return bl_set_error(BL_EINVAL, "matmul: shapes %s and %s are not compatible", BL_SHAPE(a, sa), BL_SHAPE(b, sb));
  BL_CHECK(bl_check_same_device(a, b, "matmul"));
  BL_CHECK(bl_check_same_device(a, out, "matmul"));
  if (!bl_dtype_is_float(a->dtype) || !bl_dtype_is_float(b->dtype) || !bl_dtype_is_float(out->dtype))
    return bl_set_error(BL_EINVAL, "matmul: floating-point tensors required, got %s and %s", bl_dtype_name(a->dtype),
                        bl_dtype_name(b->dtype));
  int64_t m = a->shape[a->ndim - 2], k = a->shape[a->ndim - 1], n = b->shape[b->ndim - 1];
  int nb;
  int64_t bshape[BL_MAX_DIMS + 2];
  if (bl_broadcast_shape(a->ndim - 2, a->shape, b->ndim - 2, b->shape, &nb, bshape))
    return bl_set_error(BL_EINVAL, "matmul: batch dims of %s and %s are not compatible", BL_SHAPE(a, sa),
                        BL_SHAPE(b, sb));
  if (nb + 2 > BL_MAX_DIMS) return bl_set_error(BL_EINVAL, "matmul: too many dims");
  bshape[nb] = m;
  bshape[nb + 1] = n;
  int ok = out->ndim == nb + 2;
  for (int i = 0; ok && i < nb + 2; i++) ok = out->shape[i] == bshape[i];
  if (!ok)
    return bl_set_error(BL_EINVAL, "matmul: output has shape %s, expected %s", BL_SHAPE(out, so),
                        bl_shape_str(nb + 2, bshape, se, sizeof se));
  if (out->numel == 0) return 0;
  if (a->device >= 0) return BL_ON_CUDA("matmul", a->device, bl_cuda_matmul(out, a, b));

  int cdt = (a->dtype == BL_F64 && b->dtype == BL_F64 && out->dtype == BL_F64) ? BL_F64 : BL_F32;
  bl_tensor *ta = NULL, *tb = NULL, *tc = NULL;
  const bl_tensor *ua, *ub;
  int rc = make_operand(a, cdt, &ta, &ua);
  if (!rc) rc = make_operand(b, cdt, &tb, &ub);
  bl_tensor *uc = out;
  if (!rc && (out->dtype != cdt || !bl_tensor_is_contiguous(out))) {
    rc = bl_tensor_empty(out->ndim, out->shape, cdt, -1, &tc);
    uc = tc;
  }
  if (rc) goto done;
  if (k == 0) {
    rc = bl_tensor_fill(out, 0);
    goto done;
  }
  CBLAS_TRANSPOSE tra, trb;
  int64_t lda, ldb;
  blas_layout(ua, &tra, &lda);
  blas_layout(ub, &trb, &ldb);
  int64_t nbatch = 1;
  for (int i = 0; i < nb; i++) nbatch *= bshape[i];
  int es = bl_dtype_size(cdt);
  for (int64_t bi = 0; bi < nbatch; bi++) {
    /* batch offsets with broadcasting */
    int64_t rem = bi, oa = 0, ob = 0, oc = bi * m * n;
    for (int i = nb - 1; i >= 0; i--) {
      int64_t ix = rem % bshape[i];
      rem /= bshape[i];
      int da = i - (nb - (ua->ndim - 2)), db = i - (nb - (ub->ndim - 2));
      if (da >= 0 && ua->shape[da] != 1) oa += ix * ua->stride[da];
      if (db >= 0 && ub->shape[db] != 1) ob += ix * ub->stride[db];
    }
    const char *pa = (const char *)ua->data + oa * es, *pb = (const char *)ub->data + ob * es;
    char *pc = (char *)uc->data + oc * es;
    if (cdt == BL_F64)
      cblas_dgemm(CblasRowMajor, tra, trb, (int)m, (int)n, (int)k, 1.0, (const double *)pa, (int)lda,
                  (const double *)pb, (int)ldb, 0.0, (double *)pc, (int)n);
    else
      cblas_sgemm(CblasRowMajor, tra, trb, (int)m, (int)n, (int)k, 1.0f, (const float *)pa, (int)lda, (const float *)pb,
                  (int)ldb, 0.0f, (float *)pc, (int)n);
  }
  if (tc) rc = bl_tensor_copy(out, tc);
done:
  bl_tensor_free(ta);
  bl_tensor_free(tb);
  bl_tensor_free(tc);
  return rc;
}
