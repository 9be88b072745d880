/* bertlua — CUDA backend entry points (internal: not part of bertlua.h, not seen by the FFI).
 *
 * Every function here is the device twin of a CPU entry point with the same
 * name minus the `cuda_` infix (bl_layernorm_forward -> bl_cuda_layernorm_forward)
 * and the SAME signature and contract (bl_ops.h, bl_tensor.h), unless a
 * comment below says otherwise. They are implemented in kernels/<family>.cu and only
 * exist when the library is built with CUDA (BL_HAVE_CUDA), so callers wrap
 * the dispatch in #ifdef BL_HAVE_CUDA.
 *
 * What the CPU entry point has already done before dispatching: argument
 * presence, shapes, dtypes, that all tensors are on one device. The CUDA
 * functions re-check what they rely on for memory safety (device, shapes they
 * index with, contiguity) and fail with BL_EINVAL / BL_EDEVICE /
 * BL_EUNSUPPORTED and a message "op: cuda:N: ...".
 *
 * Common rules of the CUDA ops:
 *  - All work is queued on the per-device stream bl_cuda_stream(device)
 *    (a blocking stream, so legacy-stream work such as the download in
 *    bl_dev_memcpy is ordered with it; uploads and device copies are queued on
 *    it directly). Functions return once the work is queued, except those
 *    that return a host value (counts, flags, norms), which synchronise.
 *  - Math is f32 with f32 accumulation (f64 for the generic tensor ops and
 *    the loss sums). Contiguous f32 tensors are used in place, and so are
 *    contiguous bf16/f16 ones where the op has a native path (GEMMs,
 *    activations, LayerNorms, embedding/gather, cross-entropy, argmax,
 *    dropout, casts: f32 only in registers); other dtypes and strided views go
 *    through a contiguous f32 device scratch like the CPU ops (ops_internal.h),
 *    counted in bl_cuda_counters().conversions.
 *  - Reductions (dW, db, dgamma, dbeta, dtable, norms, losses) use a fixed
 *    partition and a fixed combination order: results are bitwise
 *    reproducible run to run on the same GPU and launch configuration.
 *  - Dropout masks come from the same Philox stream as the CPU (kernels/philox.cuh):
 *    identical masks on both devices for the same (seed, offset).
 *  - Index validation (embedding ids, gather positions, targets) happens on
 *    the device before any output is written and costs one synchronisation.
 */
#ifndef BL_CUDA_OPS_H
#define BL_CUDA_OPS_H
#include "bl_ops.h"
#include "bl_optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- runtime (kernels/runtime.cu) ---- */
/* The per-device stream every kernel is queued on (a cudaStream_t). NULL with
 * an error set when the device is not available. Also makes `device` current. */
void *bl_cuda_stream(int device);
/* Waits for all work queued on the device's stream; reports asynchronous
 * kernel errors as BL_EDEVICE. */
int bl_cuda_synchronize(int device);
/* Page-locked host memory for fast, asynchronous host<->device copies. */
int bl_cuda_host_alloc(size_t n, void **p);
void bl_cuda_host_free(void *p);
/* Async copy on the device stream (host memory should be pinned). */
int bl_cuda_memcpy_async(int dst_device, void *dst, int src_device, const void *src, size_t n);
/* Input pipeline (src/data/feeder.c): the device's copy stream (non-blocking,
 * ordered by events only; NULL with an error set when the device is not
 * available), events (stream NULL: the compute stream), a host wait for one
 * event (polled: not a device synchronisation), and a host-to-device copy
 * queued on a given stream. */
void *bl_cuda_copy_stream(int device);
int bl_cuda_event_new(int device, void **ev);
void bl_cuda_event_free(void *ev);
int bl_cuda_event_record(int device, void *ev, void *stream);
int bl_cuda_stream_wait_event(int device, void *stream, void *ev);
int bl_cuda_event_wait_host(int device, void *ev);
int bl_cuda_memcpy_h2d_on(int device, void *stream, void *dst, const void *src, size_t n);

/* ---- GEMM precision for f32 operands (kernels/linear.cu) ----
 * 0 = full f32 (default), 1 = TF32 tensor cores (10-bit mantissa inputs,
 * f32 accumulate; like torch.backends.cuda.matmul.allow_tf32). Global. */
void bl_cuda_set_tf32(int enable);
int bl_cuda_get_tf32(void);

/* ---- linear (kernels/linear.cu): cuBLASLt, bias epilogue; db is a deterministic column sum.
 * x, w: f32, or both f16 or both bf16 (f32 accumulate); mixed/f64 operands go
 * through an f32 scratch. y/dx may be f32 or the operands' dtype. */
int bl_cuda_linear_forward(bl_tensor *y, const bl_tensor *x, const bl_tensor *w, const bl_tensor *b);
int bl_cuda_linear_backward(bl_tensor *dx, bl_tensor *dw, bl_tensor *db, const bl_tensor *dy, const bl_tensor *x,
                            const bl_tensor *w, int accumulate);
/* Linear + bias + GELU: pre = x W^T + b (saved for backward, same shape/dtype
 * rules as y), y = gelu(pre); backward: dpre = (dh @ w2) .* gelu'(pre),
 * db += column sums of dpre (may be NULL). Shapes: dh [M, N2], w2 [N2, N],
 * pre/dpre [M, N], db [N]. tanh_form = 0: BERT's exact erf GELU (the CPU's
 * bl_gelu_forward/backward), run after the GEMM: cuBLASLt has no erf epilogue.
 * tanh_form = 1: the tanh GELU (bl_linear_gelu_tanh_*), in the GEMM's
 * GELU_AUX_BIAS / DGELU(_BGRAD) epilogue where cuBLASLt has one. */
int bl_cuda_linear_gelu_forward(bl_tensor *y, bl_tensor *pre, const bl_tensor *x, const bl_tensor *w,
                                const bl_tensor *b, int tanh_form);
int bl_cuda_linear_dgelu_backward(bl_tensor *dpre, bl_tensor *db, const bl_tensor *dh, const bl_tensor *w2,
                                  const bl_tensor *pre, int tanh_form);
/* bl_matmul twin: out[..., m, n] = a[..., m, k] @ b[..., k, n], batch dims
 * broadcast (strided-batched cuBLASLt; broadcast operands get batch stride 0). */
int bl_cuda_matmul(bl_tensor *out, const bl_tensor *a, const bl_tensor *b);

/* ---- tensor core device side (kernels/elementwise.cu): same contracts as bl_tensor.h,
 * every operand on the same cuda device. Generic path computes in double. */
/* both on one device; broadcast + dtype conversion, any strides */
int bl_cuda_tensor_copy(bl_tensor *dst, const bl_tensor *src);
int bl_cuda_tensor_fill(bl_tensor *t, double value);
int bl_cuda_binary(int op, bl_tensor *out, const bl_tensor *a, const bl_tensor *b);
int bl_cuda_binary_scalar(int op, bl_tensor *out, const bl_tensor *a, double s, int scalar_first);
int bl_cuda_unary(int op, bl_tensor *out, const bl_tensor *a);
int bl_cuda_affine(bl_tensor *out, const bl_tensor *a, double alpha, double beta);
int bl_cuda_where(bl_tensor *out, const bl_tensor *cond, const bl_tensor *a, const bl_tensor *b);
int bl_cuda_reduce(int op, bl_tensor *out, const bl_tensor *a, uint32_t dim_mask, int keepdim);
int bl_cuda_rand_uniform(bl_tensor *t, uint64_t seed, uint64_t offset, double low, double high);
int bl_cuda_rand_normal(bl_tensor *t, uint64_t seed, uint64_t offset, double mean, double std);

/* ---- ops (same contracts as bl_ops.h) ---- */
int bl_cuda_embedding_forward(bl_tensor *out, const bl_tensor *table, const bl_tensor *ids, int accumulate);
int bl_cuda_embedding_backward(bl_tensor *dtable, const bl_tensor *dout, const bl_tensor *ids);
/* Native for contiguous f32/bf16/f16 tables, y and dy of one dtype (gamma/beta that dtype or f32) and at most 4
 * token types; BL_EUNSUPPORTED with no error set otherwise (the caller composes the op from the ones above). */
int bl_cuda_embedding_layernorm_forward(const bl_embedding_layernorm_args *a);
int bl_cuda_embedding_layernorm_backward(bl_tensor *dword, bl_tensor *dposition, bl_tensor *dtoken_type,
                                         bl_tensor *dgamma, bl_tensor *dbeta, const bl_tensor *dy,
                                         const bl_embedding_layernorm_args *a);
int bl_cuda_layernorm_forward(bl_tensor *y, bl_tensor *mean, bl_tensor *rstd, const bl_tensor *x,
                              const bl_tensor *gamma, const bl_tensor *beta, double eps);
int bl_cuda_layernorm_backward(bl_tensor *dx, bl_tensor *dgamma, bl_tensor *dbeta, const bl_tensor *dy,
                               const bl_tensor *x, const bl_tensor *gamma, const bl_tensor *mean,
                               const bl_tensor *rstd);
int bl_cuda_residual_layernorm_forward(const bl_residual_layernorm_args *a);
int bl_cuda_residual_layernorm_backward(bl_tensor *dx, bl_tensor *dresidual, bl_tensor *dgamma, bl_tensor *dbeta,
                                        bl_tensor *dbias, const bl_tensor *dy, const bl_residual_layernorm_args *a);
int bl_cuda_gelu_forward(bl_tensor *y, const bl_tensor *x);
int bl_cuda_gelu_backward(bl_tensor *dx, const bl_tensor *dy, const bl_tensor *x);
int bl_cuda_bias_gelu_forward(bl_tensor *y, const bl_tensor *x, const bl_tensor *b);
int bl_cuda_bias_gelu_backward(bl_tensor *dx, bl_tensor *db, const bl_tensor *dy, const bl_tensor *x,
                               const bl_tensor *b);
int bl_cuda_gelu_tanh_forward(bl_tensor *y, const bl_tensor *x, const bl_tensor *b);
int bl_cuda_gelu_tanh_backward(bl_tensor *dx, bl_tensor *db, const bl_tensor *dy, const bl_tensor *x,
                               const bl_tensor *b);
int bl_cuda_tanh_forward(bl_tensor *y, const bl_tensor *x);
int bl_cuda_tanh_backward(bl_tensor *dx, const bl_tensor *dy, const bl_tensor *y);
int bl_cuda_dropout_forward(bl_tensor *y, bl_tensor *mask, const bl_tensor *x, double p, uint64_t seed,
                            uint64_t offset);
int bl_cuda_dropout_backward(bl_tensor *dx, const bl_tensor *dy, const bl_tensor *mask, double p, uint64_t seed,
                             uint64_t offset);
int bl_cuda_softmax_forward(bl_tensor *y, const bl_tensor *x, const bl_tensor *mask);
int bl_cuda_softmax_backward(bl_tensor *dx, const bl_tensor *dy, const bl_tensor *y);
int bl_cuda_gather_forward(bl_tensor *out, const bl_tensor *x, const bl_tensor *pos);
int bl_cuda_gather_backward(bl_tensor *dx, const bl_tensor *dout, const bl_tensor *pos);
int bl_cuda_cross_entropy(bl_tensor *loss, bl_tensor *dlogits, const bl_tensor *logits, const bl_tensor *targets,
                          int64_t ignore_index, double grad_scale, int64_t *count);
int bl_cuda_mse_loss(bl_tensor *loss, bl_tensor *dpred, const bl_tensor *pred, const bl_tensor *target,
                     double grad_scale);
int bl_cuda_argmax(bl_tensor *out, const bl_tensor *x);
int bl_cuda_accuracy(const bl_tensor *logits, const bl_tensor *targets, int64_t ignore_index, int64_t *correct,
                     int64_t *count);
/* Device outputs for a training loop that reads them when it logs: the count comes from the caller (checked
 * against the device's only when checks are not deferred); the accuracy counts are added on the device. */
int bl_cuda_cross_entropy_counted(bl_tensor *loss, bl_tensor *dlogits, const bl_tensor *logits,
                                  const bl_tensor *targets, int64_t ignore_index, double grad_scale, int64_t count);
int bl_cuda_accuracy_add(bl_tensor *acc, const bl_tensor *logits, const bl_tensor *targets, int64_t ignore_index);

/* ---- fused attention (kernels/attention.cu) — DIFFERENT saved state from the CPU op.
 * Same arguments, math and dropout element order as bl_attention_forward/backward
 * (bl_ops.h; padded layout only), flash-style: S x S scores are never written to global memory.
 * What is saved for backward is the row logsumexp, not the probabilities:
 *   saved: contiguous f32 [B, heads, S], lse[b,h,q] = log sum_k exp(score[q,k])
 *        (scores scaled and masked, before dropout).
 * The backward additionally takes the forward OUTPUT ctx [B, S, H] (the
 * module keeps it anyway as the next linear's input) to form
 * D_q = sum_c dctx[q,c] ctx[q,c] = rowsum(dP .* P), which replaces the S x S
 * probabilities, and the same key_mask as the forward (P is recomputed as
 * exp(score + mask - lse)). Head size d = H/heads must be <= 128.
 * Two implementations: bf16/f16 operands (all of one dtype, unit stride in
 * the last dim, 16-byte aligned rows) with d in {32, 64, 128} on sm_80+ run
 * the tensor-core FlashAttention-2 kernels (kernels/attention_tc.cu: operands
 * read and written in place, dQ summed in a fixed order per head); anything
 * else runs the f32 reference kernels (kernels/attention.cu: f32 operands
 * with unit stride in place, others through f32 scratch; dq by a separate
 * pass). BL_ATTENTION_F32=1 forces the reference. Both are deterministic
 * (no atomics); dq, dk, dv are overwritten. */
int bl_cuda_attention_forward(const bl_attention_args *a);
int bl_cuda_attention_backward(bl_tensor *dq, bl_tensor *dk, bl_tensor *dv, const bl_tensor *dctx,
                               const bl_attention_args *a);

/* ---- optimizers over flat f32 buffers (kernels/optim.cu): the twins of
 * bl_lamb_step, bl_adamw_step, bl_sgd_step, bl_grad_global_norm and
 * bl_unscale_check with their arguments and contract (bl_optim.h; the
 * steps' amp form included), called by those entry points after they checked
 * the config, the segment table (in bounds, disjoint), step, lr, grad_scale,
 * the amp state and that the buffers do not alias.
 * The segment table is uploaded when its layout changes, not every step, and
 * scratch is kept per device: after the first step no allocation.
 * Synchronisation: a step synchronises once when it computes the global norm
 * (no has_grad_norm), to return the non-finite error; with a norm from the
 * caller it returns as soon as its kernels are queued; an amp step never
 * does (the decision is made on the device). bl_cuda_grad_global_norm
 * and bl_cuda_unscale_check return host values and synchronise once. */
int bl_cuda_lamb_step(const bl_lamb_config *cfg, const bl_optim_args *a);
int bl_cuda_adamw_step(const bl_adamw_config *cfg, const bl_optim_args *a);
int bl_cuda_sgd_step(const bl_sgd_config *cfg, const bl_optim_args *a);
/* bl_optim_prepare on cuda:device (segments checked). */
int bl_cuda_optim_prepare(int device, const bl_optim_segments *seg);
int bl_cuda_grad_global_norm(const bl_tensor *grads, double *norm, int *nonfinite);
int bl_cuda_unscale_check(bl_tensor *grads, double inv_scale, int *found_inf);
/* Flat-buffer casts f32 <-> f16/bf16 (master weights -> half copies and back):
 * same as bl_cuda_tensor_copy for contiguous buffers of equal numel. */
int bl_cuda_cast(bl_tensor *dst, const bl_tensor *src);

#ifdef __cplusplus
}
#endif
#endif
