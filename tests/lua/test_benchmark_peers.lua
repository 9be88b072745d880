-- recipes/benchmark.lua against today's real CPU peers (.venv-peers/, made by bash scripts/peers.sh, or
-- $BL_PEER_PYTHON): every --compare path end to end on a tiny model, a few steps, one thread. It checks that each
-- peer runs what it says (version, precision, compile time apart) on the same rows and that its rate is read back
-- into a ratio; it times nothing worth keeping. Skipped when today's peers are not made.
local T = require "testing"

local exe = T.exe()
local py = os.getenv("BL_PEER_PYTHON") or ".venv-peers/bin/python"
if not io.open(py) then
  T.skip_all("today's peers not made: bash scripts/peers.sh (or set BL_PEER_PYTHON)")
end
local common = "--model=tiny --seq=32 --batch=4 --steps=2 --warmup=1 --threads=1 --python=" .. py

local function run(extra)
  return T.sh(("%s recipes/benchmark.lua %s %s 2>&1"):format(exe, common, extra))
end
-- runs --compare=peer with `extra` options: its lines `says` (patterns), its rate and the ratio are printed
local function check(peer, extra, says)
  local out, rc = run("--compare=" .. peer .. " " .. extra)
  T.eq(rc, 0, out)
  for _, s in ipairs(says) do T.truthy(out:find(s), extra .. ": no '" .. s .. "' in\n" .. out) end
  local p = peer:gsub("%-", "%%-")
  T.truthy(out:find("\n" .. p .. ": [%d%.]+ seq/s"), out)
  T.truthy(out:find("ratio bertlua/" .. p .. ": [%d%.]+x"), out)
  return out
end

T.test("openvino: fp32, bf16 and int8 (NNCF) on the same rows, alternating rounds", function()
  check("openvino", "--infer --rounds=2 --lengths=full", { "INFERENCE_PRECISION_HINT=f32 %(compiled: f32",
    "round 2: ratio bertlua/openvino" })
  -- bf16: what the CPU runs (compiled: bf16 where it has bf16 math; OpenVINO may fall back to f32 elsewhere)
  check("openvino", "--infer --precision=bf16", { "INFERENCE_PRECISION_HINT=bf16" })
  check("openvino", "--infer --precision=int8", { "int8 nncf [%d%.]+ post%-training quantization" })
end)

T.test("onnxruntime (today's): fp32 fused graph and int8 quantize_dynamic", function()
  check("onnxruntime", "--infer", { "fused graph: {[^}]*Attention", ", fp32\n" })
  check("onnxruntime", "--infer --precision=int8", { "int8 quantize_dynamic" })
end)

T.test("torch 2 eager: training step, and bf16 inference under autocast", function()
  check("torch", "", { "torch peer: torch 2[%d%.]*[^,]*, eager, fp32, attention sdpa" })
  check("torch", "--infer --precision=bf16", { "torch peer: torch [^,]*, eager, bf16 autocast" })
end)

-- the training step only: compiling takes minutes on a loaded 2-core machine, and --infer runs the same code
T.test("torch.compile: the training step, compile time printed apart", function()
  check("torch-compile", "", { "torch%-compile peer: [^\n]*torch%.compile of the encoder",
    "torch%-compile peer: compile %(first call%) [%d%.]+ s, not in the rate" })
end)

-- accuracy_delta.sh's line for every side and precision: "METRIC SIDE PRECISION" then fp32_tail (fp32) or
-- delta_tail (the others: the delta from the side's own fp32)
local function expect_rows(out, metric, fp32_tail, delta_tail)
  for _, side in ipairs({ "bertlua fp32", "bertlua bf16", "bertlua int8", "torch fp32", "torch bf16",
    "onnxruntime fp32", "onnxruntime int8", "openvino fp32", "openvino bf16", "openvino int8" }) do
    T.truthy(out:find(metric .. " " .. side .. (side:match("fp32$") and fp32_tail or delta_tail)), side .. ": " .. out)
  end
end

T.test("accuracy rows: bertlua and each peer at fp32, bf16 and int8 on one classifier", function()
  local dir = T.tmpdir("acc")
  local words = { "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "good", "bad", "film", "slow", "fine", "very",
    "dull", "fun", "it", "is", "." }
  T.write_file(dir .. "/vocab.txt", table.concat(words, "\n") .. "\n")
  T.tiny_model_dir(dir .. "/model", { vocab = dir .. "/vocab.txt", seed = 3, config = { vocab_size = #words } })
  local rows = { "sentence\tlabel" }
  for i = 1, 12 do
    rows[#rows + 1] = ("it is %s %s film .\t%d"):format(i % 3 == 0 and "very" or "a", words[6 + i % 9], i % 2)
  end
  T.write_file(dir .. "/dev.tsv", table.concat(rows, "\n") .. "\n")
  local out, rc = T.sh(("BERTLUA=%s BL_PEER_PYTHON=%s bash tools/peers/accuracy_delta.sh %s/model %s/dev.tsv 8 1 2>&1")
    :format(exe, py, dir, dir))
  T.eq(rc, 0, out)
  expect_rows(out, "accuracy", ": [%d%.]+ %%, 8 rows", ": [%d%.]+ %%, [-+][%d%.]+ points from its fp32, 8 rows")
  -- every fp32 side computes the same model on the same rows
  local fp32 = {}
  for a in out:gmatch("accuracy %a+ fp32: ([%d%.]+) %%") do fp32[#fp32 + 1] = a end
  T.eq(#fp32, 4, out)
  for i = 2, 4 do T.eq(fp32[i], fp32[1], out) end
end)

T.test("accuracy rows: SQuAD F1 of bertlua and each peer at fp32, bf16 and int8 on one QA model", function()
  local dir = T.tmpdir("acc_squad")
  local words = { "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "dog", "sat", "on", "mat", "rug", "who",
    "where", "what", "did", "ran", "to", "a", "park", "?", "." }
  T.write_file(dir .. "/vocab.txt", table.concat(words, "\n") .. "\n")
  T.tiny_model_dir(dir .. "/model", { vocab = dir .. "/vocab.txt", seed = 5, head = "qa",
    config = { vocab_size = #words, max_position_embeddings = 192 } })
  local function squad(n)
    local qas, ctx = {}, "the cat sat on the mat . the dog ran to a park . the cat ran to the rug ."
    for i = 1, n do
      local q = ({ "where did the cat sit ?", "who ran to a park ?", "where did the dog run ?" })[1 + i % 3]
      -- long answers: a random QA head's spans overlap them, so the F1s are not all 0
      local a = ({ { "cat sat on the mat . the dog ran", 4 }, { "dog ran to a park . the cat ran", 29 },
        { "the mat . the dog ran to a park", 15 } })[1 + i % 3]
      qas[i] = { id = "q" .. i, question = q, answers = { { text = a[1], answer_start = a[2] } } }
    end
    return require("cjson").encode({ version = "1.1", data = { { title = "t", paragraphs = {
      { context = ctx, qas = qas } } } } })
  end
  T.write_file(dir .. "/eval.json", squad(6))
  T.write_file(dir .. "/train.json", squad(4))
  local out, rc = T.sh(("BERTLUA=%s BL_PEER_PYTHON=%s bash tools/peers/accuracy_delta.sh %s/model %s/eval.json 0 1 "
    .. "%s/train.json 2>&1"):format(exe, py, dir, dir, dir))
  T.eq(rc, 0, out)
  expect_rows(out, "f1", ": [%d%.]+, 6 questions", ": [%d%.]+, [-+][%d%.]+ points from its fp32, 6")
  -- the peers compute the same model on the same windows (bertlua makes its own windows)
  local fp32 = {}
  for a in out:gmatch("f1 %a+ fp32: ([%d%.]+),") do fp32[#fp32 + 1] = a end
  T.eq(#fp32, 4, out)
  T.truthy(tonumber(fp32[2]) > 0, out)
  for i = 3, 4 do T.eq(fp32[i], fp32[2], out) end
end)

T.run()
