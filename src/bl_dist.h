/* bertlua — process group over MPI (CPU tensors) and, later, NCCL (GPU tensors).
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
/* In-place sum all-reduce of a contiguous CPU tensor (f32/f64/i32/i64). */
int bl_dist_allreduce_sum(bl_tensor *t);
/* Broadcast a contiguous CPU tensor from root. */
int bl_dist_broadcast(bl_tensor *t, int root);
/* Ends the whole job with a message on this rank (MPI_Abort when under MPI). */
void bl_dist_abort(const char *message, int code);
void bl_dist_finalize(void);
/* BL_CDEF_END */
#ifdef __cplusplus
}
#endif
#endif
