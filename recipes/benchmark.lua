-- Training / inference throughput of a BERT model, optionally side by side
-- with the same model in PyTorch (tools/peers/bert_reference.py).
--
--   bertlua recipes/benchmark.lua --model=mini --seq=128 --batch=32 --steps=10 [--compare=torch]
--   bertlua recipes/benchmark.lua --model=base --seq=384 --batch=8 --infer [--compare=onnxruntime]
--   bertlua recipes/benchmark.lua --model=large --device=cuda --precision=bf16 --batch=64 --compare=torch
--
-- A training step is what pre-training does: forward of BertForPreTraining
-- (MLM decoder on the masked positions only, NSP), backward into the flat
-- gradient buffer, and an update over the flat parameter buffer.
-- Both sides use the same shapes, --threads threads, dropout --dropout, and
-- a batch with the last seq/8 tokens of every sequence padded. --infer
-- --lengths=squad|mrpc instead gives the rows real lengths (SQuAD v1.1 dev
-- features at --seq, stride 128; MRPC dev sentence pairs), a seeded draw of
-- --batch of them from --data. On the CPU with --pack, bertlua skips the
-- padded positions (bertlua.bert.infer); the peers compute them.
-- OpenMP's idle workers spin briefly, then sleep (the host sets
-- OMP_WAIT_POLICY=passive with GOMP_SPINCOUNT=10000, ~0.1 ms, see
-- src/host/main.c): inference at batch 1 runs many short parallel regions and
-- is about 2x slower on a busy machine when they sleep at once.
-- OMP_WAIT_POLICY=active is as fast alone but collapses when the cores are
-- shared (BENCHMARKS.md). The policy in effect is printed.
-- On a GPU (--device=cuda[:N]) the step is recipes/pretrain.lua's own
-- (bertlua.train.step): --accum micro-batches of --batch sequences,
-- losses and accuracy summed on the device, NVLAMB on the device with the
-- skip/update decision there, so a timed block of --steps steps waits for the
-- device once, at its end. --precision picks fp32, tf32 (f32 GEMMs on TF32
-- tensor cores) or bf16 (bf16 compute copy of the weights, refreshed after
-- each update, and bf16 activations; f32 master weights and gradients);
-- --cuda-graph runs each step after the first as one CUDA graph, as
-- pretrain's --cuda-graph does. --compare=torch runs
-- tools/peers/bench_bert_torch.py on the same GPU (bf16 = torch.autocast,
-- fused SDPA attention; its update is still plain SGD, a few percent of a step).
-- On the CPU the update is a plain SGD loop over the flat buffer, as in the
-- CPU peer (tools/peers/bert_reference.py bench).
-- --model-time=h100 (h200, a100, or a list such as h100,a100) also prints the step-time MODEL
-- (lua/bertlua/stepmodel.lua): a slow / expected / fast range of the step time
-- at that GPU's figures and named assumptions, summed over the launches one
-- training step really makes. On the emulated device the step is
-- recorded without running its large work (bl_cuda_dry_run), so BERT-large fits;
-- on a real GPU it is printed next to the measured step time. Throughput is also given as model
-- FLOP/s and MFU: training FLOPs per step = 6 N B S (N = encoder matmul
-- weights 12 L H^2 + pooler H^2, all S positions, padding included)
-- + 12 L H S^2 B (attention scores and context, forward + backward)
-- + 6 M (H^2 + H V) (MLM transform and decoder at the M = B * masked positions
-- only); inference is a third of the encoder part. MFU divides by the
-- device's dense peak for the precision (--peak_tflops overrides). --compare=onnxruntime (--infer, CPU)
-- times the encoder exported to ONNX and fused by onnxruntime's BERT optimizer
-- (tools/peers/bench_bert_onnxruntime.py); both sides also print the median latency of one step (p50).
-- Single calls of a 2-core machine spread by +-5 %: --rounds=N times N blocks of --steps, and with a CPU peer
-- alternates ours and the peer's block by block (one peer process, so its setup is paid once) and prints each
-- round's ratio and their median.
-- Today's CPU peers (bash scripts/peers.sh makes .venv-peers/, found by default; else --python or BL_PEER_PYTHON):
-- --compare=torch is PyTorch 2 eager there (sdpa attention; Debian's PyTorch 1.13 without the venv),
-- --compare=torch-compile the encoder through torch.compile (compile time printed apart, not in the rate), both
-- for the training step and --infer, --precision=bf16 under torch.autocast; --compare=openvino (--infer) OpenVINO's
-- CPU plugin with INFERENCE_PRECISION_HINT f32 or bf16 as --precision says, int8 its own post-training quantization
-- (NNCF); --compare=onnxruntime the venv's ONNX Runtime. Every peer gets the same rows (--lengths), threads and
-- rounds; each prints what it runs (version, precision). A precision the peer lacks is refused; --peer-precision
-- gives the peer another (bertlua's cpu training step is fp32 only: --peer-precision=bf16 times it against torch's
-- bf16 autocast).
local bl = require "bertlua"
local bert = require "bertlua.bert"
local optim = require "bertlua.train.optim"
local amp = require "bertlua.train.amp"
local tstep = require "bertlua.train.step"
local config = require "bertlua.bert.config"
local options = require "bertlua.util.options"
local log = require "bertlua.util.log"
local shell = require "bertlua.util.shell"
local fs = require "bertlua.util.fs"
-- the peers (PyTorch, ...) are in tools/peers, beside recipes/ in the source tree and installed
local PEERS = fs.recipe("../tools/peers/")
-- today's peers (bash scripts/peers.sh) when made, else Debian's python (PyTorch 1.13, the pinned onnxruntime)
local VENV_PY, OLD_PY = fs.recipe("../.venv-peers/bin/python"), os.getenv("BL_PYTHON") or "/usr/bin/python3"
-- the CPU peers: script (a path or a list of words), extra words; infer: inference only; today: the venv's only;
-- the precisions it has
local CPU_PEERS = {
  torch = { { PEERS .. "bert_reference.py", "bench" }, {}, precisions = "fp32 bf16" },
  ["torch-compile"] = { { PEERS .. "bert_reference.py", "bench" }, { "--compile" }, today = true,
    precisions = "fp32 bf16" },
  onnxruntime = { PEERS .. "bench_bert_onnxruntime.py", {}, infer = true, precisions = "fp32 int8" },
  openvino = { PEERS .. "bench_bert_openvino.py", {}, infer = true, today = true, precisions = "fp32 bf16 int8" },
}

local opt = options.parse(arg, {
  { "model", "mini", "preset (tiny, mini, small, medium, base, large) or a model directory" },
  { "seq", 128, "sequence length" },
  { "batch", 32, "sequences per step" },
  { "steps", 10, "timed steps" },
  { "warmup", 3, "untimed steps first (--cuda-graph: the step is captured from the 2nd or 3rd on)" },
  { "device", "cpu", "cpu, cuda or cuda:N" },
  { "precision", "fp32", "fp32 | tf32 | bf16 | int8 (tf32: a GPU; bf16 on the cpu and int8: --infer, packed)" },
  { "peak_tflops", 0, "peak TFLOP/s for MFU (0 = known GPUs by name)", int = false },
  { "threads", 0, "CPU threads for us and for PyTorch (0 = bertlua's default)" },
  { "masked", 20, "masked positions per sequence (MLM decoder rows)" },
  { "dropout", 0.1, "hidden and attention dropout" },
  { "hidden_act", "", "FFN activation (gelu, gelu_new, ...; empty = the model's config)" },
  { "infer", false, "time inference (forward of the encoder only) instead of training" },
  { "pack", true, "--infer on the cpu: linear weights packed once for our own GEMM, bias/GELU in its epilogue, "
    .. "padded positions skipped (bertlua.bert.infer)" },
  { "unpad", true, "the cpu: run the real tokens only (false: the padded forward/step): inference with --pack, "
    .. "training always (exact: the padded positions' gradients are zero)" },
  bert.CHECKPOINT_OPTION,
  { "lengths", "pad8", "real tokens per row: pad8 (last seq/8 padded) or full (no padding); with --infer also "
    .. "squad or mrpc (dev set lengths)" },
  { "data", "../shared/data", "--lengths=squad|mrpc: the data directory (squad/dev-v1.1.json, glue/MRPC/dev.tsv, "
    .. "vocab/bert-base-uncased-vocab.txt)" },
  { "lr", 1e-4, "learning rate (LAMB on a GPU, SGD on the CPU)" },
  { "accum", 1, "GPU training: micro-batches of --batch per optimizer step (gradient accumulation)", int = true,
    min = 1 },
  { "cuda_graph", false, "GPU training: run each step after the first as one CUDA graph (see pretrain)" },
  { "compare", "", "'torch' (eager) or 'torch-compile': the same benchmark in PyTorch, with the ratio; 'onnxruntime' "
    .. "(--infer): ONNX Runtime's fused BERT graph; 'openvino' (--infer): OpenVINO (tools/peers/)" },
  { "peer_precision", "", "the cpu peer's precision when it differs from ours (default: --precision), e.g. our fp32 "
    .. "training step against torch's bf16 autocast" },
  { "rounds", 1, "timed blocks of --steps steps; with a CPU --compare, ours and the peer's alternate block by block "
    .. "(one peer process) and the median ratio is printed", int = true, min = 1 },
  { "model_time", "", "also print the step-time model of one training step at these figures (h100, h200, a100 "
    .. "or a list: h100,a100)" },
  { "model_items", false, "with --model-time: list every non-GEMM launch class with its bytes (the breakdown)" },
  { "class_times", false, "with --model-time: time every launch of the recorded step with CUDA events and print the "
    .. "measured time per class beside the model's (not with --cuda-graph: captured launches are not timed)" },
  { "python", os.getenv("BL_PEER_PYTHON") or (fs.exists(VENV_PY) and VENV_PY) or OLD_PY, "python of the peers: "
    .. "$BL_PEER_PYTHON, else .venv-peers/bin/python (bash scripts/peers.sh) when made, else $BL_PYTHON or "
    .. "/usr/bin/python3" },
}, { usage = "bertlua recipes/benchmark.lua [options]" })
print("benchmark options:\n" .. options.show(opt))
print(bl.cpu_line())
local peer_def = CPU_PEERS[opt.compare]
if opt.compare ~= "" and not peer_def then
  error("benchmark: --compare must be torch, torch-compile, onnxruntime, openvino or empty, got " .. opt.compare, 0)
end
local dev = bl.device_of(opt.device, "benchmark")
local on_gpu = dev >= 0
if peer_def and peer_def.infer and not (opt.infer and not on_gpu) then
  error("benchmark: --compare=" .. opt.compare .. " times inference on the cpu: add --infer (and --device=cpu)", 0)
end
if peer_def and opt.compare ~= "torch" and on_gpu then
  error("benchmark: --compare=" .. opt.compare .. " is a cpu peer; on a GPU: --compare=torch", 0)
end
if peer_def and peer_def.today and opt.python == OLD_PY then
  error("benchmark: --compare=" .. opt.compare .. " needs today's peers: make them with 'bash scripts/peers.sh' "
    .. "(.venv-peers/) or pass --python=PATH", 0)
end
if opt.rounds > 1 and opt.compare ~= "" and on_gpu then
  error("benchmark: --rounds with --compare alternates with a cpu peer; on a GPU compare one block (--rounds=1)", 0)
end
if opt.precision ~= "fp32" and opt.precision ~= "tf32" and opt.precision ~= "bf16" and opt.precision ~= "int8" then
  error("benchmark: --precision must be fp32, tf32, bf16 or int8, got " .. tostring(opt.precision), 0)
end
local peer_precision = opt.peer_precision ~= "" and opt.peer_precision or opt.precision
if opt.peer_precision ~= "" and not (peer_def and not on_gpu) then
  error("benchmark: --peer-precision is for a cpu --compare", 0)
end
if peer_def and not on_gpu and not (" " .. peer_def.precisions .. " "):find(" " .. peer_precision .. " ", 1, true) then
  error(("benchmark: --compare=%s has no %s on the cpu (it has %s)%s"):format(opt.compare, peer_precision,
    peer_def.precisions:gsub(" ", ", "), opt.peer_precision == "" and "; --peer-precision picks another" or ""), 0)
end
if opt.peer_precision ~= "" then print(("peer precision: %s (bertlua: %s)"):format(peer_precision, opt.precision)) end
if on_gpu then
  if not bl.cuda_compiled() then error("benchmark: --device=" .. opt.device
    .. " but this bertlua was built without CUDA", 0) end
  if dev >= bl.cuda_device_count() then
    error(("benchmark: --device=%s but %d CUDA device(s) are visible"):format(opt.device, bl.cuda_device_count()), 0)
  end
  bl.cuda_set_tf32(opt.precision == "tf32")
elseif opt.precision == "tf32" or (opt.precision ~= "fp32" and not (opt.infer and opt.pack)) then
  error("benchmark: --precision=" .. opt.precision .. " needs --device=cuda" .. (opt.precision == "tf32" and ""
    or " (on the cpu: with --infer and --pack=true; a cpu training step is fp32, --peer-precision=bf16 times it "
    .. "against a peer's bf16)"), 0)
end
if opt.precision == "int8" and on_gpu then error("benchmark: --precision=int8 is cpu inference only", 0) end
local stepmodel, profiles
if opt.class_times and opt.model_time == "" then error("benchmark: --class-times needs --model-time", 0) end
if opt.model_time ~= "" then
  stepmodel = require "bertlua.stepmodel"
  profiles = {}
  for name in opt.model_time:gmatch("[^,]+") do
    profiles[#profiles + 1] = stepmodel.profiles[name]
    if not profiles[#profiles] then
      error("benchmark: --model-time takes h100, h200, a100 or a list (h100,a100), got " .. opt.model_time, 0)
    end
  end
  if not on_gpu or opt.infer then error("benchmark: --model-time needs --device=cuda and a training step", 0) end
  if opt.class_times and opt.cuda_graph then
    error("benchmark: --class-times times launches one by one: leave out --cuda-graph", 0)
  end
end
if opt.threads > 0 then bl.set_num_threads(opt.threads) end
local threads = bl.num_threads()

local cfg
if config.is_preset(opt.model) then
  cfg = config.preset(opt.model, { hidden_dropout_prob = opt.dropout, attention_probs_dropout_prob = opt.dropout })
else
  cfg = config.load(opt.model .. "/config.json")
  cfg.hidden_dropout_prob, cfg.attention_probs_dropout_prob = opt.dropout, opt.dropout
end
if opt.hidden_act ~= "" then
  if not config.activations[opt.hidden_act] then error("benchmark: unknown --hidden-act " .. opt.hidden_act, 0) end
  cfg.hidden_act = opt.hidden_act
end
local B, S, V = opt.batch, opt.seq, cfg.vocab_size
if S > cfg.max_position_embeddings then cfg.max_position_embeddings = S end

local model = bert.BertForPreTraining(cfg, { seed = 1 })
local devname, dry = "cpu", false
if on_gpu then
  devname = bl.cuda_device_name(dev) or devname
  -- the emulator could neither hold nor compute a large model's step: record it without running the large work
  dry = stepmodel ~= nil and devname:find("emulated", 1, true) ~= nil
  if dry then bl.cuda_dry_run(dev, true) end
  model:to{ device = dev, dtype = opt.precision == "bf16" and "bf16" or "f32" }
end
if opt.infer then model:eval() else model:train() end
if opt.infer and opt.pack and not on_gpu then
  -- bf16 on the cpu: weights rounded (as predict does), then packed for the bf16 GEMM where the CPU has one
  if opt.precision == "bf16" then amp.round_weights(model, "bf16") end
  local _, n, what = require("bertlua.bert.infer").pack(model.bert, opt.precision, { unpad = opt.unpad })
  print(("inference GEMM: bertlua packed, %d weights packed once, bias/GELU in its epilogue "
    .. "(--pack=false: the cpu line's GEMM); %s; padded positions %s"):format(n, what, opt.unpad and "skipped"
    or "computed (--unpad=false)"))
end
if not opt.infer and not on_gpu then
  model.bert.unpad_training = opt.unpad
  print("training path: padded positions " .. (opt.unpad and "skipped (the real tokens packed, attention per row)"
    or "computed (--unpad=false)"))
end
if not opt.infer then
  model.bert.encoder.checkpoint = opt.checkpoint_activations
  print("activations: " .. (model.bert.encoder.checkpoint and "each layer's recomputed in the backward "
    .. "(--checkpoint-activations)" or "every layer's kept for the backward"))
end
if opt.infer and not on_gpu then
  local set = os.getenv("BERTLUA_THREAD_ENV_SET") or ""
  print(("openmp wait policy: %s%s, GOMP_SPINCOUNT %s"):format(os.getenv("OMP_WAIT_POLICY") or "libgomp's default",
    set:find("OMP_WAIT_POLICY", 1, true) and " (the host's default)" or "",
    (os.getenv("GOMP_SPINCOUNT") or "unset (libgomp's default)")
      .. (set:find("GOMP_SPINCOUNT", 1, true) and " (the host's default)" or "")))
end
print(("model: L%d H%d A%d, %.1fM parameters, batch %d x %d, %d threads, %s, %s"):format(cfg.num_hidden_layers,
  cfg.hidden_size, cfg.num_attention_heads, model:num_parameters() / 1e6, B, S, threads, devname, opt.precision))

-- the real tokens of each row: S - S/8, or lengths of a dev set's features drawn with a fixed seed
local function real_lengths()
  local all = {}
  if opt.lengths == "pad8" or opt.lengths == "full" then
    local n = {}
    for b = 1, B do n[b] = opt.lengths == "full" and S or S - math.floor(S / 8) end
    return n
  elseif not opt.infer then
    error("benchmark: --lengths=" .. opt.lengths .. " is for --infer", 0)
  end
  local tok = require("bertlua.data.tokenizer").load(opt.data .. "/vocab/bert-base-uncased-vocab.txt",
    { lower = true })
  if opt.lengths == "squad" then
    local squad = require "bertlua.tasks.squad"
    local ex = squad.read_examples(opt.data .. "/squad/dev-v1.1.json", { is_training = false, quiet = true })
    ex = { unpack(ex, 1, math.min(#ex, 400)) }
    local feats = squad.convert_examples_to_features(ex, tok, { max_seq_length = S, doc_stride = 128,
      max_query_length = 64, is_training = false })
    for i, f in ipairs(feats) do all[i] = #f.tokens end
  elseif opt.lengths == "mrpc" then
    local ex = require("bertlua.tasks.glue").read_examples("mrpc", opt.data .. "/glue/MRPC/dev.tsv", { quiet = true })
    for i, e in ipairs(ex) do all[i] = #bert.pair(tok:tokenize(e.text_a), tok:tokenize(e.text_b), S) end
  else
    error("benchmark: --lengths must be pad8, full, squad or mrpc, got " .. tostring(opt.lengths), 0)
  end
  local u = bl.rand({ B }, { seed = 7, offset = 0 }):totable()
  local n = {}
  for b = 1, B do n[b] = all[1 + math.floor(u[b] * #all)] end
  return n
end
local len = real_lengths()
local function sum(t) local x = 0 for _, v in ipairs(t) do x = x + v end return x end
print(("batch: %d real tokens of %d (%.1f%%), --lengths=%s, rows %s"):format(sum(len), B * S,
  100 * sum(len) / (B * S), opt.lengths, B <= 8 and table.concat(len, ",") or ("min %d max %d"):format(
    math.min(unpack(len)), math.max(unpack(len)))))
-- a fixed batch: random tokens, the real ones first in each row, `masked` MLM positions per sequence
local u = bl.rand({ B, S + 2 * opt.masked }, { seed = 5, offset = 0 }):totable()
local ids, mask, pos, lab = {}, {}, {}, {}
for b = 1, B do
  ids[b], mask[b], pos[b], lab[b] = {}, {}, {}, {}
  local row = (b - 1) * (S + 2 * opt.masked)
  for s = 1, S do
    local real = s <= len[b]
    ids[b][s] = real and math.floor(u[row + s] * V) or 0
    mask[b][s] = real and 1 or 0
  end
  for j = 1, opt.masked do
    pos[b][j] = 1 + math.floor(u[row + S + j] * (len[b] - 2))
    lab[b][j] = math.floor(u[row + S + opt.masked + j] * V)
  end
end
local batch = {
  input_ids = bl.from(ids, { dtype = "i32" }), attention_mask = bl.from(mask),
  token_type_ids = bl.zeros({ B, S }, { dtype = "i32" }),
  masked_lm_positions = bl.from(pos, { dtype = "i32" }), masked_lm_labels = bl.from(lab, { dtype = "i32" }),
  next_sentence_labels = bl.from((function() local t = {} for b = 1, B do t[b] = b % 2 end return t end)(),
    { dtype = "i32" }),
}

local update, pstep
if on_gpu and not opt.infer then
  -- the batch on the GPU once, as pretrain's device loader hands it out (the MLM positions and labels and the NSP
  -- labels on the host: the head selects and counts them there)
  for _, k in ipairs({ "input_ids", "attention_mask", "token_type_ids" }) do batch[k] = batch[k]:to(opt.device) end
  -- pretrain's step and optimizer (its defaults: weight decay 0.01, gradient pre-normalisation 1.0). A bf16 model
  -- keeps its f32 master weights in flat_params and a bf16 compute copy (model:to above): no loss scaling, so the
  -- step's amp object is the fp32 one (the device-side skip of non-finite steps stays).
  local lamb = optim.LAMB{ model = model, lr = opt.lr, weight_decay = 0.01, max_grad_norm = 1.0 }
  pstep = tstep.Step{ model = model, optimizer = lamb, amp = amp.MixedPrecision{ model = model }, dev = dev,
    loss = tstep.pretraining_loss(), accum = opt.accum }
  if opt.cuda_graph then pstep:use_graph() end
elseif on_gpu then
  for _, k in ipairs({ "input_ids", "attention_mask", "token_type_ids" }) do batch[k] = batch[k]:to(opt.device) end
else
  local n = model.flat_params:numel()
  local p, g = model.flat_params:ptr(), model.flat_grads:ptr()
  update = function(lr)
    for i = 0, n - 1 do p[i] = p[i] - lr * g[i] end
  end
end
local steps_run = 0
local function step(mark)
  if opt.infer then
    model.bert:forward(batch)
    return
  end
  steps_run = steps_run + 1
  if pstep then
    pstep.mark = mark   -- the model's split into micro-batch and optimizer-step parts
    pstep:run(steps_run, function() return batch end, opt.lr)
    pstep.mark = nil
    return
  end
  model:zero_grad()
  model:forward(batch)
  model:backward()
  update(opt.lr)
end
local function sync()
  if pstep then pstep:read()   -- the block's one wait, which also raises a deferred index error
  elseif on_gpu then bl.cuda_synchronize(dev) end
end

if opt.cuda_graph and (not pstep or opt.warmup < 3) then
  error("benchmark: --cuda-graph times a GPU training step and needs --warmup=3 or more (warm-up, then capture)", 0)
end
if opt.accum > 1 and not pstep then error("benchmark: --accum is for a GPU training step", 0) end
for _ = 1, opt.warmup do step() end
if opt.cuda_graph and not pstep.graph_ready then
  error(("benchmark: the step still allocated device memory in warm-up step %d, so it is not captured yet: "
    .. "raise --warmup"):format(opt.warmup), 0)
end
sync()
local model_t
if stepmodel then
  local list, syncs, marks = stepmodel.record(dev, step, opt.class_times)
  for i, profile in ipairs(profiles) do
    local text, t = stepmodel.report(list, syncs, profile, B * opt.accum,
      ("BERT %s training step (pretrain's, LAMB), batch %d x %d%s, %d masked, %s%s"):format(opt.model, B, S,
        opt.accum > 1 and (" x %d accumulation"):format(opt.accum) or "", opt.masked, opt.precision,
        opt.cuda_graph and ", CUDA graph" or ""), opt.model_items)
    print(text)
    if i == 1 then model_t = t end   -- the first profile is the one the measurement is held against
    -- the model at other accumulations, NVIDIA's recipe's among them, from the same recorded launches
    local accums, r = { { 1 }, { 4 } }, stepmodel.recipe[S]
    if r then accums[3] = { math.max(1, math.floor(r.seqs / B + 0.5)), ("%s: %d sequences per GPU and optimizer "
      .. "step"):format(r.what, r.seqs) } end
    local split, res = stepmodel.accum_report(list, marks, profile, B, accums)
    print(split)
    local pub = r and profile.published and profile.published[S]
    if pub and res[3] then
      print(("  published for %s (%s): %s; the model at that accumulation: %.0f / %.0f / %.0f seq/s"):format(
        profile.name, r.what, pub, res[3].range[1], res[3].range[2], res[3].range[3]))
    end
  end
  if dry then
    print("(recorded on the emulated device without running the large work: no timing, results are garbage)")
    return
  end
end
-- A GPU training step is timed as a block of --steps steps with one wait at its end (the step never waits for
-- the device, as in pre-training); otherwise every step is timed alone, and its median is printed too.
local per_step = not pstep
local seqs = B * (pstep and opt.accum or 1)
local function timed_block()
  local t0, times = log.clock(), {}
  for i = 1, opt.steps do
    local ts = log.clock()
    step()
    if per_step then
      sync()
      times[i] = log.clock() - ts
    end
  end
  if not per_step then sync() end
  local dt = log.clock() - t0
  table.sort(times)
  local r = { rate = seqs * opt.steps / dt, dt = dt, p50 = per_step and times[math.floor(#times / 2) + 1] or nil }
  print(("bertlua: %.2f seq/s (%.1f ms/step%s, %s, %s, %s, %d threads)"):format(r.rate, dt / opt.steps * 1000,
    r.p50 and (", p50 %.1f ms"):format(r.p50 * 1000) or ", one block",
    opt.infer and "inference" or "training", opt.device, opt.precision, threads))
  return r
end
local function median(t)
  local s = { unpack(t) }
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) / 2] or (s[n / 2] + s[n / 2 + 1]) / 2
end

-- the CPU peers' command line (the peer prints "<peer>: N seq/s (..., p50 M ms, ...)" per block)
local cpu_peer
if peer_def and not on_gpu then
  cpu_peer = { opt.compare, peer_def[1], { peer_def[2], "--precision", peer_precision } }
end
-- the peer's words for bertlua.util.shell (script: a path or a list of words, extra: a list of words)
local function peer_command(script, extra, rounds, vars)
  local num = function(v) return ("%.17g"):format(v) end
  return { bl.peer_env(vars), opt.python, script, "--layers", num(cfg.num_hidden_layers), "--hidden",
    num(cfg.hidden_size), "--heads", num(cfg.num_attention_heads), "--seq", num(S), "--batch", num(B), "--steps",
    num(opt.steps), "--threads", num(threads), "--vocab", num(V), "--masked", num(opt.masked), "--warmup",
    num(opt.warmup), "--dropout", ("%g"):format(opt.dropout), extra, opt.infer and "--infer" or {},
    rounds > 1 and { "--rounds", num(rounds) } or {}, opt.lengths ~= "pad8" and { "--lengths",
    table.concat(len, ",") } or {} }
end
-- ours / theirs by throughput, and by p50 latency where both sides timed steps alone (else nil)
local function ratios(o, t) return o.rate / t.rate, o.p50 and t.p50 and t.p50 / (o.p50 * 1000) end
local function peer_result(peer, line)
  local rate = tonumber(line:match("^" .. peer:gsub("%-", "%%-") .. ": ([%d%.]+) seq/s"))
  return rate and { rate = rate, p50 = tonumber(line:match("p50 ([%d%.]+) ms")) }
end

-- --rounds: ours and the peer's blocks alternate; the peer is one process that times a block each time it reads
-- "go" on its stdin and prints through a FIFO we read line by line (each side waits while the other runs)
local rounds
if opt.rounds > 1 and cpu_peer then
  local peer = cpu_peer[1]
  local fifo = os.tmpname()
  os.remove(fifo)
  if not shell.run { "mkfifo", fifo } then error("benchmark: --rounds: cannot make a FIFO at " .. fifo, 0) end
  -- cat drains "go" lines a peer that ended early no longer reads (a write into a closed pipe would kill us)
  local to_peer = shell.popen("{ " .. shell.command(peer_command(cpu_peer[2], cpu_peer[3], opt.rounds,
    { "PYTHONUNBUFFERED=1" }), { stdout = fifo, stderr = "stdout" }) .. "; cat > /dev/null; }", "w")
  local from_peer = io.open(fifo, "r")
  os.remove(fifo)   -- both ends are open: the name is no longer needed
  -- echoes the peer's lines up to one it wants (nil at its end of output: it failed or skipped)
  local function read_until(want)
    for line in from_peer:lines() do
      print(line)
      local got = want(line)
      if got then return got end
    end
  end
  rounds = { ours = {}, theirs = {} }
  if read_until(function(l) return l == "ready" end) then
    step()   -- ours again after the peer's setup and warm-up, so both start their blocks warm
    for r = 1, opt.rounds do
      rounds.ours[r] = timed_block()
      to_peer:write("go\n")
      to_peer:flush()
      rounds.theirs[r] = read_until(function(l) return peer_result(peer, l) end)
      if not rounds.theirs[r] then break end
      local by_rate, by_p50 = ratios(rounds.ours[r], rounds.theirs[r])
      print(("round %d: ratio bertlua/%s %.2fx%s"):format(r, peer, by_rate, by_p50 and (", by p50 %.2fx")
        :format(by_p50) or ""))
    end
  end
  to_peer:close()
  from_peer:close()
  if #rounds.theirs == 0 then
    print(peer .. " comparison failed or skipped (see output above)")
    if #rounds.ours == 0 then rounds.ours[1] = timed_block() end
  end
else
  rounds = { ours = {} }
  for r = 1, opt.rounds do rounds.ours[r] = timed_block() end
end
-- median, min and max of a list
local function spread(t) return median(t), math.min(unpack(t)), math.max(unpack(t)) end
local rates = {}
for i, r in ipairs(rounds.ours) do rates[i] = r.rate end
local ours = median(rates)
local dt = seqs * opt.steps / ours
if #rates > 1 then
  print(("bertlua over %d blocks: median %.2f seq/s (min %.2f, max %.2f)"):format(#rates, spread(rates)))
end
if rounds.theirs and #rounds.theirs > 0 then
  local n, rate, p50 = #rounds.theirs, {}, {}
  for r = 1, n do rate[r], p50[r] = ratios(rounds.ours[r], rounds.theirs[r]) end
  local m, lo, hi = spread(rate)
  print(("ratio bertlua/%s: %.2fx, the median of %d alternating rounds (min %.2fx, max %.2fx)%s"):format(cpu_peer[1],
    m, n, lo, hi, #p50 == n and ("; by p50 latency %.2fx (min %.2fx, max %.2fx)"):format(spread(p50)) or ""))
end
if model_t then
  local r = model_t.range
  print(("measured vs model: %.0f seq/s measured; model %.0f / %.0f / %.0f seq/s (slow / expected / fast, %s); "
    .. "measured / expected %.2f, %s"):format(ours, seqs / r[1], seqs / r[2], seqs / r[3], profiles[1].name,
    ours * r[2] / seqs, ours < seqs / r[1] and "BELOW the slow scenario" or ours > seqs / r[3]
    and "ABOVE the fast scenario" or "inside the range"))
end

-- model FLOPs (see the header) and MFU against the device's dense peak
local L, H = cfg.num_hidden_layers, cfg.hidden_size
local enc = 2 * (12 * L * H * H * S + H * H) + 4 * L * H * S * S   -- forward, per sequence
local flops = opt.infer and enc * B or (3 * enc * B + 6 * B * opt.masked * (H * H + H * V)) * (pstep and opt.accum or 1)
local PEAK = {  -- dense TFLOP/s: { bf16, tf32, fp32 }
  { "H200", 989.4, 494.7, 66.9 }, { "H100 PCIe", 756, 378, 51.2 }, { "H100", 989.4, 494.7, 66.9 },
  { "A100", 312, 156, 19.5 }, { "L40S", 362, 183, 91.6 }, { "A10", 125, 62.5, 31.2 },
}
local peak = opt.peak_tflops > 0 and opt.peak_tflops or nil
if not peak and on_gpu then
  for _, e in ipairs(PEAK) do
    if devname:find(e[1], 1, true) then
      peak = opt.precision == "bf16" and e[2] or opt.precision == "tf32" and e[3] or e[4]
      break
    end
  end
end
local achieved = flops * opt.steps / dt / 1e12
print(("model FLOPs: %.3g per step, %.1f TFLOP/s%s"):format(flops, achieved,
  peak and ("; MFU %.1f%% of %.0f TFLOP/s (%s)"):format(100 * achieved / peak, peak, opt.precision) or ""))

-- one peer call after our block(s) (--rounds=1): its output echoed, the throughput ratio printed (and, on a GPU,
-- report(theirs))
local function compare_with(peer, cmd, report)
  local out = shell.read(cmd, { stderr = "stdout" })
  io.write(out)
  local theirs
  for line in out:gmatch("[^\n]+") do theirs = theirs or peer_result(peer, line) end
  if theirs then
    local by_rate, by_p50 = ratios(rounds.ours[1], theirs)
    print(("ratio bertlua/%s: %.2fx%s"):format(peer, by_rate, by_p50 and ("; by p50 latency %.2fx"):format(by_p50)
      or ""))
    if report then report(theirs.rate) end
  else
    print(peer .. " comparison failed or skipped (see output above)")
  end
end

if opt.compare == "torch" and on_gpu then
  compare_with("torch", peer_command(PEERS .. "bench_bert_torch.py", { "--lr", ("%g"):format(opt.lr), "--device",
    opt.device == "cuda" and "cuda:0" or opt.device, "--precision", opt.precision }, 1),
    function(theirs)
      print(("torch model FLOP/s: %.1f TFLOP/s%s"):format(flops * theirs / B / 1e12,
        peak and (", MFU %.1f%%"):format(100 * flops * theirs / B / 1e12 / peak) or ""))
    end)
elseif cpu_peer and opt.rounds == 1 then
  compare_with(cpu_peer[1], peer_command(cpu_peer[2], cpu_peer[3], 1))
end
