-- The input pipeline to a GPU (bl_feeder, bertlua.data.loader.DeviceLoader):
-- pinned buffers, copies on the copy stream ordered by events, the next batch
-- in flight while the current one is used. On the tiny pre-training corpus
-- of pretrain_fixture, against the plain (CPU) loader with the same options.
-- The C loader builds the large fields in the pinned buffers (no copy from
-- ordinary memory: bl_feeder_staged_bytes counts what is still copied).
-- Needs a CUDA device (the emulated one in CI: its copies run only when a
-- stream reaches them, so a missing event wait reads stale buffers).
local T = require "testing"
local bl = require "bertlua"
local data = require "bertlua.data.loader"
local core = require "bertlua.core"

local fx = require("pretrain_fixture").make(T, { need_cuda = true })
local FIELDS = { "input_ids", "token_type_ids", "attention_mask", "masked_lm_positions", "masked_lm_labels",
  "next_sentence_labels" }

local function loader(o)
  local args = { dir = fx.tmp .. "/data", split = "train", batch_size = 4, seed = 3, max_seq_length = 32,
    max_predictions = 5 }
  for k, v in pairs(o or {}) do args[k] = v end
  return data.Loader(args)
end

local function same(a, b, what)
  for _, k in ipairs(FIELDS) do
    T.eq(table.concat(a[k]:to("cpu"):shape(), "x"), table.concat(b[k]:shape(), "x"), what .. " " .. k .. " shape")
    local x, y = a[k]:to("cpu"):totable(), b[k]:totable()
    for i = 1, #y do
      if x[i] ~= y[i] then error(("%s %s: element %d is %s, expected %s"):format(what, k, i, x[i], y[i])) end
    end
  end
end

T.test("the device loader hands out the cpu loader's batches, in order, across an epoch", function()
  local cpu, gpu = loader(), data.DeviceLoader(loader(), 0)
  for s = 1, cpu.steps_per_epoch + 3 do
    same(gpu:next(), cpu:next(), "step " .. s)
    T.eq(gpu:state().pos, cpu:state().pos)
    T.eq(gpu:state().epoch, cpu:state().epoch)
  end
  gpu:close(); cpu:close()
end)

T.test("no device allocation after the first batch; state() resumes exactly", function()
  local gpu = data.DeviceLoader(loader(), 0)
  local first = gpu:next()
  local m0 = bl.cuda_counters(0).mallocs
  for _ = 1, 12 do
    local b = gpu:next()
    b.input_ids:add(0):free()   -- used on the compute stream, as a step would; the result goes back to the cache
  end
  T.truthy(bl.cuda_counters(0).mallocs - m0 <= 1, "at most one allocation (the add's result) for 12 batches")
  local st = gpu:state()
  local resumed = data.DeviceLoader(loader(), 0)
  resumed:set_state(st)
  local cpu = loader()
  cpu:set_state(st)
  for s = 1, 4 do same(resumed:next(), cpu:next(), "resumed step " .. s) end
  T.truthy(first.input_ids:numel() > 0)
  gpu:close(); resumed:close(); cpu:close()
end)

-- the loader writes ids, token types and mask into the pinned buffers itself: the only bytes copied from ordinary
-- memory into them are the small host fields (positions, labels [B, P], NSP labels [B]); bl_feeder_put of the
-- same batches (what DeviceLoader did before) copies the [B, S] fields too
T.test("batches are built in the pinned buffers: only the host fields are copied there", function()
  local C, ffi = core.C, core.ffi
  local gpu = data.DeviceLoader(loader(), 0)
  for _ = 1, 6 do gpu:next() end   -- 7 batches put: 2 at the first call, then one per call
  local B, P = gpu.loader.batch, gpu.loader.max_pred
  T.eq(gpu:staged_bytes(), 7 * B * (2 * P + 1) * 4, "bytes copied into the pinned buffers")
  local out = ffi.new("bl_feeder *[1]")
  T.eq(C.bl_feeder_new(0, B, gpu.loader.max_length, P, out), 0)
  local f = ffi.gc(out[0], C.bl_feeder_free)
  local cpu, b = loader(), ffi.new("bl_loader_batch")
  local batch = cpu:next()
  for _, k in ipairs(FIELDS) do b[k] = batch[k] end
  T.eq(C.bl_feeder_put(f, b), 0)
  local big = batch.input_ids:numel() * 3 * 4
  T.eq(tonumber(C.bl_feeder_staged_bytes(f)), B * (2 * P + 1) * 4 + big, "bytes copied by a put of a CPU batch")
  gpu:close(); cpu:close()
end)

T.test("a batch that does not fit the feeder is an error naming it", function()
  local C, ffi = core.C, core.ffi
  local out = ffi.new("bl_feeder *[1]")
  T.eq(C.bl_feeder_new(0, 4, 16, 5, out), 0)
  local f = ffi.gc(out[0], C.bl_feeder_free)
  local b = ffi.new("bl_loader_batch")
  local keep = {}
  for _, k in ipairs(FIELDS) do
    local shape = k == "next_sentence_labels" and { 4 } or k:match("^masked") and { 4, 5 } or { 4, 24 }
    keep[k] = bl.zeros(shape, { dtype = "i32" })
    b[k] = keep[k]
  end
  T.truthy(C.bl_feeder_put(f, b) ~= 0)
  T.truthy(ffi.string(C.bl_last_error()):find("sequence length 24 (this feeder holds 1..16)", 1, true),
    ffi.string(C.bl_last_error()))
  T.truthy(C.bl_feeder_get(f, b) ~= 0)
  T.truthy(ffi.string(C.bl_last_error()):find("no batch in flight", 1, true))
end)

T.run()
