-- ref_shard_writer: BLSHARD1 written field by field in Lua, straight from the
-- format in src/bl_loader.h: the reference the C writer (bl_shard_writer,
-- bertlua.data.shards.write_shard) must match byte for byte
-- (tests/lua/test_shard_writer.lua).
local ffi = require "ffi"
local C = require("bertlua.core").C

local M = {}
local FNV0 = 14695981039346656037ULL

-- bytes(records, o) -> the whole file as a Lua string
function M.bytes(records, o)
  local tb = o.vocab_size <= 65535 and 2 or 4
  local data, n = {}, 0
  local function le(v, bytes)  -- little-endian unsigned integer
    local t = {}
    for i = 1, bytes do t[i] = string.char(v % 256); v = math.floor(v / 256) end
    data[#data + 1] = table.concat(t)
    n = n + bytes
  end
  local offsets = ffi.new("uint64_t[?]", #records + 1)
  for k, rec in ipairs(records) do
    offsets[k - 1] = n
    le(#rec.tokens, 2); le(rec.len_a, 2); le(#rec.pos, 2); le(rec.nsp, 1); le(0, 1)
    for _, t in ipairs(rec.tokens) do le(t, tb) end
    for _, p in ipairs(rec.pos) do le(p, 2) end
    for _, l in ipairs(rec.lab) do le(l, tb) end
  end
  offsets[#records] = n
  local body = table.concat(data)
  local h = ffi.new("bl_shard_header")
  ffi.copy(h.magic, "BLSHARD1", 8)
  h.version, h.header_bytes = 1, 80
  h.vocab_hash, h.vocab_size = o.vocab_hash, o.vocab_size
  h.max_seq_length, h.max_predictions = o.max_seq_length, o.max_predictions
  h.flags = (o.dynamic_masking and 1 or 0) + (o.whole_word and 2 or 0)
  h.masked_lm_prob, h.token_bytes, h.seed = o.masked_lm_prob, tb, o.seed
  h.num_instances, h.data_bytes = #records, n
  h.checksum = C.bl_fnv1a64(body, n, C.bl_fnv1a64(offsets, 8 * (#records + 1), FNV0))
  return ffi.string(h, 80) .. ffi.string(offsets, 8 * (#records + 1)) .. body
end

return M
