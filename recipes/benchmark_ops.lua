-- Per-op CPU timings of the ops one BERT training step is made of, side by
-- side with PyTorch on the same shapes and thread count.
--
--   bertlua recipes/benchmark_ops.lua --threads=2 --size=base
--   bertlua recipes/benchmark_ops.lua --size=mini --only=attention_fwd,attention_fwdbwd --compare=
--   bertlua recipes/benchmark_ops.lua --seq=384 --threads=1 --isa=avx512,avx2 --only=attention_fwdbwd --compare=
--   bertlua recipes/benchmark_ops.lua --seq=336 --threads=1 --isa=avx512,avx2 --only=attention_infer --compare=
--
-- Each row is the median (and, in parentheses, the minimum) over --reps
-- timed repetitions after one untimed warm-up; "fwdbwd" rows time forward and backward together. Outputs
-- are preallocated and reused (as the nn modules do). The PyTorch side is
-- tools/peers/bench_ops_torch.py (Hugging Face's formulation of each op, f32,
-- torch.set_num_threads(--threads)); ratio = torch ms / bertlua ms, so > 1
-- means bertlua is faster.
local bl = require "bertlua"
local ops = require "bertlua.nn.ops"
local options = require "bertlua.util.options"
local log = require "bertlua.util.log"
local shell = require "bertlua.util.shell"
-- the peers (PyTorch, ...) are in tools/peers, beside recipes/ in the source tree and installed
local PEERS = require("bertlua.util.fs").recipe("../tools/peers/")

local opt = options.parse(arg, {
  { "threads", 2, "CPU threads for us and for PyTorch" },
  { "size", "base", "base (B=8 S=128 H=768 I=3072 12 heads) or mini (B=32 S=128 H=256 I=1024 4 heads)" },
  { "reps", 7, "timed repetitions per op (median reported)" },
  { "only", "", "comma-separated op names to run (default all)" },
  { "seq", 0, "sequence length instead of the size's 128 (batch scaled to keep B*S tokens)" },
  { "isa", "", "comma-separated ISA paths (avx512,avx2,baseline) timed in turns, rep by rep: one row per path" },
  { "compare", "torch", "'torch' runs peers/bench_ops_torch.py for the same rows; empty: ours only" },
  { "python", os.getenv("BL_PYTHON") or "/usr/bin/python3", "python with torch" },
}, { usage = "bertlua recipes/benchmark_ops.lua [options]" })
print("benchmark_ops options:\n" .. options.show(opt))
print(bl.cpu_line())

local SIZES = {
  base = { B = 8, S = 128, H = 768, I = 3072, NH = 12, V = 30528, M = 20 },
  mini = { B = 32, S = 128, H = 256, I = 1024, NH = 4, V = 30528, M = 20 },
}
local z = SIZES[opt.size]
if not z then error("benchmark_ops: --size must be base or mini, got '" .. opt.size .. "'", 0) end
if opt.reps < 1 then error("benchmark_ops: --reps must be >= 1", 0) end
bl.set_num_threads(opt.threads)
local B, S, H, I, NH, V, M = z.B, z.S, z.H, z.I, z.NH, z.V, z.M
if opt.seq > 0 then
  if opt.compare ~= "" then error("benchmark_ops: --seq needs --compare= (the PyTorch peer has the fixed sizes)", 0) end
  B, S = math.max(1, math.floor(B * S / opt.seq)), opt.seq
end
local p = 0.1
local only = {}
for name in opt.only:gmatch("[^,]+") do only[name] = true end
local wanted = next(only) == nil and function() return true end or function(n) return only[n] end

print(("bertlua threads %d size %s B=%d S=%d H=%d I=%d heads=%d"):format(bl.num_threads(), opt.size, B, S, H, I, NH))

local seed = 0
local function rn(shape) seed = seed + 1; return bl.randn(shape, { seed = seed, offset = 0 }) end

-- --isa: the paths take turns within each op's reps, so a shared machine's load drifts over all alike
local isas = {}
for name in opt.isa:gmatch("[^,]+") do isas[#isas + 1] = name end
if #isas > 0 and opt.compare ~= "" then error("benchmark_ops: --isa needs --compare= (our paths only)", 0) end
local paths = #isas > 0 and isas or { false }
local function use(path) if path then bl.set_cpu_isa(path) end end

local rows, order = {}, {}
local function median(ts)
  table.sort(ts)
  return (#ts % 2 == 1) and ts[(#ts + 1) / 2] or 0.5 * (ts[#ts / 2] + ts[#ts / 2 + 1])
end
local function bench(name, fn, flop)
  if not wanted(name) then return end
  local ts = {}
  for i, path in ipairs(paths) do use(path); fn(); ts[i] = {} end
  for r = 1, opt.reps do
    for i, path in ipairs(paths) do
      use(path)
      local t0 = log.clock()
      fn()
      ts[i][r] = (log.clock() - t0) * 1e3
    end
  end
  for i, path in ipairs(paths) do
    local row = path and (name .. "@" .. path) or name
    local med = median(ts[i])
    rows[row] = { med = med, min = ts[i][1], flop = flop }
    order[#order + 1] = row
    io.stderr:write(("  %-20s %9.3f ms\n"):format(row, med))
  end
end

-- linear ---------------------------------------------------------------------
for _, L in ipairs({ { "linear_h_i", H, I }, { "linear_i_h", I, H } }) do
  local name, fin, fout = L[1], L[2], L[3]
  local x, w, b, dy = rn({ B * S, fin }), rn({ fout, fin }), rn({ fout }), rn({ B * S, fout })
  local y, dx, dw, db = bl.empty({ B * S, fout }), bl.empty({ B * S, fin }), bl.zeros({ fout, fin }), bl.zeros({ fout })
  bench(name .. "_fwd", function() ops.linear(x, w, b, y) end)
  bench(name .. "_fwdbwd", function()
    ops.linear(x, w, b, y)
    ops.linear_backward(dy, x, w, { dx = dx, dw = dw, db = db })
  end)
end

-- attention ------------------------------------------------------------------
do
  local q, k, v, dctx = rn({ B, S, H }), rn({ B, S, H }), rn({ B, S, H }), rn({ B, S, H })
  local km = bl.ones({ B, S })
  km:narrow(2, S - math.floor(S / 8) + 1, math.floor(S / 8)):fill_(0)  -- last S/8 tokens padded
  local ctx, probs = bl.empty({ B, S, H }), bl.empty({ B, NH, S, S })
  local dq, dk, dv = bl.empty({ B, S, H }), bl.empty({ B, S, H }), bl.empty({ B, S, H })
  local o = { p = p, seed = 7, offset = 0, out = ctx, probs = probs }
  local ob = { p = p, seed = 7, offset = 0, dq = dq, dk = dk, dv = dv }
  local f = 4 * B * S * S * H  -- Q K^T and P V: 2 S^2 d each per (b, head); the backward has 4 such products
  bench("attention_fwd", function() ops.attention(q, k, v, km, NH, o) end, f)
  bench("attention_fwdbwd", function()
    ops.attention(q, k, v, km, NH, o)
    ops.attention_backward(dctx, q, k, v, probs, NH, ob)
  end, 3 * f)
end

-- packed inference attention: B sequences of S tokens back to back, no mask, no dropout (ours only: the PyTorch
-- peer has no such row); GFLOP/s counts the two products, 4 S^2 d per (sequence, head) -----------------------
do
  local q, k, v = rn({ 1, B * S, H }), rn({ 1, B * S, H }), rn({ 1, B * S, H })
  local offs = {}
  for b = 0, B do offs[b + 1] = b * S end
  local offsets, ctx = bl.from(offs, { dtype = "i32" }), bl.empty({ 1, B * S, H })
  bench("attention_infer", function() ops.attention_packed(q, k, v, offsets, NH, ctx) end, 4 * B * S * S * H)
end

-- bias + GELU --------------------------------------------------------------------
do
  local x, b, dy = rn({ B, S, I }), rn({ I }), rn({ B, S, I })
  local y, dx, db = bl.empty({ B, S, I }), bl.empty({ B, S, I }), bl.zeros({ I })
  bench("bias_gelu_fwd", function() ops.bias_gelu(x, b, y) end)
  bench("bias_gelu_fwdbwd", function()
    ops.bias_gelu(x, b, y)
    ops.bias_gelu_backward(dy, x, b, db, dx)
  end)
end

-- dropout + residual + LayerNorm, LayerNorm, dropout ----------------------------------
do
  local x, r, g, be, dy = rn({ B, S, H }), rn({ B, S, H }), rn({ H }), rn({ H }), rn({ B, S, H })
  local y, dx, dres = bl.empty({ B, S, H }), bl.empty({ B, S, H }), bl.empty({ B, S, H })
  local mean, rstd = bl.empty({ B * S }), bl.empty({ B * S })
  local dg, dbe = bl.zeros({ H }), bl.zeros({ H })
  local o = { p = p, seed = 3, offset = 0, out = y, mean = mean, rstd = rstd }
  local ob = { p = p, seed = 3, offset = 0, dgamma = dg, dbeta = dbe, dx = dx, dres = dres }
  local function rln() ops.residual_layernorm(x, r, g, be, o) end
  bench("residual_ln_fwd", rln)
  bench("residual_ln_fwdbwd", function()
    rln()
    ops.residual_layernorm_backward(dy, x, r, g, mean, rstd, ob)
  end)
  bench("layernorm_fwdbwd", function()
    ops.layernorm(x, g, be, 1e-12, y, mean, rstd)
    ops.layernorm_backward(dy, x, g, mean, rstd, dg, dbe, dx)
  end)
  bench("dropout_fwdbwd", function()
    ops.dropout(x, p, 5, 0, false, y)
    ops.dropout_backward(dy, p, 5, 0, nil, dx)
  end)
end

-- MLM cross-entropy (forward + dlogits) ---------------------------------------------
do
  local logits = rn({ B * M, V })
  local tgt = (bl.rand({ B * M }, { seed = 99, offset = 0 }) * (V - 1)):to("i64")
  local loss, dlogits = bl.empty({ 1 }, { dtype = "f64" }), bl.empty({ B * M, V })
  local o = { loss = loss, dlogits = dlogits }
  bench("cross_entropy", function() ops.cross_entropy(logits, tgt, o) end)
end

-- tensor arithmetic (the tensor core's f32 fast paths) ----------------------------------
do
  local a, b, out = rn({ B, S, H }), rn({ B, S, H }), bl.empty({ B, S, H })
  bench("add", function() a:add(b, out) end)
  bench("mul", function() a:mul(b, out) end)
  bench("scale", function() ops.affine(a, 0.5, 0, out) end)
end

-- the PyTorch side, then the table ------------------------------------------------------
local theirs = {}
if opt.compare == "torch" then
  local out = shell.read({ bl.peer_env { "OMP_NUM_THREADS=" .. opt.threads }, opt.python,
    PEERS .. "bench_ops_torch.py", "--threads=" .. opt.threads, "--size=" .. opt.size, "--reps=" .. opt.reps,
    "--only=" .. table.concat(order, ",") }, { stderr = "stdout" })
  for name, med, mn in out:gmatch("torch ([%w_]+) ([%d%.]+) ([%d%.]+)") do
    theirs[name] = { med = tonumber(med), min = tonumber(mn) }
  end
  if next(theirs) == nil then print("torch comparison failed:\n" .. out) end
elseif opt.compare ~= "" then
  error("benchmark_ops: --compare must be 'torch' or empty", 0)
end

-- median (min) in ms; ratio = torch / bertlua on the medians (on the minima); GFLOP/s of ours at the minimum
print(("%-27s %20s %20s %18s %8s"):format("op", "bertlua ms", "torch ms", "torch/ours", "GFLOP/s"))
for _, name in ipairs(order) do
  local r, t = rows[name], theirs[name]
  print(("%-27s %20s %20s %18s %8s"):format(name, ("%.3f (%.3f)"):format(r.med, r.min),
    t and ("%.3f (%.3f)"):format(t.med, t.min) or "-",
    t and ("%.2fx (%.2fx)"):format(t.med / r.med, t.min / r.min) or "-",
    r.flop and ("%.1f"):format(r.flop / r.min * 1e-6) or ""))
end
