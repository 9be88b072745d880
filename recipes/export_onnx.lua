-- Export a model to ONNX for serving outside bertlua (onnxruntime, Triton's
-- ONNX Runtime backend, TensorRT's ONNX parser). Written by bertlua itself:
-- no Python, no onnx package at export time.
--
--   bertlua recipes/export_onnx.lua --model=runs/squad/model --output=bert_qa.onnx --dynamic-batch --dynamic-seq
--   bertlua recipes/export_onnx.lua --model=runs/sst2/model --output=sst2.onnx --head=cls --batch=8 --seq-length=128
--
-- Inputs input_ids, attention_mask, token_type_ids (int64 [batch, seq]);
-- outputs as Hugging Face's optimum names them: last_hidden_state (--head=none),
-- start_logits and end_logits (qa), logits (cls: [batch, labels]; mlm:
-- [batch, seq, vocab]). Opset 17; the encoder is plain ops that onnxruntime's
-- transformer optimizer fuses (bertlua.io.onnx). Without --dynamic-batch /
-- --dynamic-seq those dimensions are fixed at --batch / --seq-length.
local options = require "bertlua.util.options"
local fs = require "bertlua.util.fs"
local pretrained = require "bertlua.pretrained"
local imp = require "bertlua.io.import"
local onnx = require "bertlua.io.onnx"
local ft = require "bertlua.tasks.common"

local opt = options.parse(arg, {
  { "model", "", "model directory (or any checkpoint bertlua reads)" },
  { "output", "", "the .onnx file to write" },
  { "head", "auto", "auto (the model's own) | qa | cls | mlm | none (the encoder: last_hidden_state)" },
  { "precision", "fp32", "fp32 | fp16 (weights and activations in float16, for GPU runtimes)" },
  { "dynamic_batch", false, "the batch dimension is dynamic (batch_size)" },
  { "dynamic_seq", false, "the sequence dimension is dynamic (sequence_length)" },
  { "batch", 1, "the fixed batch size without --dynamic-batch", int = true, min = 1 },
  { "seq_length", 0, "the fixed sequence length without --dynamic-seq (0: the model's positions, at most 128)",
    int = true, min = 0 },
}, { name = "export_onnx", usage = "usage: bertlua recipes/export_onnx.lua --model=DIR --output=model.onnx "
  .. "[--head=qa|cls|mlm|none] [--precision=fp32|fp16] [--dynamic-batch --dynamic-seq]   (--config=FILE: a file "
  .. "of option values)" })

local function die(msg) error("export_onnx: " .. msg, 0) end
if opt.model == "" or opt.output == "" then die("--model=DIR and --output=FILE are required") end
if opt.precision ~= "fp32" and opt.precision ~= "fp16" then
  die("--precision must be fp32 or fp16, got " .. opt.precision)
end
-- before any work: where the file goes
local out_dir = opt.output:match("^(.*)/[^/]*$") or "."
if fs.is_dir(opt.output) then die(("--output=%s is a directory; name the .onnx file"):format(opt.output)) end
if out_dir ~= "" and not fs.is_dir(out_dir) then
  die(("--output=%s: directory %s does not exist"):format(opt.output, out_dir))
end
-- the model's own head, as the tensors say; the one asked for must be there
local ok, src = pcall(imp.locate, opt.model)
if not ok then die(tostring(src)) end
local HAS = { qa = "qa", classification = "cls", pretraining = "mlm", model = "none" }
local own, num_labels = imp.head_of(src)
local head = opt.head == "auto" and HAS[own] or opt.head
if not onnx.HEADS[head] then die(("--head must be auto, qa, cls, mlm or none, got %s"):format(opt.head)) end
if head ~= "none" and HAS[own] ~= head then
  die(("--head=%s needs the %s head's weights, but %s holds a %s model (--head=%s or none exports it)"):format(head,
    head, opt.model, own, HAS[own]))
end

local model = pretrained.from_pretrained(opt.model, { head = onnx.HEADS[head], num_labels = num_labels, quiet = true,
  config = src.config })
model:eval()
if opt.seq_length == 0 then opt.seq_length = math.min(128, model.cfg.max_position_embeddings) end
if not opt.dynamic_seq then ft.seq_length("export_onnx", model.cfg, opt.seq_length, "--seq-length") end
local shape = { batch = opt.dynamic_batch and "batch_size" or opt.batch,
  seq = opt.dynamic_seq and "sequence_length" or opt.seq_length }
local ok2, res = pcall(onnx.export, model, opt.output, { head = head, precision = opt.precision, batch = shape.batch,
  seq = shape.seq })
if not ok2 then die(tostring(res):gsub("^onnx: ", "")) end
print(("export_onnx: wrote %s (%s, head %s, %s; input [%s, %s]; %d nodes, %d initializers, %.1f MB)"):format(
  opt.output, tostring(model), head, opt.precision, tostring(shape.batch), tostring(shape.seq), res.nodes,
  res.initializers, res.bytes / 2 ^ 20))
