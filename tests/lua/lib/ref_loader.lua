-- ref_loader: the reference batch loader, in Lua: bertlua.data.loader's C
-- loader must give the same bits for the same options (tests/lua/test_loader.lua).
local bl = require "bertlua.tensor"
local ffi = require "ffi"
local syn = require "bertlua.data.synthetic"
local pd = require "bertlua.data.pretraining"
local shards = require "bertlua.data.shards"
local loader = require "bertlua.data.loader"

local M = {}

local Loader = {}
Loader.__index = Loader

-- Loader(o): the options of bertlua.data.loader's Loader, without prefetch and bin_lengths
function M.Loader(o)
  if o.bin_lengths then error("data: bin_lengths needs the C loader", 2) end
  local files = o.files or shards.list_shards(o.dir or ".", o.split)
  local expect = { max_seq_length = o.max_seq_length }
  if o.vocab then expect.vocab_hash, expect.vocab = shards.vocab_hash(o.vocab), o.vocab end
  local self = setmetatable({ impl = "lua", shards = {}, starts = {}, batch = o.batch_size or 8, rank = o.rank or 0,
    world = o.world_size or 1, seed = o.seed or 0, shuffle = o.shuffle ~= false, epoch = 0, pos = 0,
    max_pred = o.max_predictions }, Loader)
  local total, whole_word = 0, false
  for i, path in ipairs(files) do
    local s = shards.open_shard(path, expect)
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
    local v = loader.mask_vocab(o.vocab, whole_word)
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
      local out, posl, labl = pd.mask(toks, self.mask_opts, rng)
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
  loader.check_state(self, s)
  self.epoch, self.pos = s.epoch, s.pos
  self:_permute()
end

function Loader:close()
  for _, s in ipairs(self.shards) do s:close() end
  self.shards = {}
end

return M
