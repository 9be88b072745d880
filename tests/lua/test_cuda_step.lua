-- The training step stays on the device (issue 13/14 "no host sync"), beyond what test_cuda_pretrain checks on its
-- runs that log every step: logging every 4th step, the log lines are the only host waits (the index checks,
-- the loss and accuracy sums and the fp16 loss scaler's decisions stay on the device), and a bad token id,
-- checked late, is still a clear error naming the op. Needs a CUDA device (the emulated one in CI).
local T = require "testing"
local bl = require "bertlua"

if bl.cuda_device_count() == 0 then T.skip_all("no CUDA device (the emulated build provides one)") end

local fx = require("pretrain_fixture").make(T)
local tmp, records = fx.tmp, fx.records

local function run(out, extra)
  local o, rc = fx.pretrain(tmp .. "/" .. out, extra)
  T.eq(rc, 0, o)
  return o
end

T.test("one host wait per log line: --log-every=4", function()
  run("every4", "--batch1=8 --micro-batch=8 --steps1=12 --log-every=4 --checkpoint-interval=0 --eval-batches=1 "
    .. "--device=cuda --precision=fp16 --loss-scale=dynamic:16777216:3")
  local r = records(tmp .. "/every4")
  T.eq(#r, 3, "log lines")
  fx.step_stays_on_device(tmp .. "/every4", "log every 4")
end)

T.test("a token id outside the model's vocabulary: a clear error naming the op, at the next log line", function()
  local cfg = tmp .. "/cfg_small_vocab.json"
  T.write_file(cfg, '{"vocab_size":100,"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":2,'
    .. '"intermediate_size":128,"max_position_embeddings":64}')
  -- without --vocab: with it the recipe refuses the 600-token vocabulary for a 100-word model before any step
  -- (a clear error too); this test is about the device's own check of the ids it is given
  local cmd = fx.command(tmp .. "/badid", "--batch1=8 --micro-batch=8 --steps1=3 --device=cuda --model=" .. cfg)
  local out, rc = T.sh((cmd:gsub("%-%-vocab=%S+ ", "")))
  T.eq(rc, 1, out)
  T.truthy(out:find("embedding_layernorm: id ", 1, true)
    and out:find("is out of range for vocabulary size 100", 1, true)
    and out:find("deferred check", 1, true), out)
end)

T.run()
