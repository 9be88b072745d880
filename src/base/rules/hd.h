/* The rules in src/base/rules/ are scalar functions the C CPU code and the CUDA kernels (the .cu files of kernels/) both
 * apply: one definition, compiled for the host and, by nvcc, for the device. BL_HD marks such a function:
 * __host__ __device__ under nvcc, a plain static inline function in C and in the emulated build (tests/emu,
 * where device code is host C++). */
#ifndef BL_RULES_HD_H
#define BL_RULES_HD_H
#ifdef __CUDACC__
#define BL_HD static __host__ __device__ __forceinline__
#else
#define BL_HD static inline
#endif
#ifdef __CUDA_ARCH__ /* nvcc's device pass */
#define BL_UNROLL _Pragma("unroll")
#else
#define BL_UNROLL
#endif
#endif
