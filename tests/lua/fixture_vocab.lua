-- A WordPiece vocabulary made at test time, so tests need nothing outside the
-- repository: build_vocab.lua learns it from bertlua.synthetic's generated
-- corpus (plus the words in `extra`, so tests can count on them).
--   local vocab = dofile("tests/lua/fixture_vocab.lua")(dir[, { size = 2000, extra = { "hello" } }])
return function(dir, o)
  local T = require "bertlua.testing"
  local syn = require "bertlua.synthetic"
  o = o or {}
  local corpus = syn.write_corpus(syn.world { seed = o.seed or 11, countries = 40 }, dir .. "/fixture_corpus")
  if o.extra then
    local f = assert(io.open(corpus, "ab"))
    f:write("\n", table.concat(o.extra, " "), "\n")
    f:close()
  end
  local path = dir .. "/fixture_vocab.txt"
  local out, rc = T.sh(("%s recipes/build_vocab.lua --input=%s --output=%s --size=%d"):format(T.exe(), corpus, path,
    o.size or 2000))
  if rc ~= 0 then error("fixture vocabulary: build_vocab.lua failed:\n" .. out, 2) end
  return path
end
