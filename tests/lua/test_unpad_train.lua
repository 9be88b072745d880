-- Unpadded CPU training (BertModel.unpad_training, pretrain/benchmark --unpad): the real tokens of a batch packed
-- into [1, T, H] for every GEMM, LayerNorm, GELU and dropout, attention forward and backward per row
-- (bl_attention_forward / bl_attention_backward with offsets), against the padded step on the same model,
-- batches and dropout streams:
--  * pre-training with LAMB (the recipe's step, accumulation 2), fp32 and the CPU's bf16 emulation, on
--    every CPU path this machine has: per-step losses, gradient norm and the weights after the steps;
--  * the packed attention backward against central differences of its forward, with dropout;
--  * the packed attention's dropout against the padded op's at the real positions (the same Philox entries);
--  * bad input: offsets beyond the padded length, offsets not ending at T, a masked position on a pad, and the
--    documented fall-backs (a row whose mask is not a prefix, a row with no real token) to the padded step.
--
-- Tolerance (fp32). Both steps do the same f32 operations on the real tokens; what differs is the order of some
-- sums: the dW GEMMs and the LayerNorm/bias column sums run over T rows instead of B*S (the padded rows add exact
-- zeros: their gradients are 0, masked keys have probability exactly 0 after the -10000 mask underflows in exp),
-- and the softmax sums of a row of n keys group their lanes differently from a row of S. A reordered f32 sum of K
-- terms moves by at most gamma_K sum|terms| (Higham 3.1, gamma_K ~ K u, u = 2^-24), in practice by about
-- sqrt(K) u times its magnitude when the terms' errors are independent: K <= 256 here, so ~1e-6 relative for one
-- sum. The loss and the gradient norm are means over many such sums whose errors do not add up coherently, so they
-- move less; we allow 2e-6 relative (measured: ~5e-9 and ~2e-8). LAMB's update m / (sqrt(v) + eps), eps = 1e-6,
-- moves by at most |dg| / eps relative to lr for a gradient change dg; with dg ~ 1e-6 |g| and |g| ~ 1e-3 per element
-- the weights after 4 steps of lr 1e-3 move by ~4e-6 at most: we allow 2e-6 (measured 2.4e-7).
-- A wrong dropout stream anywhere (LayerNorm rows, embedding rows, attention) fails this by 10-1000x: measured
-- gradient norms 1.5e-4 .. 3e-2 relative and weights 1.3e-3 .. 6.9e-3 apart.
-- bf16 emulation: the weights the passes read and the gradients they write are rounded to bf16 (u = 2^-8); an f32
-- difference of 1e-6 relative flips the rounding of the few elements within 1e-6 of a rounding boundary, each then
-- one bf16 ulp (2^-8 relative) off in a sum of K ~ 64-256 terms, and the Adam step of a flipped gradient element
-- moves by up to ~2^-8 of lr. We allow 2e-5 relative on losses and norms and lr * 2^-8 * 4 steps = 1.6e-5 on
-- weights (measured: no flip here, ~2e-9 relative and 7.6e-8).
local T = require "testing"
local bl = require "bertlua"
local bert = require "bertlua.bert"
local ops = require "bertlua.nn.ops"
local optim = require "bertlua.train.optim"
local amp = require "bertlua.train.amp"
local tstep = require "bertlua.train.step"

local CFG = require("fixtures").tiny_config()
local S, LR, STEPS = 37, 1e-3, 4
local LENS = { { S, 1, 23, 9 }, { 2, 30, S, 17 } }   -- the two micro-batches: a full row, a row of length 1
local TOL = { fp32 = { rel = 2e-6, w = 2e-6 }, bf16 = { rel = 2e-5, w = 1.6e-5 } }

-- a pre-training batch of rows with these real lengths (real tokens first), 3 masked positions per row among its
-- real tokens (none in a row of length 1), random ids, types and labels
local function make_batch(lens, seed)
  local B = #lens
  local u = bl.rand({ B, S + 6 }, { seed = seed, offset = 0 }):totable()
  local ids, mask, types, pos, lab, nsp = {}, {}, {}, {}, {}, {}
  for b = 1, B do
    ids[b], mask[b], types[b], pos[b], lab[b] = {}, {}, {}, {}, {}
    local row = (b - 1) * (S + 6)
    for s = 1, S do
      local real = s <= lens[b]
      ids[b][s] = real and math.floor(u[row + s] * CFG.vocab_size) or 0
      mask[b][s] = real and 1 or 0
      types[b][s] = (real and s > lens[b] / 2) and 1 or 0
    end
    for j = 1, 3 do
      local ok = lens[b] > 1
      pos[b][j] = ok and 1 + math.floor(u[row + S + j] * (lens[b] - 1)) or 0
      lab[b][j] = ok and math.floor(u[row + S + 3 + j] * CFG.vocab_size) or -1
    end
    nsp[b] = b % 2
  end
  return { input_ids = bl.from(ids, { dtype = "i32" }), attention_mask = bl.from(mask),
    token_type_ids = bl.from(types, { dtype = "i32" }), masked_lm_positions = bl.from(pos, { dtype = "i32" }),
    masked_lm_labels = bl.from(lab, { dtype = "i32" }), next_sentence_labels = bl.from(nsp, { dtype = "i32" }) }
end

-- STEPS optimizer steps of 2 micro-batches -> losses, gradient norms, final weights, how many forwards ran packed
local function train(unpad, precision)
  local model = bert.BertForPreTraining(CFG, { seed = 3 })
  model:train()
  model.bert.unpad_training = unpad
  local lamb = optim.LAMB{ model = model, lr = LR, weight_decay = 0.01, max_grad_norm = 1.0 }
  local mp = amp.MixedPrecision{ model = model, precision = precision }
  local s = tstep.Step{ model = model, optimizer = lamb, amp = mp, dev = -1, loss = tstep.pretraining_loss(),
    accum = 2 }
  local batches = { make_batch(LENS[1], 5), make_batch(LENS[2], 6) }
  local losses, norms, packed = {}, {}, 0
  local fwd = model.bert.forward
  model.bert.forward = function(m, b)
    local out = fwd(m, b)
    if m._plan then packed = packed + 1 end
    return out
  end
  for step = 1, STEPS do
    s:run(step, function(a) return batches[a] end, LR)
    local r = s:read()
    losses[step], norms[step] = r.losses[1], mp:read(r.amp).grad_norm
  end
  return losses, norms, model.flat_params:clone(), packed
end

local function rel(a, b) return math.abs(a - b) / math.max(math.abs(b), 1e-30) end

for _, precision in ipairs({ "fp32", "bf16" }) do
  T.test(precision .. ": packed pre-training steps = padded steps on every CPU path", function()
    T.each_cpu_path(function(isa)
      local l0, n0, w0, p0 = train(false, precision)
      local l1, n1, w1, p1 = train(true, precision)
      T.eq(p0, 0, isa .. ": the padded run ran padded")
      T.eq(p1, 2 * STEPS, isa .. ": every forward of the unpadded run ran packed")
      local dl, dn = 0, 0
      for i = 1, STEPS do dl, dn = math.max(dl, rel(l1[i], l0[i])), math.max(dn, rel(n1[i], n0[i])) end
      local dw = (w1 - w0):abs():max()
      print(("%s %s: losses %s; max rel diff loss %.3g, grad norm %.3g, max |dw| %.3g"):format(isa, precision,
        table.concat(l0, " ", 1, STEPS), dl, dn, dw))
      local tol = TOL[precision]
      T.truthy(dl <= tol.rel, ("%s: losses differ by %.3g relative"):format(isa, dl))
      T.truthy(dn <= tol.rel, ("%s: gradient norms differ by %.3g relative"):format(isa, dn))
      T.truthy(dw <= tol.w, ("%s: weights differ by %.3g"):format(isa, dw))
      T.truthy(l0[STEPS] < l0[1], "the loss decreases (the steps train)")
    end)
  end)
end

-- packed operands of rows with these lengths: q, k, v [1, T, H] random, offsets, and the padded [B, S, H] copies
local HEADS, D = 2, 8
local function packed_inputs(lens, seed)
  local B, Tn = #lens, 0
  for _, n in ipairs(lens) do Tn = Tn + n end
  local H = HEADS * D
  local offsets = bl.empty({ B + 1 }, { dtype = "i32" })
  local o = offsets:ptr()
  o[0] = 0
  for b = 1, B do o[b] = o[b - 1] + lens[b] end
  local t = {}
  for i, name in ipairs({ "q", "k", "v" }) do t[name] = bl.randn({ 1, Tn, H }, { seed = seed, offset = 1000 * i }) end
  return t, offsets, Tn, H
end
local function sum_sq(lens) local n = 0 for _, l in ipairs(lens) do n = n + l * l end return n end

T.test("packed attention dropout = the padded op's at the real positions", function()
  local lens, Sp, p = { 5, 1, 7 }, 7, 0.3
  local t, offsets, _, H = packed_inputs(lens, 21)
  local B = #lens
  -- the padded batch: row b holds its tokens first, pads (zeros) after, masked by key_mask
  local pq, pk, pv = bl.zeros({ B, Sp, H }), bl.zeros({ B, Sp, H }), bl.zeros({ B, Sp, H })
  local mask = bl.zeros({ B, Sp })
  local o = offsets:ptr()
  for b = 0, B - 1 do
    local n = o[b + 1] - o[b]
    for _, pair in ipairs({ { pq, t.q }, { pk, t.k }, { pv, t.v } }) do
      pair[1]:narrow(1, b + 1, 1):narrow(2, 1, n):copy_(pair[2]:narrow(2, o[b] + 1, n))
    end
    mask:narrow(1, b + 1, 1):narrow(2, 1, n):fill_(1)
  end
  local ctx0 = ops.attention(pq, pk, pv, mask, HEADS, { p = p, seed = 77, offset = 12 })
  local probs = bl.empty({ HEADS * sum_sq(lens) })
  local ctx1 = ops.attention_packed_train(t.q, t.k, t.v, offsets, HEADS, { probs = probs, seq = Sp, p = p, seed = 77,
    offset = 12 })
  local worst = 0
  for b = 0, B - 1 do
    local n = o[b + 1] - o[b]
    local a = ctx0:narrow(1, b + 1, 1):narrow(2, 1, n)
    worst = math.max(worst, (a - ctx1:narrow(2, o[b] + 1, n)):abs():max())
  end
  -- f32 sums in another lane order only (|ctx| ~ 1): 1e-6; another mask would differ by ~0.1
  T.truthy(worst <= 1e-5, ("packed context differs from the padded one by %.3g"):format(worst))
  local other = ops.attention_packed_train(t.q, t.k, t.v, offsets, HEADS, { probs = probs, seq = Sp + 1, p = p,
    seed = 77, offset = 12 })
  T.truthy((other - ctx1):abs():max() > 1e-2, "the padded length lays out the stream (another one drops others)")
end)

-- loss = sum(ctx * w) for a fixed random w: its gradient in q, k, v by central differences against the backward
T.test("packed attention backward = central differences of its forward (with dropout)", function()
  local lens, Sp, p = { 4, 1, 6 }, 6, 0.2
  local t, offsets, Tn, H = packed_inputs(lens, 31)
  local w = bl.randn({ 1, Tn, H }, { seed = 32, offset = 0 })
  local probs = bl.empty({ HEADS * sum_sq(lens) })
  local function loss()
    local ctx = ops.attention_packed_train(t.q, t.k, t.v, offsets, HEADS, { probs = probs, seq = Sp, p = p,
      seed = 5, offset = 3 })
    return (ctx:to{ dtype = "f64" } * w:to{ dtype = "f64" }):sum()
  end
  loss()
  local g = {}
  g.q, g.k, g.v = ops.attention_packed_backward(w, t.q, t.k, t.v, probs, offsets, HEADS, { seq = Sp, p = p, seed = 5,
    offset = 3 })
  -- f32 forward: h = 1e-2 keeps the truncation error (~h^2 * |f'''| ~ 1e-4) and the rounding error
  -- (~u * |f| / h ~ 1e-5) below the check's 2e-3 + 2e-3 |g|
  local h, worst = 1e-2, 0
  for _, name in ipairs({ "q", "k", "v" }) do
    local x, gx = t[name], g[name]
    local xp, gp = x:ptr(), gx:contiguous():ptr()
    for i = 0, Tn * H - 1, 3 do
      local x0 = xp[i]
      xp[i] = x0 + h
      local fp = loss()
      xp[i] = x0 - h
      local fm = loss()
      xp[i] = x0
      local fd = (fp - fm) / (2 * h)
      local err = math.abs(fd - gp[i]) / (2e-3 + 2e-3 * math.abs(gp[i]))
      worst = math.max(worst, err)
      if err > 1 then error(("d%s[%d]: backward %.6g, central difference %.6g"):format(name, i, gp[i], fd)) end
    end
  end
  print(("worst |backward - difference| / tolerance: %.3g"):format(worst))
end)

T.test("bad input: clear errors and the documented fall-backs", function()
  local lens = { 3, 2 }
  local t, offsets, Tn, H = packed_inputs(lens, 41)
  local probs = bl.empty({ HEADS * sum_sq(lens) })
  local function fwd(seq, offs)
    return ops.attention_packed_train(t.q, t.k, t.v, offs or offsets, HEADS, { probs = probs, seq = seq, p = 0.1 })
  end
  T.raises(function() fwd(2) end, "attention_packed_train: a sequence has 3 tokens, more than the padded length 2")
  T.raises(function() fwd(0) end, "padded length 0 must be positive")
  T.raises(function() fwd(4, bl.from({ 0, 3, 4 }, { dtype = "i32" })) end, "offsets must rise from 0 to the 5")
  T.raises(function() fwd(4, bl.from({ 0, 4, 3, 5 }, { dtype = "i32" })) end, "offsets must rise")
  T.raises(function()
    ops.attention_packed_train(t.q, t.k, t.v, offsets, HEADS, { probs = bl.empty({ 7 }), seq = 4, p = 0.1 })
  end, "probs must be a contiguous f32 tensor of 26 elements")
  local x = bl.randn({ 1, Tn, H }, { seed = 1, offset = 0 })
  T.raises(function()
    ops.residual_layernorm(x, x:clone(), bl.ones({ H }), bl.zeros({ H }), { p = 0.1, packed = { offsets = offsets,
      S = 2 } })
  end, "residual_layernorm_packed: a sequence has 3 tokens, more than the padded length 2")

  local model = bert.BertForPreTraining(CFG, { seed = 3 })
  model:train()
  model.bert.unpad_training = true
  local batch = make_batch({ 9, 4 }, 8)
  -- a masked position on a pad: the packed step computes no hidden state there
  batch.masked_lm_positions = bl.from({ { 1, 2, 12 }, { 1, 2, 3 } }, { dtype = "i32" })
  batch.masked_lm_labels = bl.from({ { 5, 6, 7 }, { 5, 6, 7 } }, { dtype = "i32" })
  T.raises(function() model:forward(batch) end, "masked position 12 of row 1 is a padded token")
  -- not a prefix, or a row without real tokens: the padded step runs (and says so once on stderr)
  local nonprefix = make_batch({ 9, 4 }, 8)
  nonprefix.attention_mask:narrow(1, 2, 1):narrow(2, 2, 1):fill_(0)
  model:forward(nonprefix)
  T.eq(model.bert._plan, nil, "mask not a prefix: the padded step")
  model:backward()
  local empty = make_batch({ 9, 1 }, 8)
  empty.attention_mask:narrow(1, 2, 1):fill_(0)
  model:forward(empty)
  T.eq(model.bert._plan, nil, "a row with no real token: the padded step")
  model:forward(make_batch({ 9, 4 }, 8))
  T.truthy(model.bert._plan ~= nil, "a prefix batch runs packed")
  model:backward()
end)

T.run()
