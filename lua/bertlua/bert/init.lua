-- bertlua.bert: BERT (post-LayerNorm encoder) and its heads, in bertlua.nn modules.
--
--   local bert = require "bertlua.bert"
--   local model = bert.BertForPreTraining(bert.config.preset("base"), { seed = 42 })
--   local out = model:forward{ input_ids = ids, token_type_ids = tt, attention_mask = am,
--                              masked_lm_positions = pos, masked_lm_labels = lab,
--                              next_sentence_labels = nsp }
--   -- out.loss, out.mlm_loss, out.nsp_loss, out.mlm_accuracy, out.nsp_accuracy
--   model:zero_grad(); model:backward()     -- gradients of out.loss into model.flat_grads
--   bert.save_pretrained(model, "out/", { vocab = "vocab.txt" })
--   local m2 = bert.from_pretrained("out/", { head = "qa" })
--
-- Module tree and parameter names are those of Hugging Face transformers
-- (bert.embeddings.word_embeddings.weight, bert.encoder.layer.0.attention.self.query.weight,
-- cls.predictions.transform.dense.weight, qa_outputs.weight, classifier.weight ...),
-- so a state dict maps 1:1 to a safetensors file written or read by transformers.
--
-- Inputs: input_ids [B,S] i32/i64; token_type_ids [B,S] (default 0);
-- attention_mask [B,S] (1 = token, 0 = padding; default all 1).
-- Every module keeps its activations for backward and reuses its buffers
-- while shapes repeat; the returned tensors are those buffers.
-- Devices: model:to("cuda:0") (nn.Module:to) runs the model on a GPU; batch
-- tensors (ids, masks, labels) may stay on the CPU, they are copied to the
-- model's device here. Results (losses, counts, accuracies) come back as Lua
-- numbers as on the CPU; returned tensors live on the model's device.
local core = require "bertlua.core"
local bl = require "bertlua.tensor"
local nn = require "bertlua.nn"
local config = require "bertlua.bert.config"
local C, ffi, check = core.C, core.ffi, core.check
local buf, draw, class, Module = nn.buf, nn.draw, nn.class, nn.Module

local M = {}
M.config = config

local i64box = ffi.typeof("int64_t[1]")

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
-- position ids 0..S-1 per row, cached per shape
local function position_ids(self, B, S)
  local p = self._pos
  if p and p:size(1) == B and p:size(2) == S and p.device_ == (self.device or -1) then return p end
  p = bl.empty({ B, S }, { dtype = "i32" })
  local ptr = p:ptr()
  for b = 0, B - 1 do for s = 0, S - 1 do ptr[b * S + s] = s end end
  p = on_device(self, p)
  self._pos = p
  return p
end
local function zero_types(self, B, S)
  local t = self._zero_types
  if t and t:size(1) == B and t:size(2) == S and t.device_ == (self.device or -1) then return t end
  t = bl.zeros({ B, S }, { dtype = "i32", device = self.device })
  self._zero_types = t
  return t
end
function BertEmbeddings:forward(ids, types)
  local B, S = ids:size(1), ids:size(2)
  if S > self.cfg.max_position_embeddings then
    error(("BertEmbeddings: sequence length %d exceeds max_position_embeddings %d"):format(S,
      self.cfg.max_position_embeddings), 3)
  end
  types = types or zero_types(self, B, S)
  self._types, self._posids = types, position_ids(self, B, S)
  local H = self.cfg.hidden_size
  local sum = buf(self, "sum", { B, S, H })
  check(C.bl_embedding_forward(sum, self.word_embeddings.weight, ids, 0))
  check(C.bl_embedding_forward(sum, self.position_embeddings.weight, self._posids, 1))
  check(C.bl_embedding_forward(sum, self.token_type_embeddings.weight, types, 1))
  local y = self.LayerNorm:forward(sum)
  return self.dropout:forward(y)
end
function BertEmbeddings:backward(ids, dy)
  local dln = self.dropout:backward(self.LayerNorm.output, dy)
  local dsum = self.LayerNorm:backward(self.sum, dln)
  check(C.bl_embedding_backward(self.word_embeddings.grad_weight, dsum, ids))
  check(C.bl_embedding_backward(self.position_embeddings.grad_weight, dsum, self._posids))
  check(C.bl_embedding_backward(self.token_type_embeddings.grad_weight, dsum, self._types))
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
    return ffi.cast("char*", b.data_) - ffi.cast("char*", a.data_) == n * C.bl_dtype_size(a.dtype_)
  end
  self._qkv = nil
  if q.weight and adjacent(q.weight, k.weight, H * H) and adjacent(k.weight, v.weight, H * H)
      and q.bias and adjacent(q.bias, k.bias, H) and adjacent(k.bias, v.bias, H) then
    -- a [3H, H] / [3H] view starting at the query tensor (same storage)
    local function fuse(t, n, shape)
      local out = ffi.new("bl_tensor*[1]")
      local nd = #shape
      local sh = ffi.new("int64_t[2]", shape[1], shape[2] or 0)
      local st = ffi.new("int64_t[2]", nd == 2 and shape[2] or 1, 1)
      check(C.bl_tensor_as_strided(t, nd, sh, st, t.offset_, out))
      return bl.wrap(out[0])
    end
    self._qkv = {
      w = fuse(q.weight, 3 * H * H, { 3 * H, H }), b = fuse(q.bias, 3 * H, { 3 * H }),
      gw = fuse(q.grad_weight, 3 * H * H, { 3 * H, H }), gb = fuse(q.grad_bias, 3 * H, { 3 * H }),
    }
  end
end
function BertSelfAttention:forward(x, mask)
  local B, S, H = x:size(1), x:size(2), x:size(3)
  local q, k, v
  if self.fused and self._qkv then
    local qkv = buf(self, "qkv", { B, S, 3 * H })
    check(C.bl_linear_forward(qkv, x, self._qkv.w, self._qkv.b))
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
  local ctx = buf(self, "output", { B, S, H })
  -- what backward needs: the probabilities [B,heads,S,S] on the CPU (self.probs),
  -- the row logsumexp [B,heads,S] on a GPU (self.lse); see bl_attention_saved_shape
  local saved
  if self.device then
    local sh = ffi.new("int64_t[4]")
    local nd = C.bl_attention_saved_shape(self.device, B, S, self.heads, sh)
    local shape = {}
    for i = 1, nd do shape[i] = tonumber(sh[i - 1]) end
    saved = buf(self, "lse", shape, "f32")
  else
    saved = buf(self, "probs", { B, self.heads, S, S }, "f32")
  end
  self._saved, self._mask = saved, mask
  local p, seed, off = draw(self, self.p, B * self.heads * S * S)
  self._drop = { p, seed, off }
  check(C.bl_attention_forward_saved(ctx, saved, q, k, v, mask, self.heads, 0, p, seed, off))
  return ctx
end
function BertSelfAttention:backward(x, dctx)
  local B, S, H = x:size(1), x:size(2), x:size(3)
  local p, seed, off = self._drop[1], self._drop[2], self._drop[3]
  local dx = buf(self, "grad_input", { B, S, H })
  if self._used_fused then
    local dqkv = buf(self, "grad_qkv", { B, S, 3 * H })
    if self._dqkv_src ~= dqkv then
      self._dq, self._dk, self._dv = dqkv:narrow(3, 1, H), dqkv:narrow(3, H + 1, H), dqkv:narrow(3, 2 * H + 1, H)
      self._dqkv_src = dqkv
    end
    check(C.bl_attention_backward_saved(self._dq, self._dk, self._dv, dctx, self._q, self._k, self._v, self.output,
      self._saved, self._mask, self.heads, 0, p, seed, off))
    check(C.bl_linear_backward(dx, self._qkv.gw, self._qkv.gb, dqkv, x, self._qkv.w, 0))
  else
    local dq, dk, dv = buf(self, "grad_q", { B, S, H }), buf(self, "grad_k", { B, S, H }), buf(self, "grad_v", { B, S, H })
    check(C.bl_attention_backward_saved(dq, dk, dv, dctx, self._q, self._k, self._v, self.output, self._saved,
      self._mask, self.heads, 0, p, seed, off))
    check(C.bl_linear_backward(dx, self.query.grad_weight, self.query.grad_bias, dq, x, self.query.weight, 0))
    check(C.bl_linear_backward(dx, self.key.grad_weight, self.key.grad_bias, dk, x, self.key.weight, 1))
    check(C.bl_linear_backward(dx, self.value.grad_weight, self.value.grad_bias, dv, x, self.value.weight, 1))
  end
  return dx
end

-- dense + dropout + residual + LayerNorm (BertSelfOutput and BertOutput):
-- y = LN(dropout(dense(h)) + residual) with the fused residual_layernorm op.
local BertOutput = class("BertOutput")
function BertOutput:__init(cfg, in_features)
  Module.__init(self)
  self.cfg = cfg
  self.p = cfg.hidden_dropout_prob
  self:add("dense", nn.Linear(in_features or cfg.intermediate_size, cfg.hidden_size))
  self:add("LayerNorm", nn.LayerNorm(cfg.hidden_size, cfg.layer_norm_eps))
end
function BertOutput:forward(h, residual)
  local d = self.dense:forward(h)
  local y = buf(self, "output", residual:shape())
  local rows = residual:numel() / self.cfg.hidden_size
  local mean, rstd = buf(self, "mean", { rows }, "f32"), buf(self, "rstd", { rows }, "f32")
  local p, seed, off = draw(self, self.p, d:numel())
  self._drop = { p, seed, off }
  local ln = self.LayerNorm
  check(C.bl_residual_layernorm_forward(y, mean, rstd, d, residual, ln.weight, ln.bias, ln.eps, p, seed, off))
  return y
end
-- returns dh, dresidual
function BertOutput:backward(h, residual, dy)
  local d = self.dense.output
  local dd, dres = buf(self, "grad_dense", d:shape()), buf(self, "grad_residual", residual:shape())
  local ln = self.LayerNorm
  local p, seed, off = self._drop[1], self._drop[2], self._drop[3]
  check(C.bl_residual_layernorm_backward(dd, dres, ln.grad_weight, ln.grad_bias, dy, d, residual, ln.weight,
    self.mean, self.rstd, p, seed, off))
  return self.dense:backward(h, dd), dres
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
  return self.output:forward(self.self:forward(x, mask), x)
end
function BertAttention:backward(x, dy)
  local dctx, dres = self.output:backward(self.self.output, x, dy)
  local dx = self.self:backward(x, dctx)
  return nn.add_(dx, dres)
end

-- dense + activation; the dense bias is fused into GELU when the activation allows it
local BertIntermediate = class("BertIntermediate")
function BertIntermediate:__init(cfg)
  Module.__init(self)
  self:add("dense", nn.Linear(cfg.hidden_size, cfg.intermediate_size))
  self:add("intermediate_act_fn", nn.activation(cfg.hidden_act))
end
function BertIntermediate:forward(x)
  local act, dense = self.intermediate_act_fn, self.dense
  self._fused = act.fuses_bias and dense.bias ~= nil
  if self._fused then
    local lin = buf(self, "pre", nn.with_last(x, dense.out_features))
    check(C.bl_linear_forward(lin, x, dense.weight, nil))
    self.output = act:forward_bias(lin, dense.bias)
  else
    self.output = act:forward(dense:forward(x))
  end
  return self.output
end
function BertIntermediate:backward(x, dy)
  local act, dense = self.intermediate_act_fn, self.dense
  if self._fused then
    local dpre = act:backward_bias(self.pre, dense.bias, dy, dense.grad_bias)
    local dx = buf(self, "grad_input", x:shape())
    check(C.bl_linear_backward(dx, dense.grad_weight, nil, dpre, x, dense.weight, 0))
    return dx
  end
  return dense:backward(x, act:backward(dense.output, dy))
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
  return self.output:forward(i, a)
end
function BertLayer:backward(x, dy)
  local a = self.attention.output.output
  local di, dres = self.output:backward(self.intermediate.output, a, dy)
  local da = self.intermediate:backward(a, di)
  nn.add_(da, dres)
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
  self._children = {}
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
function BertEncoder:forward(x, mask)
  local hs = { x }
  for i, l in ipairs(self.layer) do
    x = l:forward(x, mask)
    hs[i + 1] = x
  end
  self.hidden_states = hs
  return x
end
function BertEncoder:backward(x, dy)
  local hs = self.hidden_states
  for i = #self.layer, 1, -1 do dy = self.layer[i]:backward(hs[i], dy) end
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
-- backward(seq, dy, dseq): ADDS the gradient into dseq's [CLS] rows
function BertPooler:backward(seq, dy, dseq)
  local dpre = self.activation:backward(self.dense.output, dy)
  local d = self.dense
  check(C.bl_linear_backward(dseq:select(2, 1), d.grad_weight, d.grad_bias, dpre, self._cls, d.weight, 1))
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
-- forward{input_ids=, token_type_ids=, attention_mask=} ->
-- { last_hidden_state [B,S,H], pooler_output [B,H] (nil without pooler),
--   hidden_states = { embeddings, layer 1, ..., layer L } }
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
  self._ids, self._mask = ids, mask
  local emb = self.embeddings:forward(ids, types)
  local seq = self.encoder:forward(emb, mask)
  local pooled = self.pooler and self.pooler:forward(seq) or nil
  return { last_hidden_state = seq, pooler_output = pooled, hidden_states = self.encoder.hidden_states }
end
-- backward(dseq, dpooled): dseq [B,S,H] or nil (zeros), dpooled [B,H] or nil.
-- dseq is modified in place when given (the pooler adds into its [CLS] rows).
function BertModel:backward(dseq, dpooled)
  local hs = self.encoder.hidden_states
  local seq = hs[#hs]
  if not dseq then
    dseq = buf(self, "grad_seq", seq:shape())
    dseq:zero_()
  end
  if dpooled then
    if not self.pooler then error("BertModel:backward: gradient for pooler_output but the model has no pooler", 2) end
    self.pooler:backward(seq, dpooled, dseq)
  end
  local demb = self.encoder:backward(hs[1], dseq)
  self.embeddings:backward(self._ids, demb)
end
function M.BertModel(cfg, opts) return BertModel(cfg, opts) end

-- heads -------------------------------------------------------------------------------------
local function new_head(cls, cfg, opts, pooler)
  local self = setmetatable({}, cls)
  Module.__init(self)
  opts = opts or {}
  cfg = resolve_cfg(cfg)
  self.cfg = cfg
  self.initializer_range = cfg.initializer_range
  self:add("bert", BertModel(cfg, { pooler = pooler, flatten = false }))
  return self, cfg, opts
end

-- scratch scalars for the loss ops
local function f64_scalar(self, key) return buf(self, key, { 1 }, "f64") end

-- cross_entropy into module buffers: returns loss, count; dlogits kept in self[dkey]
local function cross_entropy(self, dkey, logits, targets, ignore, grad_scale)
  local loss = f64_scalar(self, "_loss_" .. dkey)
  local dl = buf(self, dkey, logits:shape())
  local cnt = i64box()
  check(C.bl_cross_entropy(loss, dl, logits, targets, ignore, grad_scale or 1, cnt))
  return loss:item(), tonumber(cnt[0])
end

local function accuracy(logits, targets, ignore)
  local c, n = i64box(), i64box()
  check(C.bl_accuracy(logits, targets, ignore, c, n))
  local cnt = tonumber(n[0])
  return cnt > 0 and tonumber(c[0]) / cnt or 0, tonumber(c[0]), cnt
end

local BertPredictionHeadTransform = class("BertPredictionHeadTransform")
function BertPredictionHeadTransform:__init(cfg)
  Module.__init(self)
  self:add("dense", nn.Linear(cfg.hidden_size, cfg.hidden_size))
  self:add("transform_act_fn", nn.activation(cfg.hidden_act))
  self:add("LayerNorm", nn.LayerNorm(cfg.hidden_size, cfg.layer_norm_eps))
end
function BertPredictionHeadTransform:forward(x)
  local act, dense = self.transform_act_fn, self.dense
  self._fused = act.fuses_bias
  local a
  if self._fused then
    local pre = buf(self, "pre", nn.with_last(x, dense.out_features))
    check(C.bl_linear_forward(pre, x, dense.weight, nil))
    a = act:forward_bias(pre, dense.bias)
  else
    a = act:forward(dense:forward(x))
  end
  self._act = a
  return self.LayerNorm:forward(a)
end
function BertPredictionHeadTransform:backward(x, dy)
  local act, dense = self.transform_act_fn, self.dense
  local da = self.LayerNorm:backward(self._act, dy)
  if self._fused then
    local dpre = act:backward_bias(self.pre, dense.bias, da, dense.grad_bias)
    local dx = buf(self, "grad_input", x:shape())
    check(C.bl_linear_backward(dx, dense.grad_weight, nil, dpre, x, dense.weight, 0))
    return dx
  end
  return dense:backward(x, act:backward(dense.output, da))
end

-- MLM head: transform, then logits = t E^T + bias with E the (tied) word embeddings.
local BertLMPredictionHead = class("BertLMPredictionHead")
function BertLMPredictionHead:__init(cfg)
  Module.__init(self)
  self:param("bias", { cfg.vocab_size }, "zeros")
  self:add("transform", nn.BertPredictionHeadTransform(cfg))
end
-- decoder(x, E) -> logits [M, V]
function BertLMPredictionHead:forward(x, E)
  local t = self.transform:forward(x)
  local logits = buf(self, "output", { x:size(1), E:size(1) })
  check(C.bl_linear_forward(logits, t, E, self.bias))
  return logits
end
-- accumulates dE (tied word-embedding gradient) and returns dx
function BertLMPredictionHead:backward(x, E, dE, dlogits)
  local t = self.transform.LayerNorm.output
  local dt = buf(self, "grad_t", t:shape())
  check(C.bl_linear_backward(dt, dE, self.grad_bias, dlogits, t, E, 0))
  return self.transform:backward(x, dt)
end

local BertPreTrainingHeads = class("BertPreTrainingHeads")
function BertPreTrainingHeads:__init(cfg)
  Module.__init(self)
  self:add("predictions", nn.BertLMPredictionHead(cfg))
  self:add("seq_relationship", nn.Linear(cfg.hidden_size, 2))
end

-- BertForPreTraining: MLM (only at the masked positions) + next-sentence prediction.
local BertForPreTraining = class("BertForPreTraining")
M.BertForPreTraining_class = BertForPreTraining
function M.BertForPreTraining(cfg, opts)
  local self, _, o = new_head(BertForPreTraining, cfg, opts, true)
  self:add("cls", nn.BertPreTrainingHeads(self.cfg))
  -- NVIDIA's data pads masked_lm_labels with -1; HF uses -100 in `labels`
  self.ignore_index = o.ignore_index or -1
  self.nsp = o.nsp ~= false
  self:flatten{ seed = o.seed or 0 }
  return self
end

-- masked positions: from masked_lm_positions [B,P] (0-based within each
-- sequence) + masked_lm_labels [B,P] (ignore_index = padding), or from HF
-- style `labels` [B,S] (-100 or ignore_index = not masked). Only counted
-- positions are gathered, so the decoder GEMM runs on M rows, not B*S.
local function masked_positions(self, batch, B, S)
  local ign = self.ignore_index
  local pos, lab = {}, {}
  if batch.masked_lm_positions ~= nil then
    local P = bl.as_tensor(batch.masked_lm_positions, { dtype = "i64" })
    local L = bl.as_tensor(batch.masked_lm_labels, { dtype = "i64" })
    if P:numel() ~= L:numel() or P:numel() % B ~= 0 then
      error(("BertForPreTraining: masked_lm_positions %s and masked_lm_labels %s must both be [batch, P]"):format(
        bl.shape_str(P:shape()), bl.shape_str(L:shape())), 3)
    end
    local np = P:numel() / B
    local pv, lv = P:totable(), L:totable()
    for b = 0, B - 1 do
      for j = 1, np do
        local l = lv[b * np + j]
        if l ~= ign and l ~= -100 then
          local p = pv[b * np + j]
          if p < 0 or p >= S then
            error(("BertForPreTraining: masked_lm_positions[%d][%d] = %d is outside the sequence (length %d)"):format(
              b + 1, j, p, S), 3)
          end
          pos[#pos + 1] = b * S + p
          lab[#lab + 1] = l
        end
      end
    end
  elseif batch.labels ~= nil then
    local L = bl.as_tensor(batch.labels, { dtype = "i64" })
    if L:numel() ~= B * S then error("BertForPreTraining: labels must be [batch, seq] like input_ids", 3) end
    local lv = L:totable()
    for i = 1, B * S do
      local l = lv[i]
      if l ~= ign and l ~= -100 then pos[#pos + 1] = i - 1; lab[#lab + 1] = l end
    end
  else
    return nil
  end
  local n = #pos
  local m = math.max(n, 1)
  -- filled on the host: the module's own buffers on the CPU, staging tensors for a GPU
  local pt = self.device and bl.empty({ m }, { dtype = "i32" }) or buf(self, "_mpos", { m }, "i32")
  local lt = self.device and bl.empty({ m }, { dtype = "i32" }) or buf(self, "_mlab", { m }, "i32")
  local pp, lp = pt:ptr(), lt:ptr()
  for i = 1, n do pp[i - 1] = pos[i]; lp[i - 1] = lab[i] end
  if n == 0 then pp[0] = 0; lp[0] = ign end  -- one ignored row keeps the shapes non-empty
  if self.device then
    pt = buf(self, "_mpos", { m }, "i32"):copy_(pt)
    lt = buf(self, "_mlab", { m }, "i32"):copy_(lt)
  end
  return pt, lt, n
end

-- forward(batch) -> { loss, mlm_loss, nsp_loss, mlm_accuracy, nsp_accuracy,
-- mlm_count, mlm_logits [M,V], nsp_logits [B,2], sequence_output, pooled_output }.
-- Gradients of the losses w.r.t. the logits are computed here (cheaply, by the
-- same fused cross-entropy op) and used by backward().
function BertForPreTraining:forward(batch)
  local out = self.bert:forward(batch)
  local seq, pooled = out.last_hidden_state, out.pooler_output
  local B, S, H = seq:size(1), seq:size(2), seq:size(3)
  local res = { sequence_output = seq, pooled_output = pooled, hidden_states = out.hidden_states, loss = 0 }
  local pos, lab, n = masked_positions(self, batch, B, S)
  self._pos, self._lab = pos, lab
  local E = self.bert.embeddings.word_embeddings.weight
  if pos then
    local g = buf(self, "_gathered", { pos:numel(), H })
    check(C.bl_gather_forward(g, seq, pos))
    local logits = self.cls.predictions:forward(g, E)
    local loss, cnt = cross_entropy(self, "_dmlm", logits, lab, self.ignore_index, 1)
    res.mlm_loss, res.mlm_count, res.mlm_logits = loss, cnt, logits
    res.mlm_accuracy = accuracy(logits, lab, self.ignore_index)
    res.loss = res.loss + loss
  end
  local nsp = batch.next_sentence_labels or batch.next_sentence_label
  local nlog = self.cls.seq_relationship:forward(pooled)
  res.nsp_logits = nlog
  if nsp ~= nil and self.nsp then
    local t = bl.as_tensor(nsp, { dtype = "i32" })
    if t:numel() ~= B then error("BertForPreTraining: next_sentence_labels must have one label per sequence", 2) end
    t = on_device(self, t:view({ B }))
    self._nsp_t = t
    local loss = cross_entropy(self, "_dnsp", nlog, t, self.ignore_index, 1)
    res.nsp_loss = loss
    res.nsp_accuracy = accuracy(nlog, t, self.ignore_index)
    res.loss = res.loss + loss
  else
    self._nsp_t = nil
  end
  self._has_mlm = pos ~= nil
  return res
end

-- backward([loss_scale]): gradients of loss * loss_scale, accumulated into the flat gradient buffer.
function BertForPreTraining:backward(loss_scale)
  loss_scale = loss_scale or 1
  local hs = self.bert.encoder.hidden_states
  local seq = hs[#hs]
  local dseq = buf(self, "_dseq", seq:shape())
  dseq:zero_()
  local emb = self.bert.embeddings.word_embeddings
  if self._has_mlm then
    local dl = self._dmlm
    if loss_scale ~= 1 then check(C.bl_affine(dl, dl, loss_scale, 0)) end
    local dg = self.cls.predictions:backward(self._gathered, emb.weight, emb.grad_weight, dl)
    check(C.bl_gather_backward(dseq, dg, self._pos))
  end
  local dpooled
  if self._nsp_t then
    local dn = self._dnsp
    if loss_scale ~= 1 then check(C.bl_affine(dn, dn, loss_scale, 0)) end
    dpooled = self.cls.seq_relationship:backward(self.bert.pooler.output, dn)
  end
  self.bert:backward(dseq, dpooled)
end

-- BertForQuestionAnswering: start/end logits over tokens (SQuAD).
local BertForQuestionAnswering = class("BertForQuestionAnswering")
function M.BertForQuestionAnswering(cfg, opts)
  local self, c, o = new_head(BertForQuestionAnswering, cfg, opts, false)  -- HF: no pooler
  self:add("qa_outputs", nn.Linear(c.hidden_size, 2))
  self:flatten{ seed = o.seed or 0 }
  return self
end
-- forward{..., start_positions=[B], end_positions=[B]} -> { start_logits [B,S], end_logits [B,S], loss? }
-- Positions outside [0, S) are clamped to S and ignored, as in transformers.
function BertForQuestionAnswering:forward(batch)
  local out = self.bert:forward(batch)
  local seq = out.last_hidden_state
  local B, S = seq:size(1), seq:size(2)
  local logits = self.qa_outputs:forward(seq)  -- [B,S,2]
  local st, en = buf(self, "start_logits", { B, S }), buf(self, "end_logits", { B, S })
  st:copy_(logits:select(3, 1)); en:copy_(logits:select(3, 2))
  local res = { start_logits = st, end_logits = en, sequence_output = seq, hidden_states = out.hidden_states }
  self._has_loss = false
  if batch.start_positions ~= nil and batch.end_positions ~= nil then
    local function clamp(x, key)
      local t = bl.as_tensor(x, { dtype = "i64" })
      if t:numel() ~= B then error("BertForQuestionAnswering: " .. key .. " must have one position per sequence", 3) end
      local v = t:totable()
      local r = self.device and bl.empty({ B }, { dtype = "i32" }) or buf(self, "_" .. key, { B }, "i32")
      local p = r:ptr()
      for i = 1, B do p[i - 1] = math.min(math.max(v[i], 0), S) end
      if self.device then r = buf(self, "_" .. key, { B }, "i32"):copy_(r) end
      return r
    end
    local sp, ep = clamp(batch.start_positions, "start_positions"), clamp(batch.end_positions, "end_positions")
    local ls = cross_entropy(self, "_dstart", st, sp, S, 0.5)
    local le = cross_entropy(self, "_dend", en, ep, S, 0.5)
    res.start_loss, res.end_loss, res.loss = ls, le, (ls + le) / 2
    self._has_loss = true
  end
  return res
end
-- backward([loss_scale]) for the loss, or backward(dstart, dend) with given logit gradients
function BertForQuestionAnswering:backward(a, b)
  local seq = self.bert.encoder.hidden_states[#self.bert.encoder.hidden_states]
  local B, S = seq:size(1), seq:size(2)
  local ds, de
  if bl.is_tensor(a) then ds, de = a, b
  else
    if not self._has_loss then error("BertForQuestionAnswering:backward: forward had no start/end positions", 2) end
    ds, de = self._dstart, self._dend
    if a and a ~= 1 then check(C.bl_affine(ds, ds, a, 0)); check(C.bl_affine(de, de, a, 0)) end
  end
  local dl = buf(self, "_dlogits", { B, S, 2 })
  dl:select(3, 1):copy_(ds); dl:select(3, 2):copy_(de)
  local dseq = self.qa_outputs:backward(seq, dl)
  self.bert:backward(dseq, nil)
end

-- BertForSequenceClassification: dropout + linear on the pooled [CLS];
-- num_labels == 1 is regression with MSE (STS-B), as in transformers.
local BertForSequenceClassification = class("BertForSequenceClassification")
function M.BertForSequenceClassification(cfg, opts)
  local self, c, o = new_head(BertForSequenceClassification, cfg, opts, true)
  self.num_labels = o.num_labels or c.num_labels or 2
  c.num_labels = self.num_labels
  local p = c.classifier_dropout
  if type(p) ~= "number" then p = c.hidden_dropout_prob end
  self:add("dropout", nn.Dropout(p))
  self:add("classifier", nn.Linear(c.hidden_size, self.num_labels))
  self:flatten{ seed = o.seed or 0 }
  return self
end
-- forward{..., labels=[B]} -> { logits [B, num_labels], loss?, accuracy? }
function BertForSequenceClassification:forward(batch)
  local out = self.bert:forward(batch)
  local pooled = out.pooler_output
  local B = pooled:size(1)
  local x = self.dropout:forward(pooled)
  self._x = x
  local logits = self.classifier:forward(x)
  local res = { logits = logits, pooled_output = pooled, hidden_states = out.hidden_states }
  self._kind = nil
  if batch.labels ~= nil then
    if self.num_labels == 1 then
      local t = on_device(self, bl.as_tensor(batch.labels, { dtype = "f32" }))
      if t:numel() ~= B then error("BertForSequenceClassification: labels must have one value per sequence", 2) end
      local loss = f64_scalar(self, "_loss")
      local dl = buf(self, "_dlogits", logits:shape())
      check(C.bl_mse_loss(loss, dl, logits, t, 1))
      res.loss = loss:item()
      self._kind = "mse"
    else
      local t = bl.as_tensor(batch.labels, { dtype = "i32" })
      if t:numel() ~= B then error("BertForSequenceClassification: labels must have one value per sequence", 2) end
      t = on_device(self, t:view({ B }))
      res.loss = cross_entropy(self, "_dlogits", logits, t, -100, 1)
      res.accuracy = accuracy(logits, t, -100)
      self._kind = "ce"
    end
  end
  return res
end
function BertForSequenceClassification:backward(a)
  local dl
  if bl.is_tensor(a) then dl = a
  else
    if not self._kind then error("BertForSequenceClassification:backward: forward had no labels", 2) end
    dl = self._dlogits
    if a and a ~= 1 then check(C.bl_affine(dl, dl, a, 0)) end
  end
  local dx = self.classifier:backward(self._x, dl)
  if self.dropout._p ~= 0 then dx = self.dropout:backward(self.bert.pooler.output, dx) end
  self.bert:backward(nil, dx)
end

-- head name -> constructor (from_pretrained{head=...})
M.heads = {
  model = M.BertModel, bert = M.BertModel,
  pretraining = M.BertForPreTraining, pretrain = M.BertForPreTraining,
  qa = M.BertForQuestionAnswering, squad = M.BertForQuestionAnswering,
  classification = M.BertForSequenceClassification, glue = M.BertForSequenceClassification,
}
M.architectures = {
  BertModel = "model", BertForPreTraining = "pretraining",
  BertForQuestionAnswering = "qa", BertForSequenceClassification = "classification",
}

-- save_pretrained / from_pretrained live here so users need one module
function M.save_pretrained(model, dir, opts)
  return require("bertlua.io.safetensors").save_pretrained(model, dir, opts)
end
function M.from_pretrained(dir, opts)
  return require("bertlua.io.safetensors").from_pretrained(dir, opts)
end

-- feature extraction (BERT's extract_features.py) ---------------------------------------
-- pair(tokens_a, tokens_b, max_len) -> tokens, type_ids: [CLS] a [SEP] (b [SEP]),
-- truncating the longer of a/b one token at a time (original _truncate_seq_pair).
function M.pair(a, b, max_len)
  a = { unpack(a) }
  if b then
    b = { unpack(b) }
    while #a + #b > max_len - 3 do
      if #a > #b then a[#a] = nil else b[#b] = nil end
    end
  else
    while #a > max_len - 2 do a[#a] = nil end
  end
  local toks, types = { "[CLS]" }, { 0 }
  for _, t in ipairs(a) do toks[#toks + 1] = t; types[#types + 1] = 0 end
  toks[#toks + 1] = "[SEP]"; types[#types + 1] = 0
  if b then
    for _, t in ipairs(b) do toks[#toks + 1] = t; types[#types + 1] = 1 end
    toks[#toks + 1] = "[SEP]"; types[#types + 1] = 1
  end
  return toks, types
end

-- extract_features(model, examples, opts, emit): examples = list of {tokens=, ids=, type_ids=}
-- (as made by pair()); runs a BertModel (or any head's .bert) in eval mode in
-- batches of opts.batch (padded to the longest example of the batch: padding
-- is masked out, so values equal those of padding to max_seq_length) and
-- calls emit(i, line) with the JSON line of example i (0-based linex_index):
-- {"linex_index": i, "features": [{"token": t, "layers": [{"index": -1, "values": [...]}, ...]}, ...]}
-- opts.layers: list of layer indices, negative from the last encoder layer
-- (-1 = last; 0 = the embeddings output). Values are printed with %.9g.
function M.extract_features(model, examples, opts, emit)
  local cjson = require "cjson"
  local m = model.bert or model
  m:eval()
  local layers = opts.layers or { -1, -2, -3, -4 }
  local L = #m.encoder.layer
  for _, li in ipairs(layers) do
    if li < -L or li > L then error(("extract_features: layer index %d out of range for %d layers"):format(li, L), 2) end
  end
  local bs = opts.batch or 8
  local first = 1
  while first <= #examples do
    local last = math.min(first + bs - 1, #examples)
    local n = last - first + 1
    local S = 0
    for i = first, last do S = math.max(S, #examples[i].ids) end
    local ids = bl.zeros({ n, S }, { dtype = "i32" })
    local types = bl.zeros({ n, S }, { dtype = "i32" })
    local mask = bl.zeros({ n, S }, { dtype = "f32" })
    local ip, tp, mp = ids:ptr(), types:ptr(), mask:ptr()
    for i = first, last do
      local e, row = examples[i], (i - first) * S
      for j = 1, #e.ids do ip[row + j - 1] = e.ids[j]; tp[row + j - 1] = e.type_ids[j]; mp[row + j - 1] = 1 end
    end
    local out = m:forward{ input_ids = ids, token_type_ids = types, attention_mask = mask }
    local hs = out.hidden_states
    local H = hs[1]:size(3)
    local ptrs = {}
    for k, li in ipairs(layers) do
      local h = hs[li < 0 and (L + 1 + li + 1) or (li + 1)]:contiguous()
      if h:is_cuda() or h:dtype() ~= "f32" then h = h:to{ dtype = "f32", device = "cpu" } end
      ptrs[k] = { h, h:ptr() }
    end
    for i = first, last do
      local e = examples[i]
      local feats = {}
      for j = 1, #e.tokens do
        local ls = {}
        for k, li in ipairs(layers) do
          local p = ptrs[k][2]
          local base = ((i - first) * S + (j - 1)) * H
          local v = {}
          for d = 0, H - 1 do v[d + 1] = string.format("%.9g", p[base + d]) end
          ls[k] = ('{"index": %d, "values": [%s]}'):format(li, table.concat(v, ", "))
        end
        feats[j] = ('{"token": %s, "layers": [%s]}'):format(cjson.encode(e.tokens[j]), table.concat(ls, ", "))
      end
      emit(e.index or (i - 1), ('{"linex_index": %d, "features": [%s]}'):format(e.index or (i - 1), table.concat(feats, ", ")))
    end
    first = last + 1
  end
end

return M
