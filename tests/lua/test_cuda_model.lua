-- The CUDA backend from Lua: tensor ops and whole BERT models on cuda:0
-- against the same thing on the CPU (the reference), through the same C
-- entry points (src/device/dispatch.h). Without a GPU only the error path
-- runs; every GPU test reports "skipped: no CUDA device".
--   * tensor core: Philox rand identical on both devices, elementwise,
--     reductions, matmul, strided/cross-device copies, get/set, arange
--   * BertForPreTraining (dropout on): loss, MLM accuracy and every gradient
--     vs the CPU; eval hidden states; QA and classification losses
--   * model:to{ dtype = "bf16" }: loss close to f32, finite gradients,
--     sync_compute() after an SGD step; model:to("cpu") round trip
--   * errors: mixed devices name both, ptr() on a GPU tensor
local T = require "testing"
local bl = require "bertlua"
local bert = require "bertlua.bert"
local config = require "bertlua.bert.config"
local core = require "bertlua.core"
local C, check = core.C, core.check

local HAVE_GPU = bl.cuda_available()
local function need_gpu()
  if not HAVE_GPU then
    T.skip(bl.cuda_compiled() and "no CUDA device" or "no CUDA device (CPU-only build)")
  end
end

local function max_abs_diff(a, b)
  local x, y = a:to{ dtype = "f64", device = "cpu" }:totable(), b:to{ dtype = "f64", device = "cpu" }:totable()
  local m, ref = 0, 0
  for i = 1, #x do
    local d = math.abs(x[i] - y[i])
    if d > m or d ~= d then m = d end
    if math.abs(y[i]) > ref then ref = math.abs(y[i]) end
  end
  return m, ref
end
-- floor: the smallest scale the error is measured against (for values that are rounding noise around 0)
local function close(a, b, rtol, what, floor)
  local m, ref = max_abs_diff(a, b)
  if not (m <= rtol * math.max(ref, floor or 1e-30)) then
    error(("%s: max |gpu - cpu| = %.3g, scale %.3g (rtol %g)"):format(what, m, ref, rtol), 2)
  end
end

local CFG = config.new{ vocab_size = 96, hidden_size = 64, num_hidden_layers = 2, num_attention_heads = 4,
  intermediate_size = 128, max_position_embeddings = 64, hidden_dropout_prob = 0.1, attention_probs_dropout_prob = 0.1 }

local function batch(B, S, P) return require("fixtures").pretrain_batch(CFG.vocab_size, B, S, P) end

T.test("without a GPU, moving a model to cuda fails cleanly", function()
  if HAVE_GPU then T.skip("a GPU is present") end
  local m = bert.BertModel(CFG, { seed = 1 })
  T.raises(function() m:to("cuda:0") end, "cuda:0 requested")
  T.raises(function() bl.zeros({ 2 }, { device = "cuda:0" }) end, "cuda:0 requested")
end)

-- The device/precision plumbing of nn.Module:to runs on the CPU too.
T.test("Module:to on the cpu: f32 is bitwise unchanged, a bf16 compute copy stays close", function()
  local bt = batch(2, 16, 3)
  local a, b = bert.BertForPreTraining(CFG, { seed = 4 }), bert.BertForPreTraining(CFG, { seed = 4 }):to("cpu")
  local la, lb = a:forward(bt).loss, b:forward(bt).loss
  T.eq(lb, la)
  a:backward(); b:backward()
  close(b.flat_grads, a.flat_grads, 0, "gradients after to('cpu')")
  local h = bert.BertForPreTraining(CFG, { seed = 4 }):to("bf16")
  T.eq(h.flat_compute:dtype(), "bf16")
  T.eq(h.bert.encoder.layer[1].attention.self.query.weight:dtype(), "bf16")
  T.truthy(h.bert.encoder.layer[1].attention.self._qkv ~= nil, "fused QKV view over the bf16 copy")
  a:eval(); h:eval()
  T.near(h:forward(bt).loss, a:forward(bt).loss, 3e-2, 1e-3, "bf16 compute loss")
  h:train(); h:zero_grad(); h:forward(bt); h:backward()
  T.eq(h.flat_grads:dtype(), "f32")
  local gs = h.flat_grads:abs():sum()
  T.truthy(gs == gs and gs > 0 and gs < math.huge, "finite gradients")
  local before = h.flat_compute:to("f32")
  h.flat_params:add_(h.flat_grads * -1e-1)
  h:sync_compute()
  T.truthy(max_abs_diff(h.flat_compute:to("f32"), before) > 0, "sync_compute refreshed the copy")
  h:to("f32")
  T.eq(h.flat_compute, nil)
  T.eq(h.bert.encoder.layer[1].attention.self.query.weight:dtype(), "f32")
end)

T.test("tensor ops on cuda:0 match the cpu", function()
  need_gpu()
  local a = bl.randn({ 5, 7 }, { seed = 3 })
  local da = bl.randn({ 5, 7 }, { seed = 3, device = "cuda:0" })
  T.eq(da:device(), "cuda:0")
  close(da, a, 1e-6, "randn (Philox on both devices)")
  local b = bl.rand({ 7, 3 }, { seed = 4 })
  local db = b:to("cuda:0")
  close(da:matmul(db), a:matmul(b), 1e-5, "matmul")
  close((da * 2 + 1):exp(), (a * 2 + 1):exp(), 1e-6, "elementwise")
  T.near(da:sum(), a:sum(), 1e-5, 1e-6)
  close(da:max(2), a:max(2), 0, "max over dim 2")
  close(da:t():contiguous(), a:t():contiguous(), 0, "strided copy on the device")
  close(da:t():to("cpu"), a:t(), 0, "strided device -> cpu copy")
  local h = bl.zeros({ 7, 5 }, { device = "cuda:0" })
  h:copy_(a:t())
  close(h, a:t():contiguous(), 0, "strided cpu -> device copy")
  da:set(42, 2, 3)
  T.eq(da:get(2, 3), 42)
  local r = bl.arange(5, { dtype = "i64", device = "cuda:0" })
  T.eq(table.concat(r:totable(), ","), "0,1,2,3,4")
end)

T.test("errors: mixed devices name both; ptr() refuses GPU memory", function()
  need_gpu()
  local x = bl.randn({ 4, 8 }, { seed = 1 })
  local w = bl.randn({ 3, 8 }, { seed = 2, device = "cuda:0" })
  local y = bl.empty({ 4, 3 }, { device = "cuda:0" })
  T.raises(function() check(C.bl_linear_forward(y, x, w, nil)) end, "different devices (cuda:0 and cpu)")
  T.raises(function() return x:to("cuda:0") + x end, "different devices")
  T.raises(function() w:ptr() end, "ptr: tensor is on cuda:0")
end)

local function pretrain_pair(seed)
  local cpu = bert.BertForPreTraining(CFG, { seed = seed })
  local gpu = bert.BertForPreTraining(CFG, { seed = seed }):to("cuda:0")
  return cpu, gpu
end

T.test("BertForPreTraining on cuda:0: loss and every gradient match the cpu (dropout on)", function()
  need_gpu()
  local cpu, gpu = pretrain_pair(7)
  T.eq(gpu.flat_params:device(), "cuda:0")
  close(gpu.flat_params, cpu.flat_params, 0, "parameters after to()")
  local bt = batch(3, 24, 4)
  for step = 1, 2 do  -- the second step reuses every buffer
    cpu:zero_grad(); gpu:zero_grad()
    local oc, og = cpu:forward(bt), gpu:forward(bt)
    T.near(og.loss, oc.loss, 1e-4, 1e-6, "loss step " .. step)
    T.near(og.mlm_loss, oc.mlm_loss, 1e-4, 1e-6)
    T.eq(og.mlm_count, oc.mlm_count)
    T.near(og.mlm_accuracy, oc.mlm_accuracy, 0, 1e-9)
    cpu:backward(); gpu:backward()
    close(gpu.flat_grads, cpu.flat_grads, 2e-3, "flat gradients step " .. step)
  end
  -- The attention key bias's exact gradient is 0 (softmax ignores a shift per row): both devices give rounding
  -- noise there, so every tensor is also measured against a millionth of the largest gradient.
  local _, gmax = max_abs_diff(gpu.flat_grads, cpu.flat_grads)
  local cp, gp = cpu:parameters(), gpu:parameters()
  for i = 1, #cp do close(gp[i].grad, cp[i].grad, 5e-3, cp[i].name, 1e-6 * gmax) end
end)

T.test("eval hidden states, QA and classification heads on cuda:0", function()
  need_gpu()
  local bt = batch(2, 16, 3)
  local m, g = bert.BertModel(CFG, { seed = 5 }), bert.BertModel(CFG, { seed = 5 }):to("cuda:0")
  m:eval(); g:eval()
  local oc, og = m:forward(bt), g:forward(bt)
  for i = 1, #oc.hidden_states do close(og.hidden_states[i], oc.hidden_states[i], 1e-4, "hidden state " .. i) end
  close(og.pooler_output, oc.pooler_output, 1e-4, "pooler")
  local qa, qg = bert.BertForQuestionAnswering(CFG, { seed = 6 }), bert.BertForQuestionAnswering(CFG, { seed = 6 })
  qg:to("cuda:0")
  local qb = { input_ids = bt.input_ids, attention_mask = bt.attention_mask, start_positions = { 1, 3 },
    end_positions = { 2, 40 } }
  local rc, rg = qa:forward(qb), qg:forward(qb)
  T.near(rg.loss, rc.loss, 1e-4, 1e-6, "qa loss")
  qa:backward(); qg:backward()
  close(qg.flat_grads, qa.flat_grads, 2e-3, "qa gradients")
  local ca = bert.BertForSequenceClassification(CFG, { seed = 8, num_labels = 3 })
  local cg = bert.BertForSequenceClassification(CFG, { seed = 8, num_labels = 3 }):to("cuda:0")
  local cb = { input_ids = bt.input_ids, attention_mask = bt.attention_mask, labels = { 2, 0 } }
  local c1, c2 = ca:forward(cb), cg:forward(cb)
  T.near(c2.loss, c1.loss, 1e-4, 1e-6, "classification loss")
  ca:backward(); cg:backward()
  close(cg.flat_grads, ca.flat_grads, 2e-3, "classification gradients")
end)

T.test("bf16 compute on cuda:0: close to f32, finite, sync_compute; back to the cpu", function()
  need_gpu()
  local bt = batch(4, 32, 5)
  local ref = bert.BertForPreTraining(CFG, { seed = 9 }):to("cuda:0")
  local m = bert.BertForPreTraining(CFG, { seed = 9 }):to{ device = "cuda:0", dtype = "bf16" }
  T.eq(m.flat_compute:dtype(), "bf16")
  T.eq(m.flat_params:dtype(), "f32")
  ref:eval(); m:eval()
  local lr, lm = ref:forward(bt).loss, m:forward(bt).loss
  T.near(lm, lr, 3e-2, 1e-3, "bf16 loss vs f32")
  m:train()
  m:zero_grad()
  m:forward(bt)
  m:backward()
  local gsum = m.flat_grads:abs():sum()
  T.truthy(gsum == gsum and gsum > 0 and gsum < math.huge, "bf16 gradients are finite and non-zero")
  local before = m.flat_compute:to("f32"):to("cpu")
  m.flat_params:add_(m.flat_grads * -1e-1)
  m:sync_compute()
  local d = max_abs_diff(m.flat_compute:to("f32"), before)
  T.truthy(d > 0, "sync_compute refreshed the bf16 copy")
  local back = m:to{ device = "cpu", dtype = "f32" }
  T.eq(back.flat_params:device(), "cpu")
  T.eq(back.flat_compute, nil)
  local out = back:forward(bt)
  T.truthy(out.loss == out.loss, "cpu forward after the round trip")
end)

T.run()
