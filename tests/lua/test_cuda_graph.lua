-- CUDA graphs (--cuda-graph, bertlua.train.graph): a captured and replayed step computes exactly what the plain
-- step computes; the runtime's counters show the kernels came from graph launches; a call that cannot be
-- captured (a host wait, a read of device memory, a new device allocation) is a clear error, not a hang, and
-- leaves the device usable. Needs a CUDA device (the emulated one in CI).
local T = require "testing"
local bl = require "bertlua"
local graph = require "bertlua.train.graph"

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
  T.truthy(k1.graph_kernels - k0.graph_kernels >= 9, "the kernels ran from the graph launches")
  T.eq(k1.launches - k0.launches, k1.graph_kernels - k0.graph_kernels, "no kernel launched outside the graph")
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
local function compare(name, extra, steps, min_launched)
  local plain, graphed = name .. "_plain", name .. "_graph"
  fx.run(plain, extra .. " --device=cuda --checkpoint-interval=0 --eval-batches=1")
  fx.run(graphed, extra .. " --device=cuda --checkpoint-interval=0 --eval-batches=1 --cuda-graph")
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
  -- an evaluation allocates (with or without the graph): the counters' check is for runs without one
  if not extra:find("eval-interval", 1, true) then fx.step_stays_on_device(fx.tmp .. "/" .. graphed, name) end
  return b[steps]
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

T.run()
