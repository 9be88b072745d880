-- Data pipeline benchmark: each stage on real text (the shared Wikipedia dump
-- excerpt and Gutenberg books, or your own via --wiki/--books), timed as a whole
-- process, with throughput and peak RSS (GNU time's maximum resident set).
--
--   bertlua recipes/benchmark_data.lua [--wiki=FILE.xml.bz2] [--books=DIR] [--vocab=FILE] [--jobs=2]
local options = require "bertlua.options"
local logm = require "bertlua.log"

local shared = os.getenv("BL_SHARED_DATA") or "../shared/data"
local opt = options.parse(arg, {
  { "wiki", shared .. "/wikipedia/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2", "Wikipedia dump" },
  { "books", shared .. "/books", "directory of .txt books" },
  { "vocab", shared .. "/vocab/bert-base-uncased-vocab.txt", "vocab.txt" },
  { "work", "/tmp/bertlua_benchmark_data", "scratch directory (removed first)" },
  { "jobs", 2, "parallel jobs for create_pretraining_data's scaling row" },
  { "seq", 128, "max sequence length" },
}, { name = "benchmark_data", usage = "usage: bertlua recipes/benchmark_data.lua [options]" })

local exe = arg[-1] or "bertlua"
local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local function size_of(path)
  local f = io.popen("du -sb " .. q(path) .. " 2>/dev/null"); local s = f:read("*a"); f:close()
  return tonumber(s:match("^(%d+)")) or 0
end
local has_time = os.execute("test -x /usr/bin/time") == 0 or os.execute("test -x /usr/bin/time") == true

local rows = {}
local function stage(name, cmd, input_bytes, count_fn)
  local rss_file = opt.work .. "/rss"
  local full = has_time and ("/usr/bin/time -f %M -o " .. q(rss_file) .. " " .. cmd) or cmd
  local t0 = logm.clock()
  local rc = os.execute(full .. " > " .. q(opt.work .. "/" .. name .. ".log") .. " 2>&1")
  local dt = logm.clock() - t0
  if rc ~= 0 and rc ~= true then error("benchmark_data: stage " .. name .. " failed, see " .. opt.work .. "/" .. name .. ".log", 0) end
  local rss = 0
  if has_time then local f = io.open(rss_file); rss = tonumber(f:read("*a"):match("(%d+)")) or 0; f:close() end
  local count, unit = nil, nil
  if count_fn then count, unit = count_fn() end
  rows[#rows + 1] = { name = name, seconds = dt, mb = input_bytes / 1e6, rss_mb = rss / 1024, count = count, unit = unit }
  io.stderr:write(("  %-28s %6.2f s\n"):format(name, dt))
end

os.execute("rm -rf " .. q(opt.work) .. " && mkdir -p " .. q(opt.work))
local W = opt.work
local xml_bytes = 0
do local f = io.popen("bzcat " .. q(opt.wiki) .. " | wc -c"); xml_bytes = tonumber(f:read("*a")) or 0; f:close() end
stage("prepare_wikipedia", ("%s recipes/prepare_wikipedia.lua --input=%s --output=%s/wiki"):format(exe, q(opt.wiki), W), xml_bytes)
stage("prepare_bookcorpus", ("%s recipes/prepare_bookcorpus.lua --input=%s --output=%s/books"):format(exe, q(opt.books), W), size_of(opt.books))
local text_bytes = size_of(W .. "/wiki") + size_of(W .. "/books")
stage("shard", ("%s recipes/shard.lua --input=%s/wiki,%s/books --output=%s/shards --num-shards=4 --memory-mb=4"):format(exe, W, W, W), text_bytes)
stage("tokenize (1 thread)", ("sh -c %s"):format(q(("%s recipes/tokenize.lua --vocab=%s --ids --quiet < %s/shards/train_00000.txt > /dev/null"):format(exe, opt.vocab, W))),
  size_of(W .. "/shards/train_00000.txt"))
local function instances(dir)
  return function()
    local n = 0
    local f = io.popen("cat " .. q(W .. "/" .. dir) .. "/*.log 2>/dev/null; cat " .. q(W) .. "/create_pretraining_data*.log")
    for line in f:lines() do local k = line:match("(%d+) instances in") if k then n = n + tonumber(k) end end
    f:close()
    return n, "instances"
  end
end
local cpd = "%s recipes/create_pretraining_data.lua --input=%s/shards --vocab=%s --output=%s/%s --max-seq-length=%d --max-predictions=20 --dupe-factor=5 --jobs=%d"
stage("create_pretraining_data j1", cpd:format(exe, W, q(opt.vocab), W, "pd1", opt.seq, 1), size_of(W .. "/shards"), instances("pd1"))
stage("create_pretraining_data j" .. opt.jobs, cpd:format(exe, W, q(opt.vocab), W, "pdN", opt.seq, opt.jobs), size_of(W .. "/shards"))
rows[#rows].count, rows[#rows].unit = rows[#rows - 1].count, "instances"
local loader_script = W .. "/loader.lua"
local f = io.open(loader_script, "w")
f:write(([[
local pd = require "bertlua.pretraining_data"
local l = pd.Loader{ dir = %q, split = "train", batch_size = 64, seed = 1, max_seq_length = %d, max_predictions = 20 }
local n = 0
for _ = 1, math.min(200, l.steps_per_epoch) do l:next(); n = n + 1 end
print(n .. " batches")
]]):format(W .. "/pd1", opt.seq))
f:close()
stage("loader (batch 64)", ("%s %s"):format(exe, loader_script), 0, function()
  local g = io.open(W .. "/loader (batch 64).log"); local s = g:read("*a"); g:close()
  return tonumber(s:match("(%d+) batches")), "batches"
end)

print(("\n%-28s %9s %10s %14s %10s"):format("stage", "seconds", "MB/s", "items/s", "peak RSS"))
for _, r in ipairs(rows) do
  print(("%-28s %9.2f %10s %14s %8.0f MB"):format(r.name, r.seconds, r.mb > 0 and ("%.1f"):format(r.mb / r.seconds) or "-",
    r.count and ("%.0f %s"):format(r.count / r.seconds, r.unit) or "-", r.rss_mb))
end
print(("\n(wall-clock per process on %d CPU threads; MB/s of the stage's input)"):format(require("bertlua").num_threads()))
