-- GLUE fine-tuning, evaluation and test-set prediction, as run_classifier.py /
-- NVIDIA's recipe do it: [CLS] a [SEP] b [SEP] truncated longest-first,
-- classification (cross-entropy) or STS-B regression (MSE) on the pooled [CLS],
-- AdamW with linear warmup and decay, the task's metrics.
--
--   bertlua recipes/glue.lua --task=mrpc --data-dir=glue/MRPC --model=DIR --output=runs/mrpc --do-train --do-eval
-- Tasks: cola sst2 mrpc stsb qqp mnli (matched + mismatched) qnli rte wnli.
-- Predictions are written in the GLUE submission format (index<TAB>prediction).
local bl = require "bertlua"
local options = require "bertlua.util.options"
local fs = require "bertlua.util.fs"
local logm = require "bertlua.util.log"
local bert = require "bertlua.bert"
local pretrained = require "bertlua.pretrained"
local glue = require "bertlua.tasks.glue"
local metrics = require "bertlua.tasks.metrics"
local Tok = require "bertlua.data.tokenizer"
local trainer = require "bertlua.train.loop"
local batched = require "bertlua.batched"
local ft = require "bertlua.tasks.common"
local amp = require "bertlua.train.amp"
local device = require "bertlua.train.device"
local dist = require "bertlua.train.dist"
local fingerprint = require "bertlua.train.fingerprint"
local cjson = require "cjson"

local opt = options.parse(arg, {
  { "task", nil, "cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli" },
  { "data_dir", nil, "task directory with train.tsv, dev.tsv (dev_matched/mismatched for MNLI), test.tsv" },
  { "model", nil, "model directory to start from" },
  { "vocab", nil, "vocab.txt (default: the model directory's)" },
  { "do_lower_case", true, "uncased tokenization" },
  { "output", "runs/glue", "output directory" },
  { "do_train", false, "fine-tune on train.tsv" }, { "do_eval", false, "evaluate on dev" },
  { "do_predict", false, "predict test.tsv" },
  { "train_file", nil, "override train.tsv" }, { "eval_file", nil, "override the dev file" },
  { "max_seq_length", 128, "tokens per sequence", int = true, min = 3 },
  { "lr", 2e-5, "peak learning rate", min = 0, above = true }, { "epochs", 3, "epochs", min = 0, above = true },
  { "batch", 32, "sequences per step", int = true, min = 1 },
  { "micro_batch", 0, "sequences per forward (0: = batch)", int = true, min = 0 },
  { "warmup", 0.1, "warmup proportion", min = 0, max = 1 },
  { "warmup_steps", -1, "warmup in optimizer steps instead of --warmup (-1: use the proportion)", int = true,
    min = -1 },
  { "loss_scale", "dynamic", "fp16 loss scale: dynamic, or a fixed number (e.g. 128)" },
  { "weight_decay", 0.01, "AdamW weight decay", min = 0 },
  { "max_grad_norm", 1.0, "clip the global gradient norm to this (0: off)", min = 0, int = false },
  { "eval_batch", 64, "sequences per forward when evaluating", int = true, min = 1 },
  { "max_steps", 0, "stop training after this many steps (0: all)", int = true, min = 0 },
  { "log_every", 1, "a training log line every N steps (on a GPU the one host wait of a step)", int = true, min = 1 },
  { "log_format", "jsonl", logm.FORMAT_HELP .. "; the training log is train_log.jsonl or dllogger.json" },
  { "precision", "fp32",
    "fp32 | tf32 | bf16 | fp16: training with f32 master weights (fp16 with dynamic loss scaling); on a GPU a " ..
      "bf16/f16 compute copy with half activations, on the CPU half weights and gradients emulated (f32 " ..
        "activations) and tf32 = fp32; prediction in the same precision" },
  { "seed", 42, "seed", int = true, min = 0, max = 2 ^ 53 }, { "threads", 0, "CPU threads (0: default)" },
  bert.CHECKPOINT_OPTION,
  trainer.SAVE_STEPS_OPTION, trainer.RESUME_OPTION,
  { "unpad", true, "CPU training: the real tokens only, padded positions skipped (exact; false: the padded step)" },
  { "bucket_mb", 25, "data parallel: gradient all-reduce bucket size in MB", min = 0, above = true, int = false },
  { "allreduce_dtype", "fp32", dist.ALLREDUCE_HELP },
  device.OPTION,
}, { name = "glue",
  usage = "usage: [mpirun -np N] bertlua recipes/glue.lua --task=T --data-dir=DIR --model=DIR [--do-train] " ..
    "[--do-eval] [--do-predict]" })
if opt.threads > 0 then bl.set_num_threads(opt.threads) end
logm.check_format(opt.log_format, "glue")
ft.line_buffered()
print(options.show(opt))
for _, k in ipairs({ "task", "model" }) do if not opt[k] then error("glue: --" .. k:gsub("_", "-") .. " is required",
  0) end end
if not (opt.do_train or opt.do_eval or opt.do_predict) then error("glue: nothing to do: give --do-train, --do-eval " ..
  "and/or --do-predict", 0) end
if not opt.data_dir and not (opt.train_file or opt.eval_file) then error("glue: --data-dir is required", 0) end
amp.check_precision("glue", opt.precision)
dist.check_allreduce_dtype("glue", opt.allreduce_dtype, opt.precision)
local scaler_opts = amp.loss_scale_option(opt.loss_scale, "glue")
local dev, dev_line = device.setup(opt, "glue")
print(("%s (%s)"):format(dev_line, amp.path(dev, opt.precision)))

local task = opt.task:lower()
do
  local ok, err = pcall(glue.labels, task)
  if not ok then error("glue: " .. tostring(err):gsub("^.-glue: ", ""), 0) end
end
if opt.micro_batch > 0 and opt.batch % opt.micro_batch ~= 0 then
  error(("glue: --batch=%d is not a multiple of --micro-batch=%d"):format(opt.batch, opt.micro_batch), 0)
end
-- every input is checked before any work, so a typo does not cost a training run
local vocab = ft.model_dir("glue", opt.model, opt.vocab)
local function split_path(t, split)
  if not opt.data_dir then error(("glue: the %s split needs --data-dir"):format(split), 0) end
  return opt.data_dir .. "/" .. glue.split_file(t, split)
end
local eval_splits = task:match("^mnli") and task ~= "mnli-mm" and { "mnli", "mnli-mm" } or { task }
if opt.do_train then ft.input_file("glue", opt.train_file or split_path(task, "train"), "training data") end
if opt.do_eval then
  if opt.eval_file then ft.input_file("glue", opt.eval_file, "--eval-file")
  else for _, t in ipairs(eval_splits) do ft.input_file("glue", split_path(t, "dev"), "dev data") end end
end
if opt.do_predict then
  if not opt.data_dir then error("glue: --do-predict needs --data-dir (with test.tsv)", 0) end
  for _, t in ipairs(eval_splits) do ft.input_file("glue", split_path(t, "test"), "test data") end
end
-- every rank runs one job: options, model, vocabulary and data compared before any work (bertlua.train.fingerprint)
dist.agree("glue", fingerprint.entries{ options = opt, files = { { "--model", opt.model }, { "--vocab", vocab },
  { "--data-dir", opt.data_dir }, { "--train-file", opt.train_file }, { "--eval-file", opt.eval_file } } })
local regression = glue.is_regression(task)
local num_labels = regression and 1 or glue.num_labels(task)
local labels = glue.labels(task)
-- the output directory belongs to this run while it lasts (a second run into it is refused)
if dist.is_main() then fs.lock_dir(opt.output, "glue") end
local tok = Tok.load(vocab, { lower = opt.do_lower_case })
do  -- a classifier fine-tuned for another task does not fit: say so before loading
  local c = bert.config.load(opt.model .. "/config.json")
  local arch = type(c.architectures) == "table" and c.architectures[1] or nil
  if arch == "BertForSequenceClassification" and c.num_labels and c.num_labels ~= num_labels then
    error(("glue: %s is a classifier with %d outputs; %s needs %d (start from a pre-trained model directory)")
      :format(opt.model, c.num_labels, task, num_labels), 0)
  end
end
local model = amp.model_to(pretrained.from_pretrained(opt.model, { head = "classification", num_labels = num_labels,
  seed = opt.seed }), dev, opt.precision)
ft.seq_length("glue", model.cfg, opt.max_seq_length)
model.bert.unpad_training = opt.unpad and dev < 0
model.bert.encoder.checkpoint = opt.checkpoint_activations
if opt.do_train then
  print("glue: padded positions " .. (model.bert.unpad_training and "skipped in training (real tokens packed; "
    .. "--unpad=false computes them)" or "computed in training"))
end

-- examples of a split (t: the task, or mnli-mm for MNLI's mismatched files); a
-- file with no usable row stops the run with the file's name (reasons above)
local function read(split, file, t)
  t = t or task
  local ex, rep
  if file then ex, rep = glue.read_examples(t, file, { set_type = split })
  else ex, rep = glue.read_split(t, opt.data_dir, split) end
  print(("%s: %d rows, %d examples, %d malformed rows skipped"):format(rep.file or split, rep.rows, rep.examples,
    rep.skipped))
  if #ex == 0 then
    error(rep.rows == 0 and ("glue: %s has no data rows"):format(rep.file or split)
      or ("glue: no usable rows in %s (%d rows, all malformed: listed above)"):format(rep.file or split, rep.rows), 0)
  end
  return ex
end

local function featurize(examples)
  local rows = {}
  for i, e in ipairs(examples) do
    local toks, types = bert.pair(tok:tokenize(e.text_a), e.text_b and tok:tokenize(e.text_b) or nil,
      opt.max_seq_length)
    local label
    if e.label ~= nil then label = regression and tonumber(e.label) or glue.label_id(task, e.label) end
    rows[i] = { ids = tok:convert_tokens_to_ids(toks), types = types, label = label, guid = e.guid, index = e.index }
  end
  return rows
end

local function batch_of(rows, idx, with_labels)
  local sel = {}
  for k, i in ipairs(idx) do sel[k] = rows[i] end
  local b = batched.pad_rows(sel, opt.max_seq_length)
  if with_labels then
    local lab = bl.empty({ #sel }, { dtype = regression and "f32" or "i32" })
    local p = lab:ptr()
    for k, r in ipairs(sel) do p[k - 1] = r.label end
    b.labels = lab
  end
  return b
end

if opt.do_train then
  local rows = featurize(read("train", opt.train_file))
  trainer.fit{ model = model, n = #rows, batch = opt.batch, micro_batch = opt.micro_batch, epochs = opt.epochs,
    lr = opt.lr, warmup = opt.warmup, warmup_steps = opt.warmup_steps >= 0 and opt.warmup_steps or nil,
    scaler = scaler_opts, weight_decay = opt.weight_decay, max_grad_norm = opt.max_grad_norm,
    max_steps = opt.max_steps, log_every = opt.log_every, seed = opt.seed, device = dev,
    precision = opt.precision, log_path = logm.path_for(opt.output, "train_log", opt.log_format),
    log_format = opt.log_format, config = { options = opt },
    bucket_mb = opt.bucket_mb, allreduce_dtype = opt.allreduce_dtype,
    checkpoints = { dir = opt.output .. "/checkpoints", every = opt.save_steps, resume = opt.resume },
    make_batch = function(idx) return batch_of(rows, idx, true) end }
  if dist.is_main() then
    pretrained.save_pretrained(model, opt.output .. "/model", { vocab = vocab })
    print("train: model saved to " .. opt.output .. "/model")
  end
end
-- the saved model keeps the f32 master weights; evaluation and prediction run in --precision (on a GPU: the
-- compute copy)
if (opt.do_eval or opt.do_predict) and amp.round_weights(model, opt.precision) and dev < 0 then
  print("predict: weights rounded to " .. opt.precision)
end

-- predictions: class ids (0-based) or regression scores, one per row (under mpirun: on rank 0,
-- the other ranks compute their share of the batches and get an empty table)
local function predict(rows)
  local preds = {}
  local stats = batched.predict{ model = model, n = #rows, batch = opt.eval_batch, name = "glue", device = dev,
    precision = opt.precision, describe = function(i) return "row " .. rows[i].guid end,
    make_batch = function(idx) return batch_of(rows, idx, false) end,
    consume = function(idx, out)
      local lg = out.logits:totable()
      for k, i in ipairs(idx) do
        if regression then preds[i] = lg[k]
        else
          local best, bi = -math.huge, 0
          for c = 1, num_labels do
            local v = lg[(k - 1) * num_labels + c]
            if v > best then best, bi = v, c - 1 end
          end
          preds[i] = bi
        end
      end
    end }
  print("predict: " .. batched.format_latency(stats))
  return preds
end

local function label_name(p) return regression and ("%.3f"):format(p) or labels[p + 1] end

local function write_predictions(path, rows, preds)
  local lines = { "index\tprediction" }
  -- each row keeps the file's own index, so a skipped malformed row does not shift the others
  for i = 1, #rows do lines[#lines + 1] = ("%s\t%s"):format(rows[i].index, label_name(preds[i])) end
  fs.write_atomic(path, table.concat(lines, "\n") .. "\n")
end

if opt.do_eval then
  local splits = eval_splits
  local results = {}
  for _, t in ipairs(splits) do
    local rows = featurize(read("dev", opt.eval_file, t))
    local preds = predict(rows)
    if dist.is_main() then
      local gold = {}
      for i, r in ipairs(rows) do gold[i] = r.label end
      for k, v in pairs(metrics.glue(t, preds, gold)) do results[k] = v end
      write_predictions(("%s/dev_predictions_%s.tsv"):format(opt.output, t), rows, preds)
    end
  end
  results.task = task
  if not dist.is_main() then results = nil end
  for k, v in pairs(results or {}) do   -- e.g. Pearson of constant predictions: say so instead of failing
    if type(v) == "number" and v ~= v then results[k] = "nan (constant predictions or labels)" end
  end
  if results then
    print("evaluation: " .. cjson.encode(results))
    fs.write_atomic(opt.output .. "/eval_results.json", cjson.encode(results))
  end
end

if opt.do_predict then
  for _, t in ipairs(eval_splits) do
    local ex = read("test", split_path(t, "test"), t)
    local rows = featurize(ex)
    local preds = predict(rows)
    local name = ({ cola = "CoLA", ["sst-2"] = "SST-2", sst2 = "SST-2", mrpc = "MRPC", ["sts-b"] = "STS-B",
      stsb = "STS-B",
      qqp = "QQP", mnli = "MNLI-m", ["mnli-mm"] = "MNLI-mm", qnli = "QNLI", rte = "RTE", wnli = "WNLI" })[t] or t
    if dist.is_main() then
      write_predictions(("%s/%s.tsv"):format(opt.output, name), rows, preds)
      print(("predict: wrote %s/%s.tsv"):format(opt.output, name))
    end
  end
end
