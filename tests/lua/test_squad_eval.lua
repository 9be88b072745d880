-- SQuAD official evaluation: hand-computed cases, Unicode normalization and
-- full-file scores against a faithful Python copy of evaluate-v1.1.py /
-- evaluate-v2.0.py (tests/py/squad_official_eval.py, run with $BL_PYTHON).
local T = require "testing"
local squad = require "bertlua.tasks.squad"
local json = require "bertlua.util.json"
local cjson = require "cjson"
local rng = require "bertlua.util.rng"

local PY = os.getenv("BL_PYTHON") or "/usr/bin/python3"
local EXE = (os.getenv("BL_BUILD_DIR") or "build") .. "/bertlua"
local REF = "tests/py/squad_official_eval.py"

local tmp = os.tmpname(); os.remove(tmp); os.execute("mkdir -p " .. tmp)
T.at_exit(function() os.execute("rm -rf " .. tmp) end)

local function sh(cmd)
  local p = io.popen(cmd .. "; echo \"__rc=$?\"")
  local out = p:read("*a"); p:close()
  local rc = tonumber(out:match("__rc=(%d+)%s*$"))
  return out:gsub("__rc=%d+%s*$", ""), rc
end

local have_py
local function need_python()
  if have_py == nil then
    local _, rc = sh(PY .. " -c 'import json, re, collections' 2>/dev/null")
    have_py = rc == 0
  end
  if not have_py then T.skip("no python at " .. PY .. " (set BL_PYTHON)") end
end

local function write(path, text)
  local f = assert(io.open(path, "wb")); f:write(text); f:close()
end

local function read(path)
  local f = assert(io.open(path, "rb")); local s = f:read("*a"); f:close(); return s
end

local N = squad.normalize_answer

T.test("normalize_answer: hand-computed", function()
  T.eq(N("The Quick, brown fox!"), "quick brown fox")
  T.eq(N("an apple a day"), "apple day")
  T.eq(N("  Theater  anthem\tthe\nend "), "theater anthem end")
  T.eq(N("a-the"), "athe")                 -- punctuation goes first, then articles
  T.eq(N("A_the_b"), "atheb")
  T.eq(N("(the) [a] {an}"), "")
  T.eq(N("the 3rd"), "3rd")
  T.eq(N("\"Denver Broncos\""), "denver broncos")
  T.eq(N(""), "")
  T.eq(N("the\28x"), "x")                  -- \x1c is whitespace for Python's split
end)

T.test("normalize_answer: Unicode like Python 3", function()
  T.eq(N("Ünïcode Ä"), "ünïcode ä")
  T.eq(N("ΣΑΣ ΟΔΟΣ"), "σας οδος")           -- final sigma
  T.eq(N("Σ"), "σ")
  T.eq(N("İstanbul"), "i̇stanbul")           -- U+0130 -> i + U+0307
  T.eq(N("the\194\160end"), "end")          -- no-break space splits words
  T.eq(N("café the"), "café")
  T.eq(N("naïve—the"), "naïve—")            -- em dash is not string.punctuation
  T.eq(N("\226\128\139the"), "\226\128\139") -- zero-width space: not a word, not a space
  T.eq(N("thé"), "thé")
  T.eq(N("the\204\129"), "\204\129")        -- combining accent ends the word: 'the' goes
  T.eq(N("Ⅻ the ²"), "ⅻ ²")
  T.eq(N("ＡＢＣ　the"), "ａｂｃ")            -- ideographic space
end)

T.test("f1 and exact: hand-computed", function()
  T.near(squad.f1_score("the cat sat", "cat sat on mat"), 2 / 3, 1e-15)
  T.near(squad.f1_score("cat cat", "cat"), 2 * 0.5 * 1 / 1.5, 1e-15) -- bag, not set
  T.eq(squad.f1_score("dog", "cat"), 0)
  T.eq(squad.exact_match_score("The Denver Broncos.", "denver broncos"), true)
  T.eq(squad.compute_f1("", ""), 1)
  T.eq(squad.compute_f1("", "x"), 0)
  T.eq(squad.compute_f1("the", "x"), 0)     -- gold normalizes to empty
  T.eq(squad.compute_exact("", "a"), 1)    -- "a" normalizes to ""
end)

local function tiny_v1()
  return { version = "1.1", data = { { title = "t", paragraphs = {
    { context = "x", qas = {
      { id = "q1", question = "?", answers = { { text = "Denver Broncos", answer_start = 0 }, { text = "Broncos",
        answer_start = 0 } } },
      { id = "q2", question = "?", answers = { { text = "the big cat", answer_start = 0 } } },
      { id = "q3", question = "?", answers = { { text = "1990", answer_start = 0 } } },
    } } } } } }
end

T.test("v1.1 evaluation: hand-computed, missing prediction warns", function()
  local warned = {}
  local r = squad.evaluate(tiny_v1(), { q1 = "broncos", q2 = "big dog" },
    { warn = function(m) warned[#warned + 1] = m end })
  -- q1 exact (gold 2), q2 f1 = 0.5, q3 missing
  T.near(r.exact_match, 100 / 3, 1e-14)
  T.near(r.f1, 100 * 1.5 / 3, 1e-14)
  T.eq(#warned, 1)
  T.eq(warned[1], "Unanswered question q3 will receive score 0.")
  T.eq(squad.format_eval(r, "1.1"), '{"exact_match": 33.333333333333336, "f1": 50.0}')
  T.raises(function() squad.evaluate(tiny_v1(), { q1 = 5 }) end, "prediction for q1 is a number")
end)

local function tiny_v2()
  return { version = "v2.0", data = { { title = "t", paragraphs = {
    { context = "x", qas = {
      { id = "a", question = "?", is_impossible = false, answers = { { text = "red car", answer_start = 0 } } },
      { id = "b", question = "?", is_impossible = true, answers = {} },
      { id = "c", question = "?", is_impossible = true, answers = {} },
      { id = "d", question = "?", is_impossible = false, answers = { { text = "blue", answer_start = 0 } } },
    } } } } } }
end

T.test("v2.0 evaluation: hand-computed with na-probs and best threshold", function()
  local preds = { a = "red", b = "", c = "something", d = "blue" }
  local r = squad.evaluate(tiny_v2(), preds)
  -- a: em 0 f1 2/3; b: 1/1; c: 0/0; d: 1/1
  T.near(r.exact, 50, 1e-14); T.near(r.f1, 100 * (2 / 3 + 2) / 4, 1e-14)
  T.eq(r.total, 4); T.eq(r.HasAns_total, 2); T.eq(r.NoAns_total, 2)
  T.near(r.HasAns_exact, 50, 1e-14); T.near(r.NoAns_f1, 50, 1e-14)
  T.eq(r.best_exact, nil)
  -- with na probs: c (0.9) above thresh 0.5 -> predicted no-answer, correct
  local na = { a = 0.1, b = 0.2, c = 0.9, d = 0.3 }
  r = squad.evaluate(tiny_v2(), preds, { na_probs = na, na_prob_thresh = 0.5, na_prob_keys = { "a", "b", "c", "d" } })
  T.near(r.exact, 75, 1e-14)
  -- best threshold: start 2 (no-ans count); a +0 (exact) -> 2, b +0, d +1 -> 3 at 0.3, c -1 -> 2
  T.near(r.best_exact, 75, 1e-14); T.eq(r.best_exact_thresh, 0.3)
  -- f1: a +2/3 at 0.1 (2.667), b 0, d +1 at 0.3 (3.667), c -1
  T.near(r.best_f1, 100 * (2 + 2 / 3 + 1) / 4, 1e-14); T.eq(r.best_f1_thresh, 0.3)
  local s = squad.format_eval(r, "2.0")
  T.truthy(s:find('^{\n  "exact": 75.0,\n  "f1": '), s)
  T.truthy(s:find('"total": 4,\n'), s)
  T.truthy(s:find('"best_f1_thresh": 0.3\n}$'), s)
  T.raises(function() squad.evaluate(tiny_v2(), { a = "x" }, { warn = function() end }) end,
    "3 question(s) have no prediction")
  T.raises(function() squad.evaluate(tiny_v2(), preds, { na_probs = { a = 0.1 } }) end, "no number for question")
end)

T.test("float repr and JSON like Python", function()
  T.eq(json.float_repr(100.0), "100.0")
  T.eq(json.float_repr(0.1), "0.1")
  T.eq(json.float_repr(1 / 3), "0.3333333333333333")
  T.eq(json.float_repr(1e-5), "1e-05")
  T.eq(json.float_repr(0.0001), "0.0001")
  T.eq(json.float_repr(1e16), "1e+16")
  T.eq(json.float_repr(123456789012345.6), "123456789012345.6")
  T.eq(json.float_repr(-2.5e-7), "-2.5e-07")
  T.eq(json.string("a\"b\\c\n\1é€😀\127"), '"a\\"b\\\\c\\n\\u0001\\u00e9\\u20ac\\ud83d\\ude00\\u007f"')
  T.eq(json.dumps(json.object({ x = 1, y = { 1.5, "s" } }, { "y", "x" }, { x = true })), '{"y": [1.5, "s"], "x": 1}')
  T.eq(json.dumps(json.object({ x = {} , y = json.array({}) }, { "x", "y" }), { indent = 4 }),
    '{\n    "x": [],\n    "y": []\n}')
  local keys = json.object_keys('{"b": [1, {"z": "}"}], "a\\u00e9": "x,y", "c": -1.5e3}')
  T.eq(table.concat(keys, "|"), "b|aé|c")
  T.raises(function() json.object_keys("[1]", "f.json") end, "f.json: not a JSON object")
end)

local function data_file(name)
  local base = T.shared_data("squad")
  if not base then T.skip("shared data not found (set BL_SHARED_DATA)") end
  local p = base .. "/" .. name
  if not io.open(p) then T.skip(p .. " not found") end
  return p
end

T.test("normalize_answer equals Python on every string of both dev files and on random Unicode", function()
  need_python()
  local strings = {}
  for _, name in ipairs { "dev-v1.1.json", "dev-v2.0.cs224n-half.json" } do
    local d = squad.load_json(data_file(name))
    for _, a in ipairs(d.data) do
      for _, p in ipairs(a.paragraphs) do
        strings[#strings + 1] = p.context
        for _, qa in ipairs(p.qas) do
          strings[#strings + 1] = qa.question
          for _, an in ipairs(qa.answers) do strings[#strings + 1] = an.text end
          for _, an in ipairs(qa.plausible_answers or {}) do strings[#strings + 1] = an.text end
        end
      end
    end
  end
  local pool = { "a", "an", "the", "The", "THE", " ", "  ", "\t", "\n", ",", ".", "_", "-", "'", "\"",
    "Σ", "ΣΑΣ", "σ", "İ", "ı", "ß", "ẞ", "\204\129", "\194\160", "\226\128\128", "\226\128\139", "\227\128\128",
    "日本", "²", "Ⅻ", "K", "Å", "ﬁ", "ǅ", "ᾈ", "Ⴀ", "\225\178\144", "😀", "Ａ", "Ω", "café", "naïve", "—",
    "x", "Dog", "1990", "\205\133", "·", "’", "Ὀδυσσεύς", "ΌΣ.", "ΑΣ'Β", "Ꭰ", "ꭰ", "\28", "\194\133", "\30" }
  local r = rng(7)
  for _ = 1, 3000 do
    local parts = {}
    for k = 1, r(8) do parts[k] = pool[r(#pool)] end
    strings[#strings + 1] = table.concat(parts, r(2) == 1 and "" or " ")
  end
  write(tmp .. "/strings.json", cjson.encode(strings))
  local out, rc = sh(PY .. " " .. REF .. " normalize " .. tmp .. "/strings.json " .. tmp .. "/norm.json 2>&1")
  T.eq(rc, 0, out)
  local expected = cjson.decode(read(tmp .. "/norm.json"))
  T.eq(#expected, #strings)
  local bad = 0
  for i, s in ipairs(strings) do
    if N(s) ~= expected[i] then
      bad = bad + 1
      if bad <= 5 then io.write(("mismatch: %q -> %q, python %q\n"):format(s, N(s), expected[i])) end
    end
  end
  T.eq(bad, 0, "strings normalized differently from Python")
end)

-- predictions derived from the gold answers by deterministic edits
local function make_predictions(dataset, seed, mode)
  local r = rng(seed)
  local preds, na = {}, {}
  local na_keys = {}
  for _, a in ipairs(dataset.data) do
    for _, p in ipairs(a.paragraphs) do
      local words = {}
      for w in p.context:gmatch("%S+") do words[#words + 1] = w end
      for _, qa in ipairs(p.qas) do
        local golds = qa.answers
        local x = r()
        local text
        if mode == "first" then text = golds[1].text
        elseif #golds > 0 and x < 0.45 then
          text = golds[r(#golds)].text
          local y = r()
          if y < 0.2 then text = text:gsub("%s*%S+$", "")             -- drop the last word
          elseif y < 0.35 then text = "The " .. text                  -- article + case
          elseif y < 0.5 then text = text:upper() .. "."               -- case + punctuation
          elseif y < 0.6 then text = words[r(#words)] .. " " .. text   -- extra word
          end
        elseif x < 0.65 then text = ""
        else
          local i = r(#words)
          text = table.concat(words, " ", i, math.min(#words, i + r(6) - 1))
        end
        if mode ~= "v1-missing" or r() > 0.05 then preds[qa.id] = text end
        local v = r()
        if r() < 0.5 then v = math.floor(v * 10 + 0.5) / 10 end      -- ties
        na[qa.id] = v
        na_keys[#na_keys + 1] = qa.id
      end
    end
  end
  -- shuffle the na-prob file order (ties follow file order in the official script)
  for i = #na_keys, 2, -1 do local j = r(i); na_keys[i], na_keys[j] = na_keys[j], na_keys[i] end
  local parts = {}
  for _, k in ipairs(na_keys) do parts[#parts + 1] = cjson.encode(k) .. ": " .. ("%.17g"):format(na[k]) end
  return preds, "{" .. table.concat(parts, ", ") .. "}"
end

local function compare_json_numbers(got, want, what)
  local g, w = cjson.decode(got), cjson.decode(want)
  for k, v in pairs(w) do
    T.truthy(g[k] ~= nil, what .. ": missing key " .. k)
    T.near(g[k], v, 0, 1e-9)
  end
  for k in pairs(g) do T.truthy(w[k] ~= nil, what .. ": extra key " .. k) end
end

T.test("v1.1 on dev-v1.1.json: first gold answer scores 100/100", function()
  local d = squad.load_json(data_file("dev-v1.1.json"))
  local preds = make_predictions(d, 1, "first")
  local r = squad.evaluate(d, preds)
  T.eq(r.exact_match, 100.0); T.eq(r.f1, 100.0)
end)

T.test("v1.1 on dev-v1.1.json equals the official script (3 prediction sets, via the recipe)", function()
  need_python()
  local D = data_file("dev-v1.1.json")
  local d = squad.load_json(D)
  for seed = 1, 3 do
    local preds = make_predictions(d, seed * 11, seed == 3 and "v1-missing" or nil)
    local pf = tmp .. "/v1_" .. seed .. ".json"
    write(pf, cjson.encode(preds))
    local want, rc = sh(PY .. " " .. REF .. " v1 " .. D .. " " .. pf .. " 2>" .. tmp .. "/py_err")
    T.eq(rc, 0, want)
    local got, rc2 = sh(EXE .. " recipes/squad_eval.lua " .. D .. " " .. pf .. " 2>" .. tmp .. "/lua_err")
    T.eq(rc2, 0, got)
    compare_json_numbers(got, want, "v1 seed " .. seed)
    T.eq(got, want)                                    -- byte-identical output
    local r = cjson.decode(got)
    T.truthy(r.exact_match > 20 and r.exact_match < 80, "predictions should be partly right: " .. got)
    if seed == 3 then
      local perr, lerr = read(tmp .. "/py_err"), read(tmp .. "/lua_err")
      local n = select(2, perr:gsub("Unanswered question", ""))
      T.truthy(n > 100, "expected missing predictions")
      T.eq(select(2, lerr:gsub("Unanswered question [%w]+ will receive score 0%.", "")), n)
    end
  end
end)

T.test("v2.0 on the CS224N half of dev-v2.0 equals the official script (na-probs, thresholds)", function()
  need_python()
  local D = data_file("dev-v2.0.cs224n-half.json")
  local d = squad.load_json(D)
  for seed = 1, 3 do
    local preds, na_text = make_predictions(d, seed * 7 + 1)
    local pf, nf = tmp .. "/v2_" .. seed .. ".json", tmp .. "/na_" .. seed .. ".json"
    write(pf, cjson.encode(preds)); write(nf, na_text)
    local thresh = ({ 1.0, 0.5, 0.3 })[seed]
    local args = D .. " " .. pf .. " --na-prob-thresh=" .. thresh .. (seed < 3 and (" --na-prob-file=" .. nf) or "")
    local want, rc = sh(PY .. " " .. REF .. " v2 " .. args .. " 2>&1")
    T.eq(rc, 0, want)
    local got, rc2 = sh(EXE .. " recipes/squad_eval.lua " .. args:gsub("%-%-na%-prob%-file",
      "--na-prob") .. " 2>/dev/null")
    T.eq(rc2, 0, got)
    compare_json_numbers(got, want, "v2 seed " .. seed)
    T.eq(got, want)
    local r = cjson.decode(got)
    T.eq(r.total, 6078); T.eq(r.NoAns_total, 3168)
    if seed < 3 then T.truthy(r.best_f1 ~= nil, "best thresholds expected") end
  end
  -- --out-file: json.dump without indent
  local pf = tmp .. "/v2_1.json"
  local _, rc = sh(PY .. " " .. REF .. " v2 " .. D .. " " .. pf .. " -o " .. tmp .. "/py_out.json")
  T.eq(rc, 0)
  local _, rc2 = sh(EXE .. " recipes/squad_eval.lua " .. D .. " " .. pf .. " --out-file=" .. tmp
    .. "/lua_out.json 2>/dev/null")
  T.eq(rc2, 0)
  T.eq(read(tmp .. "/lua_out.json"), read(tmp .. "/py_out.json"))
end)

T.test("recipe: bad inputs give clear errors", function()
  write(tmp .. "/notjson.json", "{ this is not json")
  local out, rc = sh(EXE .. " recipes/squad_eval.lua " .. tmp .. "/notjson.json " .. tmp .. "/notjson.json 2>&1")
  T.eq(rc, 1)
  T.truthy(out:find(tmp .. "/notjson.json is not valid JSON", 1, true), out)
  out, rc = sh(EXE .. " recipes/squad_eval.lua " .. tmp .. "/missing.json x.json 2>&1")
  T.eq(rc, 1); T.truthy(out:find("cannot open", 1, true), out)
  out, rc = sh(EXE .. " recipes/squad_eval.lua onlyone.json 2>&1")
  T.eq(rc, 2); T.truthy(out:find("usage", 1, true), out)
  write(tmp .. "/d.json", cjson.encode({ version = "1.1", data = { { paragraphs = { { context = "c",
    qas = { { question = "q" } } } } } } }))
  write(tmp .. "/p.json", "{}")
  out, rc = sh(EXE .. " recipes/squad_eval.lua " .. tmp .. "/d.json " .. tmp .. "/p.json 2>&1")
  T.eq(rc, 1); T.truthy(out:find("article 1 paragraph 1 question 1: 'id' is missing", 1, true), out)
end)

T.run()
