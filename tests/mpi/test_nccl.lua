-- Under `mpirun -np 2`: the NCCL path for CUDA tensors (src/dist/nccl.c) on
-- cuda:0 of each rank. Runs on GPU machines and on the emulated device
-- (-DBERTLUA_CUDA_EMU=ON: emulated NCCL over MPI); skipped without a device.
local T = require "testing"
local bl = require "bertlua"
local core = require "bertlua.core"
local C, ffi = core.C, core.ffi

if not bl.cuda_available() then
  T.skip_all(bl.cuda_compiled() and "no CUDA device" or "no CUDA device (CPU-only build)")
end
local rank = bl.rank()
local function last_error() return ffi.string(C.bl_last_error()) end

-- First on purpose: the id exchange happens when the communicator is created.
T.test("a rank failing before the NCCL id exchange fails every rank with a message", function()
  local t
  if rank == 0 then   -- a non-contiguous tensor: rank 0 fails before it could send the id
    t = bl.zeros({ 4, 3 }, { device = "cuda:0" }):t()
  else
    t = bl.zeros({ 3 }, { device = "cuda:0" })
  end
  T.truthy(C.bl_dist_allreduce_sum(t) ~= 0, "the call must fail on every rank")
  local msg = last_error()
  if rank == 0 then
    T.truthy(msg:find("must be contiguous", 1, true), msg)
  else
    T.truthy(msg:find("rank 0 failed before the id exchange", 1, true), msg)
  end
end)

T.test("all-reduce sums on cuda:0 (f32, bf16, f16, i32, i64)", function()
  for _, dt in ipairs({ "f32", "bf16", "f16", "i32", "i64" }) do
    local t = bl.arange(7, { dtype = dt }):add(rank * 10):to("cuda:0")
    assert(C.bl_dist_allreduce_sum(t) == 0, last_error())
    T.near(t:to("cpu"):tolist(), { 10, 12, 14, 16, 18, 20, 22 })
  end
end)

T.test("broadcast from rank 1 on cuda:0", function()
  local t = bl.full({ 5 }, rank == 1 and 3.5 or -1, { dtype = "f32" }):to("cuda:0")
  assert(C.bl_dist_broadcast(t, 1) == 0, last_error())
  T.near(t:to("cpu"):tolist(), { 3.5, 3.5, 3.5, 3.5, 3.5 })
end)

T.test("bucketed all-reduce mean of a CUDA gradient buffer", function()
  local dist = require "bertlua.train.dist"
  local t = bl.arange(10, { dtype = "f32" }):add(rank * 10):to("cuda:0")
  dist.all_reduce_mean(t, { bucket_elems = 3 })
  T.near(t:to("cpu"):tolist(), { 5, 6, 7, 8, 9, 10, 11, 12, 13, 14 })
end)

T.run()
