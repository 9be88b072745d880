-- Under `mpirun -np 2`: the bucketed gradient all-reduce (bl_reducer,
-- bertlua.train.dist.Reducer) on the CPU (MPI) and, where a CUDA device is
-- present (the emulated one in CI), on cuda:0 of each rank (NCCL on a
-- communication stream). Each rank sums random data; every rank can make
-- every rank's data from its seed, so the reference is the sum in doubles.
local T = require "testing"
local bl = require "bertlua"
local dist = require "bertlua.train.dist"
local ffi = require "ffi"
local C = require("bertlua.core").C
ffi.cdef "int usleep(unsigned int);"

local rank, world = bl.rank(), bl.world_size()
T.eq(world, 2)
local N = 1000

local function data(r) return bl.randn({ N }, { seed = 100 + r }) end

local ref, mag = {}, {}   -- sum and sum of magnitudes over the ranks, in doubles
for r = 0, world - 1 do
  local v = data(r):totable()
  for i = 1, N do
    ref[i] = (ref[i] or 0) + v[i]
    mag[i] = (mag[i] or 0) + math.abs(v[i])
  end
end

-- fp32: the f32 sum of two f32 values is one rounding of the exact sum (2^-24 relative);
-- bf16 / fp16: each rank's value rounded to half (u = 2^-9 / 2^-11 relative) and each addition too:
-- |error| <= (world + 1) * u * sum |g| (the contract in bl_dist.h)
local U = { fp32 = 2 ^ -23 / (world + 1), bf16 = 2 ^ -9, fp16 = 2 ^ -11 }
local function check(got, dtype, what)
  local tol = (world + 1) * U[dtype]
  local off = 0
  for i = 1, N do
    if math.abs(got[i] - ref[i]) > tol * mag[i] then
      error(("%s: element %d: got %.9g, expected %.9g (tolerance %.3g)"):format(what, i, got[i], ref[i], tol * mag[i]))
    end
    if math.abs(got[i] - ref[i]) > 2 ^ -23 * mag[i] then off = off + 1 end
  end
  return off  -- elements outside the fp32 bound
end

-- elements per bucket: one, an uneven split, exactly N, more than N
local SIZES = { 1, 7, 300, N, 4096 }

local function run_case(device, dtype, elems, launch_first)
  local g = data(rank):to(device)
  local r = dist.Reducer{ grads = g, bucket_mb = elems * 4 / 2 ^ 20, dtype = dtype }
  T.eq(r.n, math.ceil(N / elems))
  -- some buckets launched early, highest first (as backward produces them), the rest by finish
  for b = r.n - 1, math.max(r.n - launch_first, 0), -1 do T.eq(C.bl_reducer_launch(r.r, b), 0) end
  r:finish()
  return g:to("cpu"):totable()
end

local function devices()
  local d = { "cpu" }
  if bl.cuda_available() then d[2] = "cuda:0" end
  return d
end

T.test("fp32 sums equal the reference for every bucket size, with and without early launches", function()
  for _, dev in ipairs(devices()) do
    for _, e in ipairs(SIZES) do
      for _, early in ipairs({ 0, 2 }) do
        check(run_case(dev, "fp32", e, early), "fp32", ("%s, %d per bucket"):format(dev, e))
      end
    end
  end
end)

T.test("bf16 and fp16 reductions stay within their bounds and really round", function()
  for _, dev in ipairs(devices()) do
    for _, dt in ipairs({ "bf16", "fp16" }) do
      for _, e in ipairs({ 7, N }) do
        local off = check(run_case(dev, dt, e, 1), dt, ("%s %s, %d per bucket"):format(dev, dt, e))
        T.truthy(off > N / 2, ("%s: only %d of %d elements are outside the fp32 bound: %s was not used")
          :format(dev, off, N, dt))
      end
    end
  end
end)

T.test("a bucket launched right after the kernels that write it sees their values (stream ordering)", function()
  if not bl.cuda_available() then T.skip("no CUDA device") end
  local g = bl.zeros({ N }, { device = "cuda:0" })
  local src = data(rank):to("cuda:0")
  local r = dist.Reducer{ grads = g, bucket_mb = 100 * 4 / 2 ^ 20 }
  for step = 1, 2 do    -- the same reducer twice: events and the stream are reused
    g:zero_()
    g:add_(src)           -- a kernel queued on the compute stream: the launches below must come after it
    for b = r.n - 1, 0, -1 do T.eq(C.bl_reducer_launch(r.r, b), 0) end
    r:finish{ scale = 0.5 }
    local got = g:to("cpu"):totable()
    for i = 1, N do got[i] = got[i] * 2 end
    check(got, "fp32", "step " .. step)
  end
end)

-- attach(model): each encoder layer's buckets are launched when its backward returns,
-- and the summed gradients equal those of reducing everything after backward
T.test("attach: buckets launched during backward, the same sums as reducing after it", function()
  local bert = require "bertlua.bert"
  local cfg = require("bertlua.bert.config").new{ vocab_size = 64, hidden_size = 32, num_hidden_layers = 3,
    num_attention_heads = 2, intermediate_size = 64, max_position_embeddings = 32, hidden_dropout_prob = 0,
    attention_probs_dropout_prob = 0 }
  local ids = {}
  for b = 1, 2 do
    ids[b] = {}
    for j = 1, 12 do ids[b][j] = (5 * j + 11 * b + 17 * rank) % 64 end
  end
  local batch = { input_ids = bl.from(ids, { dtype = "i32" }), start_positions = { 2, 4 + rank },
    end_positions = { 3, 9 } }
  for _, dev in ipairs(devices()) do
    local function grads(hook)
      local m = bert.BertForQuestionAnswering(cfg, { seed = 3 }):to(dev)
      local r = dist.Reducer{ grads = m.flat_grads, bucket_mb = 500 * 4 / 2 ^ 20 }
      if hook then r:attach(m) end
      m:zero_grad()
      m:forward(batch)
      local early = 0
      m:backward()
      for b = 0, r.n - 1 do if r.launched[b] then early = early + 1 end end
      r:finish()
      return m.flat_grads:to("cpu"):totable(), early, r.n
    end
    local plain, none = grads(false)
    local hooked, early, n = grads(true)
    T.eq(none, 0)
    -- 3 layers of ~12,700 parameters each in buckets of 500: most buckets are launched early
    T.truthy(early > n / 2, ("%s: %d of %d buckets launched during backward"):format(dev, early, n))
    for i = 1, #plain do
      if plain[i] ~= hooked[i] then error(("%s: element %d: %.9g hooked, %.9g after backward"):format(dev, i - 1,
        hooked[i], plain[i])) end
    end
  end
end)

-- finish() on a GPU queues the sums and returns: with rank 1 a second late, rank 0's finish takes no part of that
-- second (it used to wait for the all-reduce); wait() then waits for it and the sums are right.
T.test("finish does not wait on the host (cuda), wait does", function()
  if not bl.cuda_available() then T.skip("no CUDA device") end
  local clock = require("bertlua.util.log").clock
  local g = data(rank):to("cuda:0")
  local r = dist.Reducer{ grads = g, bucket_mb = 300 * 4 / 2 ^ 20 }
  r:finish()   -- a first step: the communicator exists on both ranks
  r:wait()
  g:copy_(data(rank):to("cuda:0"))
  if rank == 1 then ffi.C.usleep(1000000) end
  local t0 = clock()
  r:finish()
  local t_finish = clock() - t0
  r:wait()
  local t_wait = clock() - t0
  if rank == 0 then
    T.truthy(t_finish < 0.5, ("finish took %.2f s with a peer 1 s late"):format(t_finish))
    T.truthy(t_wait >= 0.5, ("wait returned after %.2f s, before the late peer arrived"):format(t_wait))
  end
  check(g:to("cpu"):totable(), "fp32", "after wait")
end)

T.test("misuse is an error naming the reducer", function()
  local g = bl.zeros({ 10 })
  local r = dist.Reducer{ grads = g, bucket_mb = 4 * 4 / 2 ^ 20 }
  T.eq(C.bl_reducer_launch(r.r, 0), 0)
  T.truthy(C.bl_reducer_launch(r.r, 0) ~= 0)
  T.truthy(ffi.string(C.bl_last_error()):find("reducer: bucket 0 launched twice", 1, true))
  T.truthy(C.bl_reducer_launch(r.r, 3) ~= 0)
  T.truthy(ffi.string(C.bl_last_error()):find("bucket 3 outside 0..2", 1, true))
  r:finish()
  T.raises(function() dist.Reducer{ grads = bl.zeros({ 2, 5 }) } end, "contiguous 1-d f32")
  T.raises(function() dist.Reducer{ grads = g, dtype = "fp8" } end, "fp32, bf16 or fp16")
  T.raises(function() dist.Reducer{ grads = g, bucket_mb = 0 } end, "bucket_mb")
end)

T.run()
