-- A failing or killed rank ends the whole MPI job with a message instead of a hang.
local T = require "testing"
local exe = (os.getenv("BL_BUILD_DIR") or "build") .. "/bertlua"
local function sh(cmd)
  local f = io.popen(cmd .. " 2>&1; echo rc=$?")
  local out = f:read("*a"); f:close()
  return out, tonumber(out:match("rc=(%d+)%s*$"))
end
if not sh("command -v mpirun"):find("/", 1, true) then T.skip_all("mpirun not installed") end
local mpirun = "timeout 60 mpirun -np 2 --oversubscribe --allow-run-as-root "

local function script(body)
  local p = os.tmpname() .. ".lua"
  local f = io.open(p, "w"); f:write(body); f:close()
  return p
end

T.test("an error on one rank aborts every rank", function()
  local p = script([[
local bl = require "bertlua"
local dist = require "bertlua.train.dist"
local t = bl.ones({4})
dist.all_reduce_sum(t)
if bl.rank() == 1 then error("rank one gives up") end
dist.all_reduce_sum(t)   -- rank 0 would wait here forever without the abort
]])
  local out, rc = sh(mpirun .. exe .. " " .. p)
  os.remove(p)
  T.truthy(rc ~= 0 and rc ~= 124, "nonzero exit without timing out (rc " .. tostring(rc) .. "): " .. out)
  T.truthy(out:find("rank one gives up", 1, true), out)
end)

T.test("a rank killed by a signal ends the job", function()
  local p = script([[
local bl = require "bertlua"
local dist = require "bertlua.train.dist"
local ffi = require "ffi"
ffi.cdef "int getpid(void); int kill(int, int);"
dist.barrier()
if bl.rank() == 1 then ffi.C.kill(ffi.C.getpid(), 9) end
dist.barrier()
]])
  local out, rc = sh(mpirun .. exe .. " " .. p)
  os.remove(p)
  T.truthy(rc ~= 0 and rc ~= 124, "nonzero exit without timing out (rc " .. tostring(rc) .. "): " .. out)
end)

T.run()
