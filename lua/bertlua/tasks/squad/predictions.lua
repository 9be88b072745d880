-- bertlua.tasks.squad.predictions: logits -> answer texts, as run_squad.py's
-- write_predictions (n-best spans, get_final_text, null odds for v2.0), or
-- with an exhaustive search of every valid span instead of the n-best starts
-- x ends.
local pystr = require "bertlua.util.pystr"
local json = require "bertlua.util.json"
local slice = require("bertlua.util.list").slice

local M = {}
local chars = pystr.chars

local function whitespace_tokenize(text)
  local out = {}
  for w in text:gmatch("%S+") do out[#out + 1] = w end
  return out
end

-- indices (0-based) of the n largest logits; ties keep the lower index first
-- (Python's stable sorted(..., reverse=True)).
local function best_indexes(logits, n)
  local idx = {}
  for i = 1, #logits do idx[i] = i end
  local function key(i) local v = logits[i]; if v ~= v then return -math.huge end return v end
  table.sort(idx, function(a, b)
    local va, vb = key(a), key(b)
    if va ~= vb then return va > vb end
    return a < b
  end)
  local out = {}
  for i = 1, math.min(n, #idx) do out[i] = idx[i] - 1 end
  return out
end

-- 0 .. n-1: every position (the exhaustive span search)
local function all_indexes(n)
  local out = {}
  for i = 1, n do out[i] = i - 1 end
  return out
end

function M.compute_softmax(scores)
  if #scores == 0 then return {} end
  local max_score
  for _, s in ipairs(scores) do if max_score == nil or s > max_score then max_score = s end end
  local exps, total = {}, 0.0
  for i, s in ipairs(scores) do local x = math.exp(s - max_score); exps[i] = x; total = total + x end
  local probs = {}
  for i, x in ipairs(exps) do probs[i] = x / total end
  return probs
end

local function strip_spaces(cs)
  local ns, map = {}, {}
  for i, c in ipairs(cs) do
    if c ~= " " then ns[#ns + 1] = c; map[#ns - 1] = i - 1 end
  end
  return ns, map
end

-- get_final_text(pred_text, orig_text, tok): project the wordpiece-detokenized
-- prediction back onto the original words (run_squad.py's heuristic; falls
-- back to orig_text when the alignment fails).
function M.get_final_text(pred_text, orig_text, tok)
  local tok_text = table.concat(tok:basic_tokenize(orig_text), " ")
  local bpos = tok_text:find(pred_text, 1, true)
  if not bpos then return orig_text end
  local tok_cs = chars(tok_text)
  local start_position = #chars(tok_text:sub(1, bpos - 1))
  local end_position = start_position + #chars(pred_text) - 1
  local orig_cs = chars(orig_text)
  local orig_ns, orig_map = strip_spaces(orig_cs)
  local tok_ns, tok_map = strip_spaces(tok_cs)
  if #orig_ns ~= #tok_ns then return orig_text end
  local tok_s_to_ns = {}
  for i, ti in pairs(tok_map) do tok_s_to_ns[ti] = i end
  local orig_start, orig_end
  local ns = tok_s_to_ns[start_position]
  if ns ~= nil then orig_start = orig_map[ns] end
  if orig_start == nil then return orig_text end
  ns = tok_s_to_ns[end_position]
  if ns ~= nil then orig_end = orig_map[ns] end
  if orig_end == nil then return orig_text end
  return table.concat(orig_cs, "", orig_start + 1, orig_end + 1)
end

local function write_text(path, text) require("bertlua.util.fs").write_atomic(path, text) end

-- write_predictions(examples, features, results, opts) -> predictions, nbest, null_odds, empty
-- results: one per feature, {start_logits = {...}, end_logits = {...}} (Lua
-- arrays over the sequence) with an optional unique_id (else aligned with features).
-- opts: tokenizer (required), n_best_size 20, max_answer_length 30,
-- span_search "nbest" (run_squad.py: the n_best_size best starts x the
-- n_best_size best ends of each window) or "exhaustive" (every start x every
-- end), version_2_with_negative false, null_score_diff_threshold 0.0, and
-- output_dir, or prediction_file / nbest_file / null_odds_file, to write
-- predictions.json, nbest_predictions.json, null_odds.json (json.dumps indent=4).
-- Either search keeps the same valid spans: start and end in the context,
-- start <= end, at most max_answer_length tokens, the start in the window
-- where it has the most context; the best score over all windows wins. The
-- n-best search misses a question when every top start or end sits outside
-- its context; its answer is then run_squad.py's "empty" nonce, and `empty`
-- counts such questions (questions with no valid span found).
-- Returned tables are ordered JSON objects (qas_id in example order).
function M.write_predictions(examples, features, results, opts)
  opts = opts or {}
  local tok = opts.tokenizer
  if not tok then error("squad.write_predictions: opts.tokenizer is required (for get_final_text)", 2) end
  local n_best_size = opts.n_best_size or 20
  local max_answer_length = opts.max_answer_length or 30
  local span_search = opts.span_search or "nbest"
  if span_search ~= "nbest" and span_search ~= "exhaustive" then
    error(("squad.write_predictions: span_search must be nbest or exhaustive, got %s"):format(tostring(span_search)),
      2)
  end
  local v2 = opts.version_2_with_negative or false
  local null_thresh = opts.null_score_diff_threshold or 0.0
  if #results ~= #features then
    error(("squad.write_predictions: %d results for %d features"):format(#results, #features), 2)
  end
  local by_uid = {}
  for i, r in ipairs(results) do
    if type(r) ~= "table" or type(r.start_logits) ~= "table" or type(r.end_logits) ~= "table" then
      error(("squad.write_predictions: result %d has no start_logits/end_logits arrays"):format(i), 2)
    end
    by_uid[r.unique_id or features[i].unique_id] = r
  end
  local ex_feats = {}
  for _, f in ipairs(features) do
    local k = f.example_index
    ex_feats[k] = ex_feats[k] or {}
    table.insert(ex_feats[k], f)
  end
  local ids = {}
  local all_predictions, all_nbest, scores_diff = {}, {}, {}
  local empty = 0
  for example_index0, example in ipairs(examples) do
    local feats = ex_feats[example_index0 - 1] or {}
    local prelim = {}
    local score_null, min_null_fi, null_start, null_end = 1000000, 0, 0, 0
    for fi0, feature in ipairs(feats) do
      local fi = fi0 - 1
      local result = by_uid[feature.unique_id]
      if not result then
        error(("squad.write_predictions: no result for feature %s"):format(tostring(feature.unique_id)), 2)
      end
      local sl, el = result.start_logits, result.end_logits
      local starts, ends
      if span_search == "nbest" then
        starts, ends = best_indexes(sl, n_best_size), best_indexes(el, n_best_size)
      else
        starts, ends = all_indexes(#sl), all_indexes(#el)
      end
      if v2 then
        local fns = sl[1] + el[1]
        if fns < score_null then score_null, min_null_fi, null_start, null_end = fns, fi, sl[1], el[1] end
      end
      local ntok = #feature.tokens
      for _, s in ipairs(starts) do
        for _, e in ipairs(ends) do
          if s < ntok and e < ntok and feature.token_to_orig_map[s] ~= nil and feature.token_to_orig_map[e] ~= nil
            and feature.token_is_max_context[s] and e >= s and e - s + 1 <= max_answer_length then
            prelim[#prelim + 1] = { fi = fi, s = s, e = e, sl = sl[s + 1], el = el[e + 1], order = #prelim + 1 }
          end
        end
      end
    end
    if #prelim == 0 then empty = empty + 1 end
    if v2 then
      prelim[#prelim + 1] = { fi = min_null_fi, s = 0, e = 0, sl = null_start, el = null_end, order = #prelim + 1 }
    end
    table.sort(prelim, function(a, b)
      local sa, sb = a.sl + a.el, b.sl + b.el
      if sa ~= sb then return sa > sb end
      return a.order < b.order
    end)
    local seen, nbest = {}, {}
    for _, p in ipairs(prelim) do
      if #nbest >= n_best_size then break end
      local feature = feats[p.fi + 1]
      local final_text
      if p.s > 0 then
        local tok_tokens = {}
        for k = p.s, p.e do tok_tokens[#tok_tokens + 1] = feature.tokens[k + 1] end
        local od_s, od_e = feature.token_to_orig_map[p.s], feature.token_to_orig_map[p.e]
        local orig_text = table.concat(example.doc_tokens, " ", od_s + 1, od_e + 1)
        local tok_text = table.concat(tok_tokens, " "):gsub(" ##", ""):gsub("##", "")
        tok_text = table.concat(whitespace_tokenize(tok_text), " ")
        final_text = M.get_final_text(tok_text, orig_text, tok)
      else
        final_text = ""
      end
      if not (p.s > 0 and seen[final_text]) then
        seen[final_text] = true
        nbest[#nbest + 1] = { text = final_text, start_logit = p.sl, end_logit = p.el }
      end
    end
    if v2 and not seen[""] then
      nbest[#nbest + 1] = { text = "", start_logit = null_start, end_logit = null_end }
    end
    -- rare edge cases (no valid span): the reference's nonce entry; for v2 a
    -- lone null entry gets one too (as Hugging Face does) so a non-null exists
    if #nbest == 0 or (v2 and #nbest == 1 and nbest[1].text == "") then
      table.insert(nbest, 1, { text = "empty", start_logit = 0.0, end_logit = 0.0 })
    end
    local total_scores, best_non_null = {}, nil
    for i, entry in ipairs(nbest) do
      total_scores[i] = entry.start_logit + entry.end_logit
      if not best_non_null and entry.text ~= "" then best_non_null = entry end
    end
    local probs = M.compute_softmax(total_scores)
    local nbest_json = {}
    for i, entry in ipairs(nbest) do
      nbest_json[i] = json.object({ text = entry.text, probability = probs[i],
        start_logit = entry.start_logit, end_logit = entry.end_logit },
        { "text", "probability", "start_logit", "end_logit" })
    end
    local qid = example.qas_id
    if all_nbest[qid] == nil then ids[#ids + 1] = qid end
    if not v2 then
      all_predictions[qid] = nbest_json[1].text
    else
      local diff = score_null - best_non_null.start_logit - best_non_null.end_logit
      scores_diff[qid] = diff
      all_predictions[qid] = diff > null_thresh and "" or best_non_null.text
    end
    all_nbest[qid] = nbest_json
  end
  json.object(all_predictions, ids)
  json.object(all_nbest, ids)
  json.object(scores_diff, ids)
  local pf, nf, of = opts.prediction_file, opts.nbest_file, opts.null_odds_file
  if opts.output_dir then
    pf = pf or (opts.output_dir .. "/predictions.json")
    nf = nf or (opts.output_dir .. "/nbest_predictions.json")
    of = of or (opts.output_dir .. "/null_odds.json")
  end
  if pf then write_text(pf, json.dumps(all_predictions, { indent = 4 }) .. "\n") end
  if nf then write_text(nf, json.dumps(all_nbest, { indent = 4 }) .. "\n") end
  if of and v2 then write_text(of, json.dumps(scores_diff, { indent = 4 }) .. "\n") end
  return all_predictions, all_nbest, v2 and scores_diff or nil, empty
end

-- feature_result(feature, st, en, first, S): write_predictions' record of one feature from flat start/end logit arrays
-- whose row (S values) starts at index first. Only the feature's own tokens' logits are kept: padded positions
-- (zero hidden states under unpadded CPU inference, bertlua.bert.infer) can then never crowd real candidates out.
function M.feature_result(feature, st, en, first, S)
  local last = first + math.min(S, #feature.tokens) - 1
  return { unique_id = feature.unique_id, start_logits = slice(st, first, last), end_logits = slice(en, first, last) }
end

-- predict(examples, features, run, opts) -> predictions, nbest, null_odds, stats, empty:
-- the QA model's logits for every feature, then write_predictions(opts).
-- run(n, consume) runs the model over features 1..n in batches (the caller
-- chooses batching and timing) and calls consume(idx, out) with the features'
-- indices and the model's { start_logits, end_logits } [rows, S]; it returns
-- its statistics, passed through as `stats`. Results as M.feature_result makes them.
function M.predict(examples, features, run, opts)
  local results = {}
  local stats = run(#features, function(idx, out)
    local S = out.start_logits:size(2)
    local st, en = out.start_logits:totable(), out.end_logits:totable()
    for r, i in ipairs(idx) do results[i] = M.feature_result(features[i], st, en, (r - 1) * S + 1, S) end
  end)
  local preds, nbest, odds, empty = M.write_predictions(examples, features, results, opts)
  return preds, nbest, odds, stats, empty
end

return M
