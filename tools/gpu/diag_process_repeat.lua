-- Diagnostic for a real GPU: do two pre-training processes with the same options log the same losses bit for bit?
-- The test fixture's tiny corpus and model (tests/lua/lib/pretrain_fixture.lua), 3 steps, per variant (precision x
-- micro-batches per step x device), two processes each; prints the first step whose loss differs.
local root = arg[0]:gsub("tools/gpu/[^/]*$", "")
package.path = root .. "tests/lua/lib/?.lua;" .. package.path
local T = require "testing"
local fx = require("pretrain_fixture").make(T, { need_cuda = true })
local variants = os.getenv("BL_DIAG_QUICK") and { { "bf16", 8, "cuda" } } or {
  { "bf16", 512, "cuda" }, { "bf16", 8, "cuda" }, { "fp32", 512, "cuda" }, { "fp32", 64, "cuda" },
  { "bf16", 512, "cuda", "--threads=4" }, { "bf16", 64, "cpu" },
}
local bad = 0
for i, v in ipairs(variants) do
  local args = ("--batch1=%d --micro-batch=8 --steps1=3 --precision=%s --device=%s %s"):format(v[2], v[1], v[3],
    v[4] or "")
  local l = {}
  for r = 1, 2 do
    local name = ("v%d_%d"):format(i, r)
    local out, rc = fx.pretrain(fx.tmp .. "/" .. name, args)
    if rc ~= 0 then print(out); os.exit(1) end
    l[r] = fx.losses(fx.tmp .. "/" .. name)
  end
  local first
  for s = 1, 3 do if l[1][s] ~= l[2][s] then first = first or s end end
  print(("%-60s %s"):format(args, first and ("DIFFER from step %d: %.17g vs %.17g"):format(first, l[1][first],
    l[2][first]) or ("same bits (step 3 loss %.17g)"):format(l[1][3])))
  if first then bad = bad + 1 end
end
os.exit(bad == 0 and 0 or 1)
