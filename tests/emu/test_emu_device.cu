// Self-test of the emulated CUDA device (built only with -DBERTLUA_CUDA_EMU=ON): warp collectives, barriers,
// shared memory, launch limits, stream/event ordering, counters and the faults it must report. Each expected
// fault runs in a forked child (a fault is sticky on its device, as on a GPU) and the parent checks its message.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <string>
extern "C" {
#include "bertlua.h"
}

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
#define CU(expr)                                                         \
  do {                                                                   \
    cudaError_t e_ = (expr);                                             \
    CHECK(e_ == cudaSuccess, "%s -> %s", #expr, cudaGetErrorString(e_)); \
  } while (0)

static uint64_t rng = 88172645463325252ull;
static uint32_t next_u32() {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)rng;
}

// ---------------------------------------------------------------- kernels
__global__ void shuffles(const int *in, int *out, int width) {
  int i = blockIdx.x * blockDim.x + threadIdx.x, v = in[i];
  out[6 * i + 0] = __shfl_xor_sync(0xffffffffu, v, 5, width);
  out[6 * i + 1] = __shfl_down_sync(0xffffffffu, v, 3, width);
  out[6 * i + 2] = __shfl_up_sync(0xffffffffu, v, 2, width);
  out[6 * i + 3] = __shfl_sync(0xffffffffu, v, 7, width);
  out[6 * i + 4] = (int)__ballot_sync(0xffffffffu, v & 1);
  out[6 * i + 5] = __any_sync(0xffffffffu, v == 12345) * 2 + __all_sync(0xffffffffu, v >= 0);
}

__global__ void count_and_shared(const int *in, int *out) {
  __shared__ unsigned fresh[4];
  __shared__ int acc[256];
  unsigned before = fresh[threadIdx.x & 3]; // never written: must read as the NaN fill
  acc[threadIdx.x] = in[blockIdx.x * blockDim.x + threadIdx.x];
  int c = __syncthreads_count(acc[threadIdx.x] > 0);
  int sum = 0;
  for (unsigned j = 0; j < blockDim.x; j++) sum += acc[(threadIdx.x + j) % blockDim.x];
  __syncthreads();
  out[3 * (blockIdx.x * blockDim.x + threadIdx.x) + 0] = c;
  out[3 * (blockIdx.x * blockDim.x + threadIdx.x) + 1] = sum;
  out[3 * (blockIdx.x * blockDim.x + threadIdx.x) + 2] = (int)before;
  if (threadIdx.x == 0) fresh[0] = 0; // the next block must see the fill again
}

__global__ void dyn_fill(unsigned *out) {
  extern __shared__ unsigned dyn[];
  out[threadIdx.x] = dyn[threadIdx.x];
  __syncthreads();
  dyn[threadIdx.x] = 0;
}

__global__ void early_exit(int *out, int n) {
  __shared__ int s[64];
  if ((int)threadIdx.x >= n) return; // exited threads count as arrived at the barrier
  s[threadIdx.x] = (int)threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = s[n - 1 - threadIdx.x];
}

__global__ void atomics(unsigned long long *mn, int *orv, float *sum, unsigned *mx) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  atomicMin(mn, (unsigned long long)(1000 - i));
  atomicOr(orv, 1 << (i % 31));
  atomicAdd(sum, 0.5f);
  atomicMax(mx, i * 3u);
}

__global__ void divergent_barrier(int *out) {
  if (threadIdx.x < 16)
    __syncthreads();
  else
    __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void missing_lane(int *out) {
  int v = (int)threadIdx.x;
  if (threadIdx.x != 7) v = __shfl_xor_sync(0xffffffffu, v, 1);
  out[threadIdx.x] = v;
}

__global__ void touch(float *p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += 1.0f;
}

__global__ void big_block(int *out) { out[threadIdx.x] = 1; }

// ---------------------------------------------------------------- helpers
// Runs fn in a child; returns its stderr and sets *status to its wait status.
template <class F>
static std::string in_child(F fn, int *status) {
  int fd[2];
  if (pipe(fd) != 0) {
    perror("pipe");
    exit(1);
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd[1], 2);
    close(fd[0]);
    fn();
    fflush(stderr);
    _exit(0);
  }
  close(fd[1]);
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd[0], buf, sizeof buf)) > 0) text.append(buf, (size_t)n);
  close(fd[0]);
  waitpid(pid, status, 0);
  printf("expected fault, reported as:\n%s", text.c_str());
  return text;
}

static int *dev_ints(const int *h, int n) {
  int *d = nullptr;
  CU(cudaMalloc((void **)&d, sizeof(int) * (size_t)n));
  if (h) CU(cudaMemcpy(d, h, sizeof(int) * (size_t)n, cudaMemcpyHostToDevice));
  return d;
}

// ---------------------------------------------------------------- tests
static void test_shuffles() {
  const int n = 96; // three warps
  for (int width : { 32, 16, 8 }) {
    int h[n], got[6 * n];
    for (int i = 0; i < n; i++) h[i] = (int)(next_u32() % 1000);
    h[40] = 12345;
    int *d = dev_ints(h, n), *o = dev_ints(nullptr, 6 * n);
    shuffles<<<1, n>>>(d, o, width);
    CU(cudaGetLastError());
    CU(cudaMemcpy(got, o, sizeof got, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) {
      int w = i / 32 * 32, l = i % 32, base = l / width * width;
      int x = l ^ 5, dn = l + 3, up = l - 2, idx = base + 7 % width;
      int ex = x < base + width ? h[w + x] : h[i];
      int ed = dn < base + width ? h[w + dn] : h[i];
      int eu = up >= base ? h[w + up] : h[i];
      unsigned bal = 0;
      int any = 0, all = 1;
      for (int j = 0; j < 32; j++) {
        bal |= (unsigned)(h[w + j] & 1) << j;
        any |= h[w + j] == 12345;
        all &= h[w + j] >= 0;
      }
      CHECK(got[6 * i] == ex && got[6 * i + 1] == ed && got[6 * i + 2] == eu && got[6 * i + 3] == h[w + idx],
            "width %d lane %d: xor %d/%d down %d/%d up %d/%d idx %d/%d", width, i, got[6 * i], ex, got[6 * i + 1], ed,
            got[6 * i + 2], eu, got[6 * i + 3], h[w + idx]);
      CHECK((unsigned)got[6 * i + 4] == bal && got[6 * i + 5] == any * 2 + all, "votes lane %d", i);
    }
    cudaFree(d);
    cudaFree(o);
  }
}

static void test_barriers_and_shared() {
  const int nb = 3, nt = 256, n = nb * nt;
  int h[n], got[3 * n];
  for (int i = 0; i < n; i++) h[i] = (int)(next_u32() % 200) - 100;
  int *d = dev_ints(h, n), *o = dev_ints(nullptr, 3 * n);
  count_and_shared<<<nb, nt>>>(d, o);
  CU(cudaMemcpy(got, o, sizeof got, cudaMemcpyDeviceToHost));
  for (int b = 0; b < nb; b++) {
    int c = 0, s = 0;
    for (int t = 0; t < nt; t++) {
      c += h[b * nt + t] > 0;
      s += h[b * nt + t];
    }
    for (int t = 0; t < nt; t++) {
      int i = b * nt + t;
      CHECK(got[3 * i] == c && got[3 * i + 1] == s, "block %d thread %d: count %d/%d sum %d/%d", b, t, got[3 * i], c,
            got[3 * i + 1], s);
      CHECK((unsigned)got[3 * i + 2] == 0xffffffffu, "static shared memory at block start: 0x%08x", got[3 * i + 2]);
    }
  }
  unsigned *u = nullptr, hu[64];
  CU(cudaMalloc((void **)&u, sizeof hu));
  for (int rep = 0; rep < 2; rep++) {
    dyn_fill<<<1, 64, 64 * sizeof(unsigned)>>>(u);
    CU(cudaMemcpy(hu, u, sizeof hu, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 64; i++) CHECK(hu[i] == 0xffffffffu, "dynamic shared memory at block start: 0x%08x", hu[i]);
  }
  int e[64];
  early_exit<<<1, 64>>>(o, 40);
  CU(cudaMemcpy(e, o, sizeof e, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 40; i++) CHECK(e[i] == 39 - i, "early exit: thread %d read %d", i, e[i]);
  cudaFree(d);
  cudaFree(o);
  cudaFree(u);
}

static void test_atomics() {
  unsigned long long *mn;
  int *orv;
  float *sum;
  unsigned *mx;
  CU(cudaMalloc((void **)&mn, 8));
  CU(cudaMalloc((void **)&orv, 4));
  CU(cudaMalloc((void **)&sum, 4));
  CU(cudaMalloc((void **)&mx, 4));
  unsigned long long big = ~0ull;
  CU(cudaMemcpy(mn, &big, 8, cudaMemcpyHostToDevice));
  CU(cudaMemset(orv, 0, 4));
  CU(cudaMemset(sum, 0, 4));
  CU(cudaMemset(mx, 0, 4));
  atomics<<<4, 250>>>(mn, orv, sum, mx);
  unsigned long long hmn;
  int hor;
  float hs;
  unsigned hmx;
  CU(cudaMemcpy(&hmn, mn, 8, cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(&hor, orv, 4, cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(&hs, sum, 4, cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(&hmx, mx, 4, cudaMemcpyDeviceToHost));
  CHECK(hmn == 1 && hor == 0x7fffffff && hs == 500.0f && hmx == 999u * 3, "atomics: min %llu or 0x%x sum %g max %u",
        hmn, hor, hs, hmx);
  cudaFree(mn);
  cudaFree(orv);
  cudaFree(sum);
  cudaFree(mx);
}

static void test_launch_limits() {
  int *o = dev_ints(nullptr, 1024);
  big_block<<<1, 1025>>>(o);
  CHECK(cudaPeekAtLastError() == cudaErrorInvalidConfiguration, "1025 threads: peek");
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "1025 threads: get");
  CHECK(cudaGetLastError() == cudaSuccess, "the launch error is cleared by cudaGetLastError");
  big_block<<<dim3(1, 65536), 1>>>(o);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "grid.y 65536");
  big_block<<<dim3(1, 1, 1), dim3(1, 1, 65)>>>(o);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "block.z 65");
  big_block<<<1, 1024>>>(o);
  CHECK(cudaGetLastError() == cudaSuccess, "1024 threads");
  dyn_fill<<<1, 64, 49 * 1024>>>((unsigned *)o);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue, "49 KB of dynamic shared memory without the opt-in");
  CHECK(cudaFuncSetAttribute(dyn_fill, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024) != cudaSuccess,
        "opt-in above 227 KB");
  cudaGetLastError();
  CU(cudaFuncSetAttribute(dyn_fill, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024));
  dyn_fill<<<1, 64, 100 * 1024>>>((unsigned *)o);
  CHECK(cudaGetLastError() == cudaSuccess, "100 KB after the opt-in");
  CU(cudaDeviceSynchronize());
  cudaFree(o);
}

static void test_streams_and_counters() {
  bl_cuda_count c0, c1;
  CHECK(bl_cuda_counters(0, &c0) == 0, "counters: %s", bl_last_error());
  float *d, *pin;
  const int n = 1000;
  CU(cudaMalloc((void **)&d, n * sizeof(float)));
  CU(cudaHostAlloc((void **)&pin, n * sizeof(float), cudaHostAllocDefault));
  for (int i = 0; i < n; i++) pin[i] = (float)i;
  cudaStream_t a, b;
  CU(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CU(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  CU(cudaMemcpyAsync(d, pin, n * sizeof(float), cudaMemcpyHostToDevice, a));
  touch<<<(n + 255) / 256, 256, 0, a>>>(d, n);
  cudaEvent_t ev;
  CU(cudaEventCreate(&ev));
  CU(cudaEventRecord(ev, a));
  CU(cudaStreamWaitEvent(b, ev, 0));
  CU(cudaMemcpyAsync(pin, d, n * sizeof(float), cudaMemcpyDeviceToHost, b));
  CHECK(pin[10] == 10.0f, "a pinned buffer read without synchronising still holds the old data (%g)", pin[10]);
  CU(cudaStreamSynchronize(b)); // runs b, and a first because b waits for its event
  CHECK(pin[10] == 11.0f && pin[n - 1] == (float)n, "after the synchronisation: %g %g", pin[10], pin[n - 1]);
  CHECK(bl_cuda_counters(0, &c1) == 0, "counters");
  CHECK(c1.mallocs == c0.mallocs + 1 && c1.launches == c0.launches + 1 && c1.syncs == c0.syncs + 1,
        "counters: mallocs +%lld launches +%lld syncs +%lld", (long long)(c1.mallocs - c0.mallocs),
        (long long)(c1.launches - c0.launches), (long long)(c1.syncs - c0.syncs));
  // An event destroyed while its record is still queued (runtime.cu's peer copies do this): the record must not
  // touch the freed event when the stream runs it (a heap-use-after-free under the TSan build otherwise).
  CU(cudaMemcpyAsync(d, pin, n * sizeof(float), cudaMemcpyHostToDevice, a));
  cudaEvent_t gone;
  CU(cudaEventCreateWithFlags(&gone, cudaEventDisableTiming));
  CU(cudaEventRecord(gone, a));
  CU(cudaStreamWaitEvent(b, gone, 0));
  CU(cudaEventDestroy(gone));
  // Small blocks allocated now likely reuse the event's memory (LIFO allocator caches): they must stay untouched.
  unsigned char *probe[8];
  for (int k = 0; k < 8; k++) {
    probe[k] = (unsigned char *)malloc(16 + 8 * (size_t)k);
    memset(probe[k], 0x5a, 16 + 8 * (size_t)k);
  }
  CU(cudaStreamSynchronize(b));
  CU(cudaStreamSynchronize(a));
  for (int k = 0; k < 8; k++) {
    int changed = 0;
    for (int i = 0; i < 16 + 8 * k; i++) changed += probe[k][i] != 0x5a;
    CHECK(changed == 0, "a queued record wrote %d bytes into memory freed with its event", changed);
    free(probe[k]);
  }
  // A stream destroyed while an event recorded on it is still used, as the real runtime allows.
  cudaStream_t c;
  CU(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
  CU(cudaMemcpyAsync(d, pin, n * sizeof(float), cudaMemcpyHostToDevice, c));
  CU(cudaEventCreateWithFlags(&gone, cudaEventDisableTiming));
  CU(cudaEventRecord(gone, c));
  CU(cudaStreamDestroy(c));
  for (int k = 0; k < 8; k++) probe[k] = (unsigned char *)calloc(1, 80 + 8 * (size_t)k); // reuse its memory
  CU(cudaStreamWaitEvent(b, gone, 0));
  CU(cudaStreamSynchronize(b));
  CU(cudaEventSynchronize(gone));
  CU(cudaEventDestroy(gone));
  for (int k = 0; k < 8; k++) free(probe[k]);
  CU(cudaFree(d));
  CHECK(bl_cuda_counters(0, &c1) == 0 && c1.frees == c0.frees + 1, "counters: frees");
  CHECK(bl_cuda_counters(7, &c1) != 0, "counters of a missing device fail");
  cudaEventDestroy(ev);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  cudaFreeHost(pin);
}

// Independent references: GCC's _Float16 conversion for half; nearest of the two bf16 neighbours in double for bf16.
static void test_half_conversions() {
  int bad_h = 0, bad_b = 0;
  for (int k = 0; k < 3000000; k++) {
    float f;
    uint32_t bits = next_u32();
    if (k < 65536 * 3) { // every half value, the midpoints to its neighbour, and one ulp either side of them
      uint16_t hb = (uint16_t)((k / 3) & 0x7fff), hb1 = (uint16_t)(hb + 1);
      _Float16 hv, hw;
      memcpy(&hv, &hb, 2);
      memcpy(&hw, &hb1, 2);
      float v = (float)hv, w = (float)hw;
      float mid = (float)(((double)v + (double)w) / 2);
      uint32_t mb;
      memcpy(&mb, &mid, 4);
      mb += (uint32_t)(k % 3) - 1u;
      memcpy(&f, &mb, 4);
      if (k & 1) f = -f;
    } else {
      memcpy(&f, &bits, 4);
    }
    _Float16 ref = (_Float16)f;
    uint16_t rb;
    memcpy(&rb, &ref, 2);
    uint16_t got = __half_as_ushort(__float2half_rn(f));
    if (f != f) {
      if (got != 0x7fffu) bad_h++;
    } else if (got != rb) {
      if (bad_h++ < 3) printf("half(%a): 0x%04x, reference 0x%04x\n", f, got, rb);
    } else if (!isnan(f) && __half2float(__ushort_as_half(got)) != (float)ref)
      bad_h++;
    uint32_t fb;
    memcpy(&fb, &f, 4);
    if (f != f) {
      if (__bfloat16_as_ushort(__float2bfloat16_rn(f)) != 0x7fffu) bad_b++;
      continue;
    }
    uint32_t lo = fb & 0xffff0000u, hi = lo + 0x10000u;
    float flo, fhi;
    memcpy(&flo, &lo, 4);
    memcpy(&fhi, &hi, 4);
    // above the largest bf16, the next "value" is 2^128 (what rounding to infinity is measured against)
    double dl = fabs((double)f - flo),
           dh = isinf(fhi) || isnan(fhi) ? fabs(copysign(ldexp(1.0, 128), f) - f) : fabs((double)fhi - f);
    uint32_t want = (dl < dh || (dl == dh && !((lo >> 16) & 1u))) ? lo : hi;
    if ((lo & 0x7fffffffu) == 0x7f800000u) want = lo; // infinity itself
    if ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(f)) << 16 != want) {
      if (bad_b++ < 3)
        printf("bf16(%a): 0x%04x, reference 0x%04x\n", f, __bfloat16_as_ushort(__float2bfloat16_rn(f)), want >> 16);
    }
  }
  CHECK(bad_h == 0, "%d float->half conversions differ from round-to-nearest-even", bad_h);
  CHECK(bad_b == 0, "%d float->bf16 conversions differ from round-to-nearest-even", bad_b);
}

static void test_faults() {
  int st = 0;
  std::string out = in_child(
      [] {
        int *o = dev_ints(nullptr, 64);
        divergent_barrier<<<1, 64>>>(o);
        cudaError_t e = cudaDeviceSynchronize();
        fprintf(stderr, "sync: %s\n", cudaGetErrorName(e));
        fprintf(stderr, "later: %s\n", cudaGetErrorName(cudaMemset(o, 0, 4)));
      },
      &st);
  CHECK(out.find("divergent __syncthreads") != std::string::npos &&
            out.find("divergent_barrier") != std::string::npos &&
            out.find("test_emu_device.cu:") != std::string::npos && out.find("BL_EMU_SEED=") != std::string::npos &&
            out.find("sync: cudaErrorLaunchFailure") != std::string::npos &&
            out.find("later: cudaErrorLaunchFailure") != std::string::npos,
        "divergent barrier report (sticky error): %s", out.c_str());
  out = in_child(
      [] {
        int *o = dev_ints(nullptr, 32);
        missing_lane<<<1, 32>>>(o);
        cudaDeviceSynchronize();
      },
      &st);
  CHECK(out.find("__shfl_xor_sync") != std::string::npos && out.find("missing_lane") != std::string::npos &&
            out.find("lane 7 has exited") != std::string::npos,
        "warp collective with a lane missing: %s", out.c_str());
  out = in_child(
      [] {
        float *d = nullptr;
        cudaMalloc((void **)&d, 4096);
        fprintf(stderr, "value %g\n", d[100]); // host code reading device memory
      },
      &st);
  CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV &&
            out.find("host code dereferenced device memory") != std::string::npos &&
            out.find("byte 400 of an allocation of 4096 bytes") != std::string::npos,
        "host dereference of a device pointer: status 0x%x, %s", st, out.c_str());
}

int main(void) {
  int n = 0;
  CU(cudaGetDeviceCount(&n));
  CHECK(n == 2, "two emulated devices by default (got %d)", n);
  cudaDeviceProp p;
  CU(cudaGetDeviceProperties(&p, 1));
  CHECK(p.multiProcessorCount == 132 && p.major == 9 && p.sharedMemPerMultiprocessor == 228 * 1024,
        "H100-like properties");
  test_shuffles();
  test_barriers_and_shared();
  test_atomics();
  test_launch_limits();
  test_streams_and_counters();
  test_half_conversions();
  test_faults();
  printf("%d checks, %d failures\n", checks, fails);
  return fails ? 1 : 0;
}
