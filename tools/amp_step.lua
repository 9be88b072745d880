-- Pre-training's bf16 step (bertlua.train.step, LAMB) on the emulated device in its two set-ups:
--   emulation: the f32 model with MixedPrecision's rounding passes (what the recipes ran on cuda before
--              the compute copy, and what the CPU still runs)
--   copy:      the half compute copy (amp.model_to: half activations, tensor-core GEMMs, f32 master weights)
--
--   build-emu/bertlua tools/amp_step.lua model PRESET B S MASKED   -- step-time MODEL (H100) of both, dry run
--   build-emu/bertlua tools/amp_step.lua wall FIXTURE_DIR PAIRS    -- emulated wall time, tiny fixture model
-- FIXTURE_DIR: a pretrain_fixture directory (cfg.json, data/), as the recipe tests make (BL_KEEP=1 keeps it).
local bl = require "bertlua"
local bert = require "bertlua.bert"
local amp = require "bertlua.train.amp"
local optim = require "bertlua.train.optim"
local stepmodel = require "bertlua.stepmodel"
local clock = require("bertlua.util.log").clock
local tstep = require "bertlua.train.step"

-- a model in the set-up and its step; run(i) queues step i on the fixed batch
local function setup(cfg, mode, batch)
  local model = bert.BertForPreTraining(cfg, { seed = 1 })
  if mode == "copy" then amp.model_to(model, 0, "bf16") else model:to{ device = 0 } end
  model:train()
  local s = tstep.Step{ model = model, amp = amp.MixedPrecision{ model = model, precision = "bf16" }, dev = 0,
    loss = tstep.pretraining_loss(),
    optimizer = optim.LAMB{ model = model, lr = 1e-4, weight_decay = 0.01, max_grad_norm = 1.0 } }
  return function(i) s:run(i, function() return batch end, 1e-4) end, s
end

local what = arg[1]
if what == "model" then
  local cfg, B, S, masked = bert.config.preset(arg[2]), tonumber(arg[3]), tonumber(arg[4]), tonumber(arg[5])
  local V, real = cfg.vocab_size, S - math.floor(S / 8)
  local ids, mask, pos, lab, nsp = {}, {}, {}, {}, {}
  for b = 1, B do
    ids[b], mask[b], pos[b], lab[b], nsp[b] = {}, {}, {}, {}, b % 2
    for s = 1, S do ids[b][s] = (b * 31 + s * 17) % V; mask[b][s] = s <= real and 1 or 0 end
    for j = 1, masked do pos[b][j] = 1 + (b * 7 + j * 5) % (real - 2); lab[b][j] = (b + j * 13) % V end
  end
  local batch = { input_ids = bl.from(ids, { dtype = "i32" }):to{ device = 0 },
    attention_mask = bl.from(mask):to{ device = 0 }, token_type_ids = bl.zeros({ B, S }, { dtype = "i32", device = 0 }),
    masked_lm_positions = bl.from(pos, { dtype = "i32" }), masked_lm_labels = bl.from(lab, { dtype = "i32" }),
    next_sentence_labels = bl.from(nsp, { dtype = "i32" }) }
  bl.cuda_dry_run(0, true)   -- launches recorded, the large work not run
  for _, mode in ipairs { "emulation", "copy" } do
    local run = setup(cfg, mode, batch)
    run(1)
    local list, syncs = stepmodel.record(0, function() run(2) end)
    local _, t = stepmodel.evaluate(list, stepmodel.profiles.h100)
    print(("%s %-9s B=%d S=%d: MODEL step %.2f ms (GEMM %.2f, non-GEMM %.2f, gaps %.2f), %d launches, %.0f seq/s, "
      .. "%d host waits"):format(arg[2], mode, B, S, t.step_s * 1e3, t.gemm_s * 1e3, t.other_s * 1e3,
      t.gap_s * 1e3, t.launches, B / t.step_s, syncs))
  end
elseif what == "wall" then
  local dir, npairs = arg[2], tonumber(arg[3] or 3)
  local loader = require("bertlua.data.loader").Loader{ dir = dir .. "/data", split = "train", batch_size = 8,
    max_seq_length = 32, max_predictions = 5, shuffle = false }
  local batch = loader:next()
  loader:close()
  local cfg = bert.config.load(dir .. "/cfg.json")
  local function median_step(mode)   -- of steps 2..8, each waited for
    local run, s = setup(cfg, mode, batch)
    local t = {}
    for i = 1, 8 do
      local t0 = clock()
      run(i)
      s:read()
      if i > 1 then t[#t + 1] = clock() - t0 end
    end
    table.sort(t)
    return t[math.ceil(#t / 2)]
  end
  for p = 1, npairs do
    local a, b = median_step("emulation"), median_step("copy")
    print(("pair %d: emulation %.1f ms, compute copy %.1f ms, ratio %.3f"):format(p, a * 1e3, b * 1e3, b / a))
  end
else
  error("usage: tools/amp_step.lua model PRESET B S MASKED | wall FIXTURE_DIR [PAIRS]", 0)
end
