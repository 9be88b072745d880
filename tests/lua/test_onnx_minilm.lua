-- recipes/export_onnx.lua on real weights (sentence-transformers' all-MiniLM-L6-v2,
-- L6/H384/A12, tests/lua/lib/real_model.lua): onnxruntime running the exported
-- encoder gives bertlua's last_hidden_state within 1e-5 on real text at two
-- batch sizes and lengths, and onnx.checker accepts the file. Skips without the
-- model, torch/transformers (real_model) or onnxruntime.
local T = require "testing"
local bl = require "bertlua"
local bert = require "bertlua.bert"
local pretrained = require "bertlua.pretrained"
local st = require "bertlua.io.safetensors"
local cjson = require "cjson"
local real = require "real_model"

local tmp = T.tmpdir()
local dir, py = real.find(T, tmp)

T.test("MiniLM exported to ONNX: onnxruntime equals bertlua within 1e-5 on real text", function()
  local path = tmp .. "/minilm.onnx"
  local out, rc = T.sh(("%s recipes/export_onnx.lua --model=%s --output=%s --head=none --dynamic-batch "
    .. "--dynamic-seq"):format(T.exe(), dir, path))
  T.eq(rc, 0, out)
  local m = pretrained.from_pretrained(dir, { head = "model", quiet = true })
  m:eval()
  local tok = require("bertlua.data.tokenizer").load(dir .. "/vocab.txt", { lower = true })
  local texts = { { "Where is the capital of France?", "Paris is the capital and largest city of France." },
    { "A man is playing a guitar on the stage." }, { "Tokenizers split words into pieces", "unaffordable" } }
  for k, pick in ipairs({ { 2, 3 }, { 1, 2, 3 } }) do  -- two batch sizes and lengths
    local rows, S, n = {}, 0, #pick
    for i, p in ipairs(pick) do
      local a, b = texts[p][1], texts[p][2]
      local toks, types = bert.pair(tok:tokenize(a), b and tok:tokenize(b) or nil, 128)
      rows[i] = { ids = tok:convert_tokens_to_ids(toks), types = types }
      S = math.max(S, #toks)
    end
    local ids, tt, am = {}, {}, {}
    for i, r in ipairs(rows) do
      ids[i], tt[i], am[i] = {}, {}, {}
      for j = 1, S do
        ids[i][j], tt[i][j], am[i][j] = r.ids[j] or 0, r.types[j] or 0, r.ids[j] and 1 or 0
      end
    end
    local function t(v) return bl.from(v, { dtype = "i32" }) end
    local b = { input_ids = t(ids), token_type_ids = t(tt), attention_mask = t(am) }
    local o = m:forward(b)
    local ref = ("%s/ref%d.safetensors"):format(tmp, k)
    st.save(ref, { { "input_ids", b.input_ids:to("i64") }, { "token_type_ids", b.token_type_ids:to("i64") },
      { "attention_mask", b.attention_mask:to("i64") }, { "last_hidden_state", o.last_hidden_state } })
    out, rc = T.sh(("%s tests/py/onnx_check.py %s %s"):format(py, path, ref))
    if rc == 77 then T.skip(out) end
    T.eq(rc, 0, out)
    local r = cjson.decode(out:match("({\"inputs\".*})"))
    T.truthy(r.maxdiff.last_hidden_state <= 1e-5, ("batch %d: max difference %g"):format(n,
      r.maxdiff.last_hidden_state))
    io.write(("  batch %d x %d: max |onnxruntime - bertlua| = %.3g\n"):format(n, S, r.maxdiff.last_hidden_state))
  end
end)

T.run()
