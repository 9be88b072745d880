-- bertlua.io.import: models from the checkpoints users already have.
--
--   local imp = require "bertlua.io.import"
--   local src = imp.locate("uncased_L-12_H-768_A-12")   -- {format, weights, config, vocab}
--   local model = imp.from_pretrained("bert_large_qa.pt", { head = "qa", config = "bert_config.json" })
--   imp.load_into(model, "model.ckpt-2000")              -- weights only, any format
--   for name, t in imp.tensors("pytorch_model.bin") do ... end   -- raw file names and tensors
--
-- Formats (read in C, src/io: no Python at run time):
--   safetensors  DIR/model.safetensors (Hugging Face names)
--   TensorFlow   PREFIX.index + PREFIX.data-*-of-* (Google's bert_model.ckpt), next to bert_config.json;
--                names like bert/encoder/layer_0/attention/self/query/kernel (kernels stored [in, out]
--                are transposed), cls/squad/output_weights (SQuAD head), output_weights (classifier head);
--                optimizer slots (adam_m, adam_v, global_step...) are skipped with a count
--   PyTorch      torch.save zip files: transformers' pytorch_model.bin, NVIDIA's .pt ({"model": state_dict},
--                "module." prefixes, "dense_act" layers); other top-level entries (optimizer...) are skipped
-- A directory is searched in that order; config.json or bert_config.json is the model's configuration.
-- Names are mapped onto Hugging Face names and then loaded by bertlua.io.safetensors.load_model, which
-- checks every shape against the model and lists the tensors it cannot place.
local core = require "bertlua.core"
local bl = require "bertlua.tensor"
local C, ffi, check = core.C, core.ffi, core.check

local M = {}

local ST = { f32 = "F32", f64 = "F64", f16 = "F16", bf16 = "BF16", i32 = "I32", i64 = "I64", u8 = "U8", bool = "BOOL" }

local fs = require "bertlua.util.fs"
local is_dir, is_file = fs.is_dir, fs.readable
local function ls(dir) return fs.list_dir(dir, nil, "all") end
local function dirname(p) return p:match("^(.*)/[^/]*$") or "." end

-- C readers ----------------------------------------------------------------------------------
local ckpt_out = ffi.typeof("bl_ckpt*[1]")
local i32box, i64shape = ffi.typeof("int[1]"), ffi.typeof("int64_t[8]")

-- open(format, path) -> reader { path, what, list = { {name, dtype, shape, index} ... } }
function M.open(format, path)
  local out = ckpt_out()
  if format == "tf" and not path:match("%.index$") then path = path .. ".index" end  -- as the C reader names it
  if format == "tf" then check(C.bl_ckpt_open_tf(path, out))
  elseif format == "torch" then check(C.bl_ckpt_open_torch(path, out))
  else error("import.open: unknown format '" .. tostring(format) .. "'", 2) end
  local h = ffi.gc(out[0], C.bl_ckpt_close)
  local r = { handle = h, path = path, what = format == "tf" and "tf checkpoint" or "torch checkpoint", list = {} }
  local name, dt, nd, shape = ffi.new("const char*[1]"), i32box(), i32box(), i64shape()
  for i = 0, tonumber(C.bl_ckpt_count(h)) - 1 do
    check(C.bl_ckpt_entry(h, i, name, dt, nd, shape))
    local sh = {}
    for d = 0, nd[0] - 1 do sh[d + 1] = tonumber(shape[d]) end
    r.list[#r.list + 1] = { name = ffi.string(name[0]),
      dtype = dt[0] >= 0 and ffi.string(C.bl_dtype_name(dt[0])) or nil,
      dtype_id = dt[0], source_dtype = ffi.string(C.bl_ckpt_source_dtype(h, i)), shape = sh, index = i }
  end
  return r
end

-- read(reader, entry) -> tensor in the file's dtype and shape
function M.read(r, e)
  if not e.dtype then
    error(("%s: %s: tensor '%s': dtype %s is not supported"):format(r.what, r.path, e.name, e.source_dtype), 0)
  end
  local t = bl.empty(e.shape, { dtype = e.dtype })
  check(C.bl_ckpt_read(r.handle, e.index, t.data_, t:numel() * C.bl_dtype_size(e.dtype_id)))
  return t
end

-- name mapping -------------------------------------------------------------------------------
-- TF variables that are optimizer state, not weights
local TF_SKIP = { "/adam_m$", "/adam_v$", "^global_step$", "AdamWeightDecayOptimizer", "/Momentum$", "/LAMB",
  "^_CHECKPOINTABLE_OBJECT_GRAPH$", "^loss_scale", "^good_steps$", "^current_loss_scale$" }
local TF_HEADS = {
  ["cls/predictions/output_bias"] = "cls.predictions.bias",
  ["cls/seq_relationship/output_weights"] = "cls.seq_relationship.weight",
  ["cls/seq_relationship/output_bias"] = "cls.seq_relationship.bias",
  ["cls/squad/output_weights"] = "qa_outputs.weight", ["cls/squad/output_bias"] = "qa_outputs.bias",
  ["output_weights"] = "classifier.weight", ["output_bias"] = "classifier.bias",
}

-- Google's variable name -> Hugging Face name, transposed?
function M.tf_name(name)
  if TF_HEADS[name] then return TF_HEADS[name], false end
  local n = name:gsub("/", "."):gsub("%.layer_(%d+)%.", ".layer.%1.")
  local transpose = n:match("%.kernel$") ~= nil
  n = n:gsub("%.kernel$", ".weight"):gsub("%.gamma$", ".weight"):gsub("%.beta$", ".bias")
  if n:match("_embeddings$") then n = n .. ".weight" end
  return n, transpose
end

local function matches_any(name, pats)
  for _, p in ipairs(pats) do if name:match(p) then return true end end
  return false
end

-- torch: the state dict inside a saved object. NVIDIA saves {"model": sd, "optimizer": ..., ...} and
-- DistributedDataParallel adds "module."; NVIDIA's modeling.py names fused Linear+activation "dense_act".
-- Returns { {hf = name, entry = e} ... } and how many tensors outside the state dict were skipped.
function M.torch_names(list)
  local keep, skipped, prefix = list, 0, ""
  for _, w in ipairs({ "model.", "state_dict.", "model_state_dict." }) do
    local inside = {}
    for _, e in ipairs(list) do
      if e.name:sub(1, #w) == w then inside[#inside + 1] = e end
    end
    if #inside > 0 then
      keep, skipped, prefix = inside, #list - #inside, w
      break
    end
  end
  local out = {}
  for _, e in ipairs(keep) do
    local n = e.name:sub(#prefix + 1):gsub("^module%.", ""):gsub("%.dense_act%.", ".dense.")
    out[#out + 1] = { hf = n, entry = e }
  end
  return out, skipped
end

-- source(format, path[, opts]) -> an info table bertlua.safetensors.load_model accepts
-- ({path, what, names, tensors, read}); opts.quiet: no note about skipped tensors.
function M.source(format, path, opts)
  opts = opts or {}
  local r = M.open(format, path)
  local info = { path = r.path, what = r.what, names = {}, tensors = {}, skipped = 0 }
  local function add(hf, e, transpose)
    if info.tensors[hf] then
      error(("%s: %s: tensors '%s' and '%s' both map to %s"):format(r.what, r.path, info.tensors[hf].name, e.name,
        hf), 0)
    end
    local shape = e.shape
    if transpose then
      if #shape ~= 2 then error(("%s: %s: tensor '%s': a kernel must be 2-d, got [%s]"):format(r.what, r.path,
        e.name, table.concat(shape, ",")), 0) end
      shape = { shape[2], shape[1] }
    end
    -- entries of dtypes bertlua lacks keep the file's name so the unmatched-tensor error can list them
    info.tensors[hf] = { name = e.name, dtype = ST[e.dtype] or e.source_dtype, shape = shape, entry = e,
      transpose = transpose }
    info.names[#info.names + 1] = hf
  end
  if format == "tf" then
    for _, e in ipairs(r.list) do
      if matches_any(e.name, TF_SKIP) then info.skipped = info.skipped + 1
      else add(select(1, M.tf_name(e.name)), e, select(2, M.tf_name(e.name))) end
    end
  else
    local list, skipped = M.torch_names(r.list)
    info.skipped = skipped
    for _, m in ipairs(list) do add(m.hf, m.entry, false) end
  end
  table.sort(info.names)
  -- read(e[, dst]): a tensor in the model's layout, or nil after reading straight into dst (same dtype, no
  -- transpose, contiguous on the CPU: one read, no copy)
  info.read = function(te, dst)
    local e = te.entry
    if dst and not te.transpose and e.dtype == dst:dtype() and dst:is_contiguous() and dst:device() == "cpu" then
      check(C.bl_ckpt_read(r.handle, e.index, dst.data_, dst:numel() * C.bl_dtype_size(e.dtype_id)))
      return nil
    end
    local t = M.read(r, e)
    if te.transpose and dst then
      dst:copy_(t:transpose(1, 2))
      return nil
    end
    if te.transpose then t = t:transpose(1, 2):contiguous() end
    return t
  end
  if info.skipped > 0 and not opts.quiet then
    io.stderr:write(("note: %s: skipped %d tensor(s) that are not model weights (optimizer state%s)\n"):format(
      path, info.skipped, format == "tf" and ": adam_m, adam_v, global_step..." or " and the like"))
  end
  return info
end

-- locating a model ---------------------------------------------------------------------------
local function zip_magic(p)
  if not is_file(p) then return false end  -- a FIFO would block the open
  local f = io.open(p, "rb")
  if not f then return false end
  local m = f:read(4)
  f:close()
  return m == "PK\3\4"
end

local function weights_at(path)
  if is_dir(path) then return nil end
  if path:match("%.safetensors$") and is_file(path) then return "safetensors", path end
  if path:match("%.index$") and is_file(path) then return "tf", path:sub(1, -7) end
  if is_file(path .. ".index") then return "tf", path end
  if is_file(path) and (zip_magic(path) or path:match("%.bin$") or path:match("%.pth?$")) then return "torch", path end
  return nil
end

local function in_dir(dir)
  if is_file(dir .. "/model.safetensors") then return "safetensors", dir .. "/model.safetensors" end
  if is_file(dir .. "/pytorch_model.bin") then return "torch", dir .. "/pytorch_model.bin" end
  -- tf.train.Saver's "checkpoint" file names the newest of several
  local newest = (fs.read(dir .. "/checkpoint", "checkpoint list") or ""):match('model_checkpoint_path:%s*"([^"]+)"')
  if newest then
    local p = newest:sub(1, 1) == "/" and newest or dir .. "/" .. newest
    if is_file(p .. ".index") then return "tf", p end
  end
  local tf, pt = {}, {}
  for _, name in ipairs(ls(dir)) do
    if name:match("%.index$") then tf[#tf + 1] = name:sub(1, -7)
    elseif name:match("%.pth?$") or name:match("%.bin$") then pt[#pt + 1] = name end
  end
  for _, set in ipairs({ { "tf", tf }, { "torch", pt } }) do
    if #set[2] == 1 then return set[1], dir .. "/" .. set[2][1] end
    if #set[2] > 1 then
      error(("import: %s holds several checkpoints (%s): name one, e.g. %s/%s"):format(dir,
        table.concat(set[2], ", "), dir, set[2][#set[2]]), 0)
    end
  end
  return nil
end

-- locate(path[, config]) -> { format = "safetensors"|"tf"|"torch", weights, config, vocab }.
-- path: a model directory, a TF checkpoint prefix (or its .index), a .bin/.pt/.safetensors file.
-- config: a config.json / bert_config.json to use instead of the one next to the weights.
function M.locate(path, config)
  if type(path) ~= "string" or path == "" then error("import: no model path given", 2) end
  path = path:gsub("(.)/+$", "%1")
  local isdir = is_dir(path)
  local dir = isdir and path or dirname(path)
  local format, weights
  if isdir then format, weights = in_dir(path) else format, weights = weights_at(path) end
  if not isdir and not format then
    if not is_file(path) then error(("model directory %s does not exist"):format(path), 0) end
    error(("%s is not a checkpoint bertlua reads (model.safetensors, pytorch_model.bin, a .pt/.bin torch.save "
      .. "file, a TensorFlow PREFIX.index)"):format(path), 0)
  end
  if not config then
    for _, c in ipairs({ "config.json", "bert_config.json" }) do
      if is_file(dir .. "/" .. c) then config = dir .. "/" .. c break end
    end
  end
  if not config then
    error(("%s is not a model directory: no config.json (or bert_config.json)%s"):format(dir,
      weights and " next to " .. weights or ""), 0)
  end
  if not format then
    error(("%s is not a model directory: no weights (model.safetensors, pytorch_model.bin, a TensorFlow "
      .. "checkpoint PREFIX.index + PREFIX.data-*, or a .pt/.bin torch.save file)"):format(path), 0)
  end
  local vocab = is_file(dir .. "/vocab.txt") and dir .. "/vocab.txt" or nil
  return { format = format, weights = weights, config = config, vocab = vocab }
end

-- weights(src) -> what safetensors.load_model takes: a safetensors path or a converted source
function M.weights(src, opts)
  if src.format == "safetensors" then return src.weights end
  return M.source(src.format, src.weights, opts)
end

-- head_of(src) -> "qa" | "classification" | "pretraining" | "model", num_labels: from the tensors present
function M.head_of(src)
  if src.format == "safetensors" then
    src.info = src.info or require("bertlua.io.safetensors").read_header(src.weights)
  else
    src.info = src.info or M.source(src.format, src.weights, { quiet = true })
  end
  local has = {}
  for _, n in ipairs(src.info.names) do has[n] = src.info.tensors[n] end
  if has["qa_outputs.weight"] then return "qa" end
  if has["classifier.weight"] then return "classification", has["classifier.weight"].shape[1] end
  if has["cls.predictions.bias"] or has["cls.predictions.transform.dense.weight"] then return "pretraining" end
  return "model"
end

-- load_into(model, path[, opts]): weights from any format into an existing model (strict by default;
-- opts as safetensors.load_model: allow_missing, allow_unexpected, quiet).
function M.load_into(model, path, opts)
  local src = M.locate(path, opts and opts.config)
  return require("bertlua.io.safetensors").load_model(model, M.weights(src, opts), opts)
end

return M
