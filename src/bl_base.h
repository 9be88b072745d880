/* bertlua — base definitions: status codes, errors, dtypes, devices.
 *
 * Contract for every bl_ function that can fail: it returns 0 on success and
 * a negative status otherwise, after recording a human-readable message
 * ("op: what was wrong") retrievable with bl_last_error(). The message is
 * thread-local. No bl_ function aborts or exits on bad input.
 *
 * Everything between BL_CDEF_BEGIN and BL_CDEF_END is also fed to LuaJIT's
 * ffi.cdef at build time, so it must be plain C declarations: no macros,
 * no includes, only types LuaJIT knows (stdint types, size_t, pointers).
 */
#ifndef BL_BASE_H
#define BL_BASE_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* BL_CDEF_BEGIN */
enum {
  BL_OK = 0,
  BL_EINVAL = -1,      /* bad argument: shape, dtype, device, range */
  BL_ENOMEM = -2,      /* allocation failed */
  BL_EIO = -3,         /* file or stream problem */
  BL_EFORMAT = -4,     /* corrupt or unsupported file content */
  BL_EDEVICE = -5,     /* device missing or device runtime error */
  BL_EUNSUPPORTED = -6 /* valid request this build/backend cannot do */
};

typedef enum bl_dtype {
  BL_F32 = 0,
  BL_F64 = 1,
  BL_F16 = 2,
  BL_BF16 = 3,
  BL_I32 = 4,
  BL_I64 = 5,
  BL_U8 = 6,
  BL_BOOL = 7,
  BL_NUM_DTYPES = 8
} bl_dtype;

/* Devices are ints: -1 is the CPU, N >= 0 is cuda:N. */

const char *bl_last_error(void);
void bl_clear_error(void);
int bl_set_error(int status, const char *fmt, ...);

const char *bl_dtype_name(int dtype);
int bl_dtype_size(int dtype);
int bl_dtype_is_float(int dtype);

const char *bl_version(void);
const char *bl_blas_info(void);
/* The CPU and the vector ISA path of the CPU ops, e.g. "AMD EPYC 9R14;
 * kernels avx512 (CPU: avx512 avx512_bf16)". The path is the best the CPU
 * has (amx, avx512, avx2, baseline), capped by the environment variable
 * BL_CPU_ISA when the process starts, or by bl_cpu_set_isa (an error for an
 * unknown name or one the CPU lacks; process-wide, not thread-safe against
 * ops running at that moment). amx is avx512 with the bf16 and int8
 * inference GEMMs on AMX tiles (CPU with AMX-BF16/INT8 and AVX512-BF16/VNNI,
 * and the OS's tile permission); BL_CPU_ISA=avx512 keeps them on
 * vdpbf16ps / vpdpbusd. */
const char *bl_cpu_info(void);
/* The library that runs the linear layers' GEMMs: "oneDNN x.y.z" (the default in a build that found
 * libdnnl-dev), "OpenBLAS" (BL_GEMM=openblas, or no oneDNN) or "bertlua packed" (BL_GEMM=own). */
const char *bl_gemm_backend(void);
const char *bl_cpu_isa(void);
int bl_cpu_set_isa(const char *name);
/* 1 when the CPU ops can use feature now: "avx2", "avx512", "amx" (the path
 * in use is at least that), "avx512_bf16", "avx512_vnni" (the CPU has it and
 * the AVX-512 or amx path is in use: the bf16 and VNNI int8 inference GEMMs) */
int bl_cpu_has(const char *feature);
int bl_cuda_compiled(void); /* 1 when built with the CUDA backend */
int bl_nccl_compiled(void);
int bl_cuda_device_count(void); /* 0 when no driver/GPU or CPU-only build */
int bl_cuda_device_name(int device, char *buf, int buflen);
/* Waits for the work queued on cuda:N (kernels run asynchronously; timings
 * and host reads of device memory wait here). Error in a CPU-only build. */
int bl_cuda_synchronize(int device);
/* f32 GEMMs on TF32 tensor cores (1) or in full f32 (0, the default); global,
 * like torch.backends.cuda.matmul.allow_tf32. No-op in a CPU-only build. */
void bl_cuda_set_tf32(int enable);
/* Counts of CUDA runtime calls on cuda:N since start: host-blocking synchronisations (stream/device/event
 * synchronize, synchronous copies), cudaMalloc, cudaFree and kernel launches. The emulated device
 * (-DBERTLUA_CUDA_EMU=ON) counts every call; a real-GPU build counts those of bertlua's device layer
 * (bl_dev_malloc/free, bl_dev_memcpy, bl_cuda_synchronize) and reports launches as -1. `conversions`: launches of
 * the generic strided copy that change the dtype (an op without a native path for its operands' dtype making f32
 * images), counted by the kernel layer on both. Error in a CPU-only build. */
/* graph_launches: CUDA graph launches (bl_cuda_graph_launch); graph_kernels: the kernels they ran (included in
 * launches; -1 on a real GPU). pageable_h2d: host-to-device copies from pageable host memory (-1 on a real GPU). */
typedef struct bl_cuda_count {
  int64_t syncs, mallocs, frees, launches, conversions, graph_launches, graph_kernels, pageable_h2d;
} bl_cuda_count;
int bl_cuda_counters(int device, bl_cuda_count *out);
/* Deferred index checks on cuda:N. On (enable = 1), ops that validate indices on the device (embedding and
 * gather ids, cross-entropy targets) no longer wait to read the result back before returning: the first
 * out-of-range index is recorded on the device and the bad entries are replaced by a safe index, so the kernels
 * stay in bounds (their results are then not valid). bl_cuda_check_deferred waits once and returns the recorded
 * error (naming the op, position and value; BL_EINVAL) and clears it, or 0. Off (the default): each op checks
 * before it returns. A training loop turns them on and checks when it logs. Errors in a CPU-only build. */
int bl_cuda_defer_checks(int device, int enable);
int bl_cuda_check_deferred(int device);
/* Launch log for the step-time model (recipes/benchmark.lua --model-time): between bl_cuda_record_begin and
 * bl_cuda_record_end every kernel launch, cuBLASLt call, memset and copy on cuda:N is logged with the FLOPs and the
 * minimum bytes it must move, as its launch site computes them from its arguments. `engine` says what the FLOPs run
 * on (BL_ENGINE_*); class groups launches for the model's table. On the emulated device every launch is also seen by
 * the emulator: one whose site states no cost is logged with class "unannotated". One device at a time.
 * bl_cuda_record_end waits for the recorded work: a launch whose work depends on device data (the attention
 * kernels skip key tiles the mask rules out) is costed from a count that work wrote. */
enum { BL_ENGINE_MEM = 0, BL_ENGINE_TC16 = 1, BL_ENGINE_TF32 = 2, BL_ENGINE_FP32 = 3, BL_ENGINE_PCIE = 4 };
/* in_graph: the launch was captured into a CUDA graph (bl_cuda_graph_begin): it runs without a launch gap.
 * measured_s: with bl_cuda_record_timing on, the seconds from a CUDA event recorded on the device's stream before
 * this launch to the one before the next logged launch (or the end of the recording): the launch's own time plus
 * any idle time while the host falls behind. -1 when not timed (timing off, or the launch was captured). */
typedef struct bl_cuda_launch_rec {
  const char *name, *cls;
  int engine;
  double flops, bytes;
  int in_graph;
  double measured_s;
} bl_cuda_launch_rec;
int bl_cuda_record_begin(int device);
/* Whether the recordings that follow also time each launch (measured_s; scripts/gpu_check.sh's per-class table). */
int bl_cuda_record_timing(int device, int on);
int bl_cuda_record_end(int device, int64_t *count);
/* While recording cuda:N: *count = the launches logged so far (marks where a part of a step begins). */
int bl_cuda_record_mark(int device, int64_t *count);
int bl_cuda_record_get(int64_t i, bl_cuda_launch_rec *out);
/* Emulated device only: while on, large kernels, copies, memsets and library calls are accepted (and logged) but
 * not executed, and allocations take no host memory until written (tests/emu/README.md): a model too large to run
 * on the emulator can still be recorded. Results are garbage. Turning it on elsewhere is an error. */
int bl_cuda_dry_run(int device, int on);
/* CUDA graph of a training step (--cuda-graph; bertlua.train.graph): between bl_cuda_graph_begin and
 * bl_cuda_graph_end the work queued on cuda:N's compute stream is captured (stream capture), not run. The first
 * capture is instantiated; a later one whose work is the same kernels in the same order only updates the
 * instantiated graph's parameters (cudaGraphExecUpdate: kernel arguments such as dropout seeds and the learning
 * rate change from step to step), otherwise it is instantiated anew. bl_cuda_graph_launch runs it on the compute
 * stream. While capturing, uploads from host memory are staged in pinned buffers of the graph (two sets, used by
 * alternate captures), and a host wait, a read of device memory or a device allocation is an error naming the op
 * (the capture is then void: bl_cuda_graph_abort ends it). Errors in a CPU-only build. */
typedef struct bl_cuda_graph bl_cuda_graph;
typedef struct bl_cuda_graph_stats {
  int64_t nodes, instantiations, updates, launches, replays;
} bl_cuda_graph_stats;
int bl_cuda_graph_new(int device, bl_cuda_graph **out);
void bl_cuda_graph_free(bl_cuda_graph *g);
int bl_cuda_graph_begin(bl_cuda_graph *g);
int bl_cuda_graph_end(bl_cuda_graph *g);
void bl_cuda_graph_abort(bl_cuda_graph *g);
int bl_cuda_graph_launch(bl_cuda_graph *g);
/* Capture once, replay: bl_cuda_graph_replay launches the graph instantiated last, unchanged, without a new capture
 * (counted in launches and replays). Kernels that read their per-step values from device memory (dropout seed
 * slots, BL_SEED_SLOT in bl_ops.h; bl_amp_config.lr_from) take them from what was copied there before the replay.
 * *ok (bl_cuda_graph_replayable) = 1 when a replay would be valid: a graph was captured and launched, and no device
 * block was handed out on its device since that capture ended (a buffer the graph reads may have been replaced, or
 * a scratch block it writes taken by other work: capture again). */
int bl_cuda_graph_replay(bl_cuda_graph *g);
int bl_cuda_graph_replayable(const bl_cuda_graph *g, int *ok);
/* The step's inputs for the next launch or replay: the n bytes at src are copied into one of the graph's two
 * pinned buffers and from there into dst (contiguous, on the graph's device, at least n bytes) by one copy queued
 * on the compute stream, so it lands after the launches queued before it and before those queued after it. A pinned
 * buffer is rewritten only after the copy that read it, two calls ago, has run (a wait only when the host is that
 * far ahead). An error while capturing. */
struct bl_tensor;
int bl_cuda_graph_set_inputs(bl_cuda_graph *g, struct bl_tensor *dst, const void *src, size_t n);
int bl_cuda_graph_stats_get(const bl_cuda_graph *g, bl_cuda_graph_stats *out);
int bl_cuda_get_tf32(void);
int bl_num_threads(void);
void bl_set_num_threads(int n);
/* FNV-1a 64-bit hash of n bytes, continuing from h (start with 14695981039346656037). */
uint64_t bl_fnv1a64(const void *data, size_t n, uint64_t h);
/* Graceful stop: after bl_stop_watch(), SIGINT and SIGTERM only record the signal; long loops poll
 * bl_stop_signal() (0 or the signal number), agree on it across ranks and stop with a checkpoint. A
 * second signal of the same kind ends the process as usual. */
int bl_stop_watch(void);
int bl_stop_signal(void);
/* BL_CDEF_END */

/* Internal helpers (not part of the FFI surface). */
#define BL_MAX_DIMS 8
#define BL_CHECK(expr)              \
  do {                              \
    int bl_rc_ = (expr);            \
    if (bl_rc_ != 0) return bl_rc_; \
  } while (0)
#define BL_ERR(fmt, ...) bl_set_error(BL_EINVAL, fmt, ##__VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
