-- SQuAD v1.1 / v2.0 fine-tuning and prediction, as google-research/bert's
-- run_squad.py and NVIDIA's recipe do it: features with doc_stride windows,
-- AdamW with linear warmup and decay, n-best span search with the reference's
-- text recovery (or --span-search=exhaustive: every valid span), the official
-- metrics at the end.
--
--   bertlua recipes/squad.lua --model=DIR --train-file=train-v1.1.json --predict-file=dev-v1.1.json \
--       --output=runs/squad --do-train --do-predict
-- Under `mpirun -np N` (as run_squad.sh with num_gpus): --batch is the global
-- batch, split over the ranks (gradients averaged: the same as one rank with
-- accumulation N); prediction is sharded over the ranks and rank 0 writes the
-- predictions and the official metrics.
-- DIR is a model directory (config.json + model.safetensors + vocab.txt): a
-- bertlua pre-training output or a Hugging Face BERT. The QA head starts fresh
-- when the directory has none.
local bl = require "bertlua"
local options = require "bertlua.util.options"
local fs = require "bertlua.util.fs"
local logm = require "bertlua.util.log"
local pretrained = require "bertlua.pretrained"
local bert = require "bertlua.bert"
local squad = require "bertlua.tasks.squad"
local Tok = require "bertlua.data.tokenizer"
local trainer = require "bertlua.train.loop"
local batched = require "bertlua.batched"
local ft = require "bertlua.tasks.common"
local amp = require "bertlua.train.amp"
local cjson = require "cjson"
local device = require "bertlua.train.device"
local dist = require "bertlua.train.dist"
local fingerprint = require "bertlua.train.fingerprint"

local opt = options.parse(arg, {
  { "model", nil, "model directory to start from" },
  { "vocab", nil, "vocab.txt (default: the model directory's)" },
  { "do_lower_case", true, "uncased tokenization (false for cased models)" },
  { "train_file", nil, "SQuAD JSON to train on" },
  { "predict_file", nil, "SQuAD JSON to predict (and evaluate when it has answers)" },
  { "output", "runs/squad", "output directory: predictions and the fine-tuned model" },
  { "do_train", false, "fine-tune" }, { "do_predict", false, "predict --predict-file" },
  { "version_2_with_negative", false, "SQuAD 2.0 (unanswerable questions)" },
  { "max_seq_length", 384, "tokens per window", int = true, min = 3 },
  { "doc_stride", 128, "stride between windows", int = true, min = 1 },
  { "max_query_length", 64, "question tokens kept", int = true, min = 1 },
  { "lr", 3e-5, "peak learning rate", min = 0, above = true },
  { "epochs", 2, "training epochs", min = 0, above = true },
  { "batch", 32, "sequences per optimizer step", int = true, min = 1 },
  { "micro_batch", 0, "sequences per forward (0: = batch)", int = true, min = 0 },
  { "warmup", 0.1, "warmup proportion", min = 0, max = 1 },
  { "warmup_steps", -1, "warmup in optimizer steps instead of --warmup (-1: use the proportion)", int = true,
    min = -1 },
  { "loss_scale", "dynamic", "fp16 loss scale: dynamic, or a fixed number (e.g. 128)" },
  { "weight_decay", 0.01, "AdamW weight decay (not biases/LayerNorm)", min = 0 },
  { "max_grad_norm", 1.0, "clip the global gradient norm to this (0: off)", min = 0, int = false },
  { "predict_batch", 32, "sequences per forward when predicting", int = true, min = 1 },
  { "n_best", 20, "n-best spans per question", int = true, min = 1 },
  { "span_search", "nbest", "answer spans searched: nbest (the --n-best best starts x ends of each window, " ..
    "run_squad.py) or exhaustive (every valid start/end pair)", choices = { "nbest", "exhaustive" } },
  { "max_answer_length", 30, "longest answer in tokens", int = true, min = 1 },
  { "null_score_diff_threshold", 0.0, "v2: predict no answer when null score - best > this", int = false },
  { "max_steps", 0, "stop training after this many steps (0: all)", int = true, min = 0 },
  { "log_every", 1, "a training log line every N steps (on a GPU the one host wait of a step)", int = true, min = 1 },
  { "log_format", "jsonl", logm.FORMAT_HELP .. "; the training log is train_log.jsonl or dllogger.json" },
  { "seed", 42, "seed (initialisation of a new head, data order, dropout)", int = true, min = 0, max = 2 ^ 53 },
  { "precision", "fp32",
    "fp32 | tf32 | bf16 | fp16: training with f32 master weights (fp16 with dynamic loss scaling); on a GPU a " ..
      "bf16/f16 compute copy with half activations, on the CPU half weights and gradients emulated (f32 " ..
        "activations) and tf32 = fp32; prediction in the same precision" },
  { "threads", 0, "CPU threads (0: default)" },
  bert.CHECKPOINT_OPTION,
  trainer.SAVE_STEPS_OPTION, trainer.RESUME_OPTION,
  { "bucket_mb", 25, "data parallel: gradient all-reduce bucket size in MB", min = 0, above = true, int = false },
  { "allreduce_dtype", "fp32", dist.ALLREDUCE_HELP },
  device.OPTION,
}, { name = "squad",
  usage = "usage: [mpirun -np N] bertlua recipes/squad.lua --model=DIR [--train-file=F --do-train] " ..
    "[--predict-file=F --do-predict]" })
if opt.threads > 0 then bl.set_num_threads(opt.threads) end
logm.check_format(opt.log_format, "squad")
ft.line_buffered()
print(options.show(opt))
if not opt.model then error("squad: --model=DIR is required", 0) end
if not (opt.do_train or opt.do_predict) then error("squad: nothing to do: give --do-train and/or --do-predict", 0) end
if opt.do_train and not opt.train_file then error("squad: --do-train needs --train-file", 0) end
if opt.do_predict and not opt.predict_file then error("squad: --do-predict needs --predict-file", 0) end
amp.check_precision("squad", opt.precision)
dist.check_allreduce_dtype("squad", opt.allreduce_dtype, opt.precision)
local scaler_opts = amp.loss_scale_option(opt.loss_scale, "squad")
local dev, dev_line = device.setup(opt, "squad")
print(("%s (%s)"):format(dev_line, amp.path(dev, opt.precision)))
-- every input is checked before any work, so a typo does not cost a training run
local vocab = ft.model_dir("squad", opt.model, opt.vocab)
if opt.do_train then ft.input_file("squad", opt.train_file, "--train-file") end
if opt.do_predict then ft.input_file("squad", opt.predict_file, "--predict-file") end
if opt.micro_batch > 0 and opt.batch % opt.micro_batch ~= 0 then
  error(("squad: --batch=%d is not a multiple of --micro-batch=%d"):format(opt.batch, opt.micro_batch), 0)
end
-- every rank runs one job: options, model, vocabulary and data compared before any work (bertlua.train.fingerprint)
dist.agree("squad", fingerprint.entries{ options = opt, files = { { "--model", opt.model }, { "--vocab", vocab },
  { "--train-file", opt.train_file }, { "--predict-file", opt.predict_file } } })

-- the output directory belongs to this run while it lasts (a second run into it is refused)
if dist.is_main() then fs.lock_dir(opt.output, "squad") end
local tok = Tok.load(vocab, { lower = opt.do_lower_case })
local model = amp.model_to(pretrained.from_pretrained(opt.model, { head = "qa", seed = opt.seed }), dev, opt.precision)
ft.seq_length("squad", model.cfg, opt.max_seq_length)
model.bert.encoder.checkpoint = opt.checkpoint_activations
local feat_opts = { max_seq_length = opt.max_seq_length, doc_stride = opt.doc_stride,
  max_query_length = opt.max_query_length }

if opt.do_train then
  local examples, rep = squad.read_examples(opt.train_file, { is_training = true,
    version_2_with_negative = opt.version_2_with_negative })
  print(("train: %d questions, %d examples, %d skipped"):format(rep.questions, rep.examples, rep.skipped))
  if rep.version == "1.1" and squad.dataset_version(squad.load_json(opt.train_file)) == "2.0" then
    io.stderr:write("squad: warning: " .. opt.train_file .. " is SQuAD 2.0 but --version-2-with-negative is off: " ..
      "unanswerable questions are skipped\n")
  end
  if #examples == 0 then
    error(("squad: no usable training questions in %s (%d questions, %d entries skipped, reasons above; training " ..
      "takes exactly one answer per answerable question, as run_squad.py)"):format(opt.train_file, rep.questions,
        rep.skipped), 0)
  end
  feat_opts.is_training = true
  local feats = squad.convert_examples_to_features(examples, tok, feat_opts)
  trainer.fit{ model = model, n = #feats, batch = opt.batch, micro_batch = opt.micro_batch, epochs = opt.epochs,
    lr = opt.lr, warmup = opt.warmup, warmup_steps = opt.warmup_steps >= 0 and opt.warmup_steps or nil,
    scaler = scaler_opts, weight_decay = opt.weight_decay, max_grad_norm = opt.max_grad_norm,
    max_steps = opt.max_steps, log_every = opt.log_every, seed = opt.seed, device = dev,
    precision = opt.precision, log_path = logm.path_for(opt.output, "train_log", opt.log_format),
    log_format = opt.log_format, config = { options = opt },
    bucket_mb = opt.bucket_mb, allreduce_dtype = opt.allreduce_dtype,
    checkpoints = { dir = opt.output .. "/checkpoints", every = opt.save_steps, resume = opt.resume },
    make_batch = function(idx) return (squad.feature_batch(feats, idx, opt.max_seq_length, true)) end }
  if dist.is_main() then
    pretrained.save_pretrained(model, opt.output .. "/model", { vocab = vocab })
    print("train: model saved to " .. opt.output .. "/model")
  end
end

if opt.do_predict then
  -- the saved model keeps the f32 master weights; prediction runs in --precision (on a GPU: the compute copy)
  if amp.round_weights(model, opt.precision) and dev < 0 then print("predict: weights rounded to " .. opt.precision) end
  local examples, rep = squad.read_examples(opt.predict_file, { is_training = false,
    version_2_with_negative = opt.version_2_with_negative })
  print(("predict: %d questions, %d examples, %d skipped"):format(rep.questions, rep.examples, rep.skipped))
  if #examples == 0 then error(("squad: no usable questions in %s (reasons above)"):format(opt.predict_file), 0) end
  local dataset = squad.load_json(opt.predict_file)
  local data_version = squad.dataset_version(dataset)
  if data_version == "2.0" and not opt.version_2_with_negative then
    io.stderr:write("squad: warning: " .. opt.predict_file .. " is SQuAD 2.0 but --version-2-with-negative is off: " ..
      "every question gets an answer and no null_odds.json is written\n")
  end
  feat_opts.is_training = false
  local feats = squad.convert_examples_to_features(examples, tok, feat_opts)
  local function run(n, consume)
    return batched.predict{ model = model, n = n, batch = opt.predict_batch, name = "squad", device = dev,
      precision = opt.precision,
      describe = function(i) return "question " .. tostring(examples[feats[i].example_index + 1].qas_id) end,
      make_batch = function(idx) return (squad.feature_batch(feats, idx, opt.max_seq_length)) end,
      consume = consume }
  end
  if not dist.is_main() then  -- runs its share of the batches; rank 0 gathers them, writes and evaluates
    run(#feats)
    return
  end
  local _, _, _, stats, empty = squad.predict(examples, feats, run, { tokenizer = tok, output_dir = opt.output,
    n_best_size = opt.n_best, max_answer_length = opt.max_answer_length, span_search = opt.span_search,
    version_2_with_negative = opt.version_2_with_negative, null_score_diff_threshold = opt.null_score_diff_threshold })
  print("predict: " .. batched.format_latency(stats))
  print(("predict: wrote %s/predictions.json (%s span search; %d of %d questions without a valid span)")
    :format(opt.output, opt.span_search, empty, #examples))
  if squad.has_answers(dataset) then
    local preds = cjson.decode(io.open(opt.output .. "/predictions.json"):read("*a"))
    local eopts = {}
    if opt.version_2_with_negative then
      -- as evaluate-v2.0.py --na-prob-file null_odds.json: best_f1_thresh is the
      -- --null-score-diff-threshold to use for this model
      local text = squad.read_file(opt.output .. "/null_odds.json")
      eopts.na_probs = cjson.decode(text)
      eopts.na_prob_keys, eopts.na_prob_ints = require("bertlua.util.json").object_keys(text, "null_odds.json")
    end
    -- the official scripts refuse a malformed file; the predictions are written either way
    local ok, result = pcall(squad.evaluate, dataset, preds, eopts)
    if not ok then
      io.stderr:write("squad: no evaluation: ", tostring(result), "\n")
      return
    end
    print("evaluation: " .. squad.format_eval(result, data_version))
    result.predict_seq_per_s, result.predict_p50_ms, result.predict_p99_ms = stats.seq_per_s, stats.p50_ms, stats.p99_ms
    result.skipped_questions = rep.skipped
    result.span_search, result.empty_answers = opt.span_search, empty
    ft.write_json(opt.output .. "/eval_results.json", result)
  end
end
