-- bertlua.nn.criterion: losses as objects (the Torch7 `nn` criterion contract).
--
--   local ce = nn.CrossEntropyCriterion{ ignore_index = -1 }
--   local loss = ce:forward(logits, targets)        -- a Lua number
--   local dlogits = ce:backward(logits, targets, s) -- d(s * loss)/d logits (s defaults to 1)
--
-- The loss ops are fused: one pass computes the loss and its gradient, so
-- forward keeps the gradient in the criterion's buffer and backward scales it
-- in place. Call backward at most once after each forward; like a module's
-- outputs, the gradient is overwritten by the next forward. Buffers live on
-- the input's device, in the input's dtype.
local ops = require "bertlua.nn.ops"
local buf = require "bertlua.nn.buffer"

local M = {}

-- class(name) -> class table; calling it constructs (runs __init when there is one)
local function class(name)
  local cls = { __name = name }
  cls.__index = cls
  return setmetatable(cls, { __call = function(c, ...)
    local self = setmetatable({}, c)
    if c.__init then c.__init(self, ...) end
    return self
  end })
end

local function on_input(self, x)
  self.device = x.device_ >= 0 and x.device_ or nil
end

-- scale: a number or a one-element tensor on g's device (the fp16 loss scale stays on the GPU)
local function scaled(g, scale) return ops.scale_(g, scale) end

-- Cross-entropy over the last dim, mean over the targets not equal to
-- ignore_index (-100 as in Hugging Face; NVIDIA's MLM data uses -1).
-- `weight` multiplies the gradient (QA averages two losses: 0.5 each).
-- forward returns loss, count (counted targets, also in self.count).
local CrossEntropyCriterion = class("CrossEntropyCriterion")
function CrossEntropyCriterion:__init(o)
  o = o or {}
  self.ignore_index, self.weight = o.ignore_index or -100, o.weight or 1
end
function CrossEntropyCriterion:forward(logits, targets)
  on_input(self, logits)
  local loss, _, count = ops.cross_entropy(logits, targets, { ignore_index = self.ignore_index,
    grad_scale = self.weight, loss = buf(self, "loss", { 1 }, "f64"),
    dlogits = buf(self, "grad_input", logits:shape(), logits:dtype()) })
  self.output, self.count = loss, count
  return loss, count
end
function CrossEntropyCriterion:backward(_, _, scale) return scaled(self.grad_input, scale) end
M.CrossEntropyCriterion = CrossEntropyCriterion

-- Mean squared error (regression heads, STS-B).
local MSECriterion = class("MSECriterion")
function MSECriterion:forward(pred, target)
  on_input(self, pred)
  self.output = ops.mse_loss(pred, target, { loss = buf(self, "loss", { 1 }, "f64"),
    dpred = buf(self, "grad_input", pred:shape(), pred:dtype()) })
  return self.output
end
function MSECriterion:backward(_, _, scale) return scaled(self.grad_input, scale) end
M.MSECriterion = MSECriterion

-- Span loss for extractive QA: input { start_logits [B,S], end_logits [B,S] },
-- target { start_positions [B], end_positions [B] } (clamped to [0, S] by the
-- caller; S = outside the sequence, ignored as in transformers). The loss is
-- (start loss + end loss) / 2; forward also returns the two parts.
local SpanCriterion = class("SpanCriterion")
function SpanCriterion:__init()
  self.start_ce = CrossEntropyCriterion{ weight = 0.5 }
  self.end_ce = CrossEntropyCriterion{ weight = 0.5 }
end
function SpanCriterion:forward(input, target)
  local S = input[1]:size(2)
  self.start_ce.ignore_index, self.end_ce.ignore_index = S, S
  local ls = self.start_ce:forward(input[1], target[1])
  local le = self.end_ce:forward(input[2], target[2])
  self.output = (ls + le) / 2
  return self.output, ls, le
end
function SpanCriterion:backward(input, target, scale)
  return { self.start_ce:backward(input[1], target[1], scale), self.end_ce:backward(input[2], target[2], scale) }
end
M.SpanCriterion = SpanCriterion

-- BERT pre-training: MLM cross-entropy at the masked positions + NSP
-- cross-entropy, summed. input { mlm_logits [M,V] or nil, nsp_logits [B,2] or
-- nil }, target { mlm_labels [M], nsp_labels [B] } (a part without logits or
-- labels is left out). forward returns loss, mlm_loss, nsp_loss, mlm_count;
-- backward returns { dmlm_logits or nil, dnsp_logits or nil }.
local PreTrainingCriterion = class("PreTrainingCriterion")
function PreTrainingCriterion:__init(o)
  o = o or {}
  self.mlm = CrossEntropyCriterion{ ignore_index = o.ignore_index or -1 }
  self.nsp = CrossEntropyCriterion{ ignore_index = o.ignore_index or -1 }
end
function PreTrainingCriterion:forward(input, target)
  local loss, mlm_loss, nsp_loss, count = 0, nil, nil, nil
  self._parts = { input[1] ~= nil and target[1] ~= nil, input[2] ~= nil and target[2] ~= nil }
  if self._parts[1] then
    mlm_loss, count = self.mlm:forward(input[1], target[1])
    loss = loss + mlm_loss
  end
  if self._parts[2] then
    nsp_loss = self.nsp:forward(input[2], target[2])
    loss = loss + nsp_loss
  end
  self.output = loss
  return loss, mlm_loss, nsp_loss, count
end
function PreTrainingCriterion:backward(input, target, scale)
  local p = self._parts or {}
  return { p[1] and self.mlm:backward(input[1], target[1], scale) or nil,
    p[2] and self.nsp:backward(input[2], target[2], scale) or nil }
end
M.PreTrainingCriterion = PreTrainingCriterion

return M
