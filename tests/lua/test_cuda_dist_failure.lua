-- A failing, or stuck, rank ends a job whose gradients are reduced over NCCL
-- on cuda (dist.Reducer: buckets on a communication stream) with a message
-- instead of a hang. test_dist_failure.lua has the CPU (MPI) cases.
-- Needs a CUDA device (the emulated one in CI); skipped otherwise.
local T = require "testing"
local bl = require "bertlua"

if bl.cuda_device_count() == 0 then T.skip_all("no CUDA device (the emulated build provides one)") end
T.mpi_ranks_on_gpus(2, true)
local mpirun = "timeout 120 mpirun -np 2 --oversubscribe --allow-run-as-root "

local run = require("mpi_script")(T, mpirun, [[
local bl = require "bertlua"
local dist = require "bertlua.train.dist"
local g = bl.randn({ 5000 }, { seed = 1 }):to("cuda:0")
local r = dist.Reducer{ grads = g, bucket_mb = 1000 * 4 / 2 ^ 20 }
r:finish()   -- one good step: the communicator exists
r:wait()
]])

T.test("an error on one rank between steps ends every rank", function()
  local out, rc = run([[
if bl.rank() == 1 then error("rank one gives up") end
r:finish()   -- rank 0 waits in the NCCL all-reduce without the abort
]])
  T.truthy(rc ~= 0 and rc ~= 124, "nonzero exit without timing out (rc " .. tostring(rc) .. "): " .. out)
  T.truthy(out:find("rank one gives up", 1, true), out)
end)

T.test("a stuck rank: the bucket all-reduce times out, the communicator is aborted, the job ends", function()
  local out, rc = run([[
local ffi = require "ffi"
ffi.cdef "unsigned int sleep(unsigned int);"
if bl.rank() == 1 then ffi.C.sleep(100) end   -- in-process: ends with the process
r:finish()   -- queues the all-reduce and returns
r:wait()     -- the watched wait
]], "BL_NCCL_TIMEOUT=3 BL_EMU_NCCL_TIMEOUT=3")
  T.truthy(rc ~= 0 and rc ~= 124, "nonzero exit without timing out (rc " .. tostring(rc) .. "): " .. out)
  -- on a GPU the host's watchdog sees the stream not finish ("did not complete within 3 s"); the emulated
  -- NCCL runs the collective on the host thread and reports the missing peer as NCCL does (ncclRemoteError)
  T.truthy(out:find("reducer: NCCL bucket all-reduce", 1, true) and out:find("communicator aborted", 1, true), out)
end)

T.test("a stuck rank after finish returned: the next vote watches the queued sums and ends the job", function()
  local out, rc = run([[
local ffi = require "ffi"
ffi.cdef "unsigned int sleep(unsigned int);"
if bl.rank() == 1 then ffi.C.sleep(100) end   -- in-process: ends with the process
r:finish()                       -- rank 0: queued, no wait
dist.sum_numbers({ 1, 2 }, r)    -- a per-step vote over MPI (pretrain's stop hook)
]], "BL_NCCL_TIMEOUT=3 BL_EMU_NCCL_TIMEOUT=3")
  T.truthy(rc ~= 0 and rc ~= 124, "nonzero exit without timing out (rc " .. tostring(rc) .. "): " .. out)
  T.truthy(out:find("reducer: NCCL bucket all-reduce", 1, true) and out:find("communicator aborted", 1, true), out)
end)

T.run()
