-- Evaluation and prediction batches on a GPU go through pinned memory (bertlua.device.prefetch, bl_stager), as the
-- training batches do: infer.predict (squad/glue evaluation, predict.lua) and bert.extract_features
-- (extract_features.lua) on a tiny model with random inputs, batches of changing length and a short last batch:
--   * the outputs are bit for bit those of the direct path (each batch uploaded with device.batch_to, the same
--     kernels on the same device);
--   * the emulated runtime's counter of uploads from pageable memory stays at 0 over both loops, while the direct
--     path makes one per field and batch (the counter sees them). The direct path runs first: the model's own
--     per-shape cache (the position ids, uploaded once per new batch shape) is then warm for both;
--   * the next batch is made and put on its way before the current batch's outputs are consumed;
--   * a stager misused gives a clear error.
-- Needs a CUDA device (the emulated one in CI); skipped otherwise.
local T = require "testing"
local bl = require "bertlua"
local bert = require "bertlua.bert"
local config = require "bertlua.bert.config"
local batched = require "bertlua.batched"
local device = require "bertlua.train.device"
local prefetch = require "bertlua.device.prefetch"
local cjson = require "cjson"

if not bl.cuda_available() then
  T.skip_all(bl.cuda_compiled() and "no CUDA device" or "no CUDA device (CPU-only build)")
end

local CFG = config.new{ vocab_size = 64, hidden_size = 32, num_hidden_layers = 1, num_attention_heads = 2,
  intermediate_size = 64, max_position_embeddings = 64, num_labels = 3 }
local N, BATCH = 11, 4   -- three batches: 4, 4 and 3 examples

-- example i: random ids of a length that changes from batch to batch (the stager's buffers grow)
local u = bl.rand({ N * 40 }, { seed = 21 }):totable()
local EX = {}
for i = 1, N do
  local len = 8 + (i * 7) % 29
  local ids, types = {}, {}
  for s = 1, len do
    ids[s] = 1 + math.floor(u[(i - 1) * 40 + s] * (CFG.vocab_size - 1))
    types[s] = s > len / 2 and 1 or 0
  end
  EX[i] = { ids = ids, types = types, tokens = {}, type_ids = types, index = i - 1 }
  for s = 1, len do EX[i].tokens[s] = "t" .. ids[s] end
end

local made = {}   -- the order of make_batch and consume calls
local function make_batch(idx)
  made[#made + 1] = "make " .. idx[1]
  local rows = {}
  for k, i in ipairs(idx) do rows[k] = EX[i] end
  return (batched.pad_rows(rows, CFG.max_position_embeddings))
end

local model = bert.BertForSequenceClassification(CFG, { seed = 9 })
model:to{ device = 0 }
model:eval()

local function pageable() return bl.cuda_counters(0).pageable_h2d end

T.test("infer.predict: the direct path's logits, no upload from pageable memory, the next batch in flight",
  function()
  -- the direct path: each batch uploaded from its (pageable) tensors
  local want, p0 = {}, pageable()
  for first = 1, N, BATCH do
    local idx = {}
    for i = first, math.min(first + BATCH - 1, N) do idx[#idx + 1] = i end
    want[#want + 1] = model:forward(device.batch_to(make_batch(idx), 0)).logits:to("cpu"):totable()
  end
  -- the counter is the emulated runtime's (-1 on a real GPU, where only the zero checks below still say something)
  if p0 >= 0 then
    T.truthy(pageable() - p0 >= 3 * #want, "the direct path's uploads from pageable memory (3 fields a batch)")
  end
  made = {}
  local got, p1 = {}, pageable()
  local stats = batched.predict{ model = model, n = N, batch = BATCH, device = 0, make_batch = make_batch,
    consume = function(idx, out)
      made[#made + 1] = "consume " .. idx[1]
      got[#got + 1] = out.logits:totable()
    end }
  T.eq(pageable() - p1, 0, "uploads from pageable memory in the prediction loop")
  T.eq(stats.batches, 3, "batches")
  T.eq(#got, #want, "batches consumed")
  for b = 1, #want do
    T.eq(#got[b], #want[b], "logits of batch " .. b)
    for j = 1, #want[b] do T.eq(got[b][j], want[b][j], ("batch %d logit %d"):format(b, j)) end
  end
  T.eq(table.concat(made, ", "), "make 1, make 5, consume 1, make 9, consume 5, consume 9",
    "batch k + 1 is made and put before batch k's outputs are consumed")
end)

T.test("extract_features: the direct path's hidden states, no upload from pageable memory", function()
  local want = {}   -- example -> token -> the last layer's values, from the direct path
  for first = 1, N, BATCH do
    local idx = {}
    for i = first, math.min(first + BATCH - 1, N) do idx[#idx + 1] = i end
    -- extract_features' inputs: padded to the batch's longest example, an f32 mask
    local S = 0
    for _, i in ipairs(idx) do S = math.max(S, #EX[i].ids) end
    local ids, types, mask = {}, {}, {}
    for k, i in ipairs(idx) do
      ids[k], types[k], mask[k] = {}, {}, {}
      for j = 1, S do
        ids[k][j], types[k][j], mask[k][j] = EX[i].ids[j] or 0, EX[i].types[j] or 0, EX[i].ids[j] and 1 or 0
      end
    end
    local b = { input_ids = bl.from(ids, { dtype = "i32" }), token_type_ids = bl.from(types, { dtype = "i32" }),
      attention_mask = bl.from(mask, { dtype = "f32" }) }
    local hs = model.bert:forward(device.batch_to(b, 0)).hidden_states
    local h, H = hs[#hs]:to("cpu"):totable(), CFG.hidden_size   -- [B, S, H], flat
    for k, i in ipairs(idx) do
      want[i] = {}
      for j = 1, #EX[i].ids do
        want[i][j] = {}
        for d = 1, H do want[i][j][d] = h[((k - 1) * S + j - 1) * H + d] end
      end
    end
  end
  local lines, p0 = {}, pageable()
  bert.extract_features(model, EX, { layers = { -1 }, batch = BATCH, device = 0 }, function(i, line)
    lines[i + 1] = cjson.decode(line)
  end)
  T.eq(pageable() - p0, 0, "uploads from pageable memory in extract_features")
  T.eq(#lines, N, "examples")
  for i = 1, N do
    local feats = lines[i].features
    T.eq(#feats, #EX[i].ids, "tokens of example " .. i)
    for j = 1, #EX[i].ids do
      local v = feats[j].layers[1].values
      for d = 1, CFG.hidden_size do
        if tonumber(("%.9g"):format(want[i][j][d])) ~= v[d] then
          T.eq(v[d], want[i][j][d], ("example %d token %d dim %d"):format(i, j, d))
        end
      end
    end
  end
end)

T.test("a stager misused: clear errors", function()
  local st = prefetch.Stager(0)
  T.raises(function() st:get() end, "prefetch: get with no batch put")
  T.raises(function() st:put({ n = 3 }) end, "prefetch: a batch needs 1..8 CPU tensors, got 0")
  local x = bl.ones({ 2, 3 })
  st:put({ x = x })
  st:put({ x = x })
  T.raises(function() st:put({ x = x }) end, "stager: put with 2 batches in flight")
  T.eq(st:get().x:to("cpu"):totable()[6], 1.0, "a staged value")
  st:close()
end)

T.run()
