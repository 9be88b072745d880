-- bertlua.util.json: JSON output that reads like Python's json.dumps (the format
-- the official evaluation scripts print, so users can diff our numbers against
-- theirs), and what cjson's decoding loses (key order, array vs object).
--
--   json.dumps(value[, {indent=n}])  -- Python json.dumps output (repr floats,
--                                       ensure_ascii, ", "/": " or indented)
--   json.object(t, keys[, ints])     -- mark t as an ordered JSON object
local M = {}

-- a JSON array as cjson decodes it: a table with element 1, or empty ({} and
-- [] decode alike); a non-empty JSON object has string keys and no element 1
function M.is_array(t)
  return type(t) == "table" and (t[1] ~= nil or next(t) == nil)
end

-- Python repr() of a float: the shortest digits that round-trip, fixed notation
-- for 1e-4 <= |x| < 1e16, else d.ddde+XX; integral values get ".0".
function M.float_repr(x)
  if x ~= x then return "NaN" end
  if x == math.huge then return "Infinity" end
  if x == -math.huge then return "-Infinity" end
  if x == 0 then return (1 / x < 0) and "-0.0" or "0.0" end
  local s
  for p = 0, 16 do
    s = string.format("%." .. p .. "e", x)
    if tonumber(s) == x then break end
  end
  local sign, d1, rest, e = s:match("^(%-?)(%d)%.?(%d*)e([-+]%d+)$")
  local digits = (d1 .. rest):gsub("0+$", "")
  if digits == "" then digits = "0" end
  e = tonumber(e)
  if e < -4 or e >= 16 then
    local m = digits:sub(1, 1)
    if #digits > 1 then m = m .. "." .. digits:sub(2) end
    return ("%s%se%s%02d"):format(sign, m, e < 0 and "-" or "+", math.abs(e))
  end
  if e < 0 then return sign .. "0." .. string.rep("0", -e - 1) .. digits end
  if #digits <= e + 1 then return sign .. digits .. string.rep("0", e + 1 - #digits) .. ".0" end
  return sign .. digits:sub(1, e + 1) .. "." .. digits:sub(e + 2)
end

-- object(t, keys[, ints]): t prints with its fields in `keys` order; the keys
-- in the set `ints` print as integers (Python ints), the rest as floats.
function M.object(t, keys, ints)
  return setmetatable(t, { __json_keys = keys, __json_ints = ints or {} })
end

-- array(t): t prints as a JSON array even when empty.
function M.array(t) return setmetatable(t, { __json_array = true }) end

local escapes = { ['"'] = '\\"', ['\\'] = '\\\\', ['\n'] = '\\n', ['\r'] = '\\r',
                  ['\t'] = '\\t', ['\b'] = '\\b', ['\f'] = '\\f' }

-- Python's json string encoding with ensure_ascii=True (\uXXXX lowercase hex,
-- surrogate pairs above U+FFFF). Invalid UTF-8 bytes are written as U+FFFD.
function M.string(s)
  local out, n, i, len = { '"' }, 1, 1, #s
  local byte = string.byte
  while i <= len do
    local j = s:find('[%z\1-\31"\\\127-\255]', i)
    if not j then n = n + 1; out[n] = s:sub(i); break end
    if j > i then n = n + 1; out[n] = s:sub(i, j - 1) end
    local c = byte(s, j)
    local cp, nb = nil, 1
    if c < 128 then -- control characters, quote, backslash and DEL (Python escapes [^ -~])
      n = n + 1; out[n] = escapes[string.char(c)] or ("\\u%04x"):format(c)
    else
      if c >= 0xF0 and c < 0xF5 then cp, nb = c % 8, 4
      elseif c >= 0xE0 then cp, nb = c % 16, 3
      elseif c >= 0xC2 and c < 0xE0 then cp, nb = c % 32, 2 end
      if cp then
        for k = 1, nb - 1 do
          local cc = byte(s, j + k)
          if not cc or cc < 0x80 or cc > 0xBF then cp = nil; break end
          cp = cp * 64 + cc % 64
        end
      end
      if not cp then cp, nb = 0xFFFD, 1 end
      if cp >= 0x10000 then
        local v = cp - 0x10000
        n = n + 1; out[n] = ("\\u%04x\\u%04x"):format(0xD800 + math.floor(v / 1024), 0xDC00 + v % 1024)
      else
        n = n + 1; out[n] = ("\\u%04x"):format(cp)
      end
    end
    i = j + nb
  end
  n = n + 1; out[n] = '"'
  return table.concat(out)
end

local function dump(v, indent, level, out, is_int)
  local tv = type(v)
  if tv == "string" then out[#out + 1] = M.string(v)
  elseif tv == "number" then
    if is_int then
      if v ~= math.floor(v) or v ~= v then error("json_dumps: integer field holds " .. tostring(v), 0) end
      out[#out + 1] = ("%.0f"):format(v)
    else
      out[#out + 1] = M.float_repr(v)
    end
  elseif tv == "boolean" then out[#out + 1] = v and "true" or "false"
  elseif v == nil then out[#out + 1] = "null"
  elseif tv == "table" then
    local mt = getmetatable(v) or {}
    local nl, pad, pad_in, sep = "", "", "", ", "
    if indent then
      nl = "\n"; pad = string.rep(" ", indent * level); pad_in = string.rep(" ", indent * (level + 1)); sep = ","
    end
    local keys = mt.__json_keys
    if not keys and (mt.__json_array or #v > 0 or next(v) == nil and not mt.__json_object) then
      if #v == 0 then out[#out + 1] = "[]"; return end
      out[#out + 1] = "[" .. nl
      for i = 1, #v do
        out[#out + 1] = pad_in
        dump(v[i], indent, level + 1, out, false)
        if i < #v then out[#out + 1] = sep end
        out[#out + 1] = nl
      end
      out[#out + 1] = pad .. "]"
      return
    end
    if not keys then
      keys = {}
      for k in pairs(v) do keys[#keys + 1] = tostring(k) end
      table.sort(keys)
    end
    local ints = mt.__json_ints or {}
    local shown = {}
    for _, k in ipairs(keys) do if v[k] ~= nil then shown[#shown + 1] = k end end
    if #shown == 0 then out[#out + 1] = "{}"; return end
    out[#out + 1] = "{" .. nl
    for i, k in ipairs(shown) do
      out[#out + 1] = pad_in .. M.string(k) .. ": "
      dump(v[k], indent, level + 1, out, ints[k])
      if i < #shown then out[#out + 1] = sep end
      out[#out + 1] = nl
    end
    out[#out + 1] = pad .. "}"
  else
    error("json_dumps: cannot encode a " .. tv, 0)
  end
end

-- json_dumps(v[, {indent=n}]): Python json.dumps(v[, indent=n]) for v made of
-- strings, numbers (floats unless marked int via object()), booleans, arrays
-- and objects (ordered with object(), else sorted keys).
function M.dumps(v, opts)
  local out = {}
  dump(v, opts and opts.indent, 0, out, false)
  return table.concat(out)
end

-- json_object_keys(text) -> keys, int_keys: the keys of the top-level JSON
-- object in file order (cjson loses the order; the SQuAD v2 best-threshold
-- search depends on it) and the set of keys whose value is an integer literal
-- (Python keeps those as ints, which prints differently).
function M.object_keys(text, where)
  local cjson = require "cjson"
  where = where or "json"
  local pos = text:find("[^ \t\r\n]")
  if text:sub(1, 3) == "\239\187\191" then pos = text:find("[^ \t\r\n]", 4) end
  if not pos or text:sub(pos, pos) ~= "{" then error(where .. ": not a JSON object", 0) end
  pos = pos + 1
  local keys, ints = {}, {}
  local function skip_ws() pos = text:find("[^ \t\r\n]", pos) or #text + 1 end
  local function skip_string()
    local i = pos + 1
    while true do
      local j = text:find('["\\]', i)
      if not j then error(where .. ": unterminated string at byte " .. pos, 0) end
      if text:sub(j, j) == '\\' then i = j + 2 else local s = text:sub(pos, j); pos = j + 1; return s end
    end
  end
  local function skip_value()
    skip_ws()
    local c = text:sub(pos, pos)
    if c == '"' then skip_string(); return end
    if c == "{" or c == "[" then
      local depth = 0
      while pos <= #text do
        local j = text:find('[{}%[%]"]', pos)
        if not j then break end
        local d = text:sub(j, j)
        if d == '"' then pos = j; skip_string()
        else
          pos = j + 1
          if d == "{" or d == "[" then depth = depth + 1 else depth = depth - 1 end
          if depth == 0 then return end
        end
      end
      error(where .. ": unbalanced brackets", 0)
    end
    local j = text:find("[,}%] \t\r\n]", pos)
    if not j or j == pos then error(where .. ": bad value at byte " .. pos, 0) end
    local lit = text:sub(pos, j - 1)
    pos = j
    return lit:match("^%-?%d+$") ~= nil
  end
  skip_ws()
  if text:sub(pos, pos) == "}" then return keys, ints end
  while true do
    skip_ws()
    if text:sub(pos, pos) ~= '"' then error(where .. ": expected a key at byte " .. pos, 0) end
    keys[#keys + 1] = cjson.decode(skip_string())
    skip_ws()
    if text:sub(pos, pos) ~= ":" then error(where .. ": expected ':' at byte " .. pos, 0) end
    pos = pos + 1
    ints[keys[#keys]] = skip_value() or nil
    skip_ws()
    local c = text:sub(pos, pos)
    pos = pos + 1
    if c == "}" then return keys, ints end
    if c ~= "," then error(where .. ": expected ',' or '}' at byte " .. (pos - 1), 0) end
  end
end

return M
