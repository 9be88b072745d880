-- recipes/pretrain.lua data parallel on cuda with gradient accumulation and bf16 training: the bucketed all-reduce
-- overlaps the backward of the last micro-batch (each encoder layer's buckets are launched once its gradients are
-- final: the earlier micro-batches' sum added), where it used to wait for the whole backward. On cuda bf16 trains
-- on the half compute copy, whose gradients are f32 (the cpu's emulation would round them to bf16 there).
--   * the overlap as the run saw it: the log's overlapped_buckets (buckets launched before backward returned) is
--     > 0 on every step with 0.02 MB buckets, and 0 with one bucket for the whole model (nothing completes it
--     before backward ends: the old order); the two runs give the same losses and weights bit for bit (the sums
--     are elementwise, only their timing moved);
--   * 2 ranks x accumulation 2 against 1 rank x accumulation 4 (same global batch and data): the f32 gradients are
--     summed in another order (the emulation, rounding each rank's partial sum to bf16, made them differ by up to
--     2^-8 of their magnitude, the bound below was made for that). Step 1's loss (before any update) is equal;
--     later losses move by about that fraction of the loss change a step makes: bound 1e-5. Weights: LAMB/Adam
--     updates are normalised, an element moves by up to lr (1e-2 here) per step whatever its gradient, and a
--     perturbed gradient moves it by the perturbation's share of that: measured 2.6e-4 (a LayerNorm bias after
--     3 steps), bound 1e-3 absolute, a tenth of one step (an unreduced or twice-added range moves far more).
-- Needs a CUDA device (the emulated one in CI) and mpirun; skipped otherwise.
local T = require "testing"
local fixture = require "pretrain_fixture"
local fx = fixture.make(T, { need_cuda = true })
local tmp, losses, run = fx.tmp, fx.losses, fx.run
local LOSS_TOL, WEIGHT_TOL = 1e-5, 1e-3

-- largest absolute difference of two saved models
local function weights_diff(da, db)
  local st = require "bertlua.io.safetensors"
  local wa, wb = st.load(da .. "/phase1/model.safetensors"), st.load(db .. "/phase1/model.safetensors")
  local worst = 0
  for name, t in pairs(wa) do worst = math.max(worst, (t - wb[name]):abs():max()) end
  return worst
end

T.test("2 ranks x accumulation 2, bf16: overlapped, the same bits as reduced after backward", function()
  if not T.sh("command -v mpirun"):find("/", 1, true) then T.skip("mpirun not installed") end
  local args = "--batch1=32 --micro-batch=8 --steps1=3 --device=cuda --precision=bf16 --checkpoint-interval=0 " ..
    "--eval-batches=1"
  local mpirun = "mpirun -np 2 --oversubscribe --allow-run-as-root "
  run("acc4", args)
  run("two", args .. " --bucket-mb=0.02", mpirun)
  run("one_bucket", args .. " --bucket-mb=100", mpirun)   -- one bucket: nothing completes it before backward ends
  for _, r in ipairs(fx.records(tmp .. "/two")) do
    T.truthy((r.overlapped_buckets or 0) > 0, ("step %d: %s buckets launched during backward"):format(r.step,
      tostring(r.overlapped_buckets)))
  end
  for _, r in ipairs(fx.records(tmp .. "/one_bucket")) do T.eq(r.overlapped_buckets, 0, "one bucket: overlapped") end
  local a, b, c = losses(tmp .. "/acc4"), losses(tmp .. "/two"), losses(tmp .. "/one_bucket")
  for s = 1, 3 do T.eq(b[s], c[s], "step " .. s .. ": overlapped and after-backward losses") end
  T.eq(weights_diff(tmp .. "/two", tmp .. "/one_bucket"), 0, "overlapped and after-backward weights")
  -- against one rank: bf16 rounding of each rank's partial sum (see the header)
  T.eq(b[1], a[1], "step 1 loss")
  for s = 2, 3 do
    T.truthy(math.abs(b[s] - a[s]) <= LOSS_TOL * math.abs(a[s]), ("step %d: 2 ranks %.9g, 1 rank x 4 %.9g"):format(s,
      b[s], a[s]))
  end
  local w = weights_diff(tmp .. "/acc4", tmp .. "/two")
  T.truthy(w <= WEIGHT_TOL, ("final weights: largest difference %.3g"):format(w))
end)

T.run()
