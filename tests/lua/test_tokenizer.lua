-- Tokenizer tests: the Lua API, error messages, and exact equality with the
-- references (tools/peers/tokenizer_reference.py, run with $BL_PYTHON) on real
-- text from shared/data (Wikipedia, books, SQuAD, GLUE, BERT's sample text),
-- cased and uncased, on adversarial random strings, and code point by code
-- point: Google's tokenization.py for both cases, Hugging Face's slow
-- BertTokenizer uncased, Hugging Face tokenizers (Rust) cased. The slow one
-- NFC-normalizes, so cased it differs on decomposed text (a test shows where).
-- Reference tests skip when their package is missing.
local T = require "testing"
local Tok = require "bertlua.data.tokenizer"

local data = T.shared_data()
if not data or not T.shared_data("vocab/bert-base-uncased-vocab.txt") then
  T.skip_all("shared data with vocab/ not found (set BL_SHARED_DATA)")
end
local UNCASED = data .. "/vocab/bert-base-uncased-vocab.txt"
local CASED = data .. "/vocab/bert-base-cased-vocab.txt"
local PY = os.getenv("BL_PYTHON") or "/usr/bin/python3"
local REF = "tools/peers/tokenizer_reference.py"

local tmpfiles = {}
local function tmp(content)
  local p = os.tmpname()
  tmpfiles[#tmpfiles + 1] = p
  if content then
    local f = assert(io.open(p, "wb")); f:write(content); f:close()
  end
  return p
end
T.at_exit(function() for _, p in ipairs(tmpfiles) do os.remove(p) end end)

local function read(p)
  local f = assert(io.open(p, "rb")); local s = f:read("*a"); f:close(); return s
end

local uncased = Tok.load(UNCASED, { lower = true })
local cased = Tok.load(CASED, { lower = false })

T.test("api: sizes and special ids", function()
  T.eq(uncased.size, 30522); T.eq(cased.size, 28996)
  for _, tk in ipairs { uncased, cased } do
    T.eq(tk.pad_id, 0); T.eq(tk.unk_id, 100); T.eq(tk.cls_id, 101); T.eq(tk.sep_id, 102); T.eq(tk.mask_id, 103)
  end
  T.eq(uncased:id("[CLS]"), 101); T.eq(uncased:token(103), "[MASK]")
  T.eq(uncased:id("no-such-token"), nil); T.eq(uncased:token(30522), nil); T.eq(uncased:token(-1), nil)
  T.eq(uncased.lower, true); T.eq(cased.lower, false)
end)

T.test("api: tokenize, encode, basic_tokenize, wordpiece, conversions", function()
  local toks = uncased:tokenize("UNaff\195\161ble,running [SEP] Hello")
  T.eq(table.concat(toks, " "), "una ##ffa ##ble , running [SEP] hello")
  local ids = uncased:encode("UNaff\195\161ble,running [SEP] Hello")
  T.eq(table.concat(ids, " "), table.concat(uncased:convert_tokens_to_ids(toks), " "))
  T.eq(table.concat(uncased:convert_ids_to_tokens(ids), " "), table.concat(toks, " "))
  T.eq(ids[1], uncased:id("una"))
  T.eq(table.concat(uncased:basic_tokenize("Héllo, wörld!\nNew line"), "|"), "hello|,|world|!|new|line")
  T.eq(table.concat(cased:basic_tokenize("Héllo, wörld!"), "|"), "Héllo|,|wörld|!")
  T.eq(table.concat(uncased:wordpiece("unaffable"), " "), "una ##ffa ##ble")
  T.eq(table.concat(uncased:wordpiece("xqzxqzxqzw"), " "), "x ##q ##z ##x ##q ##z ##x ##q ##z ##w")
  T.eq(table.concat(uncased:wordpiece(("a"):rep(101)), " "), "[UNK]")
  T.eq(table.concat(uncased:convert_tokens_to_ids { "hello", "not-a-token" }, " "), "7592 100")
  T.raises(function() uncased:convert_ids_to_tokens { 5, 99999 } end, "out of range")
  T.eq(#uncased:tokenize(""), 0); T.eq(#uncased:tokenize(" \t\r\n "), 0)
  T.eq(table.concat(cased:tokenize("Hello World"), " "), "Hello World")
end)

T.test("api: count gives encode's length for a text and for byte ranges of it", function()
  local text = "UNaff\195\161ble,running [SEP] Hello\nsecond line, with more words"
  T.eq(uncased:count(text), #uncased:encode(text), "whole text")
  local nl = text:find("\n", 1, true)
  T.eq(uncased:count(text, 0, nl - 1), #uncased:encode(text:sub(1, nl - 1)), "first line")
  T.eq(uncased:count(text, nl, #text - nl), #uncased:encode(text:sub(nl + 1)), "second line")
  T.eq(uncased:count("other text here"), #uncased:encode("other text here"), "a new text after the cached one")
  T.raises(function() uncased:count(text, 5, #text) end, "byte range")
end)

T.test("api: offsets map pieces back to the original bytes", function()
  local text = "  Jim Henson's  caf\195\169\tUNAFFABLE!"
  local ids, words, starts, stops = uncased:encode_offsets(text)
  local toks = uncased:convert_ids_to_tokens(ids)
  T.eq(table.concat(toks, " "), "jim henson ' s cafe una ##ffa ##ble !")
  local spans = {}
  for i = 1, #ids do spans[i] = words[i] .. "=" .. text:sub(starts[i], stops[i]) end
  T.eq(table.concat(spans, "|"), "1=Jim|2=Henson|3='|4=s|5=caf\195\169|6=UNAFFABLE|6=UNAFFABLE|6=UNAFFABLE|7=!")
end)

T.test("api: format modes and line structure", function()
  T.eq(uncased:format("Hello, world\n\n \nBye", "tokens"), "hello , world\n\n\nbye\n")
  T.eq(uncased:format("Hello, world\n", "ids"), "7592 1010 2088\n")
  T.eq(uncased:format("a\0b\r\n", "tokens"), "ab\n")
  local s, inv = uncased:format("he\255llo \237\160\128x", "tokens")
  T.eq(s, "hello x\n"); T.eq(inv, 4)
  T.raises(function() uncased:format("x", "bogus") end, "mode must be")
end)

T.test("errors name the file", function()
  T.raises(function() Tok.load("/nonexistent/dir/vocab.txt") end, "/nonexistent/dir/vocab.txt")
  local p = tmp("[PAD]\n[CLS]\n[SEP]\n[MASK]\nhello\n")
  local err = T.raises(function() Tok.load(p) end, p)
  T.truthy(err:find("[UNK]", 1, true), err)
  local e = tmp("")
  T.raises(function() Tok.load(e) end, "empty")
  T.raises(function() Tok.load(tmp("\239\187\191")) end, "empty")
  -- a UTF-8 byte order mark (an editor's) before [PAD] is skipped, not taken for part of the token
  local bom = Tok.load(tmp("\239\187\191[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n"))
  T.eq(bom.pad_id, 0); T.eq(bom.size, 6); T.eq(bom:token(0), "[PAD]"); T.eq(bom:id("hello"), 5)
  -- more tokens than the model's embedding rows: named with both sizes before any id goes out of range
  T.eq(bom:check_model(6, "r"), bom)
  T.raises(function() bom:check_model(5, "r", "m/config.json") end, "r: the vocabulary " .. bom.path
    .. " has 6 tokens, more than the model's vocab_size 5 (m/config.json): ids from 5 on have no embedding")
  T.raises(function() uncased:tokenize(42) end, "must be a string")
end)

-- ---------------------------------------------------------------- reference comparisons
local have_ref = os.execute(PY .. " -c 'import transformers' >/dev/null 2>&1")
have_ref = have_ref == 0 or have_ref == true

local have_google = os.execute(PY .. " -c 'import bert.tokenization, absl' >/dev/null 2>&1")
have_google = have_google == 0 or have_google == true
local have_rust = os.execute(PY .. " -c 'import tokenizers' >/dev/null 2>&1")
have_rust = have_rust == 0 or have_rust == true

-- impl: "slow" (transformers), "google" (tokenization.py), "rust" (tokenizers)
local function reference(input_path, vocab, is_cased, mode, impl)
  local out = tmp()
  local cmd = ("%s %s --vocab=%s %s --mode=%s --impl=%s < %s > %s 2>/dev/null"):format(PY, REF, vocab,
    is_cased and "--cased" or "", mode, impl or "slow", input_path, out)
  local rc = os.execute(cmd)
  if not (rc == 0 or rc == true) then error("reference failed: " .. cmd) end
  return read(out)
end

-- first differing line, shown with its input, for a readable failure
local function compare(name, input, got, want)
  if got == want then return end
  local gl, wl, il = {}, {}, {}
  for l in (got):gmatch("([^\n]*)\n") do gl[#gl + 1] = l end
  for l in (want):gmatch("([^\n]*)\n") do wl[#wl + 1] = l end
  for l in (input .. "\n"):gmatch("([^\n]*)\n") do il[#il + 1] = l end
  local ndiff, first = 0, nil
  for i = 1, math.max(#gl, #wl) do
    if gl[i] ~= wl[i] then ndiff = ndiff + 1; first = first or i end
  end
  error(("%s: %d of %d lines differ; first at line %d\n input: %q\n ours:  %q\n ref:   %q"):format(name, ndiff,
    #wl, first or 0, tostring(il[first or 1]), tostring(gl[first or 1]), tostring(wl[first or 1])), 2)
end

local function real_text()
  local parts = {}
  local function add(path, limit)
    local f = io.open(path, "rb")
    if not f then return end
    local s = f:read(limit or "*a"); f:close()
    parts[#parts + 1] = s:gsub("[^\n]*$", "")  -- whole lines only
  end
  for _, b in ipairs { "books/pg1342-0.txt", "books/pg11-0.txt", "books/pg84-0.txt" } do add(data .. "/" .. b,
    80000) end
  add(data .. "/pretraining_text/bert_sample_text.txt")
  for _, g in ipairs { "MRPC", "CoLA", "SST-2" } do add(data .. "/glue/" .. g .. "/dev.tsv", 60000) end
  local wiki = data .. "/wikipedia/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
  local p = io.open(wiki, "rb")
  if p then
    p:close()
    local h = io.popen("bzcat '" .. wiki .. "' 2>/dev/null | head -c 300000")
    local s = h:read("*a"); h:close()
    parts[#parts + 1] = s:gsub("[^\n]*$", "")
  end
  local sq = io.open(data .. "/squad/dev-v1.1.json", "rb")
  if sq then
    local j = require("cjson").decode(sq:read("*a")); sq:close()
    local lines, bytes = {}, 0
    for _, art in ipairs(j.data) do
      for _, para in ipairs(art.paragraphs) do
        lines[#lines + 1] = para.context:gsub("\n", " ")
        for _, qa in ipairs(para.qas) do lines[#lines + 1] = qa.question end
        bytes = bytes + #para.context
      end
      if bytes > 200000 then break end
    end
    parts[#parts + 1] = table.concat(lines, "\n") .. "\n"
  end
  return table.concat(parts)
end

local REAL
for _, case in ipairs { { "uncased", UNCASED, false }, { "cased", CASED, true } } do
  T.test("reference: real text, " .. case[1], function()
    local impl = case[3] and "google" or "slow"
    if not (case[3] and have_google or not case[3] and have_ref) then
      T.skip("the " .. impl .. " reference is not importable by " .. PY .. " (scripts/requirements-test.txt)")
    end
    REAL = REAL or real_text()
    T.truthy(#REAL > 700000, "real text assembled: " .. #REAL .. " bytes")
    local p = tmp(REAL)
    local want = reference(p, case[2], case[3], "tokens", impl)
    local tk = case[3] and cased or uncased
    compare("real text " .. case[1], REAL, tk:format(REAL, "tokens"), want)
    -- ids are the vocab lines of those tokens
    local got_ids = tk:format(REAL, "ids")
    local expect_ids = want:gsub("[^ \n]+", function(t) return tostring(tk:id(t)) end)
    compare("real text ids " .. case[1], REAL, got_ids, expect_ids)
  end)
end

-- deterministic adversarial lines: combining marks of several classes, Hangul
-- jamo, CJK, specials and their fragments, controls, invalid UTF-8, NFC
-- singletons and exclusions, zero-width and separator characters
local POOL = { "a", "B", "z", "Q", "e", "1", ".", ",", "'", "[", "]", " ", "  ", "\t", "\r", "\0", "\1", "\127",
  "\194\133", "\204\129", "\204\150", "\204\167", "\205\133", "\214\176", "\224\189\177", "\224\189\178",
  "\224\189\179", "\224\189\181", "\224\190\129", "\225\132\128", "\225\133\161", "\225\134\168", "\234\176\128",
  "\234\176\129", "[CLS]", "[MASK]", "[SEP]", "[UNK]", "[PAD]", "[CL", "S]", "[cls]", "\206\163", "\196\176",
  "\228\184\173", "\239\164\128", "\226\128\139", "\226\128\141", "\239\187\191", "\226\128\168", "\194\160",
  "\227\128\128", "\255", "\195", "\228\184", "\237\160\128", "\244\144\128\128", "\240\159", "\192\175",
  "\224\173\135", "\224\172\190", "\226\171\156", "\226\171\157", "\204\184", "\240\157\133\159", "\240\157\133\174",
  "\205\132", "\225\191\175", "\205\190", "\226\132\171", "\195\169", "\195\137", "\195\159", "\239\172\129",
  "\224\165\152", "\224\164\188", "\224\164\149", "\226\128\153", "\226\128\156", "\194\191", "\239\188\129",
  "\240\159\152\128", "\239\191\189", "\238\128\128", "\205\184", "\225\186\158", "\226\132\166", "\199\133",
  "\225\190\136", "\206\144", "\225\184\138", "\204\163", "\204\135", "hello", "world", "unaffable", "##", "#" }

local function random_lines(seed, n)
  local state = seed
  local function rnd(k)  -- LCG, same on every platform
    state = (state * 1103515245 + 12345) % 2147483648
    return math.floor(state / 65536) % k
  end
  local lines = {}
  for i = 1, n do
    local parts = {}
    for j = 1, rnd(31) do parts[j] = POOL[rnd(#POOL) + 1] end
    lines[i] = table.concat(parts)
  end
  return table.concat(lines, "\n") .. "\n"
end

for _, case in ipairs { { "uncased", UNCASED, false }, { "cased", CASED, true } } do
  T.test("reference: adversarial random lines, " .. case[1], function()
    if not (have_ref and have_google and have_rust) then T.skip("references not importable by " .. PY) end
    local text = random_lines(case[3] and 7 or 1, 6000)
    local p = tmp(text)
    local tk = case[3] and cased or uncased
    local toks = tk:format(text, "tokens")
    -- uncased stays with the slow tokenizer: Google and Rust apply Python's/Rust's final-sigma rule
    -- when lowercasing a whole word ("ΑΣ" -> "ας"), the slow one and bertlua lowercase per code point
    local impl = case[3] and "google" or "slow"
    compare("random tokens (" .. impl .. ") " .. case[1], text, toks, reference(p, case[2], case[3], "tokens", impl))
    compare("random basic (" .. impl .. ") " .. case[1], text, tk:format(text, "basic"),
      reference(p, case[2], case[3], "basic", impl))
    if case[3] then
      compare("random tokens (rust) " .. case[1], text, toks, reference(p, case[2], case[3], "tokens", "rust"))
    end
  end)
end

T.test("reference: cased decomposed text follows Google and tokenizers, not the slow tokenizer's NFC", function()
  if not (have_ref and have_google and have_rust) then T.skip("references not importable by " .. PY) end
  local text = "a\204\129 cafe\204\129 A\204\138ngstro\204\136m\n"
  local p = tmp(text)
  local got = cased:format(text, "tokens")
  T.eq(got, reference(p, CASED, true, "tokens", "google"))
  T.eq(got, reference(p, CASED, true, "tokens", "rust"))
  T.truthy(got:find("a ##\204\129", 1, true), got)
  local slow = reference(p, CASED, true, "tokens", "slow")
  T.truthy(slow:find("\195\161", 1, true), "the slow tokenizer composes a + U+0301: " .. slow)
  T.truthy(got ~= slow, "documented difference")
end)

T.test("reference: every assigned code point (sampled above U+3000), both cases", function()
  if not have_ref then T.skip("transformers not importable by " .. PY) end
  local p = tmp()
  local gen = [[
import sys, unicodedata
out = []
for cp in list(range(0, 0x3000)) + list(range(0x3000, 0x110000, 7)):
    if 0xD800 <= cp <= 0xDFFF or cp == 10: continue
    c = chr(cp)
    if unicodedata.category(c) == "Cn": continue
    out.append("Ab" + c + "x " + c + "\u0301y " + c.upper() + c)
open(sys.argv[1], "wb").write(("\n".join(out) + "\n").encode("utf-8"))
]]
  local gp = tmp(gen)
  local rc = os.execute(PY .. " " .. gp .. " " .. p)
  T.truthy(rc == 0 or rc == true, "generator ran")
  local text = read(p)
  compare("code points uncased", text, uncased:format(text, "basic"), reference(p, UNCASED, false, "basic"))
  if have_google then
    compare("code points cased", text, cased:format(text, "basic"), reference(p, CASED, true, "basic", "google"))
  end
end)

T.test("recipe: tokenize.lua end to end", function()
  local exe = (os.getenv("BL_BUILD_DIR") or "build") .. "/bertlua"
  local input = "Hello, World!\n\n  \nna\195\175ve [CLS] x\0y\n"
  local ip, op = tmp(input), tmp()
  local rc = os.execute(("%s recipes/tokenize.lua --vocab=%s --quiet < %s > %s"):format(exe, UNCASED, ip, op))
  T.truthy(rc == 0 or rc == true, "recipe exit status")
  T.eq(read(op), "hello , world !\n\n\nnaive [CLS] x ##y\n")
  rc = os.execute(("%s recipes/tokenize.lua --vocab=%s --ids --quiet < %s > %s"):format(exe, UNCASED, ip, op))
  T.truthy(rc == 0 or rc == true, "recipe exit status (--ids)")
  T.eq(read(op):match("^[^\n]*"), "7592 1010 2088 999")
  rc = os.execute(("%s recipes/tokenize.lua --vocab=/nonexistent/v.txt --quiet < %s > %s 2>%s"):format(exe, ip, op,
    op .. ".err"))
  tmpfiles[#tmpfiles + 1] = op .. ".err"
  T.truthy(not (rc == 0 or rc == true), "missing vocab fails")
  T.truthy(read(op .. ".err"):find("/nonexistent/v.txt", 1, true), "error names the file")
end)

T.test("recipe: build_vocab.lua learns a usable, deterministic vocab", function()
  local exe = (os.getenv("BL_BUILD_DIR") or "build") .. "/bertlua"
  local book = data .. "/books/pg11-0.txt"
  local v1, v2, log = tmp(), tmp(), tmp()
  for _, v in ipairs { v1, v2 } do
    local rc = os.execute(("%s recipes/build_vocab.lua --input=%s --output=%s --size=1500 > %s 2>&1"):format(exe, book,
      v, log))
    T.truthy(rc == 0 or rc == true, "build_vocab ran: " .. read(log))
  end
  T.eq(read(v1), read(v2), "deterministic")
  local tk = Tok.load(v1)
  T.eq(tk.size, 1500)
  T.eq(tk.pad_id, 0); T.eq(tk.unk_id, 1); T.eq(tk.mask_id, 4)
  -- every word of the corpus is covered (its characters are all in the alphabet)
  local toks = tk:tokenize(read(book):sub(1, 20000))
  local unk = 0
  for _, t in ipairs(toks) do if t == "[UNK]" then unk = unk + 1 end end
  T.eq(unk, 0, "no [UNK] on the training text")
  T.truthy(#toks < 20000 / 3, "merges shorten the encoding: " .. #toks .. " tokens")
end)

T.run()
