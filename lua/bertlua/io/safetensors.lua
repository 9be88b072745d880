-- bertlua.io.safetensors: read and write safetensors files (the Hugging Face
-- weight format); model directories are bertlua.pretrained's.
--
--   local st = require "bertlua.io.safetensors"
--   local tensors, meta = st.load("model.safetensors")          -- name -> tensor
--   st.save("out.safetensors", { ["a.weight"] = t }, { dtype = "F16" })
--   st.load_model(model, "model.safetensors")                    -- HF names -> model parameters
--   st.save_model(model, "model.safetensors")
--
-- File format: 8-byte little-endian header length N; N bytes of JSON
-- {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}
-- (padded with spaces to a multiple of 8); then the byte buffer, which the
-- tensors cover exactly (no holes, no overlaps). Every field of a file is
-- checked before any byte is read, and reads are bounds-checked in C
-- (bl_file_read_at), so a truncated or hostile file gives an error naming the
-- file and the tensor, never an out-of-bounds read. Writes go to a temporary
-- file that is fsynced and renamed into place by the checked atomic writer
-- (bl_writer, src/bl_stream.h), as every file the project writes.
--
-- Tensor names follow transformers' BERT: "bert.embeddings.word_embeddings.weight",
-- "cls.predictions.transform.dense.weight", "qa_outputs.weight"... Loading also
-- accepts checkpoints of a bare BertModel (no "bert." prefix), old
-- LayerNorm "gamma"/"beta" names, and the tied "cls.predictions.decoder.weight"
-- (transformers omits it from safetensors because it is the word-embedding
-- matrix; we omit it too unless save{tied_decoder=true}).
local core = require "bertlua.core"
local bl = require "bertlua.tensor"
local cjson = require "cjson"
local C, ffi, check = core.C, core.ffi, core.check

local M = {}
M.MAX_HEADER = 100 * 1024 * 1024

-- safetensors dtype -> {bertlua dtype, bytes}; the rest of the spec's dtypes are named for clearer errors
local DTYPES = {
  F64 = { "f64", 8 }, F32 = { "f32", 4 }, F16 = { "f16", 2 }, BF16 = { "bf16", 2 },
  I64 = { "i64", 8 }, I32 = { "i32", 4 }, U8 = { "u8", 1 }, BOOL = { "bool", 1 },
}
local SPEC_ONLY = { I8 = 1, I16 = 2, U16 = 2, U32 = 4, U64 = 8, F8_E4M3 = 1, F8_E5M2 = 1, F8_E8M0 = 1,
  F6_E2M3 = 1, F6_E3M2 = 1, F4 = 1, C64 = 8 }
local TO_ST = { f64 = "F64", f32 = "F32", f16 = "F16", bf16 = "BF16", i64 = "I64", i32 = "I32", u8 = "U8",
  bool = "BOOL" }
M.dtypes = DTYPES

local file_out = ffi.typeof("bl_file*[1]")
local i64box = ffi.typeof("int64_t[1]")

local function open_read(path)
  local out = file_out()
  check(C.bl_file_open_read(path, out))
  return ffi.gc(out[0], C.bl_file_close)
end
local function close(f)
  ffi.gc(f, nil)
  C.bl_file_close(f)
end

local function ferr(path, msg) error("safetensors: " .. path .. ": " .. msg, 0) end
local function terr(path, name, msg, what)
  error(("%s: %s: tensor '%s': %s"):format(what or "safetensors", path, name, msg), 0)
end

local function is_int(v) return type(v) == "number" and v == math.floor(v) and v >= 0 and v < 2 ^ 53 end

-- read_header(path) -> { path, tensors = {name -> {dtype, shape, begin, end, nbytes}},
-- names (sorted), metadata, data_start, file_size }; raises on any inconsistency.
function M.read_header(path)
  local f = open_read(path)
  local ok, res = pcall(function()
    local size = i64box()
    check(C.bl_file_size(f, size))
    local fsize = tonumber(size[0])
    if fsize < 8 then
      ferr(path, ("file is truncated: %d bytes, shorter than the 8-byte header length"):format(fsize))
    end
    local lenbuf = ffi.new("uint8_t[8]")
    check(C.bl_file_read_at(f, 0, lenbuf, 8))
    local n = 0
    for i = 7, 0, -1 do n = n * 256 + lenbuf[i] end
    if n > M.MAX_HEADER then
      ferr(path, ("header length %.0f is absurd (limit %d bytes): not a safetensors file?"):format(n, M.MAX_HEADER))
    end
    if 8 + n > fsize then
      ferr(path, ("header length %d goes beyond the end of the file (%d bytes): truncated file?"):format(n, fsize))
    end
    if n < 2 then ferr(path, ("header length %d is too small for a JSON object"):format(n)) end
    local hbuf = ffi.new("char[?]", n)
    check(C.bl_file_read_at(f, 8, hbuf, n))
    local text = ffi.string(hbuf, n)
    local okj, h = pcall(cjson.decode, text)
    if not okj then ferr(path, "header is not valid JSON: " .. tostring(h)) end
    if type(h) ~= "table" or text:match("^%s*%[") then ferr(path, "header must be a JSON object") end
    local buflen = fsize - 8 - n
    local info = { path = path, tensors = {}, names = {}, metadata = {}, data_start = 8 + n, file_size = fsize,
      buffer_size = buflen }
    local spans = {}
    for name, e in pairs(h) do
      if type(name) ~= "string" then ferr(path, "header keys must be strings") end
      if name == "__metadata__" then
        if type(e) ~= "table" then ferr(path, "__metadata__ must be an object of strings") end
        for k, v in pairs(e) do
          if type(k) ~= "string" or type(v) ~= "string" then ferr(path, "__metadata__ must map strings to strings") end
          info.metadata[k] = v
        end
      else
        if type(e) ~= "table" then terr(path, name, "entry must be an object with dtype, shape, data_offsets") end
        local dt = e.dtype
        if type(dt) ~= "string" then terr(path, name, "missing or non-string dtype") end
        local d = DTYPES[dt]
        if not d then
          if SPEC_ONLY[dt] then terr(path, name,
            "dtype " .. dt .. " is not supported (F32, F16, BF16, F64, I64, I32, U8, BOOL)") end
          terr(path, name, "unknown dtype '" .. dt .. "'")
        end
        local shape = e.shape
        if type(shape) ~= "table" then terr(path, name, "missing shape") end
        if #shape > 8 then terr(path, name, "shape has " .. #shape .. " dims (at most 8)") end
        local numel = 1
        for i = 1, #shape do
          if not is_int(shape[i]) then terr(path, name, "shape entries must be non-negative integers") end
          numel = numel * shape[i]
        end
        for k in pairs(shape) do
          if type(k) ~= "number" or k < 1 or k > #shape then terr(path, name, "shape must be a JSON array") end
        end
        local off = e.data_offsets
        if type(off) ~= "table" or #off ~= 2 or not is_int(off[1]) or not is_int(off[2]) then
          terr(path, name, "data_offsets must be [begin, end] with non-negative integers")
        end
        local b, en = off[1], off[2]
        if b > en then terr(path, name, ("data_offsets [%d, %d] are reversed"):format(b, en)) end
        if en > buflen then
          terr(path, name, ("data_offsets [%d, %d] go beyond the data buffer (%d bytes): truncated file?"):format(b, en,
            buflen))
        end
        if en - b ~= numel * d[2] then
          terr(path, name, ("shape [%s] x %s needs %.0f bytes but data_offsets [%d, %d] hold %d"):format(
            table.concat(shape, ","), dt, numel * d[2], b, en, en - b))
        end
        local sh = {}
        for i = 1, #shape do sh[i] = shape[i] end
        info.tensors[name] = { name = name, dtype = dt, bl_dtype = d[1], shape = sh, begin = b, ["end"] = en,
          nbytes = en - b, numel = numel }
        info.names[#info.names + 1] = name
        spans[#spans + 1] = info.tensors[name]
      end
    end
    table.sort(info.names)
    -- the buffer must be covered exactly: sorted spans touch end to begin
    table.sort(spans, function(a, b2)
      if a.begin ~= b2.begin then return a.begin < b2.begin end
      return a.name < b2.name
    end)
    local pos, prev = 0, nil
    for _, s in ipairs(spans) do
      if s.begin < pos then
        terr(path, s.name, ("data_offsets [%d, %d] overlap tensor '%s' (ends at %d)"):format(s.begin, s["end"],
          prev.name, pos))
      elseif s.begin > pos then
        terr(path, s.name, ("bytes [%d, %d) before it belong to no tensor (hole in the data buffer)"):format(pos,
          s.begin))
      end
      pos, prev = s["end"], s
    end
    if pos ~= buflen then
      ferr(path, ("the data buffer has %d bytes but the tensors cover only %d (trailing bytes)"):format(buflen, pos))
    end
    return info
  end)
  close(f)
  if not ok then error(res, 0) end
  return res
end

-- read one tensor's bytes into a new tensor of its stored dtype
local function read_tensor(f, info, e)
  local t = bl.empty(e.shape, { dtype = e.bl_dtype })
  if e.nbytes > 0 then
    local ok, err = pcall(check, C.bl_file_read_at(f, info.data_start + e.begin, t.data_, e.nbytes))
    if not ok then terr(info.path, e.name, tostring(err)) end
  end
  return t
end

-- load(path[, opts]) -> tensors {name -> tensor}, metadata, info.
-- opts.dtype = "f32": float tensors converted to f32 (integers kept).
-- opts.names: only these names (error when one is missing).
function M.load(path, opts)
  opts = opts or {}
  local info = M.read_header(path)
  local f = open_read(path)
  local out = {}
  local ok, err = pcall(function()
    local names = opts.names or info.names
    for _, name in ipairs(names) do
      local e = info.tensors[name]
      if not e then ferr(path, "no tensor named '" .. name .. "'") end
      local t = read_tensor(f, info, e)
      if opts.dtype and bl.dtype_of(e.bl_dtype) <= 3 and e.bl_dtype ~= opts.dtype then t = t:to(opts.dtype) end
      out[name] = t
    end
  end)
  close(f)
  if not ok then error(err, 0) end
  return out, info.metadata, info
end

local function json_header(entries, metadata)
  local parts = {}
  local mk = {}
  for k in pairs(metadata or {}) do mk[#mk + 1] = k end
  table.sort(mk)
  if #mk > 0 then
    local m = {}
    for _, k in ipairs(mk) do m[#m + 1] = cjson.encode(k) .. ":" .. cjson.encode(tostring(metadata[k])) end
    parts[#parts + 1] = '"__metadata__":{' .. table.concat(m, ",") .. "}"
  end
  local sorted = {}
  for i, e in ipairs(entries) do sorted[i] = e end
  table.sort(sorted, function(a, b) return a.name < b.name end)
  for _, e in ipairs(sorted) do
    local sh = {}
    for i, s in ipairs(e.shape) do sh[i] = string.format("%d", s) end
    parts[#parts + 1] = ('%s:{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]}'):format(
      cjson.encode(e.name), e.dtype, table.concat(sh, ","), e.begin, e["end"])
  end
  local text = "{" .. table.concat(parts, ",") .. "}"
  local pad = (8 - #text % 8) % 8
  return text .. string.rep(" ", pad)
end

-- save(path, tensors[, opts]): tensors is {name -> tensor} or a list of {name, tensor}.
-- opts.dtype ("F32", "F16", "BF16", "F64"): float tensors stored in that dtype.
-- opts.metadata: string map (default {format = "pt"}, what transformers expects).
function M.save(path, tensors, opts)
  opts = opts or {}
  local list = {}
  if tensors[1] ~= nil then
    for _, p in ipairs(tensors) do list[#list + 1] = { name = p[1] or p.name, tensor = p[2] or p.tensor } end
  else
    for k, v in pairs(tensors) do list[#list + 1] = { name = k, tensor = v } end
    table.sort(list, function(a, b) return a.name < b.name end)
  end
  local want = opts.dtype and tostring(opts.dtype):upper()
  if want and not DTYPES[want] then error("safetensors.save: unknown dtype '" .. tostring(opts.dtype) .. "'", 2) end
  local seen = {}
  local entries, off = {}, 0
  for _, it in ipairs(list) do
    local t = it.tensor
    if type(it.name) ~= "string" or it.name == "" or it.name == "__metadata__" then
      error("safetensors.save: bad tensor name " .. tostring(it.name), 2)
    end
    if seen[it.name] then error("safetensors.save: tensor name '" .. it.name .. "' given twice", 2) end
    seen[it.name] = true
    if not bl.is_tensor(t) then error("safetensors.save: '" .. it.name .. "' is not a tensor", 2) end
    local dt = TO_ST[t:dtype()]
    if want and bl.dtype_of(t:dtype()) <= 3 then dt = want end
    if t:device() ~= "cpu" or t:dtype() ~= DTYPES[dt][1] or not t:is_contiguous() then
      t = t:to({ dtype = DTYPES[dt][1], device = "cpu" }):contiguous()
    end
    local nb = t:numel() * DTYPES[dt][2]
    entries[#entries + 1] = { name = it.name, dtype = dt, shape = t:shape(), begin = off, ["end"] = off + nb,
      tensor = t }
    off = off + nb
  end
  local header = json_header(entries, opts.metadata or { format = "pt" })
  local out = ffi.new("bl_writer*[1]")
  check(C.bl_writer_open(path, out))
  local f = out[0]
  local ok, err = pcall(function()
    local lb = ffi.new("uint8_t[8]")
    local n = #header
    for i = 0, 7 do lb[i] = n % 256; n = math.floor(n / 256) end
    check(C.bl_writer_write(f, lb, 8))
    check(C.bl_writer_write(f, header, #header))
    for _, e in ipairs(entries) do
      if e["end"] > e.begin then check(C.bl_writer_write(f, e.tensor.data_, e["end"] - e.begin)) end
    end
  end)
  if not ok then
    C.bl_writer_abort(f)
    error("safetensors.save: " .. path .. ": " .. tostring(err), 0)  -- an I/O failure (full disk): one line
  end
  check(C.bl_writer_commit(f))
  return path
end

-- model <-> file names ------------------------------------------------------------
local HEAD_PATTERNS = { "^cls%.", "^qa_outputs%.", "^classifier%.", "^bert%.pooler%.", "^pooler%." }
local function is_head(name)
  for _, p in ipairs(HEAD_PATTERNS) do if name:match(p) then return true end end
  return false
end
M.is_head = is_head

local function matcher(spec)
  if spec == true then return function() return true end end
  if not spec then return function() return false end end
  if type(spec) == "function" then return spec end
  if type(spec) == "string" then spec = { spec } end
  return function(name)
    for _, p in ipairs(spec) do if name:match(p) then return true end end
    return false
  end
end

local function canonical(name)
  name = name:gsub("LayerNorm%.gamma$", "LayerNorm.weight"):gsub("LayerNorm%.beta$", "LayerNorm.bias")
  return name
end

-- map file tensor names onto the model's parameter names.
-- Returns map {model_name -> file entry}, unexpected list, ignored notes.
local function map_names(model_names, info)
  local has_prefix_model = false
  for n in pairs(model_names) do if n:sub(1, 5) == "bert." then has_prefix_model = true break end end
  local has_prefix_file = false
  for _, n in ipairs(info.names) do if n:sub(1, 5) == "bert." then has_prefix_file = true break end end
  local map, unexpected, notes = {}, {}, {}
  local decoder_w, decoder_b
  for _, fname in ipairs(info.names) do
    local n = canonical(fname)
    if has_prefix_model and not has_prefix_file
      and (n:match("^embeddings%.") or n:match("^encoder%.") or n:match("^pooler%.")) then
      n = "bert." .. n
    elseif not has_prefix_model and has_prefix_file and n:sub(1, 5) == "bert." then
      n = n:sub(6)
    end
    if n:match("position_ids$") then
      notes[#notes + 1] = fname .. " (a buffer, not a parameter)"
    elseif n == "cls.predictions.decoder.weight" and model_names["cls.predictions.bias"] then
      decoder_w = info.tensors[fname]
    elseif n == "cls.predictions.decoder.bias" and model_names["cls.predictions.bias"] then
      decoder_b = info.tensors[fname]
    elseif model_names[n] then
      if map[n] then error(("safetensors: %s: tensors '%s' and '%s' both map to parameter %s"):format(info.path,
        map[n].name, fname, n), 0) end
      map[n] = info.tensors[fname]
    else
      unexpected[#unexpected + 1] = fname
    end
  end
  local we = has_prefix_model and "bert.embeddings.word_embeddings.weight" or "embeddings.word_embeddings.weight"
  if decoder_w then
    -- tied: the word embeddings are the decoder; use the decoder copy only when they are absent
    if not map[we] then map[we] = decoder_w else notes[#notes + 1] = decoder_w.name .. " (tied to " .. we .. ")" end
  end
  if decoder_b then
    if not map["cls.predictions.bias"] then map["cls.predictions.bias"] = decoder_b
    else notes[#notes + 1] = decoder_b.name .. " (same as cls.predictions.bias)" end
  end
  return map, unexpected, notes
end

-- Vocabulary rows are padded past vocab_size in NVIDIA's checkpoints (30522 -> 30528, a multiple of 8
-- for the GEMMs); any padding up to the next multiple of 128 is accepted.
local function is_vocab_rows(name)
  return name:match("word_embeddings%.weight$") ~= nil or name == "cls.predictions.bias"
end

-- vocab_padding(name, file shape, model shape) -> rows the file has beyond the vocabulary, or nil
local function vocab_padding(name, fshape, mshape)
  if not is_vocab_rows(name) or #fshape ~= #mshape or fshape[1] <= mshape[1] then return nil end
  for i = 2, #mshape do if fshape[i] ~= mshape[i] then return nil end end
  if fshape[1] > math.ceil(mshape[1] / 128) * 128 then return nil end
  return fshape[1] - mshape[1]
end

-- load_model(model, path[, opts]): copy the file's tensors into the model's
-- parameters (converted to f32). Strict by default: every parameter must be
-- in the file and every file tensor must be used. opts.allow_missing /
-- opts.allow_unexpected: true, a Lua pattern or list of patterns, or a
-- function(name); allowed missing parameters keep their initial values
-- (printed note, as transformers does). opts.quiet suppresses notes.
-- path may also be a source from bertlua.import (another checkpoint format).
-- Returns { loaded = n, missing = {...}, unexpected = {...} }.
function M.load_model(model, path, opts)
  opts = opts or {}
  local params = model:parameters()
  local by_name = {}
  for _, p in ipairs(params) do by_name[p.name] = p end
  local info = type(path) == "table" and path or M.read_header(path)
  path = info.path
  local what = info.what or "safetensors"
  local map, unexpected, notes = map_names(by_name, info)
  local allow_missing, allow_unexpected = matcher(opts.allow_missing), matcher(opts.allow_unexpected)
  local missing = {}
  for _, p in ipairs(params) do
    if not map[p.name] then
      if not allow_missing(p.name) then
        error(("%s: %s: tensor '%s' is missing (the model needs it; pass allow_missing to initialise it fresh)")
          :format(what, path, p.name), 0)
      end
      missing[#missing + 1] = p.name
    end
  end
  local refused = {}
  for _, n in ipairs(unexpected) do
    local orig = info.tensors[n] and info.tensors[n].name  -- another format's own name, when it differs
    if not allow_unexpected(n) then refused[#refused + 1] = (orig and orig ~= n) and (orig .. " (" .. n .. ")") or n end
  end
  if #refused == 1 then
    error(("%s: %s: tensor '%s' is not a parameter of this model (pass allow_unexpected to ignore it)"):format(what,
      path, refused[1]), 0)
  elseif #refused > 1 then
    error(("%s: %s: %d tensors are not parameters of this model (pass allow_unexpected to ignore them): %s"):format(
      what, path, #refused, table.concat(refused, ", ")), 0)
  end
  -- check every shape before writing anything: a failed load leaves the model as it was
  local trim = {}  -- parameter name -> rows of vocabulary padding in the file, dropped on load
  for _, p in ipairs(params) do
    local e = map[p.name]
    if e then
      local ps = p.param:shape()
      local same = #ps == #e.shape
      for i = 1, #ps do if ps[i] ~= e.shape[i] then same = false end end
      trim[p.name] = not same and vocab_padding(p.name, e.shape, ps) or nil
      if not same and not trim[p.name] then
        terr(path, e.name, ("shape [%s] does not match the model's %s [%s] (wrong config?)"):format(
          table.concat(e.shape, ","), p.name, table.concat(ps, ",")), what)
      end
      if not DTYPES[e.dtype] or bl.dtype_of(DTYPES[e.dtype][1]) > 3 then
        terr(path, e.name, "dtype " .. e.dtype .. " is not a floating-point type", what)
      end
    end
  end
  local f = not info.read and open_read(path)
  local ok, err = pcall(function()
    for _, p in ipairs(params) do
      local e = map[p.name]
      if e and trim[p.name] then
        local t = info.read and info.read(e) or read_tensor(f, info, e)
        p.param:copy_(t:narrow(1, 1, p.param:shape()[1]))
      elseif e and info.read then
        local t = info.read(e, p.param)  -- another checkpoint format (bertlua.import); nil: read in place
        if t then p.param:copy_(t) end
      elseif e then
        if e.dtype == "F32" and p.param:is_contiguous() and p.param:device() == "cpu" then
          local rc = C.bl_file_read_at(f, info.data_start + e.begin, p.param.data_, e.nbytes)
          if rc ~= 0 then terr(path, e.name, ffi.string(C.bl_last_error())) end
        else
          p.param:copy_(read_tensor(f, info, e))
        end
      end
    end
  end)
  if f then close(f) end
  if not ok then error(err, 0) end
  local trimmed, vocab, pad = {}, nil, nil
  for _, p in ipairs(params) do
    if trim[p.name] then trimmed[#trimmed + 1], vocab, pad = map[p.name].name, p.param:shape()[1], trim[p.name] end
  end
  if not opts.quiet and #trimmed > 0 then
    io.stderr:write(("note: %s: dropped %d row(s) of vocabulary padding (rows %d..%d past vocab_size %d, not "
      .. "checked) from %s\n"):format(path, pad, vocab, vocab + pad - 1, vocab, table.concat(trimmed, ", ")))
  end
  if not opts.quiet then
    if #missing > 0 then
      io.stderr:write(("note: %s: %d parameter(s) not in the checkpoint, initialised fresh: %s\n"):format(path,
        #missing,
        table.concat(missing, ", ")))
    end
    if #unexpected > 0 then
      io.stderr:write(("note: %s: %d tensor(s) not used by %s: %s\n"):format(path, #unexpected,
        tostring(model), table.concat(unexpected, ", ")))
    end
  end
  local n = 0
  for _ in pairs(map) do n = n + 1 end
  return { loaded = n, missing = missing, unexpected = unexpected, ignored = notes, trimmed = trimmed }
end

-- save_model(model, path[, opts]): the model's parameters under their HF names.
-- opts.dtype ("F32" default, "F16", "BF16"), opts.tied_decoder (also write
-- cls.predictions.decoder.weight, a copy of the word embeddings), opts.metadata,
-- opts.pad_vocab (a multiple: vocabulary rows zero-padded up to it, NVIDIA's layout; the
-- config keeps the real vocab_size).
function M.save_model(model, path, opts)
  opts = opts or {}
  local list = {}
  local names = {}
  local m = opts.pad_vocab
  for _, p in ipairs(model:parameters()) do
    local t = p.param
    if m and m > 1 and is_vocab_rows(p.name) and t:shape()[1] % m ~= 0 then
      local shape = t:shape()
      shape[1] = math.ceil(shape[1] / m) * m
      t = bl.zeros(shape, { dtype = t:dtype() })
      t:narrow(1, 1, p.param:shape()[1]):copy_(p.param)
    end
    list[#list + 1] = { p.name, t }
    names[p.name] = t
  end
  if opts.tied_decoder and names["cls.predictions.bias"] then
    list[#list + 1] = { "cls.predictions.decoder.weight", names["bert.embeddings.word_embeddings.weight"] }
  end
  return M.save(path, list, { dtype = opts.dtype, metadata = opts.metadata })
end

return M
