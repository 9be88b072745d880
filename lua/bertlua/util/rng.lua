-- bertlua.util.rng: the xorshift64* generator specified in src/bl_loader.h
-- (bl_xrng), the one the C loader draws its shuffles and masks from: the same
-- seed gives the same stream here and there, independent of math.random.
--
--   local r = rng(seed)   -- r() -> double in [0, 1); r(n) -> integer in 1..n
local ffi = require "ffi"

return function(seed)
  local s = ffi.new("uint64_t[1]", 0x9E3779B97F4A7C15ULL + seed * 0x100000001B3ULL)
  return function(n)
    local x = s[0]
    x = bit.bxor(x, bit.rshift(x, 12)); x = bit.bxor(x, bit.lshift(x, 25)); x = bit.bxor(x, bit.rshift(x, 27))
    s[0] = x
    local r = tonumber(bit.rshift(x * 0x2545F4914F6CDD1DULL, 11)) / 2 ^ 53
    if n then return math.floor(r * n) + 1 end
    return r
  end
end
