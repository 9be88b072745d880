// Fused scaled dot-product self-attention, flash-style (contract and saved
// state in src/device/cuda_ops.h; math and dropout order as bl_attention_* in
// bl_ops.h). f32 SIMT version: correct for any S (the S x S scores are never
// written to global memory), head size d <= 128.
//
// Layout: q, k, v, ctx are [B, S, H] with H = heads*d and unit stride in H
// (row strides free: fused-QKV column slices are used in place); head h
// occupies columns [h*d, (h+1)*d). key_mask [B, S] becomes the additive
// (1 - m) * -10000 of the CPU op. Dropout element ((b*heads + h)*S + q)*S4 + k
// of the Philox stream (seed, offset), S4 = 4*ceil(S/4) (bl_ops.h).
//
// Tiling (all three kernels): 128 threads; tiles of BQ = 32 queries and
// BK = 32 keys; thread t owns row r = t/4 of its tile and the columns
// c = (t%4) + 4u (u < 32) of a d-vector, so the 4 threads of a row are
// adjacent lanes of one warp (row reductions are two xor-shuffles). Shared
// rows are padded to d+1 floats (score tiles to BK+1): the access patterns
// below are free of bank conflicts (or 2-way at worst). Every tile edge is
// zero-filled on load and masked on use (rows/keys >= S contribute nothing
// and are never stored).
//
// attn_fwd   grid (ceil(S/BQ), B*heads). Online softmax over key tiles:
//            m, l per query row, acc = sum_k dropout(p) v_k rescaled by
//            exp(m_old - m_new). Writes ctx = acc / l and lse = m + log(l).
// attn_bwd_dot  D[q] = dctx[q] . ctx[q] (= rowsum(dP .* P) with dropout), one warp per row.
// attn_bwd_kv   grid (ceil(S/BK), B*heads). For its key tile, loops over
//            query tiles recomputing P = exp(s - lse), dP = dctx . v,
//            dS = P (Z dP - D) scale (Z = keep/(1-p)); dV += (P Z)^T dctx,
//            dK += dS^T q.
// bf16/f16 operands with d in {32, 64, 128} on sm_80+ go to the tensor-core
// kernels of attention_tc.cu instead; these f32 kernels stay as the reference.
//
// attn_bwd_q grid (ceil(S/BQ), B*heads). Same dS for its query tile over all
//            key tiles; dQ += dS k. Two passes instead of atomics: dq, dk, dv
//            are written exactly once, deterministic.
#include <algorithm>
#include "attention_tc.cuh"
#include "philox.cuh"

namespace {

const int BQ = 32, BK = 32, NT = 128, DMAX = 128, DT = DMAX / 4;

struct bsh { // [B, S, H] operand, element (b, s, c) at p[b*sb + s*ss + c]
  float *p;
  int64_t sb, ss;
};

struct attn_args {
  bsh q, k, v, o, dout; // o = ctx
  bsh dq, dk, dv;
  const float *madd; // [B, S] additive key mask or NULL
  const int *klive;  // [B] keys the tensor-core kernels visit per row (mask_rows), with madd
  int *cost_slot;    // the step-time model's count of those keys (recording only) or NULL
  float *lse;        // [B*heads, S]
  float *dsum;       // [B*heads, S] (backward)
  int64_t S, heads, d;
  float scale, p, dscale;
  uint64_t seed, offset;
};

__device__ __forceinline__ float z_factor(const attn_args &a, int64_t bh, int64_t qi, int64_t kj) {
  if (a.p <= 0.0f) return 1.0f;
  const uint64_t s4 = (uint64_t)(a.S + 3) / 4 * 4;
  uint64_t e = ((uint64_t)bh * (uint64_t)a.S + (uint64_t)qi) * s4 + (uint64_t)kj;
  return bl_dropout_keep(a.seed, a.offset, e, a.p) ? a.dscale : 0.0f;
}

// rows [r0, r0+n) of head h of batch b into sh (n x dp, padded), zero beyond S.
__device__ __forceinline__ void load_tile(float *sh, int dp, const bsh &t, int64_t b, int64_t h, int64_t r0, int n,
                                          int64_t S, int64_t d) {
  const int64_t total = (int64_t)n * d;
  for (int64_t idx = threadIdx.x; idx < total; idx += blockDim.x) {
    int i = (int)(idx / d);
    int c = (int)(idx % d);
    int64_t s = r0 + i;
    sh[i * dp + c] = s < S ? t.p[b * t.sb + s * t.ss + h * d + c] : 0.0f;
  }
}

__device__ __forceinline__ float dot_sh(const float *x, const float *y, int64_t d) {
  float acc = 0.0f;
  for (int c = 0; c < d; c++) acc += x[c] * y[c];
  return acc;
}

__global__ void __launch_bounds__(NT) attn_fwd(attn_args a) {
  a.seed = bl_seed_resolve(a.seed); // a device seed slot (bl_ops.h) read once
  extern __shared__ float smem[];
  const int d = (int)a.d, dp = d + 1, ps = BK + 1;
  float *Qs = smem, *Ks = Qs + BQ * dp, *Vs = Ks + BK * dp, *Ps = Vs + BK * dp;
  const int r = threadIdx.x >> 2, g = threadIdx.x & 3;
  const int64_t bh = blockIdx.y, b = bh / a.heads, h = bh % a.heads, S = a.S;
  const int64_t q0 = (int64_t)blockIdx.x * BQ, qi = q0 + r;
  load_tile(Qs, dp, a.q, b, h, q0, BQ, S, d);
  float acc[DT];
#pragma unroll
  for (int t = 0; t < DT; t++) acc[t] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int64_t k0 = 0; k0 < S; k0 += BK) {
    __syncthreads(); // Q loaded (first tile) / previous tile's Ks, Vs, Ps no longer read
    load_tile(Ks, dp, a.k, b, h, k0, BK, S, d);
    load_tile(Vs, dp, a.v, b, h, k0, BK, S, d);
    __syncthreads();
    float sreg[BK / 4];
    float tmax = -INFINITY;
#pragma unroll
    for (int u = 0; u < BK / 4; u++) {
      const int j = g + 4 * u;
      const int64_t kj = k0 + j;
      float s = -INFINITY;
      if (kj < S) {
        s = dot_sh(Qs + r * dp, Ks + j * dp, d) * a.scale;
        if (a.madd) s += a.madd[b * S + kj];
      }
      sreg[u] = s;
      tmax = fmaxf(tmax, s);
    }
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
    const float mnew = fmaxf(m, tmax);  // finite: key k0 < S is valid in every tile
    const float alpha = expf(m - mnew); // 0 on the first tile (m = -inf)
    float psum = 0.0f;
#pragma unroll
    for (int u = 0; u < BK / 4; u++) {
      const int j = g + 4 * u;
      const int64_t kj = k0 + j;
      float pv = kj < S ? expf(sreg[u] - mnew) : 0.0f;
      psum += pv;
      if (pv != 0.0f && qi < S) pv *= z_factor(a, bh, qi, kj);
      Ps[r * ps + j] = pv;
    }
    psum += __shfl_xor_sync(0xffffffffu, psum, 1);
    psum += __shfl_xor_sync(0xffffffffu, psum, 2);
    l = l * alpha + psum;
    m = mnew;
    __syncthreads(); // Ps of all rows written (each row's 4 threads wrote disjoint keys)
#pragma unroll
    for (int t = 0; t < DT; t++) {
      const int c = g + 4 * t;
      if (c < d) {
        float s = acc[t] * alpha;
        for (int j = 0; j < BK; j++) s += Ps[r * ps + j] * Vs[j * dp + c];
        acc[t] = s;
      }
    }
  }
  if (qi < S) {
    const float inv = 1.0f / l;
    float *o = a.o.p + b * a.o.sb + qi * a.o.ss + h * d;
#pragma unroll
    for (int t = 0; t < DT; t++) {
      const int c = g + 4 * t;
      if (c < d) o[c] = acc[t] * inv;
    }
    if (g == 0) a.lse[bh * S + qi] = m + logf(l);
  }
}

// D[bh, q] = sum_c dctx[b, q, h*d + c] * ctx[b, q, h*d + c]; one warp per (bh, q).
__global__ void attn_bwd_dot(attn_args a, int64_t rows) {
  const int lane = threadIdx.x & 31;
  for (int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; w < rows;
       w += ((int64_t)gridDim.x * blockDim.x) >> 5) {
    const int64_t bh = w / a.S, qi = w % a.S, b = bh / a.heads, h = bh % a.heads;
    const float *o = a.o.p + b * a.o.sb + qi * a.o.ss + h * a.d;
    const float *g = a.dout.p + b * a.dout.sb + qi * a.dout.ss + h * a.d;
    float s = 0.0f;
    for (int64_t c = lane; c < a.d; c += 32) s += o[c] * g[c];
    s = cu_warp_sum(s);
    if (lane == 0) a.dsum[w] = s;
  }
}

// dS and P*Z for query row i (tile-local row index, global qi) and key kj.
__device__ __forceinline__ void ds_entry(const attn_args &a, int64_t bh, int64_t b, int64_t qi, int64_t kj,
                                         const float *qrow, const float *krow, const float *dorow, const float *vrow,
                                         float lse, float dsum, float *pz, float *ds) {
  const int64_t S = a.S;
  if (qi >= S || kj >= S) {
    *pz = 0.0f;
    *ds = 0.0f;
    return;
  }
  float s = dot_sh(qrow, krow, a.d) * a.scale;
  if (a.madd) s += a.madd[b * S + kj];
  const float p = expf(s - lse);
  const float z = z_factor(a, bh, qi, kj);
  const float dpz = dot_sh(dorow, vrow, a.d) * z;
  *pz = p * z;
  *ds = p * (dpz - dsum) * a.scale;
}

__global__ void __launch_bounds__(NT) attn_bwd_kv(attn_args a) {
  a.seed = bl_seed_resolve(a.seed); // a device seed slot (bl_ops.h) read once
  extern __shared__ float smem[];
  const int d = (int)a.d, dp = d + 1, ps = BK + 1;
  float *Ks = smem, *Vs = Ks + BK * dp, *Qs = Vs + BK * dp, *Os = Qs + BQ * dp;
  float *PZ = Os + BQ * dp, *DS = PZ + BQ * ps, *Ls = DS + BQ * ps, *Dl = Ls + BQ;
  const int r = threadIdx.x >> 2, g = threadIdx.x & 3; // r: key row of this thread
  const int64_t bh = blockIdx.y, b = bh / a.heads, h = bh % a.heads, S = a.S;
  const int64_t k0 = (int64_t)blockIdx.x * BK, kj = k0 + r;
  load_tile(Ks, dp, a.k, b, h, k0, BK, S, d);
  load_tile(Vs, dp, a.v, b, h, k0, BK, S, d);
  float ak[DT], av[DT];
#pragma unroll
  for (int t = 0; t < DT; t++) {
    ak[t] = 0.0f;
    av[t] = 0.0f;
  }
  for (int64_t q0 = 0; q0 < S; q0 += BQ) {
    __syncthreads(); // K/V loaded (first tile) / previous Qs, Os, PZ, DS no longer read
    load_tile(Qs, dp, a.q, b, h, q0, BQ, S, d);
    load_tile(Os, dp, a.dout, b, h, q0, BQ, S, d);
    if (threadIdx.x < BQ) {
      const int64_t qi = q0 + threadIdx.x;
      Ls[threadIdx.x] = qi < S ? a.lse[bh * S + qi] : 0.0f;
      Dl[threadIdx.x] = qi < S ? a.dsum[bh * S + qi] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < BQ / 4; u++) {
      const int i = g + 4 * u;
      float pz, ds;
      ds_entry(a, bh, b, q0 + i, kj, Qs + i * dp, Ks + r * dp, Os + i * dp, Vs + r * dp, Ls[i], Dl[i], &pz, &ds);
      PZ[i * ps + r] = pz;
      DS[i * ps + r] = ds;
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < DT; t++) {
      const int c = g + 4 * t;
      if (c < d) {
        float sv = av[t], sk = ak[t];
        for (int i = 0; i < BQ; i++) {
          sv += PZ[i * ps + r] * Os[i * dp + c];
          sk += DS[i * ps + r] * Qs[i * dp + c];
        }
        av[t] = sv;
        ak[t] = sk;
      }
    }
  }
  if (kj < S) {
    float *dk = a.dk.p + b * a.dk.sb + kj * a.dk.ss + h * d;
    float *dv = a.dv.p + b * a.dv.sb + kj * a.dv.ss + h * d;
#pragma unroll
    for (int t = 0; t < DT; t++) {
      const int c = g + 4 * t;
      if (c < d) {
        dk[c] = ak[t];
        dv[c] = av[t];
      }
    }
  }
}

__global__ void __launch_bounds__(NT) attn_bwd_q(attn_args a) {
  a.seed = bl_seed_resolve(a.seed); // a device seed slot (bl_ops.h) read once
  extern __shared__ float smem[];
  const int d = (int)a.d, dp = d + 1, ps = BK + 1;
  float *Qs = smem, *Os = Qs + BQ * dp, *Ks = Os + BQ * dp, *Vs = Ks + BK * dp, *DS = Vs + BK * dp;
  const int r = threadIdx.x >> 2, g = threadIdx.x & 3; // r: query row of this thread
  const int64_t bh = blockIdx.y, b = bh / a.heads, h = bh % a.heads, S = a.S;
  const int64_t q0 = (int64_t)blockIdx.x * BQ, qi = q0 + r;
  load_tile(Qs, dp, a.q, b, h, q0, BQ, S, d);
  load_tile(Os, dp, a.dout, b, h, q0, BQ, S, d);
  const float lse = qi < S ? a.lse[bh * S + qi] : 0.0f, dsum = qi < S ? a.dsum[bh * S + qi] : 0.0f;
  float aq[DT];
#pragma unroll
  for (int t = 0; t < DT; t++) aq[t] = 0.0f;
  for (int64_t k0 = 0; k0 < S; k0 += BK) {
    __syncthreads();
    load_tile(Ks, dp, a.k, b, h, k0, BK, S, d);
    load_tile(Vs, dp, a.v, b, h, k0, BK, S, d);
    __syncthreads();
#pragma unroll
    for (int u = 0; u < BK / 4; u++) {
      const int j = g + 4 * u;
      float pz, ds;
      ds_entry(a, bh, b, qi, k0 + j, Qs + r * dp, Ks + j * dp, Os + r * dp, Vs + j * dp, lse, dsum, &pz, &ds);
      DS[r * ps + j] = ds;
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < DT; t++) {
      const int c = g + 4 * t;
      if (c < d) {
        float s = aq[t];
        for (int j = 0; j < BK; j++) s += DS[r * ps + j] * Ks[j * dp + c];
        aq[t] = s;
      }
    }
  }
  if (qi < S) {
    float *dq = a.dq.p + b * a.dq.sb + qi * a.dq.ss + h * d;
#pragma unroll
    for (int t = 0; t < DT; t++) {
      const int c = g + 4 * t;
      if (c < d) dq[c] = aq[t];
    }
  }
}

// One block per row b of the [B, S] key mask m: the additive mask (1 - m) * -10000 of its keys, and live[b], the
// keys the tensor-core kernels visit: up to the end of the key tile holding the row's last key with m > 0 (NaN
// counts as such), all S when no key has one. A key past that has m <= 0, an additive mask of -10000 or less, and
// its probability exp(score - 10000 - lse) is exactly 0 in f32 unless its score beats the row's best visited one
// by ~9,900: skipping its tile changes nothing. rec (while the step-time model records): += live[b].
__global__ void mask_rows(const float *m, float *out, int *live, int *rec, int64_t S) {
  __shared__ int last;
  if (threadIdx.x == 0) last = -1;
  __syncthreads();
  const int64_t base = blockIdx.x * S;
  int mine = -1;
  for (int64_t j = threadIdx.x; j < S; j += blockDim.x) {
    const float v = m[base + j];
    out[base + j] = (float)((1.0 - (double)v) * -10000.0);
    if (!(v <= 0.0f)) mine = (int)j;
  }
  if (mine >= 0) atomicMax(&last, mine);
  __syncthreads();
  if (threadIdx.x == 0) {
    const int64_t n = last < 0 ? S : std::min<int64_t>(S, ((int64_t)last / kTcKeyTile + 1) * kTcKeyTile);
    live[blockIdx.x] = (int)n;
    if (rec) atomicAdd(rec, (int)n);
  }
}

// An operand in place (f32, unit stride in H) or through a contiguous scratch.
struct operand {
  bsh v;
  cu_buf buf;
};
bool in_place(const bl_tensor *t) { return t->dtype == BL_F32 && (t->shape[2] == 1 || t->stride[2] == 1); }
int op_load(const char *op, const bl_tensor *t, operand *o) {
  if (in_place(t)) {
    o->v.p = (float *)t->data;
    o->v.sb = t->stride[0];
    o->v.ss = t->stride[1];
    return 0;
  }
  BL_CHECK(cu_load(op, t, &o->buf));
  o->v.p = o->buf.p;
  o->v.ss = t->shape[2];
  o->v.sb = t->shape[1] * t->shape[2];
  return 0;
}
int op_out(const char *op, bl_tensor *t, operand *o) {
  if (in_place(t)) {
    o->v.p = (float *)t->data;
    o->v.sb = t->stride[0];
    o->v.ss = t->stride[1];
    return 0;
  }
  BL_CHECK(cu_out(op, t, &o->buf, 0));
  o->v.p = o->buf.p;
  o->v.ss = t->shape[2];
  o->v.sb = t->shape[1] * t->shape[2];
  return 0;
}

int check_bsh(const char *op, const bl_tensor *t, const char *name, const bl_tensor *q) {
  if (!t) return bl_set_error(BL_EINVAL, "%s: %s is NULL", op, name);
  BL_CHECK(bl_tensor_check(t, op));
  if (!bl_dtype_is_float(t->dtype)) return bl_set_error(BL_EINVAL, "%s: %s must be a float tensor", op, name);
  char s1[128], s2[128];
  if (t->ndim != 3)
    return bl_set_error(BL_EINVAL, "%s: %s must be [batch, seq, hidden], got %s", op, name, BL_SHAPE(t, s1));
  if (q && (t->shape[0] != q->shape[0] || t->shape[1] != q->shape[1] || t->shape[2] != q->shape[2]))
    return bl_set_error(BL_EINVAL, "%s: %s %s does not match query %s", op, name, BL_SHAPE(t, s1), BL_SHAPE(q, s2));
  return 0;
}

int check_common(const char *op, const bl_tensor *q, const bl_tensor *k, const bl_tensor *v, const bl_tensor *lse,
                 int heads, double p, attn_args *a, double scale) {
  BL_CHECK(check_bsh(op, q, "query", nullptr));
  BL_CHECK(check_bsh(op, k, "key", q));
  BL_CHECK(check_bsh(op, v, "value", q));
  if (heads < 1 || q->shape[2] % heads != 0)
    return bl_set_error(BL_EINVAL, "%s: hidden size %lld is not divisible by %d heads", op, (long long)q->shape[2],
                        heads);
  int64_t B = q->shape[0], S = q->shape[1], d = q->shape[2] / heads;
  if (d > DMAX)
    return bl_set_error(BL_EUNSUPPORTED, "%s: head size %lld > %d is not supported by the CUDA kernel", op,
                        (long long)d, DMAX);
  if (!lse) return bl_set_error(BL_EINVAL, "%s: saved (the row logsumexp) is NULL", op);
  char s1[128];
  if (lse->dtype != BL_F32 || lse->numel != B * heads * S || !cu_is_contig(lse))
    return bl_set_error(BL_EINVAL,
                        "%s: saved (the row logsumexp) must be a contiguous f32 [%lld,%d,%lld] tensor, got %s %s", op,
                        (long long)B, heads, (long long)S, bl_dtype_name(lse->dtype), BL_SHAPE(lse, s1));
  if (!(p >= 0.0 && p < 1.0)) return bl_set_error(BL_EINVAL, "%s: dropout probability %g must be in [0, 1)", op, p);
  if (B * heads > 65535)
    return bl_set_error(BL_EUNSUPPORTED, "%s: batch*heads = %lld exceeds 65535", op, (long long)(B * heads));
  memset(a, 0, sizeof *a);
  a->S = S;
  a->heads = heads;
  a->d = d;
  a->scale = (float)(scale > 0 ? scale : 1.0 / sqrt((double)d));
  a->p = (float)p;
  a->dscale = p > 0 ? (float)(1.0 / (1.0 - p)) : 1.0f;
  a->lse = (float *)lse->data;
  return 0;
}

int check_mask(const char *op, const bl_tensor *key_mask, int64_t B, int64_t S) {
  if (key_mask && (key_mask->ndim != 2 || key_mask->shape[0] != B || key_mask->shape[1] != S))
    return bl_set_error(BL_EINVAL, "%s: key_mask must be [batch, seq] = [%lld,%lld]", op, (long long)B, (long long)S);
  return 0;
}

// The additive mask (1 - m) * -10000 of the [B, S] key_mask and the keys to visit per row (mask_rows) into
// *madd, for a->madd and a->klive; *bm holds the loaded mask (both the caller's, so they live as long as the
// launches that use them).
int load_mask(const char *op, int dev, const bl_tensor *key_mask, int64_t B, int64_t S, cu_buf *bm, cu_mem *madd,
              attn_args *a) {
  BL_CHECK(cu_load(op, key_mask, bm));
  BL_CHECK(madd->alloc(op, dev, (size_t)(B * S + B) * sizeof(float)));
  a->madd = madd->as<float>();
  a->klive = (const int *)(a->madd + B * S);
  a->cost_slot = cu_cost_slot(dev);
  cu_cost_kernel(dev, "attention", "mask_rows", 8.0 * B * S + 4.0 * B);
  mask_rows<<<(unsigned)B, 256, 0, cu_stream(dev)>>>(bm->p, madd->as<float>(), (int *)a->klive, a->cost_slot, S);
  return cu_launched(op, dev);
}

// Cost of an attention kernel over B*heads (S x S) tiles: `macs` S^2*d multiply-adds on the f32 SIMT units, reading
// `nin` and writing `nout` f32 [B,S,H] operands plus `nrow` f32 values per row (lse, dsum) and the additive mask.
void attn_cost(int dev, const char *name, const attn_args &a, int64_t B, int macs, int nin, int nout, int nrow) {
  double rows = (double)B * a.heads * a.S, bsh = rows * a.d;
  double bytes = 4.0 * ((nin + nout) * bsh + nrow * rows + (a.madd ? (double)B * a.S : 0.0));
  cu_cost_kernel(dev, "attention", name, bytes, 2.0 * macs * rows * a.S * a.d, BL_ENGINE_FP32);
}

// The tensor-core kernels' arguments: the scalars and mask of the checked f32 ones, tensors in place.
tc_args tc_common(const attn_args &a, const bl_tensor *q) {
  tc_args t;
  memset(&t, 0, sizeof t);
  t.madd = a.madd;
  t.klive = a.klive;
  t.cost_slot = a.cost_slot;
  t.lse = a.lse;
  t.dsum = a.dsum;
  t.S = a.S;
  t.heads = a.heads;
  t.d = (int)a.d;
  t.dtype = q->dtype;
  t.scale = a.scale;
  t.p = a.p;
  t.dscale = a.dscale;
  t.seed = a.seed;
  t.offset = a.offset;
  return t;
}
tc_view tc_at(const bl_tensor *t) { return tc_view{ t->data, t->stride[0], t->stride[1] }; }

template <class K>
int launch(const char *op, int dev, K kernel, dim3 grid, size_t smem, const attn_args &a) {
  if (smem > 48 * 1024)
    CU_TRY(op, dev, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  kernel<<<grid, NT, smem, cu_stream(dev)>>>(a);
  return cu_launched(op, dev);
}

} // namespace

extern "C" int bl_cuda_attention_forward(const bl_attention_args *args) {
  const char *op = "attention";
  bl_tensor *ctx = args->ctx, *lse = args->saved;
  const bl_tensor *q = args->q, *k = args->k, *v = args->v, *key_mask = args->key_mask;
  const int heads = args->heads;
  const double scale = args->scale, p = args->p;
  const uint64_t seed = args->seed, offset = args->offset;
  int dev;
  const bl_tensor *ts[] = { ctx, lse, q, k, v, key_mask };
  BL_CHECK(cu_device(op, 6, ts, &dev));
  attn_args a;
  BL_CHECK(check_common(op, q, k, v, lse, heads, p, &a, scale));
  BL_CHECK(check_bsh(op, ctx, "context", q));
  int64_t B = q->shape[0], S = q->shape[1];
  BL_CHECK(check_mask(op, key_mask, B, S));
  if (B == 0 || S == 0 || a.d == 0) return 0;
  a.seed = seed;
  a.offset = offset;
  cu_buf bm;
  cu_mem madd;
  const bl_tensor *tcs[] = { q, k, v, ctx };
  if (attn_tc_eligible(dev, a.d, 4, tcs)) {
    if (key_mask) BL_CHECK(load_mask(op, dev, key_mask, B, S, &bm, &madd, &a));
    tc_args t = tc_common(a, q);
    t.q = tc_at(q);
    t.k = tc_at(k);
    t.v = tc_at(v);
    t.o = tc_at(ctx);
    return attn_tc_forward(op, dev, t, B);
  }
  operand oq, ok, ov, oc;
  BL_CHECK(op_load(op, q, &oq));
  BL_CHECK(op_load(op, k, &ok));
  BL_CHECK(op_load(op, v, &ov));
  BL_CHECK(op_out(op, ctx, &oc));
  a.q = oq.v;
  a.k = ok.v;
  a.v = ov.v;
  a.o = oc.v;
  if (key_mask) BL_CHECK(load_mask(op, dev, key_mask, B, S, &bm, &madd, &a));
  const int dp = (int)a.d + 1;
  size_t smem = (size_t)(BQ * dp + 2 * BK * dp + BQ * (BK + 1)) * sizeof(float);
  dim3 grid((unsigned)((S + BQ - 1) / BQ), (unsigned)(B * heads));
  attn_cost(dev, "attn_fwd", a, B, 2, 3, 1, 1); // S = QK^T, O = PV; q,k,v in, o and lse out
  BL_CHECK(launch(op, dev, attn_fwd, grid, smem, a));
  return cu_store(op, ctx, &oc.buf);
}

extern "C" int bl_cuda_attention_backward(bl_tensor *dq, bl_tensor *dk, bl_tensor *dv, const bl_tensor *dctx,
                                          const bl_attention_args *args) {
  const char *op = "attention_backward";
  const bl_tensor *q = args->q, *k = args->k, *v = args->v, *ctx = args->ctx, *lse = args->saved;
  const bl_tensor *key_mask = args->key_mask;
  const int heads = args->heads;
  const double scale = args->scale, p = args->p;
  const uint64_t seed = args->seed, offset = args->offset;
  int dev;
  const bl_tensor *ts[] = { dq, dk, dv, dctx, q, k, v, ctx, lse, key_mask };
  BL_CHECK(cu_device(op, 10, ts, &dev));
  attn_args a;
  BL_CHECK(check_common(op, q, k, v, lse, heads, p, &a, scale));
  BL_CHECK(check_bsh(op, dctx, "grad_context", q));
  BL_CHECK(check_bsh(op, ctx, "context", q));
  BL_CHECK(check_bsh(op, dq, "grad_query", q));
  BL_CHECK(check_bsh(op, dk, "grad_key", q));
  BL_CHECK(check_bsh(op, dv, "grad_value", q));
  int64_t B = q->shape[0], S = q->shape[1];
  if (B == 0 || S == 0 || a.d == 0) return 0;
  a.seed = seed;
  a.offset = offset;
  BL_CHECK(check_mask(op, key_mask, B, S));
  // P = exp(s + mask - lse) is recomputed tile by tile, so the backward needs
  // the same key mask as the forward (the CPU op has it baked into probs).
  cu_buf bm;
  cu_mem madd;
  if (key_mask) BL_CHECK(load_mask(op, dev, key_mask, B, S, &bm, &madd, &a));
  cu_mem dsum;
  int64_t rows = B * heads * S;
  BL_CHECK(dsum.alloc(op, dev, (size_t)rows * sizeof(float)));
  a.dsum = dsum.as<float>();
  const bl_tensor *tcs[] = { q, k, v, ctx, dctx, dq, dk, dv };
  if (attn_tc_eligible(dev, a.d, 8, tcs)) {
    tc_args t = tc_common(a, q);
    t.q = tc_at(q);
    t.k = tc_at(k);
    t.v = tc_at(v);
    t.o = tc_at(ctx);
    t.dout = tc_at(dctx);
    t.dq = tc_at(dq);
    t.dk = tc_at(dk);
    t.dv = tc_at(dv);
    cu_mem dqacc; // dQ's f32 accumulator across key tiles (per split)
    const int64_t nacc = attn_tc_scratch_dq(dev, B * heads, S, (int)a.d);
    if (nacc) BL_CHECK(dqacc.alloc(op, dev, (size_t)nacc * sizeof(float)));
    t.dqacc = dqacc.as<float>();
    return attn_tc_backward(op, dev, t, B);
  }
  operand oq, ok, ov, oo, og, odq, odk, odv;
  BL_CHECK(op_load(op, q, &oq));
  BL_CHECK(op_load(op, k, &ok));
  BL_CHECK(op_load(op, v, &ov));
  BL_CHECK(op_load(op, ctx, &oo));
  BL_CHECK(op_load(op, dctx, &og));
  BL_CHECK(op_out(op, dq, &odq));
  BL_CHECK(op_out(op, dk, &odk));
  BL_CHECK(op_out(op, dv, &odv));
  a.q = oq.v;
  a.k = ok.v;
  a.v = ov.v;
  a.o = oo.v;
  a.dout = og.v;
  a.dq = odq.v;
  a.dk = odk.v;
  a.dv = odv.v;
  cu_cost_kernel(dev, "attention", "attn_bwd_dot", 8.0 * (double)rows * a.d + 4.0 * rows);
  attn_bwd_dot<<<cu_blocks(rows * 32, 256), 256, 0, cu_stream(dev)>>>(a, rows);
  BL_CHECK(cu_launched(op, dev));
  const int dp = (int)a.d + 1;
  size_t smem_kv = (size_t)(2 * BK * dp + 2 * BQ * dp + 2 * BQ * (BK + 1) + 2 * BQ) * sizeof(float);
  size_t smem_q = (size_t)(2 * BQ * dp + 2 * BK * dp + BQ * (BK + 1)) * sizeof(float);
  // recomputed S, dV += P^T dO, dP = dO V^T, dK += dS^T Q; then recomputed S, dP, dQ = dS K: 7 S^2 d in all
  attn_cost(dev, "attn_bwd_kv", a, B, 4, 4, 2, 2);
  BL_CHECK(launch(op, dev, attn_bwd_kv, dim3((unsigned)((S + BK - 1) / BK), (unsigned)(B * heads)), smem_kv, a));
  attn_cost(dev, "attn_bwd_q", a, B, 3, 4, 1, 2);
  BL_CHECK(launch(op, dev, attn_bwd_q, dim3((unsigned)((S + BQ - 1) / BQ), (unsigned)(B * heads)), smem_q, a));
  BL_CHECK(cu_store(op, dq, &odq.buf));
  BL_CHECK(cu_store(op, dk, &odk.buf));
  return cu_store(op, dv, &odv.buf);
}
