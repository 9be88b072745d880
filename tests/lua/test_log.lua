-- bertlua.util.log: a symlink where the log goes is replaced, never followed; write errors are errors.
local T = require "testing"
local logm = require "bertlua.util.log"
local fs = require "bertlua.util.fs"
local shell = require "bertlua.util.shell"

T.test("a symlinked log path is replaced (new log and appended one); its target keeps its bytes", function()
  local dir = T.tmpdir()
  T.write_file(dir .. "/victim", "precious\n")
  for _, append in ipairs { false, true } do
    local path = dir .. "/log" .. tostring(append) .. ".jsonl"
    shell.run { "ln", "-s", dir .. "/victim", path }
    local L = logm.open { path = path, append = append }
    L:event("start", { x = 1 })
    L:close()
    T.eq(T.slurp(dir .. "/victim"), "precious\n")
    T.truthy(not fs.is_symlink(path), "still a symlink")
    T.truthy(T.slurp(path):find('"event":"start"', 1, true), T.slurp(path))
  end
end)

T.test("a log that cannot be written is a one-line error naming it", function()
  local L = logm.open { path = "/dev/full" }
  T.raises(function() L:event("x") end, "log: cannot write /dev/full")
end)

T.run()
