-- bertlua.io.onnx: a BERT model as a standard ONNX graph, written by bertlua
-- (bertlua.io.protobuf; no Python, no onnx package).
--
--   local onnx = require "bertlua.io.onnx"
--   onnx.export(model, "model.onnx", { head = "qa", precision = "fp32", batch = "batch_size",
--     seq = "sequence_length" })
--
-- Opset 17, IR version 8. Inputs input_ids, attention_mask, token_type_ids
-- (int64 [batch, seq]); outputs named as Hugging Face's optimum names them:
--   head "none" last_hidden_state [batch, seq, H]
--   head "qa"   start_logits, end_logits [batch, seq]
--   head "cls"  logits [batch, num_labels] (pooler, then the classifier)
--   head "mlm"  logits [batch, seq, vocab_size] (the transform, then the tied decoder)
-- The encoder is plain ops in transformers' own pattern (Gather embeddings,
-- LayerNormalization, MatMul + Add, Reshape/Transpose into heads, scores
-- divided by sqrt(head size) plus the extended mask (1 - mask) * -10000,
-- Softmax, erf GELU), the form onnxruntime's transformer optimizer fuses into
-- Attention, SkipLayerNormalization and Gelu. opts.batch / opts.seq: a number
-- (a fixed dimension) or a name (dynamic). precision "fp16": weights and
-- activations in float16 (for GPU runtimes); the inputs stay int64.
local ffi = require "ffi"
local bl = require "bertlua.tensor"
local pb = require "bertlua.io.protobuf"

local M = {}

local FLOAT, INT64, FLOAT16 = 1, 7, 10
local ATTR_FLOAT, ATTR_INT, ATTR_INTS = 1, 2, 7
M.OPSET, M.IR_VERSION = 17, 8

-- A graph under construction: nodes, initializers, inputs and outputs as protobuf messages.
local Graph = {}
Graph.__index = Graph

local function new_graph(dtype)
  return setmetatable({ nodes = {}, inits = {}, inputs = {}, outputs = {}, n = 0, dtype = dtype }, Graph)
end

-- a fresh value name for an op's output
function Graph:tmp(hint)
  self.n = self.n + 1
  return ("%s_%d"):format(hint or "t", self.n)
end

-- node(op, inputs, outputs | nil, attrs[, float_attrs]) -> the first output's name; attrs: { name = number | {ints} }
-- (a number with a fractional part or a float_attrs entry is a float)
function Graph:node(op, inputs, outputs, attrs, float_attrs)
  outputs = outputs or { self:tmp(op) }
  if type(outputs) == "string" then outputs = { outputs } end
  local m = pb.message()
  for _, i in ipairs(inputs) do m:string(1, i) end
  for _, o in ipairs(outputs) do m:string(2, o) end
  m:string(3, outputs[1]):string(4, op)
  local names = {}
  for k in pairs(attrs or {}) do names[#names + 1] = k end
  table.sort(names)
  for _, k in ipairs(names) do
    local v, a = attrs[k], pb.message():string(1, k)
    if type(v) == "table" then
      for _, x in ipairs(v) do a:int(8, x) end
      a:int(20, ATTR_INTS)
    elseif (float_attrs and float_attrs[k]) or v ~= math.floor(v) then
      a:float(2, v):int(20, ATTR_FLOAT)
    else
      a:int(3, v):int(20, ATTR_INT)
    end
    m:message(5, a)
  end
  self.nodes[#self.nodes + 1] = m
  return outputs[1]  -- one value: a call may stand last in another node's input list
end

local function tensor_proto(name, dims, dtype, raw)
  local t = pb.message()
  for _, d in ipairs(dims) do t:int(1, d) end
  return t:int(2, dtype):string(8, name):bytes(9, raw)
end

-- weight(name, t[, transpose]): an initializer in the graph's float dtype, from a bertlua tensor
function Graph:weight(name, t, transpose)
  if transpose then t = t:transpose(1, 2) end
  local half = self.dtype == FLOAT16
  t = t:to({ dtype = half and "f16" or "f32", device = "cpu" }):contiguous()
  self.inits[#self.inits + 1] = tensor_proto(name, t:shape(), self.dtype, ffi.string(t.data_, t:numel() * (half and 2
    or 4)))
  return name
end

-- const(name, values, dtype[, dims]): a small initializer (int64 or the graph's float dtype); dims {} = a scalar
function Graph:const(name, values, dtype, dims)
  dims = dims or { #values }
  local raw
  if dtype == INT64 then
    local a = ffi.new("int64_t[?]", math.max(#values, 1))
    for i, v in ipairs(values) do a[i - 1] = v end
    raw = ffi.string(a, #values * 8)
  else
    local t = bl.from(values):to(dtype == FLOAT16 and "f16" or "f32")
    raw = ffi.string(t.data_, #values * (dtype == FLOAT16 and 2 or 4))
  end
  self.inits[#self.inits + 1] = tensor_proto(name, dims, dtype, raw)
  return name
end

-- scalar(name, x): a float scalar constant in the graph's dtype
function Graph:scalar(name, x) return self:const(name, { x }, self.dtype, {}) end

local function value_info(name, elem, dims)
  local shape = pb.message()
  for _, d in ipairs(dims) do
    local dim = pb.message()
    if type(d) == "number" then dim:int(1, d) else dim:string(2, d) end
    shape:message(1, dim)
  end
  local tensor = pb.message():int(1, elem):message(2, shape)
  return pb.message():string(1, name):message(2, pb.message():message(1, tensor))
end

function Graph:input(name, elem, dims) self.inputs[#self.inputs + 1] = value_info(name, elem, dims) end
function Graph:output(name, elem, dims) self.outputs[#self.outputs + 1] = value_info(name, elem, dims) end

-- model() -> the ModelProto message
function Graph:model(name, doc)
  local g = pb.message()
  for _, n in ipairs(self.nodes) do g:message(1, n) end
  g:string(2, name)
  for _, t in ipairs(self.inits) do g:message(5, t) end
  if doc then g:string(10, doc) end
  for _, v in ipairs(self.inputs) do g:message(11, v) end
  for _, v in ipairs(self.outputs) do g:message(12, v) end
  return pb.message():int(1, M.IR_VERSION):string(2, "bertlua"):string(3, "1")
    :message(8, pb.message():string(1, ""):int(2, M.OPSET)):message(7, g)
end

-- BERT ---------------------------------------------------------------------------------------
M.HEADS = { none = "model", qa = "qa", cls = "classification", mlm = "pretraining" }

-- linear(g, x, P, prefix): x @ W^T + b with prefix.weight [out, in] stored as [in, out] for MatMul
local function linear(g, x, P, prefix)
  local w = g:weight(prefix .. ".weight", P(prefix .. ".weight"), true)
  local b = g:weight(prefix .. ".bias", P(prefix .. ".bias"))
  return g:node("Add", { g:node("MatMul", { x, w }), b })
end

local function layernorm(g, x, P, prefix, eps)
  return g:node("LayerNormalization", { x, g:weight(prefix .. ".weight", P(prefix .. ".weight")),
    g:weight(prefix .. ".bias", P(prefix .. ".bias")) }, nil, { axis = -1, epsilon = eps }, { epsilon = true })
end

local function activation(g, x, act)
  if act == "relu" then return g:node("Relu", { x }) end
  -- transformers' erf GELU: x * 0.5 * (1 + erf(x / sqrt(2))), the pattern onnxruntime fuses into Gelu
  local e = g:node("Erf", { g:node("Div", { x, g.c.sqrt2 }) })
  return g:node("Mul", { g:node("Mul", { x, g:node("Add", { e, g.c.one }) }), g.c.half })
end

-- export(model, path, opts): see the top of the file. Raises level-0 errors naming what is missing.
function M.export(model, path, opts)
  opts = opts or {}
  local cfg = model.cfg
  local head = opts.head or "none"
  if not M.HEADS[head] then error(("onnx: unknown head '%s' (none, qa, cls, mlm)"):format(tostring(head)), 0) end
  if cfg.hidden_act ~= "gelu" and cfg.hidden_act ~= "relu" then
    error(("onnx: hidden_act '%s' is not exported (gelu, relu)"):format(tostring(cfg.hidden_act)), 0)
  end
  local fp16 = opts.precision == "fp16"
  if opts.precision and opts.precision ~= "fp32" and not fp16 then
    error(("onnx: precision must be fp32 or fp16, got %s"):format(tostring(opts.precision)), 0)
  end
  local params = {}
  for _, p in ipairs(model:parameters()) do params[p.name] = p.param end
  local pre = params["bert.embeddings.word_embeddings.weight"] and "bert." or ""
  local function P(name)
    local t = params[name] or params[pre .. name]
    if not t then error(("onnx: the model has no parameter %s (needed by head %s)"):format(name, head), 0) end
    return t
  end
  local g = new_graph(fp16 and FLOAT16 or FLOAT)
  local B, S = opts.batch or "batch_size", opts.seq or "sequence_length"
  local H, A = cfg.hidden_size, cfg.num_attention_heads
  local D, eps = H / A, cfg.layer_norm_eps or 1e-12
  g.c = { sqrt2 = g:scalar("const_sqrt2", math.sqrt(2)), one = g:scalar("const_one", 1),
    half = g:scalar("const_half", 0.5) }
  for _, n in ipairs({ "input_ids", "attention_mask", "token_type_ids" }) do g:input(n, INT64, { B, S }) end

  -- embeddings: word + position (0..S-1) + token type, then LayerNorm
  local E = "embeddings."
  local seq = g:node("Gather", { g:node("Shape", { "input_ids" }), g:const("const_axis1", { 1 }, INT64, {}) })
  local pos = g:node("Unsqueeze", { g:node("Range", { g:const("const_zero_i", { 0 }, INT64, {}), seq,
    g:const("const_one_i", { 1 }, INT64, {}) }), g:const("const_axes0", { 0 }, INT64) })
  local function table_(name) return g:weight(pre .. E .. name, P(E .. name)) end
  local word = g:node("Gather", { table_("word_embeddings.weight"), "input_ids" })
  local position = g:node("Gather", { table_("position_embeddings.weight"), pos })
  local types = g:node("Gather", { table_("token_type_embeddings.weight"), "token_type_ids" })
  local sum = g:node("Add", { g:node("Add", { word, position }), types })
  local x = layernorm(g, sum, P, pre .. E .. "LayerNorm", eps)

  -- the extended attention mask [B, 1, 1, S]: 0 where attended, -10000 where padded
  -- (two Unsqueezes, as transformers' export has them: the pattern onnxruntime's attention fusion matches)
  local m1 = g:node("Unsqueeze", { "attention_mask", g:const("const_axes1", { 1 }, INT64) })
  local mask = g:node("Cast", { g:node("Unsqueeze", { m1, g:const("const_axes2", { 2 }, INT64) }) }, nil,
    { to = g.dtype })
  local ext = g:node("Mul", { g:node("Sub", { g.c.one, mask }), g:scalar("const_mask_value", -10000) })
  local heads_shape = g:const("const_heads_shape", { 0, 0, A, D }, INT64)
  local hidden_shape = g:const("const_hidden_shape", { 0, 0, H }, INT64)
  local scale = g:scalar("const_sqrt_head", math.sqrt(D))
  for l = 0, cfg.num_hidden_layers - 1 do
    local L = ("%sencoder.layer.%d."):format(pre, l)
    local function split(name, perm)
      return g:node("Transpose", { g:node("Reshape", { linear(g, x, P, L .. "attention.self." .. name),
        heads_shape }) }, nil, { perm = perm })
    end
    local q, k, v = split("query", { 0, 2, 1, 3 }), split("key", { 0, 2, 3, 1 }), split("value", { 0, 2, 1, 3 })
    local scores = g:node("Add", { g:node("Div", { g:node("MatMul", { q, k }), scale }), ext })
    local ctx = g:node("MatMul", { g:node("Softmax", { scores }, nil, { axis = -1 }), v })
    ctx = g:node("Reshape", { g:node("Transpose", { ctx }, nil, { perm = { 0, 2, 1, 3 } }), hidden_shape })
    local attn = layernorm(g, g:node("Add", { linear(g, ctx, P, L .. "attention.output.dense"), x }), P,
      L .. "attention.output.LayerNorm", eps)
    local inter = activation(g, linear(g, attn, P, L .. "intermediate.dense"), cfg.hidden_act)
    x = layernorm(g, g:node("Add", { linear(g, inter, P, L .. "output.dense"), attn }), P, L .. "output.LayerNorm",
      eps)
  end

  local out_dtype = g.dtype
  if head == "none" then
    g:node("Identity", { x }, "last_hidden_state")
    g:output("last_hidden_state", out_dtype, { B, S, H })
  elseif head == "qa" then
    local logits = linear(g, x, P, "qa_outputs")
    local parts = { g:tmp("start"), g:tmp("end") }
    g:node("Split", { logits, g:const("const_split", { 1, 1 }, INT64) }, parts, { axis = -1 })
    local last = g:const("const_axes_last", { -1 }, INT64)
    g:node("Squeeze", { parts[1], last }, "start_logits")
    g:node("Squeeze", { parts[2], last }, "end_logits")
    g:output("start_logits", out_dtype, { B, S })
    g:output("end_logits", out_dtype, { B, S })
  elseif head == "cls" then
    local first = g:node("Gather", { x, g:const("const_zero_pos", { 0 }, INT64, {}) }, nil, { axis = 1 })
    local pooled = g:node("Tanh", { linear(g, first, P, pre .. "pooler.dense") })
    g:node("Identity", { linear(g, pooled, P, "classifier") }, "logits")
    g:output("logits", out_dtype, { B, P("classifier.weight"):size(1) })
  else
    local t = activation(g, linear(g, x, P, "cls.predictions.transform.dense"), cfg.hidden_act)
    t = layernorm(g, t, P, "cls.predictions.transform.LayerNorm", eps)
    -- the decoder is tied to the word embeddings: one copy in the file, transposed by the graph
    local dec = g:node("Transpose", { pre .. E .. "word_embeddings.weight" }, nil, { perm = { 1, 0 } })
    g:node("Add", { g:node("MatMul", { t, dec }), g:weight("cls.predictions.bias", P("cls.predictions.bias")) },
      "logits")
    g:output("logits", out_dtype, { B, S, cfg.vocab_size })
  end
  local m = g:model("bertlua_" .. head, ("BERT L%d/H%d/A%d exported by bertlua"):format(cfg.num_hidden_layers, H, A))
  if m.len >= 2 ^ 31 then
    error(("onnx: the model is %.1f GB; a single ONNX protobuf file holds at most 2 GB"):format(m.len / 2 ^ 30), 0)
  end
  pb.write(path, m)
  return { bytes = m.len, nodes = #g.nodes, initializers = #g.inits }
end

return M
