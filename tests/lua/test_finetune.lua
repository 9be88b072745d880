-- The fine-tuning loop the recipes share (bertlua.train.loop) and their input
-- checks (bertlua.tasks.common): accumulation gives the step of the whole batch,
-- every example is seen once per epoch, the logged learning rate follows the
-- schedule, padding to the longest in a batch does not change outputs,
-- prediction covers every sequence once and reports ordered percentiles;
-- bf16/fp16 training (bertlua.train.amp.MixedPrecision) tracks fp32.
local T = require "testing"
local bl = require "bertlua"
local bert = require "bertlua.bert"
local pretrained = require "bertlua.pretrained"
local trainer = require "bertlua.train.loop"
local batched = require "bertlua.batched"
local schedule = require "bertlua.train.schedule"
local ft = require "bertlua.tasks.common"
local cjson = require "cjson"

local tmp = os.tmpname(); os.remove(tmp)
os.execute("mkdir -p " .. tmp)
T.at_exit(function() if not os.getenv("BL_KEEP") then os.execute("rm -rf " .. tmp) end end)

-- no dropout, so a batch split into micro-batches must give the same gradient
local cfg = { vocab_size = 97, hidden_size = 16, num_hidden_layers = 2, num_attention_heads = 2,
  intermediate_size = 32, max_position_embeddings = 64, hidden_dropout_prob = 0, attention_probs_dropout_prob = 0 }

-- 24 random rows of random lengths 5..20; the label is a function of the second token
local function data(seed, n)
  local rng = require("bertlua.util.rng")(seed)
  local rows = {}
  for i = 1, n do
    local len = 4 + rng(16)
    local ids, types = { 2 }, { 0 }
    for k = 2, len do ids[k] = 4 + rng(90); types[k] = k > len / 2 and 1 or 0 end
    rows[i] = { ids = ids, types = types, label = ids[2] < 49 and 1 or 0 }
  end
  return rows
end
local rows = data(1, 24)
local function batch_of(idx)
  local sel = {}
  for k, i in ipairs(idx) do sel[k] = rows[i] end
  local b = batched.pad_rows(sel, 64)
  b.labels = bl.from((function() local l = {} for k, r in ipairs(sel) do l[k] = r.label end return l end)(),
    { dtype = "i32" })
  return b
end

local function trained(micro, steps)
  local m = bert.BertForSequenceClassification(cfg, { seed = 9, num_labels = 2 })
  trainer.fit{ model = m, n = #rows, batch = 8, micro_batch = micro, epochs = 1, lr = 1e-2, warmup = 0.34,
    seed = 4, max_steps = steps, make_batch = batch_of }
  return m.flat_params:totable(), m
end

T.test("accumulation: 8 = 4 x 2 = 2 x 4 gives the same weights", function()
  local full = trained(8, 3)
  local init = bert.BertForSequenceClassification(cfg, { seed = 9, num_labels = 2 }).flat_params:totable()
  local moved = 0
  for i = 1, #full do moved = math.max(moved, math.abs(full[i] - init[i])) end
  T.truthy(moved > 1e-3, "the weights moved " .. moved)
  for _, micro in ipairs({ 4, 2 }) do
    local w = trained(micro, 3)
    T.near(w, full, 1e-4, 2e-6, "micro " .. micro)
  end
end)

T.test("every example once per epoch; lr of each step follows the linear schedule", function()
  local m = bert.BertForSequenceClassification(cfg, { seed = 9, num_labels = 2 })
  local seen = {}
  local log = tmp .. "/log.jsonl"
  local r = trainer.fit{ model = m, n = #rows, batch = 6, micro_batch = 3, epochs = 2, lr = 1e-3, warmup = 0.25,
    seed = 5,
    log_path = log, make_batch = function(idx)
      for _, i in ipairs(idx) do seen[i] = (seen[i] or 0) + 1 end
      return batch_of(idx)
    end }
  T.eq(r.steps, 8)
  for i = 1, #rows do T.eq(seen[i], 2, "example " .. i) end
  local lr_at = schedule.linear_warmup{ lr = 1e-3, total_steps = 8, warmup_proportion = 0.25 }
  local steps = {}
  for l in io.lines(log) do local x = cjson.decode(l); if x.step then steps[#steps + 1] = x end end
  T.eq(#steps, 8)
  for s, x in ipairs(steps) do
    T.eq(x.step, s)
    T.near(x.lr, lr_at(s), 1e-9, 1e-15)
    T.truthy(x.loss > 0 and x.seq_per_s > 0, "step " .. s)
  end
  T.near(steps[3].lr, 1e-3, 1e-9); T.truthy(steps[8].lr < steps[4].lr, "decays")
  -- a different seed shuffles differently
  local order1, order2 = {}, {}
  for _, pair in ipairs({ { 5, order1 }, { 6, order2 } }) do
    trainer.fit{ model = bert.BertForSequenceClassification(cfg, { seed = 9, num_labels = 2 }), n = #rows, batch = 6,
      epochs = 1, lr = 1e-3, seed = pair[1], max_steps = 1,
      make_batch = function(idx) for _, i in ipairs(idx) do pair[2][#pair[2] + 1] = i end return batch_of(idx) end }
  end
  T.truthy(table.concat(order1, ",") ~= table.concat(order2, ","), "seeded order")
end)

-- One step over all 24 rows (so the shuffle cannot matter), no warmup, no
-- decay: the update must be Adam's first step on the gradient clipped to
-- max_grad_norm, computed here from the gradient of a separate
-- forward/backward. A clip far below the gradient's norm shrinks g below
-- eps, so the update depends on the clip (unclipped it would be ~lr*sign(g)).
T.test("max_grad_norm clips the global gradient norm before the AdamW step; 0 = off", function()
  local all = {}
  for i = 1, #rows do all[i] = i end
  local ref = bert.BertForSequenceClassification(cfg, { seed = 9, num_labels = 2 })
  local w0 = ref.flat_params:totable()
  ref:train(); ref:zero_grad()
  ref:forward(batch_of(all)); ref:backward(1)
  local g = ref.flat_grads:totable()
  local norm = 0
  for i = 1, #g do norm = norm + g[i] * g[i] end
  norm = math.sqrt(norm)
  T.truthy(norm > 1e-3, "gradient norm " .. norm)
  local lr, eps = 1e-2, 1e-6
  for _, clip in ipairs({ 1e-7 * norm, 3e-6 * norm, 0 }) do
    local m = bert.BertForSequenceClassification(cfg, { seed = 9, num_labels = 2 })
    trainer.fit{ model = m, n = #rows, batch = #rows, epochs = 1, lr = lr, warmup = 0, weight_decay = 0,
      max_grad_norm = clip, seed = 4, make_batch = batch_of }
    local w, want = m.flat_params:totable(), {}
    local c = clip > 0 and math.min(1, clip / norm) or 1
    for i = 1, #w0 do
      local gi = g[i] * c
      want[i] = w0[i] - lr * gi / (math.abs(gi) + eps)
    end
    T.near(w, want, 1e-3, lr * 1e-3, "clip " .. clip)
  end
end)

T.test("the loss falls on a learnable toy task", function()
  local m = bert.BertForSequenceClassification(cfg, { seed = 9, num_labels = 2 })
  local log = tmp .. "/toy.jsonl"
  trainer.fit{ model = m, n = #rows, batch = 8, epochs = 20, lr = 1e-2, warmup = 0.1, seed = 1, log_path = log,
    make_batch = batch_of }
  local l = {}
  for line in io.lines(log) do local x = cjson.decode(line); if x.loss then l[#l + 1] = x.loss end end
  local first, last = (l[1] + l[2] + l[3]) / 3, (l[#l] + l[#l - 1] + l[#l - 2]) / 3
  T.truthy(last < first * 0.7, ("loss %.4f -> %.4f"):format(first, last))
  if os.getenv("BL_VERBOSE") then print(("toy loss %.4f -> %.4f"):format(first, last)) end
end)

T.test("precision: bf16 and fp16 (f32 master weights) track the fp32 loss curve; fp32 is the default bitwise",
  function()
  local function run(prec, scaler)
    local m = bert.BertForSequenceClassification(cfg, { seed = 9, num_labels = 2 })
    local log = ("%s/prec_%s%s.jsonl"):format(tmp, prec or "default", scaler and "_s" or "")
    local r = trainer.fit{ model = m, n = #rows, batch = 8, epochs = 20, lr = 1e-2, warmup = 0.1, seed = 1,
      log_path = log,
      make_batch = batch_of, precision = prec, scaler = scaler }
    local l, recs = {}, {}
    for line in io.lines(log) do
      local x = cjson.decode(line)
      if x.step then l[#l + 1] = x.loss; recs[#recs + 1] = x end
    end
    return l, r, m, recs
  end
  local ref, _, mref = run(nil)
  local f32, _, m32 = run("fp32")
  T.near(f32, ref, 0, 0, "explicit fp32 = default")
  T.near(m32.flat_params:totable(), mref.flat_params:totable(), 0, 0, "fp32 weights bitwise")
  local tf32 = run("tf32")
  T.near(tf32, ref, 0, 0, "tf32 = fp32 on the CPU")
  local function tail(l) return (l[#l] + l[#l - 1] + l[#l - 2]) / 3 end
  local verbose = os.getenv("BL_VERBOSE")
  for _, prec in ipairs({ "bf16", "fp16" }) do
    local l, r, _, recs = run(prec)
    T.eq(#l, #ref)
    local worst = 0
    for i = 1, #l do worst = math.max(worst, math.abs(l[i] - ref[i])) end
    if verbose then print(("%s: tail loss %.4f (fp32 %.4f), largest step difference %.4f"):format(prec, tail(l),
      tail(ref), worst)) end
    T.truthy(worst < 0.05, ("%s: largest per-step loss difference %.4f"):format(prec, worst))
    T.near(tail(l), tail(ref), 0, 0.01, prec .. " tail")
    T.truthy(tail(l) < l[1] * 0.2, prec .. " learned")
    T.eq(r.skipped, 0)
    T.eq(recs[1].loss_scale, prec == "fp16" and 65536 or nil)
  end
  -- a loss scale far too large: the first fp16 steps overflow, are skipped and
  -- back off the scale; training then proceeds and still learns
  local l, r, _, recs = run("fp16", { init_scale = 2 ^ 24 })
  local logged = 0
  for _, x in ipairs(recs) do if x.skipped then logged = logged + 1 end end
  T.truthy(r.skipped > 0 and logged == r.skipped and r.loss_scale < 2 ^ 24, ("%d skipped, scale %g"):format(r.skipped,
    r.loss_scale))
  if verbose then print(("fp16 from scale 2^24: %d steps skipped, scale %g, tail loss %.4f"):format(r.skipped,
    r.loss_scale, tail(l))) end
  T.truthy(tail(l) < l[1] * 0.3, ("fp16 with skips learned: %.4f -> %.4f"):format(l[1], tail(l)))
  T.raises(function() run("fp8") end, "unknown precision 'fp8'")
end)

T.test("pad_rows: longest in batch, multiple of 8; padding does not change logits", function()
  local b, S = batched.pad_rows({ rows[1], rows[2], rows[3] }, 64)
  local longest = math.max(#rows[1].ids, #rows[2].ids, #rows[3].ids)
  T.eq(S, math.ceil(longest / 8) * 8)
  T.eq(b.input_ids:size(1), 3); T.eq(b.input_ids:size(2), S)
  local mask, ids, types = b.attention_mask:totable(), b.input_ids:totable(), b.token_type_ids:totable()
  for r = 1, 3 do
    for i = 1, S do
      local real = i <= #rows[r].ids
      T.eq(mask[(r - 1) * S + i], real and 1 or 0)
      T.eq(ids[(r - 1) * S + i], real and rows[r].ids[i] or 0)
      T.eq(types[(r - 1) * S + i], real and rows[r].types[i] or 0)
    end
  end
  local _, S2 = batched.pad_rows({ { ids = { 1, 2, 3 } } }, 64)
  T.eq(S2, 8)
  local _, S3 = batched.pad_rows({ { ids = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 } } }, 9)
  T.eq(S3, 9)
  local m = bert.BertForSequenceClassification(cfg, { seed = 3, num_labels = 2 })
  m:eval()
  local together = m:forward(b).logits:totable()
  for r = 1, 3 do
    local alone = m:forward((batched.pad_rows({ rows[r] }, #rows[r].ids))).logits:totable()
    T.near({ together[2 * r - 1], together[2 * r] }, alone, 1e-4, 1e-6, "row " .. r)
  end
end)

T.test("predict: eval mode, every sequence once, ordered percentiles", function()
  local m = bert.BertForSequenceClassification(cfg, { seed = 3, num_labels = 2 })
  m:train()
  local got = {}
  local st = batched.predict{ model = m, n = #rows, batch = 5, make_batch = batch_of,
    consume = function(idx, out)
      T.eq(out.logits:size(1), #idx)
      for _, i in ipairs(idx) do got[#got + 1] = i end
    end }
  T.eq(#got, #rows)
  for i = 1, #rows do T.eq(got[i], i) end
  T.eq(st.batches, 5); T.eq(st.sequences, 24)
  T.truthy(st.p50_ms > 0 and st.p50_ms <= st.p90_ms and st.p90_ms <= st.p99_ms and st.seq_per_s > 0, cjson.encode(st))
  T.truthy(batched.format_latency(st):find("p99", 1, true), "formatted")
  -- eval mode: no dropout even in a model configured with it, so runs repeat exactly
  local c2 = {}
  for k, v in pairs(cfg) do c2[k] = v end
  c2.hidden_dropout_prob, c2.attention_probs_dropout_prob = 0.5, 0.5
  local md = bert.BertForSequenceClassification(c2, { seed = 3, num_labels = 2 })
  local runs = {}
  for k = 1, 2 do
    runs[k] = {}
    batched.predict{ model = md, n = 8, batch = 8, make_batch = batch_of,
      consume = function(_, out) runs[k] = out.logits:totable() end }
  end
  T.near(runs[2], runs[1], 0, 0)
end)

T.test("bad input: batch and micro-batch, too little data, input checks", function()
  local m = bert.BertForSequenceClassification(cfg, { seed = 3, num_labels = 2 })
  T.raises(function() trainer.fit{ model = m, n = 24, batch = 8, micro_batch = 3, epochs = 1, lr = 1e-3,
    make_batch = batch_of } end,
    "--batch must be a multiple of --micro-batch x ranks")
  -- a user error: one line, no position (the host prints no traceback for it)
  local ok, msg = pcall(trainer.fit, { model = m, n = 5, batch = 8, epochs = 1, lr = 1e-3, make_batch = batch_of })
  T.eq(ok, false)
  T.eq(msg, "trainer: 5 training examples are fewer than one batch of 8: lower --batch or train on more data")
  T.raises(function() ft.model_dir("x", tmp .. "/none") end, "model directory " .. tmp .. "/none does not exist")
  T.raises(function() ft.model_dir("x", tmp) end, "no config.json")
  T.raises(function() ft.input_file("x", tmp, "--input") end, "is a directory")
  T.raises(function() ft.input_file("x", tmp .. "/nofile", "--input") end,
    "--input=" .. tmp .. "/nofile cannot be read")
  T.raises(function() ft.input_file("x", nil, "--input") end, "--input=FILE is required")
  pretrained.save_pretrained(m, tmp .. "/m", {})
  os.remove(tmp .. "/m/vocab.txt")
  T.raises(function() ft.model_dir("x", tmp .. "/m") end, "has no vocab.txt")
  local f = io.open(tmp .. "/v.txt", "w"); f:write("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n"); f:close()
  T.eq(ft.model_dir("x", tmp .. "/m", tmp .. "/v.txt"), tmp .. "/v.txt")
end)

-- what fn prints (print only), fn's errors raised after print is restored
local function capture(fn)
  local lines, real = {}, print
  print = function(...) lines[#lines + 1] = table.concat({ ... }, "\t") end   -- luacheck: ignore 121
  local ok, err = pcall(fn)
  print = real   -- luacheck: ignore 121
  if not ok then error(err, 0) end
  return table.concat(lines, "\n")
end

T.test("checkpoints: a stopped run resumed equals the uninterrupted one bitwise; another run's are refused",
  function()
  local dcfg = {}
  for k, v in pairs(cfg) do dcfg[k] = v end
  dcfg.hidden_dropout_prob, dcfg.attention_probs_dropout_prob = 0.1, 0.1   -- dropout streams must line up too
  -- 24 rows, batch 8: 3 steps an epoch, 9 in all; stops mid-epoch (every 2, stop after 5: resumed from 4) and at an
  -- epoch's end (every 3, stop after 7: resumed from 6, the third epoch's shuffle still to come)
  local function run(precision, dir, every, stop_after, resume, lr)
    local m = bert.BertForSequenceClassification(dcfg, { seed = 9, num_labels = 2 })
    local r = trainer.fit{ model = m, n = #rows, batch = 8, micro_batch = 4, epochs = 3, lr = lr or 1e-2,
      warmup = 0.2, seed = 4, precision = precision, make_batch = batch_of,
      log_path = dir and dir .. "/train_log.jsonl",
      checkpoints = dir and { dir = dir .. "/checkpoints", every = every, resume = resume },
      stop = stop_after and function(_, ran) return ran >= stop_after and "test" or nil end }
    return m.flat_params:totable(), r
  end
  for _, precision in ipairs { "fp32", "fp16" } do
    local whole, rw = run(precision)
    for _, c in ipairs { { every = 2, stop = 5, from = 4 }, { every = 3, stop = 7, from = 6 } } do
      local dir = ("%s/resume_%s_%d"):format(tmp, precision, c.every)
      local part = run(precision, dir, c.every, c.stop)
      T.truthy(part[1] ~= whole[1] or part[#part] ~= whole[#whole], "the stopped run is not yet the whole one")
      local out = capture(function()
        local resumed, r = run(precision, dir, c.every, nil, true)
        T.near(resumed, whole, 0, 0)
        T.eq(r.loss_scale, rw.loss_scale)
      end)
      T.truthy(out:find(("resumed from %s/checkpoints/ckpt%%-0*%d at step %d of 9"):format(dir:gsub("%p", "%%%0"),
        c.from, c.from)), out)
    end
  end
  -- checkpoints left without --resume, and another run's, are refused; nothing to resume starts at 0
  local dir = tmp .. "/resume_fp32_2"
  T.raises(function() run("fp32", dir, 2) end, "holds checkpoints of an earlier run")
  T.raises(function() run("fp32", dir, 2, nil, true, 2e-2) end, "a different run: lr = 0.01 there, 0.02 now")
  local out = capture(function() run("fp32", tmp .. "/fresh", 2, 1, true) end)
  T.truthy(out:find("nothing to resume", 1, true), out)
end)

T.test("loop.run: hook order, resume offset, stop reason, a missing batch", function()
  local seen = {}
  local function rec(...) seen[#seen + 1] = table.concat({ ... }, " ") end
  local step, reason = trainer.run{ name = "toy", start = 2, total = 5,
    stop = function(s, ran) rec("stop", s, ran) end,
    batch = function(s, a) rec("batch", s, a); return { s = s, a = a } end,
    step = function(s, next_batch) local b = next_batch(2); rec("step", s, b.s, b.a); return { loss = s } end,
    log = function(r, s) rec("log", r.loss, s) end,
    checkpoint = function(s) rec("checkpoint", s) end,
    evaluate = function(s) rec("evaluate", s) end }
  T.eq(step, 5); T.eq(reason, nil)
  T.eq(table.concat(seen, ", "), "stop 2 0, batch 3 2, step 3 3 2, log 3 3, checkpoint 3, evaluate 3, " ..
    "stop 3 1, batch 4 2, step 4 4 2, log 4 4, checkpoint 4, evaluate 4, " ..
    "stop 4 2, batch 5 2, step 5 5 2, log 5 5, checkpoint 5, evaluate 5")
  step, reason = trainer.run{ total = 10, step = function() return {} end,
    stop = function(_, ran) return ran == 3 and "max-steps" or nil end }
  T.eq(step, 3); T.eq(reason, "max-steps")
  T.raises(function()
    trainer.run{ name = "toy", total = 1, batch = function() return nil end,
      step = function(_, next_batch) return next_batch(1) end }
  end, "toy: the data loader returned no batch")
end)

T.run()
