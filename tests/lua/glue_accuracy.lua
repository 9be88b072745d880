-- GLUE fine-tuning accuracy of bertlua against transformers on the same data,
-- the twin of squad_accuracy.lua, for BENCHMARKS.md's accuracy section:
--
--   build/bertlua tests/lua/glue_accuracy.lua --model=DIR --task=sst2 --tsv=glue/SST-2/dev.tsv --out=runs/g --seed=1
--
-- Splits --tsv (a GLUE dev file with labels) by rows: the first --train-rows
-- train, the rest are evaluated. bertlua trains and evaluates with
-- recipes/glue.lua. transformers (tests/py/cls_finetune_reference.py:
-- BertForSequenceClassification, torch.optim.AdamW, clip_grad_norm_,
-- get_linear_schedule_with_warmup, its own shuffle from the seed) trains on
-- the token ids bertlua makes from the same initial classifier; its eval
-- logits are scored here with the same metric. Prints one JSON line.
local bl = require "bertlua"
local fs = require "bertlua.util.fs"
local options = require "bertlua.util.options"
local glue = require "bertlua.tasks.glue"
local metrics = require "bertlua.tasks.metrics"
local Tok = require "bertlua.data.tokenizer"
local st = require "bertlua.io.safetensors"
local bert = require "bertlua.bert"
local pretrained = require "bertlua.pretrained"
local batched = require "bertlua.batched"
local cjson = require "cjson"

local opt = options.parse(arg, {
  { "model", nil, "model directory (config.json, model.safetensors, vocab.txt)" },
  { "task", "sst2", "GLUE classification task of --tsv" },
  { "tsv", nil, "GLUE TSV with labels (header line first) to split" },
  { "out", "runs/glue_accuracy", "output directory" },
  { "train_rows", 600, "rows to train on (the rest are evaluated)", int = true, min = 1 },
  { "max_seq_length", 128, "tokens per sequence" }, { "lr", 5e-5, "peak learning rate" },
  { "epochs", 3, "epochs" }, { "batch", 32, "batch" }, { "warmup", 0.1, "warmup proportion" },
  { "seed", 1, "seed (head init, order, dropout) for both" }, { "threads", 2, "CPU threads for both" },
  { "bertlua_args", "", "extra recipes/glue.lua options" },
  { "ref_args", "--eps 1e-8 --clip 1.0", "cls_finetune_reference.py options (default: torch AdamW eps, clip 1)" },
  { "only", "both", "both | bertlua | transformers" },
}, { name = "glue_accuracy" })
if not opt.model or not opt.tsv then error("glue_accuracy: --model and --tsv are required", 0) end
if glue.is_regression(opt.task) then error("glue_accuracy: " .. opt.task .. " is a regression task", 0) end
bl.set_num_threads(opt.threads)

local function sh(cmd)
  local ok = os.execute(cmd)
  if ok ~= 0 and ok ~= true then error("glue_accuracy: command failed: " .. cmd, 0) end
end
local write = fs.write_atomic
local function read(path) return fs.read_text(path, "glue_accuracy") end
sh("mkdir -p " .. opt.out .. "/bertlua " .. opt.out .. "/transformers")

-- the split: the header line on both halves
local lines = {}
for l in io.lines(opt.tsv) do lines[#lines + 1] = l end
if #lines < opt.train_rows + 2 then
  error(("glue_accuracy: %s has %d rows, fewer than --train-rows=%d + 1"):format(opt.tsv, #lines - 1,
    opt.train_rows), 0)
end
local train_file, eval_file = opt.out .. "/train.tsv", opt.out .. "/eval.tsv"
write(train_file, table.concat(lines, "\n", 1, opt.train_rows + 1) .. "\n")
write(eval_file, lines[1] .. "\n" .. table.concat(lines, "\n", opt.train_rows + 2) .. "\n")

local common = ("--max-seq-length=%d --lr=%g --epochs=%d --batch=%d --warmup=%g --seed=%d --threads=%d")
  :format(opt.max_seq_length, opt.lr, opt.epochs, opt.batch, opt.warmup, opt.seed, opt.threads)
local result = { task = opt.task, seed = opt.seed }
local exe = arg[-1] or "bertlua"

if opt.only ~= "transformers" then
  sh(("%s recipes/glue.lua --task=%s --model=%s --train-file=%s --eval-file=%s --output=%s/bertlua --do-train " ..
    "--do-eval %s %s > %s/bertlua/log.txt 2>&1"):format(exe, opt.task, opt.model, train_file, eval_file, opt.out,
    common, opt.bertlua_args, opt.out))
  result.bertlua = cjson.decode(read(opt.out .. "/bertlua/eval_results.json"))
end

-- rows as recipes/glue.lua makes them: [CLS] a [SEP] (b [SEP]), truncated longest-first
local tok = Tok.load(opt.model .. "/vocab.txt", { lower = true })
local function rows_of(file)
  local ex = glue.read_examples(opt.task, file)
  local rows = {}
  for i, e in ipairs(ex) do
    local toks, types = bert.pair(tok:tokenize(e.text_a), e.text_b and tok:tokenize(e.text_b) or nil,
      opt.max_seq_length)
    rows[i] = { ids = tok:convert_tokens_to_ids(toks), types = types, label = glue.label_id(opt.task, e.label) }
  end
  return rows
end
local function dump(rows, path, labels)
  local t = batched.pad_rows(rows, opt.max_seq_length)
  if labels then
    t.labels = bl.zeros({ #rows }, { dtype = "i32" })
    for i, r in ipairs(rows) do t.labels:ptr()[i - 1] = r.label end
  end
  st.save(path, t)
end

if opt.only ~= "bertlua" then
  local dir = opt.out .. "/transformers"
  local num_labels = glue.num_labels(opt.task)
  dump(rows_of(train_file), dir .. "/features.safetensors", true)
  local eval_rows = rows_of(eval_file)
  dump(eval_rows, dir .. "/eval_features.safetensors", false)
  -- the classifier starts as the recipe's does for this seed
  local m = pretrained.from_pretrained(opt.model, { head = "classification", num_labels = num_labels, seed = opt.seed,
    quiet = true })
  st.save(dir .. "/head.safetensors",
    { ["classifier.weight"] = m.classifier.weight, ["classifier.bias"] = m.classifier.bias })
  local py = os.getenv("BL_PYTHON") or "/usr/bin/python3"
  local drop = cjson.decode(read(opt.model .. "/config.json")).hidden_dropout_prob or 0.1
  sh(("HF_HUB_OFFLINE=1 %s tests/py/cls_finetune_reference.py %s %s --num-labels %d --lr %g --epochs %d " ..
    "--batch %d --warmup %g --seed %d --threads %d --dropout %g %s > %s/log.txt 2>&1"):format(py, dir, opt.model,
    num_labels, opt.lr, opt.epochs, opt.batch, opt.warmup, opt.seed, opt.threads, drop, opt.ref_args, dir))
  local lg = st.load(dir .. "/ref_logits.safetensors").logits:totable()
  local preds, gold = {}, {}
  for i, r in ipairs(eval_rows) do
    local best, bi = -math.huge, 0
    for c = 1, num_labels do
      local v = lg[(i - 1) * num_labels + c]
      if v > best then best, bi = v, c - 1 end
    end
    preds[i], gold[i] = bi, r.label
  end
  result.transformers = metrics.glue(opt.task, preds, gold)
end
print(cjson.encode(result))
