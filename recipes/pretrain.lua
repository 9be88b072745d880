-- BERT pre-training with LAMB, two phases, as NVIDIA's DeepLearningExamples
-- recipe does it — on one CPU, one GPU or many ranks under mpirun.
--
--   bertlua recipes/pretrain.lua --data-phase1=DIR --data-phase2=DIR --model=large --output=runs/large
--   mpirun -np 8 bertlua recipes/pretrain.lua ...        (one rank per GPU / CPU slot)
--
-- Defaults are NVIDIA's BERT-large settings. The global batch is fixed; the
-- number of gradient-accumulation micro-batches follows from it, the
-- per-device micro-batch and the world size. Gradients are averaged over
-- ranks once per optimizer step. Everything a user may want to change is in
-- SPEC below or in the few functions after it (the schedule, the model, the
-- step): edit them here, no C needed.
local bl = require "bertlua"
local options = require "bertlua.util.options"
local bert = require "bertlua.bert"
local pretrained = require "bertlua.pretrained"
local optim = require "bertlua.train.optim"
local schedule = require "bertlua.train.schedule"
local amp = require "bertlua.train.amp"
local dist = require "bertlua.train.dist"
local fingerprint = require "bertlua.train.fingerprint"
local fs = require "bertlua.util.fs"
local logm = require "bertlua.util.log"
local Tok = require "bertlua.data.tokenizer"
local device = require "bertlua.train.device"
local loop = require "bertlua.train.loop"
local graph = require "bertlua.device.graph"
local tstep = require "bertlua.train.step"
local phase = require "bertlua.train.phase"

local SPEC = {
  { "model", "large", "preset (tiny mini small medium base large) or a config.json" },
  { "init", nil, "start from these weights (phase 1, or --phase=2 alone): a model directory, or a checkpoint "
    .. "bertlua.import reads (Google's TF bert_model.ckpt, pytorch_model.bin, NVIDIA's .pt)" },
  { "init_random", false, "--phase=2 without --init or a phase-1 model in --output: start from random weights "
    .. "(refused otherwise)" },
  { "vocab", nil, "vocab.txt used to create the data (checked against the shards; copied to the output model)" },
  { "data_phase1", nil, "directory of phase-1 shards (S=128)" },
  { "data_phase2", nil, "directory of phase-2 shards (S=512)" },
  { "eval_data", nil,
    "held-out shard directory for MLM evaluation (default: test_* shards next to the training data)" },
  { "output", "runs/pretrain", "run directory: checkpoints/, log.jsonl, phase1/ and phase2/ final models" },
  { "phase", "both", "1, 2 or both", choices = { "1", "2", "both" } },
  { "seq1", 128, "phase 1 sequence length", int = true, min = 3 },
  { "pred1", 20, "phase 1 max predictions per sequence", int = true, min = 0 },
  { "batch1", 65536, "phase 1 global batch (sequences per optimizer step)", int = true, min = 1 },
  { "lr1", 6e-3, "phase 1 peak learning rate", min = 0, above = true },
  { "warmup1", 0.2843, "phase 1 warmup proportion", min = 0, max = 1 },
  { "steps1", 7038, "phase 1 optimizer steps", int = true, min = 1 },
  { "seq2", 512, "phase 2 sequence length", int = true, min = 3 },
  { "pred2", 80, "phase 2 max predictions per sequence", int = true, min = 0 },
  { "batch2", 32768, "phase 2 global batch", int = true, min = 1 },
  { "lr2", 4e-3, "phase 2 peak learning rate", min = 0, above = true },
  { "warmup2", 0.128, "phase 2 warmup proportion", min = 0, max = 1 },
  { "steps2", 1563, "phase 2 optimizer steps", int = true, min = 1 },
  { "warmup_steps1", -1, "phase 1 warmup in steps instead of --warmup1 (Google/TF2: 2000; -1: the proportion)",
    int = true, min = -1 },
  { "warmup_steps2", -1, "phase 2 warmup in steps instead of --warmup2 (Google/TF2: 200; -1: the proportion)",
    int = true, min = -1 },
  { "micro_batch", 8, "sequences per device per forward/backward", int = true, min = 1 },
  { "bin_lengths", false, "loader sorts sequences by length within windows of 64 steps: less padding (phase 2)" },
  { "precision", "fp32",
    "fp32 | tf32 | bf16 | fp16 (tf32 = fp32 on the CPU; bf16/fp16: f32 master weights, on a GPU a half compute " ..
      "copy with half activations, on the CPU half weights and gradients emulated; fp16 with loss scaling)" },
  { "loss_scale", "dynamic", "fp16 loss scale: dynamic, dynamic:INIT[:INTERVAL] or a fixed number (e.g. 32768)" },
  { "bucket_mb", 25, "data parallel: gradients are summed in buckets of this many MB (f32), each launched as "
    .. "soon as backward has finished it", min = 0, above = true, int = false },
  { "allreduce_dtype", "fp32", dist.ALLREDUCE_HELP },
  { "power", 0.5, "polynomial decay power after warmup", min = 0 },
  { "weight_decay", 0.01, "decoupled weight decay (not on biases/LayerNorm)", min = 0 },
  { "optimizer", "lamb", "lamb (NVLAMB, NVIDIA's PyTorch recipe) or adam (AdamW with bias correction, as NVIDIA's TF2 "
    .. "recipe's adam; --lr1/--lr2 default to LAMB's rates: give Adam's, e.g. 1e-4)" },
  { "max_grad_norm", 1.0, "global gradient pre-normalisation (LAMB) or clipping (adam)", min = 0, above = true,
    int = false },
  { "keep_optimizer", false, "phase 2 keeps phase 1's optimizer state (NVIDIA starts it fresh)" },
  { "seed", 12439, "seed for initialisation, data order and dropout", int = true, min = 0, max = 2 ^ 53 },
  { "dropout", -1, "override hidden and attention dropout (-1: keep the config's 0.1)", min = -1, max = 0.99,
    int = false },
  { "checkpoint_interval", 200, "optimizer steps between checkpoints (0: only at the end and at a stop)", int = true,
    min = 0 },
  { "keep_checkpoints", 3, "checkpoints kept per phase", int = true, min = 1 },
  { "resume", false, "continue from the newest complete checkpoint in --output" },
  { "max_steps", 0, "stop each phase after this many steps of this run (0: all)", int = true, min = 0 },
  { "max_time", 0, "stop after this many seconds, with a checkpoint (0: no limit)", min = 0, int = false },
  { "eval_interval", 0, "steps between held-out MLM evaluations (0: only at the end of a phase)", int = true, min = 0 },
  { "eval_batches", 20, "micro-batches per evaluation", int = true, min = 1 },
  { "log_every", 1, "steps between JSON log lines", int = true, min = 1 },
  { "log_format", "jsonl", logm.FORMAT_HELP .. "; the log is log.jsonl or dllogger.json" },
  { "threads", 0, "CPU threads (0: keep the default)" },
  { "dump_batches", nil, "CPU: also write every training micro-batch to DIR/phaseP/STEP_J.safetensors (J: micro-batch "
    .. "of the step), the data tools/peers/nvidia_pretrain_reference.py replays" },
  { "unpad", true, "CPU: train on the real tokens only, padded positions skipped (exact: their gradients are zero); "
    .. "false: the padded step" },
  bert.CHECKPOINT_OPTION,
  { "cuda_graph", false, "GPU: run each step as one CUDA graph, NCCL all-reduces included (captured after the "
    .. "first step; the device runs it without launch gaps)" },
  device.OPTION,
}
local opt = options.parse(arg, SPEC, { name = "pretrain",
  usage = "usage: [mpirun -np N] bertlua recipes/pretrain.lua --data-phase1=DIR [--data-phase2=DIR] [options]" })
-- SIGINT/SIGTERM: every rank stops at the same step with a checkpoint (a second signal stops at once)
bl.stop_watch()
if opt.threads > 0 then bl.set_num_threads(opt.threads) end

local rank, world = dist.rank(), dist.size()
local function say(...) if rank == 0 then print(...) end end
amp.check_precision("pretrain", opt.precision)
logm.check_format(opt.log_format, "pretrain")
if opt.optimizer ~= "lamb" and opt.optimizer ~= "adam" then
  error(("pretrain: unknown --optimizer '%s' (lamb or adam)"):format(opt.optimizer), 0)
end
dist.check_allreduce_dtype("pretrain", opt.allreduce_dtype, opt.precision)
local scaler_opts = amp.loss_scale_option(opt.loss_scale, "pretrain")
local dev, dev_line = device.setup(opt, "pretrain")
say(("%s (%s); world size %d, %d CPU threads per rank"):format(dev_line, amp.path(dev, opt.precision), world,
  bl.num_threads()))
say(options.show(opt))
local use_graph = opt.cuda_graph
if use_graph and graph.unavailable(dev) then
  say("pretrain: " .. graph.unavailable(dev) .. "; running without a CUDA graph")
  use_graph = false
end

-- The model: a preset or a config.json, BERT initialisation from the seed.
local function model_config()
  local cfg = bert.config.is_preset(opt.model) and bert.config.preset(opt.model) or bert.config.load(opt.model)
  if opt.dropout >= 0 then
    cfg.hidden_dropout_prob, cfg.attention_probs_dropout_prob = opt.dropout, opt.dropout
  end
  return cfg
end
if opt.vocab then Tok.load(opt.vocab):check_model(model_config().vocab_size, "pretrain", opt.model) end
-- every rank runs one job: options, model, vocabulary and data compared before any work (bertlua.train.fingerprint)
dist.agree("pretrain", fingerprint.entries{ options = opt, config = model_config(),
  files = { { "--vocab", opt.vocab }, { "--init", opt.init } },
  data = { { "--data-phase1", opt.data_phase1 }, { "--data-phase2", opt.data_phase2 } } })

-- the run directory belongs to this run while it lasts (a second run into it is refused)
if rank == 0 then fs.lock_dir(opt.output, "pretrain") end
local log = logm.open{ path = logm.path_for(opt.output, "log", opt.log_format), rank = rank, append = opt.resume,
  config = { options = opt, world_size = world }, format = opt.log_format }
local done = { steps = 0, sequences = 0, train_time = 0 }   -- this run's work, for the summary line

local t_start = logm.clock()

local function run_phase(ph, init_model_dir, prev_opt_state)
  local accum = phase.accumulation(ph, opt.micro_batch, world)
  say(("phase %d: S=%d, %d predictions, global batch %d = %d ranks x %d micro-batch x %d accumulation, %d steps, lr %g")
    :format(ph.phase, ph.seq, ph.pred, ph.batch, world, opt.micro_batch, accum, ph.steps, ph.lr))

  local cfg = model_config()
  local model = bert.BertForPreTraining(cfg, { seed = opt.seed })
  if init_model_dir then
    require("bertlua.io.import").load_into(model, init_model_dir)
    say("  initialised from " .. init_model_dir)
  end
  -- on a GPU in bf16/fp16 the model trains on its half compute copy; f32 master weights stay in flat_params
  amp.model_to(model, dev, opt.precision)
  -- NVLAMB, or AdamW; both decay all but biases and LayerNorm, both bias-correct
  local optimizer = (opt.optimizer == "adam" and optim.AdamW or optim.LAMB){ model = model, lr = ph.lr,
    weight_decay = opt.weight_decay, max_grad_norm = opt.max_grad_norm }
  if prev_opt_state and opt.keep_optimizer then optimizer:load_state_dict(prev_opt_state) end
  local lr_at = schedule.poly_warmup{ lr = ph.lr, total_steps = ph.steps, power = opt.power,
    warmup_steps = ph.warmup_steps, warmup_proportion = not ph.warmup_steps and ph.warmup or nil }
  -- bf16/fp16: f32 master weights and the half compute copy on a GPU (half weights and gradients emulated on the
  -- CPU, see bertlua.train.amp), loss scaling for fp16
  local mp = amp.MixedPrecision{ model = model, precision = opt.precision, scaler = scaler_opts }
  say("  training path: " .. mp:path())
  model.bert.unpad_training = opt.unpad and dev < 0
  model.bert.encoder.checkpoint = opt.checkpoint_activations
  say("  padded positions: " .. (model.bert.unpad_training and "skipped (real tokens packed, attention per row; "
    .. "--unpad=false computes them)" or (dev < 0 and "computed (--unpad=false)" or "computed (GPU)")))
  -- data parallel: gradients summed in buckets, each encoder layer's launched when its backward of the last
  -- micro-batch returns (overlapped with the rest of backward), once it is final: rounded to bf16/fp16 (each backward
  -- adds into the buffer, so the earlier micro-batches' gradients are in it; the reducer finishes the other ranges
  -- before it launches their buckets)
  local reducer = dist.Reducer{ grads = model.flat_grads, bucket_mb = opt.bucket_mb, dtype = opt.allreduce_dtype }
  reducer:on_final(function(lo, hi) mp:round_grads(lo, hi) end)
  if world > 1 then reducer:attach(model) end

  -- the data (virtual-rank slices of the global batch, held-out evaluation) and the checkpoints (resume, save)
  local d = phase.Data{ ph = ph, opt = opt, accum = accum, rank = rank, world = world, dev = dev, say = say }
  local ck = phase.Checkpoints{ ph = ph, opt = opt, cfg = cfg, data = d, model = model, optimizer = optimizer,
    amp = mp, reducer = reducer, rank = rank, world = world, say = say }
  local start = ck:resume()

  -- the step (bertlua.train.step, also what recipes/benchmark.lua times); its device memory is made here, before
  -- the first step. Dropout streams from --seed: a resumed run sees the same masks.
  local pstep = tstep.Step{ model = model, optimizer = optimizer, amp = mp, loss = tstep.pretraining_loss(),
    reducer = reducer, dev = dev, accum = accum, world = world, rank = rank, seed = opt.seed, name = "pretrain",
    say = say }
  if use_graph then pstep:use_graph() end  -- captured once a step allocates nothing (from the 2nd or 3rd step)
  -- every rank stops at the same step (max steps, max time, a signal on any rank)
  local stop = phase.stop_votes{ max_steps = opt.max_steps, max_time = opt.max_time, t_start = t_start,
    reducer = reducer }
  local function train_step(step, next_batch)
    -- skip or update decided on the model's device: no wait here
    pstep:run(step, next_batch, lr_at(optimizer.step_count + 1))
    if step % opt.log_every ~= 0 and step ~= ph.steps then return nil end
    -- the one wait of a logged step: its sums, the scaler state and the deferred index checks
    local rec = pstep:record(step)
    rec.phase, rec.overlapped_buckets = ph.phase, world > 1 and reducer.overlapped or nil  -- launched during backward
    return rec
  end
  local function log_step(rec, step)  -- rec: nil on a step that is not logged
    if not rec then return end
    log:step(rec)
    if rec.loss ~= rec.loss then
      error(("pretrain: loss is NaN at step %d (precision %s); the last checkpoint in %s is the last good state")
        :format(step, opt.precision, ck.dir), 0)
    end
  end
  local t_loop = logm.clock()
  local step, stop_reason = loop.run{ name = "pretrain", start = start, total = ph.steps, stop = stop,
    batch = function(s, a) return d:next(s, a) end, step = train_step, log = log_step,
    checkpoint = function(s)
      if opt.checkpoint_interval > 0 and s % opt.checkpoint_interval == 0 then ck:save(s) end
    end,
    evaluate = function(s)
      if opt.eval_interval > 0 and s % opt.eval_interval == 0 then d:evaluate(model, s, log) end
    end }
  done.steps, done.sequences = done.steps + step - start, done.sequences + (step - start) * ph.batch
  done.train_time = done.train_time + logm.clock() - t_loop
  if stop_reason then
    ck:save(step)
    say(("phase %d: stopped at step %d (%s); --resume continues from here"):format(ph.phase, step, stop_reason))
  end
  d:close()
  local finished = step >= ph.steps
  local final_dir = ("%s/phase%d"):format(opt.output, ph.phase)
  if finished then
    ck:save(step)
    d:evaluate(model, step, log)
    if rank == 0 then
      pretrained.save_pretrained(model, final_dir, { vocab = opt.vocab })
      say(("phase %d: done, model saved to %s"):format(ph.phase, final_dir))
    end
    dist.barrier()
  end
  return finished, final_dir, optimizer:state_dict()
end

local ok, err = xpcall(function()
  local init, prev_state = opt.init, nil
  for _, p in ipairs(opt.phase == "both" and { 1, 2 } or { tonumber(opt.phase) }) do
    init = phase.init_dir(opt, p, init)
    local finished, final_dir, state = run_phase(phase.settings(opt, p), init, prev_state)
    if not finished then break end
    init, prev_state = final_dir, state
  end
  log:summary(done)
end, debug.traceback)
log:close()
-- the host prints the one line of a user error (the traceback too for an internal one or --debug), then ends
-- every rank of an MPI job
if not ok then error(err, 0) end
