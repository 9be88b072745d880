-- The host program: script args, -e, exit codes, tracebacks, --version, cjson, REPL.
local T = require "testing"
local exe = (os.getenv("BL_BUILD_DIR") or "build") .. "/bertlua"

local function run(cmd)
  local f = io.popen(cmd .. " 2>&1; echo \"rc=$?\"")
  local out = f:read("*a")
  f:close()
  local rc = tonumber(out:match("rc=(%d+)%s*$"))
  return out:gsub("rc=%d+%s*$", ""), rc
end

local function tmpfile(text)
  local p = os.tmpname()
  local f = io.open(p, "w"); f:write(text); f:close()
  return p
end

T.test("script arguments arrive like in lua", function()
  local p = tmpfile("print(arg[0] ~= nil, arg[1], arg[2], select('#', ...), ...)\n")
  local out, rc = run(exe .. " " .. p .. " --x=1 two")
  T.eq(rc, 0)
  T.truthy(out:find("true\t--x=1\ttwo\t2\t--x=1\ttwo", 1, true), out)
  os.remove(p)
end)

T.test("-e runs code; errors exit 1 with a traceback naming file:line", function()
  local out, rc = run(exe .. [[ -e 'print(6*7)']])
  T.eq(rc, 0); T.truthy(out:find("42", 1, true))
  local p = tmpfile("local x = 1\nlocal function f() error('boom here') end\nf()\n")
  out, rc = run(exe .. " " .. p)
  T.eq(rc, 1)
  T.truthy(out:find(":2: boom here", 1, true), out)
  T.truthy(out:find("stack traceback", 1, true), out)
  os.remove(p)
  out, rc = run(exe .. [[ -e 'local t=require"bertlua"; t.zeros({2,3}):matmul(t.zeros({2,3}))']])
  T.eq(rc, 1)
  T.truthy(out:find("matmul: shapes [2,3] and [2,3] are not compatible", 1, true), out)
  out, rc = run(exe .. " /nonexistent/script.lua")
  T.eq(rc, 1); T.truthy(out:find("cannot open", 1, true), out)
  out, rc = run(exe .. " --bogus")
  T.eq(rc, 1); T.truthy(out:find("unknown option", 1, true), out)
end)

T.test("a user error (raised without a position) is one line; --debug and BERTLUA_DEBUG add the traceback", function()
  local p = tmpfile("local function f() error('pretrain: no train_*.blshard in /d; "
    .. "run create_pretraining_data.lua', 0) end\n"
    .. "local ok, e = xpcall(f, debug.traceback)\nerror(e, 0)\n")
  local out, rc = run(exe .. " " .. p .. " --x=1")
  T.eq(rc, 1)
  T.eq(out, "bertlua: pretrain: no train_*.blshard in /d; run create_pretraining_data.lua\n")
  out = run(exe .. " " .. p .. " --debug")
  T.truthy(out:find("stack traceback", 1, true), out)
  out = run("BERTLUA_DEBUG=1 " .. exe .. " " .. p)
  T.truthy(out:find("stack traceback", 1, true), out)
  -- a data file's line number is not a Lua position
  out = run(exe .. [[ -e 'error("glue: /d/train.tsv:402: 1 columns, expected 2", 0)']])
  T.eq(out, "bertlua: glue: /d/train.tsv:402: 1 columns, expected 2\n")
  os.remove(p)
end)

T.test("stdin script and os.exit codes", function()
  local out, rc = run("echo 'local t = require \"bertlua\"; print(t.randn({2,3}, {seed=1}))' | " .. exe)
  T.eq(rc, 0)
  T.truthy(out:find("shape=[2,3], dtype=f32, device=cpu", 1, true), out)
  out, rc = run(exe .. [[ -e 'os.exit(3)']])
  T.eq(rc, 3, out)
end)

T.test("--version reports the build", function()
  local out, rc = run(exe .. " --version")
  T.eq(rc, 0)
  for _, w in ipairs({"bertlua", "LuaJIT", "BLAS", "MPI", "CUDA", "NCCL"}) do
    T.truthy(out:find(w, 1, true), "missing " .. w .. " in " .. out)
  end
end)

T.test("cjson and bertlua load with no environment", function()
  local out, rc = run("env -i " .. exe
    .. [[ -e 'local c = require "cjson"; local b = require "bertlua"; print(c.encode({a=1}), b.version)']])
  T.eq(rc, 0)
  T.truthy(out:find('{"a":1}', 1, true), out)
end)

T.test("REPL prints expression values and continues lines", function()
  -- run under a pseudo-terminal-free pipe with -i: readline falls back to plain reads
  local input = tmpfile("1+1\nbl = require 'bertlua'\nx = {\n 41 }\nx[1] + 1\nbl.ones({2})\nerror('oops')\n2*3\n")
  local out, rc = run("HOME=/tmp " .. exe .. " -i < " .. input)
  T.eq(rc, 0)
  T.truthy(out:find("2", 1, true), out)
  T.truthy(out:find("42", 1, true), "multi-line input: " .. out)
  T.truthy(out:find("shape=[2], dtype=f32", 1, true), out)
  T.truthy(out:find("oops", 1, true), out)
  T.truthy(out:find("6", 1, true), out)
  os.remove(input)
end)

T.run()
