-- bertlua.bert.model: the BERT encoder (embeddings, self-attention layers,
-- pooler) as bertlua.nn modules; the heads on top are bertlua.bert.heads.
local core = require "bertlua.core"
local bl = require "bertlua.tensor"
local nn = require "bertlua.nn"
local config = require "bertlua.bert.config"
local ffi = core.ffi
local ops = require "bertlua.nn.ops"
local graph = require "bertlua.device.graph"
local buf, draw, class, Module = nn.buf, nn.draw, nn.class, nn.Module


local M = {}

-- t on the module's device (a copy when it lives elsewhere; t itself on the CPU path)
local function on_device(self, t)
  local d = self.device
  if t == nil or d == nil or t.device_ == d then return t end
  return t:to{ device = d }
end
M.on_device = on_device

local function as_ids(t, what)
  if t == nil then return nil end
  if not bl.is_tensor(t) then t = bl.from(t, { dtype = "i32" }) end
  local d = t:dtype()
  if d ~= "i32" and d ~= "i64" then error(("bert: %s must be an i32/i64 tensor, got %s"):format(what, d), 3) end
  return t
end

-- embeddings --------------------------------------------------------------------------
local BertEmbeddings = class("BertEmbeddings")
function BertEmbeddings:__init(cfg)
  Module.__init(self)
  self.cfg = cfg
  self:add("word_embeddings", nn.Embedding(cfg.vocab_size, cfg.hidden_size))
  self:add("position_embeddings", nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size))
  self:add("token_type_embeddings", nn.Embedding(cfg.type_vocab_size, cfg.hidden_size))
  self:add("LayerNorm", nn.LayerNorm(cfg.hidden_size, cfg.layer_norm_eps))
  self:add("dropout", nn.Dropout(cfg.hidden_dropout_prob))
end
-- A cache entry made inside a CUDA graph capture is dropped if the capture is aborted: the work filling it
-- never ran (graph.on_abort).
local function forget_on_abort(self, key)
  local t = self[key]
  graph.on_abort(function() if self[key] == t then self[key] = nil end end)
end
-- position ids 0..S-1 per row, cached per shape; on a GPU a new shape is copied there from one row of every
-- position, uploaded once (no upload from host memory per batch shape: evaluation batches change shape)
local function position_ids(self, B, S)
  local p = self._pos
  if p and p:size(1) == B and p:size(2) == S and p.device_ == (self.device or -1) then return p end
  local row = self._pos_row
  if not (row and row.device_ == (self.device or -1)) then
    local n = self.cfg.max_position_embeddings
    row = bl.empty({ 1, n }, { dtype = "i32" })
    local ptr = row:ptr()
    for s = 0, n - 1 do ptr[s] = s end
    row = on_device(self, row)
    self._pos_row = row
    forget_on_abort(self, "_pos_row")
  end
  p = bl.empty({ B, S }, { dtype = "i32", device = self.device }):copy_(row:narrow(2, 1, S):expand({ B, S }))
  self._pos = p
  forget_on_abort(self, "_pos")
  return p
end
local function zero_types(self, B, S)
  local t = self._zero_types
  if t and t:size(1) == B and t:size(2) == S and t.device_ == (self.device or -1) then return t end
  t = bl.zeros({ B, S }, { dtype = "i32", device = self.device })
  self._zero_types = t
  forget_on_abort(self, "_zero_types")
  return t
end
-- posids (optional): the position of every token, for packed inference (see BertModel:forward)
function BertEmbeddings:forward(ids, types, posids)
  local B, S = ids:size(1), ids:size(2)
  if not posids and S > self.cfg.max_position_embeddings then
    error(("BertEmbeddings: sequence length %d exceeds max_position_embeddings %d"):format(S,
      self.cfg.max_position_embeddings), 3)
  end
  types = types or zero_types(self, B, S)
  self._types, self._posids, self._plan = types, posids or position_ids(self, B, S), nil
  local H = self.cfg.hidden_size
  local ln, drop = self.LayerNorm, self.dropout
  -- one op (sum of the three rows, LayerNorm, dropout); the dropout draws from the stream nn.Dropout would use
  local p, seed, off = draw(drop, drop.p, B * S * H)
  self._drop = { p = p, seed = seed, offset = off }
  local y = buf(self, "output", { B, S, H })
  ops.embedding_layernorm(self:_tables(), { ids, self._posids, types }, ln.weight, ln.bias,
    { eps = ln.eps, p = p, seed = seed, offset = off, out = y, mean = buf(ln, "mean", { B * S }, "f32"),
      rstd = buf(ln, "rstd", { B * S }, "f32") })
  return y
end
-- Packed training (BertModel's unpadded training): the real tokens of the plan as [1, T, H], one call per row so
-- that row b's dropout draws the padded run's: its mask starts at element b*S*H of the same stream, i.e. counter
-- block offset + b*S*H/4 (plan.S * H is a multiple of 4, checked by the plan).
function BertEmbeddings:forward_packed(plan)
  local H, T = self.cfg.hidden_size, plan.T
  local ln, drop = self.LayerNorm, self.dropout
  local p, seed, off = draw(drop, drop.p, plan.B * plan.S * H)
  self._drop = { p = p, seed = seed, offset = off }
  self._types, self._posids, self._plan = plan.types, plan.posids, plan
  local y = buf(self, "output", { 1, T, H })
  local mean, rstd = buf(ln, "mean", { T }, "f32"), buf(ln, "rstd", { T }, "f32")
  self:_per_row(plan, function(r)
    ops.embedding_layernorm(self:_tables(), { r(plan.ids), r(plan.posids), r(plan.types) }, ln.weight, ln.bias,
      { eps = ln.eps, p = p, seed = seed, offset = r.offset, out = r(y), mean = r(mean, 1), rstd = r(rstd, 1) })
  end)
  return y
end
-- fn(r) for every row b with tokens: r(t[, dim]) narrows t ([1, T, ...] on dim 2, or dim) to the row's tokens,
-- r.offset is the row's dropout offset
function BertEmbeddings:_per_row(plan, fn)
  local o, step = plan.offsets:ptr(), plan.S * self.cfg.hidden_size / 4
  for b = 0, plan.B - 1 do
    local t0, n = o[b], o[b + 1] - o[b]
    if n > 0 then
      fn(setmetatable({ offset = self._drop.offset + b * step }, { __call = function(_, t, dim)
        return t:narrow(dim or 2, t0 + 1, n)
      end }))
    end
  end
end
function BertEmbeddings:_tables()
  return { self.word_embeddings.weight, self.position_embeddings.weight, self.token_type_embeddings.weight }
end
function BertEmbeddings:backward(ids, dy)
  local ln = self.LayerNorm
  if self._plan then
    local plan, grads = self._plan, { self.word_embeddings.grad_weight, self.position_embeddings.grad_weight,
      self.token_type_embeddings.grad_weight, ln.grad_weight, ln.grad_bias }
    self:_per_row(plan, function(r)
      ops.embedding_layernorm_backward(r(dy), self:_tables(), { r(plan.ids), r(plan.posids), r(plan.types) },
        ln.weight, r(ln.mean, 1), r(ln.rstd, 1), grads, { p = self._drop.p, seed = self._drop.seed,
          offset = r.offset })
    end)
    return nil
  end
  ops.embedding_layernorm_backward(dy, self:_tables(), { ids, self._posids, self._types }, ln.weight, ln.mean,
    ln.rstd, { self.word_embeddings.grad_weight, self.position_embeddings.grad_weight,
      self.token_type_embeddings.grad_weight, ln.grad_weight, ln.grad_bias }, self._drop)
  return nil
end

-- self-attention ------------------------------------------------------------------------
-- Q, K, V are three HF Linear modules; their weights are laid out back to
-- back in the flat buffer, so `fused` (default) runs ONE [3H, H] GEMM and the
-- attention op reads Q/K/V as column slices of its output.
local BertSelfAttention = class("BertSelfAttention")
function BertSelfAttention:__init(cfg)
  Module.__init(self)
  self.cfg = cfg
  self.heads = cfg.num_attention_heads
  self.p = cfg.attention_probs_dropout_prob
  self.fused = true
  local H = cfg.hidden_size
  self:add("query", nn.Linear(H, H))
  self:add("key", nn.Linear(H, H))
  self:add("value", nn.Linear(H, H))
end
function BertSelfAttention:_layout(prefix, list)
  local q, k, v = self.query, self.key, self.value
  local function entry(mod, name)
    for _, p in ipairs(mod._params) do if p.name == name then return p end end
  end
  local function add(mod, mname, pname, contiguous)
    local e = entry(mod, pname)
    e.contiguous = contiguous
    list[#list + 1] = { name = prefix .. mname .. "." .. pname, entry = e, module = mod }
  end
  local std = q.__name == "Linear" and k.__name == "Linear" and v.__name == "Linear"
  if not std then return Module._layout(self, prefix, list) end
  add(q, "query", "weight", false); add(k, "key", "weight", true); add(v, "value", "weight", true)
  add(q, "query", "bias", false); add(k, "key", "bias", true); add(v, "value", "bias", true)
end
function BertSelfAttention:_after_flatten()
  local H = self.cfg.hidden_size
  local q, k, v = self.query, self.key, self.value
  local function adjacent(a, b, n)  -- b starts n elements after a (f32 or a half compute copy)
    return ffi.cast("char*", b.data_) - ffi.cast("char*", a.data_) == n * a:element_size()
  end
  self._qkv = nil
  if q.weight and adjacent(q.weight, k.weight, H * H) and adjacent(k.weight, v.weight, H * H)
      and q.bias and adjacent(q.bias, k.bias, H) and adjacent(k.bias, v.bias, H) then
    -- a [3H, H] / [3H] view starting at the query tensor (same storage)
    local function fuse(t, shape) return t:as_strided(shape, #shape == 2 and { shape[2], 1 } or { 1 }) end
    self._qkv = {
      w = fuse(q.weight, { 3 * H, H }), b = fuse(q.bias, { 3 * H }),
      gw = fuse(q.grad_weight, { 3 * H, H }), gb = fuse(q.grad_bias, { 3 * H }),
    }
  end
end
function BertSelfAttention:forward(x, mask)
  local B, S, H = x:size(1), x:size(2), x:size(3)
  local q, k, v
  if self.fused and self._qkv then
    -- bf16 (bertlua.bert.infer) for packed inference: the attention reads it in place on AMX tiles
    local half = not self.training and self.bf16_qkv and type(mask) == "table"
    local qkv = buf(self, "qkv", { B, S, 3 * H }, half and "bf16" or nil)
    ops.linear(x, self._qkv.w, self._qkv.b, qkv, not self.training and self._qkv.packed or nil)
    if self._qkv_src ~= qkv then
      self._q, self._k, self._v = qkv:narrow(3, 1, H), qkv:narrow(3, H + 1, H), qkv:narrow(3, 2 * H + 1, H)
      self._qkv_src = qkv
    end
    q, k, v = self._q, self._k, self._v
    self._used_fused = true
  else
    q, k, v = self.query:forward(x), self.key:forward(x), self.value:forward(x)
    self._q, self._k, self._v, self._qkv_src = q, k, v, nil
    self._used_fused = false
  end
  -- bf16 (bertlua.bert.infer) in inference: the output linear's bf16 GEMM reads it in place
  local ctx = buf(self, "output", { B, S, H }, not self.training and self.bf16_out and "bf16" or nil)
  self._plan = nil
  if type(mask) == "table" and not self.training then  -- packed sequences (BertModel's unpadded inference)
    return ops.attention_packed(q, k, v, mask.offsets, self.heads, ctx)
  elseif type(mask) == "table" then  -- unpadded training: the padded run's dropout stream (plan.S lays it out)
    local plan = mask
    local p, seed, off = draw(self, self.p, plan.B * self.heads * plan.S * 4 * math.ceil(plan.S / 4))
    self._drop, self._plan = { p, seed, off }, plan
    self._saved = buf(self, "probs_packed", { self.heads * plan.sum_sq }, "f32")
    ops.attention_packed_train(q, k, v, plan.offsets, self.heads, { out = ctx, probs = self._saved, seq = plan.S,
      p = p, seed = seed, offset = off })
    return ctx
  end
  -- what backward needs: the probabilities [B,heads,S,S] on the CPU (self.probs),
  -- the row logsumexp [B,heads,S] on a GPU (self.lse); see bl_attention_saved_shape
  local saved
  if self.device then
    saved = buf(self, "lse", ops.attention_saved_shape(self.device, B, S, self.heads), "f32")
  else
    saved = buf(self, "probs", { B, self.heads, S, S }, "f32")
  end
  self._saved, self._mask = saved, mask
  -- every row of the [B, heads, S, S] dropout mask starts a Philox call (bl_ops.h): rows of ceil(S/4)*4 draws
  local p, seed, off = draw(self, self.p, B * self.heads * S * 4 * math.ceil(S / 4))
  self._drop = { p, seed, off }
  ops.attention(q, k, v, mask, self.heads, { out = ctx, probs = saved, p = p, seed = seed, offset = off })
  return ctx
end
function BertSelfAttention:_attention_backward(dctx, dq, dk, dv)
  local p, seed, off, plan = self._drop[1], self._drop[2], self._drop[3], self._plan
  local o = { dq = dq, dk = dk, dv = dv, p = p, seed = seed, offset = off }
  if plan then
    o.seq = plan.S
    ops.attention_packed_backward(dctx, self._q, self._k, self._v, self._saved, plan.offsets, self.heads, o)
  else
    o.ctx, o.key_mask = self.output, self._mask
    ops.attention_backward(dctx, self._q, self._k, self._v, self._saved, self.heads, o)
  end
end
-- dacc (optional): the residual path's gradient of x; the QKV GEMM adds its dx into it (returned)
function BertSelfAttention:backward(x, dctx, dacc)
  local B, S, H = x:size(1), x:size(2), x:size(3)
  local dx = dacc or buf(self, "grad_input", { B, S, H })
  if self._used_fused then
    local dqkv = buf(self, "grad_qkv", { B, S, 3 * H })
    if self._dqkv_src ~= dqkv then
      self._dq, self._dk, self._dv = dqkv:narrow(3, 1, H), dqkv:narrow(3, H + 1, H), dqkv:narrow(3, 2 * H + 1, H)
      self._dqkv_src = dqkv
    end
    self:_attention_backward(dctx, self._dq, self._dk, self._dv)
    ops.linear_backward(dqkv, x, self._qkv.w, { dx = dx, dw = self._qkv.gw, db = self._qkv.gb,
      accumulate = dacc ~= nil })
  else
    local dq, dk, dv = buf(self, "grad_q", { B, S, H }), buf(self, "grad_k", { B, S, H }), buf(self, "grad_v", { B, S,
      H })
    self:_attention_backward(dctx, dq, dk, dv)
    local function back(lin, d, acc)
      ops.linear_backward(d, x, lin.weight, { dx = dx, dw = lin.grad_weight, db = lin.grad_bias, accumulate = acc })
    end
    back(self.query, dq, dacc ~= nil); back(self.key, dk, true); back(self.value, dv, true)
  end
  return dx
end

-- dense + dropout + residual + LayerNorm (BertSelfOutput and BertOutput):
-- y = LN(dropout(dense(h)) + residual) with the fused residual_layernorm op.
-- Two inputs, so (as Torch7's table modules) input = { h, residual } and
-- backward returns grad_input = { dh, dresidual }.
local BertOutput = class("BertOutput")
function BertOutput:__init(cfg, in_features)
  Module.__init(self)
  self.cfg = cfg
  self.p = cfg.hidden_dropout_prob
  self:add("dense", nn.Linear(in_features or cfg.intermediate_size, cfg.hidden_size))
  self:add("LayerNorm", nn.LayerNorm(cfg.hidden_size, cfg.layer_norm_eps))
end
-- plan (optional): BertModel's unpadded training plan; each token's dropout is then drawn from its row of the
-- padded batch (the packed op), so that the packed run drops what the padded one drops
function BertOutput:forward(input, plan)
  local h, residual = input[1], input[2]
  local d = self.dense:forward(h)
  local y = buf(self, "output", residual:shape())
  local H = self.cfg.hidden_size
  local rows = residual:numel() / H
  local mean, rstd = buf(self, "mean", { rows }, "f32"), buf(self, "rstd", { rows }, "f32")
  self._plan = type(plan) == "table" and self.training and plan or nil
  local p, seed, off = draw(self, self.p, self._plan and plan.B * plan.S * H or d:numel())
  self._drop = { p, seed, off }
  local ln = self.LayerNorm
  ops.residual_layernorm(d, residual, ln.weight, ln.bias, { eps = ln.eps, p = p, seed = seed, offset = off, out = y,
    mean = mean, rstd = rstd, packed = self._plan })
  return y
end
-- The dense layer's bias gradient comes out of the LayerNorm backward's pass (a plain Linear with a bias), so its
-- own backward only runs the two GEMMs. gelu_of (optional): the BertIntermediate whose tanh GELU ran in its GEMM's
-- epilogue; the dX GEMM then also applies that GELU's derivative and gives its bias gradient, and the result
-- { dpre, dres, dpre = true } carries the gradient of its pre-activation instead of h's.
function BertOutput:backward(input, dy, gelu_of)
  local h, residual = input[1], input[2]
  local dense = self.dense
  local d = dense.output
  local dd, dres = buf(self, "grad_dense", d:shape()), buf(self, "grad_residual", residual:shape())
  local ln = self.LayerNorm
  local p, seed, off = self._drop[1], self._drop[2], self._drop[3]
  local fuse_db = dense.__name == "Linear" and dense.grad_bias ~= nil
  -- the normalised sum from the output (kept: it is the next sublayer's input), one read fewer than d and residual
  ops.residual_layernorm_backward(dy, d, residual, ln.weight, self.mean, self.rstd, { dgamma = ln.grad_weight,
    dbeta = ln.grad_bias, dbias = fuse_db and dense.grad_bias or nil, p = p, seed = seed, offset = off, dx = dd,
    dres = dres, packed = self._plan, y = self.output, beta = ln.bias })
  if not fuse_db then return { dense:backward(h, dd), dres } end
  if gelu_of then
    ops.linear_backward(dd, h, dense.weight, { dx = false, dw = dense.grad_weight })
    local pre = gelu_of.pre
    return { ops.linear_dgelu_tanh_backward(dd, dense.weight, pre, gelu_of.dense.grad_bias,
      buf(gelu_of, "grad_pre", pre:shape())), dres, dpre = true }
  end
  local dh = ops.linear_backward(dd, h, dense.weight, { dx = buf(dense, "grad_input", h:shape()),
    dw = dense.grad_weight })
  return { dh, dres }
end
local BertSelfOutput = class("BertSelfOutput", BertOutput)
function BertSelfOutput:__init(cfg) BertOutput.__init(self, cfg, cfg.hidden_size) end

local BertAttention = class("BertAttention")
function BertAttention:__init(cfg)
  Module.__init(self)
  self:add("self", nn.BertSelfAttention(cfg))
  self:add("output", nn.BertSelfOutput(cfg))
end
function BertAttention:forward(x, mask)
  return self.output:forward({ self.self:forward(x, mask), x }, mask)
end
-- the residual gradient d[2] is handed to the self-attention backward, whose dx GEMM adds into it
function BertAttention:backward(x, dy)
  local d = self.output:backward({ self.self.output, x }, dy)
  return nn.add_into(self.self:backward(x, d[1], d[2]), d[2])
end

-- dense + activation; the dense bias is fused into GELU when the activation allows it
local BertIntermediate = class("BertIntermediate")
function BertIntermediate:__init(cfg)
  Module.__init(self)
  self:add("dense", nn.Linear(cfg.hidden_size, cfg.intermediate_size))
  self:add("intermediate_act_fn", nn.activation(cfg.hidden_act))
end
function BertIntermediate:forward(x)
  self.output = nn.dense_act_forward(self, self.dense, self.intermediate_act_fn, x)
  return self.output
end
function BertIntermediate:backward(x, dy, dacc, dy_is_dpre)
  return nn.dense_act_backward(self, self.dense, self.intermediate_act_fn, x, dy, dacc, dy_is_dpre)
end

local BertLayer = class("BertLayer")
function BertLayer:__init(cfg)
  Module.__init(self)
  self:add("attention", nn.BertAttention(cfg))
  self:add("intermediate", nn.BertIntermediate(cfg))
  self:add("output", nn.BertOutput(cfg))
end
function BertLayer:forward(x, mask)
  local a = self.attention:forward(x, mask)
  local i = self.intermediate:forward(a)
  return self.output:forward({ i, a }, mask)
end
function BertLayer:backward(x, dy)
  local a = self.attention.output.output
  local inter = self.intermediate
  -- a tanh GELU in FC1's epilogue: FC2's dX GEMM applies its derivative (DGELU_BGRAD)
  local d = self.output:backward({ inter.output, a }, dy, inter._fused == "epilogue" and inter or nil)
  local da = nn.add_into(inter:backward(a, d[1], d[2], d.dpre), d[2])   -- the residual path's gradient added
  return self.attention:backward(x, da)
end

-- the stack of layers; any module with forward(x, mask)/backward(x, dy) can be a layer
local BertEncoder = class("BertEncoder")
function BertEncoder:__init(cfg)
  Module.__init(self)
  self.cfg = cfg
  self.layer = {}
  for i = 1, cfg.num_hidden_layers do self.layer[i] = nn.BertLayer(cfg) end
  self:_rename()
end
function BertEncoder:_rename()
  self._children, self._set_at = {}, nil
  for i, l in ipairs(self.layer) do self._children[i] = { name = "layer." .. (i - 1), module = l } end
end
-- insert(pos, layer): layer becomes layer number pos (1-based); call flatten() on the root afterwards
function BertEncoder:insert(pos, layer)
  table.insert(self.layer, pos, layer)
  self:_rename()
  return layer
end
function BertEncoder:remove(pos)
  local l = table.remove(self.layer, pos)
  self:_rename()
  return l
end
-- Activation checkpointing (self.checkpoint): a layer's forward keeps only its output (the next layer's input) and
-- the dropout counter it started at; backward runs the layer's forward again from its input with that counter (the
-- same masks, the same numbers) just before its backward. Layers of the same structure pass one set of internal
-- buffers down the stack and back (nn.move_buffers), so one layer's activations exist at a time, in evaluation
-- too; the last layer's are still there when backward starts and are not recomputed.
local function same_structure(a, b)
  if getmetatable(a) ~= getmetatable(b) or #a._children ~= #b._children then return false end
  for i, c in ipairs(a._children) do
    if not same_structure(c.module, b._children[i].module) then return false end
  end
  return true
end
-- the shared set moves to layer i from the layer that has it (self._set_at)
local function take_set(self, i)
  local from, to = self.layer[self._set_at or i], self.layer[i]
  self._set_at = i
  if not from or from == to or not same_structure(from, to) then return end
  -- the layer output is the next layer's input (or the encoder's output): it stays with its layer
  nn.move_buffers(from, to, function(m, key) return m == from.output and key == "output" end)
end
function BertEncoder:forward(x, mask)
  local hs, ckpt = { x }, self.checkpoint and {} or nil
  for i, l in ipairs(self.layer) do
    if ckpt then
      take_set(self, i)
      ckpt[i] = l.rng and l.rng:state() or false
    end
    x = l:forward(x, mask)
    hs[i + 1] = x
  end
  self.hidden_states, self._ckpt, self._mask = hs, ckpt, mask
  return x
end
function BertEncoder:backward(x, dy)
  local hs, ckpt, L = self.hidden_states, self._ckpt, #self.layer
  for i = L, 1, -1 do
    local l = self.layer[i]
    if ckpt and i < L then
      -- dy may live in the buffers handed over: a copy of it stays with the encoder
      dy = buf(self, "_ckpt_dy", dy:shape()):copy_(dy)
      take_set(self, i)
      local rng, start = l.rng, ckpt[i]
      local now = start and rng:state()
      if start then rng:set_state(start) end
      l:forward(hs[i], self._mask)
      if start then rng:set_state(now) end
    end
    dy = l:backward(hs[i], dy)
  end
  return dy
end

local BertPooler = class("BertPooler")
function BertPooler:__init(cfg)
  Module.__init(self)
  self:add("dense", nn.Linear(cfg.hidden_size, cfg.hidden_size))
  self:add("activation", nn.Tanh())
end
function BertPooler:forward(seq)
  self._cls = seq:select(2, 1)  -- [B, H] view of the [CLS] rows
  self.output = self.activation:forward(self.dense:forward(self._cls))
  return self.output
end
-- backward(seq, dy) -> dseq [B,S,H]: zero but for the [CLS] rows
function BertPooler:backward(seq, dy)
  local dpre = self.activation:backward(self.dense.output, dy)
  local dseq = buf(self, "grad_input", seq:shape())
  dseq:zero_()
  self.dense:backward(self._cls, dpre, dseq:select(2, 1))
  return dseq
end

-- BertModel --------------------------------------------------------------------------------
local BertModel = class("BertModel")
M.BertModel_class = BertModel
local function resolve_cfg(cfg)
  if type(cfg) == "string" then return config.preset(cfg) end
  if type(cfg) == "table" and cfg._validated then return cfg end
  cfg = config.new(cfg)
  cfg._validated = true
  return cfg
end
function BertModel:__init(cfg, opts)
  Module.__init(self)
  opts = opts or {}
  cfg = resolve_cfg(cfg)
  self.cfg = cfg
  self.initializer_range = cfg.initializer_range
  self:add("embeddings", nn.BertEmbeddings(cfg))
  self:add("encoder", nn.BertEncoder(cfg))
  if opts.pooler ~= false then self:add("pooler", nn.BertPooler(cfg)) end
  if opts.flatten ~= false then self:flatten{ seed = opts.seed or 0 } end
end
-- Unpadded inference: the real tokens (attention_mask ~= 0) of the whole batch packed into one [1, T, H] matrix:
-- ids, token types and positions gathered, flat row b*S+s of each token (pos), token offsets per row. nil when
-- nothing is padded.
local function unpad_plan(self, ids, types, mask)
  local B, S = ids:size(1), ids:size(2)
  -- the host copies stay referenced (locals) while their pointers are read
  local m32, ic, tc = mask:to{ dtype = "f32" }:contiguous(), ids:contiguous(), types and types:contiguous()
  local mp = m32:ptr()
  local T = 0
  for i = 0, B * S - 1 do if mp[i] ~= 0 then T = T + 1 end end
  if T == B * S then return nil end
  local plan = { B = B, S = S, T = T, offsets = buf(self, "_unpad_offsets", { B + 1 }, "i32") }
  local op = plan.offsets:ptr()
  op[0] = 0
  if T > 0 then
    plan.pos = buf(self, "_unpad_pos", { T }, "i32")
    plan.ids, plan.types = buf(self, "_unpad_ids", { 1, T }, "i32"), buf(self, "_unpad_types", { 1, T }, "i32")
    plan.posids = buf(self, "_unpad_posids", { 1, T }, "i32")
    local ip, tp = ic:ptr(), tc and tc:ptr()
    local pp, wp, yp, sp = plan.pos:ptr(), plan.ids:ptr(), plan.types:ptr(), plan.posids:ptr()
    local t = 0
    for b = 0, B - 1 do
      for s = 0, S - 1 do
        local i = b * S + s
        if mp[i] ~= 0 then
          pp[t], wp[t], yp[t], sp[t] = i, ip[i], tp and tp[i] or 0, s
          t = t + 1
        end
      end
      op[b + 1] = t
    end
  else
    for b = 1, B do op[b] = 0 end
  end
  return plan
end

-- Unpadded training's plan: unpad_plan's, when it reproduces the padded step (else nil and why). Each row's real
-- tokens must be its first ones and at least one: the packed ops draw dropout at the padded positions of the same
-- tokens, and the [CLS] row feeds the pooler; a row with no real token attends to all its pads in the padded
-- softmax. S * H must be a multiple of 4 (BertEmbeddings:forward_packed). plan.sum_sq: the sum of the squared
-- lengths (the saved attention probabilities per head).
local function train_plan(self, ids, types, mask)
  local plan = unpad_plan(self, ids, types, mask)
  if not plan then return nil end
  if plan.S * self.cfg.hidden_size % 4 ~= 0 then return nil, "seq x hidden is not a multiple of 4" end
  local o, pp = plan.offsets:ptr(), plan.T > 0 and plan.pos:ptr()
  plan.sum_sq = 0
  for b = 0, plan.B - 1 do
    local n = o[b + 1] - o[b]
    if n == 0 then return nil, ("row %d has no real token"):format(b + 1) end
    if pp[o[b + 1] - 1] ~= b * plan.S + n - 1 then
      return nil, ("the real tokens of row %d are not its first ones (attention_mask is not a prefix)"):format(b + 1)
    end
    plan.sum_sq = plan.sum_sq + n * n
  end
  return plan
end

-- Unpadded training: embeddings and layers on the T real tokens ([1, T, H]; encoder.hidden_states packed too),
-- the last hidden state scattered to [B, S, H] (zeros at padded positions) for the heads and the pooler
function BertModel:_forward_packed_train(plan)
  local x = self.encoder:forward(self.embeddings:forward_packed(plan), plan)
  local seq = buf(self, "_unpad_seq", { plan.B, plan.S, self.cfg.hidden_size })
  seq:zero_()
  ops.gather_backward(seq, x, plan.pos)
  self._seq, self._plan = seq, plan
  local pooled = self.pooler and self.pooler:forward(seq) or nil
  return { last_hidden_state = seq, pooler_output = pooled }
end

-- the packed forward: every GEMM, LayerNorm and GELU on the T real tokens, attention per row over its own tokens;
-- each hidden state scattered back to [B, S, H] with zeros at the padded positions
function BertModel:_forward_packed(plan)
  local B, S, H, T = plan.B, plan.S, self.cfg.hidden_size, plan.T
  local packed = {}
  if T > 0 then
    self.encoder:forward(self.embeddings:forward(plan.ids, plan.types, plan.posids), plan)
    packed = self.encoder.hidden_states
  end
  local hs = {}
  for i = 1, #self.encoder.layer + 1 do
    hs[i] = buf(self, "_unpad_hs" .. i, { B, S, H })
    hs[i]:zero_()
    if T > 0 then ops.gather_backward(hs[i], packed[i], plan.pos) end
  end
  self.encoder.hidden_states = hs
  local seq = hs[#hs]
  self._seq = seq
  local pooled = self.pooler and self.pooler:forward(seq) or nil
  return { last_hidden_state = seq, pooler_output = pooled, hidden_states = hs }
end

-- forward{input_ids=, token_type_ids=, attention_mask=} ->
-- { last_hidden_state [B,S,H], pooler_output [B,H] (nil without pooler),
--   hidden_states = { embeddings, layer 1, ..., layer L } }
-- With self.unpad (bertlua.bert.infer.pack sets it), in eval mode on the CPU, a batch with padding runs packed
-- (BertModel:_forward_packed): the padded positions cost nothing, and their hidden states are zero (not what
-- the padded forward computes there; a row with no real token gives zeros, and a pooler output of tanh(bias)).
-- The real positions equal the padded forward's up to summation order.
-- With self.unpad_training (pretrain/benchmark --unpad), in training mode on the CPU, a batch with padding trains
-- packed (BertModel:_forward_packed_train; train_plan says when it falls back): last_hidden_state is [B, S, H] with
-- zeros at padded positions, hidden_states is not returned, and backward gives the padded step's gradients up to
-- summation order.
function BertModel:forward(batch)
  local ids = as_ids(batch.input_ids, "input_ids")
  if not ids or ids:dim() ~= 2 then error("BertModel: input_ids must be a [batch, seq] tensor", 2) end
  local types = as_ids(batch.token_type_ids, "token_type_ids")
  local mask = batch.attention_mask
  if mask ~= nil and not bl.is_tensor(mask) then mask = bl.from(mask, { dtype = "f32" }) end
  local function same(t, what)
    if t and (t:dim() ~= 2 or t:size(1) ~= ids:size(1) or t:size(2) ~= ids:size(2)) then
      error(("BertModel: %s %s does not match input_ids %s"):format(what, bl.shape_str(t:shape()),
        bl.shape_str(ids:shape())), 3)
    end
  end
  same(types, "token_type_ids"); same(mask, "attention_mask")
  ids, types, mask = on_device(self, ids), on_device(self, types), on_device(self, mask)
  self._ids, self._mask, self._ran_packed, self._plan = ids, mask, false, nil
  if self.unpad_training and mask and self.training and (self.device or -1) < 0 then
    local plan, why = train_plan(self, ids, types, mask)
    if plan then return self:_forward_packed_train(plan) end
    if why and not self._warned_unpad then
      self._warned_unpad = true
      io.stderr:write("BertModel: unpadded training falls back to the padded step for such batches: ", why, "\n")
    end
  end
  if self.unpad and mask and not self.training and (self.device or -1) < 0 then
    local plan = unpad_plan(self, ids, types, mask)
    if plan then
      self._ran_packed = true
      return self:_forward_packed(plan)
    end
  end
  local emb = self.embeddings:forward(ids, types)
  local seq = self.encoder:forward(emb, mask)
  self._seq = seq
  local pooled = self.pooler and self.pooler:forward(seq) or nil
  return { last_hidden_state = seq, pooler_output = pooled, hidden_states = self.encoder.hidden_states }
end
-- backward(dseq, dpooled): dseq [B,S,H] or nil (zeros), dpooled [B,H] or nil.
-- dseq is modified in place when given (the pooler's gradient is added to its [CLS] rows).
function BertModel:backward(dseq, dpooled)
  if self._ran_packed then
    error("BertModel:backward: the last forward ran on packed tokens for inference; call "
      .. "bertlua.bert.infer.unpack(model) and forward again first", 2)
  end
  local seq = self._seq
  if dpooled then
    if not self.pooler then error("BertModel:backward: gradient for pooler_output but the model has no pooler", 2) end
    local dp = self.pooler:backward(seq, dpooled)
    if dseq then dseq:select(2, 1):add_(dp:select(2, 1)) else dseq = dp end
  elseif not dseq then
    dseq = buf(self, "grad_seq", seq:shape())
    dseq:zero_()
  end
  local plan = self._plan
  if plan then  -- unpadded training: the gradient of the real tokens only (the padded ones' is zero)
    local dy = buf(self, "_unpad_dy", { 1, plan.T, seq:size(3) })
    ops.gather(dseq, plan.pos, dy)
    dseq = dy
  end
  local demb = self.encoder:backward(self.encoder.hidden_states[1], dseq)
  self.embeddings:backward(self._ids, demb)
end
-- sequence_output() -> the last forward's last hidden state [B, S, H] (what forward returned as last_hidden_state)
function BertModel:sequence_output() return self._seq end
function M.BertModel(cfg, opts) return BertModel(cfg, opts) end

M.resolve_cfg = resolve_cfg
-- the recipes' option for BertEncoder.checkpoint (pretrain, squad, glue set model.bert.encoder.checkpoint from it)
M.CHECKPOINT_OPTION = { "checkpoint_activations", false, "recompute each encoder layer's forward in the backward: "
  .. "one layer's activations in memory instead of all (about a third more compute; the same results, bit for bit)" }
M.as_ids = as_ids

return M
