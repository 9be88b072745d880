// Emulated CUDA: the data-type enum shared by the CUDA libraries (cuBLASLt,
// NCCL users), values as NVIDIA documents them for cudaDataType_t.
// The toolkit's guard: in a real CUDA build (test_ptx.cu) the toolkit's header wins.
#pragma once
#if !defined(__LIBRARY_TYPES_H__)
#define __LIBRARY_TYPES_H__
typedef enum cudaDataType_t {
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
  CUDA_R_16F = 2,
  CUDA_R_8I = 3,
  CUDA_R_32I = 10,
  CUDA_R_16BF = 14,
} cudaDataType_t;
#endif
