-- bertlua.device.prefetch: fine-tuning, evaluation and prediction batches go to a GPU as pre-training's do
-- (bl_stager in bl_loader.h): their tensors are copied into pinned host buffers and from there on the device's
-- copy stream, with an event the compute stream waits on, so the next batch is copied while the current one
-- computes and no upload comes from pageable memory (which the runtime would stage on the host first).
--
--   local prefetch = require "bertlua.device.prefetch"
--   local st = prefetch.Stager(dev)   -- dev >= 0
--   st:put(batch)                     -- a table of CPU tensors (at most 8) and other values, all kept by the stager
--   local b = st:get()                -- the oldest batch put: its tensors on the device (same keys, shapes, dtypes)
--   st:in_flight()                    -- batches put and not yet got (at most 2)
--
-- get's tensors stay valid until the second put after it: a loop gets batch k, puts batch k + 1, then runs k.
local core = require "bertlua.core"
local bl = require "bertlua.tensor"
local C, ffi, check = core.C, core.ffi, core.check

local M = {}

local Stager = {}
Stager.__index = Stager

function M.Stager(dev)
  local out = ffi.new("bl_stager *[1]")
  check(C.bl_stager_new(dev, out))
  return setmetatable({ s = ffi.gc(out[0], C.bl_stager_free), pending = {},
    fields = ffi.new("bl_tensor *[?]", C.BL_STAGER_FIELDS) }, Stager)
end

-- put(batch): the batch's CPU tensors on their way to the device (keys in sorted order), its other values kept
function Stager:put(batch)
  local keys, rest = {}, {}
  for k, v in pairs(batch) do
    if bl.is_tensor(v) and v:device() == "cpu" then keys[#keys + 1] = k else rest[k] = v end
  end
  table.sort(keys)
  if #keys == 0 or #keys > C.BL_STAGER_FIELDS then
    error(("prefetch: a batch needs 1..%d CPU tensors, got %d"):format(C.BL_STAGER_FIELDS, #keys), 2)
  end
  local hold = {}   -- contiguous copies live until the put returns (the stager copies them into pinned memory)
  for i, k in ipairs(keys) do
    hold[i] = batch[k]:contiguous()
    self.fields[i - 1] = hold[i]
  end
  check(C.bl_stager_put(self.s, #keys, self.fields))
  self.pending[#self.pending + 1] = { keys = keys, rest = rest }
end

-- get() -> the oldest batch put, its tensors on the device
function Stager:get()
  local p = table.remove(self.pending, 1)
  if not p then error("prefetch: get with no batch put", 2) end
  check(C.bl_stager_get(self.s, #p.keys, self.fields))
  local out = p.rest
  for i, k in ipairs(p.keys) do out[k] = bl.wrap(self.fields[i - 1]) end
  return out
end

function Stager:in_flight() return #self.pending end

function Stager:close()
  if self.s ~= nil then C.bl_stager_free(ffi.gc(self.s, nil)); self.s = nil end
end

return M
