-- bertlua.io.safetensors: round trips (F32/F16/BF16), Hugging Face names and
-- conventions (prefix-less BertModel checkpoints, gamma/beta, the tied
-- decoder), model directories, head mismatches, every hostile-file case
-- (each error names the file and the tensor), and — when transformers is
-- importable by BL_PYTHON — files written by transformers load here with the
-- same outputs and files written here load in transformers.
local T = require "testing"
local bl = require "bertlua"
local bert = require "bertlua.bert"
local pretrained = require "bertlua.pretrained"
local st = require "bertlua.io.safetensors"

local PY = os.getenv("BL_PYTHON") or "/usr/bin/python3"
local CFG = { vocab_size = 97, hidden_size = 48, num_hidden_layers = 2, num_attention_heads = 4,
  intermediate_size = 80, max_position_embeddings = 32 }

local tmpdir = T.tmpdir
-- run a shell command: exit code, output (T.sh's, with its last line "rc=N")
local function run(cmd)
  local out, rc = T.sh(cmd)
  return rc, out
end
local function same(a, b, msg) T.eq((a:to("f64") - b:to("f64")):abs():max(), 0, msg) end

local DIR = tmpdir()
local function writefile(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end

-- a raw safetensors file: header text, data bytes, optional header length override
local function raw(name, header, data, len)
  local path = DIR .. "/" .. name
  local f = io.open(path, "wb")
  local n = len or #header
  local b = {}
  for i = 1, 8 do b[i] = string.char(n % 256); n = math.floor(n / 256) end
  f:write(table.concat(b), header, data or "")
  f:close()
  return path
end

T.test("save/load round trip of tensors in F32, F16, BF16 and integer dtypes", function()
  local a = bl.randn({ 3, 5 }, { seed = 1, offset = 0 })
  local i = bl.from({ { 1, -2 }, { 3, 2147483647 } }, { dtype = "i32" })
  local l = bl.from({ 5, -6, 7 }, { dtype = "i64" })
  local p = st.save(DIR .. "/rt.safetensors", { a = a, ints = i, longs = l, empty = bl.empty({ 0, 4 }) })
  local t, meta, info = st.load(p)
  same(t.a, a); same(t.ints, i); same(t.longs, l)
  T.eq(t.empty:numel(), 0)
  T.eq(meta.format, "pt")
  T.eq(info.data_start % 8, 0, "header padded to 8 bytes")
  for _, dt in ipairs({ "F16", "BF16" }) do
    st.save(DIR .. "/rt16.safetensors", { a = a, ints = i }, { dtype = dt })
    local h = st.read_header(DIR .. "/rt16.safetensors")
    T.eq(h.tensors.a.dtype, dt); T.eq(h.tensors.ints.dtype, "I32")
    local back = st.load(DIR .. "/rt16.safetensors", { dtype = "f32" })
    T.eq(back.a:dtype(), "f32")
    T.truthy(back.a:allclose(a, dt == "F16" and 1e-3 or 8e-3, 1e-3), dt .. " round trip too far off")
    T.truthy(not back.a:allclose(a, 1e-7, 0), dt .. " should not be exact")
  end
end)

T.test("model weights: HF names, exact F32 round trip, F16/BF16 files load into f32", function()
  local m1 = bert.BertForPreTraining(CFG, { seed = 1 })
  local m2 = bert.BertForPreTraining(CFG, { seed = 2 })
  local p = DIR .. "/m.safetensors"
  st.save_model(m1, p)
  local h = st.read_header(p)
  for _, n in ipairs({ "bert.embeddings.word_embeddings.weight", "bert.encoder.layer.1.attention.self.query.weight",
    "bert.encoder.layer.0.attention.output.LayerNorm.bias", "bert.encoder.layer.1.intermediate.dense.weight",
    "bert.pooler.dense.bias", "cls.predictions.bias", "cls.predictions.transform.LayerNorm.weight",
    "cls.seq_relationship.weight" }) do
    T.truthy(h.tensors[n], "missing HF name " .. n)
  end
  T.truthy(not h.tensors["cls.predictions.decoder.weight"], "tied decoder omitted as transformers does")
  T.eq(#h.names, #m1:parameters())
  local r = st.load_model(m2, p)
  T.eq(r.loaded, #m1:parameters())
  same(m2.flat_params, m1.flat_params, "F32 round trip must be exact")
  for _, dt in ipairs({ "F16", "BF16" }) do
    local q = DIR .. "/m16.safetensors"
    st.save_model(m1, q, { dtype = dt })
    local m3 = bert.BertForPreTraining(CFG, { seed = 3 })
    st.load_model(m3, q)
    T.truthy(m3.flat_params:allclose(m1.flat_params, 1e-2, 1e-4), dt .. " weights not loaded")
  end
  -- tied decoder written on request, and accepted on load
  st.save_model(m1, p, { tied_decoder = true })
  T.truthy(st.read_header(p).tensors["cls.predictions.decoder.weight"], "decoder written")
  local m4 = bert.BertForPreTraining(CFG, { seed = 4 })
  st.load_model(m4, p)
  same(m4.flat_params, m1.flat_params)
  -- writes are atomic: no temporary left behind
  local rc, out = run("ls -a '" .. DIR .. "'")
  T.truthy(rc == 0 and not out:find("%.tmp%."), "temporary file left behind: " .. out)
end)

T.test("old gamma/beta names and prefix-less BertModel checkpoints", function()
  local base = bert.BertModel(CFG, { seed = 5 })
  local list = {}
  for _, p in ipairs(base:parameters()) do
    local n = p.name:gsub("LayerNorm%.weight$", "LayerNorm.gamma"):gsub("LayerNorm%.bias$", "LayerNorm.beta")
    list[#list + 1] = { n, p.param }
  end
  local p = DIR .. "/bare.safetensors"
  st.save(p, list)
  T.truthy(st.read_header(p).tensors["embeddings.LayerNorm.gamma"], "old names written")
  local b2 = bert.BertModel(CFG, { seed = 6 })
  st.load_model(b2, p)
  same(b2.flat_params, base.flat_params)
  -- into a pre-training model: encoder from the file, heads stay fresh (allowed explicitly)
  local pt = bert.BertForPreTraining(CFG, { seed = 7 })
  local heads_before = pt.cls.predictions.transform.dense.weight:clone()
  T.raises(function() st.load_model(pt, p, { quiet = true }) end, "tensor 'cls.predictions.bias' is missing")
  local r = st.load_model(pt, p, { allow_missing = "^cls%.", quiet = true })
  T.eq(#r.missing, 7)
  same(pt.bert.embeddings.word_embeddings.weight, base.embeddings.word_embeddings.weight)
  same(pt.cls.predictions.transform.dense.weight, heads_before)
  -- a BertModel from a pre-training checkpoint: strip "bert.", ignore the heads when allowed
  local q = DIR .. "/pt.safetensors"
  st.save_model(pt, q)
  local b3 = bert.BertModel(CFG, { seed = 8 })
  T.raises(function() st.load_model(b3, q) end,
    "7 tensors are not parameters of this model (pass allow_unexpected to ignore them): cls.predictions.bias, ")
  st.load_model(b3, q, { allow_unexpected = st.is_head, quiet = true })
  same(b3.encoder.layer[2].output.dense.weight, base.encoder.layer[2].output.dense.weight)
end)

T.test("model directories: save_pretrained / from_pretrained, head swap like transformers", function()
  local m = bert.BertForPreTraining(CFG, { seed = 9 })
  local vocab = DIR .. "/vocab_src.txt"
  local f = io.open(vocab, "w"); f:write("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n"); f:close()
  local d = DIR .. "/model_dir"
  pretrained.save_pretrained(m, d, { vocab = vocab })
  local cfgf = io.open(d .. "/config.json"):read("*a")
  T.truthy(cfgf:find('"BertForPreTraining"', 1, true), "architectures in config.json")
  T.eq(io.open(d .. "/vocab.txt"):read("*a"), "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n")
  local m2 = pretrained.from_pretrained(d)
  T.eq(tostring(m2), "BertForPreTraining")
  same(m2.flat_params, m.flat_params)
  T.eq(m2.vocab_path, d .. "/vocab.txt")
  local qa = pretrained.from_pretrained(d, { head = "qa", seed = 3, quiet = true })
  T.eq(tostring(qa), "BertForQuestionAnswering")
  same(qa.bert.encoder.layer[1].attention.self.value.weight, m.bert.encoder.layer[1].attention.self.value.weight)
  T.truthy(qa.qa_outputs.weight:abs():max() > 0, "qa_outputs initialised fresh")
  local cls = pretrained.from_pretrained(d, { head = "classification", num_labels = 5, quiet = true })
  T.eq(cls.classifier.weight:size(1), 5)
  same(cls.bert.pooler.dense.weight, m.bert.pooler.dense.weight)
  -- strict: a head mismatch is an error
  T.raises(function() pretrained.from_pretrained(d, { head = "qa", strict = true }) end,
    "qa_outputs.weight' is missing")
  T.raises(function() pretrained.from_pretrained(DIR .. "/nowhere") end,
    "model directory " .. DIR .. "/nowhere does not exist")
  -- wrong config for the weights: error names the tensor and both shapes
  local d2 = DIR .. "/bad_dir"
  pretrained.save_pretrained(m, d2)
  local c = io.open(d2 .. "/config.json"):read("*a"):gsub('"vocab_size": 97', '"vocab_size": 98')
  writefile(d2 .. "/config.json", c)
  T.raises(function() pretrained.from_pretrained(d2) end,
    "tensor 'bert.embeddings.word_embeddings.weight': shape [97,48] does not match the model's")
  T.raises(function() st.save(DIR .. "/no/such/dir/x.safetensors", { a = bl.zeros({ 2 }) }) end, "cannot create")
end)

T.test("hostile files: each gives a clear error naming the file and the tensor", function()
  local function hdr(t) return t end
  local cases = {
    { "short", function() local p = DIR .. "/short"; writefile(p, "abc"); return p end,
      "file is truncated: 3 bytes" },
    { "absurd", function() return raw("absurd", "{}", "", 2 ^ 40) end, "is absurd" },
    { "beyond", function() return raw("beyond", "{}", "", 1000) end, "goes beyond the end of the file" },
    { "badjson", function() return raw("badjson", '{"a": {"dtype": ', "") end, "header is not valid JSON" },
    { "array", function() return raw("array", '[1, 2]  ', "") end, "header must be a JSON object" },
    { "range", function()
      return raw("range", hdr('{"w":{"dtype":"F32","shape":[100],"data_offsets":[0,400]}}'), string.rep("\0", 16))
    end, "tensor 'w': data_offsets [0, 400] go beyond the data buffer (16 bytes)" },
    { "overlap", function()
      return raw("overlap",
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}',
        string.rep("\0", 12))
    end, "tensor 'b': data_offsets [4, 12] overlap tensor 'a'" },
    { "hole", function()
      return raw("hole",
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}}',
        string.rep("\0", 16))
    end, "tensor 'b': bytes [8, 12) before it belong to no tensor" },
    { "trailing", function()
      return raw("trailing", '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', string.rep("\0", 16))
    end, "the data buffer has 16 bytes but the tensors cover only 8" },
    { "dtype", function()
      return raw("dtype", '{"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}}', string.rep("\0", 8))
    end, "tensor 'a': unknown dtype 'Q7'" },
    { "fp8", function()
      return raw("fp8", '{"a":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}}', string.rep("\0", 8))
    end, "tensor 'a': dtype F8_E4M3 is not supported" },
    { "size", function()
      return raw("size", '{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', string.rep("\0", 8))
    end, "tensor 'a': shape [3] x F32 needs 12 bytes but data_offsets [0, 8] hold 8" },
    { "negshape", function()
      return raw("negshape", '{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}', string.rep("\0", 8))
    end, "tensor 'a': shape entries must be non-negative integers" },
    { "nooffsets", function()
      return raw("nooffsets", '{"a":{"dtype":"F32","shape":[2]}}', string.rep("\0", 8))
    end, "tensor 'a': data_offsets must be [begin, end]" },
    { "meta", function() return raw("meta", '{"__metadata__":{"format":1}}', "") end,
      "__metadata__ must map strings to strings" },
  }
  for _, c in ipairs(cases) do
    local path = c[2]()
    local err = T.raises(function() st.load(path) end, c[3])
    T.truthy(err:find(path, 1, true), c[1] .. ": error does not name the file: " .. err)
  end
  T.raises(function() st.load(DIR .. "/does_not_exist") end, "cannot open " .. DIR .. "/does_not_exist")
  -- a file truncated after a valid header: the header check catches it before any read
  local m = bert.BertModel(CFG, { seed = 1 })
  local p = DIR .. "/trunc.safetensors"
  st.save_model(m, p)
  local data = io.open(p, "rb"):read("*a")
  writefile(p, data:sub(1, #data - 100))
  T.raises(function() st.load_model(m, p) end, "go beyond the data buffer")
  -- missing / unexpected / mis-shaped tensors against a model
  local full = st.load(DIR .. "/m.safetensors")
  full["bert.pooler.dense.bias"] = nil
  full["bert.extra.weight"] = bl.zeros({ 2 })
  st.save(DIR .. "/mixed.safetensors", full)
  local pt = bert.BertForPreTraining(CFG, { seed = 1 })
  local before = pt.flat_params:clone()
  T.raises(function() st.load_model(pt, DIR .. "/mixed.safetensors") end,
    DIR .. "/mixed.safetensors: tensor 'bert.pooler.dense.bias' is missing")
  T.raises(function() st.load_model(pt, DIR .. "/mixed.safetensors", { allow_missing = "pooler" }) end,
    "tensor 'bert.extra.weight' is not a parameter of this model")
  full["bert.pooler.dense.bias"] = bl.zeros({ 7 })
  full["bert.extra.weight"] = nil
  st.save(DIR .. "/mixed.safetensors", full)
  T.raises(function() st.load_model(pt, DIR .. "/mixed.safetensors") end,
    "tensor 'bert.pooler.dense.bias': shape [7] does not match the model's bert.pooler.dense.bias [48]")
  same(pt.flat_params, before, "a failed load must not change the model")
end)

-- transformers interop ----------------------------------------------------------------
local function need_transformers()
  local rc = run(PY .. " -c 'import transformers, torch'")
  if rc ~= 0 then
    T.skip("transformers not importable by " .. PY
      .. " (pip install --break-system-packages 'transformers<4.40' safetensors)")
  end
end

local function batch()
  local ids = bl.from({ { 2, 14, 27, 90, 3, 55, 61, 3 }, { 2, 8, 9, 3, 40, 3, 0, 0 } }, { dtype = "i32" })
  return { input_ids = ids,
    token_type_ids = bl.from({ { 0, 0, 0, 0, 0, 1, 1, 1 }, { 0, 0, 0, 0, 1, 1, 0, 0 } }, { dtype = "i32" }),
    attention_mask = bl.from({ { 1, 1, 1, 1, 1, 1, 1, 1 }, { 1, 1, 1, 1, 1, 1, 0, 0 } }, { dtype = "i32" }) }
end

-- full-sequence MLM logits [B*S, V] from our model (the training path gathers masked positions only)
local function all_logits(model, seq)
  local x = seq:contiguous():view({ seq:size(1) * seq:size(2), seq:size(3) })
  return model.cls.predictions:forward(x, model.bert.embeddings.word_embeddings.weight)
end

local function compare_hf(model, ref, tol)
  local b = batch()
  model:eval()
  local out = model:forward(b)
  local seq = out.sequence_output
  local function chk(name, a, r)
    local err = (a:to("f64") - r:to("f64")):abs():max() / r:to("f64"):abs():max()
    T.truthy(err < tol, ("%s differs from transformers: relative error %.3g"):format(name, err))
  end
  chk("last hidden state", seq, ref.last_hidden)
  chk("MLM logits", all_logits(model, seq):view({ 2, 8, CFG.vocab_size }), ref.prediction_logits)
  chk("NSP logits", out.nsp_logits, ref.seq_relationship_logits)
end

T.test("a model saved by transformers loads here with the same outputs", function()
  need_transformers()
  local d = tmpdir()
  st.save(d .. "/batch.safetensors", batch())
  local rc, out = run(PY .. " tools/peers/bert_reference.py hf_save '" .. d .. "/hf'")
  if rc == 77 then T.skip(out) end
  T.eq(rc, 0, "transformers save failed: " .. out)
  local ref = st.load(d .. "/hf_out.safetensors")
  local model = pretrained.from_pretrained(d .. "/hf")
  T.eq(tostring(model), "BertForPreTraining")
  compare_hf(model, ref, 1e-5)
end)

T.test("a model saved here loads in transformers (tied decoder, QA head initialised by it)", function()
  need_transformers()
  local d = tmpdir()
  st.save(d .. "/batch.safetensors", batch())
  local model = bert.BertForPreTraining(CFG, { seed = 17 })
  for _, p in ipairs(model:parameters()) do  -- non-trivial biases / LayerNorm
    if p.name:match("bias$") or p.name:match("LayerNorm") then p.param:add_(bl.randn(p.shape, { seed = 2,
      offset = p.offset }) * 0.1) end
  end
  pretrained.save_pretrained(model, d .. "/ours")
  local rc, out = run(PY .. " tools/peers/bert_reference.py hf_check '" .. d .. "/ours'")
  if rc == 77 then T.skip(out) end
  T.eq(rc, 0, "transformers load failed: " .. out)
  T.truthy(not out:find("newly initialized", 1, true) or out:find("qa_outputs", 1, true),
    "transformers initialised weights it should have loaded: " .. out)
  local ref = st.load(d .. "/hf_out.safetensors")
  T.eq(ref.tied:item(), 1, "decoder tied to word embeddings in transformers")
  same(ref.qa_word_embeddings, model.bert.embeddings.word_embeddings.weight)
  compare_hf(model, ref, 1e-5)
end)

T.run()
