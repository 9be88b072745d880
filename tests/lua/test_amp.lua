-- bertlua.amp: dynamic loss scaling. Overflow injected into one gradient ->
-- step skipped, weights and moments unchanged, scale halved; growth after
-- growth_interval clean steps; floor; persistent-NaN error; fused step path
-- equals the unscale-then-step path; state_dict; the bf16 pass-through.
local T = require "bertlua.testing"
local bl = require "bertlua"
local optim = require "bertlua.optim"
local amp = require "bertlua.amp"

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

T.test("bad options", function()
  T.raises(function() amp.DynamicLossScaler { init_scal = 2 } end, "unknown option 'init_scal'")
  T.raises(function() amp.DynamicLossScaler { backoff_factor = 2 } end, "backoff_factor must be in (0, 1)")
  T.raises(function() amp.DynamicLossScaler { init_scale = 0.5 } end, "init_scale 0.5 must be within")
  T.raises(function() amp.DynamicLossScaler { growth_interval = 0 } end, "growth_interval must be an integer >= 1")
end)

T.run()
