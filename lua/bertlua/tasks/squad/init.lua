-- bertlua.tasks.squad: SQuAD v1.1/v2.0 data handling, faithful to google-research/bert
-- run_squad.py (read_squad_examples, convert_examples_to_features,
-- write_predictions) and to the official evaluate-v1.1.py / evaluate-v2.0.py.
--
--   local squad = require "bertlua.tasks.squad"
--   local ex, rep = squad.read_examples("dev-v1.1.json", { is_training = false })
--   local feats = squad.convert_examples_to_features(ex, tok, { is_training = false })
--   local batch = squad.feature_batch(feats, { 1, 2, 3 }, 384, true)   -- tensors, labels too
--   local out = squad.write_predictions(ex, feats, results, { tokenizer = tok,
--                  output_dir = "out", version_2_with_negative = false })
--   local scores = squad.evaluate(dataset_json, predictions)  -- official metrics
--
-- Index convention: every *position* (word index of an answer, sequence
-- position in a feature, token_to_orig_map keys and values) is 0-based, as in
-- the reference and in the C API, so start_position/end_position can be fed
-- straight to the loss. Lua arrays (doc_tokens, tokens, input_ids, logits) are
-- 1-based as usual: tokens[pos + 1] is the token at position pos.
--
-- Characters are Unicode code points (answer_start counts code points, as
-- Python does); text is UTF-8.
--
-- The tokenizer object `tok` must provide tok:tokenize(text) -> {wordpieces},
-- tok:convert_tokens_to_ids(tokens) -> {ids}, tok:basic_tokenize(text) ->
-- {tokens} (for write_predictions), and tok.pad_id (default 0).
--
-- The pieces: examples (reading), features, predictions, evaluate (the
-- official metrics); this module gathers their functions in one table.
local M = {}
for _, part in ipairs { "evaluate", "examples", "features", "predictions" } do
  for k, v in pairs(require("bertlua.tasks.squad." .. part)) do M[k] = v end
end
M.chars = require("bertlua.util.pystr").chars

return M
