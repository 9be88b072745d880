-- bertlua.data.tokenizer: BERT WordPiece tokenization, exact to Hugging Face's slow
-- BertTokenizer (see src/bl_tokenizer.h for the pipeline and its choices).
--
--   local Tok = require "bertlua.data.tokenizer"
--   local tok = Tok.load("vocab.txt", {lower = true})   -- {lower = false} for cased
--   tok:tokenize("Hello, world!")       --> {"hello", ",", "world", "!"}
--   tok:encode("Hello, world!")         --> {7592, 1010, 2088, 999}   (vocab ids, 0-based)
--   tok:basic_tokenize(text), tok:wordpiece(word)
--   tok:convert_tokens_to_ids(tokens), tok:convert_ids_to_tokens(ids)
--   tok:id("[CLS]") --> 101 (nil if absent), tok:token(101) --> "[CLS]" (nil if out of range)
--   tok.size, tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id, tok.lower, tok.path
--   tok:encode_offsets(text) --> ids, words, starts, stops: for each WordPiece,
--       the 1-based index of its basic token and that basic token's bytes in
--       text as text:sub(starts[i], stops[i]) (what SQuAD feature creation maps).
--   tok:format(text, "tokens"|"ids"|"basic") --> one output line per input line
-- Ids are the vocab's own (0-based line numbers), as every BERT tool uses them.
-- A loaded tokenizer is immutable; its C object is freed by the GC.
local core = require "bertlua.core"
local C, ffi = core.C, core.ffi

local M = {}
local Tok = {}
Tok.__index = Tok

local MODES = { tokens = 0, ids = 1, basic = 2 }

function M.load(path, opts)
  opts = opts or {}
  assert(type(path) == "string", "tokenizer.load: vocab path must be a string")
  local lower = opts.lower
  if lower == nil then lower = not opts.cased end
  local pp = ffi.new("bl_tokenizer*[1]")
  core.check(C.bl_tokenizer_load(path, lower and 1 or 0, pp))
  local ptr = ffi.gc(pp[0], C.bl_tokenizer_free)
  local size = C.bl_tokenizer_vocab_size(ptr)
  local tokens = {}
  for i = 0, size - 1 do tokens[i] = ffi.string(C.bl_tokenizer_token(ptr, i)) end
  local self = setmetatable({
    _ptr = ptr, _tokens = tokens, _cap = 0, _ids = nil, _ocap = 0, _obuf = nil,
    path = path, lower = lower, size = size,
    pad_id = C.bl_tokenizer_special_id(ptr, 0), unk_id = C.bl_tokenizer_special_id(ptr, 1),
    cls_id = C.bl_tokenizer_special_id(ptr, 2), sep_id = C.bl_tokenizer_special_id(ptr, 3),
    mask_id = C.bl_tokenizer_special_id(ptr, 4),
  }, Tok)
  return self
end

-- check_model(vocab_size, who[, config_name]): a vocabulary larger than the model's embedding table gives ids
-- without an embedding: refused naming the file and both sizes
function Tok:check_model(vocab_size, who, config_name)
  if type(vocab_size) == "number" and self.size > vocab_size then
    error(("%s: the vocabulary %s has %d tokens, more than the model's vocab_size %d%s: ids from %d on have no "
      .. "embedding; give the vocabulary the model was made with"):format(who, self.path, self.size, vocab_size,
      config_name and " (" .. config_name .. ")" or "", vocab_size), 0)
  end
  return self
end

-- ids buffer: a WordPiece token takes at least one input byte, so #text + 1 always fits
local function id_buffer(self, need)
  if need > self._cap then
    local cap = math.max(need, 2 * self._cap, 256)
    self._ids = ffi.new("int32_t[?]", cap)
    self._cap = cap
  end
  return self._ids, self._cap
end

local function check_text(text, what)
  if type(text) ~= "string" then error("tokenizer." .. what .. ": text must be a string, got " .. type(text), 3) end
end

-- ids of text by the C entry point fn (bl_tokenizer_encode or _wordpiece): the id buffer and the count
local function run_ids(self, fn, text)
  local ids, cap = id_buffer(self, #text + 1)
  local n = ffi.new("int[1]")
  core.check(fn(self._ptr, text, #text, ids, cap, n))
  return ids, n[0]
end

local function as_tokens(self, ids, n)
  local tokens, out = self._tokens, {}
  for i = 0, n - 1 do out[i + 1] = tokens[ids[i]] end
  return out
end

function Tok:encode(text)
  check_text(text, "encode")
  local ids, n = run_ids(self, C.bl_tokenizer_encode, text)
  local out = {}
  for i = 0, n - 1 do out[i + 1] = ids[i] end
  return out
end

-- count(text[, first, len]): the number of ids of text's bytes [first, first + len) (first 0-based; default:
-- the whole text), without building a table: for throughput measurements
function Tok:count(text, first, len)
  first, len = first or 0, len or #text
  if type(text) ~= "string" or first < 0 or len < 0 or first + len > #text then
    error("tokenizer.count: expected a string and a byte range inside it", 2)
  end
  local ids, cap = id_buffer(self, len + 1)
  local n = self._n or ffi.new("int[1]")
  self._n = n
  if self._count_text ~= text then  -- the pointer of the last text, so a loop over its lines casts once
    self._count_text, self._count_ptr = text, ffi.cast("const char *", text)
  end
  core.check(C.bl_tokenizer_encode(self._ptr, self._count_ptr + first, len, ids, cap, n))
  return n[0]
end

function Tok:tokenize(text)
  check_text(text, "tokenize")
  return as_tokens(self, run_ids(self, C.bl_tokenizer_encode, text))
end

function Tok:encode_offsets(text)
  check_text(text, "encode_offsets")
  local cap = #text + 1
  local r = ffi.new("bl_tok_result[1]")
  local ids, word = ffi.new("int32_t[?]", cap), ffi.new("int32_t[?]", cap)
  local st, en = ffi.new("int64_t[?]", cap), ffi.new("int64_t[?]", cap)
  r[0].ids, r[0].word, r[0].start, r[0]["end"], r[0].cap = ids, word, st, en, cap
  core.check(C.bl_tokenizer_encode_full(self._ptr, text, #text, r))
  local oi, ow, os_, oe = {}, {}, {}, {}
  for i = 0, r[0].n - 1 do
    oi[i + 1], ow[i + 1] = ids[i], word[i] + 1
    os_[i + 1], oe[i + 1] = tonumber(st[i]) + 1, tonumber(en[i])
  end
  return oi, ow, os_, oe, tonumber(r[0].invalid_utf8)
end

-- format(text, mode): the C text output (one line per input line, tokens
-- separated by spaces) as a Lua string; second value: invalid UTF-8 sequences
function Tok:format(text, mode)
  check_text(text, "format")
  local m = MODES[mode or "tokens"]
  if not m then error("tokenizer.format: mode must be tokens, ids or basic, got " .. tostring(mode), 2) end
  local need, inv = ffi.new("size_t[1]"), ffi.new("int64_t[1]")
  for _ = 1, 2 do
    if self._ocap == 0 then self._ocap = 4096; self._obuf = ffi.new("char[?]", self._ocap) end
    core.check(C.bl_tokenizer_format(self._ptr, text, #text, m, self._obuf, self._ocap, need, inv))
    local n = tonumber(need[0])
    if n <= self._ocap then return ffi.string(self._obuf, n), tonumber(inv[0]) end
    self._ocap = math.max(n, 2 * self._ocap)
    self._obuf = ffi.new("char[?]", self._ocap)
  end
  error("tokenizer.format: output size changed between passes", 2)
end

function Tok:basic_tokenize(text)
  local s = self:format(text, "basic")
  local out = {}
  for w in s:gmatch("[^ \n]+") do out[#out + 1] = w end
  return out
end

function Tok:wordpiece(word)
  check_text(word, "wordpiece")
  return as_tokens(self, run_ids(self, C.bl_tokenizer_wordpiece, word))
end

function Tok:id(token)
  if type(token) ~= "string" then return nil end
  local id = C.bl_tokenizer_id_n(self._ptr, token, #token)
  if id < 0 then return nil end
  return id
end

function Tok:token(id)
  if type(id) ~= "number" then return nil end
  return self._tokens[id]
end

-- unknown tokens map to [UNK], like BertTokenizer.convert_tokens_to_ids
function Tok:convert_tokens_to_ids(tokens)
  local out, unk = {}, self.unk_id
  for i, t in ipairs(tokens) do out[i] = self:id(t) or unk end
  return out
end

function Tok:convert_ids_to_tokens(ids)
  local out, tokens = {}, self._tokens
  for i, id in ipairs(ids) do
    local t = tokens[id]
    if not t then error(("tokenizer.convert_ids_to_tokens: id %s out of range 0..%d (%s)"):format(
      tostring(id), self.size - 1, self.path), 2) end
    out[i] = t
  end
  return out
end

return M
