-- --checkpoint-activations in the recipes (pretrain, squad, glue; tiny data, dropout on): every step's loss and
-- the saved weights bit-identical to the same run without it; pre-training padded (--unpad=false) and unpadded on
-- the CPU, and on a GPU (the emulated device in CI) in bf16 with --cuda-graph.
-- The fine-tuning models have 3 layers (the last one is not recomputed). test_checkpoint_activations.lua checks the
-- encoder itself (gradients, the buffers shared between layers).
local T = require "testing"
local fx = require("pretrain_fixture").make(T)
local sc = require "squad_compare"
local syn = require "bertlua.data.synthetic"
local exe, sh, tmp = T.exe(), T.sh, fx.tmp

local function same_losses(a, b, steps)
  local la, lb = sc.losses(a), sc.losses(b)
  T.eq(#la, steps, a .. ": steps logged")
  for s = 1, steps do T.eq(lb[s], la[s], ("step %d loss"):format(s)) end
end

for _, unpad in ipairs({ "true", "false" }) do
  T.test("pretrain --unpad=" .. unpad .. ": --checkpoint-activations gives the same losses and weights", function()
    local extra = "--batch1=8 --micro-batch=4 --steps1=3 --unpad=" .. unpad
    fx.run("plain" .. unpad, extra)
    local out = fx.run("ckpt" .. unpad, extra .. " --checkpoint-activations")
    T.truthy(out:find("checkpoint_activations", 1, true), "the option is printed: " .. out)
    local a, b = fx.losses(tmp .. "/plain" .. unpad), fx.losses(tmp .. "/ckpt" .. unpad)
    T.eq(#a, 3, "steps logged")
    for s = 1, 3 do T.eq(b[s], a[s], ("step %d loss"):format(s)) end
    T.truthy(fx.weights(tmp .. "/ckpt" .. unpad) == fx.weights(tmp .. "/plain" .. unpad), "the saved weights differ")
  end)
end

T.test("pretrain on cuda, bf16, --cuda-graph: the same losses and weights with --checkpoint-activations", function()
  if require("bertlua").cuda_device_count() == 0 then T.skip("no CUDA device (the emulated build provides one)") end
  local extra = "--batch1=8 --micro-batch=4 --steps1=4 --device=cuda --precision=bf16 --cuda-graph "
    .. "--checkpoint-interval=0 --eval-batches=1"
  fx.run("cuda_plain", extra)
  fx.run("cuda_ckpt", extra .. " --checkpoint-activations")
  local a, b = fx.records(tmp .. "/cuda_plain"), fx.records(tmp .. "/cuda_ckpt")
  T.eq(#a, 4, "steps logged")
  for s = 1, 4 do
    T.eq(b[s].loss, a[s].loss, ("step %d loss"):format(s))
    T.eq(b[s].grad_norm, a[s].grad_norm, ("step %d gradient norm"):format(s))
  end
  T.truthy(b[4].cuda_graph_launches >= 2, "the checkpointed step ran as a graph: " .. b[4].cuda_graph_launches)
  T.truthy(fx.weights(tmp .. "/cuda_ckpt") == fx.weights(tmp .. "/cuda_plain"), "the saved weights differ")
end)

T.test("squad: --checkpoint-activations gives the same losses and answers", function()
  local world = syn.world{ seed = 7, countries = 12 }
  syn.write_corpus(world, tmp .. "/corpus", { copies = 1 })
  local vo, vrc = sh(("%s recipes/build_vocab.lua --input=%s/corpus --output=%s/sq_vocab.txt --size=400"):format(exe,
    tmp, tmp))
  T.eq(vrc, 0, vo)
  syn.write_squad(world, tmp .. "/train.json", { split = "train" })
  syn.write_squad(world, tmp .. "/dev.json", { split = "dev" })
  T.tiny_model_dir(tmp .. "/qa", { head = "qa", seed = 3, vocab = tmp .. "/sq_vocab.txt",
    config = { vocab_size = #T.read_lines(tmp .. "/sq_vocab.txt"), num_hidden_layers = 3 } })
  local function squad(out, extra)
    local o, rc = sh(("%s recipes/squad.lua --model=%s/qa --train-file=%s/train.json --predict-file=%s/dev.json "
      .. "--output=%s/%s --do-train --do-predict --max-seq-length=64 --doc-stride=32 --max-query-length=16 "
      .. "--batch=8 --predict-batch=5 --lr=2e-3 --epochs=1 --max-steps=3 --seed=1 --threads=1 %s")
      :format(exe, tmp, tmp, tmp, tmp, out, extra))
    T.eq(rc, 0, o)
  end
  squad("sq_plain", "")
  squad("sq_ckpt", "--checkpoint-activations")
  sc.compare(T, tmp .. "/sq_plain", tmp .. "/sq_ckpt", 0, 3)
end)

T.test("glue: --checkpoint-activations gives the same losses", function()

  local gfx = require "fixtures"
  local vocab = gfx.vocab(tmp .. "/g")
  local lines = T.read_lines(gfx.glue(tmp .. "/g", "mrpc"))
  local data = tmp .. "/g/mrpc"
  os.execute("mkdir -p " .. data)
  T.write_file(data .. "/train.tsv", table.concat({ unpack(lines, 1, 65) }, "\n") .. "\n")
  T.tiny_model_dir(tmp .. "/g/cls", { seed = 2, num_labels = 2, vocab = vocab, config = { num_hidden_layers = 3 } })
  local function glue(out, extra)
    local o, rc = sh(("%s recipes/glue.lua --task=mrpc --data-dir=%s --model=%s/g/cls --output=%s/g/%s "
      .. "--do-train --batch=16 --lr=3e-3 --epochs=1 --max-steps=3 --max-seq-length=64 --threads=1 %s")
      :format(exe, data, tmp, tmp, out, extra))
    T.eq(rc, 0, o)
  end
  glue("plain", "")
  glue("ckpt", "--checkpoint-activations")
  same_losses(tmp .. "/g/plain", tmp .. "/g/ckpt", 3)
end)

T.run()
