/* Process group over MPI for CPU tensors (CUDA tensors: NCCL, nccl.c). MPI is started only when a launcher
 * (mpirun/mpiexec, srun with PMI/PMIx) started us, so a plain `bertlua x.lua`
 * stays a world of one without touching MPI. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "../base/internal.h"
#include "bl_corpus.h" /* bl_corpus_now: the monotonic clock */
#include "dist_internal.h"

static int dist_on, dist_rank, dist_size = 1, local_rank, local_size = 1;

static int launched_by_mpi(void) {
  static const char *vars[] = {
    "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MV2_COMM_WORLD_SIZE", NULL
  };
  for (int i = 0; vars[i]; i++)
    if (getenv(vars[i])) return 1;
  return 0;
}

static int mpi_fail(int err, const char *op) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(err, msg, &len);
  return bl_set_error(BL_EIO, "%s: MPI error: %s", op, msg);
}

int bl_dist_init(int *argc, char ***argv) {
  if (dist_on || !launched_by_mpi()) return 0;
  int provided, already;
  MPI_Initialized(&already);
  if (!already) {
    int err = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    if (err != MPI_SUCCESS) return mpi_fail(err, "dist_init");
  }
  /* Errors come back as codes so they turn into Lua errors, not silent aborts. */
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &dist_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &dist_size);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, dist_rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &local_rank);
  MPI_Comm_size(local, &local_size);
  MPI_Comm_free(&local);
  dist_on = 1;
  return 0;
}

/* The CPU collectives' watchdog (MPI cannot time a collective out by itself): every wait polls its requests
 * until they complete or BL_DIST_TIMEOUT seconds (default 600) pass, then fails naming the collective, so a
 * dead, stopped or diverged rank ends the job (the recipes' error path calls bl_dist_abort) instead of
 * leaving the others spinning. */
double bl_dist_timeout_s(void) {
  const char *e = getenv("BL_DIST_TIMEOUT");
  char *end = NULL;
  double t = e ? strtod(e, &end) : 0;
  if (e && (end == e || *end || !(t > 0))) {
    static int said;
    if (!said++) fprintf(stderr, "bertlua: BL_DIST_TIMEOUT=%s ignored (a number of seconds > 0); using 600\n", e);
    t = 0;
  }
  return t > 0 ? t : 600.0;
}

int bl_dist_wait(MPI_Request *req, int n, const char *op, const char *what, bl_reducer *r) {
  double deadline = bl_corpus_now() + bl_dist_timeout_s();
  for (long spins = 0;; spins++) {
    int done = 0;
    int err = MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE);
    if (err != MPI_SUCCESS) return mpi_fail(err, op);
    if (done) return 0;
    /* the requests stay pending on an error: the job is expected to end (bl_dist_abort) */
    if (r) BL_CHECK(bl_reducer_poll(r));
    if (bl_corpus_now() > deadline)
      return bl_set_error(BL_EIO,
                          "%s: the MPI %s did not complete within %.0f s on rank %d: another rank died, "
                          "was stopped or is stuck, or the ranks run different steps (BL_DIST_TIMEOUT sets the "
                          "limit)",
                          op, what, bl_dist_timeout_s(), dist_rank);
    struct timespec ts = { 0, spins < 1000 ? 50000 : 1000000 }; /* 50 us, after 50 ms 1 ms */
    nanosleep(&ts, NULL);
  }
}

int bl_dist_initialized(void) { return dist_on; }
MPI_Comm bl_dist_comm(void) { return MPI_COMM_WORLD; }
int bl_dist_rank(void) { return dist_rank; }
int bl_dist_size(void) { return dist_size; }
int bl_dist_local_rank(void) { return local_rank; }
int bl_dist_local_size(void) { return local_size; }

int bl_dist_barrier(void) {
  if (!dist_on) return 0;
  MPI_Request req;
  int err = MPI_Ibarrier(MPI_COMM_WORLD, &req);
  return err == MPI_SUCCESS ? bl_dist_wait(&req, 1, "barrier", "barrier", NULL) : mpi_fail(err, "barrier");
}

static int mpi_type(const bl_tensor *t, MPI_Datatype *ty, const char *op) {
  switch (t->dtype) {
    case BL_F32: *ty = MPI_FLOAT; return 0;
    case BL_F64: *ty = MPI_DOUBLE; return 0;
    case BL_I32: *ty = MPI_INT32_T; return 0;
    case BL_I64: *ty = MPI_INT64_T; return 0;
    case BL_U8:
    case BL_BOOL: *ty = MPI_UINT8_T; return 0;
  }
  return bl_set_error(BL_EINVAL, "%s: dtype %s is not supported for CPU collectives", op, bl_dtype_name(t->dtype));
}

static int check_collective(const bl_tensor *t, const char *op) {
  BL_CHECK(bl_tensor_check(t, op));
  if (t->device >= 0)
    return bl_set_error(BL_EUNSUPPORTED, "%s: tensor is on cuda:%d; GPU collectives go through NCCL", op, t->device);
  if (!bl_tensor_is_contiguous(t)) return bl_set_error(BL_EINVAL, "%s: tensor must be contiguous", op);
  if (t->numel > INT32_MAX) return bl_set_error(BL_EINVAL, "%s: tensor too large for one MPI call", op);
  return 0;
}

int bl_dist_allreduce_sum(bl_tensor *t) {
#ifdef BL_HAVE_NCCL
  if (t && t->storage && t->device >= 0) /* CUDA tensors: NCCL (nccl.c) */
    return !dist_on || dist_size == 1 ? 0 : bl_nccl_allreduce_sum(t, MPI_COMM_WORLD, dist_rank, dist_size);
#endif
  BL_CHECK(check_collective(t, "allreduce"));
  if (!dist_on || dist_size == 1) return 0;
  MPI_Datatype ty = MPI_BYTE;
  BL_CHECK(mpi_type(t, &ty, "allreduce"));
  MPI_Request req;
  int err = MPI_Iallreduce(MPI_IN_PLACE, t->data, (int)t->numel, ty, MPI_SUM, MPI_COMM_WORLD, &req);
  return err == MPI_SUCCESS ? bl_dist_wait(&req, 1, "allreduce", "all-reduce", NULL) : mpi_fail(err, "allreduce");
}

int bl_dist_allreduce_sum_watched(bl_tensor *t, bl_reducer *r) {
  if (!r || (t && t->storage && t->device >= 0)) return bl_dist_allreduce_sum(t);
  BL_CHECK(check_collective(t, "allreduce"));
  if (!dist_on || dist_size == 1) return 0;
  MPI_Datatype ty = MPI_BYTE;
  BL_CHECK(mpi_type(t, &ty, "allreduce"));
  MPI_Request req;
  int err = MPI_Iallreduce(MPI_IN_PLACE, t->data, (int)t->numel, ty, MPI_SUM, MPI_COMM_WORLD, &req);
  return err == MPI_SUCCESS ? bl_dist_wait(&req, 1, "allreduce", "all-reduce", r) : mpi_fail(err, "allreduce");
}

int bl_dist_broadcast(bl_tensor *t, int root) {
#ifdef BL_HAVE_NCCL
  if (t && t->storage && t->device >= 0) {
    if (root < 0 || root >= dist_size)
      return bl_set_error(BL_EINVAL, "broadcast: root %d outside world of %d", root, dist_size);
    return !dist_on || dist_size == 1 ? 0 : bl_nccl_broadcast(t, root, MPI_COMM_WORLD, dist_rank, dist_size);
  }
#endif
  BL_CHECK(check_collective(t, "broadcast"));
  if (root < 0 || root >= dist_size)
    return bl_set_error(BL_EINVAL, "broadcast: root %d outside world of %d", root, dist_size);
  if (!dist_on || dist_size == 1) return 0;
  MPI_Datatype ty = MPI_BYTE;
  BL_CHECK(mpi_type(t, &ty, "broadcast"));
  MPI_Request req;
  int err = MPI_Ibcast(t->data, (int)t->numel, ty, root, MPI_COMM_WORLD, &req);
  return err == MPI_SUCCESS ? bl_dist_wait(&req, 1, "broadcast", "broadcast", NULL) : mpi_fail(err, "broadcast");
}

void bl_dist_abort(const char *message, int code) {
  fprintf(stderr, "[rank %d] %s\n", dist_rank, message ? message : "aborting");
  fflush(stderr);
#ifdef BL_HAVE_NCCL
  bl_nccl_shutdown(1); /* frees this rank's GPU side at once; MPI_Abort ends the others */
#endif
  if (dist_on) MPI_Abort(MPI_COMM_WORLD, code ? code : 1);
  exit(code ? code : 1); /* the host's fatal path, never called on library errors */
}

void bl_dist_finalize(void) {
  if (!dist_on) return;
#ifdef BL_HAVE_NCCL
  bl_nccl_shutdown(0);
#endif
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
  dist_on = 0;
}
