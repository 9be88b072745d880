/* GEMM candidates side by side on BERT's own shapes, and the machine's FMA peak.
 *
 *   build/bench_gemm [threads] [reps] [cpu]    (OPENBLAS_CORETYPE=Haswell to try OpenBLAS's AVX2 kernels)
 *
 * `cpu` times by the process's CPU time instead of the wall clock: with 1 thread that is the
 * rate per core-second a loaded shared machine still gives (with more threads spinning counts).
 *
 * Each library is dlopen'ed on its own (RTLD_LOCAL: OpenBLAS and BLIS both export cblas_sgemm):
 * OpenBLAS (libopenblas-dev), BLIS (libblis-dev, its OpenMP build) and oneDNN (libdnnl-dev,
 * dnnl_sgemm, row-major) and our own packed GEMM (src/ops/gemm.c, linked in; on the ISA that
 * BL_CPU_ISA=avx2 caps it to, as in the library), also with the weight packed once (own-pre, the
 * inference path: forward products only, B packed before the timing), and own-pre with its fused
 * epilogues: +bias (C += bias) and +gelu (bias, then the erf GELU), as the inference linears
 * run. Shapes are a linear layer's three products, row-major as in src/ops/linear.c: forward
 * Y[M,N] = X[M,K] W[N,K]^T, dX[M,K] = dY[M,N] W[N,K], dW[N,K] = dY^T X; M = 4096 tokens (B=32, S=128)
 * and M = 128 (one sequence), N/K in {768, 3072}.
 * The low-precision inference GEMMs (src/ops/gemm_lowp.h) on the forward products, weight packed once
 * as own-pre: own-bf16 (where the CPU has AVX512-BF16) and own-int8 (dynamic int8: the activations'
 * quantization is in the timing; GOP/s counted as 2 M N K like the f32 columns); on a CPU with AMX
 * (BL_CPU_ISA not capped below amx) also bf16-amx and int8-amx, the same packs on the tile kernels, the
 * other two columns then on the avx512 path's vdpbf16ps / vpdpbusd, and bf16-io: bf16-amx with A in bf16 (read
 * in place) and C written in bf16, as the inference graph's bf16 activations run.
 * The libraries take turns rep by rep (a shared machine's load hits them alike); the table gives
 * each one's best rep in GFLOP/s. The peak is a loop of 12 independent FMA chains per thread
 * (AVX-512 and AVX2 forms, those the CPU has), unrolled so the chains live in registers (rolled,
 * GCC kept them in memory and the probe read less than half the peak). */
#include "ops/gemm.h"
#include "ops/gemm_lowp.h"
#include "base/vecmath.h"
#include "bl_base.h"
#include <dlfcn.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*cblas_sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                               float *, int);
typedef int (*dnnl_sgemm_fn)(char, char, long, long, long, float, const float *, long, const float *, long, float,
                             float *, long);
enum { ROW = 101, NT = 111, TR = 112 };

static int use_cpu_time;
static double now(void) {
  struct timespec t;
  clock_gettime(use_cpu_time ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* FLOP/s of n independent FMA chains per thread for `secs` seconds, `threads` threads */
#define PEAK_LOOP(VT)                                                                                                \
  VT acc[12];                                                                                                        \
  _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) acc[i] = (VT){ 0 } + (float)i;                               \
  VT m = (VT){ 0 } + 0.999999f, a = (VT){ 0 } + 1e-7f;                                                               \
  for (long it = 0; it < iters; it++) _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) acc[i] = acc[i] * m + a; \
  float s = 0;                                                                                                       \
  _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) s += acc[i][0];                                              \
  return s;
typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
__attribute__((target("arch=x86-64-v4"), noinline)) static float fma512(long iters) { PEAK_LOOP(v16) }
__attribute__((target("arch=x86-64-v3"), noinline)) static float fma256(long iters) { PEAK_LOOP(v8) }

static double peak(int isa512, int threads) {
  const long iters = 20000000;
  double best = 0;
  for (int r = 0; r < 3; r++) {
    double t0 = now();
    float sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += isa512 ? fma512(iters) : fma256(iters);
    double dt = now() - t0;
    if (sink == 12345.0f) printf(" "); /* keep the loops */
    double f = (double)threads * iters * 12 * (isa512 ? 16 : 8) * 2 / dt;
    if (f > best) best = f;
  }
  return best * 1e-9;
}

enum { PRE_F32 = 1, PRE_F32_BIAS, PRE_F32_GELU, PRE_BF16, PRE_INT8, PRE_BF16_AMX, PRE_INT8_AMX, PRE_BF16_AMX_IO };
typedef struct {
  const char *name;
  cblas_sgemm_fn cblas;
  dnnl_sgemm_fn dnnl;
  int own_isa, pre;
} lib;

/* the current forward shape's weight packed once, for own-pre / own-bf16 / own-int8 */
static opx_packed_b *prepacked;
static opx_bf16_b *pre_bf16;
static opx_q8_b *pre_int8;
static float *bias;   /* for own-pre's epilogues: N values */
static uint16_t *A16; /* A in bf16, for bf16-io */
static int have_pre(int pre) {
  return pre <= PRE_F32_GELU                                                ? prepacked != NULL
         : pre == PRE_BF16 || pre == PRE_BF16_AMX || pre == PRE_BF16_AMX_IO ? pre_bf16 != NULL
                                                                            : pre_int8 != NULL;
}

static int ldb_of(int tb, int K, int N) { return tb ? K : N; }

static int amx; /* the amx path is on: the other low-precision columns run capped to avx512 */

static void run(const lib *l, int ta, int tb, int M, int N, int K, const float *A, const float *B, float *C) {
  int lda = ta ? M : K, ldb = ldb_of(tb, K, N);
  if (amx && l->pre >= PRE_BF16) bl_cpu_set_isa(l->pre >= PRE_BF16_AMX ? "amx" : "avx512");
  if (l->pre && l->pre <= PRE_F32_GELU)
    opx_sgemm_packed(prepacked, ta, M, A, lda, C, N, l->pre == PRE_F32 ? NULL : bias, l->pre == PRE_F32_GELU);
  else if (l->pre == PRE_BF16 || l->pre == PRE_BF16_AMX)
    opx_bf16_gemm(pre_bf16, ta, M, A, lda, C, N, NULL, 0);
  else if (l->pre == PRE_BF16_AMX_IO)
    opx_bf16_gemm_io(pre_bf16, ta, M, A16, 1, lda, C, 1, N, NULL, 0);
  else if (l->pre == PRE_INT8 || l->pre == PRE_INT8_AMX)
    opx_q8_gemm(pre_int8, ta, M, A, lda, C, N, NULL, 0);
  else if (l->own_isa)
    opx_sgemm_isa(l->own_isa, ta, tb, M, N, K, A, lda, B, ldb, 0.0f, C, N);
  else if (l->cblas)
    l->cblas(ROW, ta ? TR : NT, tb ? TR : NT, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
  else
    l->dnnl(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 5;
  use_cpu_time = argc > 3 && strcmp(argv[3], "cpu") == 0;
  lib libs[12];
  int nl = 0;
  void *h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  if (h) {
    void (*set)(int) = (void (*)(int))dlsym(h, "openblas_set_num_threads");
    char *(*cfg)(void) = (char *(*)(void))dlsym(h, "openblas_get_config");
    if (set) set(threads);
    printf("OpenBLAS: %s\n", cfg ? cfg() : "?");
    libs[nl++] = (lib){ "OpenBLAS", (cblas_sgemm_fn)dlsym(h, "cblas_sgemm"), NULL, 0, 0 };
  }
  h = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
  if (h && dlsym(h, "cblas_sgemm")) {
    void (*set)(long) = (void (*)(long))dlsym(h, "bli_thread_set_num_threads");
    const char *(*arch)(int) = (const char *(*)(int))dlsym(h, "bli_arch_string");
    int (*qa)(void) = (int (*)(void))dlsym(h, "bli_arch_query_id");
    if (set) set(threads);
    printf("BLIS: sub-configuration %s\n", arch && qa ? arch(qa()) : "?");
    libs[nl++] = (lib){ "BLIS", (cblas_sgemm_fn)dlsym(h, "cblas_sgemm"), NULL, 0, 0 };
  }
  h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (h && dlsym(h, "dnnl_sgemm")) libs[nl++] = (lib){ "oneDNN", NULL, (dnnl_sgemm_fn)dlsym(h, "dnnl_sgemm"), 0, 0 };
  omp_set_num_threads(threads);
  __builtin_cpu_init();
  int has512 = __builtin_cpu_supports("x86-64-v4"), has256 = __builtin_cpu_supports("x86-64-v3");
  const char *cap = getenv("BL_CPU_ISA");
  int own = has512 && !(cap && strcmp(cap, "avx2") == 0) ? OPX_ISA_AVX512 : has256 ? OPX_ISA_AVX2 : 0;
  if (own) libs[nl++] = (lib){ own == OPX_ISA_AVX512 ? "own-avx512" : "own-avx2", NULL, NULL, own, 0 };
  if (own) libs[nl++] = (lib){ "own-pre", NULL, NULL, own, PRE_F32 };
  if (own) libs[nl++] = (lib){ "+bias", NULL, NULL, own, PRE_F32_BIAS };
  if (own) libs[nl++] = (lib){ "+gelu", NULL, NULL, own, PRE_F32_GELU };
  if (own == OPX_ISA_AVX512 && opx_bf16_ok()) libs[nl++] = (lib){ "own-bf16", NULL, NULL, own, PRE_BF16 };
  int q8isa = own == OPX_ISA_AVX512 && opx_vnni_ok() ? OPX_ISA_AVX512 : own ? OPX_ISA_AVX2 : 0;
  if (q8isa) libs[nl++] = (lib){ q8isa == OPX_ISA_AVX512 ? "int8-vnni" : "int8-avx2", NULL, NULL, own, PRE_INT8 };
  amx = opx_amx_ok();
  if (amx) libs[nl++] = (lib){ "bf16-amx", NULL, NULL, own, PRE_BF16_AMX };
  if (amx) libs[nl++] = (lib){ "int8-amx", NULL, NULL, own, PRE_INT8_AMX };
  if (amx) libs[nl++] = (lib){ "bf16-io", NULL, NULL, own, PRE_BF16_AMX_IO };
  printf("FMA peak, %d threads (GFLOP/s):", threads);
  if (has512) printf(" AVX-512 %.1f", peak(1, threads));
  if (has256) printf(" AVX2 %.1f", peak(0, threads));
  printf("\n");

  const int shapes[][3] = { { 768, 768 }, { 3072, 768 }, { 768, 3072 } }; /* N, K of the layer */
  const int Ms[] = { 4096, 128 };
  float *A = malloc(sizeof(float) * 4096 * 3072), *B = malloc(sizeof(float) * 3072 * 3072),
        *C = malloc(sizeof(float) * 4096 * 3072);
  bias = malloc(sizeof(float) * 3072);
  if (!A || !B || !C || !bias) return 1;
  for (int j = 0; j < 3072; j++) bias[j] = (float)(j % 17) * 0.01f - 0.08f;
  for (long i = 0; i < 4096L * 3072; i++) A[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
  A16 = malloc(sizeof(uint16_t) * 4096 * 3072);
  if (!A16) return 1;
  for (long i = 0; i < 4096L * 3072; i++) {
    uint32_t u;
    memcpy(&u, &A[i], 4);
    A16[i] = (uint16_t)(u >> 16);
  }
  for (long i = 0; i < 3072L * 3072; i++) B[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
  printf("\n%-6s %-28s", "M", "product");
  for (int l = 0; l < nl; l++) printf(" %10s", libs[l].name);
  printf("   (GFLOP/s, best of %d, %s)\n", reps, use_cpu_time ? "per CPU-second" : "wall clock");
  for (int mi = 0; mi < 2; mi++)
    for (int s = 0; s < 3; s++)
      for (int kind = 0; kind < 3; kind++) {
        int M = Ms[mi], N = shapes[s][0], K = shapes[s][1], m, n, k, ta, tb;
        const char *what;
        if (kind == 0) {
          m = M;
          n = N;
          k = K;
          ta = 0;
          tb = 1;
          what = "fwd  X W^T";
        } else if (kind == 1) {
          m = M;
          n = K;
          k = N;
          ta = 0;
          tb = 0;
          what = "dX = dY W";
        } else {
          m = N;
          n = K;
          k = M;
          ta = 1;
          tb = 0;
          what = "dW = dY^T X";
        }
        double best[sizeof libs / sizeof libs[0]] = { 0 };
        prepacked = own && kind == 0 ? opx_pack_b(own, 1, k, n, B, ldb_of(tb, k, n)) : NULL;
        pre_bf16 = kind == 0 ? opx_bf16_pack(1, k, n, B, ldb_of(tb, k, n)) : NULL;
        pre_int8 = q8isa && kind == 0 ? opx_q8_pack(q8isa, 1, k, n, B, ldb_of(tb, k, n)) : NULL;
        for (int l = 0; l < nl; l++)
          if (!libs[l].pre || have_pre(libs[l].pre)) run(&libs[l], ta, tb, m, n, k, A, B, C);
        for (int r = 0; r < reps; r++)
          for (int l = 0; l < nl; l++) {
            if (libs[l].pre && !have_pre(libs[l].pre)) continue; /* backward products: no packed weight */
            double t0 = now();
            run(&libs[l], ta, tb, m, n, k, A, B, C);
            double f = 2.0 * m * n * k / (now() - t0) * 1e-9;
            if (f > best[l]) best[l] = f;
          }
        char lab[64];
        snprintf(lab, sizeof lab, "%s N=%d K=%d", what, N, K);
        printf("%-6d %-28s", M, lab);
        for (int l = 0; l < nl; l++) best[l] > 0 ? printf(" %10.1f", best[l]) : printf(" %10s", "-");
        printf("\n");
        opx_packed_b_free(prepacked);
        opx_bf16_free(pre_bf16);
        opx_q8_free(pre_int8);
      }
  free(A);
  free(A16);
  free(B);
  free(C);
  free(bias);
  return 0;
}
