-- The seeds' recipe settings: a fixed fp16 loss scale (--loss-scale=N), warmup
-- in steps (--warmup-steps1/2 in pre-training, --warmup-steps in fine-tuning)
-- and the recipes/configs/ files a user passes with --config.
local T = require "testing"
local amp = require "bertlua.train.amp"

T.test("--loss-scale: dynamic by default; a fixed N never moves but still skips overflowing steps", function()
  T.eq(amp.loss_scale_option("dynamic"), nil)
  local s = amp.DynamicLossScaler(amp.loss_scale_option("128", "pretrain"))
  T.eq(s:scale(), 128)
  T.eq(s:update(true), false, "an overflowing step is skipped")
  T.eq(s:scale(), 128, "no back-off")
  for _ = 1, 2500 do T.eq(s:update(false), true) end
  T.eq(s:scale(), 128, "no growth after 2000 clean steps")
  local d = amp.DynamicLossScaler(amp.loss_scale_option("dynamic"))
  d:update(true)
  T.eq(d:scale(), 32768, "the dynamic scaler backs off")
  for _, bad in ipairs({ "abc", "0", "-4", "inf", "dynamic:", "dynamic:0", "dynamic:2:0", "dynamic:2:1.5" }) do
    T.raises(function() amp.loss_scale_option(bad, "squad") end,
      "squad: --loss-scale must be 'dynamic', 'dynamic:INIT[:INTERVAL]' or a positive number, got '" .. bad .. "'")
  end
  local o = amp.loss_scale_option("dynamic:1024:3")
  T.eq(o.init_scale, 1024); T.eq(o.growth_interval, 3); T.eq(o.min_scale, nil)
  T.eq(amp.loss_scale_option("dynamic:64").growth_interval, 2000)
end)

T.test("recipes/configs load into pre-training; warmup in steps reaches the run", function()
  local function run(args)
    local out, rc = T.sh(("%s recipes/pretrain.lua %s --output=%s"):format(T.exe(), args, T.tmpdir()))
    return out, rc
  end
  local out, rc = run("--config=recipes/configs/pretrain_google_tf2_lamb.lua")
  T.eq(rc, 1, out)  -- no data given: stops after the settings are read and printed
  T.truthy(out:find("pretrain: --data-phase1 is required", 1, true), out)
  for _, want in ipairs({ "lr1 = 0.00075", "lr2 = 0.0005", "warmup_steps1 = 2000", "warmup_steps2 = 200",
    "steps1 = 7038", "steps2 = 782", "batch1 = 30720", "batch2 = 15360" }) do
    T.truthy(out:find("  " .. want .. "\n", 1, true), want .. " in:\n" .. out)
  end
  out = run("--config=recipes/configs/pretrain_nvidia_pytorch.lua")
  for _, want in ipairs({ "lr1 = 0.006", "warmup1 = 0.2843", "steps1 = 7038", "batch1 = 65536" }) do
    T.truthy(out:find("  " .. want .. "\n", 1, true), want .. " in:\n" .. out)
  end
  out, rc = run("--loss-scale=x")
  T.eq(rc, 1)
  T.truthy(out:find("pretrain: --loss-scale must be 'dynamic', 'dynamic:INIT[:INTERVAL]' or a positive number, "
    .. "got 'x'", 1, true), out)
end)

T.run()
