-- The packed inference attention (ops.attention_packed, bl_attention_forward with offsets) against an f64 reference on
-- every CPU path: sequences of 1 to 77 tokens, so that items span several of its row blocks (24 query rows), short
-- last blocks and the products' ragged tile edges; head sizes 64 (full vectors) and 40 (a ragged vector).
--
-- Bound per context element (i, c), u = 2^-24, gamma_m = m u / (1 - m u) (Higham 3.1):
--   a score is an FMA chain over d terms: |error| <= gamma_d sum_k |q_ik k_jk| (E_i: the row's largest, times
--   the scale); the exp argument s*scale - max then carries <= 2 E_i plus its own roundings (<= 4 u (|s scale| +
--   |max|) <= 8 u max_j |s_ij| scale), and vm_exp adds <= 2 ulp (4 u): each probability is off by a relative
--   rho_i <= expm1(delta_i) + 4 u.
--   The context is (sum_j p_ij v_jc) / (sum_j p_ij): rho_i in the numerator and in the denominator, gamma_n for
--   each sum, u for 1/sum and for the product: |error| <= (2 rho_i + 2 gamma_n + 3 u) W_ic, where
--   W_ic = sum_j p_ij |v_jc| / sum_j p_ij (from the reference). A block's rows or keys mixed up are O(1) off.
local T = require "testing"
local bl = require "bertlua"
local ops = require "bertlua.nn.ops"

local U = 2 ^ -24
local function gamma(m) return m * U / (1 - m * U) end

-- ctx of one (sequence, head) in f64, and the bound of each element
local function reference(q, k, v, t0, n, c0, d)
  local sc = 1 / math.sqrt(d)
  local ctx, bound = {}, {}
  for i = 0, n - 1 do
    local qi = q[t0 + i + 1]
    local s, smax, sabs, emax = {}, -math.huge, 0, 0
    for j = 0, n - 1 do
      local kj, sum, abs = k[t0 + j + 1], 0, 0
      for c = c0 + 1, c0 + d do sum = sum + qi[c] * kj[c]; abs = abs + math.abs(qi[c] * kj[c]) end
      s[j], smax, sabs, emax = sum, math.max(smax, sum), math.max(sabs, math.abs(sum)), math.max(emax, abs)
    end
    local delta = (2 * gamma(d) * emax + 8 * U * sabs) * sc
    local rho = math.exp(delta) - 1 + 4 * U
    local p, psum = {}, 0
    for j = 0, n - 1 do p[j] = math.exp((s[j] - smax) * sc); psum = psum + p[j] end
    ctx[i], bound[i] = {}, {}
    for c = c0 + 1, c0 + d do
      local num, w = 0, 0
      for j = 0, n - 1 do num = num + p[j] * v[t0 + j + 1][c]; w = w + p[j] * math.abs(v[t0 + j + 1][c]) end
      ctx[i][c], bound[i][c] = num / psum, (2 * rho + 2 * gamma(n) + 3 * U) * w / psum * 1.01
    end
  end
  return ctx, bound
end

local function check(isa, lens, heads, d)
  local offs, total = { 0 }, 0
  for _, n in ipairs(lens) do total = total + n; offs[#offs + 1] = total end
  local H = heads * d
  local qt = bl.randn({ 1, total, H }, { seed = 11 })
  qt:mul_(2)  -- scores of spread ~2 after the 1/sqrt(d) scale: peaked rows, not a flat average
  local kt, vt = bl.randn({ 1, total, H }, { seed = 12 }), bl.randn({ 1, total, H }, { seed = 13 })
  local out = ops.attention_packed(qt, kt, vt, bl.from(offs, { dtype = "i32" }), heads):tolist()[1]
  local q, k, v = qt:tolist()[1], kt:tolist()[1], vt:tolist()[1]
  local worst, where = 0, ""
  for b, n in ipairs(lens) do
    for h = 0, heads - 1 do
      local ref, bound = reference(q, k, v, offs[b], n, h * d, d)
      for i = 0, n - 1 do
        for c = h * d + 1, h * d + d do
          local r = math.abs(out[offs[b] + i + 1][c] - ref[i][c]) / bound[i][c]
          if not (r <= worst) then  -- a NaN counts as the worst
            worst, where = r, ("sequence %d (n=%d) head %d row %d col %d"):format(b, n, h, i, c)
          end
        end
      end
    end
  end
  print(("%s d=%d: worst |ctx - f64| / bound %.3f at %s"):format(isa, d, worst, where))
  T.truthy(worst <= 1, ("%s d=%d: context off by %.3g bounds at %s"):format(isa, d, worst, where))
end

T.test("packed inference attention matches an f64 reference within its bound, every CPU path", function()
  T.each_cpu_path(function(isa)
    check(isa, { 1, 23, 24, 25, 49, 77 }, 2, 64)
    check(isa, { 5, 30, 53 }, 2, 40)
  end)
end)

T.run()
