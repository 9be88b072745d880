-- The CPU block cache (src/tensor/alloc.c) in training steps: once the batch
-- shapes a run uses have been seen, a step maps no new memory even when
-- the shape changes from step to step (module buffers are reallocated then);
-- with the cache off the same steps map every time; and a reused block's old
-- contents never leak into results (losses equal with the cache on and off).
local T = require "testing"
local bl = require "bertlua"
local bert = require "bertlua.bert"

-- sized so that activations, probabilities and FFN buffers are over the cache's 256 KiB floor
local CFG = { vocab_size = 1000, hidden_size = 128, num_hidden_layers = 2, num_attention_heads = 2,
  intermediate_size = 512, max_position_embeddings = 64, type_vocab_size = 2 }
local S, P = 64, 6

local function make_batch(B)
  local u = bl.rand({ B, S + 2 * P }, { seed = 7, offset = B }):totable()
  local ids, mask, pos, lab, nsp = {}, {}, {}, {}, {}
  for b = 1, B do
    ids[b], mask[b], pos[b], lab[b], nsp[b] = {}, {}, {}, {}, b % 2
    local row = (b - 1) * (S + 2 * P)
    for s = 1, S do
      ids[b][s] = math.floor(u[row + s] * CFG.vocab_size)
      mask[b][s] = s <= S - 8 and 1 or 0
    end
    for j = 1, P do
      pos[b][j] = 1 + math.floor(u[row + S + j] * (S - 10))
      lab[b][j] = math.floor(u[row + S + P + j] * CFG.vocab_size)
    end
  end
  return { input_ids = bl.from(ids, { dtype = "i32" }), attention_mask = bl.from(mask),
    token_type_ids = bl.zeros({ B, S }, { dtype = "i32" }), masked_lm_positions = bl.from(pos, { dtype = "i32" }),
    masked_lm_labels = bl.from(lab, { dtype = "i32" }), next_sentence_labels = bl.from(nsp, { dtype = "i32" }) }
end

-- steps over the batch sizes in `sizes` (SGD on the flat buffer); returns the losses and the cache's
-- mapping count after each step
local function train(sizes)
  local model = bert.BertForPreTraining(CFG, { seed = 3 })
  model:train()
  local batches = {}
  local losses, maps = {}, {}
  for i, B in ipairs(sizes) do
    batches[B] = batches[B] or make_batch(B)
    model:zero_grad()
    local out = model:forward(batches[B])
    model:backward()
    model.flat_params:add_(model.flat_grads * -0.05)
    losses[i] = out.loss
    collectgarbage()  -- the step's temporaries go back now, as a long run's collector would send them
    maps[i] = bl.cpu_cache_stats().maps
  end
  return losses, maps
end

local SIZES = { 16, 12, 16, 12, 16, 16 }

T.test("shapes seen once: later steps map nothing, even when the shape changes each step", function()
  bl.cpu_cache_set_limit(512 * 2 ^ 20)
  local hits0 = bl.cpu_cache_stats().hits
  local _, maps = train(SIZES)
  for i = 3, #SIZES do
    T.eq(maps[i] - maps[2], 0, ("step %d (batch %d) mapped new blocks"):format(i, SIZES[i]))
  end
  T.truthy(bl.cpu_cache_stats().hits > hits0, "the changed shapes were served from the cache")
  T.truthy(maps[1] > 0, "the first step maps its activations")
end)

T.test("cache off: the same steps map every time the shape changes; losses equal bit for bit", function()
  bl.cpu_cache_set_limit(512 * 2 ^ 20)
  local with_cache = train(SIZES)
  bl.cpu_cache_set_limit(0)
  local losses, maps = train(SIZES)
  for i = 3, 4 do
    T.truthy(maps[i] > maps[i - 1], ("step %d maps again without the cache"):format(i))
  end
  for i = 1, #SIZES do T.eq(losses[i], with_cache[i], "loss of step " .. i) end
  bl.cpu_cache_set_limit(512 * 2 ^ 20)
end)

T.test("release gives every free block back; a bad bound is an error", function()
  local t = bl.empty({ 1024, 1024 })
  t:free()
  T.truthy(bl.cpu_cache_stats().cached_bytes >= 4 * 2 ^ 20)
  T.truthy(bl.cpu_cache_release() >= 4 * 2 ^ 20)
  T.eq(bl.cpu_cache_stats().cached_bytes, 0)
  local ok, err = pcall(bl.cpu_cache_set_limit, -1)
  T.truthy(not ok and tostring(err):find("cpu_cache_set_limit", 1, true), tostring(err))
end)

T.run()
