-- bertlua.train.device: the --device option of the recipes.
--
--   local device = require "bertlua.train.device"
--   local dev, line = device.setup(opt, "squad")   -- -1 (cpu) or N (cuda:N); the startup line
--   device.model_to(model, dev)
--   batch = device.batch_to(batch, dev)
--
-- "auto" (the recipes' default) is cuda:<local rank> when this build sees a
-- GPU, else the CPU; "cuda" is cuda:<local rank>: under mpirun/srun each rank
-- takes the GPU of its local rank, as NVIDIA's launcher does. "cuda:N" is
-- that device on every rank. The environment variable BERTLUA_DEVICE, when
-- set, replaces "auto" (the test suite sets it to cpu: its recipe tests run
-- on the CPU on any machine unless they name a --device).
local bl = require "bertlua.tensor"
local runtime = require "bertlua.runtime"
local core = require "bertlua.core"
local C, check = core.C, core.check

local M = {}

M.OPTION = { "device", "auto",
  "cpu, cuda (= cuda:<local rank>), cuda:N or auto (cuda:<local rank> when a GPU is visible, else cpu)" }

-- pick(spec, recipe) -> -1 for the CPU or the cuda device index; a clear error
-- naming the recipe when the device cannot be used.
function M.pick(spec, recipe)
  if spec == nil or spec == "auto" then spec = os.getenv("BERTLUA_DEVICE") or "auto" end
  local n = runtime.cuda_device_count()
  if (spec == nil or spec == "auto") and n == 0 then return -1 end
  if spec == nil or spec == "auto" or (spec == "cuda" and n > 0) then return runtime.local_rank() % n end
  local ok, dev = pcall(bl.device_of, spec, recipe)
  if not ok then error(("%s: --device must be cpu, cuda, cuda:N or auto, got '%s'"):format(recipe, spec), 0) end
  if dev < 0 then return -1 end
  if not runtime.cuda_compiled() then
    error(("%s: --device=%s, but this bertlua was built without CUDA"):format(recipe, spec), 0)
  end
  if dev >= n then
    error(("%s: --device=%s, but %d CUDA device(s) are visible"):format(recipe, spec, n), 0)
  end
  return dev
end

-- setup(opt, recipe) -> dev, startup line: picks opt.device and sets TF32 GEMMs
-- on a GPU only for --precision=tf32 (fp32 stays exact f32, as on the CPU).
function M.setup(opt, recipe)
  local dev = M.pick(opt.device, recipe)
  if dev >= 0 then runtime.cuda_set_tf32(opt.precision == "tf32") end
  return dev, ("%s: %s"):format(recipe, M.describe(dev, opt.precision))
end

-- model_to(model, dev): the model's flat buffers on dev (nothing to do on the CPU); returns the model.
function M.model_to(model, dev)
  if dev >= 0 then model:to{ device = dev } end
  return model
end

-- inference_model(model, dev, precision): the model ready for prediction in
-- precision: on a GPU its compute copy in bf16/f16 (half activations, f32
-- accumulation); on the CPU its weights rounded to bf16/f16 once
-- (bertlua.train.amp.round_weights: half storage emulated). Returns the compute dtype or nil.
function M.inference_model(model, dev, precision)
  local amp = require "bertlua.train.amp"
  if dev < 0 then return amp.round_weights(model, precision) end
  local dt = amp.storage_dtype(precision)
  model:to{ device = dev, dtype = dt or "f32" }
  return dt
end

-- name(dev) -> "cpu" or "cuda:N"
function M.name(dev) return dev >= 0 and ("cuda:" .. dev) or "cpu" end

-- describe(dev, precision) -> "device cuda:0 (NVIDIA H100 (sm_90, 79.6 GiB)), precision bf16"
function M.describe(dev, precision)
  local what = dev < 0 and ("cpu (%d threads)"):format(runtime.num_threads())
    or ("%s (%s)"):format(M.name(dev), runtime.cuda_device_name(dev) or "unknown GPU")
  return ("device %s, precision %s"):format(what, precision or "fp32")
end

-- Fields the pre-training head reads on the host (it selects the masked positions there and uploads the
-- selection itself): moving them to the device would only cost a copy there and a synchronised one back.
-- The NSP labels too: the head counts them there (bertlua.bert.heads, forward with stats).
local HOST_FIELDS = { masked_lm_positions = true, masked_lm_labels = true, next_sentence_labels = true }

-- batch_to(batch, dev[, keep]): a table of the batch's fields with its tensors on dev (-1: the CPU), others
-- unchanged. With keep (a table the caller holds across steps) a CPU batch goes to the device into buffers kept
-- there per field and reused while shape and dtype stay the same: no device allocation per step, and the
-- upload is queued on the device's stream without a host wait (bl_dev_memcpy). The next call overwrites them.
-- With fixed, a batch already on the device is copied into the kept buffers too (a captured CUDA graph reads its
-- batch from the same addresses every step; bertlua.train.step).
function M.batch_to(batch, dev, keep, fixed)
  local out = {}
  for k, v in pairs(batch) do
    if not bl.is_tensor(v) then out[k] = v
    elseif keep and dev >= 0 and (fixed or v:device() == "cpu") then
      if HOST_FIELDS[k] then out[k] = v
      else
        local d = keep[k]
        if not (d and d:dtype() == v:dtype() and bl.shape_str(d:shape()) == bl.shape_str(v:shape())) then
          if d then d:free() end
          d = v:empty_like{ device = dev }
          keep[k] = d
        end
        out[k] = d:copy_(v:is_contiguous() and v or v:contiguous())
      end
    else out[k] = v:to{ device = dev } end
  end
  return out
end

-- defer_checks(dev[, on]): on a GPU, index checks (embedding ids, MLM targets) stop waiting for the device; their
-- errors come from StepStats:read (bl_cuda_defer_checks in bl_base.h). on = false turns them back to immediate.
-- No-op on the CPU, whose checks cost no wait.
function M.defer_checks(dev, on)
  if dev >= 0 then check(C.bl_cuda_defer_checks(dev, on == false and 0 or 1)) end
end

-- StepStats(dev[, nlosses, ncounts]): the sums a training step adds on the device: losses f64 [nlosses] and counts
-- i64 [ncounts]; the defaults are those of pre-training (BertForPreTraining:forward(batch, stats)): losses
-- {total, mlm, nsp} and counts {mlm correct, mlm counted, nsp correct, nsp counted}.
--   stats:zero()                       -- queued, at the start of a step
--   local v = stats:read(amp_state)    -- when logging: {losses = {...}, counts = {...}, amp = {...}}
-- read packs everything (and the deferred-check flag) into one buffer and reads it with one wait; a deferred
-- index error is raised there.
local Stats = {}
Stats.__index = Stats

function M.StepStats(dev, nlosses, ncounts)
  local on = dev >= 0 and dev or nil
  nlosses, ncounts = nlosses or 3, ncounts or 4
  return setmetatable({ dev = dev, nl = nlosses, nc = ncounts,
    losses = bl.zeros({ nlosses }, { dtype = "f64", device = on }),
    counts = bl.zeros({ math.max(ncounts, 1) }, { dtype = "i64", device = on }),
    buf = bl.zeros({ nlosses + ncounts + 1 + C.BL_AMP_STATE_LEN }, { dtype = "f64", device = on }) }, Stats)
end

function Stats:zero()
  self.losses:zero_()
  self.counts:zero_()
end

function Stats:read(amp_state)
  local na = amp_state and amp_state:numel() or 0
  local nl, nc = self.nl, self.nc
  local flag = nl + nc + 1   -- 1-based slot of the deferred-check flag
  local n = flag + na
  if not self.buf or self.buf:numel() ~= n then
    self.buf = bl.zeros({ n }, { dtype = "f64", device = self.dev >= 0 and self.dev or nil })
  end
  local b = self.buf
  b:narrow(1, 1, nl):copy_(self.losses)
  if nc > 0 then b:narrow(1, nl + 1, nc):copy_(self.counts:narrow(1, 1, nc)) end
  if na > 0 then b:narrow(1, flag + 1, na):copy_(amp_state) end
  if self.dev >= 0 then check(C.bl_cuda_deferred_pending(self.dev, b:narrow(1, flag, 1))) end
  local v = b:totable()   -- the one wait
  if v[flag] ~= 0 then check(C.bl_cuda_check_deferred(self.dev)) end
  local losses, counts, amp = {}, {}, {}
  for i = 1, nl do losses[i] = v[i] end
  for i = 1, nc do counts[i] = v[nl + i] end
  for i = 1, na do amp[i] = v[flag + i] end
  return { losses = losses, counts = counts, amp = amp }
end

return M
