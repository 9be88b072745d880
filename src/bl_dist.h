/* bertlua — process group over MPI (CPU tensors) and NCCL (CUDA tensors, in
 * builds with NCCL: one communicator per rank, its id broadcast over MPI on
 * first use, collectives on the device's stream, waited for with a watchdog
 * that aborts the communicator after an NCCL error or BL_NCCL_TIMEOUT seconds
 * (default 600) so a dead rank ends the job instead of hanging it).
 * bl_dist_init initialises MPI only when the process was started by an MPI
 * launcher (mpirun/srun); otherwise it is a world of one. */
#ifndef BL_DIST_H
#define BL_DIST_H
#include "bl_tensor.h"
#ifdef __cplusplus
extern "C" {
#endif
/* BL_CDEF_BEGIN */
int bl_dist_init(int *argc, char ***argv);
int bl_dist_initialized(void); /* 1 when MPI is active */
int bl_dist_rank(void);
int bl_dist_size(void);
int bl_dist_local_rank(void);
int bl_dist_local_size(void);
int bl_dist_barrier(void);
/* In-place sum all-reduce of a contiguous tensor: CPU (f32/f64/i32/i64, MPI)
 * or cuda:N (also f16/bf16, NCCL; each rank passes a tensor on its own GPU). */
int bl_dist_allreduce_sum(bl_tensor *t);
/* Broadcast a contiguous tensor from root (CPU: MPI, cuda:N: NCCL). */
int bl_dist_broadcast(bl_tensor *t, int root);
/* Ends the whole job with a message on this rank (MPI_Abort when under MPI). */
void bl_dist_abort(const char *message, int code);
void bl_dist_finalize(void);

/* Bucketed gradient all-reduce (data parallel). The f32 buffer `grads`
 * (contiguous, CPU or cuda:N) is cut into buckets of bucket_elems elements;
 * the caller launches bucket i as soon as its gradients are final, so the
 * reduction of late layers overlaps the backward pass of earlier ones, and
 * finish() launches the rest. The result is the SUM over ranks.
 *  - cuda:N: each launch records an event on the compute stream
 *    (bl_cuda_stream) that the reducer's own communication stream waits on
 *    before its ncclAllReduce; finish() makes the compute stream wait for the
 *    communication stream (the optimizer runs after it) and returns without
 *    waiting on the host: the next step is queued while the sums run.
 *    bl_reducer_wait() is the watched host wait: until the compute stream has
 *    done everything queued so far, under the NCCL watchdog (BL_NCCL_TIMEOUT;
 *    errors of the communicator are checked): a dead or stuck rank ends it with
 *    an error and the communicator aborted, instead of a hang. A training loop
 *    calls it where it waits anyway (before reading its log line).
 *  - CPU: MPI_Iallreduce per bucket, MPI_Waitall in finish(); wait() is a no-op.
 * reduce_dtype BL_F32, or BL_BF16 / BL_F16: a half copy of each bucket is
 * summed (half the bytes) and the sum written back into the f32 buffer; per
 * element the error is at most about (ranks + 1) * u * sum |g_rank| (one
 * rounding of each rank's value, one per addition; u = 2^-9 for bf16, 2^-11
 * for f16). f16 keeps 3 more bits but overflows above 65504: it is for
 * gradients that carry fp16 training's dynamic loss scale, whose overflow
 * check then skips the step (NVIDIA's allreduce_post_accumulation_fp16).
 * Streams, events and the half copy are made here: no allocation per step.
 * In a world of one every call is a no-op. Every rank must make the same
 * calls in the same order (they are collectives). */
typedef struct bl_reducer bl_reducer;
int bl_reducer_new(bl_tensor *grads, int64_t bucket_elems, int reduce_dtype, bl_reducer **res);
int bl_reducer_buckets(const bl_reducer *r);
int bl_reducer_launch(bl_reducer *r, int bucket); /* 0-based; launching one twice is an error */
int bl_reducer_finish(bl_reducer *r);             /* launches what is left; ready for the next step */
/* Forgets the buckets launched since the last finish, whose work was dropped: they were captured into a CUDA graph
 * whose capture failed (--cuda-graph; the step then runs again uncaptured and launches them anew). */
int bl_reducer_cancel(bl_reducer *r);
int bl_reducer_wait(bl_reducer *r); /* the watched wait (cuda), see above */
/* No wait: an error when the sums of the last finish() failed or are late past BL_NCCL_TIMEOUT (communicator
 * aborted then); 0 while they run or once they are done. */
int bl_reducer_poll(bl_reducer *r);
int bl_reducer_replayed(bl_reducer *r); /* a CUDA graph holding the step's collectives was replayed */
/* bl_dist_allreduce_sum of a CPU tensor that polls r between MPI tests: a loop's per-step vote cannot hang on a
 * rank stuck before the GPU sums that finish() no longer waits for. */
int bl_dist_allreduce_sum_watched(bl_tensor *t, bl_reducer *r);
void bl_reducer_free(bl_reducer *r);
/* BL_CDEF_END */
#ifdef __cplusplus
}
#endif
#endif
