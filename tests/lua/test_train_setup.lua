-- bertlua.train.setup (the start and end of recipes/pretrain.lua's run): the shared option group and
-- options.concat, the checks of start() with errors naming the recipe, --cuda-graph dropped without a GPU, the run
-- directory's lock and log, and main(): the summary of the counted steps, the log closed on an error too.
local T = require "testing"
local cjson = require "cjson"
local options = require "bertlua.util.options"
local setup = require "bertlua.train.setup"

local OWN = { { "lr", 1e-3, "peak learning rate", min = 0, above = true }, { "output", "runs/x", "run directory" } }
local function parse(args) return options.parse(args, options.concat(OWN, setup.options("the log is x.jsonl")),
  { name = "pretrain" }) end
-- start(args) -> the run and the lines it printed
local function start(args)
  local lines, print0 = {}, print
  print = function(...) lines[#lines + 1] = table.concat({ ... }, "\t") end   -- luacheck: ignore 121
  local ok, run = pcall(setup.start, parse(args), "pretrain")
  print = print0   -- luacheck: ignore 121
  if not ok then error(run, 0) end
  return run, table.concat(lines, "\n")
end

T.test("the option group joins a recipe's own options; one option twice is refused", function()
  local opt = parse({ "--lr=0.5", "--precision=bf16", "--bucket-mb=4.5" })
  T.eq(opt.lr, 0.5); T.eq(opt.precision, "bf16"); T.eq(opt.bucket_mb, 4.5)
  T.eq(opt.loss_scale, "dynamic"); T.eq(opt.log_format, "jsonl"); T.eq(opt.device, "auto"); T.eq(opt.cuda_graph, false)
  T.eq(opt.checkpoint_activations, false); T.eq(opt.threads, 0); T.eq(opt.log_every, 1)
  T.truthy(options.help(options.concat(OWN, setup.options("the log is x.jsonl"))):find("; the log is x.jsonl", 1, true))
  T.raises(function() parse({ "--log-every=0" }) end, "pretrain: option --log-every=0: must be >= 1")
  T.raises(function() options.concat(OWN, { { "output", "y", "again" } }) end, "option --output is given twice")
end)

T.test("start: each option checked, naming the recipe; the device line and the options printed", function()
  T.raises(function() start({ "--precision=fp8" }) end, "pretrain: --precision must be fp32, tf32, bf16 or fp16")
  T.raises(function() start({ "--log-format=csv" }) end, "pretrain: unknown --log-format 'csv' (jsonl or dllogger)")
  T.raises(function() start({ "--loss-scale=-1" }) end, "pretrain: --loss-scale must be")
  T.raises(function() start({ "--allreduce-dtype=int8" }) end, "pretrain: --allreduce-dtype must be fp32, bf16 or fp16")
  T.raises(function() start({ "--device=tpu" }) end, "pretrain: --device must be cpu, cuda, cuda:N or auto")
  local run, said = start({ "--device=cpu", "--cuda-graph", "--loss-scale=128" })
  T.eq(run.dev, -1); T.eq(run.rank, 0); T.eq(run.world, 1)
  T.eq(run.use_graph, false, "no graph on the CPU")
  T.eq(run.scaler.init_scale, 128)
  T.truthy(said:find("world size 1, %d+ CPU threads per rank"), said)
  T.truthy(said:find("  lr = 0.001\n", 1, true), said)
  T.truthy(said:find("pretrain: --cuda-graph needs --device=cuda; running without a CUDA graph", 1, true), said)
end)

T.test("the run directory: locked, its log opened; main writes the summary and closes the log", function()
  local dir = T.tmpdir() .. "/run"
  local run = start({ "--device=cpu", "--output=" .. dir })
  local log = run:open_log(dir, "log", false)
  T.truthy(run.t_start <= run.clock(), "the run's clock")
  T.raises(function() require("bertlua.util.fs").lock_dir(dir, "pretrain") end, "is in use by another run")
  run:main(function()
    log:step({ step = 1, loss = 3 })
    run:count(2, 16, run.clock())
    run:count(1, 8, run.clock())
  end)
  local recs = {}
  for line in T.slurp(dir .. "/log.jsonl"):gmatch("[^\n]+") do recs[#recs + 1] = cjson.decode(line) end
  T.eq(recs[1].event, "config"); T.eq(recs[1].config.world_size, 1); T.eq(recs[1].config.options.output, dir)
  T.eq(recs[3].event, "summary"); T.eq(recs[3].steps, 3); T.eq(recs[3].sequences, 40); T.eq(recs[3].final_loss, 3)
  T.eq(log.file, nil, "closed")
  local run2 = start({ "--device=cpu", "--log-format=dllogger" })
  run2:open_log(dir .. "2", "log", false)
  T.raises(function() run2:main(function() error("pretrain: a user error", 0) end) end, "pretrain: a user error")
  T.eq(run2.log.file, nil, "closed after an error")
  T.truthy(T.slurp(dir .. "2/dllogger.json"):find('"PARAMETER"', 1, true), "the DLLogger format")
end)

T.run()
