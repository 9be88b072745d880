-- SQuAD v1.1 fine-tuning accuracy of bertlua against transformers on the same
-- data, used by test_finetune_accuracy.lua and for BENCHMARKS.md's accuracy
-- section:
--
--   build/bertlua tests/lua/squad_accuracy.lua --model=DIR --squad=dev-v1.1.json --out=runs/acc --seed=1
--
-- Splits --squad by article: the first --train-per-article questions (first
-- answer only, as run_squad.py trains) of articles 1..--train-articles, and
-- the first --eval-per-article questions (all answers) of the next
-- --eval-articles articles. bertlua trains and predicts with recipes/squad.lua.
-- transformers (tests/py/qa_finetune_reference.py finetune: BertForQuestionAnswering,
-- torch.optim.AdamW, get_linear_schedule_with_warmup, its own shuffle from
-- the seed) trains on the features bertlua makes and writes eval logits,
-- which go through the same post-processing and official metric here, so the
-- two F1s differ only by training. --only=native (or all) also runs
-- tests/py/qa_transformers_native.py: transformers with its own windows, head
-- initialisation and post-processing, as a transformers user runs it (issue 19's
-- reference). Prints one JSON line {bertlua=, transformers=, native=}.
package.path = "tests/lua/lib/?.lua;" .. package.path
local bl = require "bertlua"
local fs = require "bertlua.util.fs"
local real = require "real_model"
local options = require "bertlua.util.options"
local squad = require "bertlua.tasks.squad"
local Tok = require "bertlua.data.tokenizer"
local st = require "bertlua.io.safetensors"
local pretrained = require "bertlua.pretrained"
local cjson = require "cjson"

local opt = options.parse(arg, {
  { "model", nil, "model directory (config.json, model.safetensors, vocab.txt)" },
  { "squad", nil, "SQuAD v1.1 JSON to split" },
  { "out", "runs/squad_accuracy", "output directory" },
  { "train_articles", 40, "articles to train on" }, { "train_per_article", 25, "questions per training article" },
  { "eval_articles", 8, "articles to evaluate on (after the training ones)" },
  { "eval_per_article", 50, "questions per evaluation article" },
  { "max_seq_length", 192, "tokens per window" }, { "doc_stride", 96, "stride between windows" },
  { "lr", 1e-4, "peak learning rate" }, { "epochs", 2, "epochs" }, { "batch", 32, "batch" },
  { "warmup", 0.1, "warmup proportion" }, { "seed", 1, "seed (head init, order, dropout) for both" },
  { "threads", 2, "CPU threads for both" },
  { "bertlua_args", "", "extra recipes/squad.lua options" },
  { "ref_args", "--eps 1e-8 --clip 1.0", "qa_finetune_reference.py options (default: torch AdamW eps, clip 1)" },
  { "only", "both", "both (bertlua, transformers) | all (both, native) | bertlua | transformers | native" },
}, { name = "squad_accuracy" })
if not opt.model or not opt.squad then error("squad_accuracy: --model and --squad are required", 0) end
bl.set_num_threads(opt.threads)

local function sh(cmd)
  local ok = os.execute(cmd)
  if ok ~= 0 and ok ~= true then error("squad_accuracy: command failed: " .. cmd, 0) end
end
local write = fs.write_atomic
local function read(path) return fs.read_text(path, "squad_accuracy") end
sh("mkdir -p " .. opt.out .. "/bertlua " .. opt.out .. "/transformers")

-- the split
local data = squad.load_json(opt.squad)
local function take(first, count, per, first_only)
  local arts = {}
  for a = first, math.min(first + count - 1, #data.data) do
    local art, n = data.data[a], 0
    local paras = {}
    for _, p in ipairs(art.paragraphs) do
      local qas = {}
      for _, qa in ipairs(p.qas) do
        if n < per then
          n = n + 1
          qas[#qas + 1] = first_only and { id = qa.id, question = qa.question, answers = { qa.answers[1] } } or qa
        end
      end
      if #qas > 0 then paras[#paras + 1] = { context = p.context, qas = qas } end
    end
    arts[#arts + 1] = { title = art.title, paragraphs = paras }
  end
  if #arts < count then error(("squad_accuracy: %s has too few articles for the split"):format(opt.squad), 0) end
  return { version = data.version, data = arts }
end
local train_file, eval_file = opt.out .. "/train.json", opt.out .. "/eval.json"
write(train_file, cjson.encode(take(1, opt.train_articles, opt.train_per_article, true)))
write(eval_file, cjson.encode(take(opt.train_articles + 1, opt.eval_articles, opt.eval_per_article, false)))

local common = ("--max-seq-length=%d --doc-stride=%d --lr=%g --epochs=%d --batch=%d --warmup=%g --seed=%d --threads=%d")
  :format(opt.max_seq_length, opt.doc_stride, opt.lr, opt.epochs, opt.batch, opt.warmup, opt.seed, opt.threads)
local result = {}
local exe = arg[-1] or "bertlua"
local py = os.getenv("BL_PYTHON") or "/usr/bin/python3"
local function runs(side) return opt.only == side or opt.only == "all" or (opt.only == "both" and side ~= "native") end

if runs("bertlua") then
  sh(("%s recipes/squad.lua --model=%s --train-file=%s --predict-file=%s --output=%s/bertlua --do-train " ..
    "--do-predict %s %s > %s/bertlua/log.txt 2>&1"):format(exe, opt.model, train_file, eval_file, opt.out, common,
    opt.bertlua_args, opt.out))
  local r = cjson.decode(read(opt.out .. "/bertlua/eval_results.json"))
  result.bertlua = { exact_match = r.exact_match, f1 = r.f1 }
end

local function dump(feats, path, labels)
  local all = {}
  for i = 1, #feats do all[i] = i end
  st.save(path, real.qa_tensors(feats, all, opt.max_seq_length, labels))
end

if runs("transformers") then
  local dir = opt.out .. "/transformers"
  local tok = Tok.load(opt.model .. "/vocab.txt", { lower = true })
  local fo = { max_seq_length = opt.max_seq_length, doc_stride = opt.doc_stride, max_query_length = 64 }
  local train_ex = squad.read_examples(train_file, { is_training = true })
  fo.is_training = true
  dump(squad.convert_examples_to_features(train_ex, tok, fo), dir .. "/features.safetensors", true)
  local eval_ex = squad.read_examples(eval_file, { is_training = false })
  fo.is_training = false
  local eval_feats = squad.convert_examples_to_features(eval_ex, tok, fo)
  dump(eval_feats, dir .. "/eval_features.safetensors", false)
  -- the head starts as the recipe's does for this seed (a fresh normal(0, 0.02) either way)
  local m = pretrained.from_pretrained(opt.model, { head = "qa", seed = opt.seed, quiet = true })
  st.save(dir .. "/head.safetensors",
    { ["qa_outputs.weight"] = m.qa_outputs.weight, ["qa_outputs.bias"] = m.qa_outputs.bias })
  local drop = cjson.decode(read(opt.model .. "/config.json")).hidden_dropout_prob or 0.1
  sh(("HF_HUB_OFFLINE=1 %s tests/py/qa_finetune_reference.py finetune %s %s --lr %g --epochs %d --batch %d " ..
    "--warmup %g --seed %d --threads %d --dropout %g %s > %s/log.txt 2>&1"):format(py, dir, opt.model, opt.lr,
    opt.epochs, opt.batch,
    opt.warmup, opt.seed, opt.threads, drop, opt.ref_args, dir))
  local results = real.ref_results(dir .. "/ref_logits.safetensors", eval_feats)
  squad.write_predictions(eval_ex, eval_feats, results, { tokenizer = tok, output_dir = dir })
  local r = squad.evaluate(squad.load_json(eval_file), cjson.decode(read(dir .. "/predictions.json")))
  result.transformers = { exact_match = r.exact_match, f1 = r.f1 }
end
if runs("native") then
  local dir = opt.out .. "/native"
  sh(("mkdir -p %s && HF_HUB_OFFLINE=1 %s tests/py/qa_transformers_native.py %s %s %s %s --max-seq-length %d " ..
    "--doc-stride %d --lr %g --epochs %d --batch %d --warmup %g --seed %d --threads %d > %s/log.txt 2>&1")
    :format(dir, py, train_file, eval_file, opt.model, dir, opt.max_seq_length, opt.doc_stride, opt.lr, opt.epochs,
      opt.batch, opt.warmup, opt.seed, opt.threads, dir))
  local r = cjson.decode(read(dir .. "/eval_results.json"))
  result.native = { exact_match = r.exact_match, f1 = r.f1 }
end
result.seed = opt.seed
print(cjson.encode(result))
