-- The Lua layering check (run by .ci/run): every `require` in lua/ and recipes/, lazy ones included, must
-- point to the same layer or one below, and no module may reach itself through its requires.
--   bertlua scripts/check_lua_layers.lua [ROOT]
-- The layers, lowest first; a module's layer is the longest prefix that names one.
local LAYERS = {
  { "core", { "bertlua.core" } },                        -- the FFI binding of the C API
  { "util", { "bertlua.util" } },
  { "tensor", { "bertlua.tensor", "bertlua.runtime" } },
  { "device", { "bertlua.device" } },                    -- CUDA graphs, pinned staging
  { "nn", { "bertlua.nn" } },
  { "bert", { "bertlua.bert" } },
  { "io", { "bertlua.io" } },
  { "data", { "bertlua.data" } },
  { "train", { "bertlua.train", "bertlua.stepmodel" } },
  { "batched", { "bertlua.batched" } },                  -- batched inference over a model
  { "pretrained", { "bertlua.pretrained" } },            -- model directories in and out
  { "tasks", { "bertlua.tasks" } },
  { "api", { "bertlua" } },                              -- lua/bertlua/init.lua: the short names for scripts
  { "recipes", { "recipes" } },
}
local root = arg[1] or (arg[0]:match("^(.*)/scripts/[^/]*$") or ".")

local function layer_of(mod)
  local best, best_len
  for i, l in ipairs(LAYERS) do
    for _, p in ipairs(l[2]) do
      local match = mod == p or mod:sub(1, #p + 1) == p .. "."
      if match and (not best_len or #p > best_len) then best, best_len = i, #p end
    end
  end
  return best
end

local function files()
  local out = {}
  local p = assert(io.popen(("cd '%s' && find lua recipes -name '*.lua' | sort"):format(root:gsub("'", "'\\''"))))
  for f in p:lines() do out[#out + 1] = f end
  p:close()
  return out
end

local function module_name(f)
  if f:match("^recipes/") then return "recipes." .. f:match("^recipes/(.*)%.lua$"):gsub("/", ".") end
  local m = f:match("^lua/(.*)%.lua$"):gsub("/", ".")
  return (m:gsub("%.init$", ""))
end

local edges, problems = {}, {}
for _, f in ipairs(files()) do
  local from = module_name(f)
  local src = assert(io.open(root .. "/" .. f)):read("*a")
  edges[from] = edges[from] or {}
  local n = 0
  for line in (src .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    local code = line:gsub("%-%-.*$", "")
    for _, to in code:gmatch("require%s*%(?%s*([\"'])(.-)%1") do
      if to:match("^bertlua") then
        edges[from][to] = edges[from][to] or (f .. ":" .. n)
        local lf, lt = layer_of(from), layer_of(to)
        if lt and lf and lt > lf then
          problems[#problems + 1] = ("%s:%d: %s (%s) requires %s (%s), a higher layer"):format(f, n, from,
            LAYERS[lf][1], to, LAYERS[lt][1])
        end
      end
    end
  end
end

-- cycles: a depth-first search over the module graph
local state, stack = {}, {}
local function visit(m)
  state[m] = "open"; stack[#stack + 1] = m
  local targets = {}
  for to in pairs(edges[m] or {}) do targets[#targets + 1] = to end
  table.sort(targets)
  for _, to in ipairs(targets) do
    if state[to] == "open" then
      local i = #stack
      while stack[i] ~= to do i = i - 1 end
      local cyc = {}
      for k = i, #stack do cyc[#cyc + 1] = stack[k] end
      cyc[#cyc + 1] = to
      problems[#problems + 1] = ("cycle: %s (%s)"):format(table.concat(cyc, " -> "), edges[m][to])
    elseif not state[to] then
      visit(to)
    end
  end
  stack[#stack] = nil; state[m] = "done"
end
local mods = {}
for m in pairs(edges) do mods[#mods + 1] = m end
table.sort(mods)
for _, m in ipairs(mods) do if not state[m] then visit(m) end end

local names = {}
for _, l in ipairs(LAYERS) do names[#names + 1] = l[1] end
if #problems > 0 then
  io.stderr:write(table.concat(problems, "\n"), "\n")
  io.stderr:write(("%d layering problem(s); the layers, lowest first: %s\n"):format(#problems,
    table.concat(names, " < ")))
  os.exit(1)
end
print(("lua layers: %d modules, no upward require, no cycle (%s)"):format(#mods, table.concat(names, " < ")))
