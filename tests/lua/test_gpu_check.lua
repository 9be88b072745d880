-- scripts/gpu_check.sh without a GPU: its time boxes fit the 10- and 60-minute limits by construction, and its
-- verdict (exit status and report) on stage 1 run against stub test programs: PASSED when they pass, FAILED when
-- one fails, and FAILED when every test skipped (exit 77), which used to print "ok".
local T = require "testing"

local function budget(args)
  local out, rc = T.sh("bash scripts/gpu_check.sh --budget " .. args)
  return out, rc, tonumber(out:match("total +(%d+) of")), tonumber(out:match("of (%d+)"))
end

T.test("the time boxes of --quick and the full run fit their limits by construction", function()
  for _, args in ipairs({ "--quick", "" }) do
    local out, rc, total, limit = budget(args)
    T.eq(rc, 0, out)
    T.truthy(total and total <= limit, out)
  end
  local _, _, quick_total, quick_limit = budget("--quick")
  T.eq(quick_limit, 600, "quick mode: 10 minutes")
  T.truthy(quick_total > 0, "quick mode has time boxes")
  local out = budget("")
  T.truthy(out:find("stage 4: %d+ tests"), "the suite's box is derived from the emulated timings: " .. out)
end)

-- Runs stage 1 of the emulated dry run on a build directory whose test_ptx and test_cuda_ops exit with the given
-- codes; returns the exit status and the report.
local function stage1(ptx_rc, ops_rc)
  local dir = T.tmpdir("build", "out")
  for name, rc in pairs({ test_ptx = ptx_rc, test_cuda_ops = ops_rc }) do
    T.write_file(dir .. "/build/" .. name, ("#!/bin/sh\necho %s stub\nexit %d\n"):format(name, rc))
  end
  T.sh("chmod +x " .. dir .. "/build/test_ptx " .. dir .. "/build/test_cuda_ops")
  local out, rc = T.sh(("BL_BUILD_DIR=%s/build OUT=%s/out bash scripts/gpu_check.sh --quick --emulated --stages=1")
    :format(dir, dir))
  return rc, T.slurp(dir .. "/out/gpu_report.md"), out
end

T.test("stage 1 passes when its tests pass, fails when one fails, and fails when every test skipped", function()
  local rc, report, out = stage1(0, 0)
  T.eq(rc, 0, out .. report)
  T.truthy(report:find("**PASSED**: tests 2 passed, 0 skipped, 0 failed", 1, true), report)
  T.truthy(report:find("| 2 | headline benchmarks | left out (--stages) |", 1, true), report)
  rc, report = stage1(0, 1)
  T.truthy(rc ~= 0, "a failed test fails the check")
  T.truthy(report:find("**FAILED**", 1, true) and report:find("FAILED (exit 1)", 1, true), report)
  rc, report = stage1(77, 77)
  T.truthy(rc ~= 0, "every test skipped fails the check")
  T.truthy(report:find("no test passed: 2 skipped", 1, true), report)
end)

T.run()
