-- tiny_vocab(T, dir, world) -> vocabulary size: a WordPiece vocabulary
-- (dir/vocab.txt, at most 400 entries) built by recipes/build_vocab.lua from
-- the generated corpus of a bertlua.data.synthetic world, for tiny models in
-- the recipe tests.
local syn = require "bertlua.data.synthetic"

return function(T, dir, world)
  syn.write_corpus(world, dir .. "/corpus", { copies = 1 })
  local out, rc = T.sh(("%s recipes/build_vocab.lua --input=%s/corpus --output=%s/vocab.txt --size=400")
    :format(T.exe(), dir, dir))
  assert(rc == 0, "build_vocab failed: " .. out)
  local n = 0
  for _ in io.lines(dir .. "/vocab.txt") do n = n + 1 end
  return n
end
