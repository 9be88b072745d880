-- The CPU inference path (bertlua.bert.infer: weights packed once for our own
-- GEMM, bias and GELU in its epilogue) against the ordinary eval forward of the
-- same model (OpenBLAS or BL_GEMM's GEMM, separate bias and bias+GELU ops), on
-- every CPU path this machine has (AVX-512, AVX2, baseline): hidden states and
-- pooler output of a padded batch, with random biases so that a missing bias
-- or GELU shows; the QA head through predict's packing; and the errors
-- (backward after a packed forward, a pack made for another CPU path).
-- Unpadded inference (the default of pack: real tokens only, attention per
-- row) against the padded forward: equal at the real positions within the
-- same tolerance (masked keys have probability exactly 0 in the padded
-- softmax, so only the order of sums differs), zeros at padded positions.
--
-- Tolerance: the two forwards do the same f32 math but sum the GEMMs in other
-- orders. Per product entry the difference is at most 2 gamma_K sum_p |x_p w_p|
-- (Higham 3.1, gamma_K = K u, u = 2^-24); rounding errors of opposite sign
-- cancel like a random walk, so in practice it is about 2 sqrt(K) u times the
-- sum's magnitude. Here K <= 256 and sum |x w| <= 4 (|x| ~ 1 after LayerNorm,
-- |w| ~ 0.05 over <= 256 terms): ~4e-6 per product, LayerNorm keeps the
-- output scale at 1, and 2 layers of 4 GEMMs add up 8 such terms (~3e-5). We
-- check |diff| <= 2e-4 (the per-entry worst case 2 gamma_K * 4 = 1.2e-4 per GEMM,
-- with margin). A missing bias or GELU changes outputs by ~0.1 or more.
local T = require "testing"
local bl = require "bertlua"
local bert = require "bertlua.bert"
local infer = require "bertlua.bert.infer"

local CFG = require("fixtures").tiny_config()
local B, S = 3, 37
local TOL = 2e-4

local function make_batch()
  local u = bl.rand({ B, S }, { seed = 7, offset = 0 }):totable()
  local ids, mask, types = {}, {}, {}
  local lens = { S, 30, 11 }
  for b = 1, B do
    ids[b], mask[b], types[b] = {}, {}, {}
    for s = 1, S do
      local real = s <= lens[b]
      ids[b][s] = real and math.floor(u[(b - 1) * S + s] * CFG.vocab_size) or 0
      mask[b][s] = real and 1 or 0
      types[b][s] = s > lens[b] / 2 and 1 or 0
    end
  end
  return { input_ids = bl.from(ids, { dtype = "i32" }), attention_mask = bl.from(mask),
    token_type_ids = bl.from(types, { dtype = "i32" }) }
end

-- random biases and LayerNorm parameters (flatten leaves them 0 / 1), larger weights than BERT's init
local function randomise(model)
  for i, p in ipairs(model:parameters()) do
    if p.name:match("bias$") then p.param:normal_(11, 1000 * i, 0, 0.5)
    elseif p.name:match("LayerNorm%.weight$") then p.param:normal_(12, 1000 * i, 1, 0.2)
    else p.param:mul_(2.5) end
  end
end

local function outputs(model, batch)
  local out = model:forward(batch)
  return out.last_hidden_state:clone(), out.pooler_output:clone()
end

local function max_diff(a, b) return (a - b):abs():max() end

T.test("packed inference forward = eval forward on every CPU path", function()
  local model = bert.BertModel(CFG, { seed = 3 })
  randomise(model)
  local batch = make_batch()
  T.each_cpu_path(function(isa)
    infer.unpack(model)
    model:eval()
    local h0, p0 = outputs(model, batch)
    local _, n = infer.pack(model, { unpad = false })
    T.eq(n, 4 * CFG.num_hidden_layers + 1, isa .. ": weights packed (QKV, 3 dense per layer, pooler)")
    local h1, p1 = outputs(model, batch)
    local dh, dp = max_diff(h1, h0), max_diff(p1, p0)
    print(("%s: max |packed - eval| hidden %.3g, pooler %.3g (tolerance %g)"):format(isa, dh, dp, TOL))
    T.truthy(dh <= TOL and dp <= TOL, ("%s: packed forward differs by %.3g / %.3g"):format(isa, dh, dp))
    T.truthy(h0:abs():max() > 0.5, "outputs are not trivially small")
  end)
end)

-- a batch of rows with these real tokens (1 = real) as a mask, ids and types random
local function batch_of(rows)
  local u = bl.rand({ #rows, S }, { seed = 9, offset = 0 }):totable()
  local ids, mask, types = {}, {}, {}
  for b, r in ipairs(rows) do
    ids[b], mask[b], types[b] = {}, {}, {}
    for s = 1, S do
      ids[b][s] = math.floor(u[(b - 1) * S + s] * CFG.vocab_size)
      mask[b][s] = r(s) and 1 or 0
      types[b][s] = s > S / 2 and 1 or 0
    end
  end
  return { input_ids = bl.from(ids, { dtype = "i32" }), attention_mask = bl.from(mask),
    token_type_ids = bl.from(types, { dtype = "i32" }) }, mask
end
local function first(n) return function(s) return s <= n end end

-- every hidden state and the pooler: within TOL of the padded forward at real positions, zero at padded ones
local function check_unpadded(model, batch, mask, what)
  infer.pack(model, { unpad = false })
  local ref = model:forward(batch)
  local hs0, p0 = {}, ref.pooler_output:totable()
  for i, h in ipairs(ref.hidden_states) do hs0[i] = h:totable() end
  infer.pack(model)
  local out = model:forward(batch)
  local H, worst, nonzero = CFG.hidden_size, 0, 0
  T.eq(#out.hidden_states, #hs0, what .. ": hidden states")
  for i, h in ipairs(out.hidden_states) do
    local t = h:totable()
    for b = 1, #mask do
      for s = 1, S do
        for c = 1, H do
          local j = ((b - 1) * S + s - 1) * H + c
          if mask[b][s] == 1 then worst = math.max(worst, math.abs(t[j] - hs0[i][j]))
          elseif t[j] ~= 0 then nonzero = nonzero + 1 end
        end
      end
    end
  end
  local p1 = out.pooler_output:totable()
  local pb = model.pooler.dense.bias:totable()
  for b = 1, #mask do
    for c = 1, H do
      local j = (b - 1) * H + c
      if mask[b][1] == 1 then worst = math.max(worst, math.abs(p1[j] - p0[j]))
      else  -- the [CLS] position is padding: zero hidden state, so tanh(bias)
        worst = math.max(worst, math.abs(p1[j] - math.tanh(pb[c])))
      end
    end
  end
  print(("%s: max |unpadded - padded| at real positions %.3g (tolerance %g)"):format(what, worst, TOL))
  T.truthy(worst <= TOL, ("%s: unpadded forward differs by %.3g"):format(what, worst))
  T.eq(nonzero, 0, what .. ": nonzero hidden values at padded positions")
  return out
end

T.test("unpadded inference = padded forward at real positions, zeros at padded ones, every CPU path", function()
  local model = bert.BertModel(CFG, { seed = 6 })
  randomise(model)
  local holes = function(s) return s % 3 ~= 2 and s <= 33 end  -- not a prefix: real tokens after padded ones
  local rows = { first(S), first(30), first(11), first(0), first(1), holes, first(36) }
  T.each_cpu_path(function(isa)
    local batch, mask = batch_of(rows)
    check_unpadded(model, batch, mask, isa .. " B=7 (a full row, odd lengths, an empty row, holes)")
    batch, mask = batch_of({ first(29) })
    check_unpadded(model, batch, mask, isa .. " B=1")
  end)
end)

T.test("unpadded inference: every row padding, no padding, bad offsets", function()
  local model = bert.BertModel(CFG, { seed = 7 })
  randomise(model)
  local batch, mask = batch_of({ first(0), first(0) })
  local out = check_unpadded(model, batch, mask, "every row padding")
  T.eq(out.last_hidden_state:abs():max(), 0, "all hidden states zero")
  -- without padding the ordinary forward runs: bitwise the padded path
  batch = batch_of({ first(S), first(S) })
  infer.pack(model, { unpad = false })
  local h0 = model:forward(batch).last_hidden_state:clone()
  infer.pack(model)
  T.eq(max_diff(model:forward(batch).last_hidden_state, h0), 0, "no padding: the same forward")
  -- the packed attention op refuses bad offsets with a message naming them
  local ops = require "bertlua.nn.ops"
  local q = bl.randn({ 1, 5, 8 }, { seed = 1 })
  T.raises(function() ops.attention_packed(q, q, q, bl.from({ 0, 3, 4 }, { dtype = "i32" }), 2) end,
    "offsets must rise from 0 to the 5 packed tokens")
  T.raises(function() ops.attention_packed(q, q, q, bl.from({ 0, 4, 2, 5 }, { dtype = "i32" }), 2) end, "entry 2")
  T.raises(function() ops.attention_packed(q, q, q, bl.from({ 0, 5 }, { dtype = "f32" }), 2) end, "offsets")
end)

T.test("a pack is a snapshot: train mode ignores it, backward after a packed forward is refused", function()
  local model = bert.BertModel(CFG, { seed = 4 })
  randomise(model)
  local batch = make_batch()
  infer.pack(model)
  local h1 = outputs(model, batch)
  T.raises(function() model:backward(model.encoder.hidden_states[3]:clone()) end, "infer.unpack")
  -- weights changed after packing: the eval forward still uses the stale pack, train mode does not
  model.flat_params:mul_(1.01)
  model:train()
  for _, l in ipairs(model.encoder.layer) do l.attention.self.p = 0; l.attention.output.p = 0; l.output.p = 0 end
  model.embeddings.dropout.p = 0
  local ht = outputs(model, batch)
  infer.unpack(model)
  model:eval()
  local he = outputs(model, batch)
  T.truthy(max_diff(ht, he) <= TOL, "train mode (dropout 0) must not use the packs")
  T.truthy(max_diff(h1, he) > 1e-3, "the weights' change shows")
end)

T.test("a pack made for another CPU path is refused", function()
  if not pcall(bl.set_cpu_isa, "avx512") or not pcall(bl.set_cpu_isa, "avx2") then
    T.skip("needs both the AVX-512 and the AVX2 path")
  end
  bl.set_cpu_isa("avx512")
  local model = bert.BertModel(CFG, { seed = 5 })
  infer.pack(model)
  bl.set_cpu_isa("avx2")
  T.raises(function() model:forward(make_batch()) end, "pack it again")
  T.best_cpu_path()
end)

T.run()
