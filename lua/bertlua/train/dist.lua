-- bertlua.train.dist: data-parallel helpers over the process group.
-- MPI for CPU tensors, NCCL for CUDA tensors.
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

-- Sum of Lua numbers across ranks (for logging losses/accuracies). With a Reducer, the wait also watches its
-- last queued GPU sums (bl_dist_allreduce_sum_watched): a per-step vote does not hang on a stuck rank.
function M.sum_numbers(values, reducer)
  if C.bl_dist_size() == 1 then return values end
  local t = bl.from(values, { dtype = "f64" })
  if reducer then check(C.bl_dist_allreduce_sum_watched(t, reducer.r))
  else check(C.bl_dist_allreduce_sum(t)) end
  return t:totable()
end

-- Reducer{grads = flat f32 gradient buffer, bucket_mb = 25, dtype = "fp32" | "bf16"}:
-- the data-parallel gradient sum in buckets (bl_reducer, bl_dist.h: on a GPU
-- over NCCL on a communication stream). Per step:
--   reducer:on_final(fn)       -- once, optional: fn(lo, hi) makes elements [lo, hi) final (see below)
--   reducer:attach(model)      -- once: overlap the reduction with backward
--   reducer:arm(a == accum)    -- before each micro-batch's backward: only the last one's layers are final
--   model:backward(...)        -- each encoder layer's buckets are launched as soon as that layer is done
--   reducer:finish{ scale = 1 / dist.size() }   -- the rest; the optimizer (queued after it) runs after the sums
--   reducer:wait()             -- where the loop waits anyway (its log line): a dead or stuck rank is an error here
-- On a GPU finish() does not wait on the host (bl_reducer_wait in bl_dist.h): call wait() before the host reads
-- what the step computed, so that the watchdog (BL_NCCL_TIMEOUT) sees a collective that never ends.
-- A layer's gradients are final when its backward of the step's last
-- micro-batch returns (backward adds into the buffer, so the earlier
-- micro-batches' gradients are in it), once the caller's on_final function
-- has finished them there: with bf16/fp16 training it rounds the range to
-- half precision. finish()
-- calls it on the ranges no layer finished (embeddings, heads) before it
-- launches their buckets. Buckets are launched in the same order on every
-- rank (they are collectives).
local Reducer = {}
Reducer.__index = Reducer
M.ALLREDUCE_DTYPES = { fp32 = "f32", bf16 = "bf16", fp16 = "f16" }
M.ALLREDUCE_HELP = "data parallel: the gradient all-reduce in fp32, or bf16 / fp16 (half the bytes, the sum written "
  .. "back in f32; fp16 only with --precision=fp16, whose loss scale keeps the gradients in its range)"

-- a recipe's --allreduce-dtype, checked before anything is allocated; fp16 sums the loss-scaled gradients of fp16
-- training (as NVIDIA's allreduce_post_accumulation_fp16): without a loss scale small gradients would flush to zero
function M.check_allreduce_dtype(recipe, v, precision)
  if not M.ALLREDUCE_DTYPES[v] then
    error(("%s: --allreduce-dtype must be fp32, bf16 or fp16, got '%s'"):format(recipe, tostring(v)), 0)
  end
  if v == "fp16" and precision ~= "fp16" then
    error(("%s: --allreduce-dtype=fp16 needs --precision=fp16 (its dynamic loss scale keeps the summed gradients "
      .. "in fp16's range); with --precision=%s use bf16"):format(recipe, tostring(precision)), 0)
  end
end

function M.Reducer(o)
  local dt = M.ALLREDUCE_DTYPES[o.dtype or "fp32"]
  if not dt then
    error(("reducer: all-reduce dtype must be fp32, bf16 or fp16, got '%s'"):format(tostring(o.dtype)), 2)
  end
  local mb = o.bucket_mb or 25
  if type(mb) ~= "number" or not (mb > 0) then error("reducer: bucket_mb must be a number > 0", 2) end
  local elems = math.max(1, math.floor(mb * 1024 * 1024 / 4))  -- sized in f32 bytes, whatever the dtype
  local out = ffi.new("bl_reducer *[1]")
  check(C.bl_reducer_new(o.grads, elems, ({ f32 = C.BL_F32, bf16 = C.BL_BF16, f16 = C.BL_F16 })[dt], out))
  local r = ffi.gc(out[0], C.bl_reducer_free)
  return setmetatable({ r = r, grads = o.grads, elems = elems, total = o.grads:numel(),
    n = C.bl_reducer_buckets(r), launched = {}, final = {}, hooked = {}, armed = true, overlapped = 0,
    finalizers = {} }, Reducer)
end

-- on_final(fn[, {first = true}]): fn(lo, hi) finishes the gradients of elements [lo, hi) (0-based) before they
-- are reduced. Hooks run in the order added; first = true runs fn before those (a hook that completes the values
-- the others then read, e.g. adds a separately accumulated sum before the rounding to half precision).
function Reducer:on_final(fn, opts)
  table.insert(self.finalizers, opts and opts.first and 1 or #self.finalizers + 1, fn)
  return self
end

-- the on_final hooks on elements [lo, hi)
function Reducer:finalize(lo, hi)
  for _, fn in ipairs(self.finalizers) do fn(lo, hi) end
end

-- arm(on): whether the layers' backward that follows makes their gradients final (the last micro-batch)
function Reducer:arm(on)
  self.armed = on and true or false
  return self
end

-- ready(lo, hi): elements [lo, hi) (0-based) hold their final gradients; launch every bucket now covered
function Reducer:ready(lo, hi)
  self:finalize(lo, hi)
  local f = self.final
  f[#f + 1] = { lo, hi }
  table.sort(f, function(a, b) return a[1] < b[1] end)
  local merged = {}
  for _, iv in ipairs(f) do
    local last = merged[#merged]
    if last and iv[1] <= last[2] then last[2] = math.max(last[2], iv[2]) else merged[#merged + 1] = { iv[1], iv[2] } end
  end
  self.final = merged
  for b = self.n - 1, 0, -1 do  -- backward runs from the last layer: the highest buckets first
    if not self.launched[b] then
      local a, z = b * self.elems, math.min((b + 1) * self.elems, self.total)
      for _, iv in ipairs(merged) do
        if iv[1] <= a and iv[2] >= z then
          self.launched[b] = true
          check(C.bl_reducer_launch(self.r, b))
          break
        end
      end
    end
  end
end

-- attach(model): wrap the backward of every encoder layer (a module list `layer`,
-- as BertEncoder's) so that the buckets its parameters complete are launched when it returns
function Reducer:attach(model)
  local plist, layers = model._plist, nil
  if not plist then error("reducer:attach: the model is not flattened", 2) end
  model:apply(function(m) if type(m.layer) == "table" and m.layer[1] then layers = m.layer end end)
  for _, layer in ipairs(layers or {}) do
    local mine = {}
    layer:apply(function(m) mine[m] = true end)
    local lo, hi
    for i, e in ipairs(plist) do
      if mine[e.module] then
        lo = lo or e.offset
        -- up to the next parameter: the alignment gap before it is never written
        hi = plist[i + 1] and plist[i + 1].offset or self.total
      end
    end
    if lo then
      local orig, reducer = layer.backward, self
      layer.backward = function(this, ...)
        local dx = orig(this, ...)
        if reducer.armed then reducer:ready(lo, hi) end
        return dx
      end
      self.hooked[#self.hooked + 1] = layer
    end
  end
  return self
end

function Reducer:detach()
  for _, layer in ipairs(self.hooked) do layer.backward = nil end
  self.hooked = {}
  return self
end

-- finish{scale=}: finish the ranges no layer finished (on_final), launch what is left, then grads *= scale (queued
-- after the sums on a GPU; done on the CPU). self.overlapped: how many buckets of this step were launched during
-- backward.
function Reducer:finish(opts)
  if #self.finalizers > 0 then
    local at = 0
    for _, iv in ipairs(self.final) do   -- merged, sorted: the gaps between them are what is left
      if iv[1] > at then self:finalize(at, iv[1]) end
      at = iv[2]
    end
    if at < self.total then self:finalize(at, self.total) end
  end
  local n = 0
  for _ in pairs(self.launched) do n = n + 1 end
  self.overlapped = n
  check(C.bl_reducer_finish(self.r))
  self.launched, self.final, self.armed = {}, {}, true
  local scale = opts and opts.scale or 1
  if scale ~= 1 then self.grads:mul_(scale) end
  return self.grads
end

-- cancel(): forget the step's launched buckets and final ranges, whose queued work was dropped (a CUDA graph
-- capture that failed: bertlua.train.step runs the step again uncaptured)
function Reducer:cancel()
  check(C.bl_reducer_cancel(self.r))
  self.launched, self.final, self.armed = {}, {}, true
  return self
end

-- replayed(): the step's collectives ran again in a replayed CUDA graph (finish did not run): the watchdog of
-- poll and wait covers them as it covers a captured step's
function Reducer:replayed()
  check(C.bl_reducer_replayed(self.r))
  return self
end

-- wait(): on a GPU, the host waits for everything queued so far under the NCCL watchdog (no-op otherwise)
function Reducer:wait()
  check(C.bl_reducer_wait(self.r))
  return self
end

-- one string from `root` to every rank (its length first)
local function broadcast_string(s, root)
  local n = M.broadcast(bl.from({ #s }, { dtype = "f64" }), root):totable()[1]
  local t = bl.empty({ math.max(n, 1) }, { dtype = "u8" })
  if C.bl_dist_rank() == root then ffi.copy(t:ptr(), s, n) end
  M.broadcast(t, root)
  return ffi.string(t:ptr(), n)
end

-- agree(what, entries): every rank must hold the same entries, a list of { name, value } in one order (options,
-- model config, file identities: bertlua.train.fingerprint); any difference ends every rank with the same one-line
-- error naming the first differing entry and both values. A world of one returns at once.
function M.agree(what, entries)
  local world, rank = C.bl_dist_size(), C.bl_dist_rank()
  if world == 1 then return end
  local lines = {}
  for i, e in ipairs(entries) do lines[i] = e[1] .. "\t" .. tostring(e[2]):gsub("[\t\n]", " ") end
  local mine = table.concat(lines, "\n")
  local ref, diff = broadcast_string(mine, 0), nil
  if ref ~= mine then
    local theirs, names = {}, {}
    for l in (ref .. "\n"):gmatch("([^\n]*)\n") do
      local k, v = l:match("^([^\t]*)\t(.*)$")
      if k then theirs[k] = v; names[#names + 1] = k end
    end
    for i, e in ipairs(entries) do
      local v = lines[i]:match("\t(.*)$")
      if theirs[e[1]] ~= v then
        diff = ("%s is %s on rank 0 and %s on rank %d"):format(e[1], theirs[e[1]] or "(absent)", v, rank)
        break
      end
    end
    diff = diff or ("%s is %s on rank 0 and absent on rank %d"):format(names[#names], theirs[names[#names]], rank)
  end
  local flags = bl.zeros({ world }, { dtype = "f64" })
  if diff then flags:ptr()[rank] = 1 end
  M.all_reduce_sum(flags)
  local f = flags:totable()
  for r = 1, world do
    if f[r] > 0 then   -- the first rank that differs tells everyone
      error(("%s: the ranks disagree: %s; start every rank with the same options, model, vocabulary and data")
        :format(what, broadcast_string(diff or "", r - 1)), 0)
    end
  end
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

return M
