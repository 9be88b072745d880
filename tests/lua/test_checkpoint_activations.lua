-- Activation checkpointing (BertEncoder.checkpoint, --checkpoint-activations): each layer's forward is run again
-- in the backward from its input with the same dropout counter, so everything must be bit-identical to the plain
-- step, dropout on:
--  * pre-training with LAMB (bertlua.train.step, accum 2), fp32 and the CPU's bf16 emulation, padded and unpadded
--    (unpad_training): the loss of every step, the gradients of the last step and the weights after the steps;
--  * the layers share one set of internal buffers (the memory saving): after a step, and after an evaluation between
--    steps (which gives the plain model's loss), only one layer holds them;
--  * on a GPU (the emulated device in CI), f32 and bf16 compute, GELU and gelu_new (the GEMM-epilogue path): loss
--    and every gradient of a forward/backward.
local T = require "testing"
local bl = require "bertlua"
local bert = require "bertlua.bert"
local optim = require "bertlua.train.optim"
local amp = require "bertlua.train.amp"
local fx = require "fixtures"
local tstep = require "bertlua.train.step"

local CFG = fx.tiny_config()
CFG.num_hidden_layers = 4
local B, S, P, LR, STEPS = 4, 24, 3, 1e-3, 3

-- bytes of the internal buffers each encoder layer holds (its output, the next layer's input, left out)
local function layer_bytes(model)
  local r = {}
  for i, l in ipairs(model.bert.encoder.layer) do
    local n = 0
    l:apply(function(m)
      for key in pairs(m._buf_keys or {}) do
        local t = m[key]
        if t ~= nil and t.storage_ ~= nil and not (m == l.output and key == "output") then
          n = n + t:numel() * t:element_size()
        end
      end
    end)
    r[i] = n
  end
  return r
end

local function bits_equal(a, b, what)
  T.eq(a:numel(), b:numel(), what .. ": sizes")
  local x, y = a:contiguous():ptr(), b:contiguous():ptr()
  for i = 0, a:numel() - 1 do
    if x[i] ~= y[i] then error(("%s: element %d differs: %.9g vs %.9g"):format(what, i, x[i], y[i]), 2) end
  end
end

local function train(ckpt, unpad, precision)
  local model = bert.BertForPreTraining(CFG, { seed = 3 })
  model:train()
  model.bert.unpad_training, model.bert.unpad = unpad, unpad   -- unpad: the evaluation runs packed too
  model.bert.encoder.checkpoint = ckpt
  local lamb = optim.LAMB{ model = model, lr = LR, weight_decay = 0.01, max_grad_norm = 1.0 }
  local mp = amp.MixedPrecision{ model = model, precision = precision }
  local s = tstep.Step{ model = model, optimizer = lamb, amp = mp, dev = -1, loss = tstep.pretraining_loss(),
    accum = 2 }
  local batches = { fx.pretrain_batch(CFG.vocab_size, B, S, P), fx.pretrain_batch(CFG.vocab_size, B + 1, S, P) }
  local losses, packed, eval = {}, 0, nil
  for step = 1, STEPS do
    s:run(step, function(a) return batches[a] end, LR)
    losses[step] = s:read().losses[1]
    if model.bert._plan then packed = packed + 1 end
    if step == 2 then  -- an evaluation between steps
      model:eval()
      eval = { loss = model:forward(batches[1]).loss, bytes = layer_bytes(model), packed = model.bert._ran_packed }
      model:train()
    end
  end
  return { losses = losses, grads = model.flat_grads:clone(), weights = model.flat_params:clone(), packed = packed,
    bytes = layer_bytes(model), eval = eval }
end

for _, precision in ipairs({ "fp32", "bf16" }) do
  for _, unpad in ipairs({ false, true }) do
    local name = ("%s %s"):format(precision, unpad and "unpadded" or "padded")
    T.test(name .. ": checkpointed pre-training steps = plain steps, bit for bit", function()
      local a, b = train(false, unpad, precision), train(true, unpad, precision)
      T.eq(a.packed, unpad and STEPS or 0, name .. ": the plain run took the path meant")
      T.eq(b.packed, a.packed, name .. ": the checkpointed run took the same path")
      for i = 1, STEPS do T.eq(b.losses[i], a.losses[i], ("%s: loss of step %d"):format(name, i)) end
      bits_equal(b.grads, a.grads, name .. ": gradients")
      bits_equal(b.weights, a.weights, name .. ": weights")
      -- plain: every layer keeps its set; checkpointed: layer 1 holds the set after backward, the others none
      print(("%s: internal buffer bytes per layer, plain %s; checkpointed %s"):format(name,
        table.concat(a.bytes, " "), table.concat(b.bytes, " ")))
      T.eq(a.eval.packed, unpad, name .. ": the evaluation ran packed when unpadded")
      T.eq(b.eval.loss, a.eval.loss, name .. ": the evaluation's loss")
      T.eq(b.eval.bytes[CFG.num_hidden_layers], a.eval.bytes[CFG.num_hidden_layers],
        name .. ": after an evaluation the last layer holds the set")
      for i = 1, CFG.num_hidden_layers - 1 do
        T.eq(b.eval.bytes[i], 0, ("%s: after an evaluation layer %d holds no buffers"):format(name, i))
      end
      T.eq(b.bytes[1], a.bytes[1], name .. ": layer 1 holds one set")
      for i = 2, CFG.num_hidden_layers do
        T.truthy(a.bytes[i] > 0, name .. ": a plain layer keeps its buffers")
        T.eq(b.bytes[i], 0, ("%s: checkpointed layer %d holds no buffers"):format(name, i))
      end
    end)
  end
end

-- gelu_new: FC1's tanh GELU in the GEMM epilogue, its derivative in FC2's dX GEMM (BertLayer:backward)
for _, case in ipairs({ { "f32", "gelu" }, { "bf16", "gelu" }, { "bf16", "gelu_new" } }) do
  local dtype, act = case[1], case[2]
  T.test(("cuda %s %s: checkpointed forward/backward = plain, bit for bit"):format(dtype, act), function()
    if not bl.cuda_available() then
      T.skip(bl.cuda_compiled() and "no CUDA device" or "no CUDA device (CPU-only build)")
    end
    local batch = fx.pretrain_batch(CFG.vocab_size, B, S, P)
    local function run(ckpt)
      local cfg = fx.tiny_config()
      cfg.num_hidden_layers, cfg.hidden_act = CFG.num_hidden_layers, act
      local model = bert.BertForPreTraining(cfg, { seed = 3 }):to{ device = "cuda:0", dtype = dtype }
      model:train()
      model.bert.encoder.checkpoint = ckpt
      model:zero_grad()
      model.rng = bl.Generator(77)
      model:apply(function(m) m.rng = model.rng end)
      local loss = model:forward(batch).loss
      model:backward(1)
      return loss, model.flat_grads:to("cpu"), layer_bytes(model)
    end
    local l0, g0, b0 = run(false)
    local l1, g1, b1 = run(true)
    T.eq(l1, l0, "loss")
    bits_equal(g1, g0, "gradients")
    print(("cuda %s %s: internal buffer bytes per layer, plain %s; checkpointed %s"):format(dtype, act,
      table.concat(b0, " "), table.concat(b1, " ")))
    T.eq(b1[1], b0[1], "layer 1 holds one set")
    for i = 2, CFG.num_hidden_layers do T.eq(b1[i], 0, ("checkpointed layer %d holds no buffers"):format(i)) end
  end)
end

T.run()
