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

T.run()
