-- bertlua.data.shards: the shard files pre-training instances are stored in.
--
-- The file format (BLSHARD1) is specified in src/bl_loader.h; the writer and the reader are C.
-- The reader (C, src/data/shard.c) memory-maps shards and refuses a file whose
-- size, magic, version, offsets, checksum, record lengths/positions/ids or vocab
-- hash is wrong, naming the file and the problem. The loader (C with a prefetch
local core = require "bertlua.core"
local fs = require "bertlua.util.fs"
local C, ffi, check = core.C, core.ffi, core.check

local M = {}
M.MAGIC = "BLSHARD1"

-- bl_shard_header and the shard reader/loader come from the C API (src/bl_loader.h)
local FNV0 = 14695981039346656037ULL

-- vocab_hash(path): the header's vocab_hash of a vocabulary file
function M.vocab_hash(path)
  local s, err = fs.read(path, "vocab")
  if not s then error("pretraining_data: cannot read vocab " .. path .. " (" .. tostring(err) .. ")", 0) end
  return C.bl_fnv1a64(s, #s, FNV0)
end

-- write_shard(path, records, o): a shard written atomically by the C writer (bl_shard_writer); records are
-- { tokens = {...}, len_a =, nsp =, pos = {...}, lab = {...} }, o the header's vocab_hash, vocab_size,
-- max_seq_length, max_predictions, dynamic_masking, whole_word, masked_lm_prob and seed
local i32s = ffi.typeof("int32_t[?]")
function M.write_shard(path, records, o)
  local h = ffi.new("bl_shard_header")
  h.vocab_hash, h.vocab_size = o.vocab_hash, o.vocab_size
  h.max_seq_length, h.max_predictions = o.max_seq_length, o.max_predictions
  h.flags = (o.dynamic_masking and C.BL_SHARD_DYNAMIC_MASKING or 0) + (o.whole_word and C.BL_SHARD_WHOLE_WORD or 0)
  h.masked_lm_prob, h.seed = o.masked_lm_prob, o.seed
  local wp = ffi.new("bl_shard_writer*[1]")
  check(C.bl_shard_writer_open(path, h, wp))
  local w = wp[0]
  local cap, tok, pos, lab = 0, nil, nil, nil
  for _, rec in ipairs(records) do
    local L, Mn = #rec.tokens, #rec.pos
    if L > cap or Mn > cap then
      cap = math.max(L, Mn, 2 * cap, 512)
      tok, pos, lab = i32s(cap), i32s(cap), i32s(cap)
    end
    for i = 1, L do tok[i - 1] = rec.tokens[i] end
    for i = 1, Mn do pos[i - 1], lab[i - 1] = rec.pos[i], rec.lab[i] end
    if C.bl_shard_writer_add(w, L, rec.len_a, rec.nsp, tok, Mn, pos, lab) ~= 0 then
      C.bl_shard_writer_abort(w)
      core.fail()
    end
  end
  check(C.bl_shard_writer_commit(w))
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

-- fingerprint(dir) -> a decimal string naming the data: FNV-1a 64 of every train/test shard's name and size
-- (a checkpoint records it, so a run resumes only on the data it started with)
function M.fingerprint(dir)
  local h = ffi.new("uint64_t", 14695981039346656037ULL)
  for _, name in ipairs(fs.is_dir(dir) and fs.list_dir(dir, "%.blshard$") or {}) do
    local line = ("%s %d\n"):format(name, fs.file_size(dir .. "/" .. name))
    h = C.bl_fnv1a64(line, #line, h)
  end
  return (tostring(h):gsub("ULL$", ""))
end

-- loaders -------------------------------------------------------------------------------
local function list_shards(dir, split)
  local r = {}
  if not fs.is_dir(dir) then return r end
  for _, name in ipairs(fs.list_dir(dir, "%.blshard$")) do
    if not split or name:sub(1, #split + 1) == split .. "_" then r[#r + 1] = dir .. "/" .. name end
  end
  return r
end
M.list_shards = list_shards

return M
