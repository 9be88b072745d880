-- bertlua.bert.config: BERT model configurations as Hugging Face `config.json` tables.
--
--   local config = require "bertlua.bert.config"
--   local cfg = config.preset("base")                  -- L12/H768/A12
--   local cfg = config.load("model/config.json")       -- HF file, validated
--   local cfg = config.new{ hidden_size = 64, num_hidden_layers = 2, num_attention_heads = 4 }
--   config.save(cfg, "model/config.json")
--
-- Field names and defaults are those of transformers' BertConfig, so files
-- move both ways. Validation errors name the field and what was wrong.
local cjson = require "cjson"
local fs = require "bertlua.util.fs"

local M = {}

M.defaults = {
  model_type = "bert",
  vocab_size = 30522,
  hidden_size = 768,
  num_hidden_layers = 12,
  num_attention_heads = 12,
  intermediate_size = 3072,
  hidden_act = "gelu",
  hidden_dropout_prob = 0.1,
  attention_probs_dropout_prob = 0.1,
  max_position_embeddings = 512,
  type_vocab_size = 2,
  initializer_range = 0.02,
  layer_norm_eps = 1e-12,
  pad_token_id = 0,
  position_embedding_type = "absolute",
}

-- name -> {layers, hidden, heads}; intermediate = 4 * hidden
local PRESETS = {
  tiny = { 2, 128, 2 }, mini = { 4, 256, 4 }, small = { 4, 512, 8 },
  medium = { 8, 512, 8 }, base = { 12, 768, 12 }, large = { 24, 1024, 16 },
}
M.preset_names = { "tiny", "mini", "small", "medium", "base", "large" }

-- activations the nn library implements (bertlua.nn.activation)
M.activations = { gelu = true, relu = true, tanh = true, gelu_new = true, gelu_pytorch_tanh = true }

local INT_FIELDS = { "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
  "intermediate_size", "max_position_embeddings", "type_vocab_size" }

local function fail(where, msg) error((where or "config") .. ": " .. msg, 0) end

-- the largest value each size field may take: far above any BERT, low enough that a typo (1e9 layers,
-- 1e300, Infinity) is refused before anything is allocated
M.limits = { vocab_size = 2 ^ 24, hidden_size = 65536, num_hidden_layers = 1024, num_attention_heads = 1024,
  intermediate_size = 2 ^ 20, max_position_embeddings = 2 ^ 20, type_vocab_size = 65536 }

-- parameters of the encoder with its embeddings, pooler and a pre-training head
function M.num_parameters(cfg)
  local H, I, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
  local emb = (cfg.vocab_size + cfg.max_position_embeddings + cfg.type_vocab_size + 2) * H
  local layer = 4 * (H * H + H) + 2 * H * I + I + H + 4 * H
  return emb + L * layer + (H * H + H) + (H * H + 3 * H + cfg.vocab_size) + 2 * H + 2
end

-- bytes of memory this machine has available (MemAvailable), or nil where unknown
function M.available_memory()
  local f = io.open("/proc/meminfo", "r")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  local kb = s:match("MemAvailable:%s*(%d+)")
  return kb and tonumber(kb) * 1024 or nil
end

-- validate(cfg[, where]) -> cfg; raises "where: field: problem".
function M.validate(cfg, where)
  if type(cfg) ~= "table" then fail(where, "expected a table, got " .. type(cfg)) end
  for _, k in ipairs(INT_FIELDS) do
    local v = cfg[k]
    if type(v) ~= "number" or v ~= math.floor(v) or v < 1 or v > M.limits[k] then
      fail(where, ("%s must be an integer from 1 to %d, got %s"):format(k, M.limits[k],
        type(v) == "table" and "a list" or tostring(v)))
    end
  end
  if cfg.hidden_size % cfg.num_attention_heads ~= 0 then
    fail(where, ("hidden_size %d is not divisible by num_attention_heads %d"):format(cfg.hidden_size,
      cfg.num_attention_heads))
  end
  for _, k in ipairs({ "hidden_dropout_prob", "attention_probs_dropout_prob" }) do
    local v = cfg[k]
    if type(v) ~= "number" or not (v >= 0 and v < 1) then
      fail(where, ("%s must be in [0, 1), got %s"):format(k, tostring(v)))
    end
  end
  if type(cfg.layer_norm_eps) ~= "number" or not (cfg.layer_norm_eps > 0 and cfg.layer_norm_eps < 1) then
    fail(where, "layer_norm_eps must be a positive number, got " .. tostring(cfg.layer_norm_eps))
  end
  if type(cfg.initializer_range) ~= "number" or not (cfg.initializer_range > 0 and cfg.initializer_range < 1e3) then
    fail(where, "initializer_range must be a positive number, got " .. tostring(cfg.initializer_range))
  end
  if type(cfg.hidden_act) ~= "string" or not M.activations[cfg.hidden_act] then
    local names = {}
    for k in pairs(M.activations) do names[#names + 1] = k end
    table.sort(names)
    fail(where, ("unknown hidden_act '%s' (supported: %s)"):format(tostring(cfg.hidden_act), table.concat(names, ", ")))
  end
  if cfg.position_embedding_type ~= nil and cfg.position_embedding_type ~= "absolute" then
    fail(where, ("position_embedding_type '%s' is not supported (only 'absolute')")
      :format(tostring(cfg.position_embedding_type)))
  end
  if cfg.num_labels ~= nil
    and (type(cfg.num_labels) ~= "number" or not (cfg.num_labels >= 1 and cfg.num_labels <= 2 ^ 20)
      or cfg.num_labels % 1 ~= 0) then
    fail(where, "num_labels must be a positive integer, got " .. tostring(cfg.num_labels))
  end
  -- weights and gradients in f32 at least; refuse what cannot fit before allocating it
  local need, have = 8 * M.num_parameters(cfg), M.available_memory()
  if have and need > have then
    fail(where, ("a model of %.3g parameters needs at least %.1f GB (weights and gradients), this machine has "
      .. "%.1f GB available"):format(M.num_parameters(cfg), need / 2 ^ 30, have / 2 ^ 30))
  end
  return cfg
end

-- new(fields) -> validated config: defaults filled in, intermediate_size = 4*hidden when absent.
function M.new(fields, where)
  fields = fields or {}
  local cfg = {}
  for k, v in pairs(M.defaults) do cfg[k] = v end
  for k, v in pairs(fields) do
    if v == cjson.null then v = nil end
    cfg[k] = v
  end
  if fields.intermediate_size == nil and type(fields.hidden_size) == "number" then
    cfg.intermediate_size = 4 * cfg.hidden_size
  end
  -- HF stores the label count as id2label; keep num_labels in step with it
  if cfg.num_labels == nil and type(cfg.id2label) == "table" then
    local n = 0
    for _ in pairs(cfg.id2label) do n = n + 1 end
    if n > 0 then cfg.num_labels = n end
  end
  return M.validate(cfg, where)
end

-- preset(name[, overrides]) -> config
function M.preset(name, overrides)
  local p = PRESETS[name]
  if not p then
    error(("config: unknown preset '%s' (%s)"):format(tostring(name), table.concat(M.preset_names, ", ")), 2)
  end
  local f = { num_hidden_layers = p[1], hidden_size = p[2], num_attention_heads = p[3], intermediate_size = 4 * p[2] }
  for k, v in pairs(overrides or {}) do f[k] = v end
  return M.new(f, "config preset " .. name)
end
function M.is_preset(name) return PRESETS[name] ~= nil end

function M.load(path)
  local text, err = fs.read(path, "model config")
  if not text then error("config: cannot open " .. path .. " (" .. tostring(err) .. ")", 0) end
  local ok, t = pcall(cjson.decode, text)
  if not ok or type(t) ~= "table" or t[1] ~= nil or next(t) == nil then
    error("config: " .. path .. " is not a JSON object with the model's fields: "
      .. (ok and text:sub(1, 40) or tostring(t)), 0)
  end
  return M.new(t, "config " .. path)
end

-- to_json(cfg): pretty, sorted keys (diff-friendly like transformers' files)
function M.to_json(cfg)
  local keys = {}
  for k in pairs(cfg) do if type(k) == "string" and k:sub(1, 1) ~= "_" then keys[#keys + 1] = k end end
  table.sort(keys)
  local lines = {}
  for _, k in ipairs(keys) do
    local v = cfg[k]
    local s
    if type(v) == "number" and v == math.floor(v) and math.abs(v) < 2 ^ 53 then s = string.format("%d", v)
    elseif type(v) == "number" then s = string.format("%.17g", v)
    else s = cjson.encode(v) end
    lines[#lines + 1] = ("  %s: %s"):format(cjson.encode(k), s)
  end
  return "{\n" .. table.concat(lines, ",\n") .. "\n}\n"
end

function M.save(cfg, path)
  require("bertlua.util.fs").write_atomic(path, M.to_json(cfg))
end

return M
