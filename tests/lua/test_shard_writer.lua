-- The C shard writer (bertlua.data.shards.write_shard over bl_shard_writer)
-- against a Lua writer built from the format in src/bl_loader.h, on random
-- records: the same bytes for 2- and 4-byte token ids, static and dynamic
-- masking, an empty shard; records the reader would refuse are refused.
local T = require "testing"
local shards = require "bertlua.data.shards"
local ref = require "ref_shard_writer"
local rng = require "bertlua.util.rng"

local dir = T.tmpdir("shard_writer")

local function random_records(seed, n, vocab, max_len, masked)
  local draw = rng(seed)
  local recs = {}
  for k = 1, n do
    local L = draw(max_len)
    local r = { tokens = {}, pos = {}, lab = {}, len_a = draw(L + 1) - 1, nsp = k % 2 }
    for i = 1, L do r.tokens[i] = draw(vocab) - 1 end
    if masked then
      for i = 1, math.min(L, draw(5)) do r.pos[i], r.lab[i] = draw(L) - 1, draw(vocab) - 1 end
    end
    recs[k] = r
  end
  return recs
end

local function header(vocab, dynamic)
  return { vocab_hash = 0x123456789ULL, vocab_size = vocab, max_seq_length = 40, max_predictions = 5,
    dynamic_masking = dynamic, whole_word = dynamic, masked_lm_prob = 0.15, seed = 12345 }
end

T.test("C writer == the format written field by field", function()
  for i, case in ipairs({ { 30522, false }, { 70000, false }, { 30522, true }, { 100, false } }) do
    local o = header(case[1], case[2])
    local recs = random_records(i, i == 4 and 0 or 37, case[1], 40, not case[2])
    local path = ("%s/case%d.blshard"):format(dir, i)
    shards.write_shard(path, recs, o)
    local got = T.slurp(path)
    T.truthy(got == ref.bytes(recs, o), ("case %d: %d bytes differ from the reference"):format(i, #got))
    local s = shards.open_shard(path)  -- and the reader accepts it
    T.eq(s.n, #recs)
    s:close()
  end
end)

T.test("records the reader would refuse are refused, naming the file, and nothing is written", function()
  local path = dir .. "/bad.blshard"
  local o = header(100, false)
  local function try(rec, what)
    T.raises(function() shards.write_shard(path, { rec }, o) end, what)
    T.truthy(io.open(path) == nil, "no file after a refused record")
  end
  try({ tokens = { 1, 200 }, pos = {}, lab = {}, len_a = 1, nsp = 0 }, "token[1] = 200 is outside [0, 100)")
  try({ tokens = { 1, 2 }, pos = { 2 }, lab = { 3 }, len_a = 1, nsp = 0 }, "position[0] = 2 is outside [0, 2)")
  try({ tokens = {}, pos = {}, lab = {}, len_a = 0, nsp = 0 }, "bad.blshard: record 0: length 0")
  local long = {}
  for i = 1, 41 do long[i] = 1 end
  try({ tokens = long, pos = {}, lab = {}, len_a = 1, nsp = 0 }, "length 41")
end)

T.run()
