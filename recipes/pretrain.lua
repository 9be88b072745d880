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
-- SPEC below or in run_phase after it (the model, the optimizer, the
-- schedule, the step): edit them here, no C needed. The plumbing around them
-- is in the library: bertlua.train.setup (precision, device, data-parallel and
-- log options, the log) and bertlua.train.phase (data slices, checkpoints and
-- resume, held-out evaluation, stop votes).
local options = require "bertlua.util.options"
local bert = require "bertlua.bert"
local import = require "bertlua.io.import"
local pretrained = require "bertlua.pretrained"
local optim = require "bertlua.train.optim"
local schedule = require "bertlua.train.schedule"
local amp = require "bertlua.train.amp"
local dist = require "bertlua.train.dist"
local loop = require "bertlua.train.loop"
local tstep = require "bertlua.train.step"
local phase = require "bertlua.train.phase"
local setup = require "bertlua.train.setup"

local SPEC = {
  -- the model and the data
  { "model", "large", "preset (tiny mini small medium base large) or a config.json" },
  { "init", nil, "start from these weights (phase 1, or --phase=2 alone): a model directory, or a checkpoint "
    .. "bertlua.import reads (Google's TF bert_model.ckpt, pytorch_model.bin, NVIDIA's .pt)" },
  { "init_random", false, "--phase=2 without --init or a phase-1 model in --output: start from random weights "
    .. "(refused otherwise)" },
  { "vocab", nil, "vocab.txt used to create the data (checked against the shards; copied to the output model)" },
  { "data_phase1", nil, "directory of phase-1 shards (S=128)" },
  { "data_phase2", nil, "directory of phase-2 shards (S=512)" },
  { "eval_data", nil,
    "held-out shard directory for the MLM and NSP evaluation (default: test_* shards next to the training data)" },
  { "output", "runs/pretrain", "run directory: checkpoints/, log.jsonl, phase1/ and phase2/ final models" },
  -- the two phases: sequence length, masked predictions, global batch, peak learning rate, warmup, steps
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
  -- the optimizer and the model's training
  { "optimizer", "lamb", "lamb (NVLAMB, NVIDIA's PyTorch recipe) or adam (AdamW with bias correction, as NVIDIA's TF2 "
    .. "recipe's adam; --lr1/--lr2 default to LAMB's rates: give Adam's, e.g. 1e-4)" },
  { "power", 0.5, "polynomial decay power after warmup", min = 0 },
  { "weight_decay", 0.01, "decoupled weight decay (not on biases/LayerNorm)", min = 0 },
  { "max_grad_norm", 1.0, "global gradient pre-normalisation (LAMB) or clipping (adam)", min = 0, above = true,
    int = false },
  { "keep_optimizer", false, "phase 2 keeps phase 1's optimizer state (NVIDIA starts it fresh)" },
  { "seed", 12439, "seed for initialisation, data order and dropout", int = true, min = 0, max = 2 ^ 53 },
  { "dropout", -1, "override hidden and attention dropout (-1: keep the config's 0.1)", min = -1, max = 0.99,
    int = false },
  { "unpad", true, "CPU: train on the real tokens only, padded positions skipped (exact: their gradients are zero); "
    .. "false: the padded step" },
  -- checkpoints, held-out evaluation, how long this run lasts
  { "checkpoint_interval", 200, "optimizer steps between checkpoints (0: only at the end and at a stop)", int = true,
    min = 0 },
  { "keep_checkpoints", 3, "checkpoints kept per phase", int = true, min = 1 },
  { "resume", false, "continue from the newest complete checkpoint in --output" },
  { "max_steps", 0, "stop each phase after this many steps of this run (0: all)", int = true, min = 0 },
  { "max_time", 0, "stop after this many seconds, with a checkpoint (0: no limit)", min = 0, int = false },
  { "eval_interval", 0, "steps between held-out evaluations, MLM and NSP (0: only at the end of a phase)", int = true,
    min = 0 },
  { "eval_batches", 20, "micro-batches per evaluation", int = true, min = 1 },
  { "dump_batches", nil, "CPU: also write every training micro-batch to DIR/phaseP/STEP_J.safetensors (J: micro-batch "
    .. "of the step), the data tools/peers/nvidia_pretrain_reference.py replays" },
}
-- + precision, loss scale, data-parallel all-reduce, log, threads, activation checkpointing, CUDA graph, device
local opt = options.parse(arg, options.concat(SPEC, setup.options("the log is log.jsonl or dllogger.json")),
  { name = "pretrain",
    usage = "usage: [mpirun -np N] bertlua recipes/pretrain.lua --data-phase1=DIR [--data-phase2=DIR] [options]" })
-- NVLAMB (NVIDIA's PyTorch recipe) or AdamW (its TF2 recipe's adam): both decay all but biases and LayerNorm,
-- both bias-correct
local OPTIMIZERS = { lamb = optim.LAMB, adam = optim.AdamW }
local Optimizer = OPTIMIZERS[opt.optimizer]
if not Optimizer then error(("pretrain: unknown --optimizer '%s' (lamb or adam)"):format(opt.optimizer), 0) end
local run = setup.start(opt, "pretrain")   -- the other options checked, the device picked, the options printed
local say, dev, world = run.say, run.dev, run.world

-- The model: a preset or a config.json, BERT initialisation from the seed.
local function model_config()
  local cfg = bert.config.is_preset(opt.model) and bert.config.preset(opt.model) or bert.config.load(opt.model)
  if opt.dropout >= 0 then
    cfg.hidden_dropout_prob, cfg.attention_probs_dropout_prob = opt.dropout, opt.dropout
  end
  return cfg
end
phase.agree(opt, model_config())   -- the vocabulary fits the model; every rank runs the same job
local log = run:open_log(opt.output, "log", opt.resume)   -- OUTPUT/log.jsonl, appended to by --resume

local function run_phase(ph, init_model_dir, prev_opt_state)
  local accum = phase.accumulation(ph, opt.micro_batch, world)
  say(("phase %d: S=%d, %d predictions, global batch %d = %d ranks x %d micro-batch x %d accumulation, %d steps, lr %g")
    :format(ph.phase, ph.seq, ph.pred, ph.batch, world, opt.micro_batch, accum, ph.steps, ph.lr))

  local cfg = model_config()
  local model = bert.BertForPreTraining(cfg, { seed = opt.seed })
  if init_model_dir then
    import.load_into(model, init_model_dir)
    say("  initialised from " .. init_model_dir)
  end
  -- on a GPU in bf16/fp16 the model trains on its half compute copy; f32 master weights stay in flat_params
  amp.model_to(model, dev, opt.precision)
  local optimizer = Optimizer{ model = model, lr = ph.lr, weight_decay = opt.weight_decay,
    max_grad_norm = opt.max_grad_norm }
  if prev_opt_state and opt.keep_optimizer then optimizer:load_state_dict(prev_opt_state) end
  local lr_at = schedule.poly_warmup{ lr = ph.lr, total_steps = ph.steps, power = opt.power,
    warmup_steps = ph.warmup_steps, warmup_proportion = not ph.warmup_steps and ph.warmup or nil }
  -- bf16/fp16: f32 master weights and the half compute copy on a GPU (half weights and gradients emulated on the
  -- CPU, see bertlua.train.amp), loss scaling for fp16
  local mp = amp.MixedPrecision{ model = model, precision = opt.precision, scaler = run.scaler }
  say("  training path: " .. mp:path())
  model.bert.unpad_training = opt.unpad and dev < 0
  model.bert.encoder.checkpoint = opt.checkpoint_activations
  say("  padded positions: " .. (model.bert.unpad_training and "skipped (real tokens packed, attention per row; "
    .. "--unpad=false computes them)" or (dev < 0 and "computed (--unpad=false)" or "computed (GPU)")))
  -- data parallel: gradients summed in buckets, each encoder layer's launched when its backward of the last
  -- micro-batch returns (overlapped with the rest of backward), once it is final: rounded to bf16/fp16
  local reducer = dist.Reducer{ grads = model.flat_grads, bucket_mb = opt.bucket_mb, dtype = opt.allreduce_dtype }
  reducer:on_final(function(lo, hi) mp:round_grads(lo, hi) end)
  if world > 1 then reducer:attach(model) end

  -- the data (virtual-rank slices of the global batch, held-out evaluation) and the checkpoints (resume, save)
  local d = phase.Data{ ph = ph, opt = opt, accum = accum, run = run }
  local ck = phase.Checkpoints{ ph = ph, opt = opt, cfg = cfg, data = d, model = model, optimizer = optimizer,
    amp = mp, reducer = reducer, run = run }
  local start = ck:resume()

  -- the step (bertlua.train.step, also what recipes/benchmark.lua times); its device memory is made here, before
  -- the first step. Dropout streams from --seed: a resumed run sees the same masks.
  local pstep = tstep.Step{ model = model, optimizer = optimizer, amp = mp, loss = tstep.pretraining_loss(),
    reducer = reducer, dev = dev, accum = accum, world = world, rank = run.rank, seed = opt.seed, name = "pretrain",
    say = say }
  if run.use_graph then pstep:use_graph() end  -- captured once a step allocates nothing (from the 2nd or 3rd step)
  local function train_step(step, next_batch)
    -- skip or update decided on the model's device: no wait here
    pstep:run(step, next_batch, lr_at(optimizer.step_count + 1))
    if step % opt.log_every ~= 0 and step ~= ph.steps then return nil end
    -- the one wait of a logged step: its sums, the scaler state and the deferred index checks
    local rec = pstep:record(step)
    rec.phase, rec.overlapped_buckets = ph.phase, world > 1 and reducer.overlapped or nil  -- launched during backward
    return rec
  end
  local t_loop = run.clock()
  local step, stop_reason = loop.run{ name = "pretrain", start = start, total = ph.steps,
    -- every rank stops at the same step (max steps, max time, a signal on any rank)
    stop = phase.stop_votes{ max_steps = opt.max_steps, max_time = opt.max_time, t_start = run.t_start,
      reducer = reducer },
    batch = function(s, a) return d:next(s, a) end, step = train_step, log = ck:logger(log),
    checkpoint = function(s)
      if opt.checkpoint_interval > 0 and s % opt.checkpoint_interval == 0 then ck:save(s) end
    end,
    evaluate = function(s)
      if opt.eval_interval > 0 and s % opt.eval_interval == 0 then d:evaluate(model, s, log) end
    end }
  run:count(step - start, ph.batch, t_loop)
  -- a stop's checkpoint, or the last step's and the final evaluation; then the model for fine-tuning
  if not ck:finish(step, stop_reason, log) then return false end
  local final_dir = ("%s/phase%d"):format(opt.output, ph.phase)
  if run.rank == 0 then
    pretrained.save_pretrained(model, final_dir, { vocab = opt.vocab })
    say(("phase %d: done, model saved to %s"):format(ph.phase, final_dir))
  end
  dist.barrier()
  return true, final_dir, optimizer:state_dict()
end

run:main(function()
  local init, prev_state = opt.init, nil
  for _, p in ipairs(opt.phase == "both" and { 1, 2 } or { tonumber(opt.phase) }) do
    init = phase.init_dir(opt, p, init)
    local finished, final_dir, state = run_phase(phase.settings(opt, p), init, prev_state)
    if not finished then break end
    init, prev_state = final_dir, state
  end
end)
