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
int bl_dist_initialized(void);    /* 1 when MPI is active */
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
/* BL_CDEF_END */
#ifdef __cplusplus
}
#endif
#endif
