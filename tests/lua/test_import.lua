-- bertlua.import and the C checkpoint readers (src/io): checkpoints written by
-- TensorFlow itself (tf.compat.v1.train.Saver, Google's names) against
-- transformers' own TF->PyTorch conversion; transformers' pytorch_model.bin and
-- an NVIDIA-style .pt against their safetensors twins; a pickle that asks for
-- os.system refused with nothing run; corrupted and hostile files. Fixtures come
-- from tests/py/checkpoint_fixtures.py (skips when torch/transformers/tensorflow
-- are missing); the CRC checks need nothing.
local T = require "testing"
local bl = require "bertlua"
local bert = require "bertlua.bert"
local pretrained = require "bertlua.pretrained"
local st = require "bertlua.io.safetensors"
local imp = require "bertlua.io.import"
local ffi = require "ffi"
local C = require("bertlua.core").C

local PY = os.getenv("BL_PYTHON") or "/usr/bin/python3"
local DIR = T.tmpdir()
local function run(cmd)
  local out, rc = T.sh(cmd)
  return rc, out
end
local function slurp(p) local f = assert(io.open(p, "rb")); local s = f:read("*a"); f:close(); return s end
local function write(p, s) local f = assert(io.open(p, "wb")); f:write(s); f:close() end
local function same(a, b, msg) T.eq((a:to("f64") - b:to("f64")):abs():max(), 0, msg) end
local function rel(a, b) return (a:to("f64") - b:to("f64")):abs():max() / b:to("f64"):abs():max() end

local fixtures = {}
local function fixture(kind)
  if fixtures[kind] == nil then
    local rc, out = run(("%s tests/py/checkpoint_fixtures.py %s '%s'"):format(PY, kind, DIR))
    fixtures[kind] = rc == 0 or out
    if rc ~= 0 and rc ~= 77 then error("fixture script failed: " .. out) end
  end
  if fixtures[kind] ~= true then T.skip(fixtures[kind]) end
end

-- a copy of a file with byte `at` (1-based) xor-ed
local function flipped(src, dst, at)
  local s = slurp(src)
  write(dst, s:sub(1, at - 1) .. string.char(bit.bxor(s:byte(at), 0x10)) .. s:sub(at + 1))
end
-- position in the file of a tensor's raw bytes, found by content (not by the reader's offsets)
local function locate_bytes(file, t)
  local at = slurp(file):find(ffi.string(t.data_, t:numel() * 4), 1, true)
  T.truthy(at, "tensor bytes found in " .. file)
  return at
end

local function model_outputs(model, batch)
  model:eval()
  return model:forward(batch)
end

T.test("CRC-32C and CRC-32 check values, hardware and table paths agree", function()
  pcall(ffi.cdef, "uint32_t bl_crc32c_sw(uint32_t crc, const void *data, size_t n);")
  T.eq(C.bl_crc32c(0, "123456789", 9), 0xe3069283)
  T.eq(C.bl_crc32c_sw(0, "123456789", 9), 0xe3069283)
  T.eq(C.bl_crc32(0, "123456789", 9), 0xcbf43926)
  local buf = ffi.new("uint8_t[?]", 1000)
  for i = 0, 999 do buf[i] = (i * 7919 + 13) % 256 end
  for _, n in ipairs({ 0, 1, 7, 8, 9, 63, 1000 }) do
    T.eq(C.bl_crc32c(0, buf, n), C.bl_crc32c_sw(0, buf, n), "length " .. n)
    -- continuing a checksum over two pieces gives the checksum of the whole
    T.eq(C.bl_crc32c(C.bl_crc32c(0, buf, math.floor(n / 2)), buf + math.floor(n / 2), n - math.floor(n / 2)),
      C.bl_crc32c(0, buf, n))
  end
end)

-- TensorFlow ----------------------------------------------------------------------------------
T.test("a TF checkpoint written by TensorFlow gives transformers' hidden states (its own TF conversion)", function()
  fixture("tf")
  local ref = st.load(DIR .. "/tf_ref.safetensors")
  local model = pretrained.from_pretrained(DIR .. "/tf", { quiet = true })
  T.eq(tostring(model), "BertForPreTraining")
  T.eq(model.vocab_path, DIR .. "/tf/vocab.txt")
  local out = model_outputs(model, { input_ids = ref.input_ids, token_type_ids = ref.token_type_ids,
    attention_mask = ref.attention_mask })
  local e = rel(out.sequence_output, ref.last_hidden)
  T.truthy(e <= 1e-5, ("hidden states differ from transformers: relative %.3g"):format(e))
  e = rel(out.nsp_logits, ref.nsp_logits)
  T.truthy(e <= 1e-5, ("NSP logits differ: relative %.3g"):format(e))
  -- the same through a prefix and through the .index path
  local m2 = pretrained.from_pretrained(DIR .. "/tf/bert_model.ckpt", { quiet = true })
  same(m2.flat_params, model.flat_params)
  local m3 = pretrained.from_pretrained(DIR .. "/tf/bert_model.ckpt.index", { quiet = true })
  same(m3.flat_params, model.flat_params)
end)

T.test("TF optimizer slots are skipped with a count; fine-tuned SQuAD and classifier heads map", function()
  fixture("tf")
  local info = imp.source("tf", DIR .. "/tf/bert_model.ckpt", { quiet = true })
  local weights = #info.names
  T.eq(info.skipped, 2 * weights + 1, "adam_m + adam_v per weight, and global_step")
  local heads = st.load(DIR .. "/tf_heads.safetensors")
  local qa = pretrained.from_pretrained(DIR .. "/tf_squad", { quiet = true })
  T.eq(tostring(qa), "BertForQuestionAnswering")
  same(qa.qa_outputs.weight, heads["cls.squad.output_weights"])
  same(qa.qa_outputs.bias, heads["cls.squad.output_bias"])
  local cls = pretrained.from_pretrained(DIR .. "/tf_cls", { quiet = true })
  T.eq(tostring(cls), "BertForSequenceClassification")
  T.eq(cls.classifier.weight:size(1), 3)
  same(cls.classifier.weight, heads.output_weights)
  -- the encoder is the pre-training checkpoint's, kernels transposed
  local pt = pretrained.from_pretrained(DIR .. "/tf", { quiet = true })
  same(qa.bert.encoder.layer[2].intermediate.dense.weight, pt.bert.encoder.layer[2].intermediate.dense.weight)
  -- a TF checkpoint with its vocabulary rows padded (99 -> 104) loads the same weights
  same(pretrained.from_pretrained(DIR .. "/tf_padded", { quiet = true }).flat_params, pt.flat_params)
end)

T.test("a corrupted byte in the TF data shard is reported by crc32c naming the tensor", function()
  fixture("tf")
  local d = DIR .. "/tf_bad"
  os.execute(("rm -rf '%s' && cp -r '%s/tf' '%s'"):format(d, DIR, d))
  local r = imp.open("tf", d .. "/bert_model.ckpt")
  local victim
  for _, e in ipairs(r.list) do if e.name == "bert/encoder/layer_1/intermediate/dense/kernel" then victim = e end end
  local shard = d .. "/bert_model.ckpt.data-00000-of-00001"
  flipped(shard, shard .. ".tmp", locate_bytes(shard, imp.read(r, victim)) + 100)
  os.rename(shard .. ".tmp", shard)
  r = imp.open("tf", d .. "/bert_model.ckpt")
  local failed = {}
  for _, e in ipairs(r.list) do
    local ok, err = pcall(imp.read, r, e)
    if not ok then failed[#failed + 1] = e.name; T.truthy(err:find("crc32c mismatch", 1, true), err) end
  end
  T.eq(#failed, 1)
  T.eq(failed[1], victim.name)
  T.raises(function() pretrained.from_pretrained(d, { quiet = true }) end,
    "tf checkpoint: " .. shard .. ": tensor 'bert/encoder/layer_1/intermediate/dense/kernel': crc32c mismatch")
end)

T.test("hostile TF files: truncated or corrupt index, missing or short shard, wrong config", function()
  fixture("tf")
  local d = DIR .. "/tf_h"
  local function fresh()
    os.execute(("rm -rf '%s' && cp -r '%s/tf' '%s'"):format(d, DIR, d))
    return d .. "/bert_model.ckpt.index", d .. "/bert_model.ckpt.data-00000-of-00001"
  end
  local index = fresh()
  local text = slurp(index)
  write(index, text:sub(1, math.floor(#text / 2)))
  T.raises(function() imp.open("tf", index) end, "tf checkpoint: " .. index .. ": ")
  write(index, text:sub(1, 20))
  T.raises(function() imp.open("tf", index) end, "too short for a table footer")
  write(index, "")
  T.raises(function() imp.open("tf", index) end, "too short for a table footer")
  -- every byte of a block is covered by its crc32c: flip one in the first data block
  write(index, text)
  flipped(index, index, 30)
  local ok, err = pcall(imp.open, "tf", index)
  T.truthy(not ok and err:find("fails its crc32c check", 1, true), err)
  local shard
  index, shard = fresh()
  local data = slurp(shard)
  write(shard, data:sub(1, #data - 10))
  T.raises(function() imp.open("tf", index) end, "are beyond the end of its shard")
  T.raises(function() imp.open("tf", index) end, shard .. ": tensor '")
  os.remove(shard)
  T.raises(function() imp.open("tf", index) end, "data shard 0 of 1 is missing")
  index = fresh()
  local cfg = slurp(d .. "/bert_config.json"):gsub('"vocab_size": 99', '"vocab_size": 100')
  write(d .. "/bert_config.json", cfg)
  T.raises(function() pretrained.from_pretrained(d, { quiet = true }) end,
    "tf checkpoint: " .. index .. ": tensor 'bert/embeddings/word_embeddings': shape [99,32] does not match")
end)

T.test("convert.lua: an HF directory from a TF checkpoint, loaded by transformers with the same outputs", function()
  fixture("tf")
  local out = DIR .. "/converted"
  local rc, log = run(("%s recipes/convert.lua --input=%s/tf/bert_model.ckpt --output=%s"):format(T.exe(), DIR, out))
  T.eq(rc, 0, log)
  T.truthy(log:find("skipped 95 tensor(s) that are not model weights", 1, true), log)
  local from_tf = pretrained.from_pretrained(DIR .. "/tf", { quiet = true })
  same(pretrained.from_pretrained(out, { quiet = true }).flat_params, from_tf.flat_params)
  T.eq(slurp(out .. "/vocab.txt"), slurp(DIR .. "/tf/vocab.txt"))
  local py = ("import torch, transformers\n"
    .. "from safetensors.torch import load_file\n"
    .. "r = load_file('%s/tf_ref.safetensors')\n"
    .. "m = transformers.BertForPreTraining.from_pretrained('%s').eval()\n"
    .. "with torch.no_grad(): o = m(input_ids=r['input_ids'], token_type_ids=r['token_type_ids'], "
    .. "attention_mask=r['attention_mask'], output_hidden_states=True)\n"
    .. "print('maxdiff', float((o.hidden_states[-1] - r['last_hidden']).abs().max()))\n"):format(DIR, out)
  write(DIR .. "/check.py", py)
  rc, log = run(PY .. " " .. DIR .. "/check.py")
  T.eq(rc, 0, log)
  T.truthy(tonumber(log:match("maxdiff (%S+)")) <= 1e-6, log)
  rc, log = run(("%s recipes/convert.lua --input=%s/nowhere --output=%s/x"):format(T.exe(), DIR, DIR))
  T.eq(rc, 1)
  T.truthy(log:find("model directory " .. DIR .. "/nowhere does not exist", 1, true), log)
end)

T.test("convert.lua: each documented form; --config is a file of option values, --bert-config the model's", function()
  fixture("tf")
  fixture("torch")
  local function convert(args)
    return run(("%s recipes/convert.lua %s"):format(T.exe(), args:gsub("DIR", DIR)))
  end
  local from_tf = pretrained.from_pretrained(DIR .. "/tf", { quiet = true })
  for i, input in ipairs({ "DIR/tf", "DIR/tf/bert_model.ckpt", "DIR/tf/bert_model.ckpt.index" }) do
    local rc, log = convert(("--input=%s --output=DIR/forms%d"):format(input, i))
    T.eq(rc, 0, log)
    same(pretrained.from_pretrained(DIR .. "/forms" .. i, { quiet = true }).flat_params, from_tf.flat_params, input)
  end
  -- a .pt alone, its config and vocabulary named
  os.execute(("mkdir -p %q && cp %q %q"):format(DIR .. "/lone", DIR .. "/nvidia/bert_qa.pt", DIR .. "/lone/"))
  local rc, log = convert("--input=DIR/lone/bert_qa.pt --bert-config=DIR/nvidia/bert_config.json "
    .. "--vocab=DIR/nvidia/vocab.txt --output=DIR/forms_pt")
  T.eq(rc, 0, log)
  same(pretrained.from_pretrained(DIR .. "/forms_pt", { quiet = true }).flat_params,
    pretrained.from_pretrained(DIR .. "/qa_st", { quiet = true }).flat_params)
  T.eq(slurp(DIR .. "/forms_pt/vocab.txt"), slurp(DIR .. "/nvidia/vocab.txt"))
  -- options from a file
  write(DIR .. "/convert_opts.json", ('{"input": "%s/tf", "output": "%s/forms_opts"}'):format(DIR, DIR))
  rc, log = convert("--config=DIR/convert_opts.json")
  T.eq(rc, 0, log)
  same(pretrained.from_pretrained(DIR .. "/forms_opts", { quiet = true }).flat_params, from_tf.flat_params)
  -- the old spelling: a model config given as --config says what to do, in one line
  rc, log = convert("--input=DIR/lone/bert_qa.pt --config=DIR/nvidia/bert_config.json --output=DIR/x")
  T.eq(rc, 1)
  T.eq(log, ("bertlua: convert: --config=%s/nvidia/bert_config.json is a model configuration, but --config takes a "
    .. "file of option values: pass it as --bert-config=%s/nvidia/bert_config.json\nrc=1\n"):format(DIR, DIR))
  rc, log = convert("--help")
  T.truthy(rc == 0 and log:find("--bert-config", 1, true) and log:find("--config=FILE: a file of option values", 1,
    true), log)
end)

-- PyTorch -------------------------------------------------------------------------------------
T.test("transformers' pytorch_model.bin loads with outputs identical to its safetensors twin", function()
  fixture("torch")
  local a = pretrained.from_pretrained(DIR .. "/st", { quiet = true })
  local b = pretrained.from_pretrained(DIR .. "/hf_bin", { quiet = true })
  same(b.flat_params, a.flat_params)
  local ids = bl.from({ { 2, 14, 27, 90, 3, 55 }, { 2, 8, 9, 3, 0, 0 } }, { dtype = "i32" })
  local batch = { input_ids = ids, attention_mask = bl.from({ { 1, 1, 1, 1, 1, 1 }, { 1, 1, 1, 1, 0, 0 } }) }
  local oa, ob = model_outputs(a, batch), model_outputs(b, batch)
  same(ob.sequence_output, oa.sequence_output)
  same(ob.nsp_logits, oa.nsp_logits)
  -- the file path itself works too
  same(pretrained.from_pretrained(DIR .. "/hf_bin/pytorch_model.bin", { quiet = true }).flat_params, a.flat_params)
end)

T.test("the legacy (pre-1.6, non-zip) torch.save format loads too; truncated, it names the storage", function()
  fixture("torch")
  local a = pretrained.from_pretrained(DIR .. "/st", { quiet = true })
  local bin = DIR .. "/legacy/pytorch_model.bin"
  same(pretrained.from_pretrained(bin, { quiet = true }).flat_params, a.flat_params)
  local s = slurp(bin)
  write(DIR .. "/legacy_cut.bin", s:sub(1, #s - 100))
  T.raises(function() imp.open("torch", DIR .. "/legacy_cut.bin") end, "runs past the end of the file: truncated?")
  write(DIR .. "/legacy_cut.bin", s:sub(1, 200))
  local cut = DIR .. "/legacy_cut.bin"
  T.raises(function() imp.open("torch", cut) end, "torch checkpoint: " .. cut .. ": ")
end)

T.test("torch.save with pickle_protocol=4 and 5 (MEMOIZE) loads identical to its safetensors twin", function()
  fixture("torch")
  local a = pretrained.from_pretrained(DIR .. "/st", { quiet = true })
  for _, p in ipairs { 4, 5 } do
    same(pretrained.from_pretrained(("%s/proto%d"):format(DIR, p), { quiet = true }).flat_params, a.flat_params,
      "protocol " .. p)
  end
end)

T.test("an NVIDIA .pt ({model = state dict}, module. prefixes, dense_act) equals its safetensors twin", function()
  fixture("torch")
  local a = pretrained.from_pretrained(DIR .. "/qa_st", { quiet = true })
  local b = pretrained.from_pretrained(DIR .. "/nvidia", { quiet = true })
  T.eq(tostring(b), "BertForQuestionAnswering")
  same(b.flat_params, a.flat_params)
  local ids = bl.from({ { 2, 14, 27, 90, 3, 55 } }, { dtype = "i32" })
  local oa, ob = model_outputs(a, { input_ids = ids }), model_outputs(b, { input_ids = ids })
  same(ob.start_logits, oa.start_logits)
  local info = imp.source("torch", DIR .. "/nvidia/bert_qa.pt", { quiet = true })
  T.eq(info.skipped, 1, "the optimizer's exp_avg")
end)

T.test("NVIDIA's run_pretraining .pt with its vocabulary padded to a multiple of 8 loads, padding dropped", function()
  fixture("torch")
  local a = pretrained.from_pretrained(DIR .. "/st", { quiet = true })
  local b = pretrained.from_pretrained(DIR .. "/nvidia_pt", { quiet = true })
  T.eq(tostring(b), "BertForPreTraining")
  T.eq(b.cfg.vocab_size, 99)
  same(b.flat_params, a.flat_params)
  -- the note names the dropped rows and tensors; padding past the next multiple of 128 is still refused
  local cfg = bert.config.new(require("cjson").decode(slurp(DIR .. "/nvidia_pt/bert_config.json")))
  local m = bert.BertForPreTraining(cfg)
  local res = imp.load_into(m, DIR .. "/nvidia_pt/ckpt_8601.pt", { quiet = true })
  T.eq(table.concat(res.trimmed, " "),
    "model.module.bert.embeddings.word_embeddings.weight model.module.cls.predictions.bias")
  cfg = bert.config.new(require("cjson").decode(slurp(DIR .. "/nvidia_full/bert_config.json")))
  cfg.vocab_size = 30000  -- 30528 rows are past 30080, 30000 rounded up to a multiple of 128
  T.raises(function() imp.load_into(bert.BertForPreTraining(cfg), DIR .. "/nvidia_full/ckpt_8601.pt", { quiet = true })
  end, "shape [30528,8] does not match the model's bert.embeddings.word_embeddings.weight [30000,8] (wrong config?)")
  -- at full size (30522 -> 30528) through convert.lua: one line names what was dropped
  local out = DIR .. "/nvidia_full_conv"
  local rc, log = run(("%s recipes/convert.lua --input=%s/nvidia_full --output=%s"):format(T.exe(), DIR, out))
  T.eq(rc, 0, log)
  T.truthy(log:find("ckpt_8601.pt: dropped 6 row(s) of vocabulary padding (rows 30522..30527 past vocab_size 30522, "
    .. "not checked) from model.module.bert.embeddings.word_embeddings.weight, model.module.cls.predictions.bias\n",
    1, true), log)
  same(pretrained.from_pretrained(out, { quiet = true }).flat_params,
    pretrained.from_pretrained(DIR .. "/full_st", { quiet = true }).flat_params)
  -- and back to NVIDIA's layout on request: zero rows up to the multiple, config unchanged
  rc, log = run(("%s recipes/convert.lua --input=%s/nvidia_full --output=%s_pad --pad-vocab=8"):format(T.exe(), DIR,
    out))
  T.eq(rc, 0, log)
  local h = st.read_header(out .. "_pad/model.safetensors")
  T.eq(table.concat(h.tensors["bert.embeddings.word_embeddings.weight"].shape, ","), "30528,8")
  T.eq(h.tensors["cls.predictions.bias"].shape[1], 30528)
  local tensors = st.load(out .. "_pad/model.safetensors")
  T.eq(tensors["cls.predictions.bias"]:narrow(1, 30523, 6):abs():max(), 0)
  T.eq(tensors["bert.embeddings.word_embeddings.weight"]:narrow(1, 30523, 6):abs():max(), 0)
  T.eq(require("cjson").decode(slurp(out .. "_pad/config.json")).vocab_size, 30522)
  same(pretrained.from_pretrained(out .. "_pad", { quiet = true }).flat_params,
    pretrained.from_pretrained(out, { quiet = true }).flat_params)
end)

T.test("a pickle asking for os.system is refused by name and nothing runs", function()
  fixture("torch")
  local marker = DIR .. "/pwned"
  os.remove(marker)
  T.raises(function() imp.open("torch", DIR .. "/evil.pt") end, "refusing global posix.system")
  T.raises(function() pretrained.from_pretrained(DIR .. "/evil.pt", { config = DIR .. "/st/config.json" }) end,
    "torch checkpoint: " .. DIR .. "/evil.pt")
  T.truthy(not io.open(marker), "the command did not run")
  -- the fixture is live: Python's own unpickler does run it
  local rc, out = run(("%s -c \"import zipfile, pickle; pickle.loads(zipfile.ZipFile('%s').read('archive/data.pkl'))\"")
    :format(PY, DIR .. "/evil.pt"))
  T.eq(rc, 0, out)
  T.truthy(io.open(marker), "python's pickle ran the command")
end)

T.test("hostile torch files: errors name the file and tensor, never a crash", function()
  fixture("torch")
  local h = DIR .. "/hostile/"
  local r = imp.open("torch", h .. "ok.pt")
  T.eq(#r.list, 2)
  T.eq(r.list[2].name, "wt")
  T.near(imp.read(r, r.list[2]):tolist(), { { 1, 3 }, { 2, 4 } }, 0)  -- a strided view of the storage
  local cases = {
    huge_shape = "tensor 'w': its size overflows 64 bits",
    past_storage = "tensor 'w' (offset 3, last element 6) reaches past its storage (4 elements)",
    storage_size = "storage '0' should hold 1099511627776 x 4 bytes but its zip entry has 16",
    missing_storage = "storage '7' has no entry archive/data/7",
    compressed = "is compressed",
    deep = "nested deeper than 200 levels",
    bad_opcode = "pickle opcode 0xff",
  }
  for f, want in pairs(cases) do T.raises(function() imp.open("torch", h .. f .. ".pt") end, h .. f .. ".pt: ") end
  for f, want in pairs(cases) do T.raises(function() imp.open("torch", h .. f .. ".pt") end, want) end
  r = imp.open("torch", h .. "cycle.pt")  -- a list that contains itself: visited once
  T.eq(#r.list, 1)
  -- truncated archive, flipped storage byte, entry offset out of range
  local bin = DIR .. "/hf_bin/pytorch_model.bin"
  local s = slurp(bin)
  for _, n in ipairs({ 0, 10, 22, math.floor(#s / 2), #s - 1 }) do
    write(DIR .. "/cut.bin", s:sub(1, n))
    T.raises(function() imp.open("torch", DIR .. "/cut.bin") end, "torch checkpoint: " .. DIR .. "/cut.bin: ")
  end
  r = imp.open("torch", bin)
  local victim
  for _, e in ipairs(r.list) do if e.name == "bert.pooler.dense.weight" then victim = e end end
  flipped(bin, DIR .. "/flip.bin", locate_bytes(bin, imp.read(r, victim)) + 5)
  local rf = imp.open("torch", DIR .. "/flip.bin")
  T.raises(function() imp.read(rf, rf.list[victim.index + 1]) end,
    "tensor 'bert.pooler.dense.weight': zip CRC-32 mismatch")
  -- the central directory's local-header offset of a storage, pointed past the end
  local name = s:match("([%w_]+)/data%.pkl") .. "/data/0"  -- transformers names the archive after the file
  local at, last = 0, nil
  repeat at = s:find(name, at + 1, true); if at then last = at end until not at
  local p = last - 4  -- the local-header offset: the 4 bytes before the name in its directory record
  write(DIR .. "/range.bin", s:sub(1, p - 1) .. "\240\255\255\127" .. s:sub(p + 4))
  T.raises(function() imp.open("torch", DIR .. "/range.bin") end, "no local header at offset")
end)

T.test("a name bertlua cannot place is listed; a directory with two checkpoints asks which", function()
  fixture("torch")
  local d = DIR .. "/two"
  local nv = DIR .. "/nvidia/"
  os.execute(("mkdir -p %q && cp %q %q && cp %q %q && cp %q %q"):format(d, nv .. "bert_qa.pt", d .. "/a.pt",
    nv .. "bert_qa.pt", d .. "/b.pt", nv .. "bert_config.json", d))
  T.raises(function() pretrained.from_pretrained(d) end, "holds several checkpoints (a.pt, b.pt)")
  local cfg = bert.config.new(require("cjson").decode(slurp(d .. "/bert_config.json")))
  local m = bert.BertModel(cfg, { pooler = false })  -- transformers' QA model has none
  T.raises(function() imp.load_into(m, d .. "/a.pt", { quiet = true }) end, "not parameters of this model")
  local ok, err = pcall(imp.load_into, m, d .. "/a.pt", { quiet = true })
  T.truthy(not ok and err:find("qa_outputs.weight", 1, true) and err:find("qa_outputs.bias", 1, true), err)
end)

T.test("TF: Saver's checkpoint file picks the newest of several; unplaced tensors listed by their own names", function()
  fixture("tf")
  local t = DIR .. "/two_tf"
  os.execute(("mkdir -p %q && cp %q/tf/* %q/ && cd %q && mv bert_model.ckpt.index model.ckpt-2.index && "
    .. "mv bert_model.ckpt.data-00000-of-00001 model.ckpt-2.data-00000-of-00001 && cp model.ckpt-2.index "
    .. "model.ckpt-1.index"):format(t, DIR, t, t))
  T.raises(function() pretrained.from_pretrained(t) end, "holds several checkpoints (model.ckpt-1, model.ckpt-2)")
  write(t .. "/checkpoint", 'model_checkpoint_path: "model.ckpt-2"\nall_model_checkpoint_paths: "model.ckpt-2"\n')
  T.eq(imp.locate(t).weights, t .. "/model.ckpt-2")
  local m = bert.BertModel(bert.config.load(DIR .. "/tf_squad/bert_config.json"))
  local ok, err = pcall(imp.load_into, m, DIR .. "/tf_squad", { quiet = true })
  T.truthy(not ok and err:find("2 tensors are not parameters", 1, true)
    and err:find("cls/squad/output_bias (qa_outputs.bias), cls/squad/output_weights (qa_outputs.weight)", 1, true), err)
end)

T.run()
