// Blocks of a launch in flight at once (BL_EMU_BLOCKS=2, set by ctest): the scheduler must interleave them, and the
// ThreadSanitizer build must report a race between blocks: a sum that each block adds to with += where it needs
// atomicAdd. In the TSan build ctest expects the report (kernel name and this file's line).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

__global__ void sum_without_atomic(const float *in, float *sum) {
  if (threadIdx.x == 0) *sum += in[blockIdx.x]; // needs atomicAdd(sum, in[blockIdx.x])
}

// Each block stamps a shared clock when it starts and when it ends, with a barrier between.
__global__ void stamp(unsigned *clock, unsigned *first, unsigned *last) {
  if (threadIdx.x == 0) first[blockIdx.x] = atomicAdd(clock, 1u);
  __syncthreads();
  if (threadIdx.x == 0) last[blockIdx.x] = atomicAdd(clock, 1u);
}

int main(void) {
  const char *env = getenv("BL_EMU_BLOCKS");
  if (!env || atoi(env) < 2) {
    fprintf(stderr, "test_emu_block_race: run it with BL_EMU_BLOCKS=2 or more (ctest sets it)\n");
    return 1;
  }
  const int nb = 8;
  unsigned *clock = nullptr, *first = nullptr, *last = nullptr;
  cudaMalloc((void **)&clock, sizeof(unsigned));
  cudaMalloc((void **)&first, nb * sizeof(unsigned));
  cudaMalloc((void **)&last, nb * sizeof(unsigned));
  cudaMemset(clock, 0, sizeof(unsigned));
  stamp<<<nb, 64>>>(clock, first, last);
  unsigned f[nb], l[nb];
  cudaMemcpy(f, first, sizeof f, cudaMemcpyDeviceToHost);
  cudaMemcpy(l, last, sizeof l, cudaMemcpyDeviceToHost);
  int overlaps = 0; // pairs of blocks each of which started before the other ended
  for (int i = 0; i < nb; i++)
    for (int j = i + 1; j < nb; j++) overlaps += f[i] < l[j] && f[j] < l[i];
  printf("%d of %d pairs of blocks overlapped\n", overlaps, nb * (nb - 1) / 2);
  if (overlaps == 0) {
    fprintf(stderr, "FAIL: no two blocks were in flight at once\n");
    return 1;
  }

  float *in = nullptr, *sum = nullptr;
  cudaMalloc((void **)&in, nb * sizeof(float));
  cudaMalloc((void **)&sum, sizeof(float));
  cudaMemset(in, 0, nb * sizeof(float));
  cudaMemset(sum, 0, sizeof(float));
  sum_without_atomic<<<nb, 32>>>(in, sum);
  cudaError_t e = cudaDeviceSynchronize();
  printf("kernel ran: %s\n", cudaGetErrorName(e));
  return e == cudaSuccess ? 0 : 1;
}
