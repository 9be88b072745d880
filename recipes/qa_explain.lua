-- Answers questions with a fine-tuned QA model and reports, as JSON, what a
-- notebook needs to show them: the tokens, start/end probabilities, the best
-- span, and the attention of one head (softmax probabilities, before dropout).
--
--   bertlua recipes/qa_explain.lua --model=runs/squad/model --input=questions.jsonl --layer=-1 --head=1 > out.json
-- Input lines: {"question": ..., "context": ...}. Layer is 1-based (negative from
-- the last), head 1-based. The context is truncated to fit --max-seq-length.
local options = require "bertlua.util.options"
local bert = require "bertlua.bert"
local pretrained = require "bertlua.pretrained"
local Tok = require "bertlua.data.tokenizer"
local batched = require "bertlua.batched"
local cjson = require "cjson"
local slice = require("bertlua.util.list").slice

local opt = options.parse(arg, {
  { "model", nil, "fine-tuned QA model directory" }, { "input", nil, "JSON lines {question, context}" },
  { "layer", -1, "encoder layer whose attention is reported (1-based, negative from the last)" },
  { "head", 1, "attention head (1-based)" }, { "max_seq_length", 128, "tokens per sequence", min = 4 },
  { "max_answer_length", 30, "longest answer in tokens" }, { "do_lower_case", true, "uncased tokenization" },
}, { name = "qa_explain", usage = "usage: bertlua recipes/qa_explain.lua --model=DIR --input=FILE.jsonl" })
if not opt.model or not opt.input then error("qa_explain: --model and --input are required", 0) end
local tok = Tok.load(opt.model .. "/vocab.txt", { lower = opt.do_lower_case })
local model = pretrained.from_pretrained(opt.model, { head = "qa" })
model:eval()
local layers = model.bert.encoder.layer
local li = opt.layer < 0 and #layers + opt.layer + 1 or opt.layer
if not layers[li] then error(("qa_explain: layer %d does not exist (the model has %d)"):format(opt.layer, #layers),
  0) end
local attn = layers[li].attention.self
if opt.head < 1 or opt.head > attn.heads then error(("qa_explain: head %d does not exist (%d heads)"):format(opt.head,
  attn.heads), 0) end

local function softmax(v)
  local m = -math.huge
  for _, x in ipairs(v) do if x > m then m = x end end
  local s, out = 0, {}
  for i, x in ipairs(v) do out[i] = math.exp(x - m); s = s + out[i] end
  for i = 1, #out do out[i] = out[i] / s end
  return out
end

local results = {}
for line in require("bertlua.util.fs").lines(opt.input) do
  if not line:match("^%s*$") then
    local rec = cjson.decode(line)
    local q, c = tok:tokenize(rec.question), tok:tokenize(rec.context)
    local toks, types = bert.pair(q, c, opt.max_seq_length)
    local batch = batched.pad_rows({ { ids = tok:convert_tokens_to_ids(toks), types = types } }, #toks)
    local out = model:forward(batch)
    local n = #toks
    local st = softmax(slice(out.start_logits:totable(), 1, n))
    local en = softmax(slice(out.end_logits:totable(), 1, n))
    local first_ctx = #q + 3
    local best, bs, be = -1, first_ctx, first_ctx
    for i = first_ctx, n - 1 do
      for j = i, math.min(n - 1, i + opt.max_answer_length - 1) do
        local p = st[i] * en[j]
        if p > best then best, bs, be = p, i, j end
      end
    end
    local probs = attn.probs:select(1, 1):select(1, opt.head):narrow(1, 1, n):narrow(2, 1, n):contiguous():tolist()
    local words = {}
    for i = bs, be do words[#words + 1] = toks[i] end
    results[#results + 1] = { question = rec.question, context = rec.context, tokens = toks,
      start_prob = st, end_prob = en, answer_start = bs - 1, answer_end = be - 1,
      answer = (table.concat(words, " "):gsub(" ##", "")), probability = best, layer = li, head = opt.head,
        attention = probs }
  end
end
io.write(cjson.encode(results), "\n")
