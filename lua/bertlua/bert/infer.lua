-- bertlua.bert.infer: a model set up for CPU inference.
--
--   local infer = require "bertlua.bert.infer"
--   infer.pack(model)     -- eval mode, every linear weight packed once for our own GEMM
--   model:forward(batch)  -- the packed GEMMs, bias and GELU in their epilogues, padding skipped
--   infer.unpack(model)   -- back to the ordinary GEMMs (before training again)
--
-- A pack is a snapshot of the weights for the CPU path (AVX-512 / AVX2) in
-- use: call pack again after loading other weights, after an optimizer step
-- or after bl.cpu_set_isa. Modules use their pack in eval mode only
-- (training runs the ordinary GEMMs, so train() needs no unpack, but the
-- packs keep their memory: about one more copy of the linear weights).
-- On a GPU, or for weights that are not f32 on the CPU, nothing is packed.
--
-- pack also turns on unpadded inference (opts.unpad = false keeps the padded
-- forward): a batch with padding runs on its real tokens only, packed into one
-- matrix, with attention per sequence over its own tokens; the hidden states
-- of padded positions are zeros (see BertModel:forward). Heads and recipes
-- read real positions only.
local ops = require "bertlua.nn.ops"

local M = {}

local function packable(w) return w ~= nil and w.device_ == -1 and w:dtype() == "f32" end

-- the fused [3H, H] QKV weight of a self-attention module, or nil
local function qkv_of(m) return m.fused and m._qkv end

-- pack(model[, {unpad = true}]) -> model (in eval mode); returns the number of weights packed as a second value
function M.pack(model, opts)
  local unpad = not (opts and opts.unpad == false)
  model:eval()
  local n = 0
  local function visit(m)
    if m.__name == "BertModel" then m.unpad = unpad end
    local qkv = qkv_of(m)
    if qkv and packable(qkv.w) then
      qkv.packed = ops.pack_weight(qkv.w)
      n = n + 1
      return  -- its query/key/value Linears are not run
    end
    if m.__name == "Linear" and packable(m.weight) then
      m.packed = ops.pack_weight(m.weight)
      n = n + 1
    end
    for _, c in ipairs(m._children) do visit(c.module) end
  end
  visit(model)
  return model, n
end

-- unpack(model): drop every pack (their memory goes with the next garbage collection)
function M.unpack(model)
  model:apply(function(m)
    m.packed = nil
    m.unpad = nil
    local qkv = qkv_of(m)
    if qkv then qkv.packed = nil end
  end)
  return model
end

return M
