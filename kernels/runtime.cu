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
//
// CUDA graphs (bl_cuda_graph_*, at the end): while a step is captured, the
// calls below that would wait for the device or allocate fail with a message
// naming the op, and uploads from host memory are staged in the graph's
// pinned buffers (a graph's copy reads its source when it runs, not when it
// is captured).
#include <cuda_runtime.h>
#include <atomic>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include "common.cuh"

namespace {
// The step-time model's record of a copy: over PCIe to or from the host, in device memory otherwise.
void copy_cost(int dev, int dst_device, int src_device, size_t n) {
  if (dst_device < 0 || src_device < 0)
    cu_cost_call(dev, "host copy", "cudaMemcpy", BL_ENGINE_PCIE, 0, (double)n);
  else
    cu_cost_call(dev, "copy", "cudaMemcpy d2d", BL_ENGINE_MEM, 0, 2.0 * n);
}

const size_t kLarge = 64u << 20;

struct dev_pool {
  std::unordered_map<size_t, std::vector<void *>> free; // size class -> free blocks
  std::list<void *> large_lru;                          // free blocks above kLarge, least recently freed first
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
struct counts {
  std::atomic<int64_t> syncs{ 0 }, mallocs{ 0 }, frees{ 0 }, graph_launches{ 0 }, blocks{ 0 };
};
counts call_counts[64];
void count_call(int dev, std::atomic<int64_t> counts::*which) {
  if (dev >= 0 && dev < 64) (call_counts[dev].*which)++;
}

int cuda_error(cudaError_t e, const char *op, int device) {
  return bl_set_error(BL_EDEVICE, "%s: cuda:%d: %s", op, device, cudaGetErrorString(e));
}

// The graph capturing cuda:N's compute stream now, if any (bl_cuda_graph_begin/end).
std::atomic<bl_cuda_graph *> capture_of[64];
bl_cuda_graph *capturing(int dev) { return dev >= 0 && dev < 64 ? capture_of[dev].load() : nullptr; }
int stage_upload(bl_cuda_graph *g, const void **src, size_t n);
} // namespace
bool cu_capturing(int dev) { return capturing(dev) != nullptr; }

int64_t cu_grid_cap() {
  static const int64_t cap = [] {
    const char *s = getenv("BL_CUDA_MAX_GRID");
    const long long v = s ? atoll(s) : 0;
    return v > 0 ? (int64_t)v : INT64_MAX;
  }();
  return cap;
}
namespace {
int capture_error(const char *op, int dev, const char *what) {
  return bl_set_error(BL_EDEVICE,
                      "%s: cuda:%d: %s while the step is captured into a CUDA graph (--cuda-graph): a "
                      "captured step must not wait for the device, read its memory or allocate after warm-up",
                      op, dev, what);
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
      if (v[i] == p) {
        v.erase(v.begin() + (long)i);
        break;
      }
    unlist_large(dp, p, c);
    release_block(device, p);
  }
}
} // namespace

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
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
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
  if (device >= n)
    return bl_set_error(BL_EDEVICE, "%s: cuda:%d requested, but only %d CUDA device(s) exist", op, device, n);
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
      count_call(device, &counts::blocks);
      return 0;
    }
  }
  if (capturing(device)) return capture_error("malloc", device, "a new device allocation");
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
  if (e != cudaSuccess) {
    *p = nullptr;
    return bl_set_error(BL_ENOMEM, "malloc: cuda:%d: cannot allocate %zu bytes: %s", device, n, cudaGetErrorString(e));
  }
  std::lock_guard<std::mutex> g(pool_mu);
  block_size[*p] = c;
  count_call(device, &counts::blocks);
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
      (e = cudaEventRecord(ready, ss)) != cudaSuccess) {
    rc = cu_err(op, src_device, e);
    goto out;
  }
  cudaSetDevice(dst_device);
  if ((e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming)) != cudaSuccess ||
      (e = cudaStreamWaitEvent(ds, ready, 0)) != cudaSuccess ||
      (e = cudaMemcpyPeerAsync(dst, dst_device, src, src_device, n, ds)) != cudaSuccess ||
      (e = cudaEventRecord(done, ds)) != cudaSuccess) {
    rc = cu_err(op, dst_device, e);
    goto out;
  }
  cudaSetDevice(src_device);
  if ((e = cudaStreamWaitEvent(ss, done, 0)) != cudaSuccess) rc = cu_err(op, src_device, e);
out: // destroying a recorded event is safe: its resources go once it completes
  if (ready) cudaEventDestroy(ready);
  if (done) cudaEventDestroy(done);
  return rc;
}

extern "C" int bl_dev_memcpy(int dst_device, void *dst, int src_device, const void *src, size_t n) {
  if (n == 0) return 0;
  if (dst_device < 0 && src_device < 0) {
    memcpy(dst, src, n);
    return 0;
  }
  if (dst_device >= 0 && src_device >= 0 && dst_device != src_device)
    return peer_copy("copy", dst_device, dst, src_device, src, n);
  cudaMemcpyKind kind = dst_device < 0   ? cudaMemcpyDeviceToHost
                        : src_device < 0 ? cudaMemcpyHostToDevice
                                         : cudaMemcpyDeviceToDevice;
  int dev = dst_device >= 0 ? dst_device : src_device;
  if (src_device < 0 && capturing(dev)) BL_CHECK(stage_upload(capturing(dev), &src, n));
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
  if (capturing(dev)) return capture_error("copy", dev, "a read of device memory by the host");
  cudaSetDevice(dev);
  count_call(dev, &counts::syncs);
  copy_cost(dev, dst_device, src_device, n);
  cudaError_t e = cudaMemcpy(dst, src, n, kind);
  if (e != cudaSuccess) return cuda_error(e, "copy", dev);
  return 0;
}

extern "C" int bl_dev_memset(int device, void *p, int value, size_t n) {
  if (device < 0) {
    memset(p, value, n);
    return 0;
  }
  // on the compute stream, not the legacy one: the same order (the compute stream is a blocking stream), and
  // capturable (legacy-stream work while a blocking stream captures is an error)
  void *s = bl_cuda_stream(device);
  if (!s) return BL_EDEVICE;
  cu_cost_call(device, "memset", "cudaMemset", BL_ENGINE_MEM, 0, (double)n);
  cudaError_t e = cudaMemsetAsync(p, value, n, (cudaStream_t)s);
  if (e != cudaSuccess) return cuda_error(e, "memset", device);
  return 0;
}

// ---------------------------------------------------------------- streams and errors (common.cuh)
namespace {
std::mutex stream_mu;
std::unordered_map<int, cudaStream_t> streams;
} // namespace

int cu_err(const char *op, int dev, cudaError_t e) {
  return bl_set_error(BL_EDEVICE, "%s: cuda:%d: %s", op, dev, cudaGetErrorString(e));
}

void cu_count_sync(int dev) {
#ifndef BL_CUDA_EMU
  count_call(dev, &counts::syncs);
#else
  (void)dev; // the emulator counts every wait itself
#endif
}

int cu_read_back(const char *op, int dev, void *host, const void *dptr, size_t n) {
  cu_cost_call(dev, "host copy", "cudaMemcpy d2h", BL_ENGINE_PCIE, 0, (double)n);
  cu_count_sync(dev);
  CU_TRY(op, dev, cudaMemcpy(host, dptr, n, cudaMemcpyDeviceToHost));
  return 0;
}

int cu_launched(const char *op, int dev) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return bl_set_error(BL_EDEVICE, "%s: cuda:%d: kernel launch failed: %s", op, dev, cudaGetErrorString(e));
#ifndef NDEBUG
  if (capturing(dev)) return 0; // a captured kernel runs later, with its graph
  e = cudaStreamSynchronize(cu_stream(dev));
  if (e != cudaSuccess)
    return bl_set_error(BL_EDEVICE, "%s: cuda:%d: kernel failed: %s", op, dev, cudaGetErrorString(e));
#endif
  return 0;
}

// Launch-path lookup: a lock-free cache in front of bl_cuda_stream (streams are
// created once and never destroyed).
static std::atomic<cudaStream_t> stream_cache[64];
cudaStream_t cu_stream(int dev) {
  if (dev >= 0 && dev < 64) {
    cudaStream_t s = stream_cache[dev].load(std::memory_order_acquire);
    if (s) {
      cudaSetDevice(dev);
      return s;
    }
  }
  cudaStream_t s = (cudaStream_t)bl_cuda_stream(dev);
  if (s && dev >= 0 && dev < 64) stream_cache[dev].store(s, std::memory_order_release);
  return s;
}

extern "C" void *bl_cuda_stream(int device) {
  if (bl_dev_check(device, "stream")) return nullptr;
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) {
    cu_err("stream", device, e);
    return nullptr;
  }
  std::lock_guard<std::mutex> g(stream_mu);
  auto it = streams.find(device);
  if (it != streams.end()) return (void *)it->second;
  cudaStream_t s = nullptr;
  // Blocking (not cudaStreamNonBlocking): legacy default stream work, e.g.
  // cudaMemcpy/cudaMemset in bl_dev_memcpy/bl_dev_memset, is ordered with it.
  e = cudaStreamCreateWithFlags(&s, cudaStreamDefault);
  if (e != cudaSuccess) {
    cu_err("stream", device, e);
    return nullptr;
  }
  streams[device] = s;
  return (void *)s;
}

extern "C" int bl_cuda_synchronize(int device) {
  void *s = bl_cuda_stream(device);
  if (!s) return BL_EDEVICE;
  if (capturing(device)) return capture_error("synchronize", device, "a host wait for the device");
  count_call(device, &counts::syncs);
  cudaError_t e = cudaStreamSynchronize((cudaStream_t)s);
  if (e != cudaSuccess) return cu_err("synchronize", device, e);
  return 0;
}

int cu_device(const char *op, int n, const bl_tensor *const *ts, int *dev) {
  int d = -2;
  for (int i = 0; i < n; i++) {
    if (!ts[i]) continue;
    if (d == -2)
      d = ts[i]->device;
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
  if (p) {
    bl_dev_free(dev, p);
    p = nullptr;
  }
  dev = device;
  int rc = bl_dev_malloc(device, bytes ? bytes : 16, &p);
  if (rc && capturing(device)) {
    p = nullptr;
    return capture_error(op, device, "a new device allocation (scratch)");
  }
  if (rc) {
    p = nullptr;
    return bl_set_error(rc, "%s: cuda:%d: cannot allocate %zu bytes of scratch", op, device, bytes);
  }
  return 0;
}

// ---------------------------------------------------------------- pinned host memory, async copies
extern "C" int bl_cuda_host_alloc(size_t n, void **p) {
  *p = nullptr;
  cudaError_t e = cudaHostAlloc(p, n ? n : 1, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    *p = nullptr;
    cudaGetLastError();
    return bl_set_error(BL_ENOMEM, "host_alloc: cannot pin %zu bytes: %s", n, cudaGetErrorString(e));
  }
  return 0;
}

extern "C" void bl_cuda_host_free(void *p) {
  if (p) cudaFreeHost(p);
}

extern "C" int bl_cuda_memcpy_async(int dst_device, void *dst, int src_device, const void *src, size_t n) {
  if (n == 0) return 0;
  if (dst_device < 0 && src_device < 0) {
    memcpy(dst, src, n);
    return 0;
  }
  int dev = dst_device >= 0 ? dst_device : src_device;
  void *s = bl_cuda_stream(dev);
  if (!s) return BL_EDEVICE;
  cudaMemcpyKind kind = dst_device < 0   ? cudaMemcpyDeviceToHost
                        : src_device < 0 ? cudaMemcpyHostToDevice
                                         : cudaMemcpyDeviceToDevice;
  if (src_device < 0 && capturing(dev)) BL_CHECK(stage_upload(capturing(dev), &src, n));
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
std::unordered_map<int, cudaStream_t> copy_streams; // under stream_mu
}

extern "C" void *bl_cuda_copy_stream(int device) {
  if (!bl_cuda_stream(device)) return nullptr; // checks the device, makes it current
  std::lock_guard<std::mutex> g(stream_mu);
  auto it = copy_streams.find(device);
  if (it != copy_streams.end()) return (void *)it->second;
  cudaStream_t s = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    cu_err("copy_stream", device, e);
    return nullptr;
  }
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
  *out = bl_cuda_count{ c.syncs,          c.mallocs,       c.frees,       c.launches, cu_conversions(device),
                        c.graph_launches, c.graph_kernels, c.pageable_h2d };
#else
  if (device >= 64) return bl_set_error(BL_EINVAL, "counters: cuda:%d: only devices 0..63 are counted", device);
  const counts &k = call_counts[device];
  *out = bl_cuda_count{
    k.syncs.load(), k.mallocs.load(), k.frees.load(), -1, cu_conversions(device), k.graph_launches.load(), -1, -1
  };
#endif
  return 0;
}

// ---------------------------------------------------------------- CUDA graphs (bl_base.h)
// Host uploads made while capturing are copied into pinned staging at once and the graph copies from there (a
// graph reads a copy's host side when it runs). Two sets of staging, used by alternate captures: capture k may
// overwrite set k % 2 only after the launch of capture k - 2 has run, which an event tells (normally long since).
struct bl_cuda_graph {
  struct staging {
    std::vector<std::pair<char *, size_t>> chunks; // pinned, kept for the graph's life
    size_t chunk = 0, off = 0;                     // where the next upload goes
    cudaEvent_t done = nullptr;                    // recorded after the launch that reads this set
    bool launched = false;
  };
  int dev;
  cudaGraphExec_t exec = nullptr;
  bool captured = false;  // a capture ended and was not launched yet
  bool launched = false;  // exec ran since its capture: it may be replayed
  int64_t blocks_at = -1; // the device's count of handed-out blocks when the capture ended
  staging st[2];
  int cur = 0;
  struct input_buf { // pinned source of bl_cuda_graph_set_inputs' copy, and the event after that copy
    void *p = nullptr;
    size_t cap = 0;
    cudaEvent_t read = nullptr;
    bool pending = false;
  } in[2];
  int in_cur = 0;
  bl_cuda_graph_stats stats = { 0, 0, 0, 0, 0 };
};

namespace {
const size_t kStageChunk = 1u << 20;

int graph_err(const bl_cuda_graph *g, const char *what, cudaError_t e) {
  cudaGetLastError();
  return bl_set_error(BL_EDEVICE, "cuda_graph: cuda:%d: %s: %s", g->dev, what, cudaGetErrorString(e));
}

int stage_upload(bl_cuda_graph *g, const void **src, size_t n) {
  bl_cuda_graph::staging &s = g->st[g->cur];
  size_t need = (n + 255) & ~(size_t)255;
  while (s.chunk < s.chunks.size() && s.off + need > s.chunks[s.chunk].second) {
    s.chunk++;
    s.off = 0;
  }
  if (s.chunk == s.chunks.size()) {
    // a pinned allocation is not stream work: allowed while capturing once the thread's mode is relaxed
    size_t size = need > kStageChunk ? need : kStageChunk;
    void *p = nullptr;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudaError_t e = cudaHostAlloc(&p, size, cudaHostAllocPortable);
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (e != cudaSuccess) return graph_err(g, "pinned staging for an upload", e);
    s.chunks.push_back({ (char *)p, size });
    s.off = 0;
  }
  char *dst = s.chunks[s.chunk].first + s.off;
  memcpy(dst, *src, n);
  s.off += need;
  *src = dst;
  return 0;
}
} // namespace

extern "C" int bl_cuda_graph_new(int device, bl_cuda_graph **out) {
  *out = nullptr;
  if (!bl_cuda_stream(device)) return BL_EDEVICE;
  bl_cuda_graph *g = new bl_cuda_graph;
  g->dev = device;
  for (int i = 0; i < 4; i++) {
    cudaEvent_t *ev = i < 2 ? &g->st[i].done : &g->in[i - 2].read;
    cudaError_t e = cudaEventCreateWithFlags(ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      int rc = graph_err(g, "event", e);
      bl_cuda_graph_free(g);
      return rc;
    }
  }
  *out = g;
  return 0;
}

extern "C" void bl_cuda_graph_free(bl_cuda_graph *g) {
  if (!g) return;
  bl_cuda_graph_abort(g);
  cudaSetDevice(g->dev);
  if (g->exec) cudaGraphExecDestroy(g->exec);
  for (auto &s : g->st) {
    if (s.done) cudaEventDestroy(s.done);
    for (auto &c : s.chunks) cudaFreeHost(c.first); // waits for the work that may still read it
  }
  for (auto &b : g->in) {
    if (b.read) cudaEventDestroy(b.read);
    if (b.p) cudaFreeHost(b.p);
  }
  delete g;
}

extern "C" int bl_cuda_graph_begin(bl_cuda_graph *g) {
  if (g->dev >= 64) return bl_set_error(BL_EINVAL, "cuda_graph: cuda:%d: only devices 0..63", g->dev);
  if (capturing(g->dev)) return bl_set_error(BL_EINVAL, "cuda_graph: cuda:%d: a capture is already running", g->dev);
  if (g->captured) return bl_set_error(BL_EINVAL, "cuda_graph: cuda:%d: the last capture was not launched", g->dev);
  cudaStream_t s = cu_stream(g->dev);
  if (!s) return BL_EDEVICE;
  g->cur ^= 1;
  bl_cuda_graph::staging &st = g->st[g->cur];
  if (st.launched) BL_CHECK(bl_cuda_event_wait_host(g->dev, st.done)); // the launch before last read it
  st.launched = false;
  st.chunk = st.off = 0;
  cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  if (e != cudaSuccess) return graph_err(g, "begin capture", e);
  capture_of[g->dev].store(g);
  return 0;
}

// Ends a capture and forgets it (after an error in the captured code).
extern "C" void bl_cuda_graph_abort(bl_cuda_graph *g) {
  if (!g || capturing(g->dev) != g) return;
  capture_of[g->dev].store(nullptr);
  cudaGraph_t graph = nullptr;
  cudaSetDevice(g->dev);
  cudaStreamEndCapture(cu_stream(g->dev), &graph);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();
}

extern "C" int bl_cuda_graph_end(bl_cuda_graph *g) {
  if (capturing(g->dev) != g) return bl_set_error(BL_EINVAL, "cuda_graph: cuda:%d: no capture to end", g->dev);
  capture_of[g->dev].store(nullptr);
  cudaGraph_t graph = nullptr;
  cudaSetDevice(g->dev);
  cudaError_t e = cudaStreamEndCapture(cu_stream(g->dev), &graph);
  if (e != cudaSuccess) return graph_err(g, "the step could not be captured (a call in it is not capturable)", e);
  size_t nodes = 0;
  e = cudaGraphGetNodes(graph, nullptr, &nodes);
  if (e == cudaSuccess && g->exec) {
    cudaGraphExecUpdateResultInfo info;
    if (cudaGraphExecUpdate(g->exec, graph, &info) == cudaSuccess) {
      g->stats.updates++;
    } else { // other work than last time: a new graph
      cudaGetLastError();
      cudaGraphExecDestroy(g->exec);
      g->exec = nullptr;
    }
  }
  if (e == cudaSuccess && !g->exec) {
    e = cudaGraphInstantiate(&g->exec, graph, 0);
    if (e == cudaSuccess) g->stats.instantiations++;
  }
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) return graph_err(g, "instantiate", e);
  g->stats.nodes = (int64_t)nodes;
  g->captured = true;
  g->launched = false;
  g->blocks_at = call_counts[g->dev].blocks.load();
  return 0;
}

namespace {
// Runs g's instantiated graph on the compute stream; the staging set of its capture is then read until `done`.
int launch_exec(bl_cuda_graph *g) {
  cudaStream_t s = cu_stream(g->dev);
  if (!s) return BL_EDEVICE;
  cudaError_t e = cudaGraphLaunch(g->exec, s);
  if (e != cudaSuccess) return graph_err(g, "launch", e);
  bl_cuda_graph::staging &st = g->st[g->cur];
  e = cudaEventRecord(st.done, s);
  if (e != cudaSuccess) return graph_err(g, "event", e);
  st.launched = true;
  g->launched = true;
  g->stats.launches++;
  count_call(g->dev, &counts::graph_launches);
  return 0;
}
} // namespace

extern "C" int bl_cuda_graph_launch(bl_cuda_graph *g) {
  if (!g->captured) return bl_set_error(BL_EINVAL, "cuda_graph: cuda:%d: nothing captured to launch", g->dev);
  BL_CHECK(launch_exec(g));
  g->captured = false;
  return 0;
}

extern "C" int bl_cuda_graph_replayable(const bl_cuda_graph *g, int *ok) {
  *ok =
      g->exec && g->launched && !g->captured && !capturing(g->dev) && call_counts[g->dev].blocks.load() == g->blocks_at;
  return 0;
}

extern "C" int bl_cuda_graph_replay(bl_cuda_graph *g) {
  int ok = 0;
  bl_cuda_graph_replayable(g, &ok);
  if (!ok)
    return bl_set_error(BL_EINVAL,
                        "cuda_graph: cuda:%d: no graph to replay (none launched since its capture, or a "
                        "device block was handed out since: capture again)",
                        g->dev);
  BL_CHECK(launch_exec(g));
  g->stats.replays++;
  return 0;
}

extern "C" int bl_cuda_graph_set_inputs(bl_cuda_graph *g, bl_tensor *dst, const void *src, size_t n) {
  const char *op = "cuda_graph inputs";
  if (capturing(g->dev)) return capture_error(op, g->dev, "an input upload (it belongs before the capture)");
  if (!dst || dst->device != g->dev || !bl_tensor_is_contiguous(dst) ||
      (size_t)dst->numel * bl_dtype_size(dst->dtype) < n)
    return bl_set_error(BL_EINVAL,
                        "%s: cuda:%d: the destination must be a contiguous tensor of at least %zu bytes "
                        "on the graph's device",
                        op, g->dev, n);
  if (n == 0) return 0;
  g->in_cur ^= 1;
  bl_cuda_graph::input_buf &b = g->in[g->in_cur];
  if (b.pending) BL_CHECK(bl_cuda_event_wait_host(g->dev, b.read)); // the copy two calls ago read it
  b.pending = false;
  if (b.cap < n) {
    if (b.p) cudaFreeHost(b.p);
    b.p = nullptr;
    b.cap = 0;
    cudaError_t e = cudaHostAlloc(&b.p, n, cudaHostAllocPortable);
    if (e != cudaSuccess) return graph_err(g, "pinned buffer for the step's inputs", e);
    b.cap = n;
  }
  memcpy(b.p, src, n);
  cudaStream_t s = cu_stream(g->dev);
  if (!s) return BL_EDEVICE;
  copy_cost(g->dev, g->dev, -1, n);
  cudaError_t e = cudaMemcpyAsync(dst->data, b.p, n, cudaMemcpyHostToDevice, s);
  if (e == cudaSuccess) e = cudaEventRecord(b.read, s);
  if (e != cudaSuccess) return graph_err(g, "copy of the step's inputs", e);
  b.pending = true;
  return 0;
}

extern "C" int bl_cuda_graph_stats_get(const bl_cuda_graph *g, bl_cuda_graph_stats *out) {
  *out = g->stats;
  return 0;
}
