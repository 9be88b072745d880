// Internal interface of the emulated CUDA device (tests/emu), for the emulated
// libraries (cuBLASLt, NCCL) and the PTX twins. Host C++ only; not part of the
// bertlua API.
#pragma once
#include <cuda_runtime.h>
#include <stddef.h>
#include <functional>

// Enqueue work on stream s (0 = the legacy default stream of the current device): fn runs in stream order with
// device memory accessible; `what` names the operation in error messages.
void emu_stream_enqueue(cudaStream_t s, const char *what, std::function<void()> fn);
// True when [p, p+bytes) lies inside one live allocation of emulated device `dev`.
bool emu_is_device_range(int dev, const void *p, size_t bytes);
int emu_current_device();
// Warp collective for the PTX twins: all 32 lanes of the calling warp call it at the same call site; afterwards
// all[i*bytes .. ) holds lane i's `mine`. A missing lane is an error naming `where` (file:line).
void emu_warp_gather(const void *mine, void *all, size_t bytes, const char *where);
// Lane index and warp-local id of the calling GPU thread.
int emu_lane_id();

// ---- additions (device emulation side)
// The device (>= 0) owning the live allocation that contains p, or -1.
int emu_device_of(const void *p);
// Report a device-side fault found by an emulated library or kernel helper: prints the message with the seed and
// makes the error sticky on the current device (every later call returns cudaErrorLaunchFailure), like a GPU trap.
void emu_fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
