-- shard.lua: split documents into sentences, shuffle them deterministically and
-- deal them into balanced train/test shards, with bounded memory.
--   bertlua recipes/shard.lua --input=data/wiki,data/books --output=data/shards --num-shards=256
-- Input: directories of .txt files in the inter-stage format (see below).
-- Output: DIR/train_NNNNN.txt and DIR/test_NNNNN.txt (one sentence per line, a
-- blank line between documents: create_pretraining_data.py's input) and
-- DIR/shards.json (counts per shard; written last, so it marks completion).
-- The train/test split is by document. Memory: documents are spilled to
-- K bucket files by a random key (pass 1), and each bucket is sorted in memory
-- (pass 2); K grows as --memory-mb shrinks, and the output does not depend on K.
local corpus = require "bertlua.data.corpus"
local options = require "bertlua.util.options"

local o = options.parse(arg, {
  { "input", "", "input directories, comma-separated" },
  { "output", "", "output directory" },
  { "num_shards", 256, "training shards" },
  { "num_test_shards", -1, "test shards (-1: round(num_shards * test_fraction), at least 1)" },
  { "test_fraction", 0.1, "fraction of documents that go to the test shards" },
  { "seed", 12345, "shuffle / split seed" },
  { "memory_mb", 1024, "memory budget for the in-memory pass", int = false },
  { "keep_titles", false, "keep each document's title as its first sentence" },
}, { name = "shard",
  usage = "usage: bertlua recipes/shard.lua --input=DIR[,DIR2] --output=DIR --num-shards=N\n" ..
    "       [--test-fraction=0.1] [--seed=S] [--memory-mb=M]",
  description = corpus.FORMAT_HELP })
local s = corpus.run_stage("shard", o, corpus.shard)
print(("documents %d (empty %d), sentences %d, buckets %d"):format(s.input_docs, s.empty_docs, s.sentences, s.buckets))
for _, name in ipairs { "train", "test" } do
  local t = s[name]
  if t.shards > 0 then
    print(("%s: %d shards, %d docs, %d sentences, %.1f MB, shard bytes min %d max %d"):format(name, t.shards,
      t.docs, t.sentences, t.bytes / 1e6, t.min_bytes, t.max_bytes))
  end
end
print(("%.2f s, peak RSS %.0f MB (VmHWM)"):format(s.seconds, s.peak_rss_mb))
