-- bertlua.squad: SQuAD v1.1/v2.0 data handling, faithful to google-research/bert
-- run_squad.py (read_squad_examples, convert_examples_to_features,
-- write_predictions) and to the official evaluate-v1.1.py / evaluate-v2.0.py.
--
--   local squad = require "bertlua.squad"
--   local ex, rep = squad.read_examples("dev-v1.1.json", { is_training = false })
--   local feats = squad.convert_examples_to_features(ex, tok, { is_training = false })
--   local batch = squad.pack_features(feats, 1, 32)         -- int32 FFI arrays
--   local out = squad.write_predictions(ex, feats, results, { tokenizer = tok,
--                  output_dir = "out", version_2_with_negative = false })
--   local scores = squad.evaluate(dataset_json, predictions)  -- official metrics
--
-- Index convention: every *position* (word index of an answer, sequence
-- position in a feature, token_to_orig_map keys and values) is 0-based, as in
-- the reference and in the C API, so start_position/end_position can be fed
-- straight to the loss. Lua arrays (doc_tokens, tokens, input_ids, logits) are
-- 1-based as usual: tokens[pos + 1] is the token at position pos.
--
-- Characters are Unicode code points (answer_start counts code points, as
-- Python does); text is UTF-8.
--
-- The tokenizer object `tok` must provide tok:tokenize(text) -> {wordpieces},
-- tok:convert_tokens_to_ids(tokens) -> {ids}, tok:basic_tokenize(text) ->
-- {tokens} (for write_predictions), and tok.pad_id (default 0).
local ffi = require "ffi"
local metrics = require "bertlua.metrics"

local M = {}

------------------------------------------------------------------ UTF-8 and Unicode

-- chars(s): array of the UTF-8 characters of s (malformed bytes are single characters).
local function chars(s)
  local out, n, i, len = {}, 0, 1, #s
  local byte, sub = string.byte, string.sub
  while i <= len do
    local c = byte(s, i)
    local nb = 1
    if c >= 0xF0 and c < 0xF5 then nb = 4 elseif c >= 0xE0 and c < 0xF0 then nb = 3
    elseif c >= 0xC2 and c < 0xE0 then nb = 2 end
    if nb > 1 then
      for k = 1, nb - 1 do
        local cc = byte(s, i + k)
        if not cc or cc < 0x80 or cc > 0xBF then nb = 1; break end
      end
    end
    n = n + 1
    out[n] = sub(s, i, i + nb - 1)
    i = i + nb
  end
  return out
end
M.chars = chars

local function decode(s)
  local out, n, i, len = {}, 0, 1, #s
  local byte = string.byte
  while i <= len do
    local c = byte(s, i)
    local cp, nb = c, 1
    if c >= 0xF0 and c < 0xF5 then cp, nb = c % 8, 4 elseif c >= 0xE0 and c < 0xF0 then cp, nb = c % 16, 3
    elseif c >= 0xC2 and c < 0xE0 then cp, nb = c % 32, 2 end
    if nb > 1 then
      for k = 1, nb - 1 do
        local cc = byte(s, i + k)
        if not cc or cc < 0x80 or cc > 0xBF then cp, nb = c, 1; break end
        cp = cp * 64 + cc % 64
      end
    end
    n = n + 1
    out[n] = cp
    i = i + nb
  end
  return out
end

local function encode_cp(cp)
  local char = string.char
  if cp < 0x80 then return char(cp) end
  if cp < 0x800 then return char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64) end
  if cp < 0x10000 then
    return char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
  end
  return char(0xF0 + math.floor(cp / 262144), 0x80 + math.floor(cp / 4096) % 64,
    0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
end

local function encode(cps, i, j)
  local out = {}
  for k = i or 1, j or #cps do out[#out + 1] = encode_cp(cps[k]) end
  return table.concat(out)
end

-- utf8proc (linked into libbertlua; also loadable on its own) gives the
-- Unicode case mappings and categories Python's str.lower() and re's \w use.
local U
local function uni()
  if U then return U end
  for _, decl in ipairs {
    "int32_t utf8proc_tolower(int32_t c);",
    "int32_t utf8proc_toupper(int32_t c);",
    "int utf8proc_category(int32_t c);",
  } do pcall(ffi.cdef, decl) end
  local lib
  if pcall(function() return ffi.C.utf8proc_tolower end) then lib = ffi.C
  else
    for _, name in ipairs { "utf8proc", "libutf8proc.so.3", "libutf8proc.so.2" } do
      local ok, l = pcall(ffi.load, name)
      if ok and pcall(function() return l.utf8proc_tolower end) then lib = l; break end
    end
  end
  if not lib then error("squad: libutf8proc is needed for non-ASCII text and could not be loaded", 0) end
  U = lib
  return U
end

-- Python 3 str.isspace(), which str.split() uses.
local PY_SPACE = { [9] = true, [10] = true, [11] = true, [12] = true, [13] = true, [28] = true,
  [29] = true, [30] = true, [31] = true, [32] = true, [0x85] = true, [0xA0] = true, [0x1680] = true,
  [0x2028] = true, [0x2029] = true, [0x202F] = true, [0x205F] = true, [0x3000] = true }
for c = 0x2000, 0x200A do PY_SPACE[c] = true end

-- string.punctuation
local PUNCT = {}
for c in ("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"):gmatch(".") do PUNCT[c:byte()] = true end

-- Categories (utf8proc numbering): Lu=1 Ll=2 Lt=3 Lm=4 Lo=5 Mn=6 Me=8 Nd=9 Nl=10 No=11 Sk=21 Cf=27
local function is_word_cp(c)
  if c < 128 then
    return (c >= 48 and c <= 57) or (c >= 65 and c <= 90) or (c >= 97 and c <= 122) or c == 95
  end
  local cat = uni().utf8proc_category(c)
  return (cat >= 1 and cat <= 5) or (cat >= 9 and cat <= 11)
end

-- Word_Break MidLetter / MidNumLet / Single_Quote, part of Case_Ignorable.
local CASE_IGNORABLE_EXTRA = { [0x27] = true, [0x2E] = true, [0x3A] = true, [0xB7] = true,
  [0x387] = true, [0x55F] = true, [0x5F4] = true, [0x2018] = true, [0x2019] = true, [0x2024] = true,
  [0x2027] = true, [0xFE13] = true, [0xFE52] = true, [0xFE55] = true, [0xFF07] = true,
  [0xFF0E] = true, [0xFF1A] = true }

local function case_ignorable(c)
  if CASE_IGNORABLE_EXTRA[c] then return true end
  local cat = uni().utf8proc_category(c)
  return cat == 6 or cat == 8 or cat == 27 or cat == 4 or cat == 21
end

local function cased(c)
  local u = uni()
  local cat = u.utf8proc_category(c)
  return cat == 1 or cat == 2 or cat == 3 or u.utf8proc_tolower(c) ~= c or u.utf8proc_toupper(c) ~= c
end

-- Python's Final_Sigma rule for U+03A3 at index i of cps.
local function final_sigma(cps, i)
  local j = i - 1
  while j >= 1 and case_ignorable(cps[j]) do j = j - 1 end
  if j < 1 or not cased(cps[j]) then return false end
  j = i + 1
  while j <= #cps and case_ignorable(cps[j]) do j = j + 1 end
  return j > #cps or not cased(cps[j])
end

-- Python str.lower() of code points (full mapping: U+0130 -> i + U+0307, final sigma).
local function py_lower(cps)
  local out, n = {}, 0
  local u
  for i = 1, #cps do
    local c = cps[i]
    if c < 128 then
      if c >= 65 and c <= 90 then c = c + 32 end
      n = n + 1; out[n] = c
    elseif c == 0x130 then
      out[n + 1], out[n + 2] = 0x69, 0x307; n = n + 2
    elseif c == 0x3A3 then
      n = n + 1; out[n] = final_sigma(cps, i) and 0x3C2 or 0x3C3
    else
      u = u or uni()
      n = n + 1; out[n] = u.utf8proc_tolower(c)
    end
  end
  return out
end

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
    if PY_SPACE[c] then
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

-- a JSON array as cjson decodes it: a table with element 1, or empty ({} and
-- [] decode alike); a non-empty JSON object has string keys and no element 1
local function is_array(t)
  return type(t) == "table" and (t[1] ~= nil or next(t) == nil)
end

local function where(ai, pi, qi, id)
  local s = ("article %d paragraph %d question %d"):format(ai, pi, qi)
  if id ~= nil then s = s .. " (id " .. tostring(id) .. ")" end
  return s
end

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
  return metrics.object({ exact_match = 100.0 * em / total, f1 = 100.0 * f1 / total }, { "exact_match", "f1" })
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
    return metrics.object(out, V2_KEYS, ints)
  end
  return metrics.object(out, V2_KEYS, V2_INTS)
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
  if version == "2.0" and not to_file then return metrics.json_dumps(result, { indent = 2 }) end
  return metrics.json_dumps(result)
end

------------------------------------------------------------------ reading

local function read_file(path)
  local f, err = io.open(path, "rb")
  if not f then error("squad: cannot open " .. tostring(path) .. ": " .. tostring(err), 0) end
  local text = f:read("*a")
  f:close()
  if text:sub(1, 3) == "\239\187\191" then text = text:sub(4) end
  return text
end
M.read_file = read_file

-- load_json(path) -> decoded value (cjson); a clear error names the file.
function M.load_json(path)
  local cjson = require "cjson"
  local text = read_file(path)
  local ok, v = pcall(cjson.decode, text)
  if not ok then
    error(("squad: %s is not valid JSON (%s)"):format(path, tostring(v):gsub("^.-: ", "")), 0)
  end
  return v, text
end

-- run_squad.py's is_whitespace (note U+202F, and not the other Unicode spaces)
local DOC_SPACE = { [" "] = true, ["\t"] = true, ["\r"] = true, ["\n"] = true, ["\226\128\175"] = true }

local function whitespace_tokenize(text)
  local out = {}
  for w in text:gmatch("%S+") do out[#out + 1] = w end
  return out
end

-- Python str.split() (Unicode whitespace), which tokenization.whitespace_tokenize uses
function M.py_split(text)
  if not text:find("[\128-\255]") then
    local out = {}
    for w in text:gmatch("[^\t-\r\28-\31 ]+") do out[#out + 1] = w end
    return out
  end
  local out, cur = {}, {}
  for _, c in ipairs(decode(text)) do
    if PY_SPACE[c] then
      if #cur > 0 then out[#out + 1] = encode(cur); cur = {} end
    else cur[#cur + 1] = c end
  end
  if #cur > 0 then out[#out + 1] = encode(cur) end
  return out
end

-- split a context into doc_tokens and char_to_word_offset (code points)
function M.split_context(text)
  local cs = chars(text)
  local doc_tokens, offset = {}, {}
  local prev_ws = true
  for i = 1, #cs do
    local c = cs[i]
    if DOC_SPACE[c] then
      prev_ws = true
    else
      if prev_ws then doc_tokens[#doc_tokens + 1] = c
      else doc_tokens[#doc_tokens] = doc_tokens[#doc_tokens] .. c end
      prev_ws = false
    end
    offset[i] = #doc_tokens - 1
  end
  return doc_tokens, offset, cs
end

-- read_examples(path_or_dataset, opts) -> examples, report
--   opts.is_training (false): compute answer positions and skip questions
--     whose answer cannot be recovered from the context (as the reference).
--   opts.version_2_with_negative (auto from the file): read is_impossible.
--   opts.strict_answers (false): also skip when the context at answer_start is
--     not exactly the answer text (the reference only checks the word span).
--   opts.quiet: do not print problems to stderr (they are in report.problems).
-- report = { questions, examples, skipped, warnings, problems = {strings}, version }
-- Each example: qas_id, question_text, doc_tokens, char_to_word_offset,
-- orig_answer_text, start_position, end_position (0-based word indices,
-- -1 for impossible), is_impossible, answers ({text, answer_start} as given).
function M.read_examples(src, opts)
  opts = opts or {}
  local name, dataset = "squad", src
  if type(src) == "string" then name = src; dataset = M.load_json(src) end
  if type(dataset) ~= "table" or not is_array(dataset.data) then
    error(name .. ": not a SQuAD file (no 'data' array)", 0)
  end
  local v2 = opts.version_2_with_negative
  if v2 == nil then v2 = M.dataset_version(dataset) == "2.0" end
  local training = opts.is_training or false
  local report = { questions = 0, examples = 0, skipped = 0, warnings = 0, problems = {},
    version = v2 and "2.0" or "1.1" }
  local function problem(loc, msg, skipped)
    local line = ("%s: %s: %s%s"):format(name, loc, msg, skipped and " (skipped)" or "")
    report.problems[#report.problems + 1] = line
    if skipped then report.skipped = report.skipped + 1 else report.warnings = report.warnings + 1 end
    if not opts.quiet then io.stderr:write(line, "\n") end
  end
  local examples = {}
  for ai, article in ipairs(dataset.data) do
    local paragraphs = type(article) == "table" and article.paragraphs
    if not is_array(paragraphs) then
      problem(("article %d"):format(ai), "no 'paragraphs' array", true)
      paragraphs = {}
    end
    for pi, p in ipairs(paragraphs) do
      local qas = type(p) == "table" and p.qas
      local context = type(p) == "table" and p.context
      local ploc = ("article %d paragraph %d"):format(ai, pi)
      if not is_array(qas) then
        problem(ploc, "no 'qas' array", true)
      elseif type(context) ~= "string" then
        report.questions = report.questions + #qas
        problem(ploc, ("'context' is missing or not a string, %d question(s)"):format(#qas), true)
        report.skipped = report.skipped + #qas - 1
      else
        local doc_tokens, c2w, cs = M.split_context(context)
        if #doc_tokens == 0 then
          report.questions = report.questions + #qas
          problem(ploc, ("empty context, %d question(s)"):format(#qas), true)
          report.skipped = report.skipped + #qas - 1
          qas = {}
        end
        for qi, qa in ipairs(qas) do
          report.questions = report.questions + 1
          local ok_q = true
          local id = type(qa) == "table" and qa.id or nil
          local loc = where(ai, pi, qi, id)
          local function bad(msg) problem(loc, msg, true); ok_q = false end
          if type(qa) ~= "table" then bad("not an object")
          elseif type(id) ~= "string" then bad("'id' is missing or not a string")
          elseif type(qa.question) ~= "string" then bad("'question' is missing or not a string")
          elseif qa.answers ~= nil and not is_array(qa.answers) then bad("'answers' is not an array")
          end
          local ex
          if ok_q then
            local answers = qa.answers or {}
            local is_impossible = false
            if v2 then
              if qa.is_impossible == nil then is_impossible = #answers == 0
              elseif type(qa.is_impossible) == "boolean" then is_impossible = qa.is_impossible
              else bad("'is_impossible' is not a boolean") end
            end
            ex = { qas_id = id, question_text = qa.question, doc_tokens = doc_tokens,
              char_to_word_offset = c2w, is_impossible = is_impossible, answers = {},
              start_position = nil, end_position = nil, orig_answer_text = nil }
            -- check every answer; in training only the first one is used
            for k, a in ipairs(answers) do
              if not ok_q then break end
              local aloc_bad = function(msg)
                if training and k == 1 and not is_impossible then bad(msg)
                else problem(loc, msg, false) end
              end
              if type(a) ~= "table" or type(a.text) ~= "string" then
                aloc_bad(("answer %d has no 'text' string"):format(k))
              elseif type(a.answer_start) ~= "number" or a.answer_start ~= math.floor(a.answer_start) then
                aloc_bad(("answer %d has no integer 'answer_start'"):format(k))
              else
                local text, start = a.text, a.answer_start
                local alen = #chars(text)
                ex.answers[#ex.answers + 1] = { text = text, answer_start = start }
                local first = training and k == 1 and not is_impossible
                if alen == 0 then
                  aloc_bad(("answer %d is empty"):format(k))
                elseif start < 0 or start + alen > #cs then
                  aloc_bad(("answer %d at %d+%d is outside the context (%d characters)"):format(k, start, alen, #cs))
                else
                  local at = table.concat(cs, "", start + 1, start + alen)
                  local sp, ep = c2w[start + 1], c2w[start + alen]
                  if k == 1 and not is_impossible then
                    ex.orig_answer_text, ex.start_position, ex.end_position = text, sp, ep
                  end
                  -- the reference's test: the answer's words must appear in the word span
                  local found = true
                  if first then
                    local actual = table.concat(doc_tokens, " ", sp + 1, ep + 1)
                    local cleaned = table.concat(M.py_split(text), " ")
                    found = actual:find(cleaned, 1, true) ~= nil
                  end
                  if not found then
                    bad(("could not find answer %q in the words at %d (%q)"):format(text, start, at))
                  elseif at ~= text then
                    local msg = ("answer %d text %q does not match the context at %d (%q)"):format(k, text, start, at)
                    if first and opts.strict_answers then bad(msg)
                    else problem(loc, msg .. (first and "; its words are in the span, kept" or ""), false) end
                  end
                end
              end
            end
            if ok_q and training and not is_impossible and #answers ~= 1 then
              bad(("has %d answers; for training, each question should have exactly 1"):format(#answers))
            end
            if ok_q and is_impossible then
              ex.start_position, ex.end_position, ex.orig_answer_text = -1, -1, ""
            end
          end
          if ok_q then examples[#examples + 1] = ex end
        end
      end
    end
  end
  report.examples = #examples
  return examples, report
end

------------------------------------------------------------------ features

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

-- pack_features(features[, first=1[, count=all]]) -> batch of FFI int32 arrays:
-- { n, seq_len, input_ids, input_mask, segment_ids (n*seq_len, row-major),
--   start_positions, end_positions (n; -1 when the feature has none), unique_ids (n, int64) }
function M.pack_features(features, first, count)
  first = first or 1
  count = count or (#features - first + 1)
  if count < 1 or first < 1 or first + count - 1 > #features then
    error(("squad.pack_features: range %d..%d outside 1..%d"):format(first, first + count - 1, #features), 2)
  end
  local L = #features[first].input_ids
  local b = { n = count, seq_len = L,
    input_ids = ffi.new("int32_t[?]", count * L), input_mask = ffi.new("int32_t[?]", count * L),
    segment_ids = ffi.new("int32_t[?]", count * L), start_positions = ffi.new("int32_t[?]", count),
    end_positions = ffi.new("int32_t[?]", count), unique_ids = ffi.new("int64_t[?]", count) }
  for r = 0, count - 1 do
    local f = features[first + r]
    if #f.input_ids ~= L or #f.input_mask ~= L or #f.segment_ids ~= L then
      error(("squad.pack_features: feature %d has length %d, expected %d"):format(first + r, #f.input_ids, L), 2)
    end
    local base = r * L
    local ids, mask, seg = f.input_ids, f.input_mask, f.segment_ids
    for i = 1, L do
      b.input_ids[base + i - 1] = ids[i]
      b.input_mask[base + i - 1] = mask[i]
      b.segment_ids[base + i - 1] = seg[i]
    end
    b.start_positions[r] = f.start_position or -1
    b.end_positions[r] = f.end_position or -1
    b.unique_ids[r] = f.unique_id or 0
  end
  return b
end

------------------------------------------------------------------ predictions

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

local function write_text(path, text)
  local f, err = io.open(path, "wb")
  if not f then error("squad: cannot write " .. path .. ": " .. tostring(err), 0) end
  f:write(text)
  f:close()
end

-- write_predictions(examples, features, results, opts) -> predictions, nbest, null_odds
-- results: one per feature, {start_logits = {...}, end_logits = {...}} (Lua
-- arrays over the sequence) with an optional unique_id (else aligned with features).
-- opts: tokenizer (required), n_best_size 20, max_answer_length 30,
-- version_2_with_negative false, null_score_diff_threshold 0.0, and
-- output_dir, or prediction_file / nbest_file / null_odds_file, to write
-- predictions.json, nbest_predictions.json, null_odds.json (json.dumps indent=4).
-- Returned tables are ordered JSON objects (qas_id in example order).
function M.write_predictions(examples, features, results, opts)
  opts = opts or {}
  local tok = opts.tokenizer
  if not tok then error("squad.write_predictions: opts.tokenizer is required (for get_final_text)", 2) end
  local n_best_size = opts.n_best_size or 20
  local max_answer_length = opts.max_answer_length or 30
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
      local starts = best_indexes(sl, n_best_size)
      local ends = best_indexes(el, n_best_size)
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
      nbest_json[i] = metrics.object({ text = entry.text, probability = probs[i],
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
  metrics.object(all_predictions, ids)
  metrics.object(all_nbest, ids)
  metrics.object(scores_diff, ids)
  local pf, nf, of = opts.prediction_file, opts.nbest_file, opts.null_odds_file
  if opts.output_dir then
    pf = pf or (opts.output_dir .. "/predictions.json")
    nf = nf or (opts.output_dir .. "/nbest_predictions.json")
    of = of or (opts.output_dir .. "/null_odds.json")
  end
  if pf then write_text(pf, metrics.json_dumps(all_predictions, { indent = 4 }) .. "\n") end
  if nf then write_text(nf, metrics.json_dumps(all_nbest, { indent = 4 }) .. "\n") end
  if of and v2 then write_text(of, metrics.json_dumps(scores_diff, { indent = 4 }) .. "\n") end
  return all_predictions, all_nbest, v2 and scores_diff or nil
end

return M
