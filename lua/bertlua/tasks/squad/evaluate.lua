-- bertlua.tasks.squad.evaluate: the official SQuAD evaluation, exact to
-- evaluate-v1.1.py and evaluate-v2.0.py (Unicode-aware like Python 3).
local pystr = require "bertlua.util.pystr"
local json = require "bertlua.util.json"

local M = {}
local decode, encode, py_lower, is_word_cp = pystr.decode, pystr.encode, pystr.lower, pystr.is_word

-- string.punctuation
local PUNCT = {}
for c in ("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"):gmatch(".") do PUNCT[c:byte()] = true end

local ARTICLE = { a = true, an = true, the = true }

------------------------------------------------------------------ official evaluation

-- normalize_answer(s): the official scripts' normalization: lower, remove
-- string.punctuation, \b(a|an|the)\b -> " ", collapse whitespace. Unicode
-- aware like Python 3 (str.lower, re's Unicode \b, str.split).
function M.normalize_answer(s)
  if not s:find("[\128-\255]") then
    s = s:lower():gsub("[\33-\47\58-\64\91-\96\123-\126]", "")
    s = s:gsub("%f[%w]%w+", function(w) if ARTICLE[w] then return " " end end)
    local words = {}
    for w in s:gmatch("[^\t-\r\28-\31 ]+") do words[#words + 1] = w end
    return table.concat(words, " ")
  end
  local low = py_lower(decode(s))
  local t, n = {}, 0
  for i = 1, #low do
    local c = low[i]
    if not (c < 128 and PUNCT[c]) then n = n + 1; t[n] = c end
  end
  -- articles: whole maximal runs of word characters equal to a / an / the
  local r, m, i = {}, 0, 1
  while i <= n do
    local c = t[i]
    if is_word_cp(c) then
      local j = i
      while j < n and is_word_cp(t[j + 1]) do j = j + 1 end
      local len = j - i + 1
      local art = false
      if len <= 3 then
        local w = encode(t, i, j)
        art = ARTICLE[w] or false
      end
      if art then m = m + 1; r[m] = 32
      else for k = i, j do m = m + 1; r[m] = t[k] end end
      i = j + 1
    else
      m = m + 1; r[m] = c
      i = i + 1
    end
  end
  local words, cur = {}, {}
  for k = 1, m do
    local c = r[k]
    if pystr.is_space(c) then
      if #cur > 0 then words[#words + 1] = encode(cur); cur = {} end
    else cur[#cur + 1] = c end
  end
  if #cur > 0 then words[#words + 1] = encode(cur) end
  return table.concat(words, " ")
end

local function split_words(s)
  -- normalized text only holds single ASCII spaces between words
  local out = {}
  for w in s:gmatch("[^ ]+") do out[#out + 1] = w end
  return out
end

local function token_f1(pred_toks, gold_toks)
  local counts = {}
  for _, t in ipairs(gold_toks) do counts[t] = (counts[t] or 0) + 1 end
  local same = 0
  for _, t in ipairs(pred_toks) do
    local c = counts[t]
    if c and c > 0 then same = same + 1; counts[t] = c - 1 end
  end
  if same == 0 then return 0 end
  local precision = 1.0 * same / #pred_toks
  local recall = 1.0 * same / #gold_toks
  return (2 * precision * recall) / (precision + recall)
end

-- v1.1 exact_match_score / f1_score
function M.exact_match_score(prediction, ground_truth)
  return M.normalize_answer(prediction) == M.normalize_answer(ground_truth)
end

function M.f1_score(prediction, ground_truth)
  return token_f1(split_words(M.normalize_answer(prediction)), split_words(M.normalize_answer(ground_truth)))
end

-- v2.0 compute_exact / compute_f1 (empty answers: 1 when both are empty)
function M.compute_exact(a_gold, a_pred)
  return M.normalize_answer(a_gold) == M.normalize_answer(a_pred) and 1 or 0
end

function M.compute_f1(a_gold, a_pred)
  local gold = a_gold == "" and {} or split_words(M.normalize_answer(a_gold))
  local pred = a_pred == "" and {} or split_words(M.normalize_answer(a_pred))
  if #gold == 0 or #pred == 0 then return (#gold == #pred) and 1 or 0 end
  return token_f1(pred, gold)
end

-- where(ai, pi, qi, id): a question's place in a dataset, for messages
local function where(ai, pi, qi, id)
  local s = ("article %d paragraph %d question %d"):format(ai, pi, qi)
  if id ~= nil then s = s .. " (id " .. tostring(id) .. ")" end
  return s
end
M.where = where

-- iterate the questions of a decoded dataset ("data" array), checking the
-- structure the evaluation needs; fn(qa, id, answers_texts, loc)
local function each_question(data, name, fn)
  if type(data) ~= "table" then error(name .. ": the dataset has no 'data' array", 0) end
  for ai, article in ipairs(data) do
    if type(article) ~= "table" or type(article.paragraphs) ~= "table" then
      error(("%s: article %d has no 'paragraphs' array"):format(name, ai), 0)
    end
    for pi, p in ipairs(article.paragraphs) do
      if type(p) ~= "table" or type(p.qas) ~= "table" then
        error(("%s: article %d paragraph %d has no 'qas' array"):format(name, ai, pi), 0)
      end
      for qi, qa in ipairs(p.qas) do
        local id = type(qa) == "table" and qa.id or nil
        if type(id) ~= "string" then
          error(("%s: %s: 'id' is missing or not a string"):format(name, where(ai, pi, qi, id)), 0)
        end
        if type(qa.answers) ~= "table" then
          error(("%s: %s: 'answers' is missing"):format(name, where(ai, pi, qi, id)), 0)
        end
        local texts = {}
        for k, a in ipairs(qa.answers) do
          if type(a) ~= "table" or type(a.text) ~= "string" then
            error(("%s: %s: answer %d has no 'text' string"):format(name, where(ai, pi, qi, id), k), 0)
          end
          texts[k] = a.text
        end
        fn(qa, id, texts, where(ai, pi, qi, id))
      end
    end
  end
end

local function check_prediction(preds, id, name)
  local p = preds[id]
  if p ~= nil and type(p) ~= "string" then
    error(("%s: the prediction for %s is a %s, expected a string"):format(name, id, type(p)), 0)
  end
  return p
end

-- evaluate_v1(data, preds[, opts]) -> {exact_match, f1} (percentages), as
-- evaluate-v1.1.py; a missing prediction scores 0 and is reported through
-- opts.warn (default: the official message on stderr).
function M.evaluate_v1(data, preds, opts)
  opts = opts or {}
  local name = opts.name or "squad.evaluate"
  local warn = opts.warn or function(msg) io.stderr:write(msg, "\n") end
  local f1, em, total = 0, 0, 0
  each_question(data, name, function(_, id, gts, loc)
    total = total + 1
    local pred = check_prediction(preds, id, name)
    if pred == nil then
      warn("Unanswered question " .. id .. " will receive score 0.")
      return
    end
    if #gts == 0 then
      error(("%s: %s has no answers; v1.1 scoring needs at least one (use the v2.0 evaluation)"):format(name, loc), 0)
    end
    local best_em, best_f1 = false, nil
    for _, gt in ipairs(gts) do
      if M.exact_match_score(pred, gt) then best_em = true end
      local f = M.f1_score(pred, gt)
      if best_f1 == nil or f > best_f1 then best_f1 = f end
    end
    if best_em then em = em + 1 end
    f1 = f1 + best_f1
  end)
  if total == 0 then error(name .. ": the dataset has no questions", 0) end
  return json.object({ exact_match = 100.0 * em / total, f1 = 100.0 * f1 / total }, { "exact_match", "f1" })
end

local V2_KEYS = { "exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total",
  "NoAns_exact", "NoAns_f1", "NoAns_total", "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh" }
local V2_INTS = { total = true, HasAns_total = true, NoAns_total = true }

-- evaluate_v2(data, preds[, opts]) as evaluate-v2.0.py. opts.na_probs: qid ->
-- probability of no answer, opts.na_prob_keys: its keys in file order (ties in
-- the best-threshold search follow it, as in Python), opts.na_prob_ints: the
-- set of qids whose value was an integer literal (a threshold taken from one
-- prints as an int, as in Python), opts.na_prob_thresh (1.0).
-- Every question needs a prediction (the official script fails otherwise).
function M.evaluate_v2(data, preds, opts)
  opts = opts or {}
  local name = opts.name or "squad.evaluate"
  local warn = opts.warn or function(msg) io.stderr:write(msg, "\n") end
  local thresh = opts.na_prob_thresh or 1.0
  local has_ans, order = {}, {}
  local exact_raw, f1_raw, scored = {}, {}, {}
  local missing = 0
  each_question(data, name, function(_, id, texts)
    if has_ans[id] == nil then order[#order + 1] = id end
    has_ans[id] = #texts > 0
    local gold = {}
    for _, t in ipairs(texts) do if M.normalize_answer(t) ~= "" then gold[#gold + 1] = t end end
    if #gold == 0 then gold = { "" } end
    local pred = check_prediction(preds, id, name)
    if pred == nil then
      warn("Missing prediction for " .. id)
      missing = missing + 1
      return
    end
    if exact_raw[id] == nil then scored[#scored + 1] = id end
    local e, f = nil, nil
    for _, g in ipairs(gold) do
      local ge, gf = M.compute_exact(g, pred), M.compute_f1(g, pred)
      if e == nil or ge > e then e = ge end
      if f == nil or gf > f then f = gf end
    end
    exact_raw[id], f1_raw[id] = e, f
  end)
  if #order == 0 then error(name .. ": the dataset has no questions", 0) end
  if missing > 0 then
    error(("%s: %d question(s) have no prediction; SQuAD v2.0 scoring needs one for every question "
      .. "(the official script fails with a KeyError)"):format(name, missing), 0)
  end
  local na_probs = opts.na_probs
  local function na(id)
    local v = na_probs and na_probs[id] or (not na_probs and 0.0) or nil
    if type(v) ~= "number" then
      error(("%s: the no-answer probability file has no number for question %s"):format(name, id), 0)
    end
    return v
  end
  local exact_t, f1_t = {}, {}
  for _, id in ipairs(scored) do
    if na(id) > thresh then
      local v = has_ans[id] and 0.0 or 1.0
      exact_t[id], f1_t[id] = v, v
    else
      exact_t[id], f1_t[id] = exact_raw[id], f1_raw[id]
    end
  end
  local out = {}
  local function eval_dict(list, prefix)
    local se, sf = 0, 0
    for _, id in ipairs(list) do se = se + exact_t[id]; sf = sf + f1_t[id] end
    out[prefix .. "exact"] = 100.0 * se / #list
    out[prefix .. "f1"] = 100.0 * sf / #list
    out[prefix .. "total"] = #list
  end
  eval_dict(scored, "")
  local has_list, no_list = {}, {}
  for _, id in ipairs(order) do
    if has_ans[id] then has_list[#has_list + 1] = id else no_list[#no_list + 1] = id end
  end
  if #has_list > 0 then eval_dict(has_list, "HasAns_") end
  if #no_list > 0 then eval_dict(no_list, "NoAns_") end
  if na_probs then
    local keys = opts.na_prob_keys
    if not keys then
      keys = {}
      for k in pairs(na_probs) do keys[#keys + 1] = k end
      table.sort(keys)
    end
    local uniq, seen = {}, {}
    for _, k in ipairs(keys) do
      if not seen[k] then
        seen[k] = true
        if type(na_probs[k]) ~= "number" then
          error(("%s: no-answer probability for %s is not a number"):format(name, tostring(k)), 0)
        end
        uniq[#uniq + 1] = k
      end
    end
    local pos = {}
    for i, k in ipairs(uniq) do pos[k] = i end
    table.sort(uniq, function(a, b)
      local va, vb = na_probs[a], na_probs[b]
      if va ~= vb then return va < vb end
      return pos[a] < pos[b]
    end)
    local num_no_ans = #no_list
    local function best(scores)
      local cur = num_no_ans
      local best_score, best_thresh, thresh_id = cur, 0.0, nil
      for _, id in ipairs(uniq) do
        if scores[id] ~= nil then
          local diff
          if has_ans[id] then diff = scores[id]
          elseif preds[id] ~= "" then diff = -1
          else diff = 0 end
          cur = cur + diff
          if cur > best_score then best_score, best_thresh, thresh_id = cur, na_probs[id], id end
        end
      end
      return 100.0 * best_score / #scored, best_thresh, thresh_id
    end
    local ints = {}
    for k, v in pairs(V2_INTS) do ints[k] = v end
    local na_ints = opts.na_prob_ints or {}
    local eid, fid
    out.best_exact, out.best_exact_thresh, eid = best(exact_raw)
    out.best_f1, out.best_f1_thresh, fid = best(f1_raw)
    ints.best_exact_thresh = eid ~= nil and na_ints[eid] or nil
    ints.best_f1_thresh = fid ~= nil and na_ints[fid] or nil
    return json.object(out, V2_KEYS, ints)
  end
  return json.object(out, V2_KEYS, V2_INTS)
end

-- dataset_version(json) -> "1.1" or "2.0": the 'version' field ("v2.0", "2.0"),
-- else 2.0 when any question carries is_impossible.
function M.dataset_version(dataset)
  local v = dataset and dataset.version
  if type(v) == "string" then
    local major = v:match("^[vV]?(%d+)")
    if major == "2" then return "2.0" end
    if major == "1" then return "1.1" end
  end
  for _, article in ipairs(type(dataset) == "table" and type(dataset.data) == "table" and dataset.data or {}) do
    for _, p in ipairs(type(article) == "table" and type(article.paragraphs) == "table" and article.paragraphs or {}) do
      for _, qa in ipairs(type(p) == "table" and type(p.qas) == "table" and p.qas or {}) do
        if type(qa) == "table" and qa.is_impossible ~= nil then return "2.0" end
      end
    end
  end
  return "1.1"
end

-- has_answers(json) -> true when any question has a non-empty 'answers'
-- array (a dev file that can be scored); malformed entries are passed over.
function M.has_answers(dataset)
  local function arr(t, k) return type(t) == "table" and type(t[k]) == "table" and t[k] or {} end
  for _, article in ipairs(arr(dataset, "data")) do
    for _, p in ipairs(arr(article, "paragraphs")) do
      for _, qa in ipairs(arr(p, "qas")) do
        if type(qa) == "table" and type(qa.answers) == "table" and #qa.answers > 0 then return true end
      end
    end
  end
  return false
end

-- evaluate(dataset, preds[, opts]): dataset is the decoded JSON file (with
-- 'data' and 'version'); opts.version forces "1.1"/"2.0". Returns the result
-- object (print it with squad.format_eval) and the version used.
function M.evaluate(dataset, preds, opts)
  opts = opts or {}
  if type(dataset) ~= "table" then error("squad.evaluate: dataset must be a decoded JSON object", 2) end
  if type(preds) ~= "table" then error("squad.evaluate: predictions must be a JSON object (id -> text)", 2) end
  local version = opts.version
  if version == nil or version == "auto" then version = M.dataset_version(dataset) end
  if version == "1.1" or version == "1" then
    return M.evaluate_v1(dataset.data, preds, opts), "1.1"
  elseif version == "2.0" or version == "2" then
    return M.evaluate_v2(dataset.data, preds, opts), "2.0"
  end
  error("squad.evaluate: unknown version '" .. tostring(version) .. "' (1.1 or 2.0)", 2)
end

-- The exact text the official scripts print: v1.1 json.dumps(result),
-- v2.0 json.dumps(result, indent=2) on stdout and json.dump(result) to --out-file.
function M.format_eval(result, version, to_file)
  if version == "2.0" and not to_file then return json.dumps(result, { indent = 2 }) end
  return json.dumps(result)
end

------------------------------------------------------------------ reading

return M
