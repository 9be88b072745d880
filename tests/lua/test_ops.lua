-- bertlua.nn.ops from Lua: the wrappers allocate the right shapes, agree with
-- the tensor library's own math on random inputs, accept strided views, and
-- turn C errors into Lua errors naming the op and the shapes. Numerics in
-- depth (gradient checks, PyTorch) are in tests/c/test_ops*.c.
local T = require "testing"
local bl = require "bertlua"
local ops = require "bertlua.nn.ops"

local function randn(shape, seed) return bl.randn(shape, { seed = seed, offset = 0 }) end
local function close(a, b, tol) T.truthy(a:allclose(b, tol or 1e-5, tol or 1e-5), "tensors differ") end

T.test("linear forward/backward match matmul", function()
  local x, w, b = randn({ 3, 7, 10 }, 1), randn({ 6, 10 }, 2), randn({ 6 }, 3)
  local y = ops.linear(x, w, b)
  T.eq(bl.shape_str(y:shape()), "[3,7,6]")
  local x2 = x:view({ 21, 10 })
  close(y:view({ 21, 6 }), x2:matmul(w:t()) + b:view({ 1, 6 }))
  local dy = randn({ 3, 7, 6 }, 4)
  local dw, db = bl.zeros({ 6, 10 }), bl.zeros({ 6 })
  local dx = ops.linear_backward(dy, x, w, { dw = dw, db = db })
  close(dx:view({ 21, 10 }), dy:view({ 21, 6 }):matmul(w))
  close(dw, dy:view({ 21, 6 }):t():matmul(x2))
  ops.linear_backward(dy, x, w, { dx = false, dw = dw })
  close(dw, dy:view({ 21, 6 }):t():matmul(x2) * 2)
  -- [CLS] rows as a strided view: same as the contiguous copy
  local cls = x:select(2, 1)
  close(ops.linear(cls, w, b), ops.linear(cls:contiguous(), w, b))
  T.raises(function() ops.linear(bl.zeros({ 4, 7 }), bl.zeros({ 5, 6 })) end,
    "linear: input [4,7] and weight [5,6] are not compatible")
  T.raises(function() ops.linear_backward(dy, x, w, { dx = false, db = bl.zeros({ 5 }) }) end,
    "linear_backward: grad_bias [5] does not match weight [6,10]")
  -- the fused tanh-GELU pair's CPU twin: FC1's bias gradient is checked against FC2's weight
  local pre = randn({ 21, 6 }, 8)
  local dy2, w2 = randn({ 21, 4 }, 9), randn({ 4, 6 }, 10)
  T.raises(function() ops.linear_dgelu_tanh_backward(dy2, w2, pre, bl.zeros({ 4 })) end,
    "linear_dgelu_tanh_backward: grad_bias [4] does not match FC2 weight [4,6]")
end)

T.test("layernorm, residual layernorm, gelu, tanh, softmax", function()
  local x, g, b = randn({ 3, 7, 10 }, 5), randn({ 10 }, 6), randn({ 10 }, 7)
  local y, mean, rstd = ops.layernorm(x, g, b)
  T.eq(mean:numel(), 21)
  -- row 1 by hand
  local row = x:view({ 21, 10 }):tolist()[1]
  local m, v = 0, 0
  for i = 1, 10 do m = m + row[i] / 10 end
  for i = 1, 10 do v = v + (row[i] - m) ^ 2 / 10 end
  local gl, bt = g:tolist(), b:tolist()
  local yr = y:view({ 21, 10 }):tolist()[1]
  for i = 1, 10 do T.near(yr[i], (row[i] - m) / math.sqrt(v + 1e-12) * gl[i] + bt[i], 1e-5, 1e-5) end
  local r = randn({ 3, 7, 10 }, 8)
  local y2 = ops.residual_layernorm(x, r, g, b)
  close(y2, (ops.layernorm(x + r, g, b)))
  local dy = randn({ 3, 7, 10 }, 9)
  local dg1, dg2 = bl.zeros({ 10 }), bl.zeros({ 10 })
  local dx1 = ops.layernorm_backward(dy, x + r, g, mean, rstd, nil, nil)  -- shapes only
  T.eq(dx1:numel(), 210)
  local _, m2, r2 = ops.layernorm(x + r, g, b)
  local dxa = ops.layernorm_backward(dy, x + r, g, m2, r2, dg1)
  local _, mr, rr = ops.residual_layernorm(x, r, g, b)
  local dxb, dres = ops.residual_layernorm_backward(dy, x, r, g, mr, rr, { dgamma = dg2 })
  close(dxa, dxb); close(dres, dxb); close(dg1, dg2)
  -- the preceding linear's bias gradient from the same pass: dbias += the column sums of dx (with dropout: of the
  -- masked, scaled dx), summed here by the tensor library
  local c0 = randn({ 10 }, 10)
  local dc = c0:clone()
  local dxp = ops.residual_layernorm_backward(dy, x, r, g, mr, rr, { dbias = dc, p = 0.3, seed = 7, offset = 11 })
  close(dc, c0 + dxp:view({ 21, 10 }):sum(1))
  -- gelu = 0.5 x (1 + erf(x / sqrt 2)); tanh; bias_gelu
  local gx = ops.gelu(x)
  close(gx, x * 0.5 * ((x * (1 / math.sqrt(2))):erf() + 1))
  close(ops.bias_gelu(x, b), ops.gelu(x + b:view({ 1, 1, 10 })))
  close(ops.tanh(x), x:tanh())
  local s = ops.softmax(x, bl.zeros({ 3, 1, 10 }))
  T.near(s:sum(), 21, 1e-5)
  T.near(s:select(1, 2):select(1, 3):sum(), 1, 1e-6)
  T.raises(function() ops.gelu(bl.zeros({ 2 }, { dtype = "i32" })) end, "gelu: input must be f32/f64/f16/bf16, got i32")
end)

-- gelu_tanh (gelu_new) against the textbook tanh formula in double precision. The op evaluates y = v s,
-- s = 1 / (1 + exp(-2u)), u = K0 (v + K1 v^3) in f32: u carries ~3 ulp (6 ulp ~ 4e-7 relative), which exp turns
-- into |2u| times that in s (|2u| <= 25 on [-6, 6]: 1e-5); the rest adds a few ulp. Hence 2e-5 relative, and 1e-6
-- absolute where y' = s + 2 v s (1 - s) K0 (1 + 3 K1 v^2) cancels (near v = -0.75) or y underflows (v << 0).
T.test("gelu_tanh (gelu_new) and its backward vs a double-precision reference", function()
  local K0, K1 = math.sqrt(2 / math.pi), 0.044715
  local function ref(v)
    local t = math.tanh(K0 * (v + K1 * v ^ 3))
    return 0.5 * v * (1 + t), 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * K0 * (1 + 3 * K1 * v * v)
  end
  local R, H = 9, 40
  local x = randn({ R, H }, 21) * 2.5
  x:view({ R * H }):narrow(1, 1, 121):copy_(bl.arange(-60, 61, 1, { dtype = "f32" }) * 0.1)   -- sweep [-6, 6]
  local b, dy = randn({ H }, 22) * 0.3, randn({ R, H }, 23)
  local xs, bs, dys = x:tolist(), b:tolist(), dy:tolist()
  local y, yb = ops.gelu_tanh(x), ops.gelu_tanh(x, b)
  local db = randn({ H }, 24)
  local db0 = db:tolist()
  local dx, dxb = ops.gelu_tanh_backward(dy, x), ops.gelu_tanh_backward(dy, x, b, db)
  local ys, ybs, dxs, dxbs, dbs = y:tolist(), yb:tolist(), dx:tolist(), dxb:tolist(), db:tolist()
  local col = {}
  for j = 1, H do col[j] = 0 end
  for i = 1, R do
    for j = 1, H do
      local v = xs[i][j]
      local f, g = ref(v)
      T.near(ys[i][j], f, 2e-5, 1e-6)
      T.near(dxs[i][j], dys[i][j] * g, 2e-5, 1e-6)
      f, g = ref(v + bs[j])
      T.near(ybs[i][j], f, 2e-5, 1e-6)
      T.near(dxbs[i][j], dys[i][j] * g, 2e-5, 1e-6)
      col[j] = col[j] + dys[i][j] * g
    end
  end
  for j = 1, H do T.near(dbs[j], db0[j] + col[j], 2e-5, 1e-5) end
  -- far in the negative tail y is a tiny negative number (the tanh form's 1 + tanh would give 0 or noise)
  local tail = ops.gelu_tanh(bl.from({ -8, -12, -40 })):tolist()
  T.truthy(tail[1] < 0 and tail[1] > -1e-20, "gelu_tanh(-8) is a tiny negative number")
  T.truthy(tail[2] <= 0 and tail[3] <= 0, "no NaN or positive value in the far tail")
  T.raises(function() ops.gelu_tanh_backward(dy, x, nil, db) end, "gelu_tanh_backward: grad_bias given without a bias")
  T.raises(function() ops.gelu_tanh(x, bl.zeros({ 3 })) end, "gelu_tanh: bias [3] does not match the last dim of input")
end)

T.test("dropout reproducible from seed and offset", function()
  local x = bl.ones({ 1000 })
  local g = bl.Generator(123)
  local off = g:advance(x:numel())
  local y1, mask = ops.dropout(x, 0.25, g.seed, off, true)
  local y2 = ops.dropout(x, 0.25, g.seed, off)
  close(y1, y2, 0)
  T.eq(mask:dtype(), "u8")
  local kept = mask:to("f64"):sum()
  T.truthy(kept > 700 and kept < 800, "keep fraction " .. kept / 1000)
  T.near(y1:sum(), kept / 0.75, 1e-5)
  close(ops.dropout_backward(x, 0.25, g.seed, off), y1, 0)
  close(ops.dropout_backward(x, 0.25, 0, 0, mask), y1, 0)
  local y3 = ops.dropout(x, 0.25, g.seed, g:advance(x:numel()))
  T.truthy((y3 - y1):abs():sum() > 0, "next offset must give another mask")
end)

T.test("attention on fused QKV slices, losses, accuracy", function()
  local B, S, H, heads = 2, 5, 8, 2
  local qkv = randn({ B, S, 3 * H }, 10)
  local q, k, v = qkv:narrow(3, 1, H), qkv:narrow(3, H + 1, H), qkv:narrow(3, 2 * H + 1, H)
  local mask = bl.from({ { 1, 1, 1, 1, 1 }, { 1, 1, 1, 0, 0 } })
  local ctx, probs = ops.attention(q, k, v, mask, heads)
  T.eq(bl.shape_str(ctx:shape()), "[2,5,8]"); T.eq(bl.shape_str(probs:shape()), "[2,2,5,5]")
  local ctx2 = ops.attention(q:contiguous(), k:contiguous(), v:contiguous(), mask, heads)
  close(ctx, ctx2, 0)
  T.truthy(probs:select(1, 2):select(3, 5):sum() < 1e-3, "masked keys get ~no probability")
  local dq, dk, dv = ops.attention_backward(randn({ B, S, H }, 11), q, k, v, probs, heads)
  T.eq(bl.shape_str(dq:shape()), "[2,5,8]")
  T.eq(bl.shape_str(dk:shape()), "[2,5,8]"); T.eq(bl.shape_str(dv:shape()), "[2,5,8]")
  T.raises(function() ops.attention(q, k, v, mask, 3) end, "not divisible by 3 heads")

  local logits = bl.from({ { 2, 1, 0 }, { 0, 3, 0 }, { 1, 1, 5 } })
  local tg = bl.from({ 0, -100, 1 }, { dtype = "i64" })
  local loss, dl, n = ops.cross_entropy(logits, tg)
  T.eq(n, 2)
  local l1 = math.log(math.exp(2) + math.exp(1) + 1) - 2
  local l3 = math.log(2 * math.exp(1) + math.exp(5)) - 1
  T.near(loss, (l1 + l3) / 2, 1e-6)
  T.near(dl:tolist()[2], { 0, 0, 0 })
  local correct, count = ops.accuracy(logits, tg)
  T.eq(correct, 1); T.eq(count, 2)
  T.near(ops.argmax(logits):tolist(), { 0, 1, 2 })
  T.raises(function() ops.cross_entropy(logits, bl.from({ 0, 3, 1 }, { dtype = "i64" })) end,
    "cross_entropy: target 3 at row 1 is out of range for 3 classes")
  local mse, dp = ops.mse_loss(bl.from({ 1, 2 }), bl.from({ 0, 4 }))
  T.near(mse, 2.5, 1e-6); T.near(dp:tolist(), { 1, -2 })
  -- embedding + gather
  local tbl = randn({ 11, 4 }, 12)
  local ids = bl.from({ { 1, 10 }, { 3, 3 } }, { dtype = "i32" })
  local e = ops.embedding(tbl, ids)
  close(e:select(1, 2):select(1, 1), tbl:select(1, 4))
  T.raises(function() ops.embedding(tbl, bl.from({ 11 }, { dtype = "i32" })) end,
    "id 11 at position 0 is out of range for vocabulary size 11")
  -- the embedding block names the position and token type tables, not the vocabulary
  local pos_t, type_t, g, b = randn({ 3, 4 }, 13), randn({ 2, 4 }, 14), bl.ones({ 4 }), bl.zeros({ 4 })
  local i32 = function(x) return bl.from(x, { dtype = "i32" }) end
  T.raises(function() ops.embedding_layernorm({ tbl, pos_t, type_t }, { i32({ 1, 2 }), i32({ 0, 3 }), i32({ 0, 0 }) },
    g, b) end, "position id 3 at position 1 is out of range for the position table's max_position_embeddings 3")
  T.raises(function() ops.embedding_layernorm({ tbl, pos_t, type_t }, { i32({ 1, 2 }), i32({ 0, 1 }), i32({ 2, 0 }) },
    g, b) end, "token type id 2 at position 0 is out of range for the token type table's type_vocab_size 2")
  local gsel = ops.gather(e, bl.from({ 3, 0 }, { dtype = "i64" }))
  close(gsel:select(1, 1), tbl:select(1, 4))
end)

T.run()
