-- Diagnostic for a real GPU: is a BERT pre-training forward + backward bitwise repeatable? The same model, batch and
-- seed, run R times in one process: the loss and every parameter's gradient compared bit for bit with the first
-- run; the parameters that differ are named (e.g. only the word embeddings: the embedding backward; every weight:
-- the GEMMs). Also R repeats of one bf16 GEMM with bias. Exit 1 when anything differs.
local bl = require "bertlua"
local bert = require "bertlua.bert"
local config = require "bertlua.bert.config"
package.path = arg[0]:gsub("tools/gpu/[^/]*$", "") .. "tests/lua/lib/?.lua;" .. package.path
local fixtures = require "fixtures"
if bl.cuda_device_count() == 0 then print("no CUDA device"); os.exit(77) end
local R = tonumber(os.getenv("BL_DIAG_REPEATS") or "") or 8
local bad = 0
local function bits(t) return t:to{ device = "cpu" }:contiguous() end
local function same(a, b)
  local x, y = a:to{ dtype = "f64" }:totable(), b:to{ dtype = "f64" }:totable()
  local n = 0
  for i = 1, #x do if x[i] ~= y[i] then n = n + 1 end end
  return n, #x
end
for _, prec in ipairs { "f32", "bf16" } do
  local shapes = os.getenv("BL_DIAG_SMALL") and { { 2, 32, 5, 96, 64, 2 } }
    or { { 8, 128, 20, 1024, 256, 4 }, { 64, 128, 20, 30528, 256, 2 } }
  for _, shape in ipairs(shapes) do
    local B, S, P, V, H, L = unpack(shape)
    local cfg = config.new{ vocab_size = V, hidden_size = H, num_hidden_layers = L, num_attention_heads = 4,
      intermediate_size = 4 * H, max_position_embeddings = 512, hidden_dropout_prob = 0,
      attention_probs_dropout_prob = 0 }
    local m = bert.BertForPreTraining(cfg, { seed = 7 }):to("cuda:0")
    if prec ~= "f32" then m:to(prec) end
    local bt = fixtures.pretrain_batch(V, B, S, P)
    local ref_loss, ref_grads
    local diffs = {}
    for r = 1, R do
      m:zero_grad()
      local loss = m:forward(bt).loss
      m:backward()
      local g = bits(m.flat_grads)
      if r == 1 then ref_loss, ref_grads = loss, g
      else
        if loss ~= ref_loss then diffs[#diffs + 1] = ("run %d loss %.17g vs %.17g"):format(r, loss, ref_loss) end
        for _, p in ipairs(m:parameters()) do
          local n, tot = same(g:narrow(1, p.offset + 1, p.numel), ref_grads:narrow(1, p.offset + 1, p.numel))
          if n > 0 then diffs[#diffs + 1] = ("run %d %s: %d of %d differ"):format(r, p.name, n, tot) end
        end
      end
    end
    print(("%s B=%d S=%d V=%d H=%d L=%d, %d runs: %s"):format(prec, B, S, V, H, L, R,
      #diffs == 0 and "bitwise repeatable" or (#diffs .. " differences")))
    for i = 1, math.min(#diffs, 25) do print("  " .. diffs[i]) end
    bad = bad + #diffs
  end
end
os.exit(bad == 0 and 0 or 1)
