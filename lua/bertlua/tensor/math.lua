-- Tensor arithmetic (broadcasting binary ops, unary ops, where, matmul) and
-- reductions, as methods of bertlua.tensor (which installs them).
local core = require "bertlua.core"
local C, check = core.C, core.check

-- install(T): T holds the tensor module (M), its methods and the helpers of
-- bertlua.tensor this part uses.
return function(T)
  local M, methods = T.M, T.methods
  local RANK, is_float, is_tensor, shape_str, live, cdim, dbl1 =
    T.RANK, T.is_float, T.is_tensor, T.shape_str, T.live, T.cdim, T.dbl1

  -- arithmetic ---------------------------------------------------------------
  -- method name -> the C enum value named BL_<NAME> (bl_binop, bl_unop in bl_tensor.h)
  local function enum_of(names)
    local t = {}
    for _, name in ipairs(names) do t[name] = C["BL_" .. name:upper()] end
    return t
  end
  local BIN = enum_of { "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge" }
  local UN = enum_of { "neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "square", "reciprocal",
    "sign", "floor", "ceil", "erf" }

  local function promote(a, b)
    if RANK[a] >= RANK[b] then
      if (a == 2 and b == 3) or (a == 3 and b == 2) then return 0 end
      return a
    end
    return b
  end

  local function result_dtype(op, da, db)
    if op >= C.BL_EQ then return C.BL_BOOL end   -- comparisons give bool
    local d = db and promote(da, db) or da
    if op == C.BL_DIV and not is_float(d) then return C.BL_F32 end
    return d
  end

  local function broadcast(a, b)
    local na, nb = a.ndim_, b.ndim_
    local n = math.max(na, nb)
    local s = {}
    for i = 1, n do
      local x = i <= n - na and 1 or tonumber(a.shape_[i - 1 - (n - na)])
      local y = i <= n - nb and 1 or tonumber(b.shape_[i - 1 - (n - nb)])
      if x ~= y and x ~= 1 and y ~= 1 then return nil end
      s[i] = x == 1 and y or x
    end
    return s
  end

  local function binary(name, a, b, out)
    local op = BIN[name]
    if is_tensor(a) and is_tensor(b) then
      if not out then
        local s = broadcast(a, b)
        if not s then
          error(name .. ": shapes " .. shape_str(a:shape()) .. " and " .. shape_str(b:shape()) .. " are not compatible",
            3)
        end
        out = M.empty(s, { dtype = result_dtype(op, a.dtype_, b.dtype_), device = a.device_ })
      end
      check(C.bl_binary(op, out, a, b))
    elseif is_tensor(a) and type(b) == "number" then
      out = out or methods.empty_like(a, { dtype = result_dtype(op,
        is_float(a.dtype_) and a.dtype_ or (b % 1 == 0 and a.dtype_ or 0)) })
      check(C.bl_binary_scalar(op, out, a, b, 0))
    elseif type(a) == "number" and is_tensor(b) then
      out = out or methods.empty_like(b, { dtype = result_dtype(op,
        is_float(b.dtype_) and b.dtype_ or (a % 1 == 0 and b.dtype_ or 0)) })
      check(C.bl_binary_scalar(op, out, b, a, 1))
    else
      error(name .. ": expected tensors or numbers, got " .. type(a) .. " and " .. type(b), 3)
    end
    return out
  end

  for name in pairs(BIN) do
    methods[name] = function(a, b, out) return binary(name, a, b, out) end
    M[name] = methods[name]
  end
  for name, op in pairs(UN) do
    methods[name] = function(a, out)
      if not is_tensor(a) then error(name .. ": expected a tensor, got " .. type(a), 2) end
      out = out or methods.empty_like(a, { dtype = is_float(a.dtype_) and a.dtype_ or 0 })
      check(C.bl_unary(op, out, a))
      return out
    end
    M[name] = methods[name]
  end

  -- in-place variants: t:add_(x) etc.
  for _, name in ipairs({ "add", "sub", "mul", "div", "pow", "maximum", "minimum" }) do
    methods[name .. "_"] = function(a, b) return binary(name, a, b, a) end
  end

  function methods.where(cond, a, b)
    local function as_t(x, like) if is_tensor(x) then return x end return M.full({}, x, { dtype = like.dtype_ }) end
    local ref = is_tensor(a) and a or b
    a, b = as_t(a, ref), as_t(b, ref)
    local s = broadcast(a, b)
    s = s and broadcast(cond, M.empty(s, {}))
    if not s then error("where: shapes are not compatible", 2) end
    local out = M.empty(s, { dtype = promote(a.dtype_, b.dtype_) })
    check(C.bl_where(out, cond, a, b))
    return out
  end
  M.where = methods.where

  function methods.matmul(a, b, out)
    if not is_tensor(a) or not is_tensor(b) then error("matmul: expected two tensors", 2) end
    local sa, sb = a:shape(), b:shape()
    local va, vb = #sa == 1, #sb == 1
    -- 1-D operands as in PyTorch: a row vector on the left, a column on the right
    if va then a = a:view({ 1, sa[1] }) end
    if vb then b = b:view({ sb[1], 1 }) end
    if a.ndim_ < 2 or b.ndim_ < 2 or a.shape_[a.ndim_ - 1] ~= b.shape_[b.ndim_ - 2] then
      error("matmul: shapes " .. shape_str(sa) .. " and " .. shape_str(sb) .. " are not compatible", 2)
    end
    if not out then
      local ba, bb = a:shape(), b:shape()
      local m, n = ba[#ba - 1], bb[#bb]
      ba[#ba], ba[#ba - 1] = nil, nil
      bb[#bb], bb[#bb - 1] = nil, nil
      local ta = M.empty(ba, {}); local tb = M.empty(bb, {})
      local bs = broadcast(ta, tb)
      if not bs then error("matmul: batch dims of " .. shape_str(sa) .. " and " .. shape_str(sb)
        .. " are not compatible",
        2) end
      bs[#bs + 1] = m; bs[#bs + 1] = n
      out = M.empty(bs, { dtype = promote(a.dtype_, b.dtype_), device = a.device_ })
    end
    check(C.bl_matmul(out, a, b))
    if va and vb then return out:view({}) end
    if va then local s = out:shape(); table.remove(s, #s - 1); return out:view(s) end
    if vb then local s = out:shape(); s[#s] = nil; return out:view(s) end
    return out
  end
  M.matmul = methods.matmul

  -- reductions ---------------------------------------------------------------
  local RED = enum_of { "sum", "mean", "max", "min", "argmax", "argmin", "prod" }
  local function reduce(name, t, dims, keepdim)
    live(t, name)
    local op = RED[name]
    if dims == nil then
      if name == "argmax" or name == "argmin" then
        return reduce(name, t:reshape({ t:numel() }), 1, false):item()
      end
      check(C.bl_reduce_all(op, t, dbl1))
      return dbl1[0]
    end
    if type(dims) == "number" then dims = { dims } end
    local mask = 0
    for _, d in ipairs(dims) do mask = bit.bor(mask, bit.lshift(1, cdim(t, d, name))) end
    local shape = {}
    for i = 0, t.ndim_ - 1 do
      if bit.band(mask, bit.lshift(1, i)) ~= 0 then
        if keepdim then shape[#shape + 1] = 1 end
      else
        shape[#shape + 1] = tonumber(t.shape_[i])
      end
    end
    local dt = t.dtype_
    if name == "argmax" or name == "argmin" then dt = 5
    elseif not is_float(dt) and (name == "mean") then dt = 0
    elseif not is_float(dt) and (name == "sum" or name == "prod") then dt = 5 end
    local out = M.empty(shape, { dtype = dt, device = t.device_ })
    check(C.bl_reduce(op, out, t, mask, keepdim and 1 or 0))
    if name == "argmax" or name == "argmin" then out:add_(1) end  -- 1-based indices
    return out
  end
  for name in pairs(RED) do
    methods[name] = function(t, dims, keepdim) return reduce(name, t, dims, keepdim) end
    M[name] = methods[name]
  end

  function methods.allclose(a, b, rtol, atol)
    rtol, atol = rtol or 1e-5, atol or 1e-8
    local d = (a:to("f64") - b:to("f64")):abs()
    local lim = b:to("f64"):abs():mul(rtol):add(atol)
    return (d:gt(lim)):sum() == 0
  end

  return binary
end
