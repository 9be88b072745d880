-- Printing tensors (tostring), a method of bertlua.tensor (which installs it).
local core = require "bertlua.core"
local ffi, C, check = core.ffi, core.C, core.check

-- install(T): T holds the tensor module (M), its methods and the helpers of
-- bertlua.tensor this part uses.
return function(T)
  local methods = T.methods
  local DTNAME, is_float, shape_str, device_name, dbl1 = T.DTNAME, T.is_float, T.shape_str, T.device_name, T.dbl1

  -- printing -----------------------------------------------------------------
  local function fmt_number(v, dt)
    if not is_float(dt) then return string.format("%d", v) end
    if v ~= v then return "nan" end
    if v == math.huge then return "inf" elseif v == -math.huge then return "-inf" end
    return string.format("%.4f", v)
  end

  function methods.tostring(t)
    if t.storage_ == nil then return "tensor(<freed>)" end
    local meta = string.format("shape=%s, dtype=%s, device=%s", shape_str(t:shape()), DTNAME[t.dtype_],
      device_name(t.device_))
    local src = t.device_ >= 0 and t:to("cpu") or t
    local shape = t:shape()
    local big = t:numel() > 1000
    local edge = 3
    local function idx_list(n)
      if not big or n <= 2 * edge then local r = {} for i = 1, n do r[i] = i end return r end
      local r = {}
      for i = 1, edge do r[#r + 1] = i end
      r[#r + 1] = false
      for i = n - edge + 1, n do r[#r + 1] = i end
      return r
    end
    if #shape == 0 then return "tensor(" .. fmt_number(src:item(), t.dtype_) .. ", " .. meta .. ")" end
    -- collect strings to align columns
    local cells, width = {}, 0
    local idx = ffi.new("int64_t[8]")
    local function val(ix)
      for i = 1, #ix do idx[i - 1] = ix[i] - 1 end
      check(C.bl_tensor_get(src, idx, dbl1))
      return fmt_number(dbl1[0], t.dtype_)
    end
    local function scan(ix, d)
      for _, i in ipairs(idx_list(shape[d])) do
        if i then
          ix[d] = i
          if d == #shape then
            local s = val(ix); cells[#cells + 1] = s; if #s > width then width = #s end
          else scan(ix, d + 1) end
        end
      end
    end
    if t:numel() > 0 then scan({}, 1) end
    local function render(ix, d, indent)
      local parts = {}
      for _, i in ipairs(idx_list(shape[d])) do
        if not i then parts[#parts + 1] = "..."
        else
          ix[d] = i
          if d == #shape then
            local s = val(ix)
            parts[#parts + 1] = string.rep(" ", width - #s) .. s
          else
            parts[#parts + 1] = render(ix, d + 1, indent .. " ")
          end
        end
      end
      local sep = d == #shape and ", " or (",\n" .. string.rep("\n", #shape - d - 1) .. indent .. " ")
      return "[" .. table.concat(parts, sep) .. "]"
    end
    local body = t:numel() == 0 and "[]" or render({}, 1, "       ")
    return "tensor(" .. body .. ",\n       " .. meta .. ")"
  end
end
