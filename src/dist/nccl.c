/* NCCL communicator for CUDA tensors (see dist_internal.h for the contract).
 *
 * One communicator per process, on the device of the first tensor it sees,
 * created non-blocking (ncclConfig_t.blocking = 0) so that neither its
 * creation nor a collective can hang the process: every wait below polls
 * ncclCommGetAsyncError and the stream with a deadline, and on an error or a
 * timeout the communicator is aborted (ncclCommAbort releases the GPU
 * resources and makes the other ranks' collectives fail too) and the call
 * returns an error. Compiled only when CMake found NCCL (BL_HAVE_NCCL).
 *
 * Creating the communicator is itself collective (the unique id goes from
 * rank 0 to the others over MPI), so every rank joins that exchange even when
 * its own arguments are bad, and all ranks then agree on whether every rank
 * is ready: a rank that fails locally makes the others fail too, with a
 * message, instead of leaving them in the broadcast. The broadcast is
 * non-blocking and polled under the same deadline, so a rank 0 that never
 * arrives (crashed, or stuck elsewhere) ends the wait too. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "../base/internal.h"
#include "../device/cuda_ops.h"
#include "dist_internal.h"

static ncclComm_t comm;
static int comm_device = -1;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double timeout_s(void) {
  const char *e = getenv("BL_NCCL_TIMEOUT");
  double t = e ? atof(e) : 0;
  return t > 0 ? t : 600.0;
}

static void sleep_us(long us) {
  struct timespec ts = { 0, us * 1000 };
  nanosleep(&ts, NULL);
}

void bl_nccl_shutdown(int abort) {
  if (!comm) return;
  if (!abort) {
    /* Finalize flushes pending work; it is non-blocking here, so bound the wait. */
    ncclResult_t st = ncclCommFinalize(comm);
    double end = now_s() + 30;
    while (st == ncclInProgress && now_s() < end) {
      if (ncclCommGetAsyncError(comm, &st) != ncclSuccess) break;
      if (st == ncclInProgress) sleep_us(100);
    }
    abort = st != ncclSuccess;
  }
  if (abort)
    ncclCommAbort(comm);
  else
    ncclCommDestroy(comm);
  comm = NULL;
  comm_device = -1;
}

static int fail(const char *op, const char *what, ncclResult_t r) {
  char last[256] = "";
  const char *l = comm ? ncclGetLastError(comm) : NULL;
  if (l && *l) snprintf(last, sizeof last, " - %s", l); /* copied: the abort frees it */
  bl_nccl_shutdown(1);
  return bl_set_error(BL_EIO, "%s: NCCL %s failed: %s%s; communicator aborted", op, what, ncclGetErrorString(r), last);
}

/* Waits for the communicator's pending operation (ncclInProgress) to end. */
static int wait_comm(const char *op, const char *what, double deadline) {
  for (;;) {
    ncclResult_t st = ncclInProgress;
    ncclResult_t r = ncclCommGetAsyncError(comm, &st);
    if (r != ncclSuccess) return fail(op, what, r);
    if (st == ncclSuccess) return 0;
    if (st != ncclInProgress) return fail(op, what, st);
    if (now_s() > deadline) {
      bl_nccl_shutdown(1);
      return bl_set_error(BL_EIO,
                          "%s: NCCL %s did not finish within %.0f s (a rank died or is stuck; "
                          "BL_NCCL_TIMEOUT sets the limit); communicator aborted",
                          op, what, timeout_s());
    }
    sleep_us(50);
  }
}

/* Waits for an MPI request under a deadline (MPI collectives cannot time out by themselves). */
static int wait_mpi(const char *op, const char *what, MPI_Request *req, double deadline) {
  for (;;) {
    int done = 0;
    if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      return bl_set_error(BL_EIO, "%s: MPI %s failed", op, what);
    if (done) return 0;
    if (now_s() > deadline) /* the request is left pending: the job is expected to end (bl_dist_abort) */
      return bl_set_error(BL_EIO,
                          "%s: MPI %s did not complete within %.0f s (rank 0 failed, died or is stuck "
                          "before creating the NCCL communicator; BL_NCCL_TIMEOUT sets the limit)",
                          op, what, timeout_s());
    sleep_us(100);
  }
}

/* The NCCL id exchange; `local` is this rank's status so far (0 = ready). */
struct id_msg {
  int32_t status; /* rank 0's: 0 = the id below is valid */
  ncclUniqueId id;
};

static int ensure_comm(const char *op, int local, int device, MPI_Comm world, int rank, int size) {
  if (comm) {
    if (!local && device != comm_device)
      return bl_set_error(BL_EINVAL, "%s: tensor is on cuda:%d but this rank's NCCL communicator is on cuda:%d", op,
                          device, comm_device);
    return local;
  }
  char why[512] = "";
  if (!local) local = bl_dev_check(device, op);
  if (!local) {
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess) local = bl_set_error(BL_EDEVICE, "%s: cuda:%d: %s", op, device, cudaGetErrorString(ce));
  }
  struct id_msg msg;
  memset(&msg, 0, sizeof msg);
  if (rank == 0) {
    ncclResult_t r = local ? ncclSuccess : ncclGetUniqueId(&msg.id);
    if (r != ncclSuccess) local = bl_set_error(BL_EIO, "%s: ncclGetUniqueId failed: %s", op, ncclGetErrorString(r));
    msg.status = local != 0;
  }
  if (local) snprintf(why, sizeof why, "%s", bl_last_error());
  /* Every rank joins the exchange and the agreement, whatever its own state. */
  double deadline = now_s() + timeout_s();
  MPI_Request req;
  if (MPI_Ibcast(&msg, (int)sizeof msg, MPI_BYTE, 0, world, &req) != MPI_SUCCESS)
    return bl_set_error(BL_EIO, "%s: MPI broadcast of the NCCL id failed", op);
  BL_CHECK(wait_mpi(op, "broadcast of the NCCL id", &req, deadline));
  int mine = local ? rank + 1 : size + 1, first_bad = 0; /* min: the lowest failed rank + 1, size + 1 = none */
  if (MPI_Iallreduce(&mine, &first_bad, 1, MPI_INT, MPI_MIN, world, &req) != MPI_SUCCESS)
    return bl_set_error(BL_EIO, "%s: MPI agreement before NCCL init failed", op);
  BL_CHECK(wait_mpi(op, "agreement before NCCL init", &req, deadline));
  if (local) return bl_set_error(local, "%s", why);
  if (first_bad <= size)
    return bl_set_error(BL_EIO,
                        "%s: NCCL communicator not created: rank %d failed before the id exchange (see its "
                        "error)",
                        op, first_bad - 1);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, msg.id, rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    comm = NULL;
    return bl_set_error(BL_EIO, "%s: ncclCommInitRank failed: %s", op, ncclGetErrorString(r));
  }
  comm_device = device;
  return wait_comm(op, "communicator init", deadline);
}

static int nccl_type(const bl_tensor *t, ncclDataType_t *ty, const char *op) {
  switch (t->dtype) {
    case BL_F32: *ty = ncclFloat32; return 0;
    case BL_F64: *ty = ncclFloat64; return 0;
    case BL_F16: *ty = ncclFloat16; return 0;
    case BL_BF16: *ty = ncclBfloat16; return 0;
    case BL_I32: *ty = ncclInt32; return 0;
    case BL_I64: *ty = ncclInt64; return 0;
    case BL_U8:
    case BL_BOOL: *ty = ncclUint8; return 0;
  }
  return bl_set_error(BL_EINVAL, "%s: dtype %s is not supported by NCCL", op, bl_dtype_name(t->dtype));
}

/* Waits for the queued collective: NCCL errors and the stream (or, when ev is
 * given, that event of it), under one deadline. */
static int wait_stream(const char *op, const char *what, cudaStream_t s, cudaEvent_t ev) {
  double deadline = now_s() + timeout_s();
  BL_CHECK(wait_comm(op, what, deadline));
  for (;;) {
    cudaError_t ce = ev ? cudaEventQuery(ev) : cudaStreamQuery(s);
    if (ce == cudaSuccess) return 0;
    if (ce != cudaErrorNotReady) {
      bl_nccl_shutdown(1);
      return bl_set_error(BL_EDEVICE, "%s: cuda:%d: %s", op, comm_device, cudaGetErrorString(ce));
    }
    ncclResult_t st = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &st) != ncclSuccess || (st != ncclSuccess && st != ncclInProgress))
      return fail(op, what, st);
    if (now_s() > deadline) {
      bl_nccl_shutdown(1);
      return bl_set_error(BL_EIO,
                          "%s: NCCL %s did not complete within %.0f s (a rank died or is stuck; "
                          "BL_NCCL_TIMEOUT sets the limit); communicator aborted",
                          op, what, timeout_s());
    }
    sleep_us(20);
  }
}

/* Argument errors do not return before ensure_comm: the first call creates
 * the communicator with every rank, whatever this rank's arguments. */
static int prepare(const char *op, bl_tensor *t, MPI_Comm world, int rank, int size, ncclDataType_t *ty,
                   cudaStream_t *s) {
  *ty = ncclFloat32;
  int local =
      bl_tensor_is_contiguous(t) ? nccl_type(t, ty, op) : bl_set_error(BL_EINVAL, "%s: tensor must be contiguous", op);
  BL_CHECK(ensure_comm(op, local, t->device, world, rank, size));
  *s = (cudaStream_t)bl_cuda_stream(t->device);
  if (!*s) return BL_EDEVICE;
  return 0;
}

/* The end of a collective: r is what queueing it returned. */
static int finish(const char *op, const char *what, ncclResult_t r, cudaStream_t s) {
  if (r != ncclSuccess && r != ncclInProgress) return fail(op, what, r);
  return wait_stream(op, what, s, NULL);
}

int bl_nccl_allreduce_sum(bl_tensor *t, MPI_Comm world, int rank, int size) {
  const char *op = "allreduce";
  ncclDataType_t ty;
  cudaStream_t s;
  BL_CHECK(prepare(op, t, world, rank, size, &ty, &s));
  if (t->numel == 0) return 0;
  return finish(op, "all-reduce", ncclAllReduce(t->data, t->data, (size_t)t->numel, ty, ncclSum, comm, s), s);
}

int bl_nccl_broadcast(bl_tensor *t, int root, MPI_Comm world, int rank, int size) {
  const char *op = "broadcast";
  ncclDataType_t ty;
  cudaStream_t s;
  BL_CHECK(prepare(op, t, world, rank, size, &ty, &s));
  if (t->numel == 0) return 0;
  return finish(op, "broadcast", ncclBroadcast(t->data, t->data, (size_t)t->numel, ty, root, comm, s), s);
}

/* ---------------------------------------------------------------- buckets (bl_reducer) */
struct bl_nccl_buckets {
  int device, n;
  cudaStream_t comm_stream; /* non-blocking: ordered by events only */
  cudaEvent_t *ready;       /* per bucket, recorded on the compute stream at launch */
  cudaEvent_t done;         /* recorded on comm_stream at finish */
  cudaEvent_t queued;       /* recorded on the compute stream by wait(): everything queued before it */
  double finished_at;       /* when finish() queued the last step's sums (0: none pending) */
  int in_graph;             /* finish() was captured into a CUDA graph: its sums run when the graph does */
};

static int cuda_fail(const char *op, int device, cudaError_t e) {
  return bl_set_error(BL_EDEVICE, "%s: cuda:%d: %s", op, device, cudaGetErrorString(e));
}

void bl_nccl_buckets_free(bl_nccl_buckets *b) {
  if (!b) return;
  for (int i = 0; b->ready && i < b->n; i++)
    if (b->ready[i]) cudaEventDestroy(b->ready[i]);
  if (b->done) cudaEventDestroy(b->done);
  if (b->queued) cudaEventDestroy(b->queued);
  if (b->comm_stream) cudaStreamDestroy(b->comm_stream);
  free(b->ready);
  free(b);
}

int bl_nccl_buckets_new(const bl_tensor *buf, int nbuckets, MPI_Comm world, int rank, int size, bl_nccl_buckets **res) {
  const char *op = "reducer";
  *res = NULL;
  ncclDataType_t ty = ncclFloat32;
  int local = nccl_type(buf, &ty, op);
  BL_CHECK(ensure_comm(op, local, buf->device, world, rank, size));
  bl_nccl_buckets *b = calloc(1, sizeof *b);
  if (!b || !(b->ready = calloc((size_t)nbuckets, sizeof *b->ready))) {
    free(b);
    return bl_set_error(BL_ENOMEM, "%s: out of host memory", op);
  }
  b->device = buf->device;
  b->n = nbuckets;
  cudaError_t e = cudaSetDevice(b->device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&b->comm_stream, cudaStreamNonBlocking);
  for (int i = 0; e == cudaSuccess && i < nbuckets; i++)
    e = cudaEventCreateWithFlags(&b->ready[i], cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&b->done, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&b->queued, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    bl_nccl_buckets_free(b);
    return cuda_fail(op, buf->device, e);
  }
  *res = b;
  return 0;
}

/* The compute stream of a reducer whose communicator is still there. */
static int live_compute(const bl_nccl_buckets *b, cudaStream_t *s) {
  if (!comm) return bl_set_error(BL_EIO, "reducer: the NCCL communicator was aborted by an earlier error");
  *s = (cudaStream_t)bl_cuda_stream(b->device);
  return *s ? 0 : BL_EDEVICE;
}

int bl_nccl_buckets_launch(bl_nccl_buckets *b, bl_tensor *part, int bucket) {
  const char *op = "reducer";
  cudaStream_t compute = NULL;
  BL_CHECK(live_compute(b, &compute));
  ncclDataType_t ty = ncclFloat32;
  BL_CHECK(nccl_type(part, &ty, op));
  cudaError_t e = cudaEventRecord(b->ready[bucket], compute);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(b->comm_stream, b->ready[bucket], 0);
  if (e != cudaSuccess) return cuda_fail(op, b->device, e);
  ncclResult_t r = ncclAllReduce(part->data, part->data, (size_t)part->numel, ty, ncclSum, comm, b->comm_stream);
  if (r != ncclSuccess && r != ncclInProgress) return fail(op, "bucket all-reduce", r);
  return 0;
}

int bl_nccl_buckets_finish(bl_nccl_buckets *b) {
  const char *op = "reducer";
  cudaStream_t compute = NULL;
  BL_CHECK(live_compute(b, &compute));
  cudaError_t e = cudaEventRecord(b->done, b->comm_stream);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(compute, b->done, 0); /* the optimizer runs after the sums */
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (e == cudaSuccess) e = cudaStreamIsCapturing(compute, &cs);
  if (e != cudaSuccess) return cuda_fail(op, b->device, e);
  /* a failure already reported is raised now; one still to come, at the watched wait */
  ncclResult_t st = ncclSuccess;
  if (ncclCommGetAsyncError(comm, &st) != ncclSuccess || (st != ncclSuccess && st != ncclInProgress))
    return fail(op, "bucket all-reduce", st);
  /* captured (--cuda-graph): the collectives above join the graph (the comm stream forked from the compute
   * stream's capture and joined back); `done` is then a dependency inside it, which poll cannot query */
  b->in_graph = cs == cudaStreamCaptureStatusActive;
  b->finished_at = b->in_graph ? 0 : now_s();
  return 0;
}

/* the graph holding the sums was launched again (a replay: finish did not run): poll stands a marker after it */
void bl_nccl_buckets_replayed(bl_nccl_buckets *b) { b->in_graph = 1; }

int bl_nccl_buckets_poll(bl_nccl_buckets *b) {
  const char *op = "reducer";
  if (b->in_graph) { /* the graph holding the sums was launched since: a marker after it stands for them */
    cudaStream_t compute = NULL;
    BL_CHECK(live_compute(b, &compute));
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(compute, &cs);
    if (e == cudaSuccess && cs == cudaStreamCaptureStatusActive) return 0; /* not launched yet */
    if (e == cudaSuccess) e = cudaEventRecord(b->done, compute);
    if (e != cudaSuccess) return cuda_fail(op, b->device, e);
    b->in_graph = 0;
    b->finished_at = now_s();
  }
  if (!b->finished_at) return 0;
  if (!comm) return bl_set_error(BL_EIO, "%s: the NCCL communicator was aborted by an earlier error", op);
  cudaError_t ce = cudaEventQuery(b->done);
  if (ce != cudaSuccess && ce != cudaErrorNotReady) {
    bl_nccl_shutdown(1);
    return bl_set_error(BL_EDEVICE, "%s: cuda:%d: %s", op, b->device, cudaGetErrorString(ce));
  }
  /* a collective that failed may still complete its event: the communicator's error first */
  ncclResult_t st = ncclSuccess;
  if (ncclCommGetAsyncError(comm, &st) != ncclSuccess || (st != ncclSuccess && st != ncclInProgress))
    return fail(op, "bucket all-reduce", st);
  if (ce == cudaSuccess) {
    b->finished_at = 0;
    return 0;
  }
  if (now_s() > b->finished_at + timeout_s()) {
    bl_nccl_shutdown(1);
    return bl_set_error(BL_EIO,
                        "%s: NCCL bucket all-reduce did not complete within %.0f s (a rank died or is stuck; "
                        "BL_NCCL_TIMEOUT sets the limit); communicator aborted",
                        op, timeout_s());
  }
  return 0;
}

/* The compute stream waits for the sums (finish), so its progress up to a marker recorded now covers them: a
 * stuck collective holds the marker back and the deadline of wait_stream ends it. */
int bl_nccl_buckets_wait(bl_nccl_buckets *b) {
  const char *op = "reducer";
  cudaStream_t compute = NULL;
  BL_CHECK(live_compute(b, &compute));
  cudaError_t e = cudaEventRecord(b->queued, compute);
  if (e != cudaSuccess) return cuda_fail(op, b->device, e);
  return wait_stream(op, "bucket all-reduce", compute, b->queued);
}
