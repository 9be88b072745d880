// CUDA device layer: device discovery, memory and copies, the per-device
// stream every kernel runs on, pinned host memory, and the error plumbing of
// kernels/common.cuh. A caching allocator keeps freed blocks per (device,
// size class) so the training loop never calls cudaMalloc/cudaFree once
// warmed up.
//
// Stream order: every block of device d is used only in the order of d's
// stream, so a freed block is reused at once. That holds because all kernels
// of a device run on its one stream, which is a blocking one (legacy-stream
// copies and memsets of the same device wait for it), and because a copy
// between two devices (peer_copy) runs on the destination's stream between
// two events: after the source stream's earlier work, and before its later
// work, which may reuse the source block as soon as it is freed.
//
// Blocks above 64 MiB are cached by exact size (2 MiB granularity), so with
// varying shapes they are bounded: past BL_CUDA_CACHE_LARGE_MB (default 2048)
// of cached large blocks per device the least recently freed go back to
// cudaFree. A failing cudaMalloc releases the whole cache and retries once.
#include <cuda_runtime.h>
#include <atomic>
#include <list>
#include <mutex>
#include <thread>
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

const size_t kLarge = 64u << 20;

struct dev_pool {
  std::unordered_map<size_t, std::vector<void *>> free;   // size class -> free blocks
  std::list<void *> large_lru;                             // free blocks above kLarge, least recently freed first
  size_t large_bytes = 0;
};
std::mutex pool_mu;
std::unordered_map<int, dev_pool> pool;
std::unordered_map<void *, size_t> block_size;

size_t size_class(size_t n) {
  if (n <= 512) return 512;
  size_t c = 512;
  while (c < n) c <<= 1;
  // power-of-two classes waste up to 2x; above 64 MiB round to 2 MiB instead
  if (n > kLarge) c = (n + (2u << 20) - 1) & ~((size_t)(2u << 20) - 1);
  return c;
}

size_t large_cache_limit() {
  static const size_t limit = [] {
    const char *e = getenv("BL_CUDA_CACHE_LARGE_MB");
    long mb = e ? atol(e) : 0;
    return (size_t)(mb > 0 ? mb : 2048) << 20;
  }();
  return limit;
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

// Gives a cached block back to the runtime (pool_mu held). cudaFree waits for the device, so no stream still uses it.
void release_block(int device, void *p) {
  cudaSetDevice(device);
  count_call(device, &counts::frees);
  cudaFree(p);
  block_size.erase(p);
}

// Takes block p (class c) out of the large-block bookkeeping (pool_mu held).
void unlist_large(dev_pool &dp, void *p, size_t c) {
  if (c <= kLarge) return;
  dp.large_lru.remove(p);
  dp.large_bytes -= c;
}

// Frees the least recently freed large blocks until the cache is within its limit (pool_mu held).
void trim_large(int device, dev_pool &dp) {
  while (dp.large_bytes > large_cache_limit() && !dp.large_lru.empty()) {
    void *p = dp.large_lru.front();
    size_t c = block_size[p];
    std::vector<void *> &v = dp.free[c];
    for (size_t i = 0; i < v.size(); i++)
      if (v[i] == p) { v.erase(v.begin() + (long)i); break; }
    unlist_large(dp, p, c);
    release_block(device, p);
  }
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
    dev_pool &dp = pool[device];
    auto &v = dp.free[c];
    if (!v.empty()) {
      *p = v.back();
      v.pop_back();
      unlist_large(dp, *p, c);
      return 0;
    }
  }
  cudaSetDevice(device);
  count_call(device, &counts::mallocs);
  cudaError_t e = cudaMalloc(p, c);
  if (e == cudaErrorMemoryAllocation) {
    // release cached blocks and retry once
    cudaGetLastError();
    std::lock_guard<std::mutex> g(pool_mu);
    dev_pool &dp = pool[device];
    for (auto &kv : dp.free) {
      for (void *q : kv.second) release_block(device, q);
      kv.second.clear();
    }
    dp.large_lru.clear();
    dp.large_bytes = 0;
    cudaSetDevice(device);
    count_call(device, &counts::mallocs);
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
  size_t c = it->second;
  dev_pool &dp = pool[device];
  dp.free[c].push_back(p);
  if (c > kLarge) {
    dp.large_lru.push_back(p);
    dp.large_bytes += c;
    trim_large(device, dp);
  }
}

// Cross-device copy on the destination's stream, ordered after the source stream's earlier work and before its
// later work (see the top of this file).
static int peer_copy(const char *op, int dst_device, void *dst, int src_device, const void *src, size_t n) {
  cudaStream_t ss = cu_stream(src_device), ds = cu_stream(dst_device);
  if (!ss || !ds) return BL_EDEVICE;
  cudaEvent_t ready = nullptr, done = nullptr;
  int rc = 0;
  cudaError_t e;
  cudaSetDevice(src_device);
  if ((e = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming)) != cudaSuccess ||
      (e = cudaEventRecord(ready, ss)) != cudaSuccess) { rc = cu_err(op, src_device, e); goto out; }
  cudaSetDevice(dst_device);
  if ((e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming)) != cudaSuccess ||
      (e = cudaStreamWaitEvent(ds, ready, 0)) != cudaSuccess ||
      (e = cudaMemcpyPeerAsync(dst, dst_device, src, src_device, n, ds)) != cudaSuccess ||
      (e = cudaEventRecord(done, ds)) != cudaSuccess) { rc = cu_err(op, dst_device, e); goto out; }
  cudaSetDevice(src_device);
  if ((e = cudaStreamWaitEvent(ss, done, 0)) != cudaSuccess) rc = cu_err(op, src_device, e);
out:   // destroying a recorded event is safe: its resources go once it completes
  if (ready) cudaEventDestroy(ready);
  if (done) cudaEventDestroy(done);
  return rc;
}

extern "C" int bl_dev_memcpy(int dst_device, void *dst, int src_device, const void *src, size_t n) {
  if (n == 0) return 0;
  if (dst_device < 0 && src_device < 0) { memcpy(dst, src, n); return 0; }
  if (dst_device >= 0 && src_device >= 0 && dst_device != src_device)
    return peer_copy("copy", dst_device, dst, src_device, src, n);
  cudaMemcpyKind kind = dst_device < 0 ? cudaMemcpyDeviceToHost : src_device < 0 ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice;
  int dev = dst_device >= 0 ? dst_device : src_device;
  if (dst_device >= 0) {
    // Uploads and on-device copies are queued on the compute stream, in order with the kernels, and the host
    // does not wait: a pageable source is staged by the runtime before cudaMemcpyAsync returns, so the caller
    // may reuse it at once. Only a download makes the host wait (it reads the bytes next).
    void *s = bl_cuda_stream(dev);
    if (!s) return BL_EDEVICE;
    copy_cost(dev, dst_device, src_device, n);
    cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, (cudaStream_t)s);
    if (e != cudaSuccess) return cuda_error(e, "copy", dev);
    return 0;
  }
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
  if (dst_device >= 0 && src_device >= 0 && dst_device != src_device)
    return peer_copy("copy_async", dst_device, dst, src_device, src, n);
  CU_TRY("copy_async", dev, cudaMemcpyAsync(dst, src, n, kind, (cudaStream_t)s));
  return 0;
}

// ---------------------------------------------------------------- copy stream and events (input pipeline)
// A second stream per device for host-to-device batch copies (src/data/feeder.c). Non-blocking: it is ordered
// against the compute stream by events only, so the next batch's copy runs while the current step computes.
namespace {
std::unordered_map<int, cudaStream_t> copy_streams;   // under stream_mu
}

extern "C" void *bl_cuda_copy_stream(int device) {
  if (!bl_cuda_stream(device)) return nullptr;   // checks the device, makes it current
  std::lock_guard<std::mutex> g(stream_mu);
  auto it = copy_streams.find(device);
  if (it != copy_streams.end()) return (void *)it->second;
  cudaStream_t s = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) { cu_err("copy_stream", device, e); return nullptr; }
  copy_streams[device] = s;
  return (void *)s;
}

extern "C" int bl_cuda_event_new(int device, void **ev) {
  *ev = nullptr;
  if (!bl_cuda_stream(device)) return BL_EDEVICE;
  cudaEvent_t e = nullptr;
  CU_TRY("event", device, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  *ev = (void *)e;
  return 0;
}

extern "C" void bl_cuda_event_free(void *ev) {
  if (ev) cudaEventDestroy((cudaEvent_t)ev);
}

// stream NULL: the device's compute stream
extern "C" int bl_cuda_event_record(int device, void *ev, void *stream) {
  void *s = stream ? stream : bl_cuda_stream(device);
  if (!s) return BL_EDEVICE;
  CU_TRY("event_record", device, cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)s));
  return 0;
}

extern "C" int bl_cuda_stream_wait_event(int device, void *stream, void *ev) {
  void *s = stream ? stream : bl_cuda_stream(device);
  if (!s) return BL_EDEVICE;
  CU_TRY("stream_wait", device, cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)ev, 0));
  return 0;
}

// The host waits for one event by polling it: the work before it only, not the whole device.
extern "C" int bl_cuda_event_wait_host(int device, void *ev) {
  for (;;) {
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    if (e == cudaSuccess) return 0;
    if (e != cudaErrorNotReady) return cu_err("event_wait", device, e);
    std::this_thread::yield();
  }
}

extern "C" int bl_cuda_memcpy_h2d_on(int device, void *stream, void *dst, const void *src, size_t n) {
  if (n == 0) return 0;
  copy_cost(device, device, -1, n);
  CU_TRY("copy_h2d", device, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, (cudaStream_t)stream));
  return 0;
}

extern "C" int bl_cuda_counters(int device, bl_cuda_count *out) {
  memset(out, 0, sizeof *out);
  BL_CHECK(bl_dev_check(device, "counters"));
#ifdef BL_CUDA_EMU
  emu_counters c;
  if (emu_get_counters(device, &c) != 0) return bl_set_error(BL_EDEVICE, "counters: cuda:%d: no such device", device);
  *out = bl_cuda_count{c.syncs, c.mallocs, c.frees, c.launches, cu_conversions(device)};
#else
  if (device >= 64) return bl_set_error(BL_EINVAL, "counters: cuda:%d: only devices 0..63 are counted", device);
  const counts &k = call_counts[device];
  *out = bl_cuda_count{k.syncs.load(), k.mallocs.load(), k.frees.load(), -1, cu_conversions(device)};
#endif
  return 0;
}
