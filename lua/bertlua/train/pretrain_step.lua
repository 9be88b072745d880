-- bertlua.train.pretrain_step: one pre-training optimizer step, as recipes/pretrain.lua runs it and
-- recipes/benchmark.lua times it.
--
--   local PretrainStep = require("bertlua.train.pretrain_step").PretrainStep
--   local s = PretrainStep{ model = m, optimizer = lamb, amp = mp, dev = dev, accum = 2,
--     dropout_seed = function(step, micro) ... end, reducer = r, world = 1, rank = 0 }
--   local seqs = s:run(step, next_batch, lr)   -- queued on the device; no host wait
--   local v = s:read()                          -- the one wait: {losses, counts, amp} of the steps since zero
--
-- A step: zero the gradients once, for each of `accum` micro-batches forward (losses and accuracy counts summed
-- into device-side stats) and backward (which adds its gradients into the flat buffer: dW GEMMs with beta = 1, the
-- bias, LayerNorm and embedding sums added where they are written), the mean over ranks, then the optimizer step
-- queued through the mixed-precision object (the skip/update decision and the loss scale stay on the device). A
-- model with a half compute copy (model:to{dtype=}) gets it written by the optimizer's update pass (or refreshed
-- after it).
-- s:use_graph() (--cuda-graph): from then on the micro-batches are fetched and copied into fixed device
-- buffers first; once a run allocates no device memory (the warm-up: one or two steps, s.graph_ready), everything
-- above is captured and launched as one CUDA graph (bertlua.train.graph), the reducer's collectives included.
local bl = require "bertlua"
local device = require "bertlua.train.device"
local graph = require "bertlua.train.graph"

local M = {}

local Step = {}
Step.__index = Step

-- The embedding tables' gradients are sums chained row by row from the buffer's value (the segmented scatter; the
-- word table also takes the tied MLM decoder's dW first), so added in place they would round differently from a
-- sum over ranks. They keep their own accumulation (12 + 4 bytes per table element and micro-batch, ~10 % of
-- BERT's parameters): each micro-batch's table gradients are formed in a zeroed range and added to `acc` in micro-batch
-- order, as an all-reduce adds ranks, so N ranks x A micro-batches give the bits of 1 x N*A. With a reducer, the sum
-- is added by an on_final hook that runs before the others (the range is final there).
local function tables_of(model, reducer)
  local lo, hi
  for _, e in ipairs(model:parameters()) do
    if e.name:find("_embeddings%.weight$") then
      lo, hi = math.min(lo or e.offset, e.offset), math.max(hi or 0, e.offset + e.numel)
    end
  end
  if not lo then return nil end
  local t = { lo = lo, hi = hi, view = model.flat_grads:narrow(1, lo + 1, hi - lo) }
  t.acc = bl.zeros_like(t.view)
  if reducer then
    reducer:on_final(function(a, b)
      local x, y = math.max(a, lo), math.min(b, hi)
      if x < y then model.flat_grads:narrow(1, x + 1, y - x):add_(t.acc:narrow(1, x - lo + 1, y - x)) end
    end, { first = true })
  end
  return t
end

function M.PretrainStep(o)
  for _, k in ipairs({ "model", "optimizer", "amp", "dev", "dropout_seed" }) do
    if o[k] == nil then error("PretrainStep: missing field '" .. k .. "'", 2) end
  end
  local self = setmetatable({ model = o.model, optimizer = o.optimizer, amp = o.amp, dev = o.dev,
    accum = o.accum or 1, world = o.world or 1, rank = o.rank or 0, reducer = o.reducer,
    dropout_seed = o.dropout_seed, stats = device.StepStats(o.dev), on_device = {} }, Step)
  if self.accum > 1 then self.tables = tables_of(o.model, self.reducer) end
  -- device memory the step needs, made before its first run (a captured step may not allocate)
  device.defer_checks(o.dev)
  o.optimizer:prepare()
  o.amp:state_tensor()
  return self
end

-- use_graph(): later runs as a CUDA graph, once warmed up. A captured step may not allocate, so runs go
-- uncaptured until one has found every block it needs in the allocator's cache (the first allocates its
-- buffers; the blocks those took from the cache may make the next allocate a little too).
function Step:use_graph()
  self.graph = graph.Graph(self.dev)
  self.graph_ready = false
  for a = 1, self.accum do self.on_device[a] = {} end
  return self
end

-- The step's device work on the micro-batches get(a) (already on the device). With a reducer (recipes/pretrain.lua,
-- which makes one on every world size), the last micro-batch's backward hands each layer's range to it as it
-- returns (reducer:arm): the range is final there (the backward added the last micro-batch's gradients to the
-- earlier ones'; the reducer's on_final hook rounds it to bf16/fp16) and its buckets are launched; finish() does the
-- ranges left.
local function queue(self, step, get, lr)
  local model, accum, reducer, tables = self.model, self.accum, self.reducer, self.tables
  model:zero_grad()
  self.amp:begin_step()
  local seed = self.amp:loss_seed(accum)  -- fp16: the loss scale on the model's device
  self.stats:zero()
  for a = 1, accum do
    if self.mark then self.mark("micro") end   -- the step-time model's split (bertlua.stepmodel.parts)
    model.rng = bl.Generator(self.dropout_seed(step, self.rank * accum + a - 1))
    model:apply(function(m) m.rng = model.rng end)
    model:forward(get(a), self.stats)
    if tables and a > 1 then
      tables.acc:add_(tables.view)
      tables.view:zero_()
    end
    if reducer then reducer:arm(a == accum) end
    model:backward(seed)
  end
  if self.mark then self.mark("step") end
  if reducer then
    self.amp:end_backward{ rounded = true }
    reducer:finish{ scale = 1 / self.world }  -- the mean over ranks; the optimizer waits for it on the device
  else
    if tables then tables.view:add_(tables.acc) end
    self.amp:end_backward()
  end
  if tables then tables.acc:zero_() end
  self.amp:queue_step(self.optimizer, lr)
  -- an optimizer built with model= writes the half compute copy in its update pass
  if model.compute_dtype and not self.optimizer:half() then model:sync_compute() end
end

-- run(step, next_batch, lr) -> sequences in the step. next_batch(a) gives micro-batch a (1..accum) on the CPU or
-- the device; step numbers the dropout streams.
function Step:run(step, next_batch, lr)
  local seqs = 0
  if not self.graph then
    queue(self, step, function(a)
      local b = next_batch(a)
      seqs = seqs + b.input_ids:size(1)
      return device.batch_to(b, self.dev, self.on_device)
    end, lr)
    return seqs
  end
  local batches = {}
  for a = 1, self.accum do
    local b = next_batch(a)
    seqs = seqs + b.input_ids:size(1)
    batches[a] = device.batch_to(b, self.dev, self.on_device[a], true)
  end
  local function get(a) return batches[a] end
  if self.graph_ready then
    local ok, err = pcall(self.graph.run, self.graph, queue, self, step, get, lr)
    if ok then return seqs end
    -- an allocation refused in the capture (work outside the step, an evaluation, took cached blocks): nothing
    -- of the step ran and only device work was queued, so the step runs uncaptured below, warming up again (the
    -- reducer forgets the buckets it launched into the dropped capture)
    if not graph.refused_allocation(err) then error(err, 0) end
    if self.reducer then self.reducer:cancel() end
  end
  local m0 = bl.cuda_counters(self.dev).mallocs
  queue(self, step, get, lr)
  self.graph_ready = bl.cuda_counters(self.dev).mallocs == m0
  return seqs
end

-- read() -> {losses = {total, mlm, nsp}, counts = {mlm correct, mlm counted, nsp correct, nsp counted}, amp = {...}}:
-- the sums since the last step began and the amp state, with one host wait (device.StepStats:read).
function Step:read()
  if self.reducer then self.reducer:wait() end  -- data parallel: the all-reduce under its watchdog
  return self.stats:read(self.amp:state_tensor())
end

-- graph_stats() -> nil without a graph, else {nodes, instantiations, updates, launches} (bertlua.train.graph)
function Step:graph_stats()
  return self.graph and self.graph:stats() or nil
end

return M
