-- bertlua.nn.buffer: the reusable tensors of modules and criteria.
--
-- buf(self, key, shape[, dtype]) returns self[key], reallocated only when the
-- shape, dtype or device changes. On the owner's device (`self.device`, nil =
-- CPU); dtype defaults to the owner's activation dtype (`self.act_dtype`, nil =
-- f32, see Module:to). The keys are recorded (self._buf_keys) so that
-- nn.move_buffers can hand a module's buffers to a twin module.
local bl = require "bertlua.tensor"

local function same_shape(t, shape)
  if t.ndim_ ~= #shape then return false end
  for i = 1, #shape do if t.shape_[i - 1] ~= shape[i] then return false end end
  return true
end

local function buf(self, key, shape, dtype)
  local t = self[key]
  dtype = dtype or self.act_dtype or "f32"
  local dt, dev = bl.dtype_of(dtype), self.device or -1
  if t ~= nil and t.storage_ ~= nil and t.dtype_ == dt and t.device_ == dev and same_shape(t, shape) then return t end
  if t ~= nil then t:free() end
  t = bl.empty(shape, { dtype = dtype, device = self.device })
  self[key] = t
  local keys = self._buf_keys
  if not keys then keys = {}; self._buf_keys = keys end
  keys[key] = true
  return t
end

return buf
