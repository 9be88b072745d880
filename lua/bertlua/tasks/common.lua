-- bertlua.tasks.common: what the fine-tuning and inference recipes (squad, glue,
-- predict) share besides the training loop (bertlua.train.loop): checking their
-- inputs up front, so a missing vocab or predict file is reported before an
-- hour of training rather than after it, and small output helpers (files and
-- directories: bertlua.util.fs).
--
--   local ft = require "bertlua.tasks.common"
--   local vocab = ft.model_dir("squad", opt.model, opt.vocab)  -- error unless a config, weights
--                                                               -- (any bertlua.io.import format) and a vocab exist
--   ft.input_file("squad", opt.predict_file, "--predict-file")  -- error unless readable
--   ft.write_json(path, tbl)                                    -- atomic
--   ft.report_skipped("squad", "train", rep)                    -- one line with the reader's counts
--
-- Errors are raised with level 0 ("recipe: what was wrong") so the host
-- prints one clear line.
local M = {}

local fs = require "bertlua.util.fs"
local imp = require "bertlua.io.import"
local bert_config = require "bertlua.bert.config"
local Tok = require "bertlua.data.tokenizer"
local is_dir, readable = fs.is_dir, fs.readable

-- model_dir(recipe, dir, vocab) -> vocab path. A model directory holds
-- config.json + model.safetensors (Hugging Face names) and usually vocab.txt;
-- the checkpoints bertlua.import reads (pytorch_model.bin, a TensorFlow
-- checkpoint with bert_config.json, a .pt) are accepted too. vocab overrides
-- the directory's vocab.txt.
function M.model_dir(recipe, dir, vocab)
  if not dir or dir == "" then error(recipe .. ": --model=DIR is required", 0) end
  local ok, src = pcall(imp.locate, dir)
  if not ok then error(recipe .. ": " .. tostring(src), 0) end
  if vocab then
    if not readable(vocab) then error(("%s: --vocab=%s cannot be read"):format(recipe, vocab), 0) end
  elseif not src.vocab then
    error(("%s: %s has no vocab.txt; give the vocabulary the model was trained with as --vocab=FILE"):format(recipe,
      dir), 0)
  end
  vocab = vocab or src.vocab
  -- a config that does not load is the model loader's to report
  local cok, cfg = pcall(bert_config.load, src.config)
  if cok then Tok.load(vocab):check_model(cfg.vocab_size, recipe, src.config) end
  return vocab
end

-- seq_length(recipe, cfg, n[, flag]): error unless --max-seq-length=n (or flag=n) fits the model's position table
function M.seq_length(recipe, cfg, n, flag)
  flag = flag or "--max-seq-length"
  if n > cfg.max_position_embeddings then
    error(("%s: %s=%d is longer than the model's %d positions (max_position_embeddings, the length "
      .. "it was trained up to): pass %s=%d or less"):format(recipe, flag, n, cfg.max_position_embeddings, flag,
      cfg.max_position_embeddings), 0)
  end
end

-- input_file(recipe, path, flag): error unless path is a readable file
-- (flag: the option, "--predict-file", or a description, "test data")
function M.input_file(recipe, path, flag)
  local is_opt = flag:sub(1, 2) == "--"
  if not path or path == "" then error(("%s: %s is required"):format(recipe, is_opt and flag .. "=FILE" or flag), 0) end
  local what = is_opt and (flag .. "=" .. path) or (flag .. " " .. path)
  if is_dir(path) then error(("%s: %s is a directory, expected a file"):format(recipe, what), 0) end
  -- before any open: opening a FIFO would wait for a writer forever
  local ok, err = pcall(fs.check_input, path, what, true)
  if not ok then error(("%s: %s"):format(recipe, err), 0) end
  if not readable(path) then error(("%s: %s cannot be read (no such file?)"):format(recipe, what), 0) end
  return path
end

function M.write_json(path, tbl)
  fs.write_atomic(path, require("cjson").encode(tbl))
end

-- report_skipped(recipe, what, rep): a one-line summary of a reader's report
-- (the readers print each problem with its location as they go); returns rep.skipped
function M.report_skipped(recipe, what, rep)
  local skipped = rep.skipped or 0
  if skipped > 0 then
    io.stderr:write(("%s: %s: %d malformed or unusable entries skipped (listed above)\n"):format(recipe, what, skipped))
  end
  return skipped
end

-- stdout line-buffered, so a recipe's prints and the progress lines on stderr
-- keep their order when both go to one log file
function M.line_buffered()
  io.stdout:setvbuf("line")
end

return M
