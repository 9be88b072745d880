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
-- "cpu: <model>; kernels avx2 (CPU: avx512 avx512_bf16); BLAS: OpenBLAS ... Haswell ...": the ISA path
-- of our CPU ops (BL_CPU_ISA caps it) and the BLAS build and core, for benchmark outputs
function M.cpu_line()
  return "cpu: " .. ffi.string(C.bl_cpu_info()) .. "; GEMM: " .. ffi.string(C.bl_gemm_backend()) .. "; BLAS: "
    .. ffi.string(C.bl_blas_info())
end
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

setmetatable(M, {
  __index = function(t, k)
    if type(k) ~= "string" then return nil end
    local ok, mod = pcall(require, "bertlua." .. k)
    if ok then rawset(t, k, mod); return mod end
    if not tostring(mod):find("module 'bertlua." .. k .. "' not found", 1, true) then error(mod, 2) end
    return nil
  end,
})

return M
