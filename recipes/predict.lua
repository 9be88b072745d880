-- Batch inference with a fine-tuned model directory: throughput and latency.
--
--   bertlua recipes/predict.lua --model=runs/mrpc/model --input=pairs.jsonl --output=preds.jsonl [--batch=32]
--   bertlua recipes/predict.lua --model=runs/squad/model --input=questions.jsonl --output=answers.jsonl --batch=1
-- Input: JSON lines. A classification model reads {"text_a": ..., "text_b": ...}
-- ("text" is text_a) and writes {"index", "label" (0-based class or the
-- regression score), "logits"}; a QA model reads {"question": ..., "context": ...}
-- and writes {"index", "answer", "probability"}. Batches are padded to their
-- longest sequence; the model runs in eval mode. --batch=1 measures per-request
-- latency. Sequences/s and latency percentiles (p50/p90/p99 per batch) are
-- printed at the end. A line that is not valid JSON or lacks its fields is
-- reported with its line number and skipped.
local bl = require "bertlua"
local options = require "bertlua.options"
local bert = require "bertlua.bert"
local Tok = require "bertlua.tokenizer"
local trainer = require "bertlua.trainer"
local cjson = require "cjson.safe"

local opt = options.parse(arg, {
  { "model", nil, "fine-tuned model directory (QA or sequence classification)" },
  { "vocab", nil, "vocab.txt (default: the model directory's)" },
  { "do_lower_case", true, "uncased tokenization" },
  { "input", nil, "JSON-lines input" }, { "output", nil, "JSON-lines output (default: stdout)" },
  { "batch", 32, "sequences per forward (1: latency mode)" },
  { "max_seq_length", 384, "tokens per sequence" }, { "doc_stride", 128, "QA: stride between context windows" },
  { "max_query_length", 64, "QA: question tokens kept" }, { "max_answer_length", 30, "QA: longest answer" },
  { "threads", 0, "CPU threads (0: default)" },
}, { name = "predict", usage = "usage: bertlua recipes/predict.lua --model=DIR --input=FILE.jsonl [--output=FILE.jsonl] [--batch=N]" })
if opt.threads > 0 then bl.set_num_threads(opt.threads) end
if not opt.model or not opt.input then error("predict: --model and --input are required (see --help)", 0) end

local tok = Tok.load(opt.vocab or (opt.model .. "/vocab.txt"), { lower = opt.do_lower_case })
local model = bert.from_pretrained(opt.model)
local is_qa = model.qa_outputs ~= nil
if not is_qa and not model.classifier then error("predict: " .. opt.model .. " is neither a QA nor a classification model", 0) end

local records, skipped = {}, 0
local f, err = io.open(opt.input, "rb")
if not f then error("predict: cannot open " .. opt.input .. ": " .. tostring(err), 0) end
local lineno = 0
for line in f:lines() do
  lineno = lineno + 1
  if not line:match("^%s*$") then
    local rec = cjson.decode(line)
    local why
    if type(rec) ~= "table" then why = "not a JSON object"
    elseif is_qa and (type(rec.question) ~= "string" or type(rec.context) ~= "string" or rec.context == "") then
      why = "needs string fields question and a non-empty context"
    elseif not is_qa and type(rec.text_a or rec.text) ~= "string" then why = "needs a string field text_a (or text)" end
    if why then
      skipped = skipped + 1
      io.stderr:write(("predict: %s:%d: %s (skipped)\n"):format(opt.input, lineno, why))
    else
      rec._line = lineno
      records[#records + 1] = rec
    end
  end
end
f:close()
if #records == 0 then error("predict: no usable records in " .. opt.input, 0) end

local out_lines = {}
local stats
if is_qa then
  local squad = require "bertlua.squad"
  local data = { version = "1.1", data = { { title = "predict", paragraphs = {} } } }
  for i, r in ipairs(records) do
    table.insert(data.data[1].paragraphs, { context = r.context, qas = { { id = tostring(i), question = r.question, answers = {} } } })
  end
  local examples = squad.read_examples(data, { is_training = false, quiet = true })
  local feats = squad.convert_examples_to_features(examples, tok, { max_seq_length = opt.max_seq_length,
    doc_stride = opt.doc_stride, max_query_length = opt.max_query_length, is_training = false })
  local results = {}
  stats = trainer.predict{ model = model, n = #feats, batch = opt.batch,
    make_batch = function(idx)
      local rows = {}
      for k, i in ipairs(idx) do
        local ft = feats[i]
        local n = 0
        for j = 1, #ft.input_mask do if ft.input_mask[j] ~= 0 then n = j end end
        rows[k] = { ids = { unpack(ft.input_ids, 1, n) }, types = { unpack(ft.segment_ids, 1, n) } }
      end
      return (trainer.pad_rows(rows, opt.max_seq_length))
    end,
    consume = function(idx, out)
      local S = out.start_logits:size(2)
      local st, en = out.start_logits:totable(), out.end_logits:totable()
      for r, i in ipairs(idx) do
        results[i] = { unique_id = feats[i].unique_id, start_logits = { unpack(st, (r - 1) * S + 1, r * S) },
          end_logits = { unpack(en, (r - 1) * S + 1, r * S) } }
      end
    end }
  local preds, nbest = squad.write_predictions(examples, feats, results, { tokenizer = tok,
    max_answer_length = opt.max_answer_length })
  for i, r in ipairs(records) do
    local best = nbest and nbest[tostring(i)] and nbest[tostring(i)][1]
    out_lines[i] = cjson.encode({ index = i - 1, answer = preds[tostring(i)] or "", probability = best and best.probability or nil })
  end
else
  local rows = {}
  for i, r in ipairs(records) do
    local toks, types = bert.pair(tok:tokenize(r.text_a or r.text), r.text_b and tok:tokenize(r.text_b) or nil, opt.max_seq_length)
    rows[i] = { ids = tok:convert_tokens_to_ids(toks), types = types }
  end
  local nl = model.num_labels
  stats = trainer.predict{ model = model, n = #rows, batch = opt.batch,
    make_batch = function(idx)
      local sel = {}
      for k, i in ipairs(idx) do sel[k] = rows[i] end
      return (trainer.pad_rows(sel, opt.max_seq_length))
    end,
    consume = function(idx, out)
      local lg = out.logits:totable()
      for k, i in ipairs(idx) do
        local logits = { unpack(lg, (k - 1) * nl + 1, k * nl) }
        local label = logits[1]
        if nl > 1 then
          local bi = 1
          for c = 2, nl do if logits[c] > logits[bi] then bi = c end end
          label = bi - 1
        end
        out_lines[i] = cjson.encode({ index = i - 1, label = label, logits = logits })
      end
    end }
end

local text = table.concat(out_lines, "\n") .. "\n"
if opt.output then require("bertlua.checkpoint").write_atomic(opt.output, text) else io.write(text) end
io.stderr:write(("predict: %d records (%d skipped); %s\n"):format(#records, skipped, trainer.format_latency(stats)))
