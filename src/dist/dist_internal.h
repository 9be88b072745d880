/* Internal interface between the MPI process group (dist.c) and the NCCL
 * communicator for CUDA tensors (nccl.c, compiled only when the build found
 * CUDA and NCCL: BL_HAVE_NCCL). Not part of the FFI surface. */
#ifndef BL_DIST_INTERNAL_H
#define BL_DIST_INTERNAL_H
#include <mpi.h>
#include "bl_dist.h"
#include "bl_tensor.h"

#ifdef BL_HAVE_NCCL
/* In-place sum all-reduce / broadcast of a contiguous tensor on cuda:N
 * (f32, f64, f16, bf16, i32, i64, u8) across the MPI world. The communicator
 * is made on first use: rank 0 creates the ncclUniqueId and broadcasts it
 * over `world`; every rank must call with a tensor on its own GPU (usually
 * cuda:<local rank>), in the same order, as with any collective.
 * The call queues the collective on the device's stream (bl_cuda_stream) and
 * waits for it with a watchdog: an NCCL error, or no completion within
 * BL_NCCL_TIMEOUT seconds (default 600), aborts the communicator
 * (ncclCommAbort) and returns BL_EIO with a message, so the caller can end
 * the job (bl_dist_abort) instead of hanging on a dead rank. */
int bl_nccl_allreduce_sum(bl_tensor *t, MPI_Comm world, int rank, int size);
int bl_nccl_broadcast(bl_tensor *t, int root, MPI_Comm world, int rank, int size);
/* abort != 0: ncclCommAbort (error paths), else ncclCommDestroy. Idempotent. */
void bl_nccl_shutdown(int abort);

/* The device side of bl_reducer (reducer.c): a communication stream, an event
 * per bucket and one for the end, made once (collective: may create the
 * communicator). launch queues the sum of `part` (a view on the reducer's
 * device) on the communication stream after the compute stream's work so
 * far; finish makes the compute stream wait for the communication stream and
 * waits on the host under the watchdog (BL_NCCL_TIMEOUT). */
typedef struct bl_nccl_buckets bl_nccl_buckets;
int bl_nccl_buckets_new(const bl_tensor *buf, int nbuckets, MPI_Comm world, int rank, int size, bl_nccl_buckets **res);
int bl_nccl_buckets_launch(bl_nccl_buckets *b, bl_tensor *part, int bucket);
int bl_nccl_buckets_finish(bl_nccl_buckets *b);    /* the compute stream waits for the sums; no host wait */
int bl_nccl_buckets_wait(bl_nccl_buckets *b);      /* host wait for the compute stream, under the watchdog */
void bl_nccl_buckets_replayed(bl_nccl_buckets *b); /* the graph with the sums was replayed */
int bl_nccl_buckets_poll(bl_nccl_buckets *b);      /* no wait: the last finish's sums done, late or failed */
void bl_nccl_buckets_free(bl_nccl_buckets *b);
#endif
/* MPI world of the process group (dist.c), for the reducer's CPU path. */
MPI_Comm bl_dist_comm(void);
/* Waits for n MPI requests under the CPU collectives' watchdog: BL_EIO naming op and what (e.g. "all-reduce")
 * when they have not completed within bl_dist_timeout_s() (BL_DIST_TIMEOUT, default 600 s); polls r (may be
 * NULL) between tests. */
int bl_dist_wait(MPI_Request *req, int n, const char *op, const char *what, bl_reducer *r);
double bl_dist_timeout_s(void);
#endif
