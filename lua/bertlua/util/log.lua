-- bertlua.util.log: progress on a terminal and JSON-lines logs for notebooks.
--
--   local log = require "bertlua.util.log"
--   local L = log.open{ path = "out/log.jsonl", total = 1000, config = opt }
--   L:step{ step = 10, loss = 2.3, lr = 1e-3 }   -- one JSON object per call
--   L:summary{ steps = 1000, sequences = 64000, train_time = 512.3 }   -- the end-of-run line
--   L:close()
-- Only rank 0 writes (other ranks get a silent logger). The progress line is
-- redrawn in place when stderr is a terminal, printed every `every` steps otherwise.
-- format = "dllogger" writes NVIDIA's DLLogger JSON stream instead of plain JSON lines:
--   DLLL {"timestamp": "...", "datetime": "...", "elapsedtime": "...", "type": "LOG", "step": [phase, step],
--         "data": {...}}
-- (the config as step "PARAMETER", the summary with step []), what NVIDIA's scripts and their log parsers read.
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

M.FORMATS = { jsonl = true, dllogger = true }
M.FORMAT_HELP = "log format: jsonl (one JSON object per line, DIR/NAME.jsonl) or dllogger (NVIDIA's DLLogger "
  .. "JSON stream, DIR/dllogger.json)"

-- check_format(format, who) -> format, or a one-line error naming the option
function M.check_format(format, who)
  if not M.FORMATS[format] then
    error(("%s: unknown --log-format '%s' (jsonl or dllogger)"):format(who, tostring(format)), 0)
  end
  return format
end

-- path_for(dir, name, format) -> the log file of a run directory: dir/name.jsonl, or dir/dllogger.json as
-- NVIDIA's scripts name theirs
function M.path_for(dir, name, format)
  return dir .. "/" .. ((format or "jsonl") == "dllogger" and "dllogger.json" or name .. ".jsonl")
end

pcall(ffi.cdef, "typedef struct { long tv_sec; long tv_usec; } bl_timeval;")
pcall(ffi.cdef, "int gettimeofday(bl_timeval *tv, void *tz);")
local tv = ffi.new("bl_timeval")

-- a record as DLLogger's JSONStreamBackend writes one: step [phase, step] (or "PARAMETER" for the config, [] for
-- the summary), the other fields in data, times as strings
local function dllogger_line(self, record)
  ffi.C.gettimeofday(tv, nil)
  local sec, usec = tonumber(tv.tv_sec), tonumber(tv.tv_usec)
  local data, step = {}
  for k, v in pairs(record) do
    if k ~= "step" and k ~= "phase" and k ~= "time" and k ~= "event" then data[k] = v end
  end
  if record.event == "config" then
    step = '"PARAMETER"'
  elseif record.event == "summary" then
    step = "[]"   -- cjson writes an empty table as {}
  else
    if record.event then data.event = record.event end
    step = cjson.encode(record.phase and { record.phase, record.step } or { record.step or 0 })
  end
  return ('DLLL {"timestamp": "%d.%06d", "datetime": "%s.%06d", "elapsedtime": "%.6f", "type": "LOG", '
    .. '"step": %s, "data": %s}'):format(sec, usec, os.date("%Y-%m-%d %H:%M:%S", sec), usec, M.clock() - self.t0,
    step, cjson.encode(json_safe(data)))
end

-- one line to the log file; a failed write (full disk) is an error naming the file
local function put(self, record)
  local line = self.format == "dllogger" and dllogger_line(self, record) or cjson.encode(json_safe(record))
  local ok, err = self.file:write(line, "\n")
  if ok then ok, err = self.file:flush() end
  if not ok then error(("log: cannot write %s: %s"):format(self.path, tostring(err)), 0) end
end

function M.open(o)
  o = o or {}
  local format = M.check_format(o.format or "jsonl", "log")
  local self = setmetatable({ total = o.total, every = o.every or 10, rank = o.rank or 0, format = format,
    t0 = M.clock(), tty = M.isatty(2), fields = o.fields, last_len = 0, logged = 0 }, Logger)
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
  if type(record.loss) == "number" and record.loss == record.loss then  -- for the summary, on every rank
    self.final_loss = record.loss
    self.best_loss = math.min(self.best_loss or math.huge, record.loss)
  end
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

-- summary{ steps =, sequences =, train_time = [, fields] }: the end-of-run record (event "summary") and one
-- line on stdout: steps and sequences of this run, sequences/s over train_time (seconds), the final and the best
-- logged loss, the wall time since the log was opened. Returns the record (on every rank).
function Logger:summary(o)
  local wall = M.clock() - self.t0
  local r = { event = "summary", steps = o.steps, sequences = o.sequences, train_time = o.train_time,
    sequences_per_s = o.sequences and o.train_time and o.train_time > 0 and o.sequences / o.train_time or nil,
    final_loss = self.final_loss, best_loss = self.best_loss, wall_time = wall }
  for k, v in pairs(o.fields or {}) do r[k] = v end
  if self.silent then return r end
  local parts = { ("%d steps"):format(r.steps or 0) }
  if r.sequences_per_s then
    parts[#parts + 1] = ("%.1f sequences/s (%d sequences in %.1f s)"):format(r.sequences_per_s, r.sequences,
      r.train_time)
  end
  if r.final_loss then parts[#parts + 1] = ("final loss %.4f, best %.4f"):format(r.final_loss, r.best_loss) end
  parts[#parts + 1] = ("wall time %s"):format(fmt_eta(wall))
  if self.tty then io.stderr:write("\n"); self.last_len = 0 end
  print("summary: " .. table.concat(parts, ", "))
  r.time = os.time()
  if self.file then put(self, r) end
  return r
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
