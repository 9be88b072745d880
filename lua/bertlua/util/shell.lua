-- bertlua.util.shell: the one place a command line is built and started.
-- Every argument is single-quoted, so a file or directory name carrying
-- $(...), backticks, ';', quotes or a newline stays one word and runs nothing;
-- only this module calls io.popen/os.execute in lua/ and recipes/
-- (scripts/check_shell.sh fails CI otherwise).
--
--   local shell = require "bertlua.util.shell"
--   shell.run { "mkfifo", path }                                    -> ok, exit code
--   shell.read({ "du", "-sb", dir }, { stderr = "/dev/null" })      -> stdout, ok, code
--   for l in shell.popen({ "find", dir, "-type", "f" }):lines() do ... end
--   shell.command(argv[, redirect]) -> the command line, to join with "&", "|" or ";"
-- redirect: { stdin = path, stdout = path, stderr = path or "stdout", append = true (stdout appended to) }
-- (paths are quoted too).
local M = {}

-- quote(s): s as one shell word
function M.quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- command(argv[, redirect]) -> string; argv is a list of words (nested lists are flattened, so a prefix such
-- as { "env", "-u", "X" } can be spliced in)
function M.command(argv, redirect)
  local words = {}
  local function add(list)
    for _, a in ipairs(list) do
      if type(a) == "table" then add(a) else words[#words + 1] = M.quote(a) end
    end
  end
  add(argv)
  if #words == 0 then error("shell: empty command", 2) end
  redirect = redirect or {}
  if redirect.stdin then words[#words + 1] = "< " .. M.quote(redirect.stdin) end
  if redirect.stdout then words[#words + 1] = (redirect.append and ">> " or "> ") .. M.quote(redirect.stdout) end
  if redirect.stderr == "stdout" then words[#words + 1] = "2>&1"
  elseif redirect.stderr then words[#words + 1] = "2> " .. M.quote(redirect.stderr) end
  return table.concat(words, " ")
end

-- a list of words, or a line already built by command()
local function line(cmd, redirect)
  if type(cmd) == "table" then return M.command(cmd, redirect) end
  assert(type(cmd) == "string" and not redirect, "shell: a command is an argv list or a line from command()")
  return cmd
end

-- os.execute's result as (ok, exit code) under LuaJIT (a raw wait status) and Lua 5.2+ (true/nil, "exit", code)
local function status(a, _, code)
  if type(a) == "number" then return a == 0, a % 256 == 0 and math.floor(a / 256) or 128 + a % 128 end
  return a == true, code
end

-- run(cmd[, redirect]) -> ok, exit code
function M.run(cmd, redirect)
  return status(os.execute(line(cmd, redirect)))
end

-- popen(cmd[, mode[, redirect]]) -> the io.popen handle ("r" by default)
function M.popen(cmd, mode, redirect)
  local h, err = io.popen(line(cmd, redirect), mode or "r")
  if not h then error("shell: cannot start " .. line(cmd, redirect) .. ": " .. tostring(err), 2) end
  return h
end

-- read(cmd[, redirect]) -> its whole standard output, ok, exit code (LuaJIT's popen close gives no
-- status, so the shell appends it after a last newline)
function M.read(cmd, redirect)
  local h = M.popen("{ " .. line(cmd, redirect) .. "\n}; printf '\\n%d' $?")
  local out = h:read("*a") or ""
  h:close()
  local body, code = out:match("^(.*)\n(%d+)$")
  code = tonumber(code) or -1
  return body or out, code == 0, code
end

return M
