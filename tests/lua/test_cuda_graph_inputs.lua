-- Device seed slots (BL_SEED_SLOT in bl_ops.h): a dropout seed with bit 63 set names a u64 in device memory that
-- the kernels read when they run. Every dropout-using op (dropout, residual LayerNorm, embedding LayerNorm, attention
-- f32 and bf16 tensor-core, forward and backward) gives with a slot holding s exactly what it gives with s, and the
-- CPU twin's mask; a changed slot changes the mask at the next run; the CPU refuses a slot with a clear error; a
-- CUDA graph captured once and replayed takes the seed from the slot (bertlua.device.graph: replay, replayable).
-- Cross-entropy with its count made on the device (count -1, deferred checks) equals the one given the count, and
-- a replay counts its new targets. Needs a CUDA device (the emulated one in CI).
local T = require "testing"
local bl = require "bertlua"
local ops = require "bertlua.nn.ops"
local graph = require "bertlua.device.graph"

if bl.cuda_device_count() == 0 then T.skip_all("no CUDA device (the emulated build provides one)") end

local seeds = bl.zeros({ 2 }, { dtype = "i64", device = 0 })
local function slot(i) return ops.seed_slot(seeds, i + 1) end
local function set_seeds(a, b) seeds:copy_(bl.from({ a, b }, { dtype = "i64" })) end

local function same(a, b, what)
  local x, y = a:to{ device = "cpu", dtype = "f32" }:tolist(), b:to{ device = "cpu", dtype = "f32" }:tolist()
  local flat_x, flat_y = {}, {}
  local function flat(t, out)
    for _, v in ipairs(t) do if type(v) == "table" then flat(v, out) else out[#out + 1] = v end end
  end
  flat(x, flat_x); flat(y, flat_y)
  T.eq(#flat_x, #flat_y, what .. ": sizes")
  local diff = 0
  for i = 1, #flat_x do if flat_x[i] ~= flat_y[i] then diff = diff + 1 end end
  T.eq(diff, 0, what .. ": elements that differ")
end

local P, S1, S2 = 0.25, 123457, 9876543211

T.test("dropout: a slot gives its seed's mask, read when the kernel runs", function()
  for _, dt in ipairs({ "f32", "bf16" }) do
    local xc = bl.randn({ 37, 45 }, { seed = 5 })
    local x = xc:to{ device = "cuda:0", dtype = dt }
    set_seeds(S1, S2)
    same(ops.dropout(x, P, slot(0), 8), ops.dropout(x, P, S1, 8), dt .. " slot 0 = seed")
    same(ops.dropout(x, P, slot(1), 8), ops.dropout(x, P, S2, 8), dt .. " slot 1 = seed")
    same(ops.dropout(x, P, S1, 8), ops.dropout(x:to{ device = "cpu" }, P, S1, 8), dt .. " cuda = cpu twin")
    local y = ops.dropout(x, P, slot(0), 8)
    set_seeds(S2, S1)
    same(ops.dropout(x, P, slot(0), 8), ops.dropout(x, P, S2, 8), dt .. " after the slot changed")
    local dy = bl.randn({ 37, 45 }, { seed = 6 }):to{ device = "cuda:0", dtype = dt }
    same(ops.dropout_backward(dy, P, slot(1), 8), ops.dropout_backward(dy, P, S1, 8), dt .. " backward")
    T.truthy(y ~= nil)
  end
end)

T.test("residual LayerNorm and embedding LayerNorm with a slot, forward and backward", function()
  set_seeds(S1, S2)
  local R, H = 24, 64
  local x = bl.randn({ R, H }, { seed = 7 }):to("cuda:0")
  local res = bl.randn({ R, H }, { seed = 8 }):to("cuda:0")
  local g, b = bl.rand({ H }, { seed = 9 }):to("cuda:0"), bl.randn({ H }, { seed = 10 }):to("cuda:0")
  local y1, m1, r1 = ops.residual_layernorm(x, res, g, b, { p = P, seed = slot(0), offset = 3 })
  local y2, m2, r2 = ops.residual_layernorm(x, res, g, b, { p = P, seed = S1, offset = 3 })
  same(y1, y2, "residual_layernorm forward")
  local dy = bl.randn({ R, H }, { seed = 11 }):to("cuda:0")
  local dx1, dr1 = ops.residual_layernorm_backward(dy, x, res, g, m1, r1, { p = P, seed = slot(0), offset = 3 })
  local dx2, dr2 = ops.residual_layernorm_backward(dy, x, res, g, m2, r2, { p = P, seed = S1, offset = 3 })
  same(dx1, dx2, "residual_layernorm dx")
  same(dr1, dr2, "residual_layernorm dresidual")

  local B, S, V = 2, 12, 50
  local tabs = { bl.randn({ V, H }, { seed = 12 }), bl.randn({ S, H }, { seed = 13 }),
    bl.randn({ 2, H }, { seed = 14 }) }
  for i = 1, 3 do tabs[i] = tabs[i]:to("cuda:0") end
  local wid, pid, tid = {}, {}, {}
  for i = 1, B * S do wid[i], pid[i], tid[i] = (i * 37) % V, (i - 1) % S, math.floor(i / 5) % 2 end
  local ids = {}
  for i, t in ipairs({ wid, pid, tid }) do ids[i] = bl.from(t, { dtype = "i64" }):view({ B, S }):to("cuda:0") end
  local e1, em1, er1 = ops.embedding_layernorm(tabs, ids, g, b, { p = P, seed = slot(1), offset = 0 })
  local e2, em2, er2 = ops.embedding_layernorm(tabs, ids, g, b, { p = P, seed = S2, offset = 0 })
  same(e1, e2, "embedding_layernorm forward")
  local dye = bl.randn({ B, S, H }, { seed = 17 }):to("cuda:0")
  local function grads() return { bl.zeros({ V, H }, { device = 0 }), nil, nil, bl.zeros({ H }, { device = 0 }),
    bl.zeros({ H }, { device = 0 }) } end
  local g1, g2 = grads(), grads()
  ops.embedding_layernorm_backward(dye, tabs, ids, g, em1, er1, g1, { p = P, seed = slot(1), offset = 0 })
  ops.embedding_layernorm_backward(dye, tabs, ids, g, em2, er2, g2, { p = P, seed = S2, offset = 0 })
  same(g1[1], g2[1], "embedding_layernorm word-table gradient")
  same(g1[4], g2[4], "embedding_layernorm dgamma")
end)

T.test("attention (f32 and the bf16 tensor-core kernels) with a slot, forward and backward", function()
  set_seeds(S1, S2)
  local B, S, H, heads = 2, 32, 128, 2
  for _, dt in ipairs({ "f32", "bf16" }) do
    local function r(seed) return bl.randn({ B, S, H }, { seed = seed }):to{ device = "cuda:0", dtype = dt } end
    local q, k, v, dctx = r(20), r(21), r(22), r(23)
    local mask = bl.ones({ B, S }):to("cuda:0")
    local o1 = { p = P, seed = slot(0), offset = 11 }
    local o2 = { p = P, seed = S1, offset = 11 }
    local c1, s1 = ops.attention(q, k, v, mask, heads, o1)
    local c2, s2 = ops.attention(q, k, v, mask, heads, o2)
    same(c1, c2, dt .. " attention forward")
    o1.ctx, o1.key_mask, o2.ctx, o2.key_mask = c1, mask, c2, mask
    local dq1, dk1, dv1 = ops.attention_backward(dctx, q, k, v, s1, heads, o1)
    local dq2, dk2, dv2 = ops.attention_backward(dctx, q, k, v, s2, heads, o2)
    same(dq1, dq2, dt .. " attention dq")
    same(dk1, dk2, dt .. " attention dk")
    same(dv1, dv2, dt .. " attention dv")
  end
end)

T.test("the CPU refuses a slot, naming the op", function()
  local x = bl.randn({ 8, 8 }, { seed = 30 })
  T.raises(function() ops.dropout(x, P, slot(0), 0) end, "dropout: seed 0x8")
  T.raises(function() ops.dropout(x, P, slot(0), 0) end, "device seed slot")
  local g, b = bl.ones({ 8 }), bl.zeros({ 8 })
  T.raises(function() ops.residual_layernorm(x, x, g, b, { p = P, seed = slot(0) }) end, "device seed slot")
  ops.dropout(x, 0, slot(0), 0)   -- no dropout: the seed is not used, nothing to refuse
end)

T.test("a graph captured once and replayed reads the seed from its slot", function()
  local x = bl.randn({ 300 }, { seed = 31 }):to("cuda:0")
  local y = bl.zeros({ 300 }, { device = 0 })
  local ref = bl.zeros({ 300 }, { device = 0 })   -- made before the capture: the references allocate nothing
  local function expect(seed) return ops.dropout(x, P, seed, 2, false, ref) end
  local g = graph.Graph(0)
  T.truthy(not g:replayable(), "nothing captured yet")
  set_seeds(S1, S2)
  g:run(function() ops.dropout(x, P, slot(0), 2, false, y) end)
  same(y, expect(S1), "the captured launch")
  T.truthy(g:replayable(), "replayable after its launch")
  for _, s in ipairs({ S2, 77, 5 }) do
    set_seeds(s, 0)
    g:replay()
    same(y, expect(s), "replay with seed " .. s)
  end
  local st = g:stats()
  T.eq(st.instantiations, 1, "instantiations")
  T.eq(st.updates, 0, "updates")
  T.eq(st.replays, 3, "replays")
  T.eq(st.launches, 4, "launches")
  local tmp = bl.empty({ 999 }, { device = 0 })   -- a block handed out: the graph's blocks may have changed hands
  T.truthy(not g:replayable(), "not replayable after a device allocation")
  T.raises(function() g:replay() end, "capture again")
  tmp:free()
  g:free()
end)

T.test("cross-entropy counted on the device: the given count's bits, and a replay counts its new targets", function()
  local device = require "bertlua.train.device"
  device.defer_checks(0)
  local N, K = 13, 9
  local logits = bl.randn({ N, K }, { seed = 40 }):to("cuda:0")
  local t = bl.zeros({ N }, { dtype = "i32", device = 0 })
  local function targets(seed)   -- some rows ignored (-1): their number changes with the seed
    local v, n = {}, 0
    for i = 1, N do
      v[i] = ((i * 7 + seed * 3) % 5 == 0) and -1 or (i * seed) % K
      if v[i] ~= -1 then n = n + 1 end
    end
    t:copy_(bl.from(v, { dtype = "i32" }))
    return n
  end
  local l1, l2 = bl.zeros({ 1 }, { dtype = "f64", device = 0 }), bl.zeros({ 1 }, { dtype = "f64", device = 0 })
  local d1, d2 = bl.zeros({ N, K }, { device = 0 }), bl.zeros({ N, K }, { device = 0 })
  local n = targets(1)
  ops.cross_entropy_counted(logits, t, -1, n, l1, d1, 0.5)
  ops.cross_entropy_counted(logits, t, -1, -1, l2, d2, 0.5)
  T.eq(l2:totable()[1], l1:totable()[1], "loss")
  same(d2, d1, "dlogits")
  local want = {}   -- the references first: their scratch blocks are handed out before the capture
  for _, seed in ipairs({ 2, 3, 4 }) do
    n = targets(seed)
    ops.cross_entropy_counted(logits, t, -1, n, l1, d1, 0.5)
    want[seed] = { l1:totable()[1], d1:to("cpu"), n }
  end
  local g = graph.Graph(0)
  g:run(function() ops.cross_entropy_counted(logits, t, -1, -1, l2, d2, 0.5) end)
  for _, seed in ipairs({ 2, 3, 4 }) do
    targets(seed)
    T.truthy(g:replayable(), "replayable")
    g:replay()
    T.eq(l2:totable()[1], want[seed][1], "replayed loss, seed " .. seed .. " (" .. want[seed][3] .. " counted)")
    same(d2, want[seed][2], "replayed dlogits, seed " .. seed)
  end
  g:free()
  device.defer_checks(0, false)
end)

T.run()
