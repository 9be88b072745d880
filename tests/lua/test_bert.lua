-- Whole-model tests of bertlua.bert: parity with an independent PyTorch BERT
-- (tools/peers/bert_reference.py, float64) on hidden states, losses, logits and
-- EVERY parameter gradient for the pre-training, QA and classification heads;
-- bitwise determinism from the seed; dropout reproducibility; a few SGD
-- steps that lower the MLM loss; and a model edited in Lua (activation
-- swapped, layer inserted) that still trains.
local T = require "testing"
local bl = require "bertlua"
local bert = require "bertlua.bert"
local pretrained = require "bertlua.pretrained"
local nn = require "bertlua.nn"
local config = require "bertlua.bert.config"
local st = require "bertlua.io.safetensors"

local PY = os.getenv("BL_PYTHON") or "/usr/bin/python3"

local tmpdir = T.tmpdir

-- run a shell command: exit code, output (T.sh's, with its last line "rc=N")
local function run(cmd)
  local out, rc = T.sh(cmd)
  return rc, out
end

local have_torch
local function need_torch()
  if have_torch == nil then
    have_torch = run(PY .. " -c 'import torch, numpy'") == 0
  end
  if not have_torch then T.skip("torch/numpy not importable by " .. PY .. " (set BL_PYTHON)") end
end

local CFG = { vocab_size = 101, hidden_size = 48, num_hidden_layers = 2, num_attention_heads = 4,
  intermediate_size = 80, max_position_embeddings = 40, type_vocab_size = 2 }

-- a padded batch: B=3, S=12, lengths 12, 9, 5; P=4 masked slots (some padding, label -1)
local B, S, P = 3, 12, 4
local LENS = { 12, 9, 5 }
local function make_batch(V)
  V = V or CFG.vocab_size
  local u = bl.rand({ B, S }, { seed = 99, offset = 0 }):totable()
  local ids, types, mask = {}, {}, {}
  for b = 1, B do
    ids[b], types[b], mask[b] = {}, {}, {}
    for s = 1, S do
      local real = s <= LENS[b]
      ids[b][s] = real and (1 + math.floor(u[(b - 1) * S + s] * (V - 1))) or 0
      types[b][s] = (real and s > LENS[b] / 2) and 1 or 0
      mask[b][s] = real and 1 or 0
    end
  end
  local pos = { { 1, 4, 7, 10 }, { 2, 3, 8, 0 }, { 1, 0, 0, 0 } }
  local lab = { { 5, 17, 42, 99 }, { 3, 64, 8, -1 }, { 77, -1, -1, -1 } }
  local full = {}
  for b = 1, B do
    full[b] = {}
    for s = 1, S do full[b][s] = -1 end
    for j = 1, P do if lab[b][j] ~= -1 then full[b][pos[b][j] + 1] = lab[b][j] end end
  end
  return {
    input_ids = bl.from(ids, { dtype = "i32" }), token_type_ids = bl.from(types, { dtype = "i32" }),
    attention_mask = bl.from(mask, { dtype = "f32" }),
    masked_lm_positions = bl.from(pos, { dtype = "i32" }), masked_lm_labels = bl.from(lab, { dtype = "i32" }),
    masked_lm_labels_full = bl.from(full, { dtype = "i32" }),
    next_sentence_labels = bl.from({ 0, 1, 1 }, { dtype = "i32" }),
    start_positions = bl.from({ 3, 20, 0 }, { dtype = "i32" }),   -- 20 > S: clamped and ignored
    end_positions = bl.from({ 7, 6, 4 }, { dtype = "i32" }),
  }
end

-- relative error of a against the reference b: max|a-b| / max|b|. A tensor
-- whose true value is ~0 (the key bias gradient is exactly 0: softmax ignores
-- a shift common to all keys; so is the last LayerNorm bias's under the QA
-- head) is measured against `floor` instead (1e-3 of the largest gradient).
local function rel_err(a, b, floor)
  local d = (a:to("f64") - b:to("f64")):abs():max()
  local m = b:to("f64"):abs():max()
  return d / math.max(m, floor or 1e-30), d, m
end
local function check_close(name, a, b, tol, floor)
  T.eq(bl.shape_str(a:shape()), bl.shape_str(b:shape()), name .. " shape")
  local r, d, m = rel_err(a, b, floor)
  if not (r <= tol) then error(("%s: relative error %.3g (max abs diff %.3g, max |ref| %.3g) > %g"):format(name, r, d,
    m, tol), 2) end
  return r
end

-- write model + batch, run the torch reference, return ref tensors
local function reference(model, batch, head, extra_cfg)
  local dir = tmpdir()
  local cfg = {}
  for k, v in pairs(model.cfg) do cfg[k] = v end
  for k, v in pairs(extra_cfg or {}) do cfg[k] = v end
  config.save(cfg, dir .. "/config.json")
  st.save_model(model, dir .. "/model.safetensors")
  local bt = {
    input_ids = batch.input_ids, token_type_ids = batch.token_type_ids, attention_mask = batch.attention_mask,
    masked_lm_labels = batch.masked_lm_labels_full, next_sentence_labels = batch.next_sentence_labels,
    start_positions = batch.start_positions, end_positions = batch.end_positions,
  }
  if batch.labels then bt.labels = batch.labels end
  st.save(dir .. "/batch.safetensors", bt)
  local f = io.open(dir .. "/head.txt", "w"); f:write(head); f:close()
  local rc, out = run(PY .. " tools/peers/bert_reference.py parity '" .. dir .. "'")
  if rc == 77 then T.skip(out) end
  if rc ~= 0 then error("reference failed (rc " .. tostring(rc) .. "):\n" .. out) end
  return (st.load(dir .. "/ref.safetensors"))
end

local TOL = 1e-4

local function compare_grads(model, ref)
  local worst, worst_name, n = 0, "", 0
  local gmax = 0
  for _, p in ipairs(model:parameters()) do
    local g = ref["grad." .. p.name]
    T.truthy(g, "reference has no gradient for " .. p.name)
    gmax = math.max(gmax, g:abs():max())
  end
  for _, p in ipairs(model:parameters()) do
    local g = ref["grad." .. p.name]
    local r = check_close("grad " .. p.name, p.grad, g, TOL, 1e-3 * gmax)
    if r > worst then worst, worst_name = r, p.name end
    n = n + 1
  end
  return worst, worst_name, n
end

T.test("pre-training parity with PyTorch: hidden states, MLM/NSP losses, every gradient", function()
  need_torch()
  local model = bert.BertForPreTraining(CFG, { seed = 11 })
  -- non-trivial LayerNorm and bias values so their gradients are exercised too
  for _, p in ipairs(model:parameters()) do
    if p.name:match("LayerNorm") or p.name:match("bias$") then
      p.param:add_(bl.randn(p.shape, { seed = 5, offset = p.offset }) * 0.1)
    end
  end
  model:eval()
  local batch = make_batch()
  local ref = reference(model, batch, "pretraining")
  model:zero_grad()
  local out = model:forward(batch)
  model:backward()
  for k = 0, CFG.num_hidden_layers do
    check_close("hidden." .. k, out.hidden_states[k + 1], ref["hidden." .. k], TOL)
  end
  T.near(out.mlm_loss, ref.mlm_loss:item(), TOL)
  T.near(out.nsp_loss, ref.nsp_loss:item(), TOL)
  T.near(out.loss, ref.loss:item(), TOL)
  check_close("nsp_logits", out.nsp_logits, ref.nsp_logits, TOL)
  T.eq(out.mlm_count, 8)
  local worst, name, n = compare_grads(model, ref)
  print(("  %d parameter gradients, worst relative error %.2e (%s)"):format(n, worst, name))
  -- HF-style labels [B,S] (-100 = not masked) give the same losses
  local l = batch.masked_lm_labels_full:to("i64")
  local hf = {}
  for i, v in ipairs(l:totable()) do hf[i] = v == -1 and -100 or v end
  local out2 = model:forward{ input_ids = batch.input_ids, token_type_ids = batch.token_type_ids,
    attention_mask = batch.attention_mask, labels = bl.from(hf):view({ B, S }),
      next_sentence_labels = batch.next_sentence_labels }
  T.near(out2.mlm_loss, ref.mlm_loss:item(), TOL)
end)

T.test("question-answering head parity (start/end logits, clamped positions, gradients)", function()
  need_torch()
  local model = bert.BertForQuestionAnswering(CFG, { seed = 12 })
  T.truthy(model.bert.pooler == nil, "QA model has no pooler (as in transformers)")
  model:eval()
  local batch = make_batch()
  local ref = reference(model, batch, "qa")
  model:zero_grad()
  local out = model:forward(batch)
  model:backward()
  check_close("start_logits", out.start_logits, ref.start_logits, TOL)
  check_close("end_logits", out.end_logits, ref.end_logits, TOL)
  T.near(out.loss, ref.loss:item(), TOL)
  compare_grads(model, ref)
end)

T.test("sequence-classification head parity (3 labels CE, and 1 label MSE regression)", function()
  need_torch()
  for _, nl in ipairs({ 3, 1 }) do
    local model = bert.BertForSequenceClassification(CFG, { seed = 13, num_labels = nl })
    model:eval()
    local batch = make_batch()
    batch.labels = nl == 1 and bl.from({ 0.5, 3.25, -1.0 }) or bl.from({ 2, 0, 1 }, { dtype = "i32" })
    local ref = reference(model, batch, "classification", { num_labels = nl })
    model:zero_grad()
    local out = model:forward(batch)
    model:backward()
    check_close("logits", out.logits, ref.logits, TOL)
    T.near(out.loss, ref.loss:item(), TOL)
    compare_grads(model, ref)
  end
end)

local function run_once(seed, train)
  local model = bert.BertForPreTraining(CFG, { seed = seed })
  model:train(train)
  local batch = make_batch()
  model:zero_grad()
  local out = model:forward(batch)
  model:backward()
  -- a second step continues the dropout stream (different masks, still reproducible)
  local out2 = model:forward(batch)
  model:backward()
  return out.loss, out2.loss, model.flat_grads:clone()
end

T.test("determinism: same seed gives bitwise-identical losses and gradients; dropout reproducible", function()
  local l1, l1b, g1 = run_once(7, true)
  local l2, l2b, g2 = run_once(7, true)
  T.eq(l1, l2, "loss of step 1")
  T.eq(l1b, l2b, "loss of step 2")
  T.eq((g1 - g2):abs():max(), 0, "gradients differ between identical runs")
  T.truthy(l1 ~= l1b, "dropout masks should change between steps")
  local l3 = run_once(8, true)
  T.truthy(l3 ~= l1, "another seed should give other weights/masks")
  -- eval mode: no dropout, both steps equal
  local e1, e2 = run_once(7, false)
  T.eq(e1, e2, "eval mode must be deterministic across steps")
  T.truthy(e1 ~= l1, "dropout must change the training loss")
end)

T.test("gradient accumulation: two backward calls give twice the gradient", function()
  local model = bert.BertForPreTraining(CFG, { seed = 3 })
  model:eval()
  local batch = make_batch()
  model:zero_grad()
  model:forward(batch); model:backward()
  local g1 = model.flat_grads:clone()
  model:forward(batch); model:backward()
  T.truthy(model.flat_grads:allclose(g1 * 2, 1e-5, 1e-9), "accumulated gradient is not 2x")
  -- loss scale
  model:zero_grad()
  model:forward(batch); model:backward(4)
  T.truthy(model.flat_grads:allclose(g1 * 4, 1e-5, 1e-9), "loss_scale 4 is not 4x")
end)

local function sgd(model, lr)
  model.flat_params:add_(model.flat_grads * -lr)
end

T.test("a few SGD steps on a fixed batch lower the MLM loss", function()
  local model = bert.BertForPreTraining(CFG, { seed = 21 })
  model:eval()
  local batch = make_batch()
  local first, last
  for step = 1, 12 do
    model:zero_grad()
    local out = model:forward(batch)
    model:backward()
    sgd(model, 0.5)
    first = first or out.mlm_loss
    last = out.mlm_loss
  end
  print(("  MLM loss %.4f -> %.4f"):format(first, last))
  T.truthy(last < 0.5 * first, ("MLM loss did not fall enough: %.4f -> %.4f"):format(first, last))
end)

-- an activation a researcher writes in Lua with tensor ops: x * sigmoid(x)
local Swish = nn.class("TestSwish")
function Swish:forward(x)
  self.s = x:sigmoid()
  self.output = x * self.s
  return self.output
end
function Swish:backward(x, dy)
  -- d/dx x s = s + x s (1 - s)
  return dy * (self.s + x * self.s * (1 - self.s))
end

T.test("a model changed in Lua (Swish activation, an extra layer) still trains", function()
  local model = bert.BertForPreTraining(CFG, { seed = 31 })
  local n0 = model:num_parameters()
  local before = model.bert.encoder.layer[1].attention.self.query.weight:clone()
  for _, layer in ipairs(model.bert.encoder.layer) do layer.intermediate:add("intermediate_act_fn", Swish()) end
  model.bert.encoder:insert(2, nn.BertLayer(model.cfg))
  model:flatten()   -- lay the new layer's parameters out; existing values are kept
  T.truthy(model:num_parameters() > n0, "the new layer adds parameters")
  T.eq((model.bert.encoder.layer[1].attention.self.query.weight - before):abs():max(), 0, "weights kept")
  local names = {}
  for _, p in ipairs(model:parameters()) do names[p.name] = true end
  T.truthy(names["bert.encoder.layer.2.output.LayerNorm.bias"], "three layers named 0..2")
  -- finite-difference check of one new-layer weight (gradient flows through the Lua module)
  model:eval()
  local batch = make_batch()
  model:zero_grad()
  model:forward(batch); model:backward()
  local w = model.bert.encoder.layer[2].intermediate.dense.weight
  local gw = model.bert.encoder.layer[2].intermediate.dense.grad_weight
  local g = gw:get(3, 5)
  local eps = 1e-2
  local w0 = w:get(3, 5)
  w:set(w0 + eps, 3, 5); local lp = model:forward(batch).loss
  w:set(w0 - eps, 3, 5); local lm = model:forward(batch).loss
  w:set(w0, 3, 5)
  local fd = (lp - lm) / (2 * eps)
  T.near(g, fd, 0.05, 2e-4)
  local first, last
  for _ = 1, 12 do
    model:zero_grad()
    local out = model:forward(batch)
    model:backward()
    sgd(model, 0.5)
    first = first or out.mlm_loss
    last = out.mlm_loss
  end
  T.truthy(last < 0.6 * first, ("edited model did not train: %.4f -> %.4f"):format(first, last))
end)

T.test("config validation and presets", function()
  T.raises(function() bert.BertModel({ hidden_size = 50, num_attention_heads = 4, num_hidden_layers = 1 }) end,
    "hidden_size 50 is not divisible by num_attention_heads 4")
  T.raises(function() config.new{ hidden_act = "swish" } end, "unknown hidden_act 'swish'")
  T.raises(function() config.new{ vocab_size = 0 } end, "vocab_size must be an integer from 1 to 16777216, got 0")
  -- absurd sizes are refused before anything is allocated (they ran out of memory or overflowed before)
  T.raises(function() config.new{ num_hidden_layers = 1e9 } end, "num_hidden_layers must be an integer from 1 to 1024")
  T.raises(function() config.new{ hidden_size = 1e300 } end, "hidden_size must be an integer from 1 to 65536")
  T.raises(function() config.new{ hidden_size = math.huge } end, "got inf")
  T.raises(function() config.new{ hidden_size = { 1, 2 } } end,
    "hidden_size must be an integer from 1 to 65536, got a list")
  T.raises(function() config.new{ vocab_size = 2 ^ 24, hidden_size = 65536, num_attention_heads = 1 } end,
    "this machine has")
  local dir = T.tmpdir()
  T.write_file(dir .. "/c.json", "[1, 2]")
  T.raises(function() config.load(dir .. "/c.json") end, "is not a JSON object with the model's fields")
  T.raises(function() config.new{ hidden_dropout_prob = 1.5 } end, "hidden_dropout_prob must be in [0, 1)")
  T.raises(function() config.preset("huge") end, "unknown preset 'huge'")
  local c = config.preset("large")
  T.eq(c.num_hidden_layers, 24); T.eq(c.hidden_size, 1024); T.eq(c.num_attention_heads, 16)
  T.eq(c.intermediate_size, 4096); T.eq(c.vocab_size, 30522); T.eq(c.layer_norm_eps, 1e-12)
  local t = bert.BertModel("tiny", { seed = 1 })
  -- 30522*128 + 512*128 + 2*128 + 2*128 (emb LN)
  --   + 2 * (4*(128*128+128) + 2*2*128 + 2*128*512 + 512 + 128) + 128*128+128
  T.eq(t:num_parameters(), 4385920)
  T.raises(function()
    t:forward{ input_ids = bl.zeros({ 1, 600 }, { dtype = "i32" }) }
  end, "sequence length 600 exceeds max_position_embeddings 512")
  T.raises(function()
    t:forward{ input_ids = bl.zeros({ 2, 5 }, { dtype = "i32" }), attention_mask = bl.ones({ 2, 4 }) }
  end, "attention_mask [2,4] does not match input_ids [2,5]")
  T.raises(function() t:forward{ input_ids = bl.full({ 1, 3 }, 40000, { dtype = "i32" }) } end, "embedding")
end)

T.test("extract_features: pairs, truncation, JSON lines with 9 digits, batch padding invariant", function()
  local toks, types = bert.pair({ "a", "b", "c", "d", "e" }, { "x", "y", "z" }, 8)
  T.eq(table.concat(toks, " "), "[CLS] a b c [SEP] x y [SEP]")
  T.eq(table.concat(types, ""), "00000111")
  toks = bert.pair({ "a", "b", "c", "d" }, nil, 4)
  T.eq(table.concat(toks, " "), "[CLS] a b [SEP]")
  T.eq(table.concat(bert.pair({ "a" }, { "x" }, 3), " "), "[CLS] [SEP] [SEP]")
  -- too short for the special tokens: an error, not an endless truncation loop
  T.raises(function() bert.pair({ "a" }, { "x" }, 2) end, "pair: a length of 2 leaves no room for [CLS] and the [SEP]s")
  T.raises(function() bert.pair({ "a" }, nil, 1) end, "pair: a length of 1 leaves no room")
  local model = bert.BertModel(CFG, { seed = 41 })
  local ex = {}
  for i, n in ipairs({ 3, 9, 5 }) do
    local ids, tk, ty = {}, {}, {}
    for j = 1, n do ids[j] = (i * 7 + j * 3) % CFG.vocab_size; tk[j] = "t" .. ids[j]; ty[j] = j > n / 2 and 1 or 0 end
    ex[i] = { tokens = tk, ids = ids, type_ids = ty }
  end
  local lines = {}
  bert.extract_features(model, ex, { layers = { -1, -2, 0 }, batch = 2 }, function(i, l) lines[i + 1] = l end)
  T.eq(#lines, 3)
  local cjson = require "cjson"
  local j2 = cjson.decode(lines[2])
  T.eq(j2.linex_index, 1)
  T.eq(#j2.features, 9)
  T.eq(j2.features[1].token, ex[2].tokens[1])
  T.eq(j2.features[1].layers[1].index, -1)
  T.eq(#j2.features[1].layers[1].values, CFG.hidden_size)
  T.truthy(lines[2]:match("%-?%d%.%d%d%d%d%d%d%d%d"), "9 significant digits")
  -- the same example alone (no padding) gives the same numbers
  local solo = {}
  bert.extract_features(model, { ex[1] }, { layers = { -1, -2, 0 }, batch = 1 }, function(_, l) solo[1] = l end)
  local a, b = cjson.decode(solo[1]), cjson.decode(lines[1])
  for t = 1, 3 do for k = 1, 3 do T.near(a.features[t].layers[k].values, b.features[t].layers[k].values, 1e-5,
    1e-6) end end
  -- and they are the model's hidden states: last layer of example 2, token 4
  model:eval()
  local ids = bl.from({ ex[2].ids }, { dtype = "i32" })
  local out = model:forward{ input_ids = ids, token_type_ids = bl.from({ ex[2].type_ids }, { dtype = "i32" }) }
  T.near(j2.features[4].layers[1].values[7], out.hidden_states[3]:get(1, 4, 7), 1e-5, 1e-7)
  T.near(j2.features[4].layers[2].values[7], out.hidden_states[2]:get(1, 4, 7), 1e-5, 1e-7)
  T.near(j2.features[4].layers[3].values[7], out.hidden_states[1]:get(1, 4, 7), 1e-5, 1e-7)
  T.raises(function() bert.extract_features(model, ex, { layers = { -3 } }, function() end) end,
    "layer index -3 out of range")
end)

T.test("recipes/extract_features.lua end to end (needs bertlua.data.tokenizer)", function()
  local ok = pcall(require, "bertlua.data.tokenizer")
  if not ok then T.skip("bertlua.data.tokenizer is not available yet") end
  local build = os.getenv("BL_BUILD_DIR")
  if not build then T.skip("BL_BUILD_DIR not set (run through ctest)") end
  local d = tmpdir()
  local words = { "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "a", "dog", "##s",
    "." }
  local f = io.open(d .. "/vocab.txt", "w"); f:write(table.concat(words, "\n") .. "\n"); f:close()
  local c = {}
  for k, v in pairs(CFG) do c[k] = v end
  c.vocab_size = #words
  local model = bert.BertForPreTraining(c, { seed = 3 })
  pretrained.save_pretrained(model, d .. "/m", { vocab = d .. "/vocab.txt" })
  f = io.open(d .. "/in.txt", "w"); f:write("The cat sat on the mat.\nthe dogs ||| a cat\n"); f:close()
  local rc, out = run(("%s/bertlua recipes/extract_features.lua --model=%s/m --input=%s/in.txt " ..
    "--output=%s/out.jsonl --layers=-1,-2 --max-seq-length=16"):format(
    build, d, d, d, d))
  T.eq(rc, 0, out)
  local cjson = require "cjson"
  local lines = {}
  for l in io.lines(d .. "/out.jsonl") do lines[#lines + 1] = cjson.decode(l) end
  T.eq(#lines, 2)
  local tk = {}
  for i, ft in ipairs(lines[2].features) do tk[i] = ft.token end
  T.eq(table.concat(tk, " "), "[CLS] the dog ##s [SEP] a cat [SEP]")
  T.eq(#lines[1].features[1].layers, 2)
end)

T.run()
