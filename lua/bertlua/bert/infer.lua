-- bertlua.bert.infer: a model set up for CPU inference.
--
--   local infer = require "bertlua.bert.infer"
--   infer.pack(model)     -- eval mode, every linear weight packed once for our own GEMM
--   infer.pack(model, "int8")  -- or "bf16": the low-precision GEMMs (see plan below)
--   model:forward(batch)  -- the packed GEMMs, bias and GELU in their epilogues, padding skipped
--   infer.unpack(model)   -- back to the ordinary GEMMs (before training again)
--
-- A pack is a snapshot of the weights for the CPU path (AVX-512 / AVX2) in
-- use: call pack again after loading other weights, after an optimizer step
-- or after bl.set_cpu_isa. Modules use their pack in eval mode only
-- (training runs the ordinary GEMMs, so train() needs no unpack, but the
-- packs keep their memory: about one more copy of the linear weights).
-- On a GPU, or for weights that are not f32 on the CPU, nothing is packed.
--
-- pack also turns on unpadded inference (opts.unpad = false keeps the padded
-- forward): a batch with padding runs on its real tokens only, packed into one
-- matrix, with attention per sequence over its own tokens; the hidden states
-- of padded positions are zeros (see BertModel:forward). Heads and recipes
-- read real positions only.
--
-- With a bf16 pack, the activations whose only reader is a bf16-packed linear
-- (the attention context, the FFN's GELU output) are written in bf16 (their
-- modules' bf16_out): the GEMM reads them in place instead of rounding an f32
-- copy, and the bits it reads, so the outputs, are the same. On AMX the fused
-- QKV linear also writes bf16 (bf16_qkv) where heads are 32 or 64 wide: the
-- packed attention then runs its products on tiles (bf16 q, k, v and
-- probabilities, f32 sums and softmax): not the same bits; the accuracy cost
-- is tests/lua/test_infer_lowp.lua's and BENCHMARKS'.
local ops = require "bertlua.nn.ops"
local runtime = require "bertlua.runtime"

local M = {}

-- check_precision(recipe, p, dev) -> the precision the model's weights get (bertlua.train.device's
-- inference_model): p itself (bertlua.train.amp's precisions), or "fp32" for "int8", which is CPU
-- inference only; errors raised at level 0 (one clear line from a recipe)
local PRECISIONS = { fp32 = true, tf32 = true, bf16 = true, fp16 = true, int8 = true }
function M.check_precision(recipe, p, dev)
  if not PRECISIONS[p] then
    error(("%s: --precision must be fp32, tf32, bf16, fp16 or int8, got %s"):format(recipe, tostring(p)), 0)
  end
  if p ~= "int8" then return p end
  if dev >= 0 then error(recipe .. ": --precision=int8 is CPU inference only (use --device=cpu)", 0) end
  return "fp32"
end

-- plan(precision) -> the pack's precision ("fp32", "bf16" or "int8") and a line saying what runs:
--   int8: dynamic quantization, weights per output channel, activations per row (AMX, VNNI or AVX2 kernel);
--   bf16: weights and activations rounded to bf16, f32 sums, where the CPU has AVX512-BF16 (on AMX the
--         unpadded attention's products too, see pack); elsewhere the
--         f32 GEMM on the bf16-rounded weights (what the recipes' weight rounding already gives);
--   anything else: fp32 (tf32/fp16 round the weights only, as before).
function M.plan(precision)
  if precision == "int8" then
    if not runtime.cpu_has("avx2") then
      error("int8 inference needs the avx2 or avx512 CPU path (this one: " .. runtime.cpu_isa() .. ")", 0)
    end
    return "int8", "int8 dynamic quantization (weights per output channel, activations per row), "
      .. (runtime.cpu_has("amx") and "AMX tdpbusd" or runtime.cpu_has("avx512_vnni") and "VNNI vpdpbusd"
        or "AVX2 vpmaddwd") .. " int32 sums"
  elseif precision == "bf16" then
    if runtime.cpu_has("avx512_bf16") then
      return "bf16", "bf16 GEMM (weights and activations rounded to bf16, "
        .. (runtime.cpu_has("amx") and "AMX tdpbf16ps; attention products on tiles where heads are 32 or 64 wide"
          or "vdpbf16ps") .. ", f32 sums)"
    end
    return "fp32", "bf16: no AVX512-BF16 on this CPU path (" .. runtime.cpu_isa()
      .. "): f32 GEMM on bf16-rounded weights"
  end
  return "fp32", "fp32 GEMM"
end

local function packable(w) return w ~= nil and w.device_ == -1 and w:dtype() == "f32" end

-- the fused [3H, H] QKV weight of a self-attention module, or nil
local function qkv_of(m) return m.fused and m._qkv end

-- pack(model[, precision][, {unpad = true}]) -> model (in eval mode), the number of weights packed, and
-- plan(precision)'s line (precision: as a recipe's --precision, default fp32; unpad = false: padded positions are
-- computed as in training instead of skipped)
function M.pack(model, precision, opts)
  if type(precision) == "table" then precision, opts = nil, precision end
  local kind, line = M.plan(precision or "fp32")
  local unpad = not (opts and opts.unpad == false)
  model:eval()
  local n = 0
  local function visit(m)
    if m.__name == "BertModel" then m.unpad = unpad end
    local qkv = qkv_of(m)
    if qkv and packable(qkv.w) then
      qkv.packed = ops.pack_weight(qkv.w, kind)
      n = n + 1
      return  -- its query/key/value Linears are not run
    end
    if m.__name == "Linear" and packable(m.weight) then
      m.packed = ops.pack_weight(m.weight, kind)
      n = n + 1
    end
    for _, c in ipairs(m._children) do visit(c.module) end
  end
  visit(model)
  if kind == "bf16" then
    model:apply(function(m)
      if m.__name == "BertAttention" and m.output.dense.packed then m.self.bf16_out = true end
      if m.__name == "BertLayer" and m.output.dense.packed then m.intermediate.bf16_out = true end
      local d = m.__name == "BertSelfAttention" and m.cfg.hidden_size / m.heads
      if d and (d == 32 or d == 64) and qkv_of(m) and qkv_of(m).packed and runtime.cpu_has("amx") then
        m.bf16_qkv = true
      end
    end)
  end
  return model, n, line
end

-- unpack(model): drop every pack (their memory goes with the next garbage collection)
function M.unpack(model)
  model:apply(function(m)
    m.packed = nil
    m.unpad = nil
    m.bf16_out, m.bf16_qkv = nil, nil
    local qkv = qkv_of(m)
    if qkv then qkv.packed = nil end
  end)
  return model
end

return M
