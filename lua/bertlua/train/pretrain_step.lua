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
-- buffers first, and the step's host-made inputs (learning rate, dropout seeds, MLM rows, NSP labels) copied into
-- one device block (Inputs below); once a run allocates no device memory (the warm-up: one or two steps,
-- s.graph_ready), everything above is captured once as a CUDA graph (bertlua.device.graph), the reducer's
-- collectives included, and every later step replays it (s.captures, s.replays; s.capture_reason says why the
-- last capture was made).
local bl = require "bertlua.tensor"
local runtime = require "bertlua.runtime"
local core = require "bertlua.core"
local device = require "bertlua.train.device"
local graph = require "bertlua.device.graph"
local ops = require "bertlua.nn.ops"
local C, ffi, check = core.C, core.ffi, core.check

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
-- buffers; the blocks those took from the cache may make the next allocate a little too). Then the step is
-- captured once and replayed: what changes from step to step reaches the device as data (Inputs below).
function Step:use_graph()
  self.graph = graph.Graph(self.dev)
  self.graph_ready = false
  self.captures, self.replays = 0, 0
  for a = 1, self.accum do self.on_device[a] = {} end
  return self
end

-- Inputs: what a step takes from the host, in one device block that the captured kernels read, so that a replay
-- of the graph computes the new step: the learning rate (bl_amp_config.lr_from), each micro-batch's dropout seed
-- (a seed slot, bl_ops.h BL_SEED_SLOT), MLM rows and labels (BertForPreTraining:mlm_rows) and NSP labels. The host
-- writes them into an image of the block and one copy on the compute stream puts it there before the launch
-- (graph:set_inputs: pinned, double-buffered). sizes[a] = {MLM rows, NSP labels} of micro-batch a; a block for other
-- sizes is a new allocation, so the graph is captured again.
local DT = { f64 = { C.BL_F64, "double *", 8 }, i64 = { C.BL_I64, "int64_t *", 8 }, i32 = { C.BL_I32, "int32_t *", 4 } }

local function Inputs(dev, sizes)
  local fields, bytes = {}, 0
  local function add(dtype, n)
    fields[#fields + 1] = { dtype = dtype, n = n, off = bytes }
    bytes = bytes + math.ceil(n * DT[dtype][3] / 8) * 8
    return #fields
  end
  local lr, seeds, rows = add("f64", 1), add("i64", #sizes), {}
  for a, s in ipairs(sizes) do rows[a] = { add("i32", s[1]), add("i32", s[1]), s[2] > 0 and add("i32", s[2]) } end
  local self = { sizes = sizes, bytes = bytes, block = bl.zeros({ bytes / 8 }, { dtype = "i64", device = dev }),
    image = ffi.new("uint8_t[?]", bytes) }
  local base = ffi.cast("uint8_t *", self.block.data_)
  local views, host = {}, {}
  for i, f in ipairs(fields) do
    local out = ffi.new("bl_tensor *[1]")
    check(C.bl_tensor_wrap(base + f.off, 1, ffi.new("int64_t[1]", f.n), nil, DT[f.dtype][1], dev, out))
    views[i], host[i] = bl.wrap(out[0]), ffi.cast(DT[f.dtype][2], self.image + f.off)
  end
  self.lr, self.lr_host, self.seed_host = views[lr], host[lr], host[seeds]
  self.slots, self.rows, self.nsp, self.rows_host = {}, {}, {}, {}
  for a, r in ipairs(rows) do
    self.slots[a] = ops.seed_slot(views[seeds], a)
    self.rows[a] = { views[r[1]], views[r[2]] }
    self.nsp[a] = r[3] and views[r[3]] or nil
    self.rows_host[a] = { host[r[1]], host[r[2]], r[3] and host[r[3]] }
  end
  return self
end

local function same_sizes(x, y)
  if #x ~= #y then return false end
  for a = 1, #x do if x[a][1] ~= y[a][1] or x[a][2] ~= y[a][2] then return false end end
  return true
end

-- The micro-batches of a graphed step: fetched, their tensors copied into fixed device buffers, their host-made
-- inputs (MLM rows, NSP labels) and the step's seeds and learning rate written into the inputs' image and copied
-- to the device. Returns the device batches and the sequence count; self.relayout = why the inputs block changed.
local function stage(self, step, next_batch, lr)
  local batches, sizes, host, seqs = {}, {}, {}, 0
  self.relayout = nil
  for a = 1, self.accum do
    local b = next_batch(a)
    seqs = seqs + b.input_ids:size(1)
    local pos, lab = self.model:mlm_rows(b)
    if not pos then error("PretrainStep: --cuda-graph needs MLM targets in every micro-batch (masked_lm_positions "
      .. "and masked_lm_labels, or labels)", 0) end
    local nsp = b.next_sentence_labels or b.next_sentence_label
    nsp = nsp and bl.as_tensor(nsp):totable() or {}
    sizes[a], host[a] = { pos:numel(), #nsp }, { pos, lab, nsp }
    batches[a] = device.batch_to(b, self.dev, self.on_device[a], true)
  end
  local ins = self.inputs
  if not (ins and same_sizes(ins.sizes, sizes)) then
    self.relayout = ins and "the micro-batches' MLM rows or NSP labels changed in number" or "first step"
    if ins then ins.block:free() end
    ins = Inputs(self.dev, sizes)
    self.inputs = ins
    self.amp:state_tensor()   -- the amp config exists from here on: the optimizer reads the rate from the block
    self.amp.amp_cfg.lr_from = ins.lr
  end
  if type(lr) ~= "number" or lr ~= lr or lr < 0 then
    error(("PretrainStep: learning rate must be a finite number >= 0, got %s"):format(tostring(lr)), 0)
  end
  ins.lr_host[0] = lr
  for a = 1, self.accum do
    ins.seed_host[a - 1] = self.dropout_seed(step, self.rank * self.accum + a - 1)
    local h, n = ins.rows_host[a], sizes[a][1]
    ffi.copy(h[1], host[a][1]:ptr(), 4 * n)
    ffi.copy(h[2], host[a][2]:ptr(), 4 * n)
    for i, v in ipairs(host[a][3]) do h[3][i - 1] = v end
    local d = batches[a]
    d.mlm_rows, d.masked_lm_positions, d.masked_lm_labels, d.labels = ins.rows[a], nil, nil, nil
    d.next_sentence_labels, d.next_sentence_label = ins.nsp[a], nil
  end
  check(C.bl_cuda_graph_set_inputs(self.graph.g, ins.block, ins.image, ins.bytes))
  return batches, seqs
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
  -- a number (1/accum) goes into the forward's cross-entropy: no extra pass over the MLM logits' gradients
  self.stats.grad_scale = type(seed) == "number" and seed or nil
  for a = 1, accum do
    if self.mark then self.mark("micro") end   -- the step-time model's split (bertlua.stepmodel.parts)
    -- with a graph, the seed is read from the inputs block when the kernels run
    model.rng = bl.Generator(self.inputs and self.inputs.slots[a] or self.dropout_seed(step, self.rank * accum + a - 1))
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
  local batches
  batches, seqs = stage(self, step, next_batch, lr)
  local function get(a) return batches[a] end
  -- (the step-time model, self.mark, records the launches a capture makes: a replay makes none on the host)
  if self.graph_ready and not self.relayout and not self.mark and self.graph:replayable() then
    -- the step captured before, unchanged; the host's record of it kept as the captured code keeps it
    self.graph:replay()
    self.replays = self.replays + 1
    self.optimizer:count_step(lr)
    if self.reducer then self.reducer:replayed() end
    return seqs
  end
  if self.graph_ready then
    self.capture_reason = self.relayout or (self.captures == 0 and "first capture")
      or (self.mark and "the step-time model records this step's launches")
      or "a device block was handed out since the last capture (work outside the step allocated)"
    local ok, err = pcall(self.graph.run, self.graph, queue, self, step, get, lr)
    if ok then
      self.captures = self.captures + 1
      return seqs
    end
    -- an allocation refused in the capture (work outside the step, an evaluation, took cached blocks; a new batch
    -- shape): nothing of the step ran and only device work was queued, so the step runs uncaptured below, warming
    -- up again (the reducer forgets the buckets it launched into the dropped capture; the model's caches filled
    -- in it were dropped by graph.on_abort)
    if not graph.refused_allocation(err) then error(err, 0) end
    if self.reducer then self.reducer:cancel() end
  end
  local m0 = runtime.cuda_counters(self.dev).mallocs
  queue(self, step, get, lr)
  self.graph_ready = runtime.cuda_counters(self.dev).mallocs == m0
  return seqs
end

-- read() -> {losses = {total, mlm, nsp}, counts = {mlm correct, mlm counted, nsp correct, nsp counted}, amp = {...}}:
-- the sums since the last step began and the amp state, with one host wait (device.StepStats:read).
function Step:read()
  if self.reducer then self.reducer:wait() end  -- data parallel: the all-reduce under its watchdog
  return self.stats:read(self.amp:state_tensor())
end

-- graph_stats() -> nil without a graph, else {nodes, instantiations, updates, launches, replays} (bertlua.device.graph)
-- and captures (this step's), capture_reason (why the last one was made)
function Step:graph_stats()
  if not self.graph then return nil end
  local s = self.graph:stats()
  s.captures, s.capture_reason = self.captures, self.capture_reason
  return s
end

return M
