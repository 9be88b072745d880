-- Pre-training instances, shard files and the loader.
local T = require "testing"
local loader = require "bertlua.data.loader"
local shards = require "bertlua.data.shards"
local Tok = require "bertlua.data.tokenizer"
local syn = require "bertlua.data.synthetic"

local exe = T.exe()
local tmp = T.tmpdir("in")
local vocab = require("fixtures").vocab(tmp)

-- input: the generated corpus (two files) + google's sample text when present
local w = syn.world{ seed = 5, countries = 40 }
local docs = syn.documents(w, { copies = 2 })
for fi = 1, 2 do
  local f = io.open(("%s/in/train_%05d.txt"):format(tmp, fi - 1), "w")
  for i = fi, #docs, 2 do f:write(table.concat(docs[i].sentences, "\n"), "\n\n") end
  f:close()
end
local sample = T.shared_data("pretraining_text/bert_sample_text.txt")
if sample then os.execute("cp " .. sample .. " " .. tmp .. "/in/train_00002.txt") end

local function run(args) return T.sh(exe .. " recipes/create_pretraining_data.lua " .. args) end
local slurp = T.slurp

T.test("instances follow create_pretraining_data's rules", function()
  local out, rc = run(("--input=%s/in --vocab=%s --output=%s/a --max-seq-length=64 --max-predictions=10 " ..
    "--dupe-factor=3 --seed=7")
    :format(tmp, vocab, tmp))
  T.eq(rc, 0, out)
  local tok = Tok.load(vocab, { lower = true })
  local l = loader.Loader{ dir = tmp .. "/a", split = "train", batch_size = 16, seed = 1, max_seq_length = 64,
    max_predictions = 10, vocab = vocab, shuffle = false }
  local masked, tokens, mask_tok, same, nsp1, n = 0, 0, 0, 0, 0, 0
  local seen = 0
  for _ = 1, l.steps_per_epoch do
    local b = l:next()
    local ids, am, tt, mp, ml, ns = b.input_ids:totable(), b.attention_mask:totable(), b.token_type_ids:totable(),
      b.masked_lm_positions:totable(), b.masked_lm_labels:totable(), b.next_sentence_labels:totable()
    local S = b.input_ids:size(2)
    for r = 1, 16 do
      n = n + 1
      nsp1 = nsp1 + ns[r]
      local len = 0
      for s = 1, S do len = len + am[(r - 1) * S + s] end
      T.truthy(len <= 64, "length within max_seq_length")
      T.eq(ids[(r - 1) * S + 1], tok.cls_id, "starts with [CLS]")
      T.eq(ids[(r - 1) * S + len], tok.sep_id, "ends with [SEP]")
      T.eq(tt[(r - 1) * S + 1], 0); T.eq(tt[(r - 1) * S + len], 1)
      tokens = tokens + len - 3
      for j = 1, 10 do
        local lab = ml[(r - 1) * 10 + j]
        if lab >= 0 then
          local p = mp[(r - 1) * 10 + j]
          T.truthy(p > 0 and p < len - 1, "never masks [CLS] or the final [SEP]")
          T.truthy(lab ~= tok.cls_id and lab ~= tok.sep_id, "labels are real tokens")
          masked = masked + 1
          local cur = ids[(r - 1) * S + p + 1]
          if cur == tok.mask_id then mask_tok = mask_tok + 1 elseif cur == lab then same = same + 1 end
        end
      end
      seen = seen + 1
    end
  end
  l:close()
  local frac = masked / tokens
  T.truthy(frac > 0.11 and frac < 0.17, ("~15%% of tokens masked (capped at 10 per sequence): %.3f"):format(frac))
  T.near(mask_tok / masked, 0.8, 0, 0.04)
  T.near(same / masked, 0.1, 0, 0.04)
  -- as in the reference, a chunk holding a single segment always takes a random next
  -- sentence, so short documents push the random fraction a little above one half
  T.truthy(nsp1 / n > 0.42 and nsp1 / n < 0.66, ("about half random next sentences: %.3f"):format(nsp1 / n))
end)

T.test("deterministic, and --jobs=2 writes the same bytes", function()
  local _, rc1 = run(("--input=%s/in --vocab=%s --output=%s/b --max-seq-length=64 --max-predictions=10 " ..
    "--dupe-factor=3 --seed=7 --jobs=2")
    :format(tmp, vocab, tmp))
  T.eq(rc1, 0)
  for _, name in ipairs({ "train_00000.blshard", "train_00001.blshard" }) do
    T.truthy(slurp(tmp .. "/a/" .. name) == slurp(tmp .. "/b/" .. name), name .. " identical")
  end
end)

T.test("ranks are disjoint and cover the epoch; resume is exact", function()
  local function ids_of(rank, world)
    local l = loader.Loader{ dir = tmp .. "/a", split = "train", batch_size = 4, rank = rank, world_size = world,
      seed = 3,
      max_seq_length = 64, max_predictions = 10, vocab = vocab }
    local set = {}
    for _ = 1, l.steps_per_epoch do
      local b = l:next()
      local S = b.input_ids:size(2)
      local v = b.input_ids:totable()
      for r = 0, 3 do
        local row = { unpack(v, r * S + 1, r * S + S) }
        while row[#row] == 0 do row[#row] = nil end   -- padding depends on the batch
        set[#set + 1] = table.concat(row, ",")
      end
    end
    return set, l
  end
  local a, la = ids_of(0, 2)
  local b = ids_of(1, 2)
  -- both ranks walk the same permutation (positions r, r+2, ...): together they take
  -- its first 2*floor(N/2 / batch)*batch entries, the single rank its first floor(N/batch)*batch
  local all, in_all, seen = ids_of(0, 1), {}, {}
  for _, s in ipairs(all) do in_all[s] = true end
  local count = 0
  for _, list in ipairs({ a, b }) do
    for _, s in ipairs(list) do
      T.truthy(not seen[s], "no instance on both ranks")
      seen[s] = true
      if in_all[s] then count = count + 1 end
    end
  end
  T.eq(count, #a + #b, "every instance of the two ranks is in the single rank's epoch")
  T.truthy(#all - (#a + #b) < 2 * 4, "and together they cover it up to one batch per rank")
  T.truthy(#a == #b, "equal steps per rank")
  -- resume: state after 3 batches, then 5 more, equals an uninterrupted run
  local l1 = loader.Loader{ dir = tmp .. "/a", split = "train", batch_size = 4, seed = 9, max_seq_length = 64,
    max_predictions = 10 }
  for _ = 1, 3 do l1:next() end
  local st = l1:state()
  local ref = {}
  for i = 1, l1.steps_per_epoch + 2 do ref[i] = l1:next().input_ids:totable() end  -- crosses an epoch
  local l2 = loader.Loader{ dir = tmp .. "/a", split = "train", batch_size = 4, seed = 9, max_seq_length = 64,
    max_predictions = 10 }
  l2:set_state(st)
  for i = 1, #ref do T.near(l2:next().input_ids:totable(), ref[i]) end
  la:close()
end)

T.test("dynamic masking draws new masks every epoch, reproducibly", function()
  local out, rc = run(("--input=%s/in/train_00000.txt --vocab=%s --output=%s/d --max-seq-length=64 " ..
    "--max-predictions=10 --dupe-factor=1 --dynamic-masking")
    :format(tmp, vocab, tmp))
  T.eq(rc, 0, out)
  local function first_two_epochs()
    local l = loader.Loader{ dir = tmp .. "/d", batch_size = 2, seed = 4, max_seq_length = 64, max_predictions = 10,
      vocab = vocab, shuffle = false }
    local e1 = l:next().masked_lm_positions:totable()
    for _ = 2, l.steps_per_epoch do l:next() end
    local e2 = l:next().masked_lm_positions:totable()
    return e1, e2
  end
  local a1, a2 = first_two_epochs()
  local b1 = first_two_epochs()
  T.near(a1, b1)
  T.truthy(table.concat(a1, ",") ~= table.concat(a2, ","), "epoch 2 masks differ")
  -- with whole-word masking the shard says so (flags 1|2) and the loader masks whole words
  local out2, rc2 = run(("--input=%s/in/train_00000.txt --vocab=%s --output=%s/dw --max-seq-length=64 " ..
    "--max-predictions=10 --dupe-factor=1 --dynamic-masking --whole-word-masking")
    :format(tmp, vocab, tmp))
  T.eq(rc2, 0, out2)
  local s = shards.open_shard(shards.list_shards(tmp .. "/dw", "train")[1])
  T.eq(s.h.flags, 3)
  s:close()
end)

T.test("corrupt or mismatched shards are refused with the reason", function()
  local good = slurp(tmp .. "/a/train_00000.blshard")
  local function bad(name, bytes, pattern, opts)
    local p = tmp .. "/bad/" .. name
    os.execute("mkdir -p " .. tmp .. "/bad")
    local f = io.open(p, "wb"); f:write(bytes); f:close()
    T.raises(function() shards.open_shard(p, opts) end, pattern)
  end
  bad("trunc.blshard", good:sub(1, #good - 10), "truncated or corrupt")
  bad("tiny.blshard", good:sub(1, 20), "truncated: 20 bytes")
  bad("magic.blshard", "XXSHARD1" .. good:sub(9), "wrong magic")
  bad("version.blshard", good:sub(1, 8) .. "\2\0\0\0" .. good:sub(13), "format version 2")
  bad("flip.blshard", good:sub(1, #good - 5) .. string.char((good:byte(#good - 4) + 1) % 256) .. good:sub(#good - 3),
    "checksum mismatch")
  local other = tmp .. "/other_vocab.txt"
  local f = io.open(other, "w"); f:write(slurp(vocab) .. "extra\n"); f:close()
  bad("vocab.blshard", good, "another vocabulary", { vocab_hash = shards.vocab_hash(other), vocab = other })
  T.raises(function() loader.Loader{ dir = tmp .. "/nothing", split = "train", batch_size = 2 } end,
    "no train_*.blshard files")
end)

T.run()
