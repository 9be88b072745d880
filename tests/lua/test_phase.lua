-- bertlua.train.phase (recipes/pretrain.lua's phase plumbing) on the tiny pre-training corpus: the accumulation
-- and start checks, the inputs every rank agrees on, the virtual-rank data slices (a step's micro-batches do not
-- depend on how it is split over ranks and accumulation), the held-out evaluation (bertlua.train.pretrain_eval's
-- metrics), a checkpoint that resumes the loaders, optimizer and scaler where they were and refuses another cut of
-- the batch, the log hook, the phase's end and the stop votes.
local T = require "testing"
local fx = require("pretrain_fixture").make(T)
local ffi = require "ffi"
local runtime = require "bertlua.runtime"
local bert = require "bertlua.bert"
local optim = require "bertlua.train.optim"
local amp = require "bertlua.train.amp"
local dist = require "bertlua.train.dist"
local phase = require "bertlua.train.phase"
local pretrain_eval = require "bertlua.train.pretrain_eval"
local loader = require "bertlua.data.loader"
local ckpt = require "bertlua.train.checkpoint"

local tmp = fx.tmp
local function options(o)
  local opt = { seed = 7, micro_batch = 4, vocab = tmp .. "/vocab.txt", eval_batches = 2, output = tmp .. "/out",
    optimizer = "lamb", keep_checkpoints = 2, resume = false, bin_lengths = false, init_random = false,
    precision = "fp32", model = tmp .. "/cfg.json",
    seq1 = 32, pred1 = 5, batch1 = 8, lr1 = 1e-3, warmup1 = 0.1, warmup_steps1 = -1, steps1 = 4, data_phase1 = fx.data }
  for k, v in pairs(o or {}) do opt[k] = v end
  return opt
end
local said = {}
local function say(line) said[#said + 1] = line end
local function data(opt, accum, rank, world)
  return phase.Data{ ph = phase.settings(opt, 1), opt = opt, accum = accum,
    run = { rank = rank, world = world, dev = -1, say = say } }
end
local function events()   -- a log that keeps what it is given
  local l = { steps = {}, events = {} }
  function l.step(_, rec) l.steps[#l.steps + 1] = rec end
  function l.event(_, name, rec) rec.event = name; l.events[#l.events + 1] = rec end
  return l
end
local function ids(b) return table.concat(b.input_ids:contiguous():totable(), " ") end   -- as one string

T.test("accumulation and the phase's start: the checks of the recipe", function()
  local opt = options()
  T.eq(phase.accumulation(phase.settings(opt, 1), 4, 1), 2)
  T.eq(phase.accumulation(phase.settings(opt, 1), 2, 2), 2)
  T.raises(function() phase.accumulation(phase.settings(opt, 1), 3, 1) end,
    "phase 1 global batch 8 is not a multiple of micro-batch 3 x 1 ranks")
  T.raises(function() phase.accumulation(phase.settings(options{ data_phase1 = false }, 1), 4, 1) end,
    "--data-phase1 is required for phase 1")
  T.eq(phase.init_dir(opt, 1, nil), nil)
  T.eq(phase.init_dir(opt, 2, "somewhere"), "somewhere")
  T.raises(function() phase.init_dir(opt, 2, nil) end, "--phase=2 starts from phase 1's model")
  T.eq(phase.init_dir(options{ init_random = true }, 2, nil), nil)
  T.raises(function() phase.init_dir(options{ init = "x", init_random = true }, 1, "x") end,
    "--init and --init-random exclude each other")
  local cfg = bert.config.load(tmp .. "/cfg.json")
  phase.agree(opt, cfg)   -- one rank: agrees with itself
  cfg.vocab_size = 10
  T.raises(function() phase.agree(opt, cfg) end, "more than the model's vocab_size 10 (" .. opt.model .. ")")
end)

T.test("virtual ranks: micro-batch a of rank r is data slice r * accum + a of the global batch", function()
  local opt = options()
  local one = data(opt, 2, 0, 1)           -- 1 rank x 2 micro-batches
  local r0, r1 = data(opt, 1, 0, 2), data(opt, 1, 1, 2)   -- 2 ranks x 1 micro-batch
  T.eq(one.slices, 2); T.eq(r1.slices, 2)
  for step = 1, 3 do
    local a, b = ids(one:next(step, 1)), ids(one:next(step, 2))
    T.truthy(a ~= b, "two slices")
    T.eq(a, ids(r0:next(step, 1)), "step " .. step .. ", slice 0")
    T.eq(b, ids(r1:next(step, 1)), "step " .. step .. ", slice 1")
  end
  T.truthy(#said == 0, table.concat(said, "\n"))   -- the fixture has held-out shards
  for _, d in ipairs({ one, r0, r1 }) do d:close() end
end)

T.test("evaluation: pretrain_eval's MLM and NSP metrics of the first --eval-batches held-out batches", function()
  local opt = options()
  local d = data(opt, 2, 0, 1)
  local model = bert.BertForPreTraining(bert.config.load(tmp .. "/cfg.json"), { seed = 1 })
  local log = events()
  local n = #said
  local e = d:evaluate(model, 3, log)
  d:close()
  T.eq(log.events[1], e); T.eq(e.event, "eval"); T.eq(e.step, 3); T.eq(e.phase, 1)
  local held = loader.Loader{ dir = fx.data, split = "test", batch_size = 4, seed = 7, max_seq_length = 32,
    max_predictions = 5, vocab = opt.vocab, shuffle = false }
  local m = pretrain_eval.metrics(pretrain_eval.sums(model, held, { batches = 2 }))
  held:close()
  T.truthy(m.mlm_count > 0 and m.nsp_count == 8, "2 batches of 4 sequences")
  for _, k in ipairs({ "mlm_loss", "mlm_acc", "nsp_loss", "nsp_acc" }) do T.eq(e["eval_" .. k], m[k], k) end
  T.truthy(e.eval_nsp_loss > 0 and e.eval_nsp_acc >= 0 and e.eval_nsp_acc <= 1, "NSP metrics")
  T.truthy(said[n + 1]:find(("eval phase 1 step 3: MLM loss %.4f, MLM accuracy %.4f (%d predictions), NSP loss "
    .. "%.4f, NSP accuracy %.4f (8 sequences)"):format(m.mlm_loss, m.mlm_acc, m.mlm_count, m.nsp_loss, m.nsp_acc),
    1, true), said[n + 1])
  T.eq(model.training, true, "the model is back in training mode")
end)

T.test("checkpoints: resume restores loaders, optimizer and scaler; another cut of the batch is refused", function()
  local function setup(opt, accum)
    local model = bert.BertForPreTraining(bert.config.load(tmp .. "/cfg.json"), { seed = 1 })
    local d = data(opt, accum, 0, 1)
    local o = optim.LAMB{ model = model, lr = 1e-3 }
    local mp = amp.MixedPrecision{ model = model, precision = "fp16" }
    local r = dist.Reducer{ grads = model.flat_grads }
    local ck = phase.Checkpoints{ ph = phase.settings(opt, 1), opt = opt, cfg = model.config, data = d, model = model,
      optimizer = o, amp = mp, reducer = r, run = { rank = 0, world = 1, dev = -1, say = say } }
    return ck, d, o, mp, model
  end
  local ck, d, o, mp, model = setup(options(), 2)
  T.eq(ck:resume(), 0)
  for step = 1, 3 do d:next(step, 1); d:next(step, 2) end
  model.flat_grads:fill_(1e-3)
  o:step(1e-3)
  mp.scaler.loss_scale = 1024
  ck:save(3)
  local want = { ids(d:next(4, 1)), ids(d:next(4, 2)) }
  local weights = model.flat_params:clone()
  d:close()
  local ck2, d2, o2, mp2, model2 = setup(options{ resume = true }, 2)
  T.eq(ck2:resume(), 3)
  T.eq(ids(d2:next(4, 1)), want[1], "the loaders continue where they were")
  T.eq(ids(d2:next(4, 2)), want[2])
  T.eq(o2.step_count, 1, "optimizer steps")
  T.eq(mp2:scale(), 1024, "loss scale")
  T.eq((model2.flat_params - weights):abs():max(), 0, "weights")
  d2:close()
  -- micro-batch 8 on 1 rank: 1 data slice instead of 2
  T.raises(function() setup(options{ resume = true, micro_batch = 8 }, 1) end, "data_slices")
end)

T.test("the log hook and the phase's end: a stop's checkpoint, or the last one and the final evaluation", function()
  local function setup(opt)
    local model = bert.BertForPreTraining(bert.config.load(tmp .. "/cfg.json"), { seed = 1 })
    local d = data(opt, 2, 0, 1)
    local ck = phase.Checkpoints{ ph = phase.settings(opt, 1), opt = opt, cfg = model.config, data = d, model = model,
      optimizer = optim.LAMB{ model = model, lr = 1e-3 }, amp = amp.MixedPrecision{ model = model, precision = "fp32" },
      reducer = dist.Reducer{ grads = model.flat_grads }, run = { rank = 0, world = 1, dev = -1, say = say } }
    return ck
  end
  local ck = setup(options{ output = tmp .. "/end" })
  local log = events()
  local hook = ck:logger(log)
  hook(nil, 1)
  hook({ step = 2, loss = 7 }, 2)
  T.eq(#log.steps, 1, "a step that is not logged has no record")
  T.raises(function() hook({ step = 3, loss = 0 / 0 }, 3) end, "pretrain: loss is NaN at step 3 (precision fp32); "
    .. "the last checkpoint in " .. tmp .. "/end/checkpoints/phase1 is the last good state")
  T.eq(#log.steps, 2, "the NaN record is logged first")
  local n = #said
  T.eq(ck:finish(2, "signal", log), false)
  T.eq(said[n + 1], "phase 1: stopped at step 2 (signal); --resume continues from here")
  local function last(dir) local l = ckpt.list(dir); return l[#l].step end
  T.eq(last(ck.dir), 2, "the stop's checkpoint")
  T.eq(#log.events, 0, "no evaluation")
  ck = setup(options{ output = tmp .. "/end", resume = true })
  T.eq(ck:resume(), 2)
  T.eq(ck:finish(4, nil, log), true)
  T.eq(last(ck.dir), 4, "the last step's checkpoint")
  T.eq(#log.events, 1); T.eq(log.events[1].step, 4, "the final evaluation")
end)

T.test("stop votes: max steps, max time, a signal", function()
  local stop = phase.stop_votes{ max_steps = 2, max_time = 0, t_start = 0 }
  T.eq(stop(5, 1), nil)
  T.eq(stop(5, 2), "max-steps")
  T.eq(phase.stop_votes{ max_steps = 0, max_time = 1e-9, t_start = 0 }(1, 0), "max-time")
  local votes = phase.stop_votes{ max_steps = 0, max_time = 0, t_start = 0 }
  T.eq(votes(1, 0), nil)
  runtime.stop_watch()   -- SIGTERM recorded, not fatal: the vote says so
  ffi.cdef("int getpid(void);")
  os.execute("kill -TERM " .. ffi.C.getpid())
  T.eq(votes(1, 0), "signal")
end)

T.run()
