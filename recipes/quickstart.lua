-- Quickstart: shows what this build of bertlua can do, on whatever machine it runs.
-- Grows into the full tiny pre-train → fine-tune walk-through as the stages land
-- (see README.md): each stage below runs when its module is present.
local bl = require "bertlua"

local opts = { seed = 1 }
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^%-%-([%w_-]+)=(.*)$")
  if k then opts[k:gsub("-", "_")] = tonumber(v) or v end
  if a == "--help" then
    print("usage: bertlua recipes/quickstart.lua [--seed=1]")
    os.exit(0)
  end
end

print(("bertlua %s: %d CPU threads, CUDA %s"):format(bl.version, bl.num_threads(),
  bl.cuda_available() and ("with " .. bl.cuda_device_count() .. " GPU(s)") or "not available (CPU run)"))

-- 1. tensors: a least-squares fit by gradient descent, all in tensor ops
local n, d = 256, 8
local X = bl.randn({n, d}, { seed = opts.seed })
local w_true = bl.randn({d, 1}, { seed = opts.seed + 1 })
local y = X:matmul(w_true)
local w = bl.zeros({d, 1})
local lr = 0.1
for step = 1, 60 do
  local err = X:matmul(w) - y
  local loss = (err * err):mean()
  local grad = X:t():matmul(err):mul(2 / n)
  w:sub_(grad * lr)
  if step == 1 or step % 20 == 0 then print(("  least squares step %2d  loss %.6f"):format(step, loss)) end
end
print(("  max |w - w_true| = %.2e"):format((w - w_true):abs():max()))

-- 2. later stages (tokenizer, model, pre-training, fine-tuning) run here when present
local ok, Tok = pcall(require, "bertlua.tokenizer")
local vocab = "../shared/data/vocab/bert-base-uncased-vocab.txt"
local f = io.open(vocab)
if ok and f then
  f:close()
  local tok = Tok.load(vocab, { lower = true })
  print("  WordPiece: " .. table.concat(tok:tokenize("bertlua tokenizes unaffable text."), " "))
end
print("quickstart done")
