-- Two runs of recipes/squad.lua compared (test_finetune_dp, test_cuda_squad):
--   local sc = require "squad_compare"
--   sc.losses(dir) -> { [step] = loss } from dir/train_log.jsonl
--   sc.same_answers(T, want, got) -> n: every question of want answered the same in got
--   sc.compare(T, dir_a, dir_b, rtol, steps): `steps` logged losses of b within rtol of a's, the same
--     answer for every question, and the same EM and F1 when both runs evaluated
local cjson = require "cjson"

local M = {}

function M.losses(dir)
  local r = {}
  for l in io.lines(dir .. "/train_log.jsonl") do
    local x = cjson.decode(l)
    if x.step then r[x.step] = x.loss end
  end
  return r
end

-- same_answers(T, want, got) -> questions compared: got (predictions.json's table) has want's answer for each
function M.same_answers(T, want, got)
  local count = 0
  for id, ans in pairs(want) do
    T.eq(got[id], ans, "question " .. id)
    count = count + 1
  end
  return count
end

function M.compare(T, a, b, rtol, steps)
  local la, lb = M.losses(a), M.losses(b)
  T.eq(#lb, steps)
  for s = 1, steps do
    T.truthy(math.abs(lb[s] - la[s]) <= rtol * math.abs(la[s]), ("step %d: %s %.9g, %s %.9g"):format(s, b, lb[s],
      a, la[s]))
  end
  local count = M.same_answers(T, cjson.decode(T.slurp(a .. "/predictions.json")),
    cjson.decode(T.slurp(b .. "/predictions.json")))
  T.truthy(count > 0, "predictions were written")
  local fa, fb = io.open(a .. "/eval_results.json"), io.open(b .. "/eval_results.json")
  if fa and fb then
    local ea, eb = cjson.decode(fa:read("*a")), cjson.decode(fb:read("*a"))
    T.eq(eb.exact_match, ea.exact_match, "EM")
    T.eq(eb.f1, ea.f1, "F1")
  end
  if fa then fa:close() end
  if fb then fb:close() end
end

return M
