-- CUDA graphs (--cuda-graph, bertlua.device.graph): a captured and replayed step computes exactly what the plain
-- step computes; the runtime's counters show the kernels came from graph launches; a call that cannot be
-- captured (a host wait, a read of device memory, a new device allocation) is a clear error, not a hang, and
-- leaves the device usable. Needs a CUDA device (the emulated one in CI).
local T = require "testing"
local bl = require "bertlua"
local graph = require "bertlua.device.graph"

if bl.cuda_device_count() == 0 then T.skip_all("no CUDA device (the emulated build provides one)") end

T.test("a captured graph replays its kernels; arguments change through the update", function()
  local x = bl.rand({ 1000 }, { seed = 3 }):to("cuda:0")
  local y = bl.rand({ 1000 }, { seed = 4 }):to("cuda:0")
  local x0, y0 = x:totable(), y:totable()
  local g = graph.Graph(0)
  local k0 = bl.cuda_counters(0)
  for i = 1, 3 do g:run(function() x:mul_(2):add_(y):add_(i) end) end   -- x = 2x + y + i, three times
  local k1 = bl.cuda_counters(0)
  local s = g:stats()
  T.eq(s.launches, 3, "graph launches")
  T.eq(s.instantiations, 1, "instantiated once")
  T.eq(s.updates, 2, "later captures update it")
  T.eq(k1.graph_launches - k0.graph_launches, 3, "counted by the runtime")
  if k0.graph_kernels >= 0 then   -- counted by the emulated runtime only (-1 on a real GPU)
    T.truthy(k1.graph_kernels - k0.graph_kernels >= 9, "the kernels ran from the graph launches")
    T.eq(k1.launches - k0.launches, k1.graph_kernels - k0.graph_kernels, "no kernel launched outside the graph")
  end
  local got = x:totable()
  for j = 1, #got, 97 do
    local e = x0[j]
    for i = 1, 3 do e = 2 * e + y0[j] + i end
    T.near(got[j], e, 1e-6, 0, "element " .. j)
  end
  g:free()
end)

T.test("calls that cannot be captured: clear errors, the device still works", function()
  local x = bl.zeros({ 64 }):to("cuda:0")
  local g = graph.Graph(0)
  local cases = {
    { "a host wait", function() x:add_(1); bl.cuda_synchronize(0) end, "synchronize: cuda:0: a host wait" },
    { "a read", function() x:add_(1); return x:totable() end, "a read of device memory by the host" },
    { "an allocation", function() return bl.empty({ 12345678 }, { device = 0 }):fill_(1) end,
      "a new device allocation" },
  }
  for _, c in ipairs(cases) do
    local err = T.raises(function() g:run(c[2]) end, c[3])
    T.truthy(err:find("--cuda-graph", 1, true), c[1] .. ": " .. err)
  end
  x:add_(1)   -- the aborted captures left nothing behind: the device runs work as before
  T.eq(x:totable()[1], 1, "after the refused captures")
  g:run(function() x:add_(2) end)
  T.eq(x:totable()[5], 3, "a capture after them")
end)

local fx = require("pretrain_fixture").make(T)
local weights = fx.weights

-- min_launched: graph launches expected at least (the warm-up takes one or two steps, and again after work outside
-- the step that allocates, such as an evaluation)
local function compare(name, extra, steps, min_launched, allocates)
  local plain, graphed = name .. "_plain", name .. "_graph"
  fx.run(plain, extra .. " --device=cuda --checkpoint-interval=0 --eval-batches=1")
  local said = fx.run(graphed, extra .. " --device=cuda --checkpoint-interval=0 --eval-batches=1 --cuda-graph")
  local a, b = fx.records(fx.tmp .. "/" .. plain), fx.records(fx.tmp .. "/" .. graphed)
  T.eq(#a, steps, name .. ": log lines")
  T.eq(#b, steps, name .. ": log lines")
  for i = 1, steps do
    T.eq(b[i].loss, a[i].loss, ("%s: loss of step %d"):format(name, i))
    T.eq(b[i].grad_norm, a[i].grad_norm, ("%s: gradient norm of step %d"):format(name, i))
  end
  T.truthy(weights(fx.tmp .. "/" .. plain) == weights(fx.tmp .. "/" .. graphed), name .. ": final weights bit for bit")
  local launched = b[steps].cuda_graph_launches
  T.truthy(launched >= min_launched, name .. ": graph launches " .. launched)
  -- an evaluation (or a new batch shape) allocates, with or without the graph: the counters' check is for runs
  -- without one
  if not (allocates or extra:find("eval-interval", 1, true)) then
    fx.step_stays_on_device(fx.tmp .. "/" .. graphed, name)
  end
  return b[steps], b, said
end

-- Captured once: after the warm-up (one or two uncaptured steps) the step is one capture (one instantiation, no
-- update), every later step a replay of it with the new step's inputs copied to the device (seeds, learning rate,
-- MLM rows, NSP labels).
local function captured_once(name, last, steps)
  T.eq(last.cuda_graph_instantiations, 1, name .. ": instantiations")
  T.eq(last.cuda_graph_updates, 0, name .. ": updates (a capture after the first)")
  T.truthy(last.cuda_graph_replays >= steps - 3, name .. ": replays " .. last.cuda_graph_replays)
  T.eq(last.cuda_graph_launches, last.cuda_graph_replays + 1, name .. ": launches = the capture's + the replays")
end

T.test("pre-training with --cuda-graph = without, bit for bit (fp32)", function()
  -- with an evaluation after step 3 (work outside the captured step that allocates: a later step captures again)
  local last = compare("fp32", "--batch1=8 --micro-batch=8 --steps1=6 --eval-interval=3", 6, 2)
  T.truthy(last.cuda_graph_instantiations + last.cuda_graph_updates >= 2, "fp32: captured again after the evaluation")
end)

T.test("pre-training with --cuda-graph = without, bit for bit, captured once (fp16 loss scaling, accumulation 2)",
  function()
    local steps = 6
    local last = compare("fp16", "--batch1=16 --micro-batch=8 --steps1=6 --precision=fp16 " ..
      "--loss-scale=dynamic:16777216:3", steps, 2)
    captured_once("fp16", last, steps)
  end)

T.test("captured once (bf16, accumulation 2): = without, bit for bit; SIGKILL and --resume reproduce it", function()
  local steps, extra = 6, "--batch1=16 --micro-batch=8 --steps1=6 --precision=bf16"
  captured_once("bf16", compare("bf16", extra, steps, 2), steps)
  -- the graphed run again, killed after step 3 and resumed (a checkpoint every step): every later loss and the
  -- final weights are those of the uninterrupted graphed run
  local args = extra .. " --device=cuda --cuda-graph --checkpoint-interval=1 --eval-batches=1"
  local n = fx.kill_at(fx.tmp .. "/bf16_part", args, 3)
  T.truthy(n >= 3 and n < steps, "killed at step " .. n)
  local out = fx.run("bf16_part", args .. " --resume")
  T.truthy(out:find("resumed from", 1, true), out)
  local full, resumed = fx.losses(fx.tmp .. "/bf16_graph"), fx.losses(fx.tmp .. "/bf16_part")
  for s = 1, steps do T.eq(resumed[s], full[s], "resumed: step " .. s) end
  T.truthy(weights(fx.tmp .. "/bf16_graph") == weights(fx.tmp .. "/bf16_part"), "resumed: final weights bit for bit")
end)

-- A batch of another shape in mid-run (the loader pads each batch to its longest row, rounded up to 8): its
-- device buffers are new blocks, so the step is captured again, never a stale replay of the graph made for the
-- other shape; so too when the first shape comes back. Shards with only short-target instances and length
-- binning give batches of 32 and of 24 tokens. The test reads the shapes of every step from the recipe's loaders
-- (micro-batch a from virtual rank a - 1 of 2: pretrain.lua's split of a step).
T.test("a changed batch shape in mid-run: captured again, never a stale replay; = without, bit for bit", function()
  fx.must(("%s recipes/create_pretraining_data.lua --input=%s/shards --vocab=%s/vocab.txt --output=%s/short " ..
    "--max-seq-length=32 --max-predictions=5 --dupe-factor=1 --short-seq-prob=1"):format(fx.exe, fx.tmp, fx.tmp,
    fx.tmp))
  local steps, seed = 10, 3   -- seed 3: 4 steps of 32 tokens, 1 of 24, then 32 again
  local shapes = {}
  local loader = require "bertlua.data.loader"
  local ld = {}
  for a = 1, 2 do
    ld[a] = loader.Loader{ dir = fx.tmp .. "/short", split = "train", batch_size = 8, rank = a - 1, world_size = 2,
      seed = seed, max_seq_length = 32, max_predictions = 5, vocab = fx.tmp .. "/vocab.txt", bin_lengths = true,
      prefetch = 0 }
  end
  for s = 1, steps do shapes[s] = ld[1]:next().input_ids:size(2) .. "," .. ld[2]:next().input_ids:size(2) end
  for a = 1, 2 do ld[a]:close() end
  -- the schedule this data gives: a stable first shape (captured, replayed), another one, the first one again
  local first, other, back = shapes[1], nil, nil
  for s = 2, steps do
    if not other and shapes[s] ~= first then other = s end
    if other and not back and shapes[s] == first then back = s end
  end
  T.truthy(other and other >= 5 and back and back <= steps - 2, "shapes by step: " .. table.concat(shapes, " "))
  fx.data = fx.tmp .. "/short"
  local extra = ("--batch1=16 --micro-batch=8 --steps1=%d --bin-lengths --seed=%d"):format(steps, seed)
  local last, rec, said = compare("shape", extra, steps, 2, true)
  fx.data = fx.tmp .. "/data"
  T.truthy(rec[other - 1].cuda_graph_replays > 0, "replayed before the change")
  -- a replay only where the step's shapes are the previous step's (no stale graph), and a capture after the change
  for s = 2, steps do
    local replayed = rec[s].cuda_graph_replays - rec[s - 1].cuda_graph_replays
    if shapes[s] ~= shapes[s - 1] then
      T.eq(replayed, 0, ("step %d (shapes %s after %s): replays"):format(s, shapes[s], shapes[s - 1]))
    end
  end
  T.truthy(last.cuda_graph_instantiations + last.cuda_graph_updates >= 2,
    ("captured again after the change: %d instantiations, %d updates"):format(last.cuda_graph_instantiations,
      last.cuda_graph_updates))
  T.truthy(rec[steps].cuda_graph_replays > rec[back].cuda_graph_replays, "replays after the first shape came back")
  T.truthy(said:find("captured again: a device block was handed out", 1, true), "the recipe says why:\n" .. said)
end)

T.run()
