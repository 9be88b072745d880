-- bertlua.train.phase: what a pre-training phase needs besides its model, optimizer and step (recipes/pretrain.lua):
-- the run's inputs agreed on by every rank, its data cut into slices, held-out evaluation, checkpoints (identity,
-- resume, save, the phase's end) and the ranks' stop votes.
--
--   local phase = require "bertlua.train.phase"
--   phase.agree(opt, cfg)       -- the vocabulary fits the model; every rank has the same options, model and data
--   local ph = phase.settings(opt, p); local init = phase.init_dir(opt, p, init)
--   local accum = phase.accumulation(ph, opt.micro_batch, world)     -- micro-batches per rank and step, or an error
--   local d = phase.Data{ ph = ph, opt = opt, accum = accum, run = run }   -- run: {rank, world, dev, say}
--   d:next(step, a)             -- micro-batch a of step n; d:evaluate(model, step, log) -> eval record or nil
--   local ck = phase.Checkpoints{ ph =, opt =, cfg =, data = d, model =, optimizer =, amp =, reducer =, run = }
--   local start = ck:resume()   -- --resume: the steps a checkpoint had done (0: none); ck:save(step)
--   ck:logger(log)              -- loop.run's log hook: the record logged, a NaN loss an error
--   ck:finish(step, reason, log)   -- the stop's or the last step's checkpoint, the final evaluation -> finished
--   local stop = phase.stop_votes{ max_steps =, max_time =, t_start =, reducer = }   -- loop.run's stop hook
-- ph: the phase's settings {phase, seq, pred, batch, lr, warmup, steps, data}; opt: the recipe's options (seed,
-- vocab, micro_batch, bin_lengths, eval_data, eval_batches, dump_batches, output, optimizer, resume,
-- keep_checkpoints, precision).
local fs = require "bertlua.util.fs"
local data = require "bertlua.data.loader"
local shards = require "bertlua.data.shards"
local safetensors = require "bertlua.io.safetensors"
local runtime = require "bertlua.runtime"
local logm = require "bertlua.util.log"
local ckpt = require "bertlua.train.checkpoint"
local Tok = require "bertlua.data.tokenizer"
local dist = require "bertlua.train.dist"
local fingerprint = require "bertlua.train.fingerprint"
local pretrain_eval = require "bertlua.train.pretrain_eval"

local M = {}

-- agree(opt, cfg): --vocab fits the model config cfg; every rank runs one job: options, model, vocabulary and data
-- compared before any work (bertlua.train.fingerprint)
function M.agree(opt, cfg)
  if opt.vocab then Tok.load(opt.vocab):check_model(cfg.vocab_size, "pretrain", opt.model) end
  dist.agree("pretrain", fingerprint.entries{ options = opt, config = cfg,
    files = { { "--vocab", opt.vocab }, { "--init", opt.init } },
    data = { { "--data-phase1", opt.data_phase1 }, { "--data-phase2", opt.data_phase2 } } })
end

-- settings(opt, p) -> phase p's settings from the recipe's --seqP, --predP, --batchP, --lrP, --warmupP,
-- --warmup-stepsP (-1: the proportion), --stepsP and --data-phaseP
function M.settings(opt, p)
  return {
    phase = p, seq = opt["seq" .. p], pred = opt["pred" .. p], batch = opt["batch" .. p], lr = opt["lr" .. p],
    warmup = opt["warmup" .. p], steps = opt["steps" .. p], data = opt["data_phase" .. p],
    warmup_steps = opt["warmup_steps" .. p] >= 0 and opt["warmup_steps" .. p] or nil,
  }
end

-- init_dir(opt, p, init) -> the model directory phase p starts from (nil: random weights): --init, or for phase 2
-- phase 1's model in --output; phase 2 from random weights only with --init-random (or a phase-2 checkpoint to
-- resume)
function M.init_dir(opt, p, init)
  if opt.init and opt.init_random then error("pretrain: --init and --init-random exclude each other", 0) end
  if p ~= 2 or init then return init end
  local dir = opt.output .. "/phase1"
  if fs.readable(dir .. "/model.safetensors") then return dir end
  if not opt.init_random and not (opt.resume and ckpt.latest(opt.output .. "/checkpoints/phase2")) then
    error(("pretrain: --phase=2 starts from phase 1's model: pass --init=DIR (or run phase 1 into --output=%s "
      .. "first); --init-random trains phase 2 from random weights"):format(opt.output), 0)
  end
end

-- accumulation(ph, micro_batch, world) -> micro-batches per rank and step; the phase's data option is required
function M.accumulation(ph, micro_batch, world)
  if not ph.data then error(("pretrain: --data-phase%d is required for phase %d"):format(ph.phase, ph.phase), 0) end
  if ph.batch % (micro_batch * world) ~= 0 then
    error(("pretrain: phase %d global batch %d is not a multiple of micro-batch %d x %d ranks"):format(
      ph.phase, ph.batch, micro_batch, world), 0)
  end
  return math.floor(ph.batch / (micro_batch * world))
end

-- open_loader(ph, args, flag): a data.Loader; its errors name the phase's data option (and --seqN when too short)
local function open_loader(ph, args, flag)
  local ok, loader = pcall(data.Loader, args)
  if ok then return loader end
  local msg = tostring(loader)
  if msg:find("tokens, more than the %d+ asked for") then msg = msg .. (" (--seq%d=%d)"):format(ph.phase, ph.seq) end
  error(("pretrain: %s=%s: %s"):format(flag, args.dir, msg), 0)
end

local Data = {}
Data.__index = Data

local no_eval_said = {}   -- held-out directories said to be missing (once per run)

-- Data{ph, opt, accum, run}: the phase's training loaders (run: {rank, world, dev, say}). Micro-batch j of a
-- global batch (j = rank*accum + a - 1) comes from virtual rank j of world*accum: the data a step sees does not
-- depend on how it is split over ranks and accumulation (bounded to keep the loader count sane: self.virt). On a
-- GPU the batches go there through pinned buffers on a copy stream, the next one copied during this step. The
-- held-out shards are checked now, not after the phase's training.
function M.Data(o)
  local ph, opt, accum, rank, world, dev = o.ph, o.opt, o.accum, o.run.rank, o.run.world, o.run.dev
  local self = setmetatable({ ph = ph, opt = opt, accum = accum, rank = rank, world = world, dev = dev,
    say = o.run.say, virt = accum <= 16, loaders = {} }, Data)
  local flag = "--data-phase" .. ph.phase
  local function loader_args(vrank, nvirt)
    return { dir = ph.data, split = "train", batch_size = opt.micro_batch, rank = vrank, world_size = nvirt,
      seed = opt.seed, max_seq_length = ph.seq, max_predictions = ph.pred, vocab = opt.vocab,
      bin_lengths = opt.bin_lengths }
  end
  if self.virt then
    for a = 1, accum do
      self.loaders[a] = open_loader(ph, loader_args(rank * accum + a - 1, world * accum), flag)
    end
  else
    self.loaders[1] = open_loader(ph, loader_args(rank, world), flag)
  end
  local l = self:eval_loader()
  if l then l:close() end
  if dev >= 0 then
    for a, x in ipairs(self.loaders) do self.loaders[a] = data.DeviceLoader(x, dev) end
  end
  self.slices = self.virt and world * accum or world   -- the data slices a checkpoint is tied to
  if opt.dump_batches then
    if dev >= 0 then error("pretrain: --dump-batches works on the CPU only (--device=cpu)", 0) end
    if not self.virt then error("pretrain: --dump-batches needs at most 16 micro-batches per rank and step", 0) end
    self.dump_dir = ("%s/phase%d"):format(opt.dump_batches, ph.phase)
    fs.mkdir_p(self.dump_dir)
  end
  return self
end

-- next(step, a) -> micro-batch a of step n (--dump-batches: also written to DIR/phaseP/STEP_J.safetensors)
function Data:next(step, a)
  local b = (self.virt and self.loaders[a] or self.loaders[1]):next()
  if self.dump_dir then
    safetensors.save(("%s/%06d_%03d.safetensors"):format(self.dump_dir, step, (self.virt and self.rank * self.accum
      or 0) + a), b)
  end
  return b
end

-- every rank's (virtual) loaders step in lockstep: one position describes them all
function Data:state() return self.loaders[1]:state() end
function Data:set_state(s) for _, l in ipairs(self.loaders) do l:set_state(s) end end
function Data:close() for _, l in ipairs(self.loaders) do l:close() end end

-- eval_loader() -> the held-out shards' loader, or nil (said once) when there are none or too few for a batch;
-- held-out shards that do not fit the phase are an error
function Data:eval_loader()
  local ph, opt = self.ph, self.opt
  local dir = opt.eval_data or ph.data
  local function none(why)
    if not no_eval_said[dir] then self.say("pretrain: no held-out shards for evaluation (" .. why .. ")") end
    no_eval_said[dir] = true
  end
  if #shards.list_shards(dir, "test") == 0 then
    return none(("no test_*.blshard in %s; shard.lua --test-fraction makes them"):format(dir))
  end
  local ok, loader = pcall(open_loader, ph, { dir = dir, split = "test", batch_size = opt.micro_batch,
    rank = self.rank, world_size = self.world, seed = opt.seed, max_seq_length = ph.seq, max_predictions = ph.pred,
    vocab = opt.vocab, shuffle = false }, opt.eval_data and "--eval-data" or "--data-phase" .. ph.phase)
  if ok then return loader end
  local few = tostring(loader):match("(%d+ instances are not enough for .*)$")
  if not few then error(loader, 0) end
  return none(("test_*.blshard in %s: %s"):format(dir, few))
end

-- evaluate(model, step, log) -> {step, phase, eval_mlm_loss, eval_mlm_acc, eval_nsp_loss, eval_nsp_acc} over
-- --eval-batches held-out micro-batches (bertlua.train.pretrain_eval, summed over ranks; logged and said), or nil
-- without held-out data or MLM targets in it
function Data:evaluate(model, step, log)
  local loader = self:eval_loader()
  if not loader then return nil end
  local ok, sums = pcall(pretrain_eval.sums, model, loader, { batches = self.opt.eval_batches, dev = self.dev })
  loader:close()
  if not ok then error(sums, 0) end
  local m = pretrain_eval.metrics(dist.sum_numbers(sums))
  if not (m and m.mlm_count > 0) then return nil end
  local ph = self.ph
  local r = { step = step, phase = ph.phase, eval_mlm_loss = m.mlm_loss, eval_mlm_acc = m.mlm_acc,
    eval_nsp_loss = m.nsp_loss, eval_nsp_acc = m.nsp_acc }
  log:event("eval", r)
  local nsp = m.nsp_count > 0 and (", NSP loss %.4f, NSP accuracy %.4f (%d sequences)"):format(m.nsp_loss, m.nsp_acc,
    m.nsp_count) or ""
  self.say(("  eval phase %d step %d: MLM loss %.4f, MLM accuracy %.4f (%d predictions)%s"):format(ph.phase, step,
    r.eval_mlm_loss, r.eval_mlm_acc, m.mlm_count, nsp))
  return r
end

local Checkpoints = {}
Checkpoints.__index = Checkpoints

-- Checkpoints{ph, opt, cfg, data, model, optimizer, amp, reducer, run}: the phase's checkpoints in
-- OUTPUT/checkpoints/phaseP, claimed for this run by rank 0. A checkpoint is tied to how the global batch is cut
-- into data slices (world x accumulation virtual ranks), not to the world size: resuming on a different number of
-- ranks with the same global and micro batch (so accumulation makes up the difference) continues exactly.
function M.Checkpoints(o)
  local ph, opt = o.ph, o.opt
  local self = setmetatable({ ph = ph, opt = opt, data = o.data, model = o.model, optimizer = o.optimizer,
    amp = o.amp, reducer = o.reducer, rank = o.run.rank, world = o.run.world, say = o.run.say,
    dir = ("%s/checkpoints/phase%d"):format(opt.output, ph.phase) }, Checkpoints)
  self.identity = { model_config = o.cfg, optimizer = opt.optimizer, data_slices = o.data.slices,
    global_batch = ph.batch, micro_batch = opt.micro_batch, phase = ph.phase,
    run = { lr = ph.lr, warmup = ph.warmup, steps = ph.steps, seed = opt.seed, data = shards.fingerprint(ph.data) } }
  if self.rank == 0 then ckpt.claim(self.dir, self.identity, opt.resume, "pretrain") end
  return self
end

-- resume() -> the steps already done: with --resume those of the newest checkpoint that restores (one whose state
-- does not, e.g. a loader position past the data, falls back to the previous), else 0
function Checkpoints:resume()
  local start = 0
  if self.opt.resume then
    local optimizer, amp, d = self.optimizer, self.amp, self.data
    local function restore(c)
      d:set_state(c.state.loader)
      ckpt.restore_trainer(c, optimizer, amp)
    end
    local c = ckpt.load_latest(self.dir, { model = self.model, identity = self.identity, restore = restore })
    if not c then
      self.say(("  --resume: nothing to resume in %s (no complete checkpoint); phase %d starts at step 0")
        :format(self.dir, self.ph.phase))
    else
      start = c.step
      self.say(("  resumed from %s at step %d"):format(c.path, start))
    end
  end
  if start >= self.ph.steps then self.say("  phase already complete") end
  return start
end

-- save(at): the checkpoint of step `at` (rank 0 writes it; every rank waits for its last all-reduce first)
function Checkpoints:save(at)
  self.reducer:wait()   -- the reads below wait for the device: under the watchdog (a step's finish did not wait)
  if self.rank ~= 0 then return end
  local tensors, state = ckpt.trainer_state(self.optimizer, self.amp)
  state.phase, state.loader, state.world_size, state.accumulation = self.ph.phase, self.data:state(), self.world,
    self.data.accum
  ckpt.save(self.dir, { step = at, model = self.model, tensors = tensors, identity = self.identity, state = state },
    { keep = self.opt.keep_checkpoints })
end

-- logger(log) -> loop.run's log hook: a step's record (nil: the step is not logged) to the log; a NaN loss stops
-- the run, naming the last checkpoint
function Checkpoints:logger(log)
  return function(rec, step)
    if not rec then return end
    log:step(rec)
    if rec.loss ~= rec.loss then
      error(("pretrain: loss is NaN at step %d (precision %s); the last checkpoint in %s is the last good state")
        :format(step, self.opt.precision, self.dir), 0)
    end
  end
end

-- finish(step, reason, log) -> whether the phase is complete. The training stopped after `step` steps, for
-- `reason` (nil: it ran to the end): a stop saves a checkpoint --resume continues from; the data is closed; a
-- complete phase saves its last checkpoint and is evaluated on the held-out data.
function Checkpoints:finish(step, reason, log)
  if reason then
    self:save(step)
    self.say(("phase %d: stopped at step %d (%s); --resume continues from here"):format(self.ph.phase, step, reason))
  end
  self.data:close()
  if step < self.ph.steps then return false end
  self:save(step)
  self.data:evaluate(self.model, step, log)
  return true
end

-- stop_votes{max_steps, max_time, t_start, reducer} -> loop.run's stop hook: "max-steps" after max_steps steps of
-- this run, "max-time" once max_time seconds passed since t_start on any rank, "signal" after SIGINT/SIGTERM on any
-- rank. Every rank must take the same decision, or the others wait in the next all-reduce forever: the clocks and
-- the signals of all ranks are combined (one small all-reduce per step, watching the last step's GPU sums).
function M.stop_votes(o)
  return function(_, ran)
    if o.max_steps > 0 and ran >= o.max_steps then return "max-steps" end
    local late = o.max_time > 0 and logm.clock() - o.t_start >= o.max_time
    local votes = dist.sum_numbers({ late and 1 or 0, runtime.stop_signal() }, o.reducer)
    if votes[1] > 0 then return "max-time" end
    if votes[2] > 0 then return "signal" end
  end
end

return M
