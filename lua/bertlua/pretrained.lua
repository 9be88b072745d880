-- bertlua.pretrained: model directories in and out. from_pretrained builds a model from its config and reads
-- its weights in any format bertlua.io.import knows (safetensors, pytorch_model.bin, NVIDIA's .pt, Google's
-- TensorFlow checkpoints); save_pretrained writes a Hugging Face directory. It sits above the model
-- (bertlua.bert) and the file formats (bertlua.io), so neither of those needs the other.
--   local pretrained = require "bertlua.pretrained"
--   local model = pretrained.from_pretrained("models/bert-base-uncased", { head = "qa" })
--   pretrained.save_pretrained(model, "out/model", { vocab = "vocab.txt" })
local bert = require "bertlua.bert"
local config = require "bertlua.bert.config"
local st = require "bertlua.io.safetensors"
local imp = require "bertlua.io.import"
local fs = require "bertlua.util.fs"
local global_norm = require("bertlua.train.optim").global_norm

local M = {}

-- save_pretrained(model, dir[, opts]): dir/config.json (+ "architectures"),
-- dir/model.safetensors, dir/vocab.txt (copied from opts.vocab when given).
function M.save_pretrained(model, dir, opts)
  opts = opts or {}
  local made, why = pcall(fs.mkdir_p, dir)
  if not made then error("save_pretrained: cannot create directory " .. dir .. " (" .. tostring(why) .. ")", 0) end
  local cfg = {}
  for k, v in pairs(model.cfg or {}) do cfg[k] = v end
  local arch = tostring(model)
  cfg.architectures = { arch }
  cfg.model_type = "bert"
  cfg.torch_dtype = ({ F16 = "float16", BF16 = "bfloat16" })[(opts.dtype or "F32"):upper()] or "float32"
  if model.num_labels then cfg.num_labels = model.num_labels end
  if opts.config then for k, v in pairs(opts.config) do cfg[k] = v end end
  config.save(cfg, dir .. "/config.json")
  st.save_model(model, dir .. "/model.safetensors", opts)
  if opts.vocab then fs.copy(opts.vocab, dir .. "/vocab.txt", "save_pretrained") end
  return dir
end

-- from_pretrained(dir[, opts]) -> model, cfg.
-- dir: a model directory, or any checkpoint bertlua.import reads (pytorch_model.bin, a TensorFlow
-- checkpoint with bert_config.json, NVIDIA's .pt; a directory holding one, or its file/prefix).
-- opts.head: "pretraining", "qa", "classification", "model" (default: from
-- config.json "architectures", else from the heads the checkpoint holds); opts.num_labels; opts.seed
-- (initialisation of parameters absent from the checkpoint); opts.strict
-- (default false: head parameters may be missing — initialised fresh with
-- a note — and other heads' tensors are ignored, as transformers does; the
-- encoder itself must always be complete); opts.config: a config file to use instead of the one found.
function M.from_pretrained(dir, opts)
  opts = opts or {}
  local src = imp.locate(dir, opts.config)
  local cfg = config.load(src.config)
  local head, num_labels = opts.head, opts.num_labels
  if not head and type(cfg.architectures) == "table" then head = bert.architectures[cfg.architectures[1]] end
  if not head and src.format ~= "safetensors" then
    local n
    head, n = imp.head_of(src)
    num_labels = num_labels or n
  end
  head = head or "pretraining"
  local ctor = bert.heads[head]
  if not ctor then error("from_pretrained: unknown head '" .. tostring(head)
    .. "' (pretraining, qa, classification, model)", 2) end
  local model = ctor(cfg, { seed = opts.seed or 0, num_labels = num_labels })
  local strict = opts.strict
  st.load_model(model, imp.weights(src, { quiet = opts.quiet }), {
    allow_missing = not strict and st.is_head or false,
    allow_unexpected = not strict and st.is_head or false,
    quiet = opts.quiet,
  })
  if src.vocab then model.vocab_path = src.vocab end
  M.check_finite(model, type(src.weights) == "string" and src.weights or dir)
  return model, model.cfg
end

-- check_finite(model, where): an error naming the first weight that holds NaN or an infinity (a corrupt
-- file or a diverged run would otherwise give NaN outputs without a word)
function M.check_finite(model, where)
  local _, bad = global_norm(model.flat_params)
  if not bad then return end
  for _, e in ipairs(model._plist) do
    _, bad = global_norm(model.flat_params:narrow(1, e.offset + 1, e.numel))
    if bad then
      error(("%s: weight %s holds NaN or infinite values (a corrupt file or a diverged run)"):format(where,
        e.name), 0)
    end
  end
end

return M
