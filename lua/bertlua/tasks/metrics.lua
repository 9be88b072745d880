-- bertlua.tasks.metrics: GLUE-style classification/regression metrics (JSON output
-- that reads like Python's json.dumps is bertlua.util.json).
--
--   local metrics = require "bertlua.tasks.metrics"
--   metrics.accuracy(preds, labels)          -- fraction in [0,1]
--   metrics.f1(preds, labels[, positive])    -- binary F1 of the positive class (default 1)
--   metrics.matthews(preds, labels)          -- Matthews correlation (binary or multiclass)
--   metrics.pearson(x, y); metrics.spearman(x, y)   -- spearman uses tie-averaged ranks
--   metrics.glue(task, preds, labels)        -- the task's metric table, as in HF/run_glue
--
-- Inputs are Lua arrays (1-based); labels may be numbers or strings compared with ==.
local M = {}

local function check_pair(name, a, b)
  if type(a) ~= "table" or type(b) ~= "table" then
    error(("metrics.%s: expected two arrays, got %s and %s"):format(name, type(a), type(b)), 3)
  end
  if #a ~= #b then
    error(("metrics.%s: length mismatch (%d predictions, %d labels)"):format(name, #a, #b), 3)
  end
  if #a == 0 then error(("metrics.%s: empty input"):format(name), 3) end
end

function M.accuracy(preds, labels)
  check_pair("accuracy", preds, labels)
  local n = 0
  for i = 1, #labels do if preds[i] == labels[i] then n = n + 1 end end
  return n / #labels
end

-- Binary F1 of class `positive` (sklearn f1_score default pos_label=1).
-- 0 when there are no true positives (sklearn's zero_division result).
function M.f1(preds, labels, positive)
  check_pair("f1", preds, labels)
  if positive == nil then positive = 1 end
  local tp, fp, fn = 0, 0, 0
  for i = 1, #labels do
    local p, l = preds[i] == positive, labels[i] == positive
    if p and l then tp = tp + 1 elseif p then fp = fp + 1 elseif l then fn = fn + 1 end
  end
  if tp == 0 then return 0 end
  return 2 * tp / (2 * tp + fp + fn)
end

-- Matthews correlation coefficient, the multiclass form sklearn uses
-- (reduces to (tp*tn - fp*fn)/sqrt(...) for two classes); 0 when undefined.
function M.matthews(preds, labels)
  check_pair("matthews", preds, labels)
  local n = #labels
  local t, p, classes, c = {}, {}, {}, 0
  for i = 1, n do
    local yt, yp = labels[i], preds[i]
    t[yt] = (t[yt] or 0) + 1
    p[yp] = (p[yp] or 0) + 1
    classes[yt] = true; classes[yp] = true
    if yt == yp then c = c + 1 end
  end
  local sum_pt, sum_tt, sum_pp = 0, 0, 0
  for k in pairs(classes) do
    local tk, pk = t[k] or 0, p[k] or 0
    sum_pt = sum_pt + pk * tk
    sum_tt = sum_tt + tk * tk
    sum_pp = sum_pp + pk * pk
  end
  local cov_ytyp = c * n - sum_pt
  local cov_ypyp = n * n - sum_pp
  local cov_ytyt = n * n - sum_tt
  if cov_ypyp * cov_ytyt == 0 then return 0 end
  return cov_ytyp / math.sqrt(cov_ytyt * cov_ypyp)
end

local function numbers(name, x)
  for i = 1, #x do
    if type(x[i]) ~= "number" then
      error(("metrics.%s: element %d is a %s, expected a number"):format(name, i, type(x[i])), 3)
    end
  end
end

function M.pearson(x, y)
  check_pair("pearson", x, y)
  numbers("pearson", x); numbers("pearson", y)
  local n = #x
  local mx, my = 0, 0
  for i = 1, n do mx = mx + x[i]; my = my + y[i] end
  mx, my = mx / n, my / n
  local sxy, sxx, syy = 0, 0, 0
  for i = 1, n do
    local dx, dy = x[i] - mx, y[i] - my
    sxy = sxy + dx * dy; sxx = sxx + dx * dx; syy = syy + dy * dy
  end
  if sxx == 0 or syy == 0 then return 0 / 0 end -- undefined, as scipy (nan)
  return sxy / math.sqrt(sxx * syy)
end

-- Ranks 1..n with ties given their average rank (scipy.stats.rankdata 'average').
function M.rank(x)
  local n = #x
  local idx = {}
  for i = 1, n do idx[i] = i end
  table.sort(idx, function(a, b) if x[a] ~= x[b] then return x[a] < x[b] end return a < b end)
  local r = {}
  local i = 1
  while i <= n do
    local j = i
    while j < n and x[idx[j + 1]] == x[idx[i]] do j = j + 1 end
    local avg = (i + j) / 2
    for k = i, j do r[idx[k]] = avg end
    i = j + 1
  end
  return r
end

function M.spearman(x, y)
  check_pair("spearman", x, y)
  numbers("spearman", x); numbers("spearman", y)
  return M.pearson(M.rank(x), M.rank(y))
end

-- Per-task metrics as Hugging Face's glue_compute_metrics / NVIDIA's run_glue report them.
-- task: cola, sst-2, mrpc, sts-b, qqp, mnli, mnli-mm, qnli, rte, wnli (case-insensitive).
-- For mnli, pass {matched = {preds, labels}, mismatched = {preds, labels}} as `preds`
-- to get both accuracies, or plain arrays for one of them.
function M.glue(task, preds, labels)
  local t = tostring(task):lower():gsub("_", "-")
  if t == "cola" then
    return { mcc = M.matthews(preds, labels) }
  elseif t == "sst-2" or t == "sst2" or t == "qnli" or t == "rte" or t == "wnli" then
    return { acc = M.accuracy(preds, labels) }
  elseif t == "mrpc" or t == "qqp" then
    -- the positive class is 1 (or "1" for labels read as strings from the TSVs)
    local acc, f1 = M.accuracy(preds, labels), M.f1(preds, labels, type(labels[1]) == "string" and "1" or 1)
    return { acc = acc, f1 = f1, acc_and_f1 = (acc + f1) / 2 }
  elseif t == "sts-b" or t == "stsb" then
    local p, s = M.pearson(preds, labels), M.spearman(preds, labels)
    return { pearson = p, spearmanr = s, corr = (p + s) / 2 }
  elseif t == "mnli" or t == "mnli-m" then
    if labels == nil and type(preds) == "table" and preds.matched then
      return { mnli_acc = M.accuracy(preds.matched[1], preds.matched[2]),
               ["mnli-mm_acc"] = M.accuracy(preds.mismatched[1], preds.mismatched[2]) }
    end
    return { mnli_acc = M.accuracy(preds, labels) }
  elseif t == "mnli-mm" then
    return { ["mnli-mm_acc"] = M.accuracy(preds, labels) }
  end
  error("metrics.glue: unknown task '" .. tostring(task) .. "'", 2)
end

return M
