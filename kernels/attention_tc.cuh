// Tensor-core flash attention (kernels/attention_tc.cu), called by the entry points of kernels/attention.cu after
// they validated the arguments and built the additive key mask. Internal to kernels/.
#pragma once
#include "common.cuh"

// A [B, S, H] operand of the activation dtype: element (b, s, c) at p[b*sb + s*ss + c].
struct tc_view {
  void *p;
  int64_t sb, ss;
};

// Keys per tile of the tensor-core kernels: they visit a row's keys in tiles of this many, up to klive[b].
const int kTcKeyTile = 64;

struct tc_args {
  tc_view q, k, v, o, dout, dq, dk, dv; // o = ctx
  const float *madd;                    // [B, S] additive key mask, natural units, or NULL
  const int *klive;                     // with madd: [B] keys to visit per row, whole tiles (or S); the tiles past
                                        // them are masked out (mask_rows in attention.cu) and skipped
  int *cost_slot;                       // the step-time model's count of the visited keys, or NULL
  float *lse;                           // [B*heads, S]
  float *dsum;                          // [B*heads, S] scratch (backward)
  int dsum_local;                       // backward: D computed in the kernel (set by attn_tc_backward)
  float *dqacc;                         // [splits or 1, B*heads, S, d] f32 scratch (backward)
  int64_t S, heads;
  int d, dtype; // dtype: BL_BF16 or BL_F16
  float scale, p, dscale;
  uint64_t seed, offset;
};

// Whether the tensor-core path takes these operands: bf16/f16 all alike, d in {32, 64, 128}, sm_80+, rows of
// 16-byte aligned, unit-stride columns (fused-QKV slices qualify). No error is set either way.
bool attn_tc_eligible(int dev, int64_t d, int n, const bl_tensor *const *ts);
int attn_tc_forward(const char *op, int dev, const tc_args &a, int64_t B);
// Key-tile splits of the backward for bh = B*heads heads (BL_ATTENTION_KV_SPLIT=n forces n, capped by the tiles).
int attn_tc_kv_split(int dev, int64_t bh, int64_t S);
// a.dsum and a.dqacc must be allocated by the caller: attn_tc_scratch_dq gives dqacc's f32 count (0: none).
int64_t attn_tc_scratch_dq(int dev, int64_t bh, int64_t S, int d);
int attn_tc_backward(const char *op, int dev, const tc_args &a, int64_t B);
