-- Hostile-input suite, round one: full disks, FIFOs, NUL bytes, giant inputs,
-- bad option values, absurd model configs, skewed MPI ranks. The fixtures, the
-- classifier and the report live in harness.lua beside this file.
package.path = arg[0]:gsub("[^/]*$", "") .. "?.lua;" .. package.path
local H = require "harness"

local fx, case, R = H.fx, H.case, H.R
local write, slurp, lines_of, valid_jsonl, big_text = H.write, H.slurp, H.lines_of, H.valid_jsonl, H.big_text
local exe, ROOT = H.exe, H.ROOT
local corpus, vocab, model, qa_model = fx.corpus, fx.vocab, fx.model, fx.qa_model
local docs_dir, glue_dir, squad_file, shards, PT_MODEL = fx.docs_dir, fx.glue_dir, fx.squad_file, fx.shards,
  fx.pt_config
local full = H.full()

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


-- ---------------------------------------------------------------- full disk
-- kb: room left, less than the output needs (tmpfs counts whole 4 KB pages: 0 is a full disk)
local function full_case(name, kb, make, check)
  case { class = "disk full", name = name, expect = H.DISK,
    setup = function(d)
      H.clear_full()
      local cmd = make(d)
      return H.fill_full(kb) .. cmd
    end,
    check = function(d, out, rc)
      for _, f in ipairs(H.full_files()) do
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
local fifo = H.fifo
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
local PT = fx.PT
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


H.report("hostile inputs: no hang, no crash, no silent wrong result, no data loss")
