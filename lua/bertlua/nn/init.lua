-- bertlua.nn: neural-network modules with explicit forward and backward
-- (the Torch7 `nn` contract, without its macro machinery).
--
--   local nn = require "bertlua.nn"
--   local lin = nn.Linear(768, 3072)
--   lin:flatten{ seed = 1 }               -- allocate + initialise parameters
--   local y = lin:forward(x)              -- y is lin's buffer, reused next call
--   local dx = lin:backward(x, dy)        -- grads ACCUMULATE into lin.grad_weight ...
--
-- Contract of every module:
--  * forward(input) -> output; backward(input, grad_output) -> grad_input.
--    A module with two differentiable inputs takes a table ({ h, residual })
--    and returns a table of their gradients; a non-differentiable context
--    (the attention mask) may follow the input in forward. backward must
--    follow the forward of the same input (the module keeps what it needs:
--    LayerNorm statistics, attention probabilities, the dropout counter
--    offset). Task models (bertlua.bert heads) take a batch table and
--    backward(loss_scale): their criterion (nn.CrossEntropyCriterion, ...,
--    bertlua.nn.criterion) holds the loss and its gradient.
--  * Outputs and input gradients live in buffers owned by the module and
--    reused on the next call when the shape repeats: copy them if you need
--    them after the next forward/backward.
--  * Parameter gradients ACCUMULATE (+=) across backward calls, so several
--    micro-batches sum into one gradient; call model:zero_grad() per step.
--  * Parameters are declared with `self:param(name, shape, init)` and
--    children with `self:add(name, module)`. Nothing is allocated until the
--    ROOT module's flatten() lays every parameter out in ONE flat f32 buffer
--    (and one flat gradient buffer of the same layout) and sets
--    `module[name]` / `module["grad_" .. name]` to views into them. Names are
--    the dotted child path (Hugging Face names: "encoder.layer.0.output.dense.weight").
--    After changing the structure (inserting a layer, swapping a module with
--    parameters) call flatten() again: existing values are kept, new
--    parameters are initialised.
--  * Dropout draws from the root's Philox generator (`model.rng`, seeded by
--    flatten{seed=}): each dropout call reserves a fresh counter range, so a
--    run is reproducible from the seed, and backward regenerates the same mask.
--  * train()/eval(): dropout is the identity in eval mode.
--  * Devices: model:to("cuda:0") (after flatten) moves the flat parameter and
--    gradient buffers to the GPU; every module then allocates its buffers
--    there (`module.device`) and the same C entry points run the CUDA
--    kernels. Inputs may stay on the CPU: BertModel copies them over.
--    model:to{ device = "cuda:0", dtype = "bf16" } also runs forward and
--    backward in bf16 (or f16): f32 master parameters and gradients stay in
--    flat_params/flat_grads, the modules read a half copy (flat_compute) and
--    keep half activations. The optimizers of bertlua.train.optim built with
--    model= write that copy in their update pass; after any other change of
--    flat_params call model:sync_compute(). The CPU path is unchanged by all this.
local bl = require "bertlua.tensor"
local ops = require "bertlua.nn.ops"

local M = {}

-- classes --------------------------------------------------------------------
local Module = {}
Module.__index = Module
Module.__name = "Module"
M.Module = Module

-- class(name[, parent]) -> class table; calling it constructs (runs __init).
function M.class(name, parent)
  parent = parent or Module
  local cls = {}
  cls.__index = cls
  cls.__name = name
  cls.__tostring = parent.__tostring
  setmetatable(cls, {
    __index = parent,
    __call = function(c, ...)
      local o = setmetatable({}, c)
      o:__init(...)
      return o
    end,
  })
  M[name] = cls
  return cls
end

function Module:__init()
  self._params = {}
  self._children = {}
  self.training = true
end

function Module:__tostring() return getmetatable(self).__name end

-- param(name, shape, init): init is "normal" (BERT truncated normal with the
-- root's initializer_range), "zeros" or "ones".
function Module:param(name, shape, init)
  self._params[#self._params + 1] = { name = name, shape = shape, init = init or "normal" }
  return self
end

-- add(name, module): a child; its parameters are named "<name>.<...>".
function Module:add(name, mod)
  for i, c in ipairs(self._children) do
    if c.name == name then self._children[i].module = mod; self[name] = mod; return mod end
  end
  self._children[#self._children + 1] = { name = name, module = mod }
  self[name] = mod
  return mod
end

function Module:children()
  local r = {}
  for i, c in ipairs(self._children) do r[i] = c.module end
  return r
end

-- apply(fn): fn(module) on this module and every descendant (pre-order).
function Module:apply(fn)
  fn(self)
  for _, c in ipairs(self._children) do c.module:apply(fn) end
  return self
end

function Module:train(flag)
  if flag == nil then flag = true end
  return self:apply(function(m) m.training = flag end)
end
function Module:eval() return self:train(false) end

-- _layout(prefix, list): append {name, entry, module} in flat-buffer order.
-- A module can override this to keep a group of parameters contiguous
-- (entry.contiguous = true: no alignment gap before it), e.g. fused QKV.
function Module:_layout(prefix, list)
  for _, p in ipairs(self._params) do
    list[#list + 1] = { name = prefix .. p.name, entry = p, module = self }
  end
  for _, c in ipairs(self._children) do c.module:_layout(prefix .. c.name .. ".", list) end
end

local ALIGN = 16  -- floats: every parameter group starts on a 64-byte boundary

local function numel_of(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end

-- BERT's initializer: normal(0, std) truncated at 2 std by resampling, from
-- the Philox stream (seed, rng offsets): the same seed gives the same weights.
local function trunc_normal_(t, rng, std)
  local n = t:numel()
  t:normal_(rng.seed, rng:advance(n), 0, std)
  local p = t:ptr()
  local lim = 2 * std
  local bad = {}
  for i = 0, n - 1 do
    local v = p[i]
    if v > lim or v < -lim then bad[#bad + 1] = i end
  end
  while #bad > 0 do
    local tmp = bl.empty({ #bad })
    tmp:normal_(rng.seed, rng:advance(#bad), 0, std)
    local q, still = tmp:ptr(), {}
    for j, i in ipairs(bad) do
      local v = q[j - 1]
      if v <= lim and v >= -lim then p[i] = v else still[#still + 1] = i end
    end
    bad = still
  end
end
M.trunc_normal_ = trunc_normal_

-- flatten{seed=, std=}: (re)allocate the flat parameter and gradient buffers
-- of this (root) module, keep the values of parameters that already exist,
-- initialise the new ones, and give every module the root's generator.
function Module:flatten(opts)
  opts = opts or {}
  if opts.seed ~= nil or not self.rng then self.rng = bl.Generator(opts.seed or 0) end
  local std = opts.std or self.initializer_range or 0.02
  local list = {}
  self:_layout("", list)
  local seen, off = {}, 0
  local plist = {}
  for _, e in ipairs(list) do
    if seen[e.entry] then error("flatten: parameter " .. e.name .. " is registered twice", 2) end
    seen[e.entry] = true
    if not e.entry.contiguous then off = math.ceil(off / ALIGN) * ALIGN end
    e.offset = off
    e.numel = numel_of(e.entry.shape)
    off = off + e.numel
    plist[#plist + 1] = e
  end
  local total = math.max(math.ceil(off / ALIGN) * ALIGN, ALIGN)
  local flat, gflat = bl.zeros({ total }), bl.zeros({ total })
  for _, e in ipairs(plist) do
    local p = e.entry
    local v = flat:narrow(1, e.offset + 1, e.numel):view(p.shape)
    local g = gflat:narrow(1, e.offset + 1, e.numel):view(p.shape)
    local old = p.tensor
    if old and old:numel() == e.numel then
      v:copy_(old)
    elseif p.init == "ones" then v:fill_(1)
    elseif p.init == "zeros" then v:fill_(0)
    else trunc_normal_(v, self.rng, std) end
    p.tensor, p.grad = v, g
    e.module[p.name] = v
    e.module["grad_" .. p.name] = g
  end
  local rng = self.rng
  self:apply(function(m) m.rng = rng end)
  self.flat_params, self.flat_grads, self._plist = flat, gflat, plist
  if self.device or self.compute_dtype then  -- a model already moved: move the new buffers too
    return self:to{ device = self.device or "cpu", dtype = self.compute_dtype or "f32" }
  end
  self:apply(function(m) if m._after_flatten then m:_after_flatten() end end)
  return self
end

-- to(device) / to(dtype) / to{ device =, dtype = } on the ROOT module (after
-- flatten): moves the flat parameter and gradient buffers to `device` (cpu,
-- cuda, cuda:N) and makes every module allocate its buffers there. dtype
-- (f32, bf16, f16) is the compute dtype: for a half dtype the modules use a
-- half copy of the parameters (self.flat_compute, same layout) and half
-- activations, while flat_params / flat_grads stay f32 (master weights,
-- gradients accumulated in f32); an optimizer built with model= writes the
-- half copy as it updates flat_params, after any other update call
-- sync_compute(). Tensors returned by earlier forwards are not moved.
local COMPUTE = { f32 = "f32", float32 = "f32", bf16 = "bf16", bfloat16 = "bf16", f16 = "f16", float16 = "f16",
  half = "f16" }
function Module:to(what)
  if not self._plist then error("to: call flatten() on the root module first", 2) end
  local device, dtype
  if type(what) == "table" then
    device, dtype = what.device, what.dtype
  elseif type(what) == "string" and (what == "cpu" or what:match("^cuda")) or type(what) == "number" then
    device = what
  else
    dtype = what
  end
  local dev = device ~= nil and bl.device_of(device, "to") or self.flat_params.device_
  local cdt = COMPUTE[dtype or self.compute_dtype or "f32"]
  if not cdt then error("to: compute dtype must be f32, bf16 or f16, got " .. tostring(dtype), 2) end
  dtype = cdt
  local flat, gflat = self.flat_params, self.flat_grads
  if flat.device_ ~= dev then
    flat, gflat = flat:to{ device = dev }, gflat:to{ device = dev }
    self.flat_params:free(); self.flat_grads:free()
  end
  if self.flat_compute then self.flat_compute:free() end
  local comp = dtype ~= "f32" and flat:to(dtype) or nil
  for _, e in ipairs(self._plist) do
    local p = e.entry
    local v = flat:narrow(1, e.offset + 1, e.numel):view(p.shape)
    local g = gflat:narrow(1, e.offset + 1, e.numel):view(p.shape)
    p.tensor, p.grad = v, g
    e.module[p.name] = comp and comp:narrow(1, e.offset + 1, e.numel):view(p.shape) or v
    e.module["grad_" .. p.name] = g
  end
  self.flat_params, self.flat_grads, self.flat_compute = flat, gflat, comp
  self.compute_dtype = dtype ~= "f32" and dtype or nil
  local mdev, act = dev >= 0 and dev or nil, self.compute_dtype
  self:apply(function(m)
    m.device, m.act_dtype = mdev, act
    if m._after_flatten then m:_after_flatten() end
  end)
  return self
end

-- sync_compute(): refresh the half parameter copy from flat_params (no-op in f32).
function Module:sync_compute()
  if self.flat_compute then self.flat_compute:copy_(self.flat_params) end
  return self
end

-- parameters() -> list of {name=, param=, grad=, offset=, numel=, shape=} in flat order.
function Module:parameters()
  if not self._plist then error("parameters: call flatten() on the root module first", 2) end
  local r = {}
  for i, e in ipairs(self._plist) do
    r[i] = { name = e.name, param = e.entry.tensor, grad = e.entry.grad, offset = e.offset,
      numel = e.numel, shape = e.entry.shape }
  end
  return r
end

function Module:num_parameters()
  local n = 0
  for _, e in ipairs(self._plist or {}) do n = n + e.numel end
  return n
end

function Module:zero_grad()
  if not self.flat_grads then error("zero_grad: call flatten() on the root module first", 2) end
  self.flat_grads:zero_()
  return self
end

-- buffers ----------------------------------------------------------------------
-- buf(self, key, shape[, dtype]): the module's reusable tensor `key` (bertlua.nn.buffer)
local buf = require "bertlua.nn.buffer"
M.buf = buf

-- move_buffers(from, to[, keep]): every buffer of module `from` and its descendants
-- becomes the buffer of the same key in `to` (a module of the same structure:
-- the children are paired in order), freeing what `to` held there; keep(m, key)
-- true leaves that one where it is. Activation checkpointing passes one set of
-- a layer's buffers from layer to layer this way (BertEncoder).
local function move_buffers(from, to, keep)
  local keys = from._buf_keys
  if keys then
    local tk = to._buf_keys
    if not tk then tk = {}; to._buf_keys = tk end
    for key in pairs(keys) do
      if not (keep and keep(from, key)) then
        local t, old = from[key], to[key]
        if old ~= nil and old ~= t and old.storage_ ~= nil then old:free() end
        to[key], from[key], keys[key], tk[key] = t, nil, nil, true
      end
    end
  end
  for i, c in ipairs(from._children or {}) do move_buffers(c.module, to._children[i].module, keep) end
end

M.move_buffers = move_buffers

local function with_last(t, n)
  local s = t:shape()
  s[#s] = n
  return s
end
M.with_last = with_last

-- basic layers ----------------------------------------------------------------------
local Linear = M.class("Linear")
function Linear:__init(in_features, out_features, bias)
  Module.__init(self)
  self.in_features, self.out_features = in_features, out_features
  self:param("weight", { out_features, in_features }, "normal")
  if bias ~= false then self:param("bias", { out_features }, "zeros") end
end
-- self.packed (set by bertlua.bert.infer) is used in eval mode only
function Linear:forward(x)
  local y = buf(self, "output", with_last(x, self.out_features))
  return ops.linear(x, self.weight, self.bias, y, not self.training and self.packed or nil)
end
-- backward(x, dy[, dx]): dx (overwritten) may be given, e.g. a view.
function Linear:backward(x, dy, dx)
  dx = dx or buf(self, "grad_input", x:shape())
  return ops.linear_backward(dy, x, self.weight, { dx = dx, dw = self.grad_weight, db = self.grad_bias })
end

local Embedding = M.class("Embedding")
function Embedding:__init(num, dim)
  Module.__init(self)
  self.num_embeddings, self.embedding_dim = num, dim
  self:param("weight", { num, dim }, "normal")
end
function Embedding:forward(ids)
  local s = ids:shape()
  s[#s + 1] = self.embedding_dim
  local y = buf(self, "output", s)
  return ops.embedding(self.weight, ids, y)
end
-- no gradient for integer ids: returns nil
function Embedding:backward(ids, dy)
  ops.embedding_backward(self.grad_weight, dy, ids)
  return nil
end

local LayerNorm = M.class("LayerNorm")
function LayerNorm:__init(dim, eps)
  Module.__init(self)
  self.dim, self.eps = dim, eps or 1e-12
  self:param("weight", { dim }, "ones")
  self:param("bias", { dim }, "zeros")
end
function LayerNorm:forward(x)
  local y = buf(self, "output", x:shape())
  local rows = x:numel() / self.dim
  local mean, rstd = buf(self, "mean", { rows }, "f32"), buf(self, "rstd", { rows }, "f32")
  return (ops.layernorm(x, self.weight, self.bias, self.eps, y, mean, rstd))
end
function LayerNorm:backward(x, dy)
  local dx = buf(self, "grad_input", x:shape())
  return ops.layernorm_backward(dy, x, self.weight, self.mean, self.rstd, self.grad_weight, self.grad_bias, dx)
end

-- draw(module, n): (p, seed, offset) for a dropout over n elements in train
-- mode, or p = 0 when dropout is off (eval, p = 0, or no generator yet).
local function draw(self, p, n)
  if not self.training or p == 0 then return 0, 0, 0 end
  local rng = self.rng
  if not rng then error(tostring(self) .. ": dropout needs the root's generator; call flatten() on the root", 3) end
  return p, rng.seed, rng:advance(n)
end
M.draw = draw

local Dropout = M.class("Dropout")
function Dropout:__init(p)
  Module.__init(self)
  self.p = p or 0.1
end
function Dropout:forward(x)
  local p, seed, off = draw(self, self.p, x:numel())
  self._p, self._seed, self._off = p, seed, off
  if p == 0 then return x end
  local y = buf(self, "output", x:shape())
  return (ops.dropout(x, p, seed, off, false, y))
end
function Dropout:backward(x, dy)
  if self._p == 0 then return dy end
  local dx = buf(self, "grad_input", dy:shape())
  return ops.dropout_backward(dy, self._p, self._seed, self._off, nil, dx)
end

-- activations -------------------------------------------------------------------------
-- An activation is a module without parameters. One that sets
-- `fuses_bias = true` also provides forward_bias(x, b) / backward_bias(x, b,
-- dy, db) computing act(x + b), which BertIntermediate uses to fuse the
-- dense layer's bias into the activation.
local GELU = M.class("GELU")
GELU.fuses_bias = true
function GELU:forward(x)
  local y = buf(self, "output", x:shape())
  return ops.gelu(x, y)
end
function GELU:backward(x, dy)
  local dx = buf(self, "grad_input", x:shape())
  return ops.gelu_backward(dy, x, dx)
end
function GELU:forward_bias(x, b)
  local y = buf(self, "output", x:shape())
  return ops.bias_gelu(x, b, y)
end
function GELU:backward_bias(x, b, dy, db)
  local dx = buf(self, "grad_input", x:shape())
  return ops.bias_gelu_backward(dy, x, b, db, dx)
end

local Tanh = M.class("Tanh")
function Tanh:forward(x)
  local y = buf(self, "output", x:shape())
  return ops.tanh(x, y)
end
function Tanh:backward(x, dy)
  local dx = buf(self, "grad_input", x:shape())
  return ops.tanh_backward(dy, self.output, dx)
end

-- ReLU written with tensor operations only: the way a researcher adds an activation.
local ReLU = M.class("ReLU")
function ReLU:forward(x)
  return x:relu(buf(self, "output", x:shape()))
end
function ReLU:backward(x, dy)
  return dy:mul(x:gt(0), buf(self, "grad_input", x:shape()))   -- by the 0/1 mask
end

-- tanh-approximated GELU (HF "gelu_new" / "gelu_pytorch_tanh"): one fused op each way (bias included when fused).
local GELUTanh = M.class("GELUTanh")
GELUTanh.fuses_bias = true
function GELUTanh:forward(x) return ops.gelu_tanh(x, nil, buf(self, "output", x:shape())) end
function GELUTanh:backward(x, dy) return ops.gelu_tanh_backward(dy, x, nil, nil, buf(self, "grad_input", x:shape())) end
function GELUTanh:forward_bias(x, b) return ops.gelu_tanh(x, b, buf(self, "output", x:shape())) end
function GELUTanh:backward_bias(x, b, dy, db)
  return ops.gelu_tanh_backward(dy, x, b, db, buf(self, "grad_input", x:shape()))
end

-- activation(name) -> module for a Hugging Face hidden_act name
function M.activation(name)
  if name == "gelu" then return M.GELU() end
  if name == "relu" then return M.ReLU() end
  if name == "tanh" then return M.Tanh() end
  if name == "gelu_new" or name == "gelu_pytorch_tanh" then return M.GELUTanh() end
  error("nn.activation: unknown activation '" .. tostring(name) .. "' (gelu, relu, tanh, gelu_new, gelu_pytorch_tanh)",
    2)
end

-- dense then activation (BertIntermediate, the MLM head's transform): the dense
-- bias goes into the activation's kernel when it can take it (bias+GELU).
-- The module keeps its buffers ("pre", "grad_input") and whether it fused.
-- On CUDA the tanh GELU goes into the GEMM ("epilogue"): "pre" then holds x W^T + b, bias included.
function M.dense_act_forward(self, dense, act, x)
  if dense.packed and not self.training and getmetatable(act) == M.GELU then  -- GELU in the packed GEMM's epilogue
    self._fused = "packed"
    -- self.bf16_out (bertlua.bert.infer): rounded to bf16 in the epilogue, for the next bf16 GEMM
    local out = buf(act, "output", with_last(x, dense.out_features), self.bf16_out and "bf16" or nil)
    return ops.linear(x, dense.weight, dense.bias, out, dense.packed, "gelu")
  end
  if getmetatable(act) == M.GELUTanh and dense.bias ~= nil and x:is_cuda() and getmetatable(dense) == Linear then
    self._fused = "epilogue"
    local pre = buf(self, "pre", with_last(x, dense.out_features))
    return ops.linear_gelu_tanh(x, dense.weight, dense.bias, buf(act, "output", pre:shape()), pre)
  end
  self._fused = act.fuses_bias and dense.bias ~= nil
  if not self._fused then return act:forward(dense:forward(x)) end
  local pre = buf(self, "pre", M.with_last(x, dense.out_features))
  ops.linear(x, dense.weight, nil, pre)
  return act:forward_bias(pre, dense.bias)
end
-- dy: gradient of the activation's output -> gradient of x (dense's grads accumulate). dacc (optional): a gradient
-- of x from elsewhere (a residual path); the result is dacc + the gradient, added by the dx GEMM where fused.
-- dy_is_dpre: dy is already the gradient of the pre-activation and the bias gradient is in (the next layer's dX GEMM
-- applied the activation's derivative: ops.linear_dgelu_tanh_backward).
function M.dense_act_backward(self, dense, act, x, dy, dacc, dy_is_dpre)
  if self._fused == "packed" then
    error(tostring(self) .. ": backward after a packed inference forward (GELU fused, pre-activation not kept); "
      .. "call bertlua.bert.infer.unpack(model) first", 3)
  end
  if self._fused == "epilogue" then
    local dpre = dy_is_dpre and dy or ops.gelu_tanh_backward(dy, self.pre, nil, nil, buf(act, "grad_input", dy:shape()))
    return ops.linear_backward(dpre, x, dense.weight, { dx = dacc or buf(self, "grad_input", x:shape()),
      dw = dense.grad_weight, db = not dy_is_dpre and dense.grad_bias or nil, accumulate = dacc ~= nil })
  end
  if not self._fused then
    local dx = dense:backward(x, act:backward(dense.output, dy))
    return dacc and dacc:add_(dx) or dx
  end
  local dpre = act:backward_bias(self.pre, dense.bias, dy, dense.grad_bias)
  local dx = dacc or buf(self, "grad_input", x:shape())
  return ops.linear_backward(dpre, x, dense.weight, { dx = dx, dw = dense.grad_weight, accumulate = dacc ~= nil })
end

-- in-place dst += src (same shape)
function M.add_(dst, src)
  return dst:add_(src)
end
-- A backward offered dacc (a gradient to add its own into) returns dacc itself when it added there, or its own
-- gradient alone (a module that ignores the offer): add_into(result, dacc) is the sum in both cases (dx when dacc
-- is nil).
function M.add_into(dx, dacc)
  if dacc == nil or rawequal(dx, dacc) then return dx end
  return dx:add_(dacc)
end

-- criteria (losses as objects): nn.CrossEntropyCriterion, MSECriterion, SpanCriterion, PreTrainingCriterion
for k, v in pairs(require "bertlua.nn.criterion") do M[k] = v end

return M
