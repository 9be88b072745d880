-- Step-level agreement of recipes/pretrain.lua with the PyTorch reference of NVIDIA's run_pretraining.py
-- (tools/peers/nvidia_pretrain_reference.py): both start from the same initial weights, fp32, dropout off, and
-- train on the same micro-batches (bertlua dumps them, the reference replays them); phase 2 starts from each
-- side's own phase-1 weights with a fresh optimizer. Prints the largest relative loss and gradient-norm
-- differences per phase and the largest weight difference after each phase's last step, writes them to
-- OUTPUT/summary.json, and fails when they exceed --loss-tol / --weight-tol.
--
--   bertlua tools/pretrain_vs_reference.lua --model=mini --vocab=V --data-phase1=D1 --data-phase2=D2 --output=OUT
--
-- (needs /usr/bin/python3 with torch and transformers; exit code 77 when they are missing)
--
-- The BERT-mini check of issue 30 (50 + 20 steps of 2 x 8 sequences, S=128/20 then S=512/80, NVIDIA's learning
-- rates and warmup; ~5 min for bertlua and ~20 for the reference with one thread each on a loaded 2-core VM):
--   B=build/bertlua V=../shared/data/vocab/bert-base-uncased-vocab.txt
--   $B recipes/prepare_bookcorpus.lua --input=../shared/data/books --output=d/prep
--   $B recipes/shard.lua --input=d/prep --output=d/shards --num-shards=2 --test-fraction=0.05
--   $B recipes/create_pretraining_data.lua --input=d/shards --vocab=$V --output=d/p1 --dupe-factor=1
--   $B recipes/create_pretraining_data.lua --input=d/shards --vocab=$V --output=d/p2 --dupe-factor=1 \
--     --max-seq-length=512 --max-predictions=80
--   $B tools/pretrain_vs_reference.lua --model=mini --vocab=$V --data-phase1=d/p1 --data-phase2=d/p2 --output=d/cmp
local bert = require "bertlua.bert"
local pretrained = require "bertlua.pretrained"
local options = require "bertlua.util.options"
local shell = require "bertlua.util.shell"
local fs = require "bertlua.util.fs"
local st = require "bertlua.io.safetensors"
local cjson = require "cjson"

local SPEC = {
  { "model", "mini", "preset or a config.json" },
  { "vocab", nil, "vocab.txt the shards were made with" },
  { "data_phase1", nil, "phase-1 shard directory" },
  { "data_phase2", nil, "phase-2 shard directory (none: phase 1 only)" },
  { "output", "runs/pretrain_vs_reference", "init/, batches/, bertlua/, reference/ and summary.json" },
  { "seq1", 128, "phase 1 sequence length", int = true, min = 3 },
  { "pred1", 20, "phase 1 max predictions", int = true, min = 0 },
  { "seq2", 512, "phase 2 sequence length", int = true, min = 3 },
  { "pred2", 80, "phase 2 max predictions", int = true, min = 0 },
  { "batch1", 16, "phase 1 global batch", int = true, min = 1 },
  { "batch2", 16, "phase 2 global batch", int = true, min = 1 },
  { "micro_batch", 8, "sequences per micro-batch (batch / micro_batch accumulation steps)", int = true, min = 1 },
  { "steps1", 50, "phase 1 optimizer steps", int = true, min = 1 },
  { "steps2", 20, "phase 2 optimizer steps", int = true, min = 1 },
  { "lr1", 6e-3, "phase 1 peak learning rate", min = 0, above = true },
  { "lr2", 4e-3, "phase 2 peak learning rate", min = 0, above = true },
  { "warmup1", 0.2843, "phase 1 warmup proportion", min = 0, max = 1 },
  { "warmup2", 0.128, "phase 2 warmup proportion", min = 0, max = 1 },
  { "seed", 12439, "initialisation and data order", int = true, min = 0 },
  { "threads", 1, "CPU threads of each side" },
  { "python", "/usr/bin/python3", "the Python with torch and transformers" },
  { "reference_args", "", "more options for the reference, space-separated (e.g. --power=1, to see a difference "
    .. "reported)" },
  { "rerun", "both", "both | reference (keep OUTPUT's init/, batches/ and bertlua/ from an earlier run) | none "
    .. "(compare OUTPUT's two runs again)" },
  { "loss_tol", 1e-5, "largest relative loss / gradient-norm difference allowed", min = 0 },
  { "weight_tol", 1e-4, "largest absolute weight difference allowed after each phase", min = 0 },
}
local opt = options.parse(arg, SPEC, { name = "pretrain_vs_reference",
  usage = "usage: bertlua tools/pretrain_vs_reference.lua --vocab=V --data-phase1=DIR [--data-phase2=DIR] [options]" })
for _, k in ipairs { "vocab", "data_phase1" } do
  if not opt[k] then error(("pretrain_vs_reference: --%s is required"):format(k:gsub("_", "-")), 0) end
end
local here = (arg[0]:match("^(.*)/[^/]*$") or ".")
local out = fs.mkdir_p(opt.output)
local phases = opt.data_phase2 and 2 or 1

if opt.rerun ~= "both" and opt.rerun ~= "reference" and opt.rerun ~= "none" then
  error("pretrain_vs_reference: --rerun must be both, reference or none, got '" .. opt.rerun .. "'", 0)
end
if opt.rerun == "both" then
  -- the initial weights both sides start from (dropout off: written into the config the reference reads)
  local cfg = bert.config.is_preset(opt.model) and bert.config.preset(opt.model) or bert.config.load(opt.model)
  cfg.hidden_dropout_prob, cfg.attention_probs_dropout_prob = 0, 0
  pretrained.save_pretrained(bert.BertForPreTraining(cfg, { seed = opt.seed }), out .. "/init", { vocab = opt.vocab })
  fs.remove_tree(out .. "/batches")
  fs.remove_tree(out .. "/bertlua")
end

local function run(what, argv)
  print(what .. ": " .. shell.command(argv))
  io.stdout:flush()
  local ok, code = shell.run(argv, { stderr = "stdout" })
  if code == 77 then print("pretrain_vs_reference: skipped (" .. what .. " exited 77: torch/transformers missing)")
    os.exit(77) end
  if not ok then error(("pretrain_vs_reference: %s failed (exit code %s)"):format(what, tostring(code)), 0) end
end

local extra = {}
for w in opt.reference_args:gmatch("%S+") do extra[#extra + 1] = w end
local common = { "--steps1=" .. opt.steps1, "--lr1=" .. opt.lr1, "--warmup1=" .. opt.warmup1,
  "--threads=" .. opt.threads }
local p2 = phases == 2 and { "--steps2=" .. opt.steps2, "--lr2=" .. opt.lr2, "--warmup2=" .. opt.warmup2 } or {}
if opt.rerun == "both" then
  run("bertlua", { fs.host(), here .. "/../recipes/pretrain.lua", "--model=" .. out .. "/init/config.json",
    "--init=" .. out .. "/init", "--vocab=" .. opt.vocab, "--data-phase1=" .. opt.data_phase1,
    phases == 2 and "--data-phase2=" .. opt.data_phase2 or "--phase=1", "--output=" .. out .. "/bertlua",
    "--seq1=" .. opt.seq1, "--pred1=" .. opt.pred1, "--batch1=" .. opt.batch1, "--batch2=" .. opt.batch2,
    "--seq2=" .. opt.seq2, "--pred2=" .. opt.pred2, "--micro-batch=" .. opt.micro_batch, "--seed=" .. opt.seed,
    "--dropout=0", "--precision=fp32", "--checkpoint-interval=0", "--eval-batches=1", "--device=cpu",
    "--dump-batches=" .. out .. "/batches", common, p2 })
end
if opt.rerun ~= "none" then
  run("reference", { opt.python, here .. "/peers/nvidia_pretrain_reference.py", "--init=" .. out .. "/init",
    "--batches=" .. out .. "/batches", "--output=" .. out .. "/reference", "--dropout=0", common, p2, extra })
end

local function steps(path)
  local r = {}
  for line in io.lines(path) do
    local rec = cjson.decode(line)
    if rec.step and rec.loss and rec.phase then r[rec.phase .. ":" .. rec.step] = rec end
  end
  return r
end
local mine, ref = steps(out .. "/bertlua/log.jsonl"), steps(out .. "/reference/log.jsonl")
local function rel(a, b) return math.abs(a - b) / math.max(math.abs(b), 1e-30) end
local summary, bad = { model = opt.model, phases = {} }, {}
for p = 1, phases do
  local s = { steps = opt["steps" .. p], batch = opt["batch" .. p], micro_batch = opt.micro_batch,
    loss_rel = 0, grad_norm_rel = 0, weight_abs = 0 }
  for k = 1, s.steps do
    local a, b = mine[p .. ":" .. k], ref[p .. ":" .. k]
    if not (a and b) then error(("pretrain_vs_reference: phase %d step %d missing from a log"):format(p, k), 0) end
    s.loss_rel = math.max(s.loss_rel, rel(a.loss, b.loss))
    s.grad_norm_rel = math.max(s.grad_norm_rel, rel(a.grad_norm, b.grad_norm))
  end
  local wa = st.load(("%s/bertlua/phase%d/model.safetensors"):format(out, p))
  local wb = st.load(("%s/reference/phase%d/model.safetensors"):format(out, p))
  for name, t in pairs(wb) do
    if not wa[name] then error("pretrain_vs_reference: bertlua's model has no " .. name, 0) end
    local d = (wa[name] - t):abs():max()
    if d > s.weight_abs then s.weight_abs, s.worst_tensor = d, name end
  end
  s.final_loss = ref[p .. ":" .. s.steps].loss
  print(("phase %d, %d steps: max relative loss difference %.3g, gradient norm %.3g; max weight difference %.3g (%s)")
    :format(p, s.steps, s.loss_rel, s.grad_norm_rel, s.weight_abs, s.worst_tensor))
  if math.max(s.loss_rel, s.grad_norm_rel) > opt.loss_tol or s.weight_abs > opt.weight_tol then bad[#bad + 1] = p end
  summary.phases[p] = s
end
fs.write_atomic(out .. "/summary.json", cjson.encode(summary))
if #bad > 0 then
  error(("pretrain_vs_reference: phase %s outside the bounds (loss/gradient norm %g relative, weights %g)")
    :format(table.concat(bad, ","), opt.loss_tol, opt.weight_tol), 0)
end
print("pretrain_vs_reference: within the bounds")
