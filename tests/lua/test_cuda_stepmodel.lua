-- The step-time model (lua/bertlua/stepmodel.lua, bl_cuda_record_*): its arithmetic on a made-up launch list, and
-- the launch log of a real bf16 training step on cuda:0 checked against what the model must contain:
--   * every launch the emulator accepted states its cost (none "unannotated"), one record per kernel launch;
--   * the GEMM FLOPs equal the analytic count of BERT's matmuls (independent of the launch sites' statements);
--   * a dry run records the same launches as a real run of the same step;
--   * no op of the step converts its operands through the generic strided copy (attention exempt for now), and
--     the step with its LAMB update casts nothing (the update writes the bf16 compute copy);
--   * the split of a recorded step into micro-batch and optimizer-step parts (marks) and the bound at an
--     accumulation (the first micro-batch, A - 1 later ones, the optimizer step); backward adds into the gradient
--     buffer (two backward calls without zeroing give the sum), so pre-training's step with accumulation makes no
--     full-gradient-buffer pass per micro-batch;
--   * a step's loss seed 1/accum is applied by the cross-entropy (no pass over the logits' gradient, same bits);
--   * a LayerNorm backward that falls back from its output to the sum's inputs is costed with the extra pass.
local T = require "testing"
local bl = require "bertlua"
local bert = require "bertlua.bert"
local config = require "bertlua.bert.config"
local core = require "bertlua.core"
local stepmodel = require "bertlua.stepmodel"
local optim = require "bertlua.train.optim"
local amp = require "bertlua.train.amp"
local tstep = require "bertlua.train.step"
local device = require "bertlua.train.device"
local C, check, ffi = core.C, core.check, core.ffi

local HAVE_GPU = bl.cuda_available()
local function need_gpu()
  if not HAVE_GPU then T.skip(bl.cuda_compiled() and "no CUDA device" or "no CUDA device (CPU-only build)") end
end
local function emulated()
  local nb = ffi.new("char[256]")
  check(C.bl_cuda_device_name(0, nb, 256))
  return ffi.string(nb):find("emulated", 1, true) ~= nil
end

T.test("model arithmetic: roofline per launch, launch gaps, classes, and a launch without a cost is refused", function()
  local p = { name = "test", tc16 = 1e12, tf32 = 5e11, fp32 = 1e11, hbm = 1e9, pcie = 1e8, launch_us = 10 }
  local list = {
    { name = "g", cls = "gemm", engine = "tc16", flops = 4e9, bytes = 1e6 },   -- compute-bound: 4 ms
    { name = "g2", cls = "gemm", engine = "tc16", flops = 1e6, bytes = 2e6 },  -- memory-bound: 2 ms
    { name = "a", cls = "attention", engine = "fp32", flops = 3e8, bytes = 1e6 }, -- 3 ms
    { name = "ln", cls = "layernorm", engine = "mem", flops = 0, bytes = 5e6 },   -- 5 ms
    { name = "h", cls = "host copy", engine = "pcie", flops = 0, bytes = 1e5 },   -- 1 ms, not HBM bytes
  }
  local rows, t = stepmodel.evaluate(list, p)
  T.near(t.gemm_s, 6e-3, 1e-12, 0, "GEMM time")
  T.near(t.other_s, 9e-3, 1e-12, 0, "non-GEMM time")
  T.near(t.gap_s, 5 * 10e-6, 1e-12, 0, "launch gaps")
  T.near(t.step_s, 15e-3 + 50e-6, 1e-12, 0, "step")
  T.near(t.other_bytes, 6e6, 1e-12, 0, "non-GEMM HBM bytes")
  T.eq(rows[1].cls, "gemm")
  T.eq(rows[1].launches, 2)
  list[1].in_graph, list[3].in_graph = true, true
  local _, tg = stepmodel.evaluate(list, p)
  T.near(tg.step_s, 15e-3 + 30e-6, 1e-12, 0, "launches captured in a graph have no gap, the others keep theirs")
  T.eq(tg.in_graph, 2)
  list[#list + 1] = { name = "k (x.cu:3)", cls = "unannotated", engine = "mem", flops = 0, bytes = 0 }
  T.raises(function() stepmodel.evaluate(list, p) end, "before them): k (x.cu:3)")
end)

T.test("model scenarios: named figures with sources, ordered ranges, exact per-launch charges", function()
  for name, prof in pairs(stepmodel.profiles) do
    T.truthy(prof.source and prof.tc16 and prof.hbm, name .. ": datasheet peaks and their source")
    for _, n in ipairs({ "gemm_large", "gemm_medium", "gemm_small", "mem_eff", "pcie" }) do
      local v = prof[n]
      T.truthy(type(v[4]) == "string" and #v[4] > 0, name .. "." .. n .. " states a source or 'assumed'")
      T.truthy(v[1] <= v[2] and v[2] <= v[3], name .. "." .. n .. ": slow <= expected <= fast efficiency")
      if n ~= "pcie" then T.truthy(v[3] <= 1, name .. "." .. n .. " is a fraction of the peak") end
    end
    for _, n in ipairs({ "attn_fwd", "attn_bwd", "launch_us", "graph_us", "min_us" }) do
      local v = prof[n]
      T.truthy(type(v[4]) == "string" and #v[4] > 0, name .. "." .. n .. " states a source or 'assumed'")
      T.truthy(v[1] >= v[2] and v[2] >= v[3], name .. "." .. n .. ": slow >= expected >= fast overhead")
    end
  end
  local h = stepmodel.profiles.h100
  local e = stepmodel.scenario(h, 2)
  local list = {
    { name = "g", cls = "gemm", engine = "tc16", flops = 4e10, bytes = 1e8 },         -- large
    { name = "m", cls = "gemm", engine = "tc16", flops = 2e9, bytes = 1e6 },          -- medium
    { name = "attn_tc_bwd", cls = "attention", engine = "tc16", flops = 1e10, bytes = 1e8 },
    { name = "ln", cls = "layernorm", engine = "mem", flops = 0, bytes = 3e8 },
    { name = "tiny", cls = "memset", engine = "mem", flops = 0, bytes = 4, in_graph = true },
  }
  local want = {
    4e10 / (e.tc16 * e.gemm_large), 2e9 / (e.tc16 * e.gemm_medium),
    math.max(1e10 / e.tc16, 1e8 / (e.hbm * e.mem_eff)) * e.attn_bwd,
    3e8 / (e.hbm * e.mem_eff), e.min_us * 1e-6,
  }
  local total = want[1] + want[2] + want[3] + want[4] + want[5] + 4 * e.launch_us * 1e-6 + e.graph_us * 1e-6
  local _, t = stepmodel.evaluate(list, h)
  T.near(t.step_s, total, 1e-12, 0, "expected scenario: each launch at its named efficiency, slowdown, minimum, gap")
  local r = stepmodel.range(list, h)
  T.truthy(r[1] > r[2] and r[2] > r[3], ("slow > expected > fast step time: %g %g %g"):format(r[1], r[2], r[3]))
  -- A100 vs H100: between the bandwidth ratio (1.64) for a memory-bound step and the bf16 peak ratio (3.2)
  local a = stepmodel.profiles.a100
  for k = 1, 3 do
    local mem_only = { list[4] }
    local q = stepmodel.range(list, a)[k] / r[k]
    local qm = stepmodel.range(mem_only, a)[k] / stepmodel.range(mem_only, h)[k]
    T.truthy(q > 1.5 and q < 3.2, ("A100 / H100 step time %.2f (scenario %d)"):format(q, k))
    local gap = h.launch_us[k] * 1e-6   -- the same in both profiles
    T.near(qm, (3e8 / (a.hbm * a.mem_eff[k]) + gap) / (3e8 / (h.hbm * h.mem_eff[k]) + gap), 1e-9, 0,
      "memory-bound: the bandwidth ratio")
    T.truthy(qm > 1.55 and qm < 1.7, ("memory-bound A100 / H100 %.3f"):format(qm))
  end
end)

T.test("split arithmetic: micro-batch and optimizer-step parts from the marks, the bound at an accumulation", function()
  local p = { name = "test", tc16 = 1e12, tf32 = 5e11, fp32 = 1e11, hbm = 1e9, pcie = 1e8, launch_us = 0 }
  local function l(cls, bytes) return { name = cls, cls = cls, engine = "mem", flops = 0, bytes = bytes } end
  -- zeroing 1 ms | micro-batch 1: GEMM 2 ms + LayerNorm 1 ms | micro-batch 2: the same | optimizer 4 ms
  local list = { l("memset", 1e6), l("gemm", 2e6), l("layernorm", 1e6), l("gemm", 2e6), l("layernorm", 1e6),
    l("optimizer", 4e6) }
  local marks = { { tag = "micro", at = 1 }, { tag = "micro", at = 3 }, { tag = "step", at = 5 } }
  local micro, step = stepmodel.parts(list, marks)
  T.eq(#micro, 2, "micro-batches")
  T.eq(#micro[1] + #micro[2], 4, "launches in the micro-batches")
  T.eq(step[1].cls .. "," .. step[2].cls, "memset,optimizer", "the optimizer step's launches")
  local text, res = stepmodel.accum_report(list, marks, p, 8, { { 1 }, { 10, "ten" } })
  T.near(res[1].step_s, 8e-3, 1e-12, 0, "accumulation 1")
  T.near(res[2].step_s, 35e-3, 1e-12, 0, "accumulation 10")
  T.near(res[2].seqs_per_s, 80 / 35e-3, 1e-12, 0, "seq/s at accumulation 10")
  T.near(res[2].non_gemm, 15 / 35, 1e-12, 0, "non-GEMM share at accumulation 10")
  T.truthy(text:find("accumulation 10 (ten)", 1, true), text)
  -- a later micro-batch that differs from the first (an accumulation add, 1 ms): A - 1 of them
  table.insert(list, 5, l("elementwise", 1e6))
  marks[3].at = 6
  res = select(2, stepmodel.accum_report(list, marks, p, 8, { { 1 }, { 10 } }))
  T.near(res[1].step_s, 8e-3, 1e-12, 0, "accumulation 1: the first micro-batch only")
  T.near(res[2].step_s, 3e-3 + 9 * 4e-3 + 5e-3, 1e-12, 0, "accumulation 10: the first and 9 later micro-batches")
  T.raises(function() stepmodel.accum_report(list, {}, p, 8, { { 1 } }) end, "marked no micro-batch")
end)

T.test("recording needs CUDA; reading the log while recording is an error", function()
  if not HAVE_GPU then
    T.raises(function() check(C.bl_cuda_record_begin(0)) end, "cuda:0")
    return
  end
  check(C.bl_cuda_record_begin(0))
  local r = ffi.new("bl_cuda_launch_rec")
  T.raises(function() check(C.bl_cuda_record_get(0, r)) end, "after bl_cuda_record_end")
  T.raises(function() check(C.bl_cuda_record_begin(0)) end, "being recorded already")
  local n = ffi.new("int64_t[1]")
  check(C.bl_cuda_record_end(0, n))
  T.raises(function() check(C.bl_cuda_record_end(0, n)) end, "not being recorded")
  T.raises(function() check(C.bl_cuda_record_mark(0, n)) end, "not being recorded")
  if not emulated() then T.raises(function() check(C.bl_cuda_dry_run(0, 1)) end, "emulated device") end
end)

local CFG = config.new{ vocab_size = 104, hidden_size = 64, num_hidden_layers = 2, num_attention_heads = 2,
  intermediate_size = 96, max_position_embeddings = 64, hidden_dropout_prob = 0.1, attention_probs_dropout_prob = 0.1 }
local B, S, P = 3, 24, 4

local function batch(shift)
  local ids, am, pos, lab, nsp = {}, {}, {}, {}, {}
  for b = 1, B do
    ids[b], am[b], pos[b], lab[b] = {}, {}, {}, {}
    for s = 1, S do
      ids[b][s] = (7 * b + 13 * s + (shift or 0)) % CFG.vocab_size
      am[b][s] = s <= S - b and 1 or 0
    end
    for j = 1, P do pos[b][j], lab[b][j] = 2 * j + b, (5 * j + b) % CFG.vocab_size end
    nsp[b] = b % 2
  end
  local t = {
    input_ids = bl.from(ids, { dtype = "i32" }), attention_mask = bl.from(am),
    token_type_ids = bl.zeros({ B, S }, { dtype = "i32" }), masked_lm_positions = bl.from(pos, { dtype = "i32" }),
    masked_lm_labels = bl.from(lab, { dtype = "i32" }), next_sentence_labels = bl.from(nsp, { dtype = "i32" }),
  }
  for _, k in ipairs({ "input_ids", "attention_mask", "token_type_ids", "next_sentence_labels" }) do
    t[k] = t[k]:to("cuda:0")
  end
  return t
end

local function train_step(m, bt)
  return function()
    m:zero_grad()
    m:forward(bt)
    m:backward()
  end
end

-- a bf16 pre-training model in training mode on cuda:0 and its batch
local function bf16_model(seed)
  local m = bert.BertForPreTraining(CFG, { seed = seed }):to{ device = "cuda:0", dtype = "bf16" }
  m:train()
  return m, batch()
end

T.test("timed recording: every launch of a timed recording has a measured time, an untimed one none", function()
  need_gpu()
  local x = bl.randn({ 256, 512 }, { seed = 3 }):to("cuda:0")
  local function work() for _ = 1, 3 do x = x * 2 + x end end
  local list = stepmodel.record(0, work, true)
  T.truthy(#list >= 6, "launches recorded: " .. #list)
  local measured = 0
  for _, l in ipairs(list) do
    T.truthy(l.measured_s and l.measured_s >= 0, l.name .. " has a measured time")
    measured = measured + (l.measured_s or 0)
  end
  T.truthy(measured > 0, "some time was measured")
  local text = stepmodel.report(list, 0, stepmodel.profiles.h100, 1, "ops")
  T.truthy(text:find("measured ms", 1, true), text)
  for _, l in ipairs(stepmodel.record(0, work)) do T.eq(l.measured_s, nil, l.name .. " untimed") end
end)

T.test("a bf16 training step's log: all launches costed, GEMM FLOPs = BERT's matmul count", function()
  need_gpu()
  local m = bert.BertForPreTraining(CFG, { seed = 3 }):to{ device = "cuda:0", dtype = "bf16" }
  m:train()
  local bt = batch()
  train_step(m, bt)()   -- warm-up: scratch and cuBLASLt plans exist before the recorded step
  local c0 = ffi.new("bl_cuda_count")
  check(C.bl_cuda_counters(0, c0))
  local list = stepmodel.record(0, train_step(m, bt))
  local c1 = ffi.new("bl_cuda_count")
  check(C.bl_cuda_counters(0, c1))
  local _, t = stepmodel.evaluate(list, stepmodel.profiles.h100)   -- raises on an unannotated launch
  T.truthy(t.launches > 50, "a step makes many launches")
  local kernels, gemm_flops, attn_flops = 0, 0, 0
  for _, l in ipairs(list) do
    if not l.name:find("^cu") then kernels = kernels + 1 end   -- cuBLASLt, cudaMemset/Memcpy are not our kernels
    if l.cls == "gemm" then gemm_flops = gemm_flops + l.flops end
    if l.cls == "attention" then attn_flops = attn_flops + l.flops end
    T.truthy(l.bytes >= 0 and l.flops >= 0, l.name .. ": costs are non-negative")
  end
  if emulated() then T.eq(kernels, tonumber(c1.launches - c0.launches), "one record per kernel launch") end
  -- forward + backward (dX, dW) = 3 x 2 multiply-adds per weight and row: encoder and pooler on all B*S rows
  -- (pooler on B), MLM transform and tied decoder on the B*P gathered rows, NSP classifier on B rows.
  local H, I, L, V = CFG.hidden_size, CFG.intermediate_size, CFG.num_hidden_layers, CFG.vocab_size
  local want = 6 * (B * S * L * (4 * H * H + 2 * H * I) + B * H * H + B * P * (H * H + H * V) + B * H * 2)
  T.eq(gemm_flops, want, "GEMM FLOPs of the step")
  -- head size 32 in bf16: the tensor-core attention, S^2 d multiply-adds, 2 forward + 5 backward, per head,
  -- layer and sequence
  T.eq(attn_flops, 2 * 7 * S * S * H * L * B, "attention FLOPs of the step")
  local names = {}
  for _, l in ipairs(list) do
    if l.cls == "attention" then names[l.name] = true end
    T.truthy(not (l.cls == "convert" and l.name:find("^attention")), "no conversion pass serves " .. l.name)
  end
  T.truthy(names.attn_tc_fwd and names.attn_tc_bwd and not names.attn_fwd, "the step runs the tensor-core kernels")
  -- the layers' residual gradients are added by the dx GEMMs (beta = 1) and every bias gradient comes out of a pass
  -- that runs anyway (BGRADB epilogue, LayerNorm / GELU backward): no [B,S,H] add, no column-sum pass
  local adds, colsums = 0, 0
  for _, l in ipairs(list) do
    if l.cls == "elementwise" and l.name == "add" and l.bytes >= 3 * B * S * H * 2 then adds = adds + 1 end
    if l.name == "colsum_partial" then colsums = colsums + 1 end
  end
  T.eq(adds, 0, "residual-gradient adds of [B,S,H]")
  T.eq(colsums, 0, "bias-gradient column-sum passes")
  -- the LayerNorm backward writes one parameter-gradient partial (3 x H floats) per block of several row groups
  -- (kernels/layernorm.cu: 4 groups of 8 rows at H = 64), not one per 8 rows: ln_bwd_final reads 4 (3 H nblk + 6 H)
  -- bytes, and nblk <= ceil(B S / 24) leaves room for 3 groups
  local finals = 0
  for _, l in ipairs(list) do
    if l.name == "ln_bwd_final" then
      finals = finals + 1
      local nblk = (l.bytes / 4 - 6 * H) / (3 * H)
      T.truthy(nblk <= math.ceil(B * S / 24), ("LayerNorm backward partials: %d blocks for at most %d rows, "
        .. "at most %d wanted"):format(nblk, B * S, math.ceil(B * S / 24)))
    end
  end
  T.truthy(finals > 0, "the step runs the LayerNorm backward")
end)

T.test("the attention kernels skip masked-out key tiles, and the model costs the keys they visit", function()
  need_gpu()
  -- S = 130: three tiles of 64 keys. Row 1 is full (130 keys visited), row 2 has 10 real keys (one tile, 64 keys
  -- visited): 194 of 260 keys. The model costs S d macs per visited key and head, 2 forward and 5 backward.
  local ops = require "bertlua.nn.ops"
  local Bq, Sq, heads, d = 2, 130, 2, 32
  local qkv = bl.rand({ Bq, Sq, 3 * heads * d }, { seed = 9, offset = 0 }):to{ device = "cuda:0", dtype = "bf16" }
  local dctx = bl.rand({ Bq, Sq, heads * d }, { seed = 10, offset = 0 }):to{ device = "cuda:0", dtype = "bf16" }
  local am = {}
  for b = 1, Bq do
    am[b] = {}
    for s = 1, Sq do am[b][s] = (b == 1 or s <= 10) and 1 or 0 end
  end
  local mask = bl.from(am):to("cuda:0")
  local H = heads * d
  local q, k, v = qkv:narrow(3, 1, H), qkv:narrow(3, H + 1, H), qkv:narrow(3, 2 * H + 1, H)
  local list = stepmodel.record(0, function()
    local ctx, lse = ops.attention(q, k, v, mask, heads, { p = 0.1, seed = 1 })
    ops.attention_backward(dctx, q, k, v, lse, heads, { ctx = ctx, key_mask = mask, p = 0.1, seed = 1 })
  end)
  local flops = { attn_tc_fwd = 0, attn_tc_bwd = 0 }
  for _, l in ipairs(list) do
    if flops[l.name] then flops[l.name] = flops[l.name] + l.flops end
  end
  local visited = Sq + 64
  T.eq(flops.attn_tc_fwd, 2 * 2 * heads * Sq * d * visited, "forward FLOPs: the visited keys only")
  T.eq(flops.attn_tc_bwd, 2 * 5 * heads * Sq * d * visited, "backward FLOPs: the visited keys only")
end)

T.test("the residual LayerNorm backward reads the output, not the sum's two inputs", function()
  need_gpu()
  -- dy, y in and dx, dresidual out: 4 [B*S, H] bf16 passes (5 when it read x and residual), plus gamma, beta,
  -- mean, rstd and the parameter-gradient partials
  local m, bt = bf16_model(3)
  train_step(m, bt)()
  local list = stepmodel.record(0, train_step(m, bt))
  local n, seen = B * S * CFG.hidden_size, 0
  for _, l in ipairs(list) do
    if l.name == "ln_bwd_rows" and l.bytes > 4 * 2 * n then
      seen = seen + 1
      T.truthy(l.bytes < 5 * 2 * n, ("ln_bwd_rows moves %d bytes: under 5 passes of %d"):format(l.bytes, 2 * n))
    end
  end
  T.eq(seen, 2 * CFG.num_hidden_layers, "residual LayerNorm backward launches (two per layer)")
end)

T.test("a LayerNorm backward that falls back to the sum's inputs (degenerate gamma) is costed with their pass",
  function()
    need_gpu()
    local ops = require "bertlua.nn.ops"
    local rows, H = 37, 64
    local function r(shape, seed) return bl.rand(shape, { seed = seed, offset = 0 }):to{ device = "cuda:0" } end
    local x, res, dy = r({ rows, H }, 1):to("bf16"), r({ rows, H }, 2):to("bf16"), r({ rows, H }, 3):to("bf16")
    local beta = r({ H }, 5) * 0.1
    local function ln_bytes(gamma)
      local y, mean, rstd = ops.residual_layernorm(x, res, gamma, beta)
      local list = stepmodel.record(0, function()
        ops.residual_layernorm_backward(dy, x, res, gamma, mean, rstd, { y = y, beta = beta })
      end)
      for _, l in ipairs(list) do if l.name == "ln_bwd_rows" then return l.bytes end end
      error("no ln_bwd_rows launch recorded")
    end
    local gamma = r({ H }, 4) + 0.5
    local safe = ln_bytes(gamma)
    gamma:narrow(1, 7, 1):fill_(0)   -- |gamma| < 2^-60 in one column: xhat cannot come from y
    T.eq(ln_bytes(gamma) - safe, 2 * rows * H, "the fallback's extra read of the residual")
  end)

T.test("a dry run records the same launches as a real run (emulated device)", function()
  need_gpu()
  if not emulated() then T.skip("dry runs exist on the emulated device only") end
  local m = bert.BertForPreTraining(CFG, { seed = 3 }):to{ device = "cuda:0", dtype = "bf16" }
  m:train()
  local bt = batch()
  train_step(m, bt)()
  local real = stepmodel.record(0, train_step(m, bt))
  check(C.bl_cuda_dry_run(0, 1))
  local ok, dry = pcall(stepmodel.record, 0, train_step(m, bt))
  check(C.bl_cuda_dry_run(0, 0))
  if not ok then error(dry, 0) end
  T.eq(#dry, #real, "launch count")
  for i = 1, #real do
    local a, b = real[i], dry[i]
    T.truthy(a.name == b.name and a.cls == b.cls and a.flops == b.flops and a.bytes == b.bytes,
      ("launch %d: %s/%s vs %s/%s"):format(i, a.name, a.cls, b.name, b.cls))
  end
end)

-- A bf16 step makes no generic conversion (bl_cuda_counters' `conversions`: dtype-changing launches of the strided
-- copy kernel, i.e. f32 images of bf16 operands); the log names the ops that still convert, so a failure says which
-- op lost its native path. Head size 32: the attention runs the tensor-core kernels, which read bf16 in place.
T.test("a bf16 training step makes no generic conversion", function()
  need_gpu()
  local m, bt = bf16_model(5)
  -- the update writes the bf16 compute copy in its own launches (optim with model=): no refresh cast follows it
  local lamb = optim.LAMB{ model = m, lr = 1e-3 }
  local function step()
    train_step(m, bt)()
    lamb:step()
  end
  step()
  local function conversions()
    local c = ffi.new("bl_cuda_count")
    check(C.bl_cuda_counters(0, c))
    return tonumber(c.conversions)
  end
  local c0 = conversions()
  local list = stepmodel.record(0, step)
  local total = conversions() - c0
  local bad = {}
  for _, l in ipairs(list) do
    if l.cls == "convert" then bad[#bad + 1] = l.name end
  end
  T.eq(table.concat(bad, ", "), "", "ops converting through the generic copy")
  local casts = 0
  for _, l in ipairs(list) do if l.cls == "cast" then casts = casts + 1 end end
  T.eq(casts, 0, "casts in a step (the compute copy is written by the optimizer's update)")
  T.eq(total, 0, "generic conversions counted by the runtime")
end)

-- Runs forward + backward of the batches in `bs` (with dropout streams seeds[i]) after one zero_grad: the gradient
-- buffer, per parameter, on the host.
local function grads_after(m, bs, seeds)
  m:zero_grad()
  for i, bt in ipairs(bs) do
    m.rng = bl.Generator(seeds[i])
    m:apply(function(x) x.rng = m.rng end)
    m:forward(bt)
    m:backward()
  end
  local r = {}
  for _, e in ipairs(m:parameters()) do r[e.name] = e.grad:to("cpu") end
  return r
end

-- Pre-training accumulates in the gradient buffer: each backward adds (dW GEMMs with beta = 1; the bias, LayerNorm and
-- embedding sums added where they are written). Two backward calls without zeroing = the two gradients added on the
-- host, bit for bit wherever a parameter gets one sum per backward, as the old separate accumulation buffer added
-- them. The embedding tables' segmented sums add each row into the buffer in index order (a chain starting from the
-- buffer, the CPU's order), and the tied word embedding also gets the MLM decoder's dW: their terms are added in
-- another order, so they differ by f32 rounding only: |d| <= gamma_n sum|terms| with n <= B*S + 2 terms; bounded
-- here by 1e-5 of the largest gradient of the table. A backward that overwrote the buffer gives g2 alone.
T.test("two backward calls without zeroing give the sum of the two gradients (cuda, bf16)", function()
  need_gpu()
  local m = bert.BertForPreTraining(CFG, { seed = 7 }):to{ device = "cuda:0", dtype = "bf16" }
  m:train()
  local b1, b2 = batch(0), batch(5)
  local g1 = grads_after(m, { b1 }, { 11 })
  local g2 = grads_after(m, { b2 }, { 12 })
  local gs = grads_after(m, { b1, b2 }, { 11, 12 })
  local exact, tables = 0, 0
  for name, g in pairs(gs) do
    local want = g1[name] + g2[name]
    local d = (g - want):abs():max()
    if name:find("_embeddings.weight", 1, true) then
      tables = tables + 1
      local scale = math.max(g1[name]:abs():max(), g2[name]:abs():max())
      T.truthy(d <= 1e-5 * scale, ("%s: largest difference %.3g, gradient scale %.3g"):format(name, d, scale))
    else
      exact = exact + 1
      T.eq(d, 0, name .. ": the sum differs from g1 + g2")
    end
    T.truthy(g1[name]:abs():max() == 0 or (g - g2[name]):abs():max() > 0, name .. ": the first gradient was lost")
  end
  T.eq(tables, 3, "embedding tables")
  T.truthy(exact > 20, "parameters checked bit for bit")
end)

-- pre-training's step (the benchmark's set-up) with accumulation 2, recorded with the step-time model's marks
local function recorded_accum_step()
  local m = bert.BertForPreTraining(CFG, { seed = 9 }):to{ device = "cuda:0", dtype = "bf16" }
  m:train()
  local dev = bl.device_of("cuda:0", "test")
  local lamb = optim.LAMB{ model = m, lr = 1e-3, weight_decay = 0.01, max_grad_norm = 1.0 }
  local ps = tstep.Step{ model = m, optimizer = lamb, amp = amp.MixedPrecision{ model = m }, dev = dev,
    loss = tstep.pretraining_loss(), accum = 2 }
  local bt = batch(1)
  ps:run(1, function() return bt end, 1e-3)
  ps:read()
  local list, _, marks = stepmodel.record(0, function(mark)
    ps.mark = mark
    ps:run(2, function() return bt end, 1e-3)
    ps.mark = nil
  end)
  return list, marks, m.flat_grads:numel()
end

-- A launch that moves at least the whole f32 gradient buffer once (a zeroing writes 4 bytes per gradient, an add
-- of another buffer moves 12) and is no GEMM: a full-gradient-buffer pass. The tiny model's activations are far
-- smaller than its parameters, so nothing else is that large here.
T.test("pre-training's step with accumulation: no full-gradient-buffer pass per micro-batch, one zeroing per step",
  function()
    need_gpu()
    local list, marks, n = recorded_accum_step()
    local micro, step = stepmodel.parts(list, marks)
    T.eq(#micro, 2, "micro-batches marked")
    local function full(l) return l.cls ~= "gemm" and l.bytes >= 4 * n end
    for a, ml in ipairs(micro) do
      local bad = {}
      for _, l in ipairs(ml) do if full(l) then bad[#bad + 1] = l.cls .. "/" .. l.name end end
      T.eq(table.concat(bad, ", "), "", ("micro-batch %d: full-gradient-buffer passes"):format(a))
    end
    local zeroings = 0
    for _, l in ipairs(step) do
      if (l.cls == "memset" or l.name == "fill") and l.bytes >= 4 * n then zeroings = zeroings + 1 end
    end
    T.eq(zeroings, 1, "zeroings of the gradient buffer per optimizer step")
  end)

-- A step's loss seed 1/accum (a number: bf16, no loss scaling) is known before the forward: the step hands it
-- over as stats.grad_scale and the cross-entropy writes the logits' gradients times it, so backward(1/accum) makes no
-- pass over the [masked rows, vocab] gradient. 0.5 is a power of two: the product's bits are those of scaling the
-- rounded gradient afterwards, so every gradient must be the same bit for bit.
T.test("the loss seed rides on the cross-entropy's gradient pass: no pass over the logits' gradient, same bits",
  function()
    need_gpu()
    local m, bt = bf16_model(7)
    local function run(folded, backward_scale)
      m:zero_grad()
      m.rng = bl.Generator(11)
      m:apply(function(x) x.rng = m.rng end)
      local stats = device.StepStats(0)
      stats.grad_scale = folded and (backward_scale or 0.5) or nil
      local list = stepmodel.record(0, function()
        m:forward(bt, stats)
        m:backward(backward_scale or 0.5)
      end)
      local scales = 0
      for _, l in ipairs(list) do if l.name == "affine" then scales = scales + 1 end end
      local r = {}
      for _, e in ipairs(m:parameters()) do r[e.name] = e.grad:to("cpu") end
      return r, scales
    end
    run(false)   -- warm-up: scratch and cuBLASLt plans
    local want, before = run(false)
    local got, after = run(true)
    T.eq(before, 2, "scaling passes when backward applies the seed (MLM and NSP logits' gradients)")
    T.eq(after, 0, "scaling passes when the cross-entropy applied it")
    local n = 0
    for name, g in pairs(got) do
      T.eq((g - want[name]):abs():max(), 0, name .. ": differs from scaling after the cross-entropy")
      n = n + 1
    end
    T.truthy(n > 20, "parameters compared")
    T.raises(function()
      m:forward(bt, setmetatable({ grad_scale = 0.5 }, { __index = device.StepStats(0) }))
      m:backward(0.25)
    end, "differs from the forward's stats.grad_scale")
    -- 1/3 (accumulation 3): one rounding of d * fl(s/c) to bf16 (relative error <= u + 2 u32, u = 2^-8) where the
    -- scaling afterwards rounded twice (<= 2 u + 2 u32): they differ by at most 3u (1 + 2^-6) of the larger
    local function dlogits(folded)
      run(folded, 1 / 3)
      return m._dmlm:to{ device = "cpu", dtype = "f32" }
    end
    local old, new = dlogits(false), dlogits(true)
    local worst = ((new - old):abs() - old:abs() * (3 * 2 ^ -8 * (1 + 2 ^ -6))):max()
    T.truthy(worst <= 0, ("1/3: the folded logits' gradient is within 3u of the scaled one (excess %g)"):format(worst))
    T.truthy(old:abs():max() > 0, "the logits' gradient is not zero")
  end)

-- The benchmark records a graphed step (which captures it) and then times replays of that capture: the kernels
-- that count for the model (mask_rows' visited keys, the LayerNorm backward's fallback) keep the cost slots'
-- addresses in the graph, so the slots must outlive the recording (a freed arena is an access outside every
-- allocation on the emulated device).
T.test("a step captured while it was recorded replays after the recording", function()
  need_gpu()
  local m = bert.BertForPreTraining(CFG, { seed = 9 }):to{ device = "cuda:0", dtype = "bf16" }
  m:train()
  local dev = bl.device_of("cuda:0", "test")
  local lamb = optim.LAMB{ model = m, lr = 1e-3, weight_decay = 0.01, max_grad_norm = 1.0 }
  local ps = tstep.Step{ model = m, optimizer = lamb, amp = amp.MixedPrecision{ model = m }, dev = dev,
    loss = tstep.pretraining_loss(), accum = 2 }:use_graph()
  local bt = batch(1)
  local function run(step) ps:run(step, function() return bt end, 1e-3) end
  for step = 1, 3 do run(step) end
  T.truthy(ps.graph_ready, "warmed up")
  stepmodel.record(0, function(mark)
    ps.mark = mark
    run(4)
    ps.mark = nil
  end)
  local replays = ps.replays
  run(5)
  run(6)
  ps:read()
  T.eq(ps.replays - replays, 2, "replays of the capture made while recording")
end)

T.run()
