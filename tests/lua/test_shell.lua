-- bertlua.util.shell: every argument reaches the program as one word, whatever it holds.
local T = require "testing"
local shell = require "bertlua.util.shell"

local HOSTILE = { "plain", "two words", "it's", "$(touch PWNED)", "`touch PWNED`", "a;touch PWNED;#", "new\nline",
  "\"dq\" \\ back", "*", "-n", "", "'", "''" }

T.test("each argument arrives as one word, nothing runs", function()
  local dir = T.tmpdir()
  for _, s in ipairs(HOSTILE) do
    local out, ok = shell.read { "sh", "-c", 'cd "$1" && printf "[%s]" "$2"', "sh", dir, s }
    T.truthy(ok, "exit status for " .. s)
    T.eq(out, "[" .. s .. "]")
  end
  local out = shell.read { "ls", "-A", dir }
  T.eq(out, "", "a command ran")
end)

T.test("exit codes, redirections, nested word lists", function()
  local ok, code = shell.run { "sh", "-c", "exit 3" }
  T.eq(ok, false); T.eq(code, 3)
  ok, code = shell.run { "true" }
  T.eq(ok, true); T.eq(code, 0)
  local dir = T.tmpdir()
  local f = dir .. "/o ut;'x"
  T.truthy(shell.run({ { "printf", "%s" }, "hi" }, { stdout = f }))
  T.eq(T.slurp(f), "hi")
  T.eq(shell.read({ "cat" }, { stdin = f }), "hi")
  local out
  out, ok, code = shell.read({ "sh", "-c", "echo err >&2; exit 4" }, { stderr = "stdout" })
  T.eq(out, "err\n"); T.eq(ok, false); T.eq(code, 4)
  T.eq(shell.command({ "a b", { "c" } }, { stderr = "/dev/null" }), "'a b' 'c' 2> '/dev/null'")
  T.raises(function() shell.command {} end, "empty command")
end)

T.run()
