-- The step-time model: a lower bound on the time of one step on a named GPU, computed from the launches the step
-- really makes. Every kernel launch, cuBLASLt call, memset and copy states its FLOPs and the minimum bytes it must
-- move (kernels/*.cu, from its arguments; bl_cuda_record_* in bl_base.h). Each launch is charged
-- max(FLOPs / rate of its engine, bytes / memory bandwidth), plus a fixed gap per launch unless the launch was
-- captured into a CUDA graph (a step recorded with --cuda-graph: bl_cuda_launch_rec.in_graph). It is a MODEL: it
-- cannot see a kernel that is slower than its own minimum (poor occupancy, uncoalesced access, a quadratic loop), so
-- a real step takes longer; what it shows is where the time must go.
local ffi = require "ffi"
local core = require "bertlua.core"
local C, check = core.C, core.check

local M = {}

-- Rates of the engines and the memory system. tc16 is the bf16 GEMM rate measured with cuBLASLt on an H100 SXM
-- (80% of the 989 TFLOP/s dense peak); tf32 is its peak scaled by the same 80%; fp32 is the SIMT peak (no tensor
-- cores); hbm the HBM3 peak; pcie a practical Gen5 x16 rate; launch_us the gap between back-to-back launches on one
-- stream without graph capture (an assumption: 2-4 us is typical, the lower end is taken).
M.profiles = {
  h100 = { name = "H100 SXM", tc16 = 790e12, tf32 = 395e12, fp32 = 66.9e12, hbm = 3.35e12, pcie = 55e9,
           launch_us = 2.0 },
}

local ENGINE = { [C.BL_ENGINE_MEM] = "mem", [C.BL_ENGINE_TC16] = "tc16", [C.BL_ENGINE_TF32] = "tf32",
                 [C.BL_ENGINE_FP32] = "fp32", [C.BL_ENGINE_PCIE] = "pcie" }

-- Runs fn(mark) with cuda:dev's launches recorded; returns the launch list, the host synchronisations fn made and
-- the marks fn set: mark(tag) notes that the launches from here on belong to a part named tag (parts() below).
function M.record(dev, fn)
  local c0, c1 = ffi.new("bl_cuda_count"), ffi.new("bl_cuda_count")
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
                        flops = r.flops, bytes = r.bytes, in_graph = r.in_graph ~= 0 }
  end
  return list, tonumber(c1.syncs - c0.syncs), marks
end

-- Lower-bound seconds of one launch on profile p (without the launch gap).
local function launch_time(l, p)
  if l.engine == "pcie" then return l.bytes / p.pcie end
  local t = l.bytes / p.hbm
  if l.flops > 0 then t = math.max(t, l.flops / p[l.engine]) end
  return t
end

-- Sums a launch list on profile p into per-class rows and totals: t.in_graph launches were captured in a CUDA
-- graph and pay no launch gap. Fails when a launch stated no cost.
function M.evaluate(list, p)
  local by, rows, bad, items, item_list = {}, {}, {}, {}, {}
  local t = { launches = #list, gemm_s = 0, other_s = 0, gap_s = 0, other_bytes = 0, flops = 0, in_graph = 0 }
  for _, l in ipairs(list) do
    local gap = l.in_graph and 0 or p.launch_us * 1e-6
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

-- Printable report of a recorded step of `seqs` sequences on profile p; all_items: list every non-GEMM item with
-- its bytes (the breakdown), not only the largest items.
function M.report(list, syncs, p, seqs, what, all_items)
  local rows, t = M.evaluate(list, p)
  local out = {}
  local function add(fmt, ...) out[#out + 1] = fmt:format(...) end
  add("step-time MODEL (a lower bound, not a measurement) of %s at %s figures:", what, p.name)
  add("  GEMMs at %.0f TFLOP/s (bf16/f16), %.0f (tf32), %.1f (f32 SIMT); memory at %.2f TB/s; PCIe %.0f GB/s; "
    .. "%.1f us per launch", p.tc16 / 1e12, p.tf32 / 1e12, p.fp32 / 1e12, p.hbm / 1e12, p.pcie / 1e9, p.launch_us)
  add("  %-14s %8s %11s %11s %10s %7s", "class", "launches", "GFLOP", "MB moved", "model ms", "share")
  for _, r in ipairs(rows) do
    add("  %-14s %8d %11.1f %11.1f %10.3f %6.1f%%", r.cls, r.launches, r.flops / 1e9, r.bytes / 1e6, r.s * 1e3,
      100 * r.s / t.step_s)
  end
  local gemm_share = t.gemm_s / t.step_s
  add("  model step: %.2f ms = GEMM %.2f ms (%.1f%%) + non-GEMM %.2f ms (%.1f%%) + launch gaps %.2f ms (%.1f%%)",
    t.step_s * 1e3, t.gemm_s * 1e3, 100 * gemm_share, t.other_s * 1e3, 100 * t.other_s / t.step_s,
    t.gap_s * 1e3, 100 * t.gap_s / t.step_s)
  add("  model bound: %.0f seq/s (%s)", seqs / t.step_s, t.in_graph == 0
    and "launched one by one; --cuda-graph records the step as a CUDA graph"
    or ("%d of %d launches captured in a CUDA graph, without launch gaps"):format(t.in_graph, t.launches))
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
  local res = {}
  for _, a in ipairs(accums) do
    local A = a[1]
    local t = ft.step_s + (A - 1) * l_s + st.step_s
    local gemm = ft.gemm_s + (A - 1) * l_gemm + st.gemm_s
    res[#res + 1] = { accum = A, label = a[2], step_s = t, seqs_per_s = A * b / t, non_gemm = 1 - gemm / t }
    add("  MODEL bound at accumulation %d%s: %.0f seq/s, %.2f ms per optimizer step, non-GEMM %.1f%%", A,
      a[2] and (" (" .. a[2] .. ")") or "", A * b / t, t * 1e3, 100 * (1 - gemm / t))
  end
  return table.concat(out, "\n"), res
end

return M
