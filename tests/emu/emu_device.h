// Emulated CUDA device, device side (C++ only; included by cuda_runtime.h):
// the kernel-language keywords, built-in indices, barriers and warp
// collectives (rendezvous points of the fiber scheduler, emu_fiber.cpp),
// atomics, integer intrinsics and device math, and the launch call that
// cmake/emu_rewrite.c turns `k<<<grid, block, smem, stream>>>(args)` into.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

// ---------------------------------------------------------------- keywords
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__    __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __constant__ static
// Static __shared__ variables: cmake/emu_rewrite.c gives each declaration one copy per block slot (up to
// emu::kSlots blocks of a launch are in flight at once, BL_EMU_BLOCKS), in the section of its slot, which the
// scheduler refills with NaN bytes (0xff) at each block start; the declared name is a reference to the copy of the
// running block's slot. Only rewritten files (.cu) may declare one.
#define EMU_SHARED_0 static __attribute__((section("emu_shared0")))
#define EMU_SHARED_1 static __attribute__((section("emu_shared1")))
#define EMU_SHARED_2 static __attribute__((section("emu_shared2")))
#define EMU_SHARED_3 static __attribute__((section("emu_shared3")))
#define __shared__   static_assert(false, "__shared__ outside a .cu file: emu_rewrite.c gives it a copy per block slot");
// ---------------------------------------------------------------- vector types
struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
struct __attribute__((aligned(16))) uint4 {
  unsigned x, y, z, w;
};
struct __attribute__((aligned(8))) uint2 {
  unsigned x, y;
};
struct __attribute__((aligned(16))) float4 {
  float x, y, z, w;
};
struct __attribute__((aligned(8))) float2 {
  float x, y;
};
struct __attribute__((aligned(16))) int4 {
  int x, y, z, w;
};
struct __attribute__((aligned(8))) int2 {
  int x, y;
};
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return { x, y, z, w }; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return { x, y }; }
static inline float4 make_float4(float x, float y, float z, float w) { return { x, y, z, w }; }
static inline float2 make_float2(float x, float y) { return { x, y }; }
static inline int4 make_int4(int x, int y, int z, int w) { return { x, y, z, w }; }
static inline int2 make_int2(int x, int y) { return { x, y }; }

namespace emu {
// The GPU thread running now and its block (one host thread runs the fibers of up to kSlots blocks, interleaved).
struct thread_pos {
  uint3 tid;
};
struct block_pos {
  uint3 idx;
  dim3 dim, grid;
};
extern thread_pos *cur;
extern block_pos blk;
// Blocks that may be in flight at once (BL_EMU_BLOCKS); `slot` is the slot of the running block.
constexpr int kSlots = 4;
extern int slot;
template <class T>
static inline T *shared_slot(T *s0, T *s1, T *s2, T *s3) {
  static_assert(kSlots == 4, "emu_rewrite.c writes kSlots copies of each __shared__ variable");
  return slot == 0 ? s0 : slot == 1 ? s1 : slot == 2 ? s2 : s3;
}
// The emu_sharedN sections of each loaded module (library, test program) register themselves for the NaN refill.
void register_shared(int slot, char *begin, char *end);
// With several blocks in flight: the calling GPU thread lets the scheduler run another thread (of any block) first.
// Called at global atomics and fences, where blocks meet.
extern bool interleave;
void yield();
static inline void interleave_point() {
  if (interleave) yield();
}
} // namespace emu
#define EMU_SECTION_BOUNDS_(i)                                                         \
  extern "C" char __start_emu_shared##i[] __attribute__((weak, visibility("hidden"))); \
  extern "C" char __stop_emu_shared##i[] __attribute__((weak, visibility("hidden")));
EMU_SECTION_BOUNDS_(0)
EMU_SECTION_BOUNDS_(1)
EMU_SECTION_BOUNDS_(2)
EMU_SECTION_BOUNDS_(3)
#undef EMU_SECTION_BOUNDS_
namespace {
struct emu_shared_registration {
  emu_shared_registration() {
    ::emu::register_shared(0, __start_emu_shared0, __stop_emu_shared0);
    ::emu::register_shared(1, __start_emu_shared1, __stop_emu_shared1);
    ::emu::register_shared(2, __start_emu_shared2, __stop_emu_shared2);
    ::emu::register_shared(3, __start_emu_shared3, __stop_emu_shared3);
  }
};
[[maybe_unused]] emu_shared_registration emu_shared_registration_;
} // namespace
namespace emu {

// ---- rendezvous points (emu_fiber.cpp)
void syncthreads(const char *file, int line);
int syncthreads_count(const char *file, int line, int pred); // also __syncthreads_and/or
void syncwarp(unsigned mask, const char *file, int line);
// All lanes of `mask` post `bytes` of `mine`; all[j*bytes) receives lane j's value for each lane j in mask.
void warp_gather(unsigned mask, const void *mine, void *all, size_t bytes, const char *what, const char *file,
                 int line);
int lane();
void *dyn_smem();
[[noreturn]] void trap(const char *what, const char *file, int line);

enum shfl_kind { SHFL_IDX, SHFL_XOR, SHFL_UP, SHFL_DOWN };
template <class T>
T shfl(shfl_kind k, const char *what, const char *file, int line, unsigned mask, T v, int arg, int width) {
  static_assert(std::is_trivially_copyable<T>::value, "shuffle of a non-trivial type");
  T all[32];
  warp_gather(mask, &v, all, sizeof(T), what, file, line);
  if (width <= 0 || width > 32 || (width & (width - 1))) trap("shuffle width is not a power of two <= 32", file, line);
  int l = lane(), base = l & ~(width - 1), src = l;
  switch (k) {
    case SHFL_IDX: src = base + (arg & (width - 1)); break;
    case SHFL_XOR:
      src = l ^ arg;
      if (src >= base + width) src = l;
      break;
    case SHFL_UP:
      src = l - arg;
      if (src < base) src = l;
      break;
    case SHFL_DOWN:
      src = l + arg;
      if (src >= base + width) src = l;
      break;
  }
  if (src < 0 || src > 31 || !((mask >> src) & 1u)) trap("shuffle reads a lane outside its mask", file, line);
  return all[src];
}
static inline unsigned ballot(const char *what, const char *file, int line, unsigned mask, int pred) {
  int all[32];
  int p = pred != 0;
  warp_gather(mask, &p, all, sizeof p, what, file, line);
  unsigned b = 0;
  for (int j = 0; j < 32; j++)
    if (((mask >> j) & 1u) && all[j]) b |= 1u << j;
  return b;
}
} // namespace emu

#define threadIdx (::emu::cur->tid)
#define blockIdx  (::emu::blk.idx)
#define blockDim  (::emu::blk.dim)
#define gridDim   (::emu::blk.grid)
static constexpr int warpSize = 32;

#define __syncthreads()        ::emu::syncthreads(__FILE__, __LINE__)
#define __syncthreads_count(p) ::emu::syncthreads_count(__FILE__, __LINE__, (p))
#define __syncthreads_and(p)   (::emu::syncthreads_count(__FILE__, __LINE__, !(p)) == 0)
#define __syncthreads_or(p)    (::emu::syncthreads_count(__FILE__, __LINE__, (p)) != 0)
#define __syncwarp(...)        ::emu::syncwarp(::emu::warp_mask_arg(__VA_ARGS__), __FILE__, __LINE__)
namespace emu {
static inline unsigned warp_mask_arg(unsigned m = 0xffffffffu) { return m; }
} // namespace emu
#define EMU_SHFL_(k, name, m, v, a, w) ::emu::shfl(k, name, __FILE__, __LINE__, (m), (v), (a), (w))
#define EMU_W_(...)                    ::emu::width_arg(__VA_ARGS__)
namespace emu {
static inline int width_arg(int w = 32) { return w; }
} // namespace emu
#define __shfl_sync(m, v, l, ...)      EMU_SHFL_(::emu::SHFL_IDX, "__shfl_sync", m, v, l, EMU_W_(__VA_ARGS__))
#define __shfl_xor_sync(m, v, l, ...)  EMU_SHFL_(::emu::SHFL_XOR, "__shfl_xor_sync", m, v, l, EMU_W_(__VA_ARGS__))
#define __shfl_up_sync(m, v, d, ...)   EMU_SHFL_(::emu::SHFL_UP, "__shfl_up_sync", m, v, d, EMU_W_(__VA_ARGS__))
#define __shfl_down_sync(m, v, d, ...) EMU_SHFL_(::emu::SHFL_DOWN, "__shfl_down_sync", m, v, d, EMU_W_(__VA_ARGS__))
#define __ballot_sync(m, p)            ::emu::ballot("__ballot_sync", __FILE__, __LINE__, (m), (p))
#define __any_sync(m, p)               (::emu::ballot("__any_sync", __FILE__, __LINE__, (m), (p)) != 0u)
#define __all_sync(m, p)               (::emu::ballot("__all_sync", __FILE__, __LINE__, (m), (p)) == (unsigned)(m))
#define __trap()                       ::emu::trap("__trap()", __FILE__, __LINE__)
#define __threadfence()                (::emu::interleave_point(), __atomic_thread_fence(__ATOMIC_SEQ_CST))
#define __threadfence_block()          __atomic_thread_fence(__ATOMIC_SEQ_CST)

// ---------------------------------------------------------------- atomics
// Fibers run on one host thread, but the operations are real atomics so that ThreadSanitizer sees them as such
// (relaxed: atomics order nothing else, as on the GPU). With several blocks in flight each one is a point where
// another thread, maybe of another block, may go first.
#define EMU_ATOMIC_RMW_(name, builtin, T)   \
  static inline T name(T *p, T v) {         \
    ::emu::interleave_point();              \
    return builtin(p, v, __ATOMIC_RELAXED); \
  }
#define EMU_ATOMIC_INT_(T)                                                                                \
  EMU_ATOMIC_RMW_(atomicAdd, __atomic_fetch_add, T)                                                       \
  EMU_ATOMIC_RMW_(atomicSub, __atomic_fetch_sub, T)                                                       \
  EMU_ATOMIC_RMW_(atomicAnd, __atomic_fetch_and, T)                                                       \
  EMU_ATOMIC_RMW_(atomicOr, __atomic_fetch_or, T)                                                         \
  EMU_ATOMIC_RMW_(atomicXor, __atomic_fetch_xor, T)                                                       \
  static inline T atomicExch(T *p, T v) {                                                                 \
    ::emu::interleave_point();                                                                            \
    return __atomic_exchange_n(p, v, __ATOMIC_RELAXED);                                                   \
  }                                                                                                       \
  static inline T atomicCAS(T *p, T cmp, T v) {                                                           \
    ::emu::interleave_point();                                                                            \
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);                   \
    return cmp;                                                                                           \
  }                                                                                                       \
  static inline T atomicMin(T *p, T v) {                                                                  \
    ::emu::interleave_point();                                                                            \
    T o = __atomic_load_n(p, __ATOMIC_RELAXED);                                                           \
    while (v < o && !__atomic_compare_exchange_n(p, &o, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} \
    return o;                                                                                             \
  }                                                                                                       \
  static inline T atomicMax(T *p, T v) {                                                                  \
    ::emu::interleave_point();                                                                            \
    T o = __atomic_load_n(p, __ATOMIC_RELAXED);                                                           \
    while (v > o && !__atomic_compare_exchange_n(p, &o, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} \
    return o;                                                                                             \
  }
EMU_ATOMIC_INT_(int)
EMU_ATOMIC_INT_(unsigned)
EMU_ATOMIC_INT_(unsigned long long)
EMU_ATOMIC_INT_(long long)
#undef EMU_ATOMIC_INT_
#undef EMU_ATOMIC_RMW_
template <class F, class U>
static inline F emu_atomic_float_op_(F *p, F v, F (*op)(F, F)) {
  static_assert(sizeof(F) == sizeof(U), "float/bits size");
  ::emu::interleave_point();
  U o = __atomic_load_n((U *)p, __ATOMIC_RELAXED), n;
  F of, nf;
  do {
    memcpy(&of, &o, sizeof of);
    nf = op(of, v);
    memcpy(&n, &nf, sizeof n);
  } while (!__atomic_compare_exchange_n((U *)p, &o, n, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return of;
}
static inline float atomicAdd(float *p, float v) {
  return emu_atomic_float_op_<float, uint32_t>(p, v, [](float a, float b) { return a + b; });
}
static inline double atomicAdd(double *p, double v) {
  return emu_atomic_float_op_<double, uint64_t>(p, v, [](double a, double b) { return a + b; });
}
static inline float atomicMax(float *p, float v) {
  return emu_atomic_float_op_<float, uint32_t>(p, v, [](float a, float b) { return fmaxf(a, b); });
}
static inline float atomicMin(float *p, float v) {
  return emu_atomic_float_op_<float, uint32_t>(p, v, [](float a, float b) { return fminf(a, b); });
}

// ---------------------------------------------------------------- integer intrinsics
static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }
static inline int __mulhi(int a, int b) { return (int)(((int64_t)a * b) >> 32); }
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
static inline long long __mul64hi(long long a, long long b) { return (long long)(((__int128)a * b) >> 64); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
static inline int __float_as_int(float f) {
  int i;
  memcpy(&i, &f, 4);
  return i;
}
static inline unsigned __float_as_uint(float f) {
  unsigned i;
  memcpy(&i, &f, 4);
  return i;
}
static inline float __int_as_float(int i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}
static inline float __uint_as_float(unsigned i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}
static inline long long __double_as_longlong(double d) {
  long long i;
  memcpy(&i, &d, 8);
  return i;
}
static inline double __longlong_as_double(long long i) {
  double d;
  memcpy(&d, &i, 8);
  return d;
}
template <class T>
static inline T __ldg(const T *p) {
  return *p;
}
// CUDA's min/max overloads of the global namespace.
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline long min(long a, long b) { return a < b ? a : b; }
static inline long max(long a, long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
static inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }

// ---------------------------------------------------------------- device math
// The host libm gives correctly rounded or nearly so results; CUDA's are within a few ulp (tests allow for that).
// Fast intrinsics (__expf...) are computed exactly here: the emulator proves logic, not CUDA's approximation error.
// nvcc contracts a*b+c into an FMA by default; the emulated kernels are compiled with -ffp-contract=off (unless
// BERTLUA_CUDA_EMU_CONTRACT), so kernels that must match the CPU bit for bit spell their roundings with
// __fmul_rn/__fadd_rn/__fmaf_rn.
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
// (macros: glibc declares functions of these names)
#define __expf(x)    expf(x)
#define __logf(x)    logf(x)
#define __sinf(x)    sinf(x)
#define __cosf(x)    cosf(x)
#define __tanhf(x)   tanhf(x)
#define __powf(x, y) powf(x, y)
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __saturatef(float x) { return x != x ? 0.0f : x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
// nvcc never fuses the _rn intrinsics into an FMA; the empty asm (the value must be in a register, rounded) keeps a
// contracting build of the emulated kernels (BERTLUA_CUDA_EMU_CONTRACT) from fusing them after inlining.
static inline float emu_rounded(float x) {
  __asm__("" : "+x"(x));
  return x;
}
static inline double emu_rounded(double x) {
  __asm__("" : "+x"(x));
  return x;
}
static inline float __fmul_rn(float a, float b) { return emu_rounded(a * b); }
static inline float __fadd_rn(float a, float b) { return emu_rounded(a + b); }
static inline float __fsub_rn(float a, float b) { return emu_rounded(a - b); }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dmul_rn(double a, double b) { return emu_rounded(a * b); }
static inline double __dadd_rn(double a, double b) { return emu_rounded(a + b); }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
// sin and cos of pi*x with an exact argument reduction (quadrant n, |f| <= 1/4), as accurate as the GPU's.
static inline void sincospi(double x, double *s, double *c) {
  double r = x - 2.0 * nearbyint(x * 0.5), n = nearbyint(2.0 * r), f = r - 0.5 * n;
  double s0 = sin(M_PI * f), c0 = cos(M_PI * f);
  switch (((int)n % 4 + 4) % 4) {
    case 0:
      *s = s0;
      *c = c0;
      break;
    case 1:
      *s = c0;
      *c = -s0;
      break;
    case 2:
      *s = -s0;
      *c = -c0;
      break;
    default:
      *s = -c0;
      *c = s0;
      break;
  }
}
static inline void sincospif(float x, float *s, float *c) {
  double sd, cd;
  sincospi((double)x, &sd, &cd);
  *s = (float)sd;
  *c = (float)cd;
}
static inline float normcdff(float x) { return 0.5f * erfcf(-x * 0.70710678118654752f); }

// ---------------------------------------------------------------- launches
namespace emu {
struct launch_cfg {
  const char *file;
  int line;
  const char *name;
  const void *fn;
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
};
// Checks the configuration like the hardware (a bad one sets the launch error) and enqueues the grid.
void launch(const launch_cfg &c, std::function<void()> body);

template <class... P>
struct launcher_t {
  launch_cfg c;
  void (*fn)(P...);
  template <class... A>
  void operator()(A &&...a) const {
    static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong number of arguments");
    // Arguments are converted and copied at the launch, as the real launch copies them into the parameter buffer.
    std::tuple<typename std::decay<P>::type...> args(std::forward<A>(a)...);
    auto f = fn;
    launch(c, [f, args]() { std::apply(f, args); });
  }
};
template <class... P>
launcher_t<P...> launcher(const char *file, int line, const char *name, void (*fn)(P...), dim3 grid, dim3 block,
                          size_t smem = 0, cudaStream_t s = 0) {
  return launcher_t<P...>{ { file, line, name, (const void *)fn, grid, block, smem, s }, fn };
}
} // namespace emu
