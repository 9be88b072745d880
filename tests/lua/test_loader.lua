-- The C loader (src/data/loader.c) against the Lua reference loader: the same
-- bits for every tensor over several epochs, ranks, static and dynamic
-- (whole-word) masking; exact resume with the prefetch thread running; length
-- binning; shards that fail a check; close and garbage collection.
local T = require "testing"
local ffi = require "ffi"
local pd = require "bertlua.data.pretraining"
local shards = require "bertlua.data.shards"
local ld = require "bertlua.data.loader"
local ref_loader = require "ref_loader"
local Tok = require "bertlua.data.tokenizer"
local syn = require "bertlua.data.synthetic"
local C = ffi.C

local tmp = T.tmpdir()
local vocab = require("fixtures").vocab(tmp, { size = 400 })  -- small: words split into pieces

-- data: the generated corpus, instances made in-process so that flags can be combined
local tok = Tok.load(vocab, { lower = true })
local docs = {}
for _, d in ipairs(syn.documents(syn.world{ seed = 11, countries = 30 }, { copies = 1 })) do
  local doc = {}
  for _, s in ipairs(d.sentences) do local ids = tok:encode(s); if #ids > 0 then doc[#doc + 1] = ids end end
  if #doc > 0 then docs[#docs + 1] = doc end
end
local cont = {}
for id = 0, tok.size - 1 do if tok:token(id):sub(1, 2) == "##" then cont[id] = true end end
local vhash = shards.vocab_hash(vocab)
local function make(name, o)
  local opts = { seed = o.seed or 1, max_seq_length = o.seq or 64, max_predictions = o.pred or 10,
    masked_lm_prob = 0.15,
    short_seq_prob = 0.3, dupe_factor = o.dupe or 1, whole_word = o.whole_word, dynamic_masking = o.dynamic,
    cls_id = tok.cls_id, sep_id = tok.sep_id, mask_id = tok.mask_id, vocab_size = o.vocab_size or tok.size,
    vocab_hash = vhash, is_continuation = cont }
  local lo, hi = o.docs and o.docs[1] or 1, o.docs and o.docs[2] or #docs
  local sub = {}
  for i = lo, hi do sub[#sub + 1] = docs[i] end
  local recs = pd.create(sub, opts)
  os.execute("mkdir -p " .. tmp .. "/" .. name)
  shards.write_shard(("%s/%s/train_%05d.blshard"):format(tmp, name, o.index or 0), recs, opts)
  return #recs
end
local half = math.floor(#docs / 2)
make("static", { index = 0, docs = { 1, half }, seed = 3 })
make("static", { index = 1, docs = { half + 1, #docs }, seed = 4 })
make("dynamic", { dynamic = true, seed = 5 })
make("wwm", { dynamic = true, whole_word = true, seed = 6 })
make("wide", { vocab_size = 70000, seed = 7, pred = 7 })     -- 4-byte token ids
make("long", { seq = 128, pred = 20, dupe = 2, seed = 8 })

local function bytes(t)
  return ffi.string(t:ptr(), t:numel() * 4)
end
local KEYS = { "input_ids", "token_type_ids", "attention_mask", "masked_lm_positions", "masked_lm_labels",
  "next_sentence_labels" }
local function same_batch(a, b, where)
  for _, k in ipairs(KEYS) do
    T.eq(table.concat(a[k]:shape(), "x"), table.concat(b[k]:shape(), "x"), where .. " " .. k .. " shape")
    T.truthy(bytes(a[k]) == bytes(b[k]), where .. " " .. k .. " differs")
  end
end

local function loader(dir, extra)
  local o = { dir = tmp .. "/" .. dir, split = "train", batch_size = 5, seed = 9, max_seq_length = 128,
    max_predictions = 10, vocab = vocab }
  for k, v in pairs(extra or {}) do o[k] = v end
  return (o.impl == "lua" and ref_loader or ld).Loader(o)
end

T.test("C loader == Lua loader, every tensor, several epochs and ranks", function()
  local cases = {
    { "static", {} }, { "static", { shuffle = false } }, { "static", { world_size = 3 } },
    { "static", { max_predictions = 12, batch_size = 4, prefetch = 1 } },
    { "dynamic", {} }, { "dynamic", { world_size = 2, prefetch = 0 } }, { "dynamic", { shuffle = false,
      batch_size = 3 } },
    { "wwm", {} }, { "wwm", { world_size = 2 } }, { "wide", { max_predictions = 0 } }, { "long", { batch_size = 7 } },
  }
  local batches = 0
  for _, c in ipairs(cases) do
    local world = c[2].world_size or 1
    for rank = 0, world - 1 do
      local opts = { rank = rank }
      for k, v in pairs(c[2]) do opts[k] = v end
      local lc = loader(c[1], opts)
      opts.impl = "lua"
      local ll = loader(c[1], opts)
      T.eq(lc.impl, "c"); T.eq(ll.impl, "lua")
      T.eq(lc.steps_per_epoch, ll.steps_per_epoch); T.eq(lc.total, ll.total); T.eq(lc.dynamic, ll.dynamic)
      for s = 1, 3 * lc.steps_per_epoch + 1 do
        same_batch(lc:next(), ll:next(), ("%s %s rank %d batch %d"):format(c[1], table.concat({ tostring(c[2].shuffle),
          tostring(c[2].world_size) }, "/"), rank, s))
        batches = batches + 1
        local a, b = lc:state(), ll:state()
        T.eq(a.epoch, b.epoch); T.eq(a.pos, b.pos)
        local v = ffi.new("int64_t[2]")
        C.bl_loader_get_state(lc.c, v, v + 1)
        T.eq(tonumber(v[0]), a.epoch); T.eq(tonumber(v[1]), a.pos)
      end
      lc:close(); ll:close()
    end
  end
  T.truthy(batches > 300, "compared " .. batches .. " batches")
end)

T.test("dynamic whole-word masks cover whole words", function()
  local l = loader("wwm", { batch_size = 4 })
  T.truthy(l.whole_word, "whole_word from the shard flags")
  local words, partial = 0, 0
  for _ = 1, l.steps_per_epoch do
    local b = l:next()
    local S, P = b.input_ids:size(2), b.masked_lm_positions:size(2)
    local pos, lab, ids = b.masked_lm_positions:totable(), b.masked_lm_labels:totable(), b.input_ids:totable()
    for r = 0, 3 do
      local masked = {}
      for j = 1, P do if lab[r * P + j] >= 0 then masked[pos[r * P + j]] = lab[r * P + j] end end
      for p, id in pairs(masked) do
        if cont[id] then
          -- a masked "##" piece: the piece before it (its word; [CLS]/[SEP] in between
          -- when truncation cut a word) is masked too
          local q = p - 1
          while q > 0 and not masked[q] and (ids[r * S + q + 1] == tok.sep_id) do q = q - 1 end
          if masked[q] then words = words + 1 elseif q > 0 then partial = partial + 1 end
        end
      end
      T.truthy(ids[r * S + 1] == tok.cls_id)
    end
  end
  T.eq(partial, 0, "no word masked in part")
  T.truthy(words > 0, "some multi-piece words were masked")
  l:close()
end)

T.test("resume is exact with the prefetch thread running", function()
  for _, dir in ipairs({ "static", "dynamic" }) do
    for _, pf in ipairs({ 0, 1, 4, 16 }) do
      local l1 = loader(dir, { prefetch = pf, world_size = 2, rank = 1 })
      local steps = l1.steps_per_epoch
      for _ = 1, 3 do l1:next() end
      local st = l1:state()
      T.eq(st.epoch, 0); T.eq(st.pos, 3)
      local ref = {}
      for i = 1, steps + 4 do ref[i] = l1:next() end   -- crosses an epoch
      -- a fresh loader, and the same loader rewound while its thread has batches ready
      local l2 = loader(dir, { prefetch = pf, world_size = 2, rank = 1 })
      l2:set_state(st)
      l1:set_state(st)
      for i = 1, #ref do
        same_batch(l2:next(), ref[i], ("%s prefetch %d fresh %d"):format(dir, pf, i))
        same_batch(l1:next(), ref[i], ("%s prefetch %d rewound %d"):format(dir, pf, i))
      end
      -- the end of an epoch (pos == steps) resumes into the next one; the Lua reference agrees
      local lr = loader(dir, { impl = "lua", world_size = 2, rank = 1 })
      lr:set_state({ epoch = 1, pos = steps, seed = 9 })
      l1:set_state(lr:state())
      same_batch(l1:next(), lr:next(), dir .. " after the end of epoch 1")
      T.eq(l1:state().epoch, 2); T.eq(l1:state().pos, 1)
      -- states move between the two implementations
      lr:next()
      l2:set_state(lr:state())
      same_batch(l2:next(), lr:next(), dir .. " state from the Lua loader")
      l1:close(); l2:close(); lr:close()
    end
  end
  local l = loader("static")
  T.raises(function() l:set_state({ epoch = 0, pos = 1, seed = 10 }) end, "loader state has seed 10")
  T.raises(function() l:set_state({ epoch = 0, pos = l.steps_per_epoch + 1, seed = 9 }) end, "out of range")
  T.raises(function() l:set_state({ epoch = 0, pos = 1, seed = 9, bin_lengths = 64 }) end, "length binning")
  l:close()
end)

T.test("length binning: less padding, each instance once per epoch, deterministic", function()
  local function pass(o)
    local l = loader("long", o)
    for _ = 1, 2 * l.steps_per_epoch do l:next() end
    local st = l:stats()
    l:close()
    return st
  end
  local plain = pass({ batch_size = 4 })
  local binned = pass({ batch_size = 4, bin_lengths = true })
  local small = pass({ batch_size = 4, bin_lengths = 3 })
  T.truthy(binned.padding < 0.5 * plain.padding,
    ("padding %.3f -> %.3f with bin_lengths"):format(plain.padding, binned.padding))
  T.truthy(small.padding < plain.padding, ("padding %.3f -> %.3f with 3-step windows"):format(plain.padding,
    small.padding))
  T.eq(plain.tokens, binned.tokens, "the same tokens")
  for _, window in ipairs({ true, 3 }) do
    for _, world in ipairs({ 1, 3 }) do
      local ls, seen = {}, {}
      for r = 0, world - 1 do ls[r] = loader("long", { batch_size = 4, world_size = world, rank = r,
        bin_lengths = window }) end
      local plain_l = loader("long", { batch_size = 4, world_size = world, rank = 0 })
      local steps = ls[0].steps_per_epoch
      local used = steps * 4 * world
      -- every instance the unbinned epoch uses, once, over all ranks
      local want = {}
      for e = 0, 1 do
        seen[e], want[e] = {}, {}
        for r = 0, world - 1 do
          local pl = r == 0 and plain_l or loader("long", { batch_size = 4, world_size = world, rank = r })
          for p = 0, steps - 1 do
            for b = 0, 3 do
              local i = ls[r]:instance_at(e, p, b)
              T.truthy(not seen[e][i], "instance " .. i .. " twice in epoch " .. e)
              seen[e][i] = true
              want[e][pl:instance_at(e, p, b)] = true
            end
          end
          if pl ~= plain_l then pl:close() end
        end
        local n = 0
        for i in pairs(seen[e]) do n = n + 1; T.truthy(want[e][i], "binning only reorders the epoch") end
        T.eq(n, used)
      end
      -- the batches are those instances, and a fresh loader gives the same order
      local opened = {}
      for _, f in ipairs(shards.list_shards(tmp .. "/long", "train")) do opened[#opened + 1] = shards.open_shard(f) end
      local again = loader("long", { batch_size = 4, world_size = world, rank = world - 1, bin_lengths = window })
      local r = world - 1
      for p = 0, steps + 1 do
        local b = ls[r]:next()
        same_batch(again:next(), b, "binned order is deterministic")
        local e, pp = ls[r]:state().epoch, ls[r]:state().pos - 1
        local S = b.input_ids:size(2)
        local ids = b.input_ids:totable()
        for row = 0, 3 do
          local L, _, _, _, tp = opened[1]:record(ls[r]:instance_at(e, pp, row))
          local t16 = ffi.cast("const uint16_t*", tp)
          for i = 0, L - 1 do T.eq(ids[row * S + i + 1], t16[i]) end
          if L < S then T.eq(ids[row * S + L + 1], 0, "padding after the sequence") end
        end
        T.truthy(p ~= steps + 1 or e == 1)
      end
      -- resume with binning
      local st = again:state()
      T.eq(st.bin_lengths, window == true and ld.BIN_WINDOW or window)
      local ref = again:next()
      local other = loader("long", { batch_size = 4, world_size = world, rank = world - 1, bin_lengths = window })
      other:set_state(st)
      same_batch(other:next(), ref, "binned resume")
      for _, s in ipairs(opened) do s:close() end
      for rr = 0, world - 1 do ls[rr]:close() end
      plain_l:close(); again:close(); other:close()
    end
  end
  T.raises(function() loader("long", { impl = "lua", bin_lengths = true }) end, "needs the C loader")
end)

-- shard bytes with the checksum recomputed, so that the record checks are reached
local function slurp(p) local f = io.open(p, "rb"); local s = f:read("*a"); f:close(); return s end
local function write(p, s) local f = io.open(p, "wb"); f:write(s); f:close() end
local function patch(data, at, new)   -- at: 0-based offset
  local s = data:sub(1, at) .. new .. data:sub(at + #new + 1)
  local buf = ffi.new("uint8_t[?]", #s)
  ffi.copy(buf, s, #s)
  local ck = C.bl_fnv1a64(buf + 80, #s - 80, 14695981039346656037ULL)
  ffi.cast("uint64_t*", buf + 72)[0] = ck
  return ffi.string(buf, #s)
end
local function u16(v) return string.char(v % 256, math.floor(v / 256) % 256) end

T.test("the loader refuses a shard that fails a check, naming the file and the check", function()
  local good = slurp(tmp .. "/static/train_00000.blshard")
  local h = ffi.cast("const bl_shard_header*", good)
  local n = tonumber(h.num_instances)
  local data0 = 80 + 8 * (n + 1)           -- record 0 starts here
  local dir = tmp .. "/bad"
  local function refused(name, data, pattern, max_seq_length)
    os.execute("rm -rf " .. dir .. " && mkdir -p " .. dir)
    write(dir .. "/train_00000.blshard", data)
    local err = T.raises(function()
      ld.Loader{ dir = dir, split = "train", batch_size = 2, max_seq_length = max_seq_length or 64 }
    end, pattern)
    T.truthy(err:find(dir .. "/train_00000.blshard", 1, true), name .. ": names the file: " .. err)
  end
  refused("truncated", good:sub(1, #good - 1), "truncated or corrupt")
  refused("short", good:sub(1, 50), "truncated: 50 bytes")
  refused("magic", "BLSHARDX" .. good:sub(9), "wrong magic")
  refused("checksum", good:sub(1, data0 + 8) .. string.char((good:byte(data0 + 9) + 1) % 256) .. good:sub(data0 + 10),
    "checksum mismatch")
  refused("offset", patch(good, 80 + 8, "\255\255\255\255\0\0\0\0"), "out of range")
  refused("length", patch(good, data0, u16(0)), "record 0 has length 0")
  refused("too long", patch(good, data0, u16(200)), "record 0")
  refused("len_a", patch(good, data0 + 2, u16(1000)), "segment A")
  refused("token", patch(good, data0 + 8 + 2, u16(65000)), "outside the vocabulary")
  refused("max length", good, "more than the 32 asked for", 32)
end)

local function threads()
  for line in io.lines("/proc/self/status") do
    local n = line:match("^Threads:%s*(%d+)")
    if n then return tonumber(n) end
  end
end

T.test("close and garbage collection join the thread; a closed loader says so", function()
  collectgarbage(); collectgarbage()
  local before = threads()
  for i = 1, 40 do
    local l = loader(i % 2 == 0 and "static" or "dynamic", { prefetch = 1 + i % 5 })
    l:next()
    if i % 3 == 0 then l:close() end     -- the others are left to the GC with their thread blocked
    if i % 10 == 0 then collectgarbage(); collectgarbage() end
  end
  collectgarbage(); collectgarbage()
  if before then T.eq(threads(), before, "every prefetch thread was joined") end
  local l = loader("static")
  T.eq(threads(), before and before + 1, "one thread per loader")
  l:close(); l:close()
  T.eq(threads(), before, "close joins it")
  T.raises(function() l:next() end, "closed")
  T.eq(l:state().pos, 0, "a closed loader still tells its position (pretrain saves it after closing)")
end)

T.run()
