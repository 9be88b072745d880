// Tensor-core flash attention (FlashAttention-2) for bf16/f16 activations, head sizes 32, 64 and 128: the same
// contract, saved state and dropout order as the f32 kernels of attention.cu (src/device/cuda_ops.h), which stay
// as the reference. Q, K, V, ctx are read and written in the activation dtype in place (fused-QKV column slices);
// products run on mma.sync m16n8k16 with f32 accumulation (kernels/ptx.cuh), softmax statistics stay in f32.
//
// Layout of the fragments (ptx.cuh): in a 16x8 f32 tile a lane (g = lane/4, t = lane%4) holds rows g and g+8,
// columns 2t and 2t+1. A score tile's C fragments are the A fragment of the next product with no data movement,
// which is why P (and dS in the backward) never leave registers except for dQ.
//
// attn_tc_fwd   grid (ceil(S/64), B*heads), 4 warps of 16 query rows. K/V tiles of 64 keys are staged in shared
//               memory by cp.async, double-buffered; S = Q K^T, online softmax in the log2 domain, dropout, then
//               O += P V with P rounded to the activation dtype. Writes ctx and lse.
// attn_tc_dsum  D[q] = dctx[q] . ctx[q] (= rowsum(dP o P) with dropout), one warp per row; for S <= 1024 the
//               backward computes D itself into shared memory (one launch and one pass over dO fewer).
// attn_tc_bwd   grid (splits, B*heads): a CTA walks its split's key tiles (64 keys, a warp owns 16; all of them
//               when B*heads alone gives 2 CTAs per SM) and, inside, all query tiles. Per (key, query) tile,
//               with the keys as rows (S^T = K Q^T): P^T from the saved lse, dP^T = V dO^T, dV += (P Z)^T dO,
//               dS^T = P^T (Z dP^T - D) scale, dK += dS^T Q; dS goes to shared memory and dQ += dS K is added to
//               an f32 accumulator that only this CTA touches, in a fixed order: 5 S^2 d multiply-adds, deterministic, no atomics. The last key tile writes dQ, or, split,
//               the split's f32 partial, which attn_tc_dq_sum adds in split order (small batches fill the GPU).
//
// Padding: with a key mask, a row's key tiles past a.klive[b] (all their keys masked out, see mask_rows in
// attention.cu) are not visited: their probabilities are exactly 0, so they add nothing to O, l, dQ, and their
// dK, dV rows are written as zeros. A batch padded at its tail skips its padded tiles this way.
//
// Occupancy (scripts/ptxas_check.sh prints the registers; dynamic shared memory is fwd_smem / bwd_smem below):
// forward d = 32/64/128 uses 150/180/222 registers (sm_90) and 25/45/85 KB, backward 252/242/255 and 39/41/54 KB
// (+ 4 KB for D when S <= 1024),
// 128 threads each: 2 CTAs (8 warps) per SM on H100 for all of them (3 for the d = 32 forward), bounded by the
// registers; on A100 (164 KB of shared memory per SM) the d = 128 forward fits only one.
#include <algorithm>
#include "attention_tc.cuh"
#include "philox.cuh"
#include "ptx.cuh"

namespace {

const int NW = 4, NT = 32 * NW; // warps, threads per CTA
const int BM = 64;              // query rows per forward CTA (16 per warp)
const int BN = kTcKeyTile;      // keys per tile (16 per warp in the backward)
const int PAD = 8;              // elements of padding per shared row: 16-byte rows, conflict-free ldmatrix
const int kDsumLocal = 1024;    // longest S whose D = rowsum(dO o O) the backward keeps in shared memory (4 KB)
const float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;

template <class T>
struct tag {};
__device__ __forceinline__ void mma(tag<__nv_bfloat16>, ptx::frag_c &c, const ptx::frag_a &a, const ptx::frag_b &b) {
  ptx::frag_c r;
  ptx::mma_m16n8k16_bf16(r, a, b, c);
  c = r;
}
__device__ __forceinline__ void mma(tag<__half>, ptx::frag_c &c, const ptx::frag_a &a, const ptx::frag_b &b) {
  ptx::frag_c r;
  ptx::mma_m16n8k16_f16(r, a, b, c);
  c = r;
}
__device__ __forceinline__ uint32_t pack2(tag<__nv_bfloat16>, float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}
__device__ __forceinline__ uint32_t pack2(tag<__half>, float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}

__device__ __forceinline__ void zero(ptx::frag_c &c) { c.x[0] = c.x[1] = c.x[2] = c.x[3] = 0.0f; }

// The A fragment of a 16 x 16 product operand from the C fragments of its two 16 x 8 halves (columns 0-7, 8-15).
template <class T>
__device__ __forceinline__ ptx::frag_a c_to_a(const ptx::frag_c &lo, const ptx::frag_c &hi) {
  ptx::frag_a a;
  a.x[0] = pack2(tag<T>(), lo.x[0], lo.x[1]);
  a.x[1] = pack2(tag<T>(), lo.x[2], lo.x[3]);
  a.x[2] = pack2(tag<T>(), hi.x[0], hi.x[1]);
  a.x[3] = pack2(tag<T>(), hi.x[2], hi.x[3]);
  return a;
}

// ldmatrix x4 address of this lane for the four 8 x 8 matrices of a 16 x 16 block at (r0, c0) of a row-major shared
// tile with row stride LD: matrix i = lane/8 covers rows r0 + 8*(i&1) and columns c0 + 8*(i>>1) (A fragment /
// .trans B pair along k), or with `rows_hi` rows r0 + 8*(i>>1) and columns c0 + 8*(i&1) (B pair of K^T).
template <int LD, class T>
__device__ __forceinline__ const T *lm_addr(const T *sh, int r0, int c0, bool rows_hi) {
  const int lane = threadIdx.x & 31, i = lane >> 3;
  const int r = r0 + (lane & 7) + 8 * (rows_hi ? i >> 1 : i & 1), c = c0 + 8 * (rows_hi ? i & 1 : i >> 1);
  return sh + r * LD + c;
}

// A fragment of rows [r0, r0+16), columns [c0, c0+16) of a row-major tile.
template <int LD, class T>
__device__ __forceinline__ ptx::frag_a ld_a(const T *sh, int r0, int c0) {
  ptx::frag_a a;
  ptx::ldmatrix_x4<false>(a.x, lm_addr<LD>(sh, r0, c0, false));
  return a;
}
// A fragment of the transpose: rows [c0, c0+16) of the result are columns of the stored tile.
template <int LD, class T>
__device__ __forceinline__ ptx::frag_a ld_a_trans(const T *sh, int r0, int c0) {
  ptx::frag_a a;
  ptx::ldmatrix_x4<true>(a.x, lm_addr<LD>(sh, r0, c0, true));
  return a;
}
// c[0], c[1] += a times a 16 x 16 B block of a shared tile, one 16 x 16 output block of a product. KN = false:
// the tile is stored [n][k] (K in Q K^T: k = columns [c0, c0+16), n = rows r0..r0+15); KN = true: stored [k][n]
// (V in P V: k = rows [r0, r0+16), n = columns c0..c0+15), read with .trans.
template <bool KN, int LD, class T>
__device__ __forceinline__ void mma_b(ptx::frag_c *c, const ptx::frag_a &a, const T *sh, int r0, int c0) {
  uint32_t r[4];
  ptx::ldmatrix_x4<KN>(r, lm_addr<LD>(sh, r0, c0, !KN));
  const ptx::frag_b b0 = { { r[0], r[1] } }, b1 = { { r[2], r[3] } };
  mma(tag<T>(), c[0], a, b0);
  mma(tag<T>(), c[1], a, b1);
}

// Rows [r0, r0+n) of a head's D columns (g = its first element) into a shared tile by cp.async; rows >= S zeroed.
template <int D, class T>
__device__ __forceinline__ void load_rows(T *sh, const T *g, int64_t ss, int64_t r0, int n, int64_t S) {
  const int CH = D / 8; // 16-byte chunks per row
  for (int i = threadIdx.x; i < n * CH; i += NT) {
    const int r = i / CH, c = (i % CH) * 8;
    T *dst = sh + r * (D + PAD) + c;
    if (r0 + r < S)
      ptx::cp_async_16(dst, g + (r0 + r) * ss + c);
    else
      *(uint4 *)dst = make_uint4(0u, 0u, 0u, 0u);
  }
}

template <class T>
__device__ __forceinline__ T *head(const tc_view &v, int64_t b, int64_t h, int d) {
  return (T *)v.p + b * v.sb + h * d;
}

// Zeros into rows [r0, r1) of a head's D columns of dK and dV (16-byte rows: view_ok), by the whole CTA.
template <int D, class T>
__device__ __forceinline__ void zero_keys(T *dk, int64_t dks, T *dv, int64_t dvs, int64_t r0, int64_t r1) {
  const int CH = D / 8;
  for (int64_t i = threadIdx.x; i < (r1 - r0) * CH; i += NT) {
    const int64_t r = r0 + i / CH, c = (i % CH) * 8;
    *(uint4 *)(dk + r * dks + c) = make_uint4(0u, 0u, 0u, 0u);
    *(uint4 *)(dv + r * dvs + c) = make_uint4(0u, 0u, 0u, 0u);
  }
}

// Dropout: element (q, k) of head bh uses Philox call offset + (bh*S + q)*ceil(S/4) + k/4, output k%4 (every row
// starts a call, so a call's four outputs are four adjacent keys of one row). keep when u >= p (philox.cuh).
__device__ __forceinline__ uint64_t drop_call(const tc_args &a, int64_t bh, int64_t q, int64_t k) {
  return a.offset + ((uint64_t)bh * (uint64_t)a.S + (uint64_t)q) * (uint64_t)((a.S + 3) / 4) + (uint64_t)(k >> 2);
}
__device__ __forceinline__ float keep_z(uint32_t x, const tc_args &a) {
  return bl_philox_u01(x) >= a.p ? a.dscale : 0.0f;
}

// The four dropout factors of this lane's elements of a 16 x 8 score tile (rows q, q+8; keys k, k+1, k = 2t
// + column base). Lanes t and t^1 hold the four keys of one call in each row: the even lane draws row q's call,
// the odd lane row q+8's, and they swap the halves the other needs, so every output of a call is used once.
__device__ __forceinline__ void drop4(const tc_args &a, int64_t bh, int64_t q, int64_t k, float z[4]) {
  const bool odd = threadIdx.x & 1;
  const uint4 r = bl_philox4x32_dev(a.seed, drop_call(a, bh, odd ? q + 8 : q, k));
  const uint32_t s0 = odd ? r.x : r.z, s1 = odd ? r.y : r.w;
  const uint32_t o0 = __shfl_xor_sync(0xffffffffu, s0, 1), o1 = __shfl_xor_sync(0xffffffffu, s1, 1);
  z[0] = keep_z(odd ? o0 : r.x, a);
  z[1] = keep_z(odd ? o1 : r.y, a);
  z[2] = keep_z(odd ? r.z : o0, a);
  z[3] = keep_z(odd ? r.w : o1, a);
}

// The same for a 16 x 8 tile of S^T in the backward (keys kw, kw+8 as rows g, g+8; queries q, q+1 as columns 2t,
// 2t+1): the four lanes sharing t and g/4 hold 4 keys x 2 queries x 2 row halves, four Philox calls. Lane j = g%4
// draws call j (query q + j%2, keys kb + 8*(j/2), kb = the first key of its row's call), and a 4 x 4 transpose by
// shuffles gives each lane output j (its key within the call) of all four calls.
__device__ __forceinline__ void drop4_t(const tc_args &a, uint64_t call0, int rc, int q, int kb, float z[4]) {
  const int j = (threadIdx.x >> 2) & 3;
  const uint4 r = bl_philox4x32_dev(a.seed, call0 + (uint32_t)((q + (j & 1)) * rc + ((kb + 8 * (j >> 1)) >> 2)));
  uint4 got; // got.<i>: output j of call j^i, sent by lane j^i (lane bits 2-3)
  got.x = bl_philox_lane(r, j);
  got.y = __shfl_xor_sync(0xffffffffu, bl_philox_lane(r, j ^ 1), 4);
  got.z = __shfl_xor_sync(0xffffffffu, bl_philox_lane(r, j ^ 2), 8);
  got.w = __shfl_xor_sync(0xffffffffu, bl_philox_lane(r, j ^ 3), 12);
#pragma unroll
  for (int e = 0; e < 4; e++) z[e] = keep_z(bl_philox_lane(got, j ^ e), a);
}

template <int D, class T>
__global__ void __launch_bounds__(NT, 2) attn_tc_fwd(tc_args a) {
  a.seed = bl_seed_resolve(a.seed); // a device seed slot (bl_ops.h) read once
  const int LD = D + PAD;
  extern __shared__ uint4 smem_fwd[];
  T *Qs = (T *)smem_fwd, *Ks = Qs + BM * LD, *Vs = Ks + 2 * BN * LD; // K, V: two buffers each
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t bh = blockIdx.y, b = bh / a.heads, h = bh % a.heads, S = a.S;
  const int64_t q0 = (int64_t)blockIdx.x * BM, qa = q0 + warp * 16 + g; // this lane's rows: qa, qa + 8
  const T *qg = head<T>(a.q, b, h, D), *kg = head<T>(a.k, b, h, D), *vg = head<T>(a.v, b, h, D);
  const float *madd = a.madd ? a.madd + b * S : nullptr;
  const float sl2 = a.scale * LOG2E;
  const int nk = (int)(((madd ? a.klive[b] : S) + BN - 1) / BN); // the key tiles to visit

  load_rows<D>(Qs, qg, a.q.ss, q0, BM, S);
  load_rows<D>(Ks, kg, a.k.ss, 0, BN, S);
  load_rows<D>(Vs, vg, a.v.ss, 0, BN, S);
  ptx::cp_async_commit();

  ptx::frag_a qf[D / 16];
  ptx::frag_c o[D / 8];
#pragma unroll
  for (int i = 0; i < D / 8; i++) zero(o[i]);
  float m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.0f, 0.0f }; // row max (log2 units) and this lane's partial sum

  for (int j = 0; j < nk; j++) {
    const T *Kb = Ks + (j & 1) * BN * LD, *Vb = Vs + (j & 1) * BN * LD;
    if (j + 1 < nk) {
      load_rows<D>(Ks + ((j + 1) & 1) * BN * LD, kg, a.k.ss, (int64_t)(j + 1) * BN, BN, S);
      load_rows<D>(Vs + ((j + 1) & 1) * BN * LD, vg, a.v.ss, (int64_t)(j + 1) * BN, BN, S);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads(); // tile j (and Q) visible to every warp
    if (j == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) qf[kk] = ld_a<LD>(Qs, warp * 16, kk * 16);
    }
    ptx::frag_c s[BN / 8];
#pragma unroll
    for (int i = 0; i < BN / 8; i++) zero(s[i]);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
      for (int np = 0; np < BN / 16; np++) mma_b<false, LD>(&s[2 * np], qf[kk], Kb, np * 16, kk * 16);
    // scores in log2 units, keys past S at -inf; the tile's first key is < S, so every row max is finite
    const int64_t k0 = (int64_t)j * BN;
    float mx[2] = { -INFINITY, -INFINITY };
#pragma unroll
    for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int64_t key = k0 + nt * 8 + 2 * t + (e & 1);
        float x = -INFINITY;
        if (key < S) x = s[nt].x[e] * sl2 + (madd ? __ldg(madd + key) * LOG2E : 0.0f);
        s[nt].x[e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float mnew = fmaxf(m[r], mx[r]);
      alpha[r] = exp2f(m[r] - mnew); // 0 on the first tile
      m[r] = mnew;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int i = 0; i < D / 8; i++) {
      o[i].x[0] *= alpha[0];
      o[i].x[1] *= alpha[0];
      o[i].x[2] *= alpha[1];
      o[i].x[3] *= alpha[1];
    }
#pragma unroll
    for (int nt = 0; nt < BN / 8; nt++) {
      float z[4] = { 1.0f, 1.0f, 1.0f, 1.0f };
      if (a.p > 0.0f) drop4(a, bh, qa, k0 + nt * 8 + 2 * t, z);
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const float pe = exp2f(s[nt].x[e] - m[e >> 1]);
        l[e >> 1] += pe; // the softmax denominator counts dropped entries too
        s[nt].x[e] = pe * z[e];
      }
    }
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
      const ptx::frag_a pa = c_to_a<T>(s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int dp = 0; dp < D / 16; dp++) mma_b<true, LD>(&o[2 * dp], pa, Vb, kk * 16, dp * 16);
    }
    __syncthreads(); // every warp is done with buffer j&1 before tile j+2 is loaded into it
  }

  T *og = head<T>(a.o, b, h, D);
#pragma unroll
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int64_t q = qa + 8 * r;
    if (q >= S) continue;
    const float inv = 1.0f / l[r];
#pragma unroll
    for (int i = 0; i < D / 8; i++)
      *(uint32_t *)(og + q * a.o.ss + i * 8 + 2 * t) = pack2(tag<T>(), o[i].x[2 * r] * inv, o[i].x[2 * r + 1] * inv);
    if (t == 0) a.lse[bh * S + q] = (m[r] + log2f(l[r])) * LN2;
  }
}

// D[bh, q] = sum_c dctx[b, q, h*d + c] * ctx[b, q, h*d + c] in f32; one warp per (bh, q).
template <class T>
__global__ void attn_tc_dsum(tc_args a, int64_t rows) {
  const int lane = threadIdx.x & 31;
  const int64_t nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
  for (int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; w < rows; w += nw) {
    const int64_t bh = w / a.S, q = w % a.S, b = bh / a.heads, h = bh % a.heads;
    const T *o = head<T>(a.o, b, h, a.d) + q * a.o.ss, *go = head<T>(a.dout, b, h, a.d) + q * a.dout.ss;
    float s = 0.0f;
    for (int c = lane; c < a.d; c += 32) s += to_f(o[c]) * to_f(go[c]);
    s = cu_warp_sum(s);
    if (lane == 0) a.dsum[w] = s;
  }
}

// Query rows per backward step: fewer at larger d keeps the dK, dV accumulators and two score tiles in registers.
template <int D>
struct bwd_cfg {
  static const int BQ = D == 32 ? 64 : D == 64 ? 32 : 16;
  static const int MT = BQ / 16;     // 16-row query tiles in a step
  static const int DW = D * MT / NW; // dQ columns per warp: NW warps cover MT row tiles x D columns
};

template <int D, class T>
__global__ void __launch_bounds__(NT, 2) attn_tc_bwd(tc_args a) {
  a.seed = bl_seed_resolve(a.seed); // a device seed slot (bl_ops.h) read once
  const int LD = D + PAD, BQ = bwd_cfg<D>::BQ, MT = bwd_cfg<D>::MT, DW = bwd_cfg<D>::DW, LDS = BQ + PAD;
  extern __shared__ uint4 smem_bwd[];
  T *Ks = (T *)smem_bwd, *Vs = Ks + BN * LD, *Qs = Vs + BN * LD, *Os = Qs + 2 * BQ * LD, *dSs = Os + 2 * BQ * LD;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t bh = blockIdx.y, b = bh / a.heads, h = bh % a.heads;
  const int S = (int)a.S, rc = (S + 3) / 4; // rc: Philox calls per dropout row
  const uint64_t call0 = a.offset + (uint64_t)bh * S * rc;
  const T *qg = head<T>(a.q, b, h, D), *kg = head<T>(a.k, b, h, D), *vg = head<T>(a.v, b, h, D);
  const T *dog = head<T>(a.dout, b, h, D);
  T *dqg = head<T>(a.dq, b, h, D), *dkg = head<T>(a.dk, b, h, D), *dvg = head<T>(a.dv, b, h, D);
  const float *madd = a.madd ? a.madd + b * S : nullptr, *lse = a.lse + bh * S;
  // D[q] = dO[q] . O[q]: from attn_tc_dsum, or (a.dsum_local) computed here into shared memory, as attn_tc_dsum
  // does, before the first barrier of the loop below (the only readers come after it)
  float *dloc = (float *)(dSs + BN * LDS);
  const float *dsum = a.dsum_local ? dloc : a.dsum + bh * S;
  if (a.dsum_local) {
    const T *og = head<T>(a.o, b, h, D);
    for (int q = warp; q < S; q += NW) {
      float x = 0.0f;
      for (int c = lane; c < D; c += 32) x += to_f(og[(int64_t)q * a.o.ss + c]) * to_f(dog[(int64_t)q * a.dout.ss + c]);
      x = cu_warp_sum(x);
      if (lane == 0) dloc[q] = x;
    }
  }
  // this CTA's key tiles [kt0, kt1): split blockIdx.x of gridDim.x; with one split dQ is written here, with more
  // each split leaves its partial dQ in its own f32 slice of dqacc for attn_tc_dq_sum. Tiles from kv on are
  // masked out: not visited, their dK, dV rows zeroed below (kv >= 1: a row visits at least one tile).
  const int nk = (int)((S + BN - 1) / BN), nq = (int)((S + BQ - 1) / BQ), per = (nk + gridDim.x - 1) / gridDim.x;
  const int kv = madd ? (a.klive[b] + BN - 1) / BN : nk;
  const int kt0 = blockIdx.x * per, kt1 = min(nk, kt0 + per), ktv = max(kt0, min(kt1, kv)), steps = (ktv - kt0) * nq;
  const bool direct = gridDim.x == 1;
  float *dqacc = a.dqacc ? a.dqacc + ((int64_t)blockIdx.x * gridDim.y + bh) * S * D : nullptr;
  const int64_t kend = (int64_t)kt1 * BN < S ? (int64_t)kt1 * BN : S;
  zero_keys<D>(dkg, a.dk.ss, dvg, a.dv.ss, (int64_t)ktv * BN, kend);
  if (steps == 0 && !direct) // a split with no tile to visit adds zeros to dQ
    for (int64_t i = threadIdx.x; i < (int64_t)S * D; i += NT) dqacc[i] = 0.0f;
  const float sl2 = a.scale * LOG2E;
  const int mt = warp % MT, c0 = (warp / MT) * DW; // this warp's dQ block: rows 16*mt of the step, DW columns

  if (steps == 0) return;
  load_rows<D>(Qs, qg, a.q.ss, 0, BQ, S);
  load_rows<D>(Os, dog, a.dout.ss, 0, BQ, S);
  ptx::cp_async_commit();

  ptx::frag_c dk[D / 8], dv[D / 8];
  for (int step = 0; step < steps; step++) {
    const int kt = kt0 + step / nq, qt = step % nq, buf = step & 1;
    const int k0 = kt * BN, qs0 = qt * BQ, kw = k0 + warp * 16 + g; // this lane's keys: kw, kw + 8
    if (qt == 0) { // a new key tile: the previous step ended with a barrier, K and V are free
      load_rows<D>(Ks, kg, a.k.ss, k0, BN, S);
      load_rows<D>(Vs, vg, a.v.ss, k0, BN, S);
      ptx::cp_async_commit();
#pragma unroll
      for (int i = 0; i < D / 8; i++) {
        zero(dk[i]);
        zero(dv[i]);
      }
    }
    if (step + 1 < steps) {
      const int qn = ((step + 1) % nq) * BQ;
      load_rows<D>(Qs + (buf ^ 1) * BQ * LD, qg, a.q.ss, qn, BQ, S);
      load_rows<D>(Os + (buf ^ 1) * BQ * LD, dog, a.dout.ss, qn, BQ, S);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads(); // K, V and this step's Q, dO visible
    const T *Qb = Qs + buf * BQ * LD, *Ob = Os + buf * BQ * LD;

    // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys
    ptx::frag_c s[BQ / 8], dp[BQ / 8];
#pragma unroll
    for (int i = 0; i < BQ / 8; i++) {
      zero(s[i]);
      zero(dp[i]);
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      const ptx::frag_a ka = ld_a<LD>(Ks, warp * 16, kk * 16), va = ld_a<LD>(Vs, warp * 16, kk * 16);
#pragma unroll
      for (int np = 0; np < BQ / 16; np++) {
        mma_b<false, LD>(&s[2 * np], ka, Qb, np * 16, kk * 16);
        mma_b<false, LD>(&dp[2 * np], va, Ob, np * 16, kk * 16);
      }
    }
    // P^T = exp(s scale + mask - lse), zero outside S; s <- P Z (for dV), dp <- dS^T
    const float ma[2] = { madd && kw < S ? __ldg(madd + kw) * LOG2E : 0.0f,
                          madd && kw + 8 < S ? __ldg(madd + kw + 8) * LOG2E : 0.0f };
#pragma unroll
    for (int nt = 0; nt < BQ / 8; nt++) {
      float z[4] = { 1.0f, 1.0f, 1.0f, 1.0f };
      if (a.p > 0.0f) drop4_t(a, call0, rc, qs0 + nt * 8 + 2 * t, k0 + warp * 16 + 4 * (g >> 2), z);
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int key = kw + 8 * (e >> 1), q = qs0 + nt * 8 + 2 * t + (e & 1);
        float p = 0.0f, ds = 0.0f;
        if (key < S && q < S) {
          p = exp2f(s[nt].x[e] * sl2 + ma[e >> 1] - __ldg(lse + q) * LOG2E);
          ds = p * (dp[nt].x[e] * z[e] - dsum[q]) * a.scale;
        }
        s[nt].x[e] = p * z[e];
        dp[nt].x[e] = ds;
      }
    }
    // dV += (P Z)^T dO, dK += dS^T Q
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++) {
      const ptx::frag_a pa = c_to_a<T>(s[2 * kk], s[2 * kk + 1]), sa = c_to_a<T>(dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
      for (int np = 0; np < D / 16; np++) {
        mma_b<true, LD>(&dv[2 * np], pa, Ob, kk * 16, np * 16);
        mma_b<true, LD>(&dk[2 * np], sa, Qb, kk * 16, np * 16);
      }
    }
    // dS^T to shared memory (rows = keys), the operand of dQ += dS K
#pragma unroll
    for (int nt = 0; nt < BQ / 8; nt++) {
      const int kr = warp * 16 + g, qc = nt * 8 + 2 * t;
      *(uint32_t *)(dSs + kr * LDS + qc) = pack2(tag<T>(), dp[nt].x[0], dp[nt].x[1]);
      *(uint32_t *)(dSs + (kr + 8) * LDS + qc) = pack2(tag<T>(), dp[nt].x[2], dp[nt].x[3]);
    }
    __syncthreads(); // dS of all four warps' keys written
    ptx::frag_c dq[DW / 8];
#pragma unroll
    for (int i = 0; i < DW / 8; i++) zero(dq[i]);
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
      const ptx::frag_a da = ld_a_trans<LDS>(dSs, kk * 16, mt * 16);
#pragma unroll
      for (int np = 0; np < DW / 16; np++) mma_b<true, LD>(&dq[2 * np], da, Ks, kk * 16, c0 + np * 16);
    }
    // dQ accumulates over key tiles in f32, always by this lane for these elements: ordered, no atomics
    const bool first = kt == kt0, last = kt == ktv - 1;
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int q = qs0 + mt * 16 + g + 8 * r;
      if (q >= S) continue;
#pragma unroll
      for (int i = 0; i < DW / 8; i++) {
        const int c = c0 + i * 8 + 2 * t;
        float x0 = dq[i].x[2 * r], x1 = dq[i].x[2 * r + 1];
        float *acc = dqacc + q * D + c;
        if (!first) {
          x0 += acc[0];
          x1 += acc[1];
        }
        if (last && direct)
          *(uint32_t *)(dqg + (int64_t)q * a.dq.ss + c) = pack2(tag<T>(), x0, x1);
        else {
          acc[0] = x0;
          acc[1] = x1;
        }
      }
    }
    if (qt == nq - 1) { // this key tile is complete: dK, dV of the warp's 16 keys
#pragma unroll
      for (int r = 0; r < 2; r++) {
        const int key = kw + 8 * r;
        if (key >= S) continue;
        T *dkr = dkg + (int64_t)key * a.dk.ss, *dvr = dvg + (int64_t)key * a.dv.ss;
#pragma unroll
        for (int i = 0; i < D / 8; i++) {
          *(uint32_t *)(dkr + i * 8 + 2 * t) = pack2(tag<T>(), dk[i].x[2 * r], dk[i].x[2 * r + 1]);
          *(uint32_t *)(dvr + i * 8 + 2 * t) = pack2(tag<T>(), dv[i].x[2 * r], dv[i].x[2 * r + 1]);
        }
      }
    }
    __syncthreads(); // dS, this step's Q/dO buffer (and K, V at a tile's end) are free to be overwritten
  }
}

// dq = the sum of the splits' partial dQ slices, added in split order (deterministic); a thread takes 2 columns.
template <class T>
__global__ void attn_tc_dq_sum(tc_args a, int64_t B, int nsplit) {
  const int64_t bhs = B * a.heads * a.S, pairs = bhs * a.d / 2;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < pairs; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = i / (a.d / 2), c = 2 * (i % (a.d / 2)), bh = row / a.S, q = row % a.S;
    float x0 = 0.0f, x1 = 0.0f;
    for (int z = 0; z < nsplit; z++) {
      const float *p = a.dqacc + (z * bhs + row) * a.d + c;
      x0 += p[0];
      x1 += p[1];
    }
    T *dq = head<T>(a.dq, bh / a.heads, bh % a.heads, a.d) + q * a.dq.ss + c;
    *(uint32_t *)dq = pack2(tag<T>(), x0, x1);
  }
}

size_t fwd_smem(int d) { return (size_t)(BM + 4 * BN) * (d + PAD) * 2; }
template <int D>
size_t bwd_smem() {
  const int BQ = bwd_cfg<D>::BQ;
  return ((size_t)(2 * BN + 4 * BQ) * (D + PAD) + (size_t)BN * (BQ + PAD)) * 2;
}

template <class K>
int launch(const char *op, int dev, K kernel, dim3 grid, size_t smem, const tc_args &a) {
  if (smem > 48 * 1024)
    CU_TRY(op, dev, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  kernel<<<grid, NT, smem, cu_stream(dev)>>>(a);
  return cu_launched(op, dev);
}

// Minimum traffic and tensor-core FLOPs of a launch over B*heads heads: `nio` 16-bit [B,S,H] operands moved whole
// and `nkv` moved for the visited keys only (K, V), `nrow` f32 values per row (lse, dsum), the additive mask,
// `extra` bytes, and `macs` S d multiply-adds per visited key and head. The visited keys are a count on the device
// (a.cost_slot, written by mask_rows) while the model records, else (or without a mask) all B*S keys.
void tc_cost(int dev, const char *name, const tc_args &a, int64_t B, int macs, int nio, int nkv, int nrow,
             double extra = 0) {
  const double rows = (double)B * a.heads * a.S, elems = rows * a.d;
  const double bytes = 2.0 * nio * elems + 4.0 * nrow * rows + (a.madd ? 4.0 * B * a.S : 0.0) + extra;
  const double key_bytes = 2.0 * nkv * a.heads * a.d, key_flops = 2.0 * macs * a.heads * a.S * a.d;
  const int engine = macs ? BL_ENGINE_TC16 : BL_ENGINE_MEM;
  if (a.madd && a.cost_slot && (nkv || macs))
    cu_cost_kernel_per(dev, "attention", name, bytes, 0.0, engine, a.cost_slot, key_bytes, key_flops);
  else
    cu_cost_kernel(dev, "attention", name, bytes + key_bytes * B * a.S, key_flops * B * a.S, engine);
}

template <class T>
int forward_t(const char *op, int dev, const tc_args &a, int64_t B) {
  const dim3 grid((unsigned)((a.S + BM - 1) / BM), (unsigned)(B * a.heads));
  tc_cost(dev, "attn_tc_fwd", a, B, 2, 2, 2, 1); // S = Q K^T, O = P V; q, (k, v) in, o and lse out
  switch (a.d) {
    case 32: return launch(op, dev, attn_tc_fwd<32, T>, grid, fwd_smem(32), a);
    case 64: return launch(op, dev, attn_tc_fwd<64, T>, grid, fwd_smem(64), a);
    default: return launch(op, dev, attn_tc_fwd<128, T>, grid, fwd_smem(128), a);
  }
}

template <class T>
int backward_t(const char *op, int dev, tc_args a, int64_t B) {
  const int64_t rows = B * a.heads * a.S;
  // D in the backward's shared memory up to kDsumLocal rows (BERT's 512), else one more pass
  a.dsum_local = a.S <= kDsumLocal;
  const size_t dsmem = a.dsum_local ? sizeof(float) * kDsumLocal : 0;
  if (!a.dsum_local) {
    tc_cost(dev, "attn_tc_dsum", a, B, 0, 2, 0, 1);
    attn_tc_dsum<T><<<cu_blocks(rows * 32, 256), 256, 0, cu_stream(dev)>>>(a, rows);
    BL_CHECK(cu_launched(op, dev));
  }
  // S^T, dP^T, dV, dK, dQ: 5 S^2 d; q, (k, v), dout in, dq, dk, dv out; lse, dsum in; dQ's f32 round trips within
  // a CTA stay in its L2 working set and are not counted, the partial slices of a split are (written once)
  const int ns = attn_tc_kv_split(dev, B * a.heads, a.S);
  const double slices = ns > 1 ? 4.0 * ns * rows * a.d : 0.0;
  tc_cost(dev, "attn_tc_bwd", a, B, 5, 5 - (ns > 1) + a.dsum_local, 2, 2 - a.dsum_local, slices); // + ctx, - D
  const dim3 grid((unsigned)ns, (unsigned)(B * a.heads));
  int rc;
  switch (a.d) {
    case 32: rc = launch(op, dev, attn_tc_bwd<32, T>, grid, bwd_smem<32>() + dsmem, a); break;
    case 64: rc = launch(op, dev, attn_tc_bwd<64, T>, grid, bwd_smem<64>() + dsmem, a); break;
    default: rc = launch(op, dev, attn_tc_bwd<128, T>, grid, bwd_smem<128>() + dsmem, a); break;
  }
  if (rc || ns == 1) return rc;
  tc_cost(dev, "attn_tc_dq_sum", a, B, 0, 1, 0, 0, slices);
  attn_tc_dq_sum<T><<<cu_blocks(rows * a.d / 2, 256), 256, 0, cu_stream(dev)>>>(a, B, ns);
  return cu_launched(op, dev);
}

int sm_major(int dev) {
  static int major[64]; // 0 = not asked yet
  if (dev < 0 || dev >= 64) return 0;
  if (!major[dev]) {
    cudaDeviceProp prop;
    major[dev] = cudaGetDeviceProperties(&prop, dev) == cudaSuccess ? prop.major : -1;
  }
  return major[dev];
}

bool view_ok(const bl_tensor *t, int dtype) {
  if (!t) return true;
  if (t->dtype != dtype || t->ndim != 3 || (t->shape[2] > 1 && t->stride[2] != 1)) return false;
  return (uintptr_t)t->data % 16 == 0 && t->stride[0] % 8 == 0 && t->stride[1] % 8 == 0;
}

} // namespace

bool attn_tc_eligible(int dev, int64_t d, int n, const bl_tensor *const *ts) {
  if (d != 32 && d != 64 && d != 128) return false;
  if (ts[0]->shape[1] > 16384) return false;    // in-head indices (q * ceil(S/4), q * d) are 32-bit
  if (getenv("BL_ATTENTION_F32")) return false; // the f32 reference kernels, for comparisons on a real GPU
  if (sm_major(dev) < 8) return false;
  const int dtype = ts[0]->dtype;
  if (dtype != BL_BF16 && dtype != BL_F16) return false;
  for (int i = 0; i < n; i++)
    if (!view_ok(ts[i], dtype)) return false;
  return true;
}

static int sm_count(int dev) {
  static int count[64]; // 0 = not asked yet
  if (dev < 0 || dev >= 64) return 1;
  if (!count[dev]) {
    cudaDeviceProp prop;
    count[dev] = cudaGetDeviceProperties(&prop, dev) == cudaSuccess ? prop.multiProcessorCount : 1;
  }
  return count[dev];
}

int attn_tc_kv_split(int dev, int64_t bh, int64_t S) {
  const int nk = (int)((S + BN - 1) / BN);
  int want = 1;
  if (const char *e = getenv("BL_ATTENTION_KV_SPLIT"))
    want = atoi(e); // tests: a fixed split
  else if (bh < 2 * sm_count(dev))
    want = (int)((2 * sm_count(dev) + bh - 1) / bh); // 2 CTAs per SM
  want = std::max(1, std::min(want, nk));
  const int per = (nk + want - 1) / want;
  return (nk + per - 1) / per; // no split without key tiles
}

int64_t attn_tc_scratch_dq(int dev, int64_t bh, int64_t S, int d) {
  const int ns = attn_tc_kv_split(dev, bh, S);
  return ns > 1 ? ns * bh * S * d : S > BN ? bh * S * d : 0;
}

int attn_tc_forward(const char *op, int dev, const tc_args &a, int64_t B) {
  return a.dtype == BL_BF16 ? forward_t<__nv_bfloat16>(op, dev, a, B) : forward_t<__half>(op, dev, a, B);
}

int attn_tc_backward(const char *op, int dev, const tc_args &a, int64_t B) {
  return a.dtype == BL_BF16 ? backward_t<__nv_bfloat16>(op, dev, a, B) : backward_t<__half>(op, dev, a, B);
}
