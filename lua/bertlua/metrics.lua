-- bertlua.metrics: GLUE-style classification/regression metrics and JSON output
-- that reads like Python's json.dumps (the format the official evaluation
-- scripts print, so users can diff our numbers against theirs).
--
--   local metrics = require "bertlua.metrics"
--   metrics.accuracy(preds, labels)          -- fraction in [0,1]
--   metrics.f1(preds, labels[, positive])    -- binary F1 of the positive class (default 1)
--   metrics.matthews(preds, labels)          -- Matthews correlation (binary or multiclass)
--   metrics.pearson(x, y); metrics.spearman(x, y)   -- spearman uses tie-averaged ranks
--   metrics.glue(task, preds, labels)        -- the task's metric table, as in HF/run_glue
--   metrics.json_dumps(value[, {indent=n}])  -- Python json.dumps output (repr floats,
--                                               ensure_ascii, ", "/": " or indented)
--   metrics.object(t, keys[, ints])          -- mark t as an ordered JSON object
--
-- Inputs are Lua arrays (1-based); labels may be numbers or strings compared with ==.
local M = {}

local function check_pair(name, a, b)
  if type(a) ~= "table" or type(b) ~= "table" then
    error(("metrics.%s: expected two arrays, got %s and %s"):format(name, type(a), type(b)), 3)
  end
  if #a ~= #b then
    error(("metrics.%s: length mismatch (%d predictions, %d labels)"):format(name, #a, #b), 3)
  end
  if #a == 0 then error(("metrics.%s: empty input"):format(name), 3) end
end

function M.accuracy(preds, labels)
  check_pair("accuracy", preds, labels)
  local n = 0
  for i = 1, #labels do if preds[i] == labels[i] then n = n + 1 end end
  return n / #labels
end

-- Binary F1 of class `positive` (sklearn f1_score default pos_label=1).
-- 0 when there are no true positives (sklearn's zero_division result).
function M.f1(preds, labels, positive)
  check_pair("f1", preds, labels)
  if positive == nil then positive = 1 end
  local tp, fp, fn = 0, 0, 0
  for i = 1, #labels do
    local p, l = preds[i] == positive, labels[i] == positive
    if p and l then tp = tp + 1 elseif p then fp = fp + 1 elseif l then fn = fn + 1 end
  end
  if tp == 0 then return 0 end
  return 2 * tp / (2 * tp + fp + fn)
end

-- Matthews correlation coefficient, the multiclass form sklearn uses
-- (reduces to (tp*tn - fp*fn)/sqrt(...) for two classes); 0 when undefined.
function M.matthews(preds, labels)
  check_pair("matthews", preds, labels)
  local n = #labels
  local t, p, classes, c = {}, {}, {}, 0
  for i = 1, n do
    local yt, yp = labels[i], preds[i]
    t[yt] = (t[yt] or 0) + 1
    p[yp] = (p[yp] or 0) + 1
    classes[yt] = true; classes[yp] = true
    if yt == yp then c = c + 1 end
  end
  local sum_pt, sum_tt, sum_pp = 0, 0, 0
  for k in pairs(classes) do
    local tk, pk = t[k] or 0, p[k] or 0
    sum_pt = sum_pt + pk * tk
    sum_tt = sum_tt + tk * tk
    sum_pp = sum_pp + pk * pk
  end
  local cov_ytyp = c * n - sum_pt
  local cov_ypyp = n * n - sum_pp
  local cov_ytyt = n * n - sum_tt
  if cov_ypyp * cov_ytyt == 0 then return 0 end
  return cov_ytyp / math.sqrt(cov_ytyt * cov_ypyp)
end

local function numbers(name, x)
  for i = 1, #x do
    if type(x[i]) ~= "number" then
      error(("metrics.%s: element %d is a %s, expected a number"):format(name, i, type(x[i])), 3)
    end
  end
end

function M.pearson(x, y)
  check_pair("pearson", x, y)
  numbers("pearson", x); numbers("pearson", y)
  local n = #x
  local mx, my = 0, 0
  for i = 1, n do mx = mx + x[i]; my = my + y[i] end
  mx, my = mx / n, my / n
  local sxy, sxx, syy = 0, 0, 0
  for i = 1, n do
    local dx, dy = x[i] - mx, y[i] - my
    sxy = sxy + dx * dy; sxx = sxx + dx * dx; syy = syy + dy * dy
  end
  if sxx == 0 or syy == 0 then return 0 / 0 end -- undefined, as scipy (nan)
  return sxy / math.sqrt(sxx * syy)
end

-- Ranks 1..n with ties given their average rank (scipy.stats.rankdata 'average').
function M.rank(x)
  local n = #x
  local idx = {}
  for i = 1, n do idx[i] = i end
  table.sort(idx, function(a, b) if x[a] ~= x[b] then return x[a] < x[b] end return a < b end)
  local r = {}
  local i = 1
  while i <= n do
    local j = i
    while j < n and x[idx[j + 1]] == x[idx[i]] do j = j + 1 end
    local avg = (i + j) / 2
    for k = i, j do r[idx[k]] = avg end
    i = j + 1
  end
  return r
end

function M.spearman(x, y)
  check_pair("spearman", x, y)
  numbers("spearman", x); numbers("spearman", y)
  return M.pearson(M.rank(x), M.rank(y))
end

-- Per-task metrics as Hugging Face's glue_compute_metrics / NVIDIA's run_glue report them.
-- task: cola, sst-2, mrpc, sts-b, qqp, mnli, mnli-mm, qnli, rte, wnli (case-insensitive).
-- For mnli, pass {matched = {preds, labels}, mismatched = {preds, labels}} as `preds`
-- to get both accuracies, or plain arrays for one of them.
function M.glue(task, preds, labels)
  local t = tostring(task):lower():gsub("_", "-")
  if t == "cola" then
    return { mcc = M.matthews(preds, labels) }
  elseif t == "sst-2" or t == "sst2" or t == "qnli" or t == "rte" or t == "wnli" then
    return { acc = M.accuracy(preds, labels) }
  elseif t == "mrpc" or t == "qqp" then
    -- the positive class is 1 (or "1" for labels read as strings from the TSVs)
    local acc, f1 = M.accuracy(preds, labels), M.f1(preds, labels, type(labels[1]) == "string" and "1" or 1)
    return { acc = acc, f1 = f1, acc_and_f1 = (acc + f1) / 2 }
  elseif t == "sts-b" or t == "stsb" then
    local p, s = M.pearson(preds, labels), M.spearman(preds, labels)
    return { pearson = p, spearmanr = s, corr = (p + s) / 2 }
  elseif t == "mnli" or t == "mnli-m" then
    if labels == nil and type(preds) == "table" and preds.matched then
      return { mnli_acc = M.accuracy(preds.matched[1], preds.matched[2]),
               ["mnli-mm_acc"] = M.accuracy(preds.mismatched[1], preds.mismatched[2]) }
    end
    return { mnli_acc = M.accuracy(preds, labels) }
  elseif t == "mnli-mm" then
    return { ["mnli-mm_acc"] = M.accuracy(preds, labels) }
  end
  error("metrics.glue: unknown task '" .. tostring(task) .. "'", 2)
end

------------------------------------------------------------------ JSON output

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
function M.json_string(s)
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
  if tv == "string" then out[#out + 1] = M.json_string(v)
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
      out[#out + 1] = pad_in .. M.json_string(k) .. ": "
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
function M.json_dumps(v, opts)
  local out = {}
  dump(v, opts and opts.indent, 0, out, false)
  return table.concat(out)
end

-- json_object_keys(text) -> keys, int_keys: the keys of the top-level JSON
-- object in file order (cjson loses the order; the SQuAD v2 best-threshold
-- search depends on it) and the set of keys whose value is an integer literal
-- (Python keeps those as ints, which prints differently).
function M.json_object_keys(text, where)
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
