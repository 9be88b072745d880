// Emulated twin of kernels/ptx.cuh (included by it outside nvcc): the same
// typed wrappers, implemented from the PTX ISA's fragment layouts described
// there. mma and ldmatrix are warp collectives (emu_warp_gather: all 32 lanes
// at the same call site); a cp.async destination is filled with NaN bytes at
// issue and receives the source bytes (read at issue) only at the
// cp_async_wait that completes its group, so reading it early shows up.
// Misaligned ldmatrix rows or cp.async addresses are device faults.
#pragma once
#include <stdint.h>
#include <string.h>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>
#include "emu_internal.h"
#include "emu_numeric.h"

namespace ptx {
namespace emu_twin {

// A stable "file:line" string per call site: the warp collective's site identity and its error messages.
inline const char *site(const char *file, int line) {
  static std::mutex mu;
  static std::map<std::pair<const char *, int>, std::string> sites;
  std::lock_guard<std::mutex> g(mu);
  std::string &s = sites[{ file, line }];
  if (s.empty()) s = std::string(file) + ":" + std::to_string(line);
  return s.c_str();
}

inline float half_at(uint32_t reg, int hi, cudaDataType_t t) {
  uint16_t h = (uint16_t)(reg >> (hi ? 16 : 0));
  return emu_load_f(&h, t, 0);
}

// D = A B + C over the warp's fragments, f32 accumulation (an fma chain over k, from C).
inline void mma(cudaDataType_t t, frag_c &d, const frag_a &a, const frag_b &b, const frag_c &c, const char *where) {
  struct lane_frags {
    frag_a a;
    frag_b b;
    frag_c c;
  } mine{ a, b, c }, all[32];
  emu_warp_gather(&mine, all, sizeof mine, where);
  float A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; l++) {
    int g = l >> 2, q = l & 3;
    for (int i = 0; i < 8; i++)
      A[g + 8 * ((i >> 1) & 1)][2 * q + (i & 1) + 8 * (i >> 2)] = half_at(all[l].a.x[i >> 1], i & 1, t);
    for (int i = 0; i < 4; i++) B[2 * q + (i & 1) + 8 * (i >> 1)][g] = half_at(all[l].b.x[i >> 1], i & 1, t);
    for (int i = 0; i < 4; i++) C[g + 8 * (i >> 1)][2 * q + (i & 1)] = all[l].c.x[i];
  }
  int lane = emu_lane_id(), g = lane >> 2, q = lane & 3;
  for (int i = 0; i < 4; i++) {
    int row = g + 8 * (i >> 1), col = 2 * q + (i & 1);
    float acc = C[row][col];
    for (int k = 0; k < 16; k++) acc = fmaf(A[row][k], B[k][col], acc);
    d.x[i] = acc;
  }
}

template <int N, bool Trans>
inline void ldmatrix(uint32_t *r, const void *row, const char *where) {
  const void *rows[32];
  emu_warp_gather(&row, rows, sizeof row, where);
  for (int l = 0; l < 8 * N; l++)
    if ((uintptr_t)rows[l] % 16)
      emu_fault("ldmatrix at %s: row address %p of lane %d is not 16-byte aligned", where, rows[l], l);
  int lane = emu_lane_id(), g = lane >> 2, q = lane & 3;
  for (int i = 0; i < N; i++) {
    uint16_t h[2];
    for (int j = 0; j < 2; j++) {
      const uint16_t *src = (const uint16_t *)rows[8 * i + (Trans ? 2 * q + j : g)];
      h[j] = src[Trans ? g : 2 * q + j];
    }
    r[i] = (uint32_t)h[0] | (uint32_t)h[1] << 16;
  }
}

// cp.async state per GPU thread (block and thread index): the open group and the committed ones, oldest first.
struct cp_copy {
  void *dst;
  unsigned char bytes[16];
};
struct cp_groups {
  std::vector<cp_copy> open;
  std::vector<std::vector<cp_copy>> committed;
};
typedef std::tuple<unsigned, unsigned, unsigned, unsigned, unsigned, unsigned> thread_key;
inline std::mutex &cp_mu() {
  static std::mutex m;
  return m;
}
inline std::map<thread_key, cp_groups> &cp_state() {
  static std::map<thread_key, cp_groups> s;
  return s;
}
inline thread_key me() { return thread_key(blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z); }

} // namespace emu_twin

inline void mma_m16n8k16_bf16(frag_c &d, const frag_a &a, const frag_b &b, const frag_c &c,
                              const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  emu_twin::mma(CUDA_R_16BF, d, a, b, c, emu_twin::site(file, line));
}
inline void mma_m16n8k16_f16(frag_c &d, const frag_a &a, const frag_b &b, const frag_c &c,
                             const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  emu_twin::mma(CUDA_R_16F, d, a, b, c, emu_twin::site(file, line));
}
template <bool Trans>
inline void ldmatrix_x1(uint32_t (&r)[1], const void *row, const char *file = __builtin_FILE(),
                        int line = __builtin_LINE()) {
  emu_twin::ldmatrix<1, Trans>(r, row, emu_twin::site(file, line));
}
template <bool Trans>
inline void ldmatrix_x2(uint32_t (&r)[2], const void *row, const char *file = __builtin_FILE(),
                        int line = __builtin_LINE()) {
  emu_twin::ldmatrix<2, Trans>(r, row, emu_twin::site(file, line));
}
template <bool Trans>
inline void ldmatrix_x4(uint32_t (&r)[4], const void *row, const char *file = __builtin_FILE(),
                        int line = __builtin_LINE()) {
  emu_twin::ldmatrix<4, Trans>(r, row, emu_twin::site(file, line));
}

inline void cp_async_16(void *smem, const void *gmem, const char *file = __builtin_FILE(),
                        int line = __builtin_LINE()) {
  if ((uintptr_t)smem % 16 || (uintptr_t)gmem % 16)
    emu_fault("cp.async at %s: addresses %p <- %p are not 16-byte aligned", emu_twin::site(file, line), smem, gmem);
  emu_twin::cp_copy c;
  c.dst = smem;
  memcpy(c.bytes, gmem, 16);
  memset(smem, 0xff, 16); // NaN until the wait that completes this copy
  std::lock_guard<std::mutex> g(emu_twin::cp_mu());
  emu_twin::cp_state()[emu_twin::me()].open.push_back(c);
}
inline void cp_async_commit() {
  std::lock_guard<std::mutex> g(emu_twin::cp_mu());
  emu_twin::cp_groups &s = emu_twin::cp_state()[emu_twin::me()];
  s.committed.push_back(std::move(s.open));
  s.open.clear();
}
template <int N>
inline void cp_async_wait() {
  std::lock_guard<std::mutex> g(emu_twin::cp_mu());
  auto it = emu_twin::cp_state().find(emu_twin::me());
  if (it == emu_twin::cp_state().end()) return;
  emu_twin::cp_groups &s = it->second;
  while (s.committed.size() > (size_t)N) {
    for (const emu_twin::cp_copy &c : s.committed.front()) memcpy(c.dst, c.bytes, 16);
    s.committed.erase(s.committed.begin());
  }
  if (s.committed.empty() && s.open.empty()) emu_twin::cp_state().erase(it);
}

} // namespace ptx
