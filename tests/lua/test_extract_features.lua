-- recipes/extract_features.lua end to end on a tiny model directory: the
-- output is laid out as BERT's extract_features.py writes it (linex_index,
-- features, token, layers, index, values), tokens as BERT's tokenizer makes
-- them for "text_a ||| text_b" pairs, truncation to --max-seq-length, values
-- with 9 significant digits equal to the model's hidden states computed
-- directly (and to transformers' BertModel output_hidden_states when
-- transformers is importable), the same values at any --batch; bad input
-- gives one clear line.
local T = require "testing"
local bl = require "bertlua"
local pretrained = require "bertlua.pretrained"
local cjson = require "cjson"

local exe = T.exe()
local PY = os.getenv("BL_PYTHON") or "/usr/bin/python3"
local tmp = T.tmpdir()
local sh, write, read_lines = T.sh, T.write_file, T.read_lines

-- a tiny vocabulary and a 4-layer model with a pre-training head (ignored by the recipe)
local words = { "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "a", "dog", "##s",
  ".", "big", "red", "ran", "away", "and", "jump", "##ed", "over", "fence", "," }
write(tmp .. "/vocab.txt", table.concat(words, "\n") .. "\n")
local CFG = T.tiny_model_dir(tmp .. "/m", { head = "pretraining", seed = 17, vocab = tmp .. "/vocab.txt",
  config = { vocab_size = #words, hidden_size = 24, num_hidden_layers = 4, intermediate_size = 40 } })

local INPUT = table.concat({
  "The cat sat on the mat.",
  "the dogs ||| a cat",
  "  The big red dog jumped over the fence, and ran away.  ",
  "",
  "dogs ||| cats ||| mat",
}, "\n") .. "\n"
write(tmp .. "/in.txt", INPUT)
-- what BERT's tokenizer makes of each line (uncased), [CLS]/[SEP] and segments included
local WANT = {
  { "[CLS] the cat sat on the mat . [SEP]", "000000000" },
  { "[CLS] the dog ##s [SEP] a cat [SEP]", "00000111" },
  { "[CLS] the big red dog jump ##ed over the fence , and ran away . [SEP]", "0000000000000000" },
  { "[CLS] [SEP]", "00" },
  -- split at the last " ||| ", as the original's greedy regex; '|' is punctuation, not in the vocabulary
  { "[CLS] dog ##s [UNK] [UNK] [UNK] cat ##s [SEP] mat [SEP]", "00000000011" },
}

local function extract(out, extra)
  return sh(("%s recipes/extract_features.lua --model=%s/m --input=%s/in.txt --output=%s %s")
    :format(exe, tmp, tmp, out, extra or ""))
end

-- the model's hidden states for one example, computed directly (no padding)
local model = pretrained.from_pretrained(tmp .. "/m", { head = "model", quiet = true })
model:eval()
local tok = require("bertlua.data.tokenizer").load(tmp .. "/vocab.txt", { lower = true })
local function direct(tokens, types)
  local ids = tok:convert_tokens_to_ids(tokens)
  local ty = {}
  for i = 1, #types do ty[i] = tonumber(types:sub(i, i)) end
  local out = model:forward{ input_ids = bl.from({ ids }, { dtype = "i32" }), token_type_ids = bl.from({ ty },
    { dtype = "i32" }) }
  local hs = {}
  for k, h in ipairs(out.hidden_states) do hs[k - 1] = h:contiguous():totable() end  -- hs[0] = embeddings
  return hs, ids, ty
end

local results = {}

-- Tolerance from an error analysis, not from one CPU's result (an AVX2-only machine or another OpenBLAS kernel,
-- OPENBLAS_CORETYPE=Haswell, sums in another order). Both sides compute in f32 (u = 2^-24) but with other shapes
-- (padded batches vs one example, or another library), so every dot product of length K may be summed in another
-- order: each result then differs by at most gamma_K = K u / (1 - K u) times sum |a_i b_i|. LayerNorm keeps the
-- activations and those sums O(max |h|), so each rounding-bearing step on the path to hidden state l (embedding sum
-- + LayerNorm; per layer: Q/K/V, scores, softmax, context, output projection, residual + LayerNorm, FFN in, GELU,
-- FFN out, residual + LayerNorm) adds at most gamma_Kmax * max |h|, and to first order these add up:
--   |got - ref| <= STEPS(l) * gamma_Kmax * max |h|,  STEPS(l) = 2 + 11 l,  Kmax = max(hidden, intermediate, S).
-- The 9 printed digits add 5e-9 relative. A wrong layer, token or weight is off by O(max |h|), far above this.
local U = 2 ^ -24
local function bound(layer, scale, kmax)
  local g = kmax * U / (1 - kmax * U)
  return (2 + 11 * layer) * g * scale + 5e-9 * scale
end
local function max_abs(t)
  local m = 0
  for _, v in ipairs(t) do m = math.max(m, math.abs(v)) end
  return m
end
-- every |got - ref| within the bound of its layer, else an error naming the value
local function check_close(got, ref, layer, kmax, what)
  local tol = bound(layer, max_abs(ref), kmax)
  for d = 1, #ref do
    local e = math.abs(got[d] - ref[d])
    if not (e <= tol) then
      error(("%s: value %d differs by %.3g, more than the f32 error bound %.3g (layer %d)"):format(what, d, e, tol,
        layer), 2)
    end
  end
end

T.test("layout of BERT's extract_features.py, tokens, 9 digits, values = hidden states", function()
  local out, rc = extract(tmp .. "/out.jsonl", "--layers=-1,-2,-3,-4 --batch=2")
  T.eq(rc, 0, out)
  local lines = read_lines(tmp .. "/out.jsonl")
  T.eq(#lines, #WANT)
  local H = CFG.hidden_size
  for i, line in ipairs(lines) do
    -- the original's json.dumps(OrderedDict) layout: keys in this order, ", " and ": " separators
    local head = ('{"linex_index": %d, "features": [{"token": "[CLS]", ' ..
      '"layers": [{"index": -1, "values": ['):format(i - 1)
    T.eq(line:sub(1, #head), head)
    T.truthy(line:sub(#head + 1):match("^%-?%d"), line:sub(1, #head + 20))
    T.eq(line:sub(-4), "]}]}")
    local j = cjson.decode(line)
    local keys = {}
    for k in pairs(j) do keys[#keys + 1] = k end
    table.sort(keys)
    T.eq(table.concat(keys, ","), "features,linex_index")
    T.eq(j.linex_index, i - 1)
    local toks = {}
    for t, f in ipairs(j.features) do
      toks[t] = f.token
      local fk = {}
      for k in pairs(f) do fk[#fk + 1] = k end
      table.sort(fk)
      T.eq(table.concat(fk, ","), "layers,token")
      T.eq(#f.layers, 4)
      for k, l in ipairs(f.layers) do
        T.eq(l.index, -k)
        T.eq(#l.values, H)
      end
    end
    T.eq(table.concat(toks, " "), WANT[i][1])
    -- every value printed with 9 significant digits (%.9g, enough to give back the
    -- f32 exactly): "-0.123456789", "1.23456789e-05"; %g drops trailing zeros
    local n, nine = 0, 0
    for num in line:gmatch('"values": %[([^%]]*)%]') do
      for v in num:gmatch("[^, ]+") do
        n = n + 1
        T.eq(("%.9g"):format(tonumber(v)), v)
        local mant = v:gsub("[eE].*$", ""):gsub("[-.]", ""):gsub("^0+", "")
        if #mant == 9 then nine = nine + 1 end
      end
    end
    T.eq(n, #j.features * 4 * H)
    T.truthy(nine > n * 0.75, ("only %d of %d values have 9 digits"):format(nine, n))
    -- the values are the model's hidden states: layer -k = hidden_states[L + 1 - k]
    local hs = direct(toks, WANT[i][2])
    local kmax = math.max(H, CFG.intermediate_size, #toks)
    for t, f in ipairs(j.features) do
      for k, l in ipairs(f.layers) do
        local layer = CFG.num_hidden_layers + 1 - k
        check_close(l.values, { unpack(hs[layer], (t - 1) * H + 1, t * H) }, layer, kmax,
          ("line %d token %d layer %d vs the hidden states"):format(i, t, -k))
      end
    end
    results[i] = j
  end
  -- the bound is tight enough to see a wrong layer
  local hs = direct({ "[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]" }, "000000000")
  local last = cjson.decode(lines[1]).features[2].layers[1].values
  T.raises(function() check_close(last, { unpack(hs[CFG.num_hidden_layers - 1], H + 1, 2 * H) },
    CFG.num_hidden_layers, 40, "wrong layer") end, "more than the f32 error bound")
end)

T.test("--batch does not change the values; --layers picks layers in the order given", function()
  local out, rc = extract(tmp .. "/b1.jsonl", "--layers=-1,-2,-3,-4 --batch=1")
  T.eq(rc, 0, out)
  local out5, rc5 = extract(tmp .. "/b5.jsonl", "--layers=-1,-2,-3,-4 --batch=5")
  T.eq(rc5, 0, out5)
  local one, five = read_lines(tmp .. "/b1.jsonl"), read_lines(tmp .. "/b5.jsonl")
  T.eq(#one, #WANT); T.eq(#five, #WANT)
  for i = 1, #WANT do
    local a, b = cjson.decode(one[i]), cjson.decode(five[i])
    local kmax = math.max(CFG.hidden_size, CFG.intermediate_size, 32)
    for t = 1, #a.features do
      for k = 1, 4 do
        check_close(b.features[t].layers[k].values, a.features[t].layers[k].values, CFG.num_hidden_layers + 1 - k,
          kmax, ("line %d token %d layer %d, --batch=5 vs 1"):format(i, t, -k))
      end
    end
  end
  out, rc = extract(tmp .. "/l.jsonl", "--layers=0,-4,2 --batch=3")
  T.eq(rc, 0, out)
  local j = cjson.decode(read_lines(tmp .. "/l.jsonl")[2])
  local hs = direct({ "[CLS]", "the", "dog", "##s", "[SEP]", "a", "cat", "[SEP]" }, "00000111")
  local H = CFG.hidden_size
  local idx = {}
  for k, l in ipairs(j.features[3].layers) do idx[k] = l.index end
  T.eq(table.concat(idx, ","), "0,-4,2")
  -- 0 = embeddings, -4 = first encoder layer of 4, 2 = second encoder layer
  for k, h in ipairs({ 0, 1, 2 }) do
    check_close(j.features[3].layers[k].values, { unpack(hs[h], 2 * H + 1, 3 * H) }, h,
      math.max(H, CFG.intermediate_size, 16), "layer " .. idx[k])
  end
end)

T.test("--max-seq-length truncates like the original (longest of a/b first)", function()
  local out, rc = extract(tmp .. "/t.jsonl", "--layers=-1 --max-seq-length=8")
  T.eq(rc, 0, out)
  local lines = read_lines(tmp .. "/t.jsonl")
  local function toks(l)
    local r = {}
    for t, f in ipairs(cjson.decode(l).features) do r[t] = f.token end
    return table.concat(r, " ")
  end
  T.eq(toks(lines[1]), "[CLS] the cat sat on the mat [SEP]")
  T.eq(toks(lines[2]), "[CLS] the dog ##s [SEP] a cat [SEP]")   -- exactly 8: untouched
  T.eq(toks(lines[5]), "[CLS] dog ##s [UNK] [UNK] [SEP] mat [SEP]")
end)

T.test("values equal transformers' BertModel output_hidden_states", function()
  if select(2, sh(PY .. " -c 'import transformers, torch'")) ~= 0 then
    T.skip("transformers not importable by " .. PY
      .. " (pip install --break-system-packages 'transformers<4.40' safetensors)")
  end
  if not results[3] then T.skip("needs the output of the layout test") end
  local ex = {}
  for i = 1, #WANT do
    local toks = {}
    for w in WANT[i][1]:gmatch("%S+") do toks[#toks + 1] = w end
    local ty = {}
    for c = 1, #WANT[i][2] do ty[c] = tonumber(WANT[i][2]:sub(c, c)) end
    ex[i] = { ids = tok:convert_tokens_to_ids(toks), types = ty }
  end
  write(tmp .. "/ex.json", cjson.encode(ex))
  write(tmp .. "/hf.py", [=[
import json, sys, torch
from transformers import BertModel
m = BertModel.from_pretrained(sys.argv[1]).eval()
out = []
with torch.no_grad():
    for e in json.load(open(sys.argv[2])):
        r = m(input_ids=torch.tensor([e["ids"]]), token_type_ids=torch.tensor([e["types"]]), output_hidden_states=True)
        out.append([h[0].tolist() for h in r.hidden_states])
json.dump(out, open(sys.argv[3], "w"))
]=])
  local out, rc = sh(("%s %s/hf.py %s/m %s/ex.json %s/hf.json"):format(PY, tmp, tmp, tmp, tmp))
  T.eq(rc, 0, out)
  local f = io.open(tmp .. "/hf.json"); local hf = cjson.decode(f:read("*a")); f:close()
  local L = CFG.num_hidden_layers
  for i, j in ipairs(results) do
    local kmax = math.max(CFG.hidden_size, CFG.intermediate_size, #j.features)
    for t, feat in ipairs(j.features) do
      for k, l in ipairs(feat.layers) do
        -- hidden_states[L + 1 - k], 1-based; torch's erf GELU and exp may differ by a few ulp too: covered by the
        -- per-step term of the bound
        check_close(l.values, hf[i][L + 2 - k][t], L + 1 - k, kmax,
          ("line %d token %d layer %d vs transformers"):format(i, t, -k))
      end
    end
  end
end)

T.test("bad input: a clear message, exit 1, no output file", function()
  local base = ("%s recipes/extract_features.lua --output=%s/bad.jsonl"):format(exe, tmp)
  local function fails(args, want)
    local out, rc = sh(base .. " " .. args)
    T.eq(rc, 1, out)
    T.truthy(out:find(want, 1, true), "expected '" .. want .. "' in:\n" .. out)
    T.truthy(not io.open(tmp .. "/bad.jsonl"), "no output written")
  end
  fails(("--model=%s/nope --input=%s/in.txt"):format(tmp, tmp),
    "extract_features: model directory " .. tmp .. "/nope does not exist")
  os.execute("mkdir -p " .. tmp .. "/notmodel")
  fails(("--model=%s/notmodel --input=%s/in.txt"):format(tmp, tmp), "is not a model directory: no config.json")
  write(tmp .. "/empty.txt", "")
  fails(("--model=%s/m --input=%s/empty.txt"):format(tmp, tmp), "extract_features: " .. tmp .. "/empty.txt is empty")
  write(tmp .. "/blank.txt", "\n  \n")
  fails(("--model=%s/m --input=%s/blank.txt"):format(tmp, tmp), "blank.txt is empty")
  fails(("--model=%s/m --input=%s/missing.txt"):format(tmp, tmp), "--input=" .. tmp .. "/missing.txt cannot be read")
  fails(("--model=%s/m --input=%s/in.txt --layers=-5"):format(tmp, tmp),
    "--layers: -5 is out of range for a 4-layer model")
  fails(("--model=%s/m --input=%s/in.txt --layers=5"):format(tmp, tmp), "--layers: 5 is out of range")
  fails(("--model=%s/m --input=%s/in.txt --layers=-1,x"):format(tmp, tmp), "--layers: 'x' is not an integer")
  fails(("--model=%s/m --input=%s/in.txt --batch=0"):format(tmp, tmp), "option --batch=0: must be >= 1")
  fails(("--model=%s/m --input=%s/in.txt --max-seq-length=2"):format(tmp, tmp),
    "option --max-seq-length=2: must be >= 3")
  fails(("--model=%s/m --input=%s/in.txt --max-seq-length=129"):format(tmp, tmp),
    "longer than the model's 128 positions")
  fails(("--input=%s/in.txt"):format(tmp), "--model, --input and --output are required")
end)

T.run()
