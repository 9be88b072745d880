-- bertlua.train.step: the one training step. Pre-training (recipes/pretrain.lua), fine-tuning (trainer.fit:
-- SQuAD, GLUE with every head, STS-B included) and recipes/benchmark.lua run it, on the CPU and on a GPU; the task
-- passes its loss in.
--
--   local tstep = require "bertlua.train.step"
--   local s = tstep.Step{ model = m, optimizer = lamb, amp = mp, dev = dev, loss = tstep.pretraining_loss(),
--     accum = 2, seed = 12439, reducer = r, world = 1, rank = 0 }
--   local seqs = s:run(n, next_batch, lr)   -- step n, next_batch(a) = micro-batch a; queued, no host wait
--   local rec = s:record(n)                  -- the one wait: step n's log line (throughput since the last one)
--
-- A step: zero the gradients once; for each of `accum` micro-batches pick its dropout stream, forward, the loss
-- (the loss object), backward, which adds its gradients into the flat buffer; the mean over ranks (the reducer,
-- launched layer by layer while backward runs); then the optimizer step through the mixed-precision object. The
-- options of the one object:
--   accum          gradient accumulation: micro-batches per optimizer step
--   amp            bertlua.train.amp.MixedPrecision: bf16/fp16 (a GPU's half compute copy or the CPU's emulation),
--                  fp16's dynamic loss scale
--   reducer        bertlua.train.dist.Reducer: the data-parallel all-reduce (world, rank: this job's)
--   seed           the dropout streams: dropout_seed(seed, n, j) for global micro-batch j = rank * accum + a - 1
--   synchronous    the loss read back after every micro-batch and the loss scaler's skip decided on the host
--                  (the model's own loss, model_loss(); fine-tuning on the CPU); otherwise the losses, the loss
--                  scale and the skip stay on the model's device and record() reads them, once per log line
--   exact_tables   (default true) accumulated embedding-table gradients summed as an all-reduce sums ranks (below)
--   :use_graph()   GPU pre-training: the step captured once as a CUDA graph and replayed (say(line), optional:
--                  told why a step was captured again; name: the recipe that says it)
-- A loss (pretraining_loss, head_loss, model_loss) is a table: stats(dev, accum) -> device.StepStats (the sums it
-- adds on the device), forward(model, batch, stats, a, seed) -> the micro-batch's loss on the host (synchronous) or
-- nil, backward(model, seed), sums(values, accum) -> the numbers summed over ranks for a log line, fields(sums,
-- accum, world) -> its fields of the log line, prepare(batch) (optional) -> the batch the GPU stager copies.
local bl = require "bertlua.tensor"
local runtime = require "bertlua.runtime"
local core = require "bertlua.core"
local ops = require "bertlua.nn.ops"
local buf = require "bertlua.nn.buffer"
local logm = require "bertlua.util.log"
local device = require "bertlua.train.device"
local dist = require "bertlua.train.dist"
local graph = require "bertlua.device.graph"
local C, ffi, check = core.C, core.ffi, core.check

local M = {}

-- dropout_seed(seed, n, j): the dropout stream of global micro-batch j (0-based, rank * accum + a - 1) of step n:
-- a function of (seed, n, j) only, so a resumed run sees the same masks, and N ranks x A micro-batches those of
-- 1 rank x N*A.
function M.dropout_seed(seed, n, j)
  return ((seed * 1000003 + n) * 8191 + j) % 9007199254740881
end

-- Losses ---------------------------------------------------------------------------------------------------------

-- pretraining_loss(): BertForPreTraining's MLM + NSP, summed into device-side stats by its forward(batch, stats):
-- losses {total, mlm, nsp} and counts {mlm correct, mlm counted, nsp correct, nsp counted}. A number seed (1/accum,
-- no loss scaling) goes into the forward's cross-entropy: no extra pass over the MLM logits' gradients.
function M.pretraining_loss()
  return { pretraining = true,
    stats = function(dev) return device.StepStats(dev) end,
    forward = function(model, batch, stats, _, seed)
      stats.grad_scale = type(seed) == "number" and seed or nil
      model:forward(batch, stats)
    end,
    backward = function(model, seed) model:backward(seed) end,
    sums = function(v) return { v.losses[1], v.losses[2], v.counts[1], v.counts[2], v.counts[3], v.counts[4] } end,
    fields = function(s, accum, world)
      return { loss = s[1] / (accum * world), mlm_loss = s[2] / (accum * world),
        mlm_acc = s[4] > 0 and s[3] / s[4] or 0, nsp_acc = s[6] > 0 and s[5] / s[6] or 0 }
    end }
end

-- model_loss(): the loss the model's forward computes itself (out.loss), read back after every micro-batch: the
-- synchronous step's.
function M.model_loss()
  return { host = true,
    forward = function(model, batch) return model:forward(batch).loss end,
    backward = function(model, seed) model:backward(seed) end }
end

-- The fine-tuning heads' losses on the device. QA has two parts (start and end positions, clamped to [0, S] and S
-- ignored, weight 0.5 each, as bertlua.nn.SpanCriterion), classification one (labels, -100 ignored, with accuracy
-- counts), regression one (f32 labels, mean squared error as bertlua.nn.MSECriterion; nothing ignored). Each
-- micro-batch's part writes its loss into its own f64 slot (ops.cross_entropy_counted, ops.mse_loss_into) and its
-- logits' gradient, which goes back through the head's backward_logits.
--   targets(batch, B, S) -> list of {values (host), ignore, weight}; logits(out) -> the parts' logits, in order

-- targets(x, B, what[, dtype]) -> the host's values of a batch field as a list of B integers (or f32 values)
local function targets(x, B, what, dtype)
  if x == nil then error(("trainer: the batch has no %s (the training batches need them)"):format(what), 0) end
  local t = bl.as_tensor(x, { dtype = dtype or "i64" })
  if t:numel() ~= B then error(("trainer: %s must have one value per sequence"):format(what), 0) end
  return t:contiguous():view({ B }):totable()
end

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
local TARGET_KEYS = { start_positions = true, end_positions = true, labels = true }
local STAGED = { target1 = true, target2 = true, parts = true }

-- head_loss(model) -> the device loss of the model's head, or nil when it has none of the heads above
function M.head_loss(model)
  local head = model.qa_outputs and HEADS.qa
    or model.classifier and ((model.num_labels or 2) > 1 and HEADS.classification or HEADS.regression) or nil
  if not head then return nil end
  local np, slots, grads, d = head.nparts, {}, {}, {}
  local L = {}
  function L.stats(dev, accum)
    grads.device = dev   -- the logits' gradients, device buffers reused every step
    local s = device.StepStats(dev, accum * np, head.ncounts)
    for i = 1, accum * np do slots[i] = s.losses:narrow(1, i, 1) end   -- (micro-batch, part)'s slot, made once
    return s
  end
  -- prepare(batch) -> the batch to stage: the inputs as they are, the targets of each part as a tensor
  function L.prepare(batch)
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
      out["target" .. k] = bl.from(p[1], { dtype = head.mse and "f32" or "i32" })
      out.parts[k] = { ignore = p[2], weight = p[3], count = count }
    end
    return out
  end
  -- forward of a prepared batch on the device (its targets were staged with it); the gradients scaled by seed
  function L.forward(m, batch, stats, a, seed)
    local inputs = {}
    for k, v in pairs(batch) do
      if not STAGED[k] then inputs[k] = v end
    end
    local logits = head.logits(m:forward(inputs))
    for k, p in ipairs(batch.parts) do
      local slot, x, t = slots[(a - 1) * np + k], logits[k], batch["target" .. k]
      d[k] = buf(grads, "d" .. k, x:shape(), x:dtype())
      if head.mse then
        ops.mse_loss_into(x, t, slot, d[k], p.weight)
      elseif head.ncounts > 0 then
        ops.cross_entropy_accuracy(x, t, p.ignore, p.count, slot, d[k], stats.counts, p.weight)
      else
        ops.cross_entropy_counted(x, t, p.ignore, p.count, slot, d[k], p.weight)
      end
      ops.scale_(d[k], seed)
    end
  end
  function L.backward(m) head.backward(m, d) end
  function L.sums(v, accum)   -- the micro-batches' mean, summed on the host as the synchronous step sums it
    local loss = 0
    for a = 1, accum do loss = loss + head.loss(v.losses, a) / accum end
    return { loss, v.counts[1] or 0, v.counts[2] or 0 }
  end
  function L.fields(s, _, world)
    return { loss = world > 1 and s[1] / world or s[1],
      accuracy = head.ncounts > 0 and s[3] > 0 and s[2] / s[3] or nil }
  end
  return L
end

-- The step ------------------------------------------------------------------------------------------------------

local Step = {}
Step.__index = Step

-- The embedding tables' gradients are sums chained row by row from the buffer's value (the segmented scatter; the
-- word table also takes the tied MLM decoder's dW first), so added in place they would round differently from a
-- sum over ranks. With exact_tables they keep their own accumulation (12 + 4 bytes per table element and
-- micro-batch, ~10 % of BERT's parameters): each micro-batch's table gradients are formed in a zeroed range and
-- added to `acc` in micro-batch order, as an all-reduce adds ranks, so N ranks x A micro-batches give the bits of
-- 1 x N*A. With a reducer, the sum is added by an on_final hook that runs before the others (the range is final).
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

function M.Step(o)
  for _, k in ipairs({ "model", "optimizer", "amp", "dev", "loss" }) do
    if o[k] == nil then error("Step: missing field '" .. k .. "'", 2) end
  end
  if o.synchronous and not o.loss.host then error("Step: a synchronous step needs a host loss (model_loss)", 2) end
  if not o.synchronous and o.loss.host then error("Step: a host loss (model_loss) needs synchronous = true", 2) end
  local self = setmetatable({ model = o.model, optimizer = o.optimizer, amp = o.amp, dev = o.dev, loss = o.loss,
    accum = o.accum or 1, world = o.world or 1, rank = o.rank or 0, reducer = o.reducer, seed = o.seed or 0,
    synchronous = o.synchronous, name = o.name or "train", say = o.say, on_device = {}, skipped_logged = 0, seqs = 0,
    steps = 0, since = logm.clock() }, Step)
  -- device memory the step needs, made before its first run (a captured step may not allocate)
  if not self.synchronous then
    self.skipped_logged = o.amp:state_dict().skipped_steps or 0   -- (a resumed run's, before the state is made)
    self.stats = o.loss.stats(o.dev, self.accum)
  end
  if self.accum > 1 and o.exact_tables ~= false then self.tables = tables_of(o.model, self.reducer) end
  if not self.synchronous then
    device.defer_checks(o.dev)   -- index errors come from the next read
    o.optimizer:prepare()
    o.amp:state_tensor()
  end
  return self
end

-- use_graph(): later runs as a CUDA graph, once warmed up. A captured step may not allocate, so runs go
-- uncaptured until one has found every block it needs in the allocator's cache (the first allocates its
-- buffers; the blocks those took from the cache may make the next allocate a little too). Then the step is
-- captured once and replayed (s.captures, s.replays; s.capture_reason says why the last capture was made): what
-- changes from step to step reaches the device as data (Inputs below), the reducer's collectives included.
function Step:use_graph()
  if not self.loss.pretraining or self.synchronous then
    error("Step: the CUDA graph step is pre-training's (pretraining_loss)", 2)
  end
  self.graph = graph.Graph(self.dev)
  self.graph_ready = false
  self.captures, self.replays = 0, 0
  for a = 1, self.accum do self.on_device[a] = {} end
  return self
end

-- Inputs: what a graphed step takes from the host, in one device block that the captured kernels read, so that a
-- replay of the graph computes the new step: the learning rate (bl_amp_config.lr_from), each micro-batch's dropout
-- seed (a seed slot, bl_ops.h BL_SEED_SLOT), MLM rows and labels (BertForPreTraining:mlm_rows) and NSP labels. The
-- host writes them into an image of the block and one copy on the compute stream puts it there before the launch
-- (graph:set_inputs: pinned, double-buffered). sizes[a] = {MLM rows, NSP labels} of micro-batch a; a block for
-- other sizes is a new allocation, so the graph is captured again.
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

-- the dropout seed of micro-batch a of step n on this rank
function Step:micro_seed(n, a)
  return M.dropout_seed(self.seed, n, self.rank * self.accum + a - 1)
end

-- The micro-batches of a graphed step: fetched, their tensors copied into fixed device buffers, their host-made
-- inputs (MLM rows, NSP labels) and the step's seeds and learning rate written into the inputs' image and copied
-- to the device. Returns the device batches and the sequence count; self.relayout = why the inputs block changed.
local function stage(self, n, next_batch, lr)
  local batches, sizes, host, seqs = {}, {}, {}, 0
  self.relayout = nil
  for a = 1, self.accum do
    local b = next_batch(a)
    seqs = seqs + b.input_ids:size(1)
    local pos, lab = self.model:mlm_rows(b)
    if not pos then error("Step: --cuda-graph needs MLM targets in every micro-batch (masked_lm_positions "
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
    error(("Step: learning rate must be a finite number >= 0, got %s"):format(tostring(lr)), 0)
  end
  ins.lr_host[0] = lr
  for a = 1, self.accum do
    ins.seed_host[a - 1] = self:micro_seed(n, a)
    local h, k = ins.rows_host[a], sizes[a][1]
    ffi.copy(h[1], host[a][1]:ptr(), 4 * k)
    ffi.copy(h[2], host[a][2]:ptr(), 4 * k)
    for i, v in ipairs(host[a][3]) do h[3][i - 1] = v end
    local d = batches[a]
    d.mlm_rows, d.masked_lm_positions, d.masked_lm_labels, d.labels = ins.rows[a], nil, nil, nil
    d.next_sentence_labels, d.next_sentence_label = ins.nsp[a], nil
  end
  check(C.bl_cuda_graph_set_inputs(self.graph.g, ins.block, ins.image, ins.bytes))
  return batches, seqs
end

-- The step's work on the micro-batches get(a). With a reducer, the last micro-batch's backward hands each layer's
-- range to it as it returns (reducer:arm): the range is final there (the backward added the last micro-batch's
-- gradients to the earlier ones'; the reducer's on_final hook rounds it to bf16/fp16) and its buckets are launched;
-- finish() does the ranges left. Queued: nothing waits for the device. Synchronous: the loss is read after every
-- micro-batch and the optimizer step (skipped on an fp16 overflow) decided on the host.
local function queue(self, n, get, lr)
  local model, accum, reducer, tables, loss, mp = self.model, self.accum, self.reducer, self.tables, self.loss, self.amp
  model:zero_grad()
  mp:begin_step()
  -- what the loss gradient is multiplied by: 1/accum, for fp16 times the loss scale (queued: on the device)
  local seed = self.synchronous and mp:scale() / accum or mp:loss_seed(accum)
  if self.stats then self.stats:zero() end
  local host_loss = 0
  for a = 1, accum do
    if self.mark then self.mark("micro") end   -- the step-time model's split (bertlua.stepmodel.parts)
    -- with a graph, the seed is read from the inputs block when the kernels run
    model.rng = bl.Generator(self.inputs and self.inputs.slots[a] or self:micro_seed(n, a))
    model:apply(function(m) m.rng = model.rng end)
    local l = loss.forward(model, get(a), self.stats, a, seed)
    if self.synchronous then host_loss = host_loss + l / accum end
    if tables and a > 1 then
      tables.acc:add_(tables.view)
      tables.view:zero_()
    end
    if reducer then reducer:arm(a == accum) end
    loss.backward(model, seed)
  end
  if self.mark then self.mark("step") end
  if reducer then
    mp:end_backward{ rounded = true }
    reducer:finish{ scale = 1 / self.world }  -- the mean over ranks; the optimizer waits for it on the device
  else
    if tables then tables.view:add_(tables.acc) end
    mp:end_backward()
  end
  if tables then tables.acc:zero_() end
  if self.synchronous then
    if reducer then reducer:wait() end
    if self.world > 1 then host_loss = dist.sum_numbers({ host_loss })[1] / self.world end
    if host_loss ~= host_loss then
      error(("%s: loss is NaN at step %d (precision %s)"):format(self.name, n, mp.precision), 0)
    end
    local stepped, st = mp:step(self.optimizer, lr)
    self.last = { loss = host_loss, lr = lr, grad_norm = st and st.grad_norm, skipped = not stepped or nil,
      loss_scale = mp.dtype == "f16" and mp:scale() or nil }
  else
    mp:queue_step(self.optimizer, lr)   -- the skip or update decided on the model's device
  end
  -- an optimizer built with model= writes the half compute copy in its update pass
  if model.compute_dtype and not self.optimizer:half() then model:sync_compute() end
end

-- run(n, next_batch, lr) -> sequences in step n (this rank's). next_batch(a) gives micro-batch a (1..accum) on the
-- CPU or the device.
function Step:run(n, next_batch, lr)
  local seqs = 0
  self.steps = self.steps + 1
  if not self.graph then
    queue(self, n, function(a)
      local b = next_batch(a)
      seqs = seqs + b.input_ids:size(1)
      return device.batch_to(b, self.dev, self.on_device)
    end, lr)
    self.seqs = self.seqs + seqs
    return seqs
  end
  local batches
  batches, seqs = stage(self, n, next_batch, lr)
  self.seqs = self.seqs + seqs
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
    local ok, err = pcall(self.graph.run, self.graph, queue, self, n, get, lr)
    if ok then
      self.captures = self.captures + 1
      if self.captures > 1 and self.say then   -- a capture after the first: say why
        self.say(("%s: step %d captured again: %s"):format(self.name, n, self.capture_reason))
      end
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
  queue(self, n, get, lr)
  self.graph_ready = runtime.cuda_counters(self.dev).mallocs == m0
  return seqs
end

-- read() -> {losses, counts, amp}: the loss's device sums of the last step and the amp state, with one host wait
-- (device.StepStats:read; a deferred index error is raised there). Queued steps only.
function Step:read()
  if self.reducer then self.reducer:wait() end  -- data parallel: the all-reduce under its watchdog
  return self.stats:read(self.amp:state_tensor())
end

-- record(n) -> the log line of step n: step, loss (the mean over micro-batches and ranks) and the loss's own fields,
-- lr, grad_norm, loss_scale, skipped (steps skipped since the last line), seq_per_s and step_time (since the last
-- line), and on a GPU the device's totals since the start (cuda_mallocs, cuda_syncs; graph counters with a graph).
-- Queued: the step's one host wait, on the ranks' sums of the last step.
function Step:record(n)
  local now, mp = logm.clock(), self.amp
  local dt, steps = now - self.since, math.max(self.steps, 1)
  local rec
  if self.synchronous then
    rec = { step = n, seq_per_s = self.seqs * self.world / dt }
    for k, v in pairs(self.last) do rec[k] = v end
  else
    local v = self:read()
    local r = mp:read(v.amp)
    local s = self.loss.sums(v, self.accum)
    s[#s + 1] = self.seqs
    s = dist.sum_numbers(s)
    rec = self.loss.fields(s, self.accum, self.world)
    rec.step, rec.lr, rec.grad_norm, rec.seq_per_s = n, self.optimizer.last_lr, r.grad_norm, s[#s] / dt
    rec.loss_scale = (self.loss.pretraining or mp.dtype == "f16") and r.loss_scale or nil
    rec.skipped = r.skipped > self.skipped_logged and r.skipped - self.skipped_logged or nil
    self.skipped_logged = r.skipped
  end
  if self.loss.pretraining then rec.step_time = dt / steps end
  if self.dev >= 0 then
    local k = runtime.cuda_counters(self.dev)
    rec.cuda_mallocs, rec.cuda_syncs = k.mallocs, k.syncs
    if self.graph then
      local g = self:graph_stats()
      rec.cuda_graph_launches, rec.cuda_graph_replays = k.graph_launches, g.replays
      rec.cuda_graph_instantiations, rec.cuda_graph_updates = g.instantiations, g.updates
    end
  end
  self.since, self.seqs, self.steps, self.last_loss = now, 0, 0, rec.loss
  return rec
end

-- finish() -> {loss = the last logged loss, skipped = steps skipped in all}; deferred index checks back on
function Step:finish()
  local skipped = self.amp.scaler.skipped_steps
  if not self.synchronous then
    skipped = self.amp:read().skipped
    device.defer_checks(self.dev, false)
  end
  return { loss = self.last_loss, skipped = skipped }
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
