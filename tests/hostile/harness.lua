-- The hostile-input suite's harness, shared by the tests/hostile/test_*.lua
-- files. Every input is generated at run time (a corpus, a vocabulary built
-- from it, tiny models, shards), each case feeds a recipe something a user or a
-- machine can throw at it under a time limit, and the outcome is classified:
--   clear error   non-zero exit, the expected words, no Lua traceback
--   correct       exit 0 and the output checks pass (for inputs that are valid)
--   unclear error non-zero exit without the expected words, or a traceback
--   hang          still running at the limit
--   crash         killed by a signal
--   silent wrong  exit 0 with a wrong or invalid result
--   data loss     an existing file damaged, or output missing while exit 0
--   security      a command ran that the input smuggled in
-- H.report() prints the table; any outcome but the first two fails the suite (a case whose setup cannot
-- run here is counted as skipped).
--
-- A test file:
--   package.path = arg[0]:gsub("[^/]*$", "") .. "?.lua;" .. package.path
--   local H = require "harness"
--   local fx = H.fx            -- fixtures, each built on first use
--   H.case { class = "FIFO", name = "...", expect = { "words" }, setup = function(dir) return cmd end }
--   H.report("what these cases are about")
-- case{ class, name, cmd | setup(dir) -> cmd (or nil, why: skipped here, e.g. a fixture's tool is missing),
--       expect = words of a clear error (nil: the input is valid),
--       check(dir, out, rc) -> true | false, why [, "loss" | "security"], timeout = seconds }
-- BL_HOSTILE_FILTER=text runs only the cases whose name contains text; BL_HOSTILE_TIMEOUT sets the limit.
local T = require "testing"
local cjson = require "cjson"
local shell = require "bertlua.util.shell"

local H = { T = T }
local exe = T.exe()
H.exe = exe
-- the source tree, from the test file's own path (ctest runs it there, but $PWD may say otherwise)
local ROOT = (arg[0]:match("^(.*)/tests/hostile/[^/]*$") or ".")
if ROOT:sub(1, 1) ~= "/" then
  local h = io.popen("pwd"); ROOT = h:read("*l") .. "/" .. ROOT; h:close()
end
H.ROOT = ROOT
local tmp = T.tmpdir("full")
H.tmp = tmp
local sh, write, slurp = T.sh, T.write_file, T.slurp
H.sh, H.write, H.slurp = sh, write, slurp
H.LIMIT = tonumber(os.getenv("BL_HOSTILE_TIMEOUT") or "120")
-- a recipe's command prefix: R .. "build_vocab.lua --input=..."
H.R = exe .. " " .. ROOT .. "/recipes/"

-- ---------------------------------------------------------------- small helpers
-- lines_of(path) -> lines, whole text | nil: the file's "\n"-terminated lines
function H.lines_of(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a"); f:close()
  local r = {}
  for l in s:gmatch("([^\n]*)\n") do r[#r + 1] = l end
  return r, s
end
-- valid_jsonl(path, n) -> ok, why: n lines, each a JSON object
function H.valid_jsonl(path, n)
  local ls = H.lines_of(path)
  if not ls then return false, path .. " missing" end
  if #ls ~= n then return false, ("%d lines, want %d"):format(#ls, n) end
  for i, l in ipairs(ls) do
    local ok, j = pcall(cjson.decode, l)
    if not ok or type(j) ~= "table" then return false, ("line %d is not JSON"):format(i) end
  end
  return true
end
-- big_text(words): a seeded line of that many words from a small pool
function H.big_text(words)
  local r, w = require("bertlua.util.rng")(11), {}
  local pool = { "the", "capital", "river", "founded", "language", "people", "trade", "east" }
  for i = 1, words do w[i] = pool[r(#pool)] end
  return table.concat(w, " ")
end
-- fifo(path) -> path: a named pipe at path (whatever was there removed)
function H.fifo(path) os.execute("rm -rf '" .. path .. "' && mkfifo '" .. path .. "'") return path end

-- ---------------------------------------------------------------- fixtures, built on first use
local syn = require "bertlua.data.synthetic"
local TINY = { vocab_size = 600, hidden_size = 16, num_attention_heads = 2, intermediate_size = 32,
  max_position_embeddings = 128 }
local build = {}
function build.world() return syn.world { seed = 3, countries = 30 } end
-- the between-stages format: title line, paragraph lines, blank line between documents
function build.docs_dir(fx)
  local dir = tmp .. "/docs"
  os.execute("mkdir -p " .. dir)
  local out = {}
  for _, d in ipairs(syn.documents(fx.world, { copies = 2 })) do
    out[#out + 1] = d.title
    out[#out + 1] = table.concat(d.sentences, " ")
    out[#out + 1] = ""
  end
  write(dir .. "/docs_0.txt", table.concat(out, "\n"))
  return dir
end
function build.corpus(fx) return syn.write_corpus(fx.world, tmp .. "/corpus", { copies = 2 }) end
function build.vocab(fx)
  local vocab = tmp .. "/vocab.txt"
  local out, rc = sh(("%sbuild_vocab.lua --input=%s --output=%s --size=600"):format(H.R, fx.corpus, vocab))
  assert(rc == 0, "fixture vocabulary: " .. out)
  return vocab
end
-- a sequence-classification model and a QA model on the vocabulary
function build.model(fx)
  T.tiny_model_dir(tmp .. "/model", { vocab = fx.vocab, head = "cls", seed = 5, config = TINY })
  return tmp .. "/model"
end
function build.qa_model(fx)
  T.tiny_model_dir(tmp .. "/qa_model", { vocab = fx.vocab, head = "qa", seed = 6, config = TINY })
  return tmp .. "/qa_model"
end
-- a GLUE SST-2 task directory (dev.tsv = train.tsv, labelled) about the generated world
function build.glue_dir(fx)
  local dir = tmp .. "/sst2"
  os.execute("mkdir -p " .. dir)
  local r = require("bertlua.util.rng")(9)
  local train, test = { "sentence\tlabel" }, { "index\tsentence" }
  for i, d in ipairs(syn.documents(fx.world, { copies = 1 })) do
    train[#train + 1] = d.sentences[1] .. "\t" .. (r(2) - 1)
    test[#test + 1] = (i - 1) .. "\t" .. d.sentences[2]
  end
  write(dir .. "/train.tsv", table.concat(train, "\n") .. "\n")
  write(dir .. "/dev.tsv", table.concat(train, "\n") .. "\n")
  write(dir .. "/test.tsv", table.concat(test, "\n") .. "\n")
  return dir
end
function build.squad_file(fx) return syn.write_squad(fx.world, tmp .. "/squad.json", { split = "dev" }) end
-- a pre-training model config (1 layer) and the shards create_pretraining_data.lua makes of the corpus
function build.pt_config()
  local path = tmp .. "/pt_config.json"
  write(path, cjson.encode { vocab_size = 600, hidden_size = 16, num_hidden_layers = 1, num_attention_heads = 2,
    intermediate_size = 32, max_position_embeddings = 64, type_vocab_size = 2 })
  return path
end
function build.shards(fx)
  local dir = tmp .. "/shards"
  -- shard.lua's names: train_*.txt become the train_*.blshard files pretrain.lua reads
  os.execute(("mkdir -p %s/ptin && cp %s %s/ptin/train_00000.txt"):format(tmp, fx.corpus, tmp))
  local out, rc = sh(("%screate_pretraining_data.lua --input=%s/ptin --vocab=%s --output=%s --dupe-factor=1 "
    .. "--max-seq-length=64 --max-predictions=10"):format(H.R, tmp, fx.vocab, dir))
  assert(rc == 0, "fixture shards: " .. out)
  return dir
end
-- PT: a tiny phase-1 pretrain.lua command (4 steps, a checkpoint every 2); append --output=...
function build.PT(fx)
  return ("%spretrain.lua --model=%s --vocab=%s --data-phase1=%s --phase=1 --seq1=64 --pred1=10 --batch1=8 "
    .. "--micro-batch=4 --steps1=4 --checkpoint-interval=2"):format(H.R, fx.pt_config, fx.vocab, fx.shards)
end
H.fx = setmetatable({}, { __index = function(fx, k)
  local b = build[k] or error("hostile harness: no fixture '" .. tostring(k) .. "'", 2)
  local v = b(fx)
  rawset(fx, k, v)
  return v
end })

-- ---------------------------------------------------------------- a small full disk
-- tmpfs when this user may mount one, else a file-size limit (ulimit -f; the host
-- ignores SIGXFSZ so writes fail with EFBIG). H.full() mounts it on first use.
local full_dir, mounted = tmp .. "/full", nil
function H.full()
  if mounted == nil then
    mounted = select(2, sh(("mount -t tmpfs -o size=160k bertlua_hostile %s 2>/dev/null"):format(full_dir))) == 0
    T.at_exit(function() os.execute("umount " .. full_dir .. " 2>/dev/null") end)
    H.DISK = mounted and "No space left on device" or "File too large"
  end
  return full_dir, mounted
end
-- empties the small disk (before a case writes the files that must survive)
function H.clear_full() os.execute(("rm -rf %s/* %s/.[!.]* 2>/dev/null"):format(full_dir, full_dir)) end
-- the prefix that runs a command with about `kb` KB of room left (tmpfs counts whole 4 KB pages: 0 is full)
function H.fill_full(kb)
  if H.full() and mounted then
    os.execute(("dd if=/dev/zero of=%s/.filler bs=4k 2>/dev/null; truncate -s -%dK %s/.filler"):format(full_dir,
      kb, full_dir))
    return ""
  end
  return ("ulimit -f %d; "):format(kb * 2)  -- 512-byte blocks
end
-- names of the files under the small disk but the filler, sorted
function H.full_files()
  local out = {}
  local p = io.popen("cd " .. full_dir .. " && find . -type f ! -name .filler | sort")
  for l in p:lines() do out[#out + 1] = l end
  p:close()
  return out
end

-- ---------------------------------------------------------------- cases
local cases = {}
function H.case(c)
  cases[#cases + 1] = c
  c.dir = tmp .. "/case" .. #cases
end

local KINDS = { loss = "data loss", security = "security" }
function H.run(c)
  local dir = c.dir
  os.execute("mkdir -p " .. dir)
  local cmd, skip = c.cmd, nil
  if c.setup then cmd, skip = c.setup(dir) end
  if not cmd then return "skipped", skip end
  local limit = c.timeout or H.LIMIT
  local out, rc = sh(("cd %s && timeout -k 5 %d bash -c %s"):format(shell.quote(ROOT), limit, shell.quote(cmd)))
  out = out:gsub("rc=%d+%s*$", "")
  local last = (out:match("([^\n]+)\n*$") or ""):sub(1, 120)
  if rc == 124 or rc == 137 then return "hang", "killed after " .. limit .. " s" end
  if rc > 128 then return "crash", "signal " .. (rc - 128) .. ": " .. last end
  local traceback = out:find("stack traceback", 1, true)
  if c.check then
    local ok, why, kind = c.check(dir, out, rc)
    if not ok then return KINDS[kind] or (rc == 0 and "silent wrong" or "unclear error"), why end
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

local ORDER = { "clear error", "correct", "unclear error", "hang", "crash", "silent wrong", "data loss",
  "security", "skipped" }
-- report(title): one test that runs every case, prints each verdict and the counts, and fails on a bad one
function H.report(title)
  T.test(title or "hostile inputs: no hang, no crash, no silent wrong result, no data loss", function()
    local counts, bad, tried = {}, {}, 0
    for _, k in ipairs(ORDER) do counts[k] = 0 end
    local filter = os.getenv("BL_HOSTILE_FILTER")
    for _, c in ipairs(cases) do
      if not filter or c.name:find(filter, 1, true) then
        local verdict, why = H.run(c)
        tried = tried + 1
        counts[verdict] = counts[verdict] + 1
        io.write(("  %-13s %-14s %s%s\n"):format(verdict, c.class, c.name, why and ("  (" .. why .. ")") or ""))
        io.flush()
        if verdict ~= "clear error" and verdict ~= "correct" and verdict ~= "skipped" then
          bad[#bad + 1] = ("%s: %s: %s"):format(verdict, c.name, why or "")
        end
      end
    end
    if mounted then os.execute("umount " .. full_dir) end  -- before the temporary directory is removed
    io.write(("\n  %-28s %d\n"):format("inputs tried", tried))
    for _, k in ipairs(ORDER) do io.write(("  %-28s %d\n"):format(k .. (k == "hang" and "s" or ""), counts[k])) end
    if mounted ~= nil then io.write(("  (full disk: %s)\n"):format(mounted and "160 KB tmpfs" or "ulimit -f")) end
    T.eq(#bad, 0, table.concat(bad, "\n"))
  end)
  T.run()
end

return H
