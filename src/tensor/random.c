/* Counter-based random numbers: Philox4x32-10, the stream of src/base/rules/philox.h (element i of a call with
 * (seed, offset) uses block offset + i/4, lane i%4), so any element can be generated independently — the same
 * stream on the CPU and in CUDA kernels. */
#include "../base/internal.h"
#include "../device/dispatch.h"
#include "../base/rules/philox.h"

void bl_philox4x32(uint64_t seed, uint64_t counter, uint32_t out[4]) { bl_philox_block(seed, counter, out); }

typedef struct {
  uint64_t seed, offset;
  double a, b;
  int normal;
  int dtype;
} rng_ctx;

static int fill_random(bl_tensor *t, rng_ctx *c, const char *op) {
  BL_CHECK(bl_tensor_check(t, op));
  if (!bl_dtype_is_float(t->dtype))
    return bl_set_error(BL_EINVAL, "%s: floating-point output required, got %s", op, bl_dtype_name(t->dtype));
  if (t->device >= 0)
    return BL_ON_CUDA(op, t->device,
                      c->normal ? bl_cuda_rand_normal(t, c->seed, c->offset, c->a, c->b)
                                : bl_cuda_rand_uniform(t, c->seed, c->offset, c->a, c->b));
  bl_tensor *tmp = NULL;
  bl_tensor *dst = t;
  if (!bl_tensor_is_contiguous(t) || t->dtype != BL_F32) {
    BL_CHECK(bl_tensor_empty(t->ndim, t->shape, BL_F32, -1, &tmp));
    dst = tmp;
  }
  float *p = dst->data;
  int64_t n = t->numel;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t blk = 0; blk < (n + 3) / 4; blk++) {
    uint32_t r[4];
    bl_philox4x32(c->seed, c->offset + (uint64_t)blk, r);
    float v[4];
    if (c->normal) {
      /* Box–Muller on lanes (0,1) and (2,3); u1 in (0,1] keeps log finite. */
      for (int h = 0; h < 2; h++) {
        double u1 = bl_philox_u01_pos(r[2 * h]), u2 = bl_philox_u01(r[2 * h + 1]);
        double rad = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
        v[2 * h] = (float)(c->a + c->b * rad * cos(th));
        v[2 * h + 1] = (float)(c->a + c->b * rad * sin(th));
      }
    } else {
      for (int l = 0; l < 4; l++) v[l] = bl_philox_uniform_ab(r[l], c->a, c->b);
    }
    for (int l = 0; l < 4 && blk * 4 + l < n; l++) p[blk * 4 + l] = v[l];
  }
  int rc = 0;
  if (tmp) {
    rc = bl_tensor_copy(t, tmp);
    bl_tensor_free(tmp);
  }
  return rc;
}

int bl_rand_uniform(bl_tensor *t, uint64_t seed, uint64_t offset, double low, double high) {
  rng_ctx c = { seed, offset, low, high, 0, 0 };
  return fill_random(t, &c, "rand");
}

int bl_rand_normal(bl_tensor *t, uint64_t seed, uint64_t offset, double mean, double std) {
  if (!(std >= 0)) return bl_set_error(BL_EINVAL, "randn: std must be >= 0, got %g", std);
  rng_ctx c = { seed, offset, mean, std, 1, 0 };
  return fill_random(t, &c, "randn");
}
