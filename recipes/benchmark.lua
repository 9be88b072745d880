-- Training / inference throughput of a BERT model, optionally side by side
-- with the same model in PyTorch (tests/py/bert_reference.py).
--
--   bertlua recipes/benchmark.lua --model=mini --seq=128 --batch=32 --steps=10 [--compare=torch]
--   bertlua recipes/benchmark.lua --model=base --seq=384 --batch=8 --infer
--
-- A training step is what pre-training does: forward of BertForPreTraining
-- (MLM decoder on the masked positions only, NSP), backward into the flat
-- gradient buffer, and a plain SGD update over the flat parameter buffer.
-- Both sides use the same shapes, --threads threads, dropout --dropout, and
-- a batch with the last seq/8 tokens of every sequence padded.
local bl = require "bertlua"
local bert = require "bertlua.bert"
local config = require "bertlua.config"
local options = require "bertlua.options"
local log = require "bertlua.log"

local opt = options.parse(arg, {
  { "model", "mini", "preset (tiny, mini, small, medium, base, large) or a model directory" },
  { "seq", 128, "sequence length" },
  { "batch", 32, "sequences per step" },
  { "steps", 10, "timed steps" },
  { "warmup", 2, "untimed steps first" },
  { "device", "cpu", "cpu (cuda once the CUDA kernels land)" },
  { "threads", 0, "CPU threads for us and for PyTorch (0 = bertlua's default)" },
  { "masked", 20, "masked positions per sequence (MLM decoder rows)" },
  { "dropout", 0.1, "hidden and attention dropout" },
  { "infer", false, "time inference (forward of the encoder only) instead of training" },
  { "lr", 1e-4, "SGD learning rate" },
  { "compare", "", "'torch': run the same benchmark in PyTorch and print the ratio" },
  { "python", os.getenv("BL_PYTHON") or "/usr/bin/python3", "python with torch for --compare=torch" },
}, { usage = "bertlua recipes/benchmark.lua [options]" })
print("benchmark options:\n" .. options.show(opt))

if opt.device ~= "cpu" then error("benchmark: device '" .. opt.device .. "' is not available in this build (cpu)", 0) end
if opt.threads > 0 then bl.set_num_threads(opt.threads) end
local threads = bl.num_threads()

local cfg
if config.is_preset(opt.model) then
  cfg = config.preset(opt.model, { hidden_dropout_prob = opt.dropout, attention_probs_dropout_prob = opt.dropout })
else
  cfg = config.load(opt.model .. "/config.json")
  cfg.hidden_dropout_prob, cfg.attention_probs_dropout_prob = opt.dropout, opt.dropout
end
local B, S, V = opt.batch, opt.seq, cfg.vocab_size
if S > cfg.max_position_embeddings then cfg.max_position_embeddings = S end

local model = bert.BertForPreTraining(cfg, { seed = 1 })
if opt.infer then model:eval() else model:train() end
print(("model: L%d H%d A%d, %.1fM parameters, batch %d x %d, %d threads"):format(cfg.num_hidden_layers,
  cfg.hidden_size, cfg.num_attention_heads, model:num_parameters() / 1e6, B, S, threads))

-- a fixed batch: random tokens, last S/8 padded, `masked` MLM positions per sequence
local pad = math.floor(S / 8)
local u = bl.rand({ B, S + 2 * opt.masked }, { seed = 5, offset = 0 }):totable()
local ids, mask, pos, lab = {}, {}, {}, {}
for b = 1, B do
  ids[b], mask[b], pos[b], lab[b] = {}, {}, {}, {}
  local row = (b - 1) * (S + 2 * opt.masked)
  for s = 1, S do
    local real = s <= S - pad
    ids[b][s] = real and math.floor(u[row + s] * V) or 0
    mask[b][s] = real and 1 or 0
  end
  for j = 1, opt.masked do
    pos[b][j] = 1 + math.floor(u[row + S + j] * (S - pad - 2))
    lab[b][j] = math.floor(u[row + S + opt.masked + j] * V)
  end
end
local batch = {
  input_ids = bl.from(ids, { dtype = "i32" }), attention_mask = bl.from(mask),
  token_type_ids = bl.zeros({ B, S }, { dtype = "i32" }),
  masked_lm_positions = bl.from(pos, { dtype = "i32" }), masked_lm_labels = bl.from(lab, { dtype = "i32" }),
  next_sentence_labels = bl.from((function() local t = {} for b = 1, B do t[b] = b % 2 end return t end)(), { dtype = "i32" }),
}

local n = model.flat_params:numel()
local p, g = model.flat_params:ptr(), model.flat_grads:ptr()
local function step()
  if opt.infer then
    model.bert:forward(batch)
    return
  end
  model:zero_grad()
  local out = model:forward(batch)
  model:backward()
  local lr = opt.lr
  for i = 0, n - 1 do p[i] = p[i] - lr * g[i] end
  return out.loss
end

for _ = 1, opt.warmup do step() end
local t0 = log.clock()
for _ = 1, opt.steps do step() end
local dt = log.clock() - t0
local ours = B * opt.steps / dt
print(("bertlua: %.2f seq/s (%.1f ms/step, %s, %d threads)"):format(ours, dt / opt.steps * 1000,
  opt.infer and "inference" or "training", threads))

if opt.compare == "torch" then
  local cmd = ("%s tests/py/bert_reference.py bench --layers %d --hidden %d --heads %d --seq %d --batch %d --steps %d --threads %d --vocab %d --masked %d --warmup %d --dropout %g%s 2>&1")
    :format(opt.python, cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, S, B, opt.steps,
      threads, V, opt.masked, opt.warmup, opt.dropout, opt.infer and " --infer" or "")
  local f = io.popen(cmd)
  local out = f:read("*a")
  f:close()
  io.write(out)
  local theirs = tonumber(out:match("torch: ([%d%.]+) seq/s"))
  if theirs then
    print(("ratio bertlua/torch: %.2fx"):format(ours / theirs))
  else
    print("torch comparison failed (see output above)")
  end
elseif opt.compare ~= "" then
  error("benchmark: --compare must be 'torch' or empty", 0)
end
