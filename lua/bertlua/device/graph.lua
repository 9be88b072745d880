-- bertlua.device.graph: a training step run as a CUDA graph (--cuda-graph).
--
--   local graph = require "bertlua.device.graph"
--   local g = graph.Graph(dev)
--   g:run(function() ... queue the step's work ... end)   -- captured, then launched as one graph
--   g:replay()  -- the last graph again, unchanged (when g:replayable())
--   g:stats()   -- {nodes=, instantiations=, updates=, launches=, replays=}
--
-- run(fn) captures the work fn queues on the device's compute stream (stream capture: nothing runs while fn
-- does), turns it into the instantiated graph and launches that: the device then runs the whole step without a
-- gap between launches, and the host only records. The graph is instantiated once; a later capture of the same
-- kernels in the same order only updates its parameters (cudaGraphExecUpdate). replay() launches the last graph
-- again without running fn: the kernels must then read whatever changes from step to step from device memory
-- that the host updates before the launch (set_inputs in bl_base.h; dropout seed slots, BL_SEED_SLOT in
-- bl_ops.h; the optimizer's bl_amp_config.lr_from), which is how bertlua.train.step captures its step
-- once. replayable() says whether a replay is valid (no device block handed out since the capture). What the step
-- must not do while captured: wait for the device, read its memory, or allocate (after warm-up the caching
-- allocator serves every block); each of those is an error naming the op, raised from run(). Uploads from host
-- memory in fn are staged by the runtime (bl_cuda_graph_begin in bl_base.h): a replay reads what was staged at
-- its capture, so data that changes per step must not be uploaded inside fn.
local core = require "bertlua.core"
local C, ffi, check = core.C, core.ffi, core.check

local M = {}

local Graph = {}
Graph.__index = Graph

function M.Graph(dev)
  if type(dev) ~= "number" or dev < 0 then error("graph.Graph: a CUDA graph needs a cuda device, got " ..
    tostring(dev), 2) end
  local out = ffi.new("bl_cuda_graph *[1]")
  check(C.bl_cuda_graph_new(dev, out))
  return setmetatable({ dev = dev, g = ffi.gc(out[0], C.bl_cuda_graph_free) }, Graph)
end

-- The abort hooks of the capture in progress (nil outside one): see on_abort.
local abort_hooks

-- on_abort(fn): inside a capture, fn() is called if that capture is aborted (no-op outside one). A host cache
-- that keeps a device tensor filled by work queued in the capture (the model's position ids) must forget it then:
-- that work never runs, and an uncaptured rerun of the step would read the tensor's garbage.
function M.on_abort(fn)
  if abort_hooks then abort_hooks[#abort_hooks + 1] = fn end
end

-- run(fn, ...): fn(...) captured and launched; returns fn's (first) result. An error in fn (a refused call among
-- them) ends the capture first, so the device is usable afterwards; nothing fn queued has run then, and the
-- on_abort hooks have run.
function Graph:run(fn, ...)
  check(C.bl_cuda_graph_begin(self.g))
  abort_hooks = {}
  local ok, res = pcall(fn, ...)
  local hooks = abort_hooks
  abort_hooks = nil
  if not ok then
    C.bl_cuda_graph_abort(self.g)
    for _, h in ipairs(hooks) do h() end
    error(("cuda graph: the step failed while it was captured (--cuda-graph): %s"):format(tostring(res)), 0)
  end
  check(C.bl_cuda_graph_end(self.g))
  check(C.bl_cuda_graph_launch(self.g))
  return res
end

-- refused_allocation(err): the error of run() was a device allocation the captured code needed (the caching
-- allocator had no free block of its size, e.g. after an evaluation took blocks): running the same code
-- uncaptured once makes the block, and a later capture finds it. The phrase is kernels/runtime.cu's.
function M.refused_allocation(err)
  return tostring(err):find("a new device allocation", 1, true) ~= nil
end

-- replayable() -> true when replay() may run the last graph again unchanged (bl_cuda_graph_replayable: it was
-- launched and no device block was handed out since its capture ended).
function Graph:replayable()
  local ok = ffi.new("int[1]")
  check(C.bl_cuda_graph_replayable(self.g, ok))
  return ok[0] == 1
end

-- replay(): the last captured graph launched again, without running the code that was captured. Values that
-- change from one launch to the next must then be read by the kernels from device memory the host updates before
-- it (seed slots, BL_SEED_SLOT in bl_ops.h; bl_amp_config.lr_from).
function Graph:replay()
  check(C.bl_cuda_graph_replay(self.g))
end

function Graph:stats()
  local s = ffi.new("bl_cuda_graph_stats")
  check(C.bl_cuda_graph_stats_get(self.g, s))
  return { nodes = tonumber(s.nodes), instantiations = tonumber(s.instantiations), updates = tonumber(s.updates),
    launches = tonumber(s.launches), replays = tonumber(s.replays) }
end

function Graph:free()
  if self.g ~= nil then C.bl_cuda_graph_free(ffi.gc(self.g, nil)); self.g = nil end
end

-- unavailable(dev) -> nil, or why this run cannot use a graph (the recipes then run without one and say so).
-- Any number of ranks: the gradient reducer's NCCL all-reduces are captured with the step (its communication
-- stream forks from the capture at each bucket's event and joins it back before the optimizer), so every rank's
-- graph replays the same collectives in the same order (NCCL supports capture since 2.9).
function M.unavailable(dev)
  if dev < 0 then return "--cuda-graph needs --device=cuda" end
end

return M
