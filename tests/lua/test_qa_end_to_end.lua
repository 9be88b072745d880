-- recipes/squad.lua on the generated QA set: a tiny BERT trained from scratch
-- must beat a trivial baseline clearly on held-out countries; the files the
-- official tools read are written; bad input is reported.
local T = require "testing"
local cjson = require "cjson"
local syn = require "bertlua.data.synthetic"
local squad = require "bertlua.tasks.squad"

local exe = (os.getenv("BL_BUILD_DIR") or "build") .. "/bertlua"
local tmp = os.tmpname(); os.remove(tmp)
os.execute("mkdir -p " .. tmp)
T.at_exit(function() os.execute("rm -rf " .. tmp) end)
local function sh(cmd)
  local f = io.popen(cmd .. " 2>&1; echo rc=$?")
  local out = f:read("*a"); f:close()
  return out, tonumber(out:match("rc=(%d+)%s*$"))
end

local world = syn.world{ seed = 11, countries = 80 }
syn.write_squad(world, tmp .. "/train.json", { split = "train" })
syn.write_squad(world, tmp .. "/dev.json", { split = "dev" })
syn.write_corpus(world, tmp .. "/corpus", { copies = 1 })
assert(select(2, sh(("%s recipes/build_vocab.lua --input=%s/corpus --output=%s/vocab.txt --size=500"):format(exe, tmp,
  tmp))) == 0)
-- a fresh tiny model directory
local bert = require "bertlua.bert"
local pretrained = require "bertlua.pretrained"
local n = 0
for _ in io.lines(tmp .. "/vocab.txt") do n = n + 1 end
local m = bert.BertForQuestionAnswering({ vocab_size = n, hidden_size = 64, num_hidden_layers = 2,
  num_attention_heads = 2,
  intermediate_size = 128, max_position_embeddings = 128 }, { seed = 3 })
pretrained.save_pretrained(m, tmp .. "/init", { vocab = tmp .. "/vocab.txt" })

T.test("fine-tuning beats a trivial baseline on held-out questions", function()
  local out, rc = sh(("%s recipes/squad.lua --model=%s/init --train-file=%s/train.json --predict-file=%s/dev.json " ..
    "--output=%s/run " ..
    "--do-train --do-predict --max-seq-length=128 --doc-stride=64 --max-query-length=24 --batch=16 --lr=2e-3 " ..
      "--epochs=%d --seed=1 --threads=2")
    :format(exe, tmp, tmp, tmp, tmp, T.sanitized() and 1 or 8))
  T.eq(rc, 0, out)
  T.truthy(io.open(tmp .. "/run/nbest_predictions.json"), "n-best file written")
  T.truthy(io.open(tmp .. "/run/model/model.safetensors"), "fine-tuned model saved")
  if T.sanitized() then T.skip("sanitizer build: one epoch as a smoke run; the Release build checks the F1") end
  local dev = squad.load_json(tmp .. "/dev.json")
  local preds = cjson.decode(io.open(tmp .. "/run/predictions.json"):read("*a"))
  local score = squad.evaluate(dev, preds)
  local base = {}
  for _, art in ipairs(dev.data) do
    for _, p in ipairs(art.paragraphs) do
      for _, qa in ipairs(p.qas) do base[qa.id] = p.context:match("^(%S+)") end
    end
  end
  local b = squad.evaluate(dev, base)
  T.truthy(score.f1 > b.f1 + 10, ("F1 %.1f vs baseline %.1f"):format(score.f1, b.f1))
  local ev, rc2 = sh(("%s recipes/squad_eval.lua %s/dev.json %s/run/predictions.json"):format(exe, tmp, tmp))
  T.eq(rc2, 0, ev)
  T.truthy(ev:find(('"f1": %.6f'):format(score.f1):sub(1, 12), 1, true), ev)
end)

T.test("the SQuAD notebook highlights answers and plots a head's attention", function()
  local _, has = sh("command -v jupyter")
  if has ~= 0 then T.skip("jupyter (jupyter-nbconvert) not installed") end
  if not io.open(tmp
    .. "/run/model/model.safetensors") then T.skip("needs the fine-tuned model of the previous test") end
  local out, rc = sh(("BL_QA_MODEL=%s/run/model BL_BERTLUA=%s BL_NB_OUT=%s/nb jupyter nbconvert --to notebook " ..
    "--execute notebooks/squad.ipynb --output-dir=%s/nb")
    :format(tmp, exe, tmp, tmp))
  T.eq(rc, 0, out)
  T.truthy(io.open(tmp .. "/nb/qa_attention.png"), "heatmap written")
  local page = io.open(tmp .. "/nb/qa_answers.html"):read("*a")
  T.truthy(page:find("<mark", 1, true), "an answer span is highlighted")
end)

T.test("bad input: missing model, malformed JSON, no task", function()
  local out, rc = sh(("%s recipes/squad.lua --model=%s/nope --predict-file=%s/dev.json --do-predict"):format(exe, tmp,
    tmp))
  T.eq(rc, 1); T.truthy(out:find("nope", 1, true), out)
  local f = io.open(tmp .. "/bad.json", "w")
  f:write("{\"data\": [ {\"title\": 1, \"paragraphs\": [ {\"context\": 5} ] } ] }"); f:close()
  out, rc = sh(("%s recipes/squad.lua --model=%s/init --predict-file=%s/bad.json --do-predict --output=%s/bad")
    :format(exe, tmp, tmp, tmp))
  T.truthy(rc ~= 0 and out:find("bad.json", 1, true), out)
  out, rc = sh(("%s recipes/squad.lua --model=%s/init"):format(exe, tmp))
  T.eq(rc, 1); T.truthy(out:find("nothing to do", 1, true), out)
end)

T.run()
