-- Run-level agreement of recipes/pretrain.lua with the PyTorch reference of NVIDIA's run_pretraining.py
-- (tools/peers/nvidia_pretrain_reference.py) on real text: for each seed both sides pre-train the same model from
-- the same initial weights on the same batches in the same order (bertlua dumps them, the reference replays them),
-- dropout on, two phases; their snapshots are scored on held-out shards by the same evaluators: bertlua's
-- (bertlua.train.pretrain_eval) on every snapshot of both sides, and the reference's
-- (tools/peers/pretrain_eval_reference.py) on the phase ends of both sides (every snapshot with --cross-eval=all),
-- so the curves compare the models and the two evaluators are seen to agree.
--
--   nice -n 19 bertlua tools/pretrain_curves.lua --pretrain-config=recipes/configs/pretrain_mini_cpu.lua \
--     --seeds=1,2,3 --init-seed=1 \
--     [--ref-seeds=1,2,3] [--shared-data=../shared/data] [--output=runs/pretrain_curves]
--
-- Every stage is skipped when its result is already in OUTPUT (the data, a side's run of a seed, an evaluation),
-- so runs can be added a seed at a time and --report-only rewrites the report from what is there:
--   OUTPUT/data/{wiki,books,shards,p1,p2}  text extracted from the Wikipedia sample and the books, split into
--       training and held-out (test_*) shards, instances for S=128/20 (p1) and S=512/80 (p2)
--   OUTPUT/seedS/{init,batches,bertlua,reference}  the initial weights, the dumped batches, each side's run
--   OUTPUT/seedS/eval_{bertlua,reference}.jsonl  one line per (evaluator, side, phase, step) scored
--   OUTPUT/curves.csv, OUTPUT/summary.json, OUTPUT/summary.md  the curves, the final numbers and the table
-- Exit code 77 when the reference's Python cannot import torch and transformers (the bertlua side still runs).
local bert = require "bertlua.bert"
local pretrained = require "bertlua.pretrained"
local options = require "bertlua.util.options"
local shell = require "bertlua.util.shell"
local fs = require "bertlua.util.fs"
local data = require "bertlua.data.loader"
local pe = require "bertlua.train.pretrain_eval"
local cjson = require "cjson"

local SPEC = {
  { "pretrain_config", "recipes/configs/pretrain_mini_cpu.lua", "option file of recipes/pretrain.lua: the run "
    .. "both sides make (model, sequence lengths, batches, steps, learning rates, warmup, decay)" },
  { "shared_data", "../shared/data", "holds wikipedia/*.bz2 (the dump samples), books/*.txt and vocab/" },
  { "vocab", nil, "vocab.txt (default: SHARED_DATA/vocab/bert-base-uncased-vocab.txt)" },
  { "output", "runs/pretrain_curves", "data/, seedS/, curves.csv, summary.json, summary.md" },
  { "data", nil, "the prepared data to use (another run's OUTPUT/data, e.g. for a large-batch or optimizer variant "
    .. "on the same text; default: OUTPUT/data, made when missing)" },
  { "seeds", "1,2,3", "seeds of bertlua's runs (initial weights, data order, dropout)" },
  { "ref_seeds", nil, "seeds of the reference's runs (default: --seeds; each needs bertlua's run of that seed)" },
  { "sides", "bertlua,reference", "which sides to train and evaluate in this invocation" },
  { "num_shards", 4, "training shards", int = true, min = 1 },
  { "test_fraction", 0.1, "documents held out for evaluation", min = 0, max = 1, above = true },
  { "dupe1", 5, "phase-1 instances: passes over the text with different masks", int = true, min = 1 },
  { "dupe2", 2, "phase-2 instances: passes over the text", int = true, min = 1 },
  { "steps1", 0, "phase 1 steps (0: the config's)", int = true, min = 0 },
  { "steps2", 0, "phase 2 steps (0: the config's)", int = true, min = 0 },
  { "optimizer", nil, "lamb or adam instead of the config's (the reference runs LAMB only)",
    choices = { "lamb", "adam" } },
  { "precision", nil, "fp32, bf16 or fp16 (dynamic loss scale) instead of the config's (the reference runs fp32 only: "
    .. "--sides=bertlua for the others)", choices = { "fp32", "bf16", "fp16" } },
  { "lr1", 0, "phase 1 peak learning rate (0: the config's), before --scale-batch", min = 0, int = false },
  { "lr2", 0, "phase 2 peak learning rate (0: the config's), before --scale-batch", min = 0, int = false },
  { "scale_batch", 1, "K: both phases' batches x K, their steps / K, learning rates x sqrt(K) (the LAMB paper's "
    .. "large-batch rule: the same epochs in 1/K of the steps)", int = true, min = 1 },
  { "eval_every1", 250, "phase 1 steps between snapshots", int = true, min = 1 },
  { "eval_every2", 50, "phase 2 steps between snapshots", int = true, min = 1 },
  { "eval_instances1", 256, "held-out S=128 instances scored (the first ones, in file order)", int = true, min = 1 },
  { "eval_instances2", 64, "held-out S=512 instances scored", int = true, min = 1 },
  { "eval_batch", 8, "sequences per evaluation batch", int = true, min = 1 },
  { "baseline", nil, "another run's OUTPUT (e.g. the fp32 runs of the same config and data) whose bertlua seeds' "
    .. "phase ends give the spread this run's are held against (a precision or optimizer variant)" },
  { "cross_eval", "ends", "ends: the reference's evaluator on the initial weights and each phase's end; all: on "
    .. "every snapshot", choices = { "ends", "all" } },
  { "python", "/usr/bin/python3", "the Python with torch and transformers" },
  { "threads", 1, "CPU threads of each process", int = true, min = 1 },
  { "init_seed", 0, "seed of the initial weights of every run (0: each run's own seed)", int = true, min = 0 },
  { "batches_only", false, "write each seed's initial weights and the batches pretrain.lua will train on (from the "
    .. "same loader, without training), for a reference run elsewhere; bertlua's run checks them later" },
  { "max_steps", 0, "stop each run after this many steps of this invocation (with a checkpoint, which a later "
    .. "invocation resumes from; 0: run to the end)", int = true, min = 0 },
  { "train", true, "train the runs not finished yet (false: score the snapshots already there, a run in progress "
    .. "or stopped included)" },
  { "report_only", false, "only write the report from the results in OUTPUT" },
}
local opt = options.parse(arg, SPEC, { name = "pretrain_curves",
  usage = "usage: bertlua tools/pretrain_curves.lua [--pretrain-config=FILE] [--seeds=1,2,3] [options]" })
local here = (arg[0]:match("^(.*)/[^/]*$") or ".")
local root = here .. "/.."
local out = fs.mkdir_p(opt.output)
local exe = fs.host()

local function fail(msg) error("pretrain_curves: " .. msg, 0) end
local function list(s, what)
  local r = {}
  for w in tostring(s):gmatch("[^,%s]+") do
    local n = tonumber(w)
    if not n or n < 0 or n % 1 ~= 0 then fail(("--%s: '%s' is not a seed (a whole number)"):format(what, w)) end
    r[#r + 1] = n
  end
  return r
end
local seeds, ref_seeds = list(opt.seeds, "seeds"), list(opt.ref_seeds or opt.seeds, "ref-seeds")
local sides = {}
for w in opt.sides:gmatch("[^,%s]+") do
  if w ~= "bertlua" and w ~= "reference" then fail("--sides: bertlua and/or reference, got '" .. w .. "'") end
  sides[w] = true
end

-- the run both sides make: pretrain.lua's option file, with --steps1/--steps2 overriding it
local cfg_text = fs.read_text(opt.pretrain_config, "pretrain_curves")
local chunk, perr = loadstring(cfg_text, "@" .. opt.pretrain_config)
if not chunk then fail(opt.pretrain_config .. ": " .. tostring(perr)) end
local ok_cfg, run = pcall(setfenv(chunk, {}))
if not ok_cfg or type(run) ~= "table" then fail(opt.pretrain_config .. ": not an option file returning a table") end
for _, k in ipairs { "model", "seq1", "pred1", "batch1", "lr1", "warmup1", "steps1", "seq2", "pred2", "batch2", "lr2",
  "warmup2", "steps2", "micro_batch" } do
  if run[k] == nil then fail(("%s: '%s' is missing (both sides need it)"):format(opt.pretrain_config, k)) end
end
if opt.steps1 > 0 then run.steps1 = opt.steps1 end
if opt.steps2 > 0 then run.steps2 = opt.steps2 end
if opt.optimizer then run.optimizer = opt.optimizer end
run.precision = opt.precision or run.precision or "fp32"
for p = 1, 2 do
  if opt["lr" .. p] > 0 then run["lr" .. p] = opt["lr" .. p] end
  if opt.scale_batch > 1 then
    local k = opt.scale_batch
    if run["steps" .. p] % k ~= 0 then
      fail(("--scale-batch=%d: phase %d's %d steps are not a multiple of it"):format(k, p, run["steps" .. p]))
    end
    run["batch" .. p], run["steps" .. p], run["lr" .. p] = run["batch" .. p] * k, run["steps" .. p] / k,
      run["lr" .. p] * math.sqrt(k)
  end
end
for _, k in ipairs { "warmup_steps1", "warmup_steps2", "keep_optimizer", "bin_lengths" } do
  if run[k] and run[k] ~= -1 then fail(("%s: %s is not reproduced by the reference"):format(opt.pretrain_config, k)) end
end
if sides.reference and run.optimizer and run.optimizer ~= "lamb" then
  fail(opt.pretrain_config .. ": the reference runs LAMB only (--sides=bertlua for another optimizer)")
end
if sides.reference and run.precision and run.precision ~= "fp32" then
  fail(("precision %s: the reference runs fp32 only (--sides=bertlua for the other precisions)"):format(run.precision))
end
local vocab = opt.vocab or (opt.shared_data .. "/vocab/bert-base-uncased-vocab.txt")

local function say(...) print(...); io.stdout:flush() end
local function must(what, argv, log)
  say(what .. ": " .. shell.command(argv))
  local ok, code = shell.run(argv, log and { stdout = log, stderr = "stdout" } or nil)
  if not ok then
    fail(("%s failed (exit code %s)%s"):format(what, tostring(code), log and "; see " .. log or ""))
  end
end
local function recipe(name) return root .. "/recipes/" .. name .. ".lua" end

-- 1. data: the Wikipedia sample and the books, held-out documents, instances for both phases
local D = opt.data or out .. "/data"
local function prepare()
  if fs.exists(D .. "/p2/creation.json") then return end
  if opt.data then fail("--data=" .. opt.data .. ": no prepared data there (p2/creation.json: an OUTPUT/data)") end
  local wiki = {}
  for _, f in ipairs(fs.list_dir(opt.shared_data .. "/wikipedia", "%.bz2$") or {}) do
    wiki[#wiki + 1] = opt.shared_data .. "/wikipedia/" .. f
  end
  table.sort(wiki)
  if #wiki == 0 or not fs.is_dir(opt.shared_data .. "/books") then
    fail(("--shared-data=%s: needs wikipedia/*.bz2 (dumps) and books/*.txt"):format(opt.shared_data))
  end
  fs.check_input(vocab, "--vocab")
  for _, d in ipairs { "wiki", "books", "shards", "p1", "p2" } do fs.remove_tree(D .. "/" .. d) end
  fs.mkdir_p(D)
  must("wikipedia", { exe, recipe("prepare_wikipedia"), "--input=" .. table.concat(wiki, ","), "--output=" .. D
    .. "/wiki", "--quiet" }, D .. "/prepare.log")
  must("books", { exe, recipe("prepare_bookcorpus"), "--input=" .. opt.shared_data .. "/books",
    "--output=" .. D .. "/books" }, D .. "/books.log")
  must("shards", { exe, recipe("shard"), "--input=" .. D .. "/wiki," .. D .. "/books", "--output=" .. D .. "/shards",
    "--num-shards=" .. opt.num_shards, "--test-fraction=" .. opt.test_fraction }, D .. "/shard.log")
  for p = 1, 2 do
    must("instances " .. p, { exe, recipe("create_pretraining_data"), "--input=" .. D .. "/shards",
      "--vocab=" .. vocab, "--output=" .. D .. "/p" .. p, "--max-seq-length=" .. run["seq" .. p],
      "--max-predictions=" .. run["pred" .. p], "--dupe-factor=" .. opt["dupe" .. p] }, D .. "/p" .. p .. ".log")
  end
end

local function seed_dir(s) return ("%s/seed%d"):format(out, s) end
local function done(path) return fs.exists(path) end

-- the snapshots of a run: { phase, step, data (the phase whose held-out shards score it), dir }
-- Phase 1 is scored on S=128 instances from step 0 (the initial weights) to its end; phase 2 on S=512 instances
-- from step 0 (phase 1's model) to its end.
local function snapshots(s, side)
  local sd = seed_dir(s)
  local r = {}
  local function add(phase, step, dir, kind) r[#r + 1] = { phase = phase, step = step, dir = dir, kind = kind } end
  for p = 1, 2 do
    local steps, every = run["steps" .. p], opt["eval_every" .. p]
    add(p, 0, p == 1 and sd .. "/init" or ("%s/%s/phase1"):format(sd, side), "end")
    local function mid(k)
      return side == "bertlua" and ("%s/bertlua/checkpoints/phase%d/ckpt-%08d"):format(sd, p, k)
        or ("%s/reference/phase%d/step_%06d"):format(sd, p, k)
    end
    for k = every, steps - 1, every do add(p, k, mid(k), "mid") end
    local final = ("%s/%s/phase%d"):format(sd, side, p)
    if not fs.exists(final .. "/model.safetensors") then
      -- a phase not finished (a run in progress or stopped): its newest snapshot too
      local dir = mid(0):match("^(.*)/[^/]*$")
      local newest = 0
      for _, name in ipairs(fs.is_dir(dir) and fs.list_dir(dir, nil, "dirs") or {}) do
        local k = tonumber(name:match("^ckpt%-(%d+)$") or name:match("^step_(%d+)$"))
        if k and k > newest and k % every ~= 0 and fs.exists(dir .. "/" .. name .. "/model.safetensors") then
          newest = k
        end
      end
      if newest > 0 then add(p, newest, mid(newest), "mid") end
    end
    add(p, steps, final, "end")
  end
  return r
end

-- the initial weights of seed s's runs (both sides)
local function make_init(s)
  local sd = seed_dir(s)
  if done(sd .. "/init/model.safetensors") then return end
  fs.mkdir_p(sd)
  local c = bert.config.is_preset(run.model) and bert.config.preset(run.model) or bert.config.load(run.model)
  local seed = opt.init_seed > 0 and opt.init_seed or s
  pretrained.save_pretrained(bert.BertForPreTraining(c, { seed = seed }), sd .. "/init", { vocab = vocab })
end

-- the micro-batches of seed s's run as pretrain.lua makes and dumps them (its loader arguments: micro-batch j of a
-- step from virtual rank j-1 of the accumulation steps), without training
local function dump_batches(s)
  local sd = seed_dir(s)
  if fs.is_dir(sd .. "/batches/phase2") then return end
  local st = require "bertlua.io.safetensors"
  for p = 1, 2 do
    local accum = run["batch" .. p] / run.micro_batch
    if accum % 1 ~= 0 or accum > 16 then fail(("phase %d: batch %d is not 1 to 16 micro-batches of %d"):format(p,
      run["batch" .. p], run.micro_batch)) end
    local dir = fs.mkdir_p(("%s/batches.tmp/phase%d"):format(sd, p))
    local loaders = {}
    for a = 1, accum do
      loaders[a] = data.Loader{ dir = D .. "/p" .. p, split = "train", batch_size = run.micro_batch, rank = a - 1,
        world_size = accum, seed = s, max_seq_length = run["seq" .. p], max_predictions = run["pred" .. p],
        vocab = vocab, bin_lengths = false }
    end
    for step = 1, run["steps" .. p] do
      for a = 1, accum do st.save(("%s/%06d_%03d.safetensors"):format(dir, step, a), loaders[a]:next()) end
    end
    for _, l in ipairs(loaders) do l:close() end
  end
  fs.write_atomic(sd .. "/batches.tmp/complete", "written by --batches-only\n")
  shell.run({ "mv", sd .. "/batches.tmp", sd .. "/batches" })
end

-- 2. bertlua's run of seed s: pretrain.lua with the config, from the saved initial weights, snapshots every
-- eval_everyP steps (its checkpoints), the batches dumped for the reference
local function train_bertlua(s)
  local sd = seed_dir(s)
  -- batches written earlier without training (--batches-only) stay where they are (a reference run may be
  -- replaying them); the run dumps its own beside them (batches.check), and they are compared
  local check = sd .. "/batches.check"
  if not done(sd .. "/bertlua/phase2/model.safetensors") then
    if not opt.train then return end
    make_init(s)
    local every = math.min(opt.eval_every1, opt.eval_every2)
    local keep = math.ceil(math.max(run.steps1, run.steps2) / every) + 1
    -- a run that stopped resumes from its newest checkpoint (the dumped batches of the steps after it are written
    -- again, identical)
    must("bertlua seed " .. s, { exe, recipe("pretrain"), "--config=" .. opt.pretrain_config,
      "--model=" .. sd .. "/init/config.json", "--init=" .. sd .. "/init", "--vocab=" .. vocab,
      "--data-phase1=" .. D .. "/p1", "--data-phase2=" .. D .. "/p2", "--output=" .. sd .. "/bertlua",
      "--steps1=" .. run.steps1, "--steps2=" .. run.steps2, "--batch1=" .. run.batch1, "--batch2=" .. run.batch2,
      ("--lr1=%.17g"):format(run.lr1), ("--lr2=%.17g"):format(run.lr2), "--optimizer=" .. (run.optimizer or "lamb"),
      "--precision=" .. (run.precision or "fp32"), "--seed=" .. s, "--threads=" .. opt.threads,
      "--checkpoint-interval=" .. every, "--keep-checkpoints=" .. keep, "--eval-batches=1", "--device=cpu",
      "--dump-batches=" .. (fs.exists(sd .. "/batches/complete") and check or sd .. "/batches"), "--resume",
      "--log-every=10", "--max-steps=" .. opt.max_steps }, sd .. "/bertlua.log")
    if not done(sd .. "/bertlua/phase2/model.safetensors") then return end  -- stopped by --max-steps
  end
  if fs.is_dir(check) then
    for p = 1, 2 do
      for _, name in ipairs(fs.list_dir(("%s/phase%d"):format(check, p))) do
        local rel = ("phase%d/%s"):format(p, name)
        if fs.read(check .. "/" .. rel) ~= fs.read(sd .. "/batches/" .. rel) then
          fail(("seed %d: batch %s written by --batches-only differs from pretrain.lua's (its own are in %s)")
            :format(s, rel, check))
        end
      end
    end
    fs.remove_tree(check)
  end
  -- what the evaluation reads stays: the snapshots' weights (not the optimizer state, nor checkpoints between)
  local keep_dir = {}
  for _, snap in ipairs(snapshots(s, "bertlua")) do keep_dir[snap.dir] = true end
  for p = 1, 2 do
    local ck = ("%s/bertlua/checkpoints/phase%d"):format(sd, p)
    for _, name in ipairs(fs.is_dir(ck) and fs.list_dir(ck, nil, "all") or {}) do
      if keep_dir[ck .. "/" .. name] then fs.remove_tree(ck .. "/" .. name .. "/state.safetensors")
      else fs.remove_tree(ck .. "/" .. name) end
    end
  end
end

-- 3. the reference's run of seed s: bertlua's initial weights and batches, its own dropout stream (seeded by s)
local function train_reference(s)
  local sd = seed_dir(s)
  if done(sd .. "/reference/phase2/model.safetensors") or not opt.train then return end
  if not done(sd .. "/bertlua/phase2/model.safetensors") and not fs.exists(sd .. "/batches/complete") then
    fail(("the reference's seed %d replays bertlua's batches of seed %d: run --sides=bertlua (or --batches-only) "
      .. "--seeds=%d first"):format(s, s, s))
  end
  -- a run that stopped resumes from its newest checkpoint; anything else left there is started afresh
  if not fs.exists(sd .. "/reference/resume.pt") then fs.remove_tree(sd .. "/reference") end
  local every = math.min(opt.eval_every1, opt.eval_every2)
  local argv = { opt.python, here .. "/peers/nvidia_pretrain_reference.py", "--init=" .. sd .. "/init",
    "--batches=" .. sd .. "/batches", "--output=" .. sd .. "/reference", "--seed=" .. s,
    "--threads=" .. opt.threads, "--save-every=" .. every, "--checkpoint-every=" .. every, "--resume",
    "--max-steps=" .. opt.max_steps,
    "--max-grad-norm=" .. (run.max_grad_norm or 1), "--weight-decay=" .. (run.weight_decay or 0.01),
    "--power=" .. (run.power or 0.5) }
  for p = 1, 2 do
    for _, k in ipairs { "steps", "lr", "warmup" } do argv[#argv + 1] = ("--%s%d=%.17g"):format(k, p, run[k .. p]) end
  end
  say("reference seed " .. s .. ": " .. shell.command(argv))
  local ok, code = shell.run(argv, { stdout = sd .. "/reference.log", stderr = "stdout", append = true })
  if code == 77 then
    say("pretrain_curves: " .. opt.python .. " cannot import torch/transformers: the reference is skipped")
    os.exit(77)
  end
  if not ok then
    fail(("reference seed %d failed (exit code %s); see %s/reference.log"):format(s, tostring(code), sd))
  end
  if done(sd .. "/reference/phase2/model.safetensors") then fs.remove_tree(sd .. "/reference/resume.pt") end
end

local function read_jsonl(path)
  local r = {}
  if not fs.exists(path) then return r end
  for line in io.lines(path) do
    if line:match("%S") then r[#r + 1] = cjson.decode(line) end
  end
  return r
end
local function key(e) return ("%s|%s|%d|%d"):format(e.evaluator, e.side, e.phase, e.step) end

-- bertlua's evaluator: one model per run, each snapshot's weights loaded into it; the first N held-out
-- instances of the phase's test shards, in file order
local function eval_bertlua(s, side)
  local path = seed_dir(s) .. "/eval_bertlua.jsonl"
  local have = {}
  for _, e in ipairs(read_jsonl(path)) do have[key(e)] = true end
  local model
  local f
  for _, snap in ipairs(snapshots(s, side)) do
    local e = { evaluator = "bertlua", side = side, seed = s, phase = snap.phase, step = snap.step }
    if not have[key(e)] and fs.exists(snap.dir .. "/model.safetensors") then
      if not model then
        model = pretrained.from_pretrained(seed_dir(s) .. "/init", { head = "pretraining", strict = true })
      end
      require("bertlua.io.import").load_into(model, snap.dir .. "/model.safetensors",
        { config = seed_dir(s) .. "/init/config.json" })
      local n = opt["eval_instances" .. snap.phase]
      local loader = data.Loader{ dir = D .. "/p" .. snap.phase, split = "test", batch_size = opt.eval_batch,
        seed = 0, shuffle = false, max_seq_length = run["seq" .. snap.phase],
        max_predictions = run["pred" .. snap.phase], vocab = vocab }
      if loader.steps_per_epoch and loader.steps_per_epoch * opt.eval_batch < n then
        fail(("--eval-instances%d=%d: the held-out shards hold %d batches of %d"):format(snap.phase, n,
          loader.steps_per_epoch, opt.eval_batch))
      end
      local m = pe.metrics(pe.sums(model, loader, { batches = math.ceil(n / opt.eval_batch) }))
      loader:close()
      for k, v in pairs(m) do e[k] = v end
      f = f or assert(io.open(path, "a"))
      f:write(cjson.encode(e), "\n")
      f:flush()
      say(("  bertlua evaluator, %s seed %d phase %d step %d: MLM acc %.4f loss %.4f, NSP acc %.4f"):format(side, s,
        snap.phase, snap.step, e.mlm_acc, e.mlm_loss, e.nsp_acc))
    end
  end
  if f then f:close() end
end

-- the reference's evaluator on the same snapshots (the phase ends, or all): one Python process per phase
local function eval_reference(s, side)
  local path = seed_dir(s) .. "/eval_reference.jsonl"
  local have = {}
  for _, e in ipairs(read_jsonl(path)) do have[key(e)] = true end
  for p = 1, 2 do
    local todo, dirs, last = {}, {}, nil
    local snaps = snapshots(s, side)
    for _, snap in ipairs(snaps) do
      if snap.phase == p and fs.exists(snap.dir .. "/model.safetensors") then last = snap end
    end
    for _, snap in ipairs(snaps) do
      local e = { evaluator = "reference", side = side, seed = s, phase = snap.phase, step = snap.step }
      -- the newest snapshot of a phase not finished (a run stopped or in progress) counts as its end
      if snap.phase == p and not have[key(e)] and (opt.cross_eval == "all" or snap.kind == "end" or snap == last)
        and fs.exists(snap.dir .. "/model.safetensors") then
        todo[#todo + 1], dirs[#dirs + 1] = e, snap.dir
      end
    end
    if #todo > 0 then
      local tmp = path .. ".part"
      local n = math.ceil(opt["eval_instances" .. p] / opt.eval_batch) * opt.eval_batch
      local argv = { opt.python, here .. "/peers/pretrain_eval_reference.py", "--data=" .. D .. "/p" .. p,
        "--instances=" .. n, "--batch=" .. opt.eval_batch, "--threads=" .. opt.threads,
        "--config=" .. seed_dir(s) .. "/init/config.json", "--output=" .. tmp, dirs }
      local ok, code = shell.run(argv, { stdout = seed_dir(s) .. "/eval_reference.log", stderr = "stdout" })
      if code == 77 then say("  the reference's evaluator is skipped: no torch/transformers"); return end
      if not ok then
        fail(("the reference's evaluator failed (exit code %s); see %s/eval_reference.log"):format(tostring(code),
          seed_dir(s)))
      end
      local got = read_jsonl(tmp)
      fs.remove_tree(tmp)
      local f = assert(io.open(path, "a"))
      for i, e in ipairs(todo) do
        local r = got[i]
        if not r then fail("the reference's evaluator wrote " .. #got .. " results for " .. #todo .. " models") end
        for _, k in ipairs { "mlm_loss", "mlm_acc", "mlm_count", "nsp_loss", "nsp_acc", "nsp_count" } do e[k] = r[k] end
        f:write(cjson.encode(e), "\n")
        say(("  reference evaluator, %s seed %d phase %d step %d: MLM acc %.4f loss %.4f, NSP acc %.4f"):format(side,
          s, e.phase, e.step, e.mlm_acc, e.mlm_loss, e.nsp_acc))
      end
      f:close()
    end
  end
end

local METRICS = { "mlm_acc", "mlm_loss", "nsp_acc" }

-- this run's bertlua phase ends against --baseline's (its summary.json): per phase and metric both sides' seeds,
-- means, the baseline's spread and how many of this run's seeds lie within it; into summary.baseline
local function baseline_against(summary, every, by)
  local path = opt.baseline .. "/summary.json"
  if not fs.exists(path) then
    fail("--baseline=" .. opt.baseline .. ": no summary.json there (a pretrain_curves OUTPUT)")
  end
  local ok, b = pcall(cjson.decode, fs.read_text(path, "pretrain_curves"))
  if not ok or type(b) ~= "table" or type(b.phases) ~= "table" or type(b.config) ~= "table" then
    fail(path .. ": not a pretrain_curves summary")
  end
  for _, k in ipairs { "model", "steps1", "steps2", "batch1", "batch2", "seq1", "seq2" } do
    if b.config[k] ~= run[k] then
      fail(("--baseline=%s: its %s is %s, this run's %s (not the same run)"):format(opt.baseline, k,
        tostring(b.config[k]), tostring(run[k])))
    end
  end
  local label = ("%s %s"):format(b.config.precision or "fp32", b.config.optimizer or "lamb")
  local mine_label = ("%s %s"):format(run.precision or "fp32", run.optimizer or "lamb")
  local md = { "", ("Against the baseline %s (%s, bertlua's seeds; phase ends, bertlua's evaluator):"):format(
    opt.baseline, label), "",
    ("| phase | metric | %s (per seed) | mean ± sd | baseline %s (per seed) | mean ± sd | within baseline |")
      :format(mine_label, label), "| --- | --- | --- | --- | --- | --- | --- |" }
  summary.baseline = { dir = opt.baseline, config = b.config, phases = {} }
  for p = 1, 2 do
    summary.baseline.phases[p] = {}
    for _, k in ipairs(METRICS) do
      local mine, theirs, lo, hi = {}, {}, math.huge, -math.huge
      for _, s in ipairs(every) do
        local a = by[("bertlua|bertlua|%d|%d|%d"):format(p, run["steps" .. p], s)]
        if a then mine[#mine + 1] = { seed = s, v = a[k] } end
      end
      for _, e in ipairs(((b.phases[p] or {})[k] or {}).bertlua or {}) do
        theirs[#theirs + 1] = e
        lo, hi = math.min(lo, e.v), math.max(hi, e.v)
      end
      local n = 0
      for _, m in ipairs(mine) do if m.v >= lo and m.v <= hi then n = n + 1 end end
      local function vals(t)
        local r = {}
        for _, m in ipairs(t) do r[#r + 1] = m.v end
        return r
      end
      local function fmt(t)
        local r = {}
        for _, m in ipairs(t) do r[#r + 1] = ("%d: %.4f"):format(m.seed, m.v) end
        return #r > 0 and table.concat(r, ", ") or "-"
      end
      local function ms(t)
        if #t == 0 then return "-" end
        local st = require("bertlua.util.list").stats(vals(t))
        return ("%.4f ± %.4f"):format(st.mean, st.sd or 0)
      end
      local within = #theirs >= 2 and #mine > 0 and ("%d of %d"):format(n, #mine) or "n/a"
      summary.baseline.phases[p][k] = { mine = mine, baseline = theirs, within = within }
      md[#md + 1] = ("| %d | %s | %s | %s | %s | %s | %s |"):format(p, k, fmt(mine), ms(mine), fmt(theirs), ms(theirs),
        within)
    end
  end
  return md
end

-- the dynamic loss scale's history (fp16) from each seed's run log: per phase its first, lowest, highest and last
-- value, how often it changed and the steps skipped for overflow; nil when no run logged a changing scale
local function scale_histories(every)
  local json, md, any = {}, { "", "Loss scale (fp16's dynamic scale, from each run's log.jsonl; logged every 10 "
    .. "steps):", "", "| seed | phase | first | lowest | highest | last | changes | skipped steps |",
    "| --- | --- | --- | --- | --- | --- | --- | --- |" }, false
  for _, s in ipairs(every) do
    local by_step = {}
    for _, e in ipairs(read_jsonl(seed_dir(s) .. "/bertlua/log.jsonl")) do
      if e.step and e.phase and e.loss_scale then by_step[e.phase * 1e7 + e.step] = e end  -- a resumed run's last
    end
    local keys = {}
    for k in pairs(by_step) do keys[#keys + 1] = k end
    table.sort(keys)
    local ph = {}
    for _, k in ipairs(keys) do
      local e = by_step[k]
      local h = ph[e.phase]
      if not h then
        h = { first = e.loss_scale, lowest = e.loss_scale, highest = e.loss_scale, changes = 0, skipped = 0,
          history = {} }
        ph[e.phase] = h
      end
      if h.last and e.loss_scale ~= h.last then h.changes = h.changes + 1 end
      if not h.last or e.loss_scale ~= h.last then h.history[#h.history + 1] = { e.step, e.loss_scale } end
      h.lowest, h.highest, h.last = math.min(h.lowest, e.loss_scale), math.max(h.highest, e.loss_scale), e.loss_scale
      h.skipped = h.skipped + (e.skipped or 0)
    end
    for p = 1, 2 do
      local h = ph[p]
      if h and (h.changes > 0 or h.skipped > 0 or h.first ~= 1) then any = true end
      if h then
        md[#md + 1] = ("| %d | %d | %g | %g | %g | %g | %d | %d |"):format(s, p, h.first, h.lowest, h.highest, h.last,
          h.changes, h.skipped)
      end
    end
    json[#json + 1] = { seed = s, phases = ph }
  end
  return any and { json = json, md = md } or nil
end

-- 4. the report: every score in curves.csv; per phase end and seed the numbers of both sides under bertlua's
-- evaluator, the reference's spread over its seeds and whether bertlua lies within it; the evaluators' largest
-- difference on the snapshots both scored
local function report()
  local rows, by, all = {}, {}, {}
  for _, s in ipairs(seeds) do all[s] = true end
  for _, s in ipairs(ref_seeds) do all[s] = true end
  local every = {}
  for s in pairs(all) do every[#every + 1] = s end
  table.sort(every)
  for _, s in ipairs(every) do
    for _, name in ipairs { "bertlua", "reference" } do
      for _, e in ipairs(read_jsonl(seed_dir(s) .. "/eval_" .. name .. ".jsonl")) do
        rows[#rows + 1] = e
        by[key(e) .. "|" .. e.seed] = e
      end
    end
  end
  table.sort(rows, function(a, b)
    if a.evaluator ~= b.evaluator then return a.evaluator < b.evaluator end
    if a.side ~= b.side then return a.side < b.side end
    if a.seed ~= b.seed then return a.seed < b.seed end
    if a.phase ~= b.phase then return a.phase < b.phase end
    return a.step < b.step
  end)
  local csv = { "evaluator,side,seed,phase,step,mlm_acc,mlm_loss,nsp_acc,nsp_loss,mlm_count,nsp_count" }
  for _, e in ipairs(rows) do
    csv[#csv + 1] = ("%s,%s,%d,%d,%d,%.6f,%.6f,%.6f,%.6f,%d,%d"):format(e.evaluator, e.side, e.seed, e.phase, e.step,
      e.mlm_acc, e.mlm_loss, e.nsp_acc, e.nsp_loss, e.mlm_count, e.nsp_count)
  end
  fs.write_atomic(out .. "/curves.csv", table.concat(csv, "\n") .. "\n")

  -- evaluator agreement
  local agree = { snapshots = 0 }
  for _, e in ipairs(rows) do
    if e.evaluator == "bertlua" then
      local r = by[("reference|%s|%d|%d|%d"):format(e.side, e.phase, e.step, e.seed)]
      if r then
        agree.snapshots = agree.snapshots + 1
        for _, k in ipairs { "mlm_acc", "mlm_loss", "nsp_acc", "nsp_loss" } do
          agree[k] = math.max(agree[k] or 0, math.abs(e[k] - r[k]))
        end
        if e.mlm_count ~= r.mlm_count or e.nsp_count ~= r.nsp_count then
          agree.count_mismatch = ("%s seed %d phase %d step %d: %d/%d vs %d/%d"):format(e.side, e.seed, e.phase,
            e.step, e.mlm_count, e.nsp_count, r.mlm_count, r.nsp_count)
        end
      end
    end
  end

  -- phase ends under bertlua's evaluator
  local summary = { config = run, seeds = seeds, ref_seeds = ref_seeds, evaluators_agree = agree, phases = {} }
  local md = { ("BERT-%s, %d+%d steps (batch %d/%d, S=%d/%d), held-out %d/%d instances; bertlua's evaluator; "
    .. "reference spread = min..max over its seeds"):format(run.model, run.steps1, run.steps2, run.batch1, run.batch2,
    run.seq1, run.seq2, opt.eval_instances1, opt.eval_instances2), "",
    "| phase | metric | bertlua (per seed) | reference (per seed) | reference spread | bertlua within |",
    "| --- | --- | --- | --- | --- | --- |" }
  for p = 1, 2 do
    local ph = {}
    for _, k in ipairs(METRICS) do
      local mine, ref, lo, hi = {}, {}, math.huge, -math.huge
      for _, s in ipairs(every) do
        local a = by[("bertlua|bertlua|%d|%d|%d"):format(p, run["steps" .. p], s)]
        local b = by[("bertlua|reference|%d|%d|%d"):format(p, run["steps" .. p], s)]
        if a then mine[#mine + 1] = { seed = s, v = a[k] } end
        if b then ref[#ref + 1] = { seed = s, v = b[k] }; lo, hi = math.min(lo, b[k]), math.max(hi, b[k]) end
      end
      local within
      if #ref >= 2 and #mine > 0 then
        local n = 0
        for _, m in ipairs(mine) do if m.v >= lo and m.v <= hi then n = n + 1 end end
        within = ("%d of %d"):format(n, #mine)
      else
        within = ("n/a (%d reference seed%s)"):format(#ref, #ref == 1 and "" or "s")
      end
      ph[k] = { bertlua = mine, reference = ref, reference_min = #ref > 0 and lo or nil,
        reference_max = #ref > 0 and hi or nil, within = within }
      local function fmt(t)
        local r = {}
        for _, m in ipairs(t) do r[#r + 1] = ("%d: %.4f"):format(m.seed, m.v) end
        return #r > 0 and table.concat(r, ", ") or "-"
      end
      md[#md + 1] = ("| %d | %s | %s | %s | %s | %s |"):format(p, k, fmt(mine), fmt(ref),
        #ref > 0 and ("%.4f..%.4f"):format(lo, hi) or "-", within)
    end
    summary.phases[p] = ph
  end
  -- the curves under bertlua's evaluator, and per seed run by both sides the largest difference between them over
  -- the steps both have (same initial weights and batches: only the dropout masks and the arithmetic differ)
  md[#md + 1] = ""
  md[#md + 1] = "Curves (bertlua's evaluator; per seed, seeds in order " .. table.concat(every, ",") .. "):"
  md[#md + 1] = ""
  md[#md + 1] = "| phase | step | bertlua MLM acc | reference MLM acc | bertlua MLM loss | reference MLM loss | "
    .. "bertlua NSP acc | reference NSP acc |"
  md[#md + 1] = "| --- | --- | --- | --- | --- | --- | --- | --- |"
  local steps_seen, matched = {}, {}
  for _, e in ipairs(rows) do
    if e.evaluator == "bertlua" then
      local k = e.phase * 1e6 + e.step
      if not steps_seen[k] then steps_seen[k] = true; steps_seen[#steps_seen + 1] = k end
    end
  end
  table.sort(steps_seen)
  for _, k in ipairs(steps_seen) do
    local p, st = math.floor(k / 1e6), k % 1e6
    local cells = {}
    for _, m in ipairs { "mlm_acc", "mlm_loss", "nsp_acc" } do
      for _, side in ipairs { "bertlua", "reference" } do
        local v = {}
        for _, sd in ipairs(every) do
          local e = by[("bertlua|%s|%d|%d|%d"):format(side, p, st, sd)]
          v[#v + 1] = e and ("%.4f"):format(e[m]) or "-"
        end
        cells[#cells + 1] = table.concat(v, " / ")
      end
    end
    md[#md + 1] = ("| %d | %d | %s |"):format(p, st, table.concat(cells, " | "))
    for _, sd in ipairs(every) do
      local a = by[("bertlua|bertlua|%d|%d|%d"):format(p, st, sd)]
      local b = by[("bertlua|reference|%d|%d|%d"):format(p, st, sd)]
      if a and b and not (p == 1 and st == 0) then
        local d = matched[sd] or { steps = 0 }
        d.steps = d.steps + 1
        for _, m in ipairs(METRICS) do
          if math.abs(a[m] - b[m]) >= math.abs(d[m] or 0) then d[m], d[m .. "_at"] = a[m] - b[m], k end
        end
        matched[sd] = d
      end
    end
  end
  summary.matched = {}
  for _, sd in ipairs(every) do
    local d = matched[sd]
    if d then
      summary.matched[#summary.matched + 1] = { seed = sd, snapshots = d.steps, mlm_acc = d.mlm_acc,
        mlm_loss = d.mlm_loss, nsp_acc = d.nsp_acc }
      md[#md + 1] = ""
      md[#md + 1] = ("Seed %d, bertlua - reference on the %d snapshots both have: largest MLM acc %+.4f (phase %d step "
        .. "%d), MLM loss %+.4f (phase %d step %d), NSP acc %+.4f (phase %d step %d)"):format(sd, d.steps, d.mlm_acc,
        math.floor(d.mlm_acc_at / 1e6), d.mlm_acc_at % 1e6, d.mlm_loss, math.floor(d.mlm_loss_at / 1e6),
        d.mlm_loss_at % 1e6, d.nsp_acc, math.floor(d.nsp_acc_at / 1e6), d.nsp_acc_at % 1e6)
    end
  end
  local base = opt.baseline and baseline_against(summary, every, by)
  if base then
    for _, line in ipairs(base) do md[#md + 1] = line end
  end
  local scales = scale_histories(every)
  if scales then
    summary.loss_scale = scales.json
    for _, line in ipairs(scales.md) do md[#md + 1] = line end
  end
  md[#md + 1] = ""
  if agree.snapshots > 0 then
    md[#md + 1] = ("Evaluators on the same %d snapshots: largest difference MLM acc %.2g, MLM loss %.2g, NSP acc %.2g, "
      .. "NSP loss %.2g%s"):format(agree.snapshots, agree.mlm_acc, agree.mlm_loss, agree.nsp_acc, agree.nsp_loss,
      agree.count_mismatch and " (counts differ: " .. agree.count_mismatch .. ")" or "")
  else
    md[#md + 1] = "Evaluators: no snapshot scored by both yet"
  end
  fs.write_atomic(out .. "/summary.json", cjson.encode(summary))
  fs.write_atomic(out .. "/summary.md", table.concat(md, "\n") .. "\n")
  say(table.concat(md, "\n"))
end

if opt.batches_only then
  prepare()
  for _, s in ipairs(seeds) do make_init(s); dump_batches(s) end
  os.exit(0)
end
if not opt.report_only then
  prepare()
  for _, s in ipairs(seeds) do
    if sides.bertlua then train_bertlua(s); eval_bertlua(s, "bertlua"); eval_reference(s, "bertlua") end
  end
  for _, s in ipairs(ref_seeds) do
    if sides.reference then train_reference(s); eval_bertlua(s, "reference"); eval_reference(s, "reference") end
  end
end
report()
