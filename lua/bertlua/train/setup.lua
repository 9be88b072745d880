-- bertlua.train.setup: the start and the end of a training recipe's run, around its hyperparameters: the options
-- of precision, data parallelism, device, CUDA graph, threads and log as one group, their checks, the device, the
-- run directory's log and the summary line.
--
--   local setup = require "bertlua.train.setup"
--   local opt = options.parse(arg, options.concat(SPEC, setup.options("the log is log.jsonl or dllogger.json")))
--   local run = setup.start(opt, "pretrain")   -- run.rank, run.world, run.dev, run.say, run.scaler, run.use_graph
--   local log = run:open_log(opt.output, "log", opt.resume)   -- the directory locked for this run, its log opened
--   run:main(function() ... run:count(steps, sequences_per_step, t_loop) ... end)   -- then the summary
local amp = require "bertlua.train.amp"
local device = require "bertlua.train.device"
local dist = require "bertlua.train.dist"
local graph = require "bertlua.device.graph"
local runtime = require "bertlua.runtime"
local bert = require "bertlua.bert"
local fs = require "bertlua.util.fs"
local logm = require "bertlua.util.log"
local options = require "bertlua.util.options"

local M = {}

-- options(log_help) -> the group's option specs (options.parse); log_help ends --log-format's help (which file)
function M.options(log_help)
  return {
    { "precision", "fp32",
      "fp32 | tf32 | bf16 | fp16 (tf32 = fp32 on the CPU; bf16/fp16: f32 master weights, on a GPU a half compute " ..
        "copy with half activations, on the CPU half weights and gradients emulated; fp16 with loss scaling)" },
    { "loss_scale", "dynamic", "fp16 loss scale: dynamic, dynamic:INIT[:INTERVAL] or a fixed number (e.g. 32768)" },
    { "bucket_mb", 25, "data parallel: gradients are summed in buckets of this many MB (f32), each launched as "
      .. "soon as backward has finished it", min = 0, above = true, int = false },
    { "allreduce_dtype", "fp32", dist.ALLREDUCE_HELP },
    { "log_every", 1, "steps between JSON log lines", int = true, min = 1 },
    { "log_format", "jsonl", logm.FORMAT_HELP .. "; " .. log_help },
    { "threads", 0, "CPU threads (0: keep the default)" },
    bert.CHECKPOINT_OPTION,
    { "cuda_graph", false, "GPU: run each step as one CUDA graph, NCCL all-reduces included (captured after the "
      .. "first step; the device runs it without launch gaps)" },
    device.OPTION,
  }
end

local Run = { clock = logm.clock }   -- run.clock(): seconds, for run:count
Run.__index = Run

-- start(opt, name) -> the run: the group's options checked (errors name the recipe), SIGINT/SIGTERM watched
-- (every rank stops at the same step with a checkpoint; a second signal stops at once), the device picked, the
-- device line and the options printed by rank 0. --cuda-graph without a GPU is said and dropped (run.use_graph).
function M.start(opt, name)
  runtime.stop_watch()
  if opt.threads > 0 then runtime.set_num_threads(opt.threads) end
  local rank, world = dist.rank(), dist.size()
  local function say(...) if rank == 0 then print(...) end end
  amp.check_precision(name, opt.precision)
  logm.check_format(opt.log_format, name)
  dist.check_allreduce_dtype(name, opt.allreduce_dtype, opt.precision)
  local scaler = amp.loss_scale_option(opt.loss_scale, name)
  local dev, dev_line = device.setup(opt, name)
  say(("%s (%s); world size %d, %d CPU threads per rank"):format(dev_line, amp.path(dev, opt.precision), world,
    runtime.num_threads()))
  say(options.show(opt))
  local use_graph = opt.cuda_graph
  if use_graph and graph.unavailable(dev) then
    say(name .. ": " .. graph.unavailable(dev) .. "; running without a CUDA graph")
    use_graph = false
  end
  return setmetatable({ name = name, opt = opt, rank = rank, world = world, dev = dev, say = say, scaler = scaler,
    use_graph = use_graph, done = { steps = 0, sequences = 0, train_time = 0 } }, Run)
end

-- open_log(dir, file, append) -> the log of the run directory (DIR/FILE.jsonl or DIR/dllogger.json; its config
-- record holds the options and the world size). The directory belongs to this run while it lasts: a second run
-- into it is refused. The run's clock (run.t_start, for --max-time) starts here.
function Run:open_log(dir, file, append)
  if self.rank == 0 then fs.lock_dir(dir, self.name) end
  self.log = logm.open{ path = logm.path_for(dir, file, self.opt.log_format), rank = self.rank, append = append,
    config = { options = self.opt, world_size = self.world }, format = self.opt.log_format }
  self.t_start = logm.clock()
  return self.log
end

-- count(steps, per_step, t_loop): steps of this run done since logm.clock() was t_loop, per_step sequences each
-- (the summary's tallies)
function Run:count(steps, per_step, t_loop)
  local d = self.done
  d.steps, d.sequences = d.steps + steps, d.sequences + steps * per_step
  d.train_time = d.train_time + logm.clock() - t_loop
end

-- main(fn): runs fn, then the summary line and record; the log is closed whatever happens, then an error goes on
-- to the host (it prints the one line of a user error, the traceback too for an internal one or --debug, and ends
-- every rank of an MPI job)
function Run:main(fn)
  local ok, err = xpcall(function()
    fn()
    self.log:summary(self.done)
  end, debug.traceback)
  self.log:close()
  if not ok then error(err, 0) end
end

return M
