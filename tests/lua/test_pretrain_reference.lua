-- The PyTorch reference of NVIDIA's run_pretraining.py (tools/peers/): its shard reader gives the C reader's
-- bytes, and recipes/pretrain.lua agrees with it step by step (fp32, dropout off, accumulation 2, phase 2 from
-- phase 1's weights with a fresh optimizer) through tools/pretrain_vs_reference.lua.
local T = require "testing"
local shell = require "bertlua.util.shell"
local shards = require "bertlua.data.shards"
local ffi = require "ffi"

local PY = os.getenv("BL_PYTHON") or "/usr/bin/python3"
local _, has_torch = shell.read({ PY, "-c", "import torch, transformers" }, { stderr = "/dev/null" })
if not has_torch then T.skip_all(PY .. " cannot import torch and transformers (scripts/requirements-test.txt)") end

local fx = require("pretrain_fixture").make(T)
local tmp = fx.tmp
-- phase-2 data: longer sequences, more predictions, from the same text
fx.must(("%s recipes/create_pretraining_data.lua --input=%s/shards --vocab=%s/vocab.txt --output=%s/data2 " ..
  "--max-seq-length=64 --max-predictions=10 --dupe-factor=1"):format(fx.exe, tmp, tmp, tmp))

-- the C reader's records as tools/peers/blshard.py's canonical dump lines
local function c_dump(path)
  local s = shards.open_shard(path)
  local w = s.tb == 2 and "const uint16_t*" or "const uint32_t*"
  local lines = {}
  for k = 0, s.n - 1 do
    local L, len_a, m, nsp, tok, pos, lab = s:record(k)
    local t, p, l = {}, {}, {}
    tok, lab = ffi.cast(w, tok), ffi.cast(w, lab)
    for i = 0, L - 1 do t[#t + 1] = tostring(tok[i]) end
    for i = 0, m - 1 do p[#p + 1], l[#l + 1] = tostring(pos[i]), tostring(lab[i]) end
    lines[#lines + 1] = ("%d %d %d %d|%s|%s|%s"):format(L, len_a, m, nsp, table.concat(t, " "), table.concat(p, " "),
      table.concat(l, " "))
  end
  s:close()
  return table.concat(lines, "\n") .. "\n"
end

T.test("tools/peers/blshard.py reads every shard as the C reader does, byte for byte", function()
  local n = 0
  for _, dir in ipairs { fx.data, tmp .. "/data2" } do
    for _, path in ipairs(shards.list_shards(dir)) do
      local out, ok = shell.read({ PY, "tools/peers/blshard.py", "dump", path })
      T.truthy(ok, out)
      local want = c_dump(path)
      T.truthy(#want > 100, path .. ": a shard with records")
      T.eq(out, want, path)
      n = n + 1
    end
  end
  T.eq(n, 6, "train and test shards of both phases")
end)

T.test("blshard.py refuses a damaged shard in one line naming it", function()
  local src = shards.list_shards(fx.data, "test")[1]
  local bytes = T.slurp(src)
  local bad = tmp .. "/damaged.blshard"
  T.write_file(bad, bytes:sub(1, -2) .. string.char((bytes:byte(-1) + 1) % 256))
  local out, ok = shell.read({ PY, "tools/peers/blshard.py", "dump", bad }, { stderr = "stdout" })
  T.truthy(not ok, out)
  T.eq(out, "blshard: shard " .. bad .. ": checksum mismatch (the file is damaged)\n")
  T.write_file(bad, bytes:sub(1, 40))
  out, ok = shell.read({ PY, "tools/peers/blshard.py", "dump", bad }, { stderr = "stdout" })
  T.truthy(not ok and out:find("shorter than the 80-byte header", 1, true), out)
end)

-- tools/pretrain_vs_reference.lua on the tiny model: 14 + 6 steps of 2 micro-batches of 8; the tool fails when a
-- bound is exceeded (extra: more options)
local function compare(name, extra)
  local argv = { fx.exe, "tools/pretrain_vs_reference.lua", "--model=" .. tmp .. "/cfg.json",
    "--vocab=" .. tmp .. "/vocab.txt", "--data-phase1=" .. fx.data, "--data-phase2=" .. tmp .. "/data2",
    "--output=" .. tmp .. "/" .. name, "--seq1=32", "--pred1=5", "--seq2=64", "--pred2=10", "--batch1=16",
    "--batch2=16", "--micro-batch=8", "--steps1=14", "--steps2=6", "--lr1=1e-2", "--lr2=5e-3", "--python=" .. PY,
    extra or {} }
  return shell.read(argv, { stderr = "stdout" })
end

T.test("pretrain.lua equals the reference step by step: losses, gradient norms, weights after each phase", function()
  local out, ok = compare("agree")
  T.truthy(ok, out)
  T.truthy(out:find("within the bounds", 1, true), out)
  local s = require("cjson").decode(T.slurp(tmp .. "/agree/summary.json"))
  for p = 1, 2 do
    local ph = s.phases[p]
    T.eq(ph.steps, p == 1 and 14 or 6)
    T.truthy(ph.loss_rel <= 1e-5 and ph.grad_norm_rel <= 1e-5, ("phase %d: loss %g, grad norm %g relative"):format(p,
      ph.loss_rel, ph.grad_norm_rel))
    T.truthy(ph.weight_abs <= 1e-4, ("phase %d: weights differ by %g"):format(p, ph.weight_abs))
  end
  -- the micro-batches the reference replayed are the ones bertlua trained on: 2 per step
  local n = 0
  for _ in pairs(require("bertlua.util.fs").list_dir(tmp .. "/agree/batches/phase1", "%.safetensors$")) do n = n + 1 end
  T.eq(n, 28)
  -- --rerun=none compares the two runs already there again
  out, ok = compare("agree", { "--rerun=none" })
  T.truthy(ok and out:find("within the bounds", 1, true) and not out:find("reference: '", 1, true), out)
end)

T.test("a difference is reported: the reference with a linear decay (power 1) is outside the bounds", function()
  local out, ok = compare("differ", { "--reference-args=--power=1" })
  T.truthy(not ok, out)
  T.truthy(out:find("pretrain_vs_reference: phase 1,2 outside the bounds", 1, true), out)
end)

T.run()
