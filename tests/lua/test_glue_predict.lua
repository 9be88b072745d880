-- recipes/glue.lua (classification and STS-B regression) and recipes/predict.lua, on data made at test time.
local T = require "testing"
local cjson = require "cjson"

local exe = T.exe()
local tmp = T.tmpdir("sst", "stsb")
-- made here (tests/lua/lib/fixtures.lua): a vocabulary and an SST-2 dev.tsv of 872 rows in the original format
local fx = require "fixtures"
local vocab = fx.vocab(tmp)
local sst = fx.glue(tmp, "sst2")
local sh = T.sh
T.tiny_model_dir(tmp .. "/cls", { seed = 1, num_labels = 2, vocab = vocab })

-- SST-2: train on the first 400 dev rows, evaluate on the rest; one malformed row
local lines = {}
for l in io.lines(sst) do lines[#lines + 1] = l end
local f = io.open(tmp .. "/sst/train.tsv", "w")
f:write(table.concat(lines, "\n", 1, 401), "\nthis row has no label column\n"); f:close()
f = io.open(tmp .. "/sst/dev.tsv", "w"); f:write(lines[1], "\n", table.concat(lines, "\n", 402, #lines),
  "\n"); f:close()

local function log_losses(path)
  local r = {}
  for l in io.lines(path) do local x = cjson.decode(l); if x.loss then r[#r + 1] = x.loss end end
  return r
end

T.test("SST-2: loss falls, metrics and predictions are written, bad rows reported", function()
  local out, rc = sh(("%s recipes/glue.lua --task=sst2 --data-dir=%s/sst --model=%s/cls --output=%s/sst/out " ..
    "--do-train --do-eval " ..
    "--batch=16 --lr=5e-3 --epochs=4 --max-seq-length=64 --threads=2"):format(exe, tmp, tmp, tmp))
  T.eq(rc, 0, out)
  T.truthy(out:find("train.tsv:402: ", 1, true) and out:find("1 malformed rows skipped", 1, true), out)
  local l = log_losses(tmp .. "/sst/out/train_log.jsonl")
  local first, last = (l[1] + l[2] + l[3]) / 3, (l[#l] + l[#l - 1] + l[#l - 2]) / 3
  T.truthy(last < first - 0.05, ("loss %.3f -> %.3f"):format(first, last))
  local res = cjson.decode(io.open(tmp .. "/sst/out/eval_results.json"):read("*a"))
  T.truthy(res.acc >= 0 and res.acc <= 1, out)
  local n = 0
  for _ in io.lines(tmp .. "/sst/out/dev_predictions_sst2.tsv") do n = n + 1 end
  T.eq(n, #lines - 401 + 1)
  -- the official-format scorer agrees with the recipe's accuracy
  local ev, rc2 = sh(("%s recipes/glue_eval.lua --task=sst-2 --data=%s/sst/dev.tsv " ..
    "--predictions=%s/sst/out/dev_predictions_sst2.tsv")
    :format(exe, tmp, tmp))
  T.eq(rc2, 0, ev)
  T.truthy(ev:find(tostring(res.acc):sub(1, 6), 1, true), ev .. " vs " .. res.acc)
end)

T.test("STS-B regression learns a score", function()
  T.tiny_model_dir(tmp .. "/reg", { seed = 1, num_labels = 1, vocab = vocab })
  local header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
  local words = { "cat", "dog", "bird", "fish", "horse", "mouse" }
  local rows = { header }
  for i = 1, 160 do
    local a, b = words[(i % 6) + 1], words[(i * 5 % 6) + 1]
    rows[#rows + 1] = ("%d\tmain\tx\t2012\t%d\ts\ts\tthe %s runs\tthe %s runs\t%.1f"):format(i, i, a, b,
      a == b and 5.0 or 1.0)
  end
  local g = io.open(tmp .. "/stsb/train.tsv", "w"); g:write(table.concat(rows, "\n")); g:close()
  g = io.open(tmp .. "/stsb/dev.tsv", "w"); g:write(table.concat(rows, "\n", 1, 61)); g:close()
  local out, rc = sh(("%s recipes/glue.lua --task=stsb --data-dir=%s/stsb --model=%s/reg --output=%s/stsb/out " ..
    "--do-train --do-eval " ..
    "--batch=16 --lr=5e-3 --epochs=6 --max-seq-length=32 --threads=2"):format(exe, tmp, tmp, tmp))
  T.eq(rc, 0, out)
  local res = cjson.decode(io.open(tmp .. "/stsb/out/eval_results.json"):read("*a"))
  T.truthy(res.pearson > 0.5, "pearson " .. tostring(res.pearson))
end)

T.test("predict.lua: outputs, throughput, latency percentiles, bad lines", function()
  local g = io.open(tmp .. "/in.jsonl", "w")
  g:write('{"text_a": "a charming film"}\n{"text": "dull", "text_b": "x"}\n[1,2]\n{"text_b": "only b"}\n'); g:close()
  local out, rc = sh(("%s recipes/predict.lua --model=%s/sst/out/model --input=%s/in.jsonl --output=%s/out.jsonl " ..
    "--batch=1")
    :format(exe, tmp, tmp, tmp))
  T.eq(rc, 0, out)
  T.truthy(out:find("in.jsonl:3:", 1, true) and out:find("in.jsonl:4:", 1, true), out)
  T.truthy(out:find("sequences/s", 1, true) and out:find("p99", 1, true), out)
  local n = 0
  for l in io.lines(tmp .. "/out.jsonl") do
    local r = cjson.decode(l); n = n + 1
    T.truthy(r.label == 0 or r.label == 1, l)
  end
  T.eq(n, 2)
  out, rc = sh(("%s recipes/predict.lua --model=%s/nope --input=%s/in.jsonl"):format(exe, tmp, tmp))
  T.eq(rc, 1); T.truthy(out:find("nope", 1, true), out)
end)

T.run()
