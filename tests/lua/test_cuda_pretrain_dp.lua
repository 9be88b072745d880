-- recipes/pretrain.lua data parallel on cuda: 2 ranks over the emulated NCCL
-- (bucketed all-reduce overlapped with backward) against 1 rank with
-- accumulation 2 on the tiny corpus of pretrain_fixture; a bf16 reduction
-- stays close. Split from test_cuda_pretrain so the two run side by side.
-- Needs a CUDA device (the emulated one in CI); skipped otherwise.
local T = require "testing"
local fixture = require "pretrain_fixture"
local fx = fixture.make(T, { need_cuda = true })
local tmp, losses, run, rel = fx.tmp, fx.losses, fx.run, fixture.rel

-- largest difference of two saved models, relative to each tensor's scale (the key bias has a zero true
-- gradient, so its values are rounding noise: measured against a floor)
local function weights_diff(da, db)
  local st = require "bertlua.io.safetensors"
  local wa, wb = st.load(da .. "/phase1/model.safetensors"), st.load(db .. "/phase1/model.safetensors")
  local worst = 0
  for name, t in pairs(wa) do
    local d = (t - wb[name]):abs():max() / math.max(t:abs():max(), 1e-3)
    if d > worst then worst = d end
  end
  return worst
end

-- a half-precision reduction (run `half` against `full`, both 2 ranks): the step-1 loss (before any update) is
-- the same, later losses stay within 1e-2, and the weights differ (the half sum was really used)
local function half_reduction_close(full, half, what, min_weight_diff)
  local b, h = losses(tmp .. "/" .. full), losses(tmp .. "/" .. half)
  T.eq(h[1], b[1], "step 1")
  for s = 2, 4 do
    T.truthy(rel(h[s], b[s]) <= 1e-2, ("step %d: %s reduction %.9g, fp32 %.9g"):format(s, what, h[s], b[s]))
  end
  T.truthy(weights_diff(tmp .. "/" .. full, tmp .. "/" .. half) > min_weight_diff,
    "the " .. what .. " reduction changed nothing")
end

-- The 2-rank runs reduce in buckets of 0.02 MB (5,242 floats: ~25 buckets for this model), most launched
-- by the encoder layers' backward on the communication stream while backward goes on.
T.test("2 ranks on cuda (NCCL, bucketed, overlapped) equal 1 rank with accumulation 2", function()
  T.mpi_ranks_on_gpus(2)
  local args = "--batch1=16 --micro-batch=8 --steps1=4 --device=cuda --bucket-mb=0.02"
  local mpirun = "mpirun -np 2 --oversubscribe --allow-run-as-root "
  run("acc2", args)
  run("two", args, mpirun)
  local a, b = losses(tmp .. "/acc2"), losses(tmp .. "/two")
  for s = 1, 4 do
    T.truthy(rel(b[s], a[s]) <= 1e-6, ("step %d: 2 ranks %.9g, 1 rank x 2 %.9g"):format(s, b[s], a[s]))
  end
  local w = weights_diff(tmp .. "/acc2", tmp .. "/two")
  T.truthy(w <= 1e-6, ("final weights: largest relative difference %.3g"):format(w))
  -- bf16 reduction: the gradients differ by <= 3 * 2^-9 of their magnitude (bl_dist.h), the step-1
  -- loss (before any update) not at all; LAMB's normalised updates keep later losses close
  run("two_bf16", args .. " --allreduce-dtype=bf16", mpirun)
  half_reduction_close("two", "two_bf16", "bf16", 1e-6)
end)

-- fp16 training, its loss-scaled gradients summed in fp16 (NVIDIA's allreduce_post_accumulation_fp16): the
-- step-1 loss equal to the fp32 reduction's, the later ones close (fp16 keeps 3 more bits than bf16)
T.test("--allreduce-dtype=fp16 with --precision=fp16 on cuda stays close to the fp32 reduction", function()
  T.mpi_ranks_on_gpus(2)
  local args = "--batch1=16 --micro-batch=8 --steps1=4 --device=cuda --bucket-mb=0.02 --precision=fp16"
  local mpirun = "mpirun -np 2 --oversubscribe --allow-run-as-root "
  run("two_fp16", args, mpirun)
  run("two_fp16_ar16", args .. " --allreduce-dtype=fp16", mpirun)
  half_reduction_close("two_fp16", "two_fp16_ar16", "fp16", 1e-7)
end)

T.run()
