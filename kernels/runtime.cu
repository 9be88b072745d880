// CUDA device layer: device discovery, memory and copies. A caching allocator
// keeps freed blocks per (device, size class) so the training loop never calls
// cudaMalloc/cudaFree once warmed up.
#include <cuda_runtime.h>
#include <mutex>
#include <unordered_map>
#include <vector>
#include <cstring>
extern "C" {
#include "../src/base/internal.h"
}

namespace {
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
  cudaError_t e = cudaMalloc(p, c);
  if (e == cudaErrorMemoryAllocation) {
    // release cached blocks and retry once
    cudaGetLastError();
    std::lock_guard<std::mutex> g(pool_mu);
    for (auto &kv : pool[device]) { for (void *q : kv.second) { cudaFree(q); block_size.erase(q); } kv.second.clear(); }
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
  cudaError_t e = cudaMemcpy(dst, src, n, kind);
  if (e != cudaSuccess) return cuda_error(e, "copy", dev);
  return 0;
}

extern "C" int bl_dev_memset(int device, void *p, int value, size_t n) {
  if (device < 0) { memset(p, value, n); return 0; }
  cudaSetDevice(device);
  cudaError_t e = cudaMemset(p, value, n);
  if (e != cudaSuccess) return cuda_error(e, "memset", device);
  return 0;
}
