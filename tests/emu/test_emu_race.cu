// The ThreadSanitizer build of the emulated device must report a race inside a block: a shared-memory tile read
// by other threads without the __syncthreads between the write and the read. Registered in the TSan build only,
// where ctest expects the report (kernel name and this file's line); elsewhere it prints why it skips.
#include <cuda_runtime.h>
#include <stdio.h>

__global__ void reverse_without_barrier(const float *in, float *out) {
  __shared__ float tile[64];
  tile[threadIdx.x] = in[threadIdx.x];
  out[threadIdx.x] = tile[63 - threadIdx.x]; // needs a __syncthreads() before this read
}

int main(void) {
#ifndef BL_EMU_TSAN
  printf("skipped: only meaningful in the ThreadSanitizer build (-DBERTLUA_CUDA_EMU_TSAN=ON)\n");
  return 77;
#endif
  float *in = nullptr, *out = nullptr;
  cudaMalloc((void **)&in, 64 * sizeof(float));
  cudaMalloc((void **)&out, 64 * sizeof(float));
  cudaMemset(in, 0, 64 * sizeof(float));
  reverse_without_barrier<<<1, 64>>>(in, out);
  cudaError_t e = cudaDeviceSynchronize();
  printf("kernel ran: %s\n", cudaGetErrorName(e));
  return 0;
}
