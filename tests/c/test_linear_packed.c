/* Packed linear weights (bl_linear_pack / bl_linear_forward_packed, the CPU
 * inference path): y = act(x W^T + b) through our own GEMM on a weight packed
 * once, bias and GELU in its epilogue, against a double-precision reference
 * on random inputs, on every CPU path (AVX-512, AVX2, baseline). Shapes leave
 * partial tiles and cross the KC (768) and NC (3072) blocks, so a bias or
 * GELU applied before the last K block, or a block read from the wrong place
 * of the pack, fails. Also the errors: a pack used with another weight, or
 * after the CPU path changed.
 *
 * Tolerance per entry: v = sum_p x_ip w_jp + b_j in f32 with FMA is within
 * e = (k + 2) u sum |terms| of the exact value (Higham 3.1, u = 2^-24). GELU
 * has |gelu'| <= 1.129, and the epilogue's vm_gelu_fast is within 3.5 ulp(|v|)
 * <= 3.5 2^-23 |v| < 5e-7 |v| of gelu(v) (vecmath.h), so act(v) is within
 * 1.13 e + (5e-7 + u) |v| of gelu(exact v). */
#include "bertlua.h"
#include "base/vecmath.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rand_tensor.h"
#include "ref_dot.h"

/* one layer: x [rows, in], W [out, in] (stored transposed when wtrans), bias or none, act */
static void check_layer(const char *isa, int64_t rows, int64_t in, int64_t out, int wtrans, int bias, int act) {
  bl_tensor *x = rand_tensor(rows, in, 1.0f), *ws = wtrans ? rand_tensor(in, out, 0.1f) : rand_tensor(out, in, 0.1f);
  bl_tensor *b = bias ? rand_tensor(1, out, 1.0f) : NULL, *bv = NULL, *w = ws, *y = rand_tensor(rows, out, 1.0f);
  if (wtrans) OK(bl_tensor_transpose(ws, 0, 1, &w));
  int64_t bshape[1] = { out };
  if (b) OK(bl_tensor_view(b, 1, bshape, &bv));
  bl_packed_weight *pw = NULL;
  OK(bl_linear_pack(&pw, w));
  for (int64_t i = 0; i < rows * out; i++) ((float *)y->data)[i] = NAN; /* every entry must be written */
  OK(bl_linear_forward_packed(y, x, w, pw, bv, act));
  const float *X = x->data, *W = ws->data, *B = b ? b->data : NULL, *Y = y->data;
  const double u = ldexp(1.0, -24);
  double worst = 0;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < out; j++) {
      double mag, v = ref_dot(X + i * in, 1, wtrans ? W + j : W + j * in, wtrans ? out : 1, in, B ? B[j] : 0.0, &mag);
      double e = (double)(in + 2) * u * mag, ref = v, bound = e;
      if (act == BL_LINEAR_GELU) {
        ref = v * 0.5 * erfc(-v / sqrt(2.0));
        bound = 1.13 * e + (5e-7 + u) * (fabs(v) + e);
      }
      double got = Y[i * out + j], r = isfinite(got) ? fabs(got - ref) / (bound + 1e-30) : 1e30;
      if (r > worst) worst = r;
    }
  CHECK(worst <= 1.0, "%s: linear_packed %lldx%lld -> %lld (W%s, bias %d, act %d): error %.3g x its bound", isa,
        (long long)rows, (long long)in, (long long)out, wtrans ? " transposed" : "", bias, act, worst);
  bl_linear_pack_free(pw);
  bl_tensor *ts[] = { x, ws, b, bv, y };
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) bl_tensor_free(ts[i]);
  if (w != ws) bl_tensor_free(w);
}

static void test_path(const char *isa) {
  /* rows, in, out: one element, partial tiles, a batch-1 sequence, K over KC, N over NC */
  static const int64_t shapes[][3] = {
    { 1, 1, 1 }, { 29, 45, 70 }, { 128, 64, 96 }, { 15, 800, 40 }, { 33, 40, 3100 }
  };
  int n = 0;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int v = 0; v < 4; v++, n++)
      check_layer(isa, shapes[s][0], shapes[s][1], shapes[s][2], v == 3, v != 2, v & 1 ? BL_LINEAR_GELU : 0);
  check_layer(isa, 300, 800, 3100, 0, 1, BL_LINEAR_GELU); /* several MC blocks, threads split rows */
  printf("%s: %d packed layers checked\n", isa, n + 1);
}

/* a pack is tied to its weight and to the CPU path it was made for */
static void test_errors(void) {
  bl_tensor *x = rand_tensor(4, 8, 1.0f), *w = rand_tensor(6, 8, 1.0f), *w2 = rand_tensor(6, 8, 1.0f);
  bl_tensor *y = rand_tensor(4, 6, 1.0f);
  bl_packed_weight *pw = NULL;
  OK(bl_linear_pack(&pw, w));
  CHECK(bl_linear_forward_packed(y, x, w2, pw, NULL, 0) != 0 && strstr(bl_last_error(), "was not packed from"),
        "a pack used with another weight: %s", bl_last_error());
  CHECK(bl_linear_forward_packed(y, x, w, pw, NULL, 7) != 0 && strstr(bl_last_error(), "unknown activation"),
        "an unknown activation: %s", bl_last_error());
  CHECK(bl_linear_forward_packed(y, x, w, NULL, NULL, 0) != 0, "a NULL pack accepted");
  if (strcmp(bl_cpu_isa(), "avx512") == 0) {
    OK(bl_cpu_set_isa("avx2"));
    CHECK(bl_linear_forward_packed(y, x, w, pw, NULL, 0) != 0 && strstr(bl_last_error(), "pack it again"),
          "a pack used on another CPU path: %s", bl_last_error());
    OK(bl_cpu_set_isa("avx512"));
  }
  bl_linear_pack_free(pw);
  bl_tensor *ts[] = { x, w, w2, y };
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) bl_tensor_free(ts[i]);
}

int main(void) {
  rng_state = 0x2545F4914F6CDD1Dull;
  static const char *const paths[] = { "avx512", "avx2", "baseline" };
  for (int i = 0; i < 3; i++) {
    if (bl_cpu_set_isa(paths[i]) != 0) {
      printf("%s: not on this CPU or build, skipped\n", paths[i]);
      continue;
    }
    test_path(paths[i]);
    test_errors();
  }
  printf("%s\n", failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}
