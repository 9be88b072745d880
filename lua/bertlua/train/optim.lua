-- bertlua.train.optim: optimizers over ONE flat parameter buffer and ONE flat
-- gradient buffer (see bertlua.nn Module:flatten). One C call updates every
-- parameter tensor (a "segment" of the flat buffers); the formulas and the
-- exact NVIDIA/apex semantics are documented in src/bl_optim.h.
--
--   local optim = require "bertlua.train.optim"
--   local opt = optim.LAMB{ model = model, lr = 6e-3 }      -- NVIDIA BERT pre-training
--   local opt = optim.LAMB{ params = flat, grads = gflat, segments = {
--       { name = "encoder.layer.0.attention.self.query.weight", offset = 0, length = 589824 },
--       { name = "encoder.layer.0.attention.self.query.bias", offset = 589824, length = 768 }, ... } }
--   local stats = opt:step(lr)      -- {grad_norm=, clip_coef=}; lr defaults to opts.lr
--   opt:zero_grad()
--   local sd = opt:state_dict(); opt2:load_state_dict(sd)
--
-- Segments: `offset` is the 0-based element offset into the flat buffers (what
-- Module:parameters() returns), `length` (or `numel`) the element count.
-- `decay` defaults to not optim.no_decay(name): biases and LayerNorm weights
-- get no weight decay, as in NVIDIA's and Hugging Face's BERT recipes. A
-- segment list may be Module:parameters() itself. Without segments the whole
-- buffer is one decayed segment.
--
-- LAMB defaults are NVIDIA's BERT pre-training (apex FusedLAMB): betas
-- (0.9, 0.999), eps 1e-6, weight_decay 0.01, max_grad_norm 1.0 (global
-- gradient-norm pre-normalisation), bias correction on, trust ratio only on
-- decayed segments (no-decay segments take a plain Adam step). Variants:
--   variant = "nvlamb": trust ratio on every segment (apex use_nvlamb=True)
--   variant = "paper":  LAMB paper (You et al. 2020, Alg. 2) as implemented
--     by cybertronai/pytorch-lamb: trust ratio everywhere with
--     phi(||w||) = min(||w||, 10), no global gradient pre-normalisation.
-- and each knob separately: bias_correction, use_nvlamb, adam_w_mode,
-- grad_averaging, max_weight_norm, max_trust_ratio.
--
-- AdamW defaults: bias correction on (torch.optim.AdamW), eps 1e-6 (BERT;
-- torch's default is 1e-8), weight_decay 0.01. optim.BertAdam{...} is BERT's
-- original optimizer: no bias correction, each parameter's gradient clipped
-- to norm 1 separately.
--
-- step(lr, {grad_scale=, grad_norm=}): grad_scale multiplies the gradients
-- first (fused unscale, e.g. 1/accumulation_steps); grad_norm gives the norm
-- of the scaled gradients when the caller already has it. The gradients are
-- not modified. Built with model= on a model that has a bf16/f16 compute copy (Module:to{dtype =}), every step
-- also writes that copy in the pass that updates the f32 weights: no model:sync_compute() after it. Non-finite
-- gradients raise an error and change nothing (with
-- fp16, bertlua.train.amp's loss scaler skips such steps before they get here).
local core = require "bertlua.core"
local bl = require "bertlua.tensor"
local C, ffi = core.C, core.ffi
local check = core.check

local M = {}

local i64arr = ffi.typeof("int64_t[?]")
local u8arr = ffi.typeof("uint8_t[?]")
local intbox = ffi.typeof("int[1]")
local dblbox = ffi.typeof("double[1]")

-- no_decay(name): true for parameters that take no weight decay (biases and
-- LayerNorm; "gamma"/"beta" are TF checkpoint names of LayerNorm weights).
function M.no_decay(name)
  if type(name) ~= "string" then return false end
  local low = name:lower()
  if low:find("bias", 1, true) or low:find("layernorm", 1, true) or low:find("layer_norm", 1, true) then
    return true
  end
  local last = low:match("([^%.]+)$")
  return last == "gamma" or last == "beta"
end

local function check_flat(t, what, op)
  if not bl.is_tensor(t) then error(op .. ": " .. what .. " must be a tensor, got " .. type(t), 4) end
  if t:dtype() ~= "f32" then error(op .. ": " .. what .. " must be an f32 flat buffer, got " .. t:dtype(), 4) end
  if not t:is_contiguous() then error(op .. ": " .. what .. " must be contiguous", 4) end
end

-- segments(list, numel) -> the C struct (with its arrays kept alive) and a
-- normalised Lua list {name=, offset=, length=, decay=}.
function M.segments(list, numel, op)
  op = op or "optim"
  if list == nil then list = { { offset = 0, length = numel, name = "params" } } end
  if type(list) ~= "table" then error(op .. ": segments must be a list of {offset=, length=, decay=, name=}", 3) end
  local n = #list
  local off, len, dec = i64arr(math.max(n, 1)), i64arr(math.max(n, 1)), u8arr(math.max(n, 1))
  local norm = {}
  for i, s in ipairs(list) do
    local o, l = s.offset, s.length or s.numel
    if type(o) ~= "number" or type(l) ~= "number" or o ~= math.floor(o) or l ~= math.floor(l) then
      error(("%s: segment %d (%s) needs integer offset= and length= (0-based element offset)")
        :format(op, i, tostring(s.name)), 3)
    end
    local d = s.decay
    if d == nil then d = not M.no_decay(s.name) end
    off[i - 1], len[i - 1], dec[i - 1] = o, l, d and 1 or 0
    norm[i] = { name = s.name, offset = o, length = l, decay = d and true or false }
  end
  local seg = ffi.new("bl_optim_segments")
  seg.count, seg.offset, seg.length, seg.decay = n, off, len, dec
  return { c = seg, keep = { off, len, dec }, list = norm }
end

local function bool(v, default)
  if v == nil then return default end
  return v and 1 or 0
end

local function check_keys(op, opts, allowed)
  for k in pairs(opts) do
    if not allowed[k] then
      local names = {}
      for a in pairs(allowed) do names[#names + 1] = a end
      table.sort(names)
      error(("%s: unknown option '%s' (valid: %s)"):format(op, tostring(k), table.concat(names, ", ")), 4)
    end
  end
end

local COMMON = { model = true, params = true, grads = true, segments = true, lr = true, name = true }
local function allow(extra)
  local t = {}
  for k in pairs(COMMON) do t[k] = true end
  for _, k in ipairs(extra) do t[k] = true end
  return t
end

local Optimizer = {}
Optimizer.__index = Optimizer

local function base(kind, opts, allowed)
  local op = "optim." .. kind
  if type(opts) ~= "table" then error(op .. ": expects a table of options", 3) end
  check_keys(op, opts, allowed)
  local params, grads, segs = opts.params, opts.grads, opts.segments
  if opts.model then
    params = params or opts.model.flat_params
    grads = grads or opts.model.flat_grads
    if segs == nil then segs = opts.model:parameters() end
  end
  check_flat(params, "params", op)
  check_flat(grads, "grads", op)
  if grads:numel() ~= params:numel() then
    error(("%s: grads has %d elements but params has %d"):format(op, grads:numel(), params:numel()), 3)
  end
  local lr = opts.lr
  if lr ~= nil and type(lr) ~= "number" then error(op .. ": lr must be a number", 3) end
  local self = setmetatable({
    kind = kind, params = params, grads = grads, lr = lr, step_count = 0,
    model = opts.model and rawequal(params, opts.model.flat_params) and opts.model or nil,
  }, Optimizer)
  self.seg = M.segments(segs, params:numel(), op)
  self.segment_list = self.seg.list
  self._stats = ffi.new("bl_optim_stats")
  self._args = ffi.new("bl_optim_args")
  return self
end

local function betas_of(op, opts, cfg)
  if opts.betas ~= nil then
    local b = opts.betas
    if type(b) ~= "table" or type(b[1]) ~= "number" or type(b[2]) ~= "number" then
      error(op .. ": betas must be {beta1, beta2}", 4)
    end
    cfg.beta1, cfg.beta2 = b[1], b[2]
  end
end

local function num(op, opts, key, cfg, field)
  local v = opts[key]
  if v == nil then return end
  if type(v) ~= "number" then error(("%s: %s must be a number, got %s"):format(op, key, type(v)), 4) end
  cfg[field or key] = v
end

-- half(): the model's bf16/f16 compute copy of params (Module:to{dtype =}), which the step writes in the pass that
-- updates params (no sync_compute after it); nil without one. Looked up at every step: to() makes a new copy.
function Optimizer:half()
  local m = self.model
  if m and m.flat_compute and rawequal(m.flat_params, self.params) then return m.flat_compute end
end

-- the bl_optim_args of a step (amp, state: the loss-scaled step's, else nil); m, v the optimizer's moments
local function step_args(s, m, v, lr, gs, gn, amp, state)
  local a = s._args
  a.w, a.half, a.g, a.m, a.v, a.seg = s.params, s:half(), s.grads, m, v, s.seg.c
  a.step, a.lr, a.grad_scale, a.stats, a.amp, a.amp_state = s.step_count, lr, gs, s._stats, amp, state
  a.has_grad_norm, a.grad_norm = gn and 1 or 0, gn or 0
  return a
end

-- the Adam family's state: config, the two moments (zeros like the parameters), the C step `fn` on them;
-- amp (optional): fn has a loss-scaled step whose skip/scale decision runs on the model's device.
local function adam_state(self, cfg, fn, amp)
  self.cfg = cfg
  self.exp_avg = bl.zeros_like(self.params)
  self.exp_avg_sq = bl.zeros_like(self.params)
  self._call = function(s, lr, gs, gn)
    return fn(s.cfg, step_args(s, s.exp_avg, s.exp_avg_sq, lr, gs, gn))
  end
  if amp then
    self._amp_call = function(s, lr, gs, amp_cfg, state)
      return fn(s.cfg, step_args(s, s.exp_avg, s.exp_avg_sq, lr, gs, nil, amp_cfg, state))
    end
  end
  self._moments = { "exp_avg", "exp_avg_sq" }
  return self
end

-- LAMB{...}: see the header comment for options and defaults.
function M.LAMB(opts)
  local self = base("lamb", opts, allow { "betas", "eps", "weight_decay", "max_grad_norm", "bias_correction",
    "use_nvlamb", "adam_w_mode", "grad_averaging", "max_weight_norm", "max_trust_ratio", "variant" })
  local op = "optim.LAMB"
  local cfg = ffi.new("bl_lamb_config")
  C.bl_lamb_config_default(cfg)
  local variant = opts.variant or "nvidia"
  if variant == "nvlamb" then
    cfg.use_nvlamb = 1
  elseif variant == "paper" then
    cfg.use_nvlamb, cfg.max_weight_norm, cfg.max_grad_norm = 1, 10, 0
  elseif variant ~= "nvidia" then
    error(op .. ": unknown variant '" .. tostring(variant) .. "' (nvidia, nvlamb, paper)", 2)
  end
  betas_of(op, opts, cfg)
  for _, k in ipairs { "eps", "weight_decay", "max_grad_norm", "max_weight_norm", "max_trust_ratio" } do
    num(op, opts, k, cfg)
  end
  cfg.bias_correction = bool(opts.bias_correction, cfg.bias_correction)
  cfg.use_nvlamb = bool(opts.use_nvlamb, cfg.use_nvlamb)
  cfg.adam_w_mode = bool(opts.adam_w_mode, cfg.adam_w_mode)
  cfg.grad_averaging = bool(opts.grad_averaging, cfg.grad_averaging)
  return adam_state(self, cfg, C.bl_lamb_step, true)
end

local function adamw(kind, opts, defaults)
  local self = base(kind, opts, allow { "betas", "eps", "weight_decay", "max_grad_norm", "bias_correction",
    "adam_w_mode", "per_segment_clip" })
  local op = "optim." .. kind
  local cfg = ffi.new("bl_adamw_config")
  C.bl_adamw_config_default(cfg)
  for k, v in pairs(defaults or {}) do cfg[k] = v end
  betas_of(op, opts, cfg)
  for _, k in ipairs { "eps", "weight_decay", "max_grad_norm" } do num(op, opts, k, cfg) end
  cfg.bias_correction = bool(opts.bias_correction, cfg.bias_correction)
  cfg.adam_w_mode = bool(opts.adam_w_mode, cfg.adam_w_mode)
  cfg.per_segment_clip = bool(opts.per_segment_clip, cfg.per_segment_clip)
  return adam_state(self, cfg, C.bl_adamw_step, cfg.per_segment_clip == 0)
end

-- AdamW{...}: torch.optim.AdamW with bias correction (default), BERT eps 1e-6.
function M.AdamW(opts) return adamw("adamw", opts) end

-- BertAdam{...}: the original BERT optimizer (no bias correction, per-parameter
-- gradient clipping at 1.0), e.g. for reproducing Google/HF fine-tuning.
function M.BertAdam(opts)
  return adamw("bertadam", opts, { bias_correction = 0, per_segment_clip = 1, max_grad_norm = 1.0 })
end

-- SGD{lr=, momentum=0, dampening=0, weight_decay=0, nesterov=false, max_grad_norm=0}
-- (torch.optim.SGD; weight decay only on decayed segments).
function M.SGD(opts)
  local self = base("sgd", opts, allow { "momentum", "dampening", "weight_decay", "nesterov", "max_grad_norm" })
  local op = "optim.SGD"
  local cfg = ffi.new("bl_sgd_config")
  C.bl_sgd_config_default(cfg)
  for _, k in ipairs { "momentum", "dampening", "weight_decay", "max_grad_norm" } do num(op, opts, k, cfg) end
  cfg.nesterov = bool(opts.nesterov, 0)
  self.cfg = cfg
  self._moments = {}
  if cfg.momentum > 0 then
    self.momentum_buffer = bl.zeros_like(self.params)
    self._moments = { "momentum_buffer" }
  end
  self._call = function(s, lr, gs, gn)
    return C.bl_sgd_step(s.cfg, step_args(s, s.momentum_buffer, nil, lr, gs, gn))
  end
  return self
end

-- step(lr[, {grad_scale=, grad_norm=}]) -> {grad_norm=, clip_coef=}
function Optimizer:step(lr, opts)
  lr = lr or self.lr
  if type(lr) ~= "number" then
    error("optim." .. self.kind .. ":step: no learning rate (pass step(lr) or lr= at construction)", 2)
  end
  opts = opts or {}
  local gs, gn = opts.grad_scale or 1.0, opts.grad_norm
  self.step_count = self.step_count + 1
  local rc = self._call(self, lr, gs, gn)
  if rc ~= 0 then
    self.step_count = self.step_count - 1   -- nothing was applied
    core.fail()
  end
  self.last_lr = lr
  return { grad_norm = self._stats.grad_norm, clip_coef = self._stats.clip_coef }
end

-- step_amp(lr, amp, state[, grad_scale]): a step whose loss-scale decision, skip and count of applied updates
-- (bias correction) are made where the buffers are, in the f64 state tensor of bl_optim.h (BL_AMP_*; amp a
-- bl_amp_config): on a GPU it queues its kernels and returns without waiting. step_count counts these calls
-- (the learning-rate schedule follows them); the applied updates are the state's. See bertlua.train.amp.
function Optimizer:step_amp(lr, amp, state, grad_scale)
  if not self._amp_call then
    error("optim." .. self.kind .. ":step_amp: this optimizer has no loss-scaled step (LAMB, AdamW without "
      .. "per-segment clipping do)", 2)
  end
  if type(lr) ~= "number" then error("optim." .. self.kind .. ":step_amp: lr must be a number", 2) end
  check(self._amp_call(self, lr, grad_scale or 1.0, amp, state))
  self:count_step(lr)
end

-- count_step(lr): the host's record of a queued step_amp (a replayed CUDA graph queues the step without calling it)
function Optimizer:count_step(lr)
  self.step_count = self.step_count + 1
  self.last_lr = lr
end

-- prepare(): before the first step on a GPU, the segment table uploaded and the step's scratch made, so that no
-- step allocates device memory (bl_optim_prepare). Nothing to do on the CPU.
function Optimizer:prepare()
  local dev = self.params:device()
  check(C.bl_optim_prepare(dev == "cpu" and -1 or tonumber(dev:match("%d+")), self.seg.c, self.params:numel()))
  return self
end

function Optimizer:zero_grad()
  self.grads:zero_()
  return self
end

-- state_dict(): {optimizer=kind, step=n, <moment name>=tensor, ...}. The
-- tensors are the live buffers (no copy): write them out before the next step.
function Optimizer:state_dict()
  local sd = { optimizer = self.kind, step = self.step_count, lr = self.last_lr or self.lr }
  for _, k in ipairs(self._moments) do sd[k] = self[k] end
  return sd
end

-- load_state_dict(sd): copies the moments in (sizes must match) and the step.
function Optimizer:load_state_dict(sd)
  local op = "optim." .. self.kind .. ":load_state_dict"
  if type(sd) ~= "table" then error(op .. ": expects a table from state_dict()", 2) end
  if sd.optimizer ~= self.kind then
    error(("%s: state is for optimizer '%s', this is '%s'"):format(op, tostring(sd.optimizer), self.kind), 2)
  end
  if type(sd.step) ~= "number" or sd.step < 0 or sd.step ~= math.floor(sd.step) then
    error(op .. ": step must be a non-negative integer", 2)
  end
  for _, k in ipairs(self._moments) do
    local t = sd[k]
    if not bl.is_tensor(t) then error(op .. ": missing tensor '" .. k .. "'", 2) end
    if t:numel() ~= self[k]:numel() then
      error(("%s: %s has %d elements, expected %d"):format(op, k, t:numel(), self[k]:numel()), 2)
    end
  end
  for _, k in ipairs(self._moments) do self[k]:copy_(sd[k]:view({ sd[k]:numel() })) end
  self.step_count = sd.step
  if sd.lr then self.last_lr = sd.lr end
  return self
end

-- global_norm(grads) -> L2 norm (f64, deterministic), nonfinite (boolean)
function M.global_norm(grads)
  check_flat(grads, "grads", "optim.global_norm")
  local n, bad = dblbox(), intbox()
  check(C.bl_grad_global_norm(grads, n, bad))
  return n[0], bad[0] ~= 0
end

-- clip_grad_norm(grads, max_norm) -> total norm before clipping.
-- torch.nn.utils.clip_grad_norm_ rule: coef = max_norm/(norm+1e-6), applied
-- when < 1. A non-finite norm is returned without touching the gradients.
function M.clip_grad_norm(grads, max_norm)
  if type(max_norm) ~= "number" or not (max_norm > 0) then
    error("optim.clip_grad_norm: max_norm must be a number > 0", 2)
  end
  local norm, bad = M.global_norm(grads)
  if bad then return norm end
  local coef = max_norm / (norm + 1e-6)
  if coef < 1 then check(C.bl_unscale_check(grads, coef, nil)) end
  return norm
end

-- scale_grads(grads, s): grads *= s in place (e.g. 1/accumulation_steps);
-- returns true when a gradient is inf/NaN.
function M.scale_grads(grads, s)
  check_flat(grads, "grads", "optim.scale_grads")
  local bad = intbox()
  check(C.bl_unscale_check(grads, s, bad))
  return bad[0] ~= 0
end

M.Optimizer = Optimizer
return M
