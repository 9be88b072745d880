-- Data pipeline benchmark: each stage on real text (the shared Wikipedia dump
-- excerpt and Gutenberg books, or your own via --wiki/--books), timed as a whole
-- process, with throughput and peak RSS (GNU time's maximum resident set).
--
--   bertlua recipes/benchmark_data.lua [--wiki=FILE.xml.bz2] [--books=DIR] [--vocab=FILE] [--jobs=2]
--   bertlua recipes/benchmark_data.lua --loader-data=DIR [--vocab=FILE]   (only the loader rows)
--
-- The loader rows time the batch loop alone (items/s = batches/s, after the
-- shards are opened and checked) for the C loader with its prefetch thread,
-- the C loader without the thread (the work of building batches), with length
-- binning, and the Lua reference loader; peak RSS is the whole process's.
-- --step-ms=N spends N ms after each batch as a training step would: the
-- prefetch thread then builds the next batches meanwhile.
local options = require "bertlua.util.options"
local logm = require "bertlua.util.log"
local shell = require "bertlua.util.shell"
local fs = require "bertlua.util.fs"

local shared = os.getenv("BL_SHARED_DATA") or "../shared/data"
local opt = options.parse(arg, {
  { "wiki", shared .. "/wikipedia/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
    "Wikipedia dump" },
  { "books", shared .. "/books", "directory of .txt books" },
  { "vocab", shared .. "/vocab/bert-base-uncased-vocab.txt", "vocab.txt" },
  { "work", "/tmp/bertlua_benchmark_data", "scratch directory (removed first)" },
  { "jobs", 2, "parallel jobs for create_pretraining_data's scaling row" },
  { "seq", 128, "max sequence length" },
  { "loader_data", "", "benchmark only the loader on this directory of train_*.blshard" },
  { "loader_batches", 400, "batches per loader row" },
  { "batch", 64, "loader batch size" },
  { "step_ms", 0, "simulated training step after each batch (busy), to show what the prefetch thread hides",
    int = false },
}, { name = "benchmark_data", usage = "usage: bertlua recipes/benchmark_data.lua [options]" })
print(require("bertlua").cpu_line())

local exe = fs.host()
local function size_of(path)
  return tonumber(shell.read({ "du", "-sb", "--", path }, { stderr = "/dev/null" }):match("^(%d+)")) or 0
end
local has_time = shell.run { "test", "-x", "/usr/bin/time" }

local rows = {}
-- stage(name, argv (the words after the host), input bytes[, count_fn[, redirect]]): one timed process, its
-- output in WORK/NAME.log unless redirect (bertlua.util.shell's) says otherwise
local function stage(name, argv, input_bytes, count_fn, redirect)
  local rss_file = opt.work .. "/rss"
  local cmd = { has_time and { "/usr/bin/time", "-f", "%M", "-o", rss_file } or {}, exe, argv }
  local t0 = logm.clock()
  local ok = shell.run(cmd, redirect or { stdout = opt.work .. "/" .. name .. ".log", stderr = "stdout" })
  local dt = logm.clock() - t0
  if not ok then error("benchmark_data: stage " .. name .. " failed, see " .. opt.work .. "/" .. name
    .. ".log", 0) end
  local rss = 0
  if has_time then local f = io.open(rss_file); rss = tonumber(f:read("*a"):match("(%d+)")) or 0; f:close() end
  local count, unit, rate_s = nil, nil, nil
  if count_fn then count, unit, rate_s = count_fn() end
  rows[#rows + 1] = { name = name, seconds = dt, mb = input_bytes / 1e6, rss_mb = rss / 1024, count = count,
    unit = unit,
    rate_s = rate_s }
  io.stderr:write(("  %-28s %6.2f s\n"):format(name, dt))
end

fs.remove_tree(opt.work)
fs.mkdir_p(opt.work)
local W = opt.work
local loader_dir = opt.loader_data
if loader_dir == "" then
  local xml_bytes
  do  -- the XML's size: bzcat's output counted, not kept
    local f = shell.popen({ "bzcat", "--", opt.wiki }, "r", { stderr = "/dev/null" })
    xml_bytes = 0
    for chunk in function() return f:read(1048576) end do xml_bytes = xml_bytes + #chunk end
    f:close()
  end
  local R = fs.recipe
  stage("prepare_wikipedia", { R("prepare_wikipedia.lua"), "--input=" .. opt.wiki, "--output=" .. W .. "/wiki" },
    xml_bytes)
  stage("prepare_bookcorpus", { R("prepare_bookcorpus.lua"), "--input=" .. opt.books, "--output=" .. W .. "/books" },
    size_of(opt.books))
  local text_bytes = size_of(W .. "/wiki") + size_of(W .. "/books")
  stage("shard", { R("shard.lua"), "--input=" .. W .. "/wiki," .. W .. "/books", "--output=" .. W .. "/shards",
    "--num-shards=4", "--memory-mb=4" }, text_bytes)
  stage("tokenize (1 thread)", { R("tokenize.lua"), "--vocab=" .. opt.vocab, "--ids", "--quiet" },
    size_of(W .. "/shards/train_00000.txt"), nil,
    { stdin = W .. "/shards/train_00000.txt", stdout = "/dev/null", stderr = W .. "/tokenize.log" })
  -- the instance counts the workers (or the single process) printed in their logs
  local function instances(dir)
    return function()
      local n = 0
      local logs = {}
      for _, d in ipairs { W .. "/" .. dir, W } do
        local pattern = d == W and "^create_pretraining_data.*%.log$" or "%.log$"
        for _, name in ipairs(fs.is_dir(d) and fs.list_dir(d, pattern) or {}) do logs[#logs + 1] = d .. "/" .. name end
      end
      for _, path in ipairs(logs) do
        for line in (fs.read(path) or ""):gmatch("[^\n]+") do
          local k = line:match("(%d+) instances in") if k then n = n + tonumber(k) end
        end
      end
      return n, "instances"
    end
  end
  local function cpd(out, jobs)
    return { R("create_pretraining_data.lua"), "--input=" .. W .. "/shards", "--vocab=" .. opt.vocab,
      "--output=" .. W .. "/" .. out, "--max-seq-length=" .. opt.seq, "--max-predictions=20", "--dupe-factor=5",
      "--jobs=" .. jobs }
  end
  stage("create_pretraining_data j1", cpd("pd1", 1), size_of(W .. "/shards"), instances("pd1"))
  stage("create_pretraining_data j" .. opt.jobs, cpd("pdN", opt.jobs), size_of(W .. "/shards"))
  rows[#rows].count, rows[#rows].unit = rows[#rows - 1].count, "instances"
  loader_dir = W .. "/pd1"
end

-- loader rows: one process each, the batch loop timed inside it
local vf = io.open(opt.vocab)
local vocab_ok = vf ~= nil
if vf then vf:close() end
local loader_script = W .. "/loader.lua"
local f = io.open(loader_script, "w")
f:write([[
local pd = require "bertlua.data.loader"
local logm = require "bertlua.util.log"
local shell = require "bertlua.util.shell"
local fs = require "bertlua.util.fs"
local ffi = require "ffi"
local ts = ffi.new("bl_timespec")   -- declared by bertlua.util.log
-- CPU time of this thread
local function cpu() ffi.C.clock_gettime(3, ts); return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9 end
local dir, prefetch, bin, batch, n, seq, step_ms, vocab = ...
local l = pd.Loader{ dir = dir, split = "train", batch_size = tonumber(batch), seed = 1, max_seq_length = tonumber(seq),
  prefetch = tonumber(prefetch), bin_lengths = bin == "1", vocab = vocab ~= "" and vocab or nil }
n = math.min(tonumber(n), 4 * l.steps_per_epoch)
step_ms = tonumber(step_ms) / 1000
local t0, busy = logm.clock(), 0
for _ = 1, n do
  local c0 = cpu()
  pd.free_batch(l:next())   -- a training loop frees its batch (or leaves it to the GC)
  busy = busy + cpu() - c0
  if step_ms > 0 then local t = logm.clock(); while logm.clock() - t < step_ms do end end
end
local dt = logm.clock() - t0
local st = l.stats and l:stats()
print(("%d batches in %.6f s, %.1f us CPU of the training thread per batch%s"):format(n, dt, busy / n * 1e6,
  st and (", waits %d, padding %.3f"):format(st.waits, st.padding) or ""))
l:close()
]])
f:close()
local loader_notes = {}
local function loader_row(name, prefetch, bin)
  local log = W .. "/" .. name .. ".log"
  stage(name, { loader_script, loader_dir, prefetch, bin and 1 or 0, opt.batch, opt.loader_batches, opt.seq,
    ("%g"):format(opt.step_ms), vocab_ok and opt.vocab or "" }, 0, function()
    local g = io.open(log); local s = g:read("*a"); g:close()
    local n, secs, rest = s:match("(%d+) batches in ([%d.]+) s, ([^\n]*)")
    loader_notes[#loader_notes + 1] = ("%-28s %s"):format(name, rest or "?")
    return tonumber(n), "batches", tonumber(secs)
  end)
end
loader_row(("loader C (batch %d)"):format(opt.batch), 4, false)
loader_row("loader C, no thread", 0, false)
loader_row("loader C, bin_lengths", 4, true)

print(("\n%-28s %9s %10s %14s %10s"):format("stage", "seconds", "MB/s", "items/s", "peak RSS"))
for _, r in ipairs(rows) do
  print(("%-28s %9.2f %10s %14s %8.0f MB"):format(r.name, r.seconds,
    r.mb > 0 and ("%.1f"):format(r.mb / r.seconds) or "-",
    r.count and ("%.0f %s"):format(r.count / (r.rate_s or r.seconds), r.unit) or "-", r.rss_mb))
end
print(("\n(wall-clock per process on %d CPU threads; MB/s of the stage's input; loader rows: batches/s of the " ..
  "batch loop)")
  :format(require("bertlua").num_threads()))
print("\n" .. table.concat(loader_notes, "\n"))
