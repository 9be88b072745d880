-- bertlua.train.checkpoint: training checkpoints that survive crashes.
--
--   local ckpt = require "bertlua.train.checkpoint"
--   ckpt.save("runs/x/checkpoints", {
--     step = 100, model = model,                          -- f32 (master) weights, HF names (model.safetensors)
--     tensors = { ["optimizer.exp_avg"] = m, ... },         -- optimizer state etc. (state.safetensors)
--     state = { phase = 1, rng = ..., loader = ..., scaler = ..., optimizer = {...} },  -- JSON
--     identity = { model_config = cfg, optimizer = "lamb", data_slices = 2 },          -- must match on load
--   }, { keep = 3 })
--   local path = ckpt.latest("runs/x/checkpoints")       -- newest COMPLETE checkpoint or nil
--   local c = ckpt.load(path, { model = model, identity = {...} })  -- c.step, c.state, c.tensors
--     (restore = function(c) ... end: puts c's state into the run; an error there fails the load)
--
-- Layout: DIR/ckpt-00000100/{model.safetensors, state.safetensors, state.json}.
-- A checkpoint is written into DIR/.tmp-ckpt-00000100-PID-RANDOM/ (every file fsynced
-- by the atomic writer, bl_writer), state.json last, and the directory is then renamed
-- into place: a crash at any point leaves either no checkpoint or a hidden
-- .tmp directory that latest() ignores and the next save removes. Only rank 0
-- should call save(). JSON keeps 14 significant digits: bulk numbers and
-- anything that must round-trip bit-exactly (RNG states, moments) go in the
-- safetensors files or as integers.
local cjson = require "cjson"
local bl = require "bertlua.tensor"
local st = require "bertlua.io.safetensors"
local fs = require "bertlua.util.fs"

local M = {}
M.FORMAT = 1

local exists = fs.exists

-- FNV-1a 64 of a file's bytes as a decimal string (state.json records one per tensor file: a bit flip in a
-- checkpoint is found at load, and load_latest falls back to the previous checkpoint)
function M.file_checksum(path)
  local core = require "bertlua.core"
  local f, err = io.open(path, "rb")
  if not f then error("checkpoint: cannot read " .. path .. ": " .. tostring(err), 0) end
  local h = core.ffi.new("uint64_t", 14695981039346656037ULL)
  while true do
    local chunk = f:read(16777216)
    if not chunk then break end
    h = core.C.bl_fnv1a64(chunk, #chunk, h)
  end
  f:close()
  return (tostring(h):gsub("ULL$", ""))
end
local TENSOR_FILES = { "model.safetensors", "state.safetensors" }

function M.name(step) return ("ckpt-%08d"):format(step) end

-- Complete checkpoints in dir, oldest first: { {step=, path=}, ... }
function M.list(dir)
  local r = {}
  for _, e in ipairs(fs.is_dir(dir) and fs.list_dir(dir, nil, "dirs") or {}) do
    local step = e:match("^ckpt%-(%d+)$")
    if step and exists(dir .. "/" .. e .. "/state.json") then
      r[#r + 1] = { step = tonumber(step), path = dir .. "/" .. e }
    end
  end
  table.sort(r, function(a, b) return a.step < b.step end)
  return r
end

function M.latest(dir)
  local l = M.list(dir)
  return l[#l] and l[#l].path or nil
end

function M.save(dir, c, opts)
  opts = opts or {}
  if type(c.step) ~= "number" then error("checkpoint.save: step must be a number", 2) end
  fs.mkdir_p(dir)
  -- leftovers of interrupted saves
  for _, e in ipairs(fs.list_dir(dir, nil, "hidden")) do
    if e:match("^%.tmp%-ckpt%-") then fs.remove_tree(dir .. "/" .. e) end
  end
  local final = dir .. "/" .. M.name(c.step)
  local tmp = fs.unique_dir(("%s/.tmp-%s"):format(dir, M.name(c.step)))
  if c.model then st.save_model(c.model, tmp .. "/model.safetensors") end
  if c.tensors and next(c.tensors) then st.save(tmp .. "/state.safetensors", c.tensors) end
  local sums = {}
  for _, name in ipairs(TENSOR_FILES) do
    if exists(tmp .. "/" .. name) then sums[name] = M.file_checksum(tmp .. "/" .. name) end
  end
  local meta = { format = M.FORMAT, step = c.step, state = c.state or {}, identity = c.identity or {},
    time = os.time(), checksums = sums }
  fs.write_atomic(tmp .. "/state.json", cjson.encode(meta))
  if exists(final .. "/state.json") then fs.remove_tree(final) end
  local ok, err = os.rename(tmp, final)
  if not ok then error("checkpoint.save: cannot move " .. tmp .. " to " .. final .. ": " .. tostring(err), 2) end
  local keep = opts.keep or 3
  local all = M.list(dir)
  for i = 1, #all - keep do fs.remove_tree(all[i].path) end
  return final
end

-- identity fields that must match between the run and the checkpoint; every
-- mismatch is named, in sorted order (pairs() order varies between runs)
local sorted_keys = require("bertlua.util.list").sorted_keys

local function differences(want, have)
  local diffs = {}
  for _, k in ipairs(sorted_keys(want or {})) do
    local v, h = want[k], have[k]
    if type(v) == "table" and type(h) == "table" then
      for _, kk in ipairs(sorted_keys(v)) do
        local vv = v[kk]
        if h[kk] ~= nil and vv ~= h[kk] and type(vv) ~= "table" then
          diffs[#diffs + 1] = ("a different %s: %s = %s there, %s now"):format(k, kk, tostring(h[kk]), tostring(vv))
        end
      end
    elseif h ~= nil and v ~= h then
      diffs[#diffs + 1] = ("%s = %s, this run has %s"):format(k, tostring(h), tostring(v))
    end
  end
  return diffs
end

local function compare(path, want, have)
  local diffs = differences(want, have)
  if #diffs > 0 then
    error(("checkpoint %s was made with %s"):format(path, table.concat(diffs, "; ")), 0)
  end
end

function M.load(path, opts)
  opts = opts or {}
  local text, err = fs.read(path .. "/state.json")
  if not text then error("checkpoint: " .. path .. " is not a complete checkpoint (no state.json: " .. tostring(err)
    .. ")", 2) end
  local ok, meta = pcall(cjson.decode, text)
  if not ok or type(meta) ~= "table" then error("checkpoint: " .. path .. "/state.json is not valid JSON", 2) end
  if meta.format ~= M.FORMAT then
    error(("checkpoint: %s has format %s, this bertlua reads format %d"):format(path, tostring(meta.format), M.FORMAT),
      2)
  end
  -- format 1 records a checksum for every tensor file: one missing means an edited state.json, not trusted
  if type(meta.checksums) ~= "table" then
    error(("checkpoint: %s/state.json has no checksums (its format records them); not trusted"):format(path), 0)
  end
  for _, name in ipairs(TENSOR_FILES) do
    local want = meta.checksums[name]
    if not want and exists(path .. "/" .. name) then
      error(("checkpoint: %s/state.json has no checksum for %s; not trusted"):format(path, name), 0)
    end
    if want and M.file_checksum(path .. "/" .. name) ~= want then
      error(("checkpoint: %s/%s is corrupt (its checksum differs from the one saved with it)"):format(path, name), 0)
    end
  end
  compare(path, opts.identity, meta.identity or {})
  if opts.model then
    st.load_model(opts.model, path .. "/model.safetensors", { strict = opts.strict })
    -- the file holds the f32 master weights; a model with a half compute copy (a GPU in bf16/fp16) reads that
    if opts.model.sync_compute then opts.model:sync_compute() end
  end
  local tensors = {}
  if exists(path .. "/state.safetensors") then tensors = st.load(path .. "/state.safetensors") end
  local c = { step = meta.step, state = meta.state, identity = meta.identity, tensors = tensors, path = path }
  if opts.restore then  -- the caller's state from c (optimizer, loader position): a failure makes c unusable
    local rok, rerr = pcall(opts.restore, c)
    if not rok then
      error(("checkpoint: %s cannot be restored: %s"):format(path, tostring(rerr):gsub("^[^\n]-%.lua:%d+: ", "")), 0)
    end
  end
  return c
end

-- The trainer's part of a checkpoint, one rule for pre-training and fine-tuning: trainer_state(optimizer, amp) ->
-- tensors, state (the optimizer's moments as "optimizer.<name>"; its step and rate, the loss scaler) for save's
-- c.tensors and c.state; restore_trainer(c, optimizer, amp) puts a loaded checkpoint's back (in a restore hook).
function M.trainer_state(optimizer, amp)
  local tensors = {}
  for k, v in pairs(optimizer:state_dict()) do
    if bl.is_tensor(v) then tensors["optimizer." .. k] = v end
  end
  return tensors, { optimizer_step = optimizer.step_count, lr = optimizer.last_lr, scaler = amp:state_dict() }
end

function M.restore_trainer(c, optimizer, amp)
  local sd = { optimizer = optimizer.kind, step = c.state.optimizer_step, lr = c.state.lr }
  for k, t in pairs(c.tensors) do
    local name = k:match("^optimizer%.(.+)$")
    if name then sd[name] = t end
  end
  optimizer:load_state_dict(sd)
  amp:load_state_dict(c.state.scaler, c.state.optimizer_step)
end

-- claim(dir, identity, resume, who): at the start of a run whose checkpoints go to dir. Checkpoints already
-- there belong to an earlier run: without resume they are refused (retention would mix the two runs and a
-- later --resume continue the wrong one), naming what differs from this run when it is another run's; with
-- resume, the newest must be this run's (load_latest checks each one it loads).
function M.claim(dir, identity, resume, who)
  local all = M.list(dir)
  if #all == 0 then return end
  local newest = all[#all].path
  local ok, meta = pcall(cjson.decode, fs.read(newest .. "/state.json") or "")
  local diffs = ok and type(meta) == "table" and differences(identity, meta.identity or {}) or {}
  if #diffs > 0 then
    error(("%s: %s holds checkpoints of another run (%s was made with %s); choose another --output or remove them")
      :format(who, dir, newest, table.concat(diffs, "; ")), 0)
  end
  if not resume then
    error(("%s: %s holds checkpoints of an earlier run (newest %s); --resume continues it, or choose another "
      .. "--output or remove them"):format(who, dir, newest), 0)
  end
end

-- load_latest(dir, opts) -> checkpoint or nil: the newest checkpoint that loads; a corrupt one (bad
-- checksum, truncated file, broken JSON, a state opts.restore(c) refuses, e.g. a loader position past the
-- data) is reported on stderr and the previous one is tried. A checkpoint
-- of another run (identity mismatch) is an error, not a reason to go back in time.
function M.load_latest(dir, opts)
  local all = M.list(dir)
  for i = #all, 1, -1 do
    local ok, c = pcall(M.load, all[i].path, opts)
    if ok then return c end
    if tostring(c):find(" was made with ", 1, true) then error(c, 0) end
    io.stderr:write(("checkpoint: skipping %s: %s\n"):format(all[i].path, tostring(c)))
  end
  return nil
end

return M
