// TEST DOUBLE, not the emulated runtime: the one runtime type the emulated
// libraries' self-tests need (tests/emu/cuda_runtime.h is the real emulation).
#pragma once
typedef struct emu_double_stream *cudaStream_t;
