-- bertlua.runtime: the build, the devices, the CPU path, threads, stop signals and the process group —
-- the C runtime's state, below every model and training module (require "bertlua" re-exports all of it).
local core = require "bertlua.core"
local ffi, C, check = core.ffi, core.C, core.check

local M = {}

M.version = ffi.string(C.bl_version())

function M.cuda_available() return C.bl_cuda_device_count() > 0 end
function M.cuda_device_count() return C.bl_cuda_device_count() end
-- TF32 tensor-core GEMMs for f32 on the GPU (on) or exact f32 (off)
function M.cuda_set_tf32(on) C.bl_cuda_set_tf32(on and 1 or 0) end
-- name of GPU `dev` (0-based), or nil when it cannot be read
function M.cuda_device_name(dev)
  local nb = ffi.new("char[256]")
  if C.bl_cuda_device_name(dev, nb, 256) ~= 0 then return nil end
  return ffi.string(nb)
end
-- wait until GPU `dev` has finished its queued work
function M.cuda_synchronize(dev) check(C.bl_cuda_synchronize(dev)) end
-- emulated device only: record launches without running large work (the step-time model of a large model)
function M.cuda_dry_run(dev, on) check(C.bl_cuda_dry_run(dev, on and 1 or 0)) end
function M.cuda_compiled() return C.bl_cuda_compiled() == 1 end
-- what cuda:dev has done since the start: {syncs=, mallocs=, frees=, launches=, graph_launches=, graph_kernels=,
-- pageable_h2d=} (host-blocking calls, device allocations, uploads from pageable host memory; launches,
-- graph_kernels and pageable_h2d are -1 on a real GPU)
function M.cuda_counters(dev)
  local c = ffi.new("bl_cuda_count")
  check(C.bl_cuda_counters(dev, c))
  return { syncs = tonumber(c.syncs), mallocs = tonumber(c.mallocs), frees = tonumber(c.frees),
    launches = tonumber(c.launches), graph_launches = tonumber(c.graph_launches),
    graph_kernels = tonumber(c.graph_kernels), pageable_h2d = tonumber(c.pageable_h2d) }
end
function M.nccl_compiled() return C.bl_nccl_compiled() == 1 end
function M.num_threads() return C.bl_num_threads() end
function M.set_num_threads(n) C.bl_set_num_threads(n) end
-- set_cpu_isa(name): the vector path of our CPU ops (as BL_CPU_ISA: amx, avx512, avx2, baseline; amx is avx512
-- with the bf16/int8 inference GEMMs on AMX tiles); an error for one this CPU (or OS) lacks
function M.set_cpu_isa(name) check(C.bl_cpu_set_isa(name)) end
-- cpu_has(feature) -> true when the CPU ops can use it now: "avx2", "avx512", "amx" (the path in use is at
-- least that), "avx512_bf16", "avx512_vnni" (on the CPU and the AVX-512 or amx path in use)
function M.cpu_has(feature) return C.bl_cpu_has(feature) == 1 end
-- cpu_isa() -> "amx", "avx512", "avx2" or "baseline": the path in use
function M.cpu_isa() return ffi.string(C.bl_cpu_isa()) end
-- SIGINT/SIGTERM recorded instead of killing: loops poll stop_signal() (0 or the signal) and stop together
function M.stop_watch() C.bl_stop_watch() end
function M.stop_signal() return C.bl_stop_signal() end
-- "cpu: <model>; kernels avx2 (CPU: avx512 avx512_bf16); BLAS: OpenBLAS ... Haswell ...": the ISA path
-- of our CPU ops (BL_CPU_ISA caps it) and the BLAS build and core, for benchmark outputs
function M.cpu_line()
  return "cpu: " .. ffi.string(C.bl_cpu_info()) .. "; GEMM: " .. ffi.string(C.bl_gemm_backend()) .. "; BLAS: "
    .. ffi.string(C.bl_blas_info())
end
function M.bytes_in_use() return tonumber(C.bl_storage_bytes_in_use()) end
-- The CPU block cache (src/tensor/alloc.c): cpu_cache_stats() -> { maps, unmaps, hits, cached_bytes,
-- mapped_bytes, limit_bytes }; cpu_cache_release() unmaps the free blocks (returns the bytes);
-- cpu_cache_set_limit(bytes) bounds the free blocks kept (0: none)
function M.cpu_cache_stats()
  local s = ffi.new("bl_cpu_cache_stats")
  C.bl_cpu_cache_get_stats(s)
  return { maps = tonumber(s.maps), unmaps = tonumber(s.unmaps), hits = tonumber(s.hits),
    cached_bytes = tonumber(s.cached_bytes), mapped_bytes = tonumber(s.mapped_bytes),
    limit_bytes = tonumber(s.limit_bytes) }
end
function M.cpu_cache_release() return tonumber(C.bl_cpu_cache_release()) end
function M.cpu_cache_set_limit(bytes) check(C.bl_cpu_cache_set_limit(bytes)) end
-- The words before a peer program's command (PyTorch in the benchmarks; a list for
-- bertlua.util.shell) that run it in the environment the user gave: the host sets
-- thread-waiting variables for itself (src/host/main.c) and lists them in
-- BERTLUA_THREAD_ENV_SET, not for others. `vars` ({ "NAME=value", ... }) are set for it.
function M.peer_env(vars)
  local words = { "env" }
  local set = os.getenv("BERTLUA_THREAD_ENV_SET")
  if set then
    words[#words + 1] = "-u"; words[#words + 1] = "BERTLUA_THREAD_ENV_SET"
    for name in set:gmatch("[%w_]+") do words[#words + 1] = "-u"; words[#words + 1] = name end
  end
  for _, v in ipairs(vars or {}) do words[#words + 1] = v end
  return words
end

-- process group (MPI when launched by mpirun/srun, else a world of one)
M.rank = function() return C.bl_dist_rank() end
M.world_size = function() return C.bl_dist_size() end
M.local_rank = function() return C.bl_dist_local_rank() end

return M
