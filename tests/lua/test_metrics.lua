-- GLUE metrics: hand-computed values and random inputs against numpy/scipy
-- ($BL_PYTHON), including ties for Spearman and multiclass Matthews.
local T = require "testing"
local metrics = require "bertlua.tasks.metrics"
local cjson = require "cjson"
local rng = require "bertlua.util.rng"

local PY = os.getenv("BL_PYTHON") or "/usr/bin/python3"

T.test("hand-computed", function()
  T.eq(metrics.accuracy({ 1, 0, 1, 1 }, { 1, 1, 1, 0 }), 0.5)
  -- tp 2, fp 1, fn 1 -> 2*2/(4+1+1)
  T.near(metrics.f1({ 1, 0, 1, 1, 0 }, { 1, 1, 1, 0, 0 }), 4 / 6, 1e-15)
  T.eq(metrics.f1({ 0, 0 }, { 1, 1 }), 0)
  T.near(metrics.f1({ "pos", "neg" }, { "pos", "pos" }, "pos"), 2 / 3, 1e-15)
  -- tp 2 tn 1 fp 1 fn 1: (2*1 - 1*1)/sqrt(3*3*2*2) = 1/6
  T.near(metrics.matthews({ 1, 0, 1, 1, 0 }, { 1, 1, 1, 0, 0 }), 1 / 6, 1e-14)
  T.eq(metrics.matthews({ 1, 1, 1 }, { 1, 0, 1 }), 0) -- constant predictions: undefined -> 0
  T.near(metrics.pearson({ 1, 2, 3 }, { 2, 4, 6.5 }), 4.5 / math.sqrt(61 / 3), 1e-14) -- sxy 4.5, sxx 2, syy 61/6
  T.near(metrics.rank({ 10, 20, 20, 5 }), { 2, 3.5, 3.5, 1 }, 0)
  T.near(metrics.spearman({ 1, 2, 2, 3 }, { 1, 3, 2, 2 }), 0.5, 1e-14)
  local m = metrics.glue("MRPC", { 1, 0, 1, 1 }, { 1, 1, 1, 0 })
  T.eq(m.acc, 0.5); T.near(m.f1, 2 / 3, 1e-15); T.near(m.acc_and_f1, (0.5 + 2 / 3) / 2, 1e-15)
  T.truthy(metrics.glue("cola", { 1, 0 }, { 1, 0 }).mcc == 1)
  local s = metrics.glue("sts-b", { 1, 2, 3 }, { 1, 2, 4 })
  T.near(s.corr, (s.pearson + s.spearmanr) / 2, 1e-15); T.near(s.spearmanr, 1, 1e-15)
  local mn = metrics.glue("mnli", { matched = { { "a", "b" }, { "a", "a" } }, mismatched = { { "a" }, { "a" } } })
  T.eq(mn.mnli_acc, 0.5); T.eq(mn["mnli-mm_acc"], 1)
  T.raises(function() metrics.accuracy({ 1 }, { 1, 2 }) end, "length mismatch (1 predictions, 2 labels)")
  T.raises(function() metrics.pearson({}, {}) end, "empty input")
  T.raises(function() metrics.pearson({ 1, "x" }, { 1, 2 }) end, "element 2 is a string")
  T.raises(function() metrics.glue("squad", { 1 }, { 1 }) end, "unknown task 'squad'")
end)

T.test("random inputs equal numpy / scipy", function()
  local r = rng(3)
  local cases = {}
  for c = 1, 6 do
    local n = 50 + r(300)
    local k = c <= 3 and 2 or 3
    local yp, yt, x, y = {}, {}, {}, {}
    for i = 1, n do
      yt[i] = r(k) - 1
      yp[i] = (r() < 0.7) and yt[i] or (r(k) - 1)
      x[i] = (c % 2 == 0) and r(7) or r() * 5        -- integer values give ties
      y[i] = x[i] * 0.5 + r() * 3
    end
    cases[c] = { yp = yp, yt = yt, x = x, y = y, k = k }
  end
  local path = os.tmpname()
  local f = assert(io.open(path, "w")); f:write(cjson.encode(cases)); f:close()
  local script = [[
import json, sys, numpy as np, scipy.stats as st
cases = json.load(open(sys.argv[1]))
out = []
for c in cases:
    yp, yt = np.array(c["yp"]), np.array(c["yt"])
    # Matthews, multiclass (sklearn's formula) from the confusion matrix
    K = max(yp.max(), yt.max()) + 1
    C = np.zeros((K, K))
    for a, b in zip(yt, yp): C[a, b] += 1
    t_sum, p_sum = C.sum(1), C.sum(0); n = C.sum(); cc = np.trace(C)
    cov_ytyp = cc * n - np.dot(t_sum, p_sum); cov_ypyp = n * n - np.dot(p_sum, p_sum); cov_ytyt = n * n - np.dot(t_sum, t_sum)
    mcc = cov_ytyp / np.sqrt(cov_ytyt * cov_ypyp)
    tp = np.sum((yp == 1) & (yt == 1)); fp = np.sum((yp == 1) & (yt != 1)); fn = np.sum((yp != 1) & (yt == 1))
    out.append(dict(acc=float(np.mean(yp == yt)), f1=float(2 * tp / (2 * tp + fp + fn)), mcc=float(mcc),
                    pearson=float(st.pearsonr(c["x"], c["y"])[0]), spearman=float(st.spearmanr(c["x"], c["y"])[0])))
print(json.dumps(out))
]]
  local spath = os.tmpname()
  f = assert(io.open(spath, "w")); f:write(script); f:close()
  local p = io.popen(PY .. " " .. spath .. " " .. path .. " 2>&1")
  local txt = p:read("*a"); p:close()
  os.remove(path); os.remove(spath)
  local ok, ref = pcall(cjson.decode, txt)
  if not ok then
    if txt:find("No module named") then T.skip("numpy/scipy not importable by " .. PY) end
    error("python failed: " .. txt)
  end
  for c, want in ipairs(ref) do
    local cs = cases[c]
    T.near(metrics.accuracy(cs.yp, cs.yt), want.acc, 1e-12)
    T.near(metrics.f1(cs.yp, cs.yt), want.f1, 1e-12)
    T.near(metrics.matthews(cs.yp, cs.yt), want.mcc, 1e-12)
    T.near(metrics.pearson(cs.x, cs.y), want.pearson, 1e-12)
    T.near(metrics.spearman(cs.x, cs.y), want.spearman, 1e-12)
  end
end)

T.run()
