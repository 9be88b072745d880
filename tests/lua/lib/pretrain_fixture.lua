-- A tiny pre-training corpus for the recipe tests (test_pretrain, test_cuda_pretrain):
-- generated books -> shards -> vocab -> instances (S=32, 5 predictions), and a
-- 2-layer, hidden-64 model config.
--   local fx = require("pretrain_fixture").make(T[, {need_cuda = true}])   -- need_cuda: skip without a GPU
--   fx.pretrain(out_dir, "--steps1=6 ...", launcher) -> output, exit code (fx.command: the command line)
--   fx.kill_at(out_dir, extra, step) -> steps logged when the background run was SIGKILLed
--   fx.losses(out_dir) -> { [step] = loss }; fx.records(out_dir) -> the step lines of the log
--   fx.weights(out_dir) -> the bytes of the saved phase-1 model
--   fx.step_stays_on_device(out_dir, what): the counters of a cuda run's log (no allocation, <= 1 wait per line)
--   fx.run(name, extra, launcher): fx.pretrain into tmp/name, failing the test when it fails; fx.rel(a, b)
local cjson = require "cjson"
local syn = require "bertlua.data.synthetic"

local M = {}

function M.make(T, opts)
  if opts and opts.need_cuda and require("bertlua").cuda_device_count() == 0 then
    T.skip_all("no CUDA device (the emulated build provides one)")
  end
  local exe, sh = T.exe(), T.sh
  local tmp = T.tmpdir("books")
  local function must(cmd) local out, rc = sh(cmd); if rc ~= 0 then error(cmd .. "\n" .. out, 2) end; return out end
  local docs = syn.documents(syn.world{ seed = 2, countries = 60 }, { copies = 2 })
  for b = 1, 30 do
    local f = io.open(("%s/books/b%02d.txt"):format(tmp, b), "w")
    for i = (b - 1) * 4 + 1, b * 4 do f:write(table.concat(docs[i].sentences, " "), "\n\n") end
    f:close()
  end
  must(("%s recipes/prepare_bookcorpus.lua --input=%s/books --output=%s/prep"):format(exe, tmp, tmp))
  must(("%s recipes/shard.lua --input=%s/prep --output=%s/shards --num-shards=2 --test-fraction=0.1"):format(exe, tmp,
    tmp))
  must(("%s recipes/build_vocab.lua --input=%s/shards --output=%s/vocab.txt --size=600"):format(exe, tmp, tmp))
  must(("%s recipes/create_pretraining_data.lua --input=%s/shards --vocab=%s/vocab.txt --output=%s/data " ..
    "--max-seq-length=32 --max-predictions=5 --dupe-factor=3"):format(exe, tmp, tmp, tmp))
  local cfg = { vocab_size = 600, hidden_size = 64, num_hidden_layers = 2, num_attention_heads = 2,
    intermediate_size = 128, max_position_embeddings = 64 }
  T.write_file(tmp .. "/cfg.json", cjson.encode(cfg))
  -- data: the phase-1 shards the runs read (a test may point it at shards of its own)
  local fx = { tmp = tmp, exe = exe, must = must, data = tmp .. "/data" }
  function fx.command(out, extra, launcher)
    return ("%s%s recipes/pretrain.lua --model=%s/cfg.json --vocab=%s/vocab.txt --data-phase1=%s " ..
      "--output=%s --phase=1 --seq1=32 --pred1=5 --lr1=1e-2 --warmup1=0.1 --threads=1 --checkpoint-interval=5 %s")
      :format(launcher or "", exe, tmp, tmp, fx.data, out, extra)
  end
  function fx.pretrain(out, extra, launcher) return sh(fx.command(out, extra, launcher)) end
  -- run(name, extra, launcher): pretrain into tmp/name; a failure fails the test with the output
  function fx.run(name, extra, launcher)
    local o, rc = fx.pretrain(tmp .. "/" .. name, extra, launcher)
    T.eq(rc, 0, o)
    return o
  end
  -- kill_at(out, extra, step): starts the run in the background, SIGKILLs it
  -- once its log has `step` step lines (or after 600 s); returns the number seen.
  function fx.kill_at(out, extra, step)
    os.execute(("(%s >/dev/null 2>&1 & echo $! > %s/pid)"):format(fx.command(out, extra), tmp))
    local pid = io.open(tmp .. "/pid"):read("*l")
    local n = 0
    for _ = 1, 30000 do
      local l = io.open(out .. "/log.jsonl")
      n = 0
      if l then for line in l:lines() do if line:find('"step":') then n = n + 1 end end; l:close() end
      if n >= step then break end
      os.execute("sleep 0.02")
    end
    os.execute("kill -9 " .. pid)
    os.execute("sleep 0.2")
    return n
  end
  -- records(out) -> the log's step lines (decoded), in order
  function fx.records(out)
    local r = {}
    for line in io.lines(out .. "/log.jsonl") do
      local rec = cjson.decode(line)
      if rec.step and rec.loss then r[#r + 1] = rec end
    end
    return r
  end
  -- step_stays_on_device(out, what): from the emulated runtime's counters in the log of a cuda run (totals since
  -- the start), nothing allocated after the first logged step and at most one host wait per later log line.
  function fx.step_stays_on_device(out, what)
    local r = fx.records(out)
    T.truthy(#r >= 2 and r[1].cuda_syncs and r[1].cuda_mallocs, what .. ": counters in the log")
    for i = 2, #r do
      local a, b = r[i - 1], r[i]
      T.eq(b.cuda_mallocs, r[1].cuda_mallocs, ("%s: cudaMalloc calls by step %d (by step %d: %d)"):format(what, b.step,
        r[1].step, r[1].cuda_mallocs))
      T.truthy(b.cuda_syncs - a.cuda_syncs <= 1, ("%s: %d host waits between the log lines of steps %d and %d")
        :format(what, b.cuda_syncs - a.cuda_syncs, a.step, b.step))
    end
  end
  -- weights(out) -> the bytes of the phase-1 model a finished run saved
  function fx.weights(out)
    local f = assert(io.open(out .. "/phase1/model.safetensors", "rb"))
    local b = f:read("*a")
    f:close()
    return b
  end
  function fx.losses(out)
    local r = {}
    for line in io.lines(out .. "/log.jsonl") do
      local rec = cjson.decode(line)
      if rec.loss and rec.step then r[rec.step] = rec.loss end
    end
    return r
  end
  return fx
end

function M.rel(a, b) return math.abs(a - b) / math.max(math.abs(b), 1e-30) end

return M
