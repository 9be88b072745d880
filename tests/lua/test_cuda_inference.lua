-- Inference recipes on cuda against the cpu, on a tiny classifier (1 layer,
-- hidden 32) with a vocabulary built from a generated corpus:
--  - predict.lua --task=jsonl: fp32 logits within 1e-5 (f32 kernels, other
--    summation orders), the same labels; bf16 logits within 0.05 of fp32
--    (bf16 keeps 8 bits: relative rounding 2^-9 per operand, a few dozen
--    roundings in series through one layer stay well under 5% of the logit
--    scale ~1); the latency line is printed;
--  - extract_features.lua: fp32 hidden states within 1e-4 absolute.
-- Needs a CUDA device (the emulated one in CI); skipped otherwise.
local T = require "testing"
local cjson = require "cjson"

local setup = require("cuda_recipe_setup")(T, 8)
local exe, sh, tmp, world, n = T.exe(), T.sh, setup.tmp, setup.world, setup.vocab_size
T.tiny_model_dir(tmp .. "/cls", { head = "cls", seed = 4, vocab = tmp .. "/vocab.txt", config = { vocab_size = n } })
local f = io.open(tmp .. "/in.jsonl", "w")
local lines = {}
for i, c in ipairs(world.countries) do
  local s = ("%s is a country and its capital is %s"):format(c.name, c.capital)
  f:write(cjson.encode{ text_a = s, text_b = i % 2 == 0 and "what is the capital?" or nil }, "\n")
  lines[#lines + 1] = s
end
f:close()
T.write_file(tmp .. "/in.txt", table.concat(lines, "\n") .. "\n")

local function run(cmd)
  local o, rc = sh(cmd)
  T.eq(rc, 0, o)
  return o
end
local function rows(path)
  local r = {}
  for l in io.lines(path) do r[#r + 1] = cjson.decode(l) end
  return r
end

T.test("predict.lua on cuda: fp32 = cpu, bf16 close, latency reported", function()
  local function predict(name, extra)
    return run(("%s recipes/predict.lua --model=%s/cls --input=%s/in.jsonl --output=%s/%s.jsonl --batch=4 %s")
      :format(exe, tmp, tmp, tmp, name, extra))
  end
  predict("cpu", "--device=cpu")
  local out = predict("gpu", "--device=cuda")
  T.truthy(out:find("predict: device cuda:0", 1, true) and out:find("p99", 1, true), out)
  predict("bf16", "--device=cuda --precision=bf16")
  local c, g, h = rows(tmp .. "/cpu.jsonl"), rows(tmp .. "/gpu.jsonl"), rows(tmp .. "/bf16.jsonl")
  T.eq(#c, #world.countries)
  T.eq(#g, #c)
  T.eq(#h, #c)
  for i = 1, #c do
    T.eq(g[i].label, c[i].label, "row " .. i)
    for k = 1, #c[i].logits do
      T.near(g[i].logits[k], c[i].logits[k], 1e-5, 1e-5)
      T.near(h[i].logits[k], c[i].logits[k], 0, 0.05)
    end
  end
end)

T.test("extract_features.lua on cuda: the cpu's hidden states", function()
  local function extract(name, extra)
    run(("%s recipes/extract_features.lua --model=%s/cls --input=%s/in.txt --output=%s/%s.features --layers=-1,0 %s")
      :format(exe, tmp, tmp, tmp, name, extra))
    return rows(("%s/%s.features"):format(tmp, name))
  end
  local c, g = extract("cpu", "--device=cpu"), extract("gpu", "--device=cuda")
  T.eq(#c, #lines)
  T.eq(#g, #c)
  local worst = 0
  for i = 1, #c do
    for t, tok in ipairs(c[i].features) do
      for l, layer in ipairs(tok.layers) do
        local other = g[i].features[t].layers[l].values
        for k, v in ipairs(layer.values) do worst = math.max(worst, math.abs(v - other[k])) end
      end
    end
  end
  T.truthy(worst <= 1e-4, ("largest hidden-state difference %g"):format(worst))
end)

T.run()
