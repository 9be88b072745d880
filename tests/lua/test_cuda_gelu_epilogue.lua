-- The tanh GELU (gelu_new) in cuBLASLt's epilogues (kernels/linear.cu): nn.ops.linear_gelu_tanh (GELU_AUX_BIAS: y
-- and the pre-activation from one GEMM) and nn.ops.linear_dgelu_tanh_backward (FC2's dX GEMM with DGELU_BGRAD: the
-- gradient of the pre-activation and FC1's bias gradient) against their CPU twins (the unfused sequence), in f32,
-- bf16 and f16, on odd shapes; the fallback to the GEMM + activation kernel where cuBLASLt refuses (a leading
-- dimension that is not a multiple of 8); the launches the step-time model sees; a whole gelu_new BERT step.
-- Needs a CUDA device (the emulated one in CI).
--
-- Error bounds (element-wise, |gpu - cpu| <= bound), with u the unit roundoff of the output dtype (2^-24 f32,
-- 2^-8 bf16 (8 significant bits), 2^-11 f16) and e = 2^-24. The CPU runs in f32 on the same (rounded) inputs.
--   pre = x W^T + b: both sides sum the K products in f32 in different orders, each within K e S of the exact
--     sum (S = sum_k |x_k w_k| + |b|), then the GPU rounds to the dtype: u |pre| + 2 K e S. In bf16/f16 cuBLASLt
--     may round the product to the dtype before it adds the bias (seen on an H200 with cuBLASLt 13.0 for shapes
--     whose leading dimensions are no multiple of 8: every element matched round(round(x W^T) + b)): + u S.
--   y = gelu(pre): the epilogue applies GELU to its f32 (or, as above, rounded) sum, the fallback to the rounded
--     pre (r = u in bf16/f16, 0 in f32); |gelu'| <= 1.13, and the two tanh-GELU implementations (the CPU's
--     exp-based logistic, cuBLASLt's tanh) agree to f = 2^-18 relative (worst seen on the H200: 1.2 x 2^-20):
--     u |y| + 1.13 (r (|pre| + S) + 2 K e S) + f (|y| + |pre|).
--   dpre = (dy2 W2) .* gelu'(pre), on the same pre on both sides: dh = dy2 W2 as pre (S2 over n2 terms), possibly
--     rounded to the dtype first, then the product rounded: u |dpre| + 1.13 (r |dh| + 2 n2 e S2) + f |dh|.
--   db += column sums of dpre over M rows: the epilogue sums the f32 products and rounds the sum to the dtype
--     (bf16) or the column-sum kernel sums the rounded dpre (f16, fallback): u sum|dpre| + sum_r (dpre bound
--     without its u term) + 2 M e sum|dpre|.
local T = require "testing"
local bl = require "bertlua"
local ops = require "bertlua.nn.ops"
local stepmodel = require "bertlua.stepmodel"

if bl.cuda_device_count() == 0 then T.skip_all("no CUDA device (the emulated build provides one)") end

local E = 2 ^ -24
local U = { f32 = E, bf16 = 2 ^ -8, f16 = 2 ^ -11 }
local F = 2 ^ -18

-- uniform in [lo, hi) on the CPU, rounded through dtype so that both devices see the same values
local function rand(shape, seed, lo, hi, dtype)
  local t = bl.rand(shape, { seed = seed }) * (hi - lo) + lo
  return t:to(dtype):to("f32")
end
local function flat(t) return t:to{ dtype = "f64", device = "cpu" }:contiguous():view{ t:numel() }:totable() end

-- rows x cols arrays of S = sum_k |a[r,k] b[c,k]| (+ |bias[c]|): the scale of each dot product's rounding error
local function dot_scale(a, b, bias)
  local A, B, rows, cols, k = flat(a:abs()), flat(b:abs()), a:numel() / a:size(-1), b:size(1), b:size(2)
  local Bv = bias and flat(bias:abs())
  local s = {}
  for r = 0, rows - 1 do
    for c = 0, cols - 1 do
      local acc = Bv and Bv[c + 1] or 0
      for j = 0, k - 1 do acc = acc + A[r * k + j + 1] * B[c * k + j + 1] end
      s[r * cols + c + 1] = acc
    end
  end
  return s
end

local function check(what, got, want, bound)
  local g, w = flat(got), flat(want)
  T.eq(#g, #w, what .. ": sizes")
  local worst = 0
  for i = 1, #w do
    local d = math.abs(g[i] - w[i])
    if not (d <= bound(i)) then
      error(("%s: element %d gpu %.9g cpu %.9g, |diff| %.3g > bound %.3g"):format(what, i, g[i], w[i], d, bound(i)), 2)
    end
    worst = math.max(worst, d / bound(i))
  end
  return worst
end

local function classes(list)
  local n = {}
  for _, l in ipairs(list) do n[l.cls] = (n[l.cls] or 0) + 1 end
  return n
end

-- One forward and backward of FC1 -> tanh GELU -> FC2 on the CPU and on cuda:0. x [3, M/3, K], W1 [N, K],
-- W2 [N2, N]; returns the launches of the device forward and backward.
local function case(dtype, M, K, N, N2, seed)
  local u = U[dtype]
  local ru = dtype == "f32" and 0 or u   -- a 16-bit sum may be rounded before the epilogue (see the header)
  local x = rand({ 3, M / 3, K }, seed, -1.5, 1.5, dtype)
  local w, b = rand({ N, K }, seed + 1, -0.4, 0.4, dtype), rand({ N }, seed + 2, -1, 1, dtype)
  local w2, dy2 = rand({ N2, N }, seed + 3, -0.5, 0.5, dtype), rand({ 3, M / 3, N2 }, seed + 4, -1, 1, dtype)
  local db0 = rand({ N }, seed + 5, -1, 1, "f32")   -- db accumulates: start from non-zero values
  -- CPU twin (f32)
  local y, pre = ops.linear_gelu_tanh(x, w, b)
  local dpre_ref = ops.linear_dgelu_tanh_backward(dy2, w2, pre, nil)
  -- device
  local function dev(t) return t:to{ device = "cuda:0", dtype = dtype } end
  local gx, gw, gb, gw2, gdy2 = dev(x), dev(w), dev(b), dev(w2), dev(dy2)
  local gy, gpre
  local fwd = stepmodel.record(0, function() gy, gpre = ops.linear_gelu_tanh(gx, gw, gb) end)
  -- the backward on the CPU's pre rounded to the dtype, so that it is checked on its own
  local pre_r = pre:to(dtype):to("f32")
  local db_ref = db0:clone()
  local dpre_r = ops.linear_dgelu_tanh_backward(dy2, w2, pre_r, db_ref)
  local gdb, gpre_r = db0:to("cuda:0"), dev(pre_r)
  local gdpre
  local bwd = stepmodel.record(0, function() gdpre = ops.linear_dgelu_tanh_backward(gdy2, gw2, gpre_r, gdb) end)
  T.eq(gy:dtype(), dtype); T.eq(gpre:dtype(), dtype); T.eq(gdpre:dtype(), dtype)

  local S, S2 = dot_scale(x, w, b), dot_scale(dy2, w2:t():contiguous())
  local P, Y = flat(pre), flat(y)
  local tag = ("%s M=%d K=%d N=%d n2=%d"):format(dtype, M, K, N, N2)
  local r = {}
  r.pre = check("pre " .. tag, gpre, pre, function(i) return u * math.abs(P[i]) + ru * S[i] + 2 * K * E * S[i] end)
  r.y = check("y " .. tag, gy, y, function(i)
    return u * math.abs(Y[i]) + 1.13 * (ru * (math.abs(P[i]) + S[i]) + 2 * K * E * S[i])
      + F * (math.abs(Y[i]) + math.abs(P[i]))
  end)
  local DP, DH = flat(dpre_r), flat(dy2:view{ M, N2 }:matmul(w2))
  local inner = {}
  for i = 1, #DP do inner[i] = 1.13 * (ru * math.abs(DH[i]) + 2 * N2 * E * S2[i]) + F * math.abs(DH[i]) end
  r.dpre = check("dpre " .. tag, gdpre, dpre_r, function(i) return u * math.abs(DP[i]) + inner[i] end)
  local colabs, colerr = {}, {}
  for c = 1, N do colabs[c], colerr[c] = 0, 0 end
  for i = 1, #DP do
    local c = (i - 1) % N + 1
    colabs[c], colerr[c] = colabs[c] + math.abs(DP[i]), colerr[c] + inner[i]
  end
  r.db = check("db " .. tag, gdb, db_ref, function(c) return u * colabs[c] + colerr[c] + 2 * M * E * colabs[c] end)
  T.eq(#flat(dpre_ref), M * N)
  return fwd, bwd, r
end

T.test("fused forward and backward vs the CPU twin: f32, bf16, f16, odd M and K", function()
  for _, dtype in ipairs { "f32", "bf16", "f16" } do
    local fwd, bwd, r = case(dtype, 39, 29, 48, 19, 11)
    -- one GEMM each way with the GELU in its epilogue: no activation kernel
    local cf, cb = classes(fwd), classes(bwd)
    T.eq(#fwd, 1, dtype .. " forward launches"); T.eq(cf.gemm, 1)
    T.eq(cb.activation, nil, dtype .. " backward: no activation kernel")
    T.eq(cb.gemm, 1, dtype .. " backward GEMMs")
    print(("%s: worst error / bound: pre %.2f y %.2f dpre %.2f db %.2f"):format(dtype, r.pre, r.y, r.dpre, r.db))
  end
end)

T.test("the step-time model sees the pre-activation's bytes in the fused GEMMs", function()
  local M, K, N, N2 = 39, 29, 48, 19
  for _, dtype in ipairs { "f32", "bf16" } do
    local es = dtype == "f32" and 4 or 2
    local fwd, bwd = case(dtype, M, K, N, N2, 21)
    -- x, W read; y and AUX written; the bias read
    T.eq(fwd[1].bytes, es * (M * K + N * K + 2 * M * N + N), dtype .. " forward bytes")
    T.eq(fwd[1].flops, 2 * M * N * K)
    local g
    for _, l in ipairs(bwd) do if l.cls == "gemm" then g = l end end
    -- dy2, W2 read; AUX read; dpre written; the bias gradient written
    T.eq(g.bytes, es * (M * N2 + N2 * N + 2 * M * N + N), dtype .. " backward bytes")
  end
end)

T.test("fallback where cuBLASLt refuses: N = 45 is no multiple of 8 (the AUX leading dimension)", function()
  for _, dtype in ipairs { "f32", "bf16" } do
    local fwd, bwd, r = case(dtype, 21, 17, 45, 13, 31)
    local cf, cb = classes(fwd), classes(bwd)
    T.truthy((cf.activation or 0) >= 1 and cf.gemm == 1, dtype .. ": the GEMM, then the activation kernel")
    T.truthy((cb.activation or 0) >= 1 and cb.gemm == 1, dtype .. ": the GEMM, then the activation's derivative")
    print(("%s fallback: worst error / bound: pre %.2f y %.2f dpre %.2f db %.2f"):format(dtype, r.pre, r.y, r.dpre,
      r.db))
  end
end)

-- The emulated cuBLASLt finds no algorithm for the GELU epilogues (BL_EMU_LT_NO_ALGO, as a cuBLASLt or GPU without
-- them): the GEMMs run without the epilogue and the activation kernels after them. Shapes of their own, so that no
-- algorithm cached by the cases above is reused.
T.test("fallback where cuBLASLt has no algorithm for the epilogues", function()
  local ffi = require "ffi"
  ffi.cdef [[ int setenv(const char *name, const char *value, int overwrite); int unsetenv(const char *name); ]]
  local epi = { 164, 192, 208 }   -- GELU_AUX_BIAS, DGELU, DGELU_BGRAD
  ffi.C.setenv("BL_EMU_LT_NO_ALGO", table.concat(epi, ","), 1)
  local ok, err = pcall(function()
    for _, dtype in ipairs { "f32", "bf16", "f16" } do
      local fwd, bwd = case(dtype, 33, 23, 40, 11, 41)
      local cf, cb = classes(fwd), classes(bwd)
      T.truthy((cf.activation or 0) >= 1 and cf.gemm == 1, dtype .. ": the GEMM, then the activation kernel")
      T.truthy((cb.activation or 0) >= 1 and cb.gemm == 1, dtype .. ": the GEMM, then the activation's derivative")
    end
  end)
  ffi.C.unsetenv("BL_EMU_LT_NO_ALGO")
  if not ok then error(err, 0) end
end)

T.test("bad arguments name the op", function()
  local x, w = bl.rand({ 4, 8 }, { seed = 1, device = "cuda:0" }), bl.rand({ 16, 8 }, { seed = 2, device = "cuda:0" })
  T.raises(function() ops.linear_gelu_tanh(x, w, nil) end, "linear_gelu_tanh: the bias is required")
  local b = bl.rand({ 16 }, { seed = 3, device = "cuda:0" })
  T.raises(function() ops.linear_gelu_tanh(x, w, b, nil, bl.empty({ 4, 15 }, { device = "cuda:0" })) end,
    "must match output")
  local pre = bl.empty({ 4, 16 }, { device = "cuda:0" })
  T.raises(function() ops.linear_dgelu_tanh_backward(bl.rand({ 4, 5 }, { seed = 4, device = "cuda:0" }), w, pre) end,
    "linear_dgelu_tanh_backward: grad_output")
end)

-- A gelu_new BERT: CUDA vs CPU for forward, backward and one LAMB step; on CUDA no activation kernel runs in the
-- FFNs or the MLM head's transform (the pooler's tanh keeps its two).
T.test("a gelu_new BERT step on cuda:0 matches the cpu, with the GELUs in the GEMMs", function()
  local bert, config, optim = require "bertlua.bert", require "bertlua.bert.config", require "bertlua.train.optim"
  local cfg = config.new{ vocab_size = 96, hidden_size = 64, num_hidden_layers = 2, num_attention_heads = 4,
    intermediate_size = 128, max_position_embeddings = 64, hidden_act = "gelu_new" }
  local bt = require("fixtures").pretrain_batch(cfg.vocab_size, 3, 24, 4)
  local cpu = bert.BertForPreTraining(cfg, { seed = 3 })
  local gpu = bert.BertForPreTraining(cfg, { seed = 3 }):to("cuda:0")
  local lc, lg = cpu:forward(bt).loss, nil
  cpu:backward()
  local list = stepmodel.record(0, function() lg = gpu:forward(bt).loss; gpu:backward() end)
  T.near(lg, lc, 1e-4, 1e-6, "loss")
  -- left: the pooler's tanh forward and backward, and the MLM transform's GELU derivative (a LayerNorm follows it,
  -- so no GEMM's dX can take it); the erf model runs 2 per layer and 2 in the head besides
  T.eq(classes(list).activation, 3, "activation kernels")
  local g, c = flat(gpu.flat_grads), flat(cpu.flat_grads)
  local gmax = 0
  for i = 1, #c do gmax = math.max(gmax, math.abs(c[i])) end
  for i = 1, #c do
    T.truthy(math.abs(g[i] - c[i]) <= 2e-3 * gmax, ("gradient %d: gpu %.9g cpu %.9g"):format(i, g[i], c[i]))
  end
  -- LAMB's first step moves each weight by about lr * sign(gradient): weights whose exact gradient is 0 (the key
  -- bias) get rounding noise of either sign, so the step is compared through the next loss, not weight by weight
  for _, m in ipairs { cpu, gpu } do optim.LAMB{ model = m, lr = 1e-3, weight_decay = 0.01 }:step() end
  cpu:zero_grad(); gpu:zero_grad()
  local l2c, l2g = cpu:forward(bt).loss, gpu:forward(bt).loss
  T.truthy(math.abs(l2c - lc) > 1e-4, "the step changed the loss")
  T.near(l2g, l2c, 1e-4, 1e-6, "loss after one LAMB step")
end)

-- The recipe's bf16 step with accumulation 2 on a gelu_new config, captured in a CUDA graph and replayed: bit for
-- bit the run without the graph (the DGELU_BGRAD scratch is allocated inside the captured step).
T.test("gelu_new pre-training with --cuda-graph = without, bit for bit (bf16, accumulation 2)", function()
  local fx = require("pretrain_fixture").make(T)
  T.write_file(fx.tmp .. "/cfg.json", require("cjson").encode{ vocab_size = 600, hidden_size = 64,
    num_hidden_layers = 2, num_attention_heads = 2, intermediate_size = 128, max_position_embeddings = 64,
    hidden_act = "gelu_new" })
  local extra = "--batch1=16 --micro-batch=8 --steps1=4 --precision=bf16 --device=cuda --checkpoint-interval=0 "
    .. "--eval-batches=1"
  fx.run("plain", extra)
  fx.run("graph", extra .. " --cuda-graph")
  local a, b = fx.records(fx.tmp .. "/plain"), fx.records(fx.tmp .. "/graph")
  T.eq(#a, 4); T.eq(#b, 4)
  for i = 1, 4 do
    T.eq(b[i].loss, a[i].loss, "loss of step " .. i)
    T.eq(b[i].grad_norm, a[i].grad_norm, "gradient norm of step " .. i)
  end
  T.truthy(b[4].cuda_graph_replays >= 1, "replayed")
  T.truthy(fx.weights(fx.tmp .. "/plain") == fx.weights(fx.tmp .. "/graph"), "final weights bit for bit")
end)

T.run()
