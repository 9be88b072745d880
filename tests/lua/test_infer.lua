-- The CPU inference path (bertlua.bert.infer: weights packed once for our own
-- GEMM, bias and GELU in its epilogue) against the ordinary eval forward of the
-- same model (OpenBLAS or BL_GEMM's GEMM, separate bias and bias+GELU ops), on
-- every CPU path this machine has (AVX-512, AVX2, baseline): hidden states and
-- pooler output of a padded batch, with random biases so that a missing bias
-- or GELU shows; the QA head through predict's packing; and the errors
-- (backward after a packed forward, a pack made for another CPU path).
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

local CFG = { vocab_size = 211, hidden_size = 64, num_hidden_layers = 2, num_attention_heads = 4,
  intermediate_size = 256, max_position_embeddings = 64, type_vocab_size = 2 }
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

local PATHS = { "avx512", "avx2", "baseline" }

T.test("packed inference forward = eval forward on every CPU path", function()
  local model = bert.BertModel(CFG, { seed = 3 })
  randomise(model)
  local batch = make_batch()
  local tested = 0
  for _, isa in ipairs(PATHS) do
    if pcall(bl.set_cpu_isa, isa) then
      infer.unpack(model)
      model:eval()
      local h0, p0 = outputs(model, batch)
      local _, n = infer.pack(model)
      T.eq(n, 4 * CFG.num_hidden_layers + 1, isa .. ": weights packed (QKV, 3 dense per layer, pooler)")
      local h1, p1 = outputs(model, batch)
      local dh, dp = max_diff(h1, h0), max_diff(p1, p0)
      print(("%s: max |packed - eval| hidden %.3g, pooler %.3g (tolerance %g)"):format(isa, dh, dp, TOL))
      T.truthy(dh <= TOL and dp <= TOL, ("%s: packed forward differs by %.3g / %.3g"):format(isa, dh, dp))
      T.truthy(h0:abs():max() > 0.5, "outputs are not trivially small")
      tested = tested + 1
    end
  end
  T.truthy(tested >= 1, "no CPU path could be set")
  for _, isa in ipairs(PATHS) do if pcall(bl.set_cpu_isa, isa) then break end end -- back to the best one
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
  bl.set_cpu_isa("avx512")
end)

T.run()
