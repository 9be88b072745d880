-- recipes/squad.lua on slices of the real SQuAD dev files (v1.1 and v2.0):
-- the files the official tools read are written and agree with them,
-- accumulation and the schedule show in the log, fp16 training tracks fp32,
-- a tiny model fitted to a slice beats a trivial baseline, and bad input is
-- reported before any work. (Learning that generalises to held-out questions
-- is checked on the generated QA set by test_qa_end_to_end.lua.)
local T = require "testing"
local cjson = require "cjson"

local exe = T.exe()
local vocab = T.shared_data("vocab/bert-base-uncased-vocab.txt")
local dev1 = T.shared_data("squad/dev-v1.1.json")
local dev2 = T.shared_data("squad/dev-v2.0.cs224n-half.json")
if not vocab or not dev1 or not dev2 then T.skip_all("needs ../shared/data (vocab, squad/dev-v1.1.json, " ..
  "squad/dev-v2.0.cs224n-half.json)") end

local tmp = T.tmpdir()
local sh = T.sh
local function read_json(path) return cjson.decode(T.slurp(path)) end
local function write_json(path, v) T.write_file(path, cjson.encode(v)) end

-- slices: the first 3 paragraphs of the first article; training copies keep
-- the first answer only (run_squad.py trains on exactly one answer per question)
local function slice(path, name)
  local d = read_json(path)
  local s = { version = d.version, data = { { title = d.data[1].title, paragraphs = { unpack(d.data[1].paragraphs, 1,
    3) } } } }
  write_json(tmp .. "/" .. name .. ".json", s)
  local ids = {}
  for _, p in ipairs(s.data[1].paragraphs) do
    for _, qa in ipairs(p.qas) do
      ids[#ids + 1] = qa.id
      if #qa.answers > 1 then qa.answers = { qa.answers[1] } end
    end
  end
  write_json(tmp .. "/" .. name .. "_train.json", s)
  return ids
end
local ids1, ids2 = slice(dev1, "v1"), slice(dev2, "v2")

T.tiny_model_dir(tmp .. "/init", { head = "qa", seed = 3, vocab = vocab })
local common = "--max-seq-length=128 --doc-stride=64 --max-query-length=32 --lr=1e-3 --threads=2"

local function step_lines(path)
  local r = {}
  for l in io.lines(path) do local x = cjson.decode(l); if x.step then r[#r + 1] = x end end
  return r
end

T.test("v1.1 slice: train with accumulation, predict, files parse, official evaluation agrees", function()
  local out, rc = sh(("%s recipes/squad.lua --model=%s/init --train-file=%s/v1_train.json --predict-file=%s/v1.json " ..
    "--output=%s/run1 --do-train --do-predict --batch=8 --micro-batch=4 --epochs=1 --warmup=0.25 %s")
    :format(exe, tmp, tmp, tmp, tmp, common))
  T.eq(rc, 0, out)
  -- 135 features / batch 8 = 16 steps, each 2 micro-batches of 4
  T.truthy(out:find("batch 8 = 4 x 2", 1, true), out)
  local steps = step_lines(tmp .. "/run1/train_log.jsonl")
  T.eq(#steps, 16)
  -- linear warmup over 4 steps to 1e-3 then linear decay to 0 at step 16
  T.near(steps[1].lr, 0, 0, 1e-12); T.near(steps[3].lr, 5e-4, 1e-6); T.near(steps[5].lr, 1e-3, 1e-6)
  T.near(steps[16].lr, 1e-3 * 1 / 12, 1e-6)
  for _, s in ipairs(steps) do T.truthy(s.loss > 0 and s.loss < 10, "loss " .. s.loss) end

  local preds = read_json(tmp .. "/run1/predictions.json")
  local nbest = read_json(tmp .. "/run1/nbest_predictions.json")
  for _, id in ipairs(ids1) do
    T.truthy(type(preds[id]) == "string" and preds[id] ~= "", "prediction for " .. id)
    local nb = nbest[id]
    T.truthy(type(nb) == "table" and #nb >= 1 and #nb <= 20, "n-best for " .. id)
    local sum = 0
    for k, e in ipairs(nb) do
      sum = sum + e.probability
      if k > 1 then T.truthy(e.probability <= nb[k - 1].probability, "n-best sorted") end
    end
    T.near(sum, 1, 1e-6)
    T.eq(nb[1].text, preds[id])
  end
  T.truthy(not io.open(tmp .. "/run1/null_odds.json"), "no null_odds.json for v1.1")
  T.truthy(io.open(tmp .. "/run1/model/model.safetensors") and io.open(tmp .. "/run1/model/vocab.txt"), "model saved")
  local res = read_json(tmp .. "/run1/eval_results.json")
  T.truthy(res.f1 >= 0 and res.f1 <= 100 and res.exact_match >= 0, out)
  T.truthy(res.predict_seq_per_s > 0 and res.predict_p99_ms >= res.predict_p50_ms, "throughput recorded")
  local ev, rc2 = sh(("%s recipes/squad_eval.lua %s/v1.json %s/run1/predictions.json 2>/dev/null"):format(exe, tmp,
    tmp))
  T.eq(rc2, 0, ev)
  local official = cjson.decode(ev:match("(%b{})"))
  T.near(official.f1, res.f1, 1e-9); T.near(official.exact_match, res.exact_match, 1e-9)

  -- the saved model reloads with its head and predicts the same answers
  local out2, rc3 = sh(("%s recipes/squad.lua --model=%s/run1/model --predict-file=%s/v1.json --output=%s/run1b " ..
    "--do-predict " ..
    "--predict-batch=5 %s"):format(exe, tmp, tmp, tmp, common))
  T.eq(rc3, 0, out2)
  local preds2 = read_json(tmp .. "/run1b/predictions.json")
  for _, id in ipairs(ids1) do T.eq(preds2[id], preds[id], id) end

  -- --span-search=exhaustive searches a superset of the n-best spans: each best score is at least the n-best one
  local out3, rc4 = sh(("%s recipes/squad.lua --model=%s/run1/model --predict-file=%s/v1.json --output=%s/run1c " ..
    "--do-predict --span-search=exhaustive %s"):format(exe, tmp, tmp, tmp, common))
  T.eq(rc4, 0, out3)
  T.truthy(out3:find("(exhaustive span search; 0 of " .. #ids1 .. " questions without a valid span)", 1, true), out3)
  local nb3 = read_json(tmp .. "/run1c/nbest_predictions.json")
  for _, id in ipairs(ids1) do
    local a, b = nb3[id][1], nbest[id][1]
    local nonce = b.text == "empty" and b.start_logit == 0 and b.end_logit == 0  -- n-best found no valid span
    T.truthy(nonce or a.start_logit + a.end_logit >= b.start_logit + b.end_logit - 1e-6,
      "exhaustive below n-best for " .. id)
  end
  local res3 = read_json(tmp .. "/run1c/eval_results.json")
  T.eq(res3.span_search, "exhaustive"); T.eq(res3.empty_answers, 0)
  T.eq(res.span_search, "nbest"); T.truthy(res.empty_answers >= 0, "n-best empty answers recorded")
end)

-- The issue's CPU accuracy check: a tiny model fine-tuned on a slice of the
-- real SQuAD data reaches an F1 clearly above a trivial baseline (the first
-- three words of the context, about a gold answer's length), scored by the
-- official evaluation. A randomly initialised tiny model cannot generalise
-- from 80 questions, so it is scored on the questions it was fitted to
-- (with all their gold answers); held-out learning is checked on generated
-- data by test_qa_end_to_end.lua.
T.test("a tiny model fine-tuned on a SQuAD v1.1 slice beats a trivial baseline (official F1)", function()
  if T.sanitized() then T.skip("sanitizer build: the Release build checks the accuracy (30 epochs take minutes " ..
    "under ASan)") end
  local out, rc = sh(("%s recipes/squad.lua --model=%s/init --train-file=%s/v1_train.json --predict-file=%s/v1.json " ..
    "--output=%s/fit --do-train --do-predict --batch=8 --epochs=30 --warmup=0.1 --seed=1 %s")
    :format(exe, tmp, tmp, tmp, tmp, (common:gsub("%-%-lr=1e%-3", "--lr=2e-3"))))
  T.eq(rc, 0, out)
  local base = {}
  for _, p in ipairs(read_json(tmp .. "/v1.json").data[1].paragraphs) do
    local first = table.concat({ p.context:match("^(%S+)%s+(%S+)%s+(%S+)") }, " ")
    for _, qa in ipairs(p.qas) do base[qa.id] = first end
  end
  write_json(tmp .. "/baseline.json", base)
  local function official(pred)
    local ev, rc2 = sh(("%s recipes/squad_eval.lua %s/v1.json %s 2>/dev/null"):format(exe, tmp, pred))
    T.eq(rc2, 0, ev)
    return cjson.decode(ev:match("(%b{})"))
  end
  local model, trivial = official(tmp .. "/fit/predictions.json"), official(tmp .. "/baseline.json")
  print(("  fitted tiny model: EM %.1f F1 %.1f; baseline: EM %.1f F1 %.1f"):format(
    model.exact_match, model.f1, trivial.exact_match, trivial.f1))
  T.truthy(model.f1 > trivial.f1 + 20, ("F1 %.1f vs baseline %.1f"):format(model.f1, trivial.f1))
end)

T.test("--precision=fp16 (loss scaling, f32 master weights) tracks the fp32 run step by step", function()
  if not io.open(tmp .. "/run1/train_log.jsonl") then T.skip("needs the fp32 run of the v1.1 test") end
  local out, rc = sh(("%s recipes/squad.lua --model=%s/init --train-file=%s/v1_train.json --predict-file=%s/v1.json " ..
    "--output=%s/run1h --do-train --do-predict --batch=8 --micro-batch=4 --epochs=1 --warmup=0.25 --precision=fp16 %s")
    :format(exe, tmp, tmp, tmp, tmp, common))
  T.eq(rc, 0, out)
  T.truthy(out:find("predict: weights rounded to fp16", 1, true), out)
  local ref, got = step_lines(tmp .. "/run1/train_log.jsonl"), step_lines(tmp .. "/run1h/train_log.jsonl")
  T.eq(#got, #ref)
  local worst = 0
  for i = 1, #ref do
    worst = math.max(worst, math.abs(got[i].loss - ref[i].loss))
    T.truthy(got[i].loss_scale and got[i].loss_scale >= 1, "loss scale logged")
  end
  if os.getenv("BL_VERBOSE") then print(("fp16 vs fp32: largest per-step loss difference %.4f"):format(worst)) end
  T.truthy(worst < 0.05, ("largest per-step loss difference %.4f"):format(worst))
  local a, b = read_json(tmp .. "/run1/eval_results.json"), read_json(tmp .. "/run1h/eval_results.json")
  T.near(b.f1, a.f1, 0, 10, "F1 of the fp16 run")
end)

T.test("v2.0 slice: null_odds.json, no-answer metrics, best threshold as the official script", function()
  local out, rc = sh(("%s recipes/squad.lua --model=%s/init --train-file=%s/v2_train.json --predict-file=%s/v2.json " ..
    "--output=%s/run2 --do-train --do-predict --version-2-with-negative --batch=8 --max-steps=3 %s")
    :format(exe, tmp, tmp, tmp, tmp, common))
  T.eq(rc, 0, out)
  T.eq(#step_lines(tmp .. "/run2/train_log.jsonl"), 3)
  local preds = read_json(tmp .. "/run2/predictions.json")
  local odds = read_json(tmp .. "/run2/null_odds.json")
  for _, id in ipairs(ids2) do
    T.truthy(type(preds[id]) == "string", "prediction for " .. id)
    T.truthy(type(odds[id]) == "number", "null odds for " .. id)
    -- threshold 0: "" exactly when the null score beats the best span
    T.eq(preds[id] == "", odds[id] > 0, id)
  end
  local res = read_json(tmp .. "/run2/eval_results.json")
  T.eq(res.HasAns_total + res.NoAns_total, #ids2)
  local ev, rc2 = sh(("%s recipes/squad_eval.lua %s/v2.json %s/run2/predictions.json " ..
    "--na-prob=%s/run2/null_odds.json 2>/dev/null")
    :format(exe, tmp, tmp, tmp))
  T.eq(rc2, 0, ev)
  local official = cjson.decode(ev:match("(%b{})"))
  for _, k in ipairs({ "exact", "f1", "HasAns_f1", "NoAns_f1", "best_f1", "best_f1_thresh" }) do
    T.near(official[k], res[k], 1e-9, 1e-9, k)
  end
  -- v2.0 data without the flag: said, not silently evaluated as if answerable
  out = sh(("%s recipes/squad.lua --model=%s/init --predict-file=%s/v2.json --output=%s/run2b --do-predict %s")
    :format(exe, tmp, tmp, tmp, common))
  T.truthy(out:find("is SQuAD 2.0 but --version-2-with-negative is off", 1, true), out)
end)

T.test("--save-steps / --resume: checkpoints refused without --resume, continued exactly with it", function()
  local cmd = ("%s recipes/squad.lua --model=%s/init --train-file=%s/v2_train.json --output=%s/ckpt --do-train " ..
    "--version-2-with-negative --batch=8 --max-steps=3 --save-steps=1 %s"):format(exe, tmp, tmp, tmp, common)
  local out, rc = sh(cmd)
  T.eq(rc, 0, out)
  os.execute(("cp %s/ckpt/model/model.safetensors %s/ckpt_whole.safetensors"):format(tmp, tmp))
  out, rc = sh(cmd)
  T.truthy(rc ~= 0 and out:find("holds checkpoints of an earlier run", 1, true) and
    out:find("--resume continues it", 1, true), out)
  out, rc = sh(cmd .. " --resume")
  T.eq(rc, 0, out)
  T.truthy(out:find("resumed from " .. tmp .. "/ckpt/checkpoints/ckpt-00000002 at step 2 of 3", 1, true), out)
  T.eq(#step_lines(tmp .. "/ckpt/train_log.jsonl"), 4, "3 steps, then the resumed run's one appended")
  T.truthy(T.slurp(tmp .. "/ckpt/model/model.safetensors") == T.slurp(tmp .. "/ckpt_whole.safetensors"),
    "the resumed run's model is the uninterrupted one's, byte for byte")
end)

T.test("malformed SQuAD entries (missing fields, offsets outside the context, empty contexts, non-string ids, " ..
  "wrong JSON types): located, skipped, counted; never a crash", function()
  local d = read_json(tmp .. "/v1_train.json")
  local p = d.data[1].paragraphs
  local nq = #p[1].qas + #p[2].qas + #p[3].qas
  local q1, q2, q3 = p[1].qas[1], p[1].qas[2], p[1].qas[3]
  q1.id = 12345                                                       -- non-string id
  q2.answers[1].answer_start = #p[1].context + 10                     -- offset outside the context
  q3.question = nil                                                   -- missing field
  p[1].qas[4].answers = { text = "x", answer_start = 0 }              -- an object, not an array
  p[1].qas[5].answers[1].answer_start = "3"                           -- not an integer
  p[2].context = "   "                                                -- empty context
  p[3].qas[1] = cjson.null                                            -- null question entry
  table.insert(d.data, 1, 3)                                          -- an article that is not an object
  table.insert(d.data, { title = "x", paragraphs = { context = "c" } }) -- paragraphs: an object
  write_json(tmp .. "/messy.json", d)
  -- the first article of the file is now 2: its paragraph 1 holds the broken questions
  local want = {
    "messy.json: article 1: no 'paragraphs' array (skipped)",
    "article 2 paragraph 1 question 1 (id 12345): 'id' is missing or not a string (skipped)",
    ("article 2 paragraph 1 question 2 (id %s): answer 1 at %d+"):format(q2.id, #p[1].context + 10),
    ("article 2 paragraph 1 question 3 (id %s): 'question' is missing or not a string (skipped)"):format(q3.id),
    ("article 2 paragraph 1 question 4 (id %s): 'answers' is not an array (skipped)"):format(p[1].qas[4].id),
    ("article 2 paragraph 1 question 5 (id %s): answer 1 has no integer 'answer_start'"):format(p[1].qas[5].id),
    ("article 2 paragraph 2: empty context, %d question(s) (skipped)"):format(#p[2].qas),
    "article 2 paragraph 3 question 1: not an object (skipped)",
    "article 3: no 'paragraphs' array (skipped)",
  }
  local function check(out, what)
    for _, w in ipairs(want) do T.truthy(out:find(w, 1, true), what .. ": missing '" .. w .. "' in:\n" .. out) end
  end
  -- training: the broken questions are skipped, the others train
  local out, rc = sh(("%s recipes/squad.lua --model=%s/init --train-file=%s/messy.json --do-train " ..
    "--output=%s/messy_t " ..
    "--batch=8 --max-steps=2 %s"):format(exe, tmp, tmp, tmp, common))
  T.eq(rc, 0, out)
  check(out, "train")
  T.truthy(out:find("outside the context (", 1, true), out)
  -- 6 broken questions + the empty paragraph's questions + 2 broken articles
  local skipped = 6 + #p[2].qas + 2
  T.truthy(out:find(("train: %d questions, %d examples, %d skipped"):format(nq, nq - 6 - #p[2].qas, skipped), 1, true),
    out)
  T.eq(#step_lines(tmp .. "/messy_t/train_log.jsonl"), 2)
  -- prediction: the same entries are located; the answer problems are warnings
  -- there (answers are not used to predict); the official evaluation refuses
  -- the malformed file with its location, after predictions.json is written
  out, rc = sh(("%s recipes/squad.lua --model=%s/init --predict-file=%s/messy.json --do-predict --output=%s/messy_p %s")
    :format(exe, tmp, tmp, tmp, common))
  T.eq(rc, 0, out)
  T.truthy(out:find("article 2 paragraph 1 question 1 (id 12345): 'id' is missing or not a string (skipped)", 1, true)
    and out:find("article 2 paragraph 2: empty context", 1, true) and out:find("article 3: no 'paragraphs' array", 1,
      true), out)
  T.truthy(out:find("squad: no evaluation: squad.evaluate: article 1 has no 'paragraphs' array", 1, true), out)
  local preds = read_json(tmp .. "/messy_p/predictions.json")
  T.eq(preds[q3.id], nil); T.truthy(type(preds[q2.id]) == "string",
    "a question with a bad answer offset is still answered")
  T.truthy(not io.open(tmp .. "/messy_p/eval_results.json"), "no evaluation written")
  -- predict.lua reads the same file the same way
  out, rc = sh(("%s recipes/predict.lua --model=%s/init --task=squad --input=%s/messy.json " ..
    "--output=%s/messy_pp.json %s")
    :format(exe, tmp, tmp, tmp, common:gsub("%-%-lr=%S+ ", "")))
  T.eq(rc, 0, out)
  T.truthy(out:find("article 2 paragraph 1 question 1 (id 12345): 'id' is missing or not a string (skipped)", 1, true)
    and out:find("predict: no evaluation", 1, true), out)
  -- only broken entries: a clear stop naming the counts
  write_json(tmp .. "/allbad.json", { version = "1.1", data = { 3, { paragraphs = { { context = "", qas = { { id = "a",
    question = "q" } } } } } } })
  out, rc = sh(("%s recipes/squad.lua --model=%s/init --train-file=%s/allbad.json --do-train --output=%s/allbad %s")
    :format(exe, tmp, tmp, tmp, common))
  T.eq(rc, 1, out)
  T.truthy(out:find("no usable training questions in " .. tmp .. "/allbad.json (1 questions, 2 entries skipped", 1,
    true), out)
end)

T.test("notebooks/squad.ipynb runs headless on the fine-tuned model", function()
  if select(2, sh("command -v jupyter")) ~= 0 then T.skip("jupyter (jupyter-nbconvert) not installed") end
  if not io.open(tmp .. "/run1/model/model.safetensors") then T.skip("needs the model of the v1.1 test") end
  local out, rc = sh(("BL_QA_MODEL=%s/run1/model BL_BERTLUA=%s BL_NB_OUT=%s/nb BL_HEAD=2 timeout 300 jupyter " ..
    "nbconvert --to notebook " ..
    "--execute notebooks/squad.ipynb --output-dir=%s/nb"):format(tmp, exe, tmp, tmp))
  T.eq(rc, 0, out)
  T.truthy(io.open(tmp .. "/nb/qa_attention.png") and io.open(tmp .. "/nb/qa_start_end.png"), "plots written")
  local page = io.open(tmp .. "/nb/qa_answers.html"):read("*a")
  local marks = 0
  for _ in page:gmatch("<mark") do marks = marks + 1 end
  T.eq(marks, 2, page)  -- one highlighted span per question
  local nb = read_json(tmp .. "/nb/squad.ipynb")
  for _, c in ipairs(nb.cells) do
    for _, o in ipairs(c.outputs or {}) do T.truthy(o.output_type ~= "error", cjson.encode(o)) end
  end
end)

T.test("bad input is reported before any work", function()
  local base = ("%s recipes/squad.lua %s"):format(exe, common)
  local out, rc = sh(("%s --model=%s/nope --predict-file=%s/v1.json --do-predict"):format(base, tmp, tmp))
  T.eq(rc, 1); T.truthy(out:find("model directory " .. tmp .. "/nope does not exist", 1, true), out)
  os.execute(("mkdir -p %s/novocab && cp %s/init/config.json %s/init/model.safetensors %s/novocab/"):format(tmp, tmp,
    tmp, tmp))
  out, rc = sh(("%s --model=%s/novocab --predict-file=%s/v1.json --do-predict"):format(base, tmp, tmp))
  T.eq(rc, 1); T.truthy(out:find("has no vocab.txt", 1, true) and out:find("--vocab=FILE", 1, true), out)
  out, rc = sh(("%s --model=%s/novocab --vocab=%s/missing.txt --predict-file=%s/v1.json --do-predict"):format(base, tmp,
    tmp, tmp))
  T.eq(rc, 1); T.truthy(out:find("missing.txt cannot be read", 1, true), out)
  -- a missing predict file stops a train+predict run before training
  out, rc = sh(("%s --model=%s/init --train-file=%s/v1_train.json --predict-file=%s/typo.json --do-train " ..
    "--do-predict --output=%s/bad1")
    :format(base, tmp, tmp, tmp, tmp))
  T.eq(rc, 1); T.truthy(out:find("--predict-file=" .. tmp .. "/typo.json cannot be read", 1, true), out)
  T.truthy(not io.open(tmp .. "/bad1/train_log.jsonl"), "nothing trained")
  out, rc = sh(("%s --model=%s/init --train-file=%s/v1_train.json --do-train --precision=half --output=%s/bad5")
    :format(base, tmp, tmp, tmp))
  T.eq(rc, 1); T.truthy(out:find("squad: --precision must be fp32, tf32, bf16 or fp16, got half", 1, true), out)
  T.truthy(not io.open(tmp .. "/bad5/train_log.jsonl"), "nothing trained")
  out, rc = sh(("%s --model=%s/init --train-file=%s/v1_train.json --do-train --batch=6 --micro-batch=4"):format(base,
    tmp, tmp))
  T.eq(rc, 1); T.truthy(out:find("not a multiple of --micro-batch", 1, true), out)
  -- training on questions with several answers: each one named, then a clear stop
  out, rc = sh(("%s --model=%s/init --train-file=%s/v1.json --do-train --output=%s/bad2"):format(base, tmp, tmp, tmp))
  T.eq(rc, 1)
  T.truthy(out:find("no usable training questions", 1, true) and out:find("question 1 (id " .. ids1[1], 1, true), out)
  -- malformed entries in the predict file: located, skipped, counted; the rest is predicted
  local d = read_json(tmp .. "/v1.json")
  local p = d.data[1].paragraphs
  p[1].qas[2].question = 7
  p[2].context = nil
  write_json(tmp .. "/broken.json", d)
  out, rc = sh(("%s --model=%s/init --predict-file=%s/broken.json --do-predict --output=%s/bad3"):format(base, tmp, tmp,
    tmp))
  T.eq(rc, 0, out)
  T.truthy(out:find("article 1 paragraph 1 question 2", 1, true) and out:find("article 1 paragraph 2", 1, true), out)
  local n2 = #p[2].qas
  T.truthy(out:find(("predict: %d questions, %d examples, %d skipped"):format(#ids1, #ids1 - 1 - n2, 1 + n2), 1, true),
    out)
  local preds = read_json(tmp .. "/bad3/predictions.json")
  T.eq(preds[p[1].qas[2].id], nil); T.truthy(preds[p[1].qas[1].id] ~= nil, "the good questions are answered")
  -- not JSON at all
  local f = io.open(tmp .. "/notjson.json", "w"); f:write("{\"data\": [ 1, 2"); f:close()
  out, rc = sh(("%s --model=%s/init --predict-file=%s/notjson.json --do-predict --output=%s/bad4"):format(base, tmp,
    tmp, tmp))
  T.eq(rc, 1); T.truthy(out:find("notjson.json", 1, true), out)
end)

T.run()
