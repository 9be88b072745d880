-- recipes/predict.lua: SQuAD JSON, GLUE TSV and JSON-lines inputs; answers equal
-- those of recipes/squad.lua and do not depend on the batch size (padding to the
-- longest in the batch is masked out); throughput and latency percentiles are
-- reported, also in latency mode (--batch=1) for QA and classification;
-- --precision=bf16|fp16 gives nearly fp32's logits; bad input is located and
-- counted.
local T = require "testing"
local cjson = require "cjson"

local exe = T.exe()
local tmp = T.tmpdir()
-- made here (tests/lua/lib/fixtures.lua, bertlua.data.synthetic): a vocabulary, SQuAD-format questions
-- about a generated world and an SST-2 dev file in the original format
local fx = require "fixtures"
local syn = require "bertlua.data.synthetic"
local vocab = fx.vocab(tmp)
local sst = fx.glue(tmp, "sst2")
local sh, slurp, write = T.sh, T.slurp, T.write_file

-- random non-zero heads (seeded): predictions are arbitrary but deterministic
local two = { num_hidden_layers = 2 }
T.tiny_model_dir(tmp .. "/qa", { head = "qa", seed = 5, vocab = vocab, config = two })
T.tiny_model_dir(tmp .. "/cls", { seed = 6, num_labels = 2, vocab = vocab, config = two })
T.tiny_model_dir(tmp .. "/reg", { seed = 7, num_labels = 1, vocab = vocab, config = two })

local d = syn.squad(syn.world { seed = 11, countries = 40 }, { split = "dev" })
local slice = { version = d.version, data = { { title = d.data[1].title,
  paragraphs = { d.data[1].paragraphs[1], d.data[2].paragraphs[1] } } } }
write(tmp .. "/v1.json", cjson.encode(slice))
local nq = 0
for _, p in ipairs(slice.data[1].paragraphs) do nq = nq + #p.qas end
local qa_opts = "--max-seq-length=96 --doc-stride=48 --max-query-length=24 --threads=2"

T.test("squad input: same answers as recipes/squad.lua at any batch size; stats", function()
  local out, rc = sh(("%s recipes/squad.lua --model=%s/qa --predict-file=%s/v1.json --output=%s/ref --do-predict %s")
    :format(exe, tmp, tmp, tmp, qa_opts))
  T.eq(rc, 0, out)
  local ref = slurp(tmp .. "/ref/predictions.json")
  for _, b in ipairs({ 1, 6, 64 }) do
    out, rc = sh(("%s recipes/predict.lua --model=%s/qa --task=squad --input=%s/v1.json --output=%s/p%d.json " ..
      "--batch=%d " ..
      "--stats=%s/s%d.json %s"):format(exe, tmp, tmp, tmp, b, b, tmp, b, qa_opts))
    T.eq(rc, 0, out)
    T.eq(slurp(("%s/p%d.json"):format(tmp, b)), ref, "batch " .. b)
    local s = cjson.decode(slurp(("%s/s%d.json"):format(tmp, b)))
    T.eq(s.records, nq); T.eq(s.skipped, 0); T.eq(s.batch, b)
    T.eq(s.batches, math.ceil(s.sequences / b))
    T.truthy(s.sequences >= nq and s.seq_per_s > 0 and s.seconds > 0, out)
    T.truthy(s.p50_ms > 0 and s.p50_ms <= s.p90_ms and s.p90_ms <= s.p99_ms, out)
    T.truthy(s.evaluation and s.evaluation.f1 >= 0 and s.evaluation.f1 <= 100, "evaluated")
    T.truthy(out:find("sequences/s; latency per batch p50 ", 1, true), out)
  end
end)

T.test("glue input: submission format, dev metrics, test split, malformed rows", function()
  local lines = {}
  for l in io.lines(sst) do lines[#lines + 1] = l; if #lines == 41 then break end end
  write(tmp .. "/dev.tsv", table.concat(lines, "\n", 1, 21) .. "\nno label column here\n" .. table.concat(lines, "\n",
    22, 41) .. "\n")
  local out, rc = sh(("%s recipes/predict.lua --model=%s/cls --task=glue-sst2 --input=%s/dev.tsv " ..
    "--output=%s/sst.tsv " ..
    "--batch=8 --max-seq-length=64 --stats=%s/sst_stats.json --threads=2"):format(exe, tmp, tmp, tmp, tmp))
  T.eq(rc, 0, out)
  T.truthy(out:find("dev.tsv:22: 1 columns, expected 2", 1, true) and out:find("40 records (1 skipped)", 1, true), out)
  local pred = {}
  local got = slurp(tmp .. "/sst.tsv")
  T.eq(got:match("^[^\n]*"), "index\tprediction")
  -- every row keeps its own place in the file: the malformed 21st data row (index 20) leaves a gap
  for idx, label in got:gmatch("\n(%d+)\t([^\n]+)") do
    pred[#pred + 1] = label
    T.eq(tonumber(idx), #pred <= 20 and #pred - 1 or #pred)
  end
  T.eq(#pred, 40)
  local correct = 0
  for i = 2, 41 do
    local gold = lines[i]:match("\t(%d)$")
    T.truthy(pred[i - 1] == "0" or pred[i - 1] == "1", pred[i - 1])
    if pred[i - 1] == gold then correct = correct + 1 end
  end
  local s = cjson.decode(slurp(tmp .. "/sst_stats.json"))
  T.near(s.evaluation.acc, correct / 40, 1e-12)
  -- a test file (index<TAB>sentence, no labels): predictions only
  local t = { "index\tsentence" }
  for i = 2, 11 do t[#t + 1] = ("%d\t%s"):format(i - 2, lines[i]:match("^(.-)\t")) end
  write(tmp .. "/test.tsv", table.concat(t, "\n") .. "\n")
  out, rc = sh(("%s recipes/predict.lua --model=%s/cls --task=glue-sst2 --input=%s/test.tsv --output=%s/SST-2.tsv " ..
    "--max-seq-length=64")
    :format(exe, tmp, tmp, tmp))
  T.eq(rc, 0, out)
  T.truthy(not out:find("evaluation", 1, true), out)
  local n = 0
  for l in io.lines(tmp .. "/SST-2.tsv") do n = n + 1; if n > 1 then T.eq(l:match("^(%d+)\t"), tostring(n - 2)) end end
  T.eq(n, 11)
  -- the test-file predictions equal the dev-file predictions of the same sentences
  local test_pred = {}
  for l in io.lines(tmp .. "/SST-2.tsv") do test_pred[#test_pred + 1] = l:match("\t(.+)$") end
  for i = 1, 10 do T.eq(test_pred[i + 1], pred[i], "sentence " .. i) end
end)

T.test("jsonl input: padding does not change logits; QA answers; regression scores", function()
  local recs = {
    '{"text_a": "a charming and often affecting journey", "text_b": "it is a film"}',
    '{"text": "dull"}',
    '{"text_a": "the story is told with a kind of grave humor and the acting is uniformly excellent throughout"}',
    '{"text_a": "no", "text_b": "yes"}',
    '{"text_a": "unflinchingly bleak and desperate"}',
  }
  write(tmp .. "/in.jsonl", table.concat(recs, "\n") .. "\n")
  local function logits(model, b)
    local out, rc = sh(("%s recipes/predict.lua --model=%s/%s --input=%s/in.jsonl --output=%s/o.jsonl --batch=%d " ..
      "--max-seq-length=64")
      :format(exe, tmp, model, tmp, tmp, b))
    T.eq(rc, 0, out)
    local r = {}
    for l in io.lines(tmp .. "/o.jsonl") do
      local x = cjson.decode(l)
      T.eq(x.index, #r)
      r[#r + 1] = x
    end
    T.eq(#r, #recs)
    return r
  end
  for _, m in ipairs({ "cls", "reg" }) do
    local one, many = logits(m, 1), logits(m, 5)
    for i = 1, #recs do
      T.near(many[i].logits, one[i].logits, 1e-4, 1e-5, m .. " record " .. i)
      if m == "reg" then T.near(one[i].label, one[i].logits[1], 0, 0) else T.eq(many[i].label, one[i].label) end
    end
    -- the inputs differ, so must the outputs (a broken model would give one answer for all)
    T.truthy(math.abs(one[1].logits[1] - one[3].logits[1]) > 1e-6, "outputs depend on the input")
  end
  write(tmp .. "/q.jsonl",
    '{"question": "Who won Super Bowl 50?", "context": "The Denver Broncos defeated the Carolina Panthers to win ' ..
      'Super Bowl 50."}\n' ..
    '{"question": "Where?", "context": "   "}\n')
  local out, rc = sh(("%s recipes/predict.lua --model=%s/qa --input=%s/q.jsonl --batch=1 --max-seq-length=64")
    :format(exe, tmp, tmp))
  T.eq(rc, 0, out)
  T.truthy(out:find("q.jsonl:2: needs string fields question and a non-empty context", 1, true), out)
  local line = out:match("(%b{})")
  local a = cjson.decode(line)
  T.eq(a.index, 0)
  T.truthy(type(a.answer) == "string" and a.answer ~= "" and ("The Denver Broncos defeated the Carolina Panthers " ..
    "to win Super Bowl 50."):find(a.answer, 1, true), line)
  T.truthy(a.probability > 0 and a.probability <= 1, line)
end)

T.test("latency mode --batch=1: QA and classification, one sequence per timed forward, ordered percentiles", function()
  write(tmp .. "/lat_cls.jsonl", table.concat({ '{"text_a": "a charming and often affecting journey"}',
    '{"text": "dull"}',
    '{"text_a": "no", "text_b": "yes"}', '{"text_a": "unflinchingly bleak and desperate"}', '{"text": "fine"}' },
      "\n") .. "\n")
  write(tmp .. "/lat_qa.jsonl", table.concat({
    '{"question": "Who won?", "context": "The Denver Broncos defeated the Carolina Panthers."}',
    '{"question": "Where is it?", "context": "Super Bowl 50 was played at Levi\'s Stadium in Santa Clara, ' ..
      'California."}',
    '{"question": "When?", "context": "The game was played on February 7, 2016."}' }, "\n") .. "\n")
  for _, c in ipairs({ { "cls", "lat_cls.jsonl", 5 }, { "qa", "lat_qa.jsonl", 3 } }) do
    local out, rc = sh(("%s recipes/predict.lua --model=%s/%s --input=%s/%s --output=%s/lat_%s.out --batch=1 " ..
      "--warmup-batches=2 " ..
      "--max-seq-length=64 --stats=%s/lat_%s.json --threads=2"):format(exe, tmp, c[1], tmp, c[2], tmp, c[1], tmp, c[1]))
    T.eq(rc, 0, out)
    local st = cjson.decode(slurp(("%s/lat_%s.json"):format(tmp, c[1])))
    T.eq(st.batch, 1); T.eq(st.records, c[3]); T.eq(st.skipped, 0); T.eq(st.precision, "fp32")
    T.eq(st.sequences, c[3]); T.eq(st.batches, c[3])   -- short contexts: one window per question
    T.truthy(st.p50_ms > 0 and st.p50_ms <= st.p90_ms and st.p90_ms <= st.p99_ms,
      c[1] .. ": " .. slurp(("%s/lat_%s.json"):format(tmp, c[1])))
    T.truthy(st.seq_per_s > 0 and st.seconds > 0, c[1])
    T.truthy(out:find(("predict: %d records (0 skipped); %d sequences in"):format(c[3], c[3]), 1, true)
      and out:find("latency per batch p50 ", 1, true), out)
    local n = 0
    for l in io.lines(("%s/lat_%s.out"):format(tmp, c[1])) do n = n + 1; T.eq(cjson.decode(l).index, n - 1) end
    T.eq(n, c[3])
    if os.getenv("BL_VERBOSE") then
      print(("latency %s batch 1: %.1f seq/s, p50 %.2f ms, p90 %.2f ms, p99 %.2f ms"):format(c[1], st.seq_per_s,
        st.p50_ms, st.p90_ms, st.p99_ms))
    end
  end
end)

T.test("--precision=bf16|fp16: weights rounded once, logits nearly those of fp32", function()
  local function outputs(model, input, prec)
    local out, rc = sh(("%s recipes/predict.lua --model=%s/%s --input=%s/%s --output=%s/pr.jsonl --batch=4 " ..
      "--max-seq-length=64 " ..
      "--precision=%s --stats=%s/pr_stats.json"):format(exe, tmp, model, tmp, input, tmp, prec, tmp))
    T.eq(rc, 0, out)
    T.eq(cjson.decode(slurp(tmp .. "/pr_stats.json")).precision, prec)
    local r = {}
    for l in io.lines(tmp .. "/pr.jsonl") do r[#r + 1] = cjson.decode(l) end
    return r
  end
  for _, m in ipairs({ "cls", "reg" }) do
    local ref = outputs(m, "lat_cls.jsonl", "fp32")
    T.eq(#ref, 5)
    local tf = outputs(m, "lat_cls.jsonl", "tf32")
    for i = 1, #ref do T.near(tf[i].logits, ref[i].logits, 0, 0, "tf32 = fp32 on the CPU") end
    for _, prec in ipairs({ "bf16", "fp16" }) do
      local got = outputs(m, "lat_cls.jsonl", prec)
      local worst, big = 0, 0
      for i = 1, #ref do
        for k = 1, #ref[i].logits do
          worst = math.max(worst, math.abs(got[i].logits[k] - ref[i].logits[k]))
          big = math.max(big, math.abs(ref[i].logits[k]))
        end
      end
      local rel = worst / big
      if os.getenv("BL_VERBOSE") then
        print(("%s %s: largest logit difference %.2e (%.2e of the largest logit %.3g)"):format(m, prec, worst, rel,
          big))
      end
      T.truthy(worst > 0, m .. " " .. prec .. ": the weights were rounded")
      -- bf16 keeps 8 significant bits (relative rounding 2^-9 = 2e-3), f16 11 (2.4e-4)
      T.truthy(rel < (prec == "bf16" and 0.03 or 0.004),
        ("%s %s: largest logit difference %.3g of the largest logit"):format(m, prec, rel))
    end
  end
  -- QA: answers with bf16 weights are spans of the context, probabilities close
  local ref, got = outputs("qa", "lat_qa.jsonl", "fp32"), outputs("qa", "lat_qa.jsonl", "bf16")
  for i = 1, #ref do
    T.truthy(type(got[i].answer) == "string" and got[i].answer ~= "", "answer " .. i)
    T.near(got[i].probability, ref[i].probability, 0, 0.05, "probability " .. i)
  end
end)

T.test("bad input", function()
  local base = ("%s recipes/predict.lua --max-seq-length=64"):format(exe)
  write(tmp .. "/bad.jsonl", '{"text_a": 5}\nnot json\n[1]\n\n')
  -- args (both %s: the temp dir) must fail with exit status 1 and every one of the messages
  local function refused(args, ...)
    local out, rc = sh(base .. " " .. args:format(tmp, tmp))
    T.eq(rc, 1, out)
    for _, want in ipairs({ ... }) do T.truthy(out:find(want, 1, true), out) end
    return out
  end
  refused("--model=%s/cls --input=%s/bad.jsonl", "bad.jsonl:1: needs a string field", "bad.jsonl:2: not JSON",
    "bad.jsonl:3: not a JSON object", "no usable records")
  refused("--model=%s/cls --task=glue-nope --input=%s/bad.jsonl", "unknown task 'nope'")
  refused("--model=%s/cls --task=xml --input=%s/bad.jsonl", "--task must be jsonl, squad or glue-TASK")
  refused("--model=%s/cls --task=squad --input=%s/v1.json", "--task=squad needs a QA model")
  local out = refused("--model=%s/reg --task=glue-sst2 --input=%s/dev.tsv")
  T.truthy(out:find("has 1 outputs but glue-sst2 needs 2", 1, true) or out:find("has 1 outputs but sst2 needs 2", 1,
    true), out)
  refused("--model=%s/cls --input=%s/missing.jsonl", "--input=" .. tmp .. "/missing.jsonl cannot be read")
  refused("--model=%s --input=%s/bad.jsonl", "is not a model directory: no config.json")
  refused("--model=%s/cls --input=%s/bad.jsonl --precision=f16",
    "predict: --precision must be fp32, tf32, bf16, fp16 or int8, got f16")
  refused("--model=%s/cls --input=%s/bad.jsonl --batch=0", "option --batch=0: must be >= 1")
end)

T.run()
