-- trainer.fit on a GPU with the device-resident step (bertlua.train.step with the heads' device losses) against the
-- synchronous step (fit{synchronous = true}: the heads' own losses, read back every micro-batch) on the same device,
-- tiny QA, classification and regression (STS-B: one f32 score, MSE) models, 6 steps of 2 accumulated micro-batches
-- with random inputs and targets (some QA positions outside the window and one ignored label, so clamping and
-- ignoring are exercised):
--   * fp32 and bf16: every logged loss and the final weights bit for bit those of the synchronous step (the same
--     kernels in the same order; only where the loss is read differs);
--   * fp16: the loss scaler decides on the device; the synchronous scaler's norm sums the whole flat buffer in
--     fixed chunks, the device's the segments in theirs (f64, about 1e-16 apart), which can move a clipping
--     factor by an f32 ulp: losses within 1e-6 relative;
--   * bf16/fp16 train on the model's half compute copy, which fit makes (the recorded launches show its GEMMs);
--   * the emulated runtime's counters: at most one host wait per logged step (log_every 1 and 3) and no device
--     allocation after the first step; the synchronous step needs several waits per step (the counters see them);
--     no upload from pageable memory after step 1, on either step: the micro-batches and their targets go through
--     the stager's pinned buffers (bertlua.device.prefetch), the next one made and put before the current one's
--     forward.
-- Needs a CUDA device (the emulated one in CI); skipped otherwise.
local T = require "testing"
local bl = require "bertlua"
local bert = require "bertlua.bert"
local config = require "bertlua.bert.config"
local trainer = require "bertlua.train.loop"
local cjson = require "cjson"

if not bl.cuda_available() then
  T.skip_all(bl.cuda_compiled() and "no CUDA device" or "no CUDA device (CPU-only build)")
end

local tmp = T.tmpdir()
local function tiny(num_labels)
  return config.new{ vocab_size = 64, hidden_size = 32, num_hidden_layers = 1, num_attention_heads = 2,
    intermediate_size = 64, max_position_embeddings = 32, hidden_dropout_prob = 0.1,
    attention_probs_dropout_prob = 0.1, num_labels = num_labels }
end
local CFG, CFG_REG = tiny(3), tiny(1)
local N, S, BATCH, MICRO, STEPS = 16, 16, 4, 2, 6

-- the examples: random ids, padding at the end of some rows, targets; fixed by the seed
local function examples(seed)
  local u = bl.rand({ N * (S + 3) }, { seed = seed }):totable()
  local ex = {}
  for i = 1, N do
    local r = (i - 1) * (S + 3)
    local len = S - (i % 3) * 2
    local ids, mask = {}, {}
    for s = 1, S do
      ids[s] = s <= len and 1 + math.floor(u[r + s] * (CFG.vocab_size - 1)) or 0
      mask[s] = s <= len and 1 or 0
    end
    -- positions past the window (S + 2) are clamped to S and ignored; label -100 is ignored
    local st = i % 5 == 0 and S + 2 or math.floor(u[r + S + 1] * len)
    ex[i] = { ids = ids, mask = mask, start = st, stop = math.min(st + 1, S + 2),
      label = i == 7 and -100 or math.floor(u[r + S + 3] * 3), score = 5 * u[r + S + 2] }
  end
  return ex
end
local EX = examples(11)

-- a batch of the examples idx; regression: the labels are the f32 scores (STS-B's 0..5 similarity)
local function batch_of(idx, regression)
  local ids, mask, tt, st, en, lab = {}, {}, {}, {}, {}, {}
  for k, i in ipairs(idx) do
    local e = EX[i]
    ids[k], mask[k], tt[k] = e.ids, e.mask, {}
    for s = 1, S do tt[k][s] = s > S / 2 and 1 or 0 end
    st[k], en[k], lab[k] = e.start, e.stop, regression and e.score or e.label
  end
  return { input_ids = bl.from(ids, { dtype = "i32" }), attention_mask = bl.from(mask, { dtype = "i32" }),
    token_type_ids = bl.from(tt, { dtype = "i32" }), start_positions = bl.from(st, { dtype = "i32" }),
    end_positions = bl.from(en, { dtype = "i32" }), labels = bl.from(lab, { dtype = regression and "f32" or "i32" }) }
end

local HEADS = {
  qa = function() return bert.BertForQuestionAnswering(CFG, { seed = 5 }) end,
  classification = function() return bert.BertForSequenceClassification(CFG, { seed = 5 }) end,
  regression = function() return bert.BertForSequenceClassification(CFG_REG, { seed = 5 }) end }

local function pageable() return bl.cuda_counters(0).pageable_h2d end

-- fit on cuda:0 -> log records (by step), final f32 weights on the host, the model, the uploads from pageable
-- memory after step 1 (its one-time uploads, e.g. the position ids of a new batch shape, left out): counted from
-- the making of step 2's second micro-batch, which fit does once step 1 is queued and step 2's first micro-batch
-- got (the next one is made while the current one trains); and for each forward, the micro-batches made by then
local function fit(head, name, o)
  local model = HEADS[head]()
  model:to{ device = 0 }
  local log = ("%s/%s.jsonl"):format(tmp, name)
  local made, p0, ahead, forward = 0, nil, {}, model.forward
  model.forward = function(m, b)
    ahead[#ahead + 1] = made
    return forward(m, b)
  end
  trainer.fit{ model = model, n = N, batch = BATCH, micro_batch = MICRO, epochs = 2, max_steps = STEPS, lr = 1e-3,
    warmup = 0.2, seed = 3, device = 0, precision = o.precision, synchronous = o.synchronous,
    log_every = o.log_every, log_path = log,
    make_batch = function(idx)
      made = made + 1
      if made == BATCH / MICRO + 2 then p0 = pageable() end
      return batch_of(idx, head == "regression")
    end }
  local recs = {}
  for line in io.lines(log) do
    local r = cjson.decode(line)
    if r.step then recs[#recs + 1] = r end
  end
  return recs, model.flat_params:to("cpu"):totable(), model, pageable() - p0, ahead
end

-- micro-batch k + 1 is made and its copy queued before micro-batch k trains; none is made past the last step
local function one_ahead(ahead, what)
  local n = STEPS * BATCH / MICRO
  T.eq(#ahead, n, what .. ": forwards")
  for k = 1, n do T.eq(ahead[k], math.min(k + 1, n), ("%s: micro-batches made before forward %d"):format(what, k)) end
end

local function same_run(head, precision, rtol)
  local sync, ws, _, psync, async = fit(head, head .. precision .. "_sync", { precision = precision,
    synchronous = true })
  local dev, wd, _, pdev, adev = fit(head, head .. precision .. "_dev", { precision = precision })
  one_ahead(async, head .. " " .. precision .. " synchronous")
  one_ahead(adev, head .. " " .. precision .. " device step")
  -- the batches and targets go through pinned memory on both paths (the synchronous QA head clamps the staged
  -- positions on the device: no upload of host-clamped ones)
  T.eq(psync, 0, ("%s %s: uploads from pageable memory, synchronous"):format(head, precision))
  T.eq(pdev, 0, ("%s %s: uploads from pageable memory, device step"):format(head, precision))
  T.eq(#dev, STEPS, "log lines")
  for i = 1, STEPS do
    local a, b = sync[i].loss, dev[i].loss
    if rtol == 0 then T.eq(b, a, ("%s %s step %d loss"):format(head, precision, i))
    else T.truthy(math.abs(a - b) <= rtol * math.abs(a), ("%s %s step %d: %.17g vs %.17g"):format(head, precision,
      i, a, b)) end
  end
  if rtol == 0 then
    local bad = 0
    for i = 1, #ws do if ws[i] ~= wd[i] then bad = bad + 1 end end
    T.eq(bad, 0, head .. " " .. precision .. ": weights that differ from the synchronous step's")
  end
  return sync, dev
end

for _, head in ipairs({ "qa", "classification", "regression" }) do
  T.test(head .. ": fp32 and bf16 losses and weights bit for bit the synchronous step's, batches staged", function()
    same_run(head, "fp32", 0)
    same_run(head, "bf16", 0)
  end)
end

T.test("a batch without input_ids or with a field the device step stages: a clear error", function()
  for _, c in ipairs({ { field = "input_ids", value = false, want = "needs input_ids" },
    { field = "target1", value = bl.zeros({ MICRO }), want = "target1 is reserved" } }) do
    local model = HEADS.classification()
    model:to{ device = 0 }
    local ok, err = pcall(trainer.fit, { model = model, n = N, batch = BATCH, micro_batch = MICRO, epochs = 1,
      lr = 1e-3, device = 0, make_batch = function(idx)
        local b = batch_of(idx)
        b[c.field] = c.value or nil
        return b
      end })
    T.truthy(not ok and tostring(err):find(c.want, 1, true), tostring(err))
  end
end)

T.test("qa fp16 (loss scaling on the device): losses within 1e-6 of the synchronous step's", function()
  local _, dev = same_run("qa", "fp16", 1e-6)
  T.truthy(dev[STEPS].loss_scale and dev[STEPS].loss_scale > 0, "the loss scale is logged")
end)

-- fit given an f32 model on cuda and bf16 makes its half compute copy and trains on it: every GEMM on the half
-- tensor-core engine, no rounding pass (one cast makes the copy) -- with a fall-back to the emulation, the GEMMs
-- would be f32 and each step would make 4 casts
T.test("bf16 fit on cuda trains on the half compute copy (recorded launches)", function()
  local stepmodel = require "bertlua.stepmodel"
  local model
  local list = stepmodel.record(0, function()
    model = select(3, fit("classification", "copy", { precision = "bf16" }))
  end)
  T.eq(model.compute_dtype, "bf16", "the model's compute dtype after fit")
  local gemm, tc16, cast = 0, 0, 0
  for _, l in ipairs(list) do
    if l.cls == "gemm" then gemm, tc16 = gemm + 1, tc16 + (l.engine == "tc16" and 1 or 0) end
    if l.cls == "cast" then cast = cast + 1 end
  end
  T.truthy(gemm > 0 and tc16 == gemm, ("%d of %d GEMMs on tensor cores"):format(tc16, gemm))
  T.truthy(cast <= 1, ("%d casts in %d steps: only the one that makes the copy"):format(cast, STEPS))
end)

T.test("at most one host wait per logged step, no allocation after step 1", function()
  local every = fit("qa", "every1", { precision = "fp32", log_every = 1 })
  for i = 2, STEPS do
    T.truthy(every[i].cuda_syncs - every[i - 1].cuda_syncs <= 1, ("step %d: %d waits"):format(i,
      every[i].cuda_syncs - every[i - 1].cuda_syncs))
    T.eq(every[i].cuda_mallocs, every[1].cuda_mallocs, "device allocations after step 1 (step " .. i .. ")")
  end
  for _, head in ipairs({ "classification", "regression" }) do
    local third = fit(head, head .. "_every3", { precision = "bf16", log_every = 3 })
    T.eq(#third, 2, head .. ": log lines every 3 steps")
    T.truthy(third[2].cuda_syncs, head .. ": the device step logs the counters")
    T.eq(third[2].cuda_syncs - third[1].cuda_syncs, 1, head .. ": waits in steps 4-6")
    T.eq(third[2].cuda_mallocs, third[1].cuda_mallocs, head .. ": device allocations in steps 4-6")
  end
  -- the counters see the waits of the synchronous step (one per micro-batch at least)
  local k0 = bl.cuda_counters(0).syncs
  fit("qa", "sync_counted", { precision = "fp32", synchronous = true })
  local waits = bl.cuda_counters(0).syncs - k0
  T.truthy(waits >= STEPS * BATCH / MICRO, ("the synchronous step waited %d times in %d steps"):format(waits, STEPS))
end)

T.test("checkpoints on the device step: stopped after 3 steps, resumed from step 2, the uninterrupted weights",
  function()
  for _, precision in ipairs { "fp32", "fp16" } do
    local function run(dir, stop_after, resume)
      local model = HEADS.qa()
      model:to{ device = 0 }
      trainer.fit{ model = model, n = N, batch = BATCH, micro_batch = MICRO, epochs = 2, max_steps = STEPS,
        lr = 1e-3, warmup = 0.2, seed = 3, device = 0, precision = precision,
        make_batch = function(idx) return batch_of(idx) end,
        checkpoints = dir and { dir = dir, every = 2, resume = resume },
        stop = stop_after and function(_, ran) return ran >= stop_after and "test" or nil end }
      return model.flat_params:to("cpu"):totable()
    end
    local whole, dir = run(), ("%s/ckpt_%s"):format(tmp, precision)
    run(dir, 3)
    T.near(run(dir, nil, true), whole, 0, 0)
  end
end)

T.run()
