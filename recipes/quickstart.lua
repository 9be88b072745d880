-- Quickstart: the whole BERT workflow on a small corpus, in minutes, on the CPU
-- (or a GPU when there is one), with no downloads:
--   corpus -> prepare -> shard -> vocab -> pre-training data -> pre-train a tiny
--   BERT (loss going down) -> fine-tune on SQuAD-style QA -> predictions + EM/F1.
-- Each stage is one of the recipes a user runs on real data; the commands are
-- printed so they can be re-run or changed one by one.
--
--   bertlua recipes/quickstart.lua [--output=runs/quickstart] [--books=DIR] [--vocab=FILE] [--minutes=3]
-- By default the corpus is a generated encyclopedia (bertlua.data.synthetic) and the
-- QA set asks about its facts; --books=DIR uses your .txt books instead (the QA
-- part still uses the generated set).
local options = require "bertlua.util.options"
local syn = require "bertlua.data.synthetic"
local cjson = require "cjson"

local opt = options.parse(arg, {
  { "output", "runs/quickstart", "where everything is written" },
  { "books", nil, "directory of .txt books to use instead of the generated corpus" },
  { "vocab", nil, "an existing vocab.txt (default: learn one from the corpus)" },
  { "vocab_size", 1500, "size of the learned vocabulary" },
  { "countries", 160, "size of the generated world" },
  { "pretrain_steps", 1200, "pre-training optimizer steps" },
  { "finetune_epochs", 6, "QA fine-tuning epochs" },
  { "minutes", 5, "time budget for pre-training (it stops early, with a checkpoint, when reached)", int = false },
  { "seed", 1, "seed of everything" },
  { "threads", 0, "CPU threads (0: all)" },
}, { name = "quickstart", usage = "usage: bertlua recipes/quickstart.lua [options]" })

-- the sibling recipes and the host are found from this recipe's own location, so the quickstart runs from
-- any working directory, in the source tree or installed
local fs = require "bertlua.util.fs"
local shell = require "bertlua.util.shell"
local exe = fs.host()
local out = opt.output
local clock = require("bertlua.util.log").clock
local t_all = clock()

local function stage(title, cmd)
  print(("\n== %s\n$ %s"):format(title, shell.command(cmd)))
  io.stdout:flush()
  local t0 = clock()
  if not shell.run(cmd) then
    io.stderr:write(("quickstart: stage '%s' failed (see its messages above)\n"):format(title))
    os.exit(1)
  end
  print(("   (%.1f s)"):format(clock() - t0))
end
-- recipe(name, args): the words that run a sibling recipe with the list of arguments args
local function recipe(name, args) return { exe, fs.recipe(name .. ".lua"), args } end
local threads = opt.threads > 0 and ("--threads=" .. opt.threads) or {}

fs.mkdir_p(out)
local world = syn.world{ seed = opt.seed, countries = opt.countries }

-- 1. a corpus: generated books (several countries per book) unless --books is given
local books = opt.books
if not books then
  books = out .. "/books"
  fs.mkdir_p(books)
  local docs = syn.documents(world, { copies = 3, seed = opt.seed })
  local per_book = 4
  for b = 1, math.ceil(#docs / per_book) do
    local parts = {}
    for i = (b - 1) * per_book + 1, math.min(b * per_book, #docs) do
      parts[#parts + 1] = table.concat(docs[i].sentences, " ")
    end
    fs.write_atomic(("%s/book_%03d.txt"):format(books, b), table.concat(parts, "\n\n"), "\n")
  end
  print(("generated %d books about %d invented countries in %s"):format(math.ceil(#docs / per_book), opt.countries,
    books))
end

stage("prepare: one document per book",
  recipe("prepare_bookcorpus", { "--input=" .. books, "--output=" .. out .. "/prepared" }))
stage("shard: sentences, shuffled, balanced shards, held-out split",
  recipe("shard", { "--input=" .. out .. "/prepared", "--output=" .. out .. "/shards", "--num-shards=2",
    "--test-fraction=0.1", "--seed=" .. opt.seed }))
local vocab = opt.vocab
if not vocab then
  vocab = out .. "/vocab.txt"
  stage("vocab: learn a WordPiece vocabulary",
    recipe("build_vocab", { "--input=" .. out .. "/shards", "--output=" .. vocab, "--size=" .. opt.vocab_size }))
end
stage("pre-training data: masked LM + next-sentence pairs",
  recipe("create_pretraining_data", { "--input=" .. out .. "/shards", "--vocab=" .. vocab,
    "--output=" .. out .. "/pretrain_data", "--max-seq-length=64", "--max-predictions=10", "--dupe-factor=5",
    "--seed=" .. opt.seed }))

-- a tiny BERT sized to the vocabulary
local nvocab = 0
for _ in fs.lines(vocab) do nvocab = nvocab + 1 end
local cfg = { vocab_size = nvocab, hidden_size = 128, num_hidden_layers = 2, num_attention_heads = 2,
  intermediate_size = 512, max_position_embeddings = 128, type_vocab_size = 2, hidden_act = "gelu",
  hidden_dropout_prob = 0.1, attention_probs_dropout_prob = 0.1, layer_norm_eps = 1e-12, initializer_range = 0.02 }
fs.write_atomic(out .. "/tiny_config.json", cjson.encode(cfg))

-- a rerun starts pre-training afresh: pretrain.lua refuses a run directory holding another run's checkpoints
if fs.is_dir(out .. "/checkpoints") then
  print("removing the checkpoints of the previous quickstart run in " .. out)
  fs.remove_tree(out .. "/checkpoints")
end
stage("pre-train a tiny BERT (phase 1 only, LAMB)", recipe("pretrain", { "--model=" .. out .. "/tiny_config.json",
  "--vocab=" .. vocab, "--data-phase1=" .. out .. "/pretrain_data", "--output=" .. out, "--phase=1", "--seq1=64",
  "--pred1=10", "--batch1=32", "--micro-batch=32", "--lr1=5e-3", "--warmup1=0.1", "--steps1=" .. opt.pretrain_steps,
  "--checkpoint-interval=100", "--eval-batches=8", "--max-time=" .. opt.minutes * 60, "--seed=" .. opt.seed,
  threads }))

-- 2. QA about the same world
syn.write_squad(world, out .. "/qa-train.json", { split = "train", seed = opt.seed })
syn.write_squad(world, out .. "/qa-dev.json", { split = "dev", seed = opt.seed })
local model_dir = out .. "/phase1"
if not io.open(model_dir .. "/model.safetensors") then
  model_dir = out .. "/phase1-partial"
  print("pre-training stopped early; fine-tuning from its last checkpoint")
  local ckpt = require "bertlua.train.checkpoint"
  local latest = ckpt.latest(out .. "/checkpoints/phase1")
  fs.mkdir_p(model_dir)
  fs.copy(latest .. "/model.safetensors", model_dir .. "/model.safetensors", "quickstart")
  fs.copy(out .. "/tiny_config.json", model_dir .. "/config.json", "quickstart")
  fs.copy(vocab, model_dir .. "/vocab.txt", "quickstart")
end
stage("fine-tune on QA and predict", recipe("squad", { "--model=" .. model_dir, "--vocab=" .. vocab,
  "--train-file=" .. out .. "/qa-train.json", "--predict-file=" .. out .. "/qa-dev.json",
  "--output=" .. out .. "/squad", "--do-train", "--do-predict", "--max-seq-length=128", "--doc-stride=64",
  "--max-query-length=32", "--batch=16", "--lr=1e-3", "--epochs=" .. opt.finetune_epochs, "--seed=" .. opt.seed,
  threads }))

-- 3. show a few answers and the official metrics
local preds = cjson.decode(assert(io.open(out .. "/squad/predictions.json")):read("*a"))
local dev = syn.squad(world, { split = "dev", seed = opt.seed })
print("\nsome questions about the held-out countries:")
local shown = 0
for _, art in ipairs(dev.data) do
  for _, qa in ipairs(art.paragraphs[1].qas) do
    if shown < 6 then
      print(("  Q: %-48s predicted: %-20s gold: %s"):format(qa.question, tostring(preds[qa.id]), qa.answers[1].text))
      shown = shown + 1
    end
  end
end
stage("official SQuAD v1.1 metrics", recipe("squad_eval", { out .. "/qa-dev.json",
  out .. "/squad/predictions.json" }))
-- a trivial baseline for comparison: answer every question with the first word of its context
local squad = require "bertlua.tasks.squad"
local base = {}
for _, art in ipairs(dev.data) do
  for _, p in ipairs(art.paragraphs) do
    for _, qa in ipairs(p.qas) do base[qa.id] = p.context:match("^(%S+)") end
  end
end
local b = squad.evaluate(dev, base)
print(("trivial baseline (first word of the context): exact_match %.1f, f1 %.1f"):format(b.exact_match, b.f1))
print(("\nquickstart done in %.1f minutes; everything is in %s"):format((clock() - t_all) / 60, out))
