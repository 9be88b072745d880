/* NCCL communicator for CUDA tensors (see dist_internal.h for the contract).
 *
 * One communicator per process, on the device of the first tensor it sees,
 * created non-blocking (ncclConfig_t.blocking = 0) so that neither its
 * creation nor a collective can hang the process: every wait below polls
 * ncclCommGetAsyncError and the stream with a deadline, and on an error or a
 * timeout the communicator is aborted (ncclCommAbort releases the GPU
 * resources and makes the other ranks' collectives fail too) and the call
 * returns an error. Compiled only when CMake found NCCL (BL_HAVE_NCCL). */
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
  struct timespec ts = {0, us * 1000};
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
  if (abort) ncclCommAbort(comm);
  else ncclCommDestroy(comm);
  comm = NULL;
  comm_device = -1;
}

static int fail(const char *op, const char *what, ncclResult_t r) {
  char last[256] = "";
  const char *l = comm ? ncclGetLastError(comm) : NULL;
  if (l && *l) snprintf(last, sizeof last, " - %s", l);   /* copied: the abort frees it */
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
      return bl_set_error(BL_EIO, "%s: NCCL %s did not finish within %.0f s (a rank died or is stuck; "
                          "BL_NCCL_TIMEOUT sets the limit); communicator aborted", op, what, timeout_s());
    }
    sleep_us(50);
  }
}

static int ensure_comm(const char *op, int device, MPI_Comm world, int rank, int size) {
  if (comm) {
    if (device != comm_device)
      return bl_set_error(BL_EINVAL, "%s: tensor is on cuda:%d but this rank's NCCL communicator is on cuda:%d", op,
                          device, comm_device);
    return 0;
  }
  BL_CHECK(bl_dev_check(device, op));
  cudaError_t ce = cudaSetDevice(device);
  if (ce != cudaSuccess) return bl_set_error(BL_EDEVICE, "%s: cuda:%d: %s", op, device, cudaGetErrorString(ce));
  ncclUniqueId id;
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) memset(&id, 0, sizeof id);  /* still join the broadcast so no rank waits forever */
    int err = MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, world);
    if (r != ncclSuccess) return bl_set_error(BL_EIO, "%s: ncclGetUniqueId failed: %s", op, ncclGetErrorString(r));
    if (err != MPI_SUCCESS) return bl_set_error(BL_EIO, "%s: MPI broadcast of the NCCL id failed", op);
  } else {
    if (MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, world) != MPI_SUCCESS)
      return bl_set_error(BL_EIO, "%s: MPI broadcast of the NCCL id failed", op);
    static const ncclUniqueId zero;
    if (!memcmp(&id, &zero, sizeof id)) return bl_set_error(BL_EIO, "%s: rank 0 could not create an NCCL id", op);
  }
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    comm = NULL;
    return bl_set_error(BL_EIO, "%s: ncclCommInitRank failed: %s", op, ncclGetErrorString(r));
  }
  comm_device = device;
  return wait_comm(op, "communicator init", now_s() + timeout_s());
}

static int nccl_type(const bl_tensor *t, ncclDataType_t *ty, const char *op) {
  switch (t->dtype) {
    case BL_F32: *ty = ncclFloat32; return 0;
    case BL_F64: *ty = ncclFloat64; return 0;
    case BL_F16: *ty = ncclFloat16; return 0;
    case BL_BF16: *ty = ncclBfloat16; return 0;
    case BL_I32: *ty = ncclInt32; return 0;
    case BL_I64: *ty = ncclInt64; return 0;
    case BL_U8: case BL_BOOL: *ty = ncclUint8; return 0;
  }
  return bl_set_error(BL_EINVAL, "%s: dtype %s is not supported by NCCL", op, bl_dtype_name(t->dtype));
}

/* Waits for the queued collective: NCCL errors and the stream, under one deadline. */
static int wait_stream(const char *op, const char *what, cudaStream_t s) {
  double deadline = now_s() + timeout_s();
  BL_CHECK(wait_comm(op, what, deadline));
  for (;;) {
    cudaError_t ce = cudaStreamQuery(s);
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
      return bl_set_error(BL_EIO, "%s: NCCL %s did not complete within %.0f s (a rank died or is stuck; "
                          "BL_NCCL_TIMEOUT sets the limit); communicator aborted", op, what, timeout_s());
    }
    sleep_us(20);
  }
}

static int prepare(const char *op, bl_tensor *t, MPI_Comm world, int rank, int size, ncclDataType_t *ty,
                   cudaStream_t *s) {
  if (!bl_tensor_is_contiguous(t)) return bl_set_error(BL_EINVAL, "%s: tensor must be contiguous", op);
  BL_CHECK(nccl_type(t, ty, op));
  BL_CHECK(ensure_comm(op, t->device, world, rank, size));
  *s = (cudaStream_t)bl_cuda_stream(t->device);
  if (!*s) return BL_EDEVICE;
  return 0;
}

/* The end of a collective: r is what queueing it returned. */
static int finish(const char *op, const char *what, ncclResult_t r, cudaStream_t s) {
  if (r != ncclSuccess && r != ncclInProgress) return fail(op, what, r);
  return wait_stream(op, what, s);
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
