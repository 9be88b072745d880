-- Contextual embeddings of every token, like BERT's extract_features.py.
--
--   bertlua recipes/extract_features.lua --model=DIR --input=FILE --output=FILE.jsonl \
--       [--layers=-1,-2,-3,-4] [--max-seq-length=128] [--batch=8]
--
-- Input: one example per line, a sentence or "text_a ||| text_b".
-- Output: one JSON line per input line:
--   {"linex_index": i, "features": [{"token": "[CLS]", "layers": [{"index": -1, "values": [...]}, ...]}, ...]}
-- Layer -1 is the last encoder layer, -2 the one before...; 0 is the
-- embedding output. Values have 9 significant digits (%.9g). The model
-- directory holds config.json, model.safetensors and vocab.txt (--vocab
-- overrides); any BERT checkpoint works (its heads are ignored).
local bert = require "bertlua.bert"
local options = require "bertlua.options"

local opt = options.parse(arg, {
  { "model", "", "model directory (config.json, model.safetensors, vocab.txt)" },
  { "input", "", "text file: one sentence or 'text_a ||| text_b' per line" },
  { "output", "", "JSON lines output file" },
  { "layers", "-1,-2,-3,-4", "comma-separated layer indices (-1 = last layer)" },
  { "max_seq_length", 128, "tokens per example after WordPiece, [CLS] and [SEP] included" },
  { "batch", 8, "examples per forward pass" },
  { "vocab", "", "vocab.txt (default: the model directory's)" },
  { "do_lower_case", true, "lower-case and strip accents (uncased models)" },
  { "threads", 0, "CPU threads (0 = default)" },
}, { usage = "bertlua recipes/extract_features.lua --model=DIR --input=FILE --output=FILE.jsonl [options]" })
print("extract_features options:\n" .. options.show(opt))

local function die(msg) io.stderr:write("extract_features: ", msg, "\n"); os.exit(1) end
if opt.model == "" or opt.input == "" or opt.output == "" then die("--model, --input and --output are required (see --help)") end
if opt.max_seq_length < 3 then die("--max-seq-length must be at least 3") end
if opt.threads > 0 then require("bertlua").set_num_threads(opt.threads) end

local layers = {}
for v in tostring(opt.layers):gmatch("[^,]+") do
  local n = tonumber(v)
  if not n or n % 1 ~= 0 then die("--layers: '" .. v .. "' is not an integer") end
  layers[#layers + 1] = n
end

local model = bert.from_pretrained(opt.model, { head = "model", quiet = true })
local vocab = opt.vocab ~= "" and opt.vocab or (opt.model .. "/vocab.txt")
local tok = require("bertlua.tokenizer").load(vocab, { lower = opt.do_lower_case })

local fin, err = io.open(opt.input, "r")
if not fin then die("cannot open " .. opt.input .. ": " .. tostring(err)) end
local examples = {}
local idx = 0
for line in fin:lines() do
  local a, b = line:match("^(.-)%s*|||%s*(.*)$")
  if not a then a = line end
  local ta = tok:tokenize(a)
  local tb = b and tok:tokenize(b) or nil
  local toks, types = bert.pair(ta, tb, opt.max_seq_length)
  examples[#examples + 1] = { index = idx, tokens = toks, type_ids = types, ids = tok:convert_tokens_to_ids(toks) }
  idx = idx + 1
end
fin:close()

local tmp = opt.output .. ".tmp"
local fout, oerr = io.open(tmp, "w")
if not fout then die("cannot write " .. opt.output .. ": " .. tostring(oerr)) end
bert.extract_features(model, examples, { layers = layers, batch = opt.batch }, function(_, line)
  fout:write(line, "\n")
end)
fout:close()
assert(os.rename(tmp, opt.output))
print(("extract_features: %d examples -> %s"):format(#examples, opt.output))
