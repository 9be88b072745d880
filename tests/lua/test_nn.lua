-- bertlua.nn module contract: flat parameter/gradient buffers with views,
-- accumulation, buffer reuse, re-flatten keeping values, BERT's truncated
-- normal init, dropout in train/eval, activations against finite differences.
local T = require "testing"
local bl = require "bertlua"
local nn = require "bertlua.nn"

local function randn(shape, seed) return bl.randn(shape, { seed = seed, offset = 0 }) end
local function close(a, b, tol) T.truthy(a:allclose(b, tol or 1e-5, tol or 1e-5), "tensors differ") end

-- a small container to test the contract without BERT
local Net = nn.class("TestNet")
function Net:__init()
  nn.Module.__init(self)
  self:add("fc1", nn.Linear(6, 5))
  self:add("act", nn.GELU())
  self:add("ln", nn.LayerNorm(5))
  self:add("drop", nn.Dropout(0.5))
  self:add("fc2", nn.Linear(5, 3))
end
function Net:forward(x)
  self.h1 = self.fc1:forward(x)
  self.h2 = self.act:forward(self.h1)
  self.h3 = self.ln:forward(self.h2)
  self.h4 = self.drop:forward(self.h3)
  return self.fc2:forward(self.h4)
end
function Net:backward(x, dy)
  local d = self.fc2:backward(self.h4, dy)
  d = self.drop:backward(self.h3, d)
  d = self.ln:backward(self.h2, d)
  d = self.act:backward(self.h1, d)
  return self.fc1:backward(x, d)
end

T.test("flatten: one buffer, views with HF-style names, aligned offsets", function()
  local net = Net():flatten{ seed = 1 }
  local ps = net:parameters()
  local names = {}
  for i, p in ipairs(ps) do names[i] = p.name end
  T.eq(table.concat(names, " "), "fc1.weight fc1.bias ln.weight ln.bias fc2.weight fc2.bias")
  for _, p in ipairs(ps) do T.eq(p.offset % 16, 0, p.name .. " aligned") end
  -- views alias the flat buffers
  net.flat_params:fill_(0.25)
  T.eq(net.fc2.weight:get(2, 3), 0.25)
  net.fc1.grad_bias:fill_(3)
  T.eq(net.flat_grads:sum(), 15)
  net:zero_grad()
  T.eq(net.flat_grads:sum(), 0)
  T.eq(net:num_parameters(), 6 * 5 + 5 + 5 + 5 + 5 * 3 + 3)
  T.raises(function() Net():parameters() end, "call flatten() on the root module first")
end)

T.test("init: truncated normal (|w| <= 2 std, std ~0.02), LayerNorm 1/0, biases 0, reproducible", function()
  local a = nn.Linear(300, 200):flatten{ seed = 4 }
  local w = a.weight
  T.truthy(w:abs():max() <= 0.04 + 1e-7, "values beyond 2 std")
  local sd = math.sqrt((w * w):mean())
  -- std of a normal truncated at 2 sigma is 0.8796 sigma
  T.near(sd, 0.02 * 0.8796, 0.03)
  T.eq(a.bias:abs():max(), 0)
  local b = nn.Linear(300, 200):flatten{ seed = 4 }
  T.eq((a.weight - b.weight):abs():max(), 0, "same seed, same weights")
  local c = nn.Linear(300, 200):flatten{ seed = 5 }
  T.truthy((a.weight - c.weight):abs():max() > 0, "other seed, other weights")
  local ln = nn.LayerNorm(7):flatten()
  T.eq(ln.weight:sum(), 7); T.eq(ln.bias:sum(), 0)
end)

T.test("backward matches finite differences; gradients accumulate; buffers reused", function()
  local net = Net():flatten{ seed = 2 }
  net:eval()
  for _, p in ipairs(net:parameters()) do p.param:add_(bl.randn(p.shape, { seed = 9, offset = p.offset }) * 0.3) end
  local x = randn({ 4, 6 }, 3)
  local dy = randn({ 4, 3 }, 4)
  local function loss() return (net:forward(x) * dy):sum() end
  net:zero_grad()
  net:forward(x)
  local dx = net:backward(x, dy)
  local out_ptr = net.fc2.output.data_
  -- finite differences (f32 forward: eps 1e-2, loose tolerance) for a few weights and inputs
  for _, c in ipairs({ { net.fc1.weight, net.fc1.grad_weight, { 2, 3 } }, { net.ln.weight, net.ln.grad_weight, { 4 } },
    { net.fc2.bias, net.fc2.grad_bias, { 1 } }, { x, dx, { 3, 5 } } }) do
    local t, g, idx = c[1], c[2], c[3]
    local v = t:get(unpack(idx))
    t:set(v + 1e-2, unpack(idx)); local lp = loss()
    t:set(v - 1e-2, unpack(idx)); local lm = loss()
    t:set(v, unpack(idx))
    T.near(g:get(unpack(idx)), (lp - lm) / 2e-2, 2e-2, 1e-3)
  end
  T.truthy(net.fc2.output.data_ == out_ptr, "output buffer reused for the same shape")
  local g1 = net.flat_grads:clone()
  net:forward(x); net:backward(x, dy)
  close(net.flat_grads, g1 * 2)
  -- a new shape gets a new buffer
  net:forward(randn({ 5, 6 }, 8))
  T.eq(net.fc2.output:size(1), 5)
end)

T.test("dropout: active in train mode, identity in eval, mask regenerated in backward", function()
  local d = nn.Dropout(0.5):flatten{ seed = 3 }
  local x = bl.ones({ 1000 })
  local y = d:forward(x):clone()  -- the output buffer is reused by the next call
  local zeros = (y:eq(0)):sum()
  T.truthy(zeros > 400 and zeros < 600, "about half dropped: " .. zeros)
  T.eq((y:ne(0)):sum(), (y:eq(2)):sum(), "kept values scaled by 1/(1-p)")
  local dx = d:backward(x, bl.ones({ 1000 }))
  T.eq((dx - y):abs():max(), 0, "backward uses the forward's mask")
  local y2 = d:forward(x)
  T.truthy((y2 - y):abs():max() > 0, "a fresh mask per call")
  d:eval()
  T.truthy(d:forward(x) == x, "eval: identity")
  T.raises(function() nn.Dropout(0.1):forward(x) end, "call flatten() on the root")
end)

T.test("re-flatten after adding a module keeps existing values", function()
  local net = Net():flatten{ seed = 6 }
  local w = net.fc1.weight:clone()
  net:add("fc3", nn.Linear(3, 2))
  net:flatten()
  T.eq((net.fc1.weight - w):abs():max(), 0)
  T.eq(#net:parameters(), 8)
  T.truthy(net.fc3.weight:abs():max() > 0, "new module initialised")
end)

T.test("activations: ReLU, tanh-GELU, Tanh backward vs finite differences", function()
  for _, name in ipairs({ "relu", "gelu_new", "tanh", "gelu" }) do
    local a = nn.activation(name)
    local x = randn({ 50 }, 11)
    local dy = randn({ 50 }, 12)
    a:forward(x)
    local dx = a:backward(x, dy):clone()
    for _, i in ipairs({ 3, 17, 40 }) do
      local v = x:get(i)
      x:set(v + 1e-3, i); local lp = (a:forward(x) * dy):sum()
      x:set(v - 1e-3, i); local lm = (a:forward(x) * dy):sum()
      x:set(v, i)
      T.near(dx:get(i), (lp - lm) / 2e-3, 1e-2, 1e-3)
    end
  end
  T.raises(function() nn.activation("swish") end, "unknown activation 'swish'")
end)

-- criteria vs a double-precision reference on random logits. The ops compute
-- in f32 with f64 sums: relative errors of a few f32 ulps (~1e-6) on the loss
-- and on each gradient element, so 1e-5 leaves a margin of ten.
local function ce_reference(logits, targets, ignore, weight, scale)
  local L, t = logits:tolist(), targets:totable()
  local loss, count, grad, lse = 0, 0, {}, {}
  for i, row in ipairs(L) do
    local m, z = -math.huge, 0
    for _, v in ipairs(row) do m = math.max(m, v) end
    for _, v in ipairs(row) do z = z + math.exp(v - m) end
    lse[i] = m + math.log(z)
    if t[i] ~= ignore then loss, count = loss + lse[i] - row[t[i] + 1], count + 1 end
  end
  for i, row in ipairs(L) do
    grad[i] = {}
    for j, v in ipairs(row) do
      grad[i][j] = t[i] == ignore and 0 or (math.exp(v - lse[i]) - (j == t[i] + 1 and 1 or 0)) / count * weight * scale
    end
  end
  return loss / math.max(count, 1), grad, count
end

T.test("criteria: cross-entropy, span and pre-training losses and gradients vs a double reference", function()
  local logits = randn({ 6, 7 }, 21) * 3
  local targets = bl.from({ 2, -1, 6, 0, -1, 4 }, { dtype = "i32" })
  local ce = nn.CrossEntropyCriterion{ ignore_index = -1 }
  local loss, count = ce:forward(logits, targets)
  local want, grad, n = ce_reference(logits, targets, -1, 1, 3)
  T.eq(count, n)
  T.near(loss, want, 1e-5, 1e-6)
  T.near(ce:backward(logits, targets, 3):tolist(), grad, 1e-5, 1e-6)

  local st, en = randn({ 4, 5 }, 22), randn({ 4, 5 }, 23)
  local sp, ep = bl.from({ 0, 5, 3, 1 }, { dtype = "i32" }), bl.from({ 4, 5, 3, 2 }, { dtype = "i32" })
  local span = nn.SpanCriterion()
  local l, ls, le = span:forward({ st, en }, { sp, ep })
  local ws, gs = ce_reference(st, sp, 5, 0.5, 2)
  local we, ge = ce_reference(en, ep, 5, 0.5, 2)
  T.near(ls, ws, 1e-5, 1e-6); T.near(le, we, 1e-5, 1e-6); T.near(l, (ws + we) / 2, 1e-5, 1e-6)
  local d = span:backward({ st, en }, { sp, ep }, 2)
  T.near(d[1]:tolist(), gs, 1e-5, 1e-6); T.near(d[2]:tolist(), ge, 1e-5, 1e-6)

  local nsp, nlab = randn({ 6, 2 }, 24), bl.from({ 1, 0, 0, 1, 1, 0 }, { dtype = "i32" })
  local pt = nn.PreTrainingCriterion{ ignore_index = -1 }
  local total, mlm, nspl = pt:forward({ logits, nsp }, { targets, nlab })
  local wn, gn = ce_reference(nsp, nlab, -1, 1, 1)
  T.near(mlm, want, 1e-5, 1e-6); T.near(nspl, wn, 1e-5, 1e-6); T.near(total, want + wn, 1e-5, 1e-6)
  T.near(pt:backward({ logits, nsp }, { targets, nlab })[2]:tolist(), gn, 1e-5, 1e-6)
  T.eq(select(3, pt:forward({ logits, nil }, { targets, nil })), nil, "no NSP part without its logits")
end)

T.test("criteria: mean squared error and its gradient vs a double reference", function()
  local p, t = randn({ 8 }, 25), randn({ 8 }, 26)
  local mse = nn.MSECriterion()
  local pv, tv = p:totable(), t:totable()
  local want, grad = 0, {}
  for i = 1, 8 do want = want + (pv[i] - tv[i]) ^ 2 end
  for i = 1, 8 do grad[i] = 2 * (pv[i] - tv[i]) / 8 * 0.5 end
  T.near(mse:forward(p, t), want / 8, 1e-5, 1e-6)
  T.near(mse:backward(p, t, 0.5):totable(), grad, 1e-5, 1e-6)
end)

T.run()
