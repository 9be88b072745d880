-- bertlua.util.log: progress on a terminal and JSON-lines logs for notebooks.
--
--   local log = require "bertlua.util.log"
--   local L = log.open{ path = "out/log.jsonl", total = 1000, config = opt }
--   L:step{ step = 10, loss = 2.3, lr = 1e-3 }   -- one JSON object per call
--   L:close()
-- Only rank 0 writes (other ranks get a silent logger). The progress line is
-- redrawn in place when stderr is a terminal, printed every `every` steps otherwise.
local ffi = require "ffi"
local cjson = require "cjson"
local fs = require "bertlua.util.fs"

pcall(ffi.cdef, "int isatty(int fd);")
local M = {}

function M.isatty(fd) return ffi.C.isatty(fd or 2) == 1 end

-- monotonic wall clock in seconds (clock_gettime through the FFI)
pcall(ffi.cdef, [[
typedef struct { long tv_sec; long tv_nsec; } bl_timespec;
int clock_gettime(int clk, bl_timespec *ts);
]])
local ts = ffi.new("bl_timespec")
function M.clock()
  ffi.C.clock_gettime(1, ts)  -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local function fmt_eta(sec)
  if not sec or sec ~= sec or sec == math.huge or sec < 0 then return "--:--" end
  sec = math.floor(sec + 0.5)
  local h, m, s = math.floor(sec / 3600), math.floor(sec / 60) % 60, sec % 60
  if h > 0 then return ("%d:%02d:%02d"):format(h, m, s) end
  return ("%02d:%02d"):format(m, s)
end
M.fmt_eta = fmt_eta

-- JSON numbers: cjson keeps 14 significant digits, enough for logs.
local Logger = {}
Logger.__index = Logger

-- JSON cannot hold NaN or infinities (cjson refuses them and the run died in the logger): they are
-- logged as the strings "NaN", "Infinity", "-Infinity", which every JSON reader reads back.
local function json_safe(v)
  if type(v) == "number" then
    if v ~= v then return "NaN" end
    if v == math.huge then return "Infinity" end
    if v == -math.huge then return "-Infinity" end
    return v
  end
  if type(v) ~= "table" then return v end
  local r = {}
  for k, x in pairs(v) do r[k] = json_safe(x) end
  return setmetatable(r, getmetatable(v))
end
M.json_safe = json_safe

-- one JSON line to the log file; a failed write (full disk) is an error naming the file
local function put(self, record)
  local ok, err = self.file:write(cjson.encode(json_safe(record)), "\n")
  if ok then ok, err = self.file:flush() end
  if not ok then error(("log: cannot write %s: %s"):format(self.path, tostring(err)), 0) end
end

function M.open(o)
  o = o or {}
  local self = setmetatable({ total = o.total, every = o.every or 10, rank = o.rank or 0,
    t0 = M.clock(), tty = M.isatty(2), fields = o.fields, last_len = 0 }, Logger)
  if self.rank ~= 0 then self.silent = true return self end
  if o.path then
    local dir = o.path:match("^(.*)/[^/]*$")
    if dir then fs.mkdir_p(dir) end
    -- a symlink put where the log goes is replaced, not followed (it would overwrite what it points to)
    if fs.is_symlink(o.path) and not os.remove(o.path) then
      error("log: cannot replace the symbolic link " .. o.path, 0)
    end
    local f, err = io.open(o.path, o.append and "a" or "w")
    if not f then error("log: cannot open " .. o.path .. ": " .. tostring(err), 0) end
    self.file, self.path = f, o.path
    if o.config then put(self, { event = "config", config = o.config, time = os.time() }) end
  end
  return self
end

-- record: table of fields (numbers/strings); `step` drives the progress line.
function Logger:step(record)
  if self.silent then return end
  record.time = record.time or os.time()
  if self.file then put(self, record) end
  local step = record.step or 0
  if self.tty or step % self.every == 0 or step == self.total then
    local elapsed = M.clock() - self.t0
    local parts = { self.total and ("step %d/%d"):format(step, self.total) or ("step %d"):format(step) }
    for _, k in ipairs(self.fields or { "loss", "mlm_acc", "nsp_acc", "lr", "loss_scale", "seq_per_s" }) do
      local v = record[k]
      if type(v) == "number" then
        local f = (k == "lr") and "%.3e" or (math.abs(v) >= 100 and "%.1f" or "%.4f")
        parts[#parts + 1] = k .. " " .. f:format(v)
      end
    end
    if self.total and step > 0 then
      parts[#parts + 1] = "ETA " .. fmt_eta(elapsed / step * (self.total - step))
    end
    local line = table.concat(parts, "  ")
    if self.tty then
      io.stderr:write("\r", line, string.rep(" ", math.max(0, self.last_len - #line)))
      self.last_len = #line
    else
      io.stderr:write(line, "\n")
    end
    io.stderr:flush()
  end
end

function Logger:event(name, fields)
  if self.silent then return end
  fields = fields or {}
  fields.event = name
  fields.time = fields.time or os.time()
  if self.file then put(self, fields) end
end

function Logger:close()
  if self.tty and not self.silent then io.stderr:write("\n") end
  if self.file then
    local ok, err = self.file:close()
    self.file = nil
    if not ok then error(("log: cannot write %s: %s"):format(self.path, tostring(err)), 0) end
  end
end

return M
