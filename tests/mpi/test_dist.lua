-- Under `mpirun -np 2`: rank/size visible from Lua, all-reduce and broadcast.
local T = require "testing"
local bl = require "bertlua"

T.test("rank and size", function()
  T.eq(bl.world_size(), 2)
  T.truthy(bl.rank() == 0 or bl.rank() == 1)
end)

T.test("allreduce and broadcast of CPU tensors", function()
  local C = require("bertlua.core").C   -- the C API itself is under test
  local t = bl.full({5}, bl.rank() + 1, {dtype = "f32"})
  assert(C.bl_dist_allreduce_sum(t) == 0)
  T.near(t:tolist(), {3, 3, 3, 3, 3})
  local d = bl.full({3}, bl.rank() == 1 and 7 or 0, {dtype = "f64"})
  assert(C.bl_dist_broadcast(d, 1) == 0)
  T.near(d:tolist(), {7, 7, 7})
  local h = bl.zeros({2}, {dtype = "f16"})
  T.eq(C.bl_dist_allreduce_sum(h), -1)
  T.truthy(require("ffi").string(C.bl_last_error()):find("f16 is not supported", 1, true))
end)

T.test("bucketed all-reduce mean and number sums", function()
  local dist = require "bertlua.train.dist"
  local t = bl.arange(10, {dtype = "f32"}):add(bl.rank() * 10)
  dist.all_reduce_mean(t, {bucket_elems = 3})
  T.near(t:tolist(), {5, 6, 7, 8, 9, 10, 11, 12, 13, 14})
  local s = dist.sum_numbers({bl.rank() + 1, 1})
  T.near(s, {3, 2})
end)

T.test("agree: equal fingerprints pass; a difference ends both ranks naming it and both values", function()
  local dist = require "bertlua.train.dist"
  local fingerprint = require "bertlua.train.fingerprint"
  local dir = "/tmp/bl_agree_" .. os.getenv("OMPI_COMM_WORLD_SIZE") .. "_" .. bl.rank()
  os.execute("rm -rf " .. dir .. " && mkdir -p " .. dir .. "/data")
  T.write_file(dir .. "/vocab.txt", "[PAD]\n[UNK]\nthe\n")
  T.write_file(dir .. "/data/train_0.blshard", "x")
  local o = { options = { seed = 7, output = "runs/x", _positional = { "ignored" } },
    config = { hidden_size = 32 }, files = { { "--vocab", dir .. "/vocab.txt" } },
    data = { { "--data", dir .. "/data" } } }
  dist.agree("t", fingerprint.entries(o))   -- the same on both ranks (paths differ, contents do not)
  local function differ(patch, words)
    local e = fingerprint.entries(o)
    if bl.rank() == 1 then patch(e) end
    T.raises(function() dist.agree("t", e) end, words)
  end
  differ(function(e) e[2][2] = "8" end,
    "t: the ranks disagree: --seed is 7 on rank 0 and 8 on rank 1; start every rank with the same options")
  T.write_file(dir .. "/vocab.txt", bl.rank() == 1 and "[PAD]\n[UNK]\nthe\nriver\n" or "[PAD]\n[UNK]\nthe\n")
  T.raises(function() dist.agree("t", fingerprint.entries(o)) end, "--vocab (content) is checksum ")
  T.write_file(dir .. "/vocab.txt", "[PAD]\n[UNK]\nthe\n")
  if bl.rank() == 1 then T.write_file(dir .. "/data/train_1.blshard", "y") end
  T.raises(function() dist.agree("t", fingerprint.entries(o)) end, "--data (shards) is digest ")
  os.execute("rm -rf " .. dir)
end)

-- last: it leaves a timed-out request behind (rank 1 joins it late, so both still finish)
T.test("a collective that does not complete within BL_DIST_TIMEOUT fails naming it", function()
  local ffi = require "ffi"
  pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
  ffi.C.setenv("BL_DIST_TIMEOUT", "1", 1)
  local dist = require "bertlua.train.dist"
  if bl.rank() == 1 then
    os.execute("sleep 3")
    dist.barrier()
  else
    local t0 = os.time()
    T.raises(function() dist.barrier() end, "barrier: the MPI barrier did not complete within 1 s on rank 0: "
      .. "another rank died, was stopped or is stuck")
    T.truthy(os.time() - t0 <= 3, "timed out after about 1 s")
  end
  ffi.C.setenv("BL_DIST_TIMEOUT", "600", 1)
end)

T.run()
