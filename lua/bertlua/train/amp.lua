-- bertlua.train.amp: mixed precision. Dynamic loss scaling for fp16 training (bf16
-- and fp32 need none: amp.NoScaler has the same interface and does nothing);
-- the --precision option of the recipes (check_precision, round_weights); and
-- MixedPrecision, the training step with f32 master weights that
-- recipes/pretrain.lua and bertlua.train.loop (SQuAD, GLUE) share (further below).
--
--   local amp = require "bertlua.train.amp"
--   local scaler = amp.scaler_for("fp16")          -- or amp.DynamicLossScaler{...}
--   loss_grad_seed = scaler:scale()                -- multiply the loss gradient by this
--   ... backward into the flat gradient buffer ...
--   local found_inf = scaler:unscale_and_check(grads)   -- grads *= 1/scale, one fused pass
--   if scaler:update(found_inf) then opt:step(lr) end   -- false: skip this step
-- or, in one call that leaves the gradients scaled and folds 1/scale into
-- the optimizer (one read pass less):
--   local stepped, stats = scaler:step(opt, lr)
--
-- Policy (torch.cuda.amp.GradScaler / apex dynamic scaling): start at
-- init_scale (2^16); any inf/NaN gradient skips the step and multiplies the
-- scale by backoff_factor (0.5), never below min_scale (1); growth_interval
-- (2000) consecutive clean steps multiply it by growth_factor (2), never
-- above max_scale (2^24). max_consecutive_skips (10) skips in a row at the
-- floor scale mean the gradients are NaN whatever the scale (a diverged model
-- or a bug, not an overflow): update() raises an error then, so a job stops
-- instead of skipping forever; the last checkpoint written stays the good one.
local core = require "bertlua.core"
local bl = require "bertlua.tensor"
local optim = require "bertlua.train.optim"
local C, ffi = core.C, core.ffi
local check = core.check

local M = {}

local intbox = ffi.typeof("int[1]")
local dblbox = ffi.typeof("double[1]")

local Scaler = {}
Scaler.__index = Scaler

local DEFAULTS = {
  init_scale = 65536, growth_factor = 2, backoff_factor = 0.5, growth_interval = 2000,
  min_scale = 1, max_scale = 2 ^ 24, max_consecutive_skips = 10,
}

function M.DynamicLossScaler(opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("amp.DynamicLossScaler: expects a table of options", 2) end
  local cfg = {}
  for k, v in pairs(DEFAULTS) do cfg[k] = v end
  for k, v in pairs(opts) do
    if DEFAULTS[k] == nil then
      error("amp.DynamicLossScaler: unknown option '" .. tostring(k) .. "' (init_scale, growth_factor, "
        .. "backoff_factor, growth_interval, min_scale, max_scale, max_consecutive_skips)", 2)
    end
    if type(v) ~= "number" or v ~= v then error("amp.DynamicLossScaler: " .. k .. " must be a number", 2) end
    cfg[k] = v
  end
  local function bad(msg) error("amp.DynamicLossScaler: " .. msg, 3) end
  if not (cfg.min_scale > 0) then bad("min_scale must be > 0") end
  if not (cfg.max_scale >= cfg.min_scale) then bad("max_scale must be >= min_scale") end
  if not (cfg.init_scale >= cfg.min_scale and cfg.init_scale <= cfg.max_scale) then
    bad(("init_scale %g must be within [min_scale %g, max_scale %g]"):format(cfg.init_scale, cfg.min_scale,
      cfg.max_scale))
  end
  if not (cfg.growth_factor >= 1) then bad("growth_factor must be >= 1") end
  if not (cfg.backoff_factor > 0 and cfg.backoff_factor < 1) then bad("backoff_factor must be in (0, 1)") end
  if not (cfg.growth_interval >= 1) or cfg.growth_interval ~= math.floor(cfg.growth_interval) then
    bad("growth_interval must be an integer >= 1")
  end
  if not (cfg.max_consecutive_skips >= 1) then bad("max_consecutive_skips must be >= 1") end
  return setmetatable({
    cfg = cfg, enabled = true,
    loss_scale = cfg.init_scale,
    growth_tracker = 0,        -- clean steps since the last change
    floor_skips = 0,           -- consecutive skips at min_scale
    skipped_steps = 0,         -- total skipped
    steps = 0,                 -- total update() calls
  }, Scaler)
end

function Scaler:scale() return self.loss_scale end

-- unscale_and_check(grads): grads *= 1/scale in place; true when any
-- gradient is inf/NaN (then the step must be skipped: call update()).
function Scaler:unscale_and_check(grads)
  local bad = intbox()
  check(C.bl_unscale_check(grads, 1.0 / self.loss_scale, bad))
  return bad[0] ~= 0
end

-- check(grads): true when any (still scaled) gradient is inf/NaN; also
-- returns the norm of the UNscaled gradients (for clipping / logging).
function Scaler:check(grads)
  local n, bad = dblbox(), intbox()
  check(C.bl_grad_global_norm(grads, n, bad))
  return bad[0] ~= 0, n[0] / self.loss_scale
end

local AMP_LEN = C.BL_AMP_STATE_LEN
local AMP_FIELDS = { -- state slot -> scaler field
  { C.BL_AMP_SCALE, "loss_scale" }, { C.BL_AMP_GROWTH, "growth_tracker" }, { C.BL_AMP_FLOOR_SKIPS, "floor_skips" },
  { C.BL_AMP_SKIPPED, "skipped_steps" }, { C.BL_AMP_CALLS, "steps" }, { C.BL_AMP_STEP, "applied_steps" },
}
local OWN_FIELDS = 5 -- update() writes back the first five (applied_steps is MixedPrecision's)
local statebox = ffi.typeof("double[?]")

-- the scaler's options as C's bl_amp_config (dynamic: a DynamicLossScaler)
local function amp_config(sc)
  local c = sc.cfg or { growth_factor = 2, backoff_factor = 0.5, min_scale = 1, max_scale = 1, growth_interval = 1 }
  return ffi.new("bl_amp_config", { growth_factor = c.growth_factor, backoff_factor = c.backoff_factor,
    min_scale = c.min_scale, max_scale = c.max_scale, growth_interval = c.growth_interval,
    dynamic = sc.enabled and 1 or 0 })
end

-- update(found_inf[, norm]) -> true when the optimizer should step. The decision is C's (bl_amp_decide, the
-- rule the optimizers' amp steps apply on either device), made on the scaler's fields.
function Scaler:update(found_inf, norm)
  self._amp_cfg = self._amp_cfg or amp_config(self)
  local a = statebox(AMP_LEN)
  for _, f in ipairs(AMP_FIELDS) do a[f[1]] = self[f[2]] or 0 end
  local skipped = intbox()
  check(C.bl_amp_decide(self._amp_cfg, a, found_inf and 0 / 0 or norm or 0, skipped))
  for i = 1, OWN_FIELDS do self[AMP_FIELDS[i][2]] = a[AMP_FIELDS[i][1]] end
  if self.floor_skips >= self.cfg.max_consecutive_skips then
    error(("loss scaler: %d consecutive non-finite gradients at scale %g — stopping; "
      .. "last good checkpoint is kept"):format(self.floor_skips, self.loss_scale), 2)
  end
  return skipped[0] == 0
end

-- step(opt, lr[, opts]) -> stepped (boolean), stats (from opt:step or nil).
-- Checks the scaled gradients without writing them, then lets the optimizer
-- read them with grad_scale = 1/scale (and the unscaled norm), so no
-- separate unscale pass is needed. opts.grad_scale (e.g. 1/accumulation
-- steps) multiplies in.
function Scaler:step(opt, lr, opts)
  local extra = opts and opts.grad_scale or 1.0
  local found_inf, norm = self:check(opt.grads)
  local s = self.loss_scale
  if not self:update(found_inf, norm) then return false, nil end
  return true, opt:step(lr, { grad_scale = extra / s, grad_norm = norm * extra })
end

function Scaler:state_dict()
  return {
    loss_scale = self.loss_scale, growth_tracker = self.growth_tracker, floor_skips = self.floor_skips,
    skipped_steps = self.skipped_steps, steps = self.steps,
  }
end

function Scaler:load_state_dict(sd)
  if type(sd) ~= "table" or type(sd.loss_scale) ~= "number" or not (sd.loss_scale > 0) then
    error("amp.DynamicLossScaler:load_state_dict: expects a table from state_dict() with loss_scale > 0", 2)
  end
  self.loss_scale = sd.loss_scale
  self.growth_tracker = sd.growth_tracker or 0
  self.floor_skips = sd.floor_skips or 0
  self.skipped_steps = sd.skipped_steps or 0
  self.steps = sd.steps or 0
  return self
end

-- NoScaler(): bf16 / fp32 training. Same interface; scale 1, never skips.
local NoScaler = {}
NoScaler.__index = NoScaler

function M.NoScaler()
  return setmetatable({ enabled = false, loss_scale = 1, skipped_steps = 0, steps = 0, growth_tracker = 0,
    floor_skips = 0 }, NoScaler)
end
function NoScaler:scale() return 1 end
function NoScaler:unscale_and_check(_) return false end
function NoScaler:check(grads)
  local norm = optim.global_norm(grads)
  return false, norm
end
function NoScaler:update(_)
  self.steps = self.steps + 1
  return true
end
function NoScaler:step(opt, lr, opts)
  self.steps = self.steps + 1
  return true, opt:step(lr, opts)
end
NoScaler.state_dict = Scaler.state_dict
function NoScaler:load_state_dict(sd)
  if type(sd) == "table" then self.steps = sd.steps or self.steps end
  return self
end

-- loss_scale_option(v, where) -> DynamicLossScaler options for a recipe's --loss-scale:
-- "dynamic" (nil: the defaults) or a fixed scale N (min = init = max = N, as TF's
-- FixedLossScaleManager: an overflowing step is still skipped, the scale never moves).
-- "dynamic:INIT[:INTERVAL]" starts the dynamic scale at INIT (instead of 2^16) and grows it after INTERVAL clean
-- steps (instead of 2000): a large INIT with a short interval makes overflows, hence skipped steps, happen.
function M.loss_scale_option(v, where)
  if v == nil or v == "dynamic" then return nil end
  local function bad()
    error(("%s: --loss-scale must be 'dynamic', 'dynamic:INIT[:INTERVAL]' or a positive number, got '%s'")
      :format(where or "amp", tostring(v)), 0)
  end
  local init, interval = tostring(v):match("^dynamic:([^:]+):?(.*)$")
  if init then
    local i, g = tonumber(init), interval ~= "" and tonumber(interval) or 2000
    if not i or not (i >= 1 and i <= 2 ^ 24) or not g or g < 1 or g ~= math.floor(g) then bad() end
    return { init_scale = i, growth_interval = g }
  end
  local n = tonumber(v)
  if not n or n <= 0 or n ~= n or n == math.huge then bad() end
  return { init_scale = n, min_scale = n, max_scale = n }
end

-- scaler_for(precision, opts): DynamicLossScaler for "fp16"/"f16"/"half",
-- NoScaler for "bf16" and "fp32".
function M.scaler_for(precision, opts)
  if precision == "fp16" or precision == "f16" or precision == "half" or precision == "float16" then
    return M.DynamicLossScaler(opts)
  elseif precision == "bf16" or precision == "bfloat16" or precision == "fp32" or precision == "f32"
    or precision == "float32" then
    return M.NoScaler()
  end
  error("amp.scaler_for: unknown precision '" .. tostring(precision) .. "' (fp16, bf16, fp32)", 2)
end

-- Precision of a run: the --precision option every training and inference
-- recipe takes (pretrain, squad, glue, predict).
--   fp32  f32 everywhere.
--   tf32  on a GPU, f32 GEMMs on TF32 tensor cores (10-bit mantissa inputs, f32
--         accumulate); on the CPU there is no TF32 unit: the same as fp32.
--   bf16  weights and gradients stored as bf16; f32 master weights and
--         optimizer state; no loss scaling (bf16 has f32's exponent range).
--   fp16  weights and gradients stored as f16; f32 master weights; dynamic
--         loss scaling (DynamicLossScaler above): an overflowing step is
--         skipped and the scale backs off.
-- On a GPU bf16/fp16 train on the model's half compute copy (model_to below: model:to{dtype=}): half
-- weights and activations, bf16/f16 tensor-core GEMMs and attention, f32 gradients and f32 master weights
-- (flat_params), the copy written by the optimizer's update pass. On the CPU, which has no such kernels for
-- training, half-precision storage is emulated (MixedPrecision below): the weights the forward and backward
-- passes read and the gradients they write are rounded to bf16/f16 while activations stay f32, so the rounding,
-- overflow and underflow of half-precision weights and gradients happen as there, and the loss scaler is
-- exercised for real.
M.PRECISIONS = { "fp32", "tf32", "bf16", "fp16" }
local HALF = { fp32 = false, tf32 = false, bf16 = "bf16", fp16 = "f16" }

-- check_precision(recipe, p) -> p, or an error "recipe: --precision must be ..."
-- raised at level 0 (one clear line from the host).
function M.check_precision(recipe, p)
  if HALF[p] == nil then
    error(("%s: --precision must be fp32, tf32, bf16 or fp16, got %s"):format(recipe, tostring(p)), 0)
  end
  return p
end

-- storage_dtype(p) -> "bf16", "f16", or nil for the f32 precisions
function M.storage_dtype(p)
  M.check_precision("amp.storage_dtype", p)
  return HALF[p] or nil
end

-- round_(t, dtype[, buf]): t's values rounded to dtype (round to nearest even)
-- in place; buf, a tensor of dtype and t's shape, avoids a temporary.
function M.round_(t, dtype, buf)
  if not dtype then return t end
  if buf then buf:copy_(t); t:copy_(buf)
  else
    local h = t:to(dtype)
    t:copy_(h)
    h:free()
  end
  return t
end

-- model_to(model, dev, p): the model for training or inference in precision p on dev (-1: the CPU, nothing to
-- do; the emulation above). On a GPU its buffers move there, and for bf16/fp16 it gets its half compute copy.
-- Returns the model.
function M.model_to(model, dev, p)
  if dev >= 0 then model:to{ device = dev, dtype = M.storage_dtype(p or "fp32") or "f32" } end
  return model
end

-- path(dev, p) -> how a model moved by model_to trains in precision p on dev, for the startup lines: "bf16 compute
-- copy, f32 master weights" (a GPU), "bf16 emulated on f32 activations, f32 master weights" (the CPU), or "f32
-- GEMMs" / "tf32 GEMMs". MixedPrecision:path() says the same from the model it was given.
local function describe(dt, copy, tf32)
  if not dt then return (tf32 and "tf32" or "f32") .. " GEMMs" end
  return dt .. (copy and " compute copy" or " emulated on f32 activations") .. ", f32 master weights"
end
function M.path(dev, p)
  return describe(M.storage_dtype(p), dev >= 0, dev >= 0 and p == "tf32")
end

-- round_weights(model, p): inference in precision p: the model's parameters
-- rounded to bf16/f16 once, in place (no-op for fp32/tf32). Returns the dtype or nil.
function M.round_weights(model, p)
  local dt = M.storage_dtype(p)
  -- a model with that compute copy (on a GPU) already predicts from the rounded weights
  if dt and model.compute_dtype ~= dt then M.round_(model.flat_params, dt) end
  return dt
end

-- MixedPrecision{model=, precision=, scaler=opts}: one training step in
-- precision p with f32 master weights, shared by recipes/pretrain.lua and
-- bertlua.train.loop (SQuAD, GLUE):
--
--   local mp = amp.MixedPrecision{ model = model, precision = "fp16" }
--   model:zero_grad()
--   mp:begin_step()                  -- master <- params; params <- round(params)
--   ... forward; model:backward(mp:scale() / accum) ...
--   mp:end_backward()                -- grads <- round(grads); params <- master
--                                    -- ({rounded = true}: round_grads(lo, hi) did it range by range)
--   ... all-reduce the gradients across ranks, if any ...
--   local stepped, stats = mp:step(opt, lr)   -- fp16: false when skipped
--
-- or, with no host wait anywhere in the step (recipes/pretrain.lua):
--   model:backward(mp:loss_seed(accum))      -- fp16: a tensor on the model's device holding scale / accum
--   mp:queue_step(opt, lr)                   -- decides, skips or updates on the model's device
--   local r = mp:read()                      -- when logging (one wait): loss_scale, skipped, grad_norm, ...
-- queue_step keeps the scaler's state in a tensor beside the parameters (bl_optim.h, BL_AMP_*): the skip, the
-- scale's backoff and growth and the count of applied updates (bias correction) are decided there by the same
-- rules as DynamicLossScaler, on either device; the optimizer's step_count counts queued steps, so the
-- learning-rate schedule advances on a skipped step too (as torch's schedulers stepped every iteration).
-- A non-finite gradient without loss scaling (bf16, fp32), or max_consecutive_skips at the floor scale, is
-- raised by the read() that sees it: at the next log line.
--
-- For fp32/tf32 every call but step is a no-op and step is opt:step(lr), so
-- an fp32 run is bitwise what it was without this object. For bf16/fp16 the
-- optimizer updates the f32 master copy: updates smaller than half a unit in
-- the last place of a bf16 weight (lr 3e-5 on a weight of 0.05 is) still
-- accumulate.
-- Two modes for bf16/fp16:
--   * a model with a half compute copy of that dtype (a GPU model moved by model_to): flat_params are the master
--     weights already, the forward and backward read the copy and write f32 gradients; begin_step, end_backward
--     and round_grads do nothing (mp.compute is true). The optimizer (built with model=) writes the copy in its
--     update pass; on a skipped step it writes neither. The fp16 loss scale seeds the half backward, and an
--     activation gradient that overflows f16 reaches the f32 gradients as inf/NaN, which the step's check sees.
--   * otherwise (the CPU) the emulation: begin_step keeps an f32 master copy and rounds flat_params to half,
--     end_backward rounds the gradients and restores the master. Memory: one f32 and one half copy.
local MP = {}
MP.__index = MP

function M.MixedPrecision(o)
  if type(o) ~= "table" or not o.model or not o.model.flat_params then
    error("amp.MixedPrecision: expects {model = <flattened module>, precision = ...}", 2)
  end
  local p = o.precision or "fp32"
  if HALF[p] == nil then
    error("amp.MixedPrecision: unknown precision '" .. tostring(p) .. "' (fp32, tf32, bf16, fp16)", 2)
  end
  local self = setmetatable({ model = o.model, precision = p, dtype = HALF[p] or nil }, MP)
  self.scaler = p == "fp16" and M.DynamicLossScaler(o.scaler) or M.NoScaler()
  local cdt = o.model.compute_dtype
  if cdt and self.dtype and cdt ~= self.dtype then   -- (recipes/benchmark.lua steps a bf16 model as fp32)
    error(("amp.MixedPrecision: precision %s, but the model computes in %s (move it with amp.model_to)")
      :format(p, cdt), 2)
  end
  self.compute = cdt ~= nil
  if self.dtype and not self.compute then
    local fp = o.model.flat_params
    self.master = fp:clone()
    self.half = fp:empty_like({ dtype = self.dtype })
  end
  return self
end

-- path() -> the path this step takes, as amp.path: from the model's real set-up (a log line that shows a GPU run
-- trains on its compute copy, not on the emulation)
function MP:path()
  local dev = self.model.flat_params:device()
  return describe(self.dtype, self.compute, dev ~= "cpu" and self.precision == "tf32")
end

function MP:scale()
  if self.state then self:read() end
  return self.scaler:scale()
end

-- the state tensor on the parameters' device, filled from the scaler's fields
function MP:_amp_state()
  if self.state then return self.state end
  local sc = self.scaler
  local h = bl.zeros({ AMP_LEN }, { dtype = "f64" })
  local p = h:ptr()
  for _, f in ipairs(AMP_FIELDS) do p[f[1]] = sc[f[2]] or 0 end
  local fp = self.model.flat_params
  self.state = h:to{ device = fp:device() }
  self.amp_cfg = amp_config(sc)
  return self.state
end

-- loss_seed(accum): what the loss gradient is multiplied by: 1/accum, or for fp16 a one-element f32 tensor on
-- the parameters' device holding loss scale / accum (read there by the backward, no host round trip).
function MP:loss_seed(accum)
  accum = accum or 1
  if not self.scaler.enabled then return 1 / accum end
  local st = self:_amp_state()
  self.seed = self.seed or bl.empty({ 1 }, { dtype = "f32", device = st:device() })
  self.seed:copy_(st:narrow(1, C.BL_AMP_SCALE + 1, 1))
  if accum ~= 1 then check(C.bl_affine(self.seed, self.seed, 1 / accum, 0)) end
  return self.seed
end

-- queue_step(opt, lr[, {grad_scale=}]): the optimizer step with the decision on the parameters' device.
function MP:queue_step(opt, lr, opts)
  local st = self:_amp_state()
  opt:step_amp(lr, self.amp_cfg, st, opts and opts.grad_scale or 1.0)
end

-- state_tensor(): the f64 state the queued steps update (BL_AMP_*), e.g. for StepStats:read
function MP:state_tensor() return self:_amp_state() end

-- read([values]) -> {loss_scale, skipped (total), last_skipped, grad_norm (of the last applied step),
-- applied_steps, steps}: the state of the queued steps, read from the device (one wait) or given as values (the
-- state_tensor's, already read); the scaler's fields follow it. Raises the errors the synchronous step raises at
-- once (see queue_step).
function MP:read(values)
  local sc, prev = self.scaler, self.scaler.skipped_steps or 0
  local v = values or self:_amp_state():totable()
  for _, f in ipairs(AMP_FIELDS) do sc[f[2]] = v[f[1] + 1] end
  local r = { loss_scale = sc.loss_scale, skipped = sc.skipped_steps, last_skipped = v[C.BL_AMP_LAST_SKIPPED + 1] ~= 0,
    grad_norm = v[C.BL_AMP_NORM + 1], applied_steps = sc.applied_steps, steps = sc.steps }
  if not sc.enabled and sc.skipped_steps > prev then
    error(("%s: non-finite gradients in %d step(s) since the last log (precision %s): those steps were not applied, "
      .. "weights unchanged; training stops"):format(self.name or "train", sc.skipped_steps - prev, self.precision), 0)
  end
  if sc.enabled and sc.floor_skips >= sc.cfg.max_consecutive_skips then
    error(("loss scaler: %d consecutive non-finite gradients at scale %g — stopping; last good checkpoint is kept")
      :format(sc.floor_skips, sc.loss_scale), 0)
  end
  return r
end

function MP:begin_step()
  if not self.master then return end
  local fp = self.model.flat_params
  self.master:copy_(fp)
  M.round_(fp, self.dtype, self.half)
end

-- end_backward([{rounded = true}]): rounded: the gradients were rounded already, range by range (round_grads)
function MP:end_backward(opts)
  if not self.master then return end
  if not (opts and opts.rounded) then M.round_(self.model.flat_grads, self.dtype, self.half) end
  self.model.flat_params:copy_(self.master)
end

-- round_grads(lo, hi): gradient elements [lo, hi) (0-based) rounded to the half dtype, as end_backward rounds
-- them all: a data-parallel reducer rounds each layer's range when it is final (dist.Reducer:on_final)
function MP:round_grads(lo, hi)
  if not self.master or hi <= lo then return end
  M.round_(self.model.flat_grads:narrow(1, lo + 1, hi - lo), self.dtype, self.half:narrow(1, lo + 1, hi - lo))
end

-- fp16: the dynamic scaler's checked step; otherwise NoScaler's plain opt:step
function MP:step(opt, lr, opts) return self.scaler:step(opt, lr, opts) end

function MP:state_dict()
  if self.state then self:read() end
  local sd = self.scaler:state_dict()
  sd.applied_steps = self.scaler.applied_steps
  return sd
end
-- load_state_dict(sd[, applied]): applied = the count of applied updates when sd has none (a checkpoint of the
-- synchronous step, whose optimizer counted only those)
function MP:load_state_dict(sd, applied)
  self.scaler:load_state_dict(sd)
  self.scaler.applied_steps = type(sd) == "table" and sd.applied_steps or applied or 0
  if self.state then self.state:free(); self.state = nil end
  return self
end

return M
