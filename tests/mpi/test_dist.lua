-- Under `mpirun -np 2`: rank/size visible from Lua, all-reduce and broadcast.
local T = require "testing"
local bl = require "bertlua"

T.test("rank and size", function()
  T.eq(bl.world_size(), 2)
  T.truthy(bl.rank() == 0 or bl.rank() == 1)
end)

T.test("allreduce and broadcast of CPU tensors", function()
  local C = bl.C
  local t = bl.full({5}, bl.rank() + 1, {dtype = "f32"})
  assert(C.bl_dist_allreduce_sum(t) == 0)
  T.near(t:tolist(), {3, 3, 3, 3, 3})
  local d = bl.full({3}, bl.rank() == 1 and 7 or 0, {dtype = "f64"})
  assert(C.bl_dist_broadcast(d, 1) == 0)
  T.near(d:tolist(), {7, 7, 7})
  local h = bl.zeros({2}, {dtype = "f16"})
  T.eq(C.bl_dist_allreduce_sum(h), -1)
  T.truthy(bl.ffi.string(C.bl_last_error()):find("f16 is not supported", 1, true))
end)

T.test("bucketed all-reduce mean and number sums", function()
  local dist = require "bertlua.train.dist"
  local t = bl.arange(10, {dtype = "f32"}):add(bl.rank() * 10)
  dist.all_reduce_mean(t, {bucket_elems = 3})
  T.near(t:tolist(), {5, 6, 7, 8, 9, 10, 11, 12, 13, 14})
  local s = dist.sum_numbers({bl.rank() + 1, 1})
  T.near(s, {3, 2})
end)

T.run()
