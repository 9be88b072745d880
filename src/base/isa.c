/* Which vector instruction set the CPU ops run (OPX_ISA_FN in vecmath.h
 * dispatches on it): the best one the CPU has, capped by the environment
 * variable BL_CPU_ISA (avx512, avx2 or baseline) so that an AVX-512 machine
 * also runs and tests the AVX2 and baseline kernels, or by bl_cpu_set_isa. */
#include "bl_base.h"
#include "vecmath.h"
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

static const char *const isa_names[] = { "baseline", "avx2", "avx512" };

/* what the hardware offers: AVX-512 means x86-64-v4 (F, BW, DQ, VL, CD),
 * AVX2 means x86-64-v3 (AVX2, FMA, BMI2, F16C, ...), the targets the kernels
 * are compiled for */
static int hw_isa(void) {
#if OPX_MULTI_ISA
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return OPX_ISA_AVX512;
  if (__builtin_cpu_supports("x86-64-v3")) return OPX_ISA_AVX2;
#endif
  return OPX_ISA_BASE;
}

static int isa_by_name(const char *s) {
  for (int i = 0; i < 3; i++)
    if (strcmp(s, isa_names[i]) == 0) return i;
  return -1;
}

static _Atomic int isa_now = -1;

/* The hardware level capped by BL_CPU_ISA; an unknown value is reported once
 * on stderr and ignored (this runs inside ops, which have no way to fail on it). */
static int isa_from_env(void) {
  int hw = hw_isa();
  const char *e = getenv("BL_CPU_ISA");
  if (!e || !*e) return hw;
  int want = isa_by_name(e);
  if (want < 0) {
    fprintf(stderr, "bertlua: BL_CPU_ISA=%s ignored (use avx512, avx2 or baseline)\n", e);
    return hw;
  }
  return want < hw ? want : hw;
}

int opx_isa(void) {
  int v = atomic_load_explicit(&isa_now, memory_order_relaxed);
  if (v < 0) {
    v = isa_from_env();
    atomic_store(&isa_now, v);
  }
  return v;
}

const char *bl_cpu_isa(void) { return isa_names[opx_isa()]; }

int bl_cpu_set_isa(const char *name) {
  int want = name ? isa_by_name(name) : -1;
  if (want < 0)
    return bl_set_error(BL_EINVAL, "cpu_set_isa: unknown instruction set '%s' (avx512, avx2 or baseline)",
                        name ? name : "(null)");
  int hw = hw_isa();
  if (want > hw && !OPX_MULTI_ISA)
    return bl_set_error(BL_EUNSUPPORTED,
                        "cpu_set_isa: this build has only the baseline path (sanitizer or "
                        "non-GCC build), no %s",
                        name);
  if (want > hw)
    return bl_set_error(BL_EUNSUPPORTED, "cpu_set_isa: this CPU has no %s (best: %s)", name, isa_names[hw]);
  atomic_store(&isa_now, want);
  return 0;
}

/* The low-precision GEMMs' extensions (gemm_lowp.h): on the CPU, and the
 * AVX-512 path in use (a cap to AVX2 turns them off like the rest). */
static int hw_has(int bf16) {
#if OPX_MULTI_ISA
  __builtin_cpu_init();
  return bf16 ? __builtin_cpu_supports("avx512bf16") : __builtin_cpu_supports("avx512vnni");
#else
  (void)bf16;
  return 0;
#endif
}
int opx_bf16_ok(void) { return opx_isa() == OPX_ISA_AVX512 && hw_has(1); }
int opx_vnni_ok(void) { return opx_isa() == OPX_ISA_AVX512 && hw_has(0); }

int bl_cpu_has(const char *feature) {
  if (!feature) return 0;
  if (strcmp(feature, "avx512_bf16") == 0) return opx_bf16_ok();
  if (strcmp(feature, "avx512_vnni") == 0) return opx_vnni_ok();
  int want = isa_by_name(feature);
  return want > OPX_ISA_BASE && opx_isa() >= want;
}

/* "AMD EPYC 9R14; kernels avx512 (CPU: avx512 avx512_bf16 avx512_vnni)": the brand string
 * from CPUID, the path in use, and the CPU's own best level and BF16 flag. */
const char *bl_cpu_info(void) {
  static _Thread_local char buf[256];
  char brand[49] = "unknown x86-64 CPU";
#if defined(__x86_64__) && defined(__GNUC__)
  unsigned r[12];
  if (__get_cpuid(0x80000004u, &r[0], &r[1], &r[2], &r[3])) {
    for (unsigned i = 0; i < 3; i++)
      __get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
    memcpy(brand, r, 48);
    brand[48] = 0;
  }
  unsigned a, b, c, d;
  int bf16 = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
#else
  int bf16 = 0;
#endif
  char *s = brand;
  while (*s == ' ') s++;
  snprintf(buf, sizeof buf, "%s; kernels %s (CPU: %s%s%s)", s, bl_cpu_isa(), isa_names[hw_isa()],
           bf16 ? " avx512_bf16" : "", hw_has(0) ? " avx512_vnni" : "");
  return buf;
}
