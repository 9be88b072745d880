-- bertlua.train.schedule: learning-rate schedules. Each constructor returns a plain
-- Lua function lr = f(step), so a recipe can pass its own function instead.
--
-- `step` is the 1-based number of the update about to be applied (1 for the
-- first optimizer step), i.e. optimizer.step_count + 1:
--   opt:step(sched(opt.step_count + 1))
-- Each schedule reproduces its reference under that convention:
--
-- poly_warmup{lr=, total_steps=, warmup_proportion= | warmup_steps=, power=0.5}
--   NVIDIA DeepLearningExamples BERT PolyWarmUpScheduler (pre-training uses
--   power 0.5). With p = step/total_steps and w = warmup proportion
--   (warmup_steps/total_steps when given in steps):
--     lr = base * p / w              if p < w
--     lr = base * (1 - p)^power      otherwise (0 once p >= 1)
--   NVIDIA's scheduler sets last_epoch = optimizer step count + 1 before each
--   update, so its first update uses p = 1/total_steps, as here. Note the
--   reference is discontinuous at the end of warmup (base*(1-w)^power).
--
-- nvidia_linear_warmup{lr=, total_steps=, warmup_proportion= | warmup_steps=}
--   NVIDIA LinearWarmUpScheduler (their SQuAD/GLUE fine-tuning):
--     lr = base * p / w if p < w, else base * max((p - 1)/(w - 1), 0)
--
-- linear_warmup{lr=, total_steps=, warmup_steps= | warmup_proportion=}
--   Hugging Face get_linear_schedule_with_warmup. HF's LambdaLR gives the
--   k-th update lambda(k-1) (scheduler.step() follows optimizer.step()):
--     s = step - 1
--     lr = base * s / max(1, W)                        if s < W
--     lr = base * max(0, (T - s) / max(1, T - W))      otherwise
--   (so the first update has lr 0 when W > 0, exactly as in transformers).
--   warmup_proportion gives W = ceil(proportion * T), as transformers'
--   TrainingArguments.get_warmup_steps does for warmup_ratio.
--
-- polynomial_warmup{lr=, total_steps=, warmup_steps=, lr_end=1e-7, power=1}
--   Hugging Face get_polynomial_decay_schedule_with_warmup (s = step - 1):
--     base * s / max(1, W)                             if s < W
--     lr_end                                           if s > T
--     (base - lr_end) * (1 - (s - W)/(T - W))^power + lr_end   otherwise
--
-- constant{lr=}                       lr = base
-- constant_with_warmup{lr=, warmup_steps=}
--   Hugging Face get_constant_schedule_with_warmup (s = step - 1):
--     base * s / max(1, W) if s < W, else base
--
-- make(name, opts) builds one by name ("poly", "poly_warmup", "linear",
-- "nvidia_linear", "polynomial", "constant", "constant_with_warmup") for
-- recipes that take --lr_schedule=.
local M = {}

local function need_number(op, opts, key, min)
  local v = opts[key]
  if type(v) ~= "number" or v ~= v then error(("schedule.%s: %s must be a number"):format(op, key), 4) end
  if min and v < min then error(("schedule.%s: %s must be >= %g, got %g"):format(op, key, min, v), 4) end
  return v
end

local function check_opts(op, opts, allowed)
  if type(opts) ~= "table" then error("schedule." .. op .. ": expects a table of options", 4) end
  for k in pairs(opts) do
    if not allowed[k] then error(("schedule.%s: unknown option '%s'"):format(op, tostring(k)), 4) end
  end
end

local function set(list)
  local t = {}
  for _, k in ipairs(list) do t[k] = true end
  return t
end

-- warmup as a proportion of total_steps (NVIDIA) from either form.
local function warmup_proportion(op, opts, total)
  if opts.warmup_proportion ~= nil and opts.warmup_steps ~= nil then
    error("schedule." .. op .. ": give warmup_proportion or warmup_steps, not both", 4)
  end
  if opts.warmup_steps ~= nil then return need_number(op, opts, "warmup_steps", 0) / total end
  if opts.warmup_proportion ~= nil then
    local w = need_number(op, opts, "warmup_proportion", 0)
    if w > 1 then error("schedule." .. op .. ": warmup_proportion must be in [0, 1], got " .. w, 4) end
    return w
  end
  return 0
end

-- warmup in whole steps (Hugging Face) from either form.
local function warmup_steps(op, opts, total)
  if opts.warmup_proportion ~= nil and opts.warmup_steps ~= nil then
    error("schedule." .. op .. ": give warmup_proportion or warmup_steps, not both", 4)
  end
  if opts.warmup_proportion ~= nil then
    local w = need_number(op, opts, "warmup_proportion", 0)
    if w > 1 then error("schedule." .. op .. ": warmup_proportion must be in [0, 1], got " .. w, 4) end
    if not total then error("schedule." .. op .. ": warmup_proportion needs total_steps", 4) end
    return math.ceil(w * total)  -- transformers TrainingArguments.get_warmup_steps
  end
  if opts.warmup_steps == nil then return 0 end
  local w = need_number(op, opts, "warmup_steps", 0)
  if w ~= math.floor(w) then error("schedule." .. op .. ": warmup_steps must be an integer", 4) end
  return w
end

local function check_step(op, step)
  if type(step) ~= "number" or step < 1 then
    error(("schedule.%s: step must be the 1-based update number (>= 1), got %s"):format(op, tostring(step)), 3)
  end
end

function M.poly_warmup(opts)
  local op = "poly_warmup"
  check_opts(op, opts, set { "lr", "total_steps", "warmup_proportion", "warmup_steps", "power" })
  local base = need_number(op, opts, "lr", 0)
  local total = need_number(op, opts, "total_steps", 1)
  local w = warmup_proportion(op, opts, total)
  local power = opts.power == nil and 0.5 or need_number(op, opts, "power", 0)
  return function(step)
    check_step(op, step)
    local p = step / total
    if p < w then return base * p / w end
    if p >= 1 then return 0 end
    return base * (1 - p) ^ power
  end
end

function M.nvidia_linear_warmup(opts)
  local op = "nvidia_linear_warmup"
  check_opts(op, opts, set { "lr", "total_steps", "warmup_proportion", "warmup_steps" })
  local base = need_number(op, opts, "lr", 0)
  local total = need_number(op, opts, "total_steps", 1)
  local w = warmup_proportion(op, opts, total)
  return function(step)
    check_step(op, step)
    local p = step / total
    if p < w then return base * p / w end
    if w >= 1 then return base end
    return base * math.max((p - 1) / (w - 1), 0)
  end
end

function M.linear_warmup(opts)
  local op = "linear_warmup"
  check_opts(op, opts, set { "lr", "total_steps", "warmup_proportion", "warmup_steps" })
  local base = need_number(op, opts, "lr", 0)
  local total = need_number(op, opts, "total_steps", 1)
  local W = warmup_steps(op, opts, total)
  return function(step)
    check_step(op, step)
    local s = step - 1
    if s < W then return base * s / math.max(1, W) end
    return base * math.max(0, (total - s) / math.max(1, total - W))
  end
end

function M.polynomial_warmup(opts)
  local op = "polynomial_warmup"
  check_opts(op, opts, set { "lr", "total_steps", "warmup_proportion", "warmup_steps", "lr_end", "power" })
  local base = need_number(op, opts, "lr", 0)
  local total = need_number(op, opts, "total_steps", 1)
  local W = warmup_steps(op, opts, total)
  local lr_end = opts.lr_end == nil and 1e-7 or need_number(op, opts, "lr_end", 0)
  local power = opts.power == nil and 1.0 or need_number(op, opts, "power", 0)
  if not (base > lr_end) then
    error(("schedule.%s: lr_end (%g) must be smaller than lr (%g)"):format(op, lr_end, base), 2)
  end
  return function(step)
    check_step(op, step)
    local s = step - 1
    if s < W then return base * s / math.max(1, W) end
    if s > total then return lr_end end
    local remaining = 1 - (s - W) / (total - W)
    return (base - lr_end) * remaining ^ power + lr_end
  end
end

function M.constant(opts)
  local op = "constant"
  check_opts(op, opts, set { "lr", "total_steps" })
  local base = need_number(op, opts, "lr", 0)
  return function(step)
    check_step(op, step)
    return base
  end
end

function M.constant_with_warmup(opts)
  local op = "constant_with_warmup"
  check_opts(op, opts, set { "lr", "total_steps", "warmup_steps", "warmup_proportion" })
  local base = need_number(op, opts, "lr", 0)
  local W = warmup_steps(op, opts, opts.total_steps)
  return function(step)
    check_step(op, step)
    local s = step - 1
    if s < W then return base * s / math.max(1, W) end
    return base
  end
end

local BY_NAME = {
  poly = M.poly_warmup, poly_warmup = M.poly_warmup,
  linear = M.linear_warmup, linear_warmup = M.linear_warmup,
  nvidia_linear = M.nvidia_linear_warmup, nvidia_linear_warmup = M.nvidia_linear_warmup,
  polynomial = M.polynomial_warmup, polynomial_warmup = M.polynomial_warmup,
  constant = M.constant, constant_with_warmup = M.constant_with_warmup,
}

function M.make(name, opts)
  local f = BY_NAME[name]
  if not f then
    local names = {}
    for k in pairs(BY_NAME) do names[#names + 1] = k end
    table.sort(names)
    error(("schedule.make: unknown schedule '%s' (%s)"):format(tostring(name), table.concat(names, ", ")), 2)
  end
  return f(opts)
end

return M
