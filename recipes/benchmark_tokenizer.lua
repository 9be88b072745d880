-- benchmark_tokenizer.lua: single-thread tokenization throughput (MB/s) of
-- bertlua's WordPiece tokenizer, and of Hugging Face tokenizers (Rust,
-- BertWordPieceTokenizer, RAYON_NUM_THREADS=1) on the same text when
-- tools/peers/tokenizer_reference.py can import it.
--   bertlua recipes/benchmark_tokenizer.lua --vocab=vocab.txt --input=a.txt,b.txt [--cased] [--repeat=5]
-- Both sides tokenize line by line (one call per line); bertlua also in one
-- call per whole text (tok:count). Use a Release build.
local options = require "bertlua.util.options"
local Tok = require "bertlua.data.tokenizer"
local shell = require "bertlua.util.shell"

local data = os.getenv("BL_SHARED_DATA") or "../shared/data"
local spec = {
  { "vocab", data .. "/vocab/bert-base-uncased-vocab.txt", "vocab.txt" },
  { "input", data .. "/books/pg1342-0.txt," .. data .. "/books/pg11-0.txt," .. data .. "/books/pg84-0.txt",
    "text files, comma-separated (concatenated)" },
  { "cased", false, "cased tokenizer" },
  { "repeat", 5, "timed repetitions (best is reported)" },
  { "python", os.getenv("BL_PYTHON") or "/usr/bin/python3", "python with the tokenizers package" },
  { "peer", true, "also time HF tokenizers (Rust)" },
}
local opt = options.parse(arg, spec, { usage = "bertlua recipes/benchmark_tokenizer.lua [options]" })
print("benchmark_tokenizer options:\n" .. options.show(opt))
print(require("bertlua").cpu_line())

local parts = {}
for p in opt.input:gmatch("[^,]+") do
  local f = assert(io.open(p, "rb"), "benchmark_tokenizer: cannot open " .. p)
  parts[#parts + 1] = f:read("*a"); f:close()
end
local text = table.concat(parts)
local tok = Tok.load(opt.vocab, { lower = not opt.cased })
-- the peers (PyTorch, ...) are in tools/peers, beside recipes/ in the source tree and installed
local PEERS = require("bertlua.util.fs").recipe("../tools/peers/")

local now = require("bertlua.util.log").clock

-- line offsets once, so the timed loop only tokenizes
local starts, lens = {}, {}
do
  local i = 1
  while i <= #text do
    local j = text:find("\n", i, true) or (#text + 1)
    starts[#starts + 1], lens[#lens + 1] = i - 1, j - i
    i = j + 1
  end
end

local function per_line()
  local total = 0
  for k = 1, #starts do total = total + tok:count(text, starts[k], lens[k]) end
  return total
end
local function whole() return tok:count(text) end

local function bench(name, fn)
  local best, count = math.huge, 0
  for _ = 1, opt["repeat"] do
    local t0 = now()
    count = fn()
    best = math.min(best, now() - t0)
  end
  print(("bertlua_%s bytes=%d tokens=%d seconds=%.4f MBps=%.2f"):format(name, #text, count, best, #text / best / 1e6))
  return #text / best / 1e6
end
local ours = bench("per_line", per_line)
bench("whole_text", whole)

if opt.peer then
  local tmp = os.tmpname()
  local f = assert(io.open(tmp, "wb")); f:write(text); f:close()
  local out = shell.read({ "env", "RAYON_NUM_THREADS=1", opt.python, PEERS .. "tokenizer_reference.py",
    "--vocab=" .. opt.vocab, opt.cased and "--cased" or {}, "--bench=" .. tmp, "--repeat=" .. opt["repeat"] },
    { stderr = "stdout" })
  os.remove(tmp)
  io.write(out)
  local peer = tonumber(out:match("hf_tokenizers_rust .- MBps=([%d%.]+)"))
  if peer then print(("speedup vs HF tokenizers (per line, 1 thread): %.2fx"):format(ours / peer)) end
end
