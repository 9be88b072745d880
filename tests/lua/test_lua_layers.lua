-- scripts/check_lua_layers.lua: the tree passes; a tree with an upward require (a lazy one), or with a
-- cycle inside one layer, fails naming the file, the line and the modules.
local T = require "testing"
local exe, sh = T.exe(), T.sh
local CHECK = "scripts/check_lua_layers.lua"

T.test("the source tree has no upward require and no cycle", function()
  local out, rc = sh(("%s %s ."):format(exe, CHECK))
  T.eq(rc, 0, out)
  T.truthy(out:find("no upward require, no cycle", 1, true), out)
end)

-- a tree of files (path -> source) under a new directory
local function tree(files)
  local root = T.tmpdir("lua/bertlua/util", "lua/bertlua/bert", "recipes")
  for path, src in pairs(files) do T.write_file(root .. "/" .. path, src) end
  return root
end

T.test("an upward require, even a lazy one, fails naming the file and line", function()
  local root = tree {
    ["lua/bertlua/util/a.lua"] = 'local M = {}\nfunction M.f() return require("bertlua.bert.x") end\nreturn M\n',
    ["lua/bertlua/bert/x.lua"] = 'return {}\n',
    ["recipes/r.lua"] = 'require "bertlua.bert.x"  -- a recipe may require anything below it\n',
  }
  local out, rc = sh(("%s %s %s"):format(exe, CHECK, root))
  T.eq(rc, 1, out)
  T.truthy(out:find("lua/bertlua/util/a.lua:2: bertlua.util.a (util) requires bertlua.bert.x (bert), a higher layer",
    1, true), out)
  T.truthy(out:find("1 layering problem(s)", 1, true), "the recipe's require is allowed: " .. out)
end)

T.test("a cycle within one layer fails", function()
  local root = tree {
    ["lua/bertlua/bert/x.lua"] = 'return { y = function() return require "bertlua.bert.y" end }\n',
    ["lua/bertlua/bert/y.lua"] = "-- require 'bertlua.bert.z' in a comment is not an edge\n"
      .. "return require('bertlua.bert.x')\n",
  }
  local out, rc = sh(("%s %s %s"):format(exe, CHECK, root))
  T.eq(rc, 1, out)
  T.truthy(out:find("cycle: bertlua.bert.x -> bertlua.bert.y -> bertlua.bert.x", 1, true), out)
  T.truthy(not out:find("bertlua.bert.z", 1, true), "a commented require is ignored: " .. out)
end)

T.run()
