// Emulated NCCL (see nccl.h): collectives on emulated device buffers across
// the processes of an MPI job, so `mpirun -np 2` GPU code paths run without a
// GPU.
//
// - ncclGetUniqueId makes a random id; ncclCommInitRank(Config) is collective
//   over MPI_COMM_WORLD (every process of the job calls it once per
//   communicator, as src/dist/nccl.c does): the processes holding the same id
//   form the communicator, and it is an error (ncclInvalidUsage, on every
//   rank) unless they all hold exactly the same id and nranks and their ranks
//   are 0..nranks-1 once each. nranks = 1 needs no MPI. Init completes at
//   once, also with config.blocking = 0.
// - All-reduce (sum, prod, max, min, avg; f16, bf16, f32, f64, i8, u8, i32,
//   u32, i64, u64), broadcast and all-gather are queued on the given stream
//   (emu_stream_enqueue) and run in stream order. Each rank's buffer is
//   exchanged through host copies (MPI never touches device memory), and an
//   all-reduce combines the ranks' values in rank order, rounding to the type
//   at every step as a ring does: every rank gets the same bits.
// - Buffers must lie inside one allocation of the communicator's device
//   (ncclInvalidArgument otherwise). ncclGroupStart/End defer the queueing of
//   the calls between them to the outermost ncclGroupEnd, in order.
// - A peer that does not join a collective within BL_EMU_NCCL_TIMEOUT seconds
//   (default 600) leaves the data as it was and sets the communicator's
//   asynchronous error (ncclRemoteError), as a failed NCCL collective would:
//   ncclCommGetAsyncError reports it, ncclCommAbort frees the communicator.
//   Later collectives on a failed or aborted communicator do nothing.
//
// - Collectives queued on a stream that captures a CUDA graph are recorded
//   into it (as NCCL >= 2.9 allows) and run, in order, at every launch.
//
// Not emulated: speed, NVLink/network topology, send/recv, split, user
// reduction ops, device-side (GPU-initiated) API.
// System and C++ headers first: the emulated device's keyword macros (__noinline__, ...) must not reach them.
// MPI's C API only: the C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX  1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <memory>
#include <string>
#include <vector>
#include <nccl.h>
#include "emu_internal.h"
#include "emu_numeric.h"

namespace {

const char kMagic[16] = "bl-emu-nccl-id";

struct comm_state {
  int rank = 0, nranks = 1, dev = 0;
  MPI_Comm mpi = MPI_COMM_NULL; // NCCL rank == rank in this communicator
  ncclResult_t async = ncclSuccess;
  bool aborted = false;
  std::string last;
};

} // namespace

struct emu_nccl_comm {
  std::shared_ptr<comm_state> st;
};

namespace {

thread_local std::string g_last; // errors without a communicator
thread_local int g_group_depth = 0;
struct deferred {
  cudaStream_t stream;
  const char *what;
  std::function<void()> fn;
};
thread_local std::vector<deferred> g_group;

ncclResult_t fail(comm_state *st, ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
ncclResult_t fail(comm_state *st, ncclResult_t r, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "emulated NCCL: %s: %s\n", ncclGetErrorString(r), msg);
  (st ? st->last : g_last) = msg;
  return r;
}

double now_s() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double timeout_s() {
  const char *e = getenv("BL_EMU_NCCL_TIMEOUT");
  double t = e ? atof(e) : 0;
  return t > 0 ? t : 600.0;
}

// Completes an MPI request of a collective, or marks the communicator failed
// after the timeout. The request then stays pending (MPI cannot cancel a
// collective), so its host buffer `buf` is leaked on purpose: a late peer may
// still complete it.
bool wait_peer(comm_state *st, MPI_Request *req, std::vector<char> &buf, const char *what) {
  double deadline = now_s() + timeout_s();
  for (;;) {
    int done = 0;
    if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      st->async = ncclSystemError;
      fail(st, ncclSystemError, "%s: MPI failed on rank %d", what, st->rank);
      return false;
    }
    if (done) return true;
    if (now_s() > deadline) {
      new std::vector<char>(std::move(buf));
      st->async = ncclRemoteError;
      fail(st, ncclRemoteError, "%s: a peer did not join within %.0f s (rank %d of %d; BL_EMU_NCCL_TIMEOUT)", what,
           timeout_s(), st->rank, st->nranks);
      return false;
    }
    struct timespec ts = { 0, 50 * 1000 };
    nanosleep(&ts, NULL);
  }
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
  }
  return 0;
}

template <typename T>
T combine(T a, T b, ncclRedOp_t op) {
  switch (op) {
    case ncclSum:
    case ncclAvg: return (T)(a + b);
    case ncclProd: return (T)(a * b);
    case ncclMax: return a > b ? a : b;
    case ncclMin: return a < b ? a : b;
  }
  return a;
}

// out[i] = ranks' values combined in rank order (all: n blocks of count elements).
template <typename T>
void reduce_plain(const char *all, void *out, size_t count, int n, ncclRedOp_t op) {
  const T *v = (const T *)all;
  T *o = (T *)out;
  for (size_t i = 0; i < count; i++) {
    T acc = v[i];
    for (int r = 1; r < n; r++) acc = combine(acc, v[(size_t)r * count + i], op);
    if (op == ncclAvg) acc = (T)(acc / (T)n);
    o[i] = acc;
  }
}

// f16/bf16: each step computed in f32 and rounded back to the storage type.
void reduce_half(const char *all, void *out, size_t count, int n, ncclRedOp_t op, cudaDataType_t t) {
  for (size_t i = 0; i < count; i++) {
    float acc = emu_load_f(all, t, (int64_t)i);
    for (int r = 1; r < n; r++) {
      acc = emu_round_to(t, combine(acc, emu_load_f(all, t, (int64_t)((size_t)r * count + i)), op));
    }
    if (op == ncclAvg) acc /= (float)n;
    emu_store_f(out, t, (int64_t)i, acc);
  }
}

void reduce(const char *all, void *out, size_t count, int n, ncclDataType_t t, ncclRedOp_t op) {
  switch (t) {
    case ncclInt8: reduce_plain<int8_t>(all, out, count, n, op); break;
    case ncclUint8: reduce_plain<uint8_t>(all, out, count, n, op); break;
    case ncclInt32: reduce_plain<int32_t>(all, out, count, n, op); break;
    case ncclUint32: reduce_plain<uint32_t>(all, out, count, n, op); break;
    case ncclInt64: reduce_plain<int64_t>(all, out, count, n, op); break;
    case ncclUint64: reduce_plain<uint64_t>(all, out, count, n, op); break;
    case ncclFloat32: reduce_plain<float>(all, out, count, n, op); break;
    case ncclFloat64: reduce_plain<double>(all, out, count, n, op); break;
    case ncclFloat16: reduce_half(all, out, count, n, op, CUDA_R_16F); break;
    case ncclBfloat16: reduce_half(all, out, count, n, op, CUDA_R_16BF); break;
  }
}

// Every rank's `bytes` from `mine` into all (rank order).
bool gather(comm_state *st, const void *mine, size_t bytes, std::vector<char> &all, const char *what) {
  all.resize(bytes * (size_t)st->nranks);
  memcpy(all.data() + bytes * (size_t)st->rank, mine, bytes);
  if (st->nranks == 1) return true;
  MPI_Request req;
  if (MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all.data(), (int)bytes, MPI_BYTE, st->mpi, &req) !=
      MPI_SUCCESS) {
    st->async = ncclSystemError;
    fail(st, ncclSystemError, "%s: MPI all-gather failed", what);
    return false;
  }
  return wait_peer(st, &req, all, what);
}

// Checks shared by the collectives; `bytes` of each buffer (0: not used).
ncclResult_t check_call(ncclComm_t comm, const char *what, const void *send, size_t send_bytes, const void *recv,
                        size_t recv_bytes) {
  if (!comm) return fail(nullptr, ncclInvalidArgument, "%s: communicator is NULL", what);
  comm_state *st = comm->st.get();
  if (st->aborted) return fail(st, ncclInvalidUsage, "%s: communicator was aborted", what);
  if (send_bytes + recv_bytes > (size_t)INT32_MAX)
    return fail(st, ncclInvalidArgument, "%s: %zu bytes exceed the emulation's 2 GiB limit per call", what,
                send_bytes + recv_bytes);
  if (send_bytes && !emu_is_device_range(st->dev, send, send_bytes))
    return fail(st, ncclInvalidArgument, "%s: sendbuff %p (%zu bytes) is not inside one allocation of cuda:%d", what,
                send, send_bytes, st->dev);
  if (recv_bytes && !emu_is_device_range(st->dev, recv, recv_bytes))
    return fail(st, ncclInvalidArgument, "%s: recvbuff %p (%zu bytes) is not inside one allocation of cuda:%d", what,
                recv, recv_bytes, st->dev);
  return ncclSuccess;
}

ncclResult_t submit(cudaStream_t stream, const char *what, std::function<void()> fn) {
  if (g_group_depth > 0)
    g_group.push_back({ stream, what, std::move(fn) });
  else
    emu_stream_enqueue(stream, what, std::move(fn));
  return ncclSuccess;
}

bool usable(const comm_state *st) { return !st->aborted && st->async == ncclSuccess; }

uint64_t id_hash(const ncclUniqueId &id) { // FNV-1a
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) h = (h ^ (uint8_t)id.internal[i]) * 1099511628211ull;
  return h;
}

struct member {
  ncclUniqueId id;
  int32_t nranks, rank;
};

ncclResult_t init(ncclComm_t *out, int nranks, const ncclUniqueId &id, int rank) {
  if (!out) return fail(nullptr, ncclInvalidArgument, "ncclCommInitRank: comm pointer is NULL");
  *out = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(nullptr, ncclInvalidArgument, "ncclCommInitRank: rank %d of %d", rank, nranks);
  if (memcmp(id.internal, kMagic, sizeof kMagic))
    return fail(nullptr, ncclInvalidArgument, "ncclCommInitRank: the unique id was not made by ncclGetUniqueId");
  auto st = std::make_shared<comm_state>();
  st->rank = rank;
  st->nranks = nranks;
  st->dev = emu_current_device();
  if (nranks > 1) {
    int on = 0, off = 0;
    MPI_Initialized(&on);
    MPI_Finalized(&off);
    if (!on || off)
      return fail(nullptr, ncclSystemError, "ncclCommInitRank: %d ranks need the processes of an MPI job (mpirun)",
                  nranks);
    // The processes holding this id form the communicator, ordered by NCCL rank.
    MPI_Comm sub;
    if (MPI_Comm_split(MPI_COMM_WORLD, (int)(id_hash(id) & 0x7fffffff), rank, &sub) != MPI_SUCCESS)
      return fail(nullptr, ncclSystemError, "ncclCommInitRank: MPI_Comm_split failed");
    int size = 0;
    MPI_Comm_size(sub, &size);
    member me;
    me.id = id;
    me.nranks = nranks;
    me.rank = rank;
    std::vector<member> all((size_t)size);
    MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, all.data(), (int)sizeof me, MPI_BYTE, sub);
    bool same = size == nranks;
    for (int i = 0; same && i < size; i++)
      same = !memcmp(&all[(size_t)i].id, &id, sizeof id) && all[(size_t)i].nranks == nranks && all[(size_t)i].rank == i;
    if (!same) {
      MPI_Comm_free(&sub);
      return fail(nullptr, ncclInvalidUsage,
                  "ncclCommInitRank: the ranks disagree on the unique id, nranks or rank "
                  "numbers (%d processes hold this rank's id, nranks %d, rank %d)",
                  size, nranks, rank);
    }
    st->mpi = sub;
  }
  *out = new emu_nccl_comm{ st };
  return ncclSuccess;
}

} // namespace

extern "C" {

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

const char *ncclGetLastError(ncclComm_t comm) { return comm ? comm->st->last.c_str() : g_last.c_str(); }

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (!id) return fail(nullptr, ncclInvalidArgument, "ncclGetUniqueId: NULL id");
  memset(id, 0, sizeof *id);
  memcpy(id->internal, kMagic, sizeof kMagic);
  FILE *f = fopen("/dev/urandom", "rb");
  size_t got = f ? fread(id->internal + 16, 1, 32, f) : 0;
  if (f) fclose(f);
  if (got != 32) return fail(nullptr, ncclSystemError, "ncclGetUniqueId: cannot read /dev/urandom");
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  return init(comm, nranks, id, rank);
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *) {
  return init(comm, nranks, id, rank); // completes at once, blocking or not
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *e) {
  if (!comm || !e) return fail(nullptr, ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
  *e = comm->st->async;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!comm) return fail(nullptr, ncclInvalidArgument, "ncclCommFinalize: NULL communicator");
  return comm->st->async;
}

// Queued collectives of a destroyed or aborted communicator do nothing when their stream reaches them.
static ncclResult_t release(ncclComm_t comm, const char *what) {
  if (!comm) return fail(nullptr, ncclInvalidArgument, "%s: NULL communicator", what);
  comm_state *st = comm->st.get();
  st->aborted = true;
  int off = 0;
  MPI_Finalized(&off);
  if (st->mpi != MPI_COMM_NULL && !off) MPI_Comm_free(&st->mpi);
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) { return release(comm, "ncclCommDestroy"); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return release(comm, "ncclCommAbort"); }

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  if (!comm || !count) return fail(nullptr, ncclInvalidArgument, "ncclCommCount: NULL argument");
  *count = comm->st->nranks;
  return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
  if (!comm || !device) return fail(nullptr, ncclInvalidArgument, "ncclCommCuDevice: NULL argument");
  *device = comm->st->dev;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  if (!comm || !rank) return fail(nullptr, ncclInvalidArgument, "ncclCommUserRank: NULL argument");
  *rank = comm->st->rank;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  size_t es = type_size(dt);
  if (!es || (unsigned)op > ncclAvg)
    return fail(comm ? comm->st.get() : nullptr, ncclInvalidArgument, "ncclAllReduce: type %d / op %d", dt, op);
  size_t bytes = count * es;
  ncclResult_t r = check_call(comm, "ncclAllReduce", send, bytes, recv, bytes);
  if (r || count == 0) return r;
  std::shared_ptr<comm_state> st = comm->st;
  return submit(stream, "ncclAllReduce", [st, send, recv, count, bytes, dt, op] {
    std::vector<char> all;
    if (usable(st.get()) && gather(st.get(), send, bytes, all, "ncclAllReduce"))
      reduce(all.data(), recv, count, st->nranks, dt, op);
  });
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t dt, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  size_t es = type_size(dt);
  if (!es) return fail(comm ? comm->st.get() : nullptr, ncclInvalidArgument, "ncclBroadcast: type %d", dt);
  if (comm && (root < 0 || root >= comm->st->nranks))
    return fail(comm->st.get(), ncclInvalidArgument, "ncclBroadcast: root %d of %d ranks", root, comm->st->nranks);
  size_t bytes = count * es;
  bool is_root = comm && comm->st->rank == root;
  ncclResult_t r = check_call(comm, "ncclBroadcast", send, is_root ? bytes : 0, recv, bytes);
  if (r || count == 0) return r;
  std::shared_ptr<comm_state> st = comm->st;
  return submit(stream, "ncclBroadcast", [st, send, recv, bytes, root, is_root] {
    if (!usable(st.get())) return;
    std::vector<char> buf(bytes);
    if (is_root) memcpy(buf.data(), send, bytes);
    if (st->nranks > 1) {
      MPI_Request req;
      if (MPI_Ibcast(buf.data(), (int)bytes, MPI_BYTE, root, st->mpi, &req) != MPI_SUCCESS) {
        st->async = ncclSystemError;
        fail(st.get(), ncclSystemError, "ncclBroadcast: MPI broadcast failed");
        return;
      }
      if (!wait_peer(st.get(), &req, buf, "ncclBroadcast")) return;
    }
    memcpy(recv, buf.data(), bytes);
  });
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t dt, ncclComm_t comm,
                           cudaStream_t stream) {
  size_t es = type_size(dt);
  if (!es) return fail(comm ? comm->st.get() : nullptr, ncclInvalidArgument, "ncclAllGather: type %d", dt);
  size_t bytes = sendcount * es;
  ncclResult_t r = check_call(comm, "ncclAllGather", send, bytes, recv, comm ? bytes * (size_t)comm->st->nranks : 0);
  if (r || sendcount == 0) return r;
  std::shared_ptr<comm_state> st = comm->st;
  return submit(stream, "ncclAllGather", [st, send, recv, bytes] {
    std::vector<char> all;
    if (usable(st.get()) && gather(st.get(), send, bytes, all, "ncclAllGather")) memcpy(recv, all.data(), all.size());
  });
}

ncclResult_t ncclGroupStart(void) {
  g_group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (g_group_depth == 0) return fail(nullptr, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g_group_depth > 0) return ncclSuccess;
  std::vector<deferred> calls;
  calls.swap(g_group);
  for (deferred &d : calls) emu_stream_enqueue(d.stream, d.what, std::move(d.fn));
  return ncclSuccess;
}

} // extern "C"
