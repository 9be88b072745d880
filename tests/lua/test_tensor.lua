-- Lua tensor API: creation, views, copies, math, reductions, errors.
local T = require "testing"
local bl = require "bertlua"

T.test("creation and metadata", function()
  local z = bl.zeros({2, 3})
  T.eq(z:dim(), 2); T.eq(z:numel(), 6); T.eq(z:dtype(), "f32"); T.eq(z:device(), "cpu")
  T.eq(bl.shape_str(z:shape()), "[2,3]")
  T.near(bl.ones({4}, {dtype = "f64"}):sum(), 4)
  T.near(bl.full({2, 2}, 2.5):sum(), 10)
  T.near(bl.arange(5):tolist(), {0, 1, 2, 3, 4})
  T.eq(bl.arange(5):dtype(), "i64")
  T.near(bl.arange(1, 2, 0.25):tolist(), {1, 1.25, 1.5, 1.75})
  local f = bl.from({{1, 2, 3}, {4, 5, 6}})
  T.near(f:tolist(), {{1, 2, 3}, {4, 5, 6}})
  T.eq(bl.from(3):item(), 3)
  for _, dt in ipairs({"f32", "f64", "f16", "bf16", "i32", "i64", "u8", "bool"}) do
    local t = bl.from({1, 0, 3}, {dtype = dt})
    T.eq(t:dtype(), dt)
    T.near(t:tolist(), dt == "bool" and {1, 0, 1} or {1, 0, 3})
  end
end)

T.test("dtype conversions round to nearest even", function()
  local x = bl.from({1 + 2^-11, 1 + 3 * 2^-11, 65520, 1e-8, 1 + 2^-8, 1 + 3 * 2^-8}, {dtype = "f64"})
  T.near(x:to("f16"):totable(), {1, 1 + 2^-9, math.huge, 0, 1 + 2^-8, 1 + 3 * 2^-8})
  T.near(x:to("bf16"):totable(), {1, 1, 65536, 1e-8, 1, 1 + 2^-6}, 1e-2)
  T.near(bl.from({1 + 2^-8, 1 + 3 * 2^-8}, {dtype = "f32"}):to("bf16"):totable(), {1, 1 + 2^-6})
  T.near(bl.from({2.7, -2.7, 1e20}):to("i32"):totable(), {2, -2, 2147483647})
end)

T.test("views alias storage", function()
  local t = bl.arange(12, {dtype = "f32"}):view({3, 4})
  local tr = t:transpose(1, 2)
  T.eq(bl.shape_str(tr:shape()), "[4,3]")
  T.eq(tr:is_contiguous(), false)
  T.eq(tr:get(2, 1), 1)
  local n = t:narrow(2, 2, 2)       -- columns 2..3
  n:fill_(-1)
  T.near(t:select(1, 1):tolist(), {0, -1, -1, 3})
  local row = t:select(1, -1)
  T.near(row:tolist(), {8, -1, -1, 11})
  T.raises(function() return tr:view({12}) end, "without a copy")
  T.near(tr:reshape({12}):tolist(), {0, 4, 8, -1, -1, -1, -1, -1, -1, 3, 7, 11})
  local e = bl.from({1, 2, 3}):view({3, 1}):expand({3, 4})
  T.eq(e:sum(), 24)
  T.near(t:permute({2, 1}):contiguous():view({-1}):narrow(1, 1, 3):tolist(), {0, 4, 8})
  T.eq(bl.shape_str(t:unsqueeze(1):shape()), "[1,3,4]")
  T.eq(bl.shape_str(t:unsqueeze(-1):shape()), "[3,4,1]")
  T.eq(bl.shape_str(t:unsqueeze(1):squeeze(1):shape()), "[3,4]")
end)

T.test("elementwise with broadcasting", function()
  local a = bl.from({{1, 2, 3}, {4, 5, 6}})
  local b = bl.from({10, 20, 30})
  T.near((a + b):tolist(), {{11, 22, 33}, {14, 25, 36}})
  T.near((a * 2 - 1):tolist(), {{1, 3, 5}, {7, 9, 11}})
  T.near((1 / a):tolist()[1], {1, 0.5, 1 / 3})
  T.near((-a):sum(), -21)
  T.near(a:exp():log():tolist(), a:tolist(), 1e-6)
  T.near(a:gt(3):to("f32"):tolist(), {{0, 0, 0}, {1, 1, 1}})
  T.near(bl.where(a:gt(3), a, 0):sum(), 15)
  local big = bl.randn({300, 500}, {seed = 3})
  local s = (big + big):sub(big * 2):abs():max()
  T.eq(s, 0)
  -- strided operands
  local tr = big:transpose(1, 2)
  T.near((tr + tr):sum(), 2 * big:sum(), 1e-4)
end)

T.test("reductions", function()
  local a = bl.from({{1, 5, 3}, {4, 2, 6}})
  T.near(a:sum(2):tolist(), {9, 12})
  T.near(a:mean(1):tolist(), {2.5, 3.5, 4.5})
  T.near(a:max(2):tolist(), {5, 6})
  T.near(a:argmax(2):tolist(), {2, 3})
  T.eq(a:argmax(), 6)
  T.near(a:sum(2, true):shape(), {2, 1})
  T.near(a:sum({1, 2}):item(), 21)
  T.near(a:transpose(1, 2):sum(1):tolist(), {9, 12})
  T.raises(function() return a:sum(3) end, "sum: dimension 3 out of range")
end)

T.test("matmul against a direct loop", function()
  local a = bl.randn({2, 5, 7}, {seed = 1})
  local b = bl.randn({7, 3}, {seed = 2})
  local c = a:matmul(b)
  T.eq(bl.shape_str(c:shape()), "[2,5,3]")
  local A, B, Cc = a:tolist(), b:tolist(), c:tolist()
  for bi = 1, 2 do for i = 1, 5 do for j = 1, 3 do
    local s = 0
    for k = 1, 7 do s = s + A[bi][i][k] * B[k][j] end
    T.near(Cc[bi][i][j], s, 1e-5, 1e-5)
  end end end
  -- transposed operand goes straight to BLAS with a transpose flag
  local bt = bl.randn({3, 7}, {seed = 2}):transpose(1, 2)
  T.near(a:matmul(bt):shape(), {2, 5, 3})
  T.near(a:matmul(bt):sum(), a:matmul(bt:contiguous()):sum(), 1e-5, 1e-5)
  -- f16 inputs compute in f32
  T.near(a:to("f16"):matmul(b:to("f16")):to("f32"):sum(), c:sum(), 2e-2, 2e-2)
  -- vectors
  T.near(bl.from({1, 2}):matmul(bl.from({{1, 0}, {0, 1}})):tolist(), {1, 2})
  T.raises(function() return bl.zeros({2, 3}):matmul(bl.zeros({2, 3})) end,
    "matmul: shapes [2,3] and [2,3] are not compatible")
end)

T.test("random streams are reproducible", function()
  local a = bl.randn({1000}, {seed = 5})
  local b = bl.randn({1000}, {seed = 5})
  T.eq((a - b):abs():max(), 0)
  local c = bl.randn({1000}, {seed = 6})
  T.truthy((a - c):abs():max() > 0)
  local g = bl.Generator(9)
  local x1 = bl.rand({10}, {generator = g})
  local x2 = bl.rand({10}, {generator = g})
  T.truthy((x1 - x2):abs():max() > 0, "the generator advances")
  T.eq(g.offset, 6)
  -- the second draw is the same as a fresh draw at offset 3
  T.eq((x2 - bl.rand({10}, {seed = 9, offset = 3})):abs():max(), 0)
  local u = bl.rand({20000}, {seed = 1})
  T.truthy(u:min() >= 0 and u:max() < 1)
  T.near(u:mean(), 0.5, 0, 0.01)
end)

T.test("bad calls raise errors naming the op", function()
  T.raises(function() return bl.zeros({-1}) end, "zeros")
  T.raises(function() return bl.zeros({2}, {dtype = "f8"}) end, "unknown dtype 'f8'")
  T.raises(function() return bl.zeros({2}, {device = "tpu"}) end, "unknown device 'tpu'")
  T.raises(function() return bl.zeros({2, 3}) + bl.zeros({4}) end, "add: shapes [2,3] and [4] are not compatible")
  T.raises(function() return bl.zeros({2, 3}):narrow(2, 3, 2) end, "narrow: range")
  T.raises(function() return bl.zeros({2, 3}):get(3, 1) end, "get: index 2 is out of range")
  T.raises(function() return bl.zeros({2, 3}):item() end, "item: tensor has 6 elements")
  T.raises(function() return bl.from({{1, 2}, {3}}) end, "ragged")
  T.raises(function() return bl.from({1, "x"}) end, "not a number")
  T.raises(function() return bl.zeros({2}):view({3}) end, "view: shape [3] has 3 elements")
  if not bl.cuda_available() then
    T.raises(function() return bl.zeros({2}, {device = "cuda:0"}) end, "cuda:0 requested")
  end
  local t = bl.zeros({3})
  t:free()
  T.raises(function() return t + 1 end, "freed")
  T.eq(tostring(t), "tensor(<freed>)")
end)

T.test("copy_ between overlapping views of one storage goes through a temporary", function()
  local x = bl.from({{1, 2}, {3, 4}})
  x:copy_(x:t())
  T.near(x:totable(), {1, 3, 2, 4}, 0)   -- totable is flat
  local v = bl.from({1, 2, 3, 4, 5})
  v:narrow(1, 2, 4):copy_(v:narrow(1, 1, 4))   -- shift right by one
  T.near(v:totable(), {1, 1, 2, 3, 4}, 0)
  local w = bl.from({1, 2, 3})
  w:copy_(w)   -- the same elements: nothing to protect
  T.near(w:totable(), {1, 2, 3}, 0)
end)

T.test("seeds and offsets are integers in [0, 2^64); integer tensors refuse values they cannot hold", function()
  for _, s in ipairs({-1, 0 / 0, 2 ^ 80, 1.5, 1 / 0}) do
    T.raises(function() return bl.randn({3}, {seed = s}) end, "randn: seed must be an integer from 0 to 2^64-1")
    T.raises(function() return bl.Generator(s) end, "Generator: seed must be an integer")
  end
  T.raises(function() return bl.rand({3}, {seed = 1, offset = -2}) end, "rand: offset must be an integer")
  T.near(bl.randn({3}, {seed = 2 ^ 60}):totable(), bl.randn({3}, {seed = 2 ^ 60}):totable(), 0)
  T.truthy(bl.randn({3}, {seed = 2 ^ 60}):totable()[1] ~= bl.randn({3}, {seed = 2 ^ 60 + 256}):totable()[1])
  T.raises(function() return bl.from(2 ^ 63, {dtype = "i64"}) end, "fill: value 9.2233720368547758e+18 does not fit")
  T.raises(function() return bl.from({1, 2 ^ 63}, {dtype = "i64"}) end, "(element 1) does not fit dtype i64")
  T.raises(function() return bl.from({0 / 0}, {dtype = "i32"}) end, "does not fit dtype i32")
  T.raises(function() return bl.from({300}, {dtype = "u8"}) end, "does not fit dtype u8 (0 to 255)")
  T.near(bl.from({-2 ^ 63, 2 ^ 62}, {dtype = "i64"}):totable(), {-2 ^ 63, 2 ^ 62}, 0)
end)

T.test("printing", function()
  local s = tostring(bl.from({{1, -2.5}, {3, 4}}))
  T.truthy(s:find("shape=[2,2], dtype=f32, device=cpu", 1, true), s)
  T.truthy(s:find("-2.5000", 1, true), s)
  local big = tostring(bl.zeros({100, 100}))
  T.truthy(big:find("...", 1, true) and #big < 2000, "large tensors are summarised")
  T.truthy(tostring(bl.from({1, 2}, {dtype = "i64"})):find("[1, 2]", 1, true))
end)

T.test("memory is released", function()
  collectgarbage(); collectgarbage()
  local before = bl.bytes_in_use()
  do
    local x = bl.zeros({1024, 1024})
    T.eq(bl.bytes_in_use() - before, 4 * 1024 * 1024)
    x:free()
    T.eq(bl.bytes_in_use(), before)
  end
  for _ = 1, 50 do local _ = bl.zeros({256, 256}) end
  collectgarbage(); collectgarbage()
  T.eq(bl.bytes_in_use(), before)
end)

T.run()
