// Self-test of kernels/ptx.cuh, lane by lane against a host reference. On the emulated device (CI) it checks the
// emu_ptx.h twins; in a real CUDA build (target test_ptx, scripts/gpu_check.sh stage 1) the inline PTX itself, so a
// wrapper whose operands or fragment layout are wrong is pinpointed: the wrapper, the lane, the register and the
// matrix element it should hold. Checks: mma m16n8k16 (bf16, f16) with fragments loaded directly from the documented
// layout (no ldmatrix), the same tile loaded the way tensor-core kernels load it (ldmatrix .x4 for A, .x2.trans
// for B), ldmatrix .x1/.x2/.x4 with and without .trans against the documented element placement, and cp.async
// destinations NaN until their wait_group (emulated device: the real one leaves them undefined), then the source
// bytes, one group at a time. Exits 77 without a CUDA device.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "../../kernels/ptx.cuh"
#include "emu_numeric.h"

static int fails = 0, checks = 0;
#define CHECK(cond, ...)                          \
  do {                                            \
    checks++;                                     \
    if (!(cond)) {                                \
      fails++;                                    \
      printf("FAIL %s:%d: ", __FILE__, __LINE__); \
      printf(__VA_ARGS__);                        \
      printf("\n");                               \
    }                                             \
  } while (0)

static uint64_t rng = 0x2545f4914f6cdd1dull;
static double urand() { // [-1, 1), never 0
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  double u = (double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
  return u == 0.0 ? 0.25 : u;
}

// D (16x8, row-major) = A (16x16, row-major) B (16x8, row-major k x n) + C, one warp.
template <bool BF>
__global__ void mma_tile(const uint16_t *a, const uint16_t *b, const float *c, float *d) {
  __shared__ __align__(16) uint16_t as[16][16];
  __shared__ __align__(16) uint16_t bs[16][8];
  int lane = threadIdx.x, g = lane / 4, q = lane % 4;
  for (int i = lane; i < 256; i += 32) as[i / 16][i % 16] = a[i];
  for (int i = lane; i < 128; i += 32) bs[i / 8][i % 8] = b[i];
  __syncwarp();
  ptx::frag_a fa;
  ptx::frag_b fb;
  ptx::frag_c fc, fd;
  ptx::ldmatrix_x4<false>(fa.x, &as[lane % 16][(lane / 16) * 8]);
  ptx::ldmatrix_x2<true>(fb.x, &bs[lane % 16][0]);
  for (int i = 0; i < 4; i++) fc.x[i] = c[(g + 8 * (i >> 1)) * 8 + 2 * q + (i & 1)];
  if (BF)
    ptx::mma_m16n8k16_bf16(fd, fa, fb, fc);
  else
    ptx::mma_m16n8k16_f16(fd, fa, fb, fc);
  for (int i = 0; i < 4; i++) d[(g + 8 * (i >> 1)) * 8 + 2 * q + (i & 1)] = fd.x[i];
}

// The same product with every fragment register loaded from the documented layout (ptx.cuh's header), so that a
// wrong mma operand order is told apart from a wrong ldmatrix.
template <bool BF>
__global__ void mma_direct(const uint16_t *a, const uint16_t *b, const float *c, float *d) {
  int lane = threadIdx.x, g = lane / 4, q = lane % 4;
  auto pair = [](const uint16_t *m, int lo, int hi) { return (uint32_t)m[lo] | (uint32_t)m[hi] << 16; };
  ptx::frag_a fa;
  ptx::frag_b fb;
  ptx::frag_c fc, fd;
  for (int i = 0; i < 4; i++) { // a0..a7: rows g, g+8 (i & 1), columns 2q.. and 2q+8.. (i >> 1)
    int r = g + 8 * (i & 1), col = 2 * q + 8 * (i >> 1);
    fa.x[i] = pair(a, r * 16 + col, r * 16 + col + 1);
  }
  for (int i = 0; i < 2; i++) fb.x[i] = pair(b, (2 * q + 8 * i) * 8 + g, (2 * q + 8 * i + 1) * 8 + g);
  for (int i = 0; i < 4; i++) fc.x[i] = c[(g + 8 * (i >> 1)) * 8 + 2 * q + (i & 1)];
  if (BF)
    ptx::mma_m16n8k16_bf16(fd, fa, fb, fc);
  else
    ptx::mma_m16n8k16_f16(fd, fa, fb, fc);
  for (int i = 0; i < 4; i++) d[(g + 8 * (i >> 1)) * 8 + 2 * q + (i & 1)] = fd.x[i];
}

// Four 8x8 matrices, matrix i in rows 8i..8i+7 of m, element value 64 i + 8 row + col. out: 14 registers per lane.
__global__ void ldmatrix_all(uint32_t *out) {
  __shared__ __align__(16) uint16_t m[32][8];
  int lane = threadIdx.x;
  for (int i = lane; i < 256; i += 32) m[i / 8][i % 8] = (uint16_t)i;
  __syncwarp();
  uint32_t r1[1], r2[2], r4[4], t1[1], t2[2], t4[4];
  const void *row = &m[lane][0];
  ptx::ldmatrix_x1<false>(r1, row);
  ptx::ldmatrix_x2<false>(r2, row);
  ptx::ldmatrix_x4<false>(r4, row);
  ptx::ldmatrix_x1<true>(t1, row);
  ptx::ldmatrix_x2<true>(t2, row);
  ptx::ldmatrix_x4<true>(t4, row);
  uint32_t *o = out + 14 * lane;
  o[0] = r1[0];
  o[1] = r2[0];
  o[2] = r2[1];
  for (int i = 0; i < 4; i++) o[3 + i] = r4[i];
  o[7] = t1[0];
  o[8] = t2[0];
  o[9] = t2[1];
  for (int i = 0; i < 4; i++) o[10 + i] = t4[i];
}

// Each thread copies 2 x 16 bytes in two groups and records its destination before any wait, after
// wait_group 1 and after wait_group 0 (24 floats per thread).
__global__ void cp_async_groups(const float *src, float *out) {
  __shared__ __align__(16) float s[32][8];
  int t = threadIdx.x;
  ptx::cp_async_16(&s[t][0], src + 8 * t);
  ptx::cp_async_commit();
  ptx::cp_async_16(&s[t][4], src + 8 * t + 4);
  ptx::cp_async_commit();
  for (int i = 0; i < 8; i++) out[24 * t + i] = s[t][i];
  ptx::cp_async_wait<1>();
  for (int i = 0; i < 8; i++) out[24 * t + 8 + i] = s[t][i];
  ptx::cp_async_wait<0>();
  for (int i = 0; i < 8; i++) out[24 * t + 16 + i] = s[t][i];
}

// A destination not yet waited for reads as NaN on the emulated device; on the hardware it is undefined.
#if defined(__CUDACC__)
static const bool kEmulated = false;
#else
static const bool kEmulated = true;
#endif

template <typename T>
static T *dev(const T *h, size_t n) {
  T *d = nullptr;
  cudaMalloc((void **)&d, n * sizeof(T));
  if (h) cudaMemcpy(d, h, n * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

template <bool BF>
static void test_mma() {
  cudaDataType_t t = BF ? CUDA_R_16BF : CUDA_R_16F;
  const char *ty = BF ? "bf16" : "f16";
  uint16_t a[256], b[128];
  float c[128], d[128];
  for (int i = 0; i < 256; i++) emu_store_f(a, t, i, (float)urand());
  for (int i = 0; i < 128; i++) {
    emu_store_f(b, t, i, (float)urand());
    c[i] = (float)urand();
  }
  uint16_t *da = dev(a, 256), *db = dev(b, 128);
  float *dc = dev(c, 128), *dd = dev<float>(nullptr, 128);
  for (int via_ldmatrix = 0; via_ldmatrix < 2; via_ldmatrix++) {
    const char *how = via_ldmatrix ? "loaded by ldmatrix .x4 / .x2.trans" : "fragments loaded directly";
    if (via_ldmatrix)
      mma_tile<BF><<<1, 32>>>(da, db, dc, dd);
    else
      mma_direct<BF><<<1, 32>>>(da, db, dc, dd);
    CHECK(cudaMemcpy(d, dd, sizeof d, cudaMemcpyDeviceToHost) == cudaSuccess, "mma %s launch: %s", ty,
          cudaGetErrorString(cudaGetLastError()));
    // f32 accumulation of 16 exact products and C: |err| <= 17 u (sum |a b| + |c|), u = 2^-24
    int bad = 0;
    double worst = 0;
    for (int m = 0; m < 16; m++)
      for (int n = 0; n < 8; n++) {
        double ref = c[m * 8 + n], mag = fabs(ref);
        for (int k = 0; k < 16; k++) {
          double p = (double)emu_load_f(a, t, m * 16 + k) * emu_load_f(b, t, k * 8 + n);
          ref += p;
          mag += fabs(p);
        }
        double err = fabs(d[m * 8 + n] - ref), tol = 17 * ldexp(1, -24) * mag;
        if (!(err <= tol) && bad++ < 4) // the lane and register of D that hold (m, n)
          printf("  mma %s (%s): D[%d][%d] = %g, want %g: lane %d register d%d\n", ty, how, m, n, d[m * 8 + n], ref,
                 (m % 8) * 4 + n / 2, (m / 8) * 2 + n % 2);
        worst = fmax(worst, err / tol);
      }
    CHECK(bad == 0, "%s mma m16n8k16 (%s): %d of 128 outside the bound (worst %.2f x)", ty, how, bad, worst);
  }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  cudaFree(dd);
}

static void test_ldmatrix() {
  uint32_t out[32 * 14];
  uint32_t *d = dev<uint32_t>(nullptr, 32 * 14);
  ldmatrix_all<<<1, 32>>>(d);
  cudaMemcpy(out, d, sizeof out, cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int l = 0; l < 32; l++) {
    int g = l / 4, q = l % 4;
    auto reg = [&](int mat, bool trans) { // the documented placement: row g, cols 2q, 2q+1 (trans: transposed)
      uint32_t lo = trans ? 64 * mat + 8 * (2 * q) + g : 64 * mat + 8 * g + 2 * q;
      uint32_t hi = trans ? 64 * mat + 8 * (2 * q + 1) + g : 64 * mat + 8 * g + 2 * q + 1;
      return lo | hi << 16;
    };
    const uint32_t *o = out + 14 * l;
    const uint32_t want[14] = { reg(0, 0), reg(0, 0), reg(1, 0), reg(0, 0), reg(1, 0), reg(2, 0), reg(3, 0),
                                reg(0, 1), reg(0, 1), reg(1, 1), reg(0, 1), reg(1, 1), reg(2, 1), reg(3, 1) };
    static const char *what[14] = { "x1 r0",       "x2 r0",       "x2 r1",       "x4 r0",       "x4 r1",
                                    "x4 r2",       "x4 r3",       "x1.trans r0", "x2.trans r0", "x2.trans r1",
                                    "x4.trans r0", "x4.trans r1", "x4.trans r2", "x4.trans r3" };
    for (int i = 0; i < 14; i++)
      if (o[i] != want[i] && bad++ < 6) // elements are 64 matrix + 8 row + col: decode what arrived
        printf("  ldmatrix .%s lane %d: got elements %u, %u (matrix %u row %u col %u), want %u, %u\n", what[i], l,
               o[i] & 0xffff, o[i] >> 16, (o[i] & 0xffff) / 64, (o[i] & 0xffff) / 8 % 8, (o[i] & 0xffff) % 8,
               want[i] & 0xffff, want[i] >> 16);
  }
  CHECK(bad == 0, "ldmatrix: %d of %d registers misplaced", bad, 32 * 14);
  cudaFree(d);
}

static void test_cp_async() {
  float src[256], out[32 * 24];
  for (int i = 0; i < 256; i++) src[i] = (float)i + 0.5f;
  float *ds = dev(src, 256), *dout = dev<float>(nullptr, 32 * 24);
  cp_async_groups<<<1, 32>>>(ds, dout);
  cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost);
  int early = 0, first = 0, all = 0;
  for (int t = 0; t < 32; t++) {
    const float *o = out + 24 * t;
    for (int i = 0; i < 8; i++) {
      early += kEmulated && !isnan(o[i]);
      first += i < 4 ? o[8 + i] != src[8 * t + i] : kEmulated && !isnan(o[8 + i]);
      all += o[16 + i] != src[8 * t + i];
    }
  }
  CHECK(early == 0, "cp.async: %d destination values readable before any wait", early);
  CHECK(first == 0, "cp.async: wait_group 1 completed the wrong groups (%d values)", first);
  CHECK(all == 0, "cp.async: %d values wrong after wait_group 0", all);
  cudaFree(ds);
  cudaFree(dout);
}

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("test_ptx: skipped, no CUDA device\n");
    return 77;
  }
  test_mma<true>();
  test_mma<false>();
  test_ldmatrix();
  test_cp_async();
  printf("%d checks, %d failures\n", checks, fails);
  return fails ? 1 : 0;
}
