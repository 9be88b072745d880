// Internal interface of the emulated CUDA device, shared by the emulated
// libraries (cuBLASLt, NCCL, PTX twins). Owned by the device emulation.
#pragma once
#include <cuda_runtime.h>
#include <stddef.h>
#include <functional>
void emu_stream_enqueue(cudaStream_t s, const char *what, std::function<void()> fn); // fn runs in stream order, device memory accessible
bool emu_is_device_range(int dev, const void *p, size_t bytes);   // inside one live allocation of emulated device dev
int emu_current_device();
void emu_warp_gather(const void *mine, void *all, size_t bytes, const char *where); // warp collective, all 32 lanes
int emu_lane_id();
