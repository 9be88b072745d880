-- Setup shared by the tests that run a recipe on cuda against the cpu
-- (test_cuda_squad, test_cuda_inference): the test is skipped without a CUDA
-- device (the emulated build provides one); otherwise a bertlua.data.synthetic
-- world of 12 countries from `seed`, and a WordPiece vocabulary (at most 400
-- entries) built by recipes/build_vocab.lua from its corpus in a fresh
-- directory.
--   local s = require("cuda_recipe_setup")(T, seed)
--   -> { tmp = dir (dir/vocab.txt), world = world, vocab_size = n }
local bl = require "bertlua"
local syn = require "bertlua.data.synthetic"

return function(T, seed)
  if bl.cuda_device_count() == 0 then T.skip_all("no CUDA device (the emulated build provides one)") end
  local tmp = T.tmpdir()
  local world = syn.world{ seed = seed, countries = 12 }
  syn.write_corpus(world, tmp .. "/corpus", { copies = 1 })
  local out, rc = T.sh(("%s recipes/build_vocab.lua --input=%s/corpus --output=%s/vocab.txt --size=400")
    :format(T.exe(), tmp, tmp))
  assert(rc == 0, "build_vocab failed: " .. out)
  local n = 0
  for _ in io.lines(tmp .. "/vocab.txt") do n = n + 1 end
  return { tmp = tmp, world = world, vocab_size = n }
end
