-- bertlua.data.loader: batches of pre-training instances from shard files
-- (bertlua.data.shards), prepared by the C loader (src/data/loader.c, contract in
-- src/bl_loader.h) on a prefetch thread.
local core = require "bertlua.core"
local bl = require "bertlua.tensor"
local shards = require "bertlua.data.shards"
local C, ffi, check = core.C, core.ffi, core.check

local M = {}
local HDR = ffi.sizeof("bl_shard_header")

-- What dynamic masking needs from the vocabulary: the special ids and, for
-- whole-word masking, which ids are "##" continuation pieces.
local function mask_vocab(vocab, whole_word)
  local Tok = require "bertlua.data.tokenizer"
  local tk = Tok.load(vocab, { lower = true })
  local v = { cls_id = tk.cls_id, sep_id = tk.sep_id, mask_id = tk.mask_id, vocab_size = tk.size }
  if whole_word then
    v.is_continuation = {}
    for id = 0, tk.size - 1 do if tk:token(id):sub(1, 2) == "##" then v.is_continuation[id] = true end end
  end
  return v
end

M.mask_vocab = mask_vocab

local function check_state(self, s)
  if type(s) ~= "table" then error("data: loader state must be a table from state()", 3) end
  if s.seed ~= self.seed then error(("data: loader state has seed %s, this loader %s"):format(tostring(s.seed),
    tostring(self.seed)), 3) end
  if (s.bin_lengths or 0) ~= (self.bin_window or 0) then
    error(("data: loader state has length binning %s, this loader %s"):format(tostring(s.bin_lengths or "off"),
      self.bin_window and tostring(self.bin_window) or "off"), 3)
  end
end

M.check_state = check_state

-- The C loader (default): src/data/loader.c, batches prepared on a prefetch thread.
local CLoader = {}
CLoader.__index = CLoader

-- flags of the shards' headers (1 dynamic masking, 2 whole word), read without
-- checks: only to know whether the vocabulary is needed (C validates the files)
local function peek_flags(files)
  local flags = 0
  for _, path in ipairs(files) do
    local f = io.open(path, "rb")
    local h = f and f:read(HDR)
    if f then f:close() end
    if h and #h == HDR and h:sub(1, 8) == shards.MAGIC then
      flags = bit.bor(flags, ffi.cast("const bl_shard_header*", h).flags)
    end
  end
  return flags
end

local function c_loader(o, files, expect)
  local co = ffi.new("bl_loader_options")
  co.batch_size, co.rank, co.world_size = o.batch_size or 8, o.rank or 0, o.world_size or 1
  co.seed, co.shuffle = o.seed or 0, o.shuffle ~= false and 1 or 0
  co.max_seq_length, co.max_predictions = o.max_seq_length or 0, o.max_predictions or 0
  co.prefetch = o.prefetch or 4
  local bin = o.bin_lengths
  if bin == true then bin = M.BIN_WINDOW elseif not bin then bin = 0 end
  if type(bin) ~= "number" or bin < 0 then error("data: bin_lengths must be true, false or a number of steps", 3) end
  co.bin_window = bin
  co.vocab_hash, co.vocab_name = expect.vocab_hash or 0, expect.vocab
  co.mask_id = -1
  -- arrays C reads during open (it copies them), alive until the call returns
  local keep = {}  -- luacheck: ignore 241
  local flags = peek_flags(files)
  if bit.band(flags, 1) ~= 0 and o.vocab then
    local whole_word = bit.band(flags, 2) ~= 0
    local v = mask_vocab(o.vocab, whole_word)
    co.cls_id, co.sep_id, co.mask_id, co.vocab_size = v.cls_id, v.sep_id, v.mask_id, v.vocab_size
    if whole_word then
      local cont = ffi.new("uint8_t[?]", v.vocab_size)
      for id in pairs(v.is_continuation) do cont[id] = 1 end
      co.is_continuation, keep[1] = cont, cont
    end
  end
  local paths = ffi.new("const char*[?]", #files)
  for i, p in ipairs(files) do paths[i - 1] = p end
  local out = ffi.new("bl_loader*[1]")
  if C.bl_loader_open(paths, #files, co, out) ~= 0 then error(ffi.string(C.bl_last_error()), 0) end
  local c = ffi.gc(out[0], C.bl_loader_close)
  local info = ffi.new("bl_loader_info")
  check(C.bl_loader_get_info(c, info))
  local self = setmetatable({ impl = "c", c = c, batch = tonumber(co.batch_size), rank = co.rank, world = co.world_size,
    seed = o.seed or 0, shuffle = o.shuffle ~= false, epoch = 0, pos = 0, bin_window = bin > 0 and bin or nil,
    total = tonumber(info.total), per_rank = tonumber(info.per_rank), steps_per_epoch = tonumber(info.steps_per_epoch),
    max_pred = info.max_predictions, max_length = info.max_length, dynamic = info.dynamic ~= 0,
    whole_word = info.whole_word ~= 0, masked_lm_prob = info.masked_lm_prob, prefetch = info.prefetch,
    _b = ffi.new("bl_loader_batch"), _i64 = ffi.new("int64_t[2]") }, CLoader)
  return self
end

local function alive(self)
  if self.c == nil then error("data: the loader is closed", 3) end
  return self.c
end

function CLoader:next()
  local b = self._b
  if C.bl_loader_next(alive(self), b) ~= 0 then error(ffi.string(C.bl_last_error()), 0) end
  local wrap = bl.wrap
  self.epoch, self.pos = tonumber(b.epoch), tonumber(b.pos) + 1
  local batch = { input_ids = wrap(b.input_ids), token_type_ids = wrap(b.token_type_ids),
    attention_mask = wrap(b.attention_mask), masked_lm_positions = wrap(b.masked_lm_positions),
    masked_lm_labels = wrap(b.masked_lm_labels), next_sentence_labels = wrap(b.next_sentence_labels) }
  -- The GC cannot see a batch's C memory and this loader makes little Lua
  -- garbage: when the previous batch was dropped rather than freed
  -- (free_batch), count its bytes as allocated so the GC collects it as
  -- promptly as the Lua loader's garbage would have been.
  local prev = self._prev
  if prev and prev.storage_ ~= nil then collectgarbage("step", self._prev_kb) end
  self._prev, self._prev_kb = batch.input_ids, math.ceil(tonumber(C.bl_tensor_nbytes(batch.input_ids)) * 3 / 1024)
  return batch
end

-- (kept on the Lua side after each call, so a closed loader still tells where it was)
function CLoader:state()
  return { epoch = self.epoch, pos = self.pos, seed = self.seed, bin_lengths = self.bin_window }
end

function CLoader:set_state(s)
  check_state(self, s)
  if C.bl_loader_set_state(alive(self), s.epoch, s.pos) ~= 0 then error(ffi.string(C.bl_last_error()), 0) end
  self.epoch, self.pos = s.epoch, s.pos
end

-- stats() -> { batches, waits (next() found nothing prefetched), wait_seconds,
--             tokens, padded (B*S summed), padding (fraction of padded slots) }
function CLoader:stats()
  local st = ffi.new("bl_loader_stats")
  check(C.bl_loader_get_stats(alive(self), st))
  local padded = tonumber(st.padded)
  return { batches = tonumber(st.batches), waits = tonumber(st.waits), wait_seconds = st.wait_seconds,
    tokens = tonumber(st.tokens), padded = padded, padding = padded > 0 and 1 - tonumber(st.tokens) / padded or 0 }
end

-- instance_at(epoch, pos, b) -> index (0-based, into the concatenated shards) of
-- row b (0-based) of step pos (0-based) of that epoch, for this loader's rank
function CLoader:instance_at(epoch, pos, b)
  local v = self._i64
  check(C.bl_loader_instance_at(alive(self), epoch, pos, b, v))
  return tonumber(v[0])
end

function CLoader:close()
  if self.c ~= nil then C.bl_loader_close(ffi.gc(self.c, nil)); self.c = nil end
  self._prev = nil
end

-- free_batch(batch): release a batch's tensors now instead of at GC.
function M.free_batch(batch)
  for _, t in pairs(batch) do t:free() end
end

-- DeviceLoader(loader, device): the loader's batches on cuda:device through
-- bl_feeder (bl_loader.h): pinned buffers and a copy stream, the next batch
-- copied while the current step computes, no allocation per batch. The C
-- loader builds each batch's ids, token types and attention mask straight into
-- the pinned buffers (bl_feeder_put_next), on the call: its prefetch thread
-- stops, since a step on the GPU does not wait on the host, which builds the
-- batch after next while the device computes. next()
-- returns device tensors that stay valid until the second next() after it;
-- state() is the position of the batches handed out, not of those in flight,
-- so a checkpoint resumes exactly. The MLM positions and labels and the NSP
-- labels are handed out as the loader's CPU tensors: the pre-training head
-- selects and counts them on the host (bertlua.train.device's HOST_FIELDS),
-- and reading device copies back would cost a host wait per step.
local DLoader = {}
DLoader.__index = DLoader

function M.DeviceLoader(loader, device)
  local out = ffi.new("bl_feeder *[1]")
  check(C.bl_feeder_new(device, loader.batch, loader.max_length, loader.max_pred, out))
  return setmetatable({ loader = loader, f = ffi.gc(out[0], C.bl_feeder_free), device = device,
    _b = ffi.new("bl_loader_batch"), _host = {} }, DLoader)
end

local FIELDS = { "input_ids", "token_type_ids", "attention_mask", "masked_lm_positions", "masked_lm_labels",
  "next_sentence_labels" }
local HOST_FIELDS = { "masked_lm_positions", "masked_lm_labels", "next_sentence_labels" }

-- the loader's next batch into the feeder, built in its pinned buffers; the host fields are kept for next()
local function put(self)
  local l, b = self.loader, self._b
  check(C.bl_feeder_put_next(self.f, alive(l), b))
  l.epoch, l.pos = tonumber(b.epoch), tonumber(b.pos) + 1   -- as CLoader:next keeps them
  local host = {}
  for _, k in ipairs(HOST_FIELDS) do host[k] = bl.wrap(b[k]) end
  self._host[#self._host + 1] = host
end

function DLoader:next()
  while C.bl_feeder_in_flight(self.f) < 2 do put(self) end
  local b = self._b
  check(C.bl_feeder_get(self.f, b))
  local batch = table.remove(self._host, 1)
  for _, k in ipairs(FIELDS) do batch[k] = batch[k] or bl.wrap(b[k]) end
  self.epoch, self.pos = tonumber(b.epoch), tonumber(b.pos) + 1
  return batch
end

-- staged_bytes() -> bytes copied from ordinary memory into the pinned buffers so far: only the positions, labels
-- and NSP labels (the rest is built there)
function DLoader:staged_bytes() return tonumber(C.bl_feeder_staged_bytes(self.f)) end

function DLoader:state()
  local s = self.loader:state()
  if self.epoch then s.epoch, s.pos = self.epoch, self.pos end
  return s
end

function DLoader:set_state(s)
  C.bl_feeder_drop(self.f)
  self._host = {}
  self.loader:set_state(s)
  self.epoch, self.pos = nil, nil
end

function DLoader:close()
  if self.f ~= nil then C.bl_feeder_free(ffi.gc(self.f, nil)); self.f = nil end
  self.loader:close()
end

-- Default length-binning window (steps) for bin_lengths = true.
M.BIN_WINDOW = 64

-- Loader{ dir=, split="train" | files={...}, batch_size=, rank=0, world_size=1, seed=,
--         max_seq_length=, max_predictions=, vocab=path (hash check; ids for dynamic masking),
--         shuffle=true, prefetch=4, bin_lengths=false|true|steps }
-- Every epoch is a permutation of all instances (seeded by seed and epoch);
-- rank r takes positions r, r+W, r+2W, ... of it, so ranks are disjoint and
-- together cover the epoch (the remainder beyond a multiple of W*batch is
-- dropped so that every rank runs the same number of steps). Batches are padded
-- to their longest sequence (rounded up to 8). next() -> { input_ids,
-- token_type_ids, attention_mask [B,S], masked_lm_positions, masked_lm_labels
-- [B,P], next_sentence_labels [B] } (int32 CPU tensors); a new epoch starts
-- transparently. state()/set_state() save and restore the position exactly.
--
-- A thread of src/data/loader.c prepares the next `prefetch`
-- batches while training runs (prefetch=0: no thread); bin_lengths sorts the
-- sequences by length within windows of that many steps (true: M.BIN_WINDOW) and
-- shuffles the steps of each window, so batches pad less (useful for phase 2);
-- the order stays a function of seed and epoch and every instance is still seen
-- once per epoch. tests/lua/lib/ref_loader.lua is a reference implementation in
-- Lua: this loader returns the same bits for the same options (tests/lua/test_loader.lua).
function M.Loader(o)
  local files = o.files or shards.list_shards(o.dir or ".", o.split)
  if #files == 0 then
    error(("data: no %s*.blshard files in %s (create_pretraining_data.lua makes them from shard.lua's "
      .. "train_*.txt/test_*.txt)"):format(o.split and (o.split .. "_") or "", tostring(o.dir)), 0)
  end
  local expect = { max_seq_length = o.max_seq_length }
  if o.vocab then expect.vocab_hash, expect.vocab = shards.vocab_hash(o.vocab), o.vocab end
  return c_loader(o, files, expect)
end

return M

