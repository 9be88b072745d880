-- bertlua.train.fingerprint: what every rank of a data-parallel run must share, as the list of
-- { name, value } entries bertlua.train.dist.agree compares across ranks at start (pretrain, squad, glue):
--   dist.agree("pretrain", fingerprint.entries{
--     options = opt,                                     -- every option: "--name" = value
--     config = cfg,                                      -- a model config table: "config name" = value
--     files = { { "--vocab", opt.vocab } },              -- a file's content, or every file's in a directory
--     data = { { "--data-phase1", dir } } })              -- the shards' names and sizes (bertlua.data.shards)
-- A missing path is an entry too ("missing"): it differs where it exists on another rank.
local fs = require "bertlua.util.fs"
local ckpt = require "bertlua.train.checkpoint"
local core = require "bertlua.core"
local shards = require "bertlua.data.shards"
local sorted_keys = require("bertlua.util.list").sorted_keys

local M = {}

local cjson = require "cjson"

local function show(v) return type(v) == "table" and cjson.encode(v) or tostring(v) end

-- a directory's files: names, sizes and checksums, in one value
local function dir_identity(dir)
  local names = fs.list_dir(dir)
  table.sort(names)
  local parts, bytes = {}, 0
  for i, n in ipairs(names) do
    local path = dir .. "/" .. n
    local size = fs.file_size(path)
    bytes = bytes + math.max(size, 0)
    parts[i] = n .. " " .. size .. " " .. ckpt.file_checksum(path)
  end
  local s = table.concat(parts, "\n")
  local h = core.C.bl_fnv1a64(s, #s, core.ffi.new("uint64_t", 14695981039346656037ULL))
  return ("%d files, %d bytes, digest %s"):format(#names, bytes, (tostring(h):gsub("ULL$", "")))
end

local function identity(path)
  if not path then return "none" end
  if fs.is_dir(path) then return dir_identity(path) end
  if fs.file_size(path) < 0 then return "missing" end
  return "checksum " .. ckpt.file_checksum(path)
end

function M.entries(o)
  local out = {}
  for _, k in ipairs(sorted_keys(o.options or {})) do
    if k:sub(1, 1) ~= "_" then out[#out + 1] = { "--" .. k:gsub("_", "-"), show(o.options[k]) } end
  end
  for _, k in ipairs(sorted_keys(o.config or {})) do out[#out + 1] = { "config " .. k, show(o.config[k]) } end
  for _, f in ipairs(o.files or {}) do out[#out + 1] = { f[1] .. " (content)", identity(f[2]) } end
  for _, d in ipairs(o.data or {}) do
    out[#out + 1] = { d[1] .. " (shards)", d[2] and fs.is_dir(d[2]) and "digest " .. shards.fingerprint(d[2])
      or (d[2] and "missing" or "none") }
  end
  return out
end

return M
