-- bertlua.batched: batched inference over a model (recipes/predict.lua, squad.lua, glue.lua), with latency
-- percentiles, and the padding of token rows into a batch.
--
--   local batched = require "bertlua.batched"
--   local stats = batched.predict{ model = m, n = #features, batch = 32, device = -1,   -- or N: cuda:N
--                                make_batch = function(indices) ... end, consume = function(indices, out) ... end }
--   print(batched.format_latency(stats))
--   local batch, S = batched.pad_rows({ { ids = {...}, types = {...} }, ... }, max_len)
--
-- Under mpirun (bertlua.train.dist) predict shards the batches over the ranks (round robin) and hands every output
-- to consume on rank 0 only, in order.
local bl = require "bertlua.tensor"
local logm = require "bertlua.util.log"
local amp = require "bertlua.train.amp"
local device = require "bertlua.train.device"
local dist = require "bertlua.train.dist"
local prefetch = require "bertlua.device.prefetch"

local M = {}

local function percentile(sorted, p)
  if #sorted == 0 then return 0 end
  local k = math.max(1, math.min(#sorted, math.ceil(p / 100 * #sorted)))
  return sorted[k]
end

local OUTPUTS = { "logits", "start_logits", "end_logits" }
-- NaN or an infinity in the outputs is an error naming the example (o.describe(i), else its number) and the
-- precision, instead of junk or empty predictions with exit 0
local function check_outputs(o, idx, out)
  for _, k in ipairs(OUTPUTS) do
    local t = out[k]
    if t then
      local v = t:contiguous():totable()
      local per = #v / #idx
      for j = 1, #v do
        local x = v[j]
        if x ~= x or x == math.huge or x == -math.huge then
          local i = idx[math.floor((j - 1) / per) + 1]
          local prec = o.precision or "fp32"
          error(("%s: the model's %s are not finite for %s (precision %s)%s"):format(o.name or "predict", k,
            o.describe and o.describe(i) or ("example " .. i), prec, prec == "fp16"
              and ": fp16 overflowed (its largest value is 65504); use --precision=bf16 or fp32" or ""), 0)
        end
      end
    end
  end
end

-- a batch's outputs from the rank that computed them (owner) to every rank: a header of shapes, then
-- each output as f32 (exact for the f16/bf16 a half-precision model gives)
local MAXDIM = 4
local function share_outputs(out, owner)
  local me = dist.rank() == owner
  local head = bl.zeros({ #OUTPUTS * (MAXDIM + 1) }, { dtype = "f64" })
  if me then
    local h = head:ptr()
    for k, key in ipairs(OUTPUTS) do
      local t = out[key]
      if t then
        if t:dim() > MAXDIM then
          error(("predict: output %s has %d dims (at most %d)"):format(key, t:dim(), MAXDIM), 0)
        end
        h[(k - 1) * (MAXDIM + 1)] = t:dim()
        for d = 1, t:dim() do h[(k - 1) * (MAXDIM + 1) + d] = t:size(d) end
      end
    end
  end
  dist.broadcast(head, owner)
  local h, res = head:totable(), {}
  for k, key in ipairs(OUTPUTS) do
    local nd = h[(k - 1) * (MAXDIM + 1) + 1]
    if nd > 0 then
      local shape = {}
      for d = 1, nd do shape[d] = h[(k - 1) * (MAXDIM + 1) + 1 + d] end
      local t = me and out[key]:to("f32"):contiguous() or bl.zeros(shape)
      res[key] = dist.broadcast(t, owner)
    end
  end
  return res
end

-- predict{model, n, batch, make_batch(indices), consume(indices, out), device} in eval mode;
-- returns {sequences, seconds, seq_per_s, p50_ms, p90_ms, p99_ms} (latency per batch: on a GPU
-- until the outputs are back on the host, which consume receives them on). Under mpirun batch k
-- runs on rank (k - 1) % world and consume runs on rank 0 only, for every batch in order; the
-- latencies are rank 0's own batches. On a GPU the batches go through pinned memory
-- (bertlua.device.prefetch): the rank's next batch is copied while the current one runs.
function M.predict(o)
  if not (type(o.batch) == "number" and o.batch >= 1 and o.batch % 1 == 0) then
    error(("%s: batch size must be an integer >= 1, got %s"):format(o.name or "predict", tostring(o.batch)), 0)
  end
  local model, dev, precision = o.model, o.device or -1, o.precision or "fp32"
  -- on a GPU bf16/fp16 train on the half compute copy, never on the emulation of the CPU (bertlua.train.amp)
  local known, half = pcall(amp.storage_dtype, precision)   -- an unknown one: MixedPrecision's error below
  if dev >= 0 and known and half and model.compute_dtype ~= half then amp.model_to(model, dev, precision) end
  local rank, world = dist.rank(), dist.size()
  model:eval()
  local lat = {}
  local t_all = logm.clock()
  local batches = {}   -- the examples of batch k
  for first = 1, o.n, o.batch do
    local idx = {}
    for i = first, math.min(first + o.batch - 1, o.n) do idx[#idx + 1] = i end
    batches[#batches + 1] = idx
  end
  local stage = dev >= 0 and prefetch.Stager(dev) or nil
  local function put_after(k)   -- this rank's first batch after batch k on its way to the device
    for j = k + 1, #batches do
      if (j - 1) % world == rank then return stage:put(o.make_batch(batches[j])) end
    end
  end
  if stage then put_after(0) end
  for k, idx in ipairs(batches) do
    local owner, out = (k - 1) % world, nil
    if owner == rank then
      local b
      if stage then b = stage:get(); put_after(k) else b = o.make_batch(idx) end
      local t0 = logm.clock()
      out = model:forward(b)
      if dev >= 0 then out = device.batch_to(out, -1) end
      lat[#lat + 1] = (logm.clock() - t0) * 1000
      check_outputs(o, idx, out)
    end
    if world > 1 then out = share_outputs(out, owner) end
    if o.consume and rank == 0 then o.consume(idx, out) end
  end
  if stage then stage:close() end
  local dt = logm.clock() - t_all
  table.sort(lat)
  return { sequences = o.n, seconds = dt, seq_per_s = o.n / dt, p50_ms = percentile(lat, 50),
    p90_ms = percentile(lat, 90), p99_ms = percentile(lat, 99), batches = #lat }
end

function M.format_latency(s)
  return ("%d sequences in %.2f s: %.1f sequences/s; latency per batch p50 %.1f ms, p90 %.1f ms, p99 %.1f ms")
    :format(s.sequences, s.seconds, s.seq_per_s, s.p50_ms, s.p90_ms, s.p99_ms)
end

-- tensors for a list of {ids = {...}, types = {...}} rows, padded to the longest (multiple of 8)
function M.pad_rows(rows, max_len)
  local S = 8
  for _, r in ipairs(rows) do if #r.ids > S then S = #r.ids end end
  S = math.min(math.ceil(S / 8) * 8, max_len or math.huge)
  local B = #rows
  local ids, tt, am = bl.zeros({ B, S }, { dtype = "i32" }), bl.zeros({ B, S }, { dtype = "i32" }), bl.zeros({ B, S },
    { dtype = "i32" })
  local pi, pt, pm = ids:ptr(), tt:ptr(), am:ptr()
  for b, r in ipairs(rows) do
    for i = 1, math.min(#r.ids, S) do
      pi[(b - 1) * S + i - 1] = r.ids[i]
      pt[(b - 1) * S + i - 1] = r.types and r.types[i] or 0
      pm[(b - 1) * S + i - 1] = 1
    end
  end
  return { input_ids = ids, token_type_ids = tt, attention_mask = am }, S
end

return M
