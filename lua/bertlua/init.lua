-- bertlua: `local bl = require "bertlua"` gives the tensor library
-- (bl.zeros, bl.randn, t:matmul, ...) plus information about the build and
-- the process group. Submodules load on first use: bl.nn, bl.optim, ...
local core = require "bertlua.core"
local tensor = require "bertlua.tensor"
local ffi, C = core.ffi, core.C

local M = {}
for k, v in pairs(tensor) do M[k] = v end
M.C = C
M.ffi = ffi

M.version = ffi.string(C.bl_version())

function M.cuda_available() return C.bl_cuda_device_count() > 0 end
function M.cuda_device_count() return C.bl_cuda_device_count() end
function M.cuda_compiled() return C.bl_cuda_compiled() == 1 end
function M.nccl_compiled() return C.bl_nccl_compiled() == 1 end
function M.num_threads() return C.bl_num_threads() end
function M.set_num_threads(n) C.bl_set_num_threads(n) end
function M.bytes_in_use() return tonumber(C.bl_storage_bytes_in_use()) end
-- Prefix for a shell command that runs a peer program (PyTorch in the
-- benchmarks) in the environment the user gave: the host sets thread-waiting
-- variables for itself (src/host/main.c) and lists them in
-- BERTLUA_THREAD_ENV_SET, not for others.
function M.peer_env_prefix()
  local set = os.getenv("BERTLUA_THREAD_ENV_SET")
  if not set then return "" end
  local parts = { "env -u BERTLUA_THREAD_ENV_SET" }
  for name in set:gmatch("[%w_]+") do parts[#parts + 1] = "-u " .. name end
  return table.concat(parts, " ") .. " "
end

-- process group (MPI when launched by mpirun/srun, else a world of one)
M.rank = function() return C.bl_dist_rank() end
M.world_size = function() return C.bl_dist_size() end
M.local_rank = function() return C.bl_dist_local_rank() end

-- Submodules by their short names (bl.optim, bl.squad, ...): the folders follow
-- the C tree, the short names stay what users type.
local SUBMODULE = {
  nn = "nn", ops = "nn.ops", bert = "bert", config = "bert.config",
  trainer = "train.loop", optim = "train.optim", amp = "train.amp", schedule = "train.schedule",
  checkpoint = "train.checkpoint", dist = "train.dist", safetensors = "io.safetensors",
  corpus = "data.corpus", tokenizer = "data.tokenizer", synthetic = "data.synthetic",
  pretraining_data = "data.pretraining", shards = "data.shards", loader = "data.loader",
  squad = "tasks.squad", glue = "tasks.glue", metrics = "tasks.metrics",
  options = "util.options", log = "util.log", fs = "util.fs", json = "util.json",
}

setmetatable(M, {
  __index = function(t, k)
    local name = type(k) == "string" and SUBMODULE[k]
    if not name then return nil end
    local mod = require("bertlua." .. name)
    rawset(t, k, mod)
    return mod
  end,
})

return M
