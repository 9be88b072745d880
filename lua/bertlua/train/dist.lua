-- bertlua.train.dist: data-parallel helpers over the process group.
-- MPI for CPU tensors (NCCL for CUDA tensors once the CUDA backend has it).
-- A world of one (no mpirun) makes every call a no-op, so recipes use the
-- same code on one process and many.
local core = require "bertlua.core"
local bl = require "bertlua.tensor"
local C, ffi, check = core.C, core.ffi, core.check

local M = {}

function M.rank() return C.bl_dist_rank() end
function M.size() return C.bl_dist_size() end
function M.local_rank() return C.bl_dist_local_rank() end
function M.local_size() return C.bl_dist_local_size() end
function M.is_main() return C.bl_dist_rank() == 0 end
function M.barrier() check(C.bl_dist_barrier()) end

-- Sum a contiguous tensor across ranks in place, in buckets of `bucket_elems`
-- elements (default 25M floats = 100 MB, like PyTorch DDP's bucket cap), then
-- optionally scale (e.g. 1/world for a mean).
function M.all_reduce_sum(t, opts)
  opts = opts or {}
  if C.bl_dist_size() == 1 then
    if opts.scale and opts.scale ~= 1 then t:mul_(opts.scale) end
    return t
  end
  if not t:is_contiguous() then error("all_reduce: tensor must be contiguous", 2) end
  local n = t:numel()
  local bucket = opts.bucket_elems or 25 * 1024 * 1024
  if n <= bucket then
    check(C.bl_dist_allreduce_sum(t))
  else
    local flat = t:view({ n })
    local start = 1
    while start <= n do
      local len = math.min(bucket, n - start + 1)
      check(C.bl_dist_allreduce_sum(flat:narrow(1, start, len)))
      start = start + len
    end
  end
  if opts.scale and opts.scale ~= 1 then t:mul_(opts.scale) end
  return t
end

-- Mean of gradients over ranks (what data parallelism needs once per optimizer step).
function M.all_reduce_mean(t, opts)
  opts = opts or {}
  opts.scale = (opts.scale or 1) / C.bl_dist_size()
  return M.all_reduce_sum(t, opts)
end

function M.broadcast(t, root)
  if C.bl_dist_size() == 1 then return t end
  check(C.bl_dist_broadcast(t, root or 0))
  return t
end

-- Sum of Lua numbers across ranks (for logging losses/accuracies).
function M.sum_numbers(values)
  if C.bl_dist_size() == 1 then return values end
  local t = bl.from(values, { dtype = "f64" })
  check(C.bl_dist_allreduce_sum(t))
  return t:totable()
end

-- End the whole job with a message (every rank stops, no hang).
function M.abort(message, code)
  C.bl_dist_abort(message, code or 1)
end

-- Run fn(); if it raises on any rank, print the error with the rank and abort the job.
function M.guard(fn, ...)
  local ok, err = xpcall(fn, debug.traceback, ...)
  if not ok then
    if C.bl_dist_size() > 1 then M.abort("[rank " .. C.bl_dist_rank() .. "] " .. tostring(err), 1) end
    error(err, 0)
  end
  return err
end

local _ = ffi
return M
