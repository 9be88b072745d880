-- bertlua.bert: BERT (post-LayerNorm encoder) and its heads, in bertlua.nn modules.
--
--   local bert = require "bertlua.bert"
--   local model = bert.BertForPreTraining(bert.config.preset("base"), { seed = 42 })
--   local out = model:forward{ input_ids = ids, token_type_ids = tt, attention_mask = am,
--                              masked_lm_positions = pos, masked_lm_labels = lab,
--                              next_sentence_labels = nsp }
--   -- out.loss, out.mlm_loss, out.nsp_loss, out.mlm_accuracy, out.nsp_accuracy
--   model:zero_grad(); model:backward()     -- gradients of out.loss into model.flat_grads
--   (model directories in and out: bertlua.pretrained)
--
-- Module tree and parameter names are those of Hugging Face transformers
-- (bert.embeddings.word_embeddings.weight, bert.encoder.layer.0.attention.self.query.weight,
-- cls.predictions.transform.dense.weight, qa_outputs.weight, classifier.weight ...),
-- so a state dict maps 1:1 to a safetensors file written or read by transformers.
--
-- Inputs: input_ids [B,S] i32/i64; token_type_ids [B,S] (default 0);
-- attention_mask [B,S] (1 = token, 0 = padding; default all 1).
-- Every module keeps its activations for backward and reuses its buffers
-- while shapes repeat; the returned tensors are those buffers.
-- Devices: model:to("cuda:0") (nn.Module:to) runs the model on a GPU; batch
-- tensors (ids, masks, labels) may stay on the CPU, they are copied to the
-- model's device here. Results (losses, counts, accuracies) come back as Lua
local bl = require "bertlua.tensor"
local slice = require("bertlua.util.list").slice

local M = {}
M.config = require "bertlua.bert.config"
for _, part in ipairs { require "bertlua.bert.model", require "bertlua.bert.heads" } do
  for k, v in pairs(part) do M[k] = v end
end

-- head name -> constructor (from_pretrained{head=...})
M.heads = {
  model = M.BertModel, bert = M.BertModel,
  pretraining = M.BertForPreTraining, pretrain = M.BertForPreTraining,
  qa = M.BertForQuestionAnswering, squad = M.BertForQuestionAnswering,
  classification = M.BertForSequenceClassification, glue = M.BertForSequenceClassification,
}
M.architectures = {
  BertModel = "model", BertForPreTraining = "pretraining",
  BertForQuestionAnswering = "qa", BertForSequenceClassification = "classification",
}

-- feature extraction (BERT's extract_features.py) ---------------------------------------
-- pair(tokens_a, tokens_b, max_len) -> tokens, type_ids: [CLS] a [SEP] (b [SEP]),
-- truncating the longer of a/b one token at a time (original _truncate_seq_pair).
function M.pair(a, b, max_len)
  if max_len < (b and 3 or 2) then  -- the loops below would never end
    error(("pair: a length of %s leaves no room for [CLS] and the [SEP]s"):format(tostring(max_len)), 2)
  end
  a = slice(a)
  if b then
    b = slice(b)
    while #a + #b > max_len - 3 do
      if #a > #b then a[#a] = nil else b[#b] = nil end
    end
  else
    while #a > max_len - 2 do a[#a] = nil end
  end
  local toks, types = { "[CLS]" }, { 0 }
  for _, t in ipairs(a) do toks[#toks + 1] = t; types[#types + 1] = 0 end
  toks[#toks + 1] = "[SEP]"; types[#types + 1] = 0
  if b then
    for _, t in ipairs(b) do toks[#toks + 1] = t; types[#types + 1] = 1 end
    toks[#toks + 1] = "[SEP]"; types[#types + 1] = 1
  end
  return toks, types
end

-- extract_features(model, examples, opts, emit): examples = list of {tokens=, ids=, type_ids=}
-- (as made by pair()); runs a BertModel (or any head's .bert) in eval mode in
-- batches of opts.batch (padded to the longest example of the batch: padding
-- is masked out, so values equal those of padding to max_seq_length) and
-- calls emit(i, line) with the JSON line of example i (0-based linex_index):
-- {"linex_index": i, "features": [{"token": t, "layers": [{"index": -1, "values": [...]}, ...]}, ...]}
-- opts.layers: list of layer indices, negative from the last encoder layer
-- (-1 = last; 0 = the embeddings output). Values are printed with %.9g.
-- opts.device: the model is on cuda:N (inputs go there through pinned memory, the next batch's copy while the
-- current batch runs: bertlua.device.prefetch; outputs are read back).
function M.extract_features(model, examples, opts, emit)
  local cjson = require "cjson"
  local m = model.bert or model
  m:eval()
  local layers = opts.layers or { -1, -2, -3, -4 }
  local L = #m.encoder.layer
  for _, li in ipairs(layers) do
    if li < -L or li > L then error(("extract_features: layer index %d out of range for %d layers"):format(li, L),
      2) end
  end
  local bs = opts.batch or 8
  local function span(first)   -- the last example and the padded length of the batch starting at `first`
    local last, S = math.min(first + bs - 1, #examples), 0
    for i = first, last do S = math.max(S, #examples[i].ids) end
    return last, S
  end
  local function inputs_at(first)
    local last, S = span(first)
    local n = last - first + 1
    local ids = bl.zeros({ n, S }, { dtype = "i32" })
    local types = bl.zeros({ n, S }, { dtype = "i32" })
    local mask = bl.zeros({ n, S }, { dtype = "f32" })
    local ip, tp, mp = ids:ptr(), types:ptr(), mask:ptr()
    for i = first, last do
      local e, row = examples[i], (i - first) * S
      for j = 1, #e.ids do ip[row + j - 1] = e.ids[j]; tp[row + j - 1] = e.type_ids[j]; mp[row + j - 1] = 1 end
    end
    return { input_ids = ids, token_type_ids = types, attention_mask = mask }
  end
  local stage = (opts.device or -1) >= 0 and require("bertlua.device.prefetch").Stager(opts.device) or nil
  if stage and #examples > 0 then stage:put(inputs_at(1)) end
  local first = 1
  while first <= #examples do
    local last, S = span(first)
    local inputs = stage and stage:get() or inputs_at(first)
    if stage and last < #examples then stage:put(inputs_at(last + 1)) end
    local out = m:forward(inputs)
    local hs = out.hidden_states
    local H = hs[1]:size(3)
    local ptrs = {}
    for k, li in ipairs(layers) do
      local h = hs[li < 0 and (L + 1 + li + 1) or (li + 1)]:contiguous()
      if h:is_cuda() or h:dtype() ~= "f32" then h = h:to{ dtype = "f32", device = "cpu" } end
      ptrs[k] = { h, h:ptr() }
    end
    for i = first, last do
      local e = examples[i]
      local feats = {}
      for j = 1, #e.tokens do
        local ls = {}
        for k, li in ipairs(layers) do
          local p = ptrs[k][2]
          local base = ((i - first) * S + (j - 1)) * H
          local v = {}
          for d = 0, H - 1 do v[d + 1] = string.format("%.9g", p[base + d]) end
          ls[k] = ('{"index": %d, "values": [%s]}'):format(li, table.concat(v, ", "))
        end
        feats[j] = ('{"token": %s, "layers": [%s]}'):format(cjson.encode(e.tokens[j]), table.concat(ls, ", "))
      end
      emit(e.index or (i - 1), ('{"linex_index": %d, "features": [%s]}'):format(e.index or (i - 1), table.concat(feats,
        ", ")))
    end
    first = last + 1
  end
  if stage then stage:close() end
end

return M

