-- Hostile-input suite: every input is generated here at run time (a corpus,
-- a vocabulary built from it, a tiny model), then each case feeds a recipe
-- something a user or a machine can throw at it — a full disk, a FIFO, NUL
-- bytes, giant inputs, bad option values, skewed MPI ranks — under a time
-- limit, and classifies the outcome:
--   clear error   non-zero exit, the expected words, no Lua traceback
--   correct       exit 0 and the output checks pass (for inputs that are valid)
--   unclear error non-zero exit without the expected words, or a traceback
--   hang          still running at the limit
--   crash         killed by a signal
--   silent wrong  exit 0 with a wrong or invalid result
--   data loss     an existing file damaged, or output missing while exit 0
-- and prints the table. Any outcome but the first two fails the suite.
--
-- A full disk is a small tmpfs when this user may mount one, else a file-size
-- limit (ulimit -f, the host ignores SIGXFSZ so writes fail with EFBIG).
local T = require "testing"

local exe = T.exe()
-- the source tree, from this file's own path (ctest runs it there, but $PWD may say otherwise)
local ROOT = (arg[0]:match("^(.*)/tests/hostile/[^/]*$") or ".")
if ROOT:sub(1, 1) ~= "/" then
  local h = io.popen("pwd"); ROOT = h:read("*l") .. "/" .. ROOT; h:close()
end
local tmp = T.tmpdir("full")
local sh, write, slurp = T.sh, T.write_file, T.slurp
local LIMIT = tonumber(os.getenv("BL_HOSTILE_TIMEOUT") or "120")

-- ---------------------------------------------------------------- fixtures
local syn = require "bertlua.data.synthetic"
local rng = require "bertlua.util.rng"
local world = syn.world { seed = 3, countries = 30 }
local docs_dir = tmp .. "/docs"
os.execute("mkdir -p " .. docs_dir)
do  -- the between-stages format: title line, paragraph lines, blank line between documents
  local out = {}
  for _, d in ipairs(syn.documents(world, { copies = 2 })) do
    out[#out + 1] = d.title
    out[#out + 1] = table.concat(d.sentences, " ")
    out[#out + 1] = ""
  end
  write(docs_dir .. "/docs_0.txt", table.concat(out, "\n"))
end
local corpus = syn.write_corpus(world, tmp .. "/corpus", { copies = 2 })
local vocab = tmp .. "/vocab.txt"
do
  local out, rc = sh(("%s %s/recipes/build_vocab.lua --input=%s --output=%s --size=600"):format(exe, ROOT, corpus,
    vocab))

  assert(rc == 0, "fixture vocabulary: " .. out)
end
local model = tmp .. "/model"
T.tiny_model_dir(model, { vocab = vocab, head = "cls", seed = 5, config = { vocab_size = 600, hidden_size = 16,
  num_attention_heads = 2, intermediate_size = 32, max_position_embeddings = 128 } })

-- a small full disk: tmpfs when allowed, else nil (cases then use ulimit -f)
local full = tmp .. "/full"
local mounted = select(2, sh(("mount -t tmpfs -o size=160k bertlua_hostile %s 2>/dev/null"):format(full))) == 0
local function unmount() if mounted then os.execute("umount " .. full) end end
T.at_exit(function() os.execute("umount " .. full .. " 2>/dev/null; rm -rf " .. tmp) end)
-- empties the small disk (before a case writes the files that must survive)
local function clear_full() os.execute(("rm -rf %s/* %s/.[!.]* 2>/dev/null"):format(full, full)) end
-- the prefix that runs a command with about `kb` KB of room left
local function fill_full(kb)
  if mounted then
    os.execute(("dd if=/dev/zero of=%s/.filler bs=4k 2>/dev/null; truncate -s -%dK %s/.filler"):format(full, kb, full))
    return ""
  end
  return ("ulimit -f %d; "):format(kb * 2)  -- 512-byte blocks
end
-- names of the files under the small disk but the filler, sorted
local function full_files()
  local out = {}
  local p = io.popen("cd " .. full .. " && find . -type f ! -name .filler | sort")
  for l in p:lines() do out[#out + 1] = l end
  p:close()
  return out
end

-- ---------------------------------------------------------------- cases
local cases = {}
-- case{ class, name, cmd | setup(dir) -> cmd, expect = words of a clear error (nil: the input is valid),
--       check(dir, out) -> true | false, why [, "loss"] }
local function case(c)
  cases[#cases + 1] = c
  c.dir = tmp .. "/case" .. #cases
end

local function run(c)
  local dir = c.dir
  os.execute("mkdir -p " .. dir)
  local cmd = c.setup and c.setup(dir) or c.cmd
  local out, rc = sh(("cd %s && timeout -k 5 %d bash -c %q"):format(ROOT, c.timeout or LIMIT,
    cmd))
  out = out:gsub("rc=%d+%s*$", "")
  local last = (out:match("([^\n]+)\n*$") or ""):sub(1, 120)
  if rc == 124 or rc == 137 then return "hang", "killed after " .. (c.timeout or LIMIT) .. " s" end
  if rc > 128 then return "crash", "signal " .. (rc - 128) .. ": " .. last end
  local traceback = out:find("stack traceback", 1, true)
  if c.check then
    local ok, why, kind = c.check(dir, out, rc)
    if not ok then return kind == "loss" and "data loss" or (rc == 0 and "silent wrong" or "unclear error"), why end
  end
  if c.expect then
    local words = type(c.expect) == "table" and c.expect or { c.expect }
    if rc == 0 then return "silent wrong", "exit 0, no error about " .. table.concat(words, ", ") end
    for _, w in ipairs(words) do
      if not out:find(w, 1, true) then return "unclear error", ("'%s' not in: %s"):format(w, last) end
    end
    if traceback then return "unclear error", "traceback for a user error" end
    return "clear error"
  end
  if rc ~= 0 then return "unclear error", "a valid input was refused: " .. last end
  return "correct"
end


-- ---------------------------------------------------------------- the inputs
local R = exe .. " " .. ROOT .. "/recipes/"
local function lines_of(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a"); f:close()
  local r = {}
  for l in s:gmatch("([^\n]*)\n") do r[#r + 1] = l end
  return r, s
end
local function valid_jsonl(path, n)
  local ls = lines_of(path)
  if not ls then return false, path .. " missing" end
  if #ls ~= n then return false, ("%d lines, want %d"):format(#ls, n) end
  for i, l in ipairs(ls) do
    local ok, j = pcall(require("cjson").decode, l)
    if not ok or type(j) ~= "table" then return false, ("line %d is not JSON"):format(i) end
  end
  return true
end

-- NUL bytes and CRLF in line-oriented inputs: nothing merges, nothing shifts
case { class = "NUL bytes", name = "extract_features: a NUL inside line 2 of 3",
  setup = function(d)
    write(d .. "/in.txt", "the cat sat\nthe\0dog ran\r\na red fence\n")
    return ("%sextract_features.lua --model=%s --input=%s/in.txt --output=%s/out.jsonl --layers=-1"):format(R, model,
      d, d)
  end,
  check = function(d)
    local ok, why = valid_jsonl(d .. "/out.jsonl", 3)
    if not ok then return false, why end
    for i, l in ipairs(lines_of(d .. "/out.jsonl")) do
      if require("cjson").decode(l).linex_index ~= i - 1 then return false, "linex_index shifted" end
    end
    return true
  end }


-- a GLUE SST-2 task directory and a SQuAD file about the generated world, and a QA model
local glue_dir = tmp .. "/sst2"
do
  os.execute("mkdir -p " .. glue_dir)
  local r = rng(9)
  local train, test = { "sentence\tlabel" }, { "index\tsentence" }
  for i, d in ipairs(syn.documents(world, { copies = 1 })) do
    train[#train + 1] = d.sentences[1] .. "\t" .. (r(2) - 1)
    test[#test + 1] = (i - 1) .. "\t" .. d.sentences[2]
  end
  write(glue_dir .. "/train.tsv", table.concat(train, "\n") .. "\n")
  write(glue_dir .. "/dev.tsv", table.concat(train, "\n") .. "\n")
  write(glue_dir .. "/test.tsv", table.concat(test, "\n") .. "\n")
end
local squad_file = syn.write_squad(world, tmp .. "/squad.json", { split = "dev" })
local qa_model = tmp .. "/qa_model"
T.tiny_model_dir(qa_model, { vocab = vocab, head = "qa", seed = 6, config = { vocab_size = 600, hidden_size = 16,
  num_attention_heads = 2, intermediate_size = 32, max_position_embeddings = 128 } })
local function big_text(words)
  local r, w = rng(11), {}
  local pool = { "the", "capital", "river", "founded", "language", "people", "trade", "east" }
  for i = 1, words do w[i] = pool[r(#pool)] end
  return table.concat(w, " ")
end

-- ---------------------------------------------------------------- full disk
local DISK = mounted and "No space left on device" or "File too large"
-- kb: room left, less than the output needs (tmpfs counts whole 4 KB pages: 0 is a full disk)
local function full_case(name, kb, make, check)
  case { class = "disk full", name = name, expect = DISK,
    setup = function(d)
      clear_full()
      local cmd = make(d)
      return fill_full(kb) .. cmd
    end,
    check = function(d, out, rc)
      for _, f in ipairs(full_files()) do
        if f:find("%.tmp") then return false, "temporary left behind: " .. f, "loss" end
      end
      if check then return check(d, out, rc) end
      return true
    end }
end
-- no output may claim success; files that existed keep their content; no temporaries left
full_case("build_vocab.lua over an existing vocab", 0, function()
  write(full .. "/vocab.txt", slurp(vocab))
  return ("%sbuild_vocab.lua --input=%s --output=%s/vocab.txt --size=600"):format(R, corpus, full)
end, function()
  if slurp(full .. "/vocab.txt") ~= slurp(vocab) then return false, "the existing vocab.txt changed", "loss" end
  return true
end)
full_case("prepare_bookcorpus.lua", 40, function(d)
  os.execute("mkdir -p " .. d .. "/books")
  for b = 1, 3 do write(("%s/books/book%d.txt"):format(d, b), big_text(20000)) end
  return ("%sprepare_bookcorpus.lua --input=%s/books --output=%s/prep"):format(R, d, full)
end)
full_case("shard.lua", 4, function(d)
  return ("%sshard.lua --input=%s --output=%s/shards --num-shards=2"):format(R, docs_dir, full)
end)
full_case("extract_features.lua", 40, function(d)
  local ls = {}
  for i = 1, 60 do ls[i] = big_text(20) end
  write(d .. "/in.txt", table.concat(ls, "\n") .. "\n")
  return ("%sextract_features.lua --model=%s --input=%s/in.txt --output=%s/out.jsonl --layers=-1"):format(R, model,
    d, full)
end)
full_case("create_pretraining_data.lua", 8, function(d)
  return ("%screate_pretraining_data.lua --input=%s --vocab=%s --output=%s/pt --dupe-factor=2 --max-seq-length=64")
    :format(R, corpus, vocab, full)
end)
full_case("glue.lua saving over an existing model directory keeps its config.json", 8, function(d)
  os.execute(("mkdir -p %s/out && cp -r %s %s/out/model"):format(full, model, full))
  return ("%sglue.lua --task=sst2 --data-dir=%s --model=%s --output=%s/out --do-train --epochs=1 --batch=8")
    :format(R, glue_dir, model, full)
end, function()
  if slurp(full .. "/out/model/config.json") ~= slurp(model .. "/config.json") then
    return false, "config.json of the existing model changed", "loss"
  end
  return true
end)
full_case("predict.lua --output", 0, function(d)
  return ("%spredict.lua --model=%s --task=glue-sst2 --input=%s/test.tsv --output=%s/pred.tsv --max-seq-length=64")
    :format(R, model, glue_dir, full)
end)

-- ---------------------------------------------------------------- FIFOs and directories where files belong
local function fifo(path) os.execute("rm -rf '" .. path .. "' && mkfifo '" .. path .. "'") return path end
case { class = "FIFO", name = "build_vocab.lua --input=FIFO", expect = { "fifo.txt", "FIFO" },
  setup = function(d) return ("%sbuild_vocab.lua --input=%s --output=%s/v.txt --size=600"):format(R,
    fifo(d .. "/fifo.txt"), d) end }
case { class = "FIFO", name = "extract_features.lua --input=FIFO", expect = { "fifo.txt", "FIFO" },
  setup = function(d) return ("%sextract_features.lua --model=%s --input=%s --output=%s/o.jsonl"):format(R, model,
    fifo(d .. "/fifo.txt"), d) end }
case { class = "FIFO", name = "glue.lua with train.tsv a FIFO", expect = { "train.tsv", "FIFO" },
  setup = function(d)
    os.execute(("mkdir -p %s/g && cp %s/dev.tsv %s/g/"):format(d, glue_dir, d))
    fifo(d .. "/g/train.tsv")
    return ("%sglue.lua --task=sst2 --data-dir=%s/g --model=%s --output=%s/o --do-train"):format(R, d, model, d)
  end }
case { class = "FIFO", name = "extract_features.lua --input=DIRECTORY", expect = { "directory" },
  setup = function(d) return ("%sextract_features.lua --model=%s --input=%s --output=%s/o.jsonl"):format(R, model,
    d, d) end }

-- ---------------------------------------------------------------- giant inputs
case { class = "giant input", name = "extract_features.lua: one line of 9000 words",
  setup = function(d)
    write(d .. "/in.txt", big_text(9000) .. "\n")
    return ("%sextract_features.lua --model=%s --input=%s/in.txt --output=%s/o.jsonl --layers=-1"):format(R, model,
      d, d)
  end,
  check = function(d) return valid_jsonl(d .. "/o.jsonl", 1) end }
case { class = "giant input", name = "predict.lua glue-sst2: a row of 9000 words",
  setup = function(d)
    write(d .. "/test.tsv", "index\tsentence\n0\t" .. big_text(9000) .. "\n1\tthe river\n")
    return ("%spredict.lua --model=%s --task=glue-sst2 --input=%s/test.tsv --output=%s/p.tsv --max-seq-length=64")
      :format(R, model, d, d)
  end,
  check = function(d)
    local ls = lines_of(d .. "/p.tsv")
    return ls and #ls == 3, "want a header and 2 rows"
  end }
case { class = "giant input", name = "predict.lua squad: a 1 MB context without spaces", timeout = 120,
  setup = function(d)
    local ctx = ("x"):rep(1000000)
    write(d .. "/sq.json", require("cjson").encode { version = "1.1", data = { { title = "t", paragraphs = { {
      context = ctx,
      qas = { { id = "q1", question = "what river", answers = { { text = "x", answer_start = 0 } } } } } } } } })
    return ("%spredict.lua --model=%s --task=squad --input=%s/sq.json --output=%s/p.json --max-seq-length=64 "
      .. "--doc-stride=32 --batch=64"):format(R, qa_model, d, d)
  end,
  check = function(d)
    local f = io.open(d .. "/p.json", "rb")
    if not f then return false, "no predictions" end
    local ok, j = pcall(require("cjson").decode, f:read("*a")); f:close()
    return ok and type(j) == "table" and j.q1 ~= nil, "predictions.json has q1"
  end }

-- ---------------------------------------------------------------- option values
local PT_MODEL = tmp .. "/pt_config.json"
write(PT_MODEL, require("cjson").encode { vocab_size = 600, hidden_size = 16, num_hidden_layers = 1,
  num_attention_heads = 2, intermediate_size = 32, max_position_embeddings = 64, type_vocab_size = 2 })
local shards = tmp .. "/shards"
do  -- shard.lua's names: train_*.txt become the train_*.blshard files pretrain.lua reads
  os.execute(("mkdir -p %s/ptin && cp %s %s/ptin/train_00000.txt"):format(tmp, corpus, tmp))
  local out, rc = sh(("%s " .. ROOT .. "/recipes/create_pretraining_data.lua --input=%s/ptin --vocab=%s --output=%s "
    .. "--dupe-factor=1 "
    .. "--max-seq-length=64 --max-predictions=10"):format(exe, tmp, vocab, shards))
  assert(rc == 0, "fixture shards: " .. out)
end
local PT = ("%spretrain.lua --model=%s --vocab=%s --data-phase1=%s --phase=1 --seq1=64 --pred1=10 --batch1=8 "
  .. "--micro-batch=4 --steps1=4 --checkpoint-interval=2"):format(R, PT_MODEL, vocab, shards)
local function opt_case(name, cmd, words)
  case { class = "option value", name = name, expect = words, setup = function(d) return cmd(d) end }
end
opt_case("squad.lua --predict-batch=0", function(d)
  return ("%ssquad.lua --model=%s --predict-file=%s --do-predict --predict-batch=0 --output=%s"):format(R, qa_model,
    squad_file, d) end, { "--predict-batch" })
opt_case("glue.lua --eval-batch=0", function(d)
  return ("%sglue.lua --task=sst2 --data-dir=%s --model=%s --do-eval --eval-batch=0 --output=%s"):format(R, glue_dir,
    model, d) end, { "--eval-batch" })
opt_case("glue.lua --batch=-3", function(d)
  return ("%sglue.lua --task=sst2 --data-dir=%s --model=%s --do-train --batch=-3 --output=%s"):format(R, glue_dir,
    model, d) end, { "--batch" })
for _, o in ipairs { "--lr1=1e999", "--seed=1e999", "--seed=nan", "--lr1=-inf", "--threads=100000",
  "--keep-checkpoints=0", "--batch1=0", "--steps1=2.5", "--max-time=nan" } do
  opt_case("pretrain.lua " .. o, function(d) return ("%s --output=%s %s"):format(PT, d, o) end,
    { o:match("^(%-%-[%w%-]+)") })
end
opt_case("pretrain.lua -lr1=3 (single dash)", function(d) return ("%s --output=%s -lr1=3"):format(PT, d) end,
  { "-lr1" })

-- ---------------------------------------------------------------- absurd model configs
local function config_case(name, patch, words)
  case { class = "model config", name = name, expect = words, setup = function(d)
    os.execute(("cp -r %s %s/m"):format(model, d))
    local cfg = require("cjson").decode(slurp(model .. "/config.json"))
    for k, v in pairs(patch) do cfg[k] = v end
    write(d .. "/m/config.json", (require("cjson").encode(cfg):gsub('"__INF__"', "1e999")))
    write(d .. "/in.txt", "the river\n")
    return ("%sextract_features.lua --model=%s/m --input=%s/in.txt --output=%s/o.jsonl"):format(R, d, d, d)
  end }
end
config_case("num_hidden_layers = 1e9", { num_hidden_layers = 1e9 }, { "num_hidden_layers" })
config_case("hidden_size = 1e300", { hidden_size = 1e300 }, { "hidden_size" })
config_case("hidden_size = Infinity", { hidden_size = "__INF__" }, { "hidden_size" })
config_case("hidden_size = [1,2]", { hidden_size = { 1, 2 } }, { "hidden_size" })
config_case("hidden_size not divisible by the heads", { hidden_size = 15 }, { "num_attention_heads" })

-- ---------------------------------------------------------------- outputs inside inputs, reruns
case { class = "paths", name = "shard.lua --output equal to --input", expect = { "--output" },
  setup = function(d)
    os.execute(("cp -r %s %s/in"):format(docs_dir, d))
    return ("%sshard.lua --input=%s/in --output=%s/in --num-shards=2"):format(R, d, d)
  end }
case { class = "paths", name = "create_pretraining_data.lua into shards of another vocabulary", expect = { "vocab" },
  setup = function(d)
    os.execute(("cp -r %s %s/out"):format(shards, d))
    local v = slurp(vocab):gsub("\n([^\n]+)\n$", "\n%1x\n")
    write(d .. "/v2.txt", v)
    return ("%screate_pretraining_data.lua --input=%s --vocab=%s/v2.txt --output=%s/out --dupe-factor=1 "
      .. "--max-seq-length=64 --max-predictions=10"):format(R, corpus, d, d)
  end }
case { class = "paths", name = "pretrain.lua on a directory without train_*.blshard", expect = { "train_" },
  setup = function(d)
    os.execute("mkdir -p " .. d .. "/empty")
    return ("%spretrain.lua --model=%s --vocab=%s --data-phase1=%s/empty --phase=1 --output=%s/o"):format(R,
      PT_MODEL, vocab, d, d)
  end }
case { class = "paths", name = "pretrain.lua --resume with nothing to resume says so",
  setup = function(d) return ("%s --output=%s/o --resume"):format(PT, d) end,
  check = function(_, out) return out:find("nothing to resume", 1, true) ~= nil, "no word about it" end }

-- ---------------------------------------------------------------- rows and indices
case { class = "rows", name = "glue.lua --do-predict keeps each test row's own index after a malformed row",
  setup = function(d)
    os.execute(("mkdir -p %s/g && cp %s/train.tsv %s/dev.tsv %s/g/"):format(d, glue_dir, glue_dir, d))
    write(d .. "/g/test.tsv", "index\tsentence\n10\tthe river\n11\n12\tthe capital\n13\tpeople trade\n")
    return ("%sglue.lua --task=sst2 --data-dir=%s/g --model=%s --do-predict --output=%s/o"):format(R, d, model, d)
  end,
  check = function(d)
    local p = io.popen("ls " .. d .. "/o/*.tsv 2>/dev/null")
    local f = p:read("*l"); p:close()
    local ls = f and lines_of(f)
    if not ls then return false, "no prediction file" end
    local idx = {}
    for k = 2, #ls do idx[#idx + 1] = ls[k]:match("^(%d+)") end
    return table.concat(idx, ",") == "10,12,13", "indices " .. table.concat(idx, ",")
  end }

-- ---------------------------------------------------------------- non-finite values
case { class = "non-finite", name = "extract_features.lua: a weight is NaN", expect = { "NaN" },
  setup = function(d)
    os.execute(("cp -r %s %s/m"):format(model, d))
    local pretrained = require "bertlua.pretrained"
    local m = pretrained.from_pretrained(d .. "/m", { quiet = true })
    m.flat_params:ptr()[7] = 0 / 0
    pretrained.save_pretrained(m, d .. "/m", { vocab = vocab })
    write(d .. "/in.txt", "the river\n")
    return ("%sextract_features.lua --model=%s/m --input=%s/in.txt --output=%s/o.jsonl --layers=-1"):format(R, d, d,
      d)
  end }

case { class = "non-finite", name = "predict.lua --precision=fp16 on a model with a weight of 70000",
  expect = { "not finite", "fp16" },
  setup = function(d)
    os.execute(("cp -r %s %s/m"):format(model, d))
    local pretrained = require "bertlua.pretrained"
    local m = pretrained.from_pretrained(d .. "/m", { quiet = true })
    local p = m.flat_params:ptr()
    for k = 0, m.flat_params:numel() - 1, 97 do p[k] = 70000 end   -- above fp16's 65504
    pretrained.save_pretrained(m, d .. "/m", { vocab = vocab })
    return ("%spredict.lua --model=%s/m --task=glue-sst2 --input=%s/test.tsv --output=%s/p.tsv --precision=fp16 "
      .. "--max-seq-length=64"):format(R, d, glue_dir, d)
  end }

-- ---------------------------------------------------------------- working directory
case { class = "paths", name = "quickstart.lua run from another directory by its absolute path", timeout = 600,
  setup = function(d)
    local src = ROOT
    return ("cd %s && %s %s/recipes/quickstart.lua --output=%s/q --countries=12 --vocab-size=300 "
      .. "--pretrain-steps=4 --finetune-epochs=1 --minutes=1"):format(d, exe:match("^/") and exe or (src .. "/" .. exe),
      src, d)
  end,
  check = function(d) return io.open(d .. "/q/squad/predictions.json") ~= nil, "no predictions.json" end }

-- ---------------------------------------------------------------- skewed MPI ranks
case { class = "MPI ranks", name = "pretrain.lua -np 2 --max-time with rank 1 starting 2 s late", timeout = 240,
  setup = function(d)
    write(d .. "/late.sh", ('[ "$OMPI_COMM_WORLD_RANK" = 1 ] && sleep 2; exec %s "$@"\n'):format(exe))
    return ("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 --oversubscribe bash %s/late.sh "
      .. "%s --output=%s/o --steps1=100000 --max-time=4"):format(d, PT:gsub("^%S+ ", ""):gsub("--steps1=4 ", ""), d)
  end }


local ORDER = { "clear error", "correct", "unclear error", "hang", "crash", "silent wrong", "data loss" }

T.test("hostile inputs: no hang, no crash, no silent wrong result, no data loss", function()
  local counts, bad = {}, {}
  for _, k in ipairs(ORDER) do counts[k] = 0 end
  for _, c in ipairs(cases) do
    local verdict, why = run(c)
    counts[verdict] = counts[verdict] + 1
    io.write(("  %-13s %-14s %s%s\n"):format(verdict, c.class, c.name, why and ("  (" .. why .. ")") or ""))
    if verdict ~= "clear error" and verdict ~= "correct" then
      bad[#bad + 1] = ("%s: %s: %s"):format(verdict, c.name, why or "")
    end
  end
  unmount()  -- before the temporary directory is removed
  io.write(("\n  %-28s %d\n"):format("inputs tried", #cases))
  for _, k in ipairs(ORDER) do io.write(("  %-28s %d\n"):format(k .. (k == "hang" and "s" or ""), counts[k])) end
  io.write(("  (full disk: %s)\n"):format(mounted and "160 KB tmpfs" or "ulimit -f"))
  T.eq(#bad, 0, table.concat(bad, "\n"))
end)

T.run()
