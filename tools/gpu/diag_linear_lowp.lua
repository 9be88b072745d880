-- Diagnostic for the first real-GPU run: bf16/f16 GEMM (+bias, +GELU epilogue) against the CPU's f32, by shape, to
-- locate an error the emulator does not show. Prints, per case, the launches' classes and the worst error in units
-- of the output's rounding (u |ref|) and of the f32 summation bound (K e S), with the element where it occurs.
local bl = require "bertlua"
local ops = require "bertlua.nn.ops"
local stepmodel = require "bertlua.stepmodel"
if bl.cuda_device_count() == 0 then print("no CUDA device"); os.exit(77) end
local U = { f32 = 2 ^ -24, bf16 = 2 ^ -8, f16 = 2 ^ -11 }
local function rand(shape, seed, lo, hi, dtype)
  return (bl.rand(shape, { seed = seed }) * (hi - lo) + lo):to(dtype):to("f32")
end
local function flat(t) return t:to{ dtype = "f64", device = "cpu" }:contiguous():view{ t:numel() }:totable() end
local function classes(list)
  local n = {}
  for _, l in ipairs(list) do n[#n + 1] = l.cls end
  return table.concat(n, ",")
end
local function report(tag, got, want, u, scale)
  local g, w = flat(got), flat(want)
  local worst, wi, nbad = 0, 0, 0
  for i = 1, #w do
    local d = math.abs(g[i] - w[i]) / (u * math.abs(w[i]) + scale)
    if d > worst then worst, wi = d, i end
    if d > 1 then nbad = nbad + 1 end
  end
  print(("  %-28s worst %8.2f (elem %d gpu %.8g cpu %.8g)  over bound: %d of %d"):format(tag, worst, wi, g[wi] or 0,
    w[wi] or 0, nbad, #w))
end
local SHAPES = { { 21, 17, 45 }, { 21, 24, 48 }, { 24, 17, 48 }, { 24, 24, 45 }, { 39, 29, 48 }, { 63, 64, 64 } }
for _, dtype in ipairs { "bf16", "f16", "f32" } do
  for _, s in ipairs(SHAPES) do
    local M, K, N = s[1], s[2], s[3]
    local x = rand({ 3, M / 3, K }, 31, -1.5, 1.5, dtype)
    local w, b = rand({ N, K }, 32, -0.4, 0.4, dtype), rand({ N }, 33, -1, 1, dtype)
    local dev = function(t) return t:to{ device = "cuda:0", dtype = dtype } end
    local gx, gw, gb = dev(x), dev(w), dev(b)
    print(("%s M=%d K=%d N=%d"):format(dtype, M, K, N))
    local scale = K * 2 ^ -24 * 2   -- |x w| <= 0.6 per term: a loose f32 summation scale
    local lin = ops.linear(x, w, b)
    local gl
    local l1 = stepmodel.record(0, function() gl = ops.linear(gx, gw, gb) end)
    report("linear+bias [" .. classes(l1) .. "]", gl, lin,
      U[dtype], scale)
    local gl0
    local l0 = stepmodel.record(0, function() gl0 = ops.linear(gx, gw) end)
    report("linear [" .. classes(l0) .. "]", gl0, ops.linear(x, w), U[dtype], scale)
    local y, pre = ops.linear_gelu_tanh(x, w, b)
    local gy, gpre
    local l2 = stepmodel.record(0, function() gy, gpre = ops.linear_gelu_tanh(gx, gw, gb) end)
    report("gelu pre [" .. classes(l2) .. "]", gpre, pre, U[dtype], scale)
    report("gelu y", gy, y, U[dtype], scale)
  end
end

-- Which rounding does the bias epilogue apply? For every element, the device's result against two models built on
-- the CPU from the f32 product P = x W^T: A = round(P + b) (bias added to the f32 sum), B = round(round(P) + b)
-- (the product rounded to the output dtype first). The count of exact matches says which one the library follows.
print("bias epilogue rounding: exact matches of model A round(P + b) and model B round(round(P) + b)")
for _, dtype in ipairs { "bf16", "f16" } do
  for _, s in ipairs(SHAPES) do
    local M, K, N = s[1], s[2], s[3]
    local x = rand({ 3, M / 3, K }, 31, -1.5, 1.5, dtype)
    local w, b = rand({ N, K }, 32, -0.4, 0.4, dtype), rand({ N }, 33, -1, 1, dtype)
    local dev = function(t) return t:to{ device = "cuda:0", dtype = dtype } end
    local P = ops.linear(x, w)
    local A = flat((P + b):to(dtype))
    local Bm = flat((P:to(dtype):to("f32") + b):to(dtype))
    for _, which in ipairs { "linear+bias", "gelu pre (AUX)" } do
      local g
      if which == "linear+bias" then g = flat(ops.linear(dev(x), dev(w), dev(b)))
      else local _, pre = ops.linear_gelu_tanh(dev(x), dev(w), dev(b)); g = flat(pre) end
      local na, nb = 0, 0
      for i = 1, #g do
        if g[i] == A[i] then na = na + 1 end
        if g[i] == Bm[i] then nb = nb + 1 end
      end
      print(("  %s M=%d K=%d N=%d %-15s A %d, B %d of %d"):format(dtype, M, K, N, which, na, nb, #g))
    end
  end
end
