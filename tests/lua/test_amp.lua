-- bertlua.train.amp: dynamic loss scaling. Overflow injected into one gradient ->
-- step skipped, weights and moments unchanged, scale halved; growth after
-- growth_interval clean steps; floor; persistent-NaN error; fused step path
-- equals the unscale-then-step path; state_dict; the bf16 pass-through;
-- MixedPrecision (f32 master weights, half weights/gradients in the step; no
-- rounding on a model with a half compute copy).
local T = require "testing"
local bl = require "bertlua"
local optim = require "bertlua.train.optim"
local amp = require "bertlua.train.amp"

local N = 5000
local SEGS = { { name = "w", offset = 0, length = 4000 }, { name = "b.bias", offset = 4000, length = 1000 } }

local function setup(seed)
  local p = bl.rand({ N }, { seed = seed, low = -0.1, high = 0.1 })
  local g = bl.zeros({ N })
  local opt = optim.LAMB { params = p, grads = g, segments = SEGS, lr = 1e-2 }
  return p, g, opt
end

local function same(a, b)
  local pa, pb = a:ptr(), b:ptr()
  for i = 0, a:numel() - 1 do if pa[i] ~= pb[i] then return false, i end end
  return true
end

-- backward stand-in: scaled gradients of a fixed random "true" gradient
local function fill_scaled_grads(g, seed, scale)
  g:copy_(bl.rand({ N }, { seed = seed, low = -1, high = 1 }))
  local p = g:ptr()
  for i = 0, N - 1 do p[i] = p[i] * scale end
end

T.test("overflow in one gradient: step skipped, state unchanged, scale halved", function()
  local p, g, opt = setup(1)
  local s = amp.DynamicLossScaler()
  T.eq(s:scale(), 65536)
  fill_scaled_grads(g, 10, s:scale())
  T.eq(s:unscale_and_check(g), false)
  T.near(g:ptr()[17], bl.rand({ N }, { seed = 10, low = -1, high = 1 }):ptr()[17], 1e-6)
  T.eq(s:update(false), true)
  opt:step()
  local p0, m0 = p:clone(), opt.exp_avg:clone()
  fill_scaled_grads(g, 11, s:scale())
  g:ptr()[4321] = 1 / 0                -- fp16 overflow in one gradient
  local found = s:unscale_and_check(g)
  T.eq(found, true)
  if s:update(found) then opt:step() end
  T.truthy(same(p, p0), "weights changed on a skipped step")
  T.truthy(same(opt.exp_avg, m0), "moments changed on a skipped step")
  T.eq(opt.step_count, 1)
  T.eq(s:scale(), 32768); T.eq(s.skipped_steps, 1); T.eq(s.steps, 2)
  -- NaN too
  fill_scaled_grads(g, 12, s:scale())
  g:ptr()[0] = 0 / 0
  T.eq(s:update(s:unscale_and_check(g)), false)
  T.eq(s:scale(), 16384); T.eq(s.skipped_steps, 2)
end)

T.test("growth after growth_interval clean steps, capped; backoff floored", function()
  local s = amp.DynamicLossScaler { init_scale = 8, growth_interval = 3, max_scale = 32, min_scale = 2 }
  for _ = 1, 2 do T.eq(s:update(false), true) end
  T.eq(s:scale(), 8)
  s:update(false)
  T.eq(s:scale(), 16)                   -- 3 clean steps
  s:update(true)                        -- overflow resets the count
  T.eq(s:scale(), 8)
  s:update(false); s:update(false)
  T.eq(s:scale(), 8)
  s:update(false)
  T.eq(s:scale(), 16)
  for _ = 1, 9 do s:update(false) end
  T.eq(s:scale(), 32)                   -- capped at max_scale
  for _ = 1, 6 do s:update(true) end
  T.eq(s:scale(), 2)                    -- floored at min_scale
  T.eq(s.skipped_steps, 7)
end)

T.test("persistent NaN at the floor scale raises a clear error", function()
  local s = amp.DynamicLossScaler { init_scale = 4 }
  s:update(true); s:update(true)        -- 4 -> 2 -> 1
  T.eq(s:scale(), 1)
  for _ = 1, 9 do T.eq(s:update(true), false) end
  T.raises(function() s:update(true) end,
    "loss scaler: 10 consecutive non-finite gradients at scale 1 — stopping; last good checkpoint is kept")
  -- a clean step in between resets the count
  local r = amp.DynamicLossScaler { init_scale = 1, max_consecutive_skips = 3 }
  r:update(true); r:update(true); r:update(false); r:update(true); r:update(true)
  T.raises(function() r:update(true) end, "3 consecutive non-finite gradients at scale 1")
end)

T.test("fused scaler:step equals unscale_and_check + opt:step", function()
  local pa, ga, oa = setup(3)
  local pb, gb, ob = setup(3)
  local sa, sb = amp.DynamicLossScaler { init_scale = 1024 }, amp.DynamicLossScaler { init_scale = 1024 }
  for step = 1, 4 do
    fill_scaled_grads(ga, 40 + step, sa:scale())
    fill_scaled_grads(gb, 40 + step, sb:scale())
    if step == 3 then ga:ptr()[9] = 1 / 0; gb:ptr()[9] = 1 / 0 end
    local found = sa:unscale_and_check(ga)
    if sa:update(found) then oa:step() end
    local stepped, stats = sb:step(ob)
    T.eq(stepped, step ~= 3)
    if stepped then T.truthy(stats.clip_coef < 1, "clipping should be active") end
  end
  T.eq(oa.step_count, 3); T.eq(ob.step_count, 3)
  T.eq(sa:scale(), sb:scale())
  -- the fused path scales inside the optimizer: equal to f32 rounding
  local a, b = pa:ptr(), pb:ptr()
  for i = 0, N - 1 do T.near(b[i], a[i], 1e-6, 1e-9) end
end)

T.test("state_dict round trip", function()
  local s = amp.DynamicLossScaler { growth_interval = 5 }
  s:update(true); s:update(false); s:update(false)
  local sd = s:state_dict()
  T.eq(sd.loss_scale, 32768); T.eq(sd.growth_tracker, 2); T.eq(sd.skipped_steps, 1)
  local r = amp.DynamicLossScaler { growth_interval = 5 }:load_state_dict(sd)
  for _ = 1, 3 do r:update(false); s:update(false) end
  T.eq(r:scale(), 65536); T.eq(r:scale(), s:scale())
  T.raises(function() r:load_state_dict { loss_scale = -1 } end, "loss_scale > 0")
end)

T.test("bf16 / fp32: pass-through scaler with the same interface", function()
  local s = amp.scaler_for("bf16")
  T.eq(s.enabled, false)
  T.eq(s:scale(), 1)
  local p, g, opt = setup(5)
  fill_scaled_grads(g, 50, 1)
  local g0 = g:clone()
  T.eq(s:unscale_and_check(g), false)
  T.truthy(same(g, g0), "pass-through modified the gradients")
  T.eq(s:update(false), true)
  local p0 = p:clone()
  local stepped = s:step(opt)
  T.eq(stepped, true)
  T.truthy(not same(p, p0), "optimizer did not step")
  T.eq(amp.scaler_for("fp16").enabled, true)
  T.raises(function() amp.scaler_for("int8") end, "unknown precision 'int8'")
end)

-- a stand-in for a flattened model: one parameter vector and its gradient
local function fake_model(seed)
  local p = bl.rand({ N }, { seed = seed, low = -0.1, high = 0.1 })
  return { flat_params = p, flat_grads = bl.zeros({ N }) }
end
local function representable(t, dtype)
  return same(t, t:to(dtype):to("f32"))
end

T.test("MixedPrecision fp32/tf32: every hook a no-op, the step is opt:step", function()
  for _, prec in ipairs({ "fp32", "tf32" }) do
    local m = fake_model(3)
    local opt = optim.LAMB { params = m.flat_params, grads = m.flat_grads, segments = SEGS, lr = 1e-2 }
    local mp = amp.MixedPrecision { model = m, precision = prec }
    T.eq(mp.dtype, nil); T.eq(mp:scale(), 1)
    local p0 = m.flat_params:clone()
    mp:begin_step()
    T.truthy(same(m.flat_params, p0), prec .. ": begin_step changed the weights")
    fill_scaled_grads(m.flat_grads, 7, 1)
    local g0 = m.flat_grads:clone()
    mp:end_backward()
    T.truthy(same(m.flat_grads, g0), prec .. ": end_backward changed the gradients")
    -- bitwise what a plain optimizer step gives
    local ref = fake_model(3)
    local ropt = optim.LAMB { params = ref.flat_params, grads = ref.flat_grads, segments = SEGS, lr = 1e-2 }
    ref.flat_grads:copy_(g0)
    ropt:step()
    T.eq(mp:step(opt), true)
    T.truthy(same(m.flat_params, ref.flat_params), prec .. ": step differs from opt:step")
  end
end)

T.test("MixedPrecision bf16/fp16: half weights and gradients inside the step, f32 master outside", function()
  for _, c in ipairs({ { "bf16", "bf16" }, { "fp16", "f16" } }) do
    local prec, dt = c[1], c[2]
    local m = fake_model(4)
    local opt = optim.AdamW { params = m.flat_params, grads = m.flat_grads, segments = SEGS, lr = 1e-6 }
    local mp = amp.MixedPrecision { model = m, precision = prec }
    T.eq(mp.dtype, dt)
    local master = m.flat_params:clone()
    T.truthy(not representable(master, dt), "random f32 weights are not all " .. dt)
    mp:begin_step()
    T.truthy(representable(m.flat_params, dt), prec .. ": working weights rounded")
    T.truthy(same(m.flat_params, master:to(dt):to("f32")), prec .. ": round to nearest")
    fill_scaled_grads(m.flat_grads, 8, mp:scale() * 1e-3)
    mp:end_backward()
    T.truthy(representable(m.flat_grads, dt), prec .. ": gradients rounded")
    T.truthy(same(m.flat_params, master), prec .. ": master weights restored bitwise")
    local stepped = mp:step(opt, 1e-6)
    T.eq(stepped, true)
    -- lr 1e-6 moves a weight of ~0.05 by far less than half a bf16/f16 ulp: only
    -- f32 master weights keep such updates (rounding in place would lose them all)
    local moved, lost = 0, 0
    local after, before = m.flat_params:ptr(), master:ptr()
    local ra, rb = m.flat_params:to(dt):to("f32"), master:to(dt):to("f32")
    local pa, pb = ra:ptr(), rb:ptr()
    for i = 0, N - 1 do
      if after[i] ~= before[i] then moved = moved + 1 end
      if pa[i] == pb[i] then lost = lost + 1 end
    end
    T.truthy(moved > N * 0.9, prec .. ": small updates kept in the master weights (" .. moved .. " moved)")
    T.truthy(lost > N * 0.9, prec .. ": the same updates vanish when rounded (" .. lost .. " lost)")
    T.eq(mp.scaler.enabled, prec == "fp16")
  end
end)

-- a model with a half compute copy (what amp.model_to makes on a GPU; model:to{dtype=} here): no emulation
T.test("MixedPrecision on a model with a compute copy: no rounding passes, mismatches refused", function()
  local bert = require "bertlua.bert"
  local cfg = bert.config.new{ vocab_size = 64, hidden_size = 32, num_hidden_layers = 1, num_attention_heads = 2,
    intermediate_size = 64, max_position_embeddings = 32 }
  local m = bert.BertForPreTraining(cfg, { seed = 1 })
  T.eq(amp.model_to(m, -1, "bf16"), m)
  T.eq(m.compute_dtype, nil, "model_to on the cpu keeps the f32 model (the emulation)")
  local emu = amp.MixedPrecision{ model = m, precision = "bf16" }
  T.truthy(not emu.compute and emu.master, "an f32 model: the emulation")
  T.eq(emu:path(), "bf16 emulated on f32 activations, f32 master weights")
  m:to{ dtype = "bf16" }
  local mp = amp.MixedPrecision{ model = m, precision = "bf16" }
  T.truthy(mp.compute and not mp.master, "compute mode keeps no master copy")
  T.eq(mp:path(), "bf16 compute copy, f32 master weights")
  m.flat_grads:copy_(bl.rand({ m.flat_grads:numel() }, { seed = 4, low = -1, high = 1 }))
  local w, g = m.flat_params:clone(), m.flat_grads:clone()
  mp:begin_step()
  mp:round_grads(0, m.flat_grads:numel())
  mp:end_backward()
  T.truthy(same(m.flat_params, w) and same(m.flat_grads, g), "f32 weights and gradients untouched by the hooks")
  T.raises(function() amp.MixedPrecision{ model = m, precision = "fp16" } end, "model computes in bf16")
  T.eq(amp.path(0, "bf16"), "bf16 compute copy, f32 master weights")
  T.eq(amp.path(-1, "fp16"), "f16 emulated on f32 activations, f32 master weights")
  T.eq(amp.path(0, "tf32"), "tf32 GEMMs")
  T.eq(amp.path(-1, "tf32"), "f32 GEMMs")
end)

T.test("MixedPrecision fp16: an overflowing gradient skips the step and backs off", function()
  local m = fake_model(6)
  local opt = optim.AdamW { params = m.flat_params, grads = m.flat_grads, segments = SEGS, lr = 1e-3 }
  local mp = amp.MixedPrecision { model = m, precision = "fp16", scaler = { init_scale = 2 ^ 20 } }
  local p0 = m.flat_params:clone()
  mp:begin_step()
  fill_scaled_grads(m.flat_grads, 9, mp:scale())   -- |g| up to 2^20 > f16 max 65504: inf after rounding
  mp:end_backward()
  T.eq(mp:step(opt, 1e-3), false)
  T.truthy(same(m.flat_params, p0), "skipped step left the weights alone")
  T.eq(mp:scale(), 2 ^ 19); T.eq(opt.step_count, 0)
  mp:begin_step()
  fill_scaled_grads(m.flat_grads, 9, 1)
  mp:end_backward()
  T.eq(mp:step(opt, 1e-3), true)
  T.eq(mp:state_dict().skipped_steps, 1)
end)

T.test("precision names: check_precision, storage_dtype, round_weights", function()
  for _, p in ipairs(amp.PRECISIONS) do T.eq(amp.check_precision("r", p), p) end
  T.eq(amp.storage_dtype("bf16"), "bf16"); T.eq(amp.storage_dtype("fp16"), "f16")
  T.eq(amp.storage_dtype("tf32"), nil); T.eq(amp.storage_dtype("fp32"), nil)
  T.raises(function() amp.check_precision("squad", "fp8") end,
    "squad: --precision must be fp32, tf32, bf16 or fp16, got fp8")
  T.raises(function() amp.check_precision("glue", nil) end,
    "glue: --precision must be fp32, tf32, bf16 or fp16, got nil")
  T.raises(function() amp.MixedPrecision { model = fake_model(1), precision = "half" } end, "unknown precision 'half'")
  T.raises(function() amp.MixedPrecision { precision = "bf16" } end, "expects {model")
  local m = fake_model(2)
  local p0 = m.flat_params:clone()
  T.eq(amp.round_weights(m, "fp32"), nil)
  T.truthy(same(m.flat_params, p0), "fp32 leaves the weights alone")
  T.eq(amp.round_weights(m, "bf16"), "bf16")
  T.truthy(same(m.flat_params, p0:to("bf16"):to("f32")), "bf16 rounding")
end)

T.test("bad options", function()
  T.raises(function() amp.DynamicLossScaler { init_scal = 2 } end, "unknown option 'init_scal'")
  T.raises(function() amp.DynamicLossScaler { backoff_factor = 2 } end, "backoff_factor must be in (0, 1)")
  T.raises(function() amp.DynamicLossScaler { init_scale = 0.5 } end, "init_scale 0.5 must be within")
  T.raises(function() amp.DynamicLossScaler { growth_interval = 0 } end, "growth_interval must be an integer >= 1")
end)

T.run()
