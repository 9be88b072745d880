-- SQuAD reading, features and predictions against a faithful Python copy of
-- google-research/bert run_squad.py (tests/py/squad_reference.py), both driven
-- by the same small deterministic tokenizer (defined here and there), plus
-- malformed-input handling and hand-computed cases.
local T = require "testing"
local squad = require "bertlua.tasks.squad"
local cjson = require "cjson"
local rng = require "bertlua.util.rng"

local PY = os.getenv("BL_PYTHON") or "/usr/bin/python3"
local REF = "tests/py/squad_reference.py"

local tmp = os.tmpname(); os.remove(tmp); os.execute("mkdir -p " .. tmp)
T.at_exit(function() os.execute("rm -rf " .. tmp) end)

local function sh(cmd)
  local p = io.popen(cmd .. "; echo \"__rc=$?\"")
  local out = p:read("*a"); p:close()
  local rc = tonumber(out:match("__rc=(%d+)%s*$"))
  return out:gsub("__rc=%d+%s*$", ""), rc
end

local function write(path, text) local f = assert(io.open(path, "wb")); f:write(text); f:close() end
local function read(path) local f = assert(io.open(path, "rb")); local s = f:read("*a"); f:close(); return s end

local have_py
local function need_python()
  if have_py == nil then have_py = select(2, sh(PY .. " -c 'import json' 2>/dev/null")) == 0 end
  if not have_py then T.skip("no python at " .. PY .. " (set BL_PYTHON)") end
end

-- The test tokenizer (same as FakeTokenizer in tests/py/squad_reference.py):
-- split on ' \t\n\r', lowercase A-Z, split ASCII punctuation, greedy WordPiece.
local function fake_tokenizer(vocab_path)
  local vocab, n = {}, 0
  if vocab_path then
    for line in io.lines(vocab_path) do vocab[line] = n; n = n + 1 end
  else
    for _, w in ipairs { "[PAD]", "[UNK]", "[CLS]", "[SEP]" } do vocab[w] = n; n = n + 1 end
  end
  local tok = { vocab = vocab, pad_id = vocab["[PAD]"], cls_id = vocab["[CLS]"], sep_id = vocab["[SEP]"] }
  function tok:basic_tokenize(text)
    local out = {}
    for w in text:gmatch("[^ \t\n\r]+") do
      w = w:gsub("[A-Z]", string.lower)
      local cur = {}
      for c in w:gmatch(".") do
        if c:find("^[\33-\47\58-\64\91-\96\123-\126]$") then
          if #cur > 0 then out[#out + 1] = table.concat(cur); cur = {} end
          out[#out + 1] = c
        else cur[#cur + 1] = c end
      end
      if #cur > 0 then out[#out + 1] = table.concat(cur) end
    end
    return out
  end
  function tok:wordpiece(token)
    local cs = squad.chars(token)
    if #cs > 100 then return { "[UNK]" } end
    local out, start = {}, 1
    while start <= #cs do
      local stop, cur = #cs, nil
      while start <= stop do
        local sub = table.concat(cs, "", start, stop)
        if start > 1 then sub = "##" .. sub end
        if self.vocab[sub] then cur = sub; break end
        stop = stop - 1
      end
      if not cur then return { "[UNK]" } end
      out[#out + 1] = cur
      start = stop + 1
    end
    return out
  end
  function tok:tokenize(text)
    local out = {}
    for _, t in ipairs(self:basic_tokenize(text)) do
      for _, p in ipairs(self:wordpiece(t)) do out[#out + 1] = p end
    end
    return out
  end
  function tok:convert_tokens_to_ids(tokens)
    local ids = {}
    for i, t in ipairs(tokens) do
      ids[i] = self.vocab[t] or error("fake tokenizer: '" .. t .. "' not in vocab")
    end
    return ids
  end
  return tok
end

local function shared(sub)
  local base = T.shared_data()
  if not base then T.skip("shared data not found (set BL_SHARED_DATA)") end
  local p = base .. "/" .. sub
  local f = io.open(p); if not f then T.skip(p .. " not found") end; f:close()
  return p
end

-- write the first `n` articles of a SQuAD file (optionally first answer only)
local function subset(src, n, dst, first_answer_only)
  local d = squad.load_json(src)
  local arts = {}
  for i = 1, n do arts[i] = d.data[i] end
  if first_answer_only then
    for _, a in ipairs(arts) do
      for _, p in ipairs(a.paragraphs) do
        for _, qa in ipairs(p.qas) do
          if #qa.answers > 1 then qa.answers = { qa.answers[1] } end
        end
      end
    end
  end
  write(dst, cjson.encode({ version = d.version, data = arts }))
  return dst
end

local function compare_examples(examples, path)
  local ref = cjson.decode(read(path))
  T.eq(#examples, #ref, "example count")
  for i, r in ipairs(ref) do
    local e = examples[i]
    T.eq(e.qas_id, r[1])
    T.eq(#e.doc_tokens, #r[2], "doc_tokens of " .. e.qas_id)
    for k = 1, #r[2] do T.eq(e.doc_tokens[k], r[2][k]) end
    if r[3] ~= cjson.null then
      T.eq(e.start_position, r[3], "start of " .. e.qas_id); T.eq(e.end_position, r[4], "end of " .. e.qas_id)
      T.eq(e.orig_answer_text, r[5]); T.eq(e.is_impossible, r[6])
    end
  end
end

local function compare_features(features, path)
  local ref = cjson.decode(read(path))
  T.eq(#features, #ref, "feature count")
  for i, r in ipairs(ref) do
    local f = features[i]
    local what = "feature " .. i
    T.eq(f.unique_id, r[1], what); T.eq(f.example_index, r[2], what); T.eq(f.doc_span_index, r[3], what)
    T.eq(table.concat(f.tokens, " "), table.concat(r[4], " "), what .. " tokens")
    for _, pair in ipairs { { f.input_ids, r[5] }, { f.input_mask, r[6] }, { f.segment_ids, r[7] } } do
      T.eq(#pair[1], #pair[2], what)
      for k = 1, #pair[2] do T.eq(pair[1][k], pair[2][k], what .. " position " .. k) end
    end
    local nmap = 0
    for _ in pairs(f.token_to_orig_map) do nmap = nmap + 1 end
    T.eq(nmap, #r[8], what .. " token_to_orig_map size")
    for _, kv in ipairs(r[8]) do T.eq(f.token_to_orig_map[kv[1]], kv[2], what .. " token_to_orig_map") end
    for _, kv in ipairs(r[9]) do T.eq(f.token_is_max_context[kv[1]], kv[2] == 1, what .. " max_context " .. kv[1]) end
    T.eq(f.start_position, r[10] ~= cjson.null and r[10] or nil, what .. " start_position")
    T.eq(f.end_position, r[11] ~= cjson.null and r[11] or nil, what .. " end_position")
  end
end

-- logits: small random values, with peaks on the answer for training
-- features, so predictions are sometimes right and sometimes not
local function make_results(features, seed, peaks)
  local r = rng(seed)
  local results, parts = {}, {}
  for i, f in ipairs(features) do
    local sl, el = {}, {}
    for k = 1, #f.input_ids do
      -- a trained model gives padding very low scores
      if f.input_mask[k] == 1 then sl[k] = r() * 4 - 2; el[k] = r() * 4 - 2
      else sl[k] = -10000 - r(); el[k] = -10000 - r() end
    end
    if peaks and f.start_position and f.start_position > 0 and r() < 0.8 then
      sl[f.start_position + 1] = 8 + r(); el[f.end_position + 1] = 8 + r()
    end
    if r() < 0.1 then sl[3] = sl[4] end -- ties
    results[i] = { unique_id = f.unique_id, start_logits = sl, end_logits = el }
    local s, e = {}, {}
    for k = 1, #sl do s[k] = ("%.17g"):format(sl[k]); e[k] = ("%.17g"):format(el[k]) end
    parts[#parts + 1] = ('"%d": [[%s], [%s]]'):format(f.unique_id, table.concat(s, ","), table.concat(e, ","))
  end
  return results, "{" .. table.concat(parts, ",\n") .. "}"
end

local function run_case(name, opts)
  need_python()
  local vocab = shared("vocab/bert-base-uncased-vocab.txt")
  local tok = fake_tokenizer(vocab)
  local dir = tmp .. "/" .. name
  os.execute("mkdir -p " .. dir .. "/py " .. dir .. "/lua")
  local data = subset(shared("squad/" .. opts.file), opts.articles, dir .. "/data.json", opts.training)
  local examples, report = squad.read_examples(data, { is_training = opts.training, quiet = true })
  T.eq(report.skipped, 0, table.concat(report.problems, "\n"))
  local fopts = { is_training = opts.training, max_seq_length = opts.max_seq_length or 384,
    doc_stride = opts.doc_stride or 128, max_query_length = opts.max_query_length or 64 }
  local features = squad.convert_examples_to_features(examples, tok, fopts)
  local results, logits = make_results(features, opts.seed or 1, opts.training)
  write(dir .. "/logits.json", logits)
  local v2 = opts.file:find("v2") ~= nil
  local cmd = ("%s %s %s %s %s/py --max-seq-length %d --doc-stride %d --max-query-length %d --logits " ..
    "%s/logits.json%s%s 2>&1")
    :format(PY, REF, data, vocab, dir, fopts.max_seq_length, fopts.doc_stride, fopts.max_query_length, dir,
      opts.training and " --training" or "", v2 and " --v2" or "")
  local out, rc = sh(cmd)
  T.eq(rc, 0, out)
  compare_examples(examples, dir .. "/py/examples.json")
  compare_features(features, dir .. "/py/features.json")
  local preds, nbest, odds = squad.write_predictions(examples, features, results,
    { tokenizer = tok, output_dir = dir .. "/lua", version_2_with_negative = v2 })
  for _, fname in ipairs { "predictions.json", "nbest_predictions.json", v2 and "null_odds.json" or nil } do
    local a, b = read(dir .. "/lua/" .. fname), read(dir .. "/py/" .. fname)
    if a ~= b then
      local i = 1
      while a:sub(i, i) == b:sub(i, i) do i = i + 1 end
      error(("%s differs at byte %d: lua ...%s... python ...%s..."):format(fname, i, a:sub(i - 80, i + 40),
        b:sub(i - 80, i + 40)))
    end
  end
  T.eq(odds ~= nil, v2)
  local n = 0
  for _ in pairs(preds) do n = n + 1 end
  T.eq(n, #examples)
  T.truthy(nbest[examples[1].qas_id][1].probability > 0)
  return examples, features, preds, data
end

T.test("dev-v1.1 (1 article), eval mode, seq 128 / stride 32 / query 16: examples, features, predictions = reference",
  function()
  local ex, feats = run_case("v1eval", { file = "dev-v1.1.json", articles = 1, max_seq_length = 128,
    doc_stride = 32, max_query_length = 16 })
  T.truthy(#feats > #ex, "long contexts must give several spans")
end)

T.test("dev-v1.1 (2 articles, first answers), training, 384/128/64: positions and predictions = reference; EM high",
  function()
  local _, _, preds, data = run_case("v1train", { file = "dev-v1.1.json", articles = 2, training = true, seed = 3 })
  local r = squad.evaluate(squad.load_json(data), preds)
  -- 80% of answer-bearing features have logit peaks on the gold span
  T.truthy(r.exact_match > 60 and r.exact_match < 99, "EM " .. r.exact_match)
end)

T.test("dev-v2.0 half (2 articles), training, seq 160 / stride 48: impossible questions -> [CLS]; = reference",
  function()
  local _, feats = run_case("v2train", { file = "dev-v2.0.cs224n-half.json", articles = 2, training = true,
    max_seq_length = 160, doc_stride = 48, seed = 5 })
  local cls, inside = 0, 0
  for _, f in ipairs(feats) do
    if f.start_position == 0 then cls = cls + 1 else inside = inside + 1 end
    T.truthy(f.end_position >= f.start_position)
  end
  T.truthy(cls > 0 and inside > 0)
end)

T.test("dev-v2.0 half (2 articles), eval mode: null_odds and predictions = reference", function()
  run_case("v2eval", { file = "dev-v2.0.cs224n-half.json", articles = 2, seed = 9 })
end)

T.test("read_examples: whitespace, U+202F and code-point offsets", function()
  local ctx = "Héllo  wörld\226\128\175x\ty 😀z end"
  local d = { version = "1.1", data = { { paragraphs = { { context = ctx, qas = {
    { id = "a", question = "q", answers = { { text = "😀z", answer_start = 18 } } },
    { id = "b", question = "q", answers = { { text = "wörld", answer_start = 7 } } },
  } } } } } }
  local ex, rep = squad.read_examples(d, { is_training = true, quiet = true })
  T.eq(rep.skipped, 0, table.concat(rep.problems, "\n"))
  T.eq(table.concat(ex[1].doc_tokens, "|"), "Héllo|wörld|x|y|😀z|end")
  T.eq(ex[1].start_position, 4); T.eq(ex[1].end_position, 4)
  T.eq(ex[2].start_position, 1); T.eq(ex[2].end_position, 1)
  T.eq(#ex[1].char_to_word_offset, 23)
end)

T.test("read_examples: malformed input is reported with its location and skipped", function()
  local d = { version = "1.1", data = {
    { paragraphs = {
      { context = "The cat sat on the mat.", qas = {
        { id = "ok", question = "Who?", answers = { { text = "cat", answer_start = 4 } } },
        { id = 7, question = "Who?", answers = { { text = "cat", answer_start = 4 } } },
        { id = "noq", answers = { { text = "cat", answer_start = 4 } } },
        { id = "far", question = "Who?", answers = { { text = "cat", answer_start = 40 } } },
        { id = "wrong", question = "Who?", answers = { { text = "dog", answer_start = 4 } } },
        { id = "shift", question = "Who?", answers = { { text = "at", answer_start = 4 } } },
        { id = "two", question = "Who?", answers = { { text = "cat", answer_start = 4 }, { text = "mat",
          answer_start = 19 } } },
      } },
      { context = "   ", qas = { { id = "e1", question = "q", answers = {} }, { id = "e2", question = "q",
        answers = {} } } },
      { qas = { { id = "nc", question = "q", answers = {} } } },
    } },
    { title = "no paragraphs" },
  } }
  local ex, rep = squad.read_examples(d, { is_training = true, quiet = true })
  local ids = {}
  for _, e in ipairs(ex) do ids[#ids + 1] = e.qas_id end
  -- "shift": 'at' at 4 is "ca" in the context, but its words are in the span: kept as the reference does
  T.eq(table.concat(ids, ","), "ok,shift")
  local all = table.concat(rep.problems, "\n")
  for _, want in ipairs {
    "article 1 paragraph 1 question 2 (id 7): 'id' is missing or not a string (skipped)",
    "question 3 (id noq): 'question' is missing",
    "question 4 (id far): answer 1 at 40+3 is outside the context (23 characters) (skipped)",
    "question 5 (id wrong): could not find answer \"dog\"",
    "question 6 (id shift): answer 1 text \"at\" does not match the context at 4",
    "question 7 (id two): has 2 answers; for training",
    "article 1 paragraph 2: empty context, 2 question(s) (skipped)",
    "article 1 paragraph 3: 'context' is missing",
    "article 2: no 'paragraphs' array (skipped)",
  } do T.truthy(all:find(want, 1, true), "missing problem line: " .. want .. "\n--- got:\n" .. all) end
  T.eq(rep.questions, 10)
  T.eq(rep.skipped, 9)
  T.eq(rep.examples, 2)
  -- strict mode also drops "shift"; eval mode keeps everything with an id and question
  local ex2 = squad.read_examples(d, { is_training = true, quiet = true, strict_answers = true })
  T.eq(#ex2, 1)
  local ex3 = squad.read_examples(d, { is_training = false, quiet = true })
  T.eq(#ex3, 5) -- ok, far, wrong, shift, two
  -- predictions are keyed by id: a shared id is refused, naming the first two questions that use it
  local q = function(id) return { id = id, question = "Who?", answers = { { text = "cat", answer_start = 4 } } } end
  local dup = { version = "1.1", data = { { title = "t", paragraphs = {
    { context = "the cat sat on the mat", qas = { q("a"), q("b") } },
    { context = "the cat sat on the mat", qas = { q("c"), q("b"), q("b") } } } } } }
  T.raises(function() squad.read_examples(dup, { quiet = true }) end, "squad: article 1 paragraph 1 question 2 "
    .. "(id b) and article 1 paragraph 2 question 2 (id b) share the id \"b\"; question ids must be unique")
  -- not JSON / not SQuAD
  write(tmp .. "/bad.json", "{\"data\": [1, 2")
  T.raises(function() squad.read_examples(tmp .. "/bad.json") end, tmp .. "/bad.json is not valid JSON")
  write(tmp .. "/nodata.json", "{\"x\": 1}")
  T.raises(function() squad.read_examples(tmp .. "/nodata.json") end, "nodata.json: not a SQuAD file")
  T.raises(function() squad.read_examples(tmp .. "/nope.json") end, "cannot open")
end)

T.test("features: doc stride windows, max context, out-of-span answers -> 0/0 (hand-computed)", function()
  local tok = fake_tokenizer()
  for w in ("a b c d e f g h i j k l q"):gmatch("%S") do tok.vocab[w] = 100 + w:byte() end
  local ex = squad.read_examples({ version = "1.1", data = { { paragraphs = { { context = "a b c d e f g h i j k l",
    qas = { { id = "x", question = "q", answers = { { text = "k", answer_start = 20 } } } } } } } } },
    { is_training = true, quiet = true })
  -- query 1 token -> 8 - 1 - 3 = 4 doc tokens per window, stride 2: spans 0-3, 2-5, 4-7, 6-9, 8-11
  local f = squad.convert_examples_to_features(ex, tok, { is_training = true, max_seq_length = 8,
    doc_stride = 2, max_query_length = 4 })
  T.eq(#f, 5)
  T.eq(table.concat(f[1].tokens, " "), "[CLS] q [SEP] a b c d [SEP]")
  T.eq(table.concat(f[5].tokens, " "), "[CLS] q [SEP] i j k l [SEP]")
  T.eq(f[1].start_position, 0); T.eq(f[4].start_position, 0)   -- 'k' (index 10) not in 6-9
  T.eq(f[5].start_position, 5); T.eq(f[5].end_position, 5)     -- 3 + (10 - 8)
  -- token 'c' (2) is in spans 0 (left 2, right 1 -> 1.04) and 1 (left 0 -> 0.04): max context in span 0
  T.eq(f[1].token_is_max_context[5], true); T.eq(f[2].token_is_max_context[3], false)
  T.eq(f[1].token_to_orig_map[3], 0); T.eq(f[5].token_to_orig_map[6], 11)
  T.eq(table.concat(f[1].segment_ids, ""), "00011111")
  local b, S = squad.feature_batch(f, { 3, 4, 5 }, 8, true)
  T.eq(S, 8); T.eq(b.input_ids:shape()[1], 3)
  local ids, seg, mask = b.input_ids:totable(), b.token_type_ids:totable(), b.attention_mask:totable()
  T.eq(ids[1], tok.cls_id); T.eq(ids[8 + 4], 100 + ("g"):byte())
  T.eq(b.start_positions:totable()[3], 5); T.eq(seg[8], 1); T.eq(mask[8], 1)
  T.raises(function() squad.feature_batch(f, { 4, 6 }, 8) end, "no feature 6 of 5")
  T.raises(function() squad.convert_examples_to_features(ex, tok, { max_seq_length = 4 }) end, "leaves no room")
end)

-- one question, one window (1 [CLS] + 18 question tokens + 2 [SEP] + 12
-- context words), logits made by hand
local function span_case(logits_of)
  local tok = fake_tokenizer()
  local words = {}
  for i = 1, 18 do words[i] = "q" .. i; tok.vocab["q" .. i] = 200 + i end
  for i = 1, 12 do tok.vocab["w" .. i] = 300 + i end
  local ex = squad.read_examples({ version = "1.1", data = { { paragraphs = { {
    context = "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12",
    qas = { { id = "x", question = table.concat(words, " "), answers = { { text = "w5", answer_start = 12 } } } },
  } } } } },
    { is_training = false, quiet = true })
  local f = squad.convert_examples_to_features(ex, tok, { is_training = false, max_seq_length = 40,
    doc_stride = 8, max_query_length = 24 })
  T.eq(#f, 1); T.eq(#f[1].tokens, 33)
  local sl, el = logits_of(#f[1].tokens)
  local res = { { start_logits = sl, end_logits = el } }
  local out = {}
  for _, search in ipairs { "nbest", "exhaustive" } do
    local preds, _, _, empty = squad.write_predictions(ex, f, res, { tokenizer = tok, span_search = search,
      max_answer_length = 5 })
    out[search] = { text = preds.x, empty = empty }
  end
  return out
end

-- positions: 0 [CLS], 1-18 the question, 19 [SEP], 20-31 w1..w12, 32 [SEP]
T.test("span search: top-20 starts and ends outside the context: n-best answers empty, exhaustive finds the span",
  function()
  local r = span_case(function(n)
    local sl, el = {}, {}
    for k = 1, n do sl[k] = 10 + k / 100; el[k] = 10 + k / 100 end  -- every non-context position scores high
    for k = 21, 32 do sl[k] = -5; el[k] = -5 end                    -- the context lower
    sl[20 + 5] = 1; el[20 + 7] = 2                                   -- w5 .. w7 the best valid span
    el[20 + 12] = 3                                                  -- a better end 8 tokens away: too long
    return sl, el
  end)
  T.eq(r.nbest.text, "empty"); T.eq(r.nbest.empty, 1)
  T.eq(r.exhaustive.text, "w5 w6 w7"); T.eq(r.exhaustive.empty, 0)
end)

T.test("span search: top logits in the context: n-best and exhaustive agree", function()
  local r = span_case(function(n)
    local sl, el = {}, {}
    for k = 1, n do sl[k] = math.sin(k); el[k] = math.cos(k) end
    sl[20 + 3] = 6; el[20 + 4] = 5; el[20 + 2] = 7                  -- end before start is not a span
    return sl, el
  end)
  T.eq(r.nbest.text, "w3 w4"); T.eq(r.exhaustive.text, "w3 w4")
  T.eq(r.nbest.empty, 0); T.eq(r.exhaustive.empty, 0)
  T.raises(function() squad.write_predictions({}, {}, {}, { tokenizer = {}, span_search = "all" }) end,
    "span_search must be nbest or exhaustive, got all")
end)

T.test("get_final_text and softmax (hand-computed)", function()
  local tok = fake_tokenizer()
  T.eq(squad.get_final_text("steve smith", "Steve Smith's", tok), "Steve Smith")
  T.eq(squad.get_final_text("1990", "(1990)", tok), "1990")
  T.eq(squad.get_final_text("zzz", "Steve", tok), "Steve")                 -- not found -> orig
  T.eq(squad.get_final_text("ölm", "Böhm ölmez", tok), "ölm")              -- code-point alignment
  local p = squad.compute_softmax({ 1, 2, 3 })
  local z = math.exp(-2) + math.exp(-1) + 1
  T.near(p, { math.exp(-2) / z, math.exp(-1) / z, 1 / z }, 1e-15)
  T.raises(function() squad.write_predictions({}, {}, {}, {}) end, "opts.tokenizer is required")
end)

T.test("real tokenizer (bertlua.data.tokenizer): oracle logits give near-perfect EM on dev-v1.1 (3 articles)",
  function()
  local ok, tmod = pcall(require, "bertlua.data.tokenizer")
  if not ok then T.skip("bertlua.data.tokenizer not available yet: " .. tostring(tmod):sub(1, 80)) end
  local tok = tmod.load(shared("vocab/bert-base-uncased-vocab.txt"), { lower = true })
  local data = subset(shared("squad/dev-v1.1.json"), 3, tmp .. "/real.json", true)
  local ex = squad.read_examples(data, { is_training = true, quiet = true })
  local feats = squad.convert_examples_to_features(ex, tok, { is_training = true })
  T.eq(feats[1].input_ids[1], tok.cls_id)
  local results = {}
  for i, f in ipairs(feats) do
    local sl, el = {}, {}
    for k = 1, #f.input_ids do sl[k] = -5; el[k] = -5 end
    if f.start_position > 0 then sl[f.start_position + 1] = 5; el[f.end_position + 1] = 5 end
    results[i] = { start_logits = sl, end_logits = el }
  end
  local preds = squad.write_predictions(ex, feats, results, { tokenizer = tok })
  local r = squad.evaluate(squad.load_json(shared("squad/dev-v1.1.json")), preds, { warn = function() end })
  -- scored against all 10570 questions; the 3 articles hold a known share of them
  local n = 0
  for _ in pairs(preds) do n = n + 1 end
  T.truthy(r.exact_match / 100 * 10570 / n > 0.95,
    ("oracle EM on the subset too low: %g%% of all"):format(r.exact_match))
end)

T.run()
