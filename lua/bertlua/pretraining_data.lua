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
-- The loader memory-maps shards and refuses a file whose size, magic, version,
-- offsets, checksum or vocab hash is wrong, naming the file and the problem.
local core = require "bertlua.core"
local bl = require "bertlua.tensor"
local syn = require "bertlua.synthetic"
local C, ffi, check = core.C, core.ffi, core.check

local M = {}
M.MAGIC = "BLSHARD1"
M.VERSION = 1

pcall(ffi.cdef, [[
typedef struct {
  char magic[8]; uint32_t version; uint32_t header_bytes; uint64_t vocab_hash;
  uint32_t vocab_size; uint32_t max_seq_length; uint32_t max_predictions; uint32_t flags;
  float masked_lm_prob; uint32_t token_bytes; uint64_t seed; uint64_t num_instances;
  uint64_t data_bytes; uint64_t checksum;
} bl_shard_header;
int open(const char *path, int flags);
int close(int fd);
void *mmap(void *addr, size_t len, int prot, int flags, int fd, int64_t off);
int munmap(void *addr, size_t len);
]])
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
local Shard = {}
Shard.__index = Shard

local function bad(path, what) error(("shard %s: %s"):format(path, what), 0) end

function M.open_shard(path, expect)
  local fp = ffi.new("bl_file*[1]")
  if C.bl_file_open_read(path, fp) ~= 0 then bad(path, "cannot open: " .. ffi.string(C.bl_last_error())) end
  local sz = ffi.new("int64_t[1]")
  C.bl_file_size(fp[0], sz)
  C.bl_file_close(fp[0])
  local size = tonumber(sz[0])
  if size < HDR then bad(path, ("truncated: %d bytes, smaller than the %d-byte header"):format(size, HDR)) end
  local fd = ffi.C.open(path, 0)
  if fd < 0 then bad(path, "cannot open") end
  local base = ffi.C.mmap(nil, size, 1, 2, fd, 0)
  ffi.C.close(fd)
  if ffi.cast("intptr_t", base) == -1 then bad(path, "mmap failed") end
  local self = setmetatable({ path = path, base = ffi.cast("uint8_t*", base), size = size }, Shard)
  local ok, err = pcall(function()
    local h = ffi.cast("bl_shard_header*", base)
    if ffi.string(h.magic, 8) ~= M.MAGIC then bad(path, "not a bertlua shard (wrong magic)") end
    if h.version ~= M.VERSION then bad(path, ("format version %d, this bertlua reads version %d"):format(h.version, M.VERSION)) end
    if h.header_bytes ~= HDR then bad(path, "header size " .. h.header_bytes .. " is wrong") end
    local n = tonumber(h.num_instances)
    local need = HDR + 8 * (n + 1) + tonumber(h.data_bytes)
    if n < 0 or need ~= size then
      bad(path, ("truncated or corrupt: header promises %d bytes, the file has %d"):format(need, size))
    end
    if h.token_bytes ~= 2 and h.token_bytes ~= 4 then bad(path, "token width " .. h.token_bytes .. " is invalid") end
    local ck = C.bl_fnv1a64(self.base + HDR, size - HDR, FNV0)
    if ck ~= h.checksum then bad(path, "checksum mismatch: the file is corrupt") end
    if expect and expect.vocab_hash and h.vocab_hash ~= expect.vocab_hash then
      bad(path, "was made with another vocabulary than " .. tostring(expect.vocab))
    end
    if expect and expect.max_seq_length and h.max_seq_length > expect.max_seq_length then
      bad(path, ("holds sequences of up to %d tokens, more than the %d asked for"):format(h.max_seq_length, expect.max_seq_length))
    end
    local offs = ffi.cast("uint64_t*", self.base + HDR)
    local data_start = HDR + 8 * (n + 1)
    local prev = 0ULL
    for k = 0, n do
      local o = offs[k]
      if o < prev or o > h.data_bytes then bad(path, ("offset %d of record %d is out of range"):format(tonumber(o), k)) end
      prev = o
    end
    self.h, self.n, self.offs, self.data = h, n, offs, self.base + data_start
    self.tb = h.token_bytes
  end)
  if not ok then self:close(); error(err, 0) end
  return self
end

function Shard:close()
  if self.base ~= nil then ffi.C.munmap(self.base, self.size); self.base = nil end
end

-- record k (0-based): L, len_a, M, nsp, token pointer, positions pointer, labels pointer
function Shard:record(k)
  local p = self.data + self.offs[k]
  local hdr = ffi.cast("uint16_t*", p)
  local L, la, Mn = hdr[0], hdr[1], hdr[2]
  local nsp = p[6]
  local need = 8 + L * self.tb + Mn * 2 + Mn * self.tb
  if self.offs[k] + need > self.offs[k + 1] then bad(self.path, "record " .. k .. " overruns its slot") end
  local tok = p + 8
  local pos = ffi.cast("uint16_t*", tok + L * self.tb)
  local lab = ffi.cast("uint8_t*", pos + Mn)
  return L, la, Mn, nsp, tok, pos, lab
end

-- loader ---------------------------------------------------------------------------------
local Loader = {}
Loader.__index = Loader

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

-- Loader{ dir=, split="train" | files={...}, batch_size=, rank=0, world_size=1, seed=,
--         max_seq_length=, max_predictions=, vocab=path (hash check), shuffle=true }
-- Every epoch is a permutation of all instances (seeded by seed and epoch);
-- rank r takes positions r, r+W, r+2W, ... of it, so ranks are disjoint and
-- together cover the epoch (the remainder beyond a multiple of W*batch is
-- dropped so that every rank runs the same number of steps).
function M.Loader(o)
  local files = o.files or list_shards(o.dir or ".", o.split)
  if #files == 0 then
    error(("data: no %s*.blshard files in %s"):format(o.split and (o.split .. "_") or "", tostring(o.dir)), 2)
  end
  local expect = { max_seq_length = o.max_seq_length }
  if o.vocab then expect.vocab_hash, expect.vocab = M.vocab_hash(o.vocab), o.vocab end
  local self = setmetatable({ shards = {}, starts = {}, batch = o.batch_size or 8, rank = o.rank or 0,
    world = o.world_size or 1, seed = o.seed or 0, shuffle = o.shuffle ~= false, epoch = 0, pos = 0,
    max_pred = o.max_predictions }, Loader)
  local total = 0
  for i, path in ipairs(files) do
    local s = M.open_shard(path, expect)
    self.shards[i], self.starts[i] = s, total
    total = total + s.n
    self.max_pred = math.max(self.max_pred or 0, s.h.max_predictions)
    self.dynamic = self.dynamic or bit.band(s.h.flags, 1) ~= 0
    self.masked_lm_prob = s.h.masked_lm_prob
    self.vocab_size = s.h.vocab_size
  end
  self.total = total
  self.per_rank = math.floor(total / self.world)
  self.steps_per_epoch = math.floor(self.per_rank / self.batch)
  if self.steps_per_epoch == 0 then
    error(("data: %d instances are not enough for %d rank(s) x batch %d"):format(total, self.world, self.batch), 2)
  end
  if self.dynamic then
    if not o.vocab then error("data: dynamic-masking shards need vocab= (for [MASK]/[CLS]/[SEP] ids)", 2) end
    local Tok = require "bertlua.tokenizer"
    local tk = Tok.load(o.vocab, { lower = true })
    self.mask_opts = { cls_id = tk.cls_id, sep_id = tk.sep_id, mask_id = tk.mask_id, vocab_size = tk.size,
      max_predictions = self.max_pred, masked_lm_prob = self.masked_lm_prob }
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

-- next() -> batch table of tensors (a new epoch starts transparently)
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

function Loader:state() return { epoch = self.epoch, pos = self.pos, seed = self.seed } end

function Loader:set_state(s)
  if type(s) ~= "table" then error("data: loader state must be a table from state()", 2) end
  if s.seed ~= self.seed then error(("data: loader state has seed %s, this loader %s"):format(tostring(s.seed), tostring(self.seed)), 2) end
  self.epoch, self.pos = s.epoch, s.pos
  self:_permute()
end

function Loader:close()
  for _, s in ipairs(self.shards) do s:close() end
  self.shards = {}
end

return M
