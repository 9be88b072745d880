-- Downstream worth of the models tools/pretrain_curves.lua pre-trained: every phase-2 model of both sides (each seed)
-- and the randomly initialised model they all started from are fine-tuned the same way (bertlua's recipes, the
-- same hyperparameters and fine-tuning seed) on
--   sst2:  GLUE SST-2 dev rows 1..--sst2-train (train), the rest (evaluation): accuracy
--   squad: SQuAD v1.1 dev, the first --squad-train-per questions (first answer) of articles 1..--squad-train-articles
--          (train), the first --squad-eval-per questions (all answers) of the next --squad-eval-articles: F1
-- and the scores go to CURVES/downstream.json (read by notebooks/pretraining_vs_reference.ipynb):
--
--   nice -n 19 bertlua tools/pretrain_downstream.lua --curves=runs/pretrain_curves [--tasks=sst2,squad]
--
-- Each fine-tuning is skipped when its eval_results.json is already in CURVES/downstream/, so the table can be
-- rebuilt as seeds are added.
local options = require "bertlua.util.options"
local shell = require "bertlua.util.shell"
local fs = require "bertlua.util.fs"
local squad = require "bertlua.tasks.squad"
local cjson = require "cjson"
local list_stats = require("bertlua.util.list").stats

local opt = options.parse(arg, {
  { "curves", "runs/pretrain_curves", "tools/pretrain_curves.lua's --output (seedS/{init,bertlua,reference})" },
  { "shared_data", "../shared/data", "holds glue/SST-2/dev.tsv, squad/dev-v1.1.json and vocab/" },
  { "vocab", nil, "vocab.txt of the models (default: SHARED_DATA/vocab/bert-base-uncased-vocab.txt)" },
  { "tasks", "sst2,squad", "sst2 and/or squad" },
  { "ft_seed", 1, "fine-tuning seed (head initialisation, order, dropout), the same for every model", int = true,
    min = 0 },
  { "threads", 1, "CPU threads of each fine-tuning", int = true, min = 1 },
  { "batch", 32, "sequences per fine-tuning step", int = true, min = 1 },
  { "sst2_train", 600, "SST-2 dev rows to train on (the rest are evaluated)", int = true, min = 1 },
  { "sst2_lr", 1e-4, "SST-2 peak learning rate", min = 0, above = true },
  { "sst2_epochs", 3, "SST-2 epochs", min = 0, above = true },
  { "squad_train_articles", 40, "SQuAD articles to train on", int = true, min = 1 },
  { "squad_train_per", 25, "questions per training article", int = true, min = 1 },
  { "squad_eval_articles", 8, "SQuAD articles to evaluate on (after the training ones)", int = true, min = 1 },
  { "squad_eval_per", 50, "questions per evaluation article", int = true, min = 1 },
  { "squad_lr", 1e-4, "SQuAD peak learning rate", min = 0, above = true },
  { "squad_epochs", 2, "SQuAD epochs", min = 0, above = true },
}, { name = "pretrain_downstream",
  usage = "usage: bertlua tools/pretrain_downstream.lua --curves=DIR [--tasks=sst2,squad] [options]" })
local root = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/.."
local exe = fs.host()
local vocab = opt.vocab or (opt.shared_data .. "/vocab/bert-base-uncased-vocab.txt")
local function fail(msg) error("pretrain_downstream: " .. msg, 0) end
local function say(...) print(...); io.stdout:flush() end
fs.check_input(vocab, "--vocab")
if not fs.is_dir(opt.curves) then
  fail("--curves=" .. opt.curves .. ": no such directory (run tools/pretrain_curves.lua first)")
end
local tasks = {}
for w in opt.tasks:gmatch("[^,%s]+") do
  if w ~= "sst2" and w ~= "squad" then fail("--tasks: sst2 and/or squad, got '" .. w .. "'") end
  tasks[#tasks + 1] = w
end

-- the models: every seed's phase-2 model of each side, and the initial weights (random, shared by every run)
local models = {}
local seeds = {}
for _, name in ipairs(fs.list_dir(opt.curves, nil, "all") or {}) do
  local s = tonumber(name:match("^seed(%d+)$"))
  if s then seeds[#seeds + 1] = s end
end
table.sort(seeds)
for _, s in ipairs(seeds) do
  for _, side in ipairs { "bertlua", "reference" } do
    local dir = ("%s/seed%d/%s/phase2"):format(opt.curves, s, side)
    if fs.exists(dir .. "/model.safetensors") then
      models[#models + 1] = { name = ("%s_seed%d"):format(side, s), side = side, seed = s, dir = dir }
    end
  end
end
-- the random models: each distinct initial weights (one when every run started from the same, --init-seed)
local inits = {}
for _, s in ipairs(seeds) do
  local dir = ("%s/seed%d/init"):format(opt.curves, s)
  if fs.exists(dir .. "/model.safetensors") then
    local bytes, seen = fs.read(dir .. "/model.safetensors"), false
    for _, other in ipairs(inits) do seen = seen or other.bytes == bytes end
    if not seen then inits[#inits + 1] = { seed = s, dir = dir, bytes = bytes } end
  end
end
if #inits == 0 then
  fail(opt.curves .. ": no seedS/init/model.safetensors (the initial weights pretrain_curves makes)")
end
for _, i in ipairs(inits) do
  models[#models + 1] = { name = #inits == 1 and "random_init" or ("random_init_seed%d"):format(i.seed),
    side = "random init", seed = i.seed, dir = i.dir }
  i.bytes = nil
end
if #models == #inits then fail(opt.curves .. ": no phase-2 model of any seed yet") end

-- the splits, written once
local D = fs.mkdir_p(opt.curves .. "/downstream")
local split = {}
local function sst2_split()
  local path = opt.shared_data .. "/glue/SST-2/dev.tsv"
  fs.check_input(path, "SST-2 dev.tsv")
  local lines = {}
  for line in fs.read_text(path, "pretrain_downstream"):gmatch("[^\n]+") do lines[#lines + 1] = line end
  if #lines <= opt.sst2_train + 1 then fail(("%s: %d rows, fewer than --sst2-train=%d plus some to evaluate")
    :format(path, #lines - 1, opt.sst2_train)) end
  local train, eval = { lines[1] }, { lines[1] }
  for i = 2, #lines do
    local t = i - 1 <= opt.sst2_train and train or eval
    t[#t + 1] = lines[i]
  end
  fs.write_atomic(D .. "/sst2_train.tsv", table.concat(train, "\n") .. "\n")
  fs.write_atomic(D .. "/sst2_eval.tsv", table.concat(eval, "\n") .. "\n")
  split.sst2 = { train = #train - 1, eval = #eval - 1 }
end
local function squad_split()
  local path = opt.shared_data .. "/squad/dev-v1.1.json"
  fs.check_input(path, "SQuAD dev-v1.1.json")
  local data = squad.load_json(path)
  local function take(first, count, per, first_answer_only)
    local arts, n = {}, 0
    for a = first, math.min(first + count - 1, #data.data) do
      local art = data.data[a]
      local paras, left = {}, per
      for _, p in ipairs(art.paragraphs) do
        local qas = {}
        for _, qa in ipairs(p.qas) do
          if left > 0 then
            qas[#qas + 1] = first_answer_only and { id = qa.id, question = qa.question, answers = { qa.answers[1] } }
              or qa
            left = left - 1
          end
        end
        if #qas > 0 then paras[#paras + 1] = { context = p.context, qas = qas } end
      end
      n = n + per - left
      arts[#arts + 1] = { title = art.title, paragraphs = paras }
    end
    return { version = "1.1", data = arts }, n
  end
  local train, ntrain = take(1, opt.squad_train_articles, opt.squad_train_per, true)
  local eval, neval = take(opt.squad_train_articles + 1, opt.squad_eval_articles, opt.squad_eval_per, false)
  if neval == 0 then fail(path .. ": no articles left to evaluate after the training ones") end
  fs.write_atomic(D .. "/squad_train.json", cjson.encode(train))
  fs.write_atomic(D .. "/squad_eval.json", cjson.encode(eval))
  split.squad = { train = ntrain, eval = neval }
end

local function finetune(m, task)
  local dir = ("%s/%s/%s"):format(D, m.name, task)
  local results = dir .. "/eval_results.json"
  if not fs.exists(results) then
    fs.remove_tree(dir)
    local common = { "--model=" .. m.dir, "--vocab=" .. vocab, "--output=" .. dir, "--do-train",
      "--seed=" .. opt.ft_seed, "--threads=" .. opt.threads, "--batch=" .. opt.batch }
    local argv
    if task == "sst2" then
      argv = { exe, root .. "/recipes/glue.lua", "--task=sst2", "--train-file=" .. D .. "/sst2_train.tsv",
        "--eval-file=" .. D .. "/sst2_eval.tsv", "--do-eval", "--max-seq-length=64", "--lr=" .. opt.sst2_lr,
        "--epochs=" .. opt.sst2_epochs }
    else
      argv = { exe, root .. "/recipes/squad.lua", "--train-file=" .. D .. "/squad_train.json",
        "--predict-file=" .. D .. "/squad_eval.json", "--do-predict", "--max-seq-length=192", "--doc-stride=96",
        "--lr=" .. opt.squad_lr, "--epochs=" .. opt.squad_epochs }
    end
    for _, a in ipairs(common) do argv[#argv + 1] = a end
    fs.mkdir_p(dir)
    say(("%s %s: %s"):format(m.name, task, shell.command(argv)))
    local ok, code = shell.run(argv, { stdout = dir .. ".log", stderr = "stdout" })
    if not ok then fail(("%s on %s failed (exit code %s); see %s.log"):format(task, m.name, tostring(code), dir)) end
  end
  local r = cjson.decode(fs.read_text(results, "pretrain_downstream"))
  return task == "sst2" and 100 * r.acc or r.f1
end

for _, task in ipairs(tasks) do (task == "sst2" and sst2_split or squad_split)() end
local rows, by = {}, {}
for _, task in ipairs(tasks) do
  for _, m in ipairs(models) do
    local v = finetune(m, task)
    rows[#rows + 1] = { task = task, model = m.name, side = m.side, seed = m.seed, score = v }
    by[task] = by[task] or {}
    by[task][m.side] = by[task][m.side] or {}
    table.insert(by[task][m.side], v)
  end
end
-- per task and side: mean, sd, min, max; the margin pre-training buys over the random model
local summary = {}
for _, task in ipairs(tasks) do
  local t = { metric = task == "sst2" and "accuracy %" or "F1", split = split[task] }
  for side, vs in pairs(by[task]) do t[side] = list_stats(vs) end
  local rnd = t["random init"].mean
  for _, side in ipairs { "bertlua", "reference" } do
    if t[side] then t[side].over_random = t[side].mean - rnd end
  end
  summary[task] = t
end
fs.write_atomic(opt.curves .. "/downstream.json", cjson.encode({ rows = rows, summary = summary,
  settings = { ft_seed = opt.ft_seed, sst2_lr = opt.sst2_lr, sst2_epochs = opt.sst2_epochs, squad_lr = opt.squad_lr,
    squad_epochs = opt.squad_epochs } }))
for _, task in ipairs(tasks) do
  local t = summary[task]
  local line = ("%s (%s; train %d, eval %d):"):format(task, t.metric, t.split.train, t.split.eval)
  for _, side in ipairs { "bertlua", "reference", "random init" } do
    local s = t[side]
    if s then line = line .. ("  %s %.2f (%.2f..%.2f, n=%d)"):format(side, s.mean, s.min, s.max, s.n) end
  end
  say(line)
end
say("wrote " .. opt.curves .. "/downstream.json")
