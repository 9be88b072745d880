-- bertlua.core: loads the C API into LuaJIT's FFI and turns C status codes
-- into Lua errors. Every other module reaches C through `core.C`.
local ffi = require "ffi"

local M = {}

if not pcall(function() return ffi.C.bl_cdef_text end) then
  ffi.cdef "const char *bl_cdef_text(void);"
end
-- The struct fields of bl_tensor get a trailing underscore on the Lua side
-- (same layout, other names) so that methods such as t:shape() and t:dtype()
-- do not collide with fields: LuaJIT looks up struct fields before __index.
local text = ffi.string(ffi.C.bl_cdef_text())
text = text:gsub("(typedef struct bl_tensor%s*{)(.-)(}%s*bl_tensor;)", function(head, body, tail)
  body = body:gsub("([%w_]+)(%[?%d*%]?;)", function(name, rest)
    if name:match("_$") then return name .. rest end
    return name .. "_" .. rest
  end)
  return head .. body .. tail
end)
local ok, err = pcall(ffi.cdef, text)
if not ok then error("bertlua.core: cannot load the C declarations: " .. tostring(err)) end

M.ffi = ffi
M.C = ffi.C
local C = ffi.C

-- Raise the C side's error message as a Lua error. It already names the
-- operation, file or shape and what was wrong, so it carries no Lua position:
-- the host prints it as one line (a traceback with --debug).
function M.fail()
  error(ffi.string(C.bl_last_error()), 0)
end

-- check(rc): error with the C message when rc ~= 0. Use as `check(C.bl_x(...))`.
function M.check(rc)
  if rc ~= 0 then error(ffi.string(C.bl_last_error()), 0) end
  return rc
end

return M
