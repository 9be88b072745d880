-- SQuAD v1.1 fine-tuning accuracy of bertlua against transformers on the same
-- data, over several seeds, for BENCHMARKS.md's accuracy section and
-- test_squad_seeds.lua:
--
--   nice -n 10 build/bertlua tests/lua/squad_accuracy.lua --model=DIR --squad=dev-v1.1.json --out=runs/acc
--
-- Splits --squad by article: the first --train-per-article questions (0: all;
-- first answer only, as run_squad.py trains) of articles 1..--train-articles,
-- and the first --eval-per-article questions (0: all; all answers) of the
-- next --eval-articles articles. The defaults (all 8,981 questions of
-- articles 1-40 for training, 3 epochs; the 1,589 of articles 41-48 for
-- evaluation) train long enough for the seed spread to be small; the
-- 1,000-question split (--train-per-article=25 --eval-per-article=50
-- --epochs=2) is not: a reseed moves its F1 by up to 11 points.
--
-- Each seed of --seeds runs each side of --sides into OUT/seed<N>/<side>:
--   bertlua       recipes/squad.lua trains and predicts (n-best search), then
--                 predicts again with --span-search=exhaustive from the saved model;
--   transformers  tests/py/qa_finetune_reference.py finetune (BertForQuestionAnswering,
--                 torch AdamW, get_linear_schedule_with_warmup, its own shuffle from
--                 the seed) on the features bertlua makes; its eval logits go
--                 through bertlua's post-processing here, so it differs from
--                 bertlua only by training;
--   native        tests/py/qa_transformers_native.py: transformers with its own
--                 windows, head initialisation and post-processing (run_qa.py's),
--                 as a transformers user runs it.
-- Every side reports both span searches (n-best 20: the --n-best best starts x
-- ends of each window; exhaustive: every valid span) with the official v1.1
-- metric and the number of questions left without a valid span ("empty").
-- A run whose OUT/seed<N>/<side>/eval_results.json exists is done and skipped,
-- so an interrupted sweep resumes, and a run interrupted while training goes on
-- from its last checkpoint (every 50 steps: bertlua's --save-steps/--resume, the
-- native script's resume.pt); OUT keeps the settings it was made with and
-- refuses others. Children inherit the caller's nice level. At the end
-- OUT/summary.json and OUT/summary.md hold every run, each side's mean ± sd
-- and range, and whether bertlua's mean lies inside each other side's range.
package.path = "tests/lua/lib/?.lua;" .. package.path
local fs = require "bertlua.util.fs"
local options = require "bertlua.util.options"
local squad = require "bertlua.tasks.squad"
local ft = require "bertlua.tasks.common"
local cjson = require "cjson"

local SIDES = { "bertlua", "transformers", "native" }
local SEARCHES = { "nbest", "exhaustive" }
local opt = options.parse(arg, {
  { "model", nil, "model directory (config.json, model.safetensors, vocab.txt)" },
  { "squad", nil, "SQuAD v1.1 JSON to split" },
  { "out", "runs/squad_accuracy", "output directory (resumed when it holds runs of the same settings)" },
  { "train_articles", 40, "articles to train on", int = true, min = 1 },
  { "train_per_article", 0, "questions per training article (0: all)", int = true, min = 0 },
  { "eval_articles", 8, "articles to evaluate on (after the training ones)", int = true, min = 1 },
  { "eval_per_article", 0, "questions per evaluation article (0: all)", int = true, min = 0 },
  { "max_seq_length", 192, "tokens per window", int = true, min = 8 },
  { "doc_stride", 96, "stride between windows", int = true, min = 1 },
  { "lr", 1e-4, "peak learning rate", min = 0, above = true }, { "epochs", 3, "epochs", int = true, min = 1 },
  { "batch", 32, "batch", int = true, min = 1 }, { "warmup", 0.1, "warmup proportion", min = 0, max = 1 },
  { "n_best", 20, "starts and ends of the n-best span search", int = true, min = 1 },
  { "max_answer_length", 30, "longest answer in tokens", int = true, min = 1 },
  { "seeds", "1,2,3", "seeds (head init, order, dropout), comma-separated; each runs every side" },
  { "sides", "bertlua,native", "comma-separated: bertlua, transformers (on bertlua's features), native" },
  { "threads", 2, "CPU threads for every run" },
  { "bertlua_args", "", "extra recipes/squad.lua options" },
  { "ref_args", "--eps 1e-8 --clip 1.0 --micro-batch 8",
    "qa_finetune_reference.py options (default: torch AdamW eps, clip 1, batches accumulated 8 sequences at a time)" },
}, { name = "squad_accuracy" })

ft.line_buffered()
local function fail(fmt, ...) error("squad_accuracy: " .. fmt:format(...), 0) end

-- the lists, checked before any work
local seeds, sides = {}, {}
for s in (opt.seeds .. ","):gmatch("([^,]*),") do
  local n = s:match("^%s*(%d+)%s*$")
  if not n or #n > 15 then fail("--seeds must be integers >= 0 separated by commas, got '%s'", opt.seeds) end
  for _, t in ipairs(seeds) do if t == tonumber(n) then fail("--seeds lists %s twice", n) end end
  seeds[#seeds + 1] = tonumber(n)
end
local want = {}
for s in (opt.sides .. ","):gmatch("([^,]*),") do
  s = s:match("^%s*(.-)%s*$")
  local known = false
  for _, k in ipairs(SIDES) do known = known or k == s end
  if not known then fail("--sides: unknown side '%s' (bertlua, transformers, native)", s) end
  if want[s] then fail("--sides lists %s twice", s) end
  want[s] = true
end
for _, k in ipairs(SIDES) do if want[k] then sides[#sides + 1] = k end end
if not opt.model then fail("--model=DIR is required") end
if not opt.squad then fail("--squad=FILE is required (SQuAD v1.1 JSON, e.g. dev-v1.1.json)") end
local vocab = ft.model_dir("squad_accuracy", opt.model)
ft.input_file("squad_accuracy", opt.squad, "--squad")
if opt.doc_stride >= opt.max_seq_length then fail("--doc-stride must be below --max-seq-length") end
local exe = arg[-1] or "bertlua"
local py = os.getenv("BL_PYTHON") or "/usr/bin/python3"
local stack  -- the transformers sides' versions, for the summary
if want.transformers or want.native then
  local p = io.popen(py .. [[ -c "import torch, transformers, safetensors; ]]
    .. [[print('torch %s, transformers %s' % (torch.__version__, transformers.__version__))" 2>&1]])
  local msg = p:read("*a"); p:close()
  stack = msg:match("^(torch [^\n]*, transformers [^\n]*)\n?$")
  if not stack then
    fail("%s cannot import torch/transformers/safetensors (set BL_PYTHON): %s", py, msg:match("([^\n]*)\n*$"))
  end
  stack = stack .. " (" .. py .. ")"
end

local q = require("bertlua.util.shell").quote   -- one shell word; --bertlua-args/--ref-args stay split
local function sh(cmd, what, log)
  local ok = os.execute(cmd)
  if ok ~= 0 and ok ~= true then fail("%s failed: see %s", what, log) end
end
local function read_json(path) return cjson.decode(fs.read_text(path, "squad_accuracy")) end

-- OUT belongs to one set of settings (those that change a result)
local settings = {}
for _, k in ipairs { "train_articles", "train_per_article", "eval_articles", "eval_per_article", "max_seq_length",
  "doc_stride", "lr", "epochs", "batch", "warmup", "n_best", "max_answer_length", "bertlua_args", "ref_args" } do
  settings[k] = opt[k]
end
settings.model, settings.squad = fs.realpath(opt.model), fs.realpath(opt.squad)
fs.mkdir_p(opt.out)
local settings_file = opt.out .. "/settings.json"
if fs.exists(settings_file) then
  local old = read_json(settings_file)
  for k, v in pairs(settings) do
    if old[k] ~= v then
      fail("%s holds runs made with %s=%s (now %s): choose another --out or the same settings", opt.out,
        k, tostring(old[k]), tostring(v))
    end
  end
end

-- the split
local data = squad.load_json(opt.squad)
if type(data.data) ~= "table" then fail("%s is not a SQuAD file (no data array)", opt.squad) end
local need = opt.train_articles + opt.eval_articles
if #data.data < need then
  fail("%s has %d articles; the split needs %d (--train-articles=%d + --eval-articles=%d)", opt.squad, #data.data,
    need, opt.train_articles, opt.eval_articles)
end
local function take(first, count, per, first_only)
  local arts, total = {}, 0
  for a = first, first + count - 1 do
    local art, n = data.data[a], 0
    local paras = {}
    for _, p in ipairs(art.paragraphs) do
      local qas = {}
      for _, qa in ipairs(p.qas) do
        if per == 0 or n < per then
          n = n + 1
          qas[#qas + 1] = first_only and { id = qa.id, question = qa.question, answers = { qa.answers[1] } } or qa
        end
      end
      if #qas > 0 then paras[#paras + 1] = { context = p.context, qas = qas } end
    end
    arts[#arts + 1] = { title = art.title, paragraphs = paras }
    total = total + n
  end
  return { version = data.version, data = arts }, total
end
local train_file, eval_file = opt.out .. "/train.json", opt.out .. "/eval.json"
local train_set, n_train = take(1, opt.train_articles, opt.train_per_article, true)
local eval_set, n_eval = take(opt.train_articles + 1, opt.eval_articles, opt.eval_per_article, false)
fs.write_atomic(train_file, cjson.encode(train_set))
fs.write_atomic(eval_file, cjson.encode(eval_set))
print(("split: train %d questions (articles 1-%d, first answer), eval %d questions (articles %d-%d, all answers)")
  :format(n_train, opt.train_articles, n_eval, opt.train_articles + 1, need))

-- bertlua's features: the cost estimate, and the transformers side's input
local Tok = require "bertlua.data.tokenizer"
local tok = Tok.load(vocab, { lower = true })
local fo = { max_seq_length = opt.max_seq_length, doc_stride = opt.doc_stride, max_query_length = 64 }
local train_ex = squad.read_examples(train_file, { is_training = true, quiet = true })
fo.is_training = true
local train_feats = squad.convert_examples_to_features(train_ex, tok, fo)
local eval_ex = squad.read_examples(eval_file, { is_training = false, quiet = true })
fo.is_training = false
local eval_feats = squad.convert_examples_to_features(eval_ex, tok, fo)
if #train_feats == 0 or #eval_feats == 0 then fail("the split holds no usable training or evaluation question") end

local function dir_of(seed, side) return ("%s/seed%d/%s"):format(opt.out, seed, side) end
local todo, done = 0, 0
for _, seed in ipairs(seeds) do
  for _, side in ipairs(sides) do
    if fs.exists(dir_of(seed, side) .. "/eval_results.json") then done = done + 1 else todo = todo + 1 end
  end
end
local steps = math.ceil(#train_feats / opt.batch) * opt.epochs
print(("cost: %d train features x %d epochs = %d sequences (%d steps of %d) per run, S=%d, then %d eval " ..
  "features (%d for bertlua: two span searches); %d runs to do (%d sides x %d seeds), %d done")
  :format(#train_feats, opt.epochs, #train_feats * opt.epochs, steps, opt.batch, opt.max_seq_length, #eval_feats,
    2 * #eval_feats, todo, #sides, #seeds, done))

if not fs.exists(settings_file) then ft.write_json(settings_file, settings) end

local common = ("--max-seq-length=%d --doc-stride=%d --threads=%d --n-best=%d --max-answer-length=%d")
  :format(opt.max_seq_length, opt.doc_stride, opt.threads, opt.n_best, opt.max_answer_length)
local train_opts = ("--lr=%g --epochs=%d --batch=%d --warmup=%g"):format(opt.lr, opt.epochs, opt.batch, opt.warmup)
local function result_of(r) return { exact_match = r.exact_match, f1 = r.f1, empty = r.empty } end

-- each side's run: leaves dir/eval_results.json with {nbest = {exact_match, f1, empty}, exhaustive = {...}}
local run = {}
function run.bertlua(dir, seed)
  local first = dir .. "/run"   -- training and the n-best search (the recipe's default)
  if not fs.exists(first .. "/eval_results.json") then
    sh(("%s recipes/squad.lua --model=%s --train-file=%s --predict-file=%s --output=%s --do-train --do-predict " ..
      "%s %s --seed=%d --save-steps=50 --resume %s >> %s/run.log 2>&1"):format(q(exe), q(opt.model), q(train_file),
      q(eval_file), q(first), common, train_opts, seed, opt.bertlua_args, q(dir)), "bertlua training",
      dir .. "/run.log")
  end
  local second = dir .. "/exhaustive"
  sh(("%s recipes/squad.lua --model=%s --predict-file=%s --output=%s --do-predict --span-search=exhaustive " ..
    "%s %s > %s/exhaustive.log 2>&1"):format(q(exe), q(first .. "/model"), q(eval_file), q(second), common,
    opt.bertlua_args, q(dir)), "bertlua's exhaustive prediction", dir .. "/exhaustive.log")
  local r = {}
  for search, d in pairs { nbest = first, exhaustive = second } do
    local e = read_json(d .. "/eval_results.json")
    if e.span_search ~= search then
      fail("%s/eval_results.json: span_search %s, expected %s", d, tostring(e.span_search), search)
    end
    r[search] = { exact_match = e.exact_match, f1 = e.f1, empty = e.empty_answers }
  end
  return r
end

local feat_dir = opt.out .. "/features"
local function dump_features()
  if fs.exists(feat_dir .. "/eval_features.safetensors") then return end
  local st, real = require "bertlua.io.safetensors", require "real_model"
  fs.mkdir_p(feat_dir)
  local function all(n) local t = {} for i = 1, n do t[i] = i end return t end
  st.save(feat_dir .. "/features.safetensors", real.qa_tensors(train_feats, all(#train_feats), opt.max_seq_length,
    true))
  st.save(feat_dir .. "/eval_features.safetensors",
    real.qa_tensors(eval_feats, all(#eval_feats), opt.max_seq_length, false))
end

function run.transformers(dir, seed)
  local st, real = require "bertlua.io.safetensors", require "real_model"
  local pretrained = require "bertlua.pretrained"
  dump_features()
  for _, f in ipairs { "features", "eval_features" } do
    sh(("ln -sf %s %s"):format(q(fs.realpath(feat_dir .. "/" .. f .. ".safetensors")), q(dir)), "ln", dir)
  end
  -- the head starts as the recipe's does for this seed (a fresh normal(0, 0.02) either way)
  local m = pretrained.from_pretrained(opt.model, { head = "qa", seed = seed, quiet = true })
  st.save(dir .. "/head.safetensors",
    { ["qa_outputs.weight"] = m.qa_outputs.weight, ["qa_outputs.bias"] = m.qa_outputs.bias })
  local drop = read_json(opt.model .. "/config.json").hidden_dropout_prob or 0.1
  sh(("HF_HUB_OFFLINE=1 %s tests/py/qa_finetune_reference.py finetune %s %s %s --seed %d --threads %d " ..
    "--dropout %g %s > %s/log.txt 2>&1"):format(py, q(dir), q(opt.model), train_opts:gsub("=", " "), seed,
    opt.threads, drop, opt.ref_args, q(dir)), "transformers training", dir .. "/log.txt")
  local results = real.ref_results(dir .. "/ref_logits.safetensors", eval_feats)
  local r = {}
  for _, search in ipairs(SEARCHES) do
    local out = search == "nbest" and dir or dir .. "/" .. search
    fs.mkdir_p(out)
    local preds, _, _, empty = squad.write_predictions(eval_ex, eval_feats, results, { tokenizer = tok,
      output_dir = out, n_best_size = opt.n_best, max_answer_length = opt.max_answer_length, span_search = search })
    r[search] = squad.evaluate(eval_set, preds)
    r[search].empty = empty
  end
  return r
end

function run.native(dir, seed)
  sh(("HF_HUB_OFFLINE=1 %s tests/py/qa_transformers_native.py %s %s %s %s --max-seq-length %d --doc-stride %d " ..
    "%s --seed %d --threads %d --n-best %d --max-answer-length %d >> %s/log.txt 2>&1"):format(py, q(train_file),
    q(eval_file), q(opt.model), q(dir), opt.max_seq_length, opt.doc_stride, train_opts:gsub("=", " "), seed,
    opt.threads, opt.n_best, opt.max_answer_length, q(dir)), "native transformers", dir .. "/log.txt")
  return read_json(dir .. "/eval_results.json")
end

local function line(seed, side, r, note)
  return ("seed %d %-12s F1 %.2f EM %.2f (%d empty) n-best | F1 %.2f EM %.2f (%d empty) exhaustive%s"):format(seed,
    side, r.nbest.f1, r.nbest.exact_match, r.nbest.empty, r.exhaustive.f1, r.exhaustive.exact_match,
    r.exhaustive.empty, note)
end

local runs = {}
for _, seed in ipairs(seeds) do
  for _, side in ipairs(sides) do
    local dir = dir_of(seed, side)
    local path = dir .. "/eval_results.json"
    local r, note
    if fs.exists(path) then
      r, note = read_json(path), " (done before: skipped)"
    else
      fs.mkdir_p(dir)
      print(("seed %d %s: running (logs in %s)"):format(seed, side, dir))
      local t0 = os.time()
      r = run[side](dir, seed)
      if r.questions and r.questions ~= n_eval then
        fail("seed %d %s answered %d questions of %d", seed, side, r.questions, n_eval)
      end
      r = { nbest = result_of(r.nbest), exhaustive = result_of(r.exhaustive), questions = n_eval,
        seconds = os.time() - t0, train_features = r.train_features or #train_feats, steps = r.steps or steps }
      ft.write_json(path, r)
      note = (" (%d s)"):format(r.seconds)
    end
    runs[#runs + 1] = { seed = seed, side = side, nbest = r.nbest, exhaustive = r.exhaustive, seconds = r.seconds,
      train_features = r.train_features }
    print(line(seed, side, r, note))
  end
end

-- the summary
local stats = require("bertlua.util.list").stats
local per_side = {}
for _, side in ipairs(sides) do
  local s = {}
  for _, search in ipairs(SEARCHES) do
    local f1, em, empty = {}, {}, {}
    for _, r in ipairs(runs) do
      if r.side == side then
        f1[#f1 + 1], em[#em + 1], empty[#empty + 1] = r[search].f1, r[search].exact_match, r[search].empty
      end
    end
    s[search] = { f1 = stats(f1), exact_match = stats(em), empty = stats(empty) }
  end
  per_side[side] = s
end
local inside = {}
if per_side.bertlua then
  for _, side in ipairs(sides) do
    if side ~= "bertlua" then
      inside[side] = {}
      for _, search in ipairs(SEARCHES) do
        local m, o = per_side.bertlua[search].f1.mean, per_side[side][search].f1
        inside[side][search] = m >= o.min and m <= o.max
      end
    end
  end
end
local summary = { settings = settings, seeds = seeds, sides = sides,
  split = { train_questions = n_train, eval_questions = n_eval, train_features = #train_feats,
    eval_features = #eval_feats, train_articles = opt.train_articles, eval_articles = opt.eval_articles },
  runs = runs, per_side = per_side, bertlua_mean_f1_inside = inside, reference_stack = stack }
ft.write_json(opt.out .. "/summary.json", summary)

local md = { ("SQuAD v1.1, %s: train %d questions (articles 1-%d, %d features), eval %d questions (articles %d-%d), " ..
  "S=%d/stride %d, %d epochs, batch %d, lr %g, warmup %g; F1/EM by the official metric, empty = questions " ..
  "without a valid span"):format(opt.squad:match("[^/]*$"), n_train, opt.train_articles, #train_feats, n_eval,
  opt.train_articles + 1, need, opt.max_seq_length, opt.doc_stride, opt.epochs, opt.batch, opt.lr, opt.warmup)
  .. (stack and "; transformers sides: " .. stack or ""), "",
  "| seed | side | F1 n-best | EM n-best | empty n-best | F1 exhaustive | EM exhaustive | empty exhaustive | " ..
    "train features | wall s |",
  "|---|---|---|---|---|---|---|---|---|---|" }
for _, r in ipairs(runs) do
  md[#md + 1] = ("| %d | %s | %.2f | %.2f | %d | %.2f | %.2f | %d | %s | %s |"):format(r.seed, r.side, r.nbest.f1,
    r.nbest.exact_match, r.nbest.empty, r.exhaustive.f1, r.exhaustive.exact_match, r.exhaustive.empty,
    tostring(r.train_features or "?"), tostring(r.seconds or "?"))
end
local function ms(s) return ("%.2f ± %s (%.2f-%.2f)"):format(s.mean, s.sd and ("%.2f"):format(s.sd) or "n/a",
  s.min, s.max) end
md[#md + 1] = ""
md[#md + 1] = "| side | seeds | F1 n-best | EM n-best | empty n-best | F1 exhaustive | EM exhaustive | " ..
  "empty exhaustive |"
md[#md + 1] = "|---|---|---|---|---|---|---|---|"
for _, side in ipairs(sides) do
  local s = per_side[side]
  md[#md + 1] = ("| %s | %d | %s | %s | %.1f | %s | %s | %.1f |"):format(side, s.nbest.f1.n, ms(s.nbest.f1),
    ms(s.nbest.exact_match), s.nbest.empty.mean, ms(s.exhaustive.f1), ms(s.exhaustive.exact_match),
    s.exhaustive.empty.mean)
end
md[#md + 1] = ""
for _, side in ipairs(sides) do
  for _, search in ipairs(SEARCHES) do
    if inside[side] then
      local o = per_side[side][search].f1
      md[#md + 1] = ("- %s: bertlua's mean F1 %.2f %s %s's seed range %.2f-%.2f (spread %.2f)"):format(search,
        per_side.bertlua[search].f1.mean, inside[side][search] and "lies inside" or "lies OUTSIDE", side, o.min, o.max,
        o.max - o.min)
    end
  end
end
local text = table.concat(md, "\n") .. "\n"
fs.write_atomic(opt.out .. "/summary.md", text)
io.write("\n", text)
print("wrote " .. opt.out .. "/summary.json and summary.md")
