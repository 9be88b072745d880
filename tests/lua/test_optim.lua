-- bertlua.train.optim: LAMB/AdamW/SGD through the Lua API against a plain f64
-- reference written here, AdamW and SGD against torch.optim (1.13, via
-- $BL_PYTHON), the no-decay name rule, state_dict round trips, clipping and
-- bad-input errors. The C test tests/c/test_optim.c covers the variants.
local T = require "testing"
local bl = require "bertlua"
local optim = require "bertlua.train.optim"
local ffi = require "ffi"

local PY = os.getenv("BL_PYTHON") or "/usr/bin/python3"

-- HF-style names over a flat buffer with gaps (alignment padding)
local LAYOUT = {
  { name = "encoder.layer.0.attention.self.query.weight", offset = 0, length = 24000 },
  { name = "encoder.layer.0.attention.self.query.bias", offset = 24016, length = 48 },
  { name = "encoder.layer.0.attention.output.LayerNorm.weight", offset = 24080, length = 48 },
  { name = "encoder.layer.0.attention.output.LayerNorm.bias", offset = 24128, length = 48 },
  { name = "cls.predictions.transform.dense.weight", offset = 24192, length = 18000 },
}
local NUMEL = 42208

local function rand_flat(seed, scale)
  local t = bl.rand({ NUMEL }, { seed = seed, low = -scale, high = scale })
  return t
end

local function tolist(t)
  local p, r = t:ptr(), {}
  for i = 0, t:numel() - 1 do r[i + 1] = p[i] end
  return r
end

local function max_rel_err(got, want, atol)
  local worst, at = 0, 0
  for i = 1, #want do
    local e = math.abs(got[i] - want[i]) / (atol + 1e-5 * math.abs(want[i]))
    if e > worst or e ~= e then worst, at = e, i end
  end
  return worst, at
end

local function expect_close(what, got, want, atol)
  local e, at = max_rel_err(got, want, atol)
  if not (e <= 1) then
    error(("%s: element %d got %.9g expected %.9g (%.3g x tolerance)"):format(what, at, got[at], want[at], e), 2)
  end
end

-- f64 LAMB, NVIDIA semantics, written from the formulas (not from the C code)
local function ref_lamb(w, g, m, v, segs, step, lr, o)
  local b1, b2, eps, wd, maxn = 0.9, 0.999, 1e-6, 0.01, 1.0
  local sq = 0
  for _, s in ipairs(segs) do
    for i = s.offset + 1, s.offset + s.length do sq = sq + g[i] * g[i] end
  end
  local norm = math.sqrt(sq)
  local clip = norm > maxn and norm / maxn or 1
  local bc1, bc2 = 1 - b1 ^ step, 1 - b2 ^ step
  for _, s in ipairs(segs) do
    local d = s.decay and wd or 0
    local u, wn, un = {}, 0, 0
    for i = s.offset + 1, s.offset + s.length do
      local gi = g[i] / clip
      m[i] = b1 * m[i] + (1 - b1) * gi
      v[i] = b2 * v[i] + (1 - b2) * gi * gi
      u[i] = (m[i] / bc1) / (math.sqrt(v[i] / bc2) + eps) + d * w[i]
      wn, un = wn + w[i] * w[i], un + u[i] * u[i]
    end
    wn, un = math.sqrt(wn), math.sqrt(un)
    local trust = 1
    if (s.decay or o.use_nvlamb) and wn > 0 and un > 0 then trust = wn / un end
    for i = s.offset + 1, s.offset + s.length do w[i] = w[i] - lr * trust * u[i] end
  end
  return norm
end

T.test("no_decay name rule (NVIDIA / Hugging Face)", function()
  T.eq(optim.no_decay("bert.encoder.layer.3.output.dense.bias"), true)
  T.eq(optim.no_decay("bert.encoder.layer.3.output.LayerNorm.weight"), true)
  T.eq(optim.no_decay("encoder.layers.0.layer_norm.weight"), true)
  T.eq(optim.no_decay("bert/encoder/layer_0/output/LayerNorm/gamma"), true)
  T.eq(optim.no_decay("embeddings.ln.beta"), true)
  T.eq(optim.no_decay("bert.encoder.layer.3.output.dense.weight"), false)
  T.eq(optim.no_decay("bert.embeddings.word_embeddings.weight"), false)
  T.eq(optim.no_decay(nil), false)
  local s = optim.segments(LAYOUT, NUMEL).list
  T.eq(s[1].decay, true); T.eq(s[2].decay, false); T.eq(s[3].decay, false); T.eq(s[4].decay, false)
  T.eq(s[5].decay, true)
  -- explicit decay wins over the name rule
  T.eq(optim.segments({ { name = "x.bias", offset = 0, length = 4, decay = true } }, 10).list[1].decay, true)
end)

local function lamb_run(o)
  local p, g = rand_flat(1, 0.1), bl.zeros({ NUMEL })
  local opt = optim.LAMB { params = p, grads = g, segments = LAYOUT, lr = 0.01, use_nvlamb = o.use_nvlamb }
  local W, M, V = tolist(p), {}, {}
  for i = 1, NUMEL do M[i], V[i] = 0, 0 end
  local segs = optim.segments(LAYOUT, NUMEL).list
  for step = 1, 4 do
    g:copy_(rand_flat(100 + step, 1.0))
    local G = tolist(g)
    local lr = 0.01 * step
    local st = opt:step(lr)
    local norm = ref_lamb(W, G, M, V, segs, step, lr, o)
    T.near(st.grad_norm, norm, 1e-12)
    T.truthy(st.clip_coef < 1, "clipping should be active")
  end
  T.eq(opt.step_count, 4)
  expect_close("weights", tolist(p), W, 1e-6)
  expect_close("exp_avg", tolist(opt.exp_avg), M, 1e-7)
  expect_close("exp_avg_sq", tolist(opt.exp_avg_sq), V, 1e-12)
  -- gaps untouched
  local w0 = tolist(rand_flat(1, 0.1))
  local pl = tolist(p)
  T.eq(pl[24001], w0[24001]); T.eq(pl[24081 - 1], w0[24081 - 1])
end

T.test("LAMB (NVIDIA defaults) equals the f64 formula over 4 steps", function() lamb_run {} end)
T.test("LAMB use_nvlamb equals the f64 formula", function() lamb_run { use_nvlamb = true } end)

T.test("LAMB from a model: segments and decay from parameter names", function()
  local nn = require "bertlua.nn"
  local lin = nn.Linear(8, 4)
  lin:flatten { seed = 3 }
  local opt = optim.LAMB { model = lin, lr = 1e-3 }
  local names = {}
  for _, s in ipairs(opt.segment_list) do names[s.name] = s.decay end
  T.eq(names.weight, true); T.eq(names.bias, false)
  lin.flat_grads:fill_(0.5)
  local before = lin.flat_params:clone()
  opt:step()
  T.truthy(math.abs(lin.flat_params:ptr()[0] - before:ptr()[0]) > 0, "weights did not move")
  opt:zero_grad()
  T.eq(lin.flat_grads:ptr()[0], 0)
end)

T.test("state_dict / load_state_dict resume gives identical results", function()
  local function make(p)
    return optim.LAMB { params = p, grads = bl.zeros({ NUMEL }), segments = LAYOUT, lr = 0.01 }
  end
  local pa = rand_flat(5, 0.1)
  local a = make(pa)
  for s = 1, 3 do a.grads:copy_(rand_flat(200 + s, 1)); a:step() end
  local sd = a:state_dict()
  T.eq(sd.optimizer, "lamb"); T.eq(sd.step, 3)
  local pb = pa:clone()
  local b = make(pb)
  b:load_state_dict { optimizer = "lamb", step = sd.step, exp_avg = sd.exp_avg:clone(), exp_avg_sq = sd.exp_avg_sq:clone() }
  for s = 4, 5 do
    local gs = rand_flat(200 + s, 1)
    a.grads:copy_(gs); b.grads:copy_(gs)
    a:step(); b:step()
  end
  local la, lb = tolist(pa), tolist(pb)
  for i = 1, NUMEL do if la[i] ~= lb[i] then error("resumed run differs at " .. i) end end
  T.raises(function() b:load_state_dict { optimizer = "adamw", step = 1 } end, "state is for optimizer 'adamw'")
  T.raises(function()
    b:load_state_dict { optimizer = "lamb", step = 1, exp_avg = bl.zeros({ 3 }), exp_avg_sq = bl.zeros({ 3 }) }
  end, "exp_avg has 3 elements, expected 42208")
end)

T.test("clip_grad_norm and global_norm (torch clip_grad_norm_ rule)", function()
  local g = rand_flat(9, 1.0)
  local G = tolist(g)
  local sq = 0
  for i = 1, #G do sq = sq + G[i] * G[i] end
  local n, bad = optim.global_norm(g)
  T.near(n, math.sqrt(sq), 1e-12); T.eq(bad, false)
  local total = optim.clip_grad_norm(g, 2.0)
  T.near(total, math.sqrt(sq), 1e-12)
  T.near(optim.global_norm(g), 2.0, 1e-6)
  T.near(g:ptr()[7], G[8] * 2.0 / (math.sqrt(sq) + 1e-6), 1e-6)
  -- below the threshold: untouched
  local before = g:ptr()[7]
  optim.clip_grad_norm(g, 100)
  T.eq(g:ptr()[7], before)
  g:ptr()[3] = 1 / 0
  local n2, bad2 = optim.global_norm(g)
  T.eq(bad2, true); T.eq(n2, 1 / 0)
  T.raises(function() optim.clip_grad_norm(g, 0) end, "max_norm must be a number > 0")
end)

local function write_f32(path, tensors)
  local f = assert(io.open(path, "wb"))
  for _, t in ipairs(tensors) do f:write(ffi.string(t:ptr(), t:numel() * 4)) end
  f:close()
end

local function have_torch()
  local p = io.popen(PY .. " -c 'import torch, numpy; print(\"ok\")' 2>/dev/null")
  local out = p:read("*a"); p:close()
  return out:find("ok", 1, true) ~= nil
end

-- Runs `kind` (adamw / sgd) in torch over the same layout and gradients.
local TORCH = [==[
import sys, json, numpy as np, torch
torch.set_num_threads(1)
kind, path, n, steps, layout, hp = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5]), json.loads(sys.argv[6])
data = np.fromfile(path, dtype=np.float32).reshape(steps + 1, n)
params = [torch.nn.Parameter(torch.from_numpy(data[0, s["offset"]:s["offset"] + s["length"]].copy())) for s in layout]
dec = [p for p, s in zip(params, layout) if s["decay"]]
nod = [p for p, s in zip(params, layout) if not s["decay"]]
groups = [{"params": dec, "weight_decay": hp["weight_decay"]}, {"params": nod, "weight_decay": 0.0}]
if kind == "adamw":
    opt = torch.optim.AdamW(groups, lr=hp["lr"], betas=(0.9, 0.999), eps=1e-6)
else:
    opt = torch.optim.SGD(groups, lr=hp["lr"], momentum=hp["momentum"], nesterov=hp["nesterov"])
for k in range(steps):
    for p, s in zip(params, layout):
        p.grad = torch.from_numpy(data[k + 1, s["offset"]:s["offset"] + s["length"]].copy())
    for gr in opt.param_groups: gr["lr"] = hp["lr"] * (k + 1)
    opt.step()
out = data[0].copy()
for p, s in zip(params, layout): out[s["offset"]:s["offset"] + s["length"]] = p.detach().numpy()
out.astype(np.float32).tofile(path + ".out")
print("done")
]==]

local function torch_compare(kind, make, hp)
  if not have_torch() then T.skip("torch/numpy not importable by " .. PY .. " (set BL_PYTHON)") end
  local p, g = rand_flat(11, 0.5), bl.zeros({ NUMEL })
  local opt = make(p, g)
  local frames = { p:clone() }
  for s = 1, 5 do
    g:copy_(rand_flat(300 + s, 1.0))
    frames[#frames + 1] = g:clone()
    opt:step(hp.lr * s)
  end
  local path = os.tmpname()
  write_f32(path, frames)
  local script = os.tmpname() .. ".py"
  local sf = assert(io.open(script, "w")); sf:write(TORCH); sf:close()
  local cjson = require "cjson"
  local cmd = ("%s %s %s %s %d 5 '%s' '%s' 2>&1"):format(PY, script, kind, path, NUMEL,
    cjson.encode(optim.segments(LAYOUT, NUMEL).list), cjson.encode(hp))
  local pipe = io.popen(cmd)
  local out = pipe:read("*a"); pipe:close()
  T.truthy(out:find("done", 1, true), "torch script failed: " .. out)
  local f = assert(io.open(path .. ".out", "rb"))
  local bytes = f:read("*a"); f:close()
  os.remove(path); os.remove(path .. ".out"); os.remove(script)
  T.eq(#bytes, NUMEL * 4)
  local ref = ffi.cast("const float*", bytes)
  local want = {}
  for i = 0, NUMEL - 1 do want[i + 1] = ref[i] end
  expect_close(kind .. " vs torch", tolist(p), want, 1e-6)
  -- and the parameters really moved
  T.truthy(math.abs(p:ptr()[0] - frames[1]:ptr()[0]) > 1e-5, "parameters did not move")
end

T.test("AdamW (bias-corrected) equals torch.optim.AdamW", function()
  torch_compare("adamw", function(p, g)
    return optim.AdamW { params = p, grads = g, segments = LAYOUT, weight_decay = 0.1 }
  end, { lr = 1e-2, weight_decay = 0.1 })
end)

T.test("SGD with Nesterov momentum equals torch.optim.SGD", function()
  torch_compare("sgd", function(p, g)
    return optim.SGD { params = p, grads = g, segments = LAYOUT, momentum = 0.9, nesterov = true, weight_decay = 0.05 }
  end, { lr = 0.01, momentum = 0.9, nesterov = true, weight_decay = 0.05 })
end)

T.test("BertAdam: no bias correction, per-parameter clipping", function()
  local p, g = rand_flat(21, 0.5), rand_flat(22, 1.0)
  local opt = optim.BertAdam { params = p, grads = g, segments = LAYOUT, lr = 1e-3 }
  local W, G = tolist(p), tolist(g)
  opt:step()
  -- step 1, no bias correction: m = 0.1 g', v = 0.001 g'^2, u = m/(sqrt(v)+eps) + wd w
  local s = LAYOUT[1]
  local sq = 0
  for i = s.offset + 1, s.offset + s.length do sq = sq + G[i] * G[i] end
  local coef = math.min(1, 1 / (math.sqrt(sq) + 1e-6))
  local i = 11
  local gi = G[i] * coef
  local u = 0.1 * gi / (math.sqrt(0.001 * gi * gi) + 1e-6) + 0.01 * W[i]
  T.near(p:ptr()[i - 1], W[i] - 1e-3 * u, 1e-5, 1e-7)
end)

T.test("LAMB variants set the documented knobs", function()
  local p, g = rand_flat(1, 0.1), bl.zeros({ NUMEL })
  local c = optim.LAMB { params = p, grads = g }.cfg
  T.eq(c.beta1, 0.9); T.eq(c.beta2, 0.999); T.eq(c.eps, 1e-6); T.eq(c.weight_decay, 0.01)
  T.eq(c.max_grad_norm, 1); T.eq(c.bias_correction, 1); T.eq(c.use_nvlamb, 0); T.eq(c.adam_w_mode, 1)
  c = optim.LAMB { params = p, grads = g, variant = "paper" }.cfg
  T.eq(c.use_nvlamb, 1); T.eq(c.max_weight_norm, 10); T.eq(c.max_grad_norm, 0)
  T.eq(optim.LAMB { params = p, grads = g, variant = "nvlamb" }.cfg.use_nvlamb, 1)
  c = optim.LAMB { params = p, grads = g, variant = "paper", max_grad_norm = 2, bias_correction = false,
    betas = { 0.8, 0.99 } }.cfg
  T.eq(c.max_grad_norm, 2); T.eq(c.bias_correction, 0); T.near(c.beta1, 0.8, 0); T.near(c.beta2, 0.99, 0)
  c = optim.BertAdam { params = p, grads = g }.cfg
  T.eq(c.bias_correction, 0); T.eq(c.per_segment_clip, 1); T.eq(c.max_grad_norm, 1)
end)

T.test("bad input errors", function()
  local p, g = rand_flat(1, 0.1), bl.zeros({ NUMEL })
  T.raises(function() optim.LAMB { params = p, grads = bl.zeros({ 10 }), lr = 1 } end,
    "grads has 10 elements but params has 42208")
  T.raises(function() optim.LAMB { params = p:to("f64"), grads = g, lr = 1 } end, "params must be an f32 flat buffer")
  T.raises(function() optim.LAMB { params = p, grads = g, lr = 1, beta = 0.9 } end, "unknown option 'beta'")
  T.raises(function() optim.LAMB { params = p, grads = g, lr = 1, variant = "lars" } end, "unknown variant 'lars'")
  T.raises(function() optim.AdamW { params = p, grads = g, segments = { { offset = 0 } } } end,
    "needs integer offset= and length=")
  local ov = optim.LAMB { params = p, grads = g, lr = 1,
    segments = { { offset = 0, length = 100 }, { offset = 50, length = 100 } } }
  T.raises(function() ov:step() end, "overlap")
  T.eq(ov.step_count, 0)
  local oob = optim.SGD { params = p, grads = g, lr = 1, segments = { { offset = NUMEL - 1, length = 2 } } }
  T.raises(function() oob:step() end, "outside the flat buffer")
  local nolr = optim.AdamW { params = p, grads = g }
  T.raises(function() nolr:step() end, "no learning rate")
  g:ptr()[5] = 0 / 0
  local before = p:ptr()[5]
  local o = optim.AdamW { params = p, grads = g, lr = 1 }
  T.raises(function() o:step() end, "non-finite gradient")
  T.eq(p:ptr()[5], before); T.eq(o.step_count, 0)
  T.raises(function() optim.SGD { params = p, grads = g, lr = 1, momentum = 0, nesterov = true }:step() end,
    "nesterov needs momentum")
end)

T.run()
