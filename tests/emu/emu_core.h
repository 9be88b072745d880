// Emulated CUDA device: what emu_runtime.cpp (API, memory, streams) and
// emu_fiber.cpp (GPU threads as fibers) share. Internal to tests/emu.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>
#include <functional>

// Runs a whole grid now (device memory is accessible). Failures are reported through emu_fault.
void emu_run_grid(const emu::launch_cfg &c, const std::function<void()> &body, uint64_t launch_no);
// The seed of the thread-order randomisation (BL_EMU_SEED, default 1).
uint64_t emu_seed();
// Blocks of a launch in flight at once (BL_EMU_BLOCKS, 1 to emu::kSlots, default 1).
int emu_blocks_in_flight();
// Where a fault was found: the kernel or operation running now, for messages ("" outside any).
const char *emu_running_what();
// Bounds of the GPU-thread stacks, to recognise a stack overflow in the SIGSEGV handler.
bool emu_is_stack_guard(const void *addr);
// Called by emu_fault when it runs inside a GPU thread: leaves the thread for good (the grid is abandoned).
[[noreturn]] void emu_abandon_thread();
bool emu_in_gpu_thread();
