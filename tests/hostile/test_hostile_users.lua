-- Hostile-input suite: a new user's own models and settings (issue 29). Each
-- case once printed a Lua traceback or trained on silently; each must now be
-- one clear line (or, where the input is valid, a run without a Lua position).
package.path = arg[0]:gsub("[^/]*$", "") .. "?.lua;" .. package.path
local H = require "harness"

local fx, case, R = H.fx, H.case, H.R

-- no Lua position (recipes/x.lua:12:) in a run that succeeded
local function no_position(_, out)
  local at = out:match("[%w_/%.]+%.lua:%d+:")
  if at then return false, "a Lua position in the output: " .. at end
  return true
end

case { class = "model limits", name = "squad.lua: default --max-seq-length=384 on a model with 128 positions",
  expect = { "squad: --max-seq-length=384 is longer than the model's 128 positions", "--max-seq-length=128 or less" },
  setup = function(d)
    return ("%ssquad.lua --model=%s --train-file=%s --do-train --output=%s/o --max-steps=1 --batch=4"):format(R,
      fx.qa_model, fx.squad_file, d)
  end }

case { class = "model limits", name = "predict.lua: --max-seq-length=200 past the position table",
  expect = { "predict: --max-seq-length=200 is longer than the model's 128 positions (max_position_embeddings" },
  setup = function(d)
    return ("%spredict.lua --model=%s --task=squad --input=%s --max-seq-length=200 --output=%s/p.json"):format(R,
      fx.qa_model, fx.squad_file, d)
  end }

-- valid: predict's default length follows the model (at most 384)
case { class = "model limits", name = "predict.lua: the default --max-seq-length on a model with 128 positions",
  setup = function(d)
    return ("%spredict.lua --model=%s --task=squad --input=%s --output=%s/p.json"):format(R, fx.qa_model,
      fx.squad_file, d)
  end,
  check = function(d, out)
    if not io.open(d .. "/p.json") then return false, "no predictions written" end
    return no_position(d, out)
  end }

case { class = "model limits", name = "pretrain.lua: shards longer than --seq1",
  expect = { "pretrain: --data-phase1=", "holds sequences of up to 64 tokens, more than the 32 asked for (--seq1=32)" },
  setup = function(d)
    return fx.PT:gsub("%-%-seq1=64", "--seq1=32") .. " --output=" .. d .. "/o"
  end }

-- valid: the note says there is nothing to evaluate on, once, without a Lua position
case { class = "model limits", name = "pretrain.lua: no held-out shards for evaluation",
  setup = function(d) return fx.PT .. " --eval-interval=1 --output=" .. d .. "/o" end,
  check = function(d, out, rc)
    local _, n = out:gsub("pretrain: no held%-out shards for evaluation %(no test_%*%.blshard in ", "")
    if rc == 0 and n ~= 1 then return false, ("the note came %d times, want once"):format(n) end
    return no_position(d, out)
  end }

case { class = "model limits", name = "pretrain.lua: held-out shards longer than the phase's length",
  expect = { "pretrain: --eval-data=", "more than the 32 asked for (--seq1=32)" },
  setup = function(d)
    -- training shards of 32 tokens; held-out shards of 64
    os.execute(("mkdir -p %s/in32 %s/in64 && cp %s %s/in32/train_00000.txt && cp %s %s/in64/test_00000.txt")
      :format(d, d, fx.corpus, d, fx.corpus, d))
    local make = "%screate_pretraining_data.lua --input=%s/in%d --vocab=%s --output=%s/s%d --dupe-factor=1 "
      .. "--max-seq-length=%d --max-predictions=10 >/dev/null && "
    return make:format(R, d, 32, fx.vocab, d, 32, 32) .. make:format(R, d, 64, fx.vocab, d, 64, 64)
      .. fx.PT:gsub("%-%-seq1=64", "--seq1=32"):gsub("%-%-data%-phase1=%S+", "--data-phase1=" .. d .. "/s32")
      .. " --eval-data=" .. d .. "/s64 --output=" .. d .. "/o"
  end,
  check = function(d)  -- before training, not after the phase
    return not io.open(d .. "/o/checkpoints/phase1/ckpt-00000002/state.json"), "it trained before refusing"
  end }

case { class = "model limits", name = "pretrain.lua: --phase=2 without a phase-1 model",
  expect = { "pretrain: --phase=2 starts from phase 1's model: pass --init=DIR", "--init-random" },
  setup = function(d)
    return fx.PT:gsub("%-%-phase=1", "--phase=2"):gsub("%-%-data%-phase1=", "--data-phase2=")
      .. " --seq2=64 --pred2=10 --batch2=8 --steps2=2 --output=" .. d .. "/o"
  end,
  check = function(d) return not io.open(d .. "/o/phase2/model.safetensors"), "a phase-2 model was written" end }

case { class = "bad option", name = "convert.lua: a bert_config.json given as --config",
  expect = { "is a model configuration, but --config takes a file of option values: pass it as --bert-config=" },
  setup = function(d)
    return ("%sconvert.lua --input=%s --config=%s/config.json --output=%s/o"):format(R, fx.model, fx.model, d)
  end }

case { class = "bad option", name = "convert.lua: an unknown --head",
  expect = { "convert: --head must be auto, pretraining, qa, classification or model, got bogus" },
  setup = function(d) return ("%sconvert.lua --input=%s --output=%s/o --head=bogus"):format(R, fx.model, d) end }

case { class = "bad option", name = "export_onnx.lua: --head=qa on a classifier",
  expect = { "export_onnx: --head=qa needs the qa head's weights, but", "holds a classification model" },
  setup = function(d) return ("%sexport_onnx.lua --model=%s --output=%s/m.onnx --head=qa"):format(R, fx.model, d) end,
  check = function(d) return not io.open(d .. "/m.onnx"), "a file was written" end }

case { class = "bad option", name = "export_onnx.lua: an unknown --head",
  expect = { "export_onnx: --head must be auto, qa, cls, mlm or none, got bert" },
  setup = function(d)
    return ("%sexport_onnx.lua --model=%s --output=%s/m.onnx --head=bert"):format(R, fx.model, d)
  end }

case { class = "bad option", name = "export_onnx.lua: --output in a missing directory",
  expect = { "export_onnx: --output=", "does not exist" },
  setup = function(d) return ("%sexport_onnx.lua --model=%s --output=%s/none/m.onnx"):format(R, fx.model, d) end }

H.report("hostile inputs, a user's own models: one clear line, no traceback")
