-- bertlua.train.loop: the one training loop. `run` is the driver pre-training
-- (recipes/pretrain.lua) and fine-tuning (`fit` below, for recipes/squad.lua and
-- recipes/glue.lua) share: it owns the step counter and the order of the hooks;
-- what a step does (forward/backward over the micro-batches, all-reduce, the
-- optimizer) is the caller's `step` hook, so step-level changes stay there.
--
--   local step, reason = loop.run{
--     name = "pretrain", start = 0, total = N,        -- steps already done, last step
--     stop = function(step, ran) return reason end,  -- before each step: nil = go on
--     batch = function(step, a) return batch end,     -- micro-batch a (1-based) of a step
--     step = function(step, next_batch) return record end,  -- next_batch(a) = batch(step, a)
--     log = function(record, step) end,
--     checkpoint = function(step, record) end,        -- after each step (the hook decides when)
--     evaluate = function(step, record) end }         -- after the checkpoint hook
--   -- reason = what stop returned, nil when the loop reached `total`
--
-- `fit`: fine-tuning with AdamW (no decay on biases/LayerNorm), global gradient-norm
-- clipping at 1.0 (as Google's run_squad.py, NVIDIA's recipe and transformers'
-- Trainer; max_grad_norm = 0 turns it off), linear warmup and decay,
-- gradient accumulation, a shuffled epoch order from the seed, progress
-- and JSON-lines logging. Batched evaluation is bertlua.batched's.
--
--   local trainer = require "bertlua.train.loop"
--   trainer.fit{ model = m, n = #features, batch = 32, micro_batch = 8, epochs = 2, lr = 3e-5,
--                warmup = 0.1 (or warmup_steps = N), make_batch = function(indices) return batch_table end,
--                log_path = ..., precision = "fp32",  -- or tf32, bf16, fp16: bertlua.train.amp.MixedPrecision
--                device = -1,           -- or N: the model is on cuda:N (model:to), batches are staged there;
--                                       -- bf16/fp16 train on its half compute copy (made here if it has none)
--                log_every = 1,         -- on a GPU: a log line (and the step's one host wait) every N steps
--                log_format = "jsonl",  -- or "dllogger" (bertlua.util.log); the run ends with a summary line
--                synchronous = false,   -- true: on a GPU too, the step that reads every loss back (comparisons)
--                bucket_mb = 25, allreduce_dtype = "fp32",   -- data parallel (below)
--                checkpoints = { dir = "OUT/checkpoints", every = N, resume = false, keep = 2 } }   -- (below)
--
-- Checkpoints (`checkpoints`, as transformers' Trainer save_steps / resume_from_checkpoint): every `every` steps
-- the f32 weights, the AdamW moments and step, the loss scaler (bertlua.train.checkpoint, atomic, the newest
-- `keep` kept); with `resume` the newest one that loads is continued from, and the run goes on exactly as the
-- uninterrupted one (the epochs' shuffles are replayed from the seed; dropout streams depend on the step alone).
-- A checkpoint of another run (model, batch, data size, epochs, rate, warmup, seed or precision differ) is refused,
-- and checkpoints left in dir without `resume` too.
--
-- Data parallel under mpirun (bertlua.train.dist): `batch` is the global
-- batch. Micro-batch j of a step (j = rank * accumulation + a) is the same
-- slice of the shuffled order however the batch is split over ranks and
-- accumulation, with its own dropout stream (seed, step, j), and the
-- gradients are averaged over the ranks (bucketed, overlapped with backward
-- when nothing is accumulated), so N ranks give one rank's results with
-- accumulation N.
--
-- The step is bertlua.train.step's. On the CPU it is synchronous: the head's own loss (model_loss) read back after
-- every micro-batch, fp16's skip decided on the host, the learning-rate schedule advancing on applied steps. On a
-- GPU (device >= 0) the QA, classification and regression (STS-B) heads train with their device losses (head_loss):
-- no host wait inside a step (losses, accuracy and the fp16 loss scaler stay on the device and are read once per
-- log line, every log_every steps), no device allocation after the first step while the batch shape stays the
-- same; the logged losses are those of the synchronous step. With fp16 the learning-rate schedule advances on a
-- skipped step too (as in pre-training). On a GPU the training micro-batches, targets included, go through pinned
-- memory on the copy stream (bertlua.device.prefetch), the next one copied while the current one trains, on the
-- device step and the synchronous one alike.
local optim = require "bertlua.train.optim"
local schedule = require "bertlua.train.schedule"
local logm = require "bertlua.util.log"
local rng = require "bertlua.util.rng"
local amp = require "bertlua.train.amp"
local slice = require("bertlua.util.list").slice
local device = require "bertlua.train.device"
local tstep = require "bertlua.train.step"
local dist = require "bertlua.train.dist"
local prefetch = require "bertlua.device.prefetch"
local ckpt = require "bertlua.train.checkpoint"

local M = {}

-- the recipes' options for fit's checkpoints (recipes/squad.lua, recipes/glue.lua): o.checkpoints from them is
-- { dir = OUTPUT .. "/checkpoints", every = opt.save_steps, resume = opt.resume }
M.SAVE_STEPS_OPTION = { "save_steps", 0, "a training checkpoint every N steps in --output/checkpoints (the newest 2 "
  .. "kept; 0: none)", int = true, min = 0 }
M.RESUME_OPTION = { "resume", false, "continue the training from the newest checkpoint in --output/checkpoints" }

function M.run(h)
  local step, ran, name = h.start or 0, 0, h.name or "train"
  local function next_batch(a)
    local b = h.batch(step, a)
    if b == nil then error(name .. ": the data loader returned no batch", 0) end
    return b
  end
  while step < h.total do
    local reason = h.stop and h.stop(step, ran)
    if reason then return step, reason end
    step = step + 1
    local rec = h.step(step, next_batch)
    if h.log then h.log(rec, step) end
    ran = ran + 1
    if h.checkpoint then h.checkpoint(step, rec) end
    if h.evaluate then h.evaluate(step, rec) end
  end
  return step, nil
end

function M.fit(o)
  local rank, world = dist.rank(), dist.size()
  local micro = (o.micro_batch and o.micro_batch > 0) and o.micro_batch or o.batch / world
  if o.batch % world ~= 0 or (o.batch / world) % micro ~= 0 then
    error(("trainer: --batch must be a multiple of --micro-batch x ranks (batch %d, micro-batch %s, %d ranks)")
      :format(o.batch, micro, world), 0)
  end
  local accum = o.batch / world / micro
  local steps_per_epoch = math.floor(o.n / o.batch)
  if steps_per_epoch == 0 then
    error(("trainer: %d training examples are fewer than one batch of %d: lower --batch or train on more data")
      :format(o.n, o.batch), 0)
  end
  local total = steps_per_epoch * o.epochs
  if o.max_steps and o.max_steps > 0 then total = math.min(total, o.max_steps) end
  if rank == 0 then
    print(("train: %d examples, %d steps (%d epochs x %d), batch %d = %s%d x %d"):format(o.n, total, o.epochs,
      steps_per_epoch, o.batch, world > 1 and world .. " ranks x " or "", micro, accum))
  end
  local model, dev, precision = o.model, o.device or -1, o.precision or "fp32"
  -- on a GPU bf16/fp16 train on the half compute copy, never on the emulation of the CPU (bertlua.train.amp)
  local known, half = pcall(amp.storage_dtype, precision)   -- an unknown one: MixedPrecision's error below
  if dev >= 0 and known and half and model.compute_dtype ~= half then amp.model_to(model, dev, precision) end
  -- on a GPU the step stays on the device for the heads whose loss it knows (bertlua.train.step.head_loss)
  local head_loss = dev >= 0 and not o.synchronous and tstep.head_loss(model) or nil
  local adamw = optim.AdamW{ model = model, lr = o.lr, weight_decay = o.weight_decay or 0.01,
    max_grad_norm = o.max_grad_norm or 1.0 }
  local lr_at = o.schedule or schedule.linear_warmup{ lr = o.lr, total_steps = total, warmup_steps = o.warmup_steps,
    warmup_proportion = not o.warmup_steps and (o.warmup or 0.1) or nil }
  -- bf16/fp16: f32 master weights, the half compute copy (GPU) or emulated half weights and gradients (CPU), fp16
  -- loss scaling
  local mp = amp.MixedPrecision{ model = model, precision = precision, scaler = o.scaler }
  if rank == 0 then print("train: training path: " .. mp:path()) end
  -- gradients accumulate in place: a layer's are final when its backward of the last micro-batch returns, once
  -- rounded to bf16/fp16 (the CPU's emulation); its buckets are reduced while the rest of backward runs
  local reducer = dist.Reducer{ grads = model.flat_grads, bucket_mb = o.bucket_mb, dtype = o.allreduce_dtype }
  reducer:on_final(function(lo, hi) mp:round_grads(lo, hi) end)
  if world > 1 then reducer:attach(model) end
  local saves = o.checkpoints or {}
  local identity = { model_config = model.cfg, optimizer = "adamw", global_batch = o.batch, micro_batch = micro,
    run = { examples = o.n, epochs = o.epochs, total = total, lr = o.lr, warmup = o.warmup_steps or o.warmup or 0.1,
      seed = o.seed or 42, precision = precision, weight_decay = o.weight_decay or 0.01 } }
  if saves.dir and rank == 0 then ckpt.claim(saves.dir, identity, saves.resume, "trainer") end
  local start = 0
  if saves.dir and saves.resume then
    local c = ckpt.load_latest(saves.dir, { model = model, identity = identity,
      restore = function(c) ckpt.restore_trainer(c, adamw, mp) end })
    if c then
      start = c.step
      if rank == 0 then print(("train: resumed from %s at step %d of %d"):format(c.path, start, total)) end
    elseif rank == 0 then
      print(("train: --resume: nothing to resume in %s (no complete checkpoint); training starts at step 0")
        :format(saves.dir))
    end
  end
  local log = logm.open{ path = o.log_path, total = total, fields = { "loss", "lr", "grad_norm", "seq_per_s" },
    config = o.config, rank = rank, format = o.log_format, append = start > 0 }
  local draw = rng(o.seed or 42)
  local order = {}
  for i = 1, o.n do order[i] = i end
  local function shuffle()
    for i = #order, 2, -1 do local j = draw(i); order[i], order[j] = order[j], order[i] end
  end
  for _ = 1, math.ceil(start / steps_per_epoch) do shuffle() end   -- the epochs a resumed run has begun
  model:train()
  -- the epoch's order is shuffled on its first step (the draws the old per-epoch loop made)
  -- micro-batch a of a step on the host; called in the order of the micro-batches
  local function host_batch(step, a)
    local s = (step - 1) % steps_per_epoch
    if s == 0 and a == 1 then shuffle() end
    local first = s * o.batch + (rank * accum + a - 1) * micro
    return o.make_batch(slice(order, first + 1, first + micro))
  end
  -- exact_tables = false: the embedding tables' gradients accumulate in place (fine-tuning's bits as they were)
  local ts = tstep.Step{ model = model, optimizer = adamw, amp = mp, dev = dev, accum = accum, world = world,
    rank = rank, reducer = reducer, seed = o.seed or 42, loss = head_loss or tstep.model_loss(),
    synchronous = not head_loss, exact_tables = false, name = "trainer" }
  local log_every = o.log_every or 1
  local function train_step(n, next_batch)
    ts:run(n, next_batch, lr_at(adamw.step_count + 1))
    if n % log_every ~= 0 and n ~= total then return nil end
    local rec = ts:record(n)
    if rec.loss ~= rec.loss then
      error(("trainer: loss is NaN at step %d (precision %s)"):format(n, mp.precision), 0)
    end
    return rec
  end
  local batch = function(step, a) return device.batch_to(host_batch(step, a), dev) end
  local stage = dev >= 0 and prefetch.Stager(dev) or nil
  if stage then
    -- on a GPU every micro-batch goes through pinned memory and the copy stream (bertlua.device.prefetch): got,
    -- then the next one put (copied while this one trains), then trained; the device step's targets with it
    local prepare = ts.loss.prepare or function(b) return b end
    local function put(step, a)
      if a > accum then step, a = step + 1, 1 end
      if step <= total then stage:put(prepare(host_batch(step, a))) end
    end
    batch = function(step, a)
      if stage:in_flight() == 0 then put(step, a) end
      local b = stage:get()
      put(step, a + 1)
      return b
    end
  end
  local function save(step)
    if not (saves.dir and saves.every and saves.every > 0 and step % saves.every == 0 and step < total) then return end
    reducer:wait()
    if rank ~= 0 then return end
    local tensors, state = ckpt.trainer_state(adamw, mp)
    ckpt.save(saves.dir, { step = step, model = model, tensors = tensors, identity = identity, state = state },
      { keep = saves.keep or 2 })
  end
  local t_train = logm.clock()
  local steps = M.run{ name = "trainer", start = start, total = total, batch = batch, step = train_step,
    stop = o.stop, log = function(rec) if rec then log:step(rec) end end, checkpoint = save }
  if stage then stage:close() end
  local f = ts:finish()
  log:summary{ steps = steps, sequences = (steps - start) * o.batch, train_time = logm.clock() - t_train }
  log:close()
  if f.skipped > 0 and rank == 0 then
    print(("train: %d of %d steps skipped for fp16 overflow (loss scale now %g)"):format(f.skipped, steps,
      mp:scale()))
  end
  return { steps = steps, loss = f.loss, skipped = f.skipped, loss_scale = mp:scale() }
end

return M
