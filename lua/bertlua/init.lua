-- bertlua: `local bl = require "bertlua"` gives the tensor library
-- (bl.zeros, bl.randn, t:matmul, ...) plus information about the build and
-- the process group. Submodules load on first use: bl.nn, bl.optim, ...
local tensor = require "bertlua.tensor"
local runtime = require "bertlua.runtime"

-- The raw C API (bertlua.core) is for the library's own modules: scripts
-- call the named functions here and in the submodules.
local M = {}
for k, v in pairs(tensor) do M[k] = v end
for k, v in pairs(runtime) do M[k] = v end

-- Submodules by their short names (bl.optim, bl.squad, ...): the folders follow
-- the C tree, the short names stay what users type.
local SUBMODULE = {
  nn = "nn", ops = "nn.ops", bert = "bert", config = "bert.config",
  trainer = "train.loop", optim = "train.optim", amp = "train.amp", schedule = "train.schedule",
  checkpoint = "train.checkpoint", dist = "train.dist", safetensors = "io.safetensors", pretrained = "pretrained",
  corpus = "data.corpus", tokenizer = "data.tokenizer", synthetic = "data.synthetic",
  pretraining_data = "data.pretraining", shards = "data.shards", loader = "data.loader",
  squad = "tasks.squad", glue = "tasks.glue", metrics = "tasks.metrics",
  options = "util.options", log = "util.log", fs = "util.fs", json = "util.json",
}

setmetatable(M, {
  __index = function(t, k)
    local name = type(k) == "string" and SUBMODULE[k]
    if not name then return nil end
    local mod = require("bertlua." .. name)
    rawset(t, k, mod)
    return mod
  end,
})

return M
