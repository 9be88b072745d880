-- bertlua.pretraining_data: BERT pre-training instances, their shard files and
-- the batch loader.
--
-- Instances are made as google-research/bert's create_pretraining_data.py makes
-- them (segment pairs up to a target length, 50% random next sentence from
-- another document with unused segments put back, truncation from a random
-- end of the longer side, 15% masking capped at max_predictions, never
-- [CLS]/[SEP], 80% [MASK] / 10% random token / 10% unchanged, optional whole
-- word masking, dupe_factor passes). The random stream is our own xorshift64*
-- seeded by --seed and the input file, not Python's: the same distributions,
-- reproducible bit for bit here.
--
-- Shard file format, version 1 (little-endian; written atomically):
--   header, 80 bytes:
--     char     magic[8]        "BLSHARD1"
--     uint32   version         1
--     uint32   header_bytes    80
--     uint64   vocab_hash      FNV-1a 64 of the vocab file's bytes
--     uint32   vocab_size
--     uint32   max_seq_length
--     uint32   max_predictions
--     uint32   flags           1 = dynamic masking (no masks stored), 2 = whole-word masking
--     float32  masked_lm_prob
--     uint32   token_bytes     2 when vocab_size <= 65535, else 4
--     uint64   seed
--     uint64   num_instances   N
--     uint64   data_bytes      bytes after the offsets table
--     uint64   checksum        FNV-1a 64 of the offsets table and the data
--   uint64 offsets[N + 1]      record k is data[offsets[k], offsets[k+1])
--   records:
--     uint16 length L, uint16 len_a (tokens of "[CLS] A [SEP]"), uint16 M (masked),
--     uint8 next_sentence_label (1 = B is a random sentence), uint8 reserved,
--     token ids[L] (token_bytes each, masks applied), uint16 positions[M], labels[M] (token_bytes each)
-- The reader (C, src/data/shard.c) memory-maps shards and refuses a file whose
-- size, magic, version, offsets, checksum, record lengths/positions/ids or vocab
-- hash is wrong, naming the file and the problem. The loader (C with a prefetch
-- thread, src/data/loader.c; contract in src/bl_loader.h) is described at M.Loader.
local core = require "bertlua.core"
local bl = require "bertlua.tensor"
local syn = require "bertlua.synthetic"
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

function M.vocab_hash(path)
  local f, err = io.open(path, "rb")
  if not f then error("pretraining_data: cannot read vocab " .. path .. ": " .. tostring(err), 2) end
  local s = f:read("*a")
  f:close()
  return C.bl_fnv1a64(s, #s, FNV0)
end

-- instances -------------------------------------------------------------------------
local function randint(r, a, b) return a + r(b - a + 1) - 1 end
local function shuffle(r, t) for i = #t, 2, -1 do local j = r(i); t[i], t[j] = t[j], t[i] end end

local function truncate_pair(a, b, max_tokens, r)
  while #a + #b > max_tokens do
    local t = #a > #b and a or b
    if r() < 0.5 then table.remove(t, 1) else t[#t] = nil end
  end
end

-- masked LM on a token list (0-based ids); returns output ids, positions (0-based), labels
function M.mask(tokens, o, r)
  local cand = {}
  for i, id in ipairs(tokens) do
    if id ~= o.cls_id and id ~= o.sep_id then
      if o.whole_word and #cand > 0 and o.is_continuation[id] then
        local last = cand[#cand]; last[#last + 1] = i
      else
        cand[#cand + 1] = { i }
      end
    end
  end
  shuffle(r, cand)
  local out = { unpack(tokens) }
  local want = math.min(o.max_predictions, math.max(1, math.floor(#tokens * o.masked_lm_prob + 0.5)))
  local lms, covered = {}, {}
  for _, set in ipairs(cand) do
    if #lms >= want then break end
    if #lms + #set <= want then
      local hit = false
      for _, i in ipairs(set) do if covered[i] then hit = true end end
      if not hit then
        for _, i in ipairs(set) do
          covered[i] = true
          local m
          if r() < 0.8 then m = o.mask_id
          elseif r() < 0.5 then m = tokens[i]
          else m = randint(r, 0, o.vocab_size - 1) end
          out[i] = m
          lms[#lms + 1] = { i - 1, tokens[i] }
        end
      end
    end
  end
  table.sort(lms, function(x, y) return x[1] < y[1] end)
  local pos, lab = {}, {}
  for k, e in ipairs(lms) do pos[k], lab[k] = e[1], e[2] end
  return out, pos, lab
end

-- One document's instances (create_instances_from_document).
local function from_document(docs, di, o, r, emit)
  local doc = docs[di]
  local max_tokens = o.max_seq_length - 3
  local target = max_tokens
  if r() < o.short_seq_prob then target = randint(r, 2, max_tokens) end
  local chunk, len, i = {}, 0, 1
  while i <= #doc do
    local seg = doc[i]
    chunk[#chunk + 1] = seg
    len = len + #seg
    if i == #doc or len >= target then
      if #chunk > 0 then
        local a_end = 1
        if #chunk >= 2 then a_end = randint(r, 1, #chunk - 1) end
        local a = {}
        for j = 1, a_end do for _, t in ipairs(chunk[j]) do a[#a + 1] = t end end
        local b, random_next = {}, false
        if #chunk == 1 or r() < 0.5 then
          random_next = true
          local target_b = target - #a
          local rd = di
          for _ = 1, 10 do
            rd = randint(r, 1, #docs)
            if rd ~= di then break end
          end
          local rdoc = docs[rd]
          for j = randint(r, 1, #rdoc), #rdoc do
            for _, t in ipairs(rdoc[j]) do b[#b + 1] = t end
            if #b >= target_b then break end
          end
          i = i - (#chunk - a_end)   -- put the unused segments back
        else
          for j = a_end + 1, #chunk do for _, t in ipairs(chunk[j]) do b[#b + 1] = t end end
        end
        truncate_pair(a, b, max_tokens, r)
        if #a >= 1 and #b >= 1 then
          local tokens = { o.cls_id }
          for _, t in ipairs(a) do tokens[#tokens + 1] = t end
          tokens[#tokens + 1] = o.sep_id
          local len_a = #tokens
          for _, t in ipairs(b) do tokens[#tokens + 1] = t end
          tokens[#tokens + 1] = o.sep_id
          local pos, lab = {}, {}
          if not o.dynamic_masking then tokens, pos, lab = M.mask(tokens, o, r) end
          emit(tokens, len_a, pos, lab, random_next and 1 or 0)
        end
      end
      chunk, len = {}, 0
    end
    i = i + 1
  end
end

-- read documents from the sharded text format: one sentence per line, blank line between documents
function M.read_documents(path, tok, stats)
  local docs, doc = {}, {}
  local f, err = io.open(path, "rb")
  if not f then error("create_pretraining_data: cannot read " .. path .. ": " .. tostring(err), 2) end
  for line in f:lines() do
    if line:match("^%s*$") then
      if #doc > 0 then docs[#docs + 1] = doc; doc = {} end
    else
      local ids = tok:encode(line)
      if #ids > 0 then doc[#doc + 1] = ids end
      if stats then stats.sentences = stats.sentences + 1 end
    end
  end
  f:close()
  if #doc > 0 then docs[#docs + 1] = doc end
  return docs
end

-- create(docs, opts) -> list of records; opts: tokenizer ids and the parameters
function M.create(docs, o)
  local r = syn.rng(o.seed)
  local out = {}
  local order = {}
  for i = 1, #docs do order[i] = docs[i] end
  shuffle(r, order)
  for _ = 1, o.dupe_factor do
    for di = 1, #order do
      from_document(order, di, o, r, function(tokens, len_a, pos, lab, nsp)
        out[#out + 1] = { tokens = tokens, len_a = len_a, pos = pos, lab = lab, nsp = nsp }
      end)
    end
  end
  shuffle(r, out)
  return out
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
    if C.bl_file_write(fp[0], p, n) ~= 0 then C.bl_file_close(fp[0]); core.fail(2) end
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
    if name:match("%.blshard$") and (not split or name:sub(1, #split + 1) == split .. "_") then r[#r + 1] = dir .. "/" .. name end
  end
  f:close()
  table.sort(r)
  return r
end
M.list_shards = list_shards

-- What dynamic masking needs from the vocabulary: the special ids and, for
-- whole-word masking, which ids are "##" continuation pieces.
local function mask_vocab(vocab, whole_word)
  local Tok = require "bertlua.tokenizer"
  local tk = Tok.load(vocab, { lower = true })
  local v = { cls_id = tk.cls_id, sep_id = tk.sep_id, mask_id = tk.mask_id, vocab_size = tk.size }
  if whole_word then
    v.is_continuation = {}
    for id = 0, tk.size - 1 do if tk:token(id):sub(1, 2) == "##" then v.is_continuation[id] = true end end
  end
  return v
end

-- The reference loader, in Lua (impl = "lua"): the C loader must give the same bits.
local Loader = {}
Loader.__index = Loader

local function lua_loader(o, files, expect)
  if o.bin_lengths then error("data: bin_lengths needs the C loader (impl = \"c\")", 3) end
  local self = setmetatable({ impl = "lua", shards = {}, starts = {}, batch = o.batch_size or 8, rank = o.rank or 0,
    world = o.world_size or 1, seed = o.seed or 0, shuffle = o.shuffle ~= false, epoch = 0, pos = 0,
    max_pred = o.max_predictions }, Loader)
  local total, whole_word = 0, false
  for i, path in ipairs(files) do
    local s = M.open_shard(path, expect)
    self.shards[i], self.starts[i] = s, total
    total = total + s.n
    self.max_pred = math.max(self.max_pred or 0, s.h.max_predictions)
    self.dynamic = self.dynamic or bit.band(s.h.flags, 1) ~= 0
    whole_word = whole_word or bit.band(s.h.flags, 2) ~= 0
    self.masked_lm_prob = s.h.masked_lm_prob
    self.vocab_size = s.h.vocab_size
  end
  self.total = total
  self.per_rank = math.floor(total / self.world)
  self.steps_per_epoch = math.floor(self.per_rank / self.batch)
  if self.steps_per_epoch == 0 then
    error(("data: %d instances are not enough for %d rank(s) x batch %d"):format(total, self.world, self.batch), 3)
  end
  if self.dynamic then
    if not o.vocab then error("data: dynamic-masking shards need vocab= (for [MASK]/[CLS]/[SEP] ids)", 3) end
    local v = mask_vocab(o.vocab, whole_word)
    self.mask_opts = { cls_id = v.cls_id, sep_id = v.sep_id, mask_id = v.mask_id, vocab_size = v.vocab_size,
      max_predictions = self.max_pred, masked_lm_prob = self.masked_lm_prob,
      whole_word = whole_word, is_continuation = v.is_continuation }
  end
  self:_permute()
  return self
end

function Loader:_permute()
  local n = self.total
  local perm = ffi.new("int32_t[?]", n)
  for i = 0, n - 1 do perm[i] = i end
  if self.shuffle then
    local r = syn.rng(self.seed * 1000003 + self.epoch)
    for i = n - 1, 1, -1 do local j = r(i + 1) - 1; perm[i], perm[j] = perm[j], perm[i] end
  end
  self.perm = perm
end

local function locate(self, g)
  local lo, hi = 1, #self.shards
  while lo < hi do
    local mid = math.floor((lo + hi + 1) / 2)
    if self.starts[mid] <= g then lo = mid else hi = mid - 1 end
  end
  return self.shards[lo], g - self.starts[lo]
end

function Loader:next()
  if self.pos >= self.steps_per_epoch then
    self.epoch, self.pos = self.epoch + 1, 0
    self:_permute()
  end
  local B, P = self.batch, self.max_pred
  local recs, S = {}, 8
  for b = 0, B - 1 do
    local gi = self.perm[(self.pos * B + b) * self.world + self.rank]
    local shard, k = locate(self, gi)
    local L, la, Mn, nsp, tok, pos, lab = shard:record(k)
    recs[b + 1] = { L = L, la = la, Mn = Mn, nsp = nsp, tok = tok, pos = pos, lab = lab, tb = shard.tb, gi = gi }
    if L > S then S = L end
  end
  S = math.ceil(S / 8) * 8
  local ids = bl.zeros({ B, S }, { dtype = "i32" })
  local types = bl.zeros({ B, S }, { dtype = "i32" })
  local mask = bl.zeros({ B, S }, { dtype = "i32" })
  local mpos = bl.zeros({ B, P }, { dtype = "i32" })
  local mlab = bl.full({ B, P }, -1, { dtype = "i32" })
  local nspt = bl.zeros({ B }, { dtype = "i32" })
  local pi, pt, pm, pp, pl, pn = ids:ptr(), types:ptr(), mask:ptr(), mpos:ptr(), mlab:ptr(), nspt:ptr()
  for b, r in ipairs(recs) do
    local row = (b - 1) * S
    local t16, t32 = ffi.cast("uint16_t*", r.tok), ffi.cast("uint32_t*", r.tok)
    local toks = {}
    for i = 0, r.L - 1 do
      local id = r.tb == 2 and t16[i] or t32[i]
      toks[i + 1] = id
      pi[row + i] = id
      pm[row + i] = 1
      if i >= r.la then pt[row + i] = 1 end
    end
    pn[b - 1] = r.nsp
    if self.dynamic then
      local rng = syn.rng((self.seed * 1000003 + self.epoch) * 1000003 + r.gi)
      local out, posl, labl = M.mask(toks, self.mask_opts, rng)
      for i = 1, r.L do pi[row + i - 1] = out[i] end
      for j = 1, math.min(#posl, P) do pp[(b - 1) * P + j - 1] = posl[j]; pl[(b - 1) * P + j - 1] = labl[j] end
    else
      local l16, l32 = ffi.cast("uint16_t*", r.lab), ffi.cast("uint32_t*", r.lab)
      for j = 0, math.min(r.Mn, P) - 1 do
        pp[(b - 1) * P + j] = r.pos[j]
        pl[(b - 1) * P + j] = r.tb == 2 and l16[j] or l32[j]
      end
    end
  end
  self.pos = self.pos + 1
  return { input_ids = ids, token_type_ids = types, attention_mask = mask, masked_lm_positions = mpos,
    masked_lm_labels = mlab, next_sentence_labels = nspt }
end

local function check_state(self, s)
  if type(s) ~= "table" then error("data: loader state must be a table from state()", 3) end
  if s.seed ~= self.seed then error(("data: loader state has seed %s, this loader %s"):format(tostring(s.seed), tostring(self.seed)), 3) end
  if (s.bin_lengths or 0) ~= (self.bin_window or 0) then
    error(("data: loader state has length binning %s, this loader %s"):format(tostring(s.bin_lengths or "off"),
      self.bin_window and tostring(self.bin_window) or "off"), 3)
  end
end

function Loader:state() return { epoch = self.epoch, pos = self.pos, seed = self.seed } end

function Loader:set_state(s)
  check_state(self, s)
  self.epoch, self.pos = s.epoch, s.pos
  self:_permute()
end

function Loader:close()
  for _, s in ipairs(self.shards) do s:close() end
  self.shards = {}
end

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
    if h and #h == HDR and h:sub(1, 8) == M.MAGIC then
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
  local keep = {}   -- arrays C reads during open (it copies them), alive until the call returns
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
  if C.bl_loader_open(paths, #files, co, out) ~= 0 then error(ffi.string(C.bl_last_error()), 3) end
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
  if C.bl_loader_next(alive(self), b) ~= 0 then error(ffi.string(C.bl_last_error()), 2) end
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
  if C.bl_loader_set_state(alive(self), s.epoch, s.pos) ~= 0 then error(ffi.string(C.bl_last_error()), 2) end
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

-- Default length-binning window (steps) for bin_lengths = true.
M.BIN_WINDOW = 64

-- Loader{ dir=, split="train" | files={...}, batch_size=, rank=0, world_size=1, seed=,
--         max_seq_length=, max_predictions=, vocab=path (hash check; ids for dynamic masking),
--         shuffle=true, prefetch=4, bin_lengths=false|true|steps, impl="c"|"lua" }
-- Every epoch is a permutation of all instances (seeded by seed and epoch);
-- rank r takes positions r, r+W, r+2W, ... of it, so ranks are disjoint and
-- together cover the epoch (the remainder beyond a multiple of W*batch is
-- dropped so that every rank runs the same number of steps). Batches are padded
-- to their longest sequence (rounded up to 8). next() -> { input_ids,
-- token_type_ids, attention_mask [B,S], masked_lm_positions, masked_lm_labels
-- [B,P], next_sentence_labels [B] } (int32 CPU tensors); a new epoch starts
-- transparently. state()/set_state() save and restore the position exactly.
--
-- impl="c" (default) is src/data/loader.c: a thread prepares the next `prefetch`
-- batches while training runs (prefetch=0: no thread); bin_lengths sorts the
-- sequences by length within windows of that many steps (true: M.BIN_WINDOW) and
-- shuffles the steps of each window, so batches pad less (useful for phase 2);
-- the order stays a function of seed and epoch and every instance is still seen
-- once per epoch. impl="lua" is the reference implementation: the C loader
-- returns the same bits for the same options (tests/lua/test_loader.lua).
function M.Loader(o)
  local files = o.files or list_shards(o.dir or ".", o.split)
  if #files == 0 then
    error(("data: no %s*.blshard files in %s"):format(o.split and (o.split .. "_") or "", tostring(o.dir)), 2)
  end
  local expect = { max_seq_length = o.max_seq_length }
  if o.vocab then expect.vocab_hash, expect.vocab = M.vocab_hash(o.vocab), o.vocab end
  local impl = o.impl or "c"
  if impl == "c" then return c_loader(o, files, expect) end
  if impl == "lua" then return lua_loader(o, files, expect) end
  error("data: impl must be \"c\" or \"lua\", got " .. tostring(impl), 2)
end

return M
