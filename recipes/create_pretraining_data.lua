-- Pre-training instances from sharded text (one sentence per line, blank line
-- between documents — what recipes/shard.lua writes), as google-research/bert's
-- create_pretraining_data.py makes them, into binary shards for the loader.
-- One output shard per input file (train_00000.txt -> train_00000.blshard);
-- files already converted are skipped, so an interrupted run resumes.
--
--   bertlua recipes/create_pretraining_data.lua --input=shards/ --vocab=vocab.txt --output=data128/ \
--       --max-seq-length=128 --max-predictions=20 --dupe-factor=5 --jobs=2
local options = require "bertlua.util.options"
local cjson = require "cjson"
local fs = require "bertlua.util.fs"
local shell = require "bertlua.util.shell"
local pd = require "bertlua.data.pretraining"
local shards = require "bertlua.data.shards"
local Tok = require "bertlua.data.tokenizer"
local logm = require "bertlua.util.log"

local opt = options.parse(arg, {
  { "input", nil, "directory of *.txt shards, or comma-separated files" },
  { "vocab", nil, "vocab.txt" },
  { "output", nil, "output directory" },
  { "cased", false, "keep case and accents (default: uncased, lower-cased like bert-base-uncased)" },
  { "max_seq_length", 128, "tokens per instance including [CLS] and two [SEP]", int = true, min = 5, max = 65535 },
  { "max_predictions", 20, "masked positions per instance at most", int = true, min = 0, max = 65535 },
  { "masked_lm_prob", 0.15, "fraction of tokens to mask", min = 0, max = 1 },
  { "short_seq_prob", 0.1, "probability of a shorter target length", min = 0, max = 1 },
  { "dupe_factor", 5, "passes over the data with different masks", int = true, min = 1 },
  { "whole_word_masking", false, "mask all pieces of a word together" },
  { "dynamic_masking", false, "store unmasked pairs; the loader masks anew every epoch" },
  { "seed", 12345, "random seed (each input file gets its own stream derived from it)", int = true, min = 0,
    max = 2 ^ 53 },
  { "jobs", 1, "parallel worker processes (output is the same for any value)", int = true, min = 1, max = 1024 },
  { "worker", "", "internal: k/N — this process converts every N-th file starting at k" },
}, { name = "create_pretraining_data",
  usage = "usage: bertlua recipes/create_pretraining_data.lua --input=DIR --vocab=vocab.txt --output=DIR [options]" })

for _, k in ipairs({ "input", "vocab", "output" }) do
  if not opt[k] then error("create_pretraining_data: --" .. k .. " is required (see --help)", 0) end
end

local files = {}
for part in opt.input:gmatch("[^,]+") do
  if part:match("%.txt$") then files[#files + 1] = part
  else
    for _, name in ipairs(fs.is_dir(part) and fs.list_dir(part, "%.txt$") or {}) do
      files[#files + 1] = part .. "/" .. name
    end
  end
end
table.sort(files)
if #files == 0 then error("create_pretraining_data: no .txt files in " .. opt.input, 0) end
fs.mkdir_p(opt.output)

-- Shards already in --output are kept (a rerun completes an interrupted one), so they must come from the
-- same vocabulary and options: creation.json records them, and anything else is refused, not mixed in.
if opt.worker == "" then
  local made = { vocab_hash = tostring(shards.vocab_hash(opt.vocab)) }
  for _, k in ipairs { "cased", "max_seq_length", "max_predictions", "masked_lm_prob", "short_seq_prob",
    "dupe_factor", "whole_word_masking", "dynamic_masking", "seed" } do made[k] = opt[k] end
  local path = opt.output .. "/creation.json"
  local old = fs.read(path)
  local have_shards = #fs.list_dir(opt.output, "%.blshard$") > 0
  if old then
    local ok, prev = pcall(cjson.decode, old)
    local diff = {}
    for k, v in pairs(made) do
      if not ok or type(prev) ~= "table" or prev[k] ~= v then
        diff[#diff + 1] = k == "vocab_hash" and "vocabulary" or ("--" .. k:gsub("_", "-"))
      end
    end
    table.sort(diff)
    if #diff > 0 then
      error(("create_pretraining_data: %s holds shards made with a different %s; use another --output or empty it")
        :format(opt.output, table.concat(diff, ", ")), 0)
    end
  elseif have_shards then
    error(("create_pretraining_data: %s holds shards of an unknown run (no creation.json); use another --output "
      .. "or empty it"):format(opt.output), 0)
  end
  fs.write_atomic(path, cjson.encode(made))
end

local exe = fs.host()
if opt.worker == "" then
  print(options.show(opt))
  if opt.jobs > 1 then
    -- the same recipe in N processes, each on its own files; then wait for all
    local cmds = {}
    local self_args = {}
    for i = 1, #arg do if not arg[i]:match("^%-%-jobs") then self_args[#self_args + 1] = arg[i] end end
    for k = 0, opt.jobs - 1 do
      cmds[#cmds + 1] = shell.command { exe, arg[0], self_args, ("--worker=%d/%d"):format(k, opt.jobs) }
    end
    shell.run("( " .. table.concat(cmds, " & ") .. " & wait )")
    -- verify every output exists (a failed worker leaves its files missing)
    local missing = 0
    for _, path in ipairs(files) do
      local outp = opt.output .. "/" .. path:match("([^/]+)%.txt$") .. ".blshard"
      local fh = io.open(outp); if fh then fh:close() else missing = missing + 1 end
    end
    if missing > 0 then
      error(("create_pretraining_data: %d shard(s) were not written (see worker errors above)"):format(missing), 0)
    end
    print(("create_pretraining_data: %d shards in %s"):format(#files, opt.output))
    os.exit(0)
  end
end
local wk, wn = 0, 1
if opt.worker ~= "" then
  wk, wn = opt.worker:match("^(%d+)/(%d+)$")
  wk, wn = tonumber(wk), tonumber(wn)
  if not wk then error("create_pretraining_data: --worker must be k/N", 0) end
end

local tok = Tok.load(opt.vocab, { lower = not opt.cased })
local o = {
  max_seq_length = opt.max_seq_length, max_predictions = opt.max_predictions, masked_lm_prob = opt.masked_lm_prob,
  short_seq_prob = opt.short_seq_prob, dupe_factor = opt.dupe_factor, whole_word = opt.whole_word_masking,
  dynamic_masking = opt.dynamic_masking, cls_id = tok.cls_id, sep_id = tok.sep_id, mask_id = tok.mask_id,
  vocab_size = tok.size, vocab_hash = shards.vocab_hash(opt.vocab),
}
if o.whole_word then
  o.is_continuation = {}
  for id = 0, tok.size - 1 do if tok:token(id):sub(1, 2) == "##" then o.is_continuation[id] = true end end
end

local t0 = logm.clock()
local total, sentences, done = 0, 0, 0
for idx, path in ipairs(files) do
  if (idx - 1) % wn == wk then
    local outp = opt.output .. "/" .. path:match("([^/]+)%.txt$") .. ".blshard"
    local fh = io.open(outp)
    if fh then
      fh:close()
    else
      local stats = { sentences = 0 }
      local docs = pd.read_documents(path, tok, stats)
      -- each file's stream depends only on the seed and the file's name: --jobs can't change the output
      local name_hash = 0
      for c in path:match("[^/]+$"):gmatch(".") do name_hash = (name_hash * 31 + c:byte()) % 1000000007 end
      o.seed = (opt.seed * 1000003 + name_hash) % 9007199254740881
      local recs = pd.create(docs, o)
      shards.write_shard(outp, recs, o)
      total, sentences, done = total + #recs, sentences + stats.sentences, done + 1
      local dt = logm.clock() - t0
      io.stderr:write(("  %s: %d documents, %d instances (%.0f instances/s)\n"):format(outp, #docs, #recs,
        total / math.max(dt, 1e-9)))
    end
  end
end
print(("create_pretraining_data%s: %d files, %d sentences, %d instances in %.1f s"):format(
  opt.worker ~= "" and (" worker " .. opt.worker) or "", done, sentences, total, logm.clock() - t0))
