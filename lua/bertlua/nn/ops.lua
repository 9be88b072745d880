-- bertlua.nn.ops: thin Lua wrappers over the C op library (src/bl_ops.h).
--
-- Each forward allocates its outputs (or writes into `out` when given, so
-- modules can reuse buffers) and returns them; each backward returns the
-- input gradients. Parameter gradients are passed in by the caller and
-- ACCUMULATE (+=), like the C API: zero them once per optimizer step.
-- Shapes follow PyTorch / Hugging Face: linear weights are [out, in],
-- attention works on [B, S, H] with a head count, masks are 1 = keep.
-- Dropout takes (p, seed, offset) — draw `offset` from a bertlua Generator
-- (`g:advance(numel)`) so forward and backward see the same mask.
local core = require "bertlua.core"
local bl = require "bertlua.tensor"
local C, ffi, check = core.C, core.ffi, core.check

local M = {}
local i64box = ffi.typeof("int64_t[1]")

local function shape_with_last(t, last)
  local s = t:shape()
  s[#s] = last
  return s
end

local function f32_like(t) return bl.empty(t:shape(), { dtype = "f32", device = t:device() }) end
local function like(t) return bl.empty(t:shape(), { dtype = t:dtype(), device = t:device() }) end
local function rows(t) return t:numel() / t:size(-1) end

-- linear -------------------------------------------------------------------
-- y = act(x W^T + b); x [..., in], w [out, in], b [out] or nil. packed (from
-- pack_weight(w), CPU inference) runs our own GEMM on the pack, with the bias
-- and act (nil or "gelu", only with packed) in its epilogue.
local ACT = { gelu = C.BL_LINEAR_GELU }
function M.linear(x, w, b, out, packed, act)
  out = out or bl.empty(shape_with_last(x, w:size(1)), { dtype = x:dtype(), device = x:device() })
  if packed then
    local a = act and ACT[act]
    if act and not a then error("linear: unknown activation '" .. tostring(act) .. "' (gelu)", 2) end
    check(C.bl_linear_forward_packed(out, x, w, packed, b, a or C.BL_LINEAR_NONE))
  elseif act then
    error("linear: an activation needs a packed weight (pack_weight)", 2)
  else
    check(C.bl_linear_forward(out, x, w, b))
  end
  return out
end
-- w [out, in] on the CPU packed once for the GEMM of the CPU path in use (a
-- snapshot: pack again after changing w); freed by the garbage collector.
-- precision: "fp32" (default), "bf16" (x and w rounded to bf16, f32 sums:
-- needs AVX512-BF16) or "int8" (dynamic: w per output channel, x per row;
-- needs the avx2 path or better); src/ops/gemm_lowp.h has the contracts.
local packbox = ffi.typeof("bl_packed_weight*[1]")
local PACK = { fp32 = C.BL_PACK_F32, bf16 = C.BL_PACK_BF16, int8 = C.BL_PACK_INT8 }
function M.pack_weight(w, precision)
  local p = PACK[precision or "fp32"]
  if not p then error("pack_weight: unknown precision '" .. tostring(precision) .. "' (fp32, bf16 or int8)", 2) end
  local box = packbox()
  check(C.bl_linear_pack_as(box, w, p))
  return ffi.gc(box[0], C.bl_linear_pack_free)
end

-- Returns dx (nil when opts.dx == false). opts: dw, db (tensors, +=),
-- dx (a tensor to write into), accumulate (add into opts.dx).
function M.linear_backward(dy, x, w, opts)
  opts = opts or {}
  local dx = opts.dx
  if dx == nil or dx == true then dx = like(x) elseif dx == false then dx = nil end
  check(C.bl_linear_backward(dx, opts.dw, opts.db, dy, x, w, opts.accumulate and 1 or 0))
  return dx
end
-- linear + bias + tanh GELU (gelu_new): y = gelu_tanh(x W^T + b), the pre-activation written to pre (kept for the
-- backward). On CUDA one GEMM (cuBLASLt's GELU_AUX_BIAS epilogue) where cuBLASLt has it.
function M.linear_gelu_tanh(x, w, b, out, pre)
  out = out or bl.empty(shape_with_last(x, w:size(1)), { dtype = x:dtype(), device = x:device() })
  pre = pre or like(out)
  check(C.bl_linear_gelu_tanh_forward(out, pre, x, w, b))
  return out, pre
end
-- backward of FC2(gelu_tanh(pre)) down to pre: dpre = (dy2 W2) .* gelu_tanh'(pre), dy2 the gradient of FC2's
-- output, w2 FC2's weight; db (FC1's bias gradient) += the column sums of dpre when given. On CUDA FC2's dX GEMM
-- with the DGELU_BGRAD epilogue.
function M.linear_dgelu_tanh_backward(dy2, w2, pre, db, dpre)
  dpre = dpre or like(pre)
  check(C.bl_linear_dgelu_tanh_backward(dpre, db, dy2, w2, pre))
  return dpre
end

-- embedding / gather ---------------------------------------------------------
-- out[..., :] = table[ids[...], :]; accumulate adds into `out` (embedding sums).
function M.embedding(tbl, ids, out, accumulate)
  if not out then
    local s = ids:shape()
    s[#s + 1] = tbl:size(2)
    out = bl.empty(s, { dtype = tbl:dtype(), device = tbl:device() })
  end
  check(C.bl_embedding_forward(out, tbl, ids, accumulate and 1 or 0))
  return out
end
function M.embedding_backward(dtable, dout, ids)
  check(C.bl_embedding_backward(dtable, dout, ids))
  return dtable
end

-- BERT's embedding block in one op: y = dropout_p(LN(word[ids] + position[pos_ids] + token_type[type_ids])).
-- t = {word, position, token_type} tables, ids = {ids, pos_ids, type_ids}; opts: eps (1e-12), p (0), seed, offset,
-- out, mean, rstd (buffers). Returns y, mean, rstd.
local eln_args = ffi.typeof("bl_embedding_layernorm_args")
function M.embedding_layernorm(t, ids, gamma, beta, opts)
  opts = opts or {}
  local shape = ids[1]:shape()
  shape[#shape + 1] = t[1]:size(2)
  local out = opts.out or bl.empty(shape, { dtype = t[1]:dtype(), device = t[1]:device() })
  local n = ids[1]:numel()
  local mean, rstd = opts.mean or bl.empty({ n }, { device = out:device() }),
    opts.rstd or bl.empty({ n }, { device = out:device() })
  check(C.bl_embedding_layernorm_forward(eln_args({ word = t[1], position = t[2], token_type = t[3], ids = ids[1],
    pos_ids = ids[2], type_ids = ids[3], gamma = gamma, beta = beta, y = out, mean = mean, rstd = rstd,
    eps = opts.eps or 1e-12, p = opts.p or 0, seed = opts.seed or 0, offset = opts.offset or 0 })))
  return out, mean, rstd
end
-- Accumulates the gradients in `grads` = {word, position, token_type, gamma, beta} (any may be nil);
-- opts: p, seed, offset (as in forward).
function M.embedding_layernorm_backward(dy, t, ids, gamma, mean, rstd, grads, opts)
  opts = opts or {}
  check(C.bl_embedding_layernorm_backward(grads[1], grads[2], grads[3], grads[4], grads[5], dy,
    eln_args({ word = t[1], position = t[2], token_type = t[3], ids = ids[1], pos_ids = ids[2], type_ids = ids[3],
      gamma = gamma, mean = mean, rstd = rstd, p = opts.p or 0, seed = opts.seed or 0, offset = opts.offset or 0 })))
end

-- out[j, :] = x viewed as [rows, H] at flat row pos[j] (0-based, as stored in data files).
function M.gather(x, pos, out)
  out = out or bl.empty({ pos:numel(), x:size(-1) }, { dtype = x:dtype(), device = x:device() })
  check(C.bl_gather_forward(out, x, pos))
  return out
end
-- dx[pos[j], :] += dout[j, :] (accumulates: zero dx first).
function M.gather_backward(dx, dout, pos)
  check(C.bl_gather_backward(dx, dout, pos))
  return dx
end

-- layernorm ------------------------------------------------------------------
-- Returns y, mean, rstd (mean/rstd [rows] f32 are what backward needs; pass them to reuse buffers).
function M.layernorm(x, gamma, beta, eps, out, mean, rstd)
  out = out or like(x)
  local n = rows(x)
  mean, rstd = mean or bl.empty({ n }, { device = x:device() }), rstd or bl.empty({ n }, { device = x:device() })
  check(C.bl_layernorm_forward(out, mean, rstd, x, gamma, beta, eps or 1e-12))
  return out, mean, rstd
end
function M.layernorm_backward(dy, x, gamma, mean, rstd, dgamma, dbeta, dx)
  dx = dx or like(x)
  check(C.bl_layernorm_backward(dx, dgamma, dbeta, dy, x, gamma, mean, rstd))
  return dx
end

-- y = LN(dropout_p(x) + residual); opts: eps (1e-12), p (0), seed, offset, out, mean, rstd (buffers), packed (x holds
-- packed tokens: a table with offsets [B+1] and S, the padded length, as BertModel's unpadded training plan).
local rln_args = ffi.typeof("bl_residual_layernorm_args")
function M.residual_layernorm(x, residual, gamma, beta, opts)
  opts = opts or {}
  local out = opts.out or like(x)
  local n = rows(x)
  local mean, rstd = opts.mean or bl.empty({ n }, { device = x:device() }),
    opts.rstd or bl.empty({ n }, { device = x:device() })
  local pk = opts.packed  -- packed tokens: dropout drawn from each token's row of the padded batch (pk.offsets, pk.S)
  check(C.bl_residual_layernorm_forward(rln_args({ x = x, residual = residual, gamma = gamma, beta = beta, y = out,
    mean = mean, rstd = rstd, offsets = pk and pk.offsets, seq = pk and pk.S or 0, eps = opts.eps or 1e-12,
    p = opts.p or 0, seed = opts.seed or 0, offset = opts.offset or 0 })))
  return out, mean, rstd
end
-- Returns dx, dresidual. opts: dgamma, dbeta (+=), dbias (+= the column sums of dx: the bias gradient of the linear
-- layer that produced x, in the same pass), p, seed, offset, packed (as in forward), dx, dres (buffers), y and beta
-- (the forward's output and beta: the normalised sum is taken back from y, one read fewer, where gamma allows it;
-- see bl_residual_layernorm_backward; the packed op reads x and residual).
function M.residual_layernorm_backward(dy, x, residual, gamma, mean, rstd, opts)
  opts = opts or {}
  local dx, dres = opts.dx or like(x), opts.dres or like(x)
  local pk = opts.packed
  check(C.bl_residual_layernorm_backward(dx, dres, opts.dgamma, opts.dbeta, opts.dbias, dy, rln_args({ x = x,
    residual = residual, gamma = gamma, beta = not pk and opts.beta or nil, y = not pk and opts.y or nil, mean = mean,
    rstd = rstd, offsets = pk and pk.offsets, seq = pk and pk.S or 0, p = opts.p or 0, seed = opts.seed or 0,
    offset = opts.offset or 0 })))
  return dx, dres
end

-- activations ------------------------------------------------------------------
function M.gelu(x, out) out = out or like(x); check(C.bl_gelu_forward(out, x)); return out end
function M.gelu_backward(dy, x, dx) dx = dx or like(x); check(C.bl_gelu_backward(dx, dy, x)); return dx end
-- gelu(x + b): pass the linear output without bias; db accumulates when given.
function M.bias_gelu(x, b, out) out = out or like(x); check(C.bl_bias_gelu_forward(out, x, b)); return out end
-- dx (allocated when not given) of a bias activation's backward fn(dx, db, dy, x, b)
local function act_backward(fn, dy, x, b, db, dx)
  dx = dx or like(x)
  check(fn(dx, db, dy, x, b))
  return dx
end
function M.bias_gelu_backward(dy, x, b, db, dx) return act_backward(C.bl_bias_gelu_backward, dy, x, b, db, dx) end
-- tanh-approximated GELU (gelu_new) of x + b in one pass (b optional); backward: db accumulates when given.
function M.gelu_tanh(x, b, out) out = out or like(x); check(C.bl_gelu_tanh_forward(out, x, b)); return out end
function M.gelu_tanh_backward(dy, x, b, db, dx) return act_backward(C.bl_gelu_tanh_backward, dy, x, b, db, dx) end
function M.tanh(x, out) out = out or like(x); check(C.bl_tanh_forward(out, x)); return out end
-- tanh backward from the forward OUTPUT y.
function M.tanh_backward(dy, y, dx) dx = dx or like(y); check(C.bl_tanh_backward(dx, dy, y)); return dx end

-- dropout ------------------------------------------------------------------------
-- Returns y (written into out when given) and, when want_mask, the u8 keep mask.
function M.dropout(x, p, seed, offset, want_mask, out)
  out = out or like(x)
  local mask = want_mask and bl.empty(x:shape(), { dtype = "u8", device = x:device() }) or nil
  check(C.bl_dropout_forward(out, mask, x, p, seed or 0, offset or 0))
  return out, mask
end
-- seed_slot(t, i) -> a seed (uint64 cdata) that names element i (1-based) of t, a contiguous i64 tensor on a GPU: the
-- CUDA kernels read the seed from there when they run (BL_SEED_SLOT in bl_ops.h), so a replayed CUDA graph takes
-- the value the host last copied into t. The CPU ops refuse such a seed.
local SEED_SLOT = 0x8000000000000000ULL
function M.seed_slot(t, i)
  if t.device_ < 0 or t:dtype() ~= "i64" or not t:is_contiguous() or i < 1 or i > t:numel() then
    error(("seed_slot: needs a contiguous i64 tensor on a GPU and an element 1..%d, got %s %s on %s, element %s")
      :format(t:numel(), t:dtype(), bl.shape_str(t:shape()), t:device(), tostring(i)), 2)
  end
  return SEED_SLOT + ffi.cast("uint64_t", ffi.cast("uintptr_t", t.data_)) + 8 * (i - 1)
end
-- Mask from `mask` when given, else regenerated from (seed, offset).
function M.dropout_backward(dy, p, seed, offset, mask, dx)
  dx = dx or like(dy)
  check(C.bl_dropout_backward(dx, dy, mask, p, seed or 0, offset or 0))
  return dx
end

-- softmax ------------------------------------------------------------------------
-- softmax(x + mask) over the last dim; mask additive and broadcast (or nil).
function M.softmax(x, mask, out) out = out or like(x); check(C.bl_softmax_forward(out, x, mask)); return out end
function M.softmax_backward(dy, y, dx) dx = dx or like(y); check(C.bl_softmax_backward(dx, dy, y)); return dx end

-- attention ------------------------------------------------------------------------
-- q, k, v [B, S, H] (column slices of a fused QKV output are fine), key_mask
-- [B, S] 1 = keep (or nil). opts: p, seed, offset, scale (default 1/sqrt(d)),
-- out, probs (reusable buffers). Returns ctx [B, S, H] and what backward
-- needs: on the CPU the probabilities [B, heads, S, S], on a GPU the row
-- logsumexp [B, heads, S] (bl_attention_forward in bl_ops.h).
local i64x4 = ffi.typeof("int64_t[4]")
local attn_args = ffi.typeof("bl_attention_args")
-- shape of what attention saves for backward on `device` (-1 or nil = CPU, N = cuda:N) for [B, S] and heads
function M.attention_saved_shape(device, B, S, heads)
  local sh = i64x4()
  local nd = C.bl_attention_saved_shape(device or -1, B, S, heads, sh)
  local shape = {}
  for i = 1, nd do shape[i] = tonumber(sh[i - 1]) end
  return shape
end
-- the bl_attention_args of a call (ctx, saved: the forward's output and saved state)
local function attention_args(q, k, v, key_mask, offsets, heads, ctx, saved, opts)
  return attn_args({ q = q, k = k, v = v, key_mask = key_mask, offsets = offsets, ctx = ctx, saved = saved,
    seq = opts.seq or 0, heads = heads, scale = opts.scale or 0, p = opts.p or 0, seed = opts.seed or 0,
    offset = opts.offset or 0 })
end
function M.attention(q, k, v, key_mask, heads, opts)
  opts = opts or {}
  local ctx = opts.out or bl.empty(q:shape(), { dtype = q:dtype(), device = q:device() })
  local probs = opts.probs
  if not probs then
    probs = bl.empty(M.attention_saved_shape(q.device_, q:size(1), q:size(2), heads), { dtype = "f32",
      device = q:device() })
  end
  check(C.bl_attention_forward(attention_args(q, k, v, key_mask, nil, heads, ctx, probs, opts)))
  return ctx, probs
end
local NO_OPTS = {}
-- Inference over packed sequences: q, k, v [1, T, H] hold B sequences back to back, offsets [B+1] (i32, 0 .. T)
-- delimit them; each attends to its own tokens (bl_attention_forward with offsets). Returns ctx [1, T, H] (or out).
function M.attention_packed(q, k, v, offsets, heads, out)
  out = out or bl.empty(q:shape(), { dtype = q:dtype(), device = q:device() })
  check(C.bl_attention_forward(attention_args(q, k, v, nil, offsets, heads, out, nil, NO_OPTS)))
  return out
end
-- Training over packed sequences: opts.seq is the padded length the tokens come from (it lays out the dropout
-- stream as the padded op's), opts.probs the saved probabilities (heads * the sum of the squared lengths, f32),
-- opts.out, p, seed, offset as M.attention. Returns ctx, probs.
function M.attention_packed_train(q, k, v, offsets, heads, opts)
  local ctx = opts.out or bl.empty(q:shape(), { dtype = q:dtype(), device = q:device() })
  check(C.bl_attention_forward(attention_args(q, k, v, nil, offsets, heads, ctx, opts.probs, opts)))
  return ctx, opts.probs
end
-- Its backward: dq, dk, dv (or opts.dq/dk/dv) from dctx, the forward's operands and probabilities.
function M.attention_packed_backward(dctx, q, k, v, probs, offsets, heads, opts)
  local dq, dk, dv = opts.dq or like(q), opts.dk or like(k), opts.dv or like(v)
  check(C.bl_attention_backward(dq, dk, dv, dctx, attention_args(q, k, v, nil, offsets, heads, nil, probs, opts)))
  return dq, dk, dv
end
-- Returns dq, dk, dv (or writes opts.dq/dk/dv, e.g. slices of one dQKV buffer).
-- On a GPU, opts.ctx (the forward's output) and opts.key_mask (the forward's
-- mask) are required too: the kernel recomputes the probabilities.
function M.attention_backward(dctx, q, k, v, probs, heads, opts)
  opts = opts or {}
  local dq, dk, dv = opts.dq or like(q), opts.dk or like(k), opts.dv or like(v)
  check(C.bl_attention_backward(dq, dk, dv, dctx,
    attention_args(q, k, v, opts.key_mask, nil, heads, opts.ctx, probs, opts)))
  return dq, dk, dv
end

-- losses and metrics ------------------------------------------------------------------
-- Returns loss (Lua number), dlogits (unless opts.grad == false), count.
-- opts: ignore_index (-100, HF; NVIDIA data uses -1), grad_scale (1); loss (an f64 [1] tensor) and
-- dlogits (logits' shape) are buffers to reuse.
function M.cross_entropy(logits, targets, opts)
  opts = opts or {}
  local loss = opts.loss or bl.empty({ 1 }, { dtype = "f64", device = logits:device() })
  local dlogits = opts.grad ~= false and (opts.dlogits or f32_like(logits)) or nil
  local cnt = i64box()
  check(C.bl_cross_entropy(loss, dlogits, logits, targets, opts.ignore_index or -100,
    opts.grad_scale or 1, cnt))
  return loss:item(), dlogits, tonumber(cnt[0])
end

-- Returns loss (number) and dpred (unless opts.grad == false); opts.loss, opts.dpred: buffers to reuse.
function M.mse_loss(pred, target, opts)
  opts = opts or {}
  local loss = opts.loss or bl.empty({ 1 }, { dtype = "f64", device = pred:device() })
  local dpred = opts.grad ~= false and (opts.dpred or f32_like(pred)) or nil
  check(C.bl_mse_loss(loss, dpred, pred, target, opts.grad_scale or 1))
  return loss:item(), dpred
end

-- out = x * a + b (one rounding per element; out may be x itself).
function M.affine(x, a, b, out) out = out or like(x); check(C.bl_affine(out, x, a, b or 0)); return out end

-- argmax over the last dim (0-based class ids, i64, shape without the last dim).
function M.argmax(x)
  local s = x:shape()
  s[#s] = nil
  if #s == 0 then s = { 1 } end
  local out = bl.empty(s, { dtype = "i64", device = x:device() })
  check(C.bl_argmax(out, x))
  return out
end

-- Returns correct, count (targets equal to ignore_index, default -100, skipped).
function M.accuracy(logits, targets, ignore_index)
  local c, n = i64box(), i64box()
  check(C.bl_accuracy(logits, targets, ignore_index or -100, c, n))
  return tonumber(c[0]), tonumber(n[0])
end

-- Device-side sums (nothing read back, for a training step on a GPU): the loss of the targets not equal to
-- ignore_index into `loss` (an f64 [1] tensor on the logits' device) with its gradient into `dlogits`, given
-- `count`, the number of counted targets, which the caller knows (-1: counted on the device, bl_ops.h); grad_scale
-- (default 1) multiplies the gradient.
function M.cross_entropy_counted(logits, targets, ignore_index, count, loss, dlogits, grad_scale)
  check(C.bl_cross_entropy_counted(loss, dlogits, logits, targets, ignore_index, grad_scale or 1, count))
  return loss
end

-- cross_entropy_counted that also adds {correct, counted} to `counts` (i64 [2] on the logits' device), as
-- accuracy_add: on the CPU in the same pass over the logits.
function M.cross_entropy_accuracy(logits, targets, ignore_index, count, loss, dlogits, counts, grad_scale)
  check(C.bl_cross_entropy_accuracy(loss, dlogits, counts, logits, targets, ignore_index, grad_scale or 1, count))
  return loss
end

-- The same for the mean squared error (regression heads): its mean into `loss`, its gradient into `dpred`.
function M.mse_loss_into(pred, target, loss, dpred, grad_scale)
  check(C.bl_mse_loss(loss, dpred, pred, target, grad_scale or 1))
  return loss
end

-- counts (i64 [2] on the logits' device) += {correct, counted}.
function M.accuracy_add(counts, logits, targets, ignore_index)
  check(C.bl_accuracy_add(counts, logits, targets, ignore_index or -100))
end

-- out = a + b and x *= s elementwise with broadcasting (s: a number or a one-element tensor on x's device).
function M.add(a, b, out) out = out or like(a); check(C.bl_binary(C.BL_ADD, out, a, b)); return out end
function M.scale_(x, s)
  if bl.is_tensor(s) then check(C.bl_binary(C.BL_MUL, x, x, s))
  elseif s and s ~= 1 then check(C.bl_affine(x, x, s, 0)) end
  return x
end

return M
