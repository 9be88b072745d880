-- bertlua.io.protobuf: a small protocol-buffers encoder (what writing an ONNX
-- file needs: varints, length-delimited fields, packed int64s, fixed32 floats).
--
--   local pb = require "bertlua.io.protobuf"
--   local m = pb.message()
--   m:int(1, 8):string(2, "bertlua"):message(7, graph):bytes(9, raw)
--   pb.write(path, m)     -- atomically, through bertlua.util.fs
--
-- A message is a list of byte strings and its total length: nesting one in
-- another appends the child's pieces (no copy of large raw data) after the
-- tag and length, so a file of gigabytes is written piece by piece.
local ffi = require "ffi"
local fs = require "bertlua.util.fs"

local M = {}

-- varint(n): base-128 little-endian; a negative int64 takes ten bytes (two's complement, in 64-bit integers:
-- a double cannot hold 2^64 - 1)
local function varint(n)
  assert(n == math.floor(n), "protobuf: varint of a non-integer")
  if n >= 0 and n < 128 then return string.char(n) end
  local u, out = ffi.cast("uint64_t", ffi.cast("int64_t", n)), {}
  while u >= 128 do
    out[#out + 1] = string.char(tonumber(u % 128) + 128)
    u = u / 128
  end
  out[#out + 1] = string.char(tonumber(u))
  return table.concat(out)
end
M.varint = varint

local Message = {}
Message.__index = Message

function M.message() return setmetatable({ parts = {}, len = 0 }, Message) end

local function put(m, s)
  m.parts[#m.parts + 1] = s
  m.len = m.len + #s
end

-- wire types: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32
local function tag(m, field, wire) put(m, varint(field * 8 + wire)) end

function Message:int(field, n)
  tag(self, field, 0)
  put(self, varint(n))
  return self
end

-- float(field, x): fixed32, IEEE single, little-endian
local f32 = ffi.new("float[1]")
local function float_bytes(x)
  f32[0] = x
  return ffi.string(f32, 4)
end
function Message:float(field, x)
  tag(self, field, 5)
  put(self, float_bytes(x))
  return self
end

function Message:bytes(field, s)
  tag(self, field, 2)
  put(self, varint(#s))
  put(self, s)
  return self
end
Message.string = Message.bytes

function Message:message(field, child)
  tag(self, field, 2)
  put(self, varint(child.len))
  for _, p in ipairs(child.parts) do self.parts[#self.parts + 1] = p end
  self.len = self.len + child.len
  return self
end

-- packed_ints(field, list): repeated int64 in one length-delimited field
function Message:packed_ints(field, list)
  local s = {}
  for i, n in ipairs(list) do s[i] = varint(n) end
  return self:bytes(field, table.concat(s))
end

-- packed_floats(field, list): repeated float in one length-delimited field
function Message:packed_floats(field, list)
  local s = {}
  for i, x in ipairs(list) do s[i] = float_bytes(x) end
  return self:bytes(field, table.concat(s))
end

-- write(path, m): the message as a whole file, atomically (a failed write leaves path as it was)
function M.write(path, m)
  local w = fs.open(path)
  for _, p in ipairs(m.parts) do w:write(p) end
  w:commit()
end

return M
