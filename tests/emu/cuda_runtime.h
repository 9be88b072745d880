// Emulated CUDA device (-DBERTLUA_CUDA_EMU=ON): the runtime API subset bertlua
// uses, as declared by NVIDIA's cuda_runtime.h. The C part serves C callers
// (src/dist/nccl.c); C++ translation units also get the device side
// (emu_device.h: thread indices, barriers, warp collectives, atomics, math,
// the launch call that <<<>>> is rewritten into). See tests/emu/README.md.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorLaunchFailure = 719,
  cudaErrorInvalidDevice = 101,
  cudaErrorNoDevice = 100,
  cudaErrorPeerAccessAlreadyEnabled = 704,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorCapturedEvent = 907,
  cudaErrorGraphExecUpdateFailure = 910,
  cudaErrorUnknown = 999,
} cudaError_t;

typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;
typedef struct emu_graph *cudaGraph_t;
typedef struct emu_graph_exec *cudaGraphExec_t;
typedef struct emu_graph_node *cudaGraphNode_t;

typedef enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
} cudaStreamCaptureMode;
typedef enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
} cudaStreamCaptureStatus;
typedef enum cudaGraphExecUpdateResult {
  cudaGraphExecUpdateSuccess = 0,
  cudaGraphExecUpdateError = 1,
  cudaGraphExecUpdateErrorTopologyChanged = 2,
  cudaGraphExecUpdateErrorNodeTypeChanged = 3,
  cudaGraphExecUpdateErrorFunctionChanged = 4,
} cudaGraphExecUpdateResult;
typedef struct cudaGraphExecUpdateResultInfo {
  cudaGraphExecUpdateResult result;
  cudaGraphNode_t errorNode;
  cudaGraphNode_t errorFromNode;
} cudaGraphExecUpdateResultInfo;

typedef enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
} cudaMemcpyKind;

typedef enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9,
} cudaFuncAttribute;

#define cudaStreamDefault          0x00
#define cudaStreamNonBlocking      0x01
#define cudaEventDefault           0x00
#define cudaEventBlockingSync      0x01
#define cudaEventDisableTiming     0x02
#define cudaHostAllocDefault       0x00
#define cudaHostAllocPortable      0x01
#define cudaHostAllocMapped        0x02
#define cudaHostAllocWriteCombined 0x04
#define cudaStreamLegacy           ((cudaStream_t)0x1)
#define cudaStreamPerThread        ((cudaStream_t)0x2)

// The fields bertlua and its users read; values of an H100 SXM (sm_90).
typedef struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  size_t sharedMemPerBlockOptin;
  size_t sharedMemPerMultiprocessor;
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int major, minor;
  int multiProcessorCount;
  int maxThreadsPerMultiProcessor;
  int clockRate;
  int memoryClockRate;
  int memoryBusWidth;
  int l2CacheSize;
  size_t totalConstMem;
  int unifiedAddressing;
  int canMapHostMemory;
  int concurrentKernels;
  int asyncEngineCount;
  int pciBusID, pciDeviceID, pciDomainID;
} cudaDeviceProp;

const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int dev);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaDeviceCanAccessPeer(int *can, int dev, int peer);
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned flags);

cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags);
cudaError_t cudaMallocHost(void **p, size_t n);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemcpyPeer(void *dst, int dst_dev, const void *src, int src_dev, size_t n);
cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_dev, const void *src, int src_dev, size_t n, cudaStream_t s);
cudaError_t cudaMemset(void *p, int value, size_t n);
cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s);

cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);

cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

// Stream capture and graphs (CUDA 12 signatures). A capture records the stream's kernels, copies, memsets and
// library calls in order; a launch of the instantiated graph queues them again, in that order, on its stream.
// Other streams join a capture as on the real runtime: an event recorded in the capture, waited for by another
// stream, makes that stream capture into the same graph (fork), and the capturing stream's wait for an event
// recorded there after its last work joins it back; the capture's end fails (cudaErrorStreamCaptureUnjoined) for
// a stream not joined back. The graph keeps the work of all its streams in the order it was queued, a valid order
// of their dependencies, and a launch runs it in that order.
// Global mode only: while a stream of a device captures, a host-blocking call, cudaMalloc/cudaFree, work on the
// legacy stream, a copy from pageable host memory or a wait on an event recorded outside the capture is refused
// (cudaErrorStreamCapture*) and invalidates the capture, whose end then fails. Querying or waiting on the host for
// an event last recorded in a capture is cudaErrorCapturedEvent.
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status);
// The calling thread's capture mode: kept and swapped only (the checks above are those of the global mode).
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode *mode);
cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t *nodes, size_t *n);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags);
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t e, cudaGraph_t g, cudaGraphExecUpdateResultInfo *info);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);

cudaError_t emu_func_set_attribute(const void *fn, cudaFuncAttribute attr, int value);

// Per-device counters of the emulated runtime (read through bl_cuda_counters).
typedef struct emu_counters {
  int64_t syncs;          // host-blocking calls: stream/device/event synchronize, synchronous copies
  int64_t mallocs;        // cudaMalloc
  int64_t frees;          // cudaFree
  int64_t launches;       // kernel launches (a graph launch counts the kernels it runs)
  int64_t graph_launches; // cudaGraphLaunch
  int64_t graph_kernels;  // kernels run by graph launches (included in launches)
  int64_t pageable_h2d;   // host-to-device copies from pageable (not page-locked) host memory
} emu_counters;
int emu_get_counters(int dev, emu_counters *out);
// Launch recording for the step-time model (kernels/stepmodel.cu): the hook, when set, is called at every accepted
// kernel launch with the device and the kernel's name and launch site. In a dry run, kernels of more than
// EMU_DRY_MAX_THREADS threads, copies and memsets of more than EMU_DRY_MAX_BYTES and every library call are
// accepted but not executed, and new allocations are not filled: a large model's step can be recorded without its
// compute or its memory; the small work still runs so that host-visible results (index checks) keep their meaning.
#define EMU_DRY_MAX_THREADS 65536
#define EMU_DRY_MAX_BYTES   (1u << 20)
typedef void (*emu_launch_hook)(int dev, const char *name, const char *file, int line);
void emu_set_launch_hook(emu_launch_hook hook, int dry_run);

#ifdef __cplusplus
}
template <class T>
static inline cudaError_t cudaFuncSetAttribute(T *fn, cudaFuncAttribute attr, int value) {
  return emu_func_set_attribute((const void *)fn, attr, value);
}
#include "emu_device.h"
#endif
