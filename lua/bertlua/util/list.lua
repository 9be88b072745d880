-- bertlua.util.list: table helpers safe for data-sized tables. `unpack` puts
-- every element on the Lua stack and fails past a few thousand ("too many
-- results to unpack"); these loop instead.
local M = {}

-- slice(t[, i[, j]]) -> a new table with t[i..j] (default: all of t)
function M.slice(t, i, j)
  i, j = i or 1, j or #t
  local r = {}
  for k = i, j do r[k - i + 1] = t[k] end
  return r
end

-- sorted_keys(t) -> t's keys, sorted as strings (pairs() order varies between runs)
function M.sorted_keys(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  table.sort(ks, function(a, b) return tostring(a) < tostring(b) end)
  return ks
end

-- stats(xs) -> {n, mean, sd (sample standard deviation; nil for one value), min, max} of a list of numbers
function M.stats(xs)
  local n, sum, lo, hi = #xs, 0, math.huge, -math.huge
  for _, x in ipairs(xs) do sum = sum + x; lo = math.min(lo, x); hi = math.max(hi, x) end
  local mean, ss = sum / n, 0
  for _, x in ipairs(xs) do ss = ss + (x - mean) ^ 2 end
  return { n = n, mean = mean, sd = n > 1 and math.sqrt(ss / (n - 1)) or nil, min = lo, max = hi }
end

return M
