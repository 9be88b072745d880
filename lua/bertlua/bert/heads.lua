-- bertlua.bert.heads: the task heads on a BertModel (pre-training MLM + NSP,
-- question answering, sequence classification). Each head owns the criterion
-- of its task (bertlua.nn.criterion) in `head.criterion`.
local bl = require "bertlua.tensor"
local nn = require "bertlua.nn"
local ops = require "bertlua.nn.ops"
local buf, class, Module = nn.buf, nn.class, nn.Module
local model = require "bertlua.bert.model"
local BertModel, resolve_cfg, on_device = model.BertModel_class, model.resolve_cfg, model.on_device

local M = {}

-- heads -------------------------------------------------------------------------------------
local function new_head(cls, cfg, opts, pooler)
  local self = setmetatable({}, cls)
  Module.__init(self)
  opts = opts or {}
  cfg = resolve_cfg(cfg)
  self.cfg = cfg
  self.initializer_range = cfg.initializer_range
  self:add("bert", BertModel(cfg, { pooler = pooler, flatten = false }))
  return self, cfg, opts
end

-- scratch scalars for the loss ops
local function f64_scalar(self, key) return buf(self, key, { 1 }, "f64") end

-- cross_entropy and its accuracy into module buffers: returns loss, count, accuracy; dlogits kept in self[dkey]
local function cross_entropy(self, dkey, logits, targets, ignore)
  local loss, acc = f64_scalar(self, "_loss_" .. dkey), buf(self, "_acc_" .. dkey, { 2 }, "i64")
  acc:zero_()
  ops.cross_entropy_accuracy(logits, targets, ignore, -1, loss, buf(self, dkey, logits:shape()), acc)
  local a = acc:totable()
  return loss:item(), a[2], a[2] > 0 and a[1] / a[2] or 0
end

-- The same into device-side sums (forward's stats): count = the targets not ignored, known to the caller, so
-- nothing is read back; the loss (an f64 [1] buffer on the model's device) is added to `sum` and returned, the
-- accuracy's {correct, counted} to `counts`. grad_scale multiplies the gradient in the same pass.
local function cross_entropy_into(self, dkey, logits, targets, ignore, count, sum, counts, grad_scale)
  local loss = ops.cross_entropy_accuracy(logits, targets, ignore, count, f64_scalar(self, "_loss_" .. dkey),
    buf(self, dkey, logits:shape()), counts, grad_scale)
  ops.add(sum, loss, sum)
  return loss
end

-- number of labels in t (i32, any device) other than ignore (a GPU tensor is read back: one wait)
local function count_labels(t, ignore)
  local n = 0
  for _, v in ipairs(t:totable()) do if v ~= ignore and v ~= -100 then n = n + 1 end end
  return n
end

local function accuracy(logits, targets, ignore)
  local c, cnt = ops.accuracy(logits, targets, ignore)
  return cnt > 0 and c / cnt or 0, c, cnt
end

local BertPredictionHeadTransform = class("BertPredictionHeadTransform")
function BertPredictionHeadTransform:__init(cfg)
  Module.__init(self)
  self:add("dense", nn.Linear(cfg.hidden_size, cfg.hidden_size))
  self:add("transform_act_fn", nn.activation(cfg.hidden_act))
  self:add("LayerNorm", nn.LayerNorm(cfg.hidden_size, cfg.layer_norm_eps))
end
function BertPredictionHeadTransform:forward(x)
  self._act = nn.dense_act_forward(self, self.dense, self.transform_act_fn, x)
  return self.LayerNorm:forward(self._act)
end
function BertPredictionHeadTransform:backward(x, dy)
  local da = self.LayerNorm:backward(self._act, dy)
  return nn.dense_act_backward(self, self.dense, self.transform_act_fn, x, da)
end

-- MLM head: transform, then logits = t E^T + bias with E the (tied) word embeddings.
local BertLMPredictionHead = class("BertLMPredictionHead")
function BertLMPredictionHead:__init(cfg)
  Module.__init(self)
  self:param("bias", { cfg.vocab_size }, "zeros")
  self:add("transform", nn.BertPredictionHeadTransform(cfg))
end
-- decoder(x, E) -> logits [M, V]
function BertLMPredictionHead:forward(x, E)
  local t = self.transform:forward(x)
  return ops.linear(t, E, self.bias, buf(self, "output", { x:size(1), E:size(1) }))
end
-- accumulates dE (tied word-embedding gradient) and returns dx
function BertLMPredictionHead:backward(x, E, dE, dlogits)
  local t = self.transform.LayerNorm.output
  local dt = buf(self, "grad_t", t:shape())
  ops.linear_backward(dlogits, t, E, { dx = dt, dw = dE, db = self.grad_bias })
  return self.transform:backward(x, dt)
end

local BertPreTrainingHeads = class("BertPreTrainingHeads")
function BertPreTrainingHeads:__init(cfg)
  Module.__init(self)
  self:add("predictions", nn.BertLMPredictionHead(cfg))
  self:add("seq_relationship", nn.Linear(cfg.hidden_size, 2))
end

-- BertForPreTraining: MLM (only at the masked positions) + next-sentence prediction.
local BertForPreTraining = class("BertForPreTraining")
M.BertForPreTraining_class = BertForPreTraining
function M.BertForPreTraining(cfg, opts)
  local self, _, o = new_head(BertForPreTraining, cfg, opts, true)
  self:add("cls", nn.BertPreTrainingHeads(self.cfg))
  -- NVIDIA's data pads masked_lm_labels with -1; HF uses -100 in `labels`
  self.ignore_index = o.ignore_index or -1
  self.nsp = o.nsp ~= false
  self.criterion = nn.PreTrainingCriterion{ ignore_index = self.ignore_index }
  self:flatten{ seed = o.seed or 0 }
  return self
end

-- masked positions: from masked_lm_positions [B,P] (0-based within each
-- sequence) + masked_lm_labels [B,P] (ignore_index = padding), or from HF
-- style `labels` [B,S] (-100 or ignore_index = not masked). Only counted
-- positions are gathered, so the decoder GEMM runs on M rows, not B*S.
-- With masked_lm_positions the rows are padded to B*P (ignored label, position 0): the shapes of the MLM head
-- stay the same from batch to batch, so its buffers and the ops' scratch are reused (no device allocation after
-- the first step); ignored rows add exact zeros to the loss and the gradients.
-- The rows on the host: pos, lab (i32 CPU tensors [m], m = max(n, B*P, 1)) and n, or nil when the batch has no MLM
-- targets; into(m) gives the two tensors to fill (default: new ones).
local function mlm_rows(self, batch, B, S, into)
  local ign = self.ignore_index
  local pos, lab, cap = {}, {}, 0
  if batch.masked_lm_positions ~= nil then
    local P = bl.as_tensor(batch.masked_lm_positions, { dtype = "i64" })
    local L = bl.as_tensor(batch.masked_lm_labels, { dtype = "i64" })
    if P:numel() ~= L:numel() or P:numel() % B ~= 0 then
      error(("BertForPreTraining: masked_lm_positions %s and masked_lm_labels %s must both be [batch, P]"):format(
        bl.shape_str(P:shape()), bl.shape_str(L:shape())), 3)
    end
    local np = P:numel() / B
    cap = B * np
    local pv, lv = P:totable(), L:totable()
    for b = 0, B - 1 do
      for j = 1, np do
        local l = lv[b * np + j]
        if l ~= ign and l ~= -100 then
          local p = pv[b * np + j]
          if p < 0 or p >= S then
            error(("BertForPreTraining: masked_lm_positions[%d][%d] = %d is outside the sequence (length %d)"):format(
              b + 1, j, p, S), 3)
          end
          pos[#pos + 1] = b * S + p
          lab[#lab + 1] = l
        end
      end
    end
  elseif batch.labels ~= nil then
    local L = bl.as_tensor(batch.labels, { dtype = "i64" })
    if L:numel() ~= B * S then error("BertForPreTraining: labels must be [batch, seq] like input_ids", 3) end
    local lv = L:totable()
    for i = 1, B * S do
      local l = lv[i]
      if l ~= ign and l ~= -100 then pos[#pos + 1] = i - 1; lab[#lab + 1] = l end
    end
  else
    return nil
  end
  local n = #pos
  local m = math.max(n, cap, 1)
  local pt, lt
  if into then pt, lt = into(m) else pt, lt = bl.empty({ m }, { dtype = "i32" }), bl.empty({ m }, { dtype = "i32" }) end
  local pp, lp = pt:ptr(), lt:ptr()
  for i = 1, n do pp[i - 1] = pos[i]; lp[i - 1] = lab[i] end
  for i = n, m - 1 do pp[i] = 0; lp[i] = ign end  -- padding; at least one row keeps the shapes non-empty
  return pt, lt, n
end

-- mlm_rows(batch[, into]) -> pos, lab (i32 CPU tensors [m]: flat row b*S + p of each masked position, its label;
-- padded with position 0 and ignore_index), n (the counted ones), or nil without MLM targets; into(m) -> the two
-- tensors to fill. A caller that puts them on the device itself passes them back as batch.mlm_rows = {pos, lab}
-- (bertlua.train.step with a CUDA graph: they travel with the step's inputs).
function BertForPreTraining:mlm_rows(batch, into)
  local ids = batch.input_ids
  return mlm_rows(self, batch, ids:size(1), ids:size(2), into)
end

-- masked positions: the rows on the model's device (the module's buffers; batch.mlm_rows when the caller put them
-- there: their count is then made on the device, n = -1)
local function masked_positions(self, batch, B, S)
  if batch.mlm_rows then return batch.mlm_rows[1], batch.mlm_rows[2], -1 end
  -- filled on the host: the module's own buffers on the CPU, staging tensors for a GPU
  local function into(m) return buf(self, "_mpos", { m }, "i32"), buf(self, "_mlab", { m }, "i32") end
  local pt, lt, n = mlm_rows(self, batch, B, S, not self.device and into or nil)
  if not pt then return nil end
  if self.device then
    pt = buf(self, "_mpos", pt:shape(), "i32"):copy_(pt)
    lt = buf(self, "_mlab", lt:shape(), "i32"):copy_(lt)
  end
  return pt, lt, n
end

-- Unpadded training (BertModel.unpad_training) computes no hidden state at padded positions: a masked position there
-- would train on zeros instead of what the padded step computes, so it is an error.
local function unpadded_positions(plan, pos, n)
  local o, p = plan.offsets:ptr(), pos:ptr()
  for i = 0, n - 1 do
    local b = math.floor(p[i] / plan.S)
    local s = p[i] - b * plan.S
    if s >= o[b + 1] - o[b] then
      error(("BertForPreTraining: masked position %d of row %d is a padded token (attention_mask 0); unpadded "
        .. "training (--unpad) cannot train it, run with --unpad=false"):format(s, b + 1), 3)
    end
  end
end

-- forward(batch[, stats]) -> { loss, mlm_loss, nsp_loss, mlm_accuracy, nsp_accuracy,
-- mlm_count, mlm_logits [M,V], nsp_logits [B,2], sequence_output, pooled_output }.
-- Gradients of the losses w.r.t. the logits are computed here (cheaply, by the
-- same fused cross-entropy op) and used by backward().
-- stats = {losses = f64 [3], counts = i64 [4]} on the model's device (bertlua.train.device.StepStats): the
-- losses {total, mlm, nsp} and the counts {mlm correct, mlm counted, nsp correct, nsp counted} are added there
-- and nothing is read back (loss, mlm_loss, nsp_loss and the accuracies are then not in the result): a
-- training step on a GPU does not wait for them. Keep next_sentence_labels on the host for that (their count).
-- stats.grad_scale (optional, a number): backward's loss_scale, known before the forward (a step's 1/accum). The
-- cross-entropy writes the logits' gradients times it, so backward(loss_scale) need not pass over them again.
function BertForPreTraining:forward(batch, stats)
  local out = self.bert:forward(batch)
  local seq, pooled = out.last_hidden_state, out.pooler_output
  local B, S, H = seq:size(1), seq:size(2), seq:size(3)
  local res = { sequence_output = seq, pooled_output = pooled, hidden_states = out.hidden_states, loss = 0 }
  local pos, lab, npos = masked_positions(self, batch, B, S)
  if pos and self.bert._plan then unpadded_positions(self.bert._plan, pos, npos) end
  local mlm_t, nsp_t  -- the losses as device scalars (stats)
  if stats then  -- made before the ops below run: a buffer made later takes a device block cached for their scratch
    f64_scalar(self, "_loss_total")
    if self.device then buf(self, "_nsp_labels", { B }, "i32") end
  end
  self._pos, self._lab = pos, lab
  self._dscale = stats and stats.grad_scale or 1
  local E = self.bert.embeddings.word_embeddings.weight
  if pos then
    local g = buf(self, "_gathered", { pos:numel(), H })
    ops.gather(seq, pos, g)
    local logits = self.cls.predictions:forward(g, E)
    res.mlm_logits = logits
    if stats then
      mlm_t = cross_entropy_into(self, "_dmlm", logits, lab, self.ignore_index, npos, stats.losses:narrow(1, 2, 1),
        stats.counts:narrow(1, 1, 2), self._dscale)
    else
      local loss, cnt, acc = cross_entropy(self, "_dmlm", logits, lab, self.ignore_index)
      res.mlm_loss, res.mlm_count, res.mlm_accuracy = loss, cnt, acc
      res.loss = res.loss + loss
    end
  end
  local nsp = batch.next_sentence_labels or batch.next_sentence_label
  local nlog = self.cls.seq_relationship:forward(pooled)
  res.nsp_logits = nlog
  if nsp ~= nil and self.nsp then
    local t = bl.as_tensor(nsp, { dtype = "i32" })
    if t:numel() ~= B then error("BertForPreTraining: next_sentence_labels must have one label per sequence", 2) end
    -- on the device already (the caller staged them with a CUDA graph's inputs): counted there too
    local counted = stats and (t.device_ >= 0 and -1 or count_labels(t, self.ignore_index))
    if self.device and t.device_ ~= self.device then  -- into a kept buffer: no allocation per step
      t = buf(self, "_nsp_labels", { B }, "i32"):copy_(t:view({ B }))
    else
      t = t:view({ B })
    end
    self._nsp_t = t
    if stats then
      nsp_t = cross_entropy_into(self, "_dnsp", nlog, t, self.ignore_index, counted, stats.losses:narrow(1, 3, 1),
        stats.counts:narrow(1, 3, 2), self._dscale)
    else
      local loss, _, acc = cross_entropy(self, "_dnsp", nlog, t, self.ignore_index)
      res.nsp_loss, res.nsp_accuracy = loss, acc
      res.loss = res.loss + loss
    end
  else
    self._nsp_t = nil
  end
  self._has_mlm = pos ~= nil
  if stats then  -- total = mlm + nsp, added as one number like the host's sum of the two
    local total = mlm_t or nsp_t
    if mlm_t and nsp_t then
      total = f64_scalar(self, "_loss_total")
      ops.add(mlm_t, nsp_t, total)
    end
    local sum = stats.losses:narrow(1, 1, 1)
    if total then ops.add(sum, total, sum) end
    res.loss = nil
  end
  return res
end

-- The multiplier backward(loss_scale) still has to apply to the logits' gradients: 1 when the forward's
-- cross-entropy applied loss_scale already (stats.grad_scale).
local function pending_scale(self, loss_scale)
  local done = self._dscale or 1
  if done == 1 or rawequal(loss_scale, done) then return done == 1 and loss_scale or 1 end
  error(("BertForPreTraining:backward: loss_scale %s differs from the forward's stats.grad_scale %s, which the "
    .. "logits' gradients already carry"):format(tostring(loss_scale), tostring(done)), 3)
end

-- backward([loss_scale]): gradients of loss * loss_scale (a number or a one-element tensor on the model's
-- device), accumulated into the flat gradient buffer.
function BertForPreTraining:backward(loss_scale)
  local seq = self.bert:sequence_output()
  local dseq = buf(self, "_dseq", seq:shape())
  dseq:zero_()
  local emb = self.bert.embeddings.word_embeddings
  loss_scale = pending_scale(self, loss_scale or 1)
  if self._has_mlm then
    local dl = self._dmlm
    ops.scale_(dl, loss_scale)
    local dg = self.cls.predictions:backward(self._gathered, emb.weight, emb.grad_weight, dl)
    ops.gather_backward(dseq, dg, self._pos)
  end
  local dpooled
  if self._nsp_t then
    local dn = self._dnsp
    ops.scale_(dn, loss_scale)
    dpooled = self.cls.seq_relationship:backward(self.bert.pooler.output, dn)
  end
  self.bert:backward(dseq, dpooled)
end

-- BertForQuestionAnswering: start/end logits over tokens (SQuAD).
local BertForQuestionAnswering = class("BertForQuestionAnswering")
function M.BertForQuestionAnswering(cfg, opts)
  local self, c, o = new_head(BertForQuestionAnswering, cfg, opts, false)  -- HF: no pooler
  self:add("qa_outputs", nn.Linear(c.hidden_size, 2))
  self.criterion = nn.SpanCriterion()
  self:flatten{ seed = o.seed or 0 }
  return self
end
-- forward{..., start_positions=[B], end_positions=[B]} -> { start_logits [B,S], end_logits [B,S], loss? }
-- Positions outside [0, S) are clamped to S and ignored, as in transformers.
function BertForQuestionAnswering:forward(batch)
  local out = self.bert:forward(batch)
  if self.bert._plan then  -- the span softmax runs over every position, padded ones included
    error("BertForQuestionAnswering: unpadded training is for pre-training and classification; set "
      .. "unpad_training = false on the encoder", 2)
  end
  local seq = out.last_hidden_state
  local B, S = seq:size(1), seq:size(2)
  local logits = self.qa_outputs:forward(seq)  -- [B,S,2]
  local st, en = buf(self, "start_logits", { B, S }), buf(self, "end_logits", { B, S })
  st:copy_(logits:select(3, 1)); en:copy_(logits:select(3, 2))
  local res = { start_logits = st, end_logits = en, sequence_output = seq, hidden_states = out.hidden_states }
  self._has_loss = false
  if batch.start_positions ~= nil and batch.end_positions ~= nil then
    local function clamp(x, key)
      local t = bl.as_tensor(x, { dtype = "i64" })
      if t:numel() ~= B then error("BertForQuestionAnswering: " .. key .. " must have one position per sequence", 3) end
      if self.device and t.device_ == self.device then   -- staged on the device (trainer.fit): clamped there
        return buf(self, "_" .. key, { B }, "i32"):copy_(t:contiguous():view({ B })):maximum_(0):minimum_(S)
      end
      local v = t:totable()
      local r = self.device and bl.empty({ B }, { dtype = "i32" }) or buf(self, "_" .. key, { B }, "i32")
      local p = r:ptr()
      for i = 1, B do p[i - 1] = math.min(math.max(v[i], 0), S) end
      if self.device then r = buf(self, "_" .. key, { B }, "i32"):copy_(r) end
      return r
    end
    local sp, ep = clamp(batch.start_positions, "start_positions"), clamp(batch.end_positions, "end_positions")
    self._loss_in, self._loss_target = { st, en }, { sp, ep }
    res.loss, res.start_loss, res.end_loss = self.criterion:forward(self._loss_in, self._loss_target)
    self._has_loss = true
  end
  return res
end
-- backward([loss_scale]): gradients of loss * loss_scale (forward needs start/end positions)
function BertForQuestionAnswering:backward(loss_scale)
  if not self._has_loss then error("BertForQuestionAnswering:backward: forward had no start/end positions", 2) end
  local d = self.criterion:backward(self._loss_in, self._loss_target, loss_scale)
  self:backward_logits(d[1], d[2])
end
-- backward_logits(dstart, dend): from given gradients of the start/end logits [B,S]
function BertForQuestionAnswering:backward_logits(ds, de)
  local seq = self.bert:sequence_output()
  local B, S = seq:size(1), seq:size(2)
  local dl = buf(self, "_dlogits", { B, S, 2 })
  dl:select(3, 1):copy_(ds); dl:select(3, 2):copy_(de)
  local dseq = self.qa_outputs:backward(seq, dl)
  self.bert:backward(dseq, nil)
end

-- BertForSequenceClassification: dropout + linear on the pooled [CLS];
-- num_labels == 1 is regression with MSE (STS-B), as in transformers.
local BertForSequenceClassification = class("BertForSequenceClassification")
function M.BertForSequenceClassification(cfg, opts)
  local self, c, o = new_head(BertForSequenceClassification, cfg, opts, true)
  self.num_labels = o.num_labels or c.num_labels or 2
  c.num_labels = self.num_labels
  local p = c.classifier_dropout
  if type(p) ~= "number" then p = c.hidden_dropout_prob end
  self:add("dropout", nn.Dropout(p))
  self:add("classifier", nn.Linear(c.hidden_size, self.num_labels))
  self.criterion = self.num_labels == 1 and nn.MSECriterion() or nn.CrossEntropyCriterion{ ignore_index = -100 }
  self:flatten{ seed = o.seed or 0 }
  return self
end
-- forward{..., labels=[B]} -> { logits [B, num_labels], loss?, accuracy? }
function BertForSequenceClassification:forward(batch)
  local out = self.bert:forward(batch)
  local pooled = out.pooler_output
  local B = pooled:size(1)
  local x = self.dropout:forward(pooled)
  self._x = x
  local logits = self.classifier:forward(x)
  local res = { logits = logits, pooled_output = pooled, hidden_states = out.hidden_states }
  self._target = nil
  if batch.labels ~= nil then
    local t = bl.as_tensor(batch.labels, { dtype = self.num_labels == 1 and "f32" or "i32" })
    if t:numel() ~= B then error("BertForSequenceClassification: labels must have one value per sequence", 2) end
    t = on_device(self, self.num_labels == 1 and t or t:view({ B }))
    res.loss = self.criterion:forward(logits, t)
    if self.num_labels ~= 1 then res.accuracy = accuracy(logits, t, -100) end
    self._target = t
  end
  return res
end
-- backward([loss_scale]): gradients of loss * loss_scale (forward needs labels)
function BertForSequenceClassification:backward(loss_scale)
  if not self._target then error("BertForSequenceClassification:backward: forward had no labels", 2) end
  self:backward_logits(self.criterion:backward(self.classifier.output, self._target, loss_scale))
end
-- backward_logits(dlogits): from a given gradient of the logits [B, num_labels]
function BertForSequenceClassification:backward_logits(dl)
  local dx = self.classifier:backward(self._x, dl)
  if self.dropout._p ~= 0 then dx = self.dropout:backward(self.bert.pooler.output, dx) end
  self.bert:backward(nil, dx)
end

return M
