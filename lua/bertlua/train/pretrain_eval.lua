-- bertlua.train.pretrain_eval: held-out pre-training metrics of a BertForPreTraining (MLM loss and accuracy over
-- the masked tokens, NSP loss and accuracy over the sequences), from the batches of a data.Loader: the evaluation
-- of recipes/pretrain.lua (bertlua.train.phase) and of tools/pretrain_curves.lua.
--
--   local pe = require "bertlua.train.pretrain_eval"
--   local sums = pe.sums(model, loader, { batches = 20, dev = -1 })   -- the model is left in training mode
--   local r = pe.metrics(sums)  -- { mlm_loss, mlm_acc, mlm_count, nsp_loss, nsp_acc, nsp_count } (nil: no targets)
--
-- sums is a flat array of six numbers (MLM loss sum, MLM correct, MLM count, NSP loss sum, NSP correct, NSP
-- count), so data-parallel ranks can add theirs (dist.sum_numbers) before metrics(). A loader with shuffle = false
-- serves the held-out instances in file order: the first batches * batch_size of them are the ones counted
-- (tools/peers/pretrain_eval_reference.py reads the same ones).
local device = require "bertlua.train.device"

local M = {}

function M.sums(model, loader, o)
  local dev, batches = o and o.dev or -1, o and o.batches or math.huge
  local s = { 0, 0, 0, 0, 0, 0 }
  model:eval()
  local ok, err = pcall(function()
    local k = 0
    while k < batches do
      local batch = loader:next()
      if not batch then break end
      local b = batch.next_sentence_labels and batch.next_sentence_labels:numel() or 0
      local out = model:forward(dev >= 0 and device.batch_to(batch, dev) or batch)
      local m = out.mlm_count or 0
      -- the accuracies are fractions of whole counts: rounded back to them
      s[1], s[2], s[3] = s[1] + (out.mlm_loss or 0) * m, s[2] + math.floor((out.mlm_accuracy or 0) * m + 0.5), s[3] + m
      if out.nsp_loss then
        s[4], s[5], s[6] = s[4] + out.nsp_loss * b, s[5] + math.floor(out.nsp_accuracy * b + 0.5), s[6] + b
      end
      k = k + 1
    end
  end)
  model:train()
  if not ok then error(err, 0) end
  return s
end

function M.metrics(s)
  if s[3] == 0 and s[6] == 0 then return nil end
  local function ratio(a, b) return b > 0 and a / b or nil end
  return { mlm_loss = ratio(s[1], s[3]), mlm_acc = ratio(s[2], s[3]), mlm_count = s[3],
    nsp_loss = ratio(s[4], s[6]), nsp_acc = ratio(s[5], s[6]), nsp_count = s[6] }
end

return M
