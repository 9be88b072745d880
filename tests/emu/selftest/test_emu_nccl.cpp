// Self-test of the emulated NCCL (tests/emu/emu_nccl.cpp) on the emulated
// device, under `mpirun -np 2` (emulated builds only): ranks disagreeing on
// the unique id, all-reduce of every float type and op (f16/bf16 rounding
// checked against a reference computed here), broadcast, all-gather, group
// calls, buffers outside the device, and a peer that never joins (timeout ->
// async error, abort).
#define OMPI_SKIP_MPICXX  1
#define MPICH_SKIP_MPICXX 1
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <cuda_runtime.h>
#include <nccl.h>
#include "emu_numeric.h"

static int g_fail = 0, g_checks = 0, g_rank = 0;
#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    g_checks++;                                                            \
    if (!(cond)) {                                                         \
      fprintf(stderr, "FAIL rank %d %s:%d: ", g_rank, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                        \
      fputc('\n', stderr);                                                 \
      g_fail++;                                                            \
    }                                                                      \
  } while (0)

static void *dev_copy(const void *h, size_t bytes) {
  void *d = nullptr;
  cudaMalloc(&d, bytes);
  cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
  return d;
}
template <typename T>
static std::vector<T> host_copy(const void *d, size_t n) {
  std::vector<T> h(n);
  cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}

// f16/bf16 sum of two ranks: the exact sum rounded once to the type (two values: one rounding).
static void test_allreduce(ncclComm_t c, cudaStream_t s, int rank) {
  const int n = 37;
  std::vector<float> mine(n), other(n);
  for (int i = 0; i < n; i++) {
    mine[i] = (float)((rank + 1) * 0.3 + i * 0.0137 - 0.2);
    other[i] = (float)((2 - rank) * 0.3 + i * 0.0137 - 0.2);
  }
  for (cudaDataType_t t : { CUDA_R_16F, CUDA_R_16BF }) {
    std::vector<uint16_t> h(n), o(n);
    for (int i = 0; i < n; i++) {
      emu_store_f(h.data(), t, i, mine[i]);
      emu_store_f(o.data(), t, i, other[i]);
    }
    void *d = dev_copy(h.data(), n * 2);
    CHECK(ncclAllReduce(d, d, n, t == CUDA_R_16F ? ncclFloat16 : ncclBfloat16, ncclSum, c, s) == ncclSuccess, "half");
    cudaStreamSynchronize(s);
    std::vector<uint16_t> got = host_copy<uint16_t>(d, n);
    int bad = 0;
    for (int i = 0; i < n; i++) {
      float a = emu_load_f(h.data(), t, i), b = emu_load_f(o.data(), t, i);
      float sum = rank == 0 ? a + b : b + a; // rank 0's value first, as the emulation combines
      uint16_t want = t == CUDA_R_16F ? emu_f32_to_f16(sum) : emu_f32_to_bf16(sum);
      bad += got[i] != want;
    }
    CHECK(bad == 0, "%s all-reduce: %d wrong", t == CUDA_R_16F ? "f16" : "bf16", bad);
    cudaFree(d);
  }
  double hv[3] = { 1.5 + rank, -2.0 * rank, 10.0 };
  double *dd = (double *)dev_copy(hv, sizeof hv);
  struct {
    ncclRedOp_t op;
    double want[3];
  } ops[] = { { ncclSum, { 4, -2, 20 } },
              { ncclMax, { 2.5, 0, 10 } },
              { ncclMin, { 1.5, -2, 10 } },
              { ncclProd, { 3.75, -0.0, 100 } },
              { ncclAvg, { 2, -1, 10 } } };
  for (auto &o : ops) {
    cudaMemcpy(dd, hv, sizeof hv, cudaMemcpyHostToDevice);
    CHECK(ncclAllReduce(dd, dd, 3, ncclFloat64, o.op, c, s) == ncclSuccess, "f64 op %d", o.op);
    cudaStreamSynchronize(s);
    std::vector<double> got = host_copy<double>(dd, 3);
    CHECK(got[0] == o.want[0] && got[1] == o.want[1] && got[2] == o.want[2], "op %d: %g %g %g", o.op, got[0], got[1],
          got[2]);
  }
  cudaFree(dd);
  int64_t hi[2] = { (int64_t)1 << 40, rank };
  int64_t *di = (int64_t *)dev_copy(hi, sizeof hi);
  void *out = nullptr;
  cudaMalloc(&out, sizeof hi);
  CHECK(ncclAllReduce(di, out, 2, ncclInt64, ncclSum, c, s) == ncclSuccess, "i64"); // out of place
  cudaStreamSynchronize(s);
  std::vector<int64_t> gi = host_copy<int64_t>(out, 2);
  CHECK(gi[0] == (int64_t)1 << 41 && gi[1] == 1, "i64 sum %lld %lld", (long long)gi[0], (long long)gi[1]);
  cudaFree(di);
  cudaFree(out);
}

static void test_group_gather_bcast(ncclComm_t c, cudaStream_t s, int rank) {
  float a[4] = { 1.0f + rank, 2, 3, 4 }, b[3] = { rank ? 9.0f : -1.0f, 8, 7 };
  float *da = (float *)dev_copy(a, sizeof a), *db = (float *)dev_copy(b, sizeof b), *dg = nullptr;
  cudaMalloc((void **)&dg, sizeof a * 2);
  CHECK(ncclGroupStart() == ncclSuccess, "group start");
  CHECK(ncclAllGather(da, dg, 4, ncclFloat32, c, s) == ncclSuccess, "all-gather");
  CHECK(ncclBroadcast(db, db, 3, ncclFloat32, 1, c, s) == ncclSuccess, "broadcast");
  CHECK(ncclGroupEnd() == ncclSuccess, "group end");
  cudaStreamSynchronize(s);
  std::vector<float> g = host_copy<float>(dg, 8), bb = host_copy<float>(db, 3);
  CHECK(g[0] == 1 && g[4] == 2 && g[3] == 4 && g[7] == 4, "all-gather %g %g %g %g", g[0], g[4], g[3], g[7]);
  CHECK(bb[0] == 9 && bb[2] == 7, "broadcast %g %g", bb[0], bb[2]);
  float host[4] = { 0 };
  CHECK(ncclAllReduce(host, host, 4, ncclFloat32, ncclSum, c, s) == ncclInvalidArgument, "host buffer accepted");
  CHECK(ncclAllReduce(da, da, 1000, ncclFloat32, ncclSum, c, s) == ncclInvalidArgument, "overrun accepted");
  CHECK(ncclGroupEnd() == ncclInvalidUsage, "unmatched group end accepted");
  cudaFree(da);
  cudaFree(db);
  cudaFree(dg);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) {
    if (g_rank == 0) printf("skipped: run under mpirun -np 2\n");
    MPI_Finalize();
    return 77;
  }
  fprintf(stderr, "(the emulated NCCL errors printed below are expected)\n");
  cudaSetDevice(0);
  cudaStream_t s;
  cudaStreamCreate(&s);
  ncclComm_t c = nullptr;
  { // each rank with its own id: not one communicator
    ncclUniqueId own;
    ncclGetUniqueId(&own);
    CHECK(ncclCommInitRank(&c, 2, own, g_rank) == ncclInvalidUsage && !c, "ranks with different ids accepted");
  }
  ncclUniqueId id;
  if (g_rank == 0) ncclGetUniqueId(&id);
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  { // both claiming rank 0
    CHECK(ncclCommInitRank(&c, 2, id, 0) == ncclInvalidUsage, "two ranks 0 accepted");
  }
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&c, 2, id, g_rank, &cfg);
  CHECK(r == ncclSuccess && c, "init: %s", ncclGetErrorString(r));
  int count = 0, urank = -1;
  ncclCommCount(c, &count);
  ncclCommUserRank(c, &urank);
  CHECK(count == 2 && urank == g_rank, "count %d rank %d", count, urank);
  test_allreduce(c, s, g_rank);
  test_group_gather_bcast(c, s, g_rank);
  { // rank 0 never joins: rank 1's collective times out into an async error
    setenv("BL_EMU_NCCL_TIMEOUT", "1", 1);
    float h[2] = { 1, 2 };
    float *d = (float *)dev_copy(h, sizeof h);
    if (g_rank == 1) {
      CHECK(ncclAllReduce(d, d, 2, ncclFloat32, ncclSum, c, s) == ncclSuccess, "queueing failed");
      cudaStreamSynchronize(s);
      ncclResult_t e = ncclSuccess;
      ncclCommGetAsyncError(c, &e);
      CHECK(e == ncclRemoteError, "async error %d after a missing peer", e);
      CHECK(strstr(ncclGetLastError(c), "did not join") != nullptr, "message: %s", ncclGetLastError(c));
      std::vector<float> got = host_copy<float>(d, 2);
      CHECK(got[0] == 1 && got[1] == 2, "data changed by a failed all-reduce");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0) { // the late peer completes the abandoned exchange on its side
      CHECK(ncclAllReduce(d, d, 2, ncclFloat32, ncclSum, c, s) == ncclSuccess, "late all-reduce");
      cudaStreamSynchronize(s);
    }
    cudaFree(d);
  }
  CHECK((g_rank == 1 ? ncclCommAbort(c) : ncclCommDestroy(c)) == ncclSuccess, "abort/destroy");
  cudaStreamDestroy(s);
  int fails = 0;
  MPI_Allreduce(&g_fail, &fails, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0) printf("%s: %d checks per rank, %d failed\n", fails ? "FAIL" : "ok", g_checks, fails);
  MPI_Finalize();
  return fails ? 1 : 0;
}
