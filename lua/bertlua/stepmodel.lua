-- The step-time model: the time of one step on a named GPU, computed from the launches the step really makes.
-- Every kernel launch, cuBLASLt call, memset and copy states its FLOPs and the minimum bytes it must move
-- (kernels/*.cu, from its arguments; bl_cuda_record_* in bl_base.h). Each launch is charged
-- max(FLOPs / (engine peak x efficiency), bytes / (memory peak x efficiency)), times a slowdown for the attention
-- kernels, at least a minimum kernel time, plus a gap per launch (smaller for a launch captured into a CUDA graph:
-- bl_cuda_launch_rec.in_graph). It is a MODEL: the efficiencies are named assumptions (below, each with its source
-- or the word "assumed"), evaluated three times (slow, expected, fast) so that it gives a range, not one number.
-- scripts/gpu_check.sh measures the time of each launch class on a real GPU beside the model's, to calibrate them.
local ffi = require "ffi"
local core = require "bertlua.core"
local C, check = core.C, core.check

local M = {}

-- A profile: peak figures of the datasheet (numbers) and efficiencies or overheads as { slow, expected, fast,
-- source } (the slow scenario takes the first of every figure, the fast one the third). GEMMs are split by size
-- (FLOPs per call): large >= 2e10 (BERT-large's QKV, FFN and decoder GEMMs at 8192 tokens), medium >= 1e9, small
-- below. Attention kernels on tensor cores are charged their roofline times a slowdown: their FLOPs are a small
-- part of the step, their occupancy is not (the backward runs at 2 CTAs/SM, 241-255 registers: ptxas_check.sh).
local DS_H100 = "NVIDIA H100 Tensor Core GPU datasheet (SXM5: 989.4 TFLOP/s dense bf16, 494.7 tf32, "
  .. "66.9 f32, 3.35 TB/s HBM3)"
local DS_H200 = "NVIDIA H200 Tensor Core GPU datasheet (SXM: the H100's 989.4 TFLOP/s dense bf16, 494.7 tf32, "
  .. "66.9 f32; 4.8 TB/s HBM3e)"
local DS_A100 = "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM4: 312 TFLOP/s dense bf16, 156 tf32, 19.5 f32, "
  .. "2.039 TB/s HBM2e)"
local common = {
  mem_eff = { 0.80, 0.88, 0.93, "assumed: a streaming copy reaches ~90% of HBM peak (STREAM-like copies); "
    .. "fused kernels with reductions less" },
  attn_fwd = { 2.5, 1.8, 1.2, "assumed: slowdown over its roofline; FlashAttention-2 (Dao 2023, "
    .. "arXiv:2307.08691) reaches 50-73% of A100 peak forward, ours is simpler" },
  attn_bwd = { 3.5, 2.5, 1.5, "assumed: the backward runs at 2 CTAs/SM (241-255 registers); FlashAttention-2's "
    .. "backward is slower than its forward (~45-63% of A100 peak)" },
  launch_us = { 4.0, 3.0, 2.0, "assumed: back-to-back launches on one stream without a graph, 2-4 us typical" },
  graph_us = { 2.0, 1.0, 0.5, "assumed: per kernel node of a CUDA graph (issue 31: 1-2 us)" },
  min_us = { 3.0, 2.0, 1.5, "assumed: the shortest kernel from launch to completion" },
}
local function profile(t)
  for k, v in pairs(common) do if t[k] == nil then t[k] = v end end
  return t
end
M.profiles = {
  h100 = profile{ name = "H100 SXM", source = DS_H100, tc16 = 989.4e12, tf32 = 494.7e12, fp32 = 66.9e12,
    hbm = 3.35e12, pcie = { 45e9, 52e9, 55e9, "assumed: practical PCIe Gen5 x16 host copies" },
    gemm_large = { 0.60, 0.70, 0.80, "assumed: cuBLASLt bf16 at M=8192, N,K=1024-4096 (issue 31: 600-700 TFLOP/s "
      .. "plausible; large square GEMMs reach ~75-80% of peak)" },
    gemm_medium = { 0.45, 0.60, 0.72, "assumed: too few tiles to fill 132 SMs evenly" },
    gemm_small = { 0.15, 0.30, 0.50, "assumed: latency-bound GEMMs (pooler, NSP head)" },
  },
  a100 = profile{ name = "A100 80GB SXM", source = DS_A100, tc16 = 312e12, tf32 = 156e12, fp32 = 19.5e12,
    hbm = 2.039e12, pcie = { 20e9, 24e9, 25e9, "assumed: practical PCIe Gen4 x16 host copies" },
    gemm_large = { 0.70, 0.80, 0.88, "assumed: cuBLAS bf16 on A100 reaches a larger share of its (lower) peak "
      .. "than on H100 without Hopper's wgmma" },
    gemm_medium = { 0.55, 0.68, 0.80, "assumed" },
    gemm_small = { 0.20, 0.35, 0.55, "assumed" },
    -- NVIDIA DeepLearningExamples, PyTorch/LanguageModeling/BERT README, "Pre-training training performance:
    -- NVIDIA DGX A100 (8x A100 80GB)", per GPU; PaddlePaddle's BERT README for the same machine.
    published = { [128] = "580 seq/s (PyTorch), 694 (PaddlePaddle)",
                  [512] = "210 seq/s (PyTorch), 264 (PaddlePaddle)" },
  },
}
-- the H200: the H100's chip (its peaks, GEMM efficiencies, PCIe) with HBM3e
do
  local h = {}
  for k, v in pairs(M.profiles.h100) do h[k] = v end
  h.name, h.source, h.hbm = "H200 SXM", DS_H200, 4.8e12
  M.profiles.h200 = h
end
M.SCENARIOS = { "slow", "expected", "fast" }
local NAMED = { "gemm_large", "gemm_medium", "gemm_small", "mem_eff", "attn_fwd", "attn_bwd", "launch_us",
                "graph_us", "min_us", "pcie" }

-- The flat figures of profile p in scenario k (1 slow, 2 expected, 3 fast); a profile already flat is returned as
-- it is (its missing figures: efficiencies 1, overheads 0, no graph gap).
function M.scenario(p, k)
  if type(p.gemm_large) ~= "table" then return p end
  local f = { name = p.name, tc16 = p.tc16, tf32 = p.tf32, fp32 = p.fp32, hbm = p.hbm }
  for _, n in ipairs(NAMED) do f[n] = p[n][k] end
  return f
end

-- Printable list of profile p's figures with their sources.
function M.assumptions(p)
  local out = { ("  %s: peaks from the %s"):format(p.name, p.source or "profile") }
  for _, n in ipairs(NAMED) do
    local v = p[n]
    local fmt = n == "pcie" and "%.0f/%.0f/%.0f GB/s" or "%.2f/%.2f/%.2f"
    local scale = n == "pcie" and 1e-9 or 1
    out[#out + 1] = ("    %-11s " .. fmt .. "  %s"):format(n, v[1] * scale, v[2] * scale, v[3] * scale, v[4])
  end
  return table.concat(out, "\n")
end

local ENGINE = { [C.BL_ENGINE_MEM] = "mem", [C.BL_ENGINE_TC16] = "tc16", [C.BL_ENGINE_TF32] = "tf32",
                 [C.BL_ENGINE_FP32] = "fp32", [C.BL_ENGINE_PCIE] = "pcie" }

-- Runs fn(mark) with cuda:dev's launches recorded; returns the launch list, the host synchronisations fn made and
-- the marks fn set: mark(tag) notes that the launches from here on belong to a part named tag (parts() below).
-- timed: each launch is also timed with CUDA events (measured_s in the list; not the launches of a graph capture).
function M.record(dev, fn, timed)
  local c0, c1 = ffi.new("bl_cuda_count"), ffi.new("bl_cuda_count")
  check(C.bl_cuda_record_timing(dev, timed and 1 or 0))
  check(C.bl_cuda_record_begin(dev))   -- synchronises first: queued work is not the step's
  check(C.bl_cuda_counters(dev, c0))
  local marks, at = {}, ffi.new("int64_t[1]")
  local function mark(tag)
    check(C.bl_cuda_record_mark(dev, at))
    marks[#marks + 1] = { tag = tag, at = tonumber(at[0]) }
  end
  local ok, err = pcall(fn, mark)
  check(C.bl_cuda_counters(dev, c1))   -- before record_end's own wait for the recorded work
  local n = ffi.new("int64_t[1]")
  local rc = C.bl_cuda_record_end(dev, n)
  if not ok then error(err, 0) end
  check(rc)
  local list, r = {}, ffi.new("bl_cuda_launch_rec")
  for i = 0, tonumber(n[0]) - 1 do
    check(C.bl_cuda_record_get(i, r))
    list[#list + 1] = { name = ffi.string(r.name), cls = ffi.string(r.cls), engine = ENGINE[r.engine],
                        flops = r.flops, bytes = r.bytes, in_graph = r.in_graph ~= 0,
                        measured_s = r.measured_s >= 0 and r.measured_s or nil }
  end
  return list, tonumber(c1.syncs - c0.syncs), marks
end

-- The GEMM efficiency of a call of `flops` on flat figures p.
local function gemm_eff(p, flops)
  if flops >= 2e10 then return p.gemm_large or 1 end
  return (flops >= 1e9 and p.gemm_medium or p.gemm_small) or 1
end

-- Seconds of one launch on flat figures p (without the launch gap).
local function launch_time(l, p)
  if l.engine == "pcie" then return l.bytes / p.pcie end
  local t = l.bytes / (p.hbm * (p.mem_eff or 1))
  if l.flops > 0 then
    local rate = p[l.engine] * (l.cls == "gemm" and gemm_eff(p, l.flops) or 1)
    t = math.max(t, l.flops / rate)
  end
  if l.cls == "attention" and l.engine == "tc16" then
    t = t * ((l.name:find("bwd", 1, true) and p.attn_bwd or p.attn_fwd) or 1)
  end
  return math.max(t, (p.min_us or 0) * 1e-6)
end

-- Sums a launch list on profile p (scenario k, default expected) into per-class rows and totals: t.in_graph launches
-- were captured in a CUDA graph and pay the graph node gap instead of the launch gap. Fails when a launch stated no
-- cost.
function M.evaluate(list, p, k)
  p = M.scenario(p, k or 2)
  local by, rows, bad, items, item_list = {}, {}, {}, {}, {}
  local t = { launches = #list, gemm_s = 0, other_s = 0, gap_s = 0, other_bytes = 0, flops = 0, in_graph = 0 }
  for _, l in ipairs(list) do
    local gap = (l.in_graph and (p.graph_us or 0) or p.launch_us) * 1e-6
    t.gap_s = t.gap_s + gap
    if l.in_graph then t.in_graph = t.in_graph + 1 end
    if l.cls == "unannotated" then bad[#bad + 1] = l.name end
    local r = by[l.cls]
    if not r then
      r = { cls = l.cls, launches = 0, flops = 0, bytes = 0, s = 0 }
      by[l.cls] = r
      rows[#rows + 1] = r
    end
    local s = launch_time(l, p)
    r.launches, r.flops, r.bytes, r.s = r.launches + 1, r.flops + l.flops, r.bytes + l.bytes, r.s + s + gap
    if l.measured_s then r.measured_s = (r.measured_s or 0) + l.measured_s end
    local key = l.cls .. " / " .. l.name
    local it = items[key]
    if not it then
      it = { what = key, launches = 0, s = 0, bytes = 0, gemm = l.cls == "gemm" }
      items[key] = it
      item_list[#item_list + 1] = it
    end
    it.launches, it.s, it.bytes = it.launches + 1, it.s + s + gap, it.bytes + l.bytes
    t.flops = t.flops + l.flops
    if l.cls == "gemm" then t.gemm_s = t.gemm_s + s
    else
      t.other_s = t.other_s + s
      if l.engine ~= "pcie" then t.other_bytes = t.other_bytes + l.bytes end
    end
  end
  if #bad > 0 then
    error(("step-time model: %d launch(es) state no cost (kernels/*.cu must call cu_cost_kernel before them): %s")
      :format(#bad, table.concat(bad, ", ", 1, math.min(#bad, 5))), 0)
  end
  table.sort(rows, function(a, b) return a.s > b.s end)
  table.sort(item_list, function(a, b) return a.s > b.s end)
  t.step_s = t.gemm_s + t.other_s + t.gap_s
  t.items = item_list   -- per (class, kernel or calling op), largest first
  return rows, t
end

-- Step seconds of a launch list in each scenario of profile p: { slow, expected, fast }.
function M.range(list, p)
  local r = {}
  for k = 1, 3 do r[k] = select(2, M.evaluate(list, p, k)).step_s end
  return r
end

-- Printable report of a recorded step of `seqs` sequences on profile p (the expected scenario in detail, the range
-- of all three); all_items: list every non-GEMM item with its bytes (the breakdown), not only the largest items.
-- Classes whose launches carry a measured time (l.measured_s, scripts/gpu_check.sh) show it beside the model's.
function M.report(list, syncs, p, seqs, what, all_items)
  local rows, t = M.evaluate(list, p)
  local f = M.scenario(p, 2)
  t.range = M.range(list, p)
  local out = {}
  local function add(fmt, ...) out[#out + 1] = fmt:format(...) end
  add("step-time MODEL (not a measurement) of %s at %s figures:", what, p.name)
  add("  expected scenario: GEMMs at %.0f/%.0f/%.0f TFLOP/s (bf16 large/medium/small calls), memory at %.2f TB/s, "
    .. "%.1f us per launch, %.1f us per graph node, kernels >= %.1f us", f.tc16 * (f.gemm_large or 1) / 1e12,
    f.tc16 * (f.gemm_medium or 1) / 1e12, f.tc16 * (f.gemm_small or 1) / 1e12, f.hbm * (f.mem_eff or 1) / 1e12,
    f.launch_us, f.graph_us or 0, f.min_us or 0)
  local measured = false
  for _, r in ipairs(rows) do measured = measured or r.measured_s ~= nil end
  add("  %-14s %8s %11s %11s %10s %7s%s", "class", "launches", "GFLOP", "MB moved", "model ms", "share",
    measured and "  measured ms  measured/model" or "")
  for _, r in ipairs(rows) do
    add("  %-14s %8d %11.1f %11.1f %10.3f %6.1f%%%s", r.cls, r.launches, r.flops / 1e9, r.bytes / 1e6, r.s * 1e3,
      100 * r.s / t.step_s, r.measured_s and ("  %11.3f  %14.2f"):format(r.measured_s * 1e3, r.measured_s / r.s)
      or "")
  end
  local gemm_share = t.gemm_s / t.step_s
  add("  model step: %.2f ms = GEMM %.2f ms (%.1f%%) + non-GEMM %.2f ms (%.1f%%) + launch gaps %.2f ms (%.1f%%)",
    t.step_s * 1e3, t.gemm_s * 1e3, 100 * gemm_share, t.other_s * 1e3, 100 * t.other_s / t.step_s,
    t.gap_s * 1e3, 100 * t.gap_s / t.step_s)
  add("  model range: %.0f / %.0f / %.0f seq/s (slow / expected / fast scenario; %s)", seqs / t.range[1],
    seqs / t.range[2], seqs / t.range[3], t.in_graph == 0
    and "launched one by one; --cuda-graph records the step as a CUDA graph"
    or ("%d of %d launches captured in a CUDA graph"):format(t.in_graph, t.launches))
  add("  non-GEMM time incl. launch gaps: %.1f%% of the step; bytes moved by non-GEMM work: %.2f GB per step",
    100 * (1 - gemm_share), t.other_bytes / 1e9)
  add("  launches per step: %d; host synchronisations per step: %d; FLOPs per step: %.3g", t.launches, syncs, t.flops)
  add("  largest items (class / kernel, or the op a conversion served):")
  for i = 1, math.min(12, #t.items) do
    local it = t.items[i]
    add("    %-40s %6d launches %9.3f ms %6.1f%%", it.what, it.launches, it.s * 1e3, 100 * it.s / t.step_s)
  end
  if all_items then
    add("  every non-GEMM item (class / kernel): launches, MB moved (the bytes its launches state), model ms:")
    for _, it in ipairs(t.items) do
      if not it.gemm then
        add("    %-40s %6d %11.1f MB %9.3f ms", it.what, it.launches, it.bytes / 1e6, it.s * 1e3)
      end
    end
  end
  if p.source then add("  the figures (slow / expected / fast) and their sources:\n%s", M.assumptions(p)) end
  return table.concat(out, "\n"), t
end

-- NVIDIA DeepLearningExamples' BERT pre-training (PyTorch, scripts/configs/pretrain_config.sh, dgxa100_8gpu_fp16):
-- sequences per GPU per optimizer step (its train_batch_size; micro-batch x gradient_accumulation_steps: 64 x 128 in
-- phase 1, 16 x 256 in phase 2), by sequence length.
M.recipe = {
  [128] = { what = "NVIDIA's phase 1", seqs = 8192 },
  [512] = { what = "NVIDIA's phase 2", seqs = 4096 },
}

-- parts(list, marks) -> micro (a list of launch lists, one per micro-batch), step (the launch list of the rest):
-- a "micro" mark starts a micro-batch's part, any other mark (and the time before the first mark) the optimizer
-- step's part, which every optimizer step pays once whatever its accumulation.
function M.parts(list, marks)
  local micro, step, cur, m = {}, {}, nil, 1
  for i, l in ipairs(list) do
    while marks[m] and marks[m].at < i do
      if marks[m].tag == "micro" then
        cur = {}
        micro[#micro + 1] = cur
      else
        cur = step
      end
      m = m + 1
    end
    local into = cur or step
    into[#into + 1] = l
  end
  return micro, step
end

-- Printable split of a recorded step into its micro-batch parts and its per-optimizer-step part, and the bound each
-- accumulation in `accums` ({A, label} pairs) gives with micro-batches of b sequences: the first micro-batch, A - 1
-- later ones (the mean of the recorded later ones: they may differ from the first, e.g. by an accumulation add) and
-- the step part, all computed from the recorded launches. Returns the text and the rows.
function M.accum_report(list, marks, p, b, accums)
  local micro, step = M.parts(list, marks)
  if #micro == 0 then error("step-time model: the recorded step marked no micro-batch", 2) end
  local later = {}
  for i = 2, #micro do for _, l in ipairs(micro[i]) do later[#later + 1] = l end end
  local nl = math.max(#micro - 1, 1)
  local frows, ft = M.evaluate(micro[1], p)
  local lrows, lt = M.evaluate(#micro > 1 and later or micro[1], p)
  local srows, st = M.evaluate(step, p)
  local by, order = {}, {}
  local function row(cls)
    if not by[cls] then
      by[cls] = { cls = cls, first = 0, later = 0, step = 0 }
      order[#order + 1] = by[cls]
    end
    return by[cls]
  end
  for _, r in ipairs(frows) do row(r.cls).first = r.s end
  for _, r in ipairs(lrows) do row(r.cls).later = r.s / nl end
  for _, r in ipairs(srows) do row(r.cls).step = r.s end
  local out = {}
  local function add(fmt, ...) out[#out + 1] = fmt:format(...) end
  add("  split of the recorded step, computed from its launches (MODEL): the first micro-batch, each later one (mean "
    .. "of %d recorded) and the optimizer step", #micro - 1)
  add("  %-14s %11s %11s %10s", "class", "first ms", "later ms", "step ms")
  for _, r in ipairs(order) do
    add("  %-14s %11.3f %11.3f %10.3f", r.cls, r.first * 1e3, r.later * 1e3, r.step * 1e3)
  end
  local l_s, l_gemm, l_n = lt.step_s / nl, lt.gemm_s / nl, lt.launches / nl
  add("  first micro-batch %.2f ms (%d launches), each later %.2f ms (%d launches, non-GEMM incl. gaps %.2f ms); "
    .. "optimizer step %.2f ms (%d launches)", ft.step_s * 1e3, ft.launches, l_s * 1e3, l_n, (l_s - l_gemm) * 1e3,
    st.step_s * 1e3, st.launches)
  local fr, lr, sr = M.range(micro[1], p), M.range(#micro > 1 and later or micro[1], p), M.range(step, p)
  local res = {}
  for _, a in ipairs(accums) do
    local A = a[1]
    local t = ft.step_s + (A - 1) * l_s + st.step_s
    local gemm = ft.gemm_s + (A - 1) * l_gemm + st.gemm_s
    local range = {}   -- seq/s in the slow, expected and fast scenarios
    for k = 1, 3 do range[k] = A * b / (fr[k] + (A - 1) * lr[k] / nl + sr[k]) end
    res[#res + 1] = { accum = A, label = a[2], step_s = t, seqs_per_s = A * b / t, non_gemm = 1 - gemm / t,
                      range = range }
    add("  MODEL at accumulation %d%s: %.0f / %.0f / %.0f seq/s (slow / expected / fast), %.2f ms per optimizer "
      .. "step expected, non-GEMM %.1f%%", A, a[2] and (" (" .. a[2] .. ")") or "", range[1], range[2], range[3],
      t * 1e3, 100 * (1 - gemm / t))
  end
  return table.concat(out, "\n"), res
end

return M
