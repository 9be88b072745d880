// CUDA device layer: device discovery, memory and copies, the per-device
// stream every kernel runs on, pinned host memory, and the error plumbing of
// kernels/common.cuh. A caching allocator keeps freed blocks per (device,
// size class) so the training loop never calls cudaMalloc/cudaFree once
// warmed up. Freed blocks are reused immediately: that is safe because all
// kernels of a device run on one stream (work is ordered) and the stream is a
// blocking one, so legacy-stream copies (bl_dev_memcpy) also wait for it.
#include <cuda_runtime.h>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>
#include <cstring>
#include "common.cuh"

namespace {
// The step-time model's record of a copy: over PCIe to or from the host, in device memory otherwise.
void copy_cost(int dev, int dst_device, int src_device, size_t n) {
  if (dst_device < 0 || src_device < 0) cu_cost_call(dev, "host copy", "cudaMemcpy", BL_ENGINE_PCIE, 0, (double)n);
  else cu_cost_call(dev, "copy", "cudaMemcpy d2d", BL_ENGINE_MEM, 0, 2.0 * n);
}

std::mutex pool_mu;
// size class -> free blocks, per device
std::unordered_map<int, std::unordered_map<size_t, std::vector<void *>>> pool;
std::unordered_map<void *, size_t> block_size;

size_t size_class(size_t n) {
  if (n <= 512) return 512;
  size_t c = 512;
  while (c < n) c <<= 1;
  // power-of-two classes waste up to 2x; above 64 MiB round to 2 MiB instead
  if (n > (64u << 20)) c = (n + (2u << 20) - 1) & ~((size_t)(2u << 20) - 1);
  return c;
}

// Calls of this device layer, for bl_cuda_counters in a real-GPU build (the emulator counts every call itself).
struct counts { std::atomic<int64_t> syncs{0}, mallocs{0}, frees{0}; };
counts call_counts[64];
void count_call(int dev, std::atomic<int64_t> counts::*which) {
  if (dev >= 0 && dev < 64) (call_counts[dev].*which)++;
}

int cuda_error(cudaError_t e, const char *op, int device) {
  return bl_set_error(BL_EDEVICE, "%s: cuda:%d: %s", op, device, cudaGetErrorString(e));
}
}  // namespace

extern "C" int bl_cuda_compiled(void) { return 1; }
extern "C" int bl_nccl_compiled(void) {
#ifdef BL_HAVE_NCCL
  return 1;
#else
  return 0;
#endif
}

extern "C" int bl_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) { cudaGetLastError(); return 0; }
  return n;
}

extern "C" int bl_cuda_device_name(int device, char *buf, int buflen) {
  cudaDeviceProp prop;
  cudaError_t e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess) return cuda_error(e, "device_name", device);
  snprintf(buf, (size_t)buflen, "%s (sm_%d%d, %.1f GiB)", prop.name, prop.major, prop.minor,
           prop.totalGlobalMem / 1073741824.0);
  return 0;
}

extern "C" int bl_dev_check(int device, const char *op) {
  int n = bl_cuda_device_count();
  if (n == 0) return bl_set_error(BL_EDEVICE, "%s: cuda:%d requested, but no CUDA device is available", op, device);
  if (device >= n) return bl_set_error(BL_EDEVICE, "%s: cuda:%d requested, but only %d CUDA device(s) exist", op, device, n);
  return 0;
}

extern "C" int bl_dev_malloc(int device, size_t n, void **p) {
  *p = nullptr;
  int rc = bl_dev_check(device, "malloc");
  if (rc) return rc;
  size_t c = size_class(n);
  {
    std::lock_guard<std::mutex> g(pool_mu);
    auto &v = pool[device][c];
    if (!v.empty()) { *p = v.back(); v.pop_back(); return 0; }
  }
  cudaSetDevice(device);
  count_call(device, &counts::mallocs);
  cudaError_t e = cudaMalloc(p, c);
  if (e == cudaErrorMemoryAllocation) {
    // release cached blocks and retry once
    cudaGetLastError();
    std::lock_guard<std::mutex> g(pool_mu);
    for (auto &kv : pool[device]) {
      for (void *q : kv.second) { count_call(device, &counts::frees); cudaFree(q); block_size.erase(q); }
      kv.second.clear();
    }
    e = cudaMalloc(p, c);
  }
  if (e != cudaSuccess) { *p = nullptr; return bl_set_error(BL_ENOMEM, "malloc: cuda:%d: cannot allocate %zu bytes: %s", device, n, cudaGetErrorString(e)); }
  std::lock_guard<std::mutex> g(pool_mu);
  block_size[*p] = c;
  return 0;
}

extern "C" void bl_dev_free(int device, void *p) {
  if (!p) return;
  std::lock_guard<std::mutex> g(pool_mu);
  auto it = block_size.find(p);
  if (it == block_size.end()) return;
  pool[device][it->second].push_back(p);
}

extern "C" int bl_dev_memcpy(int dst_device, void *dst, int src_device, const void *src, size_t n) {
  if (n == 0) return 0;
  if (dst_device < 0 && src_device < 0) { memcpy(dst, src, n); return 0; }
  cudaMemcpyKind kind = dst_device < 0 ? cudaMemcpyDeviceToHost : src_device < 0 ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice;
  int dev = dst_device >= 0 ? dst_device : src_device;
  cudaSetDevice(dev);
  count_call(dev, &counts::syncs);
  copy_cost(dev, dst_device, src_device, n);
  cudaError_t e = cudaMemcpy(dst, src, n, kind);
  if (e != cudaSuccess) return cuda_error(e, "copy", dev);
  return 0;
}

extern "C" int bl_dev_memset(int device, void *p, int value, size_t n) {
  if (device < 0) { memset(p, value, n); return 0; }
  cudaSetDevice(device);
  cu_cost_call(device, "memset", "cudaMemset", BL_ENGINE_MEM, 0, (double)n);
  cudaError_t e = cudaMemset(p, value, n);
  if (e != cudaSuccess) return cuda_error(e, "memset", device);
  return 0;
}

// ---------------------------------------------------------------- streams and errors (common.cuh)
namespace {
std::mutex stream_mu;
std::unordered_map<int, cudaStream_t> streams;
}

int cu_err(const char *op, int dev, cudaError_t e) {
  return bl_set_error(BL_EDEVICE, "%s: cuda:%d: %s", op, dev, cudaGetErrorString(e));
}

int cu_launched(const char *op, int dev) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return bl_set_error(BL_EDEVICE, "%s: cuda:%d: kernel launch failed: %s", op, dev, cudaGetErrorString(e));
#ifndef NDEBUG
  e = cudaStreamSynchronize(cu_stream(dev));
  if (e != cudaSuccess) return bl_set_error(BL_EDEVICE, "%s: cuda:%d: kernel failed: %s", op, dev, cudaGetErrorString(e));
#endif
  return 0;
}

// Launch-path lookup: a lock-free cache in front of bl_cuda_stream (streams are
// created once and never destroyed).
static std::atomic<cudaStream_t> stream_cache[64];
cudaStream_t cu_stream(int dev) {
  if (dev >= 0 && dev < 64) {
    cudaStream_t s = stream_cache[dev].load(std::memory_order_acquire);
    if (s) { cudaSetDevice(dev); return s; }
  }
  cudaStream_t s = (cudaStream_t)bl_cuda_stream(dev);
  if (s && dev >= 0 && dev < 64) stream_cache[dev].store(s, std::memory_order_release);
  return s;
}

extern "C" void *bl_cuda_stream(int device) {
  if (bl_dev_check(device, "stream")) return nullptr;
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) { cu_err("stream", device, e); return nullptr; }
  std::lock_guard<std::mutex> g(stream_mu);
  auto it = streams.find(device);
  if (it != streams.end()) return (void *)it->second;
  cudaStream_t s = nullptr;
  // Blocking (not cudaStreamNonBlocking): legacy default stream work, e.g.
  // cudaMemcpy/cudaMemset in bl_dev_memcpy/bl_dev_memset, is ordered with it.
  e = cudaStreamCreateWithFlags(&s, cudaStreamDefault);
  if (e != cudaSuccess) { cu_err("stream", device, e); return nullptr; }
  streams[device] = s;
  return (void *)s;
}

extern "C" int bl_cuda_synchronize(int device) {
  void *s = bl_cuda_stream(device);
  if (!s) return BL_EDEVICE;
  count_call(device, &counts::syncs);
  cudaError_t e = cudaStreamSynchronize((cudaStream_t)s);
  if (e != cudaSuccess) return cu_err("synchronize", device, e);
  return 0;
}

int cu_device(const char *op, int n, const bl_tensor *const *ts, int *dev) {
  int d = -2;
  for (int i = 0; i < n; i++) {
    if (!ts[i]) continue;
    if (d == -2) d = ts[i]->device;
    else if (ts[i]->device != d)
      return bl_set_error(BL_EINVAL, "%s: tensors are on different devices (%d and %d)", op, d, ts[i]->device);
  }
  if (d < 0) return bl_set_error(BL_EINVAL, "%s: CUDA op called with CPU tensors", op);
  BL_CHECK(bl_dev_check(d, op));
  if (!bl_cuda_stream(d)) return BL_EDEVICE;
  *dev = d;
  return 0;
}

int cu_mem::alloc(const char *op, int device, size_t bytes) {
  if (p) { bl_dev_free(dev, p); p = nullptr; }
  dev = device;
  int rc = bl_dev_malloc(device, bytes ? bytes : 16, &p);
  if (rc) { p = nullptr; return bl_set_error(rc, "%s: cuda:%d: cannot allocate %zu bytes of scratch", op, device, bytes); }
  return 0;
}

// ---------------------------------------------------------------- pinned host memory, async copies
extern "C" int bl_cuda_host_alloc(size_t n, void **p) {
  *p = nullptr;
  cudaError_t e = cudaHostAlloc(p, n ? n : 1, cudaHostAllocPortable);
  if (e != cudaSuccess) { *p = nullptr; cudaGetLastError(); return bl_set_error(BL_ENOMEM, "host_alloc: cannot pin %zu bytes: %s", n, cudaGetErrorString(e)); }
  return 0;
}

extern "C" void bl_cuda_host_free(void *p) {
  if (p) cudaFreeHost(p);
}

extern "C" int bl_cuda_memcpy_async(int dst_device, void *dst, int src_device, const void *src, size_t n) {
  if (n == 0) return 0;
  if (dst_device < 0 && src_device < 0) { memcpy(dst, src, n); return 0; }
  int dev = dst_device >= 0 ? dst_device : src_device;
  void *s = bl_cuda_stream(dev);
  if (!s) return BL_EDEVICE;
  cudaMemcpyKind kind = dst_device < 0 ? cudaMemcpyDeviceToHost : src_device < 0 ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice;
  copy_cost(dev, dst_device, src_device, n);
  if (dst_device >= 0 && src_device >= 0 && dst_device != src_device) {
    CU_TRY("copy_async", dev, cudaMemcpyPeerAsync(dst, dst_device, src, src_device, n, (cudaStream_t)s));
    return 0;
  }
  CU_TRY("copy_async", dev, cudaMemcpyAsync(dst, src, n, kind, (cudaStream_t)s));
  return 0;
}

extern "C" int bl_cuda_counters(int device, bl_cuda_count *out) {
  memset(out, 0, sizeof *out);
  BL_CHECK(bl_dev_check(device, "counters"));
#ifdef BL_CUDA_EMU
  emu_counters c;
  if (emu_get_counters(device, &c) != 0) return bl_set_error(BL_EDEVICE, "counters: cuda:%d: no such device", device);
  *out = bl_cuda_count{c.syncs, c.mallocs, c.frees, c.launches};
#else
  if (device >= 64) return bl_set_error(BL_EINVAL, "counters: cuda:%d: only devices 0..63 are counted", device);
  const counts &k = call_counts[device];
  *out = bl_cuda_count{k.syncs.load(), k.mallocs.load(), k.frees.load(), -1};
#endif
  return 0;
}
