-- bertlua.util.pystr: Python 3 string semantics the SQuAD scripts rely on, on UTF-8
-- Lua strings: characters are code points, str.lower() (full Unicode mapping),
-- str.isspace() / str.split() and re's Unicode \w.
local ffi = require "ffi"

local M = {}

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
  if not lib then error("pystr: libutf8proc is needed for non-ASCII text and could not be loaded", 0) end
  U = lib
  return U
end

-- Python 3 str.isspace(), which str.split() uses.
local PY_SPACE = { [9] = true, [10] = true, [11] = true, [12] = true, [13] = true, [28] = true,
  [29] = true, [30] = true, [31] = true, [32] = true, [0x85] = true, [0xA0] = true, [0x1680] = true,
  [0x2028] = true, [0x2029] = true, [0x202F] = true, [0x205F] = true, [0x3000] = true }
for c = 0x2000, 0x200A do PY_SPACE[c] = true end

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

-- Python str.split() (Unicode whitespace), which tokenization.whitespace_tokenize uses
function M.split(text)
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

M.decode, M.encode, M.lower, M.is_word = decode, encode, py_lower, is_word_cp
M.is_space = function(c) return PY_SPACE[c] == true end

return M
