-- bertlua.train.schedule: hand-computed values, then every step of several runs
-- against the references run by $BL_PYTHON: transformers' own
-- get_linear_schedule_with_warmup / get_constant_schedule_with_warmup /
-- get_polynomial_decay_schedule_with_warmup driven like HF's Trainer
-- (lr read at optimizer.step(), scheduler.step() after), and NVIDIA's
-- PolyWarmUpScheduler / LinearWarmUpScheduler get_lr (transcribed below, in
-- torch float32 as NVIDIA runs it) driven like run_pretraining.py
-- (scheduler.step() before optimizer.step(), last_epoch = step count + 1).
local T = require "testing"
local schedule = require "bertlua.train.schedule"
local cjson = require "cjson"

local PY = os.getenv("BL_PYTHON") or "/usr/bin/python3"

T.test("hand-computed values", function()
  -- NVIDIA phase 1: lr 6e-3, 7038 steps, warmup 0.2843, power 0.5
  local f = schedule.poly_warmup { lr = 6e-3, total_steps = 7038, warmup_proportion = 0.2843 }
  T.near(f(1), 6e-3 * (1 / 7038) / 0.2843, 1e-14)
  T.near(f(2000), 6e-3 * (2000 / 7038) / 0.2843, 1e-14)          -- p = 0.28417 < w
  T.near(f(2001), 6e-3 * (1 - 2001 / 7038) ^ 0.5, 1e-14)          -- p = 0.28432 >= w: decay
  T.near(f(7037), 6e-3 * math.sqrt(1 / 7038), 1e-9)
  T.eq(f(7038), 0); T.eq(f(8000), 0)
  -- warmup given in steps = the same proportion
  local g = schedule.poly_warmup { lr = 1, total_steps = 100, warmup_steps = 10, power = 1 }
  T.near(g(5), 0.5, 1e-15); T.near(g(10), 0.9, 1e-15); T.near(g(50), 0.5, 1e-15)
  -- HF linear: first update lr 0, peak after W updates, 0 at T+1
  local h = schedule.linear_warmup { lr = 2e-5, total_steps = 100, warmup_steps = 10 }
  T.eq(h(1), 0); T.near(h(6), 1e-5, 1e-15); T.near(h(11), 2e-5, 1e-15)
  T.near(h(56), 2e-5 * 45 / 90, 1e-15); T.eq(h(101), 0); T.eq(h(150), 0)
  -- proportion -> ceil(0.1 * 95) = 10 steps
  local hp = schedule.linear_warmup { lr = 1, total_steps = 95, warmup_proportion = 0.1 }
  T.near(hp(6), 0.5, 1e-15)
  local nl = schedule.nvidia_linear_warmup { lr = 1, total_steps = 100, warmup_proportion = 0.1 }
  T.near(nl(5), 0.5, 1e-15); T.near(nl(10), 1, 1e-15); T.near(nl(55), 0.5, 1e-15); T.eq(nl(100), 0)
  T.eq(schedule.constant { lr = 3 } (17), 3)
  local cw = schedule.constant_with_warmup { lr = 4, warmup_steps = 4 }
  T.eq(cw(1), 0); T.eq(cw(3), 2); T.eq(cw(5), 4); T.eq(cw(500), 4)
  local pd = schedule.polynomial_warmup { lr = 1, total_steps = 20, warmup_steps = 10, power = 2, lr_end = 0 }
  T.near(pd(16), 0.25, 1e-15); T.eq(pd(30), 0)
  -- a recipe may use its own function: the optimizer only needs a number
  T.eq(schedule.make("poly", { lr = 1, total_steps = 10, warmup_proportion = 0.5 })(1), 0.2)
end)

T.test("errors", function()
  T.raises(function() schedule.poly_warmup { lr = 1 } end, "total_steps must be a number")
  T.raises(function() schedule.poly_warmup { lr = 1, total_steps = 10, warmup_steps = 1, warmup_proportion = 0.1 } end,
    "not both")
  T.raises(function() schedule.linear_warmup { lr = 1, total_steps = 10, warmup_proportion = 1.5 } end,
    "warmup_proportion must be in [0, 1]")
  T.raises(function() schedule.linear_warmup { lr = 1, total_steps = 10, warmup = 3 } end, "unknown option 'warmup'")
  T.raises(function() schedule.make("cosine", {}) end, "unknown schedule 'cosine'")
  T.raises(function() schedule.constant { lr = 1 } (0) end, "step must be the 1-based update number")
  T.raises(function() schedule.polynomial_warmup { lr = 1e-8, total_steps = 10 } end, "lr_end")
end)

local SCRIPT = [==[
import sys, json, torch
from transformers import (get_linear_schedule_with_warmup, get_constant_schedule_with_warmup,
                          get_polynomial_decay_schedule_with_warmup)
cases = json.loads(sys.argv[1])
out = []
def hf(make, lr, n):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    sch = make(opt)
    r = []
    for _ in range(n):
        r.append(opt.param_groups[0]["lr"])   # the lr this update uses
        opt.step(); sch.step()
    return r
def nvidia(kind, lr, total, warmup, degree, n, dt):
    # get_lr of NVIDIA's schedulers.py; NVIDIA's tensors are torch's default float32
    w, T, d, base = (torch.tensor(x, dtype=dt) for x in (warmup, float(total), degree, lr))
    r = []
    for step in range(1, n + 1):          # last_epoch = optimizer step count + 1
        last_epoch = torch.tensor(float(step), dtype=dt)
        progress = last_epoch / T
        if kind == "poly":
            v = torch.where(progress < w, base * progress / w, base * ((1.0 - progress) ** d))
        else:
            v = base * progress / w if progress < w else base * max((progress - 1.0) / (w - 1.0), 0.)
        r.append(float(v))
    return r
for c in cases:
    k, lr, T, n = c["kind"], c["lr"], c["total"], c["n"]
    if k == "hf_linear":
        out.append(hf(lambda o: get_linear_schedule_with_warmup(o, c["warmup"], T), lr, n))
    elif k == "hf_constant":
        out.append(hf(lambda o: get_constant_schedule_with_warmup(o, c["warmup"]), lr, n))
    elif k == "hf_poly":
        out.append(hf(lambda o: get_polynomial_decay_schedule_with_warmup(o, c["warmup"], T, lr_end=c["lr_end"], power=c["power"]), lr, n))
    else:
        dt = torch.float64 if c.get("f64") else torch.float32
        out.append(nvidia(k, lr, T, c["warmup"], c.get("power", 1.0), n, dt))
print(json.dumps(out))
]==]

T.test("every step equals transformers / NVIDIA's schedulers", function()
  local p = io.popen(PY .. " -c 'import torch, transformers' 2>&1; echo __rc=$?")
  local probe = p:read("*a"); p:close()
  if not probe:find("__rc=0", 1, true) then T.skip("torch + transformers not importable by " .. PY) end
  local cases = {
    { kind = "hf_linear", lr = 3e-5, total = 200, warmup = 20, n = 230,
      f = schedule.linear_warmup { lr = 3e-5, total_steps = 200, warmup_steps = 20 } },
    { kind = "hf_linear", lr = 5e-5, total = 57, warmup = 0, n = 60,
      f = schedule.linear_warmup { lr = 5e-5, total_steps = 57 } },
    { kind = "hf_constant", lr = 1e-4, total = 0, warmup = 7, n = 20,
      f = schedule.constant_with_warmup { lr = 1e-4, warmup_steps = 7 } },
    { kind = "hf_poly", lr = 1e-3, total = 100, warmup = 10, lr_end = 1e-6, power = 2.0, n = 110,
      f = schedule.polynomial_warmup { lr = 1e-3, total_steps = 100, warmup_steps = 10, lr_end = 1e-6, power = 2 } },
    { kind = "poly", lr = 6e-3, total = 7038, warmup = 0.2843, power = 0.5, n = 7037, f64 = true,
      f = schedule.poly_warmup { lr = 6e-3, total_steps = 7038, warmup_proportion = 0.2843 } },
    { kind = "poly", lr = 6e-3, total = 7038, warmup = 0.2843, power = 0.5, n = 7037,
      f = schedule.poly_warmup { lr = 6e-3, total_steps = 7038, warmup_proportion = 0.2843 } },
    { kind = "poly", lr = 4e-3, total = 1563, warmup = 0.128, power = 0.5, n = 1562,
      f = schedule.poly_warmup { lr = 4e-3, total_steps = 1563, warmup_proportion = 0.128 } },
    { kind = "linear", lr = 3e-5, total = 300, warmup = 0.1, n = 300, f64 = true,
      f = schedule.nvidia_linear_warmup { lr = 3e-5, total_steps = 300, warmup_proportion = 0.1 } },
  }
  local spec = {}
  for i, c in ipairs(cases) do
    spec[i] = { kind = c.kind, lr = c.lr, total = c.total, warmup = c.warmup, n = c.n, lr_end = c.lr_end,
      power = c.power, f64 = c.f64 }
  end
  local path = os.tmpname()
  local f = assert(io.open(path, "w")); f:write(SCRIPT); f:close()
  local pipe = io.popen(("%s %s '%s' 2>&1"):format(PY, path, cjson.encode(spec)))
  local out = pipe:read("*a"); pipe:close()
  os.remove(path)
  local ok, ref = pcall(cjson.decode, out:match("(%[.*%])%s*$") or "")
  T.truthy(ok and type(ref) == "table", "python reference failed: " .. out:sub(-2000))
  for i, c in ipairs(cases) do
    T.eq(#ref[i], c.n, c.kind .. " length")
    -- HF computes in f64 like us, as does the f64 transcription of NVIDIA's
    -- get_lr; NVIDIA's own float32 run loses digits in (1 - p) near the end
    -- (p = step/total rounded to 2^-24: up to 4e-5 relative at step 7037).
    local rtol = (c.kind:match("^hf") or c.f64) and 1e-12 or 1e-4
    for step = 1, c.n do
      local got, want = c.f(step), ref[i][step]
      if not (math.abs(got - want) <= rtol * math.abs(want) + 1e-15) then
        error(("%s case %d step %d: got %.12g, reference %.12g"):format(c.kind, i, step, got, want))
      end
    end
  end
end)

T.run()
