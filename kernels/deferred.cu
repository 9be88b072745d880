// Deferred index checks (bl_cuda_defer_checks, contract in bl_base.h). With them on, an op that validates
// indices on the device does not wait to read the result back: the first out-of-range index is recorded in a
// per-device record that stays on the device, every bad entry of the op's own index image is replaced by a safe
// index (so its kernels stay in bounds), and bl_cuda_check_deferred reads the record (one synchronisation, when
// the training loop writes a log line) and returns the error naming the op, the position and the value.
//
// Two launches per check: defer_find takes the smallest bad position (integer atomicMin, deterministic) unless
// an earlier op already recorded one; defer_fix rewrites the bad entries, and the thread that owns that position
// fills the record. Only that thread writes the record, and `cand` is reset by a memset before defer_find.
#include "common.cuh"
#include <mutex>
#include <string.h>
#include <vector>

namespace {

struct defer_rec {
  unsigned long long cand; // smallest bad position of the current check (~0: none)
  long long set, code, pos, value, limit;
};

struct defer_site {
  const char *op, *what, *limit_what;
};

const int kMaxDevices = 64;
std::mutex mu;
bool on[kMaxDevices];
defer_rec *rec[kMaxDevices];
std::vector<defer_site> sites; // record.code indexes this

__device__ __forceinline__ bool bad_id(long long v, long long limit, int has_ignore, long long ignore) {
  return !(has_ignore && v == ignore) && (v < 0 || v >= limit);
}

__global__ void defer_find(const int64_t *ids, int64_t n, int64_t limit, int has_ignore, int64_t ignore, defer_rec *r) {
  if (r->set) return; // an earlier op's error is kept
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    if (bad_id(ids[i], limit, has_ignore, ignore)) atomicMin(&r->cand, (unsigned long long)i);
}

__global__ void defer_fix(int64_t *ids, int64_t n, int64_t limit, int has_ignore, int64_t ignore, int64_t safe,
                          int code, defer_rec *r) {
  const unsigned long long cand = r->cand;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t v = ids[i];
    if (!bad_id(v, limit, has_ignore, ignore)) continue;
    if ((unsigned long long)i == cand) {
      r->set = 1;
      r->code = code;
      r->pos = i;
      r->value = v;
      r->limit = limit;
    }
    ids[i] = safe;
  }
}

int site_code(const char *op, const char *what, const char *limit_what) {
  std::lock_guard<std::mutex> g(mu);
  for (size_t i = 0; i < sites.size(); i++)
    if (sites[i].op == op && sites[i].what == what && sites[i].limit_what == limit_what) return (int)i;
  sites.push_back(defer_site{ op, what, limit_what });
  return (int)sites.size() - 1;
}

// The device's record, made (zeroed, cand = ~0) on first use.
int record_of(const char *op, int dev, defer_rec **out) {
  std::lock_guard<std::mutex> g(mu);
  if (!rec[dev]) {
    void *p = nullptr;
    BL_CHECK(bl_dev_malloc(dev, sizeof(defer_rec), &p));
    defer_rec init = { ~0ull, 0, 0, 0, 0, 0 };
    CU_TRY(op, dev, cudaMemcpyAsync(p, &init, sizeof init, cudaMemcpyHostToDevice, cu_stream(dev)));
    rec[dev] = (defer_rec *)p;
  }
  *out = rec[dev];
  return 0;
}

} // namespace

bool cu_checks_deferred(int dev) {
  std::lock_guard<std::mutex> g(mu);
  return dev >= 0 && dev < kMaxDevices && on[dev];
}

int cu_defer_ids(const char *op, int dev, int64_t *ids, int64_t n, int64_t limit, int has_ignore, int64_t ignore,
                 int64_t safe, const char *what, const char *limit_what) {
  if (n == 0) return 0;
  defer_rec *r;
  BL_CHECK(record_of(op, dev, &r));
  const int code = site_code(op, what, limit_what);
  cudaStream_t s = cu_stream(dev);
  cu_cost_call(dev, "memset", "cudaMemsetAsync", BL_ENGINE_MEM, 0, sizeof r->cand);
  CU_TRY(op, dev, cudaMemsetAsync(&r->cand, 0xff, sizeof r->cand, s));
  cu_cost_kernel(dev, "index check", "defer_find", 8.0 * n);
  defer_find<<<cu_blocks(n, 256), 256, 0, s>>>(ids, n, limit, has_ignore, ignore, r);
  BL_CHECK(cu_launched(op, dev));
  cu_cost_kernel(dev, "index check", "defer_fix", 8.0 * n + sizeof(defer_rec));
  defer_fix<<<cu_blocks(n, 256), 256, 0, s>>>(ids, n, limit, has_ignore, ignore, safe, code, r);
  return cu_launched(op, dev);
}

extern "C" int bl_cuda_defer_checks(int device, int enable) {
  BL_CHECK(bl_dev_check(device, "defer_checks"));
  if (device >= kMaxDevices)
    return bl_set_error(BL_EUNSUPPORTED, "defer_checks: cuda:%d: at most %d devices", device, kMaxDevices);
  std::lock_guard<std::mutex> g(mu);
  on[device] = enable != 0;
  return 0;
}

namespace {
__global__ void pending_into(const defer_rec *r, double *flag) { *flag = r->set ? 1.0 : 0.0; }
} // namespace

extern "C" int bl_cuda_deferred_pending(int device, bl_tensor *flag) {
  const char *op = "deferred_pending";
  BL_CHECK(bl_dev_check(device, op));
  if (!flag || flag->device != device || flag->dtype != BL_F64 || flag->numel != 1)
    return bl_set_error(BL_EINVAL, "%s: flag must be one f64 element on cuda:%d", op, device);
  defer_rec *r;
  BL_CHECK(record_of(op, device, &r));
  cu_cost_kernel(device, "index check", "pending_into", sizeof(defer_rec) + 8.0);
  pending_into<<<1, 1, 0, cu_stream(device)>>>(r, (double *)flag->data);
  return cu_launched(op, device);
}

extern "C" int bl_cuda_check_deferred(int device) {
  const char *op = "check_deferred";
  BL_CHECK(bl_dev_check(device, op));
  defer_rec *r;
  {
    std::lock_guard<std::mutex> g(mu);
    if (device >= kMaxDevices || !rec[device]) return 0; // nothing was ever checked late
    r = rec[device];
  }
  defer_rec h;
  BL_CHECK(bl_dev_memcpy(-1, &h, device, r, sizeof h)); // the one wait
  if (!h.set) return 0;
  defer_rec clear = { ~0ull, 0, 0, 0, 0, 0 };
  BL_CHECK(bl_dev_memcpy(device, r, -1, &clear, sizeof clear));
  defer_site site;
  {
    std::lock_guard<std::mutex> g(mu);
    site = sites[(size_t)h.code];
  }
  return bl_set_error(BL_EINVAL,
                      "%s: %s %lld at position %lld is out of range for %s %lld (found on cuda:%d by a "
                      "deferred check: results computed since then are not valid)",
                      site.op, site.what, h.value, h.pos, site.limit_what, h.limit, device);
}
