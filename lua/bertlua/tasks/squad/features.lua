-- bertlua.tasks.squad.features: examples -> fixed-length features (doc stride
-- windows), as run_squad.py's convert_examples_to_features, and the one batch
-- builder that makes a model batch of them (training, evaluation, predict.lua).
local bl = require "bertlua.tensor"
local batched = require "bertlua.batched"
local slice = require("bertlua.util.list").slice

local M = {}

local function improve_answer_span(doc_tokens, input_start, input_end, tok, orig_answer_text)
  local tok_answer_text = table.concat(tok:tokenize(orig_answer_text), " ")
  for new_start = input_start, input_end do
    for new_end = input_end, new_start, -1 do
      local text_span = table.concat(doc_tokens, " ", new_start + 1, new_end + 1)
      if text_span == tok_answer_text then return new_start, new_end end
    end
  end
  return input_start, input_end
end

local function check_is_max_context(doc_spans, cur_span_index, position)
  local best_score, best_span_index = nil, nil
  for span_index, span in ipairs(doc_spans) do
    local e = span.start + span.length - 1
    if position >= span.start and position <= e then
      local num_left = position - span.start
      local num_right = e - position
      local score = math.min(num_left, num_right) + 0.01 * span.length
      if best_score == nil or score > best_score then
        best_score, best_span_index = score, span_index - 1
      end
    end
  end
  return cur_span_index == best_span_index
end

local function ids_of(tok, tokens)
  local ids = tok:convert_tokens_to_ids(tokens)
  if type(ids) ~= "table" or #ids ~= #tokens then
    error("squad: tokenizer convert_tokens_to_ids must return one id per token", 0)
  end
  return ids
end

-- convert_examples_to_features(examples, tok, opts) -> features
--   opts: max_seq_length 384, doc_stride 128, max_query_length 64,
--   is_training false, unique_id_start 1000000000, output_fn (called with each
--   feature instead of collecting them, for streaming).
-- Feature fields: unique_id, example_index, doc_span_index (0-based), tokens,
-- token_to_orig_map / token_is_max_context (keyed by 0-based sequence
-- position), input_ids, input_mask, segment_ids (arrays of max_seq_length),
-- start_position, end_position (0-based; 0/0 = [CLS] when the answer is not
-- in the span or the question is impossible; nil when not training), is_impossible.
function M.convert_examples_to_features(examples, tok, opts)
  opts = opts or {}
  local max_seq_length = opts.max_seq_length or 384
  local doc_stride = opts.doc_stride or 128
  local max_query_length = opts.max_query_length or 64
  local training = opts.is_training or false
  local pad_id = tok.pad_id or 0
  if doc_stride < 1 then error("squad: doc_stride must be >= 1", 2) end
  local unique_id = opts.unique_id_start or 1000000000
  local out = {}
  local emit = opts.output_fn or function(f) out[#out + 1] = f end
  local doc_cache_key, cache = nil, nil
  for example_index0, example in ipairs(examples) do
    local example_index = example_index0 - 1
    local query_tokens = tok:tokenize(example.question_text)
    if #query_tokens > max_query_length then
      local q = {}
      for i = 1, max_query_length do q[i] = query_tokens[i] end
      query_tokens = q
    end
    -- questions of one paragraph share doc_tokens: tokenize it once
    if doc_cache_key ~= example.doc_tokens then
      local tok_to_orig, orig_to_tok, all_doc_tokens = {}, {}, {}
      for i, token in ipairs(example.doc_tokens) do
        orig_to_tok[i] = #all_doc_tokens
        for _, sub in ipairs(tok:tokenize(token)) do
          tok_to_orig[#tok_to_orig + 1] = i - 1
          all_doc_tokens[#all_doc_tokens + 1] = sub
        end
      end
      cache = { tok_to_orig = tok_to_orig, orig_to_tok = orig_to_tok, all = all_doc_tokens }
      doc_cache_key = example.doc_tokens
    end
    local tok_to_orig, orig_to_tok, all_doc_tokens = cache.tok_to_orig, cache.orig_to_tok, cache.all
    local tok_start, tok_end
    if training and example.is_impossible then tok_start, tok_end = -1, -1 end
    if training and not example.is_impossible then
      if example.start_position == nil then
        error(("squad: example %s has no answer position (read it with is_training=true)"):format(example.qas_id), 0)
      end
      tok_start = orig_to_tok[example.start_position + 1]
      if example.end_position < #example.doc_tokens - 1 then
        tok_end = orig_to_tok[example.end_position + 2] - 1
      else
        tok_end = #all_doc_tokens - 1
      end
      tok_start, tok_end = improve_answer_span(all_doc_tokens, tok_start, tok_end, tok, example.orig_answer_text)
    end
    local max_tokens_for_doc = max_seq_length - #query_tokens - 3
    if max_tokens_for_doc < 1 then
      error(("squad: max_seq_length %d leaves no room for the document after a %d-token question")
        :format(max_seq_length, #query_tokens), 0)
    end
    local doc_spans = {}
    local start_offset = 0
    while start_offset < #all_doc_tokens do
      local length = #all_doc_tokens - start_offset
      if length > max_tokens_for_doc then length = max_tokens_for_doc end
      doc_spans[#doc_spans + 1] = { start = start_offset, length = length }
      if start_offset + length == #all_doc_tokens then break end
      start_offset = start_offset + math.min(length, doc_stride)
    end
    for span_index0, span in ipairs(doc_spans) do
      local span_index = span_index0 - 1
      local tokens, segment_ids = { "[CLS]" }, { 0 }
      local token_to_orig_map, token_is_max_context = {}, {}
      for _, t in ipairs(query_tokens) do tokens[#tokens + 1] = t; segment_ids[#segment_ids + 1] = 0 end
      tokens[#tokens + 1] = "[SEP]"; segment_ids[#segment_ids + 1] = 0
      for i = 0, span.length - 1 do
        local split_token_index = span.start + i
        local pos = #tokens
        token_to_orig_map[pos] = tok_to_orig[split_token_index + 1]
        token_is_max_context[pos] = check_is_max_context(doc_spans, span_index, split_token_index)
        tokens[#tokens + 1] = all_doc_tokens[split_token_index + 1]
        segment_ids[#segment_ids + 1] = 1
      end
      tokens[#tokens + 1] = "[SEP]"; segment_ids[#segment_ids + 1] = 1
      local input_ids = ids_of(tok, tokens)
      local input_mask = {}
      for i = 1, #input_ids do input_mask[i] = 1 end
      for i = #input_ids + 1, max_seq_length do
        input_ids[i] = pad_id; input_mask[i] = 0; segment_ids[i] = 0
      end
      local start_position, end_position
      if training and not example.is_impossible then
        local doc_start = span.start
        local doc_end = span.start + span.length - 1
        if not (tok_start >= doc_start and tok_end <= doc_end) then
          start_position, end_position = 0, 0
        else
          local doc_offset = #query_tokens + 2
          start_position = tok_start - doc_start + doc_offset
          end_position = tok_end - doc_start + doc_offset
        end
      end
      if training and example.is_impossible then start_position, end_position = 0, 0 end
      emit({ unique_id = unique_id, example_index = example_index, doc_span_index = span_index,
        tokens = tokens, token_to_orig_map = token_to_orig_map, token_is_max_context = token_is_max_context,
        input_ids = input_ids, input_mask = input_mask, segment_ids = segment_ids,
        start_position = start_position, end_position = end_position, is_impossible = example.is_impossible })
      unique_id = unique_id + 1
    end
  end
  return out
end

-- feature_batch(features, idx, max_len[, with_labels]) -> batch, S: features idx[1], idx[2], ... as a model batch
-- (input_ids, token_type_ids, attention_mask: int32 tensors), each row cut after its last unmasked token and the
-- batch padded to its longest row (a multiple of 8, at most max_len: bertlua.batched.pad_rows); with_labels adds
-- start_positions and end_positions (capped at S - 1).
function M.feature_batch(features, idx, max_len, with_labels)
  local rows = {}
  for k, i in ipairs(idx) do
    local f = features[i]
    if not f then error(("squad.feature_batch: no feature %s of %d"):format(tostring(i), #features), 2) end
    local n = 0
    for j = 1, #f.input_mask do if f.input_mask[j] ~= 0 then n = j end end
    rows[k] = { ids = slice(f.input_ids, 1, n), types = slice(f.segment_ids, 1, n) }
  end
  local b, S = batched.pad_rows(rows, max_len)
  if with_labels then
    local sp, ep = bl.zeros({ #idx }, { dtype = "i32" }), bl.zeros({ #idx }, { dtype = "i32" })
    local ps, pe = sp:ptr(), ep:ptr()
    for k, i in ipairs(idx) do
      ps[k - 1] = math.min(features[i].start_position, S - 1)
      pe[k - 1] = math.min(features[i].end_position, S - 1)
    end
    b.start_positions, b.end_positions = sp, ep
  end
  return b, S
end

------------------------------------------------------------------ predictions

return M
