-- bertlua.util.fs: the file-system helpers every module and recipe uses, over
-- the C ones (src/io: stat, directory listing, atomic writes) so behaviour and
-- error messages are the same everywhere.
--
-- Every file the project writes goes through open/write_atomic (bl_writer,
-- src/bl_stream.h): bytes go to a temporary beside the destination, which is
-- fsynced and renamed over it only when all of them are on disk, so a full
-- disk, a quota or a kill leaves the old file or the complete new one, and
-- every failure raises "write PATH: ... failed after N bytes: reason; the
-- file was not written". Line inputs are read with lines (bl_lines): a NUL
-- byte is data, lines end at "\n", FIFOs and directories are refused.
local core = require "bertlua.core"
local shell = require "bertlua.util.shell"
local C, ffi, check = core.C, core.ffi, core.check

local M = {}

local charpp = ffi.typeof("char*[1]")
local sizep = ffi.typeof("size_t[1]")

function M.file_size(path) return tonumber(C.bl_fs_file_size(path)) end   -- -1 when missing
function M.exists(path) return C.bl_fs_file_size(path) >= 0 end
function M.is_dir(path) return C.bl_fs_is_dir(path) == 1 end
function M.mkdir_p(path) check(C.bl_fs_mkdir_p(path)); return path end
-- remove_tree(path): path and everything under it gone (rm -rf); an error names what stayed
function M.remove_tree(path)
  local out, ok = shell.read({ "rm", "-rf", "--", path }, { stderr = "stdout" })
  if not ok then error(("cannot remove %s: %s"):format(path, out:match("[^\n]*")), 0) end
end

-- readable(path): a file (not a directory) this process can open
function M.readable(path)
  if M.is_dir(path) or C.bl_check_regular(path, "read", 1) ~= 0 then return false end  -- a FIFO's open blocks
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

pcall(ffi.cdef, [[
int open(const char *path, int flags, ...);
int close(int fd);
long read(int fd, void *buf, size_t n);
char *strerror(int errnum);
]])
local O_RDONLY, O_NONBLOCK, O_CLOEXEC, EINTR = 0, 2048, 524288, 4
local chunk = ffi.new("uint8_t[?]", 1048576)

-- read(path[, what]) -> the whole file (binary), or nil and the reason: the one Lua reader of whole files. The
-- open does not wait on a FIFO (O_NONBLOCK) and anything but a regular file is refused ("what PATH is a FIFO, not
-- a regular file"), so no reader can hang on one.
function M.read(path, what)
  local fd = ffi.C.open(path, bit.bor(O_RDONLY, O_NONBLOCK, O_CLOEXEC))
  if fd < 0 then return nil, ("%s: %s"):format(path, ffi.string(ffi.C.strerror(ffi.errno()))) end
  -- what the descriptor is: /proc/self/fd/N is the opened file itself, whatever path names now
  if C.bl_check_regular("/proc/self/fd/" .. fd, what or "input", 1) ~= 0 then
    ffi.C.close(fd)
    if C.bl_check_regular(path, what or "input", 1) == 0 then return nil, path .. " is not a regular file" end
    return nil, ffi.string(C.bl_last_error())
  end
  local parts = {}
  while true do
    local n = tonumber(ffi.C.read(fd, chunk, 1048576))
    if n == 0 then break end
    if n < 0 then
      local e = ffi.errno()
      if e ~= EINTR then
        ffi.C.close(fd)
        return nil, ("%s: read failed: %s"):format(path, ffi.string(ffi.C.strerror(e)))
      end
    else
      parts[#parts + 1] = ffi.string(chunk, n)
    end
  end
  ffi.C.close(fd)
  return table.concat(parts)
end

local function fail() error(ffi.string(C.bl_last_error()), 0) end

local Writer = {}
Writer.__index = Writer

-- open(path) -> writer: w:write(...) (strings, numbers), then w:commit(); a writer dropped without
-- commit (an error on the way) removes its temporary and leaves path as it was
function M.open(path)
  if type(path) ~= "string" or path == "" then error("write: no output path given", 0) end
  local out = ffi.new("bl_writer*[1]")
  if C.bl_writer_open(path, out) ~= 0 then fail() end
  return setmetatable({ h = ffi.gc(out[0], C.bl_writer_abort), path = path }, Writer)
end

local function handle(w)
  return w.h or error("write " .. w.path .. ": the file was already committed or abandoned", 0)
end

function Writer:write(...)
  local h = handle(self)
  for i = 1, select("#", ...) do
    local s = select(i, ...)
    if type(s) == "number" then s = tostring(s) end
    if C.bl_writer_write(h, s, #s) ~= 0 then
      self:abort()
      fail()
    end
  end
  return self
end

function Writer:commit()
  local h = handle(self)
  self.h = nil
  if C.bl_writer_commit(ffi.gc(h, nil)) ~= 0 then fail() end
end

function Writer:abort()
  local h = self.h
  self.h = nil
  if h then C.bl_writer_abort(ffi.gc(h, nil)) end
end

-- write_atomic(path, ...): the whole file at once, through a writer
function M.write_atomic(path, ...)
  local w = M.open(path)
  w:write(...)
  w:commit()
end

-- lines(path[, keep_cr]) -> iterator of (line, number): lines end at "\n" only (a "\r" before it is
-- dropped unless keep_cr), NUL bytes stay in the line, a last line without "\n" counts
function M.lines(path, keep_cr)
  local out = ffi.new("bl_lines*[1]")
  if C.bl_lines_open(path, keep_cr and 0 or 1, out) ~= 0 then fail() end
  local r = ffi.gc(out[0], C.bl_lines_close)
  local pl, pn, pno = ffi.new("const char*[1]"), ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
  return function()
    if not r then return nil end
    local rc = C.bl_lines_next(r, pl, pn, pno)
    if rc == 1 then return ffi.string(pl[0], pn[0]), tonumber(pno[0]) end
    C.bl_lines_close(ffi.gc(r, nil))
    r = nil
    if rc < 0 then fail() end
    return nil
  end
end

-- check_input(path, what[, may_be_missing]): path unless it is missing (allowed with may_be_missing, for
-- callers with their own message) or not a regular file (a FIFO would block, a directory reads as
-- nothing): then an error naming it, e.g. "input /x/f is a FIFO, not a regular file"
function M.check_input(path, what, may_be_missing)
  if C.bl_check_regular(path, what or "input", may_be_missing and 0 or 1) ~= 0 then fail() end
  return path
end

-- read_text(path, who) -> the whole file without a UTF-8 byte-order mark; "who: ..." errors for a file
-- that is missing, unreadable or not a regular file
function M.read_text(path, who)
  local text, err = M.read(tostring(path), "data file")
  if not text then
    error(err:find(" not a regular file", 1, true) and (who .. ": " .. err) or (who .. ": cannot open " .. err), 0)
  end
  if text:sub(1, 3) == "\239\187\191" then text = text:sub(4) end
  return text
end

pcall(ffi.cdef, "char *realpath(const char *path, char *resolved); void free(void *p);")
-- realpath(p): p absolute, with symlinks, "." and ".." resolved; a part that does not exist yet is kept as
-- given (as realpath -m)
function M.realpath(p)
  local tail, cur = {}, p
  while true do
    local r = ffi.C.realpath(cur == "" and "/" or cur, nil)
    if r ~= nil then
      local parts = { ffi.string(r) }
      ffi.C.free(r)
      for _, t in ipairs(tail) do
        if t == ".." then parts[1] = parts[1]:match("^(.*)/[^/]*$") or ""
        elseif t ~= "." and t ~= "" then parts[1] = (parts[1] == "/" and "" or parts[1]) .. "/" .. t end
      end
      return parts[1] == "" and "/" or parts[1]
    end
    local parent, base = cur:match("^(.*)/([^/]*)$")
    if not parent then parent, base = ".", cur end
    table.insert(tail, 1, base)
    cur = parent
  end
end

-- libc through the FFI: st_dev and st_ino lead struct stat on x86-64 and on the generic (aarch64) layout;
-- the rest is room for the whole struct
pcall(ffi.cdef, [[
typedef struct { uint64_t dev, ino; uint8_t rest[256]; } bl_fs_stat;
int stat(const char *path, bl_fs_stat *st);
int flock(int fd, int op);
int ftruncate(int fd, int64_t len);
long write(int fd, const void *buf, size_t n);
long pread(int fd, void *buf, size_t n, int64_t off);
int getpid(void);
char *mkdtemp(char *tmpl);
]])
local O_RDWR, O_CREAT, LOCK_EX, LOCK_NB = 2, 64, 2, 4

pcall(ffi.cdef, "long readlink(const char *path, char *buf, size_t size);")
-- is_symlink(path): whether path itself is a symbolic link (dangling or not)
function M.is_symlink(path)
  local buf = ffi.new("char[1]")
  return ffi.C.readlink(path, buf, 1) >= 0
end

-- same_file(a, b): whether a and b name one existing file (device and inode: a symlink, "..", another
-- spelling or a hard link of it all count)
function M.same_file(a, b)
  local sa, sb = ffi.new("bl_fs_stat"), ffi.new("bl_fs_stat")
  if ffi.C.stat(a, sa) ~= 0 or ffi.C.stat(b, sb) ~= 0 then return false end
  return sa.dev == sb.dev and sa.ino == sb.ino
end

-- check_output(who, output, inputs): the one rule for outputs: output ({ "--output", path }) must not be
-- any of inputs ({ { "--input", path }, { "the predictions", path }, ... }), which writing it would replace
function M.check_output(who, output, inputs)
  local function name(o) return o[1]:match("^%-%-") and (o[1] .. "=" .. o[2]) or (o[1] .. " " .. o[2]) end
  for _, input in ipairs(inputs) do
    if input[2] and input[2] ~= "" and M.same_file(output[2], input[2]) then
      error(("%s: %s is the same file as %s: writing it would destroy the input; choose another %s")
        :format(who, name(output), name(input), output[1]), 0)
    end
  end
  return output[2]
end

-- unique_dir(prefix) -> a new directory prefix .. "-PID-XXXXXX" (mkdtemp: random, created exclusively)
function M.unique_dir(prefix)
  local tmpl = ("%s-%d-XXXXXX"):format(prefix, ffi.C.getpid())
  local buf = ffi.new("char[?]", #tmpl + 1, tmpl)
  if ffi.C.mkdtemp(buf) == nil then
    error(("cannot create a directory %s: %s"):format(tmpl, ffi.string(ffi.C.strerror(ffi.errno()))), 0)
  end
  return ffi.string(buf)
end

local held = {}   -- the lock files' descriptors, open (and locked) until released or the process ends
-- lock_dir(dir, who) -> release(): an exclusive flock on DIR/.lock (dir created), held for the life of the
-- process: a run directory belongs to one run. A second run gets "who: DIR is in use by another run (pid N)".
function M.lock_dir(dir, who)
  M.mkdir_p(dir)
  local path = dir .. "/.lock"
  local fd = ffi.C.open(path, bit.bor(O_RDWR, O_CREAT, O_CLOEXEC), ffi.cast("int", 438))
  if fd < 0 then
    error(("%s: cannot open %s: %s"):format(who, path, ffi.string(ffi.C.strerror(ffi.errno()))), 0)
  end
  if ffi.C.flock(fd, bit.bor(LOCK_EX, LOCK_NB)) ~= 0 then
    local buf = ffi.new("char[32]")
    local n = tonumber(ffi.C.pread(fd, buf, 31, 0))
    ffi.C.close(fd)
    local pid = n > 0 and ffi.string(buf, n):match("%d+") or "unknown"
    error(("%s: %s is in use by another run (pid %s); wait for it to end or choose another --output")
      :format(who, dir, pid), 0)
  end
  local pid = tostring(ffi.C.getpid()) .. "\n"
  ffi.C.ftruncate(fd, 0)
  ffi.C.write(fd, pid, #pid)
  held[fd] = true
  return function()
    if held[fd] then held[fd] = nil; ffi.C.close(fd) end
  end
end

-- inside(child, parent): whether child is parent or lies under it (symlinks and ".." resolved)
function M.inside(child, parent)
  local c, p = M.realpath(child), M.realpath(parent)
  return c == p or c:sub(1, #p + 1) == p .. "/"
end

-- recipe(name): a sibling of the running recipe, found from the recipe's own location (the source tree
-- or an installed share/bertlua/recipes) whatever the working directory
function M.recipe(name)
  local dir = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
  return dir .. "/" .. name
end

-- host(): the running bertlua executable (absolute), for recipes that start other recipes
function M.host()
  local buf = ffi.new("char[4096]")
  local n = tonumber(ffi.C.readlink("/proc/self/exe", buf, 4096))
  if n and n > 0 then return ffi.string(buf, n) end
  return arg and arg[-1] or "bertlua"
end

-- copy(src, dst): dst written atomically; `who` names the caller in errors
function M.copy(src, dst, who)
  local data, err = M.read(src)
  if not data then error(("%s: cannot read %s: %s"):format(who or "copy", src, tostring(err)), 2) end
  M.write_atomic(dst, data)
end

return M
