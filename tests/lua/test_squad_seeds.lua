-- tests/lua/squad_accuracy.lua end to end at a tiny scale: the real MiniLM
-- (tests/lua/lib/real_model.lua) fine-tuned for a few steps on 16 SQuAD dev
-- questions, 2 seeds, every side (bertlua, transformers on bertlua's
-- features, native transformers). Checks the summary (both span searches,
-- counts that add up, means and ranges of the runs), that done runs are
-- skipped and a half-done one resumes where it stopped, and that bad input is
-- one line before any work. The accuracy itself is measured at full scale
-- (BENCHMARKS.md), not here.
local T = require "testing"
local real = require "real_model"
local cjson = require "cjson"

local tmp = T.tmpdir()
local model = real.find(T, tmp)
local data = T.shared_data("squad/dev-v1.1.json")
if not data then T.skip_all("no SQuAD dev set under the shared data (set BL_SHARED_DATA): squad/dev-v1.1.json") end

local out = tmp .. "/acc"
local TINY = ("--model=%s --squad=%s --out=%s --train-articles=2 --train-per-article=8 --eval-articles=1 " ..
  "--eval-per-article=10 --epochs=1 --batch=8 --max-seq-length=128 --doc-stride=64 --threads=2")
  :format(model, data, out)
local function driver(args) return T.sh(("%s tests/lua/squad_accuracy.lua %s"):format(T.exe(), args)) end
local function lines(s)
  local t = {}
  for l in s:gmatch("[^\n]+") do if not l:match("^rc=%d+$") then t[#t + 1] = l end end
  return t
end
local function json(path) return cjson.decode(T.slurp(path)) end
local function count(s, pat) return select(2, s:gsub(pat, "")) end

T.test("bad input: one line naming the problem, before any work", function()
  for _, c in ipairs {
    { "--sides=bertlua,hf", "--sides: unknown side 'hf' (bertlua, transformers, native)" },
    { "--seeds=x", "--seeds must be integers >= 0 separated by commas, got 'x'" },
    { "--seeds=1,1", "--seeds lists 1 twice" },
    { "--train-articles=48", "has 48 articles; the split needs 49 (--train-articles=48 + --eval-articles=1)" },
    { "--model=" .. tmp .. "/none", "model directory " .. tmp .. "/none does not exist" },
    { "--squad=" .. tmp .. "/none.json", "--squad=" .. tmp .. "/none.json cannot be read" },
  } do
    local o, rc = driver(TINY .. " " .. c[1])
    T.truthy(rc ~= 0, c[1] .. ": exit 0")
    local ls = lines(o)
    T.eq(#ls, 1, c[1] .. ": " .. o)
    T.truthy(ls[1]:find("^bertlua: squad_accuracy: ") and ls[1]:find(c[2], 1, true), c[1] .. ": " .. o)
  end
  local o, rc = T.sh(("BL_PYTHON=%s/nopython %s tests/lua/squad_accuracy.lua %s"):format(tmp, T.exe(), TINY))
  T.truthy(rc ~= 0 and #lines(o) == 1 and o:find("cannot import torch/transformers", 1, true), o)
  T.truthy(not T.sh("ls " .. out .. "/settings.json"):find("rc=0"), "a refused start leaves no settings behind")
end)

local first, second
T.test("2 seeds x bertlua and native: both span searches, counts that add up", function()
  local o, rc = driver(TINY .. " --seeds=1,2 --sides=bertlua,native")
  first = o
  T.eq(rc, 0, o)
  T.truthy(o:find("split: train 16 questions (articles 1-2, first answer), eval 10 questions (articles 3-3, all " ..
    "answers)", 1, true), o)
  T.truthy(o:find("epochs = %d+ sequences %(%d+ steps of 8%) per run, S=128.-4 runs to do %(2 sides x 2 seeds%), " ..
    "0 done"), o)
  local s = json(out .. "/summary.json")
  T.eq(s.split.train_questions, 16); T.eq(s.split.eval_questions, 10)
  T.truthy(s.split.train_features >= 16 and s.split.eval_features >= 10, cjson.encode(s.split))
  T.eq(#s.runs, 4)
  for _, side in ipairs { "bertlua", "native" } do
    for _, search in ipairs { "nbest", "exhaustive" } do
      local f1, em, lo, hi = {}, 0, math.huge, -math.huge
      for _, r in ipairs(s.runs) do
        if r.side == side then
          local x = r[search]
          T.truthy(x.empty >= 0 and x.empty <= 10 and x.empty % 1 == 0, side .. " empty " .. tostring(x.empty))
          T.truthy(x.exact_match >= 0 and x.exact_match <= x.f1 + 1e-9 and x.f1 <= 100, cjson.encode(x))
          f1[#f1 + 1] = x.f1; em = em + x.exact_match
          lo, hi = math.min(lo, x.f1), math.max(hi, x.f1)
        end
      end
      T.eq(#f1, 2, side)
      local p = s.per_side[side][search]
      T.eq(p.f1.n, 2)
      T.near(p.f1.mean, (f1[1] + f1[2]) / 2, 1e-12); T.near(p.exact_match.mean, em / 2, 1e-12)
      T.near(p.f1.sd, math.abs(f1[1] - f1[2]) / math.sqrt(2), 1e-9)
      T.eq(p.f1.min, lo); T.eq(p.f1.max, hi)
    end
  end
  for _, search in ipairs { "nbest", "exhaustive" } do
    local m, r = s.per_side.bertlua[search].f1.mean, s.per_side.native[search].f1
    T.eq(s.bertlua_mean_f1_inside.native[search], m >= r.min and m <= r.max)
  end
  -- each side wrote both searches' predictions, one answer per question
  for _, f in ipairs { "seed1/bertlua/run/predictions.json", "seed1/bertlua/exhaustive/predictions.json",
    "seed2/native/predictions.json", "seed2/native/predictions_exhaustive.json" } do
    local n = 0
    for _ in pairs(json(out .. "/" .. f)) do n = n + 1 end
    T.eq(n, 10, f)
  end
  T.truthy(s.reference_stack:match("^torch %S+, transformers %S+ %(.+%)$"), tostring(s.reference_stack))
  local md = T.slurp(out .. "/summary.md")
  T.truthy(md:find("; transformers sides: " .. s.reference_stack, 1, true), md)
  T.truthy(md:find("| seed | side | F1 n-best | EM n-best | empty n-best | F1 exhaustive | EM exhaustive | " ..
    "empty exhaustive | train features | wall s |", 1, true), md)
  for _, r in ipairs(s.runs) do
    T.truthy(r.seconds >= 0 and r.train_features >= 16, cjson.encode(r))
  end
  T.eq(count(md, "\n| [12] | "), 4, md)
  T.truthy(md:find("\n| native | 2 | ", 1, true) and md:find("exhaustive: bertlua's mean F1 ", 1, true), md)
end)

T.test("a second sweep skips the done runs and adds a side", function()
  if not first then T.skip("the first sweep failed") end
  local before = T.slurp(out .. "/seed1/native/eval_results.json")
  local o, rc = driver(TINY .. " --seeds=1,2 --sides=bertlua,transformers,native")
  second = o
  T.eq(rc, 0, o)
  T.truthy(o:find("2 runs to do (3 sides x 2 seeds), 4 done", 1, true), o)
  T.eq(count(o, "%(done before: skipped%)"), 4, o)
  T.truthy(o:find("seed 2 transformers F1 [%d.]+ EM [%d.]+ %(%d+ empty%) n%-best |"), o)
  T.eq(T.slurp(out .. "/seed1/native/eval_results.json"), before)
  local s = json(out .. "/summary.json")
  T.eq(#s.runs, 6); T.eq(s.per_side.transformers.exhaustive.f1.n, 2)
  T.eq(type(s.bertlua_mean_f1_inside.transformers.nbest), "boolean")
end)

T.test("a half-done run resumes where it stopped; other settings are refused", function()
  if not second then T.skip("the second sweep failed") end
  -- bertlua's training is done (run/eval_results.json), its exhaustive search is not
  local dir = out .. "/seed2/bertlua"
  local before = json(dir .. "/eval_results.json")
  os.remove(dir .. "/eval_results.json"); os.remove(dir .. "/run.log")
  local o, rc = driver(TINY .. " --seeds=2 --sides=bertlua")
  T.eq(rc, 0, o)
  T.truthy(o:find("1 runs to do (1 sides x 1 seeds), 0 done", 1, true), o)
  T.truthy(not T.sh("ls " .. dir .. "/run.log"):find("rc=0"), "training ran again")
  local after = json(dir .. "/eval_results.json")
  for _, search in ipairs { "nbest", "exhaustive" } do
    for _, k in ipairs { "f1", "exact_match", "empty" } do
      T.eq(after[search][k], before[search][k], search .. " " .. k)
    end
  end
  T.eq(#json(out .. "/summary.json").runs, 1)
  o, rc = driver(TINY .. " --epochs=2")
  T.truthy(rc ~= 0 and #lines(o) == 1, o)
  T.truthy(o:find("squad_accuracy: " .. out .. " holds runs made with epochs=1 (now 2): choose another --out", 1, true),
    o)
end)

T.run()
