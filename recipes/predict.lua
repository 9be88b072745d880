-- Batch inference with a fine-tuned model directory: predictions, throughput
-- and latency.
--
--   bertlua recipes/predict.lua --model=runs/squad/model --task=squad --input=dev-v1.1.json --output=preds.json
--   bertlua recipes/predict.lua --model=runs/mrpc/model --task=glue-mrpc --input=glue/MRPC/test.tsv --output=MRPC.tsv
--   bertlua recipes/predict.lua --model=runs/sst2/model --input=texts.jsonl --output=preds.jsonl --batch=1
--
-- --task picks the input format:
--   squad       a SQuAD JSON file (v1.1, or v2.0 with --version-2-with-negative);
--               writes predictions.json's format (id -> answer text) and, when
--               the file has answers, prints the official metrics.
--   glue-TASK   a GLUE TSV (TASK = cola sst2 mrpc stsb qqp mnli qnli rte wnli;
--               --split=dev|test, default from the file name); writes the GLUE
--               submission format (index<TAB>prediction) and, for dev files,
--               prints the task metrics.
--   jsonl       (default) JSON lines. A classification model reads
--               {"text_a": ..., "text_b": ...} ("text" is text_a) and writes
--               {"index", "label" (0-based class or the regression score),
--               "logits"}; a QA model reads {"question": ..., "context": ...} and
--               writes {"index", "answer", "probability"}.
-- Batches are padded to their longest sequence (a multiple of 8); the model runs
-- in eval mode (no dropout). Sequences/s and the latency of one batch's forward
-- (p50/p90/p99) are printed at the end and written as JSON to --stats; --batch=1
-- measures per-request latency. --warmup-batches runs that many batches
-- first, untimed. --precision=bf16|fp16 rounds the weights to that type once
-- (activations stay f32: half-precision storage emulated on the CPU); on a CPU
-- with AVX512-BF16, bf16 also runs the packed bf16 GEMM (activations rounded
-- to bf16 at each GEMM, f32 sums). --precision=int8 (CPU): dynamic int8 GEMMs
-- (bertlua.bert.infer.plan says which kernel; the line is printed).
-- Malformed input (a JSON line, a TSV row, a SQuAD entry) is reported with its
-- location and skipped; the count is printed.
local bl = require "bertlua"
local options = require "bertlua.util.options"
local fs = require "bertlua.util.fs"
local bert = require "bertlua.bert"
local pretrained = require "bertlua.pretrained"
local Tok = require "bertlua.data.tokenizer"
local batched = require "bertlua.batched"
local ft = require "bertlua.tasks.common"
local infer = require "bertlua.bert.infer"
local device = require "bertlua.train.device"
local cjson = require "cjson.safe"
local slice = require("bertlua.util.list").slice

local opt = options.parse(arg, {
  { "model", nil, "fine-tuned model directory (QA or sequence classification)" },
  { "vocab", nil, "vocab.txt (default: the model directory's)" },
  { "do_lower_case", true, "uncased tokenization" },
  { "task", "jsonl", "input format: jsonl, squad, glue-TASK (e.g. glue-sst2)" },
  { "input", nil, "input file" }, { "output", nil, "output file (default: stdout)" },
  { "split", "auto", "glue: dev (labelled) or test (the file name decides by default)" },
  { "batch", 32, "sequences per forward (1: latency mode)", int = true, min = 1 },
  { "warmup_batches", 0, "untimed batches run first", int = true, min = 0 },
  { "max_seq_length", 0, "tokens per sequence (0: the model's max_position_embeddings, at most 384)", int = true,
    min = 0 },
  { "doc_stride", 128, "QA: stride between context windows", int = true, min = 1 },
  { "max_query_length", 64, "QA: question tokens kept", int = true, min = 1 },
  { "max_answer_length", 30, "QA: longest answer", int = true, min = 1 },
  { "n_best", 20, "QA: n-best spans per question", int = true, min = 1 },
  { "span_search", "nbest", "QA: answer spans searched: nbest (the --n-best best starts x ends of each window) " ..
    "or exhaustive (every valid start/end pair)", choices = { "nbest", "exhaustive" } },
  { "version_2_with_negative", false, "squad: SQuAD 2.0 (unanswerable questions)" },
  { "null_score_diff_threshold", 0.0, "squad v2: predict no answer when null score - best > this", int = false },
  { "precision", "fp32",
    "fp32 | tf32 | bf16 | fp16 | int8: weights rounded to bf16/f16 once at load; on the CPU tf32 = fp32, bf16 " ..
      "runs the bf16 GEMM where the CPU has AVX512-BF16, activations otherwise f32; int8: cpu, dynamic int8 GEMMs" },
  { "stats", nil, "write throughput and latency as JSON here" },
  { "threads", 0, "CPU threads (0: default)" },
  { "pack", true, "cpu: linear weights packed once for our own GEMM (bertlua.bert.infer)" },
  device.OPTION,
}, { name = "predict",
  usage = "usage: bertlua recipes/predict.lua --model=DIR --input=FILE [--task=jsonl|squad|glue-TASK] " ..
    "[--output=FILE] [--batch=N]" })
if opt.threads > 0 then bl.set_num_threads(opt.threads) end
if not opt.model or not opt.input then error("predict: --model and --input are required (see --help)", 0) end
local dev, dev_line = device.setup(opt, "predict")
local weight_precision = infer.check_precision("predict", opt.precision, dev)
io.stderr:write(dev_line, "\n")
local task = opt.task:lower()
local glue_task = task:match("^glue%-(.+)$")
if task ~= "jsonl" and task ~= "squad" and not glue_task then
  error("predict: --task must be jsonl, squad or glue-TASK (e.g. glue-sst2), got " .. opt.task, 0)
end
local glue = require "bertlua.tasks.glue"
if glue_task then glue.labels(glue_task) end  -- unknown task names fail here, before loading anything
local vocab = ft.model_dir("predict", opt.model, opt.vocab)
ft.input_file("predict", opt.input, "--input")
if opt.output then fs.check_output("predict", { "--output", opt.output }, { { "--input", opt.input } }) end

local tok = Tok.load(vocab, { lower = opt.do_lower_case })
local model = pretrained.from_pretrained(opt.model)
if opt.max_seq_length == 0 then opt.max_seq_length = math.min(384, model.cfg.max_position_embeddings) end
if opt.max_seq_length < 3 then error("predict: --max-seq-length must be at least 3 ([CLS], a token, [SEP])", 0) end
ft.seq_length("predict", model.cfg, opt.max_seq_length)
local is_qa = model.qa_outputs ~= nil
if not is_qa and not model.classifier then error("predict: " .. opt.model
  .. " is neither a QA nor a classification model", 0) end
if task == "squad" and not is_qa then error("predict: --task=squad needs a QA model; " .. opt.model
  .. " is a classifier", 0) end
if glue_task and is_qa then error("predict: --task=" .. opt.task .. " needs a classification model; " .. opt.model
  .. " is a QA model", 0) end
device.inference_model(model, dev, weight_precision)
-- on the CPU every linear weight is packed once for our own GEMM (bias and GELU in its epilogue)
if dev < 0 and opt.pack then
  io.stderr:write("predict: ", select(3, infer.pack(model, opt.precision)), "\n")
elseif opt.precision == "int8" then
  error("predict: --precision=int8 runs the packed int8 GEMMs: drop --pack=false", 0)
end

-- runs the model over n sequences (batches from make_batch), with untimed warmup batches first;
-- describe(i) names sequence i in errors
local function run(n, make_batch, consume, describe)
  if opt.warmup_batches > 0 then
    local w = math.min(n, opt.warmup_batches * opt.batch)
    batched.predict{ model = model, n = w, batch = opt.batch, make_batch = make_batch, name = "predict",
      precision = opt.precision, describe = describe, device = dev }
  end
  return batched.predict{ model = model, n = n, batch = opt.batch, make_batch = make_batch, consume = consume,
    name = "predict", precision = opt.precision, describe = describe, device = dev }
end

-- a classifier's input row ({ids=, types=}) for text_a and the optional text_b
local function encode_pair(a, b)
  local toks, types = bert.pair(tok:tokenize(a), b and tok:tokenize(b) or nil, opt.max_seq_length)
  return { ids = tok:convert_tokens_to_ids(toks), types = types }
end

-- run() over such rows, each batch padded to its longest row (batched.pad_rows)
local function run_rows(rows, consume, describe)
  return run(#rows,
    function(idx)
      local sel = {}
      for k, i in ipairs(idx) do sel[k] = rows[i] end
      return (batched.pad_rows(sel, opt.max_seq_length))
    end,
    consume, describe)
end

local function write_output(text)
  if opt.output then fs.write_atomic(opt.output, text) else io.write(text) end
end

-- QA over a SQuAD file (path) or decoded dataset: returns predictions, nbest, null odds, stats, skipped, count
local function answer_questions(src, name)
  local squad = require "bertlua.tasks.squad"
  local examples, rep = squad.read_examples(src, { is_training = false,
    version_2_with_negative = opt.version_2_with_negative, quiet = false })
  if #examples == 0 then error(("predict: no usable questions in %s"):format(name), 0) end
  local feats = squad.convert_examples_to_features(examples, tok, { max_seq_length = opt.max_seq_length,
    doc_stride = opt.doc_stride, max_query_length = opt.max_query_length, is_training = false })
  local preds, nbest, odds, stats = squad.predict(examples, feats,
    function(n, consume)
      return run(n, function(idx) return (squad.feature_batch(feats, idx, opt.max_seq_length)) end, consume,
        function(i) return "question " .. tostring(examples[feats[i].example_index + 1].qas_id) end)
    end,
    { tokenizer = tok, n_best_size = opt.n_best, max_answer_length = opt.max_answer_length,
      span_search = opt.span_search, version_2_with_negative = opt.version_2_with_negative,
        null_score_diff_threshold = opt.null_score_diff_threshold })
  return preds, nbest, odds, stats, rep.skipped, #examples
end

local records, stats
local skipped = 0
local summary = {}

if task == "squad" then
  local squad = require "bertlua.tasks.squad"
  local dataset = squad.load_json(opt.input)
  local preds, _, odds, st, sk, n = answer_questions(opt.input, opt.input)
  stats, skipped, records = st, sk, n
  local json = require "bertlua.util.json"
  write_output(json.dumps(preds, { indent = 4 }) .. "\n")
  if squad.has_answers(dataset) then
    local ok, result, version = pcall(squad.evaluate, dataset, preds, { na_probs = odds })
    if ok then
      io.stderr:write("predict: evaluation: ", squad.format_eval(result, version, true), "\n")
      summary.evaluation = result
    else
      io.stderr:write("predict: no evaluation (", tostring(result), ")\n")
    end
  end
elseif glue_task then
  local split = opt.split
  if split == "auto" then split = opt.input:match("test[^/]*$") and "test" or "dev" end
  local ex, rep = glue.read_examples(glue_task, opt.input, { set_type = split })
  skipped, records = rep.skipped, #ex
  if #ex == 0 then
    error(rep.rows == 0 and ("predict: %s has no data rows"):format(opt.input)
      or ("predict: no usable rows in %s (%d rows, all malformed: listed above)"):format(opt.input, rep.rows), 0)
  end
  local regression = glue.is_regression(glue_task)
  local labels = glue.labels(glue_task)
  local nl = model.num_labels
  if (regression and nl ~= 1) or (not regression and nl ~= #labels) then
    error(("predict: %s has %d outputs but %s needs %d"):format(opt.model, nl, glue_task, regression and 1 or #labels),
      0)
  end
  local rows = {}
  for i, e in ipairs(ex) do
    rows[i] = encode_pair(e.text_a, e.text_b)
  end
  local preds = {}
  stats = run_rows(rows,
    function(idx, out)
      local lg = out.logits:totable()
      for k, i in ipairs(idx) do
        if regression then preds[i] = lg[k]
        else
          local bi = 1
          for c = 2, nl do if lg[(k - 1) * nl + c] > lg[(k - 1) * nl + bi] then bi = c end end
          preds[i] = bi - 1
        end
      end
    end,
    function(i) return ("%s row %s"):format(opt.input, ex[i].index) end)
  -- each row keeps the file's own index (its index column, else its place among the data rows), so a
  -- skipped malformed row does not shift the others
  local lines = { "index\tprediction" }
  for i = 1, #rows do
    lines[#lines + 1] = ("%s\t%s"):format(ex[i].index, regression and ("%.3f"):format(preds[i]) or labels[preds[i] + 1])
  end
  write_output(table.concat(lines, "\n") .. "\n")
  if split ~= "test" then
    local gold = {}
    for i, e in ipairs(ex) do gold[i] = regression and tonumber(e.label) or glue.label_id(glue_task, e.label) end
    local m = require("bertlua.tasks.metrics").glue(glue_task, preds, gold)
    io.stderr:write("predict: evaluation: ", require("cjson").encode(m), "\n")
    summary.evaluation = m
  end
else
  local recs = {}
  -- byte-exact lines: a NUL byte inside a record neither merges it with the next nor drops it
  for line, lineno in fs.lines(opt.input) do
    if not line:match("^%s*$") then
      local rec, jerr = cjson.decode(line)
      local why
      if type(rec) ~= "table" or rec[1] ~= nil then why = rec == nil and ("not JSON (" .. tostring(jerr)
        .. ")") or "not a JSON object"
      elseif is_qa and (type(rec.question) ~= "string" or type(rec.context) ~= "string"
          or rec.context:match("^%s*$")) then
        why = "needs string fields question and a non-empty context"
      elseif not is_qa and type(rec.text_a or rec.text) ~= "string" then why = "needs a string field text_a (or text)"
      elseif not is_qa and rec.text_b ~= nil and type(rec.text_b) ~= "string" then why = "text_b must be a string" end
      if why then
        skipped = skipped + 1
        io.stderr:write(("predict: %s:%d: %s (skipped)\n"):format(opt.input, lineno, why))
      else
        rec.lineno_ = lineno   -- a record keeps its own line as its index, whatever was skipped before it
        recs[#recs + 1] = rec
      end
    end
  end
  records = #recs
  if #recs == 0 then error("predict: no usable records in " .. opt.input, 0) end

  local out_lines = {}
  if is_qa then
    local data = { version = "1.1", data = { { title = "predict", paragraphs = {} } } }
    for i, r in ipairs(recs) do
      table.insert(data.data[1].paragraphs, { context = r.context, qas = { { id = tostring(i), question = r.question,
        answers = {} } } })
    end
    local preds, nbest, _, st = answer_questions(data, opt.input)
    stats = st
    for i = 1, #recs do
      local best = nbest and nbest[tostring(i)] and nbest[tostring(i)][1]
      out_lines[i] = cjson.encode({ index = recs[i].lineno_ - 1, answer = preds[tostring(i)] or "",
        probability = best and best.probability or nil })
    end
  else
    local rows = {}
    for i, r in ipairs(recs) do
      rows[i] = encode_pair(r.text_a or r.text, r.text_b)
    end
    local nl = model.num_labels
    stats = run_rows(rows,
      function(idx, out)
        local lg = out.logits:totable()
        for k, i in ipairs(idx) do
          local logits = slice(lg, (k - 1) * nl + 1, k * nl)
          local label = logits[1]
          if nl > 1 then
            local bi = 1
            for c = 2, nl do if logits[c] > logits[bi] then bi = c end end
            label = bi - 1
          end
          out_lines[i] = cjson.encode({ index = recs[i].lineno_ - 1, label = label, logits = logits })
        end
      end,
      function(i) return ("%s:%d"):format(opt.input, recs[i].lineno_) end)
  end
  write_output(table.concat(out_lines, "\n") .. "\n")
end

io.stderr:write(("predict: %d records (%d skipped); %s\n"):format(records, skipped, batched.format_latency(stats)))
if opt.stats then
  summary.task, summary.records, summary.skipped, summary.batch, summary.threads = task, records, skipped, opt.batch,
    bl.num_threads()
  summary.precision = opt.precision
  for _, k in ipairs({ "sequences", "seconds", "seq_per_s", "p50_ms", "p90_ms", "p99_ms",
    "batches" }) do summary[k] = stats[k] end
  ft.write_json(opt.stats, summary)
end
