-- bertlua.tensor: the Lua face of the C tensor core.
--
-- Dims and indices are 1-based as everywhere in Lua (Torch7 style); negative
-- dims count from the end (-1 is the last). Shapes are Lua arrays {2, 3}.
-- Memory belongs to C: a tensor is freed when Lua collects it, or at once
-- with t:free(). Struct fields carry a trailing underscore (t.ndim_,
-- t.shape_[0]) — use the methods (t:dim(), t:shape()) in normal code.
--
-- A Lua tensor is a `bl_tensor` struct cdata (not a pointer): LuaJIT gives
-- pointers built-in arithmetic (p - q, p + 1) that would shadow the
-- operators below, while structs use the metamethods. Struct cdata still
-- pass straight to C functions taking `bl_tensor *`.
local core = require "bertlua.core"
local ffi, C = core.ffi, core.C
local check = core.check

local M = {}
local methods = {}
M.methods = methods

local tensor_out = ffi.typeof("bl_tensor*[1]")
local tensor_t = ffi.typeof("bl_tensor")
local i64arr = ffi.typeof("int64_t[?]")
local intarr = ffi.typeof("int[?]")
local dblarr = ffi.typeof("double[?]")

-- dtypes -------------------------------------------------------------------
local DTYPE = {
  f32 = 0, float32 = 0, float = 0, f64 = 1, float64 = 1, double = 1,
  f16 = 2, float16 = 2, half = 2, bf16 = 3, bfloat16 = 3,
  i32 = 4, int32 = 4, int = 4, i64 = 5, int64 = 5, long = 5, u8 = 6, uint8 = 6, bool = 7,
}
local DTNAME = { [0] = "f32", "f64", "f16", "bf16", "i32", "i64", "u8", "bool" }
local PTRTYPE = { [0] = "float*", "double*", "uint16_t*", "uint16_t*", "int32_t*", "int64_t*", "uint8_t*", "uint8_t*" }
local RANK = { [6] = 1, [7] = 0, [4] = 2, [5] = 3, [2] = 4, [3] = 4, [0] = 5, [1] = 6 }
for k in pairs(PTRTYPE) do PTRTYPE[k] = ffi.typeof(PTRTYPE[k]) end
M.dtypes = DTNAME

local function dtype_of(d, op)
  if d == nil then return 0 end
  if type(d) == "number" and DTNAME[d] then return d end
  local v = DTYPE[d]
  if not v then error((op or "tensor") .. ": unknown dtype '" .. tostring(d)
    .. "' (f32, f64, f16, bf16, i32, i64, u8, bool)", 3) end
  return v
end
M.dtype_of = dtype_of

local function is_float(d) return d <= 3 end

local function device_of(d, op)
  if d == nil or d == "cpu" or d == -1 then return -1 end
  if type(d) == "number" and d >= 0 then return d end
  if d == "cuda" then return 0 end
  local n = type(d) == "string" and d:match("^cuda:(%d+)$")
  if not n then error((op or "tensor") .. ": unknown device '" .. tostring(d) .. "' (cpu, cuda, cuda:N)", 3) end
  return tonumber(n)
end
M.device_of = device_of
local function device_name(d) return d < 0 and "cpu" or ("cuda:" .. d) end

local function is_tensor(x) return type(x) == "cdata" and ffi.istype(tensor_t, x) end
M.is_tensor = is_tensor

-- shapes -------------------------------------------------------------------
local function shape_arg(shape, op, ...)
  if type(shape) == "number" then shape = { shape, ... } end
  if type(shape) ~= "table" then error(op .. ": shape must be a table of sizes, got " .. type(shape), 3) end
  local n = #shape
  if n > 8 then error(op .. ": at most 8 dims are supported, got " .. n, 3) end
  local buf = i64arr(math.max(n, 1))
  for i = 1, n do
    local s = shape[i]
    if type(s) ~= "number" or s < 0 or s ~= math.floor(s) then
      error(op .. ": shape entries must be non-negative integers, got " .. tostring(s) .. " at position " .. i, 3)
    end
    buf[i - 1] = s
  end
  return n, buf
end

local tensor_size = ffi.sizeof(tensor_t)
-- wrap(p): adopt a header returned by C (bl_tensor* from a bl_tensor*[1] out-param).
local function wrap(p)
  local t = tensor_t()
  ffi.copy(t, p, tensor_size)
  C.bl_tensor_free_header(p)
  return ffi.gc(t, C.bl_tensor_release)
end
M.wrap = wrap

local function new(n, buf, dtype, device)
  local out = tensor_out()
  check(C.bl_tensor_empty(n, buf, dtype, device, out))
  return wrap(out[0])
end

local function shape_str(shape) return "[" .. table.concat(shape, ",") .. "]" end

-- creation -----------------------------------------------------------------
function M.empty(shape, opts, ...)
  if type(shape) == "number" then shape, opts = { shape, opts, ... }, nil end
  opts = opts or {}
  local n, buf = shape_arg(shape, "empty")
  return new(n, buf, dtype_of(opts.dtype, "empty"), device_of(opts.device, "empty"))
end

local function filled(op, shape, value, opts)
  opts = opts or {}
  local n, buf = shape_arg(shape, op)
  local t = new(n, buf, dtype_of(opts.dtype, op), device_of(opts.device, op))
  check(C.bl_tensor_fill(t, value == true and 1 or value == false and 0 or value))
  return t
end

function M.full(shape, value, opts)
  if type(value) ~= "number" and type(value) ~= "boolean" then error("full: value must be a number", 2) end
  return filled("full", shape, value, opts)
end
function M.zeros(shape, opts, ...)
  if type(shape) == "number" then shape, opts = { shape, opts, ... }, nil end
  return filled("zeros", shape, 0, opts)
end
function M.ones(shape, opts, ...)
  if type(shape) == "number" then shape, opts = { shape, opts, ... }, nil end
  return filled("ones", shape, 1, opts)
end

-- arange(n) = 0..n-1; arange(a, b[, step]) = a, a+step, ... < b (PyTorch semantics)
function M.arange(a, b, step, opts)
  if type(b) == "table" then opts, b = b, nil end
  if type(step) == "table" then opts, step = step, nil end
  if b == nil then a, b = 0, a end
  step = step or 1
  if type(a) ~= "number" or type(b) ~= "number" or type(step) ~= "number" or step == 0 then
    error("arange: expected numbers start, stop and a non-zero step", 2)
  end
  local n = math.max(0, math.ceil((b - a) / step))
  opts = opts or {}
  local dt = opts.dtype and dtype_of(opts.dtype, "arange")
    or ((a % 1 == 0 and b % 1 == 0 and step % 1 == 0) and 5 or 0)
  local t = M.empty({ n }, { dtype = dt })
  check(C.bl_tensor_arange(t, a, step))
  if opts.device then return t:to(opts.device) end
  return t
end

-- from(nested table) with the shape inferred from the nesting
function M.from(tbl, opts)
  opts = opts or {}
  if type(tbl) == "number" or type(tbl) == "boolean" then
    local t = M.empty({}, opts)
    check(C.bl_tensor_fill(t, tbl == true and 1 or tbl == false and 0 or tbl))
    return t
  end
  if type(tbl) ~= "table" then error("from: expected a (nested) table of numbers, got " .. type(tbl), 2) end
  local shape = {}
  local x = tbl
  while type(x) == "table" do
    shape[#shape + 1] = #x
    x = x[1]
    if #shape > 8 then error("from: more than 8 levels of nesting", 2) end
  end
  local numel = 1
  for _, s in ipairs(shape) do numel = numel * s end
  local vals = dblarr(math.max(numel, 1))
  local k = 0
  local function walk(v, depth, path)
    if depth > #shape then
      local num = v == true and 1 or v == false and 0 or v
      if type(num) ~= "number" then error("from: element at " .. path .. " is a " .. type(v) .. ", not a number", 0) end
      vals[k] = num
      k = k + 1
      return
    end
    if type(v) ~= "table" or #v ~= shape[depth] then
      error("from: ragged nesting at " .. (path == "" and "top level" or path) .. ": expected " .. shape[depth]
        .. " elements", 0)
    end
    for i = 1, #v do walk(v[i], depth + 1, path .. "[" .. i .. "]") end
  end
  local ok, err = pcall(walk, tbl, 1, "")
  if not ok then error(err, 2) end
  local dt = opts.dtype
  local t = M.empty(shape, { dtype = dt })
  check(C.bl_tensor_from_doubles(t, vals, numel))
  if opts.device and device_of(opts.device) >= 0 then return t:to(opts.device) end
  return t
end

-- random numbers: counter-based Philox; the stream is fixed by (seed, offset).
local Generator = {}
Generator.__index = Generator
-- a seed or an offset: an integer in [0, 2^64) (or an FFI integer); -1, NaN or 2^80 would all map to one stream
local function check_seed(v, op, what)
  if type(v) ~= "cdata" and (type(v) ~= "number" or not (v >= 0 and v < 2 ^ 64) or v % 1 ~= 0) then
    error(("%s: %s must be an integer from 0 to 2^64-1, got %s"):format(op, what, tostring(v)), 0)
  end
  return v
end
function M.Generator(seed)
  return setmetatable({ seed = check_seed(seed or 0, "Generator", "seed"), offset = 0 }, Generator)
end
-- Reserve the counter blocks for n numbers and return the offset to use.
function Generator:advance(n)
  local off = self.offset
  self.offset = self.offset + math.ceil(n / 4)
  return off
end
function Generator:state() return { seed = self.seed, offset = self.offset } end
function Generator:set_state(s) self.seed, self.offset = s.seed, s.offset end
M.default_generator = M.Generator(0)
function M.manual_seed(seed) M.default_generator = M.Generator(seed) return M.default_generator end

-- normal_(seed, offset, mean, std): fill t in place from the Philox stream (seed, offset)
function methods.normal_(t, seed, offset, mean, std)
  check(C.bl_rand_normal(t, check_seed(seed, "normal_", "seed"), check_seed(offset, "normal_", "offset"), mean or 0,
    std or 1))
  return t
end

local function random_fill(kind, shape, opts)
  opts = opts or {}
  local t = M.empty(shape, { dtype = opts.dtype, device = "cpu" })
  local seed, offset = opts.seed, opts.offset
  if seed == nil then
    local g = opts.generator or M.default_generator
    seed, offset = g.seed, g:advance(t:numel())
  end
  local op = kind == "normal" and "randn" or "rand"
  seed, offset = check_seed(seed, op, "seed"), check_seed(offset or 0, op, "offset")
  if kind == "normal" then
    methods.normal_(t, seed, offset, opts.mean, opts.std)
  else
    check(C.bl_rand_uniform(t, seed, offset, opts.low or 0, opts.high or 1))
  end
  if opts.device and device_of(opts.device) >= 0 then return t:to(opts.device) end
  return t
end
-- rand(shape, {seed=, offset=, low=0, high=1, dtype=, generator=})
function M.rand(shape, opts) return random_fill("uniform", shape, opts) end
-- randn(shape, {seed=, offset=, mean=0, std=1, dtype=, generator=})
function M.randn(shape, opts) return random_fill("normal", shape, opts) end

-- metadata -----------------------------------------------------------------
local function live(t, op)
  if t.storage_ == nil then error((op or "tensor") .. ": tensor was freed", 3) end
end

function methods.dim(t) return t.ndim_ end
function methods.numel(t) return tonumber(t.numel_) end
function methods.dtype(t) return DTNAME[t.dtype_] end
function methods.device(t) return device_name(t.device_) end
function methods.is_cuda(t) return t.device_ >= 0 end
function methods.shape(t)
  local s = {}
  for i = 0, t.ndim_ - 1 do s[i + 1] = tonumber(t.shape_[i]) end
  return s
end
function methods.strides(t)
  local s = {}
  for i = 0, t.ndim_ - 1 do s[i + 1] = tonumber(t.stride_[i]) end
  return s
end

-- 1-based / negative dim → 0-based
local function cdim(t, d, op, extra)
  local n = t.ndim_ + (extra or 0)
  if type(d) ~= "number" or d ~= math.floor(d) then error(op .. ": dimension must be an integer, got " .. tostring(d),
    3) end
  if d < 0 then d = n + d + 1 end
  if d < 1 or d > n then error(op .. ": dimension " .. d .. " out of range for a tensor with " .. t.ndim_ .. " dims",
    3) end
  return d - 1
end
M.cdim = cdim

function methods.size(t, d)
  if d == nil then return methods.shape(t) end
  return tonumber(t.shape_[cdim(t, d, "size")])
end
function methods.is_contiguous(t) return C.bl_tensor_is_contiguous(t) == 1 end
-- ptr(): a typed host pointer to the first element (CPU tensors only: a GPU
-- address read from Lua would crash the process, so that is an error).
function methods.ptr(t)
  live(t, "ptr")
  if t.device_ >= 0 then
    error("ptr: tensor is on " .. device_name(t.device_) .. "; copy it to the cpu first (t:to(\"cpu\"))", 2)
  end
  return ffi.cast(PTRTYPE[t.dtype_], t.data_)
end
function methods.nbytes(t) return tonumber(C.bl_tensor_nbytes(t)) end
function methods.element_size(t) return tonumber(C.bl_dtype_size(t.dtype_)) end

function methods.free(t)
  C.bl_tensor_release(t)
end

-- views --------------------------------------------------------------------
function methods.view(t, shape, ...)
  if type(shape) == "number" then shape = { shape, ... } end
  live(t, "view")
  shape = { unpack(shape) }
  local known, infer = 1, nil
  for i, s in ipairs(shape) do
    if s == -1 then
      if infer then error("view: only one dimension can be -1", 2) end
      infer = i
    else known = known * s end
  end
  if infer then shape[infer] = known > 0 and math.floor(t:numel() / known) or 0 end
  local n, buf = shape_arg(shape, "view")
  local out = tensor_out()
  check(C.bl_tensor_view(t, n, buf, out))
  return wrap(out[0])
end

-- reshape: a view when the strides allow, else a contiguous copy.
function methods.reshape(t, shape, ...)
  if type(shape) == "number" then shape = { shape, ... } end
  local ok, v = pcall(methods.view, t, shape)
  if ok then return v end
  if not tostring(v):find("without a copy", 1, true) then error(v, 2) end
  return methods.view(methods.contiguous(t), shape)
end

function methods.transpose(t, d0, d1)
  live(t, "transpose")
  local out = tensor_out()
  check(C.bl_tensor_transpose(t, cdim(t, d0, "transpose"), cdim(t, d1, "transpose"), out))
  return wrap(out[0])
end
function methods.t(t)
  if t.ndim_ ~= 2 then error("t: expects a 2-D tensor, got " .. t.ndim_ .. " dims", 2) end
  return methods.transpose(t, 1, 2)
end

function methods.permute(t, perm, ...)
  if type(perm) == "number" then perm = { perm, ... } end
  live(t, "permute")
  if #perm ~= t.ndim_ then error("permute: " .. #perm .. " dims given for a tensor with " .. t.ndim_, 2) end
  local p = intarr(math.max(#perm, 1))
  for i = 1, #perm do p[i - 1] = cdim(t, perm[i], "permute") end
  local out = tensor_out()
  check(C.bl_tensor_permute(t, p, out))
  return wrap(out[0])
end

-- narrow(dim, start, length): start is 1-based
function methods.narrow(t, dim, start, length)
  live(t, "narrow")
  local d = cdim(t, dim, "narrow")
  if type(start) ~= "number" or type(length) ~= "number" then error("narrow: start and length must be numbers", 2) end
  local out = tensor_out()
  check(C.bl_tensor_narrow(t, d, start - 1, length, out))
  return wrap(out[0])
end

-- select(dim, index): index is 1-based (negative from the end); drops the dim
function methods.select(t, dim, index)
  live(t, "select")
  local d = cdim(t, dim, "select")
  if type(index) ~= "number" then error("select: index must be a number", 2) end
  if index < 0 then index = tonumber(t.shape_[d]) + index + 1 end
  local out = tensor_out()
  check(C.bl_tensor_select(t, d, index - 1, out))
  return wrap(out[0])
end

function methods.expand(t, shape, ...)
  if type(shape) == "number" then shape = { shape, ... } end
  live(t, "expand")
  local n = #shape
  local buf = i64arr(math.max(n, 1))
  for i = 1, n do buf[i - 1] = shape[i] end
  local out = tensor_out()
  check(C.bl_tensor_expand(t, n, buf, out))
  return wrap(out[0])
end

function methods.unsqueeze(t, dim)
  live(t, "unsqueeze")
  local out = tensor_out()
  check(C.bl_tensor_unsqueeze(t, cdim(t, dim, "unsqueeze", 1), out))
  return wrap(out[0])
end

function methods.squeeze(t, dim)
  live(t, "squeeze")
  if dim == nil then
    local s = {}
    for _, v in ipairs(t:shape()) do if v ~= 1 then s[#s + 1] = v end end
    return methods.view(t, s)
  end
  local out = tensor_out()
  check(C.bl_tensor_squeeze(t, cdim(t, dim, "squeeze"), out))
  return wrap(out[0])
end

function methods.alias(t)
  local out = tensor_out()
  check(C.bl_tensor_alias(t, out))
  return wrap(out[0])
end

-- as_strided(shape, strides[, offset]): a view of t's storage (strides and offset in elements; offset
-- defaults to t's own)
function methods.as_strided(t, shape, strides, offset)
  live(t, "as_strided")
  local nd = #shape
  local sh, st = ffi.new("int64_t[?]", math.max(nd, 1)), ffi.new("int64_t[?]", math.max(nd, 1))
  for i = 1, nd do sh[i - 1], st[i - 1] = shape[i], strides[i] end
  local out = tensor_out()
  check(C.bl_tensor_as_strided(t, nd, sh, st, offset or t.offset_, out))
  return wrap(out[0])
end

-- copies -------------------------------------------------------------------
function methods.copy_(t, src)
  if not is_tensor(src) then error("copy_: source must be a tensor, got " .. type(src), 2) end
  check(C.bl_tensor_copy(t, src))
  return t
end
function methods.fill_(t, v)
  if type(v) == "boolean" then v = v and 1 or 0 end
  if type(v) ~= "number" then error("fill_: value must be a number, got " .. type(v), 2) end
  check(C.bl_tensor_fill(t, v))
  return t
end
function methods.zero_(t) return methods.fill_(t, 0) end

function methods.empty_like(t, opts)
  opts = opts or {}
  return new(t.ndim_, t.shape_, opts.dtype and dtype_of(opts.dtype) or t.dtype_,
    opts.device and device_of(opts.device) or t.device_)
end
M.empty_like = methods.empty_like
function M.zeros_like(t, opts) return methods.empty_like(t, opts):fill_(0) end
function M.ones_like(t, opts) return methods.empty_like(t, opts):fill_(1) end

function methods.clone(t) return methods.empty_like(t):copy_(t) end
function methods.contiguous(t)
  if C.bl_tensor_is_contiguous(t) == 1 then return t end
  return methods.clone(t)
end

-- to(dtype) / to(device) / to{dtype=, device=}
function methods.to(t, what)
  local dtype, device = t.dtype_, t.device_
  if type(what) == "table" then
    if what.dtype then dtype = dtype_of(what.dtype, "to") end
    if what.device then device = device_of(what.device, "to") end
  elseif type(what) == "string" and (what == "cpu" or what:match("^cuda")) then
    device = device_of(what, "to")
  else
    dtype = dtype_of(what, "to")
  end
  if dtype == t.dtype_ and device == t.device_ then return t end
  return methods.empty_like(t, { dtype = dtype, device = device }):copy_(t)
end
function methods.float(t) return methods.to(t, "f32") end
function methods.double(t) return methods.to(t, "f64") end
function methods.cpu(t) return methods.to(t, "cpu") end
function methods.cuda(t, n) return methods.to(t, "cuda:" .. (n or 0)) end

-- element access and conversion to Lua ---------------------------------------
local function index_buf(t, idx, op)
  if #idx ~= t.ndim_ then error(op .. ": " .. #idx .. " indices given for a tensor with " .. t.ndim_ .. " dims", 3) end
  local b = i64arr(math.max(#idx, 1))
  for i = 1, #idx do
    local v = idx[i]
    if type(v) ~= "number" then error(op .. ": index " .. i .. " is not a number", 3) end
    if v < 0 then v = tonumber(t.shape_[i - 1]) + v + 1 end
    b[i - 1] = v - 1
  end
  return b
end

local dbl1 = ffi.new("double[1]")
-- get(i, j, ...) with 1-based indices
function methods.get(t, ...)
  check(C.bl_tensor_get(t, index_buf(t, { ... }, "get"), dbl1))
  return dbl1[0]
end
-- set(value, i, j, ...)
function methods.set(t, value, ...)
  check(C.bl_tensor_set(t, index_buf(t, { ... }, "set"), value))
  return t
end

function methods.item(t)
  if t:numel() ~= 1 then error("item: tensor has " .. t:numel() .. " elements, item() needs exactly one", 2) end
  local buf = dblarr(1)
  check(C.bl_tensor_to_doubles(t, buf, 1))
  return buf[0]
end

function methods.tolist(t)
  local n = t:numel()
  local buf = dblarr(math.max(n, 1))
  check(C.bl_tensor_to_doubles(t, buf, n))
  local shape = t:shape()
  if #shape == 0 then return buf[0] end
  local k = 0
  local function build(d)
    local r = {}
    if d == #shape then
      for i = 1, shape[d] do r[i] = buf[k]; k = k + 1 end
    else
      for i = 1, shape[d] do r[i] = build(d + 1) end
    end
    return r
  end
  return build(1)
end

-- flat Lua array of all values (row-major)
function methods.totable(t)
  local n = t:numel()
  local buf = dblarr(math.max(n, 1))
  check(C.bl_tensor_to_doubles(t, buf, n))
  local r = {}
  for i = 1, n do r[i] = buf[i - 1] end
  return r
end

-- arithmetic, reductions and printing live in tensor/math.lua and tensor/print.lua
local parts = { M = M, methods = methods, RANK = RANK, DTNAME = DTNAME, is_float = is_float, is_tensor = is_tensor,
  shape_str = shape_str, device_name = device_name, live = live, cdim = cdim, dbl1 = dbl1 }
local binary = require("bertlua.tensor.math")(parts)
require("bertlua.tensor.print")(parts)

local mt = {
  __index = methods,
  __tostring = methods.tostring,
  __add = function(a, b) return binary("add", a, b) end,
  __sub = function(a, b) return binary("sub", a, b) end,
  __mul = function(a, b) return binary("mul", a, b) end,
  __div = function(a, b) return binary("div", a, b) end,
  __pow = function(a, b) return binary("pow", a, b) end,
  __unm = function(a) return methods.neg(a) end,  -- LuaJIT passes the operand twice; ignore the second
  __len = function(t) return t.ndim_ > 0 and tonumber(t.shape_[0]) or 0 end,
}
ffi.metatype("bl_tensor", mt)

-- where a tensor is expected but a Lua table or number was given
function M.as_tensor(x, opts)
  if is_tensor(x) then return x end
  return M.from(x, opts)
end

M.shape_str = shape_str
return M
