/* The low-precision inference GEMMs (src/ops/gemm_bf16.c, gemm_int8.c) through
 * bl_linear_pack_as / bl_linear_forward_packed, against references of this
 * file on random inputs: odd M/N/K, batch 1, partial tiles, bias and GELU.
 *
 * bf16: the reference rounds x and W to bf16 itself (nearest even, through
 * frexp/ldexp, not the library's bit trick) and sums the products in double.
 * A product of two bf16 values (8-bit significands) is exact in f32, and
 * vdpbf16ps adds the products to its f32 lane one at a time, so the kernel
 * is a k-term f32 sum of exact terms plus the bias: within (k + 1) u sum|terms|
 * of the reference, u = 2^-24 (Higham 3.1); GELU as in test_linear_packed
 * (|gelu'| <= 1.13, vm_gelu_fast's error < 5e-7 |v|). Not rounding x (or
 * truncating instead of rounding) costs up to 2^-8 of each term: hundreds of
 * times the bound, so it fails. AMX's tdpbf16ps (SDM pseudocode) sums a
 * 16-pair step in two f32 chains (even and odd k) of 16 exact-product FMAs,
 * adds the two, then adds that to the accumulator, each rounded to nearest
 * even: a term meets at most 16 + 2 + k/32 <= k + 1 roundings, so the same
 * bound holds; it flushes subnormal results to zero, at most 2^-126 for each
 * of the k + 2 roundings (added to the bound; the inputs here are not bf16
 * subnormals). On an AMX machine the bf16 layers run on both kernels, each
 * against the reference and the two against each other (2x the bound).
 *
 * int8, integer core: W = 2^e_j Q with Q in [-127, 127] and one |Q| = 127 per
 * row, so that the per-channel quantization recovers Q exactly; A uint8. The
 * int32 sums must equal the exact integer products bit for bit, on the VNNI
 * and the AVX2 kernel. int8, whole path: against x W^T + b in double, within
 * the quantization bound per entry: |dx| <= sa / 2, |dw| <= sw / 2, so
 * |err| <= sa/2 sum|w| + sw/2 sum|x| + k sa sw / 4 (times 1 + 2^-12 for the
 * f32 roundings of the scales and of x / sa, w / sw), plus f32 rounding
 * (k + 4) u (sum|x w| + the bound) and, with GELU, 1.13 times that. The AMX
 * int8 kernel (tdpbusd) must give the VNNI kernel's int32 sums and therefore
 * the very same outputs, bit for bit.
 *
 * bf16 activations (test_bf16_io): a bf16 x must give the f32 x of the same
 * values' outputs bit for bit (the GEMM reads the same bf16 values), and a
 * bf16 y must be the f32 y rounded to nearest even, on both kernels, for
 * A read in place (K a multiple of 32) and packed, whole and partial row
 * blocks, strided rows, streamed outputs; with an f32 or int8 pack a bf16 x
 * or y is converted.
 *
 * bf16 attention (packed inference with bf16 q, k, v; on AMX: tdpbf16ps
 * products, test_bf16_attention): against softmax(q k^T sc) v in double on
 * the same bf16 values. A score is a d-term f32 sum of exact products:
 * within (d + 1) u sum|q k| (as above), so exp's argument within
 * ds_j = sc (d + 1) u sum|q k| + 2 u (|sc s_j| + max_j |sc s_j|) (its own
 * roundings; the shift by the row's max cancels in the ratio), and
 * e_j = exp(.) within e_j (ds_j + 2 ulp) (vm_exp) + 2^-126. The numerator
 * takes e_j rounded to bf16 (2^-8 relative: 8 significant bits) in an n-term f32 sum ((n + 1) u
 * of the sum of |terms|), the denominator the f32 sum of the unrounded e_j
 * (n u relative), then one division and one product (u each). So, p_j the
 * exact probabilities and c the exact context entry, |err| <=
 * sum_j p_j |v_j| (eps_j + 2^-8 + (n + 1) u) + |c| (max_j eps_j + (n + 3) u),
 * eps_j = 1.01 (ds_j + 2^-22), with 1 % for the products of small terms.
 * Rounding P by truncation costs up to 2^-7 of each term, biased: it fails
 * where the probabilities and values line up. A bf16 ctx must be the f32
 * ctx rounded to nearest even, bit for bit. */
#include "bertlua.h"
#include "ops/gemm_lowp.h"
#include "base/vecmath.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rand_tensor.h"

static double bf16_round(double x) { /* to 8 significant bits, nearest even */
  if (x == 0) return 0;
  int e;
  double f = frexp(x, &e); /* x = f 2^e, 0.5 <= |f| < 1 */
  return ldexp(nearbyint(ldexp(f, 8)), e - 8);
}

static double gelu(double v) { return v * 0.5 * erfc(-v / sqrt(2.0)); }

/* y = act(x W^T + b) packed as prec; returns the worst error as a fraction of its bound. With `other`
 * (an ISA path name) the forward runs there too: bf16 within twice the bound of the first, int8 identical
 * (*differ counts the entries that are not) */
static double check_layer(int prec, int64_t rows, int64_t in, int64_t out, int act, const char *other,
                          int64_t *differ) {
  bl_tensor *x = rand_tensor(rows, in, 1.0f), *w = rand_tensor(out, in, 0.1f), *b = rand_tensor(1, out, 0.5f);
  bl_tensor *y = rand_tensor(rows, out, 1.0f), *bv = NULL;
  int64_t bshape[1] = { out };
  OK(bl_tensor_view(b, 1, bshape, &bv));
  bl_packed_weight *pw = NULL;
  OK(bl_linear_pack_as(&pw, w, prec));
  for (int64_t i = 0; i < rows * out; i++) ((float *)y->data)[i] = NAN; /* every entry must be written */
  OK(bl_linear_forward_packed(y, x, w, pw, bv, act));
  bl_tensor *y2 = NULL;
  if (other) {
    const char *here = bl_cpu_isa();
    y2 = rand_tensor(rows, out, 1.0f);
    OK(bl_cpu_set_isa(other));
    OK(bl_linear_forward_packed(y2, x, w, pw, bv, act));
    OK(bl_cpu_set_isa(here));
  }
  const float *X = x->data, *W = w->data, *B = b->data, *Y = y->data, *Y2 = y2 ? y2->data : NULL;
  const double u = ldexp(1.0, -24);
  double worst = 0;
  for (int64_t i = 0; i < rows; i++) {
    double xmin = 0, xmax = 0, sx = 0;
    for (int64_t p = 0; p < in; p++) {
      xmin = fmin(xmin, X[i * in + p]);
      xmax = fmax(xmax, X[i * in + p]);
      sx += fabs(X[i * in + p]);
    }
    for (int64_t j = 0; j < out; j++) {
      const float *xr = X + i * in, *wr = W + j * in;
      double v = B[j], mag = fabs(B[j]), bound;
      if (prec == BL_PACK_BF16) {
        for (int64_t p = 0; p < in; p++) {
          double t = bf16_round(xr[p]) * bf16_round(wr[p]);
          v += t;
          mag += fabs(t);
        }
        bound = (double)(in + 1) * u * mag + (double)(in + 2) * ldexp(1.0, -126);
      } else {
        double wmax = 0, sw = 0;
        for (int64_t p = 0; p < in; p++) {
          v += (double)xr[p] * wr[p];
          mag += fabs((double)xr[p] * wr[p]);
          wmax = fmax(wmax, fabs(wr[p]));
          sw += fabs(wr[p]);
        }
        double sa = (xmax - xmin) / 255, sq = wmax / 127;
        /* 2^-12: the f32 roundings of the scales and of x / sa, w / sw inside the library */
        bound = (sa / 2 * sw + sq / 2 * sx + (double)in * sa * sq / 4) * (1 + ldexp(1.0, -12));
        bound += (double)(in + 4) * u * (mag + bound);
      }
      double ref = v;
      if (act == BL_LINEAR_GELU) {
        ref = gelu(v);
        bound = 1.13 * bound + (5e-7 + u) * (fabs(v) + bound);
      }
      double got = Y[i * out + j], r = isfinite(got) ? fabs(got - ref) / (bound + 1e-30) : 1e30;
      if (r > worst) worst = r;
      if (Y2 && prec == BL_PACK_BF16) {
        double got2 = Y2[i * out + j];
        r = isfinite(got2) ? fabs(got2 - got) / (2 * bound + 1e-30) : 1e30;
        if (r > worst) worst = r;
      }
      if (Y2 && prec == BL_PACK_INT8) *differ += memcmp(&Y[i * out + j], &Y2[i * out + j], sizeof(float)) != 0;
    }
  }
  bl_linear_pack_free(pw);
  bl_tensor *ts[] = { x, w, b, bv, y, y2 };
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) bl_tensor_free(ts[i]);
  return worst;
}

/* on the path in use, and against the path `other` where given (see check_layer) */
static void test_layers(int prec, const char *name, const char *other) {
  /* rows, in, out: one element, batch 1, odd everything, K odd and not a multiple of 4, N over many panels;
   * for AMX: M, N and K around and off multiples of 16 / 32 / 64, K under one tile, whole tiles, threaded,
   * more rows than a task takes (512), more weight panels than a task's L2 chunk (1 MB); past 4 MB of output
   * (streamed; with rows that are not 64-byte aligned: written as the others) and of A (prefetched) */
  static const int64_t shapes[][3] = { { 1, 1, 1 },      { 1, 768, 100 },   { 29, 45, 70 },    { 15, 801, 40 },
                                       { 33, 43, 3100 }, { 130, 300, 97 },  { 7, 3, 33 },      { 47, 65, 17 },
                                       { 64, 128, 64 },  { 17, 31, 33 },    { 200, 777, 50 },  { 32, 63, 31 },
                                       { 600, 40, 50 },  { 40, 3000, 200 }, { 1100, 8, 1024 }, { 1030, 9, 1001 },
                                       { 520, 2050, 33 } };
  int64_t differ = 0;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int act = 0; act < 2; act++) {
      double r = check_layer(prec, shapes[s][0], shapes[s][1], shapes[s][2], act ? BL_LINEAR_GELU : 0, other, &differ);
      CHECK(r <= 1.0, "%s on %s%s%s: %lldx%lld -> %lld, act %d: error %.3g x its bound", name, bl_cpu_isa(),
            other ? " and " : "", other ? other : "", (long long)shapes[s][0], (long long)shapes[s][1],
            (long long)shapes[s][2], act, r);
    }
  CHECK(differ == 0, "%s: %lld outputs differ between %s and %s", name, (long long)differ, bl_cpu_isa(),
        other ? other : "-");
  char vs[64] = "";
  if (other)
    snprintf(vs, sizeof vs, ", %s %s", prec == BL_PACK_INT8 ? "identical to" : "within 2x the bound of", other);
  printf("%s on %s: %d layers checked%s\n", name, bl_cpu_isa(), (int)(2 * sizeof shapes / sizeof shapes[0]), vs);
}

/* A given transposed (ta = 1: a [k, m]) gives the very same outputs as row-major (both kernels of the path in
 * use pack the same rounded or quantized values), with bias and GELU */
static void test_transposed_a(const char *name) {
  static const int64_t shapes[][3] = { { 1, 5, 3 }, { 33, 70, 45 }, { 17, 130, 64 } }; /* m, k, n */
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int64_t m = shapes[s][0], k = shapes[s][1], n = shapes[s][2];
    float *w = malloc(sizeof(float) * n * k), *a = malloc(sizeof(float) * m * k), *at = malloc(sizeof(float) * m * k);
    float *bias = malloc(sizeof(float) * n), *c0 = malloc(sizeof(float) * m * n), *c1 = malloc(sizeof(float) * m * n);
    for (int64_t i = 0; i < n * k; i++) w[i] = 0.1f * urand();
    for (int64_t i = 0; i < n; i++) bias[i] = urand();
    for (int64_t i = 0; i < m; i++)
      for (int64_t p = 0; p < k; p++) at[p * m + i] = a[i * k + p] = urand();
    opx_bf16_b *pb = opx_bf16_pack(1, k, n, w, k);
    opx_q8_b *pq = opx_q8_pack(OPX_ISA_AVX512, 1, k, n, w, k);
    CHECK(pb && pq, "%s: packs %lldx%lld failed", name, (long long)n, (long long)k);
    for (int q8 = 0; pb && pq && q8 < 2; q8++) {
      int ok0 = q8 ? opx_q8_gemm(pq, 0, m, a, k, c0, n, bias, 1) : opx_bf16_gemm(pb, 0, m, a, k, c0, n, bias, 1);
      int ok1 = q8 ? opx_q8_gemm(pq, 1, m, at, m, c1, n, bias, 1) : opx_bf16_gemm(pb, 1, m, at, m, c1, n, bias, 1);
      CHECK(ok0 && ok1 && memcmp(c0, c1, sizeof(float) * m * n) == 0, "%s %s: transposed A %lldx%lld -> %lld differs",
            name, q8 ? "int8" : "bf16", (long long)m, (long long)k, (long long)n);
    }
    opx_bf16_free(pb);
    opx_q8_free(pq);
    free(w), free(a), free(at), free(bias), free(c0), free(c1);
  }
  printf("%s: transposed A gives the row-major outputs\n", name);
}

static bl_tensor *bf16_tensor(int64_t r, int64_t c) {
  bl_tensor *t = NULL;
  int64_t shape[2] = { r, c };
  OK(bl_tensor_empty(2, shape, BL_BF16, -1, &t));
  return t;
}
static float bf16_val(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t bf16_of_exact(float f) { /* f already a bf16 value */
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}

/* y = act(x W^T + b) with x and y each f32 or bf16 (see the top), on the path in use, with pack prec; x is
 * [rows, in] of row stride ldx (>= in); returns the number of outputs that differ */
static int64_t check_io(int prec, int64_t rows, int64_t in, int64_t ldx, int64_t out, int act) {
  bl_tensor *xs = rand_tensor(rows, ldx, 1.0f), *w = rand_tensor(out, in, 0.1f), *b = rand_tensor(1, out, 0.5f);
  bl_tensor *xb = bf16_tensor(rows, ldx), *y = rand_tensor(rows, out, 1.0f), *yb = bf16_tensor(rows, out);
  bl_tensor *yb2 = bf16_tensor(rows, out), *y2 = rand_tensor(rows, out, 1.0f), *bv = NULL, *x = NULL, *xbv = NULL;
  int64_t bshape[1] = { out }, xshape[2] = { rows, in }, xstride[2] = { ldx, 1 };
  OK(bl_tensor_view(b, 1, bshape, &bv));
  float *XS = xs->data;
  uint16_t *XB = xb->data;
  for (int64_t i = 0; i < rows * ldx; i++) XB[i] = bf16_of_exact(XS[i] = (float)bf16_round(XS[i]));
  OK(bl_tensor_as_strided(xs, 2, xshape, xstride, 0, &x));
  OK(bl_tensor_as_strided(xb, 2, xshape, xstride, 0, &xbv));
  bl_packed_weight *pw = NULL;
  OK(bl_linear_pack_as(&pw, w, prec));
  for (int64_t i = 0; i < rows * out; i++) ((uint16_t *)yb->data)[i] = ((uint16_t *)yb2->data)[i] = 0x7fc1;
  OK(bl_linear_forward_packed(y, x, w, pw, bv, act));     /* the reference: f32 in and out */
  OK(bl_linear_forward_packed(y2, xbv, w, pw, bv, act));  /* bf16 x */
  OK(bl_linear_forward_packed(yb, x, w, pw, bv, act));    /* bf16 y */
  OK(bl_linear_forward_packed(yb2, xbv, w, pw, bv, act)); /* both */
  const float *Y = y->data, *Y2 = y2->data;
  const uint16_t *YB = yb->data, *YB2 = yb2->data;
  int64_t differ = 0;
  for (int64_t i = 0; i < rows * out; i++) {
    float r = (float)bf16_round(Y[i]);
    differ += memcmp(&Y[i], &Y2[i], 4) != 0 || memcmp(&r, &(float){ bf16_val(YB[i]) }, 4) != 0 ||
              memcmp(&r, &(float){ bf16_val(YB2[i]) }, 4) != 0;
  }
  bl_linear_pack_free(pw);
  bl_tensor *ts[] = { xs, xb, x, xbv, w, b, bv, y, y2, yb, yb2 };
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) bl_tensor_free(ts[i]);
  return differ;
}

static void test_bf16_io(int prec, const char *name) {
  /* rows, in, row stride of x, out: K a multiple of 32 (in place on AMX) with whole and partial 32-row blocks,
   * odd N; K not one (packed); strided rows (even and odd stride); more rows than a task takes; past 4 MB of
   * bf16 A (prefetched) and of bf16 output (streamed) */
  static const int64_t shapes[][4] = { { 1, 1, 1, 1 },           { 1, 64, 64, 33 },     { 32, 64, 64, 64 },
                                       { 45, 96, 96, 70 },       { 33, 45, 45, 17 },    { 64, 128, 160, 100 },
                                       { 40, 64, 65, 31 },       { 600, 96, 96, 40 },   { 70, 2048, 2048, 48 },
                                       { 1100, 2048, 2048, 40 }, { 1030, 64, 64, 2100 } };
  int64_t differ = 0;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int act = 0; act < 2; act++) {
      int64_t d = check_io(prec, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], act ? BL_LINEAR_GELU : 0);
      CHECK(d == 0, "%s on %s: %lldx%lld (stride %lld) -> %lld, act %d: %lld bf16-activation outputs differ", name,
            bl_cpu_isa(), (long long)shapes[s][0], (long long)shapes[s][1], (long long)shapes[s][2],
            (long long)shapes[s][3], act, (long long)d);
      differ += d;
    }
  printf("%s on %s: bf16 x / y give the f32 path's outputs (y rounded to nearest even)%s\n", name, bl_cpu_isa(),
         differ ? ": NOT" : "");
}

/* one packed inference attention over lens[] sequences of `heads` heads of d, q, k, v column slices of one bf16
 * [1, T, 3H] tensor (as the fused QKV linear writes them), on the path in use; returns the worst error as a
 * fraction of its bound (see the top) and counts the bf16-ctx entries that are not the f32 ctx rounded */
static double check_attention(const int64_t *lens, int nb, int heads, int64_t d, double scale, int64_t *differ) {
  int64_t T = 0, H = heads * d;
  for (int b = 0; b < nb; b++) T += lens[b];
  int64_t s3[3] = { 1, T, 3 * H }, s1[1] = { nb + 1 }, sh[3] = { 1, T, H }, st[3] = { T * 3 * H, 3 * H, 1 };
  bl_tensor *qkv = NULL, *off = NULL, *q = NULL, *k = NULL, *v = NULL, *c32 = NULL, *c16 = NULL;
  OK(bl_tensor_empty(3, s3, BL_BF16, -1, &qkv));
  OK(bl_tensor_empty(1, s1, BL_I32, -1, &off));
  OK(bl_tensor_empty(3, sh, BL_F32, -1, &c32));
  OK(bl_tensor_empty(3, sh, BL_BF16, -1, &c16));
  uint16_t *X = qkv->data;
  for (int64_t i = 0; i < T * 3 * H; i++) X[i] = bf16_of_exact((float)bf16_round(2.0 * urand()));
  int32_t *O = off->data;
  O[0] = 0;
  for (int b = 0; b < nb; b++) O[b + 1] = O[b] + (int32_t)lens[b];
  OK(bl_tensor_as_strided(qkv, 3, sh, st, 0, &q));
  OK(bl_tensor_as_strided(qkv, 3, sh, st, H, &k));
  OK(bl_tensor_as_strided(qkv, 3, sh, st, 2 * H, &v));
  bl_attention_args a = { 0 };
  a.q = q, a.k = k, a.v = v, a.offsets = off, a.heads = heads, a.scale = scale;
  a.ctx = c32;
  OK(bl_attention_forward(&a));
  a.ctx = c16;
  OK(bl_attention_forward(&a));
  const float *C = c32->data;
  const uint16_t *C16 = c16->data;
  const double u = ldexp(1.0, -24);
  double worst = 0;
  double *sc = malloc(sizeof(double) * 512), *e = malloc(sizeof(double) * 512), *eps = malloc(sizeof(double) * 512);
  for (int b = 0; b < nb; b++)
    for (int h = 0; h < heads; h++)
      for (int64_t i = O[b]; i < O[b + 1]; i++) {
        int64_t n = lens[b];
        double mx = -INFINITY, amx = 0, sum = 0, emax = 0;
        for (int64_t j = 0; j < n; j++) {
          const uint16_t *qi = X + i * 3 * H + h * d, *kj = X + (O[b] + j) * 3 * H + H + h * d;
          double s = 0, mag = 0;
          for (int64_t t = 0; t < d; t++) {
            double p = (double)bf16_val(qi[t]) * bf16_val(kj[t]);
            s += p;
            mag += fabs(p);
          }
          sc[j] = s * scale;
          eps[j] = scale * (double)(d + 1) * u * mag;
          mx = fmax(mx, sc[j]);
          amx = fmax(amx, fabs(sc[j]));
        }
        for (int64_t j = 0; j < n; j++) {
          e[j] = exp(sc[j] - mx);
          sum += e[j];
          eps[j] = 1.01 * (eps[j] + 2 * u * (fabs(sc[j]) + amx) + ldexp(1.0, -22));
          emax = fmax(emax, eps[j]);
        }
        for (int64_t c = 0; c < d; c++) {
          double ref = 0, mag = 0;
          for (int64_t j = 0; j < n; j++) {
            double vv = bf16_val(X[(O[b] + j) * 3 * H + 2 * H + h * d + c]), pj = e[j] / sum;
            ref += pj * vv;
            mag += pj * fabs(vv) * (eps[j] + ldexp(1.0, -8) + (double)(n + 1) * u);
          }
          double bound = mag + fabs(ref) * (emax + (double)(n + 3) * u) + 1e-30;
          double got = C[i * H + h * d + c], r = isfinite(got) ? fabs(got - ref) / bound : 1e30;
          if (r > worst) worst = r;
          float rr = (float)bf16_round(got);
          *differ += memcmp(&rr, &(float){ bf16_val(C16[i * H + h * d + c]) }, 4) != 0;
        }
      }
  free(sc), free(e), free(eps);
  bl_tensor *ts[] = { qkv, off, q, k, v, c32, c16 };
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) bl_tensor_free(ts[i]);
  return worst;
}

static void test_bf16_attention(const char *name) {
  /* sequence lengths around and off 16 / 32-key tiles, one token, the longest 128; d 64 and 32 (AMX) and 16 (the
   * f32 products on the bf16 values); scale 1/sqrt(d) and a sharper one */
  static const int64_t lens[] = { 1, 15, 16, 17, 33, 112, 128, 5, 31, 64 };
  static const int64_t ds[][2] = { { 2, 64 }, { 3, 32 }, { 2, 16 } }; /* heads, d */
  int64_t differ = 0;
  for (size_t s = 0; s < sizeof ds / sizeof ds[0]; s++)
    for (int sharp = 0; sharp < 2; sharp++) {
      double scale = (sharp ? 4.0 : 1.0) / sqrt((double)ds[s][1]);
      double r = check_attention(lens, (int)(sizeof lens / sizeof lens[0]), (int)ds[s][0], ds[s][1], scale, &differ);
      CHECK(r <= 1.0, "%s on %s: bf16 attention, %lld heads of %lld, scale %.3g: error %.3g x its bound", name,
            bl_cpu_isa(), (long long)ds[s][0], (long long)ds[s][1], scale, r);
    }
  CHECK(differ == 0, "%s on %s: %lld bf16 context entries are not the f32 context rounded", name, bl_cpu_isa(),
        (long long)differ);
  printf("%s on %s: bf16 attention within its bound\n", name, bl_cpu_isa());
}

/* the int32 sums of the int8 kernel of isa (on the path in use), bit for bit */
static void test_int8_exact(int isa, const char *name) {
  /* m, k, n; for AMX: k under a tile (64), not a multiple of it, m and n off multiples of 16 / 32, threaded,
   * more rows than a task takes, more weight panels than a task's L2 chunk, past 4 MB of A */
  static const int64_t shapes[][3] = { { 1, 1, 1 },      { 1, 768, 64 }, { 17, 33, 45 },   { 100, 301, 70 },
                                       { 6, 5, 16 },     { 33, 64, 33 }, { 47, 129, 100 }, { 32, 127, 32 },
                                       { 200, 700, 50 }, { 1, 65, 17 },  { 600, 70, 33 },  { 40, 3000, 400 },
                                       { 520, 2050, 33 } };
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int64_t m = shapes[s][0], k = shapes[s][1], n = shapes[s][2];
    float *w = malloc(sizeof(float) * n * k);
    int32_t *q = malloc(sizeof(int32_t) * n * k), *c = malloc(sizeof(int32_t) * m * n);
    uint8_t *a = malloc((size_t)(m * k));
    for (int64_t j = 0; j < n; j++) {
      float scale = ldexpf(1.0f, (int)(rng_next() % 16) - 12);
      for (int64_t p = 0; p < k; p++) q[j * k + p] = (int32_t)(rng_next() % 255) - 127;
      q[j * k + (int64_t)(rng_next() % (uint64_t)k)] = rng_next() & 1 ? 127 : -127;
      for (int64_t p = 0; p < k; p++) w[j * k + p] = scale * (float)q[j * k + p];
    }
    for (int64_t i = 0; i < m * k; i++) a[i] = (uint8_t)(rng_next() % 256);
    opx_q8_b *pb = opx_q8_pack(isa, 1, k, n, w, k);
    CHECK(pb != NULL, "%s: int8 pack %lldx%lld failed", name, (long long)n, (long long)k);
    if (pb && opx_q8_gemm_s32(pb, m, a, k, c, n)) {
      int64_t bad = 0;
      for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
          int64_t ref = 0;
          for (int64_t p = 0; p < k; p++) ref += (int64_t)a[i * k + p] * q[j * k + p];
          bad += ref != c[i * n + j];
        }
      CHECK(bad == 0, "%s: int8 sums %lldx%lldx%lld: %lld of %lld differ", name, (long long)m, (long long)n,
            (long long)k, (long long)bad, (long long)(m * n));
    }
    opx_q8_free(pb);
    free(w), free(q), free(c), free(a);
  }
  printf("%s: int8 integer sums exact\n", name);
}

int main(void) {
  rng_state = 0xD1B54A32D192ED03ull;
  /* amx: the tile kernels, each also against the avx512 path's vdpbf16ps / vpdpbusd kernels */
  int amx = bl_cpu_set_isa("amx") == 0;
  if (!amx) printf("amx: not on this CPU/OS/build, AMX kernels skipped (%s; %s)\n", bl_last_error(), bl_cpu_info());
  if (amx) {
    test_layers(BL_PACK_BF16, "bf16 amx", "avx512");
    test_layers(BL_PACK_INT8, "int8 amx", "avx512");
    test_int8_exact(OPX_ISA_AVX512, "int8 amx");
    test_transposed_a("amx");
    test_bf16_io(BL_PACK_BF16, "bf16 amx");
    test_bf16_attention("amx");
  }
  if (bl_cpu_set_isa("avx512") == 0 && bl_cpu_has("avx512_bf16")) {
    test_layers(BL_PACK_BF16, "bf16", NULL);
    test_bf16_io(BL_PACK_BF16, "bf16");
    if (bl_cpu_has("avx512_vnni")) test_transposed_a("avx512");
  } else
    printf("bf16: no AVX512-BF16 on this CPU/build: skipped (%s)\n", bl_cpu_info());
  static const char *const paths[] = { "avx512", "avx2" };
  for (int i = 0; i < 2; i++) {
    if (bl_cpu_set_isa(paths[i]) != 0) {
      printf("int8 on %s: not on this CPU or build, skipped\n", paths[i]);
      continue;
    }
    int vnni = bl_cpu_has("avx512_vnni");
    if (i == 0 && !vnni) printf("int8 on avx512: no VNNI, the AVX2 kernel runs\n");
    test_layers(BL_PACK_INT8, "int8", NULL);
    test_int8_exact(vnni ? OPX_ISA_AVX512 : OPX_ISA_AVX2, vnni ? "int8 vnni" : "int8 avx2");
    test_bf16_io(BL_PACK_F32, "fp32 pack");
    test_bf16_attention("f32 products");
    test_bf16_io(BL_PACK_INT8, "int8 pack");
  }
  /* what the CPU cannot do is a clear error, not a crash */
  bl_tensor *w = rand_tensor(4, 8, 1.0f);
  bl_packed_weight *pw = NULL;
  if (bl_cpu_set_isa("baseline") == 0) {
    CHECK(bl_linear_pack_as(&pw, w, BL_PACK_INT8) != 0 && strstr(bl_last_error(), "int8 needs"),
          "int8 on the baseline path: %s", bl_last_error());
    CHECK(bl_linear_pack_as(&pw, w, BL_PACK_BF16) != 0 && strstr(bl_last_error(), "AVX512-BF16"),
          "bf16 on the baseline path: %s", bl_last_error());
  }
  CHECK(bl_linear_pack_as(&pw, w, 9) != 0 && strstr(bl_last_error(), "unknown precision"), "precision 9: %s",
        bl_last_error());
  bl_tensor_free(w);
  printf("%s\n", failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}
