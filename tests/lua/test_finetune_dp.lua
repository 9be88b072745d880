-- Fine-tuning data parallel: `mpirun -np 2 bertlua recipes/squad.lua` (and
-- glue.lua) against one rank with accumulation 2, same global batch, seed and
-- data, on the CPU (MPI). The two split the same micro-batches, with the same
-- dropout streams, and differ only in how the two halves of the gradient are
-- added (g0/2 + g1/2 vs (g0 + g1) * 0.5: a rounding or two per element), so
-- every step's loss agrees within 1e-6 relative, and the sharded prediction
-- gathered on rank 0 gives the same answers and metrics.
-- test_cuda_squad.lua does the same on cuda (NCCL).
local T = require "testing"
local cjson = require "cjson"
local syn = require "bertlua.data.synthetic"

if not T.sh("command -v mpirun"):find("/", 1, true) then T.skip_all("mpirun not installed") end
local exe, sh = T.exe(), T.sh
local MPIRUN = "mpirun -np 2 --oversubscribe --allow-run-as-root "
local tmp = T.tmpdir()
local world = syn.world{ seed = 7, countries = 12 }
syn.write_corpus(world, tmp .. "/corpus", { copies = 1 })
local vo, vrc = sh(("%s recipes/build_vocab.lua --input=%s/corpus --output=%s/vocab.txt --size=400"):format(exe, tmp,
  tmp))
assert(vrc == 0, vo)
local n = #T.read_lines(tmp .. "/vocab.txt")
syn.write_squad(world, tmp .. "/train.json", { split = "train" })
syn.write_squad(world, tmp .. "/dev.json", { split = "dev" })
T.tiny_model_dir(tmp .. "/init", { head = "qa", seed = 3, vocab = tmp .. "/vocab.txt", config = { vocab_size = n } })

local sc = require "squad_compare"
local losses = sc.losses

local function rel(a, b) return math.abs(a - b) / math.max(math.abs(b), 1e-30) end

local function squad(out, extra, launcher)
  local o, rc = sh(("%s%s recipes/squad.lua --model=%s/init --train-file=%s/train.json --predict-file=%s/dev.json " ..
    "--output=%s/%s --do-train --do-predict --max-seq-length=64 --doc-stride=32 --max-query-length=16 --batch=8 " ..
    "--predict-batch=5 --lr=2e-3 --epochs=1 --max-steps=6 --seed=1 --threads=1 %s"):format(launcher or "", exe, tmp,
      tmp, tmp, tmp, out, extra))
  T.eq(rc, 0, o)
  return o
end

T.test("SQuAD: 2 ranks on the cpu == 1 rank with accumulation 2 (losses, answers, metrics)", function()
  squad("acc2", "--micro-batch=4 --device=cpu")
  -- small buckets: the encoder layers' backward launches most of them (overlap path)
  local out = squad("two", "--device=cpu --bucket-mb=0.01", MPIRUN)
  T.truthy(out:find("batch 8 = 2 ranks x 4 x 1", 1, true), out)
  sc.compare(T, tmp .. "/acc2", tmp .. "/two", 1e-6, 6)
end)

T.test("GLUE (MRPC-style pairs): 2 ranks == 1 rank with accumulation 2", function()
  local fx = require "fixtures"
  local vocab = fx.vocab(tmp .. "/g")
  local lines = T.read_lines(fx.glue(tmp .. "/g", "mrpc"))
  lines[1] = lines[1]:gsub("^\239\187\191", "")
  os.execute("mkdir -p " .. tmp .. "/g/mrpc")
  T.write_file(tmp .. "/g/mrpc/train.tsv", table.concat({ unpack(lines, 1, 65) }, "\n") .. "\n")
  T.write_file(tmp .. "/g/mrpc/dev.tsv", table.concat({ lines[1], unpack(lines, 66, 96) }, "\n") .. "\n")
  T.tiny_model_dir(tmp .. "/g/cls", { seed = 2, num_labels = 2, vocab = vocab })
  local function glue(out, extra, launcher)
    local o, rc = sh(("%s%s recipes/glue.lua --task=mrpc --data-dir=%s/g/mrpc --model=%s/g/cls --output=%s/g/%s " ..
      "--do-train --do-eval --batch=16 --lr=3e-3 --epochs=1 --eval-batch=7 --max-seq-length=64 --threads=1 %s")
      :format(launcher or "", exe, tmp, tmp, tmp, out, extra))
    T.eq(rc, 0, o)
  end
  glue("acc2", "--micro-batch=8")
  glue("two", "--bucket-mb=0.01", MPIRUN)
  local la, lb = losses(tmp .. "/g/acc2"), losses(tmp .. "/g/two")
  T.eq(#lb, 4)
  for s = 1, 4 do T.truthy(rel(lb[s], la[s]) <= 1e-6, ("step %d: %.9g vs %.9g"):format(s, lb[s], la[s])) end
  T.eq(T.slurp(tmp .. "/g/two/dev_predictions_mrpc.tsv"), T.slurp(tmp .. "/g/acc2/dev_predictions_mrpc.tsv"))
  local ea = cjson.decode(T.slurp(tmp .. "/g/acc2/eval_results.json"))
  local eb = cjson.decode(T.slurp(tmp .. "/g/two/eval_results.json"))
  for k, v in pairs(ea) do T.eq(eb[k], v, k) end
end)

T.run()
