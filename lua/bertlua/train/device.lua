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
local bl = require "bertlua"

local M = {}

M.OPTION = { "device", "auto",
  "cpu, cuda (= cuda:<local rank>), cuda:N or auto (cuda:<local rank> when a GPU is visible, else cpu)" }

-- pick(spec, recipe) -> -1 for the CPU or the cuda device index; a clear error
-- naming the recipe when the device cannot be used.
function M.pick(spec, recipe)
  if spec == nil or spec == "auto" then spec = os.getenv("BERTLUA_DEVICE") or "auto" end
  local n = bl.cuda_device_count()
  if (spec == nil or spec == "auto") and n == 0 then return -1 end
  if spec == nil or spec == "auto" or (spec == "cuda" and n > 0) then return bl.local_rank() % n end
  local ok, dev = pcall(bl.device_of, spec, recipe)
  if not ok then error(("%s: --device must be cpu, cuda, cuda:N or auto, got '%s'"):format(recipe, spec), 0) end
  if dev < 0 then return -1 end
  if not bl.cuda_compiled() then
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
  if dev >= 0 then bl.cuda_set_tf32(opt.precision == "tf32") end
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
  local what = dev < 0 and ("cpu (%d threads)"):format(bl.num_threads())
    or ("%s (%s)"):format(M.name(dev), bl.cuda_device_name(dev) or "unknown GPU")
  return ("device %s, precision %s"):format(what, precision or "fp32")
end

-- Fields the pre-training head reads on the host (it selects the masked positions there and uploads the
-- selection itself): moving them to the device would only cost a copy there and a synchronised one back.
local HOST_FIELDS = { masked_lm_positions = true, masked_lm_labels = true }

-- batch_to(batch, dev[, keep]): a table of the batch's fields with its tensors on dev (-1: the CPU), others
-- unchanged. With keep (a table the caller holds across steps) a CPU batch goes to the device into buffers kept
-- there per field and reused while shape and dtype stay the same: no device allocation per step, and the
-- upload is queued on the device's stream without a host wait (bl_dev_memcpy). The next call overwrites them.
function M.batch_to(batch, dev, keep)
  local out = {}
  for k, v in pairs(batch) do
    if not bl.is_tensor(v) then out[k] = v
    elseif keep and dev >= 0 and v:device() == "cpu" then
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

return M
