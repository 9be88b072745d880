/* C unit tests of the tensor core: dtype rounding, Philox, views, copies,
 * elementwise, reductions, matmul and error reporting. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bertlua.h"

static int failures, checks;
#define CHECK(cond, ...)                          \
  do {                                            \
    checks++;                                     \
    if (!(cond)) {                                \
      failures++;                                 \
      printf("FAIL %s:%d: ", __FILE__, __LINE__); \
      printf(__VA_ARGS__);                        \
      printf("\n");                               \
    }                                             \
  } while (0)

static bl_tensor *mk(int ndim, const int64_t *shape, int dtype) {
  bl_tensor *t = NULL;
  if (bl_tensor_empty(ndim, shape, dtype, -1, &t)) {
    printf("alloc failed: %s\n", bl_last_error());
    exit(1);
  }
  return t;
}

static void test_half(void) {
  /* exhaustive round trip of every finite f16 / bf16 bit pattern */
  for (uint32_t h = 0; h < 65536; h++) {
    float f = bl_f16_to_f32((uint16_t)h);
    if (f != f) continue;
    CHECK(bl_f32_to_f16(f) == h, "f16 round trip of 0x%04x", h);
    float b = bl_bf16_to_f32((uint16_t)h);
    if (b == b) CHECK(bl_f32_to_bf16(b) == h, "bf16 round trip of 0x%04x", h);
  }
  /* round to nearest even at the halfway point */
  CHECK(bl_f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00, "1+2^-11 rounds to even (1.0)");
  CHECK(bl_f32_to_f16(1.0f + 3.0f / 2048) == 0x3c02, "1+3*2^-11 rounds to even (1+2^-9)");
  CHECK(bl_f32_to_f16(65504.0f) == 0x7bff, "max f16");
  CHECK(bl_f32_to_f16(65520.0f) == 0x7c00, "65520 overflows to inf");
  CHECK(bl_f32_to_f16(5.9604645e-8f) == 0x0001, "smallest subnormal");
  CHECK(bl_f32_to_f16(2.98e-8f) == 0x0000, "below half the smallest subnormal -> 0");
  CHECK(bl_f32_to_bf16(1.0f + 1.0f / 256) == 0x3f80, "bf16 halfway rounds to even");
  CHECK(bl_f32_to_bf16(1.0f + 3.0f / 256) == 0x3f82, "bf16 halfway rounds up to even");
  float nan = NAN;
  CHECK((bl_f32_to_bf16(nan) & 0x7fc0) == 0x7fc0, "bf16 NaN stays NaN");
  CHECK((bl_f32_to_f16(nan) & 0x7e00) == 0x7e00, "f16 NaN stays NaN");
  /* compare against a double-precision rounding reference on random floats */
  uint32_t s = 12345;
  for (int i = 0; i < 200000; i++) {
    s = s * 1664525u + 1013904223u;
    float f = ldexpf((float)(s >> 8) / 16777216.0f + 0.5f, (int)(s % 40) - 26) * ((s & 1) ? -1 : 1);
    float r = bl_f16_to_f32(bl_f32_to_f16(f));
    /* the error must be at most half an f16 ulp of the result */
    int e;
    frexpf(fabsf(f), &e);
    double ulp = ldexp(1.0, (e - 1 < -14 ? -14 : e - 1) - 10);
    CHECK(fabs((double)r - f) <= ulp / 2 + 1e-30, "f16 rounding of %.9g gave %.9g", f, r);
    if (failures > 20) return;
  }
}

static void test_philox(void) {
  /* Known-answer vectors of Random123's philox4x32-10 */
  uint32_t r[4];
  bl_philox4x32(0, 0, r);
  CHECK(r[0] == 0x6627e8d5u && r[1] == 0xe169c58du && r[2] == 0xbc57ac4cu && r[3] == 0x9b00dbd8u,
        "philox(0,0) = %08x %08x %08x %08x", r[0], r[1], r[2], r[3]);
  /* Stream property: element i of an offset-0 call equals element i-4k of an offset-k call */
  int64_t n = 37;
  bl_tensor *a = mk(1, &n, BL_F32), *b = mk(1, &n, BL_F32);
  bl_rand_uniform(a, 7, 0, 0, 1);
  bl_rand_uniform(b, 7, 2, 0, 1);
  const float *pa = a->data, *pb = b->data;
  for (int i = 8; i < n; i++) CHECK(pa[i] == pb[i - 8], "offset shifts the stream by 4 per block");
  bl_tensor *c = mk(1, &n, BL_F32);
  bl_rand_uniform(c, 8, 0, 0, 1);
  CHECK(((float *)c->data)[0] != pa[0], "different seeds differ");
  bl_tensor_free(a);
  bl_tensor_free(b);
  bl_tensor_free(c);
  /* normal moments */
  int64_t big = 200000;
  bl_tensor *z = mk(1, &big, BL_F32);
  bl_rand_normal(z, 3, 0, 0, 1);
  double m = 0, v = 0;
  for (int64_t i = 0; i < big; i++) m += ((float *)z->data)[i];
  m /= big;
  for (int64_t i = 0; i < big; i++) {
    double d = ((float *)z->data)[i] - m;
    v += d * d;
  }
  v /= big;
  CHECK(fabs(m) < 0.01 && fabs(v - 1) < 0.02, "randn mean %g var %g", m, v);
  bl_tensor_free(z);
}

/* fill: every element gets the value's bits (as the strided path stores them into a transposed view), whatever
 * the dtype, size (small, and large enough to be cut in chunks across threads, with a ragged end) and layout,
 * and nothing outside the tensor is touched; -0.0 keeps its sign (the all-zero-bytes shortcut must not take it). */
static void test_fill(void) {
  const int dts[] = { BL_F32, BL_F64, BL_F16, BL_BF16, BL_I32, BL_I64, BL_U8 };
  const double vals[] = { 0.0, -0.0, 1.5, 7.0 };
  const int64_t sizes[] = { 5, 3 * 262144 + 7 }, s22[2] = { 2, 2 };
  for (int d = 0; d < 7; d++)
    for (int v = 0; v < 4; v++) {
      int is_int = dts[d] == BL_I32 || dts[d] == BL_I64 || dts[d] == BL_U8;
      if (is_int && vals[v] != 7.0 && vals[v] != 0.0) continue;
      bl_tensor *r = mk(2, s22, dts[d]), *rt = NULL;
      CHECK(bl_tensor_transpose(r, 0, 1, &rt) == 0 && !bl_tensor_is_contiguous(rt) && bl_tensor_fill(rt, vals[v]) == 0,
            "reference fill: %s", bl_last_error());
      const int es = bl_dtype_size(dts[d]);
      const char *want = r->data;
      for (int z = 0; z < 2; z++) {
        int64_t n = sizes[z] + 2, inner = sizes[z];
        bl_tensor *t = mk(1, &n, dts[d]), *mid = NULL;
        CHECK(bl_tensor_fill(t, 3.0) == 0 && bl_tensor_narrow(t, 0, 1, inner, &mid) == 0 &&
                  bl_tensor_fill(mid, vals[v]) == 0,
              "fill: %s", bl_last_error());
        int bad = 0;
        for (int64_t i = 1; i <= inner; i++) bad += memcmp((char *)t->data + i * es, want, (size_t)es) != 0;
        double e0, e1;
        int64_t i0 = 0, i1 = n - 1;
        bl_tensor_get(t, &i0, &e0);
        bl_tensor_get(t, &i1, &e1);
        CHECK(bad == 0 && e0 == 3.0 && e1 == 3.0, "fill %s with %g, %lld elements: %d wrong, ends %g %g",
              bl_dtype_name(dts[d]), vals[v], (long long)inner, bad, e0, e1);
        bl_tensor_free(mid);
        bl_tensor_free(t);
      }
      bl_tensor_free(rt);
      bl_tensor_free(r);
    }
  int64_t s2[2] = { 300, 5000 };
  bl_tensor *m = mk(2, s2, BL_F32), *tr = NULL;
  CHECK(bl_tensor_transpose(m, 0, 1, &tr) == 0 && bl_tensor_fill(tr, -2.25) == 0, "%s", bl_last_error());
  int bad = 0;
  for (int64_t i = 0; i < 300 * 5000; i++) bad += ((float *)m->data)[i] != -2.25f;
  CHECK(bad == 0, "fill of a transposed view: %d wrong", bad);
  bl_tensor_free(tr);
  bl_tensor_free(m);
}

static void test_views(void) {
  int64_t s[2] = { 3, 4 };
  bl_tensor *t = mk(2, s, BL_F32);
  for (int i = 0; i < 12; i++) ((float *)t->data)[i] = (float)i;
  bl_tensor *tr = NULL, *nar = NULL, *v = NULL, *tc = NULL;
  CHECK(bl_tensor_transpose(t, 0, 1, &tr) == 0, "transpose");
  CHECK(tr->shape[0] == 4 && tr->stride[0] == 1 && tr->stride[1] == 4, "transpose strides");
  CHECK(!bl_tensor_is_contiguous(tr), "transpose is not contiguous");
  int64_t flat = 12;
  CHECK(bl_tensor_view(tr, 1, &flat, &v) != 0 && strstr(bl_last_error(), "without a copy"),
        "view of transpose fails: %s", bl_last_error());
  CHECK(bl_tensor_narrow(t, 1, 1, 2, &nar) == 0, "narrow");
  double x;
  int64_t ix[2] = { 2, 1 };
  bl_tensor_get(nar, ix, &x);
  CHECK(x == 10, "narrow aliases: got %g", x);
  bl_tensor_set(nar, ix, -5);
  CHECK(((float *)t->data)[10] == -5, "write through a view reaches the storage");
  CHECK(t->storage->refcount == 3, "refcount %d", t->storage->refcount);
  bl_tensor_free(t); /* views keep the storage alive */
  bl_tensor_get(tr, ix, &x);
  CHECK(x == 6, "storage alive after freeing the base: %g", x);
  tc = mk(2, tr->shape, BL_F32);
  bl_tensor_copy(tc, tr);
  CHECK(((float *)tc->data)[1] == 4 && ((float *)tc->data)[3] == 1, "contiguous copy of transpose");
  int64_t s3[3] = { 2, 2, 3 };
  bl_tensor *v3 = NULL;
  int64_t s2[2] = { 4, 3 };
  bl_tensor *split = NULL;
  CHECK(bl_tensor_view(tc, 3, s3, &v3) == 0, "view contiguous 4x3 as 2x2x3");
  CHECK(bl_tensor_view(v3, 2, s2, &split) == 0, "and back");
  bl_tensor_free(v3);
  bl_tensor_free(split);
  /* errors */
  bl_tensor *bad = NULL;
  CHECK(bl_tensor_narrow(tc, 0, 3, 2, &bad) != 0 && strstr(bl_last_error(), "narrow"), "narrow out of range: %s",
        bl_last_error());
  CHECK(bl_tensor_select(tc, 5, 0, &bad) != 0 && strstr(bl_last_error(), "dimension out of range"), "select bad dim");
  int64_t neg[1] = { -2 };
  CHECK(bl_tensor_empty(1, neg, BL_F32, -1, &bad) != 0 && strstr(bl_last_error(), "negative"), "negative shape");
  CHECK(bl_tensor_empty(1, s, 99, -1, &bad) != 0 && strstr(bl_last_error(), "dtype"), "bad dtype");
  if (bl_cuda_device_count() == 0) {
    CHECK(bl_tensor_empty(1, s, BL_F32, 0, &bad) != 0 && strstr(bl_last_error(), "cuda:0"), "cuda without device: %s",
          bl_last_error());
  } else { /* a real or emulated GPU: a device tensor is made and freed like any other */
    CHECK(bl_tensor_empty(1, s, BL_F32, 0, &bad) == 0 && bad->device == 0, "cuda tensor: %s", bl_last_error());
    bl_tensor_free(bad);
  }
  bl_tensor_release(tc);
  CHECK(bl_tensor_copy(tc, tr) != 0 && strstr(bl_last_error(), "freed"), "use after release is an error");
  bl_tensor_free(tc);
  bl_tensor_free(tr);
  bl_tensor_free(nar);
  CHECK(bl_storage_bytes_in_use() == 0, "all storage released: %lld bytes left", (long long)bl_storage_bytes_in_use());
}

static void test_math(void) {
  int64_t sa[2] = { 2, 3 }, sb[1] = { 3 }, sm[2] = { 3, 2 }, so[2] = { 2, 2 };
  bl_tensor *a = mk(2, sa, BL_F32), *b = mk(1, sb, BL_F64), *o = mk(2, sa, BL_F32);
  for (int i = 0; i < 6; i++) ((float *)a->data)[i] = (float)(i + 1);
  for (int i = 0; i < 3; i++) ((double *)b->data)[i] = 10.0 * (i + 1);
  CHECK(bl_binary(BL_ADD, o, a, b) == 0, "broadcast add");
  CHECK(((float *)o->data)[4] == 25, "1-based 5 + 20 = 25, got %g", ((float *)o->data)[4]);
  double r;
  bl_reduce_all(BL_SUM, o, &r);
  CHECK(r == 21 + 2 * 60, "sum %g", r);
  bl_tensor *m = mk(2, sm, BL_F32), *mo = mk(2, so, BL_F32);
  for (int i = 0; i < 6; i++) ((float *)m->data)[i] = (float)(i % 4) - 1;
  CHECK(bl_matmul(mo, a, m) == 0, "matmul: %s", bl_last_error());
  /* reference */
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) {
      float ref = 0;
      for (int k = 0; k < 3; k++) ref += ((float *)a->data)[i * 3 + k] * ((float *)m->data)[k * 2 + j];
      CHECK(((float *)mo->data)[i * 2 + j] == ref, "matmul[%d,%d]", i, j);
    }
  CHECK(bl_matmul(mo, a, a) != 0 && strstr(bl_last_error(), "matmul: shapes [2,3] and [2,3] are not compatible"),
        "matmul shape error: %s", bl_last_error());
  int64_t s1[1] = { 2 };
  bl_tensor *rs = mk(1, s1, BL_F32);
  CHECK(bl_reduce(BL_MAX, rs, a, 2u, 0) == 0 && ((float *)rs->data)[1] == 6, "max over dim 1");
  bl_tensor *am = mk(1, s1, BL_I64);
  CHECK(bl_reduce(BL_ARGMAX, am, a, 2u, 0) == 0 && ((int64_t *)am->data)[0] == 2, "argmax");
  CHECK(bl_binary(BL_ADD, o, a, m) != 0 && strstr(bl_last_error(), "add: shapes [2,3] and [3,2]"),
        "add shape error: %s", bl_last_error());
  bl_tensor_free(a);
  bl_tensor_free(b);
  bl_tensor_free(o);
  bl_tensor_free(m);
  bl_tensor_free(mo);
  bl_tensor_free(rs);
  bl_tensor_free(am);
}

/* The unit-stride f32 loops of add/sub/mul/div (tensor and scalar operand)
 * and affine on every CPU path this machine has, against the same IEEE
 * operations done here one element at a time (each result is one correctly
 * rounded operation, affine two: so bitwise equal), at lengths that end
 * inside and outside a 64-float block and a thread's chunk, the output a
 * few floats away from the inputs (the alignments and 4 KB offsets the
 * loops' blocking is for). */
static void test_flat_paths(void) {
  static const char *const isas[] = { "avx512", "avx2", "baseline" };
  static const int64_t lens[] = { 1, 63, 64, 1000, 3 * 16384 + 16384 + 77 };
  int64_t big = 3 * 16384 + 16384 + 77 + 64, sh[1] = { big };
  bl_tensor *A = mk(1, sh, BL_F32), *B = mk(1, sh, BL_F32), *O = mk(1, sh, BL_F32);
  float *a = A->data, *b = B->data;
  char start[32];
  snprintf(start, sizeof start, "%s", bl_cpu_isa());
  for (int64_t i = 0; i < big; i++) {
    a[i] = (float)sin(0.37 * (double)i) * 3.0f + 0.01f;
    b[i] = (float)cos(0.11 * (double)i) * 2.0f + 2.5f; /* >= 0.5: a safe divisor */
  }
  for (size_t p = 0; p < sizeof isas / sizeof isas[0]; p++) {
    if (bl_cpu_set_isa(isas[p]) != 0) continue;
    int bad = 0, runs = 0;
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
      for (int64_t off = 0; off <= 16; off += 3) {
        int64_t n = lens[l];
        bl_tensor *va = NULL, *vb = NULL, *vo = NULL;
        bl_tensor_narrow(A, 0, 0, n, &va);
        bl_tensor_narrow(B, 0, 1, n, &vb);
        bl_tensor_narrow(O, 0, off, n, &vo);
        const float *x = va->data, *y = vb->data;
        const float *o = vo->data;
        for (int op = BL_ADD; op <= BL_DIV; op++) {
          bl_binary(op, vo, va, vb);
          for (int64_t i = 0; i < n; i++) {
            volatile float r = op == BL_ADD   ? x[i] + y[i]
                               : op == BL_SUB ? x[i] - y[i]
                               : op == BL_MUL ? x[i] * y[i]
                                              : x[i] / y[i];
            bad += memcmp((const void *)&r, o + i, 4) != 0;
          }
          /* +, -, * with a scalar go through affine (exact there); x / s is computed in double, then rounded */
          bl_binary_scalar(op, vo, va, 0.7, 0);
          for (int64_t i = 0; i < n; i++) {
            volatile float s = 0.7f, r = op == BL_ADD   ? x[i] + s
                                         : op == BL_SUB ? x[i] - s
                                         : op == BL_MUL ? x[i] * s
                                                        : (float)(x[i] / 0.7);
            bad += memcmp((const void *)&r, o + i, 4) != 0;
          }
          runs += 2;
        }
        bl_affine(vo, va, 1.5, -0.25);
        for (int64_t i = 0; i < n; i++) {
          volatile float t = x[i] * 1.5f;
          volatile float r = t + -0.25f;
          bad += memcmp((const void *)&r, o + i, 4) != 0;
        }
        runs++;
        bl_tensor_free(va);
        bl_tensor_free(vb);
        bl_tensor_free(vo);
      }
    CHECK(bad == 0, "%s: %d elementwise results differ from the scalar IEEE operation", isas[p], bad);
    printf("%s: %d elementwise loops checked\n", isas[p], runs);
  }
  bl_cpu_set_isa(start);
  bl_tensor_free(A);
  bl_tensor_free(B);
  bl_tensor_free(O);
}

int main(void) {
  test_half();
  test_philox();
  test_fill();
  test_views();
  test_math();
  test_flat_paths();
  printf("%d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}
