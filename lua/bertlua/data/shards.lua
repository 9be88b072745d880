-- bertlua.data.shards: the shard files pre-training instances are stored in.
--
-- The file format (BLSHARD1) is specified in src/bl_loader.h; this module writes it.
-- The reader (C, src/data/shard.c) memory-maps shards and refuses a file whose
-- size, magic, version, offsets, checksum, record lengths/positions/ids or vocab
-- hash is wrong, naming the file and the problem. The loader (C with a prefetch
local core = require "bertlua.core"
local C, ffi, check = core.C, core.ffi, core.check

local M = {}
M.MAGIC = "BLSHARD1"
M.VERSION = 1

-- bl_shard_header and the shard reader/loader come from the C API (src/bl_loader.h)
local HDR = ffi.sizeof("bl_shard_header")
assert(HDR == 80)
local FNV0 = 14695981039346656037ULL

-- growable byte buffer ---------------------------------------------------------
local Buf = {}
Buf.__index = Buf
local function buffer(cap)
  cap = cap or 65536
  return setmetatable({ p = ffi.new("uint8_t[?]", cap), cap = cap, n = 0 }, Buf)
end
function Buf:reserve(extra)
  if self.n + extra <= self.cap then return end
  local cap = self.cap
  while cap < self.n + extra do cap = cap * 2 end
  local p = ffi.new("uint8_t[?]", cap)
  ffi.copy(p, self.p, self.n)
  self.p, self.cap = p, cap
end
function Buf:u8(v) self:reserve(1); self.p[self.n] = v; self.n = self.n + 1 end
function Buf:u16(v) self:reserve(2); ffi.cast("uint16_t*", self.p + self.n)[0] = v; self.n = self.n + 2 end
function Buf:u32(v) self:reserve(4); ffi.cast("uint32_t*", self.p + self.n)[0] = v; self.n = self.n + 4 end

-- vocab_hash(path): the header's vocab_hash of a vocabulary file
function M.vocab_hash(path)
  local f, err = io.open(path, "rb")
  if not f then error("pretraining_data: cannot read vocab " .. path .. ": " .. tostring(err), 2) end
  local s = f:read("*a")
  f:close()
  return C.bl_fnv1a64(s, #s, FNV0)
end

-- write a shard atomically
function M.write_shard(path, records, o)
  local tb = o.vocab_size <= 65535 and 2 or 4
  local data = buffer(1048576)
  local offsets = ffi.new("uint64_t[?]", #records + 1)
  for k, rec in ipairs(records) do
    offsets[k - 1] = data.n
    local L, Mn = #rec.tokens, #rec.pos
    if L > 65535 or Mn > 65535 then error("create_pretraining_data: instance too long", 2) end
    data:u16(L); data:u16(rec.len_a); data:u16(Mn); data:u8(rec.nsp); data:u8(0)
    for _, t in ipairs(rec.tokens) do if tb == 2 then data:u16(t) else data:u32(t) end end
    for _, p in ipairs(rec.pos) do data:u16(p) end
    for _, l in ipairs(rec.lab) do if tb == 2 then data:u16(l) else data:u32(l) end end
  end
  offsets[#records] = data.n
  local h = ffi.new("bl_shard_header")
  ffi.copy(h.magic, M.MAGIC, 8)
  h.version, h.header_bytes = M.VERSION, HDR
  h.vocab_hash, h.vocab_size = o.vocab_hash, o.vocab_size
  h.max_seq_length, h.max_predictions = o.max_seq_length, o.max_predictions
  h.flags = (o.dynamic_masking and 1 or 0) + (o.whole_word and 2 or 0)
  h.masked_lm_prob, h.token_bytes, h.seed = o.masked_lm_prob, tb, o.seed
  h.num_instances, h.data_bytes = #records, data.n
  local ck = C.bl_fnv1a64(offsets, 8 * (#records + 1), FNV0)
  h.checksum = C.bl_fnv1a64(data.p, data.n, ck)
  local fp = ffi.new("bl_file*[1]")
  check(C.bl_file_create_atomic(path, fp))
  local function w(p, n)
    if C.bl_file_write(fp[0], p, n) ~= 0 then C.bl_file_close(fp[0]); core.fail() end
  end
  w(h, HDR); w(offsets, 8 * (#records + 1)); w(data.p, data.n)
  check(C.bl_file_commit(fp[0]))
end

-- shard reader --------------------------------------------------------------------------
-- Opening, validation and record access are C (src/data/shard.c), shared by both loaders.
local Shard = {}
Shard.__index = Shard

-- open_shard(path [, expect{ vocab_hash=, vocab=, max_seq_length= }]) -> shard with .path,
-- .h (header), .n, .tb and :record(k). A file that fails a check raises "shard PATH: why".
function M.open_shard(path, expect)
  local ex = ffi.new("bl_shard_expect")
  if expect then
    ex.vocab_hash = expect.vocab_hash or 0
    ex.vocab_name = expect.vocab and tostring(expect.vocab) or nil
    ex.max_seq_length = expect.max_seq_length or 0
  end
  local out = ffi.new("bl_shard*[1]")
  if C.bl_shard_open(path, ex, out) ~= 0 then error(ffi.string(C.bl_last_error()), 0) end
  local c = ffi.gc(out[0], C.bl_shard_close)
  local h = C.bl_shard_get_header(c)
  return setmetatable({ path = path, c = c, h = h, n = tonumber(C.bl_shard_count(c)), tb = h.token_bytes,
    rec = ffi.new("bl_shard_record") }, Shard)
end

function Shard:close()
  if self.c ~= nil then C.bl_shard_close(ffi.gc(self.c, nil)); self.c, self.h = nil, nil end
end

-- record k (0-based): L, len_a, M, nsp, token pointer, positions pointer, labels pointer
function Shard:record(k)
  local r = self.rec
  if C.bl_shard_get_record(self.c, k, r) ~= 0 then error(ffi.string(C.bl_last_error()), 2) end
  return r.length, r.len_a, r.num_masked, r.next_sentence_label, ffi.cast("const uint8_t*", r.tokens), r.positions,
    ffi.cast("const uint8_t*", r.labels)
end

-- loaders -------------------------------------------------------------------------------
local function list_shards(dir, split)
  local f = io.popen("ls -1 '" .. dir:gsub("'", "'\\''") .. "' 2>/dev/null")
  local r = {}
  for name in f:lines() do
    if name:match("%.blshard$") and (not split or name:sub(1,
      #split + 1) == split .. "_") then r[#r + 1] = dir .. "/" .. name end
  end
  f:close()
  table.sort(r)
  return r
end
M.list_shards = list_shards

return M
