-- bertlua.train.device_step: the fine-tuning step of trainer.fit on a GPU, resident on the device as
-- pre-training's is (recipes/pretrain.lua). The host never waits inside a step:
--   * the batch reaches the device through trainer.fit's stager (bertlua.device.prefetch: pinned buffers, the copy
--     stream, the next micro-batch in flight), its targets too: step.prepare turns a host batch into the staged one,
--     the targets clamped and counted on the host where the batch was made;
--   * the head's loss is computed here, not by the head (whose forward reads its loss back, one wait per
--     micro-batch): ops.cross_entropy_counted (ops.mse_loss_into for a regression head, STS-B) writes each
--     micro-batch's loss into its own f64 slot on the device and its gradient, which goes back through
--     head:backward_logits;
--   * the optimizer step is queued with its loss-scale decision, skip and step count on the device
--     (amp.MixedPrecision:queue_step; fp16 dynamic loss scaling without a host round trip);
--   * index checks are deferred (device.defer_checks) and raised at the next log line.
-- On a logged step one read (device.StepStats:read) brings the loss slots, the accuracy counts and the scaler's
-- state back; the loss is then summed on the host exactly as the synchronous step sums it, so the logged losses
-- are that step's bits.
--
--   local make = device_step.for_model(model)   -- nil: the model has no head with a device step
--   local step = make{ model =, dev =, accum =, world =, mp =, optimizer =, reducer =, lr_at =, total =,
--     log_every =, set_rng = function(step, a) end }
--   local staged = step.prepare(host_batch)  -- what the stager gets: the inputs, the targets as tensors
--   local rec = step(step_no, next_batch)   -- loop.run's step hook, next_batch(a) on the device; nil: not logged
--   step.finish()                           -- after the last step: the scaler's totals, checks back on
local bl = require "bertlua.tensor"
local runtime = require "bertlua.runtime"
local ops = require "bertlua.nn.ops"
local buf = require "bertlua.nn.buffer"
local device = require "bertlua.train.device"
local dist = require "bertlua.train.dist"
local logm = require "bertlua.util.log"

local M = {}

local TARGET_KEYS = { start_positions = true, end_positions = true, labels = true }

-- targets(x, B, what[, dtype]) -> the host's values of a batch field as a list of B integers (or f32 values)
local function targets(x, B, what, dtype)
  if x == nil then error(("trainer: the batch has no %s (the training batches need them)"):format(what), 0) end
  local t = bl.as_tensor(x, { dtype = dtype or "i64" })
  if t:numel() ~= B then error(("trainer: %s must have one value per sequence"):format(what), 0) end
  return t:contiguous():view({ B }):totable()
end

-- The loss parts of the heads: QA has two (start and end positions, clamped to [0, S] and S ignored, weight 0.5
-- each, as bertlua.nn.SpanCriterion), classification one (labels, -100 ignored, with accuracy counts),
-- regression one (f32 labels, mean squared error as bertlua.nn.MSECriterion; `mse` set, nothing ignored).
-- targets(batch, B, S) -> list of {values (host), ignore, weight} for B sequences of S tokens (the QA logits have
-- S positions); logits(out) -> the parts' logits, in order
local HEADS = {
  qa = { nparts = 2, ncounts = 0,
    targets = function(batch, B, S)
      local function clamp(key)
        local v = targets(batch[key], B, key)
        for i = 1, B do v[i] = math.min(math.max(v[i], 0), S) end
        return v
      end
      return { { clamp("start_positions"), S, 0.5 }, { clamp("end_positions"), S, 0.5 } }
    end,
    logits = function(out) return { out.start_logits, out.end_logits } end,
    loss = function(l, a) return (l[2 * a - 1] + l[2 * a]) / 2 end,
    backward = function(model, d) model:backward_logits(d[1], d[2]) end },
  classification = { nparts = 1, ncounts = 2,
    targets = function(batch, B) return { { targets(batch.labels, B, "labels"), -100, 1 } } end,
    logits = function(out) return { out.logits } end,
    loss = function(l, a) return l[a] end,
    backward = function(model, d) model:backward_logits(d[1]) end },
  regression = { nparts = 1, ncounts = 0, mse = true,
    targets = function(batch, B) return { { targets(batch.labels, B, "labels", "f32"), nil, 1 } } end,
    logits = function(out) return { out.logits } end,
    loss = function(l, a) return l[a] end,
    backward = function(model, d) model:backward_logits(d[1]) end },
}

-- the staged batch's fields besides the model's inputs: part k's targets (a tensor) and its ignore, weight and
-- count of targets not ignored (host values, which the stager keeps)
local function target_key(k) return "target" .. k end
local STAGED = { target1 = true, target2 = true, parts = true }

-- prepare(head, batch) -> the batch to stage: the inputs as they are, the targets of each part as a tensor
local function prepare(head, batch)
  local ids = batch.input_ids
  if not bl.is_tensor(ids) or ids:dim() ~= 2 then
    error("trainer: the batch needs input_ids of shape [batch, sequence] (a tensor)", 0)
  end
  local out, parts = { parts = {} }, head.targets(batch, ids:size(1), ids:size(2))
  for k, v in pairs(batch) do
    if STAGED[k] then error(("trainer: the batch field %s is reserved for the device step"):format(k), 0) end
    if not TARGET_KEYS[k] then out[k] = v end
  end
  for k, p in ipairs(parts) do
    local count = 0
    for _, v in ipairs(p[1]) do if v ~= p[2] then count = count + 1 end end
    out[target_key(k)] = bl.from(p[1], { dtype = head.mse and "f32" or "i32" })
    out.parts[k] = { ignore = p[2], weight = p[3], count = count }
  end
  return out
end

-- for_model(model) -> the step maker for the model's head, or nil when its head has none
function M.for_model(model)
  local head = model.qa_outputs and HEADS.qa
    or model.classifier and ((model.num_labels or 2) > 1 and HEADS.classification or HEADS.regression) or nil
  if head then return function(o) return M.new(o, head) end end
end

function M.new(o, head)
  local model, dev, accum, world, mp = o.model, o.dev, o.accum, o.world, o.mp
  local np = head.nparts
  local stats = device.StepStats(dev, accum * np, head.ncounts)
  local slots = {}   -- the f64 [1] loss slot of (micro-batch, part), made once
  for i = 1, accum * np do slots[i] = stats.losses:narrow(1, i, 1) end
  local grads = { device = dev }   -- the logits' gradients, device buffers reused every step
  device.defer_checks(dev)
  o.optimizer:prepare()   -- with the scaler's state and the stats: device memory made before the first step
  mp:state_tensor()
  local since, seqs, skipped_logged, last = logm.clock(), 0, 0, nil

  -- micro_batch(a, batch, seed): batch is a prepared one, on the device (its targets were staged with it)
  local function micro_batch(a, batch, seed)
    local inputs = {}
    for k, v in pairs(batch) do
      if not STAGED[k] then inputs[k] = v end
    end
    local logits, d = head.logits(model:forward(inputs)), {}
    for k, p in ipairs(batch.parts) do
      local slot, x, t = slots[(a - 1) * np + k], logits[k], batch[target_key(k)]
      d[k] = buf(grads, "d" .. k, x:shape(), x:dtype())
      if head.mse then
        ops.mse_loss_into(x, t, slot, d[k], p.weight)
      else
        ops.cross_entropy_counted(x, t, p.ignore, p.count, slot, d[k], p.weight)
      end
      ops.scale_(d[k], seed)
      if head.ncounts > 0 then ops.accuracy_add(stats.counts, x, t, p.ignore) end
    end
    o.reducer:arm(a == accum)
    head.backward(model, d)
  end

  local function read(step)
    o.reducer:wait()   -- data parallel: the all-reduce under its watchdog (finish did not wait)
    local v = stats:read(mp:state_tensor())
    local r = mp:read(v.amp)
    local loss = 0
    for a = 1, accum do loss = loss + head.loss(v.losses, a) / accum end   -- the synchronous step's sum
    local s = dist.sum_numbers({ loss, v.counts[1] or 0, v.counts[2] or 0, seqs })
    if world > 1 then loss = s[1] / world end
    if loss ~= loss then error(("trainer: loss is NaN at step %d (precision %s)"):format(step, mp.precision), 0) end
    local now = logm.clock()
    local rec = { step = step, loss = loss, lr = o.optimizer.last_lr, grad_norm = r.grad_norm,
      seq_per_s = s[4] / (now - since), accuracy = head.ncounts > 0 and s[3] > 0 and s[2] / s[3] or nil,
      loss_scale = mp.dtype == "f16" and r.loss_scale or nil,
      skipped = r.skipped > skipped_logged and r.skipped - skipped_logged or nil }   -- steps since the last line
    local k = runtime.cuda_counters(dev)   -- totals since the start: allocations and host waits of the device
    rec.cuda_mallocs, rec.cuda_syncs = k.mallocs, k.syncs
    since, seqs, skipped_logged, last = now, 0, r.skipped, rec
    return rec
  end

  local step = setmetatable({}, { __call = function(_, n, next_batch)
    model:zero_grad()
    mp:begin_step()
    local seed = mp:loss_seed(accum)   -- fp16: the loss scale / accum on the device
    if head.ncounts > 0 then stats.counts:zero_() end
    for a = 1, accum do
      o.set_rng(n, a)
      local batch = next_batch(a)
      micro_batch(a, batch, seed)
      seqs = seqs + batch.input_ids:size(1)
    end
    mp:end_backward{ rounded = true }   -- the reducer rounds (fit's on_final)
    o.reducer:finish{ scale = 1 / world }   -- the mean over ranks; the optimizer runs after the sums
    mp:queue_step(o.optimizer, o.lr_at(o.optimizer.step_count + 1))   -- skip or update decided on the device
    if n % o.log_every ~= 0 and n ~= o.total then return nil end
    return read(n)
  end })

  function step.prepare(batch) return prepare(head, batch) end

  -- finish() -> {loss = the last logged loss, skipped = steps skipped in all}: deferred checks back off
  function step.finish()
    local r = mp:read()
    device.defer_checks(dev, false)
    return { loss = last and last.loss, skipped = r.skipped }
  end
  return step
end

return M
