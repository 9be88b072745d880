// Launch log of the step-time model (bl_cuda_record_* in bl_base.h). Launch sites state their costs through
// cu_cost_kernel / cu_cost_call (common.cuh); this file keeps them while a recording is active. On the emulated
// device the emulator also reports every launch it accepts (emu_set_launch_hook): a kernel cost then waits for its
// launch, and a launch that finds no cost waiting is logged as "unannotated", so a missing statement cannot hide.
// A launch whose work depends on device data (the attention kernels skip key tiles that the mask rules out) states
// a fixed part and a part per unit of a count that an earlier kernel of the step writes to a cost slot: the slots
// are device ints of an arena made at bl_cuda_record_begin and read at bl_cuda_record_end, after the step's work.
// With bl_cuda_record_timing on, each cost statement (made just before its launch) also records a CUDA event on the
// device's stream, and a launch's measured time runs from its event to the next one (scripts/gpu_check.sh).
#include <atomic>
#include <mutex>
#include <set>
#include <string>
#include <vector>
#include "common.cuh"

namespace {
std::mutex mu;
std::atomic<int> rec_dev{ -1 }; // device being recorded, -1 when off
std::vector<bl_cuda_launch_rec> launches;
std::set<std::string> names; // storage of the launches' names (a name may be the caller's op)

// Cost slots (cu_cost_slot) and the launches that depend on them: record `at` gets *slot times the per-unit costs.
const int kSlots = 4096;
// The arena outlives a recording: a step captured as a CUDA graph while it was recorded keeps slot addresses in
// its kernels' arguments, and its replays (the benchmark's timed steps) still write there after the recording.
int *slots = nullptr;
int slots_dev = -1;
int slots_used = 0;
struct per_unit {
  size_t at;
  const int *slot;
  double bytes, flops;
};
std::vector<per_unit> deferred;

// Launch timing: events[i] was recorded before launch marks[i]; a pool of events reused across recordings.
bool timing = false;
std::vector<cudaEvent_t> events;
std::vector<size_t> marks;
size_t events_used = 0;

// Records the next event before launch `at` (not inside a capture: a captured launch runs later, in a graph).
void time_mark(int dev, size_t at) {
  if (!timing || cu_capturing(dev)) return;
  if (events_used == events.size()) {
    cudaEvent_t e;
    if (cudaEventCreate(&e) != cudaSuccess) return; // untimed, not an error of the step
    events.push_back(e);
  }
  if (cudaEventRecord(events[events_used], cu_stream(dev)) != cudaSuccess) return;
  marks.resize(events_used);
  marks.push_back(at);
  events_used++;
}

#ifdef BL_CUDA_EMU
bool dry = false;          // bl_cuda_dry_run
bool have_pending = false; // a kernel cost waiting for the emulator to see its launch
bl_cuda_launch_rec pending;
per_unit pending_unit{ 0, nullptr, 0, 0 };

void on_launch(int dev, const char *name, const char *file, int line) {
  std::lock_guard<std::mutex> g(mu);
  if (dev != rec_dev.load()) return;
  if (have_pending) {
    if (pending_unit.slot)
      deferred.push_back(per_unit{ launches.size(), pending_unit.slot, pending_unit.bytes, pending_unit.flops });
    launches.push_back(pending);
    have_pending = false;
    return;
  }
  const char *at = names.insert(std::string(name) + " (" + file + ":" + std::to_string(line) + ")").first->c_str();
  launches.push_back(bl_cuda_launch_rec{ at, "unannotated", BL_ENGINE_MEM, 0, 0, cu_capturing(dev), -1 });
}
#endif
} // namespace

void cu_cost_kernel_per(int dev, const char *cls, const char *name, double bytes, double flops, int engine,
                        const int *slot, double bytes_per, double flops_per) {
  if (dev != rec_dev.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> g(mu);
  name = names.insert(name).first->c_str();
  time_mark(dev, launches.size());
#ifdef BL_CUDA_EMU
  // A cost still pending here belonged to a launch the emulator refused (the op fails with that error).
  pending = bl_cuda_launch_rec{ name, cls, engine, flops, bytes, cu_capturing(dev), -1 };
  pending_unit = per_unit{ 0, slot, bytes_per, flops_per };
  have_pending = true;
#else
  if (slot) deferred.push_back(per_unit{ launches.size(), slot, bytes_per, flops_per });
  launches.push_back(bl_cuda_launch_rec{ name, cls, engine, flops, bytes, cu_capturing(dev), -1 });
#endif
}

void cu_cost_kernel(int dev, const char *cls, const char *name, double bytes, double flops, int engine) {
  cu_cost_kernel_per(dev, cls, name, bytes, flops, engine, nullptr, 0, 0);
}

int *cu_cost_slot(int dev) {
  if (dev != rec_dev.load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard<std::mutex> g(mu);
  return slots && slots_used < kSlots ? slots + slots_used++ : nullptr;
}

void cu_cost_call(int dev, const char *cls, const char *name, int engine, double flops, double bytes) {
  if (dev != rec_dev.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> g(mu);
  name = names.insert(name).first->c_str();
  time_mark(dev, launches.size());
  launches.push_back(bl_cuda_launch_rec{ name, cls, engine, flops, bytes, cu_capturing(dev), -1 });
}

extern "C" int bl_cuda_dry_run(int device, int on) {
  BL_CHECK(bl_dev_check(device, "dry_run"));
#ifdef BL_CUDA_EMU
  std::lock_guard<std::mutex> g(mu);
  dry = on != 0;
  emu_set_launch_hook(rec_dev.load() >= 0 ? on_launch : nullptr, dry);
  return 0;
#else
  if (!on) return 0;
  return bl_set_error(BL_EUNSUPPORTED, "dry_run: cuda:%d: a dry run needs the emulated device", device);
#endif
}

extern "C" int bl_cuda_record_begin(int device) {
  BL_CHECK(bl_dev_check(device, "record"));
  // Queued work belongs to what came before.
  BL_CHECK(bl_cuda_synchronize(device));
  std::lock_guard<std::mutex> g(mu);
  if (rec_dev.load() >= 0) return bl_set_error(BL_EINVAL, "record: cuda:%d is being recorded already", rec_dev.load());
  launches.clear();
  names.clear();
  deferred.clear();
  slots_used = 0;
  events_used = 0;
  marks.clear();
  if (slots && slots_dev != device) { // only the last recorded device keeps an arena
    cudaFree(slots);
    slots = nullptr;
  }
  if (!slots) {
    CU_TRY("record", device, cudaMalloc((void **)&slots, kSlots * sizeof(int)));
    slots_dev = device;
  }
  CU_TRY("record", device, cudaMemset(slots, 0, kSlots * sizeof(int)));
  rec_dev.store(device);
#ifdef BL_CUDA_EMU
  have_pending = false;
  emu_set_launch_hook(on_launch, dry);
#endif
  return 0;
}

// Waits for the recorded work (the cost slots are written by it), then adds the per-unit costs.
extern "C" int bl_cuda_record_end(int device, int64_t *count) {
  *count = 0;
  if (rec_dev.load() != device) return bl_set_error(BL_EINVAL, "record: cuda:%d is not being recorded", device);
  {
    std::lock_guard<std::mutex> g(mu);
    time_mark(device, launches.size()); // the end of the last timed launch
  }
  const int sync = bl_cuda_synchronize(device);
  std::lock_guard<std::mutex> g(mu);
  rec_dev.store(-1);
#ifdef BL_CUDA_EMU
  emu_set_launch_hook(nullptr, dry);
#endif
  std::vector<int> got((size_t)kSlots);
  const int *base = slots;
  cudaError_t e = sync ? cudaSuccess : cudaMemcpy(got.data(), slots, kSlots * sizeof(int), cudaMemcpyDeviceToHost);
  if (sync) return sync;
  if (e != cudaSuccess) return cu_err("record", device, e);
  for (const per_unit &u : deferred) {
    const double n = got[(size_t)(u.slot - base)];
    launches[u.at].bytes += n * u.bytes;
    launches[u.at].flops += n * u.flops;
  }
  for (size_t i = 0; i + 1 < events_used; i++) {
    float ms = 0;
    if (marks[i] < launches.size() && cudaEventElapsedTime(&ms, events[i], events[i + 1]) == cudaSuccess)
      launches[marks[i]].measured_s = ms * 1e-3;
  }
  *count = (int64_t)launches.size();
  return 0;
}

extern "C" int bl_cuda_record_timing(int device, int on) {
  BL_CHECK(bl_dev_check(device, "record"));
  std::lock_guard<std::mutex> g(mu);
  timing = on != 0;
  return 0;
}

extern "C" int bl_cuda_record_mark(int device, int64_t *count) {
  std::lock_guard<std::mutex> g(mu);
  *count = 0;
  if (rec_dev.load() != device) return bl_set_error(BL_EINVAL, "record: cuda:%d is not being recorded", device);
  *count = (int64_t)launches.size();
  return 0;
}

extern "C" int bl_cuda_record_get(int64_t i, bl_cuda_launch_rec *out) {
  std::lock_guard<std::mutex> g(mu);
  if (rec_dev.load() >= 0) return bl_set_error(BL_EINVAL, "record: the log is read after bl_cuda_record_end");
  if (i < 0 || i >= (int64_t)launches.size())
    return bl_set_error(BL_EINVAL, "record: launch %lld of %zu", (long long)i, launches.size());
  *out = launches[(size_t)i];
  return 0;
}
