-- --cuda-graph with several ranks: the gradient reducer's NCCL all-reduces are captured into the step's CUDA graph
-- (its communication stream forks from the compute stream's capture at each bucket's event and joins it back at
-- finish) and every rank's graph replays them in the same order:
--   * a reducer's finish() captured and launched sums the ranks' buffers, also when the capture is updated with
--     new values (the collectives run at each launch, not at the capture);
--   * `mpirun -np 2 pretrain.lua --device=cuda --cuda-graph` (the emulated NCCL) gives bit for bit the losses,
--     gradient norms and final weights of the same run without the graph, with most steps launched as graphs;
--   * a rank that fails or gets stuck while the other replays its graph ends every rank with a message (no hang).
-- Needs a CUDA device (the emulated one in CI) and mpirun; skipped otherwise.
local T = require "testing"
local bl = require "bertlua"

if bl.cuda_device_count() == 0 then T.skip_all("no CUDA device (the emulated build provides one)") end
T.mpi_ranks_on_gpus(2, true)
local mpirun = "timeout 500 mpirun -np 2 --oversubscribe --allow-run-as-root "

-- body runs on both ranks after a reducer over 5,000 random values (5 buckets) exists and a graph g was made
local run = require("mpi_script")(T, mpirun, [[
local bl = require "bertlua"
local dist = require "bertlua.train.dist"
local graph = require "bertlua.device.graph"
local rank = bl.rank()
local function values(step, r) return bl.randn({ 5000 }, { seed = 10 * step + r }) end
local g = values(1, rank):to("cuda:0")
local r = dist.Reducer{ grads = g, bucket_mb = 1000 * 4 / 2 ^ 20 }
r:finish()   -- one plain step: the communicator exists
r:wait()
local gr = graph.Graph(0)
]])

T.test("a captured reducer sums the ranks' buffers at every launch", function()
  local out, rc = run([[
for step = 2, 4 do
  local want = (values(step, 0) + values(step, 1)):totable()
  g:copy_(values(step, rank):to("cuda:0"))
  gr:run(function() r:finish() end)   -- captured: nothing is summed before the launch
  r:wait()
  local got = g:totable()
  for i = 1, #want do
    if got[i] ~= want[i] then error(("step %d element %d: %.9g, want %.9g"):format(step, i, got[i], want[i])) end
  end
end
local s = gr:stats()
assert(s.launches == 3 and s.instantiations == 1 and s.updates == 2, "graph stats")
print("rank " .. rank .. " sums ok")
]])
  T.eq(rc, 0, out)
  T.truthy(out:find("rank 0 sums ok", 1, true) and out:find("rank 1 sums ok", 1, true), out)
end)

T.test("an error on one rank while the other replays its graph ends every rank", function()
  local out, rc = run([[
gr:run(function() r:finish() end)
r:wait()
if rank == 1 then error("rank one gives up") end
gr:run(function() r:finish() end)   -- rank 0's collectives wait for rank 1
r:wait()
]])
  T.truthy(rc ~= 0 and rc ~= 124, "nonzero exit without timing out (rc " .. tostring(rc) .. "): " .. out)
  T.truthy(out:find("rank one gives up", 1, true), out)
end)

-- body (with sleep(s) declared) leaves rank 1 asleep while rank 0 waits on a graph's all-reduce: every rank must end
-- with the reducer's timeout message, before mpirun's own time limit
local function expect_vote_timeout(body)
  local out, rc = run('local ffi = require "ffi"\nffi.cdef "unsigned int sleep(unsigned int);"\n' .. body,
    "BL_NCCL_TIMEOUT=15 BL_EMU_NCCL_TIMEOUT=15")   -- the start-up agreement too: 3 s is short under load
  T.truthy(rc ~= 0 and rc ~= 124, "nonzero exit without timing out (rc " .. tostring(rc) .. "): " .. out)
  T.truthy(out:find("reducer: NCCL bucket all-reduce", 1, true) and out:find("communicator aborted", 1, true), out)
end

T.test("a stuck rank: the graph's all-reduce times out at the next vote, the job ends", function()
  expect_vote_timeout([[
gr:run(function() r:finish() end)
r:wait()
if rank == 1 then ffi.C.sleep(100) end   -- in-process: ends with the process
gr:run(function() r:finish() end)         -- rank 0: launched, no wait
dist.sum_numbers({ 1, 2 }, r)             -- the per-step vote watches the graph's sums
]])
end)

T.test("a stuck rank after replays: the replayed graph's all-reduce times out at the vote, the job ends", function()
  -- a replay runs no finish(): Reducer:replayed() makes the per-step vote watch the replayed collectives again
  expect_vote_timeout([[
gr:run(function() r:finish() end)
r:wait()
gr:replay(); r:replayed()
dist.sum_numbers({ 1, 2 }, r)             -- both ranks: its sums done, the marker cleared
r:wait()
if rank == 1 then ffi.C.sleep(100) end
gr:replay(); r:replayed()                  -- rank 0: launched, no wait
dist.sum_numbers({ 1, 2 }, r)
]])
end)

local fx = require("pretrain_fixture").make(T)
local weights = fx.weights

T.test("mpirun -np 2 pre-training with --cuda-graph = without, bit for bit, captured once", function()
  -- 6 steps: the first warms up (allocates), the graph is captured at the 2nd or 3rd and replayed after
  local steps = 6
  local args = ("--batch1=16 --micro-batch=8 --steps1=%d --device=cuda --bucket-mb=0.02 --checkpoint-interval=0 "
    .. "--eval-batches=1"):format(steps)
  fx.run("plain", args, mpirun)
  fx.run("graph", args .. " --cuda-graph", mpirun)
  local a, b = fx.records(fx.tmp .. "/plain"), fx.records(fx.tmp .. "/graph")
  T.eq(#b, steps, "log lines")
  for i = 1, steps do
    T.eq(b[i].loss, a[i].loss, ("loss of step %d"):format(i))
    T.eq(b[i].grad_norm, a[i].grad_norm, ("gradient norm of step %d"):format(i))
  end
  T.truthy(weights(fx.tmp .. "/plain") == weights(fx.tmp .. "/graph"), "final weights bit for bit")
  local last = b[steps]
  T.eq(last.cuda_graph_instantiations, 1, "instantiations")
  T.eq(last.cuda_graph_updates, 0, "updates")
  T.truthy(last.cuda_graph_replays >= steps - 3, "replays: " .. tostring(last.cuda_graph_replays))
end)

T.run()
