-- recipes/export_onnx.lua (bertlua.io.onnx, bertlua.io.protobuf): the file bertlua
-- writes passes onnx.checker; onnxruntime running it gives bertlua's outputs
-- within 1e-5 (fp32) for every head, at two batch sizes and lengths when the
-- dimensions are dynamic and at the fixed ones otherwise; onnxruntime's
-- transformer optimizer fuses it (Attention, SkipLayerNormalization, Gelu); a
-- SQuAD model served by onnxruntime gives predict.lua's answers; bad input is
-- one line each. tests/py/onnx_check.py runs the Python side (skips without
-- onnx/onnxruntime); the real MiniLM weights are in test_onnx_minilm.lua.
local T = require "testing"
local bl = require "bertlua"
local bert = require "bertlua.bert"
local pretrained = require "bertlua.pretrained"
local st = require "bertlua.io.safetensors"
local cjson = require "cjson"

local PY = os.getenv("BL_PYTHON") or "/usr/bin/python3"
local exe, tmp = T.exe(), T.tmpdir()
local sh = T.sh

local function export(args) return sh(("%s recipes/export_onnx.lua %s"):format(exe, args)) end

-- check(onnx, ref[, extra]) -> tests/py/onnx_check.py's JSON (the test skips when onnxruntime is missing)
local function check(path, ref, extra)
  local out, rc = sh(("%s tests/py/onnx_check.py %s %s %s"):format(PY, path, ref, extra or ""))
  if rc == 77 then T.skip(out) end
  T.eq(rc, 0, out)
  return cjson.decode(out:match("({\"inputs\".*})") or error("no JSON from onnx_check.py: " .. out))
end

local CFG = { vocab_size = 99, hidden_size = 32, num_hidden_layers = 2, num_attention_heads = 4,
  intermediate_size = 64, max_position_embeddings = 40, hidden_dropout_prob = 0.1 }
local CLASSES = { qa = "BertForQuestionAnswering", cls = "BertForSequenceClassification",
  mlm = "BertForPreTraining", none = "BertModel" }

-- a model directory with every parameter random (biases and LayerNorms too, so a misplaced tensor shows)
local function random_model(head, seed)
  local dir = ("%s/%s"):format(tmp, head)
  local m = bert[CLASSES[head]](bert.config.new(CFG), { seed = seed, num_labels = 3 })
  bl.manual_seed(seed)
  m.flat_params:copy_(bl.randn({ m.flat_params:numel() }) * 0.3)
  pretrained.save_pretrained(m, dir, {})
  return dir
end

-- a batch of B sequences of length S, the later ones padded (every sequence keeps at least 3 tokens)
local function batch(B, S, seed)
  local r = require("bertlua.util.rng")(seed)
  local ids, tt, am = {}, {}, {}
  for b = 1, B do
    local n = math.max(3, S - (b - 1) * 3)
    ids[b], tt[b], am[b] = {}, {}, {}
    for i = 1, S do
      ids[b][i] = i <= n and r(CFG.vocab_size) - 1 or 0
      tt[b][i] = (i <= n and i > n / 2) and 1 or 0
      am[b][i] = i <= n and 1 or 0
    end
  end
  local function t(v) return bl.from(v, { dtype = "i32" }) end
  return { input_ids = t(ids), token_type_ids = t(tt), attention_mask = t(am) }
end

-- reference(dir, head, b, path): bertlua's outputs on batch b, with the inputs, as safetensors at path
local function reference(dir, head, b, path)
  local m = pretrained.from_pretrained(dir, { quiet = true })
  m:eval()
  local o = m:forward(b)
  local list = { { "input_ids", b.input_ids:to("i64") }, { "token_type_ids", b.token_type_ids:to("i64") },
    { "attention_mask", b.attention_mask:to("i64") } }
  if head == "qa" then
    list[#list + 1] = { "start_logits", o.start_logits }
    list[#list + 1] = { "end_logits", o.end_logits }
  elseif head == "cls" then
    list[#list + 1] = { "logits", o.logits }
  elseif head == "mlm" then
    local B, S, H = o.sequence_output:size(1), o.sequence_output:size(2), CFG.hidden_size
    local lg = m.cls.predictions:forward(o.sequence_output:contiguous():view({ B * S, H }),
      m.bert.embeddings.word_embeddings.weight)
    list[#list + 1] = { "logits", lg:view({ B, S, CFG.vocab_size }) }
  else
    list[#list + 1] = { "last_hidden_state", o.last_hidden_state or o.sequence_output }
  end
  st.save(path, list)
  return path
end

local OUTPUTS = { qa = { "start_logits", "end_logits" }, cls = { "logits" }, mlm = { "logits" },
  none = { "last_hidden_state" } }

T.test("every head: onnx.checker passes and onnxruntime equals bertlua within 1e-5 at two shapes", function()
  for i, head in ipairs({ "qa", "cls", "mlm", "none" }) do
    local dir = random_model(head, 10 + i)
    local path = ("%s/%s.onnx"):format(tmp, head)
    local out, rc = export(("--model=%s --output=%s --dynamic-batch --dynamic-seq"):format(dir, path))
    T.eq(rc, 0, out)
    T.truthy(out:find("head " .. head, 1, true), out)
    for k, shape in ipairs({ { 2, 8 }, { 3, 13 } }) do
      local ref = reference(dir, head, batch(shape[1], shape[2], k), ("%s/%s_ref%d.safetensors"):format(tmp, head, k))
      local r = check(path, ref)
      T.eq(table.concat(r.outputs, ","), table.concat(OUTPUTS[head], ","), head)
      T.eq(table.concat(r.inputs.input_ids, ","), "batch_size,sequence_length")
      for _, n in ipairs(OUTPUTS[head]) do
        T.truthy(r.maxdiff[n] and r.maxdiff[n] <= 1e-5, ("%s %s at %dx%d: %s"):format(head, n, shape[1], shape[2],
          tostring(r.maxdiff[n])))
      end
    end
  end
end)

T.test("fixed dimensions, fp16, and onnxruntime's transformer optimizer fuses the encoder", function()
  local dir = tmp .. "/qa"
  local ref = reference(dir, "qa", batch(2, 8, 1), tmp .. "/qa_fixed.safetensors")
  local out, rc = export(("--model=%s --output=%s/fixed.onnx --batch=2 --seq-length=8"):format(dir, tmp))
  T.eq(rc, 0, out)
  local r = check(tmp .. "/fixed.onnx", ref, "--fuse 4 32")
  T.eq(table.concat(r.inputs.attention_mask, ","), "2,8")
  T.truthy(r.maxdiff.start_logits <= 1e-5 and r.maxdiff.end_logits <= 1e-5, cjson.encode(r.maxdiff))
  -- one Attention per layer, the residual Add + LayerNorm pairs as SkipLayerNormalization, the erf GELU with its bias
  T.eq(r.fused.Attention, CFG.num_hidden_layers, cjson.encode(r.fused))
  T.eq(r.fused.SkipLayerNormalization, 2 * CFG.num_hidden_layers, cjson.encode(r.fused))
  T.eq(r.fused.EmbedLayerNormalization, 1, cjson.encode(r.fused))
  T.eq((r.fused.BiasGelu or 0) + (r.fused.Gelu or 0), CFG.num_hidden_layers, cjson.encode(r.fused))
  out, rc = export(("--model=%s --output=%s/half.onnx --precision=fp16 --dynamic-batch --dynamic-seq"):format(dir, tmp))
  T.eq(rc, 0, out)
  r = check(tmp .. "/half.onnx", ref)
  T.truthy(r.maxdiff.start_logits <= 1e-2 and r.maxdiff.end_logits <= 1e-2, cjson.encode(r.maxdiff))
end)

T.test("a SQuAD model served by onnxruntime answers as predict.lua does", function()
  local fx = require "fixtures"
  local syn = require "bertlua.data.synthetic"
  local squad = require "bertlua.tasks.squad"
  local real = require "real_model"
  local vocab = fx.vocab(tmp)
  T.tiny_model_dir(tmp .. "/sq", { head = "qa", seed = 5, vocab = vocab, config = { num_hidden_layers = 2 } })
  local d = syn.squad(syn.world { seed = 11, countries = 40 }, { split = "dev" })
  T.write_file(tmp .. "/v1.json", cjson.encode({ version = d.version, data = { { title = d.data[1].title,
    paragraphs = { d.data[1].paragraphs[1], d.data[2].paragraphs[1] } } } }))
  local S = 96
  local out, rc = sh(("%s recipes/predict.lua --model=%s/sq --task=squad --input=%s/v1.json --output=%s/p.json "
    .. "--max-seq-length=%d --doc-stride=48 --max-query-length=24"):format(exe, tmp, tmp, tmp, S))
  T.eq(rc, 0, out)
  out, rc = export(("--model=%s/sq --output=%s/sq.onnx --dynamic-batch --dynamic-seq"):format(tmp, tmp))
  T.eq(rc, 0, out)
  -- bertlua's features in, onnxruntime's logits out, bertlua's answer selection on them
  local tok = require("bertlua.data.tokenizer").load(vocab, { lower = true })
  local examples = squad.read_examples(tmp .. "/v1.json", { is_training = false })
  local feats = squad.convert_examples_to_features(examples, tok, { max_seq_length = S, doc_stride = 48,
    max_query_length = 24, is_training = false })
  local idx = {}
  for i = 1, #feats do idx[i] = i end
  local t = real.qa_tensors(feats, idx, S)
  st.save(tmp .. "/sq_in.safetensors", { { "input_ids", t.input_ids:to("i64") },
    { "token_type_ids", t.token_type_ids:to("i64") }, { "attention_mask", t.attention_mask:to("i64") } })
  check(tmp .. "/sq.onnx", tmp .. "/sq_in.safetensors", "--save " .. tmp .. "/sq_logits.safetensors")
  local preds = squad.write_predictions(examples, feats, real.ref_results(tmp .. "/sq_logits.safetensors", feats),
    { tokenizer = tok })
  local n = require("squad_compare").same_answers(T, cjson.decode(T.slurp(tmp .. "/p.json")), preds)
  T.truthy(n >= 5, "questions compared: " .. n)
end)

T.test("bad input: unknown head, a head the model lacks, an unwritable output; one line each", function()
  local function fails(args, want)
    local out, rc = export(args)
    T.eq(rc, 1, out)
    T.truthy(out:find(want, 1, true) and not out:find("traceback", 1, true), out)
    local lines = select(2, out:gsub("\n", ""))
    T.eq(lines, 2, "one line (and rc=): " .. out)
  end
  local qa = tmp .. "/qa"
  fails(("--model=%s --output=%s/x.onnx --head=seq2seq"):format(qa, tmp),
    "export_onnx: --head must be auto, qa, cls, mlm or none, got seq2seq")
  fails(("--model=%s --output=%s/x.onnx --head=cls"):format(qa, tmp),
    ("export_onnx: --head=cls needs the cls head's weights, but %s holds a qa model (--head=qa or none exports it)")
      :format(qa))
  fails(("--model=%s/cls --output=%s/x.onnx --head=mlm"):format(tmp, tmp), "--head=mlm needs the mlm head's weights")
  fails(("--model=%s --output=%s/no/such/x.onnx"):format(qa, tmp),
    ("export_onnx: --output=%s/no/such/x.onnx: directory %s/no/such does not exist"):format(tmp, tmp))
  fails(("--model=%s --output=%s"):format(qa, tmp), ("export_onnx: --output=%s is a directory"):format(tmp))
  fails(("--model=%s/nowhere --output=%s/x.onnx"):format(tmp, tmp), "export_onnx: model directory")
  fails(("--model=%s --output=%s/x.onnx --precision=int8"):format(qa, tmp), "--precision must be fp32 or fp16")
  T.truthy(not io.open(tmp .. "/x.onnx"), "nothing written")
  -- the encoder of any model exports
  local out, rc = export(("--model=%s --output=%s/enc.onnx --head=none"):format(qa, tmp))
  T.eq(rc, 0, out)
end)

T.run()
