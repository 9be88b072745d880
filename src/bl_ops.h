/* bertlua — the BERT op library: explicit forward and backward entry points.
 *
 * General contract (every op below):
 *  - Outputs are caller-provided tensors of the documented shape; every
 *    function checks shapes, dtypes and devices and fails with a message
 *    naming the op and the shapes ("linear: input [4,7] and weight [5,6] are
 *    not compatible"), writing nothing.
 *  - Math is f32 (accumulation included). Float tensors may be stored as
 *    f32, f16, bf16 or f64: values are converted on load and on store.
 *    f32 contiguous tensors are used in place; strided views and other
 *    dtypes go through a contiguous f32 scratch copy.
 *  - Gradients of INPUTS (dx, dq, dlogits...) are OVERWRITTEN unless the
 *    function says otherwise (linear has an `accumulate` flag; gather and
 *    the scatter-type backwards accumulate). Gradients of PARAMETERS
 *    (dweight, dbias, dgamma, dbeta, dtable) ACCUMULATE (+=) so micro-batches
 *    sum into the flat gradient buffer; zero them once per step.
 *  - Outputs must not alias inputs (no in-place calls) unless stated.
 *  - Reductions over rows (dW, db, dgamma, dbeta) use a fixed partition
 *    independent of the thread count: results are bitwise reproducible.
 *  - Dropout everywhere uses the Philox stream of bl_philox4x32: element i
 *    (row-major index in the op's documented mask shape) takes block
 *    (offset + i/4), lane i%4, u = (x >> 8) * 2^-24, keep = (u >= p), kept
 *    values scaled by 1/(1-p). The same (seed, offset) gives the same mask on
 *    every device; an op consumes ceil(numel/4) counter blocks.
 *  - A seed with bit 63 set (BL_SEED_SLOT | address) is a device seed slot:
 *    a CUDA kernel reads the seed from the u64 at that device address when
 *    it runs, so a replayed CUDA graph takes each step's seed from memory
 *    the host updates (bertlua.train.pretrain_step). Seeds a user passes are
 *    below 2^63; the CPU ops refuse a slot.
 *  - Tensors on cuda:N run the CUDA twin (in kernels/, contracts in
 *    src/device/cuda_ops.h) behind the same entry point; all tensors of a
 *    call must be on one device (else an error naming both). A CPU-only
 *    build reports cuda tensors as an error.
 */
#ifndef BL_OPS_H
#define BL_OPS_H
#include "bl_tensor.h"

/* bit 63 of a dropout seed: the seed is read on the device from the address in bits 0..62 (see above) */
#define BL_SEED_SLOT 0x8000000000000000ull
/* how bl_embedding_layernorm_* name an out-of-range position / token type id and its table (both devices) */
#define BL_EMB_POSITION_NAMES   "position id", "the position table's max_position_embeddings"
#define BL_EMB_TOKEN_TYPE_NAMES "token type id", "the token type table's type_vocab_size"

#ifdef __cplusplus
extern "C" {
#endif

/* BL_CDEF_BEGIN */
/* ---- linear: y = x W^T + b.  x [..., in], W [out, in] (HF layout), b [out] or NULL,
 * y [..., out]. GEMMs are OpenBLAS sgemm on the tensors in place when each is
 * an f32 matrix with unit column stride (row stride free: x[:,0,:] works) or
 * a transposed one; otherwise a scratch copy is made.
 * Saved for backward: nothing (backward takes x and W).
 * Backward: dx = dy W (overwritten, or += when accumulate != 0; dx may be NULL),
 * dW += dy^T x (NULL to skip), db += sum_rows dy (NULL to skip). */
int bl_linear_forward(bl_tensor *y, const bl_tensor *x, const bl_tensor *w, const bl_tensor *b);
int bl_linear_backward(bl_tensor *dx, bl_tensor *dw, bl_tensor *db, const bl_tensor *dy, const bl_tensor *x,
                       const bl_tensor *w, int accumulate);

/* ---- packed linear weights (CPU inference): bl_linear_pack copies W [out, in]
 * (f32/f16/bf16/f64, any 2-D layout) once into the layout of our own GEMM's
 * kernel for the CPU path in use (src/ops/gemm.c; on the baseline path
 * nothing is copied and the ordinary GEMM runs). bl_linear_forward_packed is
 * bl_linear_forward with W given together with its pack (*pw must have been
 * packed from this w, and on the same CPU path, else an error): y = act(x W^T
 * + b), act BL_LINEAR_NONE or BL_LINEAR_GELU (exact erf GELU, as
 * bl_bias_gelu_forward), bias and GELU applied in the GEMM's epilogue. With a
 * bf16 pack, a bf16 x or y with unit column stride is read / written in
 * place (y rounded to nearest even: a bf16 y fed to the next bf16 GEMM gives
 * the bits an f32 y would); any other x or y is converted. The
 * pack is a snapshot: pack again after changing W. Forward only (no backward:
 * training runs the ordinary GEMM). Free with bl_linear_pack_free. A separate
 * entry, not an option: it takes a different operand (the pack) and an epilogue. */
typedef struct bl_packed_weight bl_packed_weight;
enum { BL_LINEAR_NONE = 0, BL_LINEAR_GELU = 1 };
int bl_linear_pack(bl_packed_weight **out, const bl_tensor *w);
/* bl_linear_pack in a precision: BL_PACK_F32 (as bl_linear_pack), BL_PACK_BF16
 * (W and, per call, x rounded to bf16, products summed in f32: needs
 * AVX512-BF16, bl_cpu_has("avx512_bf16")), BL_PACK_INT8 (dynamic int8: W
 * symmetric per output channel, x asymmetric uint8 per row per call, exact
 * int32 sums, dequantized in the epilogue: needs the avx2 or avx512 path;
 * VNNI where bl_cpu_has("avx512_vnni")). Contract in src/ops/gemm_lowp.h. An
 * error (BL_EUNSUPPORTED) where the CPU lacks the instructions. */
enum { BL_PACK_F32 = 0, BL_PACK_BF16 = 1, BL_PACK_INT8 = 2 };
int bl_linear_pack_as(bl_packed_weight **out, const bl_tensor *w, int precision);
void bl_linear_pack_free(bl_packed_weight *pw);
int bl_linear_forward_packed(bl_tensor *y, const bl_tensor *x, const bl_tensor *w, const bl_packed_weight *pw,
                             const bl_tensor *b, int act);

/* ---- embedding: out[i, :] (+)= table[ids[i], :].  ids [...] i32/i64, table [V, H],
 * out [..., H]. accumulate != 0 adds into out (word + position + type sums
 * without temporaries). Every id is checked (0 <= id < V) before anything is written.
 * Backward: dtable[ids[i], :] += dout[i, :] in index order (deterministic). */
int bl_embedding_forward(bl_tensor *out, const bl_tensor *table, const bl_tensor *ids, int accumulate);
int bl_embedding_backward(bl_tensor *dtable, const bl_tensor *dout, const bl_tensor *ids);

/* ---- BERT's embedding block as one op: y = dropout_p(LN(s)) with
 * s[i, :] = word[ids[i], :] + position[pos_ids[i], :] + token_type[type_ids[i], :]
 * summed in f32 in that order (not rounded to y's dtype). ids, pos_ids, type_ids [...]
 * i32/i64 of n elements each (all checked as in bl_embedding_forward); the three
 * tables [*, H] of one float dtype; y [..., H] with n rows. Dropout as
 * bl_dropout_forward on y's shape at (seed, offset). Same values as
 * bl_embedding_forward x3 into an f32 sum, bl_layernorm_forward,
 * bl_dropout_forward. One argument struct for forward and backward (fields
 * left 0 / NULL take the default named beside them).
 * Backward recomputes s from the tables (nothing else saved) and accumulates
 * dword, dposition, dtoken_type (deterministic, as bl_embedding_backward),
 * dgamma, dbeta (+=; any of the five may be NULL). */
typedef struct bl_embedding_layernorm_args {
  const bl_tensor *word, *position, *token_type; /* the tables [*, H] */
  const bl_tensor *ids, *pos_ids, *type_ids;     /* [...] i32/i64, n elements each */
  const bl_tensor *gamma, *beta;                 /* [H]; beta NULL = 0 */
  bl_tensor *y;                                  /* [..., H]: forward's output (backward does not read it) */
  bl_tensor *mean, *rstd;                        /* [n] f32: written by forward, read by backward */
  double eps;                                    /* forward: > 0 (BERT: 1e-12) */
  double p;                                      /* dropout probability; 0 = none */
  uint64_t seed, offset;
} bl_embedding_layernorm_args;
int bl_embedding_layernorm_forward(const bl_embedding_layernorm_args *a);
int bl_embedding_layernorm_backward(bl_tensor *dword, bl_tensor *dposition, bl_tensor *dtoken_type, bl_tensor *dgamma,
                                    bl_tensor *dbeta, const bl_tensor *dy, const bl_embedding_layernorm_args *a);

/* ---- layernorm over the last dim: y = (x - mean) * rstd * gamma + beta,
 * x/y [..., H], gamma/beta [H], mean/rstd [rows] f32 (rows = numel/H) saved
 * for backward (plus x itself). rstd = 1/sqrt(var + eps), biased variance.
 * Backward: dx overwritten, dgamma += , dbeta += (either may be NULL). */
int bl_layernorm_forward(bl_tensor *y, bl_tensor *mean, bl_tensor *rstd, const bl_tensor *x, const bl_tensor *gamma,
                         const bl_tensor *beta, double eps);
int bl_layernorm_backward(bl_tensor *dx, bl_tensor *dgamma, bl_tensor *dbeta, const bl_tensor *dy, const bl_tensor *x,
                          const bl_tensor *gamma, const bl_tensor *mean, const bl_tensor *rstd);

/* ---- fused dropout + residual + layernorm (BERT's SelfOutput/Output tail):
 * y = LN(dropout_p(x) + residual), one argument struct for forward and
 * backward (fields left 0 / NULL take the default named beside them).
 * The dropout mask (shape of x) is regenerated in backward from (seed,
 * offset), so nothing but mean/rstd is stored.
 * Backward: dx overwritten (= dsum * mask / (1-p)), dresidual overwritten
 * (= dsum; may be NULL, and equals dx when p = 0), dgamma/dbeta += (may be
 * NULL), dbias += the column sums of dx (may be NULL): the bias gradient of
 * the linear layer whose output x is, in the same pass. It recomputes the
 * normalised sum from x and residual, or, when y is given, takes it back as
 * xhat = (y - beta) / gamma, one [rows, H] read fewer (y is kept anyway: it is
 * the next sublayer's input). That is done only when every column j has
 * |gamma_j| >= 2^-60 and |beta_j| <= 4 |gamma_j| (else x and residual are
 * read, so both stay required); the rounding of a stored y (unit roundoff u
 * of its dtype: 2^-24 f32, 2^-8 bf16, 2^-11 f16) moves xhat by at most
 * u (|xhat| + 4): dx, dresidual and dgamma may differ from the x path by that
 * much relative to their xhat term.
 * Packed tokens (offsets != NULL, CPU only, for unpadded training): x,
 * residual, y [1, T, H] (or [T, H]) hold the real tokens of B rows back to
 * back, offsets [B+1] delimit them (as bl_attention_args), seq is the padded
 * length they come from. Token t of row b (its position s = t - offsets[b];
 * each row's real tokens its first ones) draws its dropout from row b*seq + s
 * of the padded op's mask, so a packed run drops what the padded run drops at
 * the real positions. */
typedef struct bl_residual_layernorm_args {
  const bl_tensor *x, *residual; /* [..., H] */
  const bl_tensor *gamma, *beta; /* [H]; beta NULL = 0 */
  bl_tensor *y;                  /* [..., H]: forward's output; backward: NULL, or y to take xhat from */
  bl_tensor *mean, *rstd;        /* [rows] f32: written by forward, read by backward */
  const bl_tensor *offsets;      /* NULL = padded rows; else packed tokens (see above) */
  int64_t seq;                   /* packed: the padded length */
  double eps;                    /* forward: > 0 (BERT: 1e-12) */
  double p;                      /* dropout probability; 0 = none */
  uint64_t seed, offset;
} bl_residual_layernorm_args;
int bl_residual_layernorm_forward(const bl_residual_layernorm_args *a);
int bl_residual_layernorm_backward(bl_tensor *dx, bl_tensor *dresidual, bl_tensor *dgamma, bl_tensor *dbeta,
                                   bl_tensor *dbias, const bl_tensor *dy, const bl_residual_layernorm_args *a);

/* ---- GELU (exact erf form): y = 0.5 x (1 + erf(x / sqrt 2)).
 * bias_gelu: y = gelu(x + b), b [H] over the last dim; backward recomputes the
 * pre-activation from x and b (saved: x only), dx overwritten, db += (may be NULL). */
int bl_gelu_forward(bl_tensor *y, const bl_tensor *x);
int bl_gelu_backward(bl_tensor *dx, const bl_tensor *dy, const bl_tensor *x);
int bl_bias_gelu_forward(bl_tensor *y, const bl_tensor *x, const bl_tensor *b);
int bl_bias_gelu_backward(bl_tensor *dx, bl_tensor *db, const bl_tensor *dy, const bl_tensor *x, const bl_tensor *b);

/* ---- tanh-approximated GELU (HF "gelu_new" / "gelu_pytorch_tanh"), one fused op:
 * y = 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))), v = x + b (b [H] over the last dim, may be NULL);
 * backward recomputes v from x and b, dx overwritten, db += (may be NULL; needs b). */
int bl_gelu_tanh_forward(bl_tensor *y, const bl_tensor *x, const bl_tensor *b);
int bl_gelu_tanh_backward(bl_tensor *dx, bl_tensor *db, const bl_tensor *dy, const bl_tensor *x, const bl_tensor *b);

/* ---- linear + bias + tanh GELU (gelu_new) with the pre-activation kept, and the backward of FC2(gelu(FC1 x))
 * through it. On CUDA each is one cuBLASLt GEMM (GELU_AUX_BIAS; DGELU_BGRAD) where cuBLASLt has the epilogue,
 * else the GEMM and the activation kernel; on the CPU bl_linear_forward + bl_gelu_tanh_forward and back.
 * forward: pre = x W^T + b (b required), y = gelu_tanh(pre); y and pre [..., out] of one dtype.
 * backward: dpre = (dy2 W2) .* gelu_tanh'(pre) (overwritten), dy2 [..., n2] the gradient of FC2's output, W2
 * [n2, out] FC2's weight, pre/dpre [..., out]; db += the column sums of dpre (FC1's bias gradient; may be NULL). */
int bl_linear_gelu_tanh_forward(bl_tensor *y, bl_tensor *pre, const bl_tensor *x, const bl_tensor *w,
                                const bl_tensor *b);
int bl_linear_dgelu_tanh_backward(bl_tensor *dpre, bl_tensor *db, const bl_tensor *dy2, const bl_tensor *w2,
                                  const bl_tensor *pre);

/* ---- tanh (BERT pooler): backward uses the saved OUTPUT y: dx = dy (1 - y^2). */
int bl_tanh_forward(bl_tensor *y, const bl_tensor *x);
int bl_tanh_backward(bl_tensor *dx, const bl_tensor *dy, const bl_tensor *y);

/* ---- dropout: y = x * keep / (1-p); element i of the row-major order uses the
 * Philox stream at (seed, offset) (see above). mask: optional u8 output of
 * x's shape (1 = kept). Backward: dx = dy * keep / (1-p) with keep read from
 * mask when non-NULL, else regenerated from (seed, offset). */
int bl_dropout_forward(bl_tensor *y, bl_tensor *mask, const bl_tensor *x, double p, uint64_t seed, uint64_t offset);
int bl_dropout_backward(bl_tensor *dx, const bl_tensor *dy, const bl_tensor *mask, double p, uint64_t seed,
                        uint64_t offset);

/* ---- softmax over the last dim: y = softmax(x + mask), mask optional (NULL)
 * and additive, broadcast to x's shape (e.g. BERT's extended mask [B,1,1,S]
 * holding (1 - m) * -10000). Saved: y. Backward: dx = y (dy - sum(dy y)). */
int bl_softmax_forward(bl_tensor *y, const bl_tensor *x, const bl_tensor *mask);
int bl_softmax_backward(bl_tensor *dx, const bl_tensor *dy, const bl_tensor *y);

/* ---- fused scaled dot-product self-attention, layout [B, S, H] with H = heads*d
 * (what the Q/K/V linears produce, so no permute copies; Q/K/V may be strided
 * views such as column slices of one fused [B,S,3H] QKV output as long as the
 * last dim has unit stride; on the CPU a bf16 ctx with unit stride in H is
 * written in place, each head's f32 rows rounded to nearest even). Per batch b
 * and head h:
 *   scores = Q_bh K_bh^T * scale + (1 - key_mask[b, :]) * -10000
 *   P = softmax(scores); ctx_bh = dropout_p(P) V_bh
 * The dropout mask has shape [B, heads, S, S]; each row starts a Philox call:
 * element (q, k) of head bh = b*heads + h is element ((bh*S + q)*S4 + k) of
 * the stream, S4 = 4*ceil(S/4), so a call's four outputs are four adjacent
 * keys of one row (B*heads*S*S4 elements drawn).
 * One argument struct serves forward and backward (fill it once, pass it to
 * both; fields left 0 / NULL take the default named beside them).
 * What forward saves for backward depends on the device: the CPU keeps the
 * probabilities [B, heads, S, S] f32 (softmax before dropout: 24 MiB for B=8,
 * 12 heads, S=256, instead of a second Q K^T GEMM in backward); the CUDA
 * kernel (flash-style, S x S never in memory) keeps the row logsumexp
 * [B, heads, S] of the scaled, masked scores and recomputes P in backward
 * from ctx and key_mask. bl_attention_saved_shape(device, B, S, heads,
 * shape[4]) returns the ndim of `saved` (4 on the CPU, 3 on cuda:N) and fills
 * shape; `saved` is a contiguous f32 tensor. The dropout mask is regenerated.
 * Packed sequences (offsets != NULL, CPU only, for unpadded batches): q, k, v
 * and ctx [1, T, H] hold the real tokens of B sequences back to back, offsets
 * [B+1] i32/i64 (0 first, non-decreasing, T last) delimit them, and each
 * token attends to its own sequence only (no key_mask): equal to the padded op
 * at the real positions up to summation order. saved NULL is inference (p = 0,
 * nothing saved); for training saved is a contiguous f32 tensor of heads *
 * sum_b n_b^2 elements (sequence b's [heads, n_b, n_b] back to back) and seq
 * is the padded length S the tokens come from: element (i, j) of sequence b,
 * head h is element ((bh*S + i)*S4 + j) of the stream, so with each row's real
 * tokens its first n_b the packed run drops exactly the padded run's entries.
 * Sequences of length 0 write nothing.
 * Backward: dq, dk, dv (shape of q) overwritten. */
typedef struct bl_attention_args {
  const bl_tensor *q, *k, *v; /* [B, S, H] (packed: [1, T, H]) */
  const bl_tensor *key_mask;  /* [B, S], 1 = keep, 0 = padding, any dtype; NULL = all keep */
  const bl_tensor *offsets;   /* NULL = the padded layout; else [B+1] packed sequences (see above) */
  bl_tensor *ctx;             /* [B, S, H] written by forward; read by backward on cuda */
  bl_tensor *saved;           /* written by forward, read by backward (see above) */
  int64_t seq;                /* packed training: the padded length S */
  int32_t heads;
  int32_t pad_;
  double scale; /* <= 0: 1/sqrt(d) */
  double p;     /* dropout probability; 0 = none */
  uint64_t seed, offset;
} bl_attention_args;
int bl_attention_saved_shape(int device, int64_t batch, int64_t seq, int heads, int64_t *shape);
int bl_attention_forward(const bl_attention_args *a);
int bl_attention_backward(bl_tensor *dq, bl_tensor *dk, bl_tensor *dv, const bl_tensor *dctx,
                          const bl_attention_args *a);

/* ---- gather rows at flat positions: out[j, :] = x[pos[j], :], x viewed as
 * [rows, H] (e.g. [B, S, H] with pos = b*S + s of each masked token), pos [M]
 * i32/i64, out [M, H]. Positions are range-checked before writing.
 * Backward ACCUMULATES: dx[pos[j], :] += dout[j, :] (deterministic order). */
int bl_gather_forward(bl_tensor *out, const bl_tensor *x, const bl_tensor *pos);
int bl_gather_backward(bl_tensor *dx, const bl_tensor *dout, const bl_tensor *pos);

/* ---- cross-entropy over the last dim with an ignored target value:
 * logits [N, C] (or [..., C]), targets [N] i32/i64. Targets equal to
 * ignore_index are skipped (BERT MLM uses -1 in NVIDIA's data, -100 in HF's;
 * SQuAD clamps to S and ignores S); other targets outside [0, C) are an error.
 * loss (f32/f64, numel 1) = mean over counted targets of logsumexp - logit[t]
 * (0 when none counts). dlogits (optional, overwritten, logits' shape) =
 * (softmax - onehot) * grad_scale / count, zero rows for ignored targets.
 * count (optional) receives the number of counted targets. */
int bl_cross_entropy(bl_tensor *loss, bl_tensor *dlogits, const bl_tensor *logits, const bl_tensor *targets,
                     int64_t ignore_index, double grad_scale, int64_t *count);
/* The same with the number of counted targets given by the caller (e.g. counted on the host where the batch was
 * made), so a GPU need not send it back: no host wait when deferred checks are on (bl_cuda_defer_checks; the
 * targets are then checked late too). Without them, and on the CPU, a different count is an error. count < 0: not
 * known to the caller; with deferred checks the GPU counts the targets itself and its kernels read that count
 * (nothing read back, and a replayed CUDA graph counts its new targets), otherwise as bl_cross_entropy. */
int bl_cross_entropy_counted(bl_tensor *loss, bl_tensor *dlogits, const bl_tensor *logits, const bl_tensor *targets,
                             int64_t ignore_index, double grad_scale, int64_t count);
/* bl_cross_entropy_counted and bl_accuracy_add(acc, logits, targets, ignore_index) in one call: acc (i64 [2],
 * contiguous, on the logits' device) += {correct, count}. On the CPU both come from one pass over the logits (the
 * row max the loss takes decides the argmax too); on a GPU the two ops run in turn. */
int bl_cross_entropy_accuracy(bl_tensor *loss, bl_tensor *dlogits, bl_tensor *acc, const bl_tensor *logits,
                              const bl_tensor *targets, int64_t ignore_index, double grad_scale, int64_t count);
/* ---- mean squared error (STS-B regression): pred and target of equal numel
 * (pred [N] or [N,1]); loss = mean (pred - target)^2; dpred (optional,
 * overwritten) = 2 (pred - target) * grad_scale / N. */
int bl_mse_loss(bl_tensor *loss, bl_tensor *dpred, const bl_tensor *pred, const bl_tensor *target, double grad_scale);

/* ---- argmax over the last dim: x [..., C] float, out [...] i64 or i32 (first max wins).
 * accuracy: counts rows of logits [N, C] whose argmax equals targets [N]
 * (targets equal to ignore_index are not counted). */
int bl_argmax(bl_tensor *out, const bl_tensor *x);
int bl_accuracy(const bl_tensor *logits, const bl_tensor *targets, int64_t ignore_index, int64_t *correct,
                int64_t *count);
/* acc (i64 [2], contiguous, on the logits' device) += {correct, count}: accuracy counted where the logits are,
 * read by the caller when it needs the numbers (no host wait per call on a GPU). */
int bl_accuracy_add(bl_tensor *acc, const bl_tensor *logits, const bl_tensor *targets, int64_t ignore_index);
/* BL_CDEF_END */

#ifdef __cplusplus
}
#endif
#endif
