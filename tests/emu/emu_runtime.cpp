// Emulated CUDA device: the runtime API (devices, memory, copies, streams,
// events, errors) with the ordering rules of the real runtime.
//
// - Device memory: one mmap'd region per device, PROT_NONE except while an
//   emulated kernel, copy or memset runs, so host code that dereferences a device
//   pointer faults at once; a SIGSEGV handler names the allocation. Fresh
//   allocations are filled with 0xff bytes (NaN in every float format).
// - Streams: work is queued and runs only when something needs it: a
//   synchronising call (stream/event/device synchronize, a synchronous copy,
//   cudaFree), a query, or work on another stream that waits for it. A stream
//   runs its work in order; another stream's work runs first only when an event
//   (cudaStreamWaitEvent) or the legacy default stream's implicit
//   synchronisation says so. So a host read of a pinned buffer that an async copy
//   fills, without a synchronisation, sees the old data, as it may on a GPU.
// - Errors: a failing call sets the per-thread last error (cudaGetLastError
//   returns and clears it, cudaPeekAtLastError only returns it); a fault inside a
//   kernel (emu_fault) is sticky: every later call on that device fails.
// - Stream capture and graphs: a capturing stream appends its work to the
//   graph instead of its queue; a graph launch queues the recorded work again,
//   in order (cudaStreamBeginCapture ... cudaGraphLaunch below). Streams fork
//   from and join the capture through events recorded in it. Calls that are
//   illegal while a device captures (global mode) fail and invalidate it.
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>
#include "emu_core.h"
#include "emu_internal.h"

struct emu_stream {
  int dev;
  unsigned flags;
  bool legacy;
  uint64_t enq = 0, done = 0; // ops enqueued / completed so far
  struct op {
    std::string what;
    std::function<void()> fn;
    std::vector<std::pair<emu_stream *, uint64_t>> waits; // run (stream, up to seq) first
    bool kernel = false;
  };
  std::deque<op> q;
  emu_graph *cap = nullptr; // the graph this stream is capturing into, if any
  bool cap_invalid = false; // an illegal call during the capture: its end fails
  bool cap_origin = false;  // the stream that began the capture (the others forked from it)
  uint64_t cap_ops = 0;     // work this stream added to the capture
  bool cap_joined = true;   // a forked stream's work so far is waited for by the capture's other streams
};
// A captured graph and an instantiated one: the recorded work of the capturing streams in the order it was
// queued (every event wait inside the capture came after its record, so that order keeps the dependencies).
struct emu_graph {
  int dev;
  std::vector<emu_stream::op> ops;
  size_t kernels = 0;
  uint64_t id = 0; // the capture's number (events recorded in it name it)
};
struct emu_graph_exec {
  int dev;
  std::vector<emu_stream::op> ops;
  size_t kernels = 0;
};
struct emu_event {
  emu_stream *s = nullptr;
  uint64_t seq = 0;
  uint64_t cap_id = 0;  // last recorded in that capture (0: outside any): a graph-internal dependency
  uint64_t cap_seq = 0; // the recording stream's cap_ops then
  // Host time when the recorded point completed. Shared with the queued record op: an event may be destroyed (or
  // recorded again) before that op runs, as the real runtime allows, and the op must not write into a freed event.
  std::shared_ptr<double> t;
  bool recorded = false;
};

namespace {
struct device {
  char *base = nullptr;
  size_t cap = 0, high = 0;             // reserved bytes; end of the highest allocation
  std::map<size_t, size_t> live, freel; // offset -> size
  emu_stream *legacy = nullptr;
  std::vector<emu_stream *> streams; // blocking and non-blocking streams created by the user
  cudaError_t sticky = cudaSuccess;
  emu_counters cnt = { 0, 0, 0, 0, 0, 0, 0 };
};

std::recursive_mutex mu;
std::vector<device> devs;
std::map<char *, size_t> pinned; // page-locked host allocations
// Destroyed streams, drained and kept: events recorded on them and other streams' waits may still name them.
std::vector<emu_stream *> retired;
std::unordered_map<const void *, int> dyn_smem_optin; // kernel -> cudaFuncAttributeMaxDynamicSharedMemorySize
thread_local int cur_dev = 0;
thread_local cudaError_t last_err = cudaSuccess;
int open_depth = 0;       // > 0 while device memory is accessible
const char *running = ""; // the op running now, for messages
uint64_t launches = 0;
emu_launch_hook launch_hook = nullptr; // emu_set_launch_hook
bool dry_run = false;
struct sigaction old_segv;

const size_t kAlign = 256, kSmemDefault = 48 << 10, kSmemOptinMax = 227 << 10;

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int env_int(const char *name, int dflt) {
  const char *s = getenv(name);
  return s && *s ? atoi(s) : dflt;
}

void segv_handler(int sig, siginfo_t *si, void *uctx);

void init_locked() {
  if (!devs.empty()) return;
  int n = env_int("BL_EMU_DEVICES", 2);
  if (n < 0) n = 0;
#ifdef BL_EMU_TSAN
  size_t cap = (size_t)env_int("BL_EMU_MEM_GB", 8) << 30;
#else
  size_t cap = (size_t)env_int("BL_EMU_MEM_GB", 80) << 30;
#endif
  devs.resize((size_t)n);
  for (int i = 0; i < n; i++) {
    device &d = devs[(size_t)i];
    void *m = mmap(nullptr, cap, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      fprintf(stderr, "bertlua emulated CUDA: cannot reserve %zu bytes for cuda:%d\n", cap, i);
      abort();
    }
    d.base = (char *)m;
    d.cap = cap;
    d.freel[0] = cap;
    d.legacy = new emu_stream{ i, 0, true, 0, 0, {} };
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = segv_handler;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &old_segv);
}

struct lock {
  std::lock_guard<std::recursive_mutex> g{ mu };
  lock() { init_locked(); }
};

cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess) last_err = e;
  return e;
}

bool valid_dev(int d) { return d >= 0 && d < (int)devs.size(); }

void set_access(int prot) {
  for (device &d : devs)
    if (d.high && mprotect(d.base, (d.high + 4095) & ~(size_t)4095, prot) != 0) {
      perror("bertlua emulated CUDA: mprotect");
      abort();
    }
}
struct access_window {
  access_window() {
    if (open_depth++ == 0) set_access(PROT_READ | PROT_WRITE);
  }
  ~access_window() {
    if (--open_depth == 0) set_access(PROT_NONE);
  }
};

// The allocation of device d containing [p, p+n), or live.end().
std::map<size_t, size_t>::iterator find_alloc(device &d, const void *p, size_t n) {
  const char *c = (const char *)p;
  if (c < d.base || c >= d.base + d.cap) return d.live.end();
  size_t off = (size_t)(c - d.base);
  auto it = d.live.upper_bound(off);
  if (it == d.live.begin()) return d.live.end();
  --it;
  if (off + n > it->first + it->second || off < it->first) return d.live.end();
  return it;
}

int dev_of(const void *p) {
  for (size_t i = 0; i < devs.size(); i++)
    if (find_alloc(devs[i], p, 1) != devs[i].live.end()) return (int)i;
  return -1;
}

bool in_any_region(const void *p) {
  for (device &d : devs)
    if ((const char *)p >= d.base && (const char *)p < d.base + d.cap) return true;
  return false;
}

bool is_pinned(const void *p, size_t n) {
  auto it = pinned.upper_bound((char *)p);
  if (it == pinned.begin()) return false;
  --it;
  return (const char *)p >= it->first && (const char *)p + n <= it->first + it->second;
}

emu_stream *resolve(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return devs[(size_t)cur_dev].legacy;
  return s;
}

void run_until(emu_stream *s, uint64_t seq) {
  if (s->done >= seq) return;
  access_window a; // opened once for the whole run (mprotect costs a system call per device)
  while (s->done < seq) {
    emu_stream::op o = std::move(s->q.front());
    s->q.pop_front();
    for (auto &w : o.waits) run_until(w.first, w.second);
    device &d = devs[(size_t)s->dev];
    if (d.sticky == cudaSuccess) {
      const char *saved = running;
      running = o.what.c_str();
      int saved_dev = cur_dev;
      cur_dev = s->dev;
      o.fn();
      cur_dev = saved_dev;
      running = saved;
    }
    s->done++;
  }
}
void drain(emu_stream *s) { run_until(s, s->enq); }

// A stream of device dev is capturing (global mode: calls that are unsafe then are refused device-wide).
bool capturing(int dev) {
  for (emu_stream *s : devs[(size_t)dev].streams)
    if (s->cap) return true;
  return false;
}
// Refuses a call made while dev captures: every capture of dev is invalidated, as on the real runtime.
cudaError_t refuse(int dev, cudaError_t e) {
  for (emu_stream *s : devs[(size_t)dev].streams)
    if (s->cap) s->cap_invalid = true;
  fprintf(stderr, "bertlua emulated CUDA: cuda:%d: %s: call not allowed while a stream captures a graph\n", dev,
          cudaGetErrorName(e));
  return e;
}
// Work for stream s while its device captures: legal only on the capturing stream itself (the legacy stream would
// synchronise with it implicitly).
cudaError_t capture_check(emu_stream *s) {
  if (s->cap || !capturing(s->dev)) return cudaSuccess;
  if (s->legacy) return refuse(s->dev, cudaErrorStreamCaptureImplicit);
  return cudaSuccess;
}

uint64_t captures = 0; // captures begun so far: their numbers

// The graph of capture `id` of device dev while it is being captured, or nullptr.
emu_graph *capture_by_id(int dev, uint64_t id) {
  for (emu_stream *s : devs[(size_t)dev].streams)
    if (s->cap && s->cap->id == id) return s->cap;
  return nullptr;
}

// st waits for event e recorded inside a capture: st forks from it (joins the capture) or, already in it, the
// dependency holds by the graph's order; waiting for everything a forked stream did joins that stream back.
cudaError_t capture_wait(emu_stream *st, cudaEvent_t e) {
  emu_graph *g = capture_by_id(e->s->dev, e->cap_id);
  if (!g) return ret(cudaErrorCapturedEvent); // that capture has ended
  if (st->cap && st->cap != g) return ret(refuse(st->dev, cudaErrorStreamCaptureIsolation));
  if (st->legacy || st->dev != e->s->dev) return ret(refuse(e->s->dev, cudaErrorStreamCaptureIsolation));
  if (!st->cap) {
    st->cap = g;
    st->cap_invalid = false;
    st->cap_origin = false;
    st->cap_ops = 0;
    st->cap_joined = true;
  } else if (e->s != st && e->cap_seq == e->s->cap_ops) {
    e->s->cap_joined = true;
  }
  return cudaSuccess;
}

void drain_device(int dev) {
  device &d = devs[(size_t)dev];
  drain(d.legacy);
  for (emu_stream *s : d.streams) drain(s);
}

void enqueue(emu_stream *s, const char *what, std::function<void()> fn, bool kernel = false) {
  emu_stream::op o;
  o.what = what;
  o.fn = std::move(fn);
  o.kernel = kernel;
  if (s->cap) { // captured: the graph's order keeps the dependencies (waits on outside events are refused)
    s->cap->kernels += kernel;
    s->cap->ops.push_back(std::move(o));
    s->cap_ops++;
    if (!s->cap_origin) s->cap_joined = false;
    return;
  }
  device &d = devs[(size_t)s->dev];
  if (s->legacy) { // the legacy default stream waits for the blocking streams of its device, and they for it
    for (emu_stream *b : d.streams)
      if (!(b->flags & cudaStreamNonBlocking) && b->done < b->enq) o.waits.push_back({ b, b->enq });
  } else if (!(s->flags & cudaStreamNonBlocking) && d.legacy->done < d.legacy->enq) {
    o.waits.push_back({ d.legacy, d.legacy->enq });
  }
  s->q.push_back(std::move(o));
  s->enq++;
}

cudaError_t check_ptr(const void *p, size_t n, bool device_side, int *dev) {
  if (device_side) {
    *dev = -1;
    for (size_t i = 0; i < devs.size(); i++)
      if (find_alloc(devs[i], p, n) != devs[i].live.end()) *dev = (int)i;
    return *dev < 0 ? cudaErrorInvalidValue : cudaSuccess;
  }
  *dev = -1;
  return in_any_region(p) ? cudaErrorInvalidValue : cudaSuccess;
}

const char *kind_name(cudaMemcpyKind k) {
  switch (k) {
    case cudaMemcpyHostToDevice: return "cudaMemcpy host to device";
    case cudaMemcpyDeviceToHost: return "cudaMemcpy device to host";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpy device to device";
    default: return "cudaMemcpy";
  }
}

// The common part of every copy: checks the pointers against `kind`, enqueues on s. *sync_needed tells the caller
// that the call must not return before the copy ran (pageable host destination).
cudaError_t copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, emu_stream *s, bool *sync_needed) {
  *sync_needed = false;
  if (n == 0) return cudaSuccess;
  if (kind == cudaMemcpyDefault || kind == cudaMemcpyHostToHost) {
    bool dd = in_any_region(dst), sd = in_any_region(src);
    kind = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
              : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  }
  if (dry_run && n > EMU_DRY_MAX_BYTES) return cudaSuccess;
  int ddev = -1, sdev = -1;
  bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (check_ptr(dst, n, dst_dev, &ddev) != cudaSuccess || check_ptr(src, n, src_dev, &sdev) != cudaSuccess)
    return cudaErrorInvalidValue;
  if (cudaError_t e = capture_check(s)) return e;
  // a graph's copy reads its host side when it runs: pageable memory (staged at the call) cannot be captured
  if (s->cap && (kind == cudaMemcpyHostToHost || (kind == cudaMemcpyHostToDevice && !is_pinned(src, n)) ||
                 (kind == cudaMemcpyDeviceToHost && !is_pinned(dst, n))))
    return refuse(s->dev, cudaErrorStreamCaptureUnsupported);
  if (kind == cudaMemcpyHostToHost) {
    enqueue(s, "cudaMemcpy host to host", [dst, src, n] { memcpy(dst, src, n); });
    *sync_needed = true;
    return cudaSuccess;
  }
  if (kind == cudaMemcpyHostToDevice && !is_pinned(src, n)) {
    // pageable source: the runtime stages it before returning, so the caller may reuse it at once
    if (valid_dev(ddev)) devs[(size_t)ddev].cnt.pageable_h2d++;
    auto staged = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + n);
    enqueue(s, kind_name(kind), [dst, staged] { memcpy(dst, staged->data(), staged->size()); });
    return cudaSuccess;
  }
  enqueue(s, kind_name(kind), [dst, src, n] { memmove(dst, src, n); });
  *sync_needed = kind == cudaMemcpyDeviceToHost && !is_pinned(dst, n);
  return cudaSuccess;
}

void segv_handler(int sig, siginfo_t *si, void *uctx) {
  const void *a = si->si_addr;
  char msg[600];
  int n = -1;
  if (emu_is_stack_guard(a)) {
    n = snprintf(msg, sizeof msg, "bertlua emulated CUDA: GPU thread stack overflow in %s [BL_EMU_SEED=%llu]\n",
                 running, (unsigned long long)emu_seed());
  } else {
    for (size_t i = 0; i < devs.size() && n < 0; i++) {
      device &d = devs[i];
      if ((const char *)a < d.base || (const char *)a >= d.base + d.cap) continue;
      auto it = find_alloc(d, a, 1);
      if (open_depth > 0)
        n = snprintf(msg, sizeof msg,
                     "bertlua emulated CUDA: %s accessed cuda:%zu memory at %p outside every "
                     "allocation [BL_EMU_SEED=%llu]\n",
                     running, i, a, (unsigned long long)emu_seed());
      else if (it != d.live.end())
        n = snprintf(msg, sizeof msg,
                     "bertlua emulated CUDA: host code dereferenced device memory at %p (cuda:%zu, "
                     "byte %zu of an allocation of %zu bytes at %p); device memory is only accessible to kernels, "
                     "copies and memsets, as on a GPU\n",
                     a, i, (size_t)((const char *)a - d.base) - it->first, it->second, (void *)(d.base + it->first));
      else
        n = snprintf(msg, sizeof msg,
                     "bertlua emulated CUDA: host code dereferenced cuda:%zu address %p, which is in "
                     "no live allocation (freed or never allocated)\n",
                     i, a);
    }
  }
  if (n > 0) {
    ssize_t w = write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
    (void)w;
    signal(SIGSEGV, SIG_DFL); // returning re-executes the access, which now kills the process
    return;
  }
  if (old_segv.sa_flags & SA_SIGINFO)
    old_segv.sa_sigaction(sig, si, uctx);
  else if (old_segv.sa_handler != SIG_DFL && old_segv.sa_handler != SIG_IGN)
    old_segv.sa_handler(sig);
  else
    signal(SIGSEGV, SIG_DFL);
}
} // namespace

// ---------------------------------------------------------------- internal interface (emu_internal.h)
void emu_stream_enqueue(cudaStream_t s, const char *what, std::function<void()> fn) {
  lock l;
  if (dry_run) return;
  enqueue(resolve(s), what, std::move(fn));
}

bool emu_is_device_range(int dev, const void *p, size_t bytes) {
  lock l;
  return valid_dev(dev) && find_alloc(devs[(size_t)dev], p, bytes ? bytes : 1) != devs[(size_t)dev].live.end();
}

int emu_device_of(const void *p) {
  lock l;
  return dev_of(p);
}

int emu_current_device() { return cur_dev; }

const char *emu_running_what() { return running; }

void emu_fault(const char *fmt, ...) {
  char b[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  char blocks[40] = "";
  if (emu_blocks_in_flight() > 1) snprintf(blocks, sizeof blocks, " BL_EMU_BLOCKS=%d", emu_blocks_in_flight());
  fprintf(stderr, "bertlua emulated CUDA: cuda:%d: %s [BL_EMU_SEED=%llu%s]\n", cur_dev, b,
          (unsigned long long)emu_seed(), blocks);
  if (valid_dev(cur_dev)) devs[(size_t)cur_dev].sticky = cudaErrorLaunchFailure;
  if (emu_in_gpu_thread()) emu_abandon_thread();
}

void emu_set_launch_hook(emu_launch_hook hook, int dry) {
  lock l;
  launch_hook = hook;
  dry_run = dry != 0;
}

int emu_get_counters(int dev, emu_counters *out) {
  lock l;
  if (!valid_dev(dev)) return -1;
  *out = devs[(size_t)dev].cnt;
  return 0;
}

// ---------------------------------------------------------------- launches (emu_device.h)
void emu::launch(const launch_cfg &c, std::function<void()> body) {
  lock l;
  if (!valid_dev(cur_dev)) {
    ret(cudaErrorInvalidDevice);
    return;
  }
  device &d = devs[(size_t)cur_dev];
  if (d.sticky) {
    ret(d.sticky);
    return;
  }
  uint64_t threads = (uint64_t)c.block.x * c.block.y * c.block.z;
  if (threads == 0 || threads > 1024 || c.block.x > 1024 || c.block.y > 1024 || c.block.z > 64 || c.grid.x == 0 ||
      c.grid.y == 0 || c.grid.z == 0 || c.grid.x > 0x7fffffffu || c.grid.y > 65535 || c.grid.z > 65535) {
    ret(cudaErrorInvalidConfiguration);
    return;
  }
  auto it = dyn_smem_optin.find(c.fn);
  size_t limit = it == dyn_smem_optin.end() ? kSmemDefault : (size_t)it->second;
  if (c.smem > limit) {
    ret(cudaErrorInvalidValue);
    return;
  }
  emu_stream *st = resolve(c.stream);
  if (cudaError_t e = capture_check(st)) {
    ret(e);
    return;
  }
  if (!st->cap) d.cnt.launches++; // a captured kernel is counted when a graph launch runs it
  uint64_t no = ++launches;
  if (launch_hook) launch_hook(cur_dev, c.name, c.file, c.line);
  if (dry_run && threads * c.grid.x * c.grid.y * c.grid.z > EMU_DRY_MAX_THREADS) return;
  char what[300];
  snprintf(what, sizeof what, "kernel %s (launched at %s:%d)", c.name, c.file, c.line);
  enqueue(
      st, what, [c, body, no] { emu_run_grid(c, body, no); }, true);
}

extern "C" {
cudaError_t emu_func_set_attribute(const void *fn, cudaFuncAttribute attr, int value) {
  lock l;
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || (size_t)value > kSmemOptinMax) return ret(cudaErrorInvalidValue);
    dyn_smem_optin[fn] = value;
  }
  return cudaSuccess;
}

// ---------------------------------------------------------------- errors
const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
#define N_(x) \
  case x: return #x
    N_(cudaSuccess);
    N_(cudaErrorInvalidValue);
    N_(cudaErrorMemoryAllocation);
    N_(cudaErrorInitializationError);
    N_(cudaErrorInvalidConfiguration);
    N_(cudaErrorInvalidDevicePointer);
    N_(cudaErrorInvalidMemcpyDirection);
    N_(cudaErrorInvalidResourceHandle);
    N_(cudaErrorNotReady);
    N_(cudaErrorIllegalAddress);
    N_(cudaErrorLaunchOutOfResources);
    N_(cudaErrorLaunchFailure);
    N_(cudaErrorInvalidDevice);
    N_(cudaErrorNoDevice);
    N_(cudaErrorPeerAccessAlreadyEnabled);
    N_(cudaErrorUnknown);
    N_(cudaErrorStreamCaptureUnsupported);
    N_(cudaErrorStreamCaptureInvalidated);
    N_(cudaErrorStreamCaptureUnmatched);
    N_(cudaErrorStreamCaptureUnjoined);
    N_(cudaErrorStreamCaptureIsolation);
    N_(cudaErrorStreamCaptureImplicit);
    N_(cudaErrorCapturedEvent);
    N_(cudaErrorGraphExecUpdateFailure);
#undef N_
  }
  return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchFailure: return "unspecified launch failure (emulated device: see the message above)";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorPeerAccessAlreadyEnabled: return "peer access is already enabled";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched: return "capture was not initiated in this stream";
    case cudaErrorStreamCaptureUnjoined: return "capturing stream has unjoined work";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing "
             "blocking stream";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorGraphExecUpdateFailure:
      return "the graph update was not performed because it included changes "
             "which violated constraints specific to instantiated graph update";
    default: return "unknown error";
  }
}

cudaError_t cudaGetLastError(void) {
  lock l;
  cudaError_t e = last_err;
  last_err = cudaSuccess;
  if (e == cudaSuccess && valid_dev(cur_dev)) e = devs[(size_t)cur_dev].sticky;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  lock l;
  if (last_err == cudaSuccess && valid_dev(cur_dev)) return devs[(size_t)cur_dev].sticky;
  return last_err;
}

// ---------------------------------------------------------------- devices
cudaError_t cudaGetDeviceCount(int *n) {
  lock l;
  *n = (int)devs.size();
  return devs.empty() ? ret(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaSetDevice(int dev) {
  lock l;
  if (!valid_dev(dev)) return ret(cudaErrorInvalidDevice);
  cur_dev = dev;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *dev) {
  lock l;
  *dev = cur_dev;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev) {
  lock l;
  if (!valid_dev(dev)) return ret(cudaErrorInvalidDevice);
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "bertlua emulated H100 (CPU)");
  p->totalGlobalMem = devs[(size_t)dev].cap;
  p->sharedMemPerBlock = kSmemDefault;
  p->sharedMemPerBlockOptin = kSmemOptinMax;
  p->sharedMemPerMultiprocessor = 228 << 10;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024;
  p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 0x7fffffff;
  p->maxGridSize[1] = 65535;
  p->maxGridSize[2] = 65535;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 132;
  p->maxThreadsPerMultiProcessor = 2048;
  p->clockRate = 1980000;
  p->memoryClockRate = 2619000;
  p->memoryBusWidth = 5120;
  p->l2CacheSize = 50 << 20;
  p->totalConstMem = 65536;
  p->unifiedAddressing = 1;
  p->canMapHostMemory = 1;
  p->concurrentKernels = 1;
  p->asyncEngineCount = 2;
  p->pciBusID = dev;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  lock l;
  if (!valid_dev(cur_dev)) return ret(cudaErrorInvalidDevice);
  if (capturing(cur_dev)) return ret(refuse(cur_dev, cudaErrorStreamCaptureUnsupported));
  devs[(size_t)cur_dev].cnt.syncs++;
  drain_device(cur_dev);
  return ret(devs[(size_t)cur_dev].sticky);
}

cudaError_t cudaDeviceReset(void) { return cudaDeviceSynchronize(); }

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
  lock l;
  device &d = devs[(size_t)cur_dev];
  size_t used = 0;
  for (auto &kv : d.live) used += kv.second;
  *free_bytes = d.cap - used;
  *total_bytes = d.cap;
  return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int *can, int dev, int peer) {
  lock l;
  if (!valid_dev(dev) || !valid_dev(peer)) return ret(cudaErrorInvalidDevice);
  *can = dev != peer;
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned flags) {
  lock l;
  if (!valid_dev(peer) || flags != 0) return ret(cudaErrorInvalidValue);
  return cudaSuccess;
}

// ---------------------------------------------------------------- memory
cudaError_t cudaMalloc(void **p, size_t n) {
  lock l;
  *p = nullptr;
  if (!valid_dev(cur_dev)) return ret(cudaErrorInvalidDevice);
  device &d = devs[(size_t)cur_dev];
  if (d.sticky) return ret(d.sticky);
  if (capturing(cur_dev)) return ret(refuse(cur_dev, cudaErrorStreamCaptureUnsupported));
  d.cnt.mallocs++;
  size_t want = (n + kAlign - 1) / kAlign * kAlign;
  if (want == 0) want = kAlign;
  for (auto it = d.freel.begin(); it != d.freel.end(); ++it) {
    if (it->second < want) continue;
    size_t off = it->first, rest = it->second - want;
    d.freel.erase(it);
    if (rest) d.freel[off + want] = rest;
    d.live[off] = want;
    if (off + want > d.high) d.high = off + want;
    *p = d.base + off;
    access_window a;
    if (!dry_run) memset(*p, 0xff, want); // uninitialised device memory reads as NaN
    return cudaSuccess;
  }
  return ret(cudaErrorMemoryAllocation);
}

cudaError_t cudaFree(void *p) {
  lock l;
  if (!p) return cudaSuccess;
  int dev = dev_of(p);
  if (dev < 0) return ret(cudaErrorInvalidValue);
  device &d = devs[(size_t)dev];
  size_t off = (size_t)((char *)p - d.base);
  auto it = d.live.find(off);
  if (it == d.live.end()) return ret(cudaErrorInvalidValue); // not the start of an allocation
  if (capturing(dev)) return ret(refuse(dev, cudaErrorStreamCaptureUnsupported));
  drain_device(dev); // cudaFree synchronises: queued work may still use the block
  d.cnt.frees++;
  size_t size = it->second;
  d.live.erase(it);
  if (size >= (1u << 20)) madvise(d.base + off, size, MADV_DONTNEED);
  auto nx = d.freel.lower_bound(off);
  if (nx != d.freel.end() && nx->first == off + size) {
    size += nx->second;
    d.freel.erase(nx);
  }
  auto pv = d.freel.lower_bound(off);
  if (pv != d.freel.begin()) {
    --pv;
    if (pv->first + pv->second == off) {
      pv->second += size;
      return cudaSuccess;
    }
  }
  d.freel[off] = size;
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags) {
  lock l;
  (void)flags;
  *p = nullptr;
  if (posix_memalign(p, 4096, n ? n : 1) != 0) {
    *p = nullptr;
    return ret(cudaErrorMemoryAllocation);
  }
  pinned[(char *)*p] = n ? n : 1;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t n) { return cudaHostAlloc(p, n, 0); }

cudaError_t cudaFreeHost(void *p) {
  lock l;
  if (!p) return cudaSuccess;
  auto it = pinned.find((char *)p);
  if (it == pinned.end()) return ret(cudaErrorInvalidValue);
  for (size_t i = 0; i < devs.size(); i++) drain_device((int)i); // queued copies may still use it
  pinned.erase(it);
  free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
  lock l;
  if (!valid_dev(cur_dev)) return ret(cudaErrorInvalidDevice);
  emu_stream *st = resolve(s);
  if (devs[(size_t)st->dev].sticky) return ret(devs[(size_t)st->dev].sticky);
  bool sync = false;
  cudaError_t e = copy(dst, src, n, kind, st, &sync);
  if (e != cudaSuccess) return ret(e);
  if (sync) { // a pageable destination: the call returns after the copy, like a synchronisation
    devs[(size_t)st->dev].cnt.syncs++;
    drain(st);
  }
  return ret(devs[(size_t)st->dev].sticky);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
  lock l;
  if (!valid_dev(cur_dev)) return ret(cudaErrorInvalidDevice);
  emu_stream *st = devs[(size_t)cur_dev].legacy;
  if (devs[(size_t)cur_dev].sticky) return ret(devs[(size_t)cur_dev].sticky);
  if (capturing(cur_dev)) return ret(refuse(cur_dev, cudaErrorStreamCaptureUnsupported));
  bool sync = false;
  cudaError_t e = copy(dst, src, n, kind, st, &sync);
  if (e != cudaSuccess) return ret(e);
  devs[(size_t)cur_dev].cnt.syncs++;
  drain(st);
  return ret(devs[(size_t)cur_dev].sticky);
}

cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_dev, const void *src, int src_dev, size_t n, cudaStream_t s) {
  lock l;
  if (!valid_dev(dst_dev) || !valid_dev(src_dev)) return ret(cudaErrorInvalidDevice);
  if (n == 0) return cudaSuccess;
  if (find_alloc(devs[(size_t)dst_dev], dst, n) == devs[(size_t)dst_dev].live.end() ||
      find_alloc(devs[(size_t)src_dev], src, n) == devs[(size_t)src_dev].live.end())
    return ret(cudaErrorInvalidValue);
  if (cudaError_t e = capture_check(resolve(s))) return ret(e);
  enqueue(resolve(s), "cudaMemcpyPeer", [dst, src, n] { memmove(dst, src, n); });
  return cudaSuccess;
}

cudaError_t cudaMemcpyPeer(void *dst, int dst_dev, const void *src, int src_dev, size_t n) {
  lock l;
  cudaError_t e = cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, n, nullptr);
  if (e != cudaSuccess) return e;
  if (capturing(cur_dev)) return ret(refuse(cur_dev, cudaErrorStreamCaptureUnsupported));
  devs[(size_t)cur_dev].cnt.syncs++;
  drain(devs[(size_t)cur_dev].legacy);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s) {
  lock l;
  if (!valid_dev(cur_dev)) return ret(cudaErrorInvalidDevice);
  emu_stream *st = resolve(s);
  if (devs[(size_t)st->dev].sticky) return ret(devs[(size_t)st->dev].sticky);
  if (n == 0) return cudaSuccess;
  if (dev_of(p) < 0 || find_alloc(devs[(size_t)dev_of(p)], p, n) == devs[(size_t)dev_of(p)].live.end())
    return ret(cudaErrorInvalidValue);
  if (cudaError_t e = capture_check(st)) return ret(e);
  if (!dry_run || n <= EMU_DRY_MAX_BYTES) enqueue(st, "cudaMemset", [p, value, n] { memset(p, value, n); });
  return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t n) { return cudaMemsetAsync(p, value, n, nullptr); }

// ---------------------------------------------------------------- streams and events
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
  lock l;
  if (!valid_dev(cur_dev)) return ret(cudaErrorInvalidDevice);
  *s = new emu_stream{ cur_dev, flags, false, 0, 0, {} };
  devs[(size_t)cur_dev].streams.push_back(*s);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  lock l;
  if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread) return ret(cudaErrorInvalidResourceHandle);
  if (s->cap) return ret(refuse(s->dev, cudaErrorStreamCaptureUnsupported));
  drain(s); // work already queued completes, as on the real runtime
  auto &v = devs[(size_t)s->dev].streams;
  for (size_t i = 0; i < v.size(); i++)
    if (v[i] == s) {
      v.erase(v.begin() + (long)i);
      break;
    }
  retired.push_back(s);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  lock l;
  emu_stream *st = resolve(s);
  if (st->cap || (st->legacy && capturing(st->dev))) return ret(refuse(st->dev, cudaErrorStreamCaptureUnsupported));
  devs[(size_t)st->dev].cnt.syncs++;
  drain(st);
  return ret(devs[(size_t)st->dev].sticky);
}

// Work does not progress on its own: a query with work pending runs it and answers "not ready" this once.
cudaError_t cudaStreamQuery(cudaStream_t s) {
  lock l;
  emu_stream *st = resolve(s);
  if (devs[(size_t)st->dev].sticky) return ret(devs[(size_t)st->dev].sticky);
  if (st->cap) return ret(refuse(st->dev, cudaErrorStreamCaptureUnsupported));
  if (st->done == st->enq) return cudaSuccess;
  drain(st);
  return cudaErrorNotReady;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
  (void)flags;
  *e = new emu_event;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  lock l;
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  lock l;
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  emu_stream *st = resolve(s);
  e->t = std::make_shared<double>(0);
  if (st->cap) { // a point inside the capture: other streams fork from it or the capture joins them there
    e->s = st;
    e->cap_id = st->cap->id;
    e->cap_seq = st->cap_ops;
    e->recorded = true;
    return cudaSuccess;
  }
  if (cudaError_t ce = capture_check(st)) return ret(ce);
  e->cap_id = 0;
  enqueue(st, "cudaEventRecord", [t = e->t] { *t = now_s(); });
  e->s = st;
  e->seq = st->enq;
  e->recorded = true;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  lock l;
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  if (!e->recorded) return cudaSuccess;
  if (e->cap_id) return ret(cudaErrorCapturedEvent);
  devs[(size_t)e->s->dev].cnt.syncs++;
  run_until(e->s, e->seq);
  return ret(devs[(size_t)e->s->dev].sticky);
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  lock l;
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  if (e->recorded && e->cap_id) return ret(cudaErrorCapturedEvent);
  if (!e->recorded || e->s->done >= e->seq) return cudaSuccess;
  run_until(e->s, e->seq);
  return cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  lock l;
  if (!a || !b || !a->recorded || !b->recorded) return ret(cudaErrorInvalidResourceHandle);
  if (a->s->done < a->seq || b->s->done < b->seq) return ret(cudaErrorNotReady);
  *ms = (float)((*b->t - *a->t) * 1e3);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  lock l;
  (void)flags;
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  if (!e->recorded) return cudaSuccess;
  emu_stream *st = resolve(s);
  if (e->cap_id) return capture_wait(st, e);
  if (st->cap) return ret(refuse(st->dev, cudaErrorStreamCaptureIsolation)); // recorded outside the capture
  if (cudaError_t ce = capture_check(st)) return ret(ce);
  emu_stream *es = e->s;
  uint64_t seq = e->seq;
  enqueue(st, "cudaStreamWaitEvent", [] {});
  st->q.back().waits.push_back({ es, seq });
  return cudaSuccess;
}

// ---------------------------------------------------------------- stream capture and graphs

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  lock l;
  emu_stream *st = resolve(s);
  if (mode != cudaStreamCaptureModeGlobal) return ret(cudaErrorInvalidValue); // only the default mode
  if (st->legacy) return ret(cudaErrorStreamCaptureImplicit);                 // the legacy stream cannot capture
  if (st->cap) return ret(cudaErrorStreamCaptureUnsupported);
  if (devs[(size_t)st->dev].sticky) return ret(devs[(size_t)st->dev].sticky);
  st->cap = new emu_graph{ st->dev, {}, 0, ++captures };
  st->cap_invalid = false;
  st->cap_origin = true;
  st->cap_ops = 0;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
  lock l;
  emu_stream *st = resolve(s);
  *g = nullptr;
  if (!st->cap || !st->cap_origin) return ret(cudaErrorStreamCaptureUnmatched);
  emu_graph *cg = st->cap;
  bool unjoined = false;
  for (emu_stream *o : devs[(size_t)st->dev].streams) // the forked streams leave the capture too
    if (o != st && o->cap == cg) {
      unjoined = unjoined || !o->cap_joined;
      o->cap = nullptr;
    }
  st->cap = nullptr;
  st->cap_origin = false;
  if (st->cap_invalid || unjoined) {
    delete cg;
    return ret(st->cap_invalid ? cudaErrorStreamCaptureInvalidated : cudaErrorStreamCaptureUnjoined);
  }
  *g = cg;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status) {
  lock l;
  emu_stream *st = resolve(s);
  *status = !st->cap          ? cudaStreamCaptureStatusNone
            : st->cap_invalid ? cudaStreamCaptureStatusInvalidated
                              : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode *mode) {
  static thread_local cudaStreamCaptureMode cur = cudaStreamCaptureModeGlobal;
  cudaStreamCaptureMode old = cur;
  cur = *mode;
  *mode = old;
  return cudaSuccess;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t *nodes, size_t *n) {
  if (!g) return ret(cudaErrorInvalidValue);
  if (nodes) return ret(cudaErrorInvalidValue); // only the count is emulated
  *n = g->ops.size();
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags) {
  lock l;
  *e = nullptr;
  if (!g || flags != 0) return ret(cudaErrorInvalidValue);
  *e = new emu_graph_exec{ g->dev, g->ops, g->kernels };
  return cudaSuccess;
}

// The new graph's parameters into e when only they changed: the same work, in the same order, of the same kernels.
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t e, cudaGraph_t g, cudaGraphExecUpdateResultInfo *info) {
  lock l;
  if (!e || !g) return ret(cudaErrorInvalidValue);
  cudaGraphExecUpdateResult r = cudaGraphExecUpdateSuccess;
  if (g->dev != e->dev || g->ops.size() != e->ops.size()) r = cudaGraphExecUpdateErrorTopologyChanged;
  for (size_t i = 0; r == cudaGraphExecUpdateSuccess && i < g->ops.size(); i++)
    if (g->ops[i].kernel != e->ops[i].kernel)
      r = cudaGraphExecUpdateErrorNodeTypeChanged;
    else if (g->ops[i].what != e->ops[i].what)
      r = cudaGraphExecUpdateErrorFunctionChanged;
  if (info) *info = cudaGraphExecUpdateResultInfo{ r, nullptr, nullptr };
  if (r != cudaGraphExecUpdateSuccess) return ret(cudaErrorGraphExecUpdateFailure);
  e->ops = g->ops;
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
  lock l;
  if (!e) return ret(cudaErrorInvalidValue);
  emu_stream *st = resolve(s);
  if (st->dev != e->dev) return ret(cudaErrorInvalidValue);
  device &d = devs[(size_t)st->dev];
  if (d.sticky) return ret(d.sticky);
  if (st->cap) return ret(refuse(st->dev, cudaErrorStreamCaptureUnsupported)); // graphs in graphs: not emulated
  if (cudaError_t ce = capture_check(st)) return ret(ce);
  for (const emu_stream::op &o : e->ops) enqueue(st, o.what.c_str(), o.fn, o.kernel);
  d.cnt.graph_launches++;
  d.cnt.graph_kernels += (int64_t)e->kernels;
  d.cnt.launches += (int64_t)e->kernels;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  lock l;
  delete g;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
  lock l;
  delete e;
  return cudaSuccess;
}
} // extern "C"
