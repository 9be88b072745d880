-- bertlua.util.fs: the file-system helpers every module and recipe uses, over
-- the C ones (src/io: stat, directory listing, atomic writes) so behaviour and
-- error messages are the same everywhere.
local core = require "bertlua.core"
local C, ffi, check = core.C, core.ffi, core.check

local M = {}

local charpp = ffi.typeof("char*[1]")
local sizep = ffi.typeof("size_t[1]")

function M.file_size(path) return tonumber(C.bl_fs_file_size(path)) end   -- -1 when missing
function M.exists(path) return C.bl_fs_file_size(path) >= 0 end
function M.is_dir(path) return C.bl_fs_is_dir(path) == 1 end
function M.mkdir_p(path) check(C.bl_fs_mkdir_p(path)); return path end

-- readable(path): a file (not a directory) this process can open
function M.readable(path)
  if M.is_dir(path) then return false end
  local f = io.open(path, "rb")
  if not f then return false end
  f:close()
  return true
end

-- list_dir(dir[, pattern[, what]]) -> sorted names (not paths) of the regular
-- files of dir (what = "dirs": its subdirectories, "all": both, "hidden": both
-- and names starting with ".", which the others leave out) matching the Lua pattern.
local WHAT = { files = C.BL_FS_FILES, dirs = C.BL_FS_DIRS, all = bit.bor(C.BL_FS_FILES, C.BL_FS_DIRS),
  hidden = bit.bor(C.BL_FS_FILES, C.BL_FS_DIRS, C.BL_FS_HIDDEN) }
function M.list_dir(dir, pattern, what)
  local out, len = charpp(), sizep()
  check(C.bl_fs_list_dir(dir, WHAT[what or "files"], out, len))
  local s = ffi.string(out[0], len[0])
  C.bl_fs_free(out[0])
  local names = {}
  for name in s:gmatch("[^\n]+") do
    if not pattern or name:match(pattern) then names[#names + 1] = name end
  end
  return names
end

-- read(path) -> the whole file (binary), or nil and the reason
function M.read(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local s = f:read("*a")
  f:close()
  return s
end

-- write_atomic(path, text): readers see the old file or the whole new one
-- (temporary file, fsync, rename: bl_file_create_atomic)
function M.write_atomic(path, text)
  local fp = ffi.new("bl_file*[1]")
  check(C.bl_file_create_atomic(path, fp))
  if C.bl_file_write(fp[0], text, #text) ~= 0 then
    C.bl_file_close(fp[0])
    core.fail(2)
  end
  check(C.bl_file_commit(fp[0]))
end

-- copy(src, dst): dst written atomically; `who` names the caller in errors
function M.copy(src, dst, who)
  local data, err = M.read(src)
  if not data then error(("%s: cannot read %s: %s"):format(who or "copy", src, tostring(err)), 2) end
  M.write_atomic(dst, data)
end

return M
