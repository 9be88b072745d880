-- recipes/glue.lua beyond SST-2/STS-B (test_glue_predict.lua): sentence pairs
-- (MRPC) with accumulation, metrics that agree with the predictions file, the
-- GLUE submission file for test.tsv; CoLA's headerless files and MCC; MNLI's
-- matched + mismatched dev files; bf16/fp16 training tracks fp32; bad input
-- reported before any work.
local T = require "testing"
local cjson = require "cjson"
local metrics = require "bertlua.tasks.metrics"

local exe = T.exe()
local tmp = T.tmpdir("mrpc", "cola", "mnli")
-- made here (tests/lua/lib/fixtures.lua): a vocabulary and MRPC/CoLA dev files in their original formats
local fx = require "fixtures"
local vocab = fx.vocab(tmp)
local mrpc, cola = fx.glue(tmp, "mrpc"), fx.glue(tmp, "cola")
local sh, read_lines = T.sh, T.read_lines
local function write(path, lines) T.write_file(path, table.concat(lines, "\n") .. "\n") end
local function model(dir, labels) T.tiny_model_dir(dir, { seed = 2, num_labels = labels, vocab = vocab }) end
model(tmp .. "/cls2", 2)
model(tmp .. "/cls3", 3)
local common = "--max-seq-length=64 --threads=2"

T.test("MRPC pairs: accumulation, loss falls, metrics agree with the predictions file, submission file", function()
  local lines = read_lines(mrpc)
  lines[1] = lines[1]:gsub("^\239\187\191", "")
  write(tmp .. "/mrpc/train.tsv", { unpack(lines, 1, 257) })
  local dev = { lines[1], unpack(lines, 258, 357) }
  write(tmp .. "/mrpc/dev.tsv", dev)
  -- test.tsv: index, #1 ID, #2 ID, #1 String, #2 String (no labels)
  local test = { "index\t#1 ID\t#2 ID\t#1 String\t#2 String" }
  for i = 2, 31 do
    local c = { lines[i + 358]:match("^(%d)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t(.*)$") }
    test[#test + 1] = ("%d\t%s\t%s\t%s\t%s"):format(i - 2, c[2], c[3], c[4], c[5])
  end
  write(tmp .. "/mrpc/test.tsv", test)
  local out, rc = sh(("%s recipes/glue.lua --task=mrpc --data-dir=%s/mrpc --model=%s/cls2 --output=%s/mrpc/out " ..
    "--do-train --do-eval --do-predict --batch=16 --micro-batch=8 --lr=3e-3 --epochs=3 %s"):format(exe, tmp, tmp, tmp,
      common))
  T.eq(rc, 0, out)
  T.truthy(out:find("batch 16 = 8 x 2", 1, true), out)
  local steps, summary = {}, nil
  for l in io.lines(tmp .. "/mrpc/out/train_log.jsonl") do
    local x = cjson.decode(l)
    if x.step then steps[#steps + 1] = x end
    if x.event == "summary" then summary = x end
  end
  T.eq(#steps, 3 * math.floor(256 / 16))
  -- the run ends with its summary: on stdout and as the log's last record
  T.truthy(out:find("summary: 48 steps, [%d.]+ sequences/s %(768 sequences in [%d.]+ s%), final loss"), out)
  T.eq(summary.steps, 48); T.eq(summary.sequences, 768); T.eq(summary.final_loss, steps[#steps].loss)
  local first, last = (steps[1].loss + steps[2].loss + steps[3].loss) / 3, 0
  for i = #steps - 5, #steps do last = last + steps[i].loss / 6 end
  T.truthy(last < first - 0.02, ("loss %.4f -> %.4f"):format(first, last))

  local res = cjson.decode(io.open(tmp .. "/mrpc/out/eval_results.json"):read("*a"))
  local pl = read_lines(tmp .. "/mrpc/out/dev_predictions_mrpc.tsv")
  T.eq(pl[1], "index\tprediction"); T.eq(#pl, 101)
  local preds, gold = {}, {}
  for i = 2, #pl do
    preds[i - 1] = tonumber(pl[i]:match("\t(%d)$"))
    gold[i - 1] = tonumber(dev[i]:match("^(%d)"))
  end
  local m = metrics.glue("mrpc", preds, gold)
  T.near(res.acc, m.acc, 1e-12); T.near(res.f1, m.f1, 1e-12); T.near(res.acc_and_f1, (m.acc + m.f1) / 2, 1e-12)
  local sub = read_lines(tmp .. "/mrpc/out/MRPC.tsv")
  T.eq(sub[1], "index\tprediction"); T.eq(#sub, 31)
  for i = 2, #sub do T.truthy(sub[i] == ("%d\t0"):format(i - 2) or sub[i] == ("%d\t1"):format(i - 2), sub[i]) end
  -- the fine-tuned model reloads and, through predict.lua, gives the same dev predictions
  out, rc = sh(("%s recipes/predict.lua --model=%s/mrpc/out/model --task=glue-mrpc --input=%s/mrpc/dev.tsv " ..
    "--output=%s/mrpc/p.tsv %s")
    :format(exe, tmp, tmp, tmp, common))
  T.eq(rc, 0, out)
  local again = read_lines(tmp .. "/mrpc/p.tsv")
  for i = 2, #pl do T.eq(again[i], pl[i], "row " .. i) end
end)

T.test("CoLA (no header line): Matthews correlation", function()
  local lines = read_lines(cola)
  write(tmp .. "/cola/train.tsv", { unpack(lines, 1, 64) })
  write(tmp .. "/cola/dev.tsv", { unpack(lines, 65, 124) })
  local out, rc = sh(("%s recipes/glue.lua --task=cola --data-dir=%s/cola --model=%s/cls2 --output=%s/cola/out " ..
    "--do-train --do-eval --batch=16 --epochs=1 %s"):format(exe, tmp, tmp, tmp, common))
  T.eq(rc, 0, out)
  T.truthy(out:find("60 rows, 60 examples", 1, true) or out:find("dev.tsv: 60 examples", 1, true), out)
  local res = cjson.decode(io.open(tmp .. "/cola/out/eval_results.json"):read("*a"))
  T.truthy(type(res.mcc) == "number" or tostring(res.mcc):find("constant", 1, true), tostring(res.mcc))
  T.eq(res.task, "cola")
end)

T.test("MNLI: matched and mismatched dev files, three labels, submission files", function()
  local labels = { "contradiction", "entailment", "neutral" }
  local words = { "cats", "dogs", "birds", "fish" }
  local function rows(n, cols, offset)
    local header = { "index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
      "sentence1_parse", "sentence2_parse", "sentence1", "sentence2" }
    if cols == 16 then for k = 1, 5 do header[#header + 1] = "label" .. k end end
    header[#header + 1] = "gold_label"
    local r = { table.concat(header, "\t") }
    for i = 1, n do
      local a, b = words[(i + offset) % 4 + 1], words[(i * 3 + offset) % 4 + 1]
      local lab = labels[(i + offset) % 3 + 1]
      local c = { tostring(i), "1", "1", "fiction", "x", "x", "x", "x", a .. " are nice", b .. " are nice" }
      if cols == 16 then for _ = 1, 5 do c[#c + 1] = lab end end
      c[#c + 1] = lab
      r[#r + 1] = table.concat(c, "\t")
    end
    return r
  end
  write(tmp .. "/mnli/train.tsv", rows(48, 12, 0))
  write(tmp .. "/mnli/dev_matched.tsv", rows(20, 16, 1))
  write(tmp .. "/mnli/dev_mismatched.tsv", rows(15, 16, 2))
  local t = { "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t" ..
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2" }
  for i = 1, 7 do t[#t + 1] = ("%d\t1\t1\tx\tx\tx\tx\tx\tcats are nice\tdogs are nice"):format(i - 1) end
  write(tmp .. "/mnli/test_matched.tsv", t)
  write(tmp .. "/mnli/test_mismatched.tsv", { unpack(t, 1, 5) })
  local out, rc = sh(("%s recipes/glue.lua --task=mnli --data-dir=%s/mnli --model=%s/cls3 --output=%s/mnli/out " ..
    "--do-train --do-eval --do-predict --batch=16 --epochs=1 %s"):format(exe, tmp, tmp, tmp, common))
  T.eq(rc, 0, out)
  local res = cjson.decode(io.open(tmp .. "/mnli/out/eval_results.json"):read("*a"))
  T.truthy(res.mnli_acc >= 0 and res.mnli_acc <= 1 and res["mnli-mm_acc"] >= 0, cjson.encode(res))
  T.eq(#read_lines(tmp .. "/mnli/out/dev_predictions_mnli.tsv"), 21)
  T.eq(#read_lines(tmp .. "/mnli/out/dev_predictions_mnli-mm.tsv"), 16)
  local m, mm = read_lines(tmp .. "/mnli/out/MNLI-m.tsv"), read_lines(tmp .. "/mnli/out/MNLI-mm.tsv")
  T.eq(#m, 8); T.eq(#mm, 5)
  for i = 2, #m do
    local lab = m[i]:match("^%d+\t(.+)$")
    T.truthy(lab == labels[1] or lab == labels[2] or lab == labels[3], m[i])
  end
end)

T.test("--precision=bf16|fp16 training tracks fp32 (loss per step, dev accuracy)", function()
  local lines = read_lines(mrpc)
  lines[1] = lines[1]:gsub("^\239\187\191", "")
  os.execute("mkdir -p " .. tmp .. "/prec")
  write(tmp .. "/prec/train.tsv", { unpack(lines, 1, 97) })
  write(tmp .. "/prec/dev.tsv", { lines[1], unpack(lines, 258, 321) })
  local function run(prec)
    local out, rc = sh(("%s recipes/glue.lua --task=mrpc --data-dir=%s/prec --model=%s/cls2 --output=%s/prec/%s " ..
      "--do-train --do-eval --batch=16 --lr=3e-3 --epochs=2 --precision=%s %s"):format(exe, tmp, tmp, tmp, prec, prec,
        common))
    T.eq(rc, 0, out)
    local l = {}
    for x in io.lines(("%s/prec/%s/train_log.jsonl"):format(tmp, prec)) do
      local r = cjson.decode(x)
      if r.step then l[#l + 1] = r end
    end
    return l, cjson.decode(io.open(("%s/prec/%s/eval_results.json"):format(tmp, prec)):read("*a")), out
  end
  local ref, ref_res = run("fp32")
  T.eq(#ref, 12)
  for _, prec in ipairs({ "bf16", "fp16" }) do
    local l, res, out = run(prec)
    T.truthy(out:find("weights rounded to " .. prec, 1, true), out)
    T.eq(#l, #ref)
    local worst = 0
    for i = 1, #l do worst = math.max(worst, math.abs(l[i].loss - ref[i].loss)) end
    if os.getenv("BL_VERBOSE") then
      print(("%s: largest per-step loss difference %.4f; dev acc %.4f (fp32 %.4f)"):format(prec, worst, res.acc,
        ref_res.acc))
    end
    T.truthy(worst < 0.05, ("%s: largest per-step loss difference %.4f"):format(prec, worst))
    T.near(res.acc, ref_res.acc, 0, 0.05, prec .. " dev accuracy")
    if prec == "fp16" then T.eq(l[1].loss_scale, 65536) else T.eq(l[1].loss_scale, nil) end
  end
end)

T.test("malformed rows (missing fields, bad labels, empty lines): FILE:LINE, skipped, counted; an empty split refused",
  function()
  os.execute("mkdir -p " .. tmp .. "/rows")
  local lines = read_lines(mrpc)
  lines[1] = lines[1]:gsub("^\239\187\191", "")
  local train = { unpack(lines, 1, 41) }
  train[3] = "1\t123\t456\tonly one sentence"                   -- 4 columns: a missing field
  train[6] = train[6]:gsub("^%d", "7")                            -- unknown label
  train[9] = ""                                                   -- empty line
  train[12] = train[12] .. "\textra"                              -- one column too many
  write(tmp .. "/rows/train.tsv", train)
  write(tmp .. "/rows/dev.tsv", { lines[1] })                    -- a header and no rows
  local out, rc = sh(("%s recipes/glue.lua --task=mrpc --data-dir=%s/rows --model=%s/cls2 --output=%s/rows/out " ..
    "--do-train --batch=8 --epochs=1 %s"):format(exe, tmp, tmp, tmp, common))
  T.eq(rc, 0, out)
  local f = tmp .. "/rows/train.tsv"
  for _, w in ipairs({ f .. ":3: 4 columns, expected 5 (skipped)",
    f .. ":6: unknown label '7' (expected 0/1) (skipped)",
    f .. ":9: empty line (skipped)", f .. ":12: 6 columns, expected 5 (skipped)",
      "40 rows, 36 examples, 4 malformed rows skipped" }) do
    T.truthy(out:find(w, 1, true), "missing '" .. w .. "' in:\n" .. out)
  end
  T.truthy(out:find("train: 36 examples, 4 steps", 1, true), out)
  out, rc = sh(("%s recipes/glue.lua --task=mrpc --data-dir=%s/rows --model=%s/cls2 --output=%s/rows/out2 --do-eval %s")
    :format(exe, tmp, tmp, tmp, common))
  T.eq(rc, 1); T.truthy(out:find("glue: " .. tmp .. "/rows/dev.tsv has no data rows", 1, true), out)
  -- STS-B: a score that is not a number
  os.execute("mkdir -p " .. tmp .. "/stsb")
  local head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
  local rows = { head }
  for i = 1, 9 do rows[#rows + 1] = ("%d\tmain\tf\t2012\t%d\tnone\tnone\tA cat sat.\tA dog sat.\t%s"):format(i, i,
    i == 4 and "high" or tostring(i % 5)) end
  write(tmp .. "/stsb/dev.tsv", rows)
  model(tmp .. "/reg", 1)
  out, rc = sh(("%s recipes/glue.lua --task=stsb --data-dir=%s/stsb --model=%s/reg --output=%s/stsb/out --do-eval %s")
    :format(exe, tmp, tmp, tmp, common))
  T.eq(rc, 0, out)
  T.truthy(out:find(tmp .. "/stsb/dev.tsv:5: label 'high' is not a number (skipped)", 1, true)
    and out:find("9 rows, 8 examples, 1 malformed rows skipped", 1, true), out)
end)

T.test("bad input is reported before any work", function()
  local base = ("%s recipes/glue.lua %s"):format(exe, common)
  local out, rc = sh(("%s --task=nope --data-dir=%s/mrpc --model=%s/cls2 --do-eval"):format(base, tmp, tmp))
  T.eq(rc, 1); T.truthy(out:find("glue: unknown task 'nope'", 1, true), out)
  -- no dev.tsv: found before training starts
  out, rc = sh(("%s --task=sst2 --data-dir=%s/mrpc --train-file=%s/mrpc/train.tsv --model=%s/cls2 --output=%s/bad1 " ..
    "--do-train --do-eval --eval-file=%s/none.tsv")
    :format(base, tmp, tmp, tmp, tmp, tmp))
  T.eq(rc, 1); T.truthy(out:find("--eval-file=" .. tmp .. "/none.tsv cannot be read", 1, true), out)
  T.truthy(not io.open(tmp .. "/bad1/train_log.jsonl"), "nothing trained")
  out, rc = sh(("%s --task=cola --data-dir=%s/cola --model=%s/cls2 --do-predict"):format(base, tmp, tmp))
  T.eq(rc, 1); T.truthy(out:find("test data " .. tmp .. "/cola/test.tsv cannot be read", 1, true), out)
  out, rc = sh(("%s --task=mrpc --data-dir=%s/mrpc --model=%s/nope --do-eval"):format(base, tmp, tmp))
  T.eq(rc, 1); T.truthy(out:find("model directory " .. tmp .. "/nope does not exist", 1, true), out)
  out, rc = sh(("%s --task=mrpc --data-dir=%s/mrpc --model=%s/cls2 --do-train --batch=10 --micro-batch=4"):format(base,
    tmp, tmp))
  T.eq(rc, 1); T.truthy(out:find("not a multiple of --micro-batch", 1, true), out)
  -- MRPC rows read as SST-2: every row is malformed; each is located, then a clear stop
  out, rc = sh(("%s --task=sst2 --eval-file=%s/mrpc/dev.tsv --model=%s/cls2 --do-eval --output=%s/bad2"):format(base,
    tmp, tmp, tmp))
  T.eq(rc, 1)
  T.truthy(out:find("dev.tsv:2: 5 columns, expected 2", 1, true) and out:find("no usable rows", 1, true), out)
  out, rc = sh(("%s --task=mrpc --data-dir=%s/mrpc --model=%s/cls2 --do-train --precision=fp8 --output=%s/bad4")
    :format(base, tmp, tmp, tmp))
  T.eq(rc, 1); T.truthy(out:find("glue: --precision must be fp32, tf32, bf16 or fp16, got fp8", 1, true), out)
  T.truthy(not io.open(tmp .. "/bad4/train_log.jsonl"), "nothing trained")
  -- a 3-label model for a 2-label task
  out, rc = sh(("%s --task=mrpc --data-dir=%s/mrpc --model=%s/cls3 --do-eval --output=%s/bad3"):format(base, tmp, tmp,
    tmp))
  T.eq(rc, 1); T.truthy(out:find("is a classifier with 3 outputs; mrpc needs 2", 1, true), out)
end)

T.run()
