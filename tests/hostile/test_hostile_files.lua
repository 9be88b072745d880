-- Hostile-input suite, round two, files and commands (issue 33): file names that
-- carry shell syntax, run directories two runs share or another run left,
-- outputs equal to inputs, symlinked logs, a full standard output, FIFOs where
-- files are read. The harness (fixtures, classifier, report) is harness.lua.
package.path = arg[0]:gsub("[^/]*$", "") .. "?.lua;" .. package.path
local H = require "harness"
local shell = require "bertlua.util.shell"
local fs = require "bertlua.util.fs"

local fx, case, R, write, slurp = H.fx, H.case, H.R, H.write, H.slurp
local Q = shell.quote
-- the host by an absolute path: the injection cases run inside their own directory
local EXE = H.exe:match("^/") and H.exe or (H.ROOT .. "/" .. H.exe)
local function recipe(name) return Q(EXE) .. " " .. Q(H.ROOT .. "/recipes/" .. name) end

-- ---------------------------------------------------------------- shell injection through names
-- Directory names: one runs `touch PWNEDn` wherever a command line is built from it unquoted (every case
-- runs inside its own directory, so a marker there or in the source tree is a command that ran); the other,
-- a quote and a newline, breaks such a line. Each spawning recipe must run correctly under both.
local HOSTILE = { "h$(touch PWNED1)`touch PWNED2`;touch PWNED3;#", "q'x\ny" }
local function pwned(d)
  for _, where in ipairs { d, H.ROOT } do
    local found = shell.read { "find", where, "-maxdepth", "3", "-name", "PWNED*" }
    if found:match("%S") then return found:match("[^\n]+") end
  end
end
local function injection_case(name, make, expect)
  for k, hostile in ipairs(HOSTILE) do
    case { class = "security", name = ("%s (name %d)"):format(name, k), expect = expect,
      setup = function(d)
        local h = fs.mkdir_p(d .. "/" .. hostile)
        return "cd " .. Q(d) .. " && " .. make(d, h)
      end,
      check = function(d)
        local p = pwned(d)
        if p then return false, "a command smuggled in a file name ran: " .. p, "security" end
        return true
      end }
  end
end
injection_case("benchmark_tokenizer.lua --vocab in a hostile directory", function(_, h)
  shell.run { "cp", fx.vocab, h .. "/vocab.txt" }
  write(h .. "/in.txt", H.big_text(200) .. "\n")
  return recipe("benchmark_tokenizer.lua") .. " " .. Q("--vocab=" .. h .. "/vocab.txt") .. " "
    .. Q("--input=" .. h .. "/in.txt") .. " --repeat=1 --python=/bin/echo"
end)
injection_case("benchmark_ops.lua --python in a hostile directory", function(_, h)
  shell.run { "ln", "-s", "/bin/echo", h .. "/python" }
  return recipe("benchmark_ops.lua") .. " --size=mini --reps=1 --only=gelu --threads=1 "
    .. Q("--python=" .. h .. "/python")
end)
injection_case("benchmark.lua --compare=torch --rounds=2 with --python in a hostile directory", function(_, h)
  shell.run { "ln", "-s", "/bin/echo", h .. "/python" }
  return recipe("benchmark.lua") .. " --model=tiny --seq=32 --batch=4 --steps=2 --warmup=1 --threads=1 "
    .. "--compare=torch --rounds=2 " .. Q("--python=" .. h .. "/python")
end)
injection_case("benchmark_data.lua --work, --wiki, --books, --vocab in a hostile directory", function(_, h)
  -- a two-article dump and one book
  write(h .. "/wiki.xml", "<mediawiki><page><title>Aa</title><ns>0</ns><revision><text>"
    .. H.big_text(300) .. ".</text></revision></page><page><title>Bb</title><ns>0</ns><revision><text>"
    .. H.big_text(300) .. ".</text></revision></page></mediawiki>\n")
  shell.run { "bzip2", "-f", h .. "/wiki.xml" }
  fs.mkdir_p(h .. "/books")
  write(h .. "/books/b.txt", H.big_text(2000) .. "\n")
  shell.run { "cp", fx.vocab, h .. "/vocab.txt" }
  return recipe("benchmark_data.lua") .. " " .. Q("--work=" .. h .. "/w") .. " " .. Q("--wiki=" .. h
    .. "/wiki.xml.bz2") .. " " .. Q("--books=" .. h .. "/books") .. " " .. Q("--vocab=" .. h .. "/vocab.txt")
    .. " --seq=64 --loader-batches=4 --batch=4 --jobs=2"
end)
injection_case("create_pretraining_data.lua --jobs=2 from and into a hostile directory", function(_, h)
  fs.mkdir_p(h .. "/in")
  shell.run { "cp", fx.corpus, h .. "/in/a.txt" }
  shell.run { "cp", fx.corpus, h .. "/in/b.txt" }
  return recipe("create_pretraining_data.lua") .. " " .. Q("--input=" .. h .. "/in") .. " "
    .. Q("--vocab=" .. fx.vocab) .. " " .. Q("--output=" .. h .. "/out") .. " --jobs=2 --max-seq-length=64"
end)
injection_case("build_vocab.lua --input=a hostile directory", function(_, h)
  shell.run { "cp", fx.corpus, h .. "/c.txt" }
  return recipe("build_vocab.lua") .. " " .. Q("--input=" .. h) .. " " .. Q("--output=" .. h .. "/v.txt")
    .. " --size=300"
end)
injection_case("download.lua --base-url and --output in a hostile directory", function(_, h)
  write(h .. "/bert-base-uncased-vocab.txt", "not the vocabulary\n")
  write(h .. "/bert-base-cased-vocab.txt", "not the vocabulary\n")
  return recipe("download.lua") .. " --dataset=vocab --retries=0 " .. Q("--base-url=file://" .. h) .. " "
    .. Q("--output=" .. h .. "/out")
end, { "could not fetch" })  -- curl refuses such a URL (it is not percent-encoded): no command ran
injection_case("quickstart.lua --output=a hostile directory", function(_, h)
  return recipe("quickstart.lua") .. " " .. Q("--output=" .. h .. "/q") .. " --countries=12 --vocab-size=300 "
    .. "--pretrain-steps=4 --finetune-epochs=1 --minutes=1"
end)

-- ---------------------------------------------------------------- outputs that are inputs
-- each refused before anything is written; the input keeps its bytes
local function same_case(name, make, words)
  case { class = "data loss", name = name, expect = words,
    setup = function(d)
      local cmd, input = make(d)
      return ("cp %s %s/before && %s"):format(Q(input), Q(d), cmd)
    end,
    check = function(d)
      for _, f in ipairs(fs.list_dir(d)) do
        if f ~= "before" and slurp(d .. "/" .. f) ~= slurp(d .. "/before") and fs.exists(d .. "/before") then
          return false, f .. " (an input) was overwritten", "loss"
        end
      end
      return true
    end }
end
same_case("predict.lua --output = --input (JSON lines)", function(d)
  write(d .. "/in.jsonl", '{"text": "the river"}\n{"text": "the capital"}\n')
  return ("%spredict.lua --model=%s --input=%s/in.jsonl --output=%s/in.jsonl"):format(R, fx.model, d, d),
    d .. "/in.jsonl"
end, { "--output=", "same file as --input=" })
same_case("predict.lua --output = --input through a symlink (GLUE dev.tsv)", function(d)
  shell.run { "cp", fx.glue_dir .. "/dev.tsv", d .. "/dev.tsv" }
  shell.run { "ln", "-s", "dev.tsv", d .. "/out.tsv" }
  return ("%spredict.lua --model=%s --task=glue-sst2 --input=%s/dev.tsv --output=%s/out.tsv --max-seq-length=64")
    :format(R, fx.model, d, d), d .. "/dev.tsv"
end, { "same file as --input=" })
same_case("extract_features.lua --output = --input", function(d)
  write(d .. "/in.txt", "the river\n")
  return ("%sextract_features.lua --model=%s --input=%s/in.txt --output=%s/./in.txt"):format(R, fx.model, d, d),
    d .. "/in.txt"
end, { "same file as --input=" })
same_case("build_vocab.lua --output = the corpus (a hard link of it)", function(d)
  shell.run { "cp", fx.corpus, d .. "/corpus.txt" }
  shell.run { "ln", d .. "/corpus.txt", d .. "/link.txt" }
  return ("%sbuild_vocab.lua --input=%s/corpus.txt --output=%s/link.txt --size=300"):format(R, d, d),
    d .. "/corpus.txt"
end, { "same file as --input=" })
same_case("squad_eval.lua --out-file = the predictions", function(d)
  write(d .. "/p.json", '{"x": "y"}')
  return ("%ssquad_eval.lua %s %s/p.json --out-file=%s/p.json"):format(R, fx.squad_file, d, d), d .. "/p.json"
end, { "--out-file=", "same file as the predictions" })

-- ---------------------------------------------------------------- run directories
case { class = "data loss", name = "pretrain.lua: a second run on a running run's --output is refused",
  expect = { "is in use by another run (pid" },
  setup = function(d)
    -- the first run holds the directory (its lock file names it) while the second starts
    return ("%s --output=%s/run --steps1=400 --checkpoint-interval=0 > %s/first.log 2>&1 & "
      .. "for i in $(seq 200); do grep -q . %s/run/.lock 2>/dev/null && break; sleep 0.1; done; "
      .. "%s --output=%s/run; rc=$?; kill %%1; wait; exit $rc"):format(fx.PT, d, d, d, fx.PT, d)
  end }
-- a log whose path is a symlink to a victim: the symlink is replaced, the victim keeps its bytes
local function symlinked_log_case(name, log, cmd)
  case { class = "data loss", name = name .. ": a symlinked " .. log .. " is replaced, not followed",
    setup = function(d)
      write(d .. "/victim", "precious\n")
      fs.mkdir_p(d .. "/o")
      shell.run { "ln", "-s", d .. "/victim", d .. "/o/" .. log }
      return cmd(d .. "/o")
    end,
    check = function(d)
      if slurp(d .. "/victim") ~= "precious\n" then return false, "the symlink's target was overwritten", "loss" end
      if fs.is_symlink(d .. "/o/" .. log) then return false, log .. " is still the symlink" end
      return true
    end }
end
symlinked_log_case("glue.lua", "train_log.jsonl", function(o)
  return ("%sglue.lua --task=sst2 --data-dir=%s --model=%s --output=%s --do-train --epochs=1 --batch=8")
    :format(R, fx.glue_dir, fx.model, o)
end)
symlinked_log_case("pretrain.lua", "log.jsonl", function(o) return ("%s --output=%s --steps1=2"):format(fx.PT, o) end)
-- a directory holding another run's checkpoints: refused, naming what differs (PT: --steps1=4, a checkpoint every 2)
local function reuse_case(name, first, second, words)
  case { class = "data loss", name = name, expect = words,
    setup = function(d)
      local out, rc = H.sh(("%s --output=%s/run %s"):format(fx.PT, d, first))
      assert(rc == 0, out)
      return ("%s --output=%s/run %s"):format(fx.PT, d, second)
    end,
    check = function(d)
      local ckpts = fs.list_dir(d .. "/run/checkpoints/phase1", "^ckpt", "dirs")
      if table.concat(ckpts, " ") ~= "ckpt-00000002 ckpt-00000004" then
        return false, "the first run's checkpoints changed: " .. table.concat(ckpts, " "), "loss"
      end
      return true
    end }
end
reuse_case("pretrain.lua: a fresh run into a directory with another run's checkpoints", "--lr1=1e-3", "--lr1=2e-3",
  { "holds checkpoints of another run", "lr = 0.001 there, 0.002 now" })
reuse_case("pretrain.lua: the same run again without --resume", "", "", { "earlier run", "--resume" })
reuse_case("pretrain.lua --resume with other --steps1 and --seed", "", "--resume --steps1=8 --seed=9",
  { "another run", "seed = ", "steps = 4 there, 8 now" })
case { class = "data loss", name = "pretrain.lua --resume: a checkpoint whose state.json lost its checksums",
  setup = function(d)
    local out, rc = H.sh(("%s --output=%s/run"):format(fx.PT, d))
    assert(rc == 0, out)
    local last = d .. "/run/checkpoints/phase1/ckpt-00000004/state.json"
    local meta = require("cjson").decode(slurp(last))
    meta.checksums = nil
    write(last, require("cjson").encode(meta))
    -- and a flipped weight byte the checksum would have caught
    local f = assert(io.open(d .. "/run/checkpoints/phase1/ckpt-00000004/model.safetensors", "r+b"))
    local size = f:seek("end")
    f:seek("set", size - 3); local b = f:read(1)
    f:seek("set", size - 3); f:write(string.char((b:byte() + 1) % 256)); f:close()
    return ("%s --output=%s/run --resume"):format(fx.PT, d)
  end,
  check = function(_, out)
    if not out:find("no checksums", 1, true) then return false, "the edited checkpoint was trusted" end
    if not out:find("resumed from [^\n]*ckpt%-00000002") then return false, "did not fall back to step 2" end
    return true
  end }

case { class = "data loss", name = "quickstart.lua run twice into one --output", timeout = 600,
  setup = function(d)
    local q = recipe("quickstart.lua") .. " " .. Q("--output=" .. d .. "/q") .. " --countries=12 --vocab-size=300 "
      .. "--pretrain-steps=4 --finetune-epochs=1 --minutes=1"
    return q .. " > /dev/null && " .. q
  end }

-- ---------------------------------------------------------------- a standard output that takes nothing
local function stdout_case(name, cmd)
  case { class = "data loss", name = name .. " > /dev/full", expect = { "cannot write the standard output" },
    setup = function() return cmd() .. " > /dev/full" end }
end
case { class = "data loss", name = "tokenize.lua > a full disk", expect = { "cannot write the standard output" },
  setup = function()
    local full = H.full()
    H.clear_full()
    return ("%s%stokenize.lua --vocab=%s --quiet < %s > %s/ids.txt"):format(H.fill_full(8), R, fx.vocab, fx.corpus,
      full)
  end }
stdout_case("tokenize.lua", function()
  return ("%stokenize.lua --vocab=%s --quiet < %s"):format(R, fx.vocab, fx.corpus)
end)
stdout_case("predict.lua without --output", function()
  return ("%spredict.lua --model=%s --task=glue-sst2 --input=%s/test.tsv --max-seq-length=64"):format(R, fx.model,
    fx.glue_dir)
end)
stdout_case("squad_eval.lua", function()
  local d = H.tmp .. "/stdout_squad"
  fs.mkdir_p(d)
  write(d .. "/p.json", '{"x": "y"}')
  return ("%ssquad_eval.lua %s %s/p.json"):format(R, fx.squad_file, d)
end)

-- ---------------------------------------------------------------- FIFOs where a file is read
-- every reader refuses a FIFO at once, naming it (the open used to wait forever for a writer)
local function fifo_case(name, make, words)
  case { class = "hang", name = name, expect = words or { "fifo", "is a FIFO" }, timeout = 60,
    setup = function(d) return make(d, H.fifo(d .. "/fifo")) end }
end
fifo_case("convert.lua: the TF checkpoint's .data shard is a FIFO", function(d)
  local out, rc = H.sh(("%s %s/tests/py/checkpoint_fixtures.py tf %s"):format(os.getenv("BL_PYTHON")
    or "/usr/bin/python3", H.ROOT, d))
  if rc == 77 then return nil, "no tensorflow: " .. out:match("[^\n]*") end
  assert(rc == 0, out)
  shell.run { "mv", d .. "/fifo", d .. "/tf/bert_model.ckpt.data-00000-of-00001" }
  return ("%sconvert.lua --input=%s/tf/bert_model.ckpt --output=%s/out"):format(R, d, d)
end, { "bert_model.ckpt.data-00000-of-00001 is a FIFO" })
fifo_case("tokenize.lua --vocab=FIFO", function(d, f)
  return ("%stokenize.lua --vocab=%s < %s"):format(R, f, fx.corpus)
end)
fifo_case("create_pretraining_data.lua --vocab=FIFO", function(d, f)
  return ("%screate_pretraining_data.lua --input=%s --vocab=%s --output=%s/out"):format(R, fx.corpus, f, d)
end)
fifo_case("pretrain.lua --vocab=FIFO", function(d, f)
  return ("%spretrain.lua --model=%s --vocab=%s --data-phase1=%s --phase=1 --output=%s/o"):format(R, fx.pt_config, f,
    fx.shards, d)
end)
fifo_case("pretrain.lua --model=FIFO (a config.json)", function(d, f)
  return ("%spretrain.lua --model=%s --vocab=%s --data-phase1=%s --phase=1 --output=%s/o"):format(R, f, fx.vocab,
    fx.shards, d)
end)
fifo_case("glue.lua --config=FIFO", function(d, f)
  return ("%sglue.lua --config=%s --task=sst2 --data-dir=%s --model=%s --output=%s/o"):format(R, f, fx.glue_dir,
    fx.model, d)
end)
fifo_case("prepare_wikipedia.lua --input=FIFO", function(d, f)
  return ("%sprepare_wikipedia.lua --input=%s --output=%s/o"):format(R, f, d)
end)

H.report("hostile files and commands: no injection, no data loss, no hang, no unclear error")
