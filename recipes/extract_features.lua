-- Contextual embeddings of every token, like BERT's extract_features.py.
--
--   bertlua recipes/extract_features.lua --model=DIR --input=FILE --output=FILE.jsonl \
--       [--layers=-1,-2,-3,-4] [--max-seq-length=128] [--batch=8]
--
-- Input: one example per line, a sentence or "text_a ||| text_b" (as the
-- original: the line is stripped, then split at the last " ||| "; a blank line
-- is an example with no words, so linex_index is always the 0-based line number).
-- Output: one JSON line per input line, laid out as the original's:
--   {"linex_index": i, "features": [{"token": "[CLS]", "layers": [{"index": -1, "values": [...]}, ...]}, ...]}
-- one feature per token ([CLS] and [SEP] included, no padding). Layer -1 is
-- the last encoder layer, -2 the one before...; 0 is the embedding output and
-- k > 0 encoder layer k (the original's non-negative indices count from the
-- first encoder layer instead: its 0 is our 1). Values have 9 significant
-- digits (%.9g; the original rounds to 6 decimals). Examples are batched
-- (--batch) and padded to the longest of the batch; padding is masked out, so
-- the values do not depend on --batch. The model directory holds
-- config.json, model.safetensors and vocab.txt (--vocab overrides); any BERT
-- checkpoint works (its heads are ignored).
local bert = require "bertlua.bert"
local pretrained = require "bertlua.pretrained"
local options = require "bertlua.util.options"
local fs = require "bertlua.util.fs"
local ft = require "bertlua.tasks.common"
local infer = require "bertlua.bert.infer"
local device = require "bertlua.train.device"

local opt = options.parse(arg, {
  { "model", "", "model directory (config.json, model.safetensors, vocab.txt)" },
  { "input", "", "text file: one sentence or 'text_a ||| text_b' per line" },
  { "output", "", "JSON lines output file" },
  { "layers", "-1,-2,-3,-4", "comma-separated layer indices (-1 = last layer, 0 = embeddings)" },
  { "max_seq_length", 128, "tokens per example after WordPiece, [CLS] and [SEP] included", int = true, min = 3 },
  { "batch", 8, "examples per forward pass", int = true, min = 1 },
  { "vocab", "", "vocab.txt (default: the model directory's)" },
  { "do_lower_case", true, "lower-case and strip accents (uncased models)" },
  { "threads", 0, "CPU threads (0 = default)" },
  { "precision", "fp32", "fp32 | tf32 | bf16 | fp16 | int8 (on the CPU: weights rounded, activations f32; "
    .. "bf16 runs the bf16 GEMM where the CPU has AVX512-BF16; int8: cpu, dynamic int8 GEMMs)" },
  { "pack", true, "cpu: linear weights packed once for our own GEMM, padding skipped (bertlua.bert.infer)" },
  device.OPTION,
}, { name = "extract_features",
  usage = "bertlua recipes/extract_features.lua --model=DIR --input=FILE --output=FILE.jsonl [options]" })
print("extract_features options:\n" .. options.show(opt))

local function die(msg) error("extract_features: " .. msg, 0) end
if opt.model == "" or opt.input == "" or opt.output == "" then die("--model, --input and --output are required " ..
  "(see --help)") end
if opt.threads > 0 then require("bertlua").set_num_threads(opt.threads) end
local dev, dev_line = device.setup(opt, "extract_features")
local weight_precision = infer.check_precision("extract_features", opt.precision, dev)
print(dev_line)

local layers = {}
for v in tostring(opt.layers):gmatch("[^,]+") do
  local n = tonumber(v)
  if not n or n % 1 ~= 0 then die("--layers: '" .. v .. "' is not an integer") end
  layers[#layers + 1] = n
end
if #layers == 0 then die("--layers is empty") end

-- every input is checked before the model is loaded
local vocab = ft.model_dir("extract_features", opt.model, opt.vocab ~= "" and opt.vocab or nil)
ft.input_file("extract_features", opt.input, "--input")
fs.check_output("extract_features", { "--output", opt.output }, { { "--input", opt.input } })
local cfg = bert.config.load(opt.model .. "/config.json")
local L = cfg.num_hidden_layers
for _, li in ipairs(layers) do
  if li < -L or li > L then
    die(("--layers: %d is out of range for a %d-layer model (-%d..-1 from the last layer, 0 = embeddings, 1..%d)")
      :format(li, L, L, L))
  end
end
ft.seq_length("extract_features", cfg, opt.max_seq_length)

local lines = {}
do
  local any = false
  for line in fs.lines(opt.input) do   -- byte-exact: a NUL byte neither merges nor drops a line
    line = line:gsub("^%s+", ""):gsub("%s+$", "")
    if line ~= "" then any = true end
    lines[#lines + 1] = line
  end
  if not any then die(opt.input .. " is empty: expected one sentence or 'text_a ||| text_b' per line") end
end

local model = pretrained.from_pretrained(opt.model, { head = "model", quiet = true })
device.inference_model(model, dev, weight_precision)
-- on the CPU: packed weights, and each batch's padded positions skipped (their hidden states are never written out)
if dev < 0 and opt.pack then
  print("extract_features: " .. select(3, infer.pack(model, opt.precision)))
elseif opt.precision == "int8" then
  die("--precision=int8 runs the packed int8 GEMMs: drop --pack=false")
end
local tok = require("bertlua.data.tokenizer").load(vocab, { lower = opt.do_lower_case })

local examples = {}
for i, line in ipairs(lines) do
  local a, b = line:match("^(.*) ||| (.*)$")   -- the original's ^(.*) \|\|\| (.*)$
  if not a then a = line end
  local toks, types = bert.pair(tok:tokenize(a), b and tok:tokenize(b) or nil, opt.max_seq_length)
  examples[i] = { index = i - 1, tokens = toks, type_ids = types, ids = tok:convert_tokens_to_ids(toks) }
end

local fout = fs.open(opt.output)
bert.extract_features(model, examples, { layers = layers, batch = opt.batch, device = dev }, function(_, line)
  fout:write(line, "\n")
end)
fout:commit()
print(("extract_features: %d examples -> %s"):format(#examples, opt.output))
