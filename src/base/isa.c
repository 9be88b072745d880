/* Which vector instruction set the CPU ops run (OPX_ISA_FN in vecmath.h
 * dispatches on it): the best one the CPU has, capped by the environment
 * variable BL_CPU_ISA (amx, avx512, avx2 or baseline) so that an AVX-512 or
 * AMX machine also runs and tests the lower kernels, or by bl_cpu_set_isa.
 * amx is the AVX-512 path whose bf16 and int8 inference GEMMs run on AMX
 * tiles (opx_amx_ok); avx512 on such a CPU keeps them on vdpbf16ps/vpdpbusd. */
#include "bl_base.h"
#include "vecmath.h"
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif
#if OPX_MULTI_ISA && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

enum { LEVEL_AMX = OPX_ISA_AVX512 + 1 }; /* levels: the OPX_ISA_* values, then AMX */
static const char *const isa_names[] = { "baseline", "avx2", "avx512", "amx" };
#define ISA_LIST "amx, avx512, avx2 or baseline"

#if OPX_MULTI_ISA
/* AMX-TILE, -BF16 and -INT8 (CPUID 7.0 EDX bits 24, 22, 25) with the tile
 * state enabled by the OS in XCR0 (TILECFG bit 17, TILEDATA bit 18) */
static int cpu_amx(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE: xgetbv is allowed */
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
  unsigned want = 1u << 22 | 1u << 24 | 1u << 25;
  if ((d & want) != want) return 0;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & (3u << 17)) == (3u << 17);
}
#endif

/* Linux hands out the 8 KB tile data state only to a process that asks for it
 * (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 18), once for all its
 * threads; without it the first tile instruction faults. Asked once. */
static int os_amx(void) {
  static _Atomic int granted = -1;
  int g = atomic_load(&granted);
  if (g < 0) {
#if OPX_MULTI_ISA && defined(__linux__) && defined(SYS_arch_prctl)
    g = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
#else
    g = 0;
#endif
    atomic_store(&granted, g);
  }
  return g;
}

/* what the hardware offers: AVX-512 means x86-64-v4 (F, BW, DQ, VL, CD),
 * AVX2 means x86-64-v3 (AVX2, FMA, BMI2, F16C, ...), the targets the kernels
 * are compiled for; AMX also needs AVX-512 with BF16 and VNNI (the kernels'
 * packs and edges are theirs). The OS's permission is asked only when AMX is
 * to be used (level_allowed). */
static int hw_isa(void) {
#if OPX_MULTI_ISA
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) {
    if (__builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vnni") && cpu_amx()) return LEVEL_AMX;
    return OPX_ISA_AVX512;
  }
  if (__builtin_cpu_supports("x86-64-v3")) return OPX_ISA_AVX2;
#endif
  return OPX_ISA_BASE;
}

/* level, or AVX-512 where it is AMX and the OS refuses the tile state */
static int level_allowed(int level) { return level == LEVEL_AMX && !os_amx() ? OPX_ISA_AVX512 : level; }

static int isa_by_name(const char *s) {
  for (int i = 0; i <= LEVEL_AMX; i++)
    if (strcmp(s, isa_names[i]) == 0) return i;
  return -1;
}

static _Atomic int isa_now = -1; /* the level in use */

/* The hardware level capped by BL_CPU_ISA; an unknown value is reported once
 * on stderr and ignored (this runs inside ops, which have no way to fail on it). */
static int isa_from_env(void) {
  int hw = hw_isa();
  const char *e = getenv("BL_CPU_ISA");
  if (!e || !*e) return level_allowed(hw);
  int want = isa_by_name(e);
  if (want < 0) {
    fprintf(stderr, "bertlua: BL_CPU_ISA=%s ignored (use " ISA_LIST ")\n", e);
    return level_allowed(hw);
  }
  return level_allowed(want < hw ? want : hw);
}

static int level(void) {
  int v = atomic_load_explicit(&isa_now, memory_order_relaxed);
  if (v < 0) {
    v = isa_from_env();
    atomic_store(&isa_now, v);
  }
  return v;
}

int opx_isa(void) {
  int v = level();
  return v > OPX_ISA_AVX512 ? OPX_ISA_AVX512 : v;
}

const char *bl_cpu_isa(void) { return isa_names[level()]; }

int bl_cpu_set_isa(const char *name) {
  int want = name ? isa_by_name(name) : -1;
  if (want < 0)
    return bl_set_error(BL_EINVAL, "cpu_set_isa: unknown instruction set '%s' (" ISA_LIST ")", name ? name : "(null)");
  int hw = hw_isa();
  if (want > hw && !OPX_MULTI_ISA)
    return bl_set_error(BL_EUNSUPPORTED,
                        "cpu_set_isa: this build has only the baseline path (sanitizer or "
                        "non-GCC build), no %s",
                        name);
  if (want > hw)
    return bl_set_error(BL_EUNSUPPORTED, "cpu_set_isa: this CPU has no %s (best: %s)", name, isa_names[hw]);
  if (level_allowed(want) != want)
    return bl_set_error(BL_EUNSUPPORTED, "cpu_set_isa: the OS refused the AMX tile state (arch_prctl)");
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
int opx_amx_ok(void) { return level() == LEVEL_AMX; }

int bl_cpu_has(const char *feature) {
  if (!feature) return 0;
  if (strcmp(feature, "avx512_bf16") == 0) return opx_bf16_ok();
  if (strcmp(feature, "avx512_vnni") == 0) return opx_vnni_ok();
  int want = isa_by_name(feature);
  return want > OPX_ISA_BASE && level() >= want;
}

/* The L2 cache per core in bytes, from CPUID's deterministic cache
 * parameters (leaf 4 on Intel, 0x8000001D on AMD: the same layout), 0 when
 * the CPU does not say; BL_CPU_L2_KB overrides it (so the tests run each
 * blocking on any CPU). Asked once. */
int64_t opx_l2_bytes(void) {
  static _Atomic int64_t l2 = -1;
  int64_t v = atomic_load(&l2);
  if (v >= 0) return v;
  v = 0;
  const char *env = getenv("BL_CPU_L2_KB");
  char *end;
  long long kb = env && *env ? strtoll(env, &end, 10) : -1;
  if (kb >= 0 && *end == 0) {
    atomic_store(&l2, (int64_t)kb << 10);
    return (int64_t)kb << 10;
  }
#if defined(__x86_64__) && defined(__GNUC__)
  unsigned a = 0, b = 0, c, d, leaf = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541u /* "Auth"enticAMD */) {
    if (__get_cpuid(0x80000001u, &a, &b, &c, &d) && (c & (1u << 22))) leaf = 0x8000001Du; /* topology extensions */
  } else if (a >= 4) {
    leaf = 4;
  }
  for (unsigned i = 0; leaf && i < 16 && __get_cpuid_count(leaf, i, &a, &b, &c, &d) && (a & 31); i++)
    if ((a >> 5 & 7) == 2 && (a & 31) != 2) /* level 2, data or unified */
      v = (int64_t)((b >> 22) + 1) * ((b >> 12 & 1023) + 1) * ((b & 4095) + 1) * ((int64_t)c + 1);
#endif
  atomic_store(&l2, v);
  return v;
}

/* "AMD EPYC 9R14; kernels avx512 (CPU: avx512 avx512_bf16 avx512_vnni)": the brand string
 * from CPUID, the path in use, and the CPU's own best level (amx: with the OS's tile state
 * enabled; the permission is asked only when the amx path is set) and BF16/VNNI flags. */
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
