-- Convert a checkpoint you already have into a standard Hugging Face model
-- directory (config.json, model.safetensors, vocab.txt), which bertlua and
-- transformers both load.
--
--   bertlua recipes/convert.lua --input=uncased_L-24_H-1024_A-16 --output=models/bert-large-uncased
--   bertlua recipes/convert.lua --input=model.ckpt-8601 --output=DIR        (a TF checkpoint prefix)
--   bertlua recipes/convert.lua --input=bert_large_qa.pt --bert-config=bert_config.json --vocab=vocab.txt --output=DIR
--
-- The model's configuration is --bert-config; --config is, as in every recipe, a
-- file of option values (e.g. { input = "...", output = "..." }).
--
-- Inputs (read in C, no Python): Google's TensorFlow checkpoints
-- (PREFIX.index + PREFIX.data-*, every crc32c checked; optimizer slots
-- skipped), transformers' pytorch_model.bin and NVIDIA's torch.save .pt files
-- ({"model": state dict}, "module." prefixes, NVIDIA's names, vocabulary rows
-- padded past vocab_size: dropped with a note), safetensors.
-- The head (pre-training, SQuAD, classifier or none) follows from the tensors
-- the checkpoint holds; --head overrides it. Every recipe's --model/--init
-- also takes these inputs directly: converting once just saves the mapping
-- work on every later start.
local bert = require "bertlua.bert"
local pretrained = require "bertlua.pretrained"
local options = require "bertlua.util.options"
local imp = require "bertlua.io.import"

local opt = options.parse(arg, {
  { "input", "", "checkpoint: a directory, a TF checkpoint prefix or .index, a .bin/.pt/.safetensors file" },
  { "output", "", "output model directory" },
  { "bert_config", "", "the model's config.json or bert_config.json (default: the one next to the input)" },
  { "vocab", "", "vocab.txt (default: the one next to the input)" },
  { "head", "auto", "auto | pretraining | qa | classification | model" },
  { "dtype", "F32", "F32 | F16 | BF16: how model.safetensors stores the weights" },
  { "pad_vocab", 0, "pad the vocabulary rows with zeros to a multiple of this (8: NVIDIA's layout; transformers "
    .. "refuses such files, bertlua trims them)", int = true, min = 0 },
}, { name = "convert", usage = "usage: bertlua recipes/convert.lua --input=CKPT --output=DIR "
  .. "[--bert-config=bert_config.json] [--vocab=vocab.txt] [options]   (--config=FILE: a file of option values)" })

if opt.input == "" or opt.output == "" then error("convert: --input=CKPT and --output=DIR are required", 0) end
local dtype = opt.dtype:upper()
if dtype ~= "F32" and dtype ~= "F16" and dtype ~= "BF16" then
  error("convert: --dtype must be F32, F16 or BF16, got " .. opt.dtype, 0)
end
if opt.head ~= "auto" and not bert.heads[opt.head] then
  error("convert: --head must be auto, pretraining, qa, classification or model, got " .. opt.head, 0)
end
local src = imp.locate(opt.input, opt.bert_config ~= "" and opt.bert_config or nil)
local vocab = opt.vocab ~= "" and opt.vocab or src.vocab
if vocab and not io.open(vocab, "rb") then error("convert: --vocab=" .. vocab .. " cannot be read", 0) end
local head, num_labels
if opt.head == "auto" then head, num_labels = imp.head_of(src) else head = opt.head end

print(("convert: %s (%s) with %s -> %s, head %s"):format(src.weights, src.format, src.config, opt.output, head))
local model = pretrained.from_pretrained(opt.input, { head = head, num_labels = num_labels, config = src.config })
local n = 0
for _ in ipairs(model:parameters()) do n = n + 1 end
pretrained.save_pretrained(model, opt.output, { vocab = vocab, dtype = dtype, pad_vocab = opt.pad_vocab })
print(("convert: wrote %s/config.json, model.safetensors (%d tensors, %s)%s"):format(opt.output, n, dtype,
  vocab and ", vocab.txt" or " (no vocab.txt found: pass --vocab=FILE)"))
