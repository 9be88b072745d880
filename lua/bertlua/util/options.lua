-- bertlua.util.options: command-line options for recipes.
--
--   local options = require "bertlua.util.options"
--   local opt = options.parse(arg, {
--     { "lr", 6e-3, "peak learning rate" },
--     { "phase", "both", "1, 2 or both" },
--     { "resume", false, "continue from the newest checkpoint" },
--   }, { usage = "bertlua recipes/pretrain.lua [options]" })
--
-- Accepts --name=value, --name value, --flag (true), --no-flag (false).
-- Dashes and underscores in names are the same (--max-steps = --max_steps).
-- Values take the type of their default (number, boolean, string); a default
-- of nil accepts anything as a string. --config=FILE loads defaults from a
-- Lua file returning a table or a JSON object; the command line wins over it.
-- --help prints every option with its default and description, then exits 0.
-- --debug is accepted by every recipe (the host then prints tracebacks for user errors too).
-- options.concat(spec, group) joins a recipe's own options and a shared group (e.g. bertlua.train.setup's).
--
-- Numbers are checked when parsed: NaN and infinities are refused, and a spec
-- entry may declare more (named fields beside the positional ones):
--   { "batch", 32, "sequences per step", int = true, min = 1 }
--   { "lr", 2e-5, "peak learning rate", min = 0, above = true }   -- above: strictly greater than min
--   { "warmup", 0.1, "warmup proportion", min = 0, max = 1 }
--   { "max_time", 0, "seconds", int = false }   -- a real number despite its integer default
--   { "phase", "both", "1, 2 or both", choices = { "1", "2", "both" } }
-- A number option whose default is an integer is an integer unless it says
-- int = false. An option named "threads" is an integer in 0..(CPUs of this
-- machine). A single-dash option (-lr=3), a bare non-boolean option
-- (--output), an "=" parted from its option (--output = x), a JSON object for
-- a string and stray arguments are refused; a recipe that takes arguments
-- says so with info.positional = true (they are in opt._positional).
local ffi = require "ffi"
local fs = require "bertlua.util.fs"
local M = {}

local function online_cpus()
  pcall(ffi.cdef, "long sysconf(int name);")
  local ok, n = pcall(function() return tonumber(ffi.C.sysconf(84)) end)  -- _SC_NPROCESSORS_ONLN on Linux
  return ok and n and n > 0 and n or 1024
end

local function norm(name) return (name:gsub("-", "_")) end

-- range(where, name, n, o): n against the declared type and range of spec entry o
local function range(where, name, n, o)
  local flag = "--" .. name:gsub("_", "-")
  local function bad(what) error(("%s: option %s=%s: %s"):format(where, flag, tostring(n), what), 0) end
  if n ~= n or n == math.huge or n == -math.huge then bad("must be a finite number") end
  if name == "threads" then
    local cpus = online_cpus()
    if n ~= math.floor(n) or n < 0 or n > cpus then
      bad(("must be an integer from 0 to %d (0: default)"):format(cpus))
    end
  end
  local int = o.int
  if int == nil then int = type(o[2]) == "number" and o[2] % 1 == 0 end
  if int and n ~= math.floor(n) then bad("must be an integer") end
  if o.min and (n < o.min or (o.above and n == o.min)) then
    bad(("must be %s %s"):format(o.above and ">" or ">=", tostring(o.min)))
  end
  if o.max and n > o.max then bad(("must be <= %s"):format(tostring(o.max))) end
  return n
end

local function convert(name, v, default, where, o)
  local ty = type(default)
  if ty == "number" then
    local n = tonumber(v)
    if not n then
      error(("%s: option --%s expects a number, got '%s'"):format(where, name:gsub("_", "-"), tostring(v)), 0)
    end
    return range(where, name, n, o or {})
  elseif ty == "boolean" then
    if v == true or v == "true" or v == "1" or v == "yes" then return true end
    if v == false or v == "false" or v == "0" or v == "no" then return false end
    error(("%s: option --%s expects true or false, got '%s'"):format(where, name:gsub("_", "-"), tostring(v)), 0)
  end
  local flag = "--" .. name:gsub("_", "-")
  if v == true then error(("%s: option %s needs a value (%s=VALUE)"):format(where, flag, flag), 0) end
  if type(v) == "number" then v = tostring(v) end
  if type(v) ~= "string" then
    error(("%s: option %s expects a string, got %s"):format(where, flag,
      type(v) == "table" and "a JSON object or array" or tostring(v)), 0)
  end
  if o and o.choices then
    for _, c in ipairs(o.choices) do if v == c then return v end end
    error(("%s: option %s=%s: must be %s"):format(where, flag, v, table.concat(o.choices, ", ")), 0)
  end
  return v
end

local function load_config(path)
  local text, err = fs.read(path, "config file")
  if not text then error("options: cannot open config file " .. path .. " (" .. tostring(err) .. ")", 0) end
  if path:match("%.json$") or text:match("^%s*{%s*\"") then
    local ok, t = pcall(require("cjson").decode, text)
    if not ok or type(t) ~= "table" then error("options: " .. path .. " is not a JSON object: " .. tostring(t), 0) end
    return t
  end
  local chunk, lerr = loadstring(text, "@" .. path)
  if not chunk then error("options: " .. lerr, 0) end
  local ok, t = pcall(chunk)
  if not ok or type(t) ~= "table" then error("options: " .. path .. " must return a table: " .. tostring(t), 0) end
  return t
end

function M.help(spec, info)
  local lines = { info and info.usage or "options:" }
  if info and info.description then lines[#lines + 1] = info.description end
  lines[#lines + 1] = ""
  local width = 0
  for _, o in ipairs(spec) do width = math.max(width, #o[1]) end
  for _, o in ipairs(spec) do
    local d = o[2]
    local ds = d == nil and "" or ("=" .. tostring(d))
    lines[#lines + 1] = ("  --%-" .. (width + 2) .. "s %s%s"):format(o[1]:gsub("_", "-"), o[3] or "",
      d == nil and "" or (" (default " .. tostring(d) .. ")"))
    local _ = ds
  end
  lines[#lines + 1] = ("  --%-" .. (width + 2) .. "s %s"):format("config",
    "a Lua or JSON file of option values (not a model's config.json)")
  return table.concat(lines, "\n")
end

-- parse(argv, spec[, info]) -> table of options (+ opt._positional)
function M.parse(argv, spec, info)
  local where = info and info.name or (argv and argv[0]) or "options"
  local known, opt = {}, { _positional = {} }
  for _, o in ipairs(spec) do
    if norm(o[1]) == "config" then error("options: --config is reserved for option files; name the option otherwise", 2)
    end
    known[norm(o[1])] = o
    opt[norm(o[1])] = o[2]
  end
  local given = {}
  local i = 1
  argv = argv or {}
  while i <= #argv do
    local a = argv[i]
    if a == "--help" or a == "-h" then
      print(M.help(spec, info))
      os.exit(0)
    end
    if a:match("^%-[%a_]") then
      error(("%s: %s: options start with two dashes (-%s)"):format(where, a, a), 0)
    end
    local name, value = a:match("^%-%-([%w_%-%.]+)=(.*)$")
    if not name then name = a:match("^%-%-([%w_%-%.]+)$") end
    if name then
      name = norm(name)
      if value == nil then
        local o = known[name]
        if name == "config" or (o and type(o[2]) ~= "boolean" and argv[i + 1] and not argv[i + 1]:match("^%-%-")) then
          i = i + 1
          value = argv[i]
          if value:sub(1, 1) == "=" then
            error(("%s: '--%s %s': write --%s=VALUE without spaces"):format(where, a:sub(3), value, a:sub(3)), 0)
          end
        elseif not o and name:match("^no_") and known[name:sub(4)] then
          name, value = name:sub(4), false
        else
          value = true
        end
      end
      if name == "debug" and not known.debug then goto continue end  -- read by the host
      if name ~= "config" and not known[name] then
        error(("%s: unknown option --%s (see --help)"):format(where, name:gsub("_", "-")), 0)
      end
      given[name] = value
    elseif info and info.positional then
      opt._positional[#opt._positional + 1] = a
    else
      error(("%s: stray argument '%s': options are --name=VALUE (see --help)"):format(where, a), 0)
    end
    ::continue::
    i = i + 1
  end
  if given.config then
    local values = load_config(given.config)
    if values.hidden_size and values.num_attention_heads and not known.hidden_size then
      error(("%s: --config=%s is a model configuration, but --config takes a file of option values: %s"):format(where,
        given.config, known.bert_config and "pass it as --bert-config=" .. given.config
        or "give the model's directory (--model/--init) instead"), 0)
    end
    for k, v in pairs(values) do
      local n = norm(k)
      if not known[n] then error(("%s: unknown option '%s' in %s"):format(where, k, given.config), 0) end
      opt[n] = convert(n, v, known[n][2], where, known[n])
    end
  end
  for k, v in pairs(given) do
    if k ~= "config" then opt[k] = convert(k, v, known[k][2], where, known[k]) end
  end
  -- defaults are checked too: a recipe's own table cannot hold an out-of-range value unnoticed
  for _, o in ipairs(spec) do
    local n = norm(o[1])
    if given[n] == nil and type(opt[n]) == "number" then range(where, n, opt[n], o) end
  end
  return opt
end

-- concat(spec, ...) -> one spec of the given ones' entries, in order (a recipe's own options and a shared group);
-- an option given twice is an error
function M.concat(...)
  local out, seen = {}, {}
  for i = 1, select("#", ...) do
    for _, o in ipairs(select(i, ...)) do
      if seen[norm(o[1])] then error(("options.concat: option --%s is given twice"):format(o[1]:gsub("_", "-")), 2) end
      seen[norm(o[1])] = true
      out[#out + 1] = o
    end
  end
  return out
end

-- show(opt[, fmt]): the options as one line per option, sorted (printed at start by recipes);
-- fmt formats name and value (default "  %s = %s")
function M.show(opt, fmt)
  local keys = {}
  for k in pairs(opt) do if k:sub(1, 1) ~= "_" then keys[#keys + 1] = k end end
  table.sort(keys)
  local out = {}
  for _, k in ipairs(keys) do out[#out + 1] = (fmt or "  %s = %s"):format(k, tostring(opt[k])) end
  return table.concat(out, "\n")
end

return M
