-- testing: a tiny test runner for tests/lua/*.lua.
--   local T = require "testing"
--   T.test("name", function() T.near(a, b, 1e-6) end)
--   T.run()             -- prints "N passed, M failed[, K skipped]" and exits
-- T.skip("why") inside a test marks it skipped; T.skip_all("why") skips the file (exit 77).
local M = {}
local tests = {}
local SKIP = {}

function M.test(name, fn) tests[#tests + 1] = { name = name, fn = fn } end

function M.skip(why) error(setmetatable({ why = why }, SKIP), 0) end
-- mpi_ranks_on_gpus(n[, all]): skips (the case, or with all the whole file) without mpirun or without a CUDA device
-- per rank: ranks take cuda:(local rank % devices), and NCCL refuses two ranks on one GPU (the emulated build has 2)
function M.mpi_ranks_on_gpus(n, all)
  local skip = all and M.skip_all or M.skip
  if not M.sh("command -v mpirun"):find("/", 1, true) then skip("mpirun not installed") end
  local have = require("bertlua").cuda_device_count()
  if have < n then skip(("%d ranks need %d CUDA devices (NCCL takes one GPU per rank); %d here"):format(n, n, have)) end
end

function M.skip_all(why)
  io.write("skipped: ", why, "\n")
  os.exit(77)
end

local function fmt(v)
  if type(v) == "string" then return string.format("%q", v) end
  return tostring(v)
end

function M.eq(a, b, msg)
  if a ~= b then error((msg and msg .. ": " or "") .. "expected " .. fmt(b) .. ", got " .. fmt(a), 2) end
end

function M.truthy(v, msg)
  if not v then error(msg or "expected a true value", 2) end
  return v
end

-- |a-b| <= atol + rtol*|b| for numbers or equal-length tables (nested allowed).
function M.near(a, b, rtol, atol, path)
  rtol = rtol or 1e-6; atol = atol or 0; path = path or ""
  if type(a) == "table" and type(b) == "table" then
    if #a ~= #b then error(("length mismatch at %s: %d vs %d"):format(path, #a, #b), 2) end
    for i = 1, #b do M.near(a[i], b[i], rtol, atol, path .. "[" .. i .. "]") end
    return
  end
  a, b = tonumber(a), tonumber(b)
  local ok = (a == b) or (math.abs(a - b) <= atol + rtol * math.abs(b))
  if not ok or a ~= a then
    error(("not near at %s: got %.9g, expected %.9g (rtol %g, atol %g)"):format(path, a, b, rtol, atol), 2)
  end
end

-- raises(fn, pattern): fn must raise an error whose message contains the plain text `pattern`.
function M.raises(fn, pattern)
  local ok, err = pcall(fn)
  if ok then error("expected an error containing '" .. pattern .. "', got none", 2) end
  err = tostring(err)
  if not err:find(pattern, 1, true) then
    error("error message '" .. err .. "' does not contain '" .. pattern .. "'", 2)
  end
  return err
end

-- shared_data(): path of ../shared/data (or $BL_SHARED_DATA) or nil.
-- True in the AddressSanitizer build's tests (BL_SANITIZED=1 from
-- tests/tests.cmake): long training runs there shrink to smoke runs, since
-- the Release build's run checks the accuracy and ASan runs ~10x slower.
function M.sanitized() return os.getenv("BL_SANITIZED") == "1" end

function M.shared_data(sub)
  local base = os.getenv("BL_SHARED_DATA") or "../shared/data"
  local p = sub and (base .. "/" .. sub) or base
  local f = io.open(p, "r")
  if f then f:close(); return p end
  return nil
end

local finalizers = {}
-- at_exit(fn): run fn after all tests (cleanup of temp dirs, servers).
function M.at_exit(fn) finalizers[#finalizers + 1] = fn end

-- Helpers for tests that run recipes through the executable --------------------

-- exe(): path of the bertlua executable: $BL_BUILD_DIR/bertlua (ctest sets it), else build/bertlua.
-- each_cpu_path(fn): fn(isa) on every CPU kernel path this build and CPU can set (avx512, avx2, baseline; the
-- sanitizer build has only baseline), at least one; the best path is set again afterwards (best_cpu_path: amx
-- where there is one, avx512 with the bf16/int8 GEMMs on tiles, which the tests of those GEMMs run themselves).
local CPU_PATHS = { "avx512", "avx2", "baseline" }
function M.each_cpu_path(fn)
  local bl = require "bertlua"
  local tested = 0
  for _, isa in ipairs(CPU_PATHS) do
    if pcall(bl.set_cpu_isa, isa) then
      fn(isa)
      tested = tested + 1
    end
  end
  M.truthy(tested >= 1, "no CPU path could be set")
  M.best_cpu_path()
end

-- best_cpu_path(): sets the best CPU path this build and CPU have again (amx, avx512, avx2 or baseline), under
-- BL_CPU_ISA's cap as at start-up
function M.best_cpu_path()
  local bl = require "bertlua"
  local cap, paths = os.getenv("BL_CPU_ISA"), { "amx", "avx512", "avx2", "baseline" }
  local from = 1
  for i, isa in ipairs(paths) do if isa == cap then from = i end end
  for i = from, #paths do if pcall(bl.set_cpu_isa, paths[i]) then return paths[i] end end
end

function M.exe() return (os.getenv("BL_BUILD_DIR") or "build") .. "/bertlua" end

-- sh(cmd) -> out, rc: runs a shell command; out is its stdout and stderr together
-- (followed by a last line "rc=N"), rc its exit status as a number.
function M.sh(cmd)
  local f = io.popen(cmd .. " 2>&1; echo rc=$?")
  local out = f:read("*a"); f:close()
  return out, tonumber(out:match("rc=(%d+)%s*$"))
end

-- tmpdir(sub, ...) -> path: a new directory (with the named subdirectories),
-- removed after all tests unless $BL_KEEP is set.
function M.tmpdir(...)
  local tmp = os.tmpname(); os.remove(tmp)
  local dirs = { tmp }
  for _, sub in ipairs({ ... }) do dirs[#dirs + 1] = tmp .. "/" .. sub end
  os.execute("mkdir -p " .. table.concat(dirs, " "))
  M.at_exit(function() if not os.getenv("BL_KEEP") then os.execute("rm -rf " .. tmp) end end)
  return tmp
end

-- slurp(path): the whole file (binary); fails with "<path> not written" when it cannot be opened.
function M.slurp(path)
  local f = assert(io.open(path, "rb"), path .. " not written")
  local s = f:read("*a"); f:close()
  return s
end

-- write_file(path, s): (over)writes path with the string s.
function M.write_file(path, s)
  local f = assert(io.open(path, "w")); f:write(s); f:close()
end

-- read_lines(path): the file's lines as a list.
function M.read_lines(path)
  local r = {}
  for l in io.lines(path) do r[#r + 1] = l end
  return r
end

local HEADS = { qa = "BertForQuestionAnswering", cls = "BertForSequenceClassification",
  pretraining = "BertForPreTraining" }
-- tiny_model_dir(dir, opts) -> cfg: saves a randomly initialised (seeded) small
-- BERT as a model directory (config.json, model.safetensors, vocab.txt).
--   opts.vocab: path of the vocab.txt to copy in (required)
--   opts.head: "cls" (default; opts.num_labels, default 2), "qa" or "pretraining"
--   opts.seed: initialisation seed
--   opts.config: fields overriding the default config: BERT-base's vocabulary
--     (30522), hidden 32, 1 layer, 2 heads, intermediate 64, 128 positions
function M.tiny_model_dir(dir, opts)
  local bert = require "bertlua.bert"
  local pretrained = require "bertlua.pretrained"
  local cfg = { vocab_size = 30522, hidden_size = 32, num_hidden_layers = 1, num_attention_heads = 2,
    intermediate_size = 64, max_position_embeddings = 128 }
  for k, v in pairs(opts.config or {}) do cfg[k] = v end
  local head = HEADS[opts.head or "cls"] or error("tiny_model_dir: unknown head " .. tostring(opts.head), 2)
  local mopts = { seed = opts.seed }
  if head == HEADS.cls then mopts.num_labels = opts.num_labels or 2 end
  pretrained.save_pretrained(bert[head](cfg, mopts), dir, { vocab = assert(opts.vocab, "tiny_model_dir: opts.vocab") })
  return cfg
end

function M.run()
  local passed, failed, skipped = 0, 0, 0
  local filter = os.getenv("BL_TEST_FILTER")
  for _, t in ipairs(tests) do
    if not filter or t.name:find(filter, 1, true) then
      local t0 = os.clock()
      local ok, err = xpcall(t.fn, function(e)
        if getmetatable(e) == SKIP then return e end
        return debug.traceback(tostring(e), 2)
      end)
      if ok then
        passed = passed + 1
        io.write(("ok      %s (%.2fs)\n"):format(t.name, os.clock() - t0))
      elseif type(err) == "table" and getmetatable(err) == SKIP then
        skipped = skipped + 1
        io.write(("skipped %s: %s\n"):format(t.name, err.why))
      else
        failed = failed + 1
        io.write(("FAILED  %s\n%s\n"):format(t.name, err))
      end
      io.flush()
    end
  end
  for _, fn in ipairs(finalizers) do pcall(fn) end
  io.write(("%d passed, %d failed, %d skipped\n"):format(passed, failed, skipped))
  os.exit(failed == 0 and (passed > 0 and 0 or (skipped > 0 and 77 or 1)) or 1)
end

return M
