/* Vectorisable f32 math for the CPU ops' hot loops (internal, not part of
 * the FFI). Everything here is branch-free scalar C: inside a loop marked
 * `#pragma omp simd` (in a function compiled for AVX2/AVX-512 through
 * OPX_ISA_FN) the compiler turns each call into straight vector code, where
 * a libm call (expf, erff) would stay one scalar call per element.
 *
 * Accuracy (checked over dense grids against double-precision libm by
 * tests/c/test_ops_vecmath.c, in optimised and -O0 builds):
 *   vm_exp(x)     relative error <= 2 ulp for x in [-87.3, 88.6]; results
 *                 in the subnormal range (x down to -103.9) come from a
 *                 two-step scaling, x <= -103.9 gives 0; x > 88.7 is
 *                 clamped (our callers only pass x <= 0). NaN propagates.
 *   vm_exp_ftz(x) the same for x <= 0, but results below 2^-126 (x < -87.33)
 *                 are flushed to 0 (cheaper; used inside erfc).
 *   vm_erf(x)     relative error <= 2e-7 (about 2.5 ulp), checked on [-12, 12].
 *   vm_phi(x)     the normal CDF 0.5 (1 + erf(x / sqrt 2)) = 0.5 erfc(-x / sqrt 2),
 *                 evaluated through erfc for every x, so there is no
 *                 cancellation: relative error <= 5e-7 wherever Phi >= 1e-37
 *                 (libm's 0.5f * (1 + erff(x)) loses every digit for x below
 *                 about -5); Phi = 0 for x < -13.2 (true value < 1e-38). The
 *                 pdf exp(-x^2/2)/sqrt(2 pi) it also returns: likewise <= 5e-7.
 * erfc(z), z >= 0: exp(-z^2) * (3 / (z + 3)) * Q(z / (z + 3)) with Q a
 * degree-9 polynomial (weighted least squares on the relative error of
 * erfcx(z) (z+3)/3 over z in [0, 9.5], fitted in double: max rel error
 * 3.3e-9; beyond 9.5 erfc < 1e-38 is flushed to 0), with z^2 split into its
 * rounded value (exact in the exp argument) and the FMA residual: exp(-z^2)
 * has a relative condition number z^2, so rounding z^2 first would cost
 * tens of ulp in the tail. erf: |t| < 1 a degree-7 polynomial in t^2
 * (erf(t)/t on [0, 1], max rel error 1.4e-10), else 1 - erfc. */
#ifndef BL_BASE_VECMATH_H
#define BL_BASE_VECMATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "rules/philox.h"

/* Runtime dispatch: a kernel written once as an always_inline body
 * (OPX_BODY) is compiled three times by OPX_ISA_FN, for AVX-512
 * (x86-64-v4), AVX2+FMA (x86-64-v3) and baseline x86-64, and each call runs
 * the variant opx_isa() picked once at first use (src/base/isa.c: the best the
 * CPU has, capped by BL_CPU_ISA), so the library needs no -march, runs on any
 * x86-64, and an AVX-512 machine can test the AVX2 code. Vector-extension
 * code that depends on the width writes one body per width instead. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define OPX_MULTI_ISA     1
#define OPX_TARGET_AVX512 __attribute__((target("arch=x86-64-v4")))
#define OPX_TARGET_AVX2   __attribute__((target("arch=x86-64-v3")))
#else
#define OPX_MULTI_ISA 0
#define OPX_TARGET_AVX512
#define OPX_TARGET_AVX2
#endif
enum { OPX_ISA_BASE = 0, OPX_ISA_AVX2 = 1, OPX_ISA_AVX512 = 2 };
int opx_isa(void);
/* does this CPU (and build) run the bf16 GEMM / the VNNI int8 kernel (src/ops/gemm_lowp.h)? Both also need the
 * AVX-512 path in use (BL_CPU_ISA not capped below it). */
int opx_bf16_ok(void);
int opx_vnni_ok(void);
/* do those two GEMMs run on AMX tiles now? (the amx path: CPU, OS permission, BL_CPU_ISA not capped below it) */
int opx_amx_ok(void);
/* the L2 cache per core in bytes (CPUID, or BL_CPU_L2_KB), 0 when unknown: the f32 GEMM's blocking (src/ops/gemm.c) */
int64_t opx_l2_bytes(void);

#define OPX_BODY static inline __attribute__((always_inline)) void
/* name(params) runs body(args) compiled for the ISA in use */
#define OPX_ISA_DISPATCH(name, params, args, body512, body2, body0)    \
  OPX_TARGET_AVX512 static void name##_avx512 params { body512 args; } \
  OPX_TARGET_AVX2 static void name##_avx2 params { body2 args; }       \
  static void name##_base params { body0 args; }                       \
  static void name params {                                            \
    int isa_ = OPX_MULTI_ISA ? opx_isa() : OPX_ISA_BASE;               \
    if (isa_ == OPX_ISA_AVX512)                                        \
      name##_avx512 args;                                              \
    else if (isa_ == OPX_ISA_AVX2)                                     \
      name##_avx2 args;                                                \
    else                                                               \
      name##_base args;                                                \
  }
#define OPX_ISA_FN(name, params, args) OPX_ISA_DISPATCH(name, params, args, name##_body, name##_body, name##_body)

/* always_inline: GCC may refuse to inline a plain inline function into a caller
 * compiled for another -march, and a call there would stop the loop vectorising */
#define VM_INLINE static inline __attribute__((always_inline))

VM_INLINE float vm_asf(int32_t i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}
VM_INLINE int32_t vm_asi(float f) {
  int32_t i;
  memcpy(&i, &f, 4);
  return i;
}
/* 2^(e-127) from a biased exponent; the shift is done unsigned because a NaN
 * input reaches here with a huge e (the result is then discarded). */
VM_INLINE float vm_pow2_biased(int32_t e) { return vm_asf((int32_t)((uint32_t)e << 23)); }

/* exp(x): x = n ln2 + r, |r| <= ln2/2, Cephes' degree-7 polynomial for e^r;
 * vm_exp applies 2^n in two halves so that subnormal results come out right. */
VM_INLINE float vm_exp_reduced(float x, int32_t *n) {
  float kb = x * 1.44269504088896341f + 12582912.0f; /* round(x/ln2) in the low mantissa bits */
  *n = vm_asi(kb) - 0x4B400000;
  float kf = kb - 12582912.0f;
  float r = x - kf * 0.693359375f;
  r = r - kf * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * (r * r) + r + 1.0f; /* e^r; e^x = e^r 2^n */
}

VM_INLINE float vm_exp(float x) {
  x = x < -103.9f ? -103.9f : x;
  x = x > 88.7f ? 88.7f : x;
  int32_t n;
  float p = vm_exp_reduced(x, &n);
  int32_t n1 = n >> 1, n2 = n - n1;
  float y = p * vm_pow2_biased(n1 + 127) * vm_pow2_biased(n2 + 127);
  return x <= -103.9f ? 0.0f : y;
}

/* exp(x) for x <= 0 with results below 2^-126 flushed to 0 (x < -87.33):
 * vm_exp without the subnormal scaling step, for erfc, whose callers can
 * afford to lose values below 1e-38. Same accuracy in the normal range. */
VM_INLINE float vm_exp_ftz(float x) {
  int tiny = x < -87.33f;
  x = x < -87.33f ? -87.33f : x;
  int32_t n;
  float p = vm_exp_reduced(x, &n);
  float y = p * vm_pow2_biased(n + 127);
  return tiny ? 0.0f : y;
}

/* The rounding error of sq = a*a, exactly: a*a = sq + residual. fmaf is one
 * instruction in the AVX2/AVX-512 variants (x86-64-v3 and up have FMA). */
VM_INLINE float vm_sq_residual(float a, float sq) { return fmaf(a, a, -sq); }

/* erfc(z) for z >= 0 (0 for z > 9.34, where it drops below 1e-38),
 * given z^2 = sq + lo exactly (sq the rounded square), together with
 * exp(-z^2), which GELU's derivative reuses. The exact square matters:
 * exp(-z^2) has a relative condition number z^2. */
VM_INLINE float vm_erfc_pos(float z, float sq, float lo, float *expmz2) {
  /* clamp as integers (z >= 0 orders like its bit pattern; NaN also ends at
   * 9.5, the caller's x carries it): one vpminsd, and the compiler cannot
   * turn the clamp into a masked copy of the whole polynomial. Beyond 9.5,
   * exp(-z^2) is flushed to 0 anyway. */
  int32_t zi = vm_asi(z), ci = 0x41180000; /* 9.5f */
  z = vm_asf(zi < ci ? zi : ci);
  float d = 1.0f / (z + 3.0f), u = z * d; /* u in [0, 0.76] */
  float w = (u - 0.38f) * 2.631579f;
  float q = -9.331353174e-06f;
  q = q * w + 8.191013163e-06f;
  q = q * w + 1.630430422e-04f;
  q = q * w + -4.370519203e-04f;
  q = q * w + -1.784346917e-03f;
  q = q * w + 1.658185290e-02f;
  q = q * w + -6.437732827e-02f;
  q = q * w + 1.653223625e-01f;
  q = q * w + -3.109406244e-01f;
  q = q * w + 4.415760591e-01f;
  float e = vm_exp_ftz(-sq) * (1.0f - lo); /* exp(-lo) = 1 - lo to f32 precision: |lo| <= 2^-24 sq */
  *expmz2 = e;
  return e * q * (3.0f * d);
}

/* erf(t)/t for |t| <= 1 */
VM_INLINE float vm_erf_small(float t2) {
  float p = -9.809248222e-06f;
  p = p * t2 + 1.131311169e-04f;
  p = p * t2 + -8.490194918e-04f;
  p = p * t2 + 5.221422888e-03f;
  p = p * t2 + -2.686555832e-02f;
  p = p * t2 + 1.128378446e-01f;
  p = p * t2 + -3.761263858e-01f;
  p = p * t2 + 1.128379167e+00f;
  return p;
}

VM_INLINE float vm_erf(float t) {
  float a = fabsf(t), e;
  float t2 = t * t, lo = vm_sq_residual(a, t2);
  float small = t * vm_erf_small(t2);
  float ec = vm_erfc_pos(a, t2, lo, &e);
  float big = t > 0 ? 1.0f - ec : ec - 1.0f;
  return a < 1.0f ? small : big;
}

/* Phi(x) = 0.5 (1 + erf(x/sqrt 2)) = 0.5 erfc(-x/sqrt 2); *pdf receives
 * phi(x) = exp(-x^2/2)/sqrt(2 pi). One erfc for every x (no region
 * blending); t^2 = x^2/2 is formed from x exactly (x/sqrt 2 rounded first
 * would cost a relative error ~t^2 2^-24 in the tails). */
VM_INLINE float vm_phi(float x, float *pdf) {
  float z = fabsf(x) * 0.70710678118654752440f, e;
  float xx = x * x, lox = vm_sq_residual(x, xx);
  float ec = vm_erfc_pos(z, 0.5f * xx, 0.5f * lox, &e);
  *pdf = e * 0.39894228040143267794f;
  return x > 0 ? 1.0f - 0.5f * ec : 0.5f * ec;
}

/* GELU x Phi(x) for inference's GEMM epilogue, with an absolute error bound
 * instead of vm_phi's relative one (about 17 vector operations instead of
 * ~45: no exp, no erfc). Phi(x) - 1/2 = x P(x^2) / Q(x^2) with x clamped to
 * [-5.6, 5.6], P and Q of degree 5 (Q(0) = 1), fitted in double (Lawson's
 * weighted least squares on the absolute error, x^2 scaled to [0, 1]):
 * max |fit - (Phi - 1/2)| = 9.3e-9 = 2^-26.7 on [0, 5.6], and beyond the
 * clamp Phi(-5.6) = 1.07e-8. All coefficients are positive, so Horner's sums
 * of non-negative terms lose nothing to cancellation. Why absolute is
 * enough: the consumer is the next GEMM, which sums 3072 products of these
 * outputs; an error of e |x| in one output is far below that sum's own
 * rounding (~sqrt(3072) 2^-24 of its magnitude) when e is a few 2^-24.
 * Over every normal f32 x (exhaustive, against x Phi(x) in double), with
 * ulp(|x|) = 2^(floor(log2 |x|) - 23): |error| <= 2.72 ulp(|x|) for |x| <=
 * 5.6 where GCC contracts the Horner steps into FMAs (AVX2, AVX-512), 3.30
 * without (baseline); <= 0.13 ulp(|x|) beyond. That is the f32 rounding of
 * the ~12 operations, the fit adds < 0.2. For x >= 0 (result ~ x) it is as
 * good as x * vm_phi(x) (5e-7 relative, ~4-8 ulp). tests/c/test_ops_vecmath.c
 * checks 3.5 on a dense grid. NaN propagates (through x). */
VM_INLINE float vm_gelu_fast(float x) {
  float c = x < -5.6f ? -5.6f : x;
  c = c > 5.6f ? 5.6f : c;
  float s = c * c;
  float p = 2.2144487530317246e-08f;
  p = p * s + 6.3564357212996135e-06f;
  p = p * s + 1.7385206246362434e-04f;
  p = p * s + 4.7072666789788150e-03f;
  p = p * s + 3.4376353323564604e-02f;
  p = p * s + 3.9894222158530480e-01f;
  float q = 1.1801805357784027e-06f;
  q = q * s + 7.5101783506644100e-05f;
  q = q * s + 1.9129865077765274e-03f;
  q = q * s + 2.8940208383661320e-02f;
  q = q * s + 2.5283445261037124e-01f;
  q = q * s + 1.0f;
  float g = c * p / q; /* Phi(x) - 1/2 */
  return fmaf(x, g, 0.5f * x);
}

/* max of x[0..n) in 16 lanes (the reduction vectorises with GCC and clang
 * alike; max is exact, so the lane order does not matter). NaNs are skipped,
 * -inf for n = 0. */
VM_INLINE float vm_row_max(int64_t n, const float *x) {
  float acc[16], m = -INFINITY;
  for (int l = 0; l < 16; l++) acc[l] = -INFINITY;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
#pragma omp simd
    for (int l = 0; l < 16; l++) acc[l] = x[j + l] > acc[l] ? x[j + l] : acc[l];
  }
  for (; j < n; j++) m = x[j] > m ? x[j] : m;
  for (int l = 0; l < 16; l++) m = acc[l] > m ? acc[l] : m;
  return m;
}

/* Philox4x32-10, identical to bl_philox_block (src/base/rules/philox.h) but
 * written so that a loop over counters vectorises. The 32-bit state lives in 64-bit
 * lanes (high halves kept zero), which lets the 32x32->64 products and their
 * high/low halves stay in one lane: about twice as fast as 32-bit lanes
 * with widening conversions. */
VM_INLINE void vm_philox(uint32_t key0, uint32_t key1, uint64_t counter, uint32_t *o0, uint32_t *o1, uint32_t *o2,
                         uint32_t *o3) {
  const uint64_t M32 = 0xffffffffu;
  uint64_t c0 = counter & M32, c1 = counter >> 32, c2 = 0, c3 = 0, k0 = key0, k1 = key1;
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (c0 & M32) * BL_PHILOX_M0, p1 = (c2 & M32) * BL_PHILOX_M1;
    uint64_t n0 = (p1 >> 32) ^ c1 ^ k0, n2 = (p0 >> 32) ^ c3 ^ k1;
    c1 = p1 & M32;
    c3 = p0 & M32;
    c0 = n0;
    c2 = n2;
    k0 = (k0 + BL_PHILOX_W0) & M32;
    k1 = (k1 + BL_PHILOX_W1) & M32;
  }
  *o0 = (uint32_t)c0;
  *o1 = (uint32_t)c1;
  *o2 = (uint32_t)c2;
  *o3 = (uint32_t)c3;
}

#endif
